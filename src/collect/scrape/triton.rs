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
//! (e.g. `request_p99_ms`, `queue_p99_9_ms`). It never writes a point for the first scrape
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

/// One model version's counters in one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
struct Counters {
    /// Counter name -> value (failures summed over reasons).
    values: HashMap<&'static str, f64>,
    pending: Option<f64>,
    /// (field, ms) from the summaries.
    quantiles: Vec<(String, f64)>,
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
}
