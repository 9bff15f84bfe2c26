//! The query engine: aggregates of one field over time steps (`step` + `agg`), read from the
//! coarsest rollup tier that fits, and the derived inference signals (percentile ratios,
//! throughput, GPU share, overhead, batch efficiency, the latency-throughput curve and its
//! knee). Read-only: it runs on a [`Reader`] and never writes.
//!
//! Choosing the source ([`choose_source`], pure): among tiers whose resolution divides the
//! step, the coarsest whose retention covers `from`; if none covers it, the one that keeps
//! the longest; if no tier's resolution divides the step (finer than 1 min, or e.g. 90 s),
//! the raw points. A tier answers with its rows *plus* the raw chunks it has not rolled up
//! yet (ids above its cursor), so the newest step is complete and no point is counted twice.
//!
//! The files: [`request`] turns a user's words (times, step, agg names, group-by) into the
//! typed queries of this module; `source.rs` picks the tier and reads it into steps;
//! `steps.rs` holds the per-step accumulators and their values (`value`, `rates`);
//! `inference.rs` derives the inference signals and the knee; `llm.rs` the LLM serving
//! signals (TTFT, ITL, tokens per second and per joule, the prompt-length knee);
//! `energy.rs` the energy per inference and per token (power integrated per step,
//! attributed to models); `config.rs` is `[inference]`.
//! Parsing a transport (an HTTP query string, command-line flags) is never done here: that
//! belongs to `api::params` and the CLI, which both build these types.
//!
//! Steps are epoch-aligned: step `k` covers `[k*step, (k+1)*step)`, and the query covers the
//! steps from the one holding `from` to the one holding `to` (whole rollup buckets; the edges
//! are not cut inside a bucket). Percentiles from tiers merge the buckets' DDSketches (within
//! 0.5% relative of the exact value, see `store/sketch.rs`); from raw points they are exact
//! (rank `floor(q * (n - 1))` of the sorted values). `rate` is the per-second change of the
//! step's last value against the previous step's last (the step's first for the first step),
//! computed per series and summed over a group. Empty steps are left out.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::rollup::Plan;
use crate::store::bucket::parse_percentile;
use crate::store::{Reader, StoreError};

pub mod config;
pub mod energy;
mod inference;
mod llm;
pub mod pointcache;
pub mod request;
pub mod rowcache;
mod source;
mod steps;

pub use config::InferenceConfig;
pub use inference::{inference, knee, ratio, InferenceAnswer, InferenceQuery};
pub use llm::{llm, prompt_curve, PromptBucket};
pub use request::{parse_step, DEFAULT_LIMIT, DEFAULT_RANGE_NS};
pub use source::{
    choose_source, collect, collect_window, collect_window_cached, need_of, Collected, Need,
    SeriesRef, Source,
};
pub use steps::{rates, value, StepAcc, Steps};

const NS: i64 = 1_000_000_000;
/// Most steps one query may return per series.
pub const MAX_STEPS: i64 = 200_000;

/// Why a query failed: a bad request (400) or the store (500).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is invalid; the message says what to change.
    #[error("{0}")]
    BadQuery(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A rollup row does not decode.
    #[error("corrupt rollup row in {0}")]
    Corrupt(std::path::PathBuf),
}

/// An aggregate function.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Agg {
    /// Mean.
    Mean,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum.
    Sum,
    /// Number of values.
    Count,
    /// Per-second change of the last value.
    Rate,
    /// Last value.
    Last,
    /// A quantile in `[0, 1]` (`p50`, `p99`, `p999`, ...).
    Quantile(f64),
}

impl Agg {
    /// Parses `mean`, `min`, `max`, `sum`, `count`, `rate`, `last` or `pNN`.
    pub fn parse(s: &str) -> Result<Agg, String> {
        Ok(match s {
            "mean" | "avg" => Agg::Mean,
            "min" => Agg::Min,
            "max" => Agg::Max,
            "sum" => Agg::Sum,
            "count" => Agg::Count,
            "rate" => Agg::Rate,
            "last" => Agg::Last,
            other => Agg::Quantile(parse_percentile(other).ok_or_else(|| {
                format!(
                    "invalid agg {other:?}: expected mean, min, max, sum, count, rate, last or a percentile like p50, p99, p999"
                )
            })?),
        })
    }
}

