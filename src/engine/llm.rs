//! The derived LLM serving signals of the `llm` measurement ([`llm`], for `/api/v1/llm`):
//! per model and step, time to first token, inter-token latency and end-to-end latency
//! percentiles, the TTFT p99/p50 ratio, requests and output tokens per second, each request's
//! decode speed, errors, and energy per output token (tokens per joule, joules per 1k
//! tokens) through the energy attribution of `energy.rs`, with the share of tokens its
//! power samples cover. Read-only.
//!
//! Two sources, one entry each: points an app sent (the Python client, its `openai` and
//! `transformers` integrations: one point per request with `ttft_ms`, `e2e_ms`, ... and
//! one per gap between tokens with `itl_ms`, so ITL percentiles are true percentiles across
//! requests), and points the scrape input's `vllm` / `llamacpp` presets write per scrape
//! interval (tagged `scrape`), whose percentiles are the server's histogram buckets
//! interpolated per interval: a step's percentile there is its worst interval's (a
//! percentile of percentiles is not one), marked `"source": "scrape"`.
//!
//! The prompt-length curve ([`prompt_curve`], app points from raw data only: it pairs each
//! request's `prompt_tokens` with its `ttft_ms`): requests bucketed by prompt length in
//! quarter octaves (buckets with at least [`MIN_BUCKET`] requests), TTFT p50/p99 per
//! bucket, and the knee where TTFT starts growing faster with the prompt ([`knee`]), with
//! the fitted slope (ms per 1k prompt tokens) below and above it.

use std::collections::BTreeMap;

use super::energy::{energy, raw_points, ModelStep};
use super::{collect, knee, ratio, EngineError, InferenceQuery, Need, StepAcc, Steps, NS};
use crate::rollup::Plan;
use crate::store::{dict, Reader};

/// The fields of an app-reported request (and its gaps), with what each step reads.
const APP_FIELDS: [(&str, Need); 8] = [
    ("ttft_ms", Need::All),
    ("itl_ms", Need::All),
    ("e2e_ms", Need::All),
    ("queue_ms", Need::All),
    ("tokens_per_s", Need::All),
    ("output_tokens", Need::Sum),
    ("prompt_tokens", Need::Sum),
    ("ok", Need::Sum),
];
const TTFT: usize = 0;
const ITL: usize = 1;
const E2E: usize = 2;
const QUEUE: usize = 3;
const TPS: usize = 4;
const OUT: usize = 5;
const PROMPT: usize = 6;
const OK: usize = 7;

/// The per-interval fields the scrape presets write (see `collect::scrape::llm`).
const SCRAPE_FIELDS: [&str; 21] = [
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p90_ms",
    "itl_p99_ms",
    "e2e_p50_ms",
    "e2e_p90_ms",
    "e2e_p99_ms",
    "queue_p50_ms",
    "queue_p90_ms",
    "queue_p99_ms",
    "requests",
    "output_tokens",
    "prompt_tokens",
    "kv_cache_usage",
    "requests_running",
    "requests_waiting",
    "requests_processing",
    "requests_deferred",
    "decode_tokens_per_s",
];

/// Fewest requests a prompt-length bucket needs to be on the curve.
pub const MIN_BUCKET: u64 = 3;

fn num(v: Option<f64>) -> serde_json::Value {
    v.filter(|v| v.is_finite())
        .map_or(serde_json::Value::Null, |v| v.into())
}

fn pcts(s: &StepAcc) -> serde_json::Value {
    serde_json::json!({
        "p50": num(s.quantile(0.5)),
        "p95": num(s.quantile(0.95)),
        "p99": num(s.quantile(0.99)),
        "mean": num(s.acc.mean()),
        "count": s.acc.count,
    })
}

/// The energy fields of a step or summary.
fn with_energy(s: &mut serde_json::Value, e: &ModelStep, tokens: f64) {
    let (tpj, jpk) = e.per_token();
    s["energy_mj"] = num(e.board_mj);
    s["tokens_per_joule"] = num(tpj);
    s["joules_per_1k_tokens"] = num(jpk);
    s["energy_mj_per_request"] = num(e.per_inference().0);
    // The share of the output tokens the power samples cover (the divisor of tokens/J).
    s["energy_tokens"] = num(e.board_mj.map(|_| e.tokens));
    s["energy_token_coverage"] = num(ratio(e.board_mj.map(|_| e.tokens), Some(tokens)));
}

