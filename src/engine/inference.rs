//! The derived inference signals of the `inference` measurement ([`inference`]): latency
//! percentiles and their ratios, throughput, GPU share, overhead, batch efficiency, and the
//! latency-throughput curve with its [`knee`]. Read-only; the steps come from `collect`.
//!
//! Beside the models apps report, it lists the models a Triton server serves, from the
//! `triton` measurement the scrape input writes (one point per model, version and scrape
//! interval, see [`triton_models`]): one entry per `(model, version, scrape)`, marked
//! `"source": "triton"`. Its latencies are Triton's per-request means; its percentiles are
//! Triton's own (its latency summaries) when it exposes them, else `null`: a percentile is
//! never made up from a mean.

use std::collections::BTreeMap;

use super::energy::{energy, ModelStep};
use super::{collect, EngineError, Need, StepAcc, Steps, NS};
use crate::rollup::Plan;
use crate::store::Reader;

/// `a / b`, when both are finite and `b > 0`.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

/// The knee of a curve `(x, y)` sorted by `x`: the index `i` where a two-segment
/// least-squares fit (`points[..=i]` and `points[i..]`, each at least 3 points with distinct
/// `x`) has the largest *increase* in slope. `None` when the curve is too short or never
/// gets steeper. Pure; O(n) with prefix sums.
pub fn knee(points: &[(f64, f64)]) -> Option<usize> {
    let n = points.len();
    if n < 5 {
        return None;
    }
    // Prefix sums of x, y, xx, xy.
    let mut pre = vec![[0.0f64; 4]; n + 1];
    for (i, (x, y)) in points.iter().enumerate() {
        let p = pre[i];
        pre[i + 1] = [p[0] + x, p[1] + y, p[2] + x * x, p[3] + x * y];
    }
    let slope = |a: usize, b: usize| -> Option<f64> {
        // Points a..b (exclusive).
        let k = (b - a) as f64;
        let s: Vec<f64> = (0..4).map(|j| pre[b][j] - pre[a][j]).collect();
        let var = s[2] - s[0] * s[0] / k;
        if var <= 1e-12 * (1.0 + s[2].abs()) {
            return None;
        }
        Some((s[3] - s[0] * s[1] / k) / var)
    };
    let mut best: Option<(usize, f64)> = None;
    for i in 2..n - 2 {
        let (Some(l), Some(r)) = (slope(0, i + 1), slope(i, n)) else {
            continue;
        };
        let jump = r - l;
        if jump > 1e-9 * (1.0 + l.abs() + r.abs()) && best.map_or(true, |(_, b)| jump > b) {
            best = Some((i, jump));
        }
    }
    best.map(|(i, _)| i)
}

/// An inference-signals query.
#[derive(Debug, Clone)]
pub struct InferenceQuery {
    /// Only this model.
    pub model: Option<String>,
    /// Start, ns.
    pub from: i64,
    /// End, ns.
    pub to: i64,
    /// Step, ns.
    pub step_ns: i64,
}

fn json_num(v: Option<f64>) -> serde_json::Value {
    finite(v).map_or(serde_json::Value::Null, |v| v.into())
}

