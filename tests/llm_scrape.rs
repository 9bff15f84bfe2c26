//! `[[scrape]] preset = "vllm"` / `"llamacpp"` end to end: a local HTTP server serves
//! vLLM- and llama.cpp-format pages that change between scrapes (known observations added to
//! chosen buckets, counters advanced, a restart), the real agent scrapes them, and the stored
//! `llm` fields (read back through `/api/v1/query`) must equal the bucket math done here from
//! the observations themselves. Then a page with a malformed family, and `check-config`.
//!
//! Metric names and types are the documented ones: vLLM's "Production Metrics" page
//! (docs.vllm.ai; `vllm:*` with the label `model_name`, histograms in seconds, as its
//! `prometheus_client` exposition prints them) and llama.cpp's server README (`GET /metrics`
//! with `--metrics`; `llamacpp:*`, no labels).

use std::time::Duration;

use crate::scrape::{query, scrape_status, target, Reply, Server};
use crate::support::*;

/// The bucket bounds of the served histograms, seconds (a subset of vLLM's own).
const BOUNDS: [f64; 8] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
const MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

/// What a vLLM server has observed since it started.
#[derive(Clone, Default)]
struct Vllm {
    ttft: Vec<f64>,
    itl: Vec<f64>,
    e2e: Vec<f64>,
    queue: Vec<f64>,
    generation_tokens: u64,
    prompt_tokens: u64,
    running: u64,
    waiting: u64,
    kv: f64,
}

/// One interval's traffic.
#[derive(Clone, Default)]
struct Batch {
    ttft: Vec<f64>,
    itl: Vec<f64>,
    e2e: Vec<f64>,
    queue: Vec<f64>,
    generation_tokens: u64,
    prompt_tokens: u64,
}

impl Vllm {
    fn add(&self, b: &Batch, running: u64, waiting: u64, kv: f64) -> Vllm {
        let cat = |a: &[f64], b: &[f64]| [a, b].concat();
        Vllm {
            ttft: cat(&self.ttft, &b.ttft),
            itl: cat(&self.itl, &b.itl),
            e2e: cat(&self.e2e, &b.e2e),
            queue: cat(&self.queue, &b.queue),
            generation_tokens: self.generation_tokens + b.generation_tokens,
            prompt_tokens: self.prompt_tokens + b.prompt_tokens,
            running,
            waiting,
            kv,
        }
    }

