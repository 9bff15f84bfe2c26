//! Where a query's data comes from and reading it: [`choose_source`] picks raw points or a
//! rollup tier for a step (pure), and [`collect`] reads one field of the matching tag sets
//! into [`Steps`] from that tier plus the raw chunks it has not rolled up yet (past a coarse
//! tier that waits for its bucket to close, a finer tier's rows and the chunks past that
//! one's cursor: [`finer_from`]). Read-only;
//! it never aggregates steps into answers (that is `query` and `inference`).

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;

use super::rowcache::{self, RowCache};
use super::{Agg, EngineError, StepAcc, Steps, MAX_STEPS};
use crate::model::Value;
use crate::rollup::{Plan, Tier};
use crate::store::bucket::{bucket_start, numeric, Acc};
use crate::store::chunks::{self, Scan};
use crate::store::{dict, tiers, HeldSnapshot, Reader, StoreError};

/// Where a query's data comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Raw points.
    Raw,
    /// The plan's tier at this index.
    Tier(usize),
}

/// Picks the source for `step` over a range starting at `from` (pure; see the module docs).
pub fn choose_source(plan: &Plan, step_ns: i64, from: i64, now: i64) -> Source {
    let fits: Vec<usize> = plan
        .tiers
        .iter()
        .enumerate()
        .filter(|(_, t)| t.res_ns <= step_ns && step_ns % t.res_ns == 0)
        .map(|(i, _)| i)
        .collect();
    let covers = |t: &Tier| {
        t.retention_ns
            .map_or(true, |r| from >= now.saturating_sub(r))
    };
    if let Some(&i) = fits.iter().rev().find(|&&i| covers(&plan.tiers[i])) {
        return Source::Tier(i);
    }
    fits.iter()
        .copied()
        .max_by_key(|&i| plan.tiers[i].retention_ns.unwrap_or(i64::MAX))
        .map_or(Source::Raw, Source::Tier)
}

/// A finer tier read in place of the chosen one's raw tail (see [`finer_from`]).
#[derive(Clone, Copy)]
pub(super) struct Finer<'a> {
    pub(super) tier: &'a Tier,
    /// Its cursor: its rows hold the points of every chunk up to this id.
    pub(super) cursor: i64,
    /// The chosen tier's rows are read before this time, the finer tier's from it on.
    pub(super) split: i64,
}

/// The finer tier that stands in for `tier`'s raw tail, if one would. A coarse tier waits
/// for its buckets to close (the 1h tier folds each hour once, when it has:
/// `Plan::fold_every_ns`), so the chunks past its cursor can be an hour of raw points
/// (360,000 for a series at 100 a second, ~25 ms to read and merge). The coarsest tier finer
/// than it whose buckets divide its own (the 1m tier, folded each minute) holds the points
/// of every chunk up to its own cursor; from `split`, the start of `tier`'s bucket of the
/// first chunk it has not folded, its rows stand in for `tier`'s.
/// Each point is then read once: from `tier`'s rows before `split`, from the chunks past
/// `tier`'s cursor before `split` (points that came late), from the finer rows from `split`
/// on, and from the chunks past the finer cursor from `split` on. `None` when `tier` has
/// nothing unfolded in the range, or no finer tier is ahead of it and covers `split`.
pub(super) fn finer_from<'a>(
    reader: &Reader,
    plan: &'a Plan,
    tier: &Tier,
    cursor: i64,
    to: i64,
    now: i64,
) -> Result<Option<Finer<'a>>, EngineError> {
    let (conn, path) = (reader.conn(), reader.path());
    let Some(f) = plan
        .tiers
        .iter()
        .filter(|f| f.res_ns < tier.res_ns && tier.res_ns % f.res_ns == 0)
        .max_by_key(|f| f.res_ns)
    else {
        return Ok(None);
    };
    let first = chunks::first_ts_min_after(conn, path, cursor, None)?;
    let Some(split) = first.map(|ts| bucket_start(ts, tier.res_ns)) else {
        return Ok(None);
    };
    let f_cursor = tiers::state(conn, path, f.key())?.cursor;
    let covers = f
        .retention_ns
        .map_or(true, |r| split >= now.saturating_sub(r));
    Ok(
        (f_cursor > cursor && split <= to && covers).then_some(Finer {
            tier: f,
            cursor: f_cursor,
            split,
        }),
    )
}

/// The per-step state: the aggregate and, from raw points, every value (exact percentiles).
pub use crate::store::tiers::Need;