/// Derived signals of the `inference` measurement per model and step: p50/p95/p99 of
/// `wall_ms` and `gpu_ms`, p99/p50 and p99/p95 of `wall_ms`, throughput (requests per
/// second), GPU share (sum gpu_ms / sum wall_ms), mean overhead (mean wall_ms - mean
/// gpu_ms), batch efficiency (mean `batch_size` / the model's `optimal_batch`), a summary
/// over the whole range, and the latency-throughput curve with its [`knee`].
pub fn inference(
    reader: &Reader,
    plan: &Plan,
    optimal_batch: &BTreeMap<String, f64>,
    q: &InferenceQuery,
    now: i64,
) -> Result<InferenceAnswer, EngineError> {
    let tags: Vec<(String, String)> = q
        .model
        .iter()
        .map(|m| ("model".to_string(), m.clone()))
        .collect();
    let mut per_model: BTreeMap<String, [Steps; 3]> = BTreeMap::new();
    let mut tier = String::new();
    let mut from = q.from;
    for (fi, field) in ["wall_ms", "gpu_ms", "batch_size"].into_iter().enumerate() {
        let c = collect(
            reader,
            plan,
            "inference",
            field,
            &tags,
            q.from,
            q.to,
            q.step_ns,
            if fi < 2 { Need::All } else { Need::Sum },
            now,
        )?;
        tier = c.tier;
        from = c.from;
        for (set_tags, steps) in c.sets {
            let model = set_tags.get("model").cloned().unwrap_or_default();
            let slot = &mut per_model.entry(model).or_default()[fi];
            for (t, s) in steps {
                slot.at(t).merge(&s);
            }
        }
    }
    let step_s = q.step_ns as f64 / NS as f64;
    let energy = energy(reader, plan, from, q.to, q.step_ns, now)?;
    let mut models = Vec::new();
    for (model, [wall, gpu, batch]) in per_model {
        let opt = optimal_batch.get(&model).copied();
        let mut times: Vec<i64> = wall.keys().chain(gpu.keys()).chain(batch.keys()).collect();
        times.sort_unstable();
        times.dedup();
        let empty = StepAcc::default();
        let mut steps = Vec::with_capacity(times.len());
        let mut curve: Vec<CurvePoint> = Vec::new();
        let (mut tw, mut tg, mut tb) = (StepAcc::default(), StepAcc::default(), StepAcc::default());
        let mut te = ModelStep::default();
        for t in &times {
            let w = wall.get(*t).unwrap_or(&empty);
            let g = gpu.get(*t).unwrap_or(&empty);
            let b = batch.get(*t).unwrap_or(&empty);
            tw.merge(w);
            tg.merge(g);
            tb.merge(b);
            let e = energy.get(&model, *t);
            te.add(&e);
            let mut s = Signals::of(w, g, b, step_s, opt, &e);
            s.t = Some(*t);
            steps.push(s);
            if let (Some(p50_ms), Some(p99_ms)) = (w.quantile(0.5), w.quantile(0.99)) {
                curve.push(CurvePoint {
                    throughput_per_s: w.acc.count as f64 / step_s,
                    p50_ms,
                    p99_ms,
                    t: *t,
                });
            }
        }
        curve.sort_by(|a, b| {
            a.throughput_per_s
                .total_cmp(&b.throughput_per_s)
                .then(a.t.cmp(&b.t))
        });
        let k = knee(
            &curve
                .iter()
                .map(|c| (c.throughput_per_s, c.p99_ms))
                .collect::<Vec<_>>(),
        );
        let seconds = ((q.to - from) as f64 / NS as f64).max(step_s);
        models.push(Model::App(Box::new(AppModel {
            knee: k.map(|i| curve[i]),
            model,
            source: "app",
            optimal_batch: finite(opt),
            summary: Signals::of(&tw, &tg, &tb, seconds, opt, &te),
            steps,
            curve,
        })));
    }
    models.extend(
        triton_models(reader, plan, optimal_batch, q, now)?
            .into_iter()
            .map(Model::Scraped),
    );
    Ok(InferenceAnswer {
        measurement: "inference",
        step_ns: q.step_ns,
        tier,
        from,
        to: q.to,
        models,
        energy: energy.to_json(),
    })
}

/// The answer of [`inference`], serialized as it is built: typed rows rather than a JSON
/// tree, since a tree of an hour's steps of a few dozen models (a map and a string per key
/// of each step) took more memory than the rest of the agent (docs/performance.md).
#[derive(Debug, serde::Serialize)]
pub struct InferenceAnswer {
    measurement: &'static str,
    step_ns: i64,
    tier: String,
    from: i64,
    to: i64,
    models: Vec<Model>,
    energy: serde_json::Value,
}

/// A model of the answer: one apps report (`"source": "app"`), or one a scrape reported
/// ([`triton_models`]).
#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
enum Model {
    App(Box<AppModel>),
    Scraped(serde_json::Value),
}

#[derive(Debug, serde::Serialize)]
struct AppModel {
    model: String,
    source: &'static str,
    optimal_batch: Option<f64>,
    summary: Signals,
    steps: Vec<Signals>,
    curve: Vec<CurvePoint>,
    knee: Option<CurvePoint>,
}

