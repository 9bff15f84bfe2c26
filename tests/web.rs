//! The web UI in a real headless Chromium (Debian's `chromium`, driven by `tests/web/ui.mjs`
//! through playwright-core), `/metrics` checked by a real `promtool`, and access control.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value as J;

use crate::support::*;

/// Streamed answers against a scraper that stops reading and a store that fails halfway.
pub(crate) mod streams;

// Collectors off: the tests feed every measurement themselves, with known values.
const FED: &str =
    "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A small deterministic noise source in [0, 1).
struct Lcg(u64);
impl Lcg {
    fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The last 14 minutes of a device whose GPU overheats and throttles from 6 to 4 minutes
/// ago: inference latency (two models, wall and GPU time), a GPU as NVML reports it,
/// thermal zones and host CPU/memory. Line protocol, millisecond timestamps.
fn incident(now_ms: i64) -> String {
    let mut r = Lcg(7);
    let mut out = String::new();
    let start = now_ms - 14 * 60_000;
    let hot = |t: i64| t >= now_ms - 6 * 60_000 && t < now_ms - 4 * 60_000;
    let mut t = start;
    while t < now_ms {
        let h = hot(t);
        for _ in 0..6 {
            let (wall, gpu) = if h {
                let g = 42.0 + 14.0 * r.unit();
                (g + 25.0 + 110.0 * r.unit().powi(3), g)
            } else {
                let g = 27.0 + 4.0 * r.unit();
                (g + 8.0 + 22.0 * r.unit().powi(6), g)
            };
            out.push_str(&format!(
                "inference,model=yolov8n,model_version=3,app=cam wall_ms={wall:.2},gpu_ms={gpu:.2},queue_ms={:.2},batch_size=1i {t}\n",
                wall - gpu - 2.0
            ));
        }
        for _ in 0..2 {
            let gpu = 9.0 + 2.0 * r.unit() + if h { 4.0 } else { 0.0 };
            out.push_str(&format!(
                "inference,model=resnet50,app=cam wall_ms={:.2},gpu_ms={gpu:.2},batch_size=4i {t}\n",
                gpu + 3.0 + 2.0 * r.unit()
            ));
        }
        if (t - start) % 5_000 == 0 {
            let n = r.unit();
            let (util, temp, power, clock, sw) = if h {
                (97.0 + 3.0 * n, 86.0 + 2.0 * n, 68.0 + 2.0 * n, 1110.0, 1)
            } else {
                (62.0 + 10.0 * n, 66.0 + 3.0 * n, 48.0 + 6.0 * n, 1785.0, 0)
            };
            out.push_str(&format!(
                "gpu,gpu=0,uuid=GPU-5f1d7c2a,name=NVIDIA\\ RTX\\ A2000,arch=ampere,cc=8.6 \
                 util_gpu_pct={util:.1},mem_used_mb=3172,mem_total_mb=6138,temp_c={temp:.1},\
                 power_w={power:.1},clock_sm_mhz={clock},clock_graphics_mhz={clock},\
                 throttle_reasons={}i,throttle_sw_thermal={sw}i,throttle_hw_thermal=0i,\
                 throttle_power_cap=0i {t}\n",
                sw * 0x20
            ));
        }
        if (t - start) % 10_000 == 0 {
            // A Triton server's model, as the scrape input writes it every 10 s.
            out.push_str(&format!(
                "triton,model=densenet_onnx,version=1,scrape=triton requests=40,failures=0,\
                 request_ms=12.5,queue_ms=1.5,compute_input_ms=0.5,compute_infer_ms=9,\
                 compute_output_ms=0.4,batch_size=2,pending=0,request_p50_ms=12,\
                 request_p95_ms=20,request_p99_ms=31.5 {t}\n"
            ));
            let n = r.unit();
            let cpu_temp = if h { 71.0 } else { 55.0 } + 2.0 * n;
            out.push_str(&format!(
                "thermal,zone=cpu-thermal,sensor=thermal_zone0 temp_c={cpu_temp:.1} {t}\n\
                 thermal,zone=soc-thermal,sensor=thermal_zone1 temp_c={:.1} {t}\n\
                 host cpu_pct={:.1},mem_used_pct={:.1},load1={:.2},mem_used_mb=5120,mem_total_mb=15822 {t}\n",
                cpu_temp - 6.0,
                38.0 + 10.0 * n,
                41.0 + n,
                1.2 + n
            ));
        }
        t += 2_000;
    }
    out
}

/// A number as the page's `num()` prints it (JavaScript `toFixed`/`toPrecision(2)`).
fn js_num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        let digits = (1 - a.log10().floor() as i32).max(0) as usize;
        format!("{v:.digits$}")
    }
}

