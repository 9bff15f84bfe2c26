//! Energy per inference through the real binary: tegrastats-style power rails and two
//! models' inferences written as line protocol with known timestamps, and
//! `/api/v1/inference` checked against values computed by hand (trapezoids, attribution by
//! `gpu_ms`, the idle remainder, `null` where the power samples are too few).

use serde_json::Value as J;

use crate::support::*;

const QUIET: &str = "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n[rollup]\nenabled = false\n";
const S: i64 = 1_000_000_000;

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

#[test]
fn energy_per_inference_is_integrated_attributed_and_null_without_power() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let t0 = (edgewatch::now_ns() - 600 * S) / (10 * S) * (10 * S);
    let mut body = String::new();
    // VDD_IN ramps 4000 mW + 100 mW/s, one sample a second over 0..=30 s; the GPU rail is
    // 1000 mW over 0..=20 s only.
    for i in 0..=30 {
        body.push_str(&format!(
            "jetson_power,rail=VDD_IN current_mw={},average_mw=1 {}\n",
            4000 + 100 * i,
            t0 + i * S
        ));
        if i <= 20 {
            body.push_str(&format!(
                "jetson_power,rail=VDD_GPU_SOC current_mw=1000,average_mw=1 {}\n",
                t0 + i * S
            ));
        }
    }
    let inf = |model: &str, gpu: f64, ts: i64| {
        format!(
            "inference,model={model} wall_ms={},gpu_ms={gpu} {ts}\n",
            gpu + 5.0
        )
    };
    // Step 0 (0-10 s): a 4 x 15 ms, b 2 x 10 ms. Step 1: nothing. Step 2: a 5 x. Step 3
    // (30-40 s, no power after 30 s): a 1 x.
    for k in 0..4 {
        body.push_str(&inf("a", 15.0, t0 + k * S + S / 2));
    }
    for k in 0..2 {
        body.push_str(&inf("b", 10.0, t0 + k * S + S / 2));
    }
    for k in 0..5 {
        body.push_str(&inf("a", 15.0, t0 + 20 * S + k * S));
    }
    body.push_str(&inf("a", 15.0, t0 + 35 * S));
    write(&agent, &body);

    let to = t0 + 40 * S - 1;
    let (code, text) =
        get(&agent.url(&format!("/api/v1/inference?from={t0}&to={to}&step=10s"))).unwrap();
    assert_eq!(code, 200, "{text}");
    let v: J = serde_json::from_str(&text).unwrap();
    let e = &v["energy"];
    assert_eq!(e["source"], "tegrastats:VDD_IN", "{e}");
    assert_eq!(e["gpu_source"], "tegrastats:VDD_GPU_SOC");
    assert_eq!(e["lower_bound"], false);
    // By hand: a linear ramp integrates to the mean of its ends times the time.
    // Step 0: (4000+5000)/2 mW * 10 s = 45000 mJ; step 1: 55000; step 2: 65000; step 3: null.
    let steps = e["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4, "{e}");
    close(&steps[0]["board_mj"], 45_000.0);
    close(&steps[0]["gpu_mj"], 10_000.0);
    close(&steps[1]["board_mj"], 55_000.0);
    close(&steps[1]["idle_mj"], 55_000.0);
    close(&steps[2]["board_mj"], 65_000.0);
    assert_eq!(steps[2]["gpu_mj"], J::Null, "no GPU rail after 20 s");
    assert_eq!(steps[3]["board_mj"], J::Null, "one sample covers nothing");
    close(&e["board_mj"], 165_000.0);
    close(&e["idle_mj"], 55_000.0);
    close(&e["attributed_mj"], 110_000.0);

    let models = v["models"].as_array().unwrap();
    let (a, b) = (&models[0], &models[1]);
    assert_eq!(
        (a["model"].as_str(), b["model"].as_str()),
        (Some("a"), Some("b"))
    );
    // Step 0 split by gpu_ms: a 60 ms of 80 (0.75), b 20 of 80 (0.25).
    let a0 = &a["steps"][0];
    close(&a0["energy_mj"], 33_750.0);
    close(&a0["energy_mj_per_inference"], 33_750.0 / 4.0);
    close(&a0["gpu_energy_mj_per_inference"], 7_500.0 / 4.0);
    close(&a0["inferences_per_joule"], 4.0 / 33.75);
    let b0 = &b["steps"][0];
    close(&b0["energy_mj_per_inference"], 11_250.0 / 2.0);
    close(&b0["gpu_energy_mj_per_inference"], 2_500.0 / 2.0);
    // Step 2: a alone; no GPU rail.
    let a2 = &a["steps"][1];
    assert_eq!(a2["t"], t0 + 20 * S);
    close(&a2["energy_mj_per_inference"], 13_000.0);
    assert_eq!(a2["gpu_energy_mj_per_inference"], J::Null);
    // Step 3: too little power data.
    let a3 = &a["steps"][2];
    assert_eq!(a3["count"], 1);
    assert_eq!(a3["energy_mj_per_inference"], J::Null);
    assert_eq!(a3["inferences_per_joule"], J::Null);
    // Summary: over the steps with energy (a: 0 and 2; GPU: step 0 only).
    close(&a["summary"]["energy_mj_per_inference"], 98_750.0 / 9.0);
    close(&a["summary"]["gpu_energy_mj_per_inference"], 1_875.0);
    close(&a["summary"]["inferences_per_joule"], 9.0 / 98.75);
    close(&b["summary"]["energy_mj_per_inference"], 5_625.0);
    // The numbers add up: attributed + idle = board.
    let attributed: f64 = [a0, b0, a2]
        .iter()
        .map(|s| s["energy_mj"].as_f64().unwrap())
        .sum();
    close(&J::from(attributed), 110_000.0);

    // The model filter keeps the attribution over every model.
    let (_, text) = get(&agent.url(&format!(
        "/api/v1/inference?model=b&from={t0}&to={to}&step=10s"
    )))
    .unwrap();
    let v: J = serde_json::from_str(&text).unwrap();
    close(
        &v["models"][0]["steps"][0]["energy_mj_per_inference"],
        5_625.0,
    );

    // No power at all in a range: null with a reason.
    write(&agent, &inf("a", 15.0, t0 + 300 * S));
    let (_, text) = get(&agent.url(&format!(
        "/api/v1/inference?from={}&to={}&step=10s",
        t0 + 300 * S,
        t0 + 310 * S - 1
    )))
    .unwrap();
    let v: J = serde_json::from_str(&text).unwrap();
    assert_eq!(v["energy"]["source"], J::Null, "{v}");
    assert!(v["energy"]["reason"]
        .as_str()
        .unwrap()
        .contains("no power samples"));
    assert_eq!(
        v["models"][0]["steps"][0]["energy_mj_per_inference"],
        J::Null
    );
    assert_eq!(
        v["models"][0]["summary"]["energy_mj_per_inference"],
        J::Null
    );
    agent.terminate();
}

