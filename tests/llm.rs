//! LLM serving signals through the real binary: `llm` points (requests and the gaps between
//! tokens) and a staged power series written as line protocol with known timestamps, and
//! `/api/v1/llm` checked against values computed here: exact TTFT/ITL percentiles across
//! requests, errors, tokens per second, tokens per joule by a trapezoid sum split by each
//! model's work, the prompt-length knee, and scraped (vLLM preset) intervals.

use serde_json::Value as J;

use crate::support::*;

const QUIET: &str = "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n[rollup]\nenabled = false\n[alerts]\nbuiltin = false\n";
const S: i64 = 1_000_000_000;
const MS: i64 = 1_000_000;

fn write(agent: &Agent, body: &str) {
    let (code, resp) = post(&agent.url("/write"), body.as_bytes(), &[]).unwrap();
    assert_eq!(code, 204, "{resp}");
}

fn close(v: &J, want: f64) {
    let got = v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"));
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
        "{got} vs {want}"
    );
}

fn llm(agent: &Agent, query: &str) -> J {
    let (code, text) = get(&agent.url(&format!("/api/v1/llm?{query}"))).unwrap();
    assert_eq!(code, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn model<'a>(v: &'a J, name: &str, source: &str) -> &'a J {
    v["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"] == name && m["source"] == source)
        .unwrap_or_else(|| panic!("no {source} model {name}: {v}"))
}

/// One request of `model`: its point (at `end`) and one `itl_ms` point per gap, as the
/// Python client writes them.
fn request(model: &str, end: i64, ttft: f64, gaps: &[f64], prompt: u64, ok: bool) -> String {
    let decode: f64 = gaps.iter().sum();
    let e2e = ttft + decode;
    let out = gaps.len() as u64 + 1;
    let mut s = format!(
        "llm,model={model},app=chat ttft_ms={ttft},e2e_ms={e2e},prompt_tokens={prompt}i,output_tokens={out}i,ok={ok}{} {end}\n",
        if gaps.is_empty() {
            String::new()
        } else {
            format!(",tokens_per_s={}", gaps.len() as f64 / (decode / 1000.0))
        }
    );
    // The gaps end at `end`, the last token's arrival.
    let mut t = end;
    for g in gaps.iter().rev() {
        s.push_str(&format!("llm,model={model},app=chat itl_ms={g} {t}\n"));
        t -= (*g * MS as f64) as i64;
    }
    s
}

/// The trapezoid sum of `(t, mW)` samples over `[a, b]`, in mJ (the samples are inside).
fn trapezoids(samples: &[(i64, f64)]) -> f64 {
    samples
        .windows(2)
        .map(|w| (w[0].1 + w[1].1) / 2.0 * (w[1].0 - w[0].0) as f64 / S as f64)
        .sum()
}