fn feed(agent_url: &str, lines: &str, auth: &[(&str, &str)]) {
    let (code, body) = post(
        &format!("{agent_url}/write?precision=ms"),
        lines.as_bytes(),
        auth,
    )
    .unwrap();
    assert_eq!(code, 204, "{body}");
}

fn scrape(agent: &Agent) -> String {
    let r = ureq::get(&agent.url("/metrics"))
        .call()
        .expect("GET /metrics");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    r.into_string().unwrap()
}

fn target_dir() -> PathBuf {
    // target/<profile>/deps/tests-* -> target/
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir)
}

#[test]
fn metrics_of_a_fed_agent_pass_promtool_check() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), FED);
    feed(&agent.url(""), &incident(now_ms()), &[]);
    // A tag value that needs escaping, and a string field that must be left out.
    feed(
        &agent.url(""),
        &format!(
            "thermal,zone=a\\ \"quoted\"\\\\zone,sensor=x temp_c=40,label=\"hot\" {}\n",
            now_ms()
        ),
        &[],
    );
    // A scrape commits nothing (the held points' values are in it all the same): a read of
    // the latest commits the fed points, so the commit histogram below has seen them.
    agent.status();
    let text = scrape(&agent);
    for want in [
        "# TYPE inference_wall_seconds gauge",
        "inference_wall_seconds{app=\"cam\",model=\"yolov8n\",model_version=\"3\"} 0.0",
        "gpu_temp_c{arch=\"ampere\",cc=\"8.6\",gpu=\"0\",name=\"NVIDIA RTX A2000\",uuid=\"GPU-5f1d7c2a\"} ",
        "gpu_mem_used_bytes{",
        "gpu_throttle_sw_thermal{",
        "thermal_temp_c{sensor=\"x\",zone=\"a \\\"quoted\\\"\\\\zone\"} 40",
        "host_cpu_pct ",
        "# TYPE edgewatch_points_written_total counter",
        "edgewatch_points_rejected_total 0",
        "edgewatch_points_dropped_total 0",
        "edgewatch_queue_points ",
        "edgewatch_write_latency_seconds ",
        "edgewatch_db_bytes ",
        "edgewatch_db_budget_bytes 1073741824",
        "edgewatch_rollup_lag_seconds{tier=\"1m\"} ",
        "edgewatch_collector_errors_total 0",
        "edgewatch_build_info{version=",
        "# TYPE edgewatch_commit_duration_seconds histogram",
        "edgewatch_commit_duration_seconds_bucket{le=\"+Inf\"} ",
        "edgewatch_clock_set 1",
        "edgewatch_clock_holding 0",
        "edgewatch_clock_unfixable_points_total 0",
        "edgewatch_evicted_raw_points_total 0",
        "edgewatch_evicted_rows_total{tier=\"1m\"} 0",
        "edgewatch_series ",
        "# TYPE edgewatch_tegrastats_state gauge",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // Every commit of the fed data was observed.
    let commits: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("edgewatch_commit_duration_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(commits >= 2.0, "{commits} commits:\n{text}");
    assert!(!text.contains("label"), "strings are not metrics:\n{text}");
    std::fs::write(target_dir().join("metrics-sample.txt"), &text).unwrap();
    promtool_check(&text);
}

/// The Series tab with 20,000 series: one page of rows at a time, filtered and paged by the
/// agent, so the page answers at once (it used to fetch and filter every series itself).
#[test]
fn ui_series_tab_pages_and_filters_many_series() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web/series.mjs");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), FED);
    let now = now_ms();
    for part in 0..4 {
        let body: String = (part * 5_000..(part + 1) * 5_000)
            .map(|j| {
                format!(
                    "req,req=r{j:07},host=dev wall_ms={}.5 {}\n",
                    j % 97,
                    now - j as i64
                )
            })
            .collect();
        feed(&agent.url(""), &body, &[]);
    }
    let out = Command::new("node")
        .arg(&script)
        .arg(agent.url(""))
        .arg("r0012345")
        .output()
        .expect("node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "series.mjs failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: J = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    assert!(
        r["failure"].is_null(),
        "browser step failed: {}",
        r["failure"]
    );
    assert_eq!(r["errors"], serde_json::json!([]), "console errors");
    assert_eq!(r["firstRows"], 200, "{r}");
    assert_eq!(r["firstCount"], "200 of 20000 series", "{r}");
    assert_eq!(r["moreRows"], 400, "{r}");
    let rows = r["filterRows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{r}");
    assert!(
        rows[0].as_str().unwrap_or("").contains("req=r0012345"),
        "{r}"
    );
    assert_eq!(r["filterCount"], "1 of 1 series matching", "{r}");
    // No answer carried more than a page (a page of 200 rows is ~20 KB; the whole list ~2 MB).
    let max = r["maxBody"].as_i64().unwrap_or(i64::MAX);
    assert!(max < 100_000, "an answer of {max} bytes: {r}");
    // Generous bounds on a busy 2-core machine: each step answered within seconds.
    for step in ["first", "more", "filter"] {
        let ms = r["ms"][step].as_i64().unwrap_or(i64::MAX);
        assert!(ms < 10_000, "{step}: {ms} ms: {r}");
    }
}

/// Every `edgewatch_*` family the status document can give (a sink with every optional
/// value known, a tier not run yet, a held clock) passes promtool, not only those of an
/// agent without sinks.
#[test]
fn metrics_of_every_status_family_pass_promtool_check() {
    use edgewatch::status;
    let mut st = status::Status::default();
    st.agent.version = "0.0.0-test".into();
    st.store.series = Some(3);
    st.rollup = Some(status::Rollup {
        tiers: vec![
            status::Tier {
                name: "1m".into(),
                lag_s: Some(2.0),
                ..status::Tier::default()
            },
            status::Tier {
                name: "1h".into(),
                lag_s: None,
                pending_chunks: 4,
                ..status::Tier::default()
            },
        ],
        sinks: vec![status::SinkEvictions {
            name: "north".into(),
            evicted_unforwarded_points: 5,
            ..status::SinkEvictions::default()
        }],
        ..status::Rollup::default()
    });
    st.clock = Some(status::Clock {
        set: true,
        held_from_chunk_id: Some(7),
        ..status::Clock::default()
    });
    st.forward.sinks.push(status::Sink {
        name: "north".into(),
        kind: "influxdb".into(),
        connected: true,
        backlog_points: 9,
        oldest_unsent_age_s: Some(1.5),
        last_success_ns: Some(1_700_000_000_000_000_000),
        last_error: Some("cannot reach".into()),
        last_error_ns: Some(1_700_000_001_000_000_000),
        errors: 2,
        drain_rate_pps: 10.0,
        ..status::Sink::default()
    });
    st.collectors.nvml.state = "running".into();
    st.collectors.nvml.gpus.push(status::Gpu::default());
    st.collectors.tegrastats.state = "off".into();
    st.collectors.tegrastats.last_sample_age_s = Some(0.5);
    let text = edgewatch::web::metrics::render(&st, &[], None);
    for want in [
        "edgewatch_sink_connected{sink=\"north\"} 1",
        "edgewatch_sink_backlog_points{sink=\"north\"} 9",
        "edgewatch_sink_oldest_unsent_age_seconds{sink=\"north\"} 1.5",
        "edgewatch_sink_last_success_seconds{sink=\"north\"} 1700000000",
        "edgewatch_sink_last_error_seconds{sink=\"north\"} 1700000001",
        "edgewatch_sink_evicted_unforwarded_points_total{sink=\"north\"} 5",
        "edgewatch_rollup_lag_seconds{tier=\"1h\"} NaN",
        "edgewatch_clock_holding 1",
        "edgewatch_nvml_gpus 1",
        "edgewatch_tegrastats_last_sample_age_seconds 0.5",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    promtool_check(&text);
}

#[test]
fn ui_in_chromium_shows_the_incident_and_follows_the_range_picker() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web/ui.mjs");
    assert!(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/web/node_modules/playwright-core")
            .exists(),
        "run: npm install --no-save --prefix tests/web playwright-core@1"
    );
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), FED);
    let now = now_ms();
    feed(&agent.url(""), &incident(now), &[]);
    // The agent "restarted" 12 minutes ago (ms precision, as the feed).
    feed(
        &agent.url(""),
        &format!(
            "edgewatch_event,kind=start,severity=info,source=agent,version=0.1.0 pid=4242i {}\n",
            now - 12 * 60_000
        ),
        &[],
    );
    let empty_dir = tempfile::tempdir().unwrap();
    // A device whose clock is not set yet (it reads earlier than min_valid).
    let empty = Agent::start(
        empty_dir.path(),
        &format!("{FED}[clock]\nmin_valid = \"2100-01-01T00:00:00Z\"\n"),
    );
    // A Jetson: tegrastats replayed from a real AGX Orin (JetPack 6) log, no NVML; and one
    // InfluxDB sink whose server is down (nothing listens on its port).
    let jet_dir = tempfile::tempdir().unwrap();
    // Its identity and a passed thermal trip point, as files under a fake root.
    let root = jet_dir.path().join("root");
    for (rel, text) in [
        (
            "proc/device-tree/model",
            "NVIDIA Jetson AGX Orin Developer Kit\0",
        ),
        (
            "etc/nv_tegra_release",
            "# R36 (release), REVISION: 4.0, GCID: 1, BOARD: generic\n",
        ),
        ("var/lib/nvpmodel/status", "pmode:0000\n"),
        ("etc/nvpmodel.conf", "< POWER_MODEL ID=0 NAME=MAXN >\n"),
        ("sys/class/thermal/thermal_zone0/type", "tj-thermal\n"),
        ("sys/class/thermal/thermal_zone0/temp", "99500\n"),
        (
            "sys/class/thermal/thermal_zone0/trip_point_0_type",
            "passive\n",
        ),
        (
            "sys/class/thermal/thermal_zone0/trip_point_0_temp",
            "99000\n",
        ),
    ] {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let jetson = Agent::start(
        jet_dir.path(),
        &format!(
            "[host]\nenabled = false\n[nvml]\nenabled = false\n[jetson]\nroot = \"{}\"\ninterval = \"100ms\"\n\
             [tegrastats]\nreplay = \"{}\"\ninterval = \"100ms\"\n\
             [[sink]]\ntype = \"influxdb\"\nname = \"north\"\nurl = \"http://127.0.0.1:{}\"\nversion = 1\n\
             database = \"edge\"\nmin_backoff = \"50ms\"\nmax_backoff = \"500ms\"\n",
            root.display(),
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/tegrastats/agx-orin-jp6.log")
                .display(),
            free_port()
        ),
    );
    let shot = target_dir().join("ui-screenshot.png");
    let out = Command::new("node")
        .arg(&script)
        .arg(agent.url(""))
        .arg(empty.url(""))
        .arg(&shot)
        .arg(jetson.url(""))
        .output()
        .expect("node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ui.mjs failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: J = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!(
            "bad report ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        r["failure"].is_null(),
        "browser step failed: {}",
        r["failure"]
    );
    assert_eq!(r["errors"], serde_json::json!([]), "console errors");
    // The page ran under its CSP, and the CSSOM-set colours took effect.
    assert!(
        r["csp"]
            .as_str()
            .unwrap_or("")
            .contains("script-src 'self'"),
        "{}",
        r["csp"]
    );
    // A store of a few hundred KB against the 1 GB default budget: an all but empty meter.
    let fill = r["meterFill"].as_f64().unwrap_or(1.0);
    assert!(fill < 0.05, "budget meter {fill}");
    let swatch = r["swatch"].as_str().unwrap_or("");
    assert!(
        swatch.starts_with("rgb") && swatch != "rgba(0, 0, 0, 0)",
        "legend swatch not coloured: {swatch:?}"
    );

    // 15 minutes at 10 s steps: ~84 steps of data per latency line.
    let charts = &r["charts"];
    for line in ["p50", "p95", "p99", "GPU p50", "GPU p99"] {
        let n = charts["latency-yolov8n"][line].as_i64().unwrap_or(0);
        assert!((80..=92).contains(&n), "{line}: {n} points: {charts}");
    }
    assert!(charts["latency-resnet50"]["p99"].as_i64().unwrap_or(0) >= 80);
    assert!(charts["ratio"]["yolov8n"].as_i64().unwrap_or(0) >= 80);
    assert!(charts["throughput"]["resnet50"].as_i64().unwrap_or(0) >= 80);
    for (chart, series) in [
        ("gpu_util", "GPU 0"),
        ("gpu_temp", "GPU 0"),
        ("gpu_power", "GPU 0"),
        ("gpu_mem", "GPU 0"),
        ("gpu_throttle", "sw thermal"),
        ("thermal", "cpu-thermal"),
        ("thermal", "soc-thermal"),
        ("cpu", "CPU"),
    ] {
        let n = charts[chart][series].as_i64().unwrap_or(0);
        assert!(n >= 80, "{chart}/{series}: {n} points: {charts}");
    }
    assert!(
        charts["gpu_clock"]["SM GPU 0"].as_i64().unwrap_or(0) >= 80
            || charts["gpu_clock"]["SM"].as_i64().unwrap_or(0) >= 80,
        "{charts}"
    );
    // No Jetson data: no Jetson panels.
    assert!(charts["j_power"].is_null(), "{charts}");
    // Energy per inference, from NVML's board power: each card shows the API's number as
    // the page formats it, and the chart has a line per model.
    let api = &r["energyApi"];
    assert_eq!(api["energy"]["source"], "nvml:power_w", "{api}");
    for model in ["yolov8n", "resnet50"] {
        let mj = api["summary"][model]["energy_mj_per_inference"]
            .as_f64()
            .unwrap_or_else(|| panic!("{model}: no energy: {api}"));
        let card = r["energyCards"][model].as_str().unwrap_or("");
        assert!(
            card.starts_with(&format!("{} mJ/inference", js_num(mj))),
            "{model}: {card:?} vs {mj}"
        );
        assert!(
            card.contains("inf/J") && card.contains("nvml:power_w"),
            "{card}"
        );
        assert!(
            charts["energy"][model].as_i64().unwrap_or(0) >= 80,
            "{charts}"
        );
    }
    // yolov8n (~29 ms GPU, 3/s) takes most of the ~50 W board next to resnet50 (~10 ms,
    // 1/s): about 0.9 * 50 W / 3 per second, i.e. ~15 J per inference (a sanity range).
    let yolo = api["summary"]["yolov8n"]["energy_mj_per_inference"]
        .as_f64()
        .unwrap_or(0.0);
    assert!((10_000.0..22_000.0).contains(&yolo), "{yolo}");

    // A Triton model sits beside the app-reported ones, marked, with its latency as the API
    // gives it (Triton's own p99 summary, 31.5 ms) and a latency chart of its own.
    let tri = &r["tritonApi"];
    let p99 = tri["densenet_onnx"]["wall_ms"]["p99"]
        .as_f64()
        .unwrap_or(0.0);
    assert_eq!(p99, 31.5, "{tri}");
    let card = r["tritonCards"]["densenet_onnx"].as_str().unwrap_or("");
    assert!(
        card.contains("Triton")
            && card.contains(&format!("{} ms", js_num(p99)))
            && card.contains("p50 12.0 ms"),
        "Triton card: {card:?}"
    );
    let n = charts["latency-triton-densenet_onnx-1-triton"]["p99"]
        .as_i64()
        .unwrap_or(0);
    assert!((80..=92).contains(&n), "Triton p99: {n} points: {charts}");
    assert!(
        charts["throughput"]["densenet_onnx (Triton v1)"]
            .as_i64()
            .unwrap_or(0)
            >= 80,
        "{charts}"
    );

    // The triage line names the spike and its cause.
    let findings = r["findings"].to_string();
    assert!(
        findings.contains("yolov8n: p99 peaked") && findings.contains("throttled (sw thermal)"),
        "{findings}"
    );
    assert!(
        findings.contains("edgewatch agent started at"),
        "{findings}"
    );
    let tip = r["tip"].as_str().unwrap_or("");
    assert!(tip.contains("p99") && tip.contains("ms"), "tooltip: {tip}");
    assert!(
        r["crosshairs"].as_i64().unwrap_or(0) >= 10,
        "{}",
        r["crosshairs"]
    );

    // The range picker: the 1 h view reads 1-minute steps (about 14 with data).
    let h1 = &r["ranges"]["1h"];
    assert_eq!(h1["active"], "1 h");
    let n = h1["charts"]["latency-yolov8n"]["p99"].as_i64().unwrap_or(0);
    assert!((13..=16).contains(&n), "1h p99 points: {n}: {h1}");
    let n = r["ranges"]["24h"]["charts"]["latency-yolov8n"]["p99"]
        .as_i64()
        .unwrap_or(0);
    assert!((3..=5).contains(&n), "24h p99 points: {n}");
    // The first load reads the latest; the live refresh, every 15 s (the agent's default
    // hold, longer than the 15m range's 5 s), reads what is stored (held points included),
    // each of its requests.
    assert_eq!(r["firstRead"], "latest", "{}", r["firstRead"]);
    assert_eq!(r["live"], "live · every 15 s", "{}", r["live"]);
    assert_eq!(r["refreshRead"], "stored", "{}", r["refreshRead"]);
    let reads = r["refreshQueryReads"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !reads.is_empty() && reads.iter().all(|x| x == "stored"),
        "{reads:?}"
    );
    let steps = r["steps"].to_string();
    for want in [
        "from=-15m&step=10s",
        "from=-1h&step=1m",
        "from=-24h&step=5m",
        "from=-7d&step=1h",
    ] {
        assert!(steps.contains(want), "no request with {want}: {steps}");
    }

    // Series browser, forwarding, storage and the empty states.
    assert!(
        r["seriesRows"].as_i64().unwrap_or(0) >= 1,
        "{}",
        r["seriesRows"]
    );
    assert!(
        r["seriesPlot"].as_i64().unwrap_or(0) >= 10,
        "{}",
        r["seriesPlot"]
    );
    // No sinks in this agent's config: the tab holds its heading and the empty state only,
    // which names the config key as it is spelled (`[[sink]]`).
    assert_eq!(
        r["forwarding"].as_str().unwrap_or(""),
        "ForwardingNo sinks configured: data stays on this device. Add a [[sink]] (InfluxDB or \
         MQTT) to the config to ship it to the fleet.",
        "{}",
        r["forwarding"]
    );
    let storage = r["storage"].as_str().unwrap_or("");
    assert!(
        storage.contains("1.0 GB budget") && storage.contains("Retention per tier"),
        "{storage}"
    );
    // The offline runway card: how long the budget holds at the current write rate.
    assert!(
        storage.contains("offline runway")
            && (storage.contains("before eviction begins")
                || storage.contains("nothing written yet")),
        "{storage}"
    );
    // What the agent has written to storage (its status' `disk_written_bytes`).
    assert!(
        storage.contains("written to storage") && storage.contains("the agent's wear on the flash"),
        "{storage}"
    );
    // The evicted table: raw chunks and points, then each tier's rows.
    assert!(
        storage.contains("Evictedwhatcountraw chunks0raw points0rows 1m0rows 1h0"),
        "{storage}"
    );
    let empty_inf = r["emptyInference"].as_str().unwrap_or("");
    assert!(
        empty_inf.contains("curl -XPOST") && empty_inf.contains("inference,model="),
        "{empty_inf}"
    );
    // The clock banner: hidden on a set clock, explaining the hold on the unset one.
    assert_eq!(r["bannerHidden"], true, "{}", r["bannerHidden"]);
    let banner = r["emptyBanner"].as_str().unwrap_or("");
    assert!(
        banner.contains("clock is not set") && banner.contains("2100-01-01"),
        "{banner}"
    );
    // The empty state says why: both GPU collectors are off in this agent's config.
    let empty_gpu = r["emptyGpu"].as_str().unwrap_or("");
    assert!(
        empty_gpu.contains("No GPU found")
            && empty_gpu.contains("NVML collector: off: disabled in the configuration")
            && empty_gpu.contains("tegrastats collector: off (disabled in the configuration)"),
        "{empty_gpu}"
    );
    // The Jetson's panels, drawn from tegrastats alone.
    let jc = &r["jetsonCharts"];
    for (chart, series) in [
        ("j_power", "VDD_GPU_SOC"),
        ("j_power", "VIN_SYS_5V0"),
        ("j_temp", "tj"),
        ("j_emc", "EMC"),
        ("j_engine", "NVENC"),
        ("gpu_util", "GR3D"),
        ("mem", "RAM"),
    ] {
        let n = jc[chart][series].as_i64().unwrap_or(0);
        assert!(n >= 1, "{chart}/{series}: {n} points: {jc}");
    }
    // The jetson collector read the fake root: the passed trip shows as throttling.
    assert!(
        jc["gpu_throttle"]["Jetson throttled"].as_i64().unwrap_or(0) >= 1,
        "{jc}"
    );
    let jf = r["jetsonFindings"].to_string();
    assert!(jf.contains("GPU throttled (Jetson throttled)"), "{jf}");
    let sections = r["jetsonSections"].to_string();
    assert!(
        sections.contains("Jetson") && sections.contains("GPU"),
        "{sections}"
    );
    // Its forwarding tab: one row per sink, every column read from `forward.sinks`.
    let fwd = &r["jetsonForwarding"];
    assert_eq!(
        fwd["head"],
        serde_json::json!([
            "sink",
            "kind",
            "connection",
            "backlog (points)",
            "oldest unsent",
            "last error",
            "dead letters",
            "evicted before sent"
        ]),
        "{fwd}"
    );
    let rows = fwd["rows"].as_array().expect("forwarding rows");
    assert_eq!(rows.len(), 1, "{fwd}");
    let cell = |i: usize| rows[0][i].as_str().unwrap_or("");
    assert_eq!(cell(0), "north", "{fwd}");
    assert_eq!(cell(1), "influxdb", "{fwd}");
    assert_eq!(cell(2), "disconnected", "{fwd}");
    assert!(cell(3).parse::<u64>().is_ok(), "backlog: {fwd}");
    assert!(
        cell(5).starts_with("cannot reach http://127.0.0.1:"),
        "{fwd}"
    );
    assert_eq!(cell(6), "0", "dead letters: {fwd}");
    assert_eq!(cell(7), "0", "evicted: {fwd}");
    assert!(shot.exists());
    eprintln!("screenshot: {}", shot.display());
}

