//! The spike window the triage snapshot compares with the hour before it: it starts where the
//! alert's latency left its baseline, found from the data. The latency series is the rule's
//! own field when it is a latency (a `*_ms` or `*_us` field: `inference` `wall_ms`, `llm`
//! `ttft_ms`, ...), restricted to the firing instance's tags. Its per-minute p50 and p99 are
//! compared with the p50 and p99 of the hour before the earliest allowed start; walking back
//! from the firing, every minute where either is [`OFF_RATIO`] times its baseline or more is
//! part of the spike, and the walk stops at two quiet minutes in a row. The start is bounded:
//! never earlier than [`super::LEAD_NS`] before the condition first held (the longest window,
//! as before) and never later than a minute before the firing ([`MIN_WINDOW_NS`]). Without
//! a latency series, or when the latency is not off its baseline at the firing, the window is
//! the rule's own aggregation window before the condition first held (same bounds), and
//! without one the longest window. Reads through `gather::steps`; the walk itself is pure.

use std::collections::BTreeMap;

use super::gather::{self, Stat, STEP_NS};
use super::snapshot::{clock, Span, WindowFrom};
use super::{BASELINE_NS, LEAD_NS};
use crate::alert::event::Firing;
use crate::engine::EngineError;
use crate::rollup::Plan;
use crate::store::bucket::bucket_start;
use crate::store::Reader;

/// The shortest window, ns.
pub const MIN_WINDOW_NS: i64 = 60_000_000_000;
/// A minute whose p50 or p99 is this many times its baseline's is off the baseline.
pub const OFF_RATIO: f64 = 1.25;
/// Quiet minutes in a row that end the walk back.
const QUIET_STEPS: u32 = 2;

/// The chosen spans and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The spike window.
    pub window: Span,
    /// The hour before it.
    pub baseline: Span,
    /// How its start was found.
    pub from: WindowFrom,
    /// The sentence saying so.
    pub note: String,
}

/// One minute's (or the baseline's) level of the latency.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Level {
    /// Median.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

impl Level {
    fn of(s: &Stat) -> Level {
        Level {
            p50: s.quantile(0.5),
            p99: s.quantile(0.99),
        }
    }

    /// Whether this level is off `base` (either quantile [`OFF_RATIO`] times its baseline).
    pub fn off(&self, base: &Level) -> bool {
        let above = |w: Option<f64>, b: Option<f64>| match (w, b) {
            (Some(w), Some(b)) if b > 0.0 && w.is_finite() => w >= b * OFF_RATIO,
            _ => false,
        };
        above(self.p99, base.p99) || above(self.p50, base.p50)
    }
}

/// A latency series: measurement, field, tags.
pub type Series = (String, String, Vec<(String, String)>);

/// The series whose departure from its baseline starts the window: the rule's measurement
/// and field, with the instance's tags, when the field is a latency.
pub fn latency_series(f: &Firing) -> Option<Series> {
    let (m, field) = (f.measurement.as_ref()?, f.field.as_ref()?);
    if !(field.ends_with("_ms") || field.ends_with("_us")) {
        return None;
    }
    let tags = f.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    Some((m.clone(), field.clone(), tags))
}

/// Walks back from the step `last` over the per-step `levels` to the earliest step of the
/// spike that ends at the firing, not before `lo`: `None` when neither `last` nor the step
/// before it is off `base` (a partial last minute may hold few points). Two quiet steps in a
/// row end the walk; one is tolerated inside the spike.
pub fn walk_back(levels: &BTreeMap<i64, Level>, base: &Level, lo: i64, last: i64) -> Option<i64> {
    let off = |t: i64| levels.get(&t).is_some_and(|l| l.off(base));
    let mut t = if off(last) {
        last
    } else if last - STEP_NS >= lo && off(last - STEP_NS) {
        last - STEP_NS
    } else {
        return None;
    };
    let mut start = t;
    let mut quiet = 0;
    while t - STEP_NS >= lo {
        t -= STEP_NS;
        if off(t) {
            start = t;
            quiet = 0;
        } else {
            quiet += 1;
            if quiet >= QUIET_STEPS {
                break;
            }
        }
    }
    Some(start)
}

fn short(v: Option<f64>) -> String {
    match v {
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
        None => "-".into(),
    }
}

