//! Folding raw chunks into the tiers, one bounded step at a time (see the module docs of
//! [`super`] for the exactly-once and late-point rules). A step reads and folds its chunks
//! under a read snapshot and takes the write lock only to merge and write the rows, so
//! ingest is not held back while it decodes. Settling moves final buckets from the recent
//! table to the series-keyed one in bulk. The bucket maths is
//! [`crate::store::bucket`]; every statement is in [`crate::store`].

use std::collections::HashMap;
use std::ops::ControlFlow;

use rusqlite::TransactionBehavior;

use super::{Job, Plan, Report, RollupError};
use crate::store::bucket::{bucket_start, numeric, Acc};
use crate::store::chunks::{self, Scan};
use crate::store::CHUNK_SPLIT_NS;
use crate::store::{counters, tiers, Ctx};

/// The buckets one rollup step is building for one tier, in first-seen order, with an index
/// by `(series_id, bucket)` and the last one used: points of a chunk come series by series in
/// time order, so most land in the bucket of the point before and skip the hash lookup.
#[derive(Default)]
struct Fresh {
    accs: Vec<((i64, i64), Acc)>,
    index: HashMap<(i64, i64), usize>,
    last: Option<((i64, i64), usize)>,
}

impl Fresh {
    fn at(&mut self, key: (i64, i64)) -> &mut Acc {
        let i = match self.last {
            Some((k, i)) if k == key => i,
            _ => {
                let accs = &mut self.accs;
                let i = *self.index.entry(key).or_insert_with(|| {
                    accs.push((key, Acc::default()));
                    accs.len() - 1
                });
                self.last = Some((key, i));
                i
            }
        };
        &mut self.accs[i].1
    }

    /// The buckets sorted by key (sorting indices, not the large accumulators).
    fn into_sorted(mut self) -> Vec<((i64, i64), Acc)> {
        let mut order: Vec<usize> = (0..self.accs.len()).collect();
        order.sort_unstable_by_key(|&i| self.accs[i].0);
        order
            .into_iter()
            .map(|i| (self.accs[i].0, std::mem::take(&mut self.accs[i].1)))
            .collect()
    }
}

/// How many final buckets of a tier gather in `rollups_recent` before [`Job::settle`] moves
/// them into `rollups` together: an hour's, and at least six. A move writes about a page per
/// series, as each fold did before recent rows were kept apart, so the 1m tier writes those
/// pages once an hour instead of every minute.
pub fn settle_span_ns(res_ns: i64) -> i64 {
    res_ns.saturating_mul(6).max(3_600_000_000_000)
}

fn load_states(
    conn: &rusqlite::Connection,
    path: &std::path::Path,
    plan: &Plan,
) -> Result<Vec<tiers::State>, RollupError> {
    let mut out = Vec::with_capacity(plan.tiers.len());
    for t in &plan.tiers {
        out.push(tiers::state(conn, path, t.key())?);
    }
    Ok(out)
}

impl Job {
    /// Moves the final buckets (more than `lateness` behind its watermark) of each tier of at
    /// least [`Plan::settle_from_ns`] resolution from
    /// `rollups_recent` into `rollups` once [`settle_span_ns`] of them wait, in steps of at
    /// most [`tiers::SETTLE_ROWS`] rows, each moving the tier's settled bucket in the same
    /// transaction. Late points for a moved bucket are merged into its row in `rollups`.
    pub fn settle(
        &mut self,
        stop: &dyn Fn() -> bool,
        report: &mut Report,
    ) -> Result<(), RollupError> {
        let path = self.path.clone();
        let settling = self
            .plan
            .tiers
            .iter()
            .filter(|t| t.res_ns >= self.plan.settle_from_ns);
        for (key, res) in settling.map(|t| (t.key(), t.res_ns)) {
            let mut started = false;
            loop {
                if stop() {
                    report.interrupted = true;
                    return Ok(());
                }
                let tx = self
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .ctx(&path)?;
                let state = tiers::state(&tx, &path, key)?;
                if state.watermark == i64::MIN {
                    break;
                }
                let through =
                    bucket_start(state.watermark.saturating_sub(self.plan.lateness_ns), res)
                        .saturating_sub(res);
                // A run starts moving only once a whole span waits, then moves all that is final.
                let start_by = if started {
                    through
                } else {
                    through
                        .saturating_sub(settle_span_ns(res))
                        .saturating_add(res)
                };
                let Some((rows, upto)) = tiers::settle_step(&tx, &path, key, through, start_by)?
                else {
                    break;
                };
                let settled = tiers::State {
                    settled: state.settled.max(upto),
                    ..state
                };
                tiers::put_state(&tx, &path, key, &settled)?;
                tx.commit().ctx(&path)?;
                report.settled_rows += rows;
                started = true;
            }
        }
        Ok(())
    }