    /// The page, as vLLM's `prometheus_client` exposition prints it.
    fn page(&self) -> String {
        let m = format!("engine=\"0\",model_name=\"{MODEL}\"");
        let mut s = String::new();
        for (name, help, obs) in [
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &self.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                &self.itl,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                &self.e2e,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                &self.queue,
            ),
        ] {
            s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
            for b in BOUNDS {
                let n = obs.iter().filter(|&&o| o <= b).count();
                s.push_str(&format!("{name}_bucket{{{m},le=\"{b}\"}} {n}.0\n"));
            }
            s.push_str(&format!(
                "{name}_bucket{{{m},le=\"+Inf\"}} {}.0\n{name}_count{{{m}}} {}.0\n\
                 {name}_sum{{{m}}} {}\n",
                obs.len(),
                obs.len(),
                obs.iter().sum::<f64>()
            ));
        }
        let requests = self.e2e.len();
        s.push_str(&format!(
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n\
             # TYPE vllm:generation_tokens_total counter\n\
             vllm:generation_tokens_total{{{m}}} {}.0\n\
             # HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n\
             # TYPE vllm:prompt_tokens_total counter\n\
             vllm:prompt_tokens_total{{{m}}} {}.0\n\
             # HELP vllm:request_success_total Count of successfully processed requests.\n\
             # TYPE vllm:request_success_total counter\n\
             vllm:request_success_total{{engine=\"0\",finished_reason=\"stop\",model_name=\"{MODEL}\"}} {requests}.0\n\
             # HELP vllm:num_requests_running Number of requests in model execution batches.\n\
             # TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{{m}}} {}.0\n\
             # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{{m}}} {}.0\n\
             # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
             # TYPE vllm:kv_cache_usage_perc gauge\n\
             vllm:kv_cache_usage_perc{{{m}}} {}\n",
            self.generation_tokens, self.prompt_tokens, self.running, self.waiting, self.kv
        ));
        s
    }
}

/// Prometheus' `histogram_quantile` rule, written out from one interval's observations
/// (not the agent's code): count the observations at or below each bound, find the first
/// bucket whose count reaches the rank `q * n`, interpolate linearly inside it (the first
/// bucket starts at 0); a rank above every finite bound gives the highest finite bound.
/// In ms; `None` without observations.
fn quantile_ms(q: f64, obs: &[f64]) -> Option<f64> {
    if obs.is_empty() {
        return None;
    }
    let rank = q * obs.len() as f64;
    let (mut lower, mut below) = (0.0, 0.0);
    for b in BOUNDS {
        let count = obs.iter().filter(|&&o| o <= b).count() as f64;
        if count >= rank {
            return Some((lower + (b - lower) * (rank - below) / (count - below)) * 1000.0);
        }
        (lower, below) = (b, count);
    }
    Some(BOUNDS[BOUNDS.len() - 1] * 1000.0)
}

/// A field's points of one target up to `until` (ns, inclusive; the agent goes on
/// scraping while the test reads): (ns, value), oldest first.
fn series(agent: &Agent, scrape: &str, field: &str, until: i64) -> Vec<(i64, f64)> {
    let v = query(
        agent,
        &format!("measurement=llm&field={field}&tag.scrape={scrape}"),
    );
    let series = v["series"].as_array().cloned().unwrap_or_default();
    assert!(series.len() <= 1, "one model per target: {v}");
    series
        .first()
        .and_then(|s| s["points"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|p| (p[0].as_i64().unwrap(), p[1].as_f64().unwrap()))
        .filter(|p| p.0 <= until)
        .collect()
}

fn values(agent: &Agent, scrape: &str, field: &str, until: i64) -> Vec<f64> {
    series(agent, scrape, field, until)
        .into_iter()
        .map(|p| p.1)
        .collect()
}

fn close_all(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-9 * w.abs().max(1.0),
            "{what}: {got:?} vs {want:?}"
        );
    }
}

fn llamacpp_page(
    [prompt, predicted]: [u64; 2],
    predicted_s: f64,
    kv: f64,
    [kv_tokens, processing, deferred]: [u64; 3],
) -> String {
    format!(
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n\
         # TYPE llamacpp:prompt_tokens_total counter\n\
         llamacpp:prompt_tokens_total {prompt}\n\
         # HELP llamacpp:prompt_seconds_total Prompt process time\n\
         # TYPE llamacpp:prompt_seconds_total counter\n\
         llamacpp:prompt_seconds_total 1.5\n\
         # HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n\
         # TYPE llamacpp:tokens_predicted_total counter\n\
         llamacpp:tokens_predicted_total {predicted}\n\
         # HELP llamacpp:tokens_predicted_seconds_total Predict process time\n\
         # TYPE llamacpp:tokens_predicted_seconds_total counter\n\
         llamacpp:tokens_predicted_seconds_total {predicted_s}\n\
         # HELP llamacpp:n_decode_total Total number of llama_decode() calls\n\
         # TYPE llamacpp:n_decode_total counter\n\
         llamacpp:n_decode_total {predicted}\n\
         # HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call\n\
         # TYPE llamacpp:n_busy_slots_per_decode counter\n\
         llamacpp:n_busy_slots_per_decode 1\n\
         # HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.\n\
         # TYPE llamacpp:prompt_tokens_seconds gauge\n\
         llamacpp:prompt_tokens_seconds 812.5\n\
         # HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.\n\
         # TYPE llamacpp:predicted_tokens_seconds gauge\n\
         llamacpp:predicted_tokens_seconds 41.2\n\
         # HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE llamacpp:kv_cache_usage_ratio gauge\n\
         llamacpp:kv_cache_usage_ratio {kv}\n\
         # HELP llamacpp:kv_cache_tokens KV-cache tokens.\n\
         # TYPE llamacpp:kv_cache_tokens gauge\n\
         llamacpp:kv_cache_tokens {kv_tokens}\n\
         # HELP llamacpp:requests_processing Number of requests processing.\n\
         # TYPE llamacpp:requests_processing gauge\n\
         llamacpp:requests_processing {processing}\n\
         # HELP llamacpp:requests_deferred Number of requests deferred.\n\
         # TYPE llamacpp:requests_deferred gauge\n\
         llamacpp:requests_deferred {deferred}\n"
    )
}

