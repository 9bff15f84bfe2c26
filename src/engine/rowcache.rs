//! A cache of rollup rows kept across alert evaluations: for each (tier, series, what is
//! read, window span) the rows a window read last time, so the next evaluation reads from
//! the store only the rows newer than those it holds (a 1-hour window over the 1-minute
//! tier reads about one row per series instead of 61). Only the plain parts are kept
//! (count and sum, or count, min and max: 32 bytes a row); reads that need sketches or
//! first/last are not cached. At most [`MAX_ROWS`] rows are held (8 MiB); a read past that
//! is served from the store and not kept. Rows can change only through the rollup job,
//! which moves the tier's cursor in the same transaction, or through eviction, which
//! deletes the tier's oldest buckets; so at each evaluation the tier's state is compared
//! with the one seen last time: an unchanged cursor keeps every row; a moved cursor drops
//! the rows a fold may have rewritten (buckets not yet final at the last watermark seen;
//! all of them when a late point landed in a final bucket); a raised oldest bucket drops
//! the rows below it. It never writes to the store and never serves a query that is not
//! the alert evaluator's. It carries the evaluator's [`PointCache`] too (raw points of the
//! windows read from chunks), so that one value holds what an evaluator keeps.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use rusqlite::Connection;

use super::pointcache::PointCache;
use crate::store::bucket::Acc;
use crate::store::tiers::{self, Need, State};
use crate::store::StoreError;

/// Most rows held, all tiers and series together (32 bytes each: 8 MiB).
pub const MAX_ROWS: usize = 1 << 18;

/// One cached row: the bucket and its plain parts (`a`, `b`: sum and 0 for [`Need::Sum`],
/// min and max for [`Need::MinMax`]).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Row {
    bucket: i64,
    count: u64,
    a: f64,
    b: f64,
}

impl Row {
    fn of(bucket: i64, acc: &Acc, need: Need) -> Row {
        let (a, b) = match need {
            Need::MinMax => (acc.min, acc.max),
            _ => (acc.sum, 0.0),
        };
        Row {
            bucket,
            count: acc.count,
            a,
            b,
        }
    }

    /// The aggregate as [`tiers::read_ranges`] returns it for `need`.
    fn acc(&self, need: Need) -> Acc {
        match need {
            Need::MinMax => Acc {
                count: self.count,
                min: self.a,
                max: self.b,
                ..Acc::default()
            },
            _ => Acc {
                count: self.count,
                sum: self.a,
                ..Acc::default()
            },
        }
    }
}

/// The rows of one (series, need, span): every row with `from <= bucket < known_to`.
#[derive(Debug, Default)]
struct Entry {
    rows: VecDeque<Row>,
    from: i64,
    known_to: i64,
    /// The evaluation that last used it.
    used: u64,
}

/// What decides whether a tier's rows are still as cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    cursor: i64,
    late: i64,
    watermark: i64,
    oldest: Option<i64>,
}

#[derive(Debug, Default)]
struct TierRows {
    seen: Option<Seen>,
    /// The evaluation it was last checked in.
    checked: u64,
    entries: HashMap<(i64, bool, i64), Entry>,
}

/// The cache; see the module docs. One per evaluator, used by one evaluation at a time.
#[derive(Debug, Default)]
pub struct RowCache {
    tiers: HashMap<i64, TierRows>,
    rows: usize,
    cycle: u64,
    /// The raw points of windows read from chunks.
    pub points: PointCache,
}

/// Whether rows of `need` are cached.
pub fn cacheable(need: Need) -> bool {
    matches!(need, Need::Sum | Need::MinMax)
}

impl RowCache {
    /// Rows held now.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Ends an evaluation: entries it did not use (a series gone, a rule removed, a window
    /// that changed) are dropped.
    pub fn finish_cycle(&mut self) {
        let cycle = self.cycle;
        let mut dropped = 0;
        for t in self.tiers.values_mut() {
            t.entries.retain(|_, e| {
                let keep = e.used == cycle;
                if !keep {
                    dropped += e.rows.len();
                }
                keep
            });
        }
        self.rows -= dropped;
        self.cycle += 1;
        self.points.finish_cycle();
    }