#[test]
fn energy_per_inference_from_the_1m_tier() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let min = 60 * S;
    let t0 = (edgewatch::now_ns() - 30 * min) / min * min;
    // 10 minutes: VDD_IN at a constant 10 W, one sample a second; 10 inferences a minute.
    let mut body = String::new();
    for i in 0..600 {
        body.push_str(&format!(
            "jetson_power,rail=VDD_IN current_mw=10000 {}\n",
            t0 + i * S
        ));
        if i % 6 == 0 {
            body.push_str(&format!(
                "inference,model=m wall_ms=20,gpu_ms=10 {}\n",
                t0 + i * S
            ));
        }
    }
    write(&agent, &body);
    let out = std::process::Command::new(bin())
        .arg("maintain")
        .arg("--data-dir")
        .arg(&agent.dir)
        .output()
        .expect("run maintain");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let to = t0 + 10 * min - 1;
    let (code, text) =
        get(&agent.url(&format!("/api/v1/inference?from={t0}&to={to}&step=1m"))).unwrap();
    assert_eq!(code, 200, "{text}");
    let v: J = serde_json::from_str(&text).unwrap();
    assert_eq!(v["tier"], "1m", "{v}");
    let steps = v["models"][0]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 10);
    // From the tier: each minute holds its mean (10 W) from its first sample (0 s) to its
    // last (59 s) and is joined to the next minute's first: 10 W * 60 s = 600 J, over 10
    // inferences = 60000 mJ; the last minute has no next sample (59 s: 590 J).
    for s in &steps[..9] {
        close(&s["energy_mj_per_inference"], 60_000.0);
        close(&s["inferences_per_joule"], 10.0 / 600.0);
    }
    close(&steps[9]["energy_mj_per_inference"], 59_000.0);
    close(
        &v["models"][0]["summary"]["energy_mj_per_inference"],
        (9.0 * 600_000.0 + 590_000.0) / 100.0,
    );
    agent.terminate();
}

