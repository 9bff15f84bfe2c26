//! Retention and the disk budget: deleting raw chunks past `[retention] raw` (only those
//! every tier has rolled up), tier rows past their tier's retention, and, oldest first, what
//! it takes to keep the store under `max_bytes` (raw, then each tier, finest first), each
//! step one short transaction that also counts what was evicted (and, per sink, what it had
//! not forwarded yet). Every statement is in [`crate::store`].

use rusqlite::TransactionBehavior;

use super::{Job, Report, RollupError, Tier};
use crate::store::chunks::{self, ChunkSize, Scan};
use crate::store::open::{space, WAL_CHECKPOINT_BYTES};
use crate::store::{counters, sinks, tiers, Ctx};

/// WAL size above which a rollup run truncates it even when nothing was evicted: past what
/// the connections' own checkpoints keep it at (`WAL_CHECKPOINT_BYTES`, 16 MiB and the
/// frame headers), i.e. a WAL a long read kept from restarting.
const WAL_SHRINK_BYTES: u64 = 24 << 20;

/// Free pages (bytes) that make giving them back to the file system worth a checkpoint,
/// at least: below it they are reused by the next inserts, and returning them only to grow
/// the file again costs a WAL checkpoint (every hot page rewritten into the database) and
/// `PRAGMA incremental_vacuum`'s move of every page past each hole (about a page written
/// per page freed). A store with a disk budget keeps up to [`FREE_KEEP_SHARE`] of it free.
const FREE_SHRINK_BYTES: u64 = 4 << 20;

/// The share of the disk budget (1/16: 64 MiB of the default 1 GiB) that free pages may hold
/// before they are given back. The hourly merges of small chunks free what an hour of the
/// store's writes takes back (1,700-2,700 pages an hour at twice the reference rate,
/// `cargo bench --bench merge_wear`), and so does raw retention once the store is full;
/// giving those back doubled the merges' WAL (`BENCH_SHRINK_MIB=4`). Over the budget they
/// go back whatever their size.
const FREE_KEEP_SHARE: u64 = 16;

/// What the budget keeps free for the WAL, at most: its file grows to about
/// `WAL_CHECKPOINT_BYTES` between checkpoints, and the budget counts it. A small budget keeps
/// an eighth of itself.
const WAL_ROOM_BYTES: u64 = WAL_SHRINK_BYTES;

/// The share of the budget (1/32: 32 MiB of 1 GiB) one eviction takes at once, below the
/// line that starts it. A store at its budget (every device after its first days: the
/// default 1 GiB holds about ten days of the reference workload) used to evict what a run
/// had just written at every run, and give it back and checkpoint each time; with this much
/// taken at once the next eviction waits until the next writes have refilled it (hours),
/// and the pages it frees are reused in place, never moved or given back.
const EVICT_SHARE: u64 = 32;

/// The budget's lines, in bytes, for a budget of `max` bytes (not 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lines {
    /// Room kept for the WAL: the file's pages stay at most `max - wal_room`.
    pub wal_room: u64,
    /// Pages in use at most this many bytes after an eviction: `max - wal_room - max / 32`.
    pub low: u64,
}

/// How much WAL the store's connections let grow before they checkpoint under a budget of
/// `max_bytes` (0: none): [`WAL_CHECKPOINT_BYTES`], or three quarters of the budget's room
/// for the WAL when that is less (a budget under about 170 MiB), so that the WAL's file,
/// which keeps its longest length, fits the room and the budget never has to truncate it.
pub fn wal_checkpoint_bytes(max_bytes: u64) -> u64 {
    let default = WAL_CHECKPOINT_BYTES as u64;
    if max_bytes == 0 {
        return default;
    }
    default.min(Lines::of(max_bytes).wal_room / 4 * 3)
}

impl Lines {
    pub(super) fn of(max: u64) -> Lines {
        let wal_room = WAL_ROOM_BYTES.min(max / 8);
        Lines {
            wal_room,
            low: max
                .saturating_sub(wal_room)
                .saturating_sub(max / EVICT_SHARE),
        }
    }
}