/// An aggregate query.
#[derive(Debug, Clone)]
pub struct AggQuery {
    /// Measurement.
    pub measurement: String,
    /// Field (required).
    pub field: String,
    /// Tags that must match.
    pub tags: Vec<(String, String)>,
    /// `None`: one series per tag set; `Some(keys)`: merge series with equal values of
    /// `keys` (empty: everything into one series).
    pub group_by: Option<Vec<String>>,
    /// Inclusive start, ns.
    pub from: i64,
    /// Inclusive end, ns.
    pub to: i64,
    /// Step, ns.
    pub step_ns: i64,
    /// Aggregate.
    pub agg: Agg,
    /// The agg's name as asked, echoed in the answer.
    pub agg_name: String,
}

/// One output series.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AggSeries {
    /// Its tags (the group-by tags when grouped).
    pub tags: BTreeMap<String, String>,
    /// `[step_start_ns, value]`, in time order.
    pub points: Vec<(i64, f64)>,
}

/// The answer to an [`AggQuery`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AggResult {
    /// Measurement.
    pub measurement: String,
    /// Field.
    pub field: String,
    /// Aggregate, as asked.
    pub agg: String,
    /// Step, ns.
    pub step_ns: i64,
    /// `raw` or the tier's name.
    pub tier: String,
    /// First step start, ns.
    pub from: i64,
    /// End, ns.
    pub to: i64,
    /// Series.
    pub series: Vec<AggSeries>,
}

fn group_key(
    tags: &BTreeMap<String, String>,
    group_by: &Option<Vec<String>>,
) -> BTreeMap<String, String> {
    match group_by {
        None => tags.clone(),
        Some(keys) => keys
            .iter()
            .filter_map(|k| tags.get(k).map(|v| (k.clone(), v.clone())))
            .collect(),
    }
}