    /// Compares tier `key`'s state with the one seen last time and drops what may have
    /// changed since (once per evaluation and tier).
    #[allow(clippy::too_many_arguments)]
    fn check(
        &mut self,
        conn: &Connection,
        path: &Path,
        key: i64,
        res_ns: i64,
        lateness_ns: i64,
        state: &State,
    ) -> Result<(), StoreError> {
        let cycle = self.cycle;
        let t = self.tiers.entry(key).or_default();
        if t.checked == cycle && t.seen.is_some() {
            return Ok(());
        }
        let now = Seen {
            cursor: state.cursor,
            late: state.late,
            watermark: state.watermark,
            oldest: tiers::oldest_bucket(conn, path, key)?,
        };
        let mut dropped = 0;
        match t.seen {
            Some(s) if s == now => {}
            Some(s)
                if now.cursor >= s.cursor
                    && now.late == s.late
                    && s.watermark != i64::MIN
                    && match (s.oldest, now.oldest) {
                        (Some(a), Some(b)) => b >= a,
                        (None, None) => true,
                        _ => false,
                    } =>
            {
                // A fold since: a point that was not late landed in a bucket ending after
                // the watermark then (at least the one seen) less the lateness.
                let dirty_from = (now.cursor > s.cursor).then(|| {
                    s.watermark
                        .saturating_sub(lateness_ns)
                        .saturating_sub(res_ns)
                        .saturating_add(1)
                });
                for e in t.entries.values_mut() {
                    if let Some(d) = dirty_from {
                        while e.rows.back().is_some_and(|r| r.bucket >= d) {
                            e.rows.pop_back();
                            dropped += 1;
                        }
                        e.known_to = e.known_to.min(d);
                    }
                    if let Some(oldest) = now.oldest {
                        while e.rows.front().is_some_and(|r| r.bucket < oldest) {
                            e.rows.pop_front();
                            dropped += 1;
                        }
                    }
                }
            }
            _ => {
                // First sight, a late point in a final bucket, rows appearing below the
                // oldest or the store replaced: nothing cached is trusted.
                dropped += t.entries.values().map(|e| e.rows.len()).sum::<usize>();
                t.entries.clear();
            }
        }
        t.seen = Some(now);
        t.checked = cycle;
        self.rows -= dropped;
        Ok(())
    }