/// An agent listening on 0.0.0.0 (tests still only connect to 127.0.0.1).
struct Remote {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Remote {
    fn start(dir: &Path, http_extra: &str) -> Remote {
        let port = free_port();
        let cfg = dir.join("edgewatch.toml");
        std::fs::write(
            &cfg,
            format!(
                "[http]\nlisten = \"0.0.0.0:{port}\"\n{http_extra}\n[udp]\nenabled = false\n\
                 [storage]\ndata_dir = \"{}\"\n[kmsg]\nenabled = false\n{FED}",
                dir.join("data").display()
            ),
        )
        .unwrap();
        let log = dir.join("agent.log");
        let child = Command::new(bin())
            .args(["run", "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut r = Remote { child, port, log };
        let up = wait_for(Duration::from_secs(20), || {
            if let Ok(Some(s)) = r.child.try_wait() {
                panic!(
                    "exited ({s}): {}",
                    std::fs::read_to_string(&r.log).unwrap_or_default()
                );
            }
            get(&r.url("/health")).ok().filter(|x| x.0 == 200)
        });
        assert!(up.is_some(), "not ready");
        r
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_of(url: &str, auth: Option<&str>) -> (u16, Option<String>) {
    let mut req = ureq::get(url).timeout(Duration::from_secs(10));
    if let Some(a) = auth {
        req = req.set("Authorization", a);
    }
    match req.call() {
        Ok(r) => (r.status(), None),
        Err(ureq::Error::Status(c, r)) => (c, r.header("WWW-Authenticate").map(String::from)),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn off_loopback_everything_but_health_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let a = Remote::start(dir.path(), "token = \"s3cret\"");
    assert_eq!(status_of(&a.url("/health"), None).0, 200);
    for path in [
        "/",
        "/assets/app.js",
        "/metrics",
        "/api/v1/status",
        "/api/v1/series",
        "/ping",
    ] {
        let (code, challenge) = status_of(&a.url(path), None);
        assert_eq!(code, 401, "{path}");
        assert!(challenge.unwrap_or_default().starts_with("Basic"), "{path}");
        assert_eq!(
            status_of(&a.url(path), Some("Bearer wrong")).0,
            401,
            "{path}"
        );
        assert_eq!(
            status_of(&a.url(path), Some("Bearer s3cret")).0,
            if path == "/ping" { 204 } else { 200 },
            "{path}"
        );
    }
    // InfluxDB 2.x `Token`, basic auth (a browser), and 1.x `p=`.
    assert_eq!(status_of(&a.url("/metrics"), Some("Token s3cret")).0, 200);
    // base64("edge:s3cret")
    assert_eq!(
        status_of(&a.url("/"), Some("Basic ZWRnZTpzM2NyZXQ=")).0,
        200
    );
    let line = b"inference,model=m wall_ms=1";
    assert_eq!(post(&a.url("/write"), line, &[]).unwrap().0, 401);
    assert_eq!(
        post(&a.url("/write?u=edge&p=nope"), line, &[]).unwrap().0,
        401
    );
    assert_eq!(
        post(&a.url("/write?u=edge&p=s3cret"), line, &[]).unwrap().0,
        204
    );
    assert_eq!(
        post(
            &a.url("/api/v2/write?bucket=b"),
            line,
            &[("Authorization", "Token s3cret")]
        )
        .unwrap()
        .0,
        204
    );
}

#[test]
fn query_string_token_is_read_on_write_only() {
    let dir = tempfile::tempdir().unwrap();
    let a = Remote::start(dir.path(), "token = \"s3cret\"");
    let line = b"inference,model=m wall_ms=1";
    // InfluxDB 1.x clients put the credentials in the URL of /write, and only there.
    assert_eq!(
        post(&a.url("/write?db=d&u=edge&p=s3cret"), line, &[])
            .unwrap()
            .0,
        204
    );
    let (code, body) = post(&a.url("/api/v2/write?bucket=b&p=s3cret"), line, &[]).unwrap();
    assert_eq!(code, 401, "{body}");
    for path in [
        "/api/v1/query?measurement=inference&from=0&p=s3cret",
        "/api/v1/status?p=s3cret",
        "/metrics?p=s3cret",
        "/?p=s3cret",
    ] {
        assert_eq!(status_of(&a.url(path), None).0, 401, "{path}");
    }
    // The same requests with the token in the header pass: only the place was wrong.
    assert_eq!(
        status_of(
            &a.url("/api/v1/query?measurement=inference&from=0"),
            Some("Bearer s3cret")
        )
        .0,
        200
    );
}

#[test]
fn metrics_open_serves_metrics_without_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let a = Remote::start(dir.path(), "token = \"s3cret\"\nmetrics_open = true");
    assert_eq!(status_of(&a.url("/metrics"), None).0, 200);
    assert_eq!(status_of(&a.url("/api/v1/status"), None).0, 401);
    assert_eq!(status_of(&a.url("/"), None).0, 401);
}

#[test]
fn on_loopback_a_token_guards_writes_only() {
    let dir = tempfile::tempdir().unwrap();
    // The token from the environment, as a systemd unit or container would pass it.
    let agent = Agent::start_with_env(dir.path(), FED, &[("EDGEWATCH_HTTP__TOKEN", "s3cret")]);
    assert_eq!(status_of(&agent.url("/"), None).0, 200);
    assert_eq!(status_of(&agent.url("/metrics"), None).0, 200);
    let line = b"inference,model=m wall_ms=1";
    let (code, body) = post(&agent.url("/write"), line, &[]).unwrap();
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("token"), "{body}");
    assert_eq!(
        post(
            &agent.url("/api/v2/write?bucket=b"),
            line,
            &[("Authorization", "Token nope")]
        )
        .unwrap()
        .0,
        401
    );
    assert_eq!(
        post(
            &agent.url("/write"),
            line,
            &[("Authorization", "Bearer s3cret")]
        )
        .unwrap()
        .0,
        204
    );
    assert!(!agent.log_text().contains("s3cret"), "the token was logged");
}

#[test]
fn off_loopback_without_a_token_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("edgewatch.toml");
    std::fs::write(
        &cfg,
        format!(
            "[http]\nlisten = \"0.0.0.0:{}\"\n[udp]\nenabled = false\n[storage]\ndata_dir = \"{}\"\n[kmsg]\nenabled = false\n{FED}",
            free_port(),
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no [http] token is set") && err.contains("EDGEWATCH_HTTP__TOKEN"),
        "{err}"
    );
}