/// One point of the latency-throughput curve.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct CurvePoint {
    throughput_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    t: i64,
}

/// Percentiles and mean of one latency field.
#[derive(Debug, serde::Serialize)]
struct Latency {
    p50: Option<f64>,
    p95: Option<f64>,
    p99: Option<f64>,
    mean: Option<f64>,
}

impl Latency {
    fn of(a: &StepAcc) -> Latency {
        Latency {
            p50: finite(a.quantile(0.5)),
            p95: finite(a.quantile(0.95)),
            p99: finite(a.quantile(0.99)),
            mean: finite(a.acc.mean()),
        }
    }
}

/// The signals of one step (with its start `t`), or of the summary over all steps.
#[derive(Debug, serde::Serialize)]
struct Signals {
    #[serde(skip_serializing_if = "Option::is_none")]
    t: Option<i64>,
    count: u64,
    throughput_per_s: f64,
    wall_ms: Latency,
    gpu_ms: Latency,
    p99_p50: Option<f64>,
    p99_p95: Option<f64>,
    gpu_share: Option<f64>,
    overhead_ms: Option<f64>,
    batch_mean: Option<f64>,
    batch_efficiency: Option<f64>,
    energy_mj: Option<f64>,
    energy_mj_per_inference: Option<f64>,
    gpu_energy_mj_per_inference: Option<f64>,
    inferences_per_joule: Option<f64>,
}

impl Signals {
    /// Of wall time `w`, GPU time `g` and batch size `b` over `seconds`, with energy `e`.
    fn of(
        w: &StepAcc,
        g: &StepAcc,
        b: &StepAcc,
        seconds: f64,
        opt: Option<f64>,
        e: &ModelStep,
    ) -> Signals {
        let wall_ms = Latency::of(w);
        let count = w.acc.count.max(g.acc.count);
        let (per, gpu_per, ipj) = e.per_inference();
        Signals {
            t: None,
            count,
            throughput_per_s: count as f64 / seconds,
            p99_p50: finite(ratio(wall_ms.p99, wall_ms.p50)),
            p99_p95: finite(ratio(wall_ms.p99, wall_ms.p95)),
            gpu_share: finite(ratio(Some(g.acc.sum), Some(w.acc.sum)).filter(|_| g.acc.count > 0)),
            overhead_ms: finite(match (w.acc.mean(), g.acc.mean()) {
                (Some(a), Some(b)) => Some(a - b),
                _ => None,
            }),
            batch_mean: finite(b.acc.mean()),
            batch_efficiency: finite(ratio(b.acc.mean(), opt)),
            energy_mj: finite(e.board_mj),
            energy_mj_per_inference: finite(per),
            gpu_energy_mj_per_inference: finite(gpu_per),
            inferences_per_joule: finite(ipj),
            wall_ms,
            gpu_ms: Latency::of(g),
        }
    }
}

/// `v` when it is a finite number (JSON has no NaN or infinity: `null` otherwise).
fn finite(v: Option<f64>) -> Option<f64> {
    v.filter(|v| v.is_finite())
}

/// The `triton` fields [`triton_models`] reads, with how each step aggregates them.
const TRITON_FIELDS: [&str; 13] = [
    "requests",
    "failures",
    "request_ms",
    "compute_infer_ms",
    "queue_ms",
    "batch_size",
    "pending",
    "request_p50_ms",
    "request_p95_ms",
    "request_p99_ms",
    "compute_infer_p50_ms",
    "compute_infer_p95_ms",
    "compute_infer_p99_ms",
];

/// One Triton model's steps: per field of [`TRITON_FIELDS`].
type TritonSteps = [Steps; 13];