#[test]
fn vllm_and_llamacpp_pages_become_llm_points_equal_to_the_bucket_math() {
    // vLLM: a base, two intervals of traffic, a restart, one more interval.
    let a = Batch {
        ttft: vec![0.004, 0.018, 0.02, 0.03, 0.04, 0.045, 0.07, 0.09, 0.12, 0.3],
        itl: vec![0.011, 0.012, 0.013, 0.02, 0.021, 0.03, 0.06],
        e2e: vec![0.8, 0.9, 1.2, 1.4, 2.0],
        queue: vec![0.001, 0.002, 0.03],
        generation_tokens: 640,
        prompt_tokens: 2100,
    };
    // Two first tokens above the last finite bound: p99 (and p90) lie in +Inf.
    let b = Batch {
        ttft: vec![0.06, 0.2, 0.22, 0.4, 0.45, 0.8, 2.2, 2.4, 3.1, 4.0],
        itl: vec![0.015, 0.04],
        e2e: vec![1.1, 3.0, 5.5],
        queue: Vec::new(),
        generation_tokens: 300,
        prompt_tokens: 900,
    };
    let c = Batch {
        ttft: vec![0.03, 0.035],
        itl: vec![0.02],
        e2e: vec![0.6, 0.7],
        queue: vec![0.2],
        generation_tokens: 80,
        prompt_tokens: 150,
    };
    let d = Batch {
        ttft: vec![0.011, 0.012, 0.013, 0.6],
        itl: vec![0.03, 0.031, 0.032],
        e2e: vec![0.4, 0.45, 0.9, 1.6],
        queue: vec![0.004, 0.006],
        generation_tokens: 210,
        prompt_tokens: 410,
    };
    let s0 = Vllm::default().add(
        &Batch {
            ttft: vec![0.05, 0.5],
            itl: vec![0.02],
            e2e: vec![1.0, 2.0],
            queue: vec![0.01],
            generation_tokens: 5000,
            prompt_tokens: 9000,
        },
        1,
        0,
        0.05,
    );
    let s1 = s0.add(&a, 4, 1, 0.31);
    let s2 = s1.add(&b, 6, 3, 0.62);
    let s3 = Vllm::default().add(&c, 2, 0, 0.08); // restarted
    let s4 = s3.add(&d, 3, 0, 0.12);
    let pages: Vec<String> = [&s0, &s1, &s2, &s3, &s4].iter().map(|s| s.page()).collect();
    let intervals = [&a, &b, &c, &d];
    let gauges = [&s0, &s1, &s2, &s3, &s4];

    let llama = vec![
        llamacpp_page([1000, 400], 10.0, 0.1, [410, 1, 0]),
        // +600 prompt, +500 predicted in 10 s of decoding.
        llamacpp_page([1600, 900], 20.0, 0.2, [2500, 2, 1]),
        // Restarted: the new values are the interval.
        llamacpp_page([120, 64], 0.8, 0.05, [184, 1, 0]),
        // +180 prompt, +150 predicted in 2.5 s.
        llamacpp_page([300, 214], 3.3, 0.15, [514, 2, 2]),
    ];
    let server = Server::start(vec![
        ("/vllm", Reply::Pages(pages, "text/plain; version=0.0.4")),
        ("/llama", Reply::Pages(llama, "text/plain; version=0.0.4")),
    ]);
    let fast = "interval = \"400ms\"\ntimeout = \"400ms\"\ntags = { role = \"llm\" }";
    let mut cfg = target(
        "vllm",
        &server.url("/vllm"),
        &format!("{fast}\npreset = \"vllm\""),
    );
    cfg.push_str(&target(
        "llama",
        &server.url("/llama"),
        &format!("{fast}\npreset = \"llamacpp\"\nmodel = \"qwen2.5-1.5b-instruct-q4_k_m\""),
    ));
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), &cfg);
    assert!(
        wait_for(Duration::from_secs(20), || (server.hits("/vllm") >= 7
            && server.hits("/llama") >= 6)
            .then_some(()))
        .is_some(),
        "the targets were not scraped"
    );
    // Every scrape wrote a point: at least the pages plus one repeat of the last.
    let ts = wait_for(Duration::from_secs(5), || {
        let t = series(&agent, "vllm", "requests_running", i64::MAX);
        (t.len() >= 6).then_some(t)
    })
    .unwrap_or_else(|| panic!("llm points missing:\n{}", agent.log_text()));
    let v = query(
        &agent,
        "measurement=llm&field=requests_running&tag.scrape=vllm",
    );
    let tags = &v["series"][0]["tags"];
    assert_eq!(tags["model"], MODEL, "{v}");
    assert_eq!(tags["server"], "vllm");
    assert_eq!(tags["role"], "llm");
    for name in ["vllm", "llama"] {
        let s = scrape_status(&agent, name);
        assert_eq!(
            s["failures"], 0,
            "a failed scrape merges two pages into one interval: {s}"
        );
    }
    let n = ts.len();
    let repeats = n - 5;
    let until = ts[n - 1].0;

    // Gauges: every point, the first scrape's too.
    let mut want: Vec<f64> = gauges.iter().map(|g| g.running as f64).collect();
    want.extend(std::iter::repeat(s4.running as f64).take(repeats));
    close_all(
        "requests_running",
        &ts.iter().map(|p| p.1).collect::<Vec<_>>(),
        &want,
    );
    let mut want: Vec<f64> = gauges.iter().map(|g| g.kv).collect();
    want.extend(std::iter::repeat(s4.kv).take(repeats));
    close_all(
        "kv_cache_usage",
        &values(&agent, "vllm", "kv_cache_usage", until),
        &want,
    );
    let mut want: Vec<f64> = gauges.iter().map(|g| g.waiting as f64).collect();
    want.extend(std::iter::repeat(s4.waiting as f64).take(repeats));
    close_all(
        "requests_waiting",
        &values(&agent, "vllm", "requests_waiting", until),
        &want,
    );

    // Counts: one per interval (the first scrape has none), then idle repeats at 0.
    let idle = |mut v: Vec<f64>| {
        v.extend(std::iter::repeat(0.0).take(repeats));
        v
    };
    let want = idle(intervals.iter().map(|b| b.e2e.len() as f64).collect());
    close_all(
        "requests",
        &values(&agent, "vllm", "requests", until),
        &want,
    );
    let want = idle(
        intervals
            .iter()
            .map(|b| b.generation_tokens as f64)
            .collect(),
    );
    close_all(
        "output_tokens",
        &values(&agent, "vllm", "output_tokens", until),
        &want,
    );
    let want = idle(intervals.iter().map(|b| b.prompt_tokens as f64).collect());
    close_all(
        "prompt_tokens",
        &values(&agent, "vllm", "prompt_tokens", until),
        &want,
    );
    // Rates: the delta over the time between this point and the previous one.
    let secs: Vec<f64> = ts
        .windows(2)
        .map(|w| (w[1].0 - w[0].0) as f64 / 1e9)
        .collect();
    let rate =
        |tokens: Vec<f64>| -> Vec<f64> { tokens.iter().zip(&secs).map(|(t, s)| t / s).collect() };
    let want = rate(idle(
        intervals
            .iter()
            .map(|b| b.generation_tokens as f64)
            .collect(),
    ));
    close_all(
        "output_tokens_per_s",
        &values(&agent, "vllm", "output_tokens_per_s", until),
        &want,
    );
    let want = rate(idle(
        intervals.iter().map(|b| b.prompt_tokens as f64).collect(),
    ));
    close_all(
        "prompt_tokens_per_s",
        &values(&agent, "vllm", "prompt_tokens_per_s", until),
        &want,
    );

    // Percentiles: only for intervals with observations (idle repeats have none).
    for (stage, obs) in [
        ("ttft", intervals.map(|b| b.ttft.clone())),
        ("itl", intervals.map(|b| b.itl.clone())),
        ("e2e", intervals.map(|b| b.e2e.clone())),
        ("queue", intervals.map(|b| b.queue.clone())),
    ] {
        for (q, p) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99")] {
            let want: Vec<f64> = obs.iter().filter_map(|o| quantile_ms(q, o)).collect();
            let field = format!("{stage}_{p}_ms");
            close_all(&field, &values(&agent, "vllm", &field, until), &want);
        }
        if stage == "ttft" || stage == "e2e" {
            let want: Vec<f64> = obs
                .iter()
                .filter(|o| !o.is_empty())
                .map(|o| o.iter().sum::<f64>() / o.len() as f64 * 1000.0)
                .collect();
            let field = format!("{stage}_mean_ms");
            close_all(&field, &values(&agent, "vllm", &field, until), &want);
        }
    }
    // The rule's cases, spelled out for interval b: ranks 9 and 9.9 of 10 lie above 2.5 s.
    assert_eq!(values(&agent, "vllm", "ttft_p99_ms", until)[1], 2500.0);
    // The queue histogram had no observation in interval b: no field for it.
    assert_eq!(values(&agent, "vllm", "queue_p50_ms", until).len(), 3);

    // llama.cpp: no model label, the configured one.
    let v = query(
        &agent,
        "measurement=llm&field=kv_cache_tokens&tag.scrape=llama",
    );
    assert_eq!(
        v["series"][0]["tags"]["model"], "qwen2.5-1.5b-instruct-q4_k_m",
        "{v}"
    );
    assert_eq!(v["series"][0]["tags"]["server"], "llamacpp");
    let lts = series(&agent, "llama", "kv_cache_tokens", i64::MAX);
    assert!(lts.len() >= 5, "{lts:?}");
    let until_l = lts[lts.len() - 1].0;
    let repeats = lts.len() - 4;
    let idle = |mut v: Vec<f64>| {
        v.extend(std::iter::repeat(0.0).take(repeats));
        v
    };
    let mut want = vec![410.0, 2500.0, 184.0, 514.0];
    want.extend(std::iter::repeat(514.0).take(repeats));
    close_all(
        "kv_cache_tokens",
        &lts.iter().map(|p| p.1).collect::<Vec<_>>(),
        &want,
    );
    let mut want = vec![0.1, 0.2, 0.05, 0.15];
    want.extend(std::iter::repeat(0.15).take(repeats));
    close_all(
        "kv_cache_usage",
        &values(&agent, "llama", "kv_cache_usage", until_l),
        &want,
    );
    let mut want = vec![1.0, 2.0, 1.0, 2.0];
    want.extend(std::iter::repeat(2.0).take(repeats));
    close_all(
        "requests_processing",
        &values(&agent, "llama", "requests_processing", until_l),
        &want,
    );
    let mut want = vec![0.0, 1.0, 0.0, 2.0];
    want.extend(std::iter::repeat(2.0).take(repeats));
    close_all(
        "requests_deferred",
        &values(&agent, "llama", "requests_deferred", until_l),
        &want,
    );
    let prompt = idle(vec![600.0, 120.0, 180.0]);
    close_all(
        "prompt_tokens",
        &values(&agent, "llama", "prompt_tokens", until_l),
        &prompt,
    );
    let predicted = idle(vec![500.0, 64.0, 150.0]);
    close_all(
        "output_tokens",
        &values(&agent, "llama", "output_tokens", until_l),
        &predicted,
    );
    let secs: Vec<f64> = lts
        .windows(2)
        .map(|w| (w[1].0 - w[0].0) as f64 / 1e9)
        .collect();
    let per_s = |v: &[f64]| -> Vec<f64> { v.iter().zip(&secs).map(|(t, s)| t / s).collect() };
    close_all(
        "output_tokens_per_s",
        &values(&agent, "llama", "output_tokens_per_s", until_l),
        &per_s(&predicted),
    );
    close_all(
        "prompt_tokens_per_s",
        &values(&agent, "llama", "prompt_tokens_per_s", until_l),
        &per_s(&prompt),
    );
    // The server's own decode speed, only where it decoded: 500 / 10, 64 / 0.8, 150 / 2.5.
    close_all(
        "decode_tokens_per_s",
        &values(&agent, "llama", "decode_tokens_per_s", until_l),
        &[50.0, 80.0, 60.0],
    );

    // The samples are stored as without a preset, and the status counts the points.
    let raw = query(
        &agent,
        "measurement=prometheus&field=llamacpp:tokens_predicted_total&tag.scrape=llama",
    );
    assert!(
        !raw["series"][0]["points"].as_array().unwrap().is_empty(),
        "{raw}"
    );
    let s = scrape_status(&agent, "vllm");
    assert_eq!(s["up"], true, "{s}");
    assert!(s["llm_points"].as_u64().unwrap() >= n as u64, "{s}");
    assert_eq!(s["preset_errors"], 0, "{s}");
}