/// What a query of `agg` reads from each rollup row.
pub fn need_of(agg: Agg) -> Need {
    match agg {
        Agg::Mean | Agg::Sum | Agg::Count => Need::Sum,
        Agg::Min | Agg::Max => Need::MinMax,
        Agg::Last | Agg::Rate => Need::FirstLast,
        Agg::Quantile(_) => Need::Sketch,
    }
}

/// What [`collect`] gathers: the source's name and, per tag set, its tags and steps.
pub struct Collected {
    /// `raw` or the tier's name.
    pub tier: String,
    /// First step start.
    pub from: i64,
    /// Per matching tag set.
    pub sets: Vec<(BTreeMap<String, String>, Steps)>,
}

/// Reads `field` of every tag set of `measurement` matching `tags` into steps of `step_ns`.
#[allow(clippy::too_many_arguments)]
pub fn collect(
    reader: &Reader,
    plan: &Plan,
    measurement: &str,
    field: &str,
    tags: &[(String, String)],
    from: i64,
    to: i64,
    step_ns: i64,
    need: Need,
    now: i64,
) -> Result<Collected, EngineError> {
    if step_ns <= 0 {
        return Err(EngineError::BadQuery("`step` must be positive".into()));
    }
    let from = bucket_start(from, step_ns);
    if to < from {
        return Err(EngineError::BadQuery(format!(
            "`from` is after `to` ({to})"
        )));
    }
    if (to - from) / step_ns > MAX_STEPS {
        return Err(EngineError::BadQuery(format!(
            "{} steps requested, at most {MAX_STEPS}: use a larger `step` or a shorter range",
            (to - from) / step_ns
        )));
    }
    let (conn, path) = (reader.conn(), reader.path());
    let source = choose_source(plan, step_ns, from, now);
    let (tier_name, tier) = match source {
        Source::Raw => ("raw".to_string(), None),
        Source::Tier(i) => (plan.tiers[i].name.clone(), Some(&plan.tiers[i])),
    };
    let cursor: i64 = match tier {
        Some(t) => tiers::state(conn, path, t.key())?.cursor,
        None => 0,
    };
    // The matching tag sets' series, each with its steps.
    let mut found: Vec<(BTreeMap<String, String>, i64, i64, ByStep)> = Vec::new();
    for set in reader.tagsets_matching(measurement, tags)? {
        let Some(sid) = dict::numeric_series(conn, path, set.id, field)? else {
            continue;
        };
        let steps = ByStep {
            steps: Steps::default(),
            step_ns,
        };
        found.push((set.tags, set.id, sid, steps));
    }
    let finer = match tier {
        Some(t) => finer_from(reader, plan, t, cursor, to, now)?,
        None => None,
    };
    // Each tier's rows of all of them in one read: the recent ones of every series at once
    // (a scan of the span's buckets when they are many of a bucket's rows, see
    // `tiers::read_ranges`), then each series' settled range. With a finer tier standing in
    // from `split` on, the tier's rows end before it.
    let sids: Vec<i64> = found.iter().map(|f| f.2).collect();
    let mut rows = Vec::new();
    if let Some(t) = tier {
        let hi = finer.map_or(to, |f| to.min(f.split.saturating_sub(1)));
        rows.push((t, bucket_start(from, t.res_ns), hi));
    }
    if let Some(f) = finer {
        rows.push((f.tier, f.split.max(bucket_start(from, f.tier.res_ns)), to));
    }
    for (t, lo, hi) in rows {
        tiers::read_ranges(
            conn,
            path,
            t.key(),
            &sids,
            lo,
            hi,
            need,
            |i, bucket, acc| {
                let acc = acc.map_err(|()| EngineError::Corrupt(path.to_path_buf()))?;
                add_row(&mut found[i].3, bucket, acc);
                Ok::<_, EngineError>(())
            },
        )?;
    }
    // Raw points of all of them (each tag set's chunks in id order, the unindexed tail read
    // once a pass): all points for the raw source, else only chunks the tier has not rolled
    // up yet; with a finer tier from `split` on, the points before it of the chunks past the
    // tier's cursor (late ones) and the points from it on of the chunks past the finer
    // tier's cursor.
    let exact = tier.is_none();
    let of_tagset: HashMap<i64, usize> = found.iter().enumerate().map(|(i, f)| (f.1, i)).collect();
    let passes = match finer {
        None => vec![(cursor, from, to)],
        Some(f) => vec![
            (cursor, from, to.min(f.split.saturating_sub(1))),
            (f.cursor, from.max(f.split), to),
        ],
    };
    let tagsets: Vec<i64> = found.iter().map(|f| f.1).collect();
    for (after, lo, hi) in passes.into_iter().filter(|p| p.1 <= p.2) {
        let scan = Scan {
            after: Some(after),
            ts_from: Some(lo),
            ts_to: Some(hi),
            ..Scan::default()
        };
        chunks::scan_tagsets(conn, path, &scan, tagsets.iter().copied(), |c| {
            let Some(&i) = of_tagset.get(&c.tagset_id) else {
                return Ok(ControlFlow::Continue(()));
            };
            let (_, _, sid, slots) = &mut found[i];
            let sid = *sid;
            c.decode(path, |ts, s, v| {
                if s == sid && ts >= lo && ts <= hi {
                    add_raw(slots, ts, &v, exact);
                }
            })?;
            Ok(ControlFlow::Continue(()))
        })?;
    }
    // The points the writer held when the read began (inside `Reader::read_with_held`):
    // none of them is in a chunk or a tier row yet.
    if let Some(held) = &*reader.held() {
        for (_, tagset, sid, slots) in &mut found {
            for (ts, s, v) in held.values_in(*tagset, from, to) {
                if s == *sid {
                    add_raw(slots, ts, v, exact);
                }
            }
        }
    }
    let sets = found
        .into_iter()
        .filter(|f| !f.3.steps.is_empty())
        .map(|f| (f.0, f.3.steps))
        .collect();
    Ok(Collected {
        tier: tier_name,
        from,
        sets,
    })
}