#[test]
fn a_discrete_gpu_s_energy_counter_is_used_by_difference() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let t0 = (edgewatch::now_ns() - 600 * S) / (10 * S) * (10 * S);
    let mut body = String::new();
    // The counter grows 50 J a second (50 W); power_w says 1 W: the counter wins.
    for i in 0..=20 {
        body.push_str(&format!(
            "gpu,gpu=0,uuid=GPU-1 energy_mj={}i,power_w=1 {}\n",
            1_000_000 + 50_000 * i,
            t0 + i * S
        ));
    }
    for k in 0..10 {
        body.push_str(&format!(
            "inference,model=m wall_ms=20,gpu_ms=10 {}\n",
            t0 + k * S + S / 2
        ));
    }
    write(&agent, &body);
    let (code, text) = get(&agent.url(&format!(
        "/api/v1/inference?from={t0}&to={}&step=10s",
        t0 + 10 * S - 1
    )))
    .unwrap();
    assert_eq!(code, 200, "{text}");
    let v: J = serde_json::from_str(&text).unwrap();
    assert_eq!(v["energy"]["source"], "nvml:energy_mj", "{v}");
    assert_eq!(v["energy"]["gpu_source"], "nvml:energy_mj");
    // 50 W * 10 s = 500 J over 10 inferences.
    let s = &v["models"][0]["steps"][0];
    close(&s["energy_mj_per_inference"], 50_000.0);
    close(&s["gpu_energy_mj_per_inference"], 50_000.0);
    close(&s["inferences_per_joule"], 0.02);
    agent.terminate();
}

/// By hand: the energy (mJ) of time-ordered `(ts, mW)` samples within `[a, b)`, trapezoids
/// between consecutive samples at most 5 median intervals apart, cut at the edges.
fn by_hand(samples: &[(i64, f64)], a: i64, b: i64) -> f64 {
    let mut gaps: Vec<i64> = samples.windows(2).map(|w| w[1].0 - w[0].0).collect();
    gaps.sort_unstable();
    let max_gap = gaps[gaps.len() / 2] * 5;
    let mut mj = 0.0;
    for w in samples.windows(2) {
        let ((t0, p0), (t1, p1)) = (w[0], w[1]);
        if t1 <= t0 || t1 - t0 > max_gap {
            continue;
        }
        let (lo, hi) = (t0.max(a), t1.min(b));
        if hi <= lo {
            continue;
        }
        let at = |t: i64| p0 + (p1 - p0) * (t - t0) as f64 / (t1 - t0) as f64;
        mj += (at(lo) + at(hi)) / 2.0 * (hi - lo) as f64 / S as f64;
    }
    mj
}

