//! Triton Inference Server's `nv_inference_*` counters -> one `triton` point per model and
//! version per scrape interval. A pure state machine: it keeps the previous scrape's
//! counters and turns the next scrape into deltas; time is an argument.
//!
//! Fields: `requests` (delta of `nv_inference_request_success`), `failures` (delta of
//! `nv_inference_request_failure`, summed over `reason`), `request_ms`, `queue_ms`,
//! `compute_input_ms`, `compute_infer_ms`, `compute_output_ms` (delta of the matching
//! `*_duration_us` / delta of successes / 1000), `batch_size` (delta of
//! `nv_inference_count` / delta of `nv_inference_exec_count`), `pending`
//! (`nv_inference_pending_request_count`), and from the `*_summary_us` summaries Triton
//! exposes when started with `--metrics-config summary_latencies=true`, `<stage>_p<q>_ms`
//! (e.g. `request_p99_ms`, `queue_p99_9_ms`). From the latency histograms Triton exposes
//! when started with `--metrics-config histogram_latencies=true`
//! (`nv_inference_first_response_histogram_ms`, stage `first_response`) it writes
//! `<stage>_p50_ms`, `_p95_ms` and `_p99_ms`, estimated from the interval's own
//! distribution (the delta of each cumulative bucket) by linear interpolation inside the
//! bucket that holds the rank, as Prometheus' `histogram_quantile` does; no field when the
//! interval has no observation, and a summary for the same stage wins over the histogram.
//! It never writes a point for the first scrape
//! of a model, for an interval without a successful request, or for an interval where a
//! counter went down (a server restart): that interval is skipped, the new values become the
//! base, and no value is ever negative.

use std::collections::HashMap;

use super::parse::Sample;
use crate::model::{series_key, Line, Value};

/// The measurement.
pub const MEASUREMENT: &str = "triton";

const SUCCESS: &str = "nv_inference_request_success";
const FAILURE: &str = "nv_inference_request_failure";
const COUNT: &str = "nv_inference_count";
const EXEC: &str = "nv_inference_exec_count";
const PENDING: &str = "nv_inference_pending_request_count";
/// (counter, field) for the per-request durations.
const DURATIONS: [(&str, &str); 5] = [
    ("nv_inference_request_duration_us", "request_ms"),
    ("nv_inference_queue_duration_us", "queue_ms"),
    ("nv_inference_compute_input_duration_us", "compute_input_ms"),
    ("nv_inference_compute_infer_duration_us", "compute_infer_ms"),
    (
        "nv_inference_compute_output_duration_us",
        "compute_output_ms",
    ),
];
/// (summary, stage) for the latency summaries.
const SUMMARIES: [(&str, &str); 5] = [
    ("nv_inference_request_summary_us", "request"),
    ("nv_inference_queue_summary_us", "queue"),
    ("nv_inference_compute_input_summary_us", "compute_input"),
    ("nv_inference_compute_infer_summary_us", "compute_infer"),
    ("nv_inference_compute_output_summary_us", "compute_output"),
];

/// (histogram, stage) for the latency histograms (already in ms).
const HISTOGRAMS: [(&str, &str); 1] = [(
    "nv_inference_first_response_histogram_ms_bucket",
    "first_response",
)];
/// The percentiles written from a histogram: (quantile, field suffix).
const HIST_QUANTILES: [(f64, &str); 3] = [(0.5, "p50"), (0.95, "p95"), (0.99, "p99")];

/// One model version's counters in one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
struct Counters {
    /// Counter name -> value (failures summed over reasons).
    values: HashMap<&'static str, f64>,
    pending: Option<f64>,
    /// (field, ms) from the summaries.
    quantiles: Vec<(String, f64)>,
    /// Stage -> (upper bound, cumulative count) per bucket, from the histograms.
    buckets: HashMap<&'static str, Vec<(f64, f64)>>,
}

/// The previous scrape's counters per (model, version).
#[derive(Debug, Default)]
pub struct Triton {
    prev: HashMap<(String, String), Counters>,
}

fn counter_name(name: &str) -> Option<&'static str> {
    [SUCCESS, FAILURE, COUNT, EXEC]
        .into_iter()
        .chain(DURATIONS.iter().map(|d| d.0))
        .find(|c| *c == name)
}