/// Where [`read_series`] puts a point or a rollup row starting at a time.
trait Slots {
    fn at(&mut self, t: i64) -> &mut StepAcc;
}

/// One slot per step (what [`collect`] returns).
struct ByStep {
    steps: Steps,
    step_ns: i64,
}

impl Slots for ByStep {
    fn at(&mut self, t: i64) -> &mut StepAcc {
        self.steps.at(bucket_start(t, self.step_ns))
    }
}

/// One slot for the whole range (what [`collect_window`] returns).
impl Slots for StepAcc {
    fn at(&mut self, _t: i64) -> &mut StepAcc {
        self
    }
}

/// Adds a raw point (from a chunk or held) to its step of [`collect`], and its exact value
/// when the raw source answers percentiles.
fn add_raw(slots: &mut ByStep, ts: i64, v: &Value, exact: bool) {
    if let Some(f) = numeric(v) {
        let step = slots.at(ts);
        step.acc.add(ts, f);
        if exact {
            step.exact.get_or_insert_with(Vec::new).push(f);
        }
    }
}

/// Adds a tier row starting at `bucket` to its slot.
fn add_row(slots: &mut impl Slots, bucket: i64, acc: Acc) {
    let slot = &mut slots.at(bucket).acc;
    if slot.count == 0 {
        *slot = acc;
    } else {
        slot.merge(&acc);
    }
}

/// A series resolved by the caller (once for many reads): its tag set and numeric series ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesRef {
    /// `tagsets.id`.
    pub tagset: i64,
    /// `series.id`.
    pub sid: i64,
}

/// A tier's raw tail is read in one scan of the chunks after its cursor (all tag sets at
/// once, each chunk decoded once) while it holds at most this many chunks per tag set read;
/// a longer tail (rollups behind) is read per tag set through the `(tagset_id, ts_max)`
/// index instead.
const TAIL_SCAN_PER_TAGSET: i64 = 64;

/// What [`collect`] would read for each of `series` from the same source and range (`from`
/// rounded down to `step_ns`, the source picked for `step_ns`), folded into one [`StepAcc`]
/// per series instead of one per step (for a caller that wants the window's total, e.g. an
/// alert rule). `None` where a series has no data in the range.
///
/// Each chunk is decoded once for all the series of its tag set (and, for a tier's short
/// raw tail, in one scan for all tag sets); a point adds to the sketch only when `need`
/// reads percentiles from a tier, and is kept as an exact value only when `need` reads
/// percentiles from raw points: a mean, min, max, sum, count, last or rate builds neither.
#[allow(clippy::too_many_arguments)]
pub fn collect_window(
    reader: &Reader,
    plan: &Plan,
    series: &[SeriesRef],
    from: i64,
    to: i64,
    step_ns: i64,
    need: Need,
    now: i64,
) -> Result<Vec<Option<StepAcc>>, EngineError> {
    collect_window_cached(
        reader, plan, series, from, to, step_ns, need, now, None, None,
    )
}