/// The signals of app-reported requests over `seconds` (a step, or the whole range).
fn app_signals(f: &[StepAcc], seconds: f64) -> serde_json::Value {
    let requests = f[E2E].acc.count.max(f[TTFT].acc.count).max(f[OK].acc.count);
    let errors = (f[OK].acc.count as f64 - f[OK].acc.sum).max(0.0).round() as u64;
    let out = f[OUT].acc.sum;
    let (p50, p99) = (f[TTFT].quantile(0.5), f[TTFT].quantile(0.99));
    serde_json::json!({
        "requests": requests,
        "requests_per_s": requests as f64 / seconds,
        "errors": errors,
        "ttft_ms": pcts(&f[TTFT]),
        "itl_ms": pcts(&f[ITL]),
        "e2e_ms": pcts(&f[E2E]),
        "queue_ms": pcts(&f[QUEUE]),
        "ttft_p99_p50": num(ratio(p99, p50)),
        "tokens_per_s": {"p50": num(f[TPS].quantile(0.5)), "mean": num(f[TPS].acc.mean())},
        "output_tokens": out,
        "prompt_tokens": f[PROMPT].acc.sum,
        "prompt_tokens_mean": num(f[PROMPT].acc.mean()),
        "output_tokens_per_s": out / seconds,
    })
}

/// The signals of scraped intervals over `seconds`: percentiles are the worst interval's,
/// counts summed, gauges the newest (and the highest KV-cache use).
fn scrape_signals(f: &[StepAcc], seconds: f64) -> serde_json::Value {
    let at = |name: &str| SCRAPE_FIELDS.iter().position(|n| *n == name).map(|i| &f[i]);
    let max = |name: &str| at(name).filter(|s| s.acc.count > 0).map(|s| s.acc.max);
    let sum = |name: &str| at(name).filter(|s| s.acc.count > 0).map(|s| s.acc.sum);
    let last = |name: &str| at(name).filter(|s| s.acc.count > 0).map(|s| s.acc.last.1);
    let lat = |p: &str| {
        serde_json::json!({
            "p50": num(max(&format!("{p}_p50_ms"))),
            "p90": num(max(&format!("{p}_p90_ms"))),
            "p99": num(max(&format!("{p}_p99_ms"))),
        })
    };
    let requests = sum("requests");
    let out = sum("output_tokens");
    serde_json::json!({
        "requests": num(requests),
        "requests_per_s": num(requests.map(|r| r / seconds)),
        "ttft_ms": lat("ttft"),
        "itl_ms": lat("itl"),
        "e2e_ms": lat("e2e"),
        "queue_ms": lat("queue"),
        "ttft_p99_p50": num(ratio(max("ttft_p99_ms"), max("ttft_p50_ms"))),
        "output_tokens": num(out),
        "prompt_tokens": num(sum("prompt_tokens")),
        "output_tokens_per_s": num(out.map(|o| o / seconds)),
        "decode_tokens_per_s": num(at("decode_tokens_per_s").and_then(|s| s.acc.mean())),
        "kv_cache_usage": num(last("kv_cache_usage")),
        "kv_cache_usage_max": num(max("kv_cache_usage")),
        "requests_running": num(last("requests_running").or(last("requests_processing"))),
        "requests_waiting": num(last("requests_waiting").or(last("requests_deferred"))),
    })
}

/// One entry's fields: per field, its steps.
type FieldSteps = Vec<Steps>;

/// Reads `fields` of `llm` into per-`(model, server, scrape)` steps; `scraped` picks the
/// tag sets with (true) or without (false) a `scrape` tag.
#[allow(clippy::type_complexity)]
fn read(
    reader: &Reader,
    plan: &Plan,
    q: &InferenceQuery,
    fields: &[(&str, Need)],
    scraped: bool,
    now: i64,
) -> Result<(BTreeMap<(String, String, String), FieldSteps>, String, i64), EngineError> {
    let tags: Vec<(String, String)> = q
        .model
        .iter()
        .map(|m| ("model".to_string(), m.clone()))
        .collect();
    let mut per: BTreeMap<(String, String, String), FieldSteps> = BTreeMap::new();
    let (mut tier, mut from) = (String::new(), q.from);
    for (fi, (field, need)) in fields.iter().enumerate() {
        let c = collect(
            reader, plan, "llm", field, &tags, q.from, q.to, q.step_ns, *need, now,
        )?;
        tier = c.tier;
        from = c.from;
        for (set_tags, steps) in c.sets {
            if set_tags.contains_key("scrape") != scraped {
                continue;
            }
            let get = |k: &str| set_tags.get(k).cloned().unwrap_or_default();
            // App points group by model (every app and server together).
            let key = if scraped {
                (get("model"), get("server"), get("scrape"))
            } else {
                (get("model"), String::new(), String::new())
            };
            let slot = per
                .entry(key)
                .or_insert_with(|| vec![Steps::default(); fields.len()]);
            for (t, s) in steps {
                slot[fi].at(t).merge(&s);
            }
        }
    }
    Ok((per, tier, from))
}