/// Chooses the window of `firing` (see the module docs).
pub fn choose(
    reader: &Reader,
    plan: &Plan,
    firing: &Firing,
    now: i64,
) -> Result<Choice, EngineError> {
    let fired = firing.fired_ns;
    let lo = bucket_start(firing.active_since_ns.saturating_sub(LEAD_NS), STEP_NS);
    let hi = bucket_start(fired.saturating_sub(MIN_WINDOW_NS), STEP_NS).max(lo);
    let clamp = |t: i64| t.clamp(lo, hi);
    let mut why = String::new();
    if let Some((m, field, tags)) = latency_series(firing) {
        let steps = gather::steps(
            reader,
            plan,
            &m,
            &field,
            &tags,
            lo - BASELINE_NS,
            fired,
            now,
        )?;
        let mut base = Stat::default();
        let mut levels = BTreeMap::new();
        for (t, s) in &steps {
            if *t < lo {
                base.merge(s);
            } else {
                levels.insert(*t, Level::of(s));
            }
        }
        let base_level = Level::of(&base);
        let scope = if tags.is_empty() {
            String::new()
        } else {
            format!(
                " of {}",
                tags.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        };
        let found = walk_back(&levels, &base_level, lo, bucket_start(fired, STEP_NS));
        match found {
            Some(start) => {
                let start = clamp(start);
                let top = levels
                    .range(start..)
                    .filter_map(|(_, l)| l.p99)
                    .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))));
                return Ok(spans(
                    start,
                    fired,
                    WindowFrom::Latency,
                    format!(
                        "{m} {field}{scope} left its baseline (p50 {}, p99 {}) at {} UTC (minute p99 up to {})",
                        short(base_level.p50),
                        short(base_level.p99),
                        clock(start),
                        short(top)
                    ),
                ));
            }
            None => {
                why = if base.count() == 0 {
                    format!("{m} {field}{scope} has no baseline to compare with; ")
                } else {
                    format!("{m} {field}{scope} is not {OFF_RATIO}x its baseline at the firing; ")
                };
            }
        }
    } else if let (Some(m), Some(f)) = (&firing.measurement, &firing.field) {
        why = format!("{m} {f} is not a latency; ");
    }
    Ok(match firing.window_ns {
        Some(w) if w > 0 => {
            let start = clamp(bucket_start(
                firing.active_since_ns.saturating_sub(w),
                STEP_NS,
            ));
            spans(
                start,
                fired,
                WindowFrom::RuleWindow,
                format!(
                    "{why}the rule's {} window before the condition held",
                    minutes(w)
                ),
            )
        }
        _ => spans(
            lo,
            fired,
            WindowFrom::Lead,
            format!(
                "{why}the rule has no window: {} before the condition held",
                minutes(LEAD_NS)
            ),
        ),
    })
}

fn minutes(ns: i64) -> String {
    let s = ns / 1_000_000_000;
    if s % 60 == 0 {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

fn spans(from: i64, fired: i64, how: WindowFrom, note: String) -> Choice {
    Choice {
        window: Span {
            from_ns: from,
            to_ns: fired.max(from),
        },
        baseline: Span {
            from_ns: from - BASELINE_NS,
            to_ns: from - 1,
        },
        from: how,
        note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: i64 = STEP_NS;

    fn lv(p50: f64, p99: f64) -> Level {
        Level {
            p50: Some(p50),
            p99: Some(p99),
        }
    }

    #[test]
    fn the_walk_stops_where_the_latency_returned_to_its_baseline() {
        let base = lv(20.0, 30.0);
        // Minutes 0..20 normal, 17..20 spiking (p99 only: a tail), with one quiet minute
        // inside the spike at 18.
        let mut levels = BTreeMap::new();
        for i in 0..=20 {
            let l = match i {
                17 | 19 | 20 => lv(21.0, 80.0),
                _ => lv(20.5, 31.0),
            };
            levels.insert(i * M, l);
        }
        assert_eq!(walk_back(&levels, &base, 0, 20 * M), Some(17 * M));
        // The median alone moving counts too.
        levels.insert(16 * M, lv(30.0, 33.0));
        assert_eq!(walk_back(&levels, &base, 0, 20 * M), Some(16 * M));
        // Bounded by `lo`.
        assert_eq!(walk_back(&levels, &base, 18 * M, 20 * M), Some(19 * M));
        // A partial last minute without points: the one before decides.
        levels.remove(&(20 * M));
        assert_eq!(walk_back(&levels, &base, 0, 20 * M), Some(16 * M));
        // Nothing off at the firing: no start from the data.
        let flat: BTreeMap<i64, Level> = (0..=20).map(|i| (i * M, lv(20.0, 30.0))).collect();
        assert_eq!(walk_back(&flat, &base, 0, 20 * M), None);
        // No baseline: nothing is off.
        assert_eq!(walk_back(&levels, &Level::default(), 0, 20 * M), None);
    }

    #[test]
    fn only_latency_fields_start_the_window_from_the_data() {
        let mut f = Firing {
            rule: "r".into(),
            labels: BTreeMap::new(),
            measurement: Some("inference".into()),
            field: Some("wall_ms".into()),
            tags: [("model".to_string(), "m".to_string())].into(),
            window_ns: Some(M),
            value: None,
            threshold: None,
            active_since_ns: 0,
            fired_ns: 0,
        };
        let (m, field, tags) = latency_series(&f).unwrap();
        assert_eq!((m.as_str(), field.as_str()), ("inference", "wall_ms"));
        assert_eq!(tags, [("model".to_string(), "m".to_string())]);
        f.field = Some("temp_c".into());
        assert!(latency_series(&f).is_none());
        f.field = None;
        assert!(latency_series(&f).is_none());
    }
}