/// The signals of one Triton step (or of the summary, over all steps): `f[i]` is the
/// accumulator of `TRITON_FIELDS[i]`. Counts and failures are sums of the intervals'
/// deltas; means are the mean of the intervals' per-request means; a percentile is the
/// newest value of Triton's summary field (Triton's own sliding window), `null` without one.
fn triton_signals(f: &[StepAcc], seconds: f64, opt: Option<f64>) -> serde_json::Value {
    let sum = |i: usize| (f[i].acc.count > 0).then_some(f[i].acc.sum);
    let mean = |i: usize| f[i].acc.mean();
    let newest = |i: usize| (f[i].acc.count > 0).then_some(f[i].acc.last.1);
    let count = sum(0).unwrap_or(0.0).max(0.0).round() as u64;
    let (p50, p95, p99) = (newest(7), newest(8), newest(9));
    let (wall, gpu) = (mean(2), mean(3));
    serde_json::json!({
        "count": count,
        "throughput_per_s": count as f64 / seconds,
        "failures": sum(1).unwrap_or(0.0).max(0.0).round() as u64,
        "wall_ms": {"p50": json_num(p50), "p95": json_num(p95), "p99": json_num(p99), "mean": json_num(wall)},
        "gpu_ms": {"p50": json_num(newest(10)), "p95": json_num(newest(11)), "p99": json_num(newest(12)), "mean": json_num(gpu)},
        "queue_ms": json_num(mean(4)),
        "pending": json_num(newest(6)),
        "p99_p50": json_num(ratio(p99, p50)),
        "p99_p95": json_num(ratio(p99, p95)),
        "gpu_share": json_num(ratio(gpu, wall)),
        "overhead_ms": json_num(match (wall, gpu) { (Some(a), Some(b)) => Some(a - b), _ => None }),
        "batch_mean": json_num(mean(5)),
        "batch_efficiency": json_num(ratio(mean(5), opt)),
        // Energy is attributed to app-reported models only.
        "energy_mj": null,
        "energy_mj_per_inference": null,
        "gpu_energy_mj_per_inference": null,
        "inferences_per_joule": null,
    })
}