/// Derived signals of the `llm` measurement per model and step, a summary over the range,
/// the energy per token, and (app points) the prompt-length curve and its knee.
pub fn llm(
    reader: &Reader,
    plan: &Plan,
    q: &InferenceQuery,
    now: i64,
) -> Result<serde_json::Value, EngineError> {
    let (app, tier, from) = read(reader, plan, q, &APP_FIELDS, false, now)?;
    let has_scrape = dict::tagsets(reader.conn(), reader.path(), Some("llm"))?
        .iter()
        .any(|s| s.tags.contains_key("scrape"));
    let scraped = if has_scrape {
        let fields: Vec<(&str, Need)> = SCRAPE_FIELDS.iter().map(|f| (*f, Need::All)).collect();
        read(reader, plan, q, &fields, true, now)?.0
    } else {
        BTreeMap::new()
    };
    let step_s = q.step_ns as f64 / NS as f64;
    let seconds = ((q.to - from) as f64 / NS as f64).max(step_s);
    let energy = energy(reader, plan, from, q.to, q.step_ns, now)?;
    let curves = prompt_curves(reader, q)?;
    let mut models = Vec::new();
    for ((model, server, scrape), fields) in app.into_iter().chain(scraped) {
        let is_scrape = !scrape.is_empty();
        let mut times: Vec<i64> = fields.iter().flat_map(|f| f.keys()).collect();
        times.sort_unstable();
        times.dedup();
        let empty = StepAcc::default();
        let mut total = vec![StepAcc::default(); fields.len()];
        let mut te = ModelStep::default();
        let mut steps = Vec::new();
        let signals = |f: &[StepAcc], secs: f64| {
            if is_scrape {
                scrape_signals(f, secs)
            } else {
                app_signals(f, secs)
            }
        };
        for t in &times {
            let step: Vec<StepAcc> = fields
                .iter()
                .map(|f| f.get(*t).unwrap_or(&empty).clone())
                .collect();
            for (a, s) in total.iter_mut().zip(&step) {
                a.merge(s);
            }
            let mut s = signals(&step, step_s);
            s["t"] = (*t).into();
            let e = energy.get_in("llm", &model, &scrape, *t);
            te.add(&e);
            let tokens = s["output_tokens"].as_f64().unwrap_or(0.0);
            with_energy(&mut s, &e, tokens);
            steps.push(s);
        }
        let mut summary = signals(&total, seconds);
        let tokens = summary["output_tokens"].as_f64().unwrap_or(0.0);
        with_energy(&mut summary, &te, tokens);
        let mut entry = serde_json::json!({
            "model": model,
            "source": if is_scrape { "scrape" } else { "app" },
            "summary": summary,
            "steps": steps,
        });
        if is_scrape {
            entry["server"] = server.into();
            entry["scrape"] = scrape.into();
        } else {
            entry["prompt_curve"] = curves
                .get(&model)
                .cloned()
                .unwrap_or_else(|| prompt_curve_json(&[]));
        }
        models.push(entry);
    }
    Ok(serde_json::json!({
        "measurement": "llm",
        "step_ns": q.step_ns,
        "tier": tier,
        "from": from,
        "to": q.to,
        "models": models,
        "energy": energy.to_json(),
    }))
}

/// One bucket of the prompt-length curve.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptBucket {
    /// Smallest prompt length in the bucket, tokens.
    pub lo: f64,
    /// Largest, tokens.
    pub hi: f64,
    /// Mean prompt length, tokens.
    pub mean: f64,
    /// Requests.
    pub count: u64,
    /// TTFT p50, ms (exact).
    pub p50: f64,
    /// TTFT p99, ms (exact).
    pub p99: f64,
}

