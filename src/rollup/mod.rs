//! The rollup, retention and disk-budget job: folds raw chunks into downsampled tiers
//! (1 min, 1 h, ... : count, sum, min, max, first, last and a DDSketch per series and
//! bucket), evicts data past each tier's retention, and keeps the store under `max_bytes`.
//!
//! Design:
//! - **Second writer, small transactions.** The job has its own read-write connection, beside
//!   the ingest writer. Each step is one `BEGIN IMMEDIATE` transaction bounded by
//!   `[rollup] batch_points` raw points (or 1,000 evicted chunks / 5,000 evicted rows), so the
//!   ingest writer (busy_timeout 5 s) waits at most one short step. Ingest never waits for a
//!   whole run.
//! - **Exactly once, by chunk id.** Each tier has a cursor: the id of the last chunk folded
//!   into it (`rollup_state`). A step reads the next chunks by id, merges their points into
//!   the existing bucket rows (read-modify-merge-write) and moves the cursor in the *same*
//!   transaction. A kill -9 loses either the whole step or nothing, so a rerun neither
//!   double-counts nor skips. Steps are a deterministic function of the cursor and the
//!   stored chunks, so an interrupted and rerun job ends bit-identical to an uninterrupted
//!   one (tested). Chunk ids never repeat (`AUTOINCREMENT`, migration 0002).
//! - **Late points.** A point is always merged into its bucket, however late it arrives
//!   (the bucket row is read and merged, not overwritten). `lateness` defines when a bucket
//!   is *final*: once the tier's watermark (newest point time seen, capped at the wall clock)
//!   is more than `lateness` past the bucket's end. Points that land in a final bucket are
//!   still merged and are counted in `late_points`, so a consumer that copied final buckets
//!   (the forwarder) knows to resend. Nothing is dropped, so backfilling old data works.
//! - **Recent rows, then settled.** A fold writes new rows to a time-keyed table, so its row
//!   per series fills adjacent pages; [`Job::settle`] moves the final buckets of hourly and
//!   coarser tiers ([`Plan::settle_from_ns`]) to the series-keyed table six at a time (each
//!   move in one transaction with the tier's settled bucket), so a series' page is written
//!   once per move, not at every fold. Finer tiers stay keyed by time: moving them wrote
//!   every row twice.
//! - **Eviction** never deletes a raw chunk that some tier has not rolled up (id above the
//!   lowest cursor). Retention deletes raw chunks whose newest point is older than `raw`, and
//!   tier rows whose bucket ended before the tier's retention. The budget keeps the file's
//!   pages under `max_bytes` less room for the WAL: once the pages in use reach that line
//!   it evicts the oldest raw chunks (by id, i.e. write order) first, then the oldest rows of
//!   the finest tier, then the next tier, a 32nd of the budget below the line at once, and
//!   the next writes reuse the freed pages; a file over the line is shrunk by what it is
//!   over (`PRAGMA incremental_vacuum(N)`, then `wal_checkpoint(TRUNCATE)`).
//!   Raw chunks a sink had not forwarded yet are counted per sink (`sinks`).
//!
//! It never reads the ingest queue, never serves HTTP and issues no SQL itself: every
//! statement is a typed function of [`crate::store`]. Files: `config.rs` (`[rollup]`,
//! `[retention]`), `plan.rs` (the validated [`Plan`] and its [`Tier`]s, shared with the query
//! engine), `fold.rs` (raw chunks into tiers, and settling final buckets), `evict.rs`
//! (retention and the disk budget), `status.rs` (the `rollup` object of `/api/v1/status`),
//! this file (the [`Job`] and the agent's periodic task).

pub(crate) mod config;
mod evict;
mod fold;
mod plan;
mod status;
#[cfg(test)]
pub(crate) mod tests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::periodic::Ticker;
use crate::store::open::space;
use crate::store::{Mode, StoreError};

pub use config::{RetentionConfig, RollupConfig};
pub use evict::wal_checkpoint_bytes;
pub use plan::{Plan, Tier};
pub use status::status;