/// Stored `(ts, current_mw)` of one rail over every tag set (the identity tags split a
/// rail by power mode), and the power modes seen.
fn rail_samples(agent: &Agent, rail: &str) -> (Vec<(i64, f64)>, Vec<String>) {
    let pts = stored_points(
        agent,
        &format!("measurement=jetson_power&field=current_mw&tag.rail={rail}"),
    );
    let mut modes: Vec<String> = pts
        .iter()
        .filter_map(|p| {
            p.0.split(',')
                .find_map(|kv| kv.strip_prefix("power_mode="))
                .map(str::to_string)
        })
        .collect();
    modes.sort();
    modes.dedup();
    let samples = pts.iter().map(|p| (p.2, p.3.as_f64().unwrap())).collect();
    (samples, modes)
}

#[test]
fn a_tegrastats_replay_across_a_power_mode_change_gives_the_energy_computed_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let root = jetson_fixture(dir.path(), "orin-nano-jp6");
    let log = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/jetson/tegrastats-orin-nano.log");
    let agent = Agent::start(
        dir.path(),
        &format!(
            "[host]\nenabled = false\n[nvml]\nenabled = false\n[rollup]\nenabled = false\n\
             [jetson]\nroot = \"{}\"\ninterval = \"100ms\"\n\
             [tegrastats]\nreplay = \"{}\"\ninterval = \"100ms\"\n",
            root.display(),
            log.display()
        ),
    );
    let step = 5 * S;
    let first = wait_for(std::time::Duration::from_secs(15), || {
        rail_samples(&agent, "VDD_IN").0.first().map(|p| p.0)
    })
    .unwrap_or_else(|| panic!("no VDD_IN samples:\n{}", agent.log_text()));
    let t0 = (first / step + 1) * step;
    // The power mode changes 1.5 s into the step: VDD_IN is two tag sets within it.
    while edgewatch::now_ns() < t0 + 3 * S / 2 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::fs::write(
        root.join("var/lib/nvpmodel/status"),
        "pmode:0000 fmode:quiet\n",
    )
    .unwrap();
    let done = wait_for(std::time::Duration::from_secs(15), || {
        let (s, _) = rail_samples(&agent, "VDD_IN");
        s.last()
            .is_some_and(|p| p.0 > t0 + step + S / 2)
            .then_some(())
    });
    assert!(done.is_some(), "replay stopped:\n{}", agent.log_text());
    let (board, modes) = rail_samples(&agent, "VDD_IN");
    assert_eq!(modes, vec!["15W".to_string(), "MAXN_SUPER".to_string()]);
    let (gpu, _) = rail_samples(&agent, "VDD_CPU_GPU_CV");
    // The real lines alternate 12479 and 4824 mW on VDD_IN.
    assert!(board.iter().all(|p| p.1 == 12479.0 || p.1 == 4824.0));
    let board_mj = by_hand(&board, t0, t0 + step);
    let gpu_mj = by_hand(&gpu, t0, t0 + step);

    // Two models in the step: a 3 x 30 ms of GPU time, b 1 x 10 ms.
    let mut body = String::new();
    for k in 1..=3 {
        body.push_str(&format!(
            "inference,model=a wall_ms=35,gpu_ms=30 {}\n",
            t0 + k * S
        ));
    }
    body.push_str(&format!(
        "inference,model=b wall_ms=15,gpu_ms=10 {}\n",
        t0 + 4 * S
    ));
    write(&agent, &body);
    let (code, text) = get(&agent.url(&format!(
        "/api/v1/inference?from={t0}&to={}&step=5s",
        t0 + step - 1
    )))
    .unwrap();
    assert_eq!(code, 200, "{text}");
    let v: J = serde_json::from_str(&text).unwrap();
    let e = &v["energy"];
    assert_eq!(e["source"], "tegrastats:VDD_IN", "{e}");
    assert_eq!(e["gpu_source"], "tegrastats:VDD_CPU_GPU_CV");
    close(&e["steps"][0]["board_mj"], board_mj);
    close(&e["steps"][0]["gpu_mj"], gpu_mj);
    close(&e["idle_mj"], 0.0);
    let models = v["models"].as_array().unwrap();
    let (a, b) = (&models[0]["steps"][0], &models[1]["steps"][0]);
    close(&a["energy_mj_per_inference"], board_mj * 0.9 / 3.0);
    close(&a["gpu_energy_mj_per_inference"], gpu_mj * 0.9 / 3.0);
    close(&b["energy_mj_per_inference"], board_mj * 0.1);
    close(&b["inferences_per_joule"], 1.0 / (board_mj * 0.1 / 1000.0));
    agent.terminate();
}