/// Buckets `(prompt_tokens, ttft_ms)` pairs by prompt length in quarter octaves (`1`, then
/// `[2^(k/4), 2^((k+1)/4))`), keeping buckets of at least [`MIN_BUCKET`] requests, in
/// prompt order. Pure.
pub fn prompt_curve(pairs: &[(f64, f64)]) -> Vec<PromptBucket> {
    let mut by: BTreeMap<i64, Vec<(f64, f64)>> = BTreeMap::new();
    for &(p, t) in pairs {
        if !(p.is_finite() && t.is_finite()) || p < 1.0 {
            continue;
        }
        by.entry((4.0 * p.log2()).floor() as i64)
            .or_default()
            .push((p, t));
    }
    by.into_values()
        .filter(|v| v.len() as u64 >= MIN_BUCKET)
        .map(|v| {
            let mut ttft: Vec<f64> = v.iter().map(|x| x.1).collect();
            ttft.sort_by(f64::total_cmp);
            let rank = |q: f64| ttft[(q * (ttft.len() - 1) as f64).floor() as usize];
            let prompts = v.iter().map(|x| x.0);
            PromptBucket {
                lo: prompts.clone().fold(f64::INFINITY, f64::min),
                hi: prompts.clone().fold(f64::NEG_INFINITY, f64::max),
                mean: prompts.sum::<f64>() / v.len() as f64,
                count: v.len() as u64,
                p50: rank(0.5),
                p99: rank(0.99),
            }
        })
        .collect()
}

/// The least-squares slope of `points`, when they have distinct `x`.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let var: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let cov: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    (var > 0.0).then(|| cov / var)
}

/// The curve's JSON: buckets, knee (on TTFT p50 against mean prompt length) and the slopes
/// below and above it in ms per 1k prompt tokens (one slope over the whole curve without a
/// knee).
fn prompt_curve_json(buckets: &[PromptBucket]) -> serde_json::Value {
    let pts: Vec<(f64, f64)> = buckets.iter().map(|b| (b.mean, b.p50)).collect();
    let k = knee(&pts);
    let per_k = |s: Option<f64>| num(s.map(|s| s * 1000.0));
    let (below, above) = match k {
        Some(i) => (slope(&pts[..=i]), slope(&pts[i..])),
        None => (slope(&pts), None),
    };
    serde_json::json!({
        "source": "raw",
        "requests": buckets.iter().map(|b| b.count).sum::<u64>(),
        "buckets": buckets.iter().map(|b| serde_json::json!({
            "prompt_tokens_lo": b.lo, "prompt_tokens_hi": b.hi, "prompt_tokens_mean": b.mean,
            "count": b.count, "ttft_p50_ms": b.p50, "ttft_p99_ms": b.p99,
        })).collect::<Vec<_>>(),
        "knee": k.map(|i| serde_json::json!({
            "prompt_tokens": buckets[i].mean, "ttft_p50_ms": buckets[i].p50,
        })),
        "ttft_ms_per_1k_prompt_tokens": per_k(below),
        "ttft_ms_per_1k_prompt_tokens_above_knee": per_k(above),
    })
}