impl Job {
    /// Whether this run's budget step evicts: the file and the WAL are over `max_bytes`, or
    /// the pages in use have eaten into the WAL's room (the free pages are all reused).
    pub(super) fn over_budget(&self) -> Result<bool, RollupError> {
        let max = self.plan.max_bytes;
        if max == 0 {
            return Ok(false);
        }
        let lines = Lines::of(max);
        Ok(self.db_bytes()? > max
            || space::used_bytes(&self.conn, &self.path)? + lines.wal_room > max)
    }

    /// Deletes raw chunks (rolled up by every tier) and tier rows past their retention.
    pub fn enforce_retention(&mut self, now: i64, report: &mut Report) -> Result<(), RollupError> {
        let min_cursor = self.min_cursor()?;
        let cut = now.saturating_sub(self.plan.raw_retention_ns);
        loop {
            let batch = chunks::sizes(
                &self.conn,
                &self.path,
                &Scan {
                    through: Some(min_cursor),
                    older_than: Some(cut),
                    limit: Some(1000),
                    ..Scan::default()
                },
            )?;
            if batch.is_empty() {
                break;
            }
            self.evict_chunks(&batch, report)?;
        }
        for tier in self.plan.tiers.clone() {
            let Some(ret) = tier.retention_ns else {
                continue;
            };
            // Rows whose bucket ended before now - retention.
            let last_bucket = now.saturating_sub(ret).saturating_sub(tier.res_ns);
            while self.evict_rows(&tier, last_bucket, 5000, report)? > 0 {}
        }
        if self.plan.checkpoint_each_run || self.worth_shrinking()? {
            self.shrink()?;
        }
        Ok(())
    }