/// `0.99` -> `p99`, `0.999` -> `p99_9`, `0.5` -> `p50`.
fn quantile_name(q: &str) -> Option<String> {
    let v: f64 = q.parse().ok()?;
    if !(0.0..=1.0).contains(&v) {
        return None;
    }
    let pct = format!("{:.4}", v * 100.0);
    let pct = pct.trim_end_matches('0').trim_end_matches('.');
    Some(format!("p{}", pct.replace('.', "_")))
}

/// A bucket's `le` label: a number or `+Inf`.
pub(super) fn bound(le: &str) -> Option<f64> {
    match le.trim() {
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        v => v.parse().ok().filter(|v: &f64| v.is_finite()),
    }
}

/// The `q` quantile of one interval's histogram: `buckets` are (upper bound, cumulative
/// count), sorted by bound, the last one `+Inf`. Linear interpolation inside the bucket that
/// holds the rank `q * total`, the first bucket starting at 0; a rank in the `+Inf` bucket
/// gives the highest finite bound. `None` without observations, without a `+Inf` bucket or
/// without a finite one.
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let &(last, total) = buckets.last()?;
    if last != f64::INFINITY || total <= 0.0 || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let rank = q * total;
    let i = buckets.iter().position(|&(_, c)| c >= rank)?;
    let (upper, count) = buckets[i];
    if upper == f64::INFINITY {
        // Only a +Inf bucket: no finite bound to give.
        return (i > 0).then(|| buckets[i - 1].0);
    }
    let (lower, below) = if i == 0 { (0.0, 0.0) } else { buckets[i - 1] };
    if count <= below {
        return Some(upper);
    }
    Some(lower + (upper - lower) * (rank - below) / (count - below))
}