#[test]
fn ttft_and_itl_are_true_percentiles_and_tokens_per_joule_follows_the_power() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let t0 = (edgewatch::now_ns() - 600 * S) / (20 * S) * (20 * S);
    let mut body = String::new();
    // A staged board power: 5 W for 10 s, then 9 W, one sample a second over 0..=20 s (and
    // on to 30 s, past the step, so the step's end has its neighbour).
    let power: Vec<(i64, f64)> = (0..=30)
        .map(|i| (t0 + i * S, if i < 10 { 5000.0 } else { 9000.0 }))
        .collect();
    for (t, mw) in &power {
        body.push_str(&format!(
            "jetson_power,rail=VDD_IN current_mw={mw},average_mw=1 {t}\n"
        ));
    }
    // `big`: one request with 100 gaps of 10 ms, one with 10 gaps of 50 ms. True p50 of
    // the 110 gaps is 10 ms; the mean of the two requests' own p50s would be 30.
    body.push_str(&request("big", t0 + 5 * S, 100.0, &[10.0; 100], 500, true));
    body.push_str(&request("big", t0 + 15 * S, 300.0, &[50.0; 10], 2000, true));
    // `small`: ten requests, TTFT 10, 20, ..., 100 ms, 4 gaps of 5 ms; the last one failed.
    for k in 0..10i64 {
        body.push_str(&request(
            "small",
            t0 + S + k * S,
            10.0 * (k + 1) as f64,
            &[5.0; 4],
            50,
            k != 9,
        ));
    }
    write(&agent, &body);

    let to = t0 + 20 * S - 1;
    let v = llm(&agent, &format!("from={t0}&to={to}&step=20s"));
    assert_eq!(v["energy"]["source"], "tegrastats:VDD_IN", "{v}");
    let big = &model(&v, "big", "app")["summary"];
    assert_eq!(big["requests"], 2);
    assert_eq!(big["itl_ms"]["count"], 110);
    close(&big["itl_ms"]["p50"], 10.0);
    // Rank floor(0.99 * 109) = 107 of 100 x 10 ms and 10 x 50 ms.
    close(&big["itl_ms"]["p99"], 50.0);
    close(&big["itl_ms"]["mean"], 1500.0 / 110.0);
    close(&big["output_tokens"], 112.0);
    close(&big["output_tokens_per_s"], 112.0 / 20.0);
    close(&big["prompt_tokens"], 2500.0);
    close(&big["e2e_ms"]["mean"], (1100.0 + 800.0) / 2.0);
    let small = &model(&v, "small", "app")["summary"];
    assert_eq!(
        (small["requests"].as_u64(), small["errors"].as_u64()),
        (Some(10), Some(1))
    );
    // Exact ranks of 10..100: p50 floor(4.5) -> 50, p99 floor(8.91) -> 90.
    close(&small["ttft_ms"]["p50"], 50.0);
    close(&small["ttft_ms"]["p99"], 90.0);
    close(&small["ttft_p99_p50"], 90.0 / 50.0);
    close(&small["tokens_per_s"]["p50"], 200.0);

    // Energy: the board's trapezoids over the step, split by each model's e2e time.
    let e = trapezoids(&power[..=20]);
    close(&v["energy"]["board_mj"], e);
    let big_e2e = (100.0 + 1000.0) + (300.0 + 500.0);
    let small_e2e: f64 = (1..=10).map(|k| 10.0 * k as f64 + 20.0).sum();
    let big_mj = e * big_e2e / (big_e2e + small_e2e);
    close(&big["energy_mj"], big_mj);
    close(&big["tokens_per_joule"], 112.0 / (big_mj / 1000.0));
    close(&big["joules_per_1k_tokens"], big_mj / 112.0);
    close(&big["energy_token_coverage"], 1.0);
    let small_mj = e - big_mj;
    close(&small["tokens_per_joule"], 50.0 / (small_mj / 1000.0));
    close(&v["energy"]["idle_mj"], 0.0);

    // A model filter reads that model only; the energy split still sees every workload.
    let only = llm(&agent, &format!("from={t0}&to={to}&step=20s&model=big"));
    assert_eq!(only["models"].as_array().unwrap().len(), 1, "{only}");
    close(&only["models"][0]["summary"]["energy_mj"], big_mj);
    // Nothing there: an empty answer, not an error.
    let none = llm(&agent, &format!("from={t0}&to={to}&step=20s&model=nope"));
    assert_eq!(none["models"], serde_json::json!([]));
    // A bad step is a 400 naming the parameter.
    let (code, text) = get(&agent.url("/api/v1/llm?step=banana")).unwrap();
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("step"), "{text}");
}

#[test]
fn the_prompt_length_knee_and_scraped_intervals() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let t0 = (edgewatch::now_ns() - 600 * S) / (60 * S) * (60 * S);
    let mut body = String::new();
    // TTFT grows 2 ms per 1k prompt tokens up to 2048 tokens, 40 ms per 1k above: three
    // requests per quarter octave from 128 to ~6800 tokens.
    let mut t = t0 + S;
    for k in 0..24 {
        let p = (128.0 * 2f64.powf(k as f64 / 4.0)).ceil();
        let ttft = if p <= 2048.0 {
            20.0 + 0.002 * p
        } else {
            20.0 + 0.002 * 2048.0 + 0.04 * (p - 2048.0)
        };
        for _ in 0..3 {
            body.push_str(&request("rag", t, ttft, &[20.0], p as u64, true));
            t += 50 * MS;
        }
    }
    // Two scrape intervals of a vLLM server in the same minute.
    body.push_str(&format!(
        "llm,model=qwen,server=vllm,scrape=v ttft_p50_ms=40,ttft_p99_ms=90,requests=5,output_tokens=600,kv_cache_usage=0.9 {}\n",
        t0 + 15 * S
    ));
    body.push_str(&format!(
        "llm,model=qwen,server=vllm,scrape=v ttft_p50_ms=30,ttft_p99_ms=120,requests=7,output_tokens=300,kv_cache_usage=0.4,requests_waiting=2 {}\n",
        t0 + 30 * S
    ));
    write(&agent, &body);

    let to = t0 + 60 * S - 1;
    let v = llm(&agent, &format!("from={t0}&to={to}&step=60s"));
    let curve = &model(&v, "rag", "app")["prompt_curve"];
    assert_eq!(curve["requests"], 72, "{curve}");
    assert_eq!(curve["buckets"].as_array().unwrap().len(), 24, "{curve}");
    let knee = curve["knee"]["prompt_tokens"].as_f64().unwrap();
    assert!((knee - 2048.0).abs() < 1.0, "{curve}");
    let below = curve["ttft_ms_per_1k_prompt_tokens"].as_f64().unwrap();
    let above = curve["ttft_ms_per_1k_prompt_tokens_above_knee"]
        .as_f64()
        .unwrap();
    assert!((below - 2.0).abs() < 0.05, "{curve}");
    assert!((above - 40.0).abs() < 0.05, "{curve}");

    let q = model(&v, "qwen", "scrape");
    assert_eq!(
        (q["server"].as_str(), q["scrape"].as_str()),
        (Some("vllm"), Some("v"))
    );
    let s = &q["summary"];
    // The worst interval's percentile; counts summed; gauges the newest.
    close(&s["ttft_ms"]["p99"], 120.0);
    close(&s["requests"], 12.0);
    close(&s["output_tokens_per_s"], 900.0 / 60.0);
    close(&s["kv_cache_usage"], 0.4);
    close(&s["kv_cache_usage_max"], 0.9);
    close(&s["requests_waiting"], 2.0);
    assert!(q.get("prompt_curve").is_none());
}