/// [`collect_window`], reading the tier's rows through `cache` (kept across calls, see
/// [`RowCache`]) when it is given and `need` is cacheable, and a raw window's points
/// through its [`super::pointcache::PointCache`] (the results are the same), and adding
/// the points of `held`: what the writer held for its next commit when the reader's
/// transaction began ([`crate::store::HeldView::snapshot_with`]), none of it in the store.
#[allow(clippy::too_many_arguments)]
pub fn collect_window_cached(
    reader: &Reader,
    plan: &Plan,
    series: &[SeriesRef],
    from: i64,
    to: i64,
    step_ns: i64,
    need: Need,
    now: i64,
    mut cache: Option<&mut RowCache>,
    held: Option<&HeldSnapshot>,
) -> Result<Vec<Option<StepAcc>>, EngineError> {
    if step_ns <= 0 {
        return Err(EngineError::BadQuery("`step` must be positive".into()));
    }
    let from = bucket_start(from, step_ns);
    if to < from {
        return Err(EngineError::BadQuery(format!(
            "`from` is after `to` ({to})"
        )));
    }
    if (to - from) / step_ns > MAX_STEPS {
        return Err(EngineError::BadQuery(format!(
            "{} steps requested, at most {MAX_STEPS}: use a larger `step` or a shorter range",
            (to - from) / step_ns
        )));
    }
    let (conn, path) = (reader.conn(), reader.path());
    let tier = match choose_source(plan, step_ns, from, now) {
        Source::Raw => None,
        Source::Tier(i) => Some(&plan.tiers[i]),
    };
    let state = match tier {
        Some(t) => tiers::state(conn, path, t.key())?,
        None => tiers::State::default(),
    };
    let cursor = if tier.is_some() { state.cursor } else { 0 };
    let mut out: Vec<StepAcc> = series.iter().map(|_| StepAcc::default()).collect();
    if let Some(t) = tier {
        let lo = bucket_start(from, t.res_ns);
        let sids: Vec<i64> = series.iter().map(|s| s.sid).collect();
        let mut merge = |i: usize, acc: Result<Acc, ()>| {
            let acc = acc.map_err(|()| EngineError::Corrupt(path.to_path_buf()))?;
            let slot = &mut out[i];
            if slot.acc.count == 0 {
                slot.acc = acc;
            } else {
                slot.acc.merge(&acc);
            }
            Ok::<_, EngineError>(())
        };
        match cache.as_deref_mut() {
            Some(c) if rowcache::cacheable(need) => c.read_ranges(
                conn,
                path,
                (t.key(), t.res_ns),
                plan.lateness_ns,
                &state,
                &sids,
                lo,
                to,
                need,
                merge,
            )?,
            _ => tiers::read_ranges(conn, path, t.key(), &sids, lo, to, need, |i, _, acc| {
                merge(i, acc)
            })?,
        }
    }
    let percentiles = matches!(need, Need::Sketch | Need::All);
    let (sketch, exact) = (percentiles && tier.is_some(), percentiles && tier.is_none());
    // Held points: the caller's snapshot, else the reader's (`Reader::read_with_held`).
    let reader_held = reader.held();
    let held = held.or(reader_held.as_ref());
    // The wanted series of each tag set (a chunk holds one tag set's fields): (sid, slot).
    let mut by_tagset: BTreeMap<i64, Vec<(i64, usize)>> = BTreeMap::new();
    for (i, s) in series.iter().enumerate() {
        by_tagset.entry(s.tagset).or_default().push((s.sid, i));
    }
    // One raw numeric point of slot `i` within `[from, to]`, from a chunk or held.
    let mut point = |i: usize, ts: i64, f: f64| {
        let slot = &mut out[i];
        if sketch {
            slot.acc.add(ts, f);
        } else {
            slot.acc.add_plain(ts, f);
        }
        if exact {
            slot.exact.get_or_insert_with(Vec::new).push(f);
        }
    };
    // The slot of series `sid` in a tag set's wanted series (the first, if asked twice).
    let slot_of =
        |want: &[(i64, usize)], sid: i64| want.iter().find(|(s, _)| *s == sid).map(|&(_, i)| i);
    if let Some(held) = held {
        for (tagset, want) in &by_tagset {
            for (ts, sid, v) in held.values_in(*tagset, from, to) {
                if let (Some(i), Some(f)) = (slot_of(want, sid), numeric(v)) {
                    point(i, ts, f);
                }
            }
        }
    }
    // A raw window read through the evaluator's point cache: the tag sets whose every
    // wanted series it holds are served from it, the others read from the store in full
    // and kept.
    if let (None, Some(c)) = (tier, cache) {
        let cache = &mut c.points;
        let through = cache.advance(conn, path)?;
        let mut missing: Vec<i64> = Vec::new();
        for (tagset, want) in &by_tagset {
            if !want.iter().all(|&(sid, _)| cache.covers(sid, from)) {
                missing.push(*tagset);
                continue;
            }
            for &(sid, i) in want {
                if slot_of(want, sid) == Some(i) {
                    cache.serve(sid, from, to, |ts, f| point(i, ts, f));
                }
            }
        }
        if !missing.is_empty() {
            // Every point from `from` on (later than `to` too: a point stamped ahead of
            // the clock is in a later window), through the id the cache has seen.
            let mut fresh: BTreeMap<i64, (i64, Vec<(i64, f64)>)> = BTreeMap::new();
            for tagset in &missing {
                for &(sid, _) in by_tagset.get(tagset).map_or(&[][..], Vec::as_slice) {
                    fresh.entry(sid).or_insert((*tagset, Vec::new()));
                }
            }
            let scan = Scan {
                through: Some(through),
                ts_from: Some(from),
                ..Scan::default()
            };
            chunks::scan_tagsets(conn, path, &scan, missing, |c| {
                c.decode(path, |ts, sid, v| {
                    if let (true, Some((_, pts)), Some(f)) =
                        (ts >= from, fresh.get_mut(&sid), numeric(&v))
                    {
                        pts.push((ts, f));
                    }
                })?;
                Ok(ControlFlow::Continue(()))
            })?;
            for (sid, (tagset, pts)) in fresh {
                if let Some(i) = by_tagset.get(&tagset).and_then(|w| slot_of(w, sid)) {
                    for &(ts, f) in &pts {
                        if ts <= to {
                            point(i, ts, f);
                        }
                    }
                }
                cache.insert(sid, tagset, from, pts);
            }
        }
        return Ok(finished(out));
    }
    let mut add = |c: &chunks::Chunk<'_>| -> Result<ControlFlow<()>, StoreError> {
        let Some(want) = by_tagset.get(&c.tagset_id) else {
            return Ok(ControlFlow::Continue(()));
        };
        c.decode(path, |ts, sid, v| {
            if ts >= from && ts <= to {
                if let (Some(i), Some(f)) = (slot_of(want, sid), numeric(&v)) {
                    point(i, ts, f);
                }
            }
        })?;
        Ok(ControlFlow::Continue(()))
    };
    let one_scan = tier.is_some()
        && chunks::count_after(conn, path, cursor)?
            <= TAIL_SCAN_PER_TAGSET.saturating_mul(by_tagset.len() as i64);
    // Raw points: all of them for the raw source, else only chunks the tier has not rolled
    // up yet.
    let scan = Scan {
        after: Some(cursor),
        ts_from: Some(from),
        ts_to: Some(to),
        ..Scan::default()
    };
    if one_scan {
        chunks::scan(conn, path, &scan, &mut add)?;
    } else {
        let tagsets: Vec<i64> = by_tagset.keys().copied().collect();
        chunks::scan_tagsets(conn, path, &scan, tagsets, &mut add)?;
    }
    Ok(finished(out))
}

