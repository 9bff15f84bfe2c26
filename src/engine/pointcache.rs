//! A cache of raw points kept across alert evaluations, beside the [`super::rowcache`]'s
//! rollup rows: for each series a window reads from raw chunks (a `p99 over 5m` rule, whose
//! percentiles must be exact), the numeric points it read last time, so the next evaluation
//! decodes only the chunks committed since, in one scan by id for every cached series,
//! instead of every chunk of every window again (a 5-minute window read every 15 s is
//! 95 % the points it read the time before). Chunk ids only grow, so "committed since" is
//! "above the newest id seen". A committed chunk changes in three ways, each of which bumps a
//! counter in its own transaction: merging ([`crate::store::compact`]: the same points under
//! the largest id of a run, which may be a chunk not seen yet, so seen points would come
//! again; `merged_raw_chunks`), eviction (points gone; `evicted_raw_chunks`) and the clock
//! hold's correction (points retimed; `clock_fixed_points`). A change in any of them drops
//! every entry, and the next reads fill the cache again from the store. At most
//! [`MAX_POINTS`] points are held (16 bytes each: 4 MiB); a read past that is served from the
//! store and not kept. It never writes to the store and serves only the alert evaluator.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::Path;

use rusqlite::Connection;

use crate::store::bucket::numeric;
use crate::store::chunks::{self, Scan};
use crate::store::{counters, StoreError};

/// Most points held, every series together (16 bytes each: 4 MiB).
pub const MAX_POINTS: usize = 1 << 18;

/// Chunks committed since the last evaluation past which the cache starts over rather than
/// scanning them all (an evaluator that was paused for long: a full read of its windows is
/// then the cheaper way).
pub const MAX_NEW_CHUNKS: i64 = 50_000;

/// The counters whose change means committed chunks changed (see the module docs).
pub const CHANGE_COUNTERS: [&str; 3] = [
    counters::MERGED_RAW_CHUNKS,
    "evicted_raw_chunks",
    "clock_fixed_points",
];

/// One series' cached points: every numeric point of every chunk through the cache's
/// `seen` id with a time at or after `from`, in chunk id order.
#[derive(Debug)]
struct Entry {
    tagset: i64,
    from: i64,
    points: Vec<(i64, f64)>,
    /// The oldest `from` an evaluation read it with, and which evaluation that was.
    wanted_from: i64,
    used: u64,
}

/// The cache; see the module docs. One per evaluator, used by one evaluation at a time.
#[derive(Debug, Default)]
pub struct PointCache {
    /// By series id.
    entries: HashMap<i64, Entry>,
    /// Entries per tag set (the advance decodes only chunks of these).
    tagsets: HashMap<i64, usize>,
    points: usize,
    /// Every chunk at or below this id is in the entries it belongs to.
    seen: i64,
    /// The [`CHANGE_COUNTERS`] when `seen` was read.
    stamp: Option<[i64; 3]>,
    cycle: u64,
    /// The evaluation whose first read brought the entries up to date.
    advanced: Option<u64>,
    /// Points taken from the store so far (new chunks and filled entries).
    fetched: u64,
}

impl PointCache {
    /// Points held now.
    pub fn points(&self) -> usize {
        self.points
    }

    /// Points taken from the store so far, by both the advance and the reads that fill
    /// entries (what the cache saves is the window's points less these).
    pub fn fetched(&self) -> u64 {
        self.fetched
    }

    /// Series held now.
    pub fn series(&self) -> usize {
        self.entries.len()
    }

    /// Drops every entry.
    fn clear(&mut self) {
        self.entries.clear();
        self.tagsets.clear();
        self.points = 0;
    }

    /// Ends an evaluation: entries it did not read are dropped, and the others keep only
    /// points from the oldest `from` it read them with.
    pub fn finish_cycle(&mut self) {
        let cycle = self.cycle;
        let (tagsets, points) = (&mut self.tagsets, &mut self.points);
        self.entries.retain(|_, e| {
            if e.used != cycle {
                *points -= e.points.len();
                forget(tagsets, e.tagset);
                return false;
            }
            if e.wanted_from > e.from {
                let before = e.points.len();
                let from = e.wanted_from;
                e.points.retain(|p| p.0 >= from);
                *points -= before - e.points.len();
                e.from = from;
            }
            true
        });
        self.cycle += 1;
    }