/// The overview's LLM section in a real headless Chromium (tests/web/llm.mjs): a card per
/// model with the API's TTFT p99 and tokens per joule, the TTFT, ITL and tokens charts, and
/// the prompt-length chart with its knee; an LLM-only device shows no empty inference box.
#[test]
fn the_llm_section_in_chromium() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        root.join("tests/web/node_modules/playwright-core").exists(),
        "run: npm install --no-save --prefix tests/web playwright-core@1"
    );
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists()
            || std::env::var_os("CHROMIUM").is_some(),
        "the UI test needs Debian's chromium (apt-get install chromium)"
    );
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    // The last 10 minutes: a request every 2 s from `chat` with prompts that cross a knee,
    // a vLLM server's scrape intervals, and 6 W of board power sampled every second.
    let now = edgewatch::now_ns();
    let t0 = now - 600 * S;
    let mut body = String::new();
    for i in 0..=600 {
        body.push_str(&format!(
            "jetson_power,rail=VDD_IN current_mw=6000,average_mw=6000 {}\n",
            t0 + i * S
        ));
    }
    for k in 0..300i64 {
        let p = (128.0 * 2f64.powf((k % 24) as f64 / 4.0)).ceil();
        let ttft = if p <= 2048.0 {
            20.0 + 0.002 * p
        } else {
            24.096 + 0.04 * (p - 2048.0)
        };
        body.push_str(&request(
            "chat",
            t0 + k * 2 * S + S,
            ttft,
            &[25.0; 8],
            p as u64,
            true,
        ));
    }
    for k in 0..40i64 {
        body.push_str(&format!(
            "llm,model=qwen,server=vllm,scrape=v ttft_p50_ms=40,ttft_p90_ms=70,ttft_p99_ms=90,itl_p50_ms=12,itl_p99_ms=30,requests=5,output_tokens=600 {}\n",
            t0 + k * 15 * S
        ));
    }
    write(&agent, &body);

    // Kept beside the other UI screenshot (target/), for a person to look at.
    let shot = std::env::current_exe()
        .ok()
        .and_then(|e| e.ancestors().nth(3).map(|p| p.join("llm-screenshot.png")))
        .unwrap_or_else(|| std::env::temp_dir().join("llm-screenshot.png"));
    let out = std::process::Command::new("node")
        .arg(root.join("tests/web/llm.mjs"))
        .arg(agent.url(""))
        .arg(&shot)
        .output()
        .expect("node (apt-get install nodejs)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "llm.mjs failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: J = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    assert!(
        r["failure"].is_null(),
        "browser step failed: {}",
        r["failure"]
    );
    assert_eq!(r["errors"], serde_json::json!([]), "console errors");
    assert_eq!(r["headings"][0], "LLM", "{r}");
    assert_eq!(r["emptyInference"], 0, "{r}");
    // The cards show what the API answered.
    let chat = &model(&r["api"], "chat", "app")["summary"];
    let card = r["cards"]["chat/app"].as_str().unwrap();
    let p99 = chat["ttft_ms"]["p99"].as_f64().unwrap();
    assert!(
        card.contains(&format!("{p99:.0} ms")) || card.contains(&format!("{p99:.1} ms")),
        "{card} vs {p99}"
    );
    assert!(card.contains("tokens/J"), "{card}");
    assert!(chat["tokens_per_joule"].as_f64().unwrap() > 0.0, "{chat}");
    let qwen = r["cards"]["qwen/scrape"].as_str().unwrap();
    assert!(qwen.contains("vllm") && qwen.contains("90.0 ms"), "{qwen}");
    // Every chart has its series; the ITL chart the per-step points.
    let charts = &r["charts"];
    for id in [
        "ttft-chat",
        "itl-chat",
        "llm-tokens",
        "llm-tokens-per-joule",
        "ttft-vllm-v-qwen",
    ] {
        assert!(
            charts[id]["p99"].as_i64().unwrap_or(0) > 0
                || charts[id].as_object().is_some_and(|o| !o.is_empty()),
            "{id}: {charts}"
        );
    }
    assert_eq!(charts["prompt-chat"]["p50"], 24, "{charts}");
    // The knee the page marks is the API's, at the 2048-token bucket.
    let knee = r["knee"][0].as_f64().unwrap();
    let api_knee = model(&r["api"], "chat", "app")["prompt_curve"]["knee"]["prompt_tokens"]
        .as_f64()
        .unwrap();
    assert_eq!(knee, api_knee);
    assert!((knee - 2048.0).abs() < 1.0, "{knee}");
}
