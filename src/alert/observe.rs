//! What a rule sees at one evaluation: its value per instance (group labels -> value). A
//! series rule reads through the query engine ([`crate::engine::collect`]: the coarsest
//! rollup tier that fits plus the raw tail not rolled up yet, as a dashboard query does),
//! over the window ending at the evaluation, grouped by the rule's `group_by`; the built-ins
//! that are not series aggregates read the agent's own state: its counters (dropped and
//! rejected points), the forwarders' status (backlog age), the store's size against the
//! budget, and the clock. Read-only; it never decides a state.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use super::rules::{Rule, SeriesSpec, Watch};
use crate::engine::rowcache::RowCache;
use crate::engine::{collect_window_cached, need_of, value, Agg, EngineError, SeriesRef, StepAcc};
use crate::rollup::Plan;
use crate::stats::Stats;
use crate::store::dict::{self, Tagset};
use crate::store::tiers::Need;
use crate::store::{HeldSnapshot, Reader};

const NS: i64 = 1_000_000_000;

/// An instance's group labels.
pub type Labels = BTreeMap<String, String>;

/// The agent state the non-series built-ins read.
#[derive(Clone)]
pub struct Inputs {
    /// The agent's counters.
    pub stats: Arc<Stats>,
    /// The forwarders' status.
    pub forward: crate::status::Live<crate::forward::ForwardStatus>,
    /// The database file (its size, with the WAL).
    pub db_path: PathBuf,
    /// `[retention] max_bytes` (0: no budget).
    pub max_bytes: u64,
    /// `[clock] min_valid`, ns.
    pub clock_floor_ns: i64,
}

/// Samples of the dropped + rejected counter, to tell how many went in a window.
#[derive(Debug, Default, Clone)]
pub struct DropHistory(VecDeque<(i64, u64)>);

impl DropHistory {
    /// Starts at zero at `start_ns` (the counters start at zero with the process).
    pub fn new(start_ns: i64) -> DropHistory {
        DropHistory(VecDeque::from([(start_ns, 0)]))
    }

    /// Records `total` at `now` and returns how much it grew over the last `window_ns`.
    pub fn observe(&mut self, now: i64, total: u64, window_ns: i64) -> u64 {
        self.0.push_back((now, total));
        // Keep one sample at or before the window's start as the base.
        while self.0.len() > 2 && self.0[1].0 <= now - window_ns {
            self.0.pop_front();
        }
        let base = self.0.front().map_or(0, |s| s.1);
        total.saturating_sub(base)
    }
}

/// The step a window is read in: raw points (1 s steps, exact percentiles) below 15 minutes
/// or when the window is not whole minutes; the 1-minute tier plus the raw tail up to a day;
/// whole hours from the hour tier beyond. The window's start is rounded down to a step.
pub fn step_for(window_ns: i64) -> i64 {
    let (m, h) = (60 * NS, 3600 * NS);
    if window_ns >= 24 * h && window_ns % h == 0 {
        h
    } else if window_ns >= 15 * m && window_ns % m == 0 {
        m
    } else {
        NS
    }
}

/// What one series read covers: one field of a measurement over one window (its range,
/// step and tier follow from the window and the cycle's time).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ReadKey {
    measurement: String,
    field: String,
    window_ns: i64,
}

/// One read shared by the cycle's rules over the same [`ReadKey`]: the union of the series
/// they match and of what their aggs need, read once (on first use) for all of them.
struct Shared {
    series: BTreeSet<SeriesRef>,
    need: Need,
    /// After the read: the series with data in the window.
    read: Option<HashMap<SeriesRef, StepAcc>>,
}

