//! The agent's own counters (a *point* is one line of line protocol, as InfluxDB counts;
//! a *value* is one field of it), shared by every stage as plain atomics. Stages only add to
//! them; `/api/v1/status` (and later `/metrics`) read them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the ingest path.
#[derive(Debug, Default)]
pub struct Stats {
    /// Points (lines) committed to the store.
    pub points_written: AtomicU64,
    /// Field values committed to the store.
    pub values_written: AtomicU64,
    /// Points refused (parse errors, type conflicts, series cap).
    pub points_rejected: AtomicU64,
    /// Points dropped because the queue was full (UDP, collectors) or their commit failed
    /// with nobody to tell.
    pub points_dropped: AtomicU64,
    /// HTTP writes answered 503 because the queue was full.
    pub writes_throttled: AtomicU64,
    /// HTTP writes answered 413.
    pub writes_too_large: AtomicU64,
    /// Transactions committed by the writer.
    pub commits: AtomicU64,
    /// Transactions that failed (disk full, IO error), and journal appends that did.
    pub commit_errors: AtomicU64,
    /// Acknowledged writes made durable by a journal append (one per group of writes).
    pub journal_appends: AtomicU64,
    /// What those appends cost the storage, bytes (see `store::journal::Journal::written`).
    pub journal_bytes: AtomicU64,
    /// Duration of the last commit, microseconds.
    pub last_commit_us: AtomicU64,
    /// Every commit's duration (exported on `/metrics` as a histogram).
    pub commit_seconds: CommitHistogram,
    /// UDP datagrams received.
    pub udp_datagrams: AtomicU64,
    /// Collector samples that failed.
    pub collector_errors: AtomicU64,
}

/// The writer's commit durations: a Prometheus histogram (atomic buckets; clones share them).
#[derive(Debug, Clone)]
pub struct CommitHistogram(pub prometheus::Histogram);

/// Bucket bounds of [`CommitHistogram`], seconds: 0.5 ms to 2.5 s (eMMC and SD cards).
pub const COMMIT_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

impl Default for CommitHistogram {
    fn default() -> Self {
        let opts = prometheus::HistogramOpts::new(
            "edgewatch_commit_duration_seconds",
            "Duration of the writer's commits (one transaction per batch of writes).",
        )
        .buckets(COMMIT_BUCKETS.to_vec());
        // Constant, valid options (name, help, increasing buckets): this cannot fail.
        CommitHistogram(prometheus::Histogram::with_opts(opts).expect("valid histogram options"))
    }
}

impl Stats {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