/// Each series' window: `None` where it has no data.
fn finished(out: Vec<StepAcc>) -> Vec<Option<StepAcc>> {
    out.into_iter()
        .map(|a| (a.acc.count > 0 || a.exact.is_some()).then_some(a))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::NS;
    use crate::rollup::{RetentionConfig, RollupConfig};

    fn plan() -> Plan {
        Plan::new(&RollupConfig::default(), &RetentionConfig::default()).unwrap()
    }

    #[test]
    fn source_is_the_coarsest_tier_that_fits_and_covers() {
        let p = plan();
        let now = 400 * 86_400 * NS;
        let h = 3600 * NS;
        assert_eq!(choose_source(&p, NS, now - h, now), Source::Raw);
        assert_eq!(choose_source(&p, 90 * NS, now - h, now), Source::Raw);
        assert_eq!(
            choose_source(&p, 60 * NS, now - 24 * h, now),
            Source::Tier(0)
        );
        assert_eq!(
            choose_source(&p, 300 * NS, now - 24 * h, now),
            Source::Tier(0)
        );
        assert_eq!(choose_source(&p, h, now - 24 * h, now), Source::Tier(1));
        // 1 min retention (30 d) does not cover 60 days: the 1 h tier still fits a 2 h step.
        assert_eq!(
            choose_source(&p, 2 * h, now - 60 * 24 * h, now),
            Source::Tier(1)
        );
        // A 1 min step over 60 days: no tier both fits and covers; the longest-kept one that
        // fits answers.
        assert_eq!(
            choose_source(&p, 60 * NS, now - 60 * 24 * h, now),
            Source::Tier(0)
        );
    }
}