/// Why the job failed. Store errors say whether a retry can help.
#[derive(Debug, thiserror::Error)]
pub enum RollupError {
    /// SQLite or the data directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored sketch does not decode.
    #[error("corrupt rollup row (tier {tier_s}s, series {series_id}, bucket {bucket}) in {path}")]
    Corrupt {
        /// Database.
        path: PathBuf,
        /// Tier resolution, seconds.
        tier_s: i64,
        /// Series.
        series_id: i64,
        /// Bucket start, ns.
        bucket: i64,
    },
    /// The tier configuration is invalid.
    #[error("invalid rollup configuration: {0}")]
    Config(String),
}

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    /// Chunks folded (counted once per chunk, whichever tiers needed it).
    pub chunks: u64,
    /// Raw points read.
    pub points: u64,
    /// Transactions committed by the rollup.
    pub steps: u64,
    /// Tier rows read back and written again with more points (late points, a bucket
    /// folded while open).
    pub rewritten_rows: u64,
    /// Raw chunks evicted (retention + budget).
    pub evicted_chunks: u64,
    /// Raw points evicted.
    pub evicted_points: u64,
    /// Tier rows evicted.
    pub evicted_rows: u64,
    /// Tier rows moved from `rollups_recent` into `rollups` (see [`Job::settle`]).
    pub settled_rows: u64,
    /// Store size after the run (bytes, database + WAL).
    pub db_bytes: u64,
    /// True when stopped early by the stop flag.
    pub interrupted: bool,
    /// Rollup and retention waited for the device's clock to be set (see [`crate::clock`]).
    pub clock_held: bool,
    /// Points whose times were corrected after the clock was set.
    pub clock_fixed_points: u64,
}

/// The job: its own read-write connection and the plan.
pub struct Job {
    conn: Connection,
    path: PathBuf,
    plan: Plan,
    /// Test aid for the crash test (`edgewatch maintain --debug-pause-ms`): sleep this long
    /// after each committed rollup step. Zero in production.
    pub pause_between_steps: Duration,
    /// Whether a run folds only the tiers whose [`Plan::fold_every_ns`] passed since this job
    /// last folded them (the agent's periodic job); off, every run folds every tier.
    pub fold_cadence: bool,
    /// When each tier was last folded by this job (`now` of the run, ns).
    folded_at: Vec<Option<i64>>,
    /// When this job last looked for small chunks to merge (`now` of the run, ns).
    merged_at: Option<i64>,
}

/// How often the agent's periodic job (`fold_cadence`) looks for small chunks to merge. A
/// look reads the chunk rows after the merge cursor up to the consumers' horizon (at most a
/// range's worth); a step only runs once a full range is below the horizon, which on a
/// device is when the 1h tier folds, so merging waits anyway.
const MERGE_EVERY_NS: i64 = 5 * 60 * plan::NS;

/// Opens a read-write connection to the migrated store in `dir` (it must exist, at this
/// binary's schema version): [`crate::store::open`] in [`Mode::Job`].
pub fn open_conn(dir: &Path) -> Result<(Connection, PathBuf), RollupError> {
    Ok(crate::store::open(dir, Mode::Job)?)
}

impl Job {
    /// Opens the job on the store in `dir`.
    pub fn open(dir: &Path, plan: Plan) -> Result<Job, RollupError> {
        let (conn, path) = open_conn(dir)?;
        crate::store::open::space::checkpoint_every(
            &conn,
            &path,
            wal_checkpoint_bytes(plan.max_bytes),
        )?;
        Ok(Job {
            conn,
            path,
            plan,
            pause_between_steps: Duration::ZERO,
            fold_cadence: false,
            folded_at: Vec::new(),
            merged_at: None,
        })
    }

    /// Rollup, then retention, then the budget. `stop` is polled between transactions.
    pub fn run_once(&mut self, now: i64, stop: &dyn Fn() -> bool) -> Result<Report, RollupError> {
        let mut report = Report::default();
        // A clock that is not set (or was just set) holds rollup and retention: the times of
        // the held points are wrong until corrected. The budget still protects the disk.
        let machine = crate::clock::Machine::read(now);
        let (clock, fixed) =
            crate::clock::settle(&mut self.conn, self.plan.clock_floor_ns, now, &machine)?;
        report.clock_fixed_points = fixed.points;
        report.clock_held = clock != crate::clock::Settle::Ready;
        if report.clock_held {
            self.enforce_budget(stop, &mut report)?;
        } else {
            // A run that evicts folds every tier first: raw chunks are evicted only once every
            // tier has them, and a tier on a long cadence would otherwise leave the budget
            // nothing but tier rows to take. (Only such a run: a fold of every tier's open
            // bucket at every run wrote a store at its budget's tiers twice.)
            let over_budget = self.over_budget()?;
            self.rollup(now, over_budget, stop, &mut report)?;
            if !report.interrupted {
                self.settle(stop, &mut report)?;
            }
            if !report.interrupted {
                self.enforce_retention(now, &mut report)?;
                // Runs of small chunks every consumer has passed become full columnar
                // chunks (a few bounded steps a run, every MERGE_EVERY_NS in the agent;
                // see store::compact).
                let merge_due = !self.fold_cadence
                    || self
                        .merged_at
                        .map_or(true, |at| now.saturating_sub(at) >= MERGE_EVERY_NS);
                if merge_due {
                    self.merged_at = Some(now);
                }
                for _ in 0..if merge_due { 4 } else { 0 } {
                    // A step's range holds `batch_points` points, like a fold's transaction.
                    let limits = crate::store::compact::Limits {
                        max_points: self.plan.batch_points,
                        all: false,
                    };
                    if stop()
                        || crate::store::compact::merge_step(&mut self.conn, &self.path, &limits)?
                            .is_none()
                    {
                        break;
                    }
                }
                self.enforce_budget(stop, &mut report)?;
            }
        }
        report.db_bytes = self.db_bytes()?;
        // Give the page cache back between runs (runs are seconds apart and touch pages
        // the next run mostly does not need): the agent's steady RSS stays flat instead of
        // holding this connection's cache full.
        space::release_memory(&self.conn, &self.path)?;
        Ok(report)
    }