/// The interval's histogram (delta per bucket, sorted by bound), or `Err(())` when a bucket
/// went down (a restart); `Ok(None)` when the buckets do not line up.
fn bucket_delta(prev: &[(f64, f64)], cur: &[(f64, f64)]) -> Result<Option<Vec<(f64, f64)>>, ()> {
    let mut out = Vec::with_capacity(cur.len());
    for &(le, c) in cur {
        let Some(&(_, p)) = prev.iter().find(|(l, _)| *l == le) else {
            return Ok(None);
        };
        if c < p {
            return Err(());
        }
        out.push((le, c - p));
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(Some(out))
}

impl Triton {
    /// Whether a page carries Triton's counters.
    pub fn applies(samples: &[Sample]) -> bool {
        samples.iter().any(|s| s.name == SUCCESS)
    }

    /// Takes one scrape's samples (all of them, before include/exclude) and returns the
    /// interval's points, stamped `now`, tagged `model`, `version`, `scrape` and `extra`.
    pub fn update(
        &mut self,
        samples: &[Sample],
        now: i64,
        scrape: &str,
        extra: &[(&str, &str)],
    ) -> Vec<Line> {
        let mut cur: HashMap<(String, String), Counters> = HashMap::new();
        for s in samples {
            if !s.name.starts_with("nv_inference_") {
                continue;
            }
            let (Some(model), Some(version)) = (s.label("model"), s.label("version")) else {
                continue;
            };
            let key = (model.to_string(), version.to_string());
            if let Some(c) = counter_name(&s.name) {
                if s.value.is_finite() {
                    *cur.entry(key).or_default().values.entry(c).or_insert(0.0) += s.value;
                }
            } else if s.name == PENDING {
                cur.entry(key).or_default().pending = Some(s.value);
            } else if let Some((_, stage)) = SUMMARIES.iter().find(|(n, _)| *n == s.name) {
                if let Some(q) = s.label("quantile").and_then(quantile_name) {
                    if s.value.is_finite() {
                        cur.entry(key)
                            .or_default()
                            .quantiles
                            .push((format!("{stage}_{q}_ms"), s.value / 1000.0));
                    }
                }
            } else if let Some((_, stage)) = HISTOGRAMS.iter().find(|(n, _)| *n == s.name) {
                if let Some(le) = s.label("le").and_then(bound) {
                    if s.value.is_finite() {
                        cur.entry(key)
                            .or_default()
                            .buckets
                            .entry(stage)
                            .or_default()
                            .push((le, s.value));
                    }
                }
            }
        }
        let mut out = Vec::new();
        let mut keys: Vec<&(String, String)> = cur.keys().collect();
        keys.sort();
        for key in keys {
            let c = &cur[key];
            let Some(prev) = self.prev.get(key) else {
                continue;
            };
            if let Some(fields) = interval_fields(prev, c) {
                let mut tags: Vec<(&str, &str)> = extra.to_vec();
                tags.retain(|(k, _)| !matches!(*k, "model" | "version" | "scrape"));
                tags.extend([("model", key.0.as_str()), ("version", key.1.as_str())]);
                tags.push(("scrape", scrape));
                out.push(Line {
                    key: series_key(MEASUREMENT, &tags),
                    fields,
                    ts: now,
                    line_no: 0,
                });
            }
        }
        self.prev = cur;
        out
    }
}

/// The interval's fields, or `None` when it is skipped (no success, a counter went down).
fn interval_fields(prev: &Counters, cur: &Counters) -> Option<Vec<(String, Value)>> {
    let mut delta: HashMap<&'static str, f64> = HashMap::new();
    for (name, v) in &cur.values {
        if let Some(p) = prev.values.get(name) {
            let d = v - p;
            if d < 0.0 {
                return None;
            }
            delta.insert(name, d);
        }
    }
    let mut hist: Vec<(&'static str, Vec<(f64, f64)>)> = Vec::new();
    for (stage, buckets) in &cur.buckets {
        let Some(p) = prev.buckets.get(stage) else {
            continue;
        };
        match bucket_delta(p, buckets) {
            Err(()) => return None,
            Ok(Some(d)) => hist.push((stage, d)),
            Ok(None) => {}
        }
    }
    hist.sort_by(|a, b| a.0.cmp(b.0));
    let ok = *delta.get(SUCCESS)?;
    if ok <= 0.0 {
        return None;
    }
    let mut f: Vec<(String, Value)> = vec![("requests".into(), Value::F64(ok))];
    if let Some(d) = delta.get(FAILURE) {
        f.push(("failures".into(), Value::F64(*d)));
    }
    for (counter, field) in DURATIONS {
        if let Some(d) = delta.get(counter) {
            f.push((field.into(), Value::F64(d / ok / 1000.0)));
        }
    }
    if let (Some(n), Some(e)) = (delta.get(COUNT), delta.get(EXEC)) {
        if *e > 0.0 {
            f.push(("batch_size".into(), Value::F64(n / e)));
        }
    }
    if let Some(p) = cur.pending.filter(|p| p.is_finite()) {
        f.push(("pending".into(), Value::F64(p)));
    }
    for (name, v) in &cur.quantiles {
        f.push((name.clone(), Value::F64(*v)));
    }
    for (stage, d) in hist {
        let from_summary = format!("{stage}_p");
        if cur
            .quantiles
            .iter()
            .any(|(n, _)| n.starts_with(&from_summary))
        {
            continue;
        }
        for (q, suffix) in HIST_QUANTILES {
            if let Some(v) = histogram_quantile(q, &d) {
                f.push((format!("{stage}_{suffix}_ms"), Value::F64(v)));
            }
        }
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::super::parse::{parse, Format};
    use super::*;

    fn page(success: u64, failure: u64, count: u64, exec: u64, req_us: u64, q_us: u64) -> String {
        format!(
            "# TYPE nv_inference_request_success counter\n\
             nv_inference_request_success{{model=\"resnet\",version=\"1\"}} {success}\n\
             nv_inference_request_failure{{model=\"resnet\",reason=\"REJECTED\",version=\"1\"}} {failure}\n\
             nv_inference_request_failure{{model=\"resnet\",reason=\"BACKEND\",version=\"1\"}} 1\n\
             nv_inference_count{{model=\"resnet\",version=\"1\"}} {count}\n\
             nv_inference_exec_count{{model=\"resnet\",version=\"1\"}} {exec}\n\
             nv_inference_request_duration_us{{model=\"resnet\",version=\"1\"}} {req_us}\n\
             nv_inference_queue_duration_us{{model=\"resnet\",version=\"1\"}} {q_us}\n\
             nv_inference_pending_request_count{{model=\"resnet\",version=\"1\"}} 3\n"
        )
    }

    fn run(t: &mut Triton, text: &str) -> Vec<Line> {
        let p = parse(text, Format::Prometheus);
        assert_eq!(p.bad_lines, 0);
        t.update(&p.samples, 7, "tr", &[("role", "server")])
    }

    #[test]
    fn deltas_become_per_request_latency_and_restarts_skip_an_interval() {
        let mut t = Triton::default();
        assert!(run(&mut t, &page(100, 2, 400, 50, 1_000_000, 200_000)).is_empty());
        let l = run(&mut t, &page(150, 4, 600, 75, 1_600_000, 250_000));
        assert_eq!(l.len(), 1);
        assert_eq!(
            l[0].key,
            "triton,model=resnet,role=server,scrape=tr,version=1"
        );
        assert_eq!(l[0].ts, 7);
        let f: Vec<(String, f64)> = l[0]
            .fields
            .iter()
            .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
            .collect();
        let want: Vec<(String, f64)> = [
            ("requests", 50.0),
            ("failures", 2.0),
            ("request_ms", 12.0),
            ("queue_ms", 1.0),
            ("batch_size", 8.0),
            ("pending", 3.0),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
        assert_eq!(f, want);
        // No successes in the interval: no point.
        assert!(run(&mut t, &page(150, 5, 600, 75, 1_600_000, 250_000)).is_empty());
        // A restart past the old success count: the others went down, the interval is
        // skipped ...
        assert!(run(&mut t, &page(160, 0, 40, 5, 100_000, 10_000)).is_empty());
        // ... and the next one counts from the new base.
        let l = run(&mut t, &page(180, 0, 80, 10, 300_000, 30_000));
        assert_eq!(l[0].fields[0], ("requests".into(), Value::F64(20.0)));
        assert_eq!(l[0].fields[2], ("request_ms".into(), Value::F64(10.0)));
    }

    #[test]
    fn summaries_become_percentile_fields() {
        let sum = "nv_inference_request_summary_us{model=\"m\",version=\"2\",quantile=\"0.5\"} 1500\n\
                   nv_inference_request_summary_us{model=\"m\",version=\"2\",quantile=\"0.999\"} 9000\n\
                   nv_inference_queue_summary_us{model=\"m\",version=\"2\",quantile=\"0.99\"} NaN\n";
        let a = format!("nv_inference_request_success{{model=\"m\",version=\"2\"}} 1\n{sum}");
        let b = format!("nv_inference_request_success{{model=\"m\",version=\"2\"}} 3\n{sum}");
        let mut t = Triton::default();
        assert!(run(&mut t, &a).is_empty());
        let l = run(&mut t, &b);
        let names: Vec<&str> = l[0].fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["requests", "request_p50_ms", "request_p99_9_ms"]);
        assert_eq!(l[0].fields[1].1, Value::F64(1.5));
        assert_eq!(quantile_name("0.95").as_deref(), Some("p95"));
        assert_eq!(quantile_name("2"), None);
    }

    #[test]
    fn histogram_quantile_interpolates_like_prometheus() {
        let inf = f64::INFINITY;
        // 100 observations: 20 <= 10 ms, 40 in (10, 50], 30 in (50, 100], 10 above.
        let b = [(10.0, 20.0), (50.0, 60.0), (100.0, 90.0), (inf, 100.0)];
        // Rank 10 in the first bucket, which starts at 0: 10 * 10/20.
        assert_eq!(histogram_quantile(0.1, &b), Some(5.0));
        // Rank 50: 10 + 40 * (50 - 20) / (60 - 20).
        assert_eq!(histogram_quantile(0.5, &b), Some(40.0));
        // Rank 80: 50 + 50 * (80 - 60) / (90 - 60).
        assert_eq!(histogram_quantile(0.8, &b), Some(50.0 + 50.0 * 20.0 / 30.0));
        // Ranks 95 and 99 lie in +Inf: the highest finite bound.
        assert_eq!(histogram_quantile(0.95, &b), Some(100.0));
        assert_eq!(histogram_quantile(0.99, &b), Some(100.0));
        // No observations, no +Inf bucket, only +Inf: nothing to invent.
        assert_eq!(histogram_quantile(0.5, &[(10.0, 0.0), (inf, 0.0)]), None);
        assert_eq!(histogram_quantile(0.5, &[(10.0, 4.0)]), None);
        assert_eq!(histogram_quantile(0.5, &[(inf, 4.0)]), None);
        assert_eq!(bound("+Inf"), Some(inf));
        assert_eq!(bound("2.5"), Some(2.5));
        assert_eq!(bound("x"), None);
    }

    fn hist_page(ok: u64, buckets: [u64; 4], summary: bool) -> String {
        let m = "model=\"llm\",version=\"1\"";
        let h = "nv_inference_first_response_histogram_ms";
        let [a, b, c, d] = buckets;
        let mut s = format!(
            "nv_inference_request_success{{{m}}} {ok}\n\
             # TYPE {h} histogram\n\
             {h}_bucket{{{m},le=\"10\"}} {a}\n\
             {h}_bucket{{{m},le=\"50\"}} {b}\n\
             {h}_bucket{{{m},le=\"100\"}} {c}\n\
             {h}_bucket{{{m},le=\"+Inf\"}} {d}\n\
             {h}_sum{{{m}}} 12345\n\
             {h}_count{{{m}}} {d}\n"
        );
        if summary {
            s.push_str(&format!(
                "nv_inference_first_response_summary_ms{{{m},quantile=\"0.5\"}} 7\n"
            ));
        }
        s
    }

    fn fields(l: &Line) -> Vec<(String, f64)> {
        l.fields
            .iter()
            .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
            .collect()
    }

    #[test]
    fn histograms_become_the_intervals_percentiles() {
        let mut t = Triton::default();
        assert!(run(&mut t, &hist_page(10, [5, 10, 10, 10], false)).is_empty());
        // Interval: 20, 40, 30, 10 more (the deltas of the table above).
        let l = run(&mut t, &hist_page(110, [25, 70, 100, 110], false));
        let want: Vec<(String, f64)> = [
            ("requests", 100.0),
            ("first_response_p50_ms", 40.0),
            ("first_response_p95_ms", 100.0),
            ("first_response_p99_ms", 100.0),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
        assert_eq!(fields(&l[0]), want);
        // Requests but no new observation: no percentile field.
        let l = run(&mut t, &hist_page(120, [25, 70, 100, 110], false));
        assert_eq!(fields(&l[0]), [("requests".to_string(), 10.0)]);
        // A bucket went down (restart): the interval is skipped ...
        assert!(run(&mut t, &hist_page(130, [1, 2, 2, 2], false)).is_empty());
        // ... and the next counts from the new base: 4 observations, all <= 10 ms.
        let l = run(&mut t, &hist_page(140, [5, 6, 6, 6], false));
        assert_eq!(
            l[0].fields[1],
            ("first_response_p50_ms".into(), Value::F64(5.0))
        );
    }

    #[test]
    fn a_summary_for_the_same_stage_wins_over_the_histogram() {
        // Triton documents no first-response summary today; the rule is per stage, so it is
        // checked on the counters directly.
        let inf = f64::INFINITY;
        let at = |ok: f64, n: f64, summary: bool| Counters {
            values: HashMap::from([(SUCCESS, ok)]),
            pending: None,
            quantiles: if summary {
                vec![("first_response_p50_ms".to_string(), 7.0)]
            } else {
                Vec::new()
            },
            buckets: HashMap::from([("first_response", vec![(10.0, n), (inf, n)])]),
        };
        let names = |f: Vec<(String, Value)>| -> Vec<(String, f64)> {
            f.into_iter()
                .map(|(k, v)| (k, v.as_f64().unwrap()))
                .collect()
        };
        let both = interval_fields(&at(1.0, 0.0, false), &at(5.0, 4.0, true));
        assert_eq!(
            names(both.unwrap()),
            [
                ("requests".to_string(), 4.0),
                ("first_response_p50_ms".to_string(), 7.0)
            ]
        );
        let hist_only = interval_fields(&at(1.0, 0.0, false), &at(5.0, 4.0, false));
        assert_eq!(names(hist_only.unwrap()).len(), 4);
    }
}
