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
    /// Transactions that failed (disk full, IO error).
    pub commit_errors: AtomicU64,
    /// Duration of the last commit, microseconds.
    pub last_commit_us: AtomicU64,
    /// UDP datagrams received.
    pub udp_datagrams: AtomicU64,
    /// Collector samples that failed.
    pub collector_errors: AtomicU64,
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