    /// Folds every chunk not yet rolled up, step by step.
    ///
    /// `all` folds every tier whatever its cadence (see [`Job::due_tiers`]).
    pub fn rollup(
        &mut self,
        now: i64,
        all: bool,
        stop: &dyn Fn() -> bool,
        report: &mut Report,
    ) -> Result<(), RollupError> {
        if self.plan.tiers.is_empty() {
            return Ok(());
        }
        // A tier that folds closed buckets only is due at every run: a run in which no
        // bucket closed writes nothing for it, and one right after a bucket closes keeps the
        // raw tail that reads merge short.
        let open_from = self.open_buckets(now, all);
        let due: Vec<bool> = self
            .due_tiers(now, all)
            .into_iter()
            .zip(&open_from)
            .map(|(due, open)| due || open.is_some())
            .collect();
        if !due.contains(&true) {
            return Ok(());
        }
        // The tiers still folding in this run: one that reached its open bucket is done.
        let mut active = due.clone();
        let mut folded = false;
        loop {
            if stop() {
                report.interrupted = true;
                return Ok(());
            }
            match self.rollup_step(now, &mut active, &open_from)? {
                None => {
                    // The cadence starts at a fold that wrote something: a tier with nothing
                    // to fold yet folds the first points at the next run.
                    if folded {
                        for (at, d) in self.folded_at.iter_mut().zip(&due) {
                            if *d {
                                *at = Some(now);
                            }
                        }
                    }
                    return Ok(());
                }
                Some((chunks, points, rewritten)) => {
                    folded = true;
                    report.chunks += chunks;
                    report.points += points;
                    report.rewritten_rows += rewritten;
                    report.steps += 1;
                }
            }
            if !self.pause_between_steps.is_zero() {
                std::thread::sleep(self.pause_between_steps);
            }
        }
    }

    /// The tiers this run folds. Without a cadence (`edgewatch maintain`, tests) every tier.
    /// With one (the agent's periodic job) a tier folds once every [`Plan::fold_every_ns`]
    /// (every tier when `all`: a store near its budget, whose raw chunks may be evicted only
    /// once every tier has folded them): a fold rewrites the open bucket of every active
    /// series (unless the tier folds closed buckets only, see [`Job::open_buckets`]), so
    /// a tier folded less often writes its rows less often. Queries lose nothing (they read
    /// the raw chunks past a tier's cursor).
    ///
    /// [`Plan::fold_every_ns`]: super::Plan::fold_every_ns
    fn due_tiers(&mut self, now: i64, all: bool) -> Vec<bool> {
        self.folded_at.resize(self.plan.tiers.len(), None);
        self.plan
            .tiers
            .iter()
            .zip(&self.folded_at)
            .map(|(t, at)| {
                !self.fold_cadence
                    || all
                    || at.map_or(true, |at| {
                        now < at || now.saturating_sub(at) >= self.plan.fold_every_ns(t)
                    })
            })
            .collect()
    }

    /// Per tier, the start of its open bucket when this run folds only its closed buckets,
    /// else `None`. In the agent's job (`fold_cadence`, not near the budget) a tier whose
    /// bucket is no longer than its cadence (the 1m tier folded every minute) stops at the
    /// first chunk of the bucket `now` is in: folding the open minute's first seconds wrote
    /// its rows, and the next fold read and wrote them again, the whole 1m tier twice. The
    /// writer splits a commit's chunks at the start of the current minute and puts the
    /// earlier ones first ([`CHUNK_SPLIT_NS`]), so the stop leaves nothing of a closed bucket
    /// behind it (points that come late fold at the next fold, into the stored row). It
    /// adds at most a bucket to the tier's lag, which reads make up from the raw chunks, as
    /// for any chunk past a cursor; such a tier is folded at every run (a run in which no
    /// bucket closed writes nothing), so its lag is its open bucket, the margin and a run.
    /// A bucket counts as closed [`Plan::close_margin_ns`] after its end, once the writer has
    /// committed the points it held for it.
    fn open_buckets(&self, now: i64, all: bool) -> Vec<Option<i64>> {
        let now = now.saturating_sub(self.plan.close_margin_ns);
        self.plan
            .tiers
            .iter()
            .map(|t| {
                (self.fold_cadence
                    && !all
                    && t.res_ns % CHUNK_SPLIT_NS == 0
                    && t.res_ns <= self.plan.fold_every_ns(t))
                .then(|| bucket_start(now, t.res_ns))
            })
            .collect()
    }