#[test]
fn a_malformed_family_is_reported_and_nothing_else_is_lost() {
    let good = Batch {
        ttft: vec![0.02, 0.03, 0.2],
        itl: vec![0.01],
        e2e: vec![0.5, 0.7],
        queue: vec![0.001],
        generation_tokens: 100,
        prompt_tokens: 100,
    };
    let s0 = Vllm::default().add(&good, 1, 0, 0.1);
    let s1 = s0.add(&good, 2, 0, 0.2);
    let s2 = s1.add(&good, 7, 0, 0.3);
    // The third page lost the TTFT histogram's +Inf bucket and its count: missing buckets.
    let inf = format!(
        "vllm:time_to_first_token_seconds_bucket{{engine=\"0\",model_name=\"{MODEL}\",le=\"+Inf\"}} 9.0\n"
    );
    let count = format!(
        "vllm:time_to_first_token_seconds_count{{engine=\"0\",model_name=\"{MODEL}\"}} 9.0\n"
    );
    let bad = s2.page().replace(&inf, "").replace(&count, "");
    assert_ne!(bad, s2.page(), "the test removes the bucket");
    let server = Server::start(vec![(
        "/vllm",
        Reply::Pages(vec![s0.page(), s1.page(), bad], "text/plain"),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &target(
            "broken",
            &server.url("/vllm"),
            "interval = \"300ms\"\ntimeout = \"300ms\"\npreset = \"vllm\"",
        ),
    );
    assert!(
        wait_for(Duration::from_secs(15), || (server.hits("/vllm") >= 5)
            .then_some(()))
        .is_some(),
        "not scraped"
    );
    let s = wait_for(Duration::from_secs(5), || {
        let s = scrape_status(&agent, "broken");
        s["last_preset_error"].is_string().then_some(s)
    })
    .unwrap_or_else(|| panic!("no preset error: {}", scrape_status(&agent, "broken")));
    assert_eq!(s["up"], true, "the page itself was fine: {s}");
    let e = s["last_preset_error"].as_str().unwrap();
    assert!(
        e.starts_with(&format!(
            "vllm:time_to_first_token_seconds (model \"{MODEL}\"): no +Inf bucket"
        )),
        "{e}"
    );
    assert!(s["preset_errors"].as_u64().unwrap() >= 2, "{s}");
    // The interval before the bad page keeps its TTFT percentiles; the bad pages give none.
    close_all(
        "ttft_p50_ms",
        &values(&agent, "broken", "ttft_p50_ms", i64::MAX),
        &[quantile_ms(0.5, &good.ttft).unwrap()],
    );
    // Everything else of the bad page's interval is written: e2e, counters, gauges.
    let e2e = values(&agent, "broken", "e2e_p50_ms", i64::MAX);
    assert_eq!(e2e.len(), 2, "{e2e:?}");
    close_all(
        "e2e_p50_ms",
        &e2e,
        &[quantile_ms(0.5, &good.e2e).unwrap(); 2],
    );
    let running = values(&agent, "broken", "requests_running", i64::MAX);
    assert_eq!(&running[..3], [1.0, 2.0, 7.0]);
    assert_eq!(
        &values(&agent, "broken", "output_tokens", i64::MAX)[..2],
        [100.0, 100.0]
    );
    // And the bad page's samples are stored like any page's.
    let raw = query(
        &agent,
        "measurement=prometheus&field=vllm:num_requests_running&tag.scrape=broken",
    );
    let raw: Vec<f64> = raw["series"][0]["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_f64().unwrap())
        .collect();
    assert!(raw.contains(&7.0), "{raw:?}");
}

#[test]
fn check_config_names_the_allowed_presets() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    let check = |body: &str| check_config(&f, body);
    let base = "[[scrape]]\nname = \"llm\"\nurl = \"http://127.0.0.1:8000/metrics\"\n";
    let (code, err) = check(&format!("{base}preset = \"vllm\"\n"));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = check(&format!("{base}preset = \"llamacpp\"\nmodel = \"phi-3\"\n"));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = check(&format!("{base}preset = \"tgi\"\n"));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "[[scrape]] \"llm\": preset \"tgi\" is not known; use one of \"vllm\", \"llamacpp\""
        ),
        "{err}"
    );
}