#[test]
fn the_sum_of_rails_is_a_lower_bound_and_a_rail_split_by_power_mode_is_one_series() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let t0 = (edgewatch::now_ns() - 600 * S) / (10 * S) * (10 * S);
    // AGX Orin rails (no input rail), constant 2 W + 1.5 W + 4 W; the mode changes at 3 s,
    // so each rail is two tag sets in the step.
    let mut body = String::new();
    for i in 0..=10 {
        let mode = if i < 3 {
            "MAXN,power_mode_id=0"
        } else {
            "MODE_30W,power_mode_id=2"
        };
        for (rail, mw) in [
            ("VDD_GPU_SOC", 2000),
            ("VDD_CPU_CV", 1500),
            ("VIN_SYS_5V0", 4000),
        ] {
            body.push_str(&format!(
                "jetson_power,rail={rail},power_mode={mode} current_mw={mw} {}\n",
                t0 + i * S
            ));
        }
    }
    body.push_str(&format!(
        "inference,model=m wall_ms=20,gpu_ms=10 {}\n",
        t0 + S
    ));
    write(&agent, &body);
    let (code, text) = get(&agent.url(&format!(
        "/api/v1/inference?from={t0}&to={}&step=10s",
        t0 + 10 * S - 1
    )))
    .unwrap();
    assert_eq!(code, 200, "{text}");
    let v: J = serde_json::from_str(&text).unwrap();
    let e = &v["energy"];
    assert_eq!(e["source"], "tegrastats:sum_of_rails", "{e}");
    assert_eq!(e["lower_bound"], true);
    assert_eq!(e["gpu_source"], "tegrastats:VDD_GPU_SOC");
    // 7.5 W * 10 s and 2 W * 10 s, whatever the mode tags.
    close(&e["steps"][0]["board_mj"], 75_000.0);
    close(&e["steps"][0]["gpu_mj"], 20_000.0);
    close(
        &v["models"][0]["steps"][0]["energy_mj_per_inference"],
        75_000.0,
    );
    agent.terminate();
}

#[test]
fn a_30_day_query_at_1h_reads_energy_per_inference_from_the_1h_tier() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let hour = 3600 * S;
    let t0 = (edgewatch::now_ns() - 20 * 24 * hour) / hour * hour;
    // Three hours 20 days ago: VDD_IN at 5, 10 and 8 W, a sample every 10 s; 6, 12 and 3
    // inferences.
    let watts = [5.0, 10.0, 8.0];
    let counts = [6, 12, 3];
    let mut body = String::new();
    for (h, (w, n)) in watts.iter().zip(counts).enumerate() {
        let base = t0 + h as i64 * hour;
        for i in 0..360 {
            body.push_str(&format!(
                "jetson_power,rail=VDD_IN,power_mode=15W current_mw={} {}\n",
                w * 1000.0,
                base + i * 10 * S
            ));
        }
        for k in 0..n {
            body.push_str(&format!(
                "inference,model=m wall_ms=20,gpu_ms=10 {}\n",
                base + k * 60 * S + 5 * S
            ));
        }
    }
    write(&agent, &body);
    let out = std::process::Command::new(bin())
        .arg("maintain")
        .arg("--data-dir")
        .arg(&agent.dir)
        .output()
        .expect("run maintain");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Raw retention (48 h) has dropped the raw points: what follows is the tiers' alone.
    assert!(stored_points(&agent, "measurement=jetson_power").is_empty());
    let (code, text) = get(&agent.url("/api/v1/inference?from=-30d&to=now&step=1h")).unwrap();
    assert_eq!(code, 200, "{text}");
    let v: J = serde_json::from_str(&text).unwrap();
    assert_eq!(v["tier"], "1h", "{v}");
    let steps = v["models"][0]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{v}");
    // Each hour's mean held from its first sample (0 s) to its last (3590 s), joined to the
    // next hour's first by a trapezoid over 10 s; the last hour has no next sample.
    let j = |h: usize| {
        let held = watts[h] * 3590.0;
        let join = watts
            .get(h + 1)
            .map_or(0.0, |n| (watts[h] + n) / 2.0 * 10.0);
        (held + join) * 1000.0
    };
    for (h, s) in steps.iter().enumerate() {
        assert_eq!(s["t"], t0 + h as i64 * hour);
        close(&s["energy_mj_per_inference"], j(h) / counts[h] as f64);
    }
    close(
        &v["models"][0]["summary"]["energy_mj_per_inference"],
        (j(0) + j(1) + j(2)) / 21.0,
    );
    agent.terminate();
}