/// What one evaluation cycle resolves once for all its rules: the tag sets of each
/// measurement (read and parsed once, not once per rule), each (tag set, field)'s numeric
/// series id, and (after [`Cycle::prepare`]) one read per measurement, field and window for
/// every rule over it. Lives for one cycle only, so a tag set or field that appears is seen
/// by the next cycle (measured: the per-rule lookup over the measurement's 1,000 tag sets
/// was most of a cycle, benches/alerts.rs).
#[derive(Default)]
pub struct Cycle {
    tagsets: HashMap<String, Vec<Tagset>>,
    /// Per measurement: tag key -> tag value -> its tag sets' indices in `tagsets`, in
    /// order (a rule's tag filter finds its tag sets without scanning them all).
    by_tag: HashMap<String, TagIndex>,
    series: HashMap<(i64, String), Option<i64>>,
    shared: HashMap<ReadKey, Shared>,
    reads: usize,
    /// The rollup rows kept across cycles (the evaluator's, lent for the cycle): a shared
    /// read takes from the store only the rows it does not hold (`None`: reads them all).
    rows: Option<RowCache>,
    /// The points the writer held when the cycle's read transaction began, read with the
    /// store's (`None`: the store's alone).
    held: Option<HeldSnapshot>,
}

/// Tag key -> tag value -> tag set indices, ascending.
type TagIndex = HashMap<String, HashMap<String, Vec<usize>>>;

/// The need covering both `a` and `b`.
fn union(a: Need, b: Need) -> Need {
    if a == b {
        a
    } else {
        Need::All
    }
}

/// What a read for `s`'s aggs needs from each rollup row.
fn need_of_spec(s: &SeriesSpec) -> Need {
    match s.ratio_of {
        Some(r) => union(need_of(s.agg), need_of(r)),
        None => need_of(s.agg),
    }
}

/// The built-in temperature margin reads the last `field` of each GPU over the window.
fn gpu_spec(field: &str, window_ns: i64) -> SeriesSpec {
    SeriesSpec {
        measurement: "gpu".into(),
        fields: vec![field.into()],
        tags: Vec::new(),
        group_by: vec!["gpu".into()],
        exclude: Vec::new(),
        agg: Agg::Last,
        ratio_of: None,
        window_ns,
    }
}

/// The series specs a rule reads.
fn specs_of(rule: &Rule) -> Vec<SeriesSpec> {
    match &rule.watch {
        Watch::Series(s) => vec![s.clone()],
        Watch::GpuTempMargin { window_ns } => vec![
            gpu_spec("temp_c", *window_ns),
            gpu_spec("temp_slowdown_c", *window_ns),
        ],
        _ => Vec::new(),
    }
}

impl Cycle {
    /// Groups the series reads of `rules` by measurement, field and window, so that each
    /// is read once for all the rules over it (on first use, by [`series`]). A tag-set
    /// lookup that fails here leaves its rules to read on their own (and report the error).
    pub fn prepare(&mut self, reader: &Reader, rules: &[Rule]) {
        for rule in rules {
            for spec in specs_of(rule) {
                let need = need_of_spec(&spec);
                for field in &spec.fields {
                    let Ok(found) = self.matching(reader, &spec, field) else {
                        continue;
                    };
                    let key = ReadKey {
                        measurement: spec.measurement.clone(),
                        field: field.clone(),
                        window_ns: spec.window_ns,
                    };
                    let shared = self.shared.entry(key).or_insert_with(|| Shared {
                        series: BTreeSet::new(),
                        need,
                        read: None,
                    });
                    shared.need = union(shared.need, need);
                    shared.series.extend(found.into_iter().map(|(r, _)| r));
                }
            }
        }
    }

    /// A cycle that reads through `rows` (the previous cycle's, see [`Cycle::finish`]).
    pub fn with_rows(rows: Option<RowCache>) -> Cycle {
        Cycle {
            rows,
            ..Cycle::default()
        }
    }

    /// Reads the points in `held` with the store's: what the writer held for its next
    /// commit when the cycle's read transaction began.
    pub fn with_held(mut self, held: Option<HeldSnapshot>) -> Cycle {
        self.held = held;
        self
    }