/// The Triton models of the `triton` measurement (written by the scrape input), one entry
/// per `(model, version, scrape)`, in the shape of the app-reported ones plus `source`,
/// `version`, `scrape`, `failures`, `queue_ms` and `pending`. The mapping: `count` = sum of
/// `requests`; `throughput_per_s` = that / the step's seconds; `wall_ms.mean` = mean of
/// `request_ms`, `gpu_ms.mean` = mean of `compute_infer_ms` (each interval's per-request
/// mean weighs the same); `wall_ms.pNN` / `gpu_ms.pNN` = the newest `request_pNN_ms` /
/// `compute_infer_pNN_ms` in the step, `null` when Triton exposes no summaries.
pub fn triton_models(
    reader: &Reader,
    plan: &Plan,
    optimal_batch: &BTreeMap<String, f64>,
    q: &InferenceQuery,
    now: i64,
) -> Result<Vec<serde_json::Value>, EngineError> {
    let tags: Vec<(String, String)> = q
        .model
        .iter()
        .map(|m| ("model".to_string(), m.clone()))
        .collect();
    let mut per: BTreeMap<(String, String, String), TritonSteps> = BTreeMap::new();
    let mut from = q.from;
    for (fi, field) in TRITON_FIELDS.into_iter().enumerate() {
        let c = collect(
            reader,
            plan,
            "triton",
            field,
            &tags,
            q.from,
            q.to,
            q.step_ns,
            Need::Sum,
            now,
        )?;
        from = c.from;
        for (set_tags, steps) in c.sets {
            let get = |k: &str| set_tags.get(k).cloned().unwrap_or_default();
            let key = (get("model"), get("version"), get("scrape"));
            let slot = &mut per.entry(key).or_default()[fi];
            for (t, s) in steps {
                slot.at(t).merge(&s);
            }
        }
    }
    let step_s = q.step_ns as f64 / NS as f64;
    let seconds = ((q.to - from) as f64 / NS as f64).max(step_s);
    let mut out = Vec::new();
    for ((model, version, scrape), fields) in per {
        let opt = optimal_batch.get(&model).copied();
        let mut times: Vec<i64> = fields.iter().flat_map(|f| f.keys()).collect();
        times.sort_unstable();
        times.dedup();
        let empty = StepAcc::default();
        let mut total: Vec<StepAcc> = vec![StepAcc::default(); TRITON_FIELDS.len()];
        let mut steps = Vec::new();
        let mut curve: Vec<(f64, f64, f64, i64)> = Vec::new();
        for t in &times {
            let step: Vec<StepAcc> = fields
                .iter()
                .map(|f| f.get(*t).unwrap_or(&empty).clone())
                .collect();
            for (a, s) in total.iter_mut().zip(&step) {
                a.merge(s);
            }
            let mut s = triton_signals(&step, step_s, opt);
            if let (Some(x), Some(p50), Some(p99)) = (
                s["throughput_per_s"].as_f64(),
                s["wall_ms"]["p50"].as_f64(),
                s["wall_ms"]["p99"].as_f64(),
            ) {
                curve.push((x, p50, p99, *t));
            }
            s["t"] = (*t).into();
            steps.push(s);
        }
        curve.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.3.cmp(&b.3)));
        let k = knee(&curve.iter().map(|c| (c.0, c.2)).collect::<Vec<_>>());
        out.push(serde_json::json!({
            "model": model,
            "source": "triton",
            "version": version,
            "scrape": scrape,
            "optimal_batch": json_num(opt),
            "summary": triton_signals(&total, seconds, opt),
            "steps": steps,
            "curve": curve.iter().map(|c| serde_json::json!({"throughput_per_s": c.0, "p50_ms": c.1, "p99_ms": c.2, "t": c.3})).collect::<Vec<_>>(),
            "knee": k.map(|i| serde_json::json!({"throughput_per_s": curve[i].0, "p50_ms": curve[i].1, "p99_ms": curve[i].2, "t": curve[i].3})),
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knee_is_where_the_slope_jumps() {
        // Flat latency up to 100 req/s, then steep.
        let pts: Vec<(f64, f64)> = (0..20)
            .map(|i| {
                let x = 10.0 * i as f64;
                let y = if x <= 100.0 {
                    20.0 + 0.01 * x
                } else {
                    21.0 + 2.0 * (x - 100.0)
                };
                (x, y)
            })
            .collect();
        assert_eq!(knee(&pts), Some(10));
        // A straight line has no knee; neither has a too-short curve.
        let line: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 2.0 * i as f64)).collect();
        assert_eq!(knee(&line), None);
        assert_eq!(knee(&pts[..4]), None);
        // A curve that flattens (slope drops) has no knee either.
        let flat: Vec<(f64, f64)> = pts.iter().map(|(x, y)| (*x, -y)).collect();
        assert_eq!(knee(&flat), None);
    }

    #[test]
    fn triton_steps_sum_counts_average_means_and_never_invent_percentiles() {
        let mut f = vec![StepAcc::default(); TRITON_FIELDS.len()];
        fn put(f: &mut [StepAcc], name: &str, t: i64, v: f64) {
            let i = TRITON_FIELDS.iter().position(|n| *n == name).unwrap();
            f[i].acc.add(t, v);
        }
        put(&mut f, "requests", 1, 10.0);
        put(&mut f, "requests", 2, 30.0);
        put(&mut f, "request_ms", 1, 20.0);
        put(&mut f, "request_ms", 2, 30.0);
        put(&mut f, "compute_infer_ms", 1, 10.0);
        put(&mut f, "compute_infer_ms", 2, 10.0);
        let s = triton_signals(&f, 10.0, Some(4.0));
        assert_eq!(s["count"], 40);
        assert_eq!(s["throughput_per_s"], 4.0);
        assert_eq!(s["failures"], 0);
        assert_eq!(s["wall_ms"]["mean"], 25.0);
        assert_eq!(s["gpu_share"], 0.4);
        assert_eq!(s["overhead_ms"], 15.0);
        // No summaries: means only, every percentile and ratio null.
        for p in ["p50", "p95", "p99"] {
            assert!(s["wall_ms"][p].is_null() && s["gpu_ms"][p].is_null(), "{s}");
        }
        assert!(s["p99_p50"].is_null() && s["batch_efficiency"].is_null());
        // With summaries: the newest value.
        put(&mut f, "request_p99_ms", 2, 70.0);
        put(&mut f, "request_p99_ms", 1, 90.0);
        let s = triton_signals(&f, 10.0, None);
        assert_eq!(s["wall_ms"]["p99"], 70.0);
    }

    #[test]
    fn ratios_need_finite_values_and_a_positive_divisor() {
        assert_eq!(ratio(Some(30.0), Some(10.0)), Some(3.0));
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
    }
}