/// Per app-reported model, the prompt-length curve of the raw points in the range (each
/// request's `prompt_tokens` paired with the `ttft_ms` of the same point).
fn prompt_curves(
    reader: &Reader,
    q: &InferenceQuery,
) -> Result<BTreeMap<String, serde_json::Value>, EngineError> {
    let tag = q.model.as_deref().map(|m| ("model", m));
    let prompts = raw_points(reader, "llm", "prompt_tokens", tag, q.from, q.to, 1.0)?;
    let ttfts = raw_points(reader, "llm", "ttft_ms", tag, q.from, q.to, 1.0)?;
    let mut ttft_by_set: BTreeMap<i64, BTreeMap<i64, f64>> = BTreeMap::new();
    for (id, _, pts) in ttfts {
        ttft_by_set.entry(id).or_default().extend(pts);
    }
    let mut pairs: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (id, tags, pts) in prompts {
        if tags.contains_key("scrape") {
            continue;
        }
        let Some(ttft) = ttft_by_set.get(&id) else {
            continue;
        };
        let model = tags.get("model").cloned().unwrap_or_default();
        let out = pairs.entry(model).or_default();
        out.extend(
            pts.iter()
                .filter_map(|(ts, p)| ttft.get(ts).map(|t| (*p, *t))),
        );
    }
    Ok(pairs
        .into_iter()
        .map(|(m, p)| (m, prompt_curve_json(&prompt_curve(&p))))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_buckets_are_quarter_octaves_with_exact_percentiles() {
        // 100 requests at 64 tokens (TTFT 10..109 ms), 2 at 1000 (too few), 3 at 2048.
        let mut pairs: Vec<(f64, f64)> = (0..100).map(|i| (64.0, 10.0 + i as f64)).collect();
        pairs.extend([(1000.0, 50.0), (1000.0, 60.0)]);
        pairs.extend([(2048.0, 300.0), (2048.0, 310.0), (2050.0, 320.0)]);
        pairs.push((0.0, 5.0)); // no prompt: not on the curve
        let c = prompt_curve(&pairs);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].count, c[0].p50, c[0].p99), (100, 59.0, 108.0));
        assert_eq!((c[1].lo, c[1].hi, c[1].count), (2048.0, 2050.0, 3));
        assert_eq!(c[1].p50, 310.0);
    }

    #[test]
    fn the_knee_is_where_ttft_grows_faster_with_the_prompt() {
        // 2 ms per 1k tokens up to 2048 tokens, 40 ms per 1k after.
        let mut pairs = Vec::new();
        for k in 0..24 {
            let p = 128.0 * 2f64.powf(k as f64 / 4.0);
            let t = if p <= 2048.0 {
                20.0 + 0.002 * p
            } else {
                20.0 + 0.002 * 2048.0 + 0.04 * (p - 2048.0)
            };
            for _ in 0..MIN_BUCKET {
                pairs.push((p, t));
            }
        }
        let c = prompt_curve(&pairs);
        assert_eq!(c.len(), 24);
        let j = prompt_curve_json(&c);
        let knee = j["knee"]["prompt_tokens"].as_f64().unwrap();
        assert!((knee - 2048.0).abs() < 1.0, "{j}");
        let below = j["ttft_ms_per_1k_prompt_tokens"].as_f64().unwrap();
        let above = j["ttft_ms_per_1k_prompt_tokens_above_knee"]
            .as_f64()
            .unwrap();
        assert!((below - 2.0).abs() < 1e-6, "{below}");
        assert!((above - 40.0).abs() < 1e-6, "{above}");
    }

    #[test]
    fn app_signals_count_errors_and_aggregate_tokens() {
        let mut f = vec![StepAcc::default(); APP_FIELDS.len()];
        for (i, (ttft, e2e, out, ok)) in [(100.0, 1100.0, 11.0, 1.0), (300.0, 2300.0, 21.0, 0.0)]
            .into_iter()
            .enumerate()
        {
            let t = i as i64;
            f[TTFT].acc.add(t, ttft);
            f[E2E].acc.add(t, e2e);
            f[OUT].acc.add(t, out);
            f[OK].acc.add(t, ok);
        }
        let s = app_signals(&f, 10.0);
        assert_eq!(s["requests"], 2);
        assert_eq!(s["errors"], 1);
        assert_eq!(s["output_tokens"], 32.0);
        assert_eq!(s["output_tokens_per_s"], 3.2);
        assert_eq!(s["ttft_ms"]["mean"], 200.0);
        assert!(s["queue_ms"]["p99"].is_null());
    }

    #[test]
    fn scraped_steps_take_the_worst_interval_and_sum_counts() {
        let mut f = vec![StepAcc::default(); SCRAPE_FIELDS.len()];
        let put = |f: &mut [StepAcc], name: &str, t: i64, v: f64| {
            let i = SCRAPE_FIELDS.iter().position(|n| *n == name).unwrap();
            f[i].acc.add(t, v);
        };
        put(&mut f, "ttft_p99_ms", 1, 80.0);
        put(&mut f, "ttft_p99_ms", 2, 120.0);
        put(&mut f, "ttft_p50_ms", 2, 40.0);
        put(&mut f, "requests", 1, 5.0);
        put(&mut f, "requests", 2, 7.0);
        put(&mut f, "output_tokens", 2, 600.0);
        put(&mut f, "kv_cache_usage", 1, 0.9);
        put(&mut f, "kv_cache_usage", 2, 0.4);
        let s = scrape_signals(&f, 60.0);
        assert_eq!(s["ttft_ms"]["p99"], 120.0);
        assert_eq!(s["ttft_p99_p50"], 3.0);
        assert_eq!(s["requests"], 12.0);
        assert_eq!(s["output_tokens_per_s"], 10.0);
        assert_eq!(
            (
                s["kv_cache_usage"].as_f64(),
                s["kv_cache_usage_max"].as_f64()
            ),
            (Some(0.4), Some(0.9))
        );
        assert!(s["itl_ms"]["p99"].is_null());
    }
}
