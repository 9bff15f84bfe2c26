//! The derived inference signals of the `inference` measurement ([`inference`]): latency
//! percentiles and their ratios, throughput, GPU share, overhead, batch efficiency, and the
//! latency-throughput curve with its [`knee`]. Read-only; the steps come from `collect`.

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
    v.filter(|v| v.is_finite())
        .map_or(serde_json::Value::Null, |v| v.into())
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
) -> Result<serde_json::Value, EngineError> {
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
    let with_energy = |s: &mut serde_json::Value, e: &ModelStep| {
        let (per, gpu_per, ipj) = e.per_inference();
        s["energy_mj"] = json_num(e.board_mj);
        s["energy_mj_per_inference"] = json_num(per);
        s["gpu_energy_mj_per_inference"] = json_num(gpu_per);
        s["inferences_per_joule"] = json_num(ipj);
    };
    let signals = |w: &StepAcc, g: &StepAcc, b: &StepAcc, seconds: f64, opt: Option<f64>| {
        let (p50, p95, p99) = (w.quantile(0.5), w.quantile(0.95), w.quantile(0.99));
        let count = w.acc.count.max(g.acc.count);
        serde_json::json!({
            "count": count,
            "throughput_per_s": count as f64 / seconds,
            "wall_ms": {"p50": json_num(p50), "p95": json_num(p95), "p99": json_num(p99), "mean": json_num(w.acc.mean())},
            "gpu_ms": {"p50": json_num(g.quantile(0.5)), "p95": json_num(g.quantile(0.95)), "p99": json_num(g.quantile(0.99)), "mean": json_num(g.acc.mean())},
            "p99_p50": json_num(ratio(p99, p50)),
            "p99_p95": json_num(ratio(p99, p95)),
            "gpu_share": json_num(ratio(Some(g.acc.sum), Some(w.acc.sum)).filter(|_| g.acc.count > 0)),
            "overhead_ms": json_num(match (w.acc.mean(), g.acc.mean()) { (Some(a), Some(b)) => Some(a - b), _ => None }),
            "batch_mean": json_num(b.acc.mean()),
            "batch_efficiency": json_num(ratio(b.acc.mean(), opt)),
        })
    };
    let mut models = Vec::new();
    for (model, [wall, gpu, batch]) in per_model {
        let opt = optimal_batch.get(&model).copied();
        let mut times: Vec<i64> = wall.keys().chain(gpu.keys()).chain(batch.keys()).collect();
        times.sort_unstable();
        times.dedup();
        let empty = StepAcc::default();
        let mut steps = Vec::new();
        let mut curve: Vec<(f64, f64, f64, i64)> = Vec::new();
        let (mut tw, mut tg, mut tb) = (StepAcc::default(), StepAcc::default(), StepAcc::default());
        let mut te = ModelStep::default();
        for t in &times {
            let w = wall.get(*t).unwrap_or(&empty);
            let g = gpu.get(*t).unwrap_or(&empty);
            let b = batch.get(*t).unwrap_or(&empty);
            tw.merge(w);
            tg.merge(g);
            tb.merge(b);
            let mut s = signals(w, g, b, step_s, opt);
            s["t"] = (*t).into();
            let e = energy.get(&model, *t);
            te.add(&e);
            with_energy(&mut s, &e);
            steps.push(s);
            if let (Some(p50), Some(p99)) = (w.quantile(0.5), w.quantile(0.99)) {
                curve.push((w.acc.count as f64 / step_s, p50, p99, *t));
            }
        }
        curve.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.3.cmp(&b.3)));
        let k = knee(&curve.iter().map(|c| (c.0, c.2)).collect::<Vec<_>>());
        let seconds = ((q.to - from) as f64 / NS as f64).max(step_s);
        let mut summary = signals(&tw, &tg, &tb, seconds, opt);
        with_energy(&mut summary, &te);
        models.push(serde_json::json!({
            "model": model,
            "optimal_batch": json_num(opt),
            "summary": summary,
            "steps": steps,
            "curve": curve.iter().map(|c| serde_json::json!({"throughput_per_s": c.0, "p50_ms": c.1, "p99_ms": c.2, "t": c.3})).collect::<Vec<_>>(),
            "knee": k.map(|i| serde_json::json!({"throughput_per_s": curve[i].0, "p50_ms": curve[i].1, "p99_ms": curve[i].2, "t": curve[i].3})),
        }));
    }
    Ok(serde_json::json!({
        "measurement": "inference",
        "step_ns": q.step_ns,
        "tier": tier,
        "from": from,
        "to": q.to,
        "models": models,
        "energy": energy.to_json(),
    }))
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
    fn ratios_need_finite_values_and_a_positive_divisor() {
        assert_eq!(ratio(Some(30.0), Some(10.0)), Some(3.0));
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
    }
}