    /// Brings the entries up to the store as the reader's transaction sees it (once per
    /// evaluation, at its first read): the chunks committed since, or nothing kept when
    /// committed chunks changed. Returns the newest chunk id, through which a read filling
    /// an entry must read.
    pub fn advance(&mut self, conn: &Connection, path: &Path) -> Result<i64, StoreError> {
        if self.advanced == Some(self.cycle) {
            return Ok(self.seen);
        }
        let mut stamp = [0i64; 3];
        for (slot, name) in stamp.iter_mut().zip(CHANGE_COUNTERS) {
            *slot = counters::get(conn, path, name)?;
        }
        let newest = chunks::newest_id(conn, path)?;
        if self.stamp != Some(stamp) || newest < self.seen || newest - self.seen > MAX_NEW_CHUNKS {
            self.clear();
        } else if newest > self.seen && !self.entries.is_empty() {
            let scan = Scan {
                after: Some(self.seen),
                through: Some(newest),
                ..Scan::default()
            };
            let (entries, tagsets) = (&mut self.entries, &self.tagsets);
            let (points, fetched) = (&mut self.points, &mut self.fetched);
            let read = chunks::scan(conn, path, &scan, |c| {
                if !tagsets.contains_key(&c.tagset_id) {
                    return Ok(ControlFlow::Continue(()));
                }
                c.decode(path, |ts, sid, v| {
                    if let (Some(e), Some(f)) = (entries.get_mut(&sid), numeric(&v)) {
                        if ts >= e.from {
                            e.points.push((ts, f));
                            *points += 1;
                            *fetched += 1;
                        }
                    }
                })?;
                Ok(ControlFlow::Continue(()))
            });
            if let Err(e) = read {
                // A chunk that does not decode: start over; the reads that fill the cache
                // again report it if it is in their window.
                tracing::debug!(error = %e, "alert point cache starts over");
                self.clear();
            }
        }
        self.stamp = Some(stamp);
        self.seen = newest;
        self.advanced = Some(self.cycle);
        Ok(newest)
    }

    /// Whether series `sid` is held with every point from `from` on.
    pub fn covers(&self, sid: i64, from: i64) -> bool {
        self.entries.get(&sid).is_some_and(|e| e.from <= from)
    }

    /// Calls `f` with each held point of `sid` in `[from, to]`, in chunk id order, and
    /// marks the entry read by this evaluation (see [`PointCache::covers`] first).
    pub fn serve(&mut self, sid: i64, from: i64, to: i64, mut f: impl FnMut(i64, f64)) {
        let cycle = self.cycle;
        if let Some(e) = self.entries.get_mut(&sid) {
            for &(ts, v) in &e.points {
                if ts >= from && ts <= to {
                    f(ts, v);
                }
            }
            if e.used != cycle {
                e.used = cycle;
                e.wanted_from = from;
            } else {
                e.wanted_from = e.wanted_from.min(from);
            }
        }
    }

    /// Keeps `points` (every numeric point of `sid` at or after `from` in the chunks through
    /// the id [`PointCache::advance`] returned, in chunk id order) as `sid`'s entry, unless
    /// that would hold more than [`MAX_POINTS`].
    pub fn insert(&mut self, sid: i64, tagset: i64, from: i64, points: Vec<(i64, f64)>) {
        if let Some(old) = self.entries.remove(&sid) {
            self.points -= old.points.len();
            forget(&mut self.tagsets, old.tagset);
        }
        self.fetched += points.len() as u64;
        if self.points + points.len() > MAX_POINTS {
            return;
        }
        self.points += points.len();
        *self.tagsets.entry(tagset).or_default() += 1;
        self.entries.insert(
            sid,
            Entry {
                tagset,
                from,
                points,
                wanted_from: from,
                used: self.cycle,
            },
        );
    }
}

