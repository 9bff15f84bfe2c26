//! What a rule sees at one evaluation: its value per instance (group labels -> value). A
//! series rule reads through the query engine ([`crate::engine::collect`]: the coarsest
//! rollup tier that fits plus the raw tail not rolled up yet, as a dashboard query does),
//! over the window ending at the evaluation, grouped by the rule's `group_by`; the built-ins
//! that are not series aggregates read the agent's own state: its counters (dropped and
//! rejected points), the forwarders' status (backlog age), the store's size against the
//! budget, and the clock. Read-only; it never decides a state.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use super::rules::{Rule, SeriesSpec, Watch};
use crate::engine::{collect_window, need_of, value, Agg, EngineError, SeriesRef, StepAcc};
use crate::rollup::Plan;
use crate::stats::Stats;
use crate::store::dict::{self, Tagset};
use crate::store::tiers::Need;
use crate::store::Reader;

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

/// What one evaluation cycle resolves once for all its rules: the tag sets of each
/// measurement (read and parsed once, not once per rule) and each (tag set, field)'s numeric
/// series id. Lives for one cycle only, so a tag set or field that appears is seen by the
/// next cycle (measured: the per-rule lookup over the measurement's 1,000 tag sets was most
/// of a cycle, benches/alerts.rs).
#[derive(Default)]
pub struct Cycle {
    tagsets: HashMap<String, Vec<Tagset>>,
    series: HashMap<(i64, String), Option<i64>>,
}

impl Cycle {
    /// The numeric series of `field` of every tag set of `measurement` whose tags include
    /// `tags`, with the tag set's tags.
    fn matching(
        &mut self,
        reader: &Reader,
        measurement: &str,
        field: &str,
        tags: &[(String, String)],
    ) -> Result<Vec<(SeriesRef, &Labels)>, EngineError> {
        let (conn, path) = (reader.conn(), reader.path());
        if !self.tagsets.contains_key(measurement) {
            let sets = dict::tagsets(conn, path, Some(measurement))?;
            self.tagsets.insert(measurement.to_string(), sets);
        }
        let sets = &self.tagsets[measurement];
        let mut out = Vec::new();
        for set in sets {
            if !tags.iter().all(|(k, v)| set.tags.get(k) == Some(v)) {
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
                    &set.tags,
                ));
            }
        }
        Ok(out)
    }
}

/// One group's accumulated data.
#[derive(Default)]
struct Group {
    acc: StepAcc,
    rate: Option<f64>,
}

fn merge_into(dst: &mut StepAcc, src: StepAcc) {
    if dst.acc.count == 0 && dst.exact.is_none() {
        *dst = src;
        return;
    }
    dst.acc.merge(&src.acc);
    match (&mut dst.exact, src.exact) {
        (Some(a), Some(b)) => a.extend(b),
        _ => dst.exact = None,
    }
}

fn agg_of(agg: Agg, g: &Group) -> Option<f64> {
    match agg {
        Agg::Rate => g.rate,
        a => value(a, &g.acc),
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
    let from = now.saturating_sub(s.window_ns);
    let step = step_for(s.window_ns);
    let need = match s.ratio_of {
        Some(r) if need_of(r) != need_of(s.agg) => Need::All,
        _ => need_of(s.agg),
    };
    let mut best: BTreeMap<Labels, f64> = BTreeMap::new();
    for field in &s.fields {
        let mut found = cycle.matching(reader, &s.measurement, field, &s.tags)?;
        found.retain(|(_, tags)| !s.exclude.iter().any(|(k, v)| tags.get(k) == Some(v)));
        let refs: Vec<SeriesRef> = found.iter().map(|(r, _)| *r).collect();
        let accs = collect_window(reader, plan, &refs, from, now, step, need, now)?;
        let mut groups: BTreeMap<Labels, Group> = BTreeMap::new();
        for ((_, tags), one) in found.iter().zip(accs) {
            let Some(one) = one else {
                continue;
            };
            let key: Labels = s
                .group_by
                .iter()
                .filter_map(|k| tags.get(k).map(|v| (k.clone(), v.clone())))
                .collect();
            // A rate is per series (a counter each), summed over the group.
            let dt = one.acc.last.0 - one.acc.first.0;
            let rate = (one.acc.count > 0 && dt > 0)
                .then(|| (one.acc.last.1 - one.acc.first.1) * NS as f64 / dt as f64);
            let g = groups.entry(key).or_default();
            if let Some(r) = rate {
                *g.rate.get_or_insert(0.0) += r;
            }
            merge_into(&mut g.acc, one);
        }
        for (key, g) in groups {
            let Some(mut v) = agg_of(s.agg, &g) else {
                continue;
            };
            if let Some(r) = s.ratio_of {
                match agg_of(r, &g) {
                    Some(d) if d != 0.0 => v /= d,
                    _ => continue,
                }
            }
            if !v.is_finite() {
                continue;
            }
            best.entry(key).and_modify(|b| *b = b.max(v)).or_insert(v);
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
            let spec = |field: &str| SeriesSpec {
                measurement: "gpu".into(),
                fields: vec![field.into()],
                tags: Vec::new(),
                group_by: vec!["gpu".into()],
                exclude: Vec::new(),
                agg: Agg::Last,
                ratio_of: None,
                window_ns: *window_ns,
            };
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