    /// Ends the cycle: the row cache for the next one.
    pub fn finish(mut self) -> Option<RowCache> {
        if let Some(r) = &mut self.rows {
            r.finish_cycle();
        }
        self.rows
    }

    /// Reads done so far (shared and not).
    pub fn reads(&self) -> usize {
        self.reads
    }

    /// The numeric series of `field` of every tag set of `s.measurement` whose tags include
    /// `s.tags` and none of `s.exclude`, with the tag set's index in `self.tagsets`.
    fn matching(
        &mut self,
        reader: &Reader,
        s: &SeriesSpec,
        field: &str,
    ) -> Result<Vec<(SeriesRef, usize)>, EngineError> {
        let (conn, path) = (reader.conn(), reader.path());
        if !self.tagsets.contains_key(&s.measurement) {
            let sets = dict::tagsets(conn, path, Some(&s.measurement))?;
            let mut index = TagIndex::new();
            for (i, set) in sets.iter().enumerate() {
                for (k, v) in &set.tags {
                    index
                        .entry(k.clone())
                        .or_default()
                        .entry(v.clone())
                        .or_default()
                        .push(i);
                }
            }
            self.by_tag.insert(s.measurement.clone(), index);
            self.tagsets.insert(s.measurement.clone(), sets);
        }
        let sets = &self.tagsets[&s.measurement];
        // The candidates: the tag sets with the filter's rarest tag (all without a filter).
        let index = &self.by_tag[&s.measurement];
        let mut candidates: Option<&[usize]> = None;
        for (k, v) in &s.tags {
            let with = index
                .get(k.as_str())
                .and_then(|vals| vals.get(v.as_str()))
                .map_or(&[][..], Vec::as_slice);
            if candidates.map_or(true, |c| with.len() < c.len()) {
                candidates = Some(with);
            }
        }
        let all: Vec<usize>;
        let candidates = match candidates {
            Some(c) => c,
            None => {
                all = (0..sets.len()).collect();
                &all
            }
        };
        let mut out = Vec::new();
        for &i in candidates {
            let set = &sets[i];
            if !s.tags.iter().all(|(k, v)| set.tags.get(k) == Some(v))
                || s.exclude.iter().any(|(k, v)| set.tags.get(k) == Some(v))
            {
                continue;
            }
            let key = (set.id, field.to_string());
            let sid = match self.series.get(&key) {
                Some(s) => *s,
                None => {
                    let s = dict::numeric_series(conn, path, set.id, field)?;
                    self.series.insert(key, s);
                    s
                }
            };
            if let Some(sid) = sid {
                out.push((
                    SeriesRef {
                        tagset: set.id,
                        sid,
                    },
                    i,
                ));
            }
        }
        Ok(out)
    }

    /// The window's data of `refs`: from the shared read of `key` when it covers them and
    /// `need` (read now if not yet), else read for them alone.
    #[allow(clippy::too_many_arguments)]
    fn window(
        &mut self,
        reader: &Reader,
        plan: &Plan,
        key: &ReadKey,
        refs: &[SeriesRef],
        need: Need,
        now: i64,
    ) -> Result<Window<'_>, EngineError> {
        let from = now.saturating_sub(key.window_ns);
        let step = step_for(key.window_ns);
        let covered = self.shared.get(key).is_some_and(|sh| {
            (sh.need == need || sh.need == Need::All) && refs.iter().all(|r| sh.series.contains(r))
        });
        if covered {
            if let Some(sh) = self.shared.get_mut(key) {
                if sh.read.is_none() {
                    let all: Vec<SeriesRef> = sh.series.iter().copied().collect();
                    self.reads += 1;
                    // A failed shared read is not kept: each rule then reads on its own.
                    if let Ok(accs) = collect_window_cached(
                        reader,
                        plan,
                        &all,
                        from,
                        now,
                        step,
                        sh.need,
                        now,
                        self.rows.as_mut(),
                        self.held.as_ref(),
                    ) {
                        sh.read = Some(
                            all.into_iter()
                                .zip(accs)
                                .filter_map(|(r, a)| a.map(|a| (r, a)))
                                .collect(),
                        );
                    }
                }
                if let Some(read) = &sh.read {
                    return Ok(Window::Shared(read));
                }
            }
        }
        self.reads += 1;
        let accs = collect_window_cached(
            reader,
            plan,
            refs,
            from,
            now,
            step,
            need,
            now,
            None,
            self.held.as_ref(),
        )?;
        Ok(Window::Own(
            refs.iter()
                .copied()
                .zip(accs)
                .filter_map(|(r, a)| a.map(|a| (r, a)))
                .collect(),
        ))
    }
}