    /// The lowest cursor of all tiers (`i64::MAX` without tiers): chunks above it are not
    /// rolled up everywhere yet.
    pub(super) fn min_cursor(&self) -> Result<i64, RollupError> {
        if self.plan.tiers.is_empty() {
            return Ok(i64::MAX);
        }
        let states = load_states(&self.conn, &self.path, &self.plan)?;
        Ok(states.iter().map(|s| s.cursor).min().unwrap_or(0))
    }

    /// One transaction: the next chunks (up to `batch_points` points) into every `due` tier
    /// that has not seen them, each tier with an open bucket in `open_from` up to the first
    /// chunk in that bucket (that tier is then no longer `due` in this run): (chunks,
    /// points, tier rows rewritten). `None` when every due tier is caught up.
    fn rollup_step(
        &mut self,
        now: i64,
        due: &mut [bool],
        open_from: &[Option<i64>],
    ) -> Result<Option<(u64, u64, u64)>, RollupError> {
        let path = self.path.clone();
        let plan = &self.plan;
        // Reading and folding run under a read snapshot, without the write lock: ingest
        // commits meanwhile (on a slow disk a 100,000-point fold under the lock held every
        // write back for a second; `benches/slow_disk.py`). Only this job moves the tier
        // cursors and removes chunks, and chunks below the ingest head never change, so the
        // snapshot's batch is still the next one when the write transaction begins; that is
        // checked, and a step that finds otherwise is dropped and redone.
        let read = self.conn.transaction().ctx(&path)?;
        let mut states = load_states(&read, &path, plan)?;
        let read_cursors: Vec<i64> = states.iter().map(|s| s.cursor).collect();
        // Chunks stamped by a clock that is not set yet wait (see crate::clock).
        let hold = crate::clock::hold_from(&read)
            .ctx(&path)?
            .unwrap_or(i64::MAX);
        // A tier that folds closed buckets only and whose next chunk is in its open bucket
        // has nothing to fold in this run. Left in, it would start the batch at its cursor,
        // up to a bucket (an hour, for the 1h tier) behind the others: every run would read
        // that hour again, and a tier with a newer cursor could find none of its own chunks
        // in the batch.
        for (ti, tier) in plan.tiers.iter().enumerate() {
            let Some(open) = open_from[ti].filter(|_| due[ti]) else {
                continue;
            };
            let next = chunks::first_ts_min_after(&read, &path, states[ti].cursor, Some(hold))?;
            if next.is_some_and(|ts| bucket_start(ts, tier.res_ns) == open) {
                due[ti] = false;
            }
        }
        let min_cursor = states
            .iter()
            .zip(due.iter())
            .filter(|(_, d)| **d)
            .map(|(s, _)| s.cursor)
            .min()
            .unwrap_or(i64::MAX);
        // The batch: whole chunks by id until `batch_points` (at least one chunk).
        let mut chunks: Vec<(i64, i64, Vec<u8>)> = Vec::new();
        let mut points = 0u64;
        let scan = Scan {
            after: Some(min_cursor),
            before: Some(hold),
            limit: Some(5000),
            ..Scan::default()
        };
        chunks::scan(&read, &path, &scan, |c| {
            if points >= plan.batch_points as u64 {
                return Ok(ControlFlow::Break(()));
            }
            points += c.n.max(0) as u64;
            chunks.push((c.id, c.ts_min, c.data.to_vec()));
            Ok(ControlFlow::Continue(()))
        })?;
        read.commit().ctx(&path)?;
        if chunks.is_empty() {
            return Ok(None);
        }
        // The last chunk of the batch each due tier folds: all of them, or those before the
        // first chunk of its open bucket.
        let mut upto = vec![i64::MIN; plan.tiers.len()];
        for (ti, tier) in plan.tiers.iter().enumerate() {
            if !due[ti] {
                continue;
            }
            let cursor = states[ti].cursor;
            let mut last = cursor;
            for &(id, ts_min, _) in &chunks {
                if id <= cursor {
                    continue;
                }
                if open_from[ti] == Some(bucket_start(ts_min, tier.res_ns)) {
                    due[ti] = false;
                    break;
                }
                last = id;
            }
            upto[ti] = last;
        }
        if upto.iter().zip(&states).all(|(u, s)| *u <= s.cursor) {
            return Ok(None);
        }
        let mut fresh: Vec<Fresh> = (0..plan.tiers.len()).map(|_| Fresh::default()).collect();
        let mut rewritten = 0u64;
        let mut values: Vec<(i64, i64, f64)> = Vec::new();
        for (id, ts_min, data) in &chunks {
            values.clear();
            crate::store::codec::decode_chunk(data, *ts_min, |ts, sid, v| {
                if let Some(f) = numeric(&v) {
                    values.push((ts, sid, f));
                }
            })
            .map_err(|source| crate::store::StoreError::Corrupt {
                path: path.clone(),
                source,
            })?;
            for (ti, tier) in plan.tiers.iter().enumerate() {
                let state = &mut states[ti];
                if *id <= state.cursor || *id > upto[ti] {
                    continue;
                }
                for &(ts, sid, f) in &values {
                    let b = bucket_start(ts, tier.res_ns);
                    if b.saturating_add(tier.res_ns)
                        <= state.watermark.saturating_sub(plan.lateness_ns)
                    {
                        state.late += 1;
                    }
                    state.watermark = state.watermark.max(ts.min(now));
                    fresh[ti].at((sid, b)).add(ts, f);
                }
            }
        }
        // The write lock, held only for merging into the stored rows and writing them.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx(&path)?;
        // The states under the write lock: the cursors must be those this step read, and
        // where each tier is settled through (another job may have settled since) decides
        // which table a row is in.
        let locked = load_states(&tx, &path, plan)?;
        let now_cursors: Vec<i64> = locked.iter().map(|s| s.cursor).collect();
        if now_cursors != read_cursors {
            tracing::warn!(
                ?read_cursors,
                ?now_cursors,
                "tier cursors moved during a rollup step; redoing it"
            );
            return Ok(Some((0, 0, 0)));
        }
        for (ti, tier) in plan.tiers.iter().enumerate() {
            if upto[ti] <= states[ti].cursor {
                continue;
            }
            let key = tier.key();
            let settled = locked[ti].settled;
            let (mut inserted, mut corrupt_skipped) = (0i64, 0i64);
            // Sorted, so the write order (and the file) is the same on every run.
            let accs = std::mem::take(&mut fresh[ti]).into_sorted();
            // The existing rows of each series, read together, merged and written back.
            let mut group: Vec<(i64, Acc)> = Vec::new();
            let mut buckets: Vec<i64> = Vec::new();
            let mut iter = accs.into_iter().peekable();
            while let Some(((sid, bucket), acc)) = iter.next() {
                group.clear();
                group.push((bucket, acc));
                while let Some(((_, b), a)) = iter.next_if(|((s, _), _)| *s == sid) {
                    group.push((b, a));
                }
                buckets.clear();
                buckets.extend(group.iter().map(|g| g.0));
                let existing =
                    tiers::read_buckets(&tx, &path, key, tier.res_ns, settled, sid, &buckets)?;
                for ((bucket, acc), existing) in group.drain(..).zip(existing) {
                    let exists = existing.is_some();
                    let merged = match existing {
                        None => acc,
                        // A stored row whose sketch does not decode: the row stays as it is
                        // (reads of its percentiles report it) and these points stay out of
                        // it, counted, so one bad row does not stop the tier for good.
                        Some(Err(())) => {
                            tracing::warn!(
                                error = %RollupError::Corrupt {
                                    path: path.clone(),
                                    tier_s: key,
                                    series_id: sid,
                                    bucket,
                                },
                                points = acc.count,
                                "late points for a corrupt tier row left out of it"
                            );
                            corrupt_skipped += acc.count as i64;
                            continue;
                        }
                        Some(Ok(mut old)) => {
                            old.merge(&acc);
                            old
                        }
                    };
                    if exists {
                        rewritten += 1;
                    } else {
                        inserted += 1;
                    }
                    tiers::put(&tx, &path, key, settled, sid, bucket, &merged, exists)?;
                }
            }
            counters::bump(&tx, &path, &counters::tier_rows(key), inserted)?;
            if corrupt_skipped > 0 {
                counters::bump(&tx, &path, &counters::corrupt_skipped(key), corrupt_skipped)?;
            }
            let s = &states[ti];
            if s.cursor < upto[ti] {
                let moved = tiers::State {
                    cursor: upto[ti],
                    updated: now,
                    settled,
                    ..*s
                };
                tiers::put_state(&tx, &path, key, &moved)?;
            }
        }
        tx.commit().ctx(&path)?;
        tracing::debug!(chunks = chunks.len(), points, "rollup step committed");
        Ok(Some((chunks.len() as u64, points, rewritten)))
    }
}