    /// Bytes the store occupies: live pages plus the WAL file.
    pub fn db_bytes(&self) -> Result<u64, RollupError> {
        Ok(space::db_bytes(&self.conn, &self.path)?)
    }
}

/// Hands the heap pages a rollup run freed back to the OS. glibc keeps freed memory in its
/// arenas, and a run's short-lived buffers (chunk blobs, bucket maps, SQLite's page cache,
/// released by `PRAGMA shrink_memory`) leave holes that a later run does not always reuse:
/// without this the agent's RSS crept up by ~0.4 MB/min under load
/// (`FOOTPRINT_SECONDS=900 scripts/footprint.sh`).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory back to the OS; glibc serialises it
    // with every other allocator call.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How long the job waits after `failures` failed runs in a row, counted from the failed
/// run's tick: `2^failures` intervals, capped at 32 (deterministic: one job per device, and
/// its retries stay on the interval's grid).
fn retry_policy(interval: Duration) -> Backoff {
    Backoff::new(interval, interval.saturating_mul(32))
}

/// Runs the job every `plan.interval` on the blocking pool until `shutdown`; missed ticks are
/// skipped, failures back off ([`retry_policy`]) and are logged once per attempt with a
/// running count.
pub async fn run(dir: PathBuf, plan: Plan, shutdown: CancellationToken) {
    let mut job = match tokio::task::spawn_blocking({
        let dir = dir.clone();
        let plan = plan.clone();
        move || Job::open(&dir, plan)
    })
    .await
    {
        Ok(Ok(mut j)) => {
            j.fold_cadence = true;
            Some(j)
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "rollup job cannot open the store; rollups are off");
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "rollup job failed to start");
            return;
        }
    };
    let retry = retry_policy(plan.interval);
    let mut ticker = Ticker::new(plan.interval);
    let mut failures = 0u32;
    let mut retry_at = None;
    // Cancelling the wait loses nothing: a run in progress is awaited below, not there.
    while let Some(due) = ticker.next(&shutdown).await {
        if retry_at.is_some_and(|at| due < at) {
            continue;
        }
        let Some(mut j) = job.take() else { return };
        let stop = shutdown.clone();
        let res = tokio::task::spawn_blocking(move || {
            let r = j.run_once(crate::now_ns(), &|| stop.is_cancelled());
            (j, r)
        })
        .await;
        match res {
            Ok((j, Ok(report))) => {
                job = Some(j);
                failures = 0;
                retry_at = None;
                trim_heap();
                if report.points > 0 || report.evicted_chunks > 0 || report.evicted_rows > 0 {
                    tracing::info!(
                        points = report.points,
                        chunks = report.chunks,
                        evicted_chunks = report.evicted_chunks,
                        evicted_rows = report.evicted_rows,
                        db_bytes = report.db_bytes,
                        "rollup run"
                    );
                }
            }
            Ok((j, Err(e))) => {
                job = Some(j);
                failures += 1;
                let wait = retry.base(failures);
                retry_at = Some(due + wait);
                let retry_in_intervals = wait.as_nanos() / plan.interval.as_nanos().max(1);
                tracing::warn!(error = %e, failures, retry_in_intervals, "rollup run failed");
            }
            Err(e) => {
                tracing::error!(error = %e, "rollup run panicked; rollups are off until restart");
                return;
            }
        }
    }
}