/// The data of a window, per series with data: borrowed from a shared read or read alone.
enum Window<'a> {
    Shared(&'a HashMap<SeriesRef, StepAcc>),
    Own(HashMap<SeriesRef, StepAcc>),
}

impl Window<'_> {
    fn get(&self, r: &SeriesRef) -> Option<&StepAcc> {
        match self {
            Window::Shared(m) => m.get(r),
            Window::Own(m) => m.get(r),
        }
    }
}

/// One group's data: its series' accumulators and the sum of their rates.
#[derive(Default)]
struct Group<'a> {
    accs: Vec<&'a StepAcc>,
    rate: Option<f64>,
}

impl Group<'_> {
    /// The value of `agg` over the group's series (merged in their order when several).
    fn value(&self, agg: Agg) -> Option<f64> {
        if agg == Agg::Rate {
            return self.rate;
        }
        match self.accs.as_slice() {
            [] => None,
            [one] => value(agg, one),
            [first, rest @ ..] => {
                let mut m: StepAcc = (*first).clone();
                for o in rest {
                    m.acc.merge(&o.acc);
                    match (&mut m.exact, &o.exact) {
                        (Some(a), Some(b)) => a.extend_from_slice(b),
                        _ => m.exact = None,
                    }
                }
                value(agg, &m)
            }
        }
    }
}

/// The value of a series rule per group.
pub fn series(
    cycle: &mut Cycle,
    reader: &Reader,
    plan: &Plan,
    s: &SeriesSpec,
    now: i64,
) -> Result<Vec<(Labels, f64)>, EngineError> {
    let need = need_of_spec(s);
    let mut best: BTreeMap<Labels, f64> = BTreeMap::new();
    for field in &s.fields {
        let found = cycle.matching(reader, s, field)?;
        // Each series' group, from its tag set's tags.
        let sets = &cycle.tagsets[&s.measurement];
        let keyed: Vec<(SeriesRef, Labels)> = found
            .into_iter()
            .map(|(r, i)| {
                let tags = &sets[i].tags;
                let key: Labels = s
                    .group_by
                    .iter()
                    .filter_map(|k| tags.get(k).map(|v| (k.clone(), v.clone())))
                    .collect();
                (r, key)
            })
            .collect();
        let refs: Vec<SeriesRef> = keyed.iter().map(|(r, _)| *r).collect();
        let key = ReadKey {
            measurement: s.measurement.clone(),
            field: field.clone(),
            window_ns: s.window_ns,
        };
        let window = cycle.window(reader, plan, &key, &refs, need, now)?;
        let mut groups: BTreeMap<&Labels, Group<'_>> = BTreeMap::new();
        for (r, key) in &keyed {
            let Some(one) = window.get(r) else {
                continue;
            };
            // A rate is per series (a counter each), summed over the group.
            let dt = one.acc.last.0 - one.acc.first.0;
            let rate = (one.acc.count > 0 && dt > 0)
                .then(|| (one.acc.last.1 - one.acc.first.1) * NS as f64 / dt as f64);
            let g = groups.entry(key).or_default();
            if let Some(r) = rate {
                *g.rate.get_or_insert(0.0) += r;
            }
            g.accs.push(one);
        }
        for (key, g) in groups {
            let Some(mut v) = g.value(s.agg) else {
                continue;
            };
            if let Some(r) = s.ratio_of {
                match g.value(r) {
                    Some(d) if d != 0.0 => v /= d,
                    _ => continue,
                }
            }
            if !v.is_finite() {
                continue;
            }
            best.entry(key.clone())
                .and_modify(|b| *b = b.max(v))
                .or_insert(v);
        }
    }
    Ok(best.into_iter().collect())
}