    /// Deletes `batch` in one transaction, counting the chunks and, per sink, those it had
    /// not forwarded yet.
    fn evict_chunks(
        &mut self,
        batch: &[ChunkSize],
        report: &mut Report,
    ) -> Result<(), RollupError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx(&path)?;
        let points: i64 = batch.iter().map(|c| c.n).sum();
        chunks::delete(&tx, &path, batch.iter().map(|c| c.id))?;
        for lost in sinks::record_eviction(&tx, &path, batch)? {
            tracing::warn!(
                sink = %lost.sink,
                chunks = lost.chunks,
                points = lost.points,
                "evicting raw data the sink has not forwarded yet"
            );
        }
        counters::bump(&tx, &path, "evicted_raw_chunks", batch.len() as i64)?;
        counters::bump(&tx, &path, "evicted_raw_points", points)?;
        tx.commit().ctx(&path)?;
        report.evicted_chunks += batch.len() as u64;
        report.evicted_points += points.max(0) as u64;
        Ok(())
    }

    /// Deletes up to about `limit` of the oldest rows of `tier` with `bucket <= last_bucket`,
    /// in one transaction; returns how many.
    fn evict_rows(
        &mut self,
        tier: &Tier,
        last_bucket: i64,
        limit: i64,
        report: &mut Report,
    ) -> Result<u64, RollupError> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx(&path)?;
        let n = tiers::delete_oldest(&tx, &path, tier.key(), last_bucket, limit)?;
        counters::bump(
            &tx,
            &path,
            &format!("evicted_rows_{}", tier.key()),
            n as i64,
        )?;
        counters::bump(&tx, &path, &counters::tier_rows(tier.key()), -(n as i64))?;
        tx.commit().ctx(&path)?;
        report.evicted_rows += n;
        Ok(n)
    }

    /// Whether shrinking gives enough back: free pages past [`FREE_SHRINK_BYTES`] and past
    /// [`FREE_KEEP_SHARE`] of the disk budget, or a WAL past [`WAL_SHRINK_BYTES`].
    fn worth_shrinking(&self) -> Result<bool, RollupError> {
        let keep = FREE_SHRINK_BYTES.max(self.plan.max_bytes / FREE_KEEP_SHARE);
        Ok(space::free_bytes(&self.conn, &self.path)? >= keep
            || space::wal_bytes(&self.path) > WAL_SHRINK_BYTES)
    }

    /// Returns free pages to the file system and truncates the WAL (best effort: a reader
    /// holding an old snapshot can keep the WAL until the next run).
    fn shrink(&mut self) -> Result<(), RollupError> {
        if !space::shrink(&self.conn, &self.path)? {
            tracing::debug!("wal checkpoint could not truncate (readers busy); retried next run");
        }
        Ok(())
    }

    /// Evicts oldest-first (raw, then each tier, finest first) once the store is over its
    /// budget (`Job::over_budget`), down to `Lines::low` bytes of pages in use at once,
    /// then gives back only the free pages that keep the file over `max - wal_room` (none
    /// at a store that was at its budget before: the freed pages are reused in place) and
    /// truncates the WAL if the two together are still over `max`. Never touches raw chunks
    /// some tier has not rolled up.
    pub fn enforce_budget(
        &mut self,
        stop: &dyn Fn() -> bool,
        report: &mut Report,
    ) -> Result<(), RollupError> {
        let max = self.plan.max_bytes;
        if max == 0 {
            return Ok(());
        }
        if !space::incremental_vacuum(&self.conn, &self.path)? {
            tracing::warn!(
                "the store is not in incremental auto-vacuum mode: evicted space is reused but \
                 the file will not shrink until the agent of this version reopens it"
            );
        }
        if !self.over_budget()? {
            // Giving space back holds the write lock while the checkpoint copies the WAL into
            // the database and syncs both: on a slow disk that is time ingest waits. So only
            // when it gives something back: free pages past their keep share or a WAL grown
            // past WAL_SHRINK_BYTES (the connections' own checkpoints restart it otherwise).
            // `benches/slow_disk.py` measures the difference.
            if self.worth_shrinking()? {
                self.shrink()?;
            }
            return Ok(());
        }
        let lines = Lines::of(max);
        let mut tier_idx = 0usize;
        loop {
            let used = space::used_bytes(&self.conn, &self.path)?;
            if used <= lines.low || stop() {
                break;
            }
            let over = (used - lines.low) as i64;
            let min_cursor = self.min_cursor()?;
            let candidates = chunks::sizes(
                &self.conn,
                &self.path,
                &Scan {
                    through: Some(min_cursor),
                    limit: Some(1000),
                    ..Scan::default()
                },
            )?;
            if !candidates.is_empty() {
                // Just enough chunks to cover the excess (plus page slack), at least one.
                let mut take = 0;
                let mut bytes = 0i64;
                for c in &candidates {
                    take += 1;
                    bytes += c.bytes + 64;
                    if bytes >= over + 8192 {
                        break;
                    }
                }
                self.evict_chunks(&candidates[..take], report)?;
            } else if let Some(tier) = self.plan.tiers.get(tier_idx).cloned() {
                let rows = (over / 256).clamp(100, 5000);
                if self.evict_rows(&tier, i64::MAX, rows, report)? == 0 {
                    tier_idx += 1;
                }
            } else {
                tracing::warn!(
                    used_bytes = used,
                    max_bytes = max,
                    "store is over its disk budget with nothing left that may be evicted \
                     (raw data not rolled up yet is kept); raise [retention] max_bytes"
                );
                break;
            }
        }
        if !space::shrink_to(&self.conn, &self.path, max - lines.wal_room, lines.wal_room)? {
            tracing::debug!("wal checkpoint could not truncate (readers busy); retried next run");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default 1 GiB budget keeps 24 MiB for the WAL and evicts 32 MiB at once; a small
    /// budget keeps an eighth of itself for the WAL.
    #[test]
    fn the_lines_leave_the_wal_its_room_and_evict_a_32nd() {
        const MIB: u64 = 1 << 20;
        assert_eq!(
            Lines::of(1 << 30),
            Lines {
                wal_room: 24 * MIB,
                low: 1024 * MIB - 24 * MIB - 32 * MIB,
            }
        );
        let small = Lines::of(64 * MIB);
        assert_eq!((small.wal_room, small.low), (8 * MIB, 54 * MIB));
        assert_eq!(Lines::of(100).low, 100 - 12 - 3);
    }
}