/// Counts one entry of `tagset` less (its last one gone: the tag set too).
fn forget(tagsets: &mut HashMap<i64, usize>, tagset: i64) {
    if let Some(n) = tagsets.get_mut(&tagset) {
        *n -= 1;
        if *n == 0 {
            tagsets.remove(&tagset);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::engine::rowcache::RowCache;
    use crate::engine::{collect_window, collect_window_cached, Need, SeriesRef, StepAcc};
    use crate::rollup::{Job, Plan};
    use crate::store::compact::{self, Limits};
    use crate::store::testing::write_body as write;
    use crate::store::{dict, Reader};

    use super::*;

    const NS: i64 = 1_000_000_000;
    const M: i64 = 60 * NS;

    /// Every numeric series of measurement `m` (fields `v` and `w`).
    fn refs(reader: &Reader) -> Vec<SeriesRef> {
        let (conn, path) = (reader.conn(), reader.path());
        let mut out = Vec::new();
        for t in dict::tagsets(conn, path, Some("m")).unwrap() {
            for field in ["v", "w"] {
                if let Some(sid) = dict::numeric_series(conn, path, t.id, field).unwrap() {
                    out.push(SeriesRef { tagset: t.id, sid });
                }
            }
        }
        out
    }

    /// Count, min, max, sum in millionths, sorted values.
    type Summary = (u64, f64, f64, i64, Vec<f64>);

    /// A window as a comparable value: count, min, max, the sum to 1e-9 (the cache adds in
    /// chunk id order, a store read in index order) and the exact values, sorted.
    fn summary(v: &[Option<StepAcc>]) -> Vec<Option<Summary>> {
        v.iter()
            .map(|a| {
                a.as_ref().map(|a| {
                    let mut exact = a.exact.clone().unwrap_or_default();
                    exact.sort_by(f64::total_cmp);
                    (
                        a.acc.count,
                        a.acc.min,
                        a.acc.max,
                        (a.acc.sum * 1e6).round() as i64,
                        exact,
                    )
                })
            })
            .collect()
    }

    /// Cached and uncached raw window reads agree at every evaluation while points arrive
    /// (late, ahead of the clock, not numeric), small chunks are merged (a run that mixes
    /// chunks the cache has seen with one it has not), chunks in the window are evicted and
    /// retimed, and a series stops being read; and the cache is used (it decodes only what
    /// is new).
    #[test]
    fn cached_raw_windows_equal_store_reads_across_evaluations() {
        let dir = tempfile::tempdir().unwrap();
        let plan = Plan::from_config(&Config::default()).unwrap();
        let mut now = crate::now_ns() - 3600 * NS;
        let mut body = String::new();
        for i in 0..240 {
            let ts = now - 20 * M + i * 5 * NS;
            body.push_str(&format!(
                "m,host=a v={} {ts}\nm,host=b v={},w={}i {ts}\nm,host=c v={} {ts}\n",
                i % 17,
                3 * i,
                i,
                (i * 7) % 11
            ));
        }
        write(dir.path(), &body, now);
        let mut cache = RowCache::default();
        let check = |cache: &mut RowCache, now: i64, label: &str| {
            let reader = Reader::open(dir.path()).unwrap();
            let series = refs(&reader);
            assert_eq!(series.len(), 4);
            for window in [5 * M, 2 * M] {
                let from = now - window;
                let want = collect_window(&reader, &plan, &series, from, now, NS, Need::All, now);
                let got = collect_window_cached(
                    &reader,
                    &plan,
                    &series,
                    from,
                    now,
                    NS,
                    Need::All,
                    now,
                    Some(&mut *cache),
                    None,
                );
                let (got, want) = (summary(&got.unwrap()), summary(&want.unwrap()));
                if label == "first" {
                    assert!(got.iter().all(Option::is_some), "{got:?}");
                }
                assert_eq!(got, want, "{label}, window {window}");
            }
            cache.finish_cycle();
        };
        check(&mut cache, now, "first");
        assert_eq!(cache.points.series(), 4);
        // 5 minutes of 5 s points, less what the finished evaluation trimmed.
        assert!(cache.points.points() >= 4 * 60, "{}", cache.points.points());
        // Points arrive, 15 s apart: one late (4 minutes back), one ahead of the clock (it
        // enters the window two evaluations later), a string the windows skip.
        for step in 1..=6 {
            let ts = now + 15 * NS;
            let mut body = format!(
                "m,host=a v={step} {ts}\nm,host=b v={},w=2i {ts}\n",
                100 + step
            );
            match step {
                2 => body.push_str(&format!("m,host=c v=1000 {}\n", ts - 4 * M)),
                3 => body.push_str(&format!("m,host=c v=-5 {}\n", ts + 25 * NS)),
                4 => body.push_str(&format!("m,host=a v=\"text\" {}\n", ts - NS)),
                _ => {}
            }
            write(dir.path(), &body, ts);
            now = ts;
            let fetched = cache.points.fetched();
            check(&mut cache, now, &format!("step {step}"));
            // Only the new points came from the store (two reads of each window).
            let new = cache.points.fetched() - fetched;
            assert!((3..=4).contains(&new), "step {step}: {new} points fetched");
        }
        let (conn, path) = crate::store::open(dir.path(), crate::store::Mode::Cursor).unwrap();
        let decoded_before = cache.points.points();
        // A merge whose runs end in a chunk committed after the last evaluation: the merged
        // chunk keeps that newer id, so it holds points the cache has and is new to it.
        now += 15 * NS;
        write(
            dir.path(),
            &format!("m,host=a v=55 {now}\nm,host=b v=56 {now}\n"),
            now,
        );
        drop(conn);
        {
            let (mut conn, path) =
                crate::store::open(dir.path(), crate::store::Mode::Cursor).unwrap();
            let all = Limits {
                all: true,
                ..Limits::default()
            };
            let pass = compact::merge_step(&mut conn, &path, &all)
                .unwrap()
                .unwrap();
            assert!(pass.removed > 10, "{pass:?}");
        }
        check(&mut cache, now, "merged");
        assert!(cache.points.points() > 0 && decoded_before > 0);
        check(&mut cache, now + NS, "after the merge");
        // The clock hold's correction moves a chunk in the window by two minutes.
        {
            let (mut conn, path) =
                crate::store::open(dir.path(), crate::store::Mode::Cursor).unwrap();
            let newest = chunks::newest_id(&conn, &path).unwrap();
            let tx = conn.transaction().unwrap();
            let (lo, hi, data) = tx
                .query_row(
                    "SELECT ts_min, ts_max, data FROM chunks WHERE id = ?1",
                    [newest],
                    |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, Vec<u8>>(2)?,
                        ))
                    },
                )
                .unwrap();
            let (out, nlo, nhi, moved) =
                crate::store::codec::retime_chunk(&data, lo, |t| t - 2 * M).unwrap();
            chunks::retime(&tx, &path, newest, nlo, nhi, &out).unwrap();
            counters::bump(&tx, &path, "clock_fixed_points", moved as i64).unwrap();
            tx.commit().unwrap();
            assert!(nhi < hi);
        }
        check(&mut cache, now + NS, "retimed");
        // The disk budget evicts every raw chunk the tiers have rolled up.
        {
            let mut small = plan.clone();
            small.max_bytes = 1;
            let mut job = Job::open(dir.path(), small).unwrap();
            let report = job.run_once(now + 2 * NS, &|| false).unwrap();
            assert!(report.evicted_chunks > 0, "{report:?}");
        }
        now += 15 * NS;
        write(
            dir.path(),
            &format!("m,host=a v=1 {now}\nm,host=b v=2,w=3i {now}\nm,host=c v=4 {now}\n"),
            now,
        );
        check(&mut cache, now, "evicted");
        // A series no evaluation reads any more leaves the cache.
        {
            let reader = Reader::open(dir.path()).unwrap();
            let one = &refs(&reader)[..1];
            collect_window_cached(
                &reader,
                &plan,
                one,
                now - 5 * M,
                now,
                NS,
                Need::All,
                now,
                Some(&mut cache),
                None,
            )
            .unwrap();
            cache.finish_cycle();
        }
        assert_eq!(cache.points.series(), 1);
        let _ = path;
    }
}