/// The value of `rule` per instance at `now` (empty: no data).
pub fn observe(
    cycle: &mut Cycle,
    rule: &Rule,
    reader: &Reader,
    plan: &Plan,
    inputs: &Inputs,
    drops: &mut DropHistory,
    now: i64,
) -> Result<Vec<(Labels, f64)>, EngineError> {
    Ok(match &rule.watch {
        Watch::Series(s) => series(cycle, reader, plan, s, now)?,
        Watch::GpuTempMargin { window_ns } => {
            let spec = |field: &str| gpu_spec(field, *window_ns);
            let temp: BTreeMap<Labels, f64> = series(cycle, reader, plan, &spec("temp_c"), now)?
                .into_iter()
                .collect();
            series(cycle, reader, plan, &spec("temp_slowdown_c"), now)?
                .into_iter()
                .filter_map(|(k, slow)| temp.get(&k).map(|t| (k, slow - t)))
                .collect()
        }
        Watch::DroppedPoints { window_ns } => {
            let total = crate::stats::Stats::get(&inputs.stats.points_dropped)
                + crate::stats::Stats::get(&inputs.stats.points_rejected);
            vec![(Labels::new(), drops.observe(now, total, *window_ns) as f64)]
        }
        Watch::SinkBacklogAge => inputs
            .forward
            .get()
            .snapshot()
            .sinks
            .into_iter()
            .map(|s| {
                (
                    Labels::from([("sink".to_string(), s.name)]),
                    s.oldest_unsent_age_s.unwrap_or(0.0),
                )
            })
            .collect(),
        Watch::DiskBudget => {
            if inputs.max_bytes == 0 {
                Vec::new()
            } else {
                let bytes = crate::store::disk_bytes(&inputs.db_path);
                vec![(
                    Labels::new(),
                    bytes as f64 * 100.0 / inputs.max_bytes as f64,
                )]
            }
        }
        Watch::ClockUnset => vec![(
            Labels::new(),
            if now < inputs.clock_floor_ns {
                1.0
            } else {
                0.0
            },
        )],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::alert::config::{NoData, Op};
    use crate::config::{Config, Synchronous};
    use crate::ingest::lineproto::{parse_body, Precision};
    use crate::store::Writer;

    fn rule(name: &str, agg: Agg, ratio_of: Option<Agg>, group_by: &[&str], window_s: i64) -> Rule {
        Rule {
            name: name.into(),
            builtin: false,
            watch: Watch::Series(SeriesSpec {
                measurement: "m".into(),
                fields: vec!["v".into()],
                tags: Vec::new(),
                group_by: group_by.iter().map(|g| g.to_string()).collect(),
                exclude: Vec::new(),
                agg,
                ratio_of,
                window_ns: window_s * NS,
            }),
            op: Op::Gt,
            threshold: 0.0,
            for_ns: 0,
            keep_firing_for_ns: 0,
            no_data: NoData::Ok,
            severity: "warning".into(),
            severity_from: None,
            summary: String::new(),
            labels: BTreeMap::new(),
        }
    }

    fn spec(r: &Rule) -> &SeriesSpec {
        match &r.watch {
            Watch::Series(s) => s,
            _ => unreachable!("a series rule"),
        }
    }

    /// Rules over the same field and window share one read (each series read once for all
    /// of them), and each gets what it would get reading alone; a rule over another window
    /// reads on its own.
    #[test]
    fn rules_over_the_same_window_share_one_read() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::now_ns();
        // Hosts a and b, one point every 10 s over the last 20 minutes; a tag set that no
        // rule below reads (other = x) is left out of the shared read.
        let mut body = String::new();
        for i in 0..120 {
            let ts = now - i * 10 * NS;
            body.push_str(&format!("m,host=a v={} {ts}\n", i));
            body.push_str(&format!("m,host=b v={} {ts}\n", 1000 - i));
            body.push_str(&format!("n,host=a v=5 {ts}\n"));
        }
        let parsed = parse_body(&body, Precision::Nanos, now);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        Writer::open(dir.path(), 1_000, Synchronous::Normal)
            .unwrap()
            .write(&[&parsed.batch])
            .unwrap();
        let reader = Reader::open(dir.path()).unwrap();
        let plan = Plan::from_config(&Config::default()).unwrap();
        let mut only_b = rule("MaxB", Agg::Max, None, &["host"], 300);
        if let Watch::Series(s) = &mut only_b.watch {
            s.tags = vec![("host".into(), "b".into())];
        }
        let rules = vec![
            rule(
                "Ratio",
                Agg::Quantile(0.99),
                Some(Agg::Quantile(0.5)),
                &["host"],
                300,
            ),
            rule("Mean", Agg::Mean, None, &[], 300),
            only_b,
            rule("Count15", Agg::Count, None, &["host"], 900),
        ];
        let mut cycle = Cycle::default();
        cycle.prepare(&reader, &rules);
        let together: Vec<Vec<(Labels, f64)>> = rules
            .iter()
            .map(|r| series(&mut cycle, &reader, &plan, spec(r), now).unwrap())
            .collect();
        // The three 5-minute rules: one read; the 15-minute one: another.
        assert_eq!(cycle.reads(), 2);
        let alone: Vec<Vec<(Labels, f64)>> = rules
            .iter()
            .map(|r| {
                let mut c = Cycle::default();
                let out = series(&mut c, &reader, &plan, spec(r), now).unwrap();
                assert_eq!(c.reads(), 1);
                out
            })
            .collect();
        assert_eq!(together, alone);
        // And the values are the points': the last 5 minutes are i = 0..=30.
        let host = |h: &str| Labels::from([("host".to_string(), h.to_string())]);
        let mean = (0..=30).map(|i| (i + 1000 - i) as f64).sum::<f64>() / 62.0;
        assert_eq!(together[1], vec![(Labels::new(), mean)]);
        assert_eq!(together[2], vec![(host("b"), 1000.0)]);
        // 15 minutes read whole 1-minute steps: from the minute holding the window's start.
        let from = crate::store::bucket::bucket_start(now - 900 * NS, 60 * NS);
        let n = (0..120).filter(|i| now - i * 10 * NS >= from).count() as f64;
        assert_eq!(together[3], vec![(host("a"), n), (host("b"), n)]);
        // p99 / p50 of a's 0..=30 (exact ranks 29 and 15).
        assert_eq!(together[0][0], (host("a"), 29.0 / 15.0));
    }

    #[test]
    fn steps_follow_the_window() {
        assert_eq!(step_for(5 * 60 * NS), NS);
        assert_eq!(step_for(90 * NS), NS);
        assert_eq!(step_for(3600 * NS), 60 * NS);
        assert_eq!(step_for(48 * 3600 * NS), 3600 * NS);
        assert_eq!(step_for(24 * 3600 * NS + 60 * NS), 60 * NS);
    }

    #[test]
    fn drops_count_over_the_window_only() {
        let mut d = DropHistory::new(0);
        assert_eq!(d.observe(NS, 0, 10 * NS), 0);
        assert_eq!(d.observe(2 * NS, 3, 10 * NS), 3);
        assert_eq!(d.observe(11 * NS, 3, 10 * NS), 3);
        // The samples at or before t = 2 s have left the window: nothing new since.
        assert_eq!(d.observe(13 * NS, 3, 10 * NS), 0);
        assert_eq!(d.observe(14 * NS, 5, 10 * NS), 2);
    }
}