/// A collector gap inside steps: VDD_IN (5 W) sampled every second over 0-6 s, then nothing
/// until 13 s (a hole: more than 5 median intervals), then every second to 20 s; the GPU
/// rail (2 W) all through; one inference a second all through. Each step's board energy is
/// that of its covered time, divided by the inferences in that time: 5 J each (5 W at one
/// a second), not diluted over the inferences no sample measured; the coverage is reported.
#[test]
fn a_collector_gap_leaves_the_energy_per_inference_right_and_reports_coverage() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let t0 = (edgewatch::now_ns() - 600 * S) / (10 * S) * (10 * S);
    let mut body = String::new();
    for i in (0..=6).chain(13..=20) {
        body.push_str(&format!(
            "jetson_power,rail=VDD_IN current_mw=5000 {}\n",
            t0 + i * S
        ));
    }
    for i in 0..=20 {
        body.push_str(&format!(
            "jetson_power,rail=VDD_GPU_SOC current_mw=2000 {}\n",
            t0 + i * S
        ));
    }
    for k in 0..20 {
        body.push_str(&format!(
            "inference,model=m wall_ms=15,gpu_ms=10 {}\n",
            t0 + k * S + S / 2
        ));
    }
    write(&agent, &body);
    let (code, text) = get(&agent.url(&format!(
        "/api/v1/inference?from={t0}&to={}&step=10s",
        t0 + 20 * S - 1
    )))
    .unwrap();
    assert_eq!(code, 200, "{text}");
    let v: J = serde_json::from_str(&text).unwrap();
    let m = &v["models"][0];
    for s in m["steps"].as_array().unwrap() {
        // Every inference of the step is still counted in the latency signals.
        assert_eq!(s["count"], 10, "{s}");
        close(&s["energy_mj_per_inference"], 5_000.0);
        close(&s["inferences_per_joule"], 0.2);
        // The GPU rail has no gap: 2 W over 10 s for 10 inferences.
        close(&s["gpu_energy_mj_per_inference"], 2_000.0);
    }
    close(&m["summary"]["energy_mj_per_inference"], 5_000.0);
    close(&m["summary"]["gpu_energy_mj_per_inference"], 2_000.0);
    let steps = v["energy"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{v}");
    // Step 0 covers 0-6 s (30 J, 6 inferences); step 1 covers 13-20 s (35 J, 7).
    close(&steps[0]["coverage"], 0.6);
    close(&steps[0]["board_mj"], 30_000.0);
    close(&steps[0]["inferences"], 10.0);
    close(&steps[0]["covered_inferences"], 6.0);
    close(&steps[0]["gpu_coverage"], 1.0);
    close(&steps[1]["coverage"], 0.7);
    close(&steps[1]["board_mj"], 35_000.0);
    close(&steps[1]["covered_inferences"], 7.0);
    close(&steps[1]["idle_mj"], 0.0);
    agent.terminate();
}