/// Runs an aggregate query.
pub fn query(
    reader: &Reader,
    plan: &Plan,
    q: &AggQuery,
    now: i64,
) -> Result<AggResult, EngineError> {
    let need = need_of(q.agg);
    let c = collect(
        reader,
        plan,
        &q.measurement,
        &q.field,
        &q.tags,
        q.from,
        q.to,
        q.step_ns,
        need,
        now,
    )?;
    let mut groups: BTreeMap<BTreeMap<String, String>, Vec<Steps>> = BTreeMap::new();
    for (tags, steps) in c.sets {
        groups
            .entry(group_key(&tags, &q.group_by))
            .or_default()
            .push(steps);
    }
    let mut series = Vec::new();
    for (tags, members) in groups {
        let points: Vec<(i64, f64)> = if q.agg == Agg::Rate {
            let mut sum: BTreeMap<i64, f64> = BTreeMap::new();
            for m in &members {
                for (t, r) in rates(m) {
                    *sum.entry(t).or_default() += r;
                }
            }
            sum.into_iter().collect()
        } else {
            // The first member is the base (with one member per group, the default, no
            // step is moved at all).
            let mut members = members.into_iter();
            let mut merged: Steps = members.next().unwrap_or_default();
            for m in members {
                for (t, s) in m {
                    merged.at(t).absorb(s);
                }
            }
            merged
                .iter()
                .filter_map(|(t, s)| value(q.agg, s).map(|v| (t, v)))
                .collect()
        };
        if !points.is_empty() {
            series.push(AggSeries { tags, points });
        }
    }
    Ok(AggResult {
        measurement: q.measurement.clone(),
        field: q.field.clone(),
        agg: q.agg_name.clone(),
        step_ns: q.step_ns,
        tier: c.tier,
        from: c.from,
        to: q.to,
        series,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agg_names() {
        assert_eq!(Agg::parse("p99"), Ok(Agg::Quantile(0.99)));
        assert_eq!(Agg::parse("avg"), Ok(Agg::Mean));
        assert!(Agg::parse("median").is_err());
    }
}

#[cfg(test)]
mod agg_tests {
    //! Every agg, read from the 1-minute tier plus a raw tail not rolled up yet, against the
    //! same agg computed directly from the points.
    use super::*;
    use crate::config::Synchronous;
    use crate::rollup::tests::write;
    use crate::rollup::{Job, RetentionConfig, RollupConfig};
    use crate::store::bucket::bucket_start;
    use crate::store::Writer;

    const NOW: i64 = 400 * 86_400 * NS;

    /// The agg of `pts` (time-ordered) by itself, as the engine defines it.
    fn expected(agg: Agg, pts: &[(i64, f64)], prev_last: Option<(i64, f64)>) -> f64 {
        let vals: Vec<f64> = pts.iter().map(|p| p.1).collect();
        let (first, last) = (pts[0], pts[pts.len() - 1]);
        match agg {
            Agg::Mean => vals.iter().sum::<f64>() / vals.len() as f64,
            Agg::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
            Agg::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Agg::Sum => vals.iter().sum(),
            Agg::Count => vals.len() as f64,
            Agg::Last => last.1,
            Agg::Rate => {
                let r = prev_last.unwrap_or(first);
                (last.1 - r.1) * NS as f64 / (last.0 - r.0) as f64
            }
            Agg::Quantile(q) => {
                let mut v = vals;
                v.sort_by(f64::total_cmp);
                v[(q * (v.len() - 1) as f64).floor() as usize]
            }
        }
    }

    /// `(step start, expected agg)` of time-ordered `pts` cut into steps.
    fn expected_steps(agg: Agg, pts: &[(i64, f64)], step: i64) -> Vec<(i64, f64)> {
        let mut out = Vec::new();
        let (mut i, mut prev) = (0, None);
        while i < pts.len() {
            let s = bucket_start(pts[i].0, step);
            let j = pts[i..]
                .iter()
                .position(|p| p.0 >= s + step)
                .map_or(pts.len(), |k| i + k);
            out.push((s, expected(agg, &pts[i..j], prev)));
            prev = Some(pts[j - 1]);
            i = j;
        }
        out
    }

    fn assert_close(what: &str, agg: Agg, got: &[(i64, f64)], want: &[(i64, f64)]) {
        assert_eq!(got.len(), want.len(), "{what}");
        // Percentiles come from sketches (0.5% relative); everything else is exact.
        let tol = if matches!(agg, Agg::Quantile(_)) {
            0.01
        } else {
            1e-9
        };
        for ((gt, gv), (wt, wv)) in got.iter().zip(want) {
            assert_eq!(gt, wt, "{what}");
            assert!(
                (gv - wv).abs() <= tol * wv.abs().max(1.0),
                "{what} at {gt}: {gv} vs {wv}"
            );
        }
    }

    /// `collect_window` (one accumulator per series, each chunk decoded once for all the
    /// series read, sketches and exact values only where a percentile is asked) gives every
    /// agg of the window as the points do: from the 1-minute tier plus its raw tail (read in
    /// one scan for all tag sets) and from raw points alone (read per tag set).
    #[test]
    fn window_reads_equal_the_points_for_every_agg() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let t0 = NOW - 2 * 3600 * NS;
        let cut = t0 + 100 * 60 * NS;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut series: Vec<(&str, Vec<(i64, f64)>)> = Vec::new();
        for (key, offset) in [("m,s=a", 0), ("m,s=b", 2 * NS), ("m,s=c", 4 * NS)] {
            let pts: Vec<(i64, f64)> = (0..1_000)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (t0 + offset + i * 7 * NS, -20.0 + (x % 10_000) as f64 / 50.0)
                })
                .collect();
            series.push((key, pts));
        }
        for (key, pts) in &series {
            let before: Vec<(i64, f64)> = pts.iter().copied().filter(|p| p.0 < cut).collect();
            write(&mut w, key, &before);
        }
        let plan = Plan::new(
            &RollupConfig {
                tiers: vec!["1m".into()],
                ..Default::default()
            },
            &RetentionConfig::default(),
        )
        .unwrap();
        Job::open(dir.path(), plan.clone())
            .unwrap()
            .run_once(NOW, &|| false)
            .unwrap();
        for (key, pts) in &series {
            let after: Vec<(i64, f64)> = pts.iter().copied().filter(|p| p.0 >= cut).collect();
            write(&mut w, key, &after);
        }
        let reader = Reader::open(dir.path()).unwrap();
        let (conn, path) = (reader.conn(), reader.path());
        // Series a and c (b is not asked for), in that order.
        let refs: Vec<SeriesRef> = ["a", "c"]
            .iter()
            .map(|s| {
                let set = crate::store::dict::tagsets_matching(
                    conn,
                    path,
                    "m",
                    &[("s".to_string(), s.to_string())],
                )
                .unwrap()
                .into_iter()
                .find(|t| t.tags.get("s").map(String::as_str) == Some(*s))
                .unwrap();
                let sid = crate::store::dict::numeric_series(conn, path, set.id, "v")
                    .unwrap()
                    .unwrap();
                SeriesRef {
                    tagset: set.id,
                    sid,
                }
            })
            .collect();
        let want = [&series[0].1, &series[2].1];
        let aggs = ["mean", "min", "max", "sum", "count", "last", "p50", "p99"];
        // 90 minutes in 1-minute steps: the tier plus the tail; 5 minutes in 1-second
        // steps: raw points (exact percentiles).
        for (window, step) in [(90 * 60 * NS, 60 * NS), (300 * NS, NS)] {
            let from = bucket_start(NOW - window, step);
            for name in aggs {
                let agg = Agg::parse(name).unwrap();
                let got = collect_window(&reader, &plan, &refs, from, NOW, step, need_of(agg), NOW)
                    .unwrap();
                assert_eq!(got.len(), 2);
                for (acc, pts) in got.iter().zip(want) {
                    let inside: Vec<(i64, f64)> =
                        pts.iter().copied().filter(|p| p.0 >= from).collect();
                    let acc = acc.as_ref().expect("data in the window");
                    let v = value(agg, acc).unwrap();
                    let e = expected(agg, &inside, None);
                    let tol = if matches!(agg, Agg::Quantile(_)) && step > NS {
                        0.01
                    } else {
                        1e-9
                    };
                    assert!(
                        (v - e).abs() <= tol * e.abs().max(1.0),
                        "{name} over {window}: {v} vs {e}"
                    );
                    // A sketch only where a tier's percentile needs one; every value only
                    // where a raw percentile needs them.
                    let q = matches!(agg, Agg::Quantile(_));
                    assert_eq!(acc.exact.is_some(), q && step == NS, "{name}");
                    assert_eq!(acc.acc.sketch.count() > 0, q && step > NS, "{name}");
                }
            }
        }
    }

    #[test]
    fn every_agg_from_the_tier_and_the_raw_tail_equals_the_points() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let t0 = NOW - 2 * 3600 * NS;
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut series: Vec<(&str, Vec<(i64, f64)>)> = Vec::new();
        for (key, offset) in [("m,s=a", 0), ("m,s=b", 3 * NS)] {
            let pts: Vec<(i64, f64)> = (0..520)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (t0 + offset + i * 7 * NS, 1.0 + (x % 10_000) as f64 / 100.0)
                })
                .collect();
            series.push((key, pts));
        }
        // The first 50 minutes are rolled up; the last ~10 stay raw (the tail).
        let cut = t0 + 50 * 60 * NS;
        let part = |pts: &[(i64, f64)], before: bool| -> Vec<(i64, f64)> {
            pts.iter()
                .copied()
                .filter(|p| (p.0 < cut) == before)
                .collect()
        };
        for (key, pts) in &series {
            write(&mut w, key, &part(pts, true));
        }
        let plan = Plan::new(
            &RollupConfig {
                tiers: vec!["1m".into()],
                ..Default::default()
            },
            &RetentionConfig::default(),
        )
        .unwrap();
        Job::open(dir.path(), plan.clone())
            .unwrap()
            .run_once(NOW, &|| false)
            .unwrap();
        for (key, pts) in &series {
            write(&mut w, key, &part(pts, false));
        }
        let mut all: Vec<(i64, f64)> = series.iter().flat_map(|s| s.1.clone()).collect();
        all.sort_by_key(|p| p.0);
        let reader = Reader::open(dir.path()).unwrap();
        let aggs = [
            "mean", "min", "max", "sum", "count", "last", "rate", "p50", "p99",
        ];
        for step in [60 * NS, 300 * NS] {
            for name in aggs {
                let agg = Agg::parse(name).unwrap();
                let mut q = AggQuery {
                    measurement: "m".into(),
                    field: "v".into(),
                    tags: vec![],
                    group_by: None,
                    from: t0,
                    to: NOW,
                    step_ns: step,
                    agg,
                    agg_name: name.into(),
                };
                let res = query(&reader, &plan, &q, NOW).unwrap();
                assert_eq!(res.tier, "1m");
                assert_eq!(res.series.len(), 2, "{name}");
                for (got, (key, pts)) in res.series.iter().zip(&series) {
                    let what = format!("{name} step {step} {key}");
                    assert_close(&what, agg, &got.points, &expected_steps(agg, pts, step));
                }
                // Grouped into one series (rates add per series, so they are left out).
                if agg != Agg::Rate {
                    q.group_by = Some(vec![]);
                    let merged = query(&reader, &plan, &q, NOW).unwrap();
                    assert_eq!(merged.series.len(), 1);
                    let what = format!("grouped {name} step {step}");
                    let want = expected_steps(agg, &all, step);
                    assert_close(&what, agg, &merged.series[0].points, &want);
                }
            }
        }
    }

    /// A 1h tier waiting for its hour to close, the 1m tier ahead of it: a query at hourly
    /// steps reads the 1h rows before the hour of the first chunk the 1h tier has not folded,
    /// the 1m rows from it on, and raw only past each tier's cursor on its own side (late
    /// points among them): every agg equals the points', with the 1m tier standing in.
    #[test]
    fn every_agg_from_a_waiting_coarse_tier_and_the_finer_one_equals_the_points() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let hour = 3600 * NS;
        let t0 = NOW - 3 * hour;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut val = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1.0 + (x % 10_000) as f64 / 100.0
        };
        let keys = ["m,s=a", "m,s=b"];
        let mut series: Vec<Vec<(i64, f64)>> = vec![Vec::new(), Vec::new()];
        let mut put = |w: &mut Writer, range: std::ops::Range<i64>, every: i64| {
            for (k, pts) in keys.iter().zip(series.iter_mut()) {
                let new: Vec<(i64, f64)> = range
                    .clone()
                    .step_by(every as usize)
                    .map(|t| (t, val()))
                    .collect();
                write(w, k, &new);
                pts.extend(new);
            }
        };
        let plan = |tiers: &[&str]| {
            Plan::new(
                &RollupConfig {
                    tiers: tiers.iter().map(|t| t.to_string()).collect(),
                    ..Default::default()
                },
                &RetentionConfig::default(),
            )
            .unwrap()
        };
        let both = plan(&["1m", "1h"]);
        // 100 minutes folded into both tiers.
        put(&mut w, t0..t0 + 100 * 60 * NS, 13 * NS);
        Job::open(dir.path(), both.clone())
            .unwrap()
            .run_once(NOW, &|| false)
            .unwrap();
        // Up to 5 minutes before now folded into the 1m tier only, with late points in
        // buckets both tiers had made final.
        put(&mut w, t0 + 100 * 60 * NS..NOW - 5 * 60 * NS, 11 * NS);
        put(&mut w, t0 + 10 * 60 * NS + 1..t0 + 10 * 60 * NS + 2, 1);
        put(&mut w, t0 + 70 * 60 * NS + 1..t0 + 70 * 60 * NS + 2, 1);
        Job::open(dir.path(), plan(&["1m"]))
            .unwrap()
            .run_once(NOW, &|| false)
            .unwrap();
        // The last minutes raw, and a late point past both cursors.
        put(&mut w, NOW - 5 * 60 * NS..NOW, 7 * NS);
        put(&mut w, t0 + 30 * 60 * NS + 5..t0 + 30 * 60 * NS + 6, 1);
        for pts in series.iter_mut() {
            pts.sort_by_key(|p| p.0);
        }
        let reader = Reader::open(dir.path()).unwrap();
        let hourly = &both.tiers[1];
        let cursor = crate::store::tiers::state(reader.conn(), reader.path(), 3600)
            .unwrap()
            .cursor;
        let finer = source::finer_from(&reader, &both, hourly, cursor, NOW, NOW)
            .unwrap()
            .expect("the 1m tier stands in");
        assert_eq!(finer.tier.name, "1m");
        assert_eq!(finer.split, bucket_start(t0 + 100 * 60 * NS, hour));
        let aggs = [
            "mean", "min", "max", "sum", "count", "last", "rate", "p50", "p99",
        ];
        for (step, from) in [
            (hour, t0 - hour),
            (2 * hour, t0 - 2 * hour),
            (hour, t0 + 2 * hour),
        ] {
            for name in aggs {
                let agg = Agg::parse(name).unwrap();
                let q = AggQuery {
                    measurement: "m".into(),
                    field: "v".into(),
                    tags: vec![],
                    group_by: None,
                    from,
                    to: NOW,
                    step_ns: step,
                    agg,
                    agg_name: name.into(),
                };
                let res = query(&reader, &both, &q, NOW).unwrap();
                assert_eq!(res.tier, "1h");
                assert_eq!(res.series.len(), 2, "{name}");
                for (got, pts) in res.series.iter().zip(&series) {
                    let pts: Vec<(i64, f64)> = pts
                        .iter()
                        .copied()
                        .filter(|p| p.0 >= bucket_start(from, step))
                        .collect();
                    let what = format!("{name} step {step} from {from}");
                    assert_close(&what, agg, &got.points, &expected_steps(agg, &pts, step));
                }
            }
        }
    }
}