    /// [`tiers::read_ranges`] for a cacheable `need` (see [`cacheable`]), through the cache:
    /// `f(index in sids, row)` for each row of tier `tier` with `lo <= bucket <= hi`, in
    /// bucket order per series; the tier's `state` was read in the same read transaction.
    #[allow(clippy::too_many_arguments)]
    pub fn read_ranges<E: From<StoreError>>(
        &mut self,
        conn: &Connection,
        path: &Path,
        tier: (i64, i64),
        lateness_ns: i64,
        state: &State,
        sids: &[i64],
        lo: i64,
        hi: i64,
        need: Need,
        mut f: impl FnMut(usize, Result<Acc, ()>) -> Result<(), E>,
    ) -> Result<(), E> {
        let (key, res_ns) = tier;
        self.check(conn, path, key, res_ns, lateness_ns, state)?;
        let cycle = self.cycle;
        let span = (hi - lo) / res_ns.max(1);
        let minmax = need == Need::MinMax;
        let mut fresh: Vec<Row> = Vec::new();
        for (i, &sid) in sids.iter().enumerate() {
            let t = self.tiers.entry(key).or_default();
            let e = t.entries.entry((sid, minmax, span)).or_default();
            let held = e.rows.len();
            if e.from > lo || e.known_to > hi.saturating_add(1) {
                e.rows.clear();
                e.from = lo;
                e.known_to = lo;
            }
            while e.rows.front().is_some_and(|r| r.bucket < lo) {
                e.rows.pop_front();
            }
            e.from = e.from.max(lo);
            e.known_to = e.known_to.max(lo);
            e.used = cycle;
            fresh.clear();
            let mut corrupt = false;
            tiers::read_range(conn, path, key, sid, e.known_to, hi, need, |b, acc| {
                match acc {
                    Ok(acc) => fresh.push(Row::of(b, &acc, need)),
                    Err(()) => corrupt = true,
                }
                Ok::<_, StoreError>(())
            })?;
            if corrupt {
                // Not kept; the caller reports it.
                self.rows -= held;
                t.entries.remove(&(sid, minmax, span));
                return f(i, Err(()));
            }
            e.rows.extend(fresh.iter().copied());
            e.known_to = hi.saturating_add(1);
            for r in &e.rows {
                f(i, Ok(r.acc(need)))?;
            }
            let now_held = e.rows.len();
            self.rows = self.rows + now_held - held;
            if self.rows > MAX_ROWS {
                // Over the bound: served, not kept.
                self.rows -= now_held;
                t.entries.remove(&(sid, minmax, span));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::engine::{collect_window, collect_window_cached, SeriesRef, StepAcc};
    use crate::rollup::{Job, Plan};
    use crate::store::testing::write_body as write;
    use crate::store::{dict, Reader};

    use super::*;

    const NS: i64 = 1_000_000_000;
    const M: i64 = 60 * NS;

    fn refs(reader: &Reader) -> Vec<SeriesRef> {
        let (conn, path) = (reader.conn(), reader.path());
        dict::tagsets(conn, path, Some("m"))
            .unwrap()
            .into_iter()
            .filter_map(|t| {
                dict::numeric_series(conn, path, t.id, "v")
                    .unwrap()
                    .map(|sid| SeriesRef { tagset: t.id, sid })
            })
            .collect()
    }

    fn plain(v: &[Option<StepAcc>]) -> Vec<Option<(u64, f64, f64, f64)>> {
        v.iter()
            .map(|a| {
                a.as_ref()
                    .map(|a| (a.acc.count, a.acc.sum, a.acc.min, a.acc.max))
            })
            .collect()
    }

    /// Cached and uncached window reads agree at every cycle while data arrives and is
    /// rolled up, a late point lands in a minute already cached (not yet final, and final),
    /// eviction removes the oldest rows, and a series appears and goes away; and the cache
    /// reads fewer rows than it holds (it is used).
    #[test]
    fn cached_reads_equal_uncached_reads_across_cycles() {
        let dir = tempfile::tempdir().unwrap();
        let plan = Plan::from_config(&Config::default()).unwrap();
        let t0 = crate::now_ns() - 3 * 3600 * NS;
        let mut body = String::new();
        for i in 0..(90 * 6) {
            let ts = t0 + i * 10 * NS;
            body.push_str(&format!(
                "m,host=a v={} {ts}\nm,host=b v={} {ts}\n",
                i % 17,
                3 * i
            ));
        }
        write(dir.path(), &body, t0 + 90 * M);
        let mut job = Job::open(dir.path(), plan.clone()).unwrap();
        let mut cache = RowCache::default();
        let mut now = t0 + 90 * M;
        job.run_once(now, &|| false).unwrap();
        let check = |cache: &mut RowCache, now: i64, label: &str| {
            let reader = Reader::open(dir.path()).unwrap();
            let series = refs(&reader);
            for (window, need) in [(3600 * NS, Need::MinMax), (900 * NS, Need::Sum)] {
                let from = now - window;
                let want = collect_window(&reader, &plan, &series, from, now, M, need, now);
                let got = collect_window_cached(
                    &reader,
                    &plan,
                    &series,
                    from,
                    now,
                    M,
                    need,
                    now,
                    Some(&mut *cache),
                    None,
                );
                assert_eq!(
                    plain(&got.unwrap()),
                    plain(&want.unwrap()),
                    "{label}, window {window}"
                );
            }
            cache.finish_cycle();
        };
        check(&mut cache, now, "first");
        assert!(cache.rows() > 2 * 60, "{}", cache.rows());
        // New data, rolled up, 15 s later each.
        for step in 1..=8 {
            let ts = now + 15 * NS;
            write(
                dir.path(),
                &format!("m,host=a v={step} {ts}\nm,host=b v={} {ts}\n", 100 + step),
                ts,
            );
            now = ts;
            if step % 2 == 0 {
                job.run_once(now, &|| false).unwrap();
            }
            check(&mut cache, now, &format!("step {step}"));
        }
        // A late point into a minute cached 5 minutes ago (not final yet) and one 40
        // minutes ago (final: counted late).
        for ago in [5 * M, 40 * M] {
            write(dir.path(), &format!("m,host=a v=1000 {}\n", now - ago), now);
            check(&mut cache, now, "late, before the rollup");
            job.run_once(now, &|| false).unwrap();
            check(&mut cache, now, "late, rolled up");
        }
        // Eviction of the oldest rows of the 1-minute tier (inside both windows).
        {
            let (mut conn, path) =
                crate::store::open(dir.path(), crate::store::Mode::Cursor).unwrap();
            let tx = conn.transaction().unwrap();
            let key = plan.tiers[0].key();
            let n = tiers::delete_oldest(&tx, &path, key, now - 50 * M, 10_000).unwrap();
            assert!(n > 0);
            tx.commit().unwrap();
        }
        check(&mut cache, now, "evicted");
        // A series appears, then the reads no longer ask for it.
        let ts = now + 15 * NS;
        write(dir.path(), &format!("m,host=c v=7 {ts}\n"), ts);
        now = ts;
        job.run_once(now, &|| false).unwrap();
        check(&mut cache, now, "appeared");
        let before = cache.rows();
        {
            let reader = Reader::open(dir.path()).unwrap();
            let one = &refs(&reader)[..1];
            let got = collect_window_cached(
                &reader,
                &plan,
                one,
                now - 3600 * NS,
                now,
                M,
                Need::MinMax,
                now,
                Some(&mut cache),
                None,
            )
            .unwrap();
            let want = collect_window(
                &reader,
                &plan,
                one,
                now - 3600 * NS,
                now,
                M,
                Need::MinMax,
                now,
            )
            .unwrap();
            assert_eq!(plain(&got), plain(&want));
            cache.finish_cycle();
        }
        assert!(cache.rows() < before, "{} < {before}", cache.rows());
    }
}
