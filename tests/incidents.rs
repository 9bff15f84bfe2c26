//! Incidents: the triage snapshot of `alert::incident::open` on staged stores (each cause
//! staged alone shows up as its finding, a flat control shows none), the incident API through
//! the real agent, and the Alerts tab and incident page in Chromium (`tests/web/alerts.mjs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use edgewatch::alert::event::Firing;
use edgewatch::alert::incident::{self, Options};
use edgewatch::config::Synchronous;
use edgewatch::ingest::lineproto::{parse_body, Precision};
use edgewatch::store::{incidents, Mode, Writer};
use serde_json::Value as J;

use crate::support::*;

const S: i64 = 1_000_000_000;
const MIN: i64 = 60 * S;

/// The staged data's "now": half past the current minute's start, 30 s back at most. The
/// triage window starts on a minute boundary where the latency left its baseline, so a spike
/// that began a second before a minute ended shows in that minute with one point: its first
/// minute must hold the same points whatever second the test runs at.
fn staged_now() -> i64 {
    let n = edgewatch::now_ns();
    let half = n - n.rem_euclid(MIN) + 30 * S;
    if half <= n {
        half
    } else {
        half - MIN
    }
}

/// What a staged store's spike coincides with.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cause {
    /// Nothing: latency rises, everything else stays flat.
    Control,
    /// `input_length` three times as large.
    Inputs,
    /// The GPU 8 °C warmer, thermal slowdown active, the SM clock down, during the spike.
    Hot,
    /// The agent restarted 5 minutes before the firing.
    Restart,
    /// The model's version changed with the spike.
    Version,
    /// The GPU busier (utilisation 60 → 98 %) and fuller (memory 4 → 7.5 GB).
    GpuBusy,
    /// Another process takes the host's CPU (30 → 95 %).
    Contention,
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

/// 80 minutes of a device (ns timestamps) ending at `now`: inference for yolov8n (wall and
/// GPU time, input length, batch size), another model, an NVML GPU, the host, the agent's
/// own health, an agent start 70 minutes ago (in the baseline), a process's GPU memory. The
/// spike (wall time up) runs for the last 8 minutes, with `cause`.
fn stage_lines(now: i64, cause: Cause) -> String {
    stage_spike(now, cause, 8 * MIN)
}

/// [`stage_lines`] with a spike of the last `spike` ns (a restart 20 s before a spike
/// shorter than 5 minutes).
fn stage_spike(now: i64, cause: Cause, spike: i64) -> String {
    let mut r = Lcg(11);
    let mut out = String::new();
    let spike_from = now - spike;
    let mut t = now - 80 * MIN;
    out.push_str(&format!(
        "edgewatch_event,kind=start,severity=info,source=agent,version=0.1.0 pid=100i {}\n",
        now - 70 * MIN
    ));
    if cause == Cause::Restart {
        out.push_str(&format!(
            "edgewatch_event,kind=start,severity=info,source=agent,version=0.1.0 pid=200i {}\n",
            if spike >= 5 * MIN {
                now - 5 * MIN
            } else {
                spike_from - 20 * S
            }
        ));
    }
    while t < now {
        let spike = t >= spike_from;
        let mut n = |base: f64| base * (0.97 + 0.06 * r.unit());
        for i in 0..3 {
            let ts = t + i * 3 * S;
            let input = if spike && cause == Cause::Inputs {
                n(1500.0)
            } else {
                n(500.0)
            };
            let gpu = n(20.0);
            let wall = gpu + if spike { n(60.0) } else { n(8.0) };
            let version = if spike && cause == Cause::Version {
                "2"
            } else {
                "1"
            };
            out.push_str(&format!(
                "inference,model=yolov8n,model_version={version},app=cam wall_ms={wall:.2},gpu_ms={gpu:.2},input_length={}i,batch_size=4i {ts}\n",
                input.round() as i64
            ));
            out.push_str(&format!(
                "inference,model=bert,model_version=7 wall_ms={:.2},gpu_ms={:.2},input_length={}i,batch_size=1i {ts}\n",
                n(30.0),
                n(25.0),
                n(128.0).round() as i64
            ));
        }
        let hot = spike && cause == Cause::Hot;
        let busy = spike && cause == Cause::GpuBusy;
        let (util, mem) = if busy {
            (n(98.0).min(100.0), n(7500.0))
        } else {
            (n(60.0), n(4000.0))
        };
        out.push_str(&format!(
            "gpu,gpu=0,uuid=GPU-1,name=L4,arch=ada,cc=8.9,driver=550.54,cuda=12.4 util_gpu_pct={util:.1},mem_used_mb={mem:.0},temp_c={:.1},clock_sm_mhz={:.0},throttle_sw_thermal={}i,throttle_hw_thermal=0i,throttle_power_cap=0i,throttle_idle=0i {t}\n",
            if hot { n(70.0) } else { n(61.0) },
            if hot { 1000.0 } else { 1800.0 },
            i32::from(hot),
        ));
        let cpu = if spike && cause == Cause::Contention {
            n(95.0).min(100.0)
        } else {
            n(30.0)
        };
        out.push_str(&format!(
            "host cpu_pct={cpu:.1},mem_used_pct={:.1} {t}\n",
            n(45.0)
        ));
        out.push_str(&format!(
            "edgewatch_agent,version=0.1.0 uptime_s={}i {t}\n",
            (t - (now - 70 * MIN)) / S
        ));
        if t >= now - MIN {
            out.push_str(&format!(
                "gpu_process,gpu=0,uuid=GPU-1,pid=777,process=trtexec mem_used_mb=1500 {t}\n"
            ));
        }
        t += 10 * S;
    }
    out
}

/// The firing of `InferenceP99High` for yolov8n: pending 3 minutes ago, firing now.
fn firing(now: i64) -> Firing {
    let model: BTreeMap<String, String> = [("model".to_string(), "yolov8n".to_string())].into();
    Firing {
        rule: "InferenceP99High".into(),
        labels: model.clone(),
        measurement: Some("inference".into()),
        field: Some("wall_ms".into()),
        tags: model,
        window_ns: Some(MIN),
        value: Some(80.0),
        threshold: Some(40.0),
        active_since_ns: now - 3 * MIN,
        fired_ns: now,
    }
}

/// Stages `cause` in a new store (rolled up to the 1-minute tier when `rollup`), opens the
/// incident and returns its stored snapshot.
fn snapshot_of(cause: Cause, rollup: bool) -> J {
    snapshot_at(cause, rollup, 8 * MIN, firing).0
}

/// [`snapshot_of`] with a spike of the last `spike` ns and the firing `fire` makes of `now`;
/// returns the snapshot and `now`.
fn snapshot_at(cause: Cause, rollup: bool, spike: i64, fire: impl Fn(i64) -> Firing) -> (J, i64) {
    let dir = tempfile::tempdir().unwrap();
    let now = staged_now();
    let body = stage_spike(now, cause, spike);
    let parsed = parse_body(&body, Precision::Nanos, now);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let mut w = Writer::open(dir.path(), 10_000, Synchronous::Normal).unwrap();
    w.write(&[&parsed.batch]).unwrap();
    let opts = Options::new().unwrap();
    if rollup {
        let mut job = edgewatch::rollup::Job::open(dir.path(), opts.plan.clone()).unwrap();
        job.run_once(now, &|| false).unwrap();
    }
    let t0 = std::time::Instant::now();
    let fired = fire(now);
    let id = incident::open_with(dir.path(), &opts, &fired, now)
        .unwrap()
        .expect("an incident id");
    // The cost of one snapshot (80 min of a small device; with the 250 ms /proc sample).
    eprintln!(
        "incident open ({cause:?}, rollup {rollup}): {:?}",
        t0.elapsed()
    );
    let (conn, path) = edgewatch::store::open(dir.path(), Mode::Cursor).unwrap();
    let row = incidents::get(&conn, &path, id).unwrap().unwrap();
    assert_eq!(row.rule, fired.rule);
    assert_eq!(row.labels, fired.labels);
    assert_eq!((row.value, row.threshold), (fired.value, fired.threshold));
    assert_eq!(row.fired_ns, now);
    let snap: J = serde_json::from_str(row.snapshot.as_deref().unwrap()).unwrap();
    let first = snap["findings"][0]["message"].as_str().map(String::from);
    assert_eq!(row.top_finding, first, "{snap:#}");
    (snap, now)
}

fn keys(snap: &J) -> Vec<String> {
    snap["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].as_str().unwrap().to_string())
        .collect()
}

fn finding<'a>(snap: &'a J, key: &str) -> &'a J {
    snap["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["key"] == key)
        .unwrap_or_else(|| panic!("no {key} finding: {snap:#}"))
}

/// The keys the staged causes produce: none may show without its cause.
const CAUSED: [&str; 6] = [
    "inference.input_length.p99",
    "inference.input_length.p50",
    "gpu.thermal",
    "gpu.clock_sm_mhz",
    "event.start",
    "inference.model_version",
];

#[test]
fn a_flat_device_gives_no_findings_but_the_split_and_processes() {
    let snap = snapshot_of(Cause::Control, false);
    assert_eq!(snap["findings"], serde_json::json!([]), "{snap:#}");
    // The spike is outside GPU compute (gpu_ms flat), for yolov8n only.
    let split = &snap["split"];
    assert!(
        split["message"]
            .as_str()
            .unwrap()
            .contains("outside GPU compute"),
        "{split}"
    );
    assert!(split["inside_gpu_share"].as_f64().unwrap() < 0.1, "{split}");
    assert_eq!(snap["scope"]["model"], "yolov8n");
    // Every step found data to compare.
    for step in [
        "events",
        "gpu",
        "contention",
        "input",
        "thermal",
        "versions",
    ] {
        assert_eq!(snap["checked"][step], true, "{step}: {snap:#}");
    }
    // Processes: sampled from /proc at fire time, GPU memory from NVML's newest points.
    assert!(
        snap["processes"]["by_cpu"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["cpu_pct"].is_number()),
        "{snap:#}"
    );
    assert!(!snap["processes"]["by_cpu"].as_array().unwrap().is_empty());
    assert_eq!(snap["processes"]["by_gpu_mem"][0]["pid"], 777);
    assert_eq!(snap["processes"]["by_gpu_mem"][0]["name"], "trtexec");
    assert_eq!(snap["processes"]["by_gpu_mem"][0]["gpu_mem_mb"], 1500.0);
}

#[test]
fn larger_inputs_rank_first_read_from_the_tier_and_the_raw_tail() {
    let snap = snapshot_of(Cause::Inputs, true);
    let k = keys(&snap);
    // The window holds only the spike: p50 and p99 both moved 3x, either may lead.
    assert!(k[0].starts_with("inference.input_length.p"), "{snap:#}");
    assert!(k.contains(&"inference.input_length.p50".to_string()));
    assert!(k.contains(&"inference.input_length.p99".to_string()));
    let f = finding(&snap, "inference.input_length.p99");
    assert_eq!(f["scope"], "model=yolov8n");
    let ratio = f["window"].as_f64().unwrap() / f["baseline"].as_f64().unwrap();
    assert!((2.7..3.3).contains(&ratio), "{f}");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .starts_with("input_length p99 3.")
            || f["message"]
                .as_str()
                .unwrap()
                .starts_with("input_length p99 2.9x"),
        "{f}"
    );
    for other in &CAUSED[2..] {
        assert!(!k.contains(&other.to_string()), "{other}: {snap:#}");
    }
}

#[test]
fn a_hotter_throttled_gpu_is_a_thermal_finding() {
    let snap = snapshot_of(Cause::Hot, false);
    let k = keys(&snap);
    let f = finding(&snap, "gpu.thermal");
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.starts_with("GPU 0 p95 +") && msg.contains("thermal slowdown active"),
        "{msg}"
    );
    // 9 °C warmer through the whole window (which starts with the spike, 8 minutes ago),
    // compared at the p95 of each span.
    let warmer = f["window"].as_f64().unwrap() - f["baseline"].as_f64().unwrap();
    assert!((7.5..11.0).contains(&warmer), "{f}");
    assert_eq!(k[0], "gpu.thermal", "{snap:#}");
    assert!(k.contains(&"gpu.clock_sm_mhz".to_string()), "{snap:#}");
    for other in [
        "inference.input_length.p99",
        "event.start",
        "inference.model_version",
    ] {
        assert!(!k.contains(&other.to_string()), "{other}: {snap:#}");
    }
}

#[test]
fn a_restart_in_the_window_is_an_event_finding() {
    let snap = snapshot_of(Cause::Restart, false);
    let k = keys(&snap);
    assert_eq!(k, ["event.start"], "{snap:#}");
    let msg = finding(&snap, "event.start")["message"].as_str().unwrap();
    assert!(
        msg.starts_with("agent started in the window (version 0.1.0) · ") && msg.ends_with(" UTC"),
        "{msg}"
    );
    // The events of the window (and its lead) are listed.
    let ev = snap["events"].as_array().unwrap();
    assert_eq!(ev.len(), 1, "{snap:#}");
    assert_eq!(ev[0]["kind"], "start");
    assert_eq!(ev[0]["severity"], "info");
    assert_eq!(ev[0]["source"], "agent");
}

#[test]
fn a_model_version_change_is_flagged() {
    let snap = snapshot_of(Cause::Version, false);
    let k = keys(&snap);
    assert_eq!(k, ["inference.model_version"], "{snap:#}");
    let f = finding(&snap, "inference.model_version");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .starts_with("model_version of model yolov8n changed: 1 → 2 · "),
        "{f}"
    );
    assert_eq!(f["scope"], "model=yolov8n");
}

/// The firing of a spike of the last 3 minutes: pending 2 minutes ago, firing now.
fn short_firing(now: i64) -> Firing {
    Firing {
        active_since_ns: now - 2 * MIN,
        ..firing(now)
    }
}

/// The snapshot of a cause lasting only the last 3 minutes before the firing, after checking
/// its window: it starts with the spike (found from the latency), and every finding states
/// the interval it compared.
fn short_spike(cause: Cause) -> J {
    let (snap, now) = snapshot_at(cause, false, 3 * MIN, short_firing);
    assert_eq!(snap["window_from"], "latency", "{snap:#}");
    let note = snap["window_note"].as_str().unwrap();
    assert!(
        note.starts_with("inference wall_ms of model=yolov8n left its baseline"),
        "{note}"
    );
    let from = snap["window"]["from_ns"].as_i64().unwrap();
    assert!(
        (now - 4 * MIN..=now - 3 * MIN).contains(&from),
        "window from {}s before the firing: {snap:#}",
        (now - from) / S
    );
    assert_eq!(snap["window"]["to_ns"], now);
    assert_eq!(snap["baseline"]["to_ns"], from - 1);
    assert_eq!(snap["baseline"]["from_ns"], from - 60 * MIN);
    for f in snap["findings"].as_array().unwrap() {
        let msg = f["message"].as_str().unwrap();
        assert!(msg.ends_with(" UTC"), "{msg}");
        assert_eq!(f["window_to_ns"], now, "{f}");
        if f["step"] == "events" {
            assert_eq!(f["window_from_ns"], from - 2 * MIN, "{f}");
            assert!(f.get("baseline_from_ns").is_none(), "{f}");
        } else {
            assert_eq!(f["window_from_ns"], from, "{f}");
            assert_eq!(f["baseline_from_ns"], from - 60 * MIN, "{f}");
            assert_eq!(f["baseline_to_ns"], from - 1, "{f}");
        }
    }
    snap
}

/// `snap`'s first finding is `top`; the other keys are all among `also`.
fn ranked_first(snap: &J, top: &str, also: &[&str]) {
    let k = keys(snap);
    assert_eq!(k.first().map(String::as_str), Some(top), "{snap:#}");
    for other in &k[1..] {
        assert!(also.contains(&other.as_str()), "{other}: {snap:#}");
    }
}

#[test]
fn a_gpu_hotter_only_for_the_last_3_minutes_is_found() {
    let snap = short_spike(Cause::Hot);
    ranked_first(&snap, "gpu.thermal", &["gpu.clock_sm_mhz"]);
    let f = finding(&snap, "gpu.thermal");
    // 9 °C at the p95 of the 3-minute window (a 13-minute mean saw about 2 °C of it).
    let warmer = f["window"].as_f64().unwrap() - f["baseline"].as_f64().unwrap();
    assert!((7.5..11.0).contains(&warmer), "{f}");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .contains("thermal slowdown active"),
        "{f}"
    );
    assert!(keys(&snap).contains(&"gpu.clock_sm_mhz".to_string()));
}

#[test]
fn a_busier_fuller_gpu_for_the_last_3_minutes_is_found() {
    let snap = short_spike(Cause::GpuBusy);
    ranked_first(&snap, "gpu.util_gpu_pct", &["gpu.mem_used_mb"]);
    let u = finding(&snap, "gpu.util_gpu_pct");
    assert!(u["window"].as_f64().unwrap() >= 95.0, "{u}");
    let m = finding(&snap, "gpu.mem_used_mb");
    let ratio = m["window"].as_f64().unwrap() / m["baseline"].as_f64().unwrap();
    assert!((1.7..2.0).contains(&ratio), "{m}");
}

#[test]
fn contention_for_the_last_3_minutes_is_found() {
    let snap = short_spike(Cause::Contention);
    ranked_first(&snap, "host.cpu_pct", &[]);
    let f = finding(&snap, "host.cpu_pct");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .starts_with("host CPU p95 +6"),
        "{f}"
    );
}

#[test]
fn larger_inputs_for_the_last_3_minutes_are_found() {
    let snap = short_spike(Cause::Inputs);
    // p50 and p99 both moved 3x: either may lead.
    let top = keys(&snap)[0].clone();
    assert!(top.starts_with("inference.input_length.p"), "{snap:#}");
    ranked_first(
        &snap,
        &top,
        &["inference.input_length.p50", "inference.input_length.p99"],
    );
    let f = finding(&snap, "inference.input_length.p50");
    let ratio = f["window"].as_f64().unwrap() / f["baseline"].as_f64().unwrap();
    assert!((2.7..3.3).contains(&ratio), "{f}");
}

#[test]
fn a_restart_just_before_a_3_minute_spike_is_found() {
    let snap = short_spike(Cause::Restart);
    ranked_first(&snap, "event.start", &[]);
    let ev = snap["events"].as_array().unwrap();
    assert_eq!(ev.len(), 1, "{snap:#}");
    assert!(
        ev[0]["at_ns"].as_i64().unwrap() < snap["window"]["to_ns"].as_i64().unwrap() - 3 * MIN,
        "the restart precedes the spike: {snap:#}"
    );
}

#[test]
fn a_3_minute_spike_without_a_cause_reports_none() {
    let snap = short_spike(Cause::Control);
    assert_eq!(snap["findings"], serde_json::json!([]), "{snap:#}");
    assert_eq!(snap["events"], serde_json::json!([]), "{snap:#}");
    assert!(snap["split"]["message"]
        .as_str()
        .unwrap()
        .contains("outside GPU compute"));
}

/// A rule watching no latency (the GPU's temperature, a 1-minute window): the window is the
/// rule's own before the condition held; a rule without a window gets the longest one.
#[test]
fn a_rule_without_latency_compares_its_own_window() {
    let gpu_rule = |now: i64| Firing {
        rule: "GpuHot".into(),
        labels: [("gpu".to_string(), "0".to_string())].into(),
        measurement: Some("gpu".into()),
        field: Some("temp_c".into()),
        tags: [("gpu".to_string(), "0".to_string())].into(),
        window_ns: Some(MIN),
        value: Some(70.0),
        threshold: Some(65.0),
        active_since_ns: now - 2 * MIN,
        fired_ns: now,
    };
    let (snap, now) = snapshot_at(Cause::Hot, false, 3 * MIN, gpu_rule);
    assert_eq!(snap["window_from"], "rule_window", "{snap:#}");
    let note = snap["window_note"].as_str().unwrap();
    assert!(
        note.starts_with("gpu temp_c is not a latency; the rule's 1 min window"),
        "{note}"
    );
    let from = snap["window"]["from_ns"].as_i64().unwrap();
    assert_eq!(from, (now - 3 * MIN) / MIN * MIN, "{snap:#}");
    assert_eq!(keys(&snap)[0], "gpu.thermal", "{snap:#}");
    let no_window = |now: i64| Firing {
        measurement: None,
        field: None,
        window_ns: None,
        ..gpu_rule(now)
    };
    let (snap, now) = snapshot_at(Cause::Hot, false, 3 * MIN, no_window);
    assert_eq!(snap["window_from"], "lead", "{snap:#}");
    let from = snap["window"]["from_ns"].as_i64().unwrap();
    assert_eq!(from, (now - 12 * MIN) / MIN * MIN, "{snap:#}");
    // Diluted by 9 quiet minutes, the p95 still shows the hot 3.
    assert_eq!(keys(&snap)[0], "gpu.thermal", "{snap:#}");
}

// Collectors off: the test feeds every measurement itself.
const FED: &str =
    "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n";

/// The device's events around an incident firing at `now`: a critical Xid half an hour
/// before (outside the incident's window), an agent start 20 minutes before, a warning Xid
/// two minutes before (inside the window) and an informational process start a minute before.
fn device_events(now: i64) -> String {
    format!(
        "edgewatch_event,kind=xid,severity=critical,source=kernel message=\"NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus\",code=79i {}\n\
         edgewatch_event,kind=xid,severity=warning,source=kernel message=\"NVRM: Xid (PCI:0000:01:00): 31, pid=4242, name=trtexec\",code=31i,pid=4242i {}\n\
         edgewatch_event,kind=process_start,severity=info,source=process message=\"trtexec started (pid 4243)\",pid=4243i {}\n\
         edgewatch_event,kind=start,severity=info,source=agent,version=0.1.0 message=\"agent 0.1.0 started (pid 300)\",pid=300i {}\n",
        now - 30 * MIN,
        now - 2 * MIN,
        now - MIN,
        now - 20 * MIN
    )
}

/// An agent with the staged `Inputs` device fed through `/write` and one incident opened on
/// its store while it runs; returns the agent, the incident id and `now`.
fn agent_with_incident(dir: &Path) -> (Agent, i64, i64) {
    let agent = Agent::start(dir, FED);
    let now = staged_now();
    let mut body = stage_lines(now, Cause::Inputs);
    body.push_str(&device_events(now));
    for chunk in body.lines().collect::<Vec<_>>().chunks(2_000) {
        let (code, text) = post(&agent.url("/write"), chunk.join("\n").as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{text}");
    }
    let want = body.lines().count();
    let stored = wait_for(Duration::from_secs(10), || {
        let (_, t) = get(&agent.url("/api/v1/status")).ok()?;
        let st: J = serde_json::from_str(&t).ok()?;
        (st["ingest"]["points_written"].as_u64()? as usize >= want).then_some(())
    });
    assert!(stored.is_some(), "points not written");
    let opts = Options {
        cpu_sample: Duration::from_millis(50),
        ..Options::new().unwrap()
    };
    let id = incident::open_with(&agent.dir, &opts, &firing(now), now)
        .unwrap()
        .unwrap();
    (agent, id, now)
}

#[test]
fn the_incident_api_lists_and_shows_incidents_of_the_running_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, id, now) = agent_with_incident(dir.path());
    let (code, text) = get(&agent.url("/api/v1/incidents")).unwrap();
    assert_eq!(code, 200, "{text}");
    let list: J = serde_json::from_str(&text).unwrap();
    assert_eq!(list["truncated"], false);
    let inc = &list["incidents"][0];
    assert_eq!(inc["id"], id);
    assert_eq!(inc["rule"], "InferenceP99High");
    assert_eq!(inc["labels"]["model"], "yolov8n");
    assert_eq!(inc["value"], 80.0);
    assert_eq!(inc["fired_ns"], now);
    assert_eq!(inc["started_ns"], now - 3 * MIN);
    assert_eq!(inc["path"], format!("/#/incidents/{id}"));
    assert!(inc["resolved"].is_null());
    assert!(
        inc["top_finding"]
            .as_str()
            .unwrap()
            .starts_with("input_length p"),
        "{inc}"
    );
    assert!(inc.get("snapshot").is_none(), "listings carry no snapshot");
    // A range before the incident lists nothing.
    let (_, text) = get(&agent.url(&format!("/api/v1/incidents?to={}", now - MIN))).unwrap();
    let before: J = serde_json::from_str(&text).unwrap();
    assert_eq!(before["incidents"], serde_json::json!([]));
    // The full incident.
    let (code, text) = get(&agent.url(&format!("/api/v1/incidents/{id}"))).unwrap();
    assert_eq!(code, 200, "{text}");
    let full: J = serde_json::from_str(&text).unwrap();
    assert!(
        full["snapshot"]["findings"][0]["key"]
            .as_str()
            .unwrap()
            .starts_with("inference.input_length.p"),
        "{full}"
    );
    // The window starts where the latency left its baseline: the spike's first minute.
    let from = full["snapshot"]["window"]["from_ns"].as_i64().unwrap();
    assert!(
        (now - 9 * MIN..=now - 8 * MIN).contains(&from),
        "{}",
        full["snapshot"]
    );
    assert_eq!(full["snapshot"]["window_from"], "latency");
    // Unknown ids and bad parameters.
    for path in ["/api/v1/incidents/999999", "/api/v1/incidents/abc"] {
        let (code, text) = get(&agent.url(path)).unwrap();
        assert_eq!(code, 404, "{path}: {text}");
    }
    let (code, text) = get(&agent.url("/api/v1/incidents?limit=0")).unwrap();
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("limit"), "{text}");
}

#[test]
fn alerts_tab_and_incident_page_in_chromium() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web/alerts.mjs");
    assert!(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/web/node_modules/playwright-core")
            .exists(),
        "run: npm install --no-save --prefix tests/web playwright-core@1"
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, id, _now) = agent_with_incident(dir.path());
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/alerts-screenshot.png");
    let out = Command::new("node")
        .arg(&script)
        .arg(agent.url(""))
        .arg(id.to_string())
        .arg(&shot)
        .output()
        .expect("node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "alerts.mjs failed: {}\n{stdout}",
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
    // The only 404: the unknown incident (the agent has the alerts API; its first phase
    // answers from the real evaluator, the second from the page's mocks).
    let mut nf: Vec<&str> = r["notFound"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    nf.sort();
    assert_eq!(nf, ["/api/v1/incidents/999999"], "{r}");
    // The real evaluator, nothing firing: no badge, the tab says how many instances it
    // watches, and lists the stored incident.
    assert_eq!(r["noApi"]["badgeHidden"], true, "{r}");
    assert!(
        r["noApi"]["active"]
            .as_str()
            .unwrap_or("")
            .contains("No alert pending or firing"),
        "{r}"
    );
    let rows = r["noApi"]["incidents"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{r}");
    assert!(
        rows[0].as_str().unwrap().contains("InferenceP99High"),
        "{r}"
    );
    assert!(rows[0].as_str().unwrap().contains("input_length p"), "{r}");
    // With the alerts API (its contract's shape): firing badge on every tab, the active list
    // with a link to the incident, the history timeline.
    assert_eq!(r["badge"]["overview"], "2", "{r}");
    assert_eq!(r["badge"]["storage"], "2", "{r}");
    let active = r["active"].as_array().unwrap();
    assert_eq!(active.len(), 3, "{r}");
    assert!(active[0].as_str().unwrap().contains("firing"), "{r}");
    assert_eq!(r["activeLink"], format!("#/incidents/{id}"), "{r}");
    assert_eq!(r["history"].as_array().unwrap().len(), 2, "{r}");
    // The incident page: ranked findings next to the latency chart of that moment.
    let findings = r["page"]["findings"].as_array().unwrap();
    assert!(
        findings[0].as_str().unwrap().contains("input_length p"),
        "{r}"
    );
    assert!(
        r["page"]["title"]
            .as_str()
            .unwrap()
            .contains("InferenceP99High"),
        "{r}"
    );
    assert!(
        r["page"]["split"]
            .as_str()
            .unwrap()
            .contains("outside GPU compute"),
        "{r}"
    );
    let pts = r["page"]["chartPoints"].as_object().unwrap();
    assert!(pts.get("p99").and_then(J::as_i64).unwrap_or(0) >= 60, "{r}");
    assert!(r["page"]["band"].as_i64().unwrap_or(0) >= 1, "{r}");
    // The device's events on the overview's timeline: the two Xids as markers, critical red
    // and warning amber, the agent's own start in grey, never the informational process start.
    let ov = &r["overviewEvents"];
    let ratio = ov["ratio"].as_array().unwrap();
    let mut seen: Vec<String> = ratio
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m["kind"].as_str().unwrap(),
                m["severity"].as_str().unwrap()
            )
        })
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, ["start/info", "xid/critical", "xid/warning"], "{ov}");
    for m in ratio {
        let want = match m["severity"].as_str().unwrap() {
            "critical" => "rgb(239, 83, 80)",
            "warning" => "rgb(224, 165, 38)",
            _ => "rgb(141, 152, 165)",
        };
        assert_eq!(m["stroke"], want, "{m}");
    }
    let crit = ratio.iter().find(|m| m["severity"] == "critical").unwrap();
    assert!(
        crit["title"].as_str().unwrap().ends_with(
            "xid (critical, kernel): NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus"
        ),
        "{crit}"
    );
    // Every chart of the overview marks the critical one (flag charts too).
    let charts = ov["charts"].as_array().unwrap();
    assert!(charts.len() >= 4, "{ov}");
    assert!(charts.iter().all(|n| n == 1), "{ov}");
    assert!(
        ov["tip"].as_array().unwrap().iter().any(|t| t
            .as_str()
            .unwrap()
            .contains("xid: NVRM: Xid (PCI:0000:01:00): 79")),
        "{ov}"
    );
    // The incident page lists the events of its window (not the Xid half an hour before)
    // and marks them on its chart.
    let ev: Vec<&str> = r["page"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(ev.len(), 2, "{r}");
    assert!(
        ev[0].contains("xidwarningkernelNVRM: Xid (PCI:0000:01:00): 31, pid=4242, name=trtexec"),
        "{ev:?}"
    );
    assert!(
        ev[1].contains("process_startinfoprocesstrtexec started (pid 4243)"),
        "{ev:?}"
    );
    assert_eq!(
        r["page"]["eventMarkers"],
        serde_json::json!(["xid/warning"]),
        "{r}"
    );
    assert!(
        r["page"]["windowNote"]
            .as_str()
            .unwrap()
            .contains("left its baseline"),
        "{r}"
    );
    assert_eq!(r["page"]["missing"], "no incident 999999", "{r}");
    assert_eq!(r["page"]["bandsBefore"], 1, "{r}");
    assert_eq!(r["page"]["bandsAfter"], 0, "{r}");
    assert_eq!(r["page"]["tabOn"], "alerts", "{r}");
    // Links in the tables (incident ids, fired times) are readable on the dark theme: WCAG
    // contrast of at least 4.5 against their background (the browser's default link blue
    // there was 1.8).
    eprintln!("table links: {}", r["contrast"]);
    for table in ["incidents", "active"] {
        let links = r["contrast"][table].as_array().unwrap();
        assert!(!links.is_empty(), "no link in the {table} table: {r}");
        for l in links {
            let ratio = l["ratio"].as_f64().unwrap_or(0.0);
            assert!(ratio >= 4.5, "{table} table link contrast {ratio:.2}: {l}");
        }
    }
}

/// An agent evaluating every second, no collectors, no built-ins, with the rule `Hot`
/// (`m v > 5`, at once) when `hot`, else one that never fires.
fn alerting(dir: &Path, hot: bool) -> Agent {
    let rule = if hot {
        "[[alert]]\nname = \"Hot\"\nmeasurement = \"m\"\nfield = \"v\"\nagg = \"max\"\nwindow = \"5s\"\nop = \">\"\nthreshold = 5\nfor = \"0s\"\n"
    } else {
        "[[alert]]\nname = \"Never\"\nmeasurement = \"m\"\nfield = \"v\"\nagg = \"max\"\nwindow = \"5s\"\nop = \"<\"\nthreshold = -1000\nfor = \"0s\"\n"
    };
    Agent::start(
        dir,
        &format!(
            "{FED}[jetson]\nenabled = false\n[alerts]\ninterval = \"1s\"\nbuiltin = false\n{rule}"
        ),
    )
}

/// Every incident of the agent, oldest first, as `/api/v1/incidents` lists them.
fn incident_list(agent: &Agent) -> Vec<J> {
    let (code, text) = get(&agent.url("/api/v1/incidents")).unwrap();
    assert_eq!(code, 200, "{text}");
    let v: J = serde_json::from_str(&text).unwrap();
    let mut out = v["incidents"].as_array().unwrap().clone();
    out.reverse();
    out
}

/// Writes `m v=<value>` now.
fn feed(agent: &Agent, value: f64) {
    let _ = post(&agent.url("/write"), format!("m v={value}").as_bytes(), &[]);
}

/// `Hot`'s instance in `/api/v1/alerts`, if it is firing.
fn hot_firing(agent: &Agent) -> Option<J> {
    let (_, text) = get(&agent.url("/api/v1/alerts")).ok()?;
    let v: J = serde_json::from_str(&text).ok()?;
    v["alerts"]
        .as_array()?
        .iter()
        .find(|a| a["name"] == "Hot" && a["state"] == "firing")
        .cloned()
}

/// Evaluations done by the agent's evaluator so far.
fn evaluations(agent: &Agent) -> u64 {
    agent.status()["alerts"]["evaluations"]
        .as_u64()
        .unwrap_or(0)
}

/// Makes the store under `data` fail (`Some(table)`: a trigger aborts every insert into or
/// update of `table`, as a full disk would in the middle of a transaction) or stop failing.
fn inject(data: &Path, what: Option<(&str, &str)>) {
    let conn = rusqlite::Connection::open(data.join("edgewatch.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let sql = match what {
        Some((op, table)) => format!(
            "CREATE TRIGGER test_fail BEFORE {op} ON {table} BEGIN SELECT RAISE(ABORT, 'injected failure'); END;"
        ),
        None => "DROP TRIGGER IF EXISTS test_fail;".to_string(),
    };
    conn.execute_batch(&sql).unwrap();
}

/// The state commit of a firing fails for several evaluations in a row (the store refuses
/// the history row): no incident is left by any of them, and once the store works again
/// the firing is recorded with the only incident, which its notification names.
#[test]
fn a_failing_state_commit_leaves_one_incident_per_firing() {
    let dir = tempfile::tempdir().unwrap();
    let agent = alerting(dir.path(), true);
    inject(&agent.dir, Some(("INSERT", "alert_history")));
    let failed = wait_for(Duration::from_secs(20), || {
        feed(&agent, 10.0);
        let st = agent.status();
        let err = st["alerts"]["store_error"]
            .as_str()
            .unwrap_or("")
            .to_string();
        std::thread::sleep(Duration::from_millis(200));
        err.contains("injected failure").then_some(())
    });
    assert!(failed.is_some(), "no failed commit:\n{}", agent.log_text());
    // Three more failing evaluations.
    let n = evaluations(&agent);
    wait_for(Duration::from_secs(20), || {
        feed(&agent, 10.0);
        std::thread::sleep(Duration::from_millis(200));
        (evaluations(&agent) >= n + 3).then_some(())
    })
    .expect("evaluations while the store fails");
    assert!(
        hot_firing(&agent).is_none(),
        "the firing is not recorded yet"
    );
    inject(&agent.dir, None);
    let hot = wait_for(Duration::from_secs(20), || {
        feed(&agent, 10.0);
        std::thread::sleep(Duration::from_millis(200));
        hot_firing(&agent).filter(|a| a["incident_id"].is_i64())
    })
    .unwrap_or_else(|| panic!("Hot not firing with an incident:\n{}", agent.log_text()));
    // A few evaluations later, still one incident: the one the instance names.
    let n = evaluations(&agent);
    wait_for(Duration::from_secs(20), || {
        feed(&agent, 10.0);
        std::thread::sleep(Duration::from_millis(200));
        (evaluations(&agent) >= n + 2).then_some(())
    })
    .expect("evaluations after the store recovered");
    let list = incident_list(&agent);
    let ids: Vec<&J> = list.iter().map(|i| &i["id"]).collect();
    assert_eq!(
        ids,
        [&hot["incident_id"]],
        "one firing, one incident: {list:?}"
    );
    assert_eq!(agent.status()["alerts"]["store_error"], J::Null);
    // The notification names it.
    let conn = rusqlite::Connection::open(agent.dir.join("edgewatch.db")).unwrap();
    let events: Vec<J> = conn
        .prepare("SELECT event FROM alert_outbox ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|e| serde_json::from_str(&e.unwrap()).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["incident_id"], hot["incident_id"]);
    agent.terminate();
}

/// The resolve of a firing alert cannot be stored (the store refuses the incident's
/// update, as a crash right after the alert's own commit would leave it with older
/// versions); the agent stops, the store recovers, and at the next start the alert, whose
/// condition ended while the agent was down, resolves and its incident is closed.
#[test]
fn an_incident_whose_alert_ended_while_the_agent_was_down_is_closed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let agent = alerting(dir.path(), true);
    let hot = wait_for(Duration::from_secs(20), || {
        feed(&agent, 10.0);
        std::thread::sleep(Duration::from_millis(200));
        hot_firing(&agent).filter(|a| a["incident_id"].is_i64())
    })
    .unwrap_or_else(|| panic!("Hot not firing with an incident:\n{}", agent.log_text()));
    let id = hot["incident_id"].clone();
    inject(&agent.dir, Some(("UPDATE", "incidents")));
    // The value drops; once the window holds no high value the evaluator resolves the alert
    // (and, storing it, fails on the incident).
    let resolving = wait_for(Duration::from_secs(30), || {
        feed(&agent, 1.0);
        std::thread::sleep(Duration::from_millis(200));
        let failed = agent.status()["alerts"]["store_error"]
            .as_str()
            .is_some_and(|e| e.contains("injected failure"));
        (failed || hot_firing(&agent).is_none()).then_some(())
    });
    assert!(
        resolving.is_some(),
        "Hot never resolved:\n{}",
        agent.log_text()
    );
    let data = agent.dir.clone();
    agent.terminate();
    inject(&data, None);
    let agent = alerting(dir.path(), true);
    let closed = wait_for(Duration::from_secs(20), || {
        feed(&agent, 1.0);
        std::thread::sleep(Duration::from_millis(200));
        incident_list(&agent)
            .into_iter()
            .find(|i| i["id"] == id)
            .filter(|i| !i["resolved"].is_null())
    });
    assert!(
        closed.is_some(),
        "incident {id} still open after the restart: {:?}\n{}",
        incident_list(&agent),
        agent.log_text()
    );
    assert!(hot_firing(&agent).is_none());
    assert_eq!(incident_list(&agent).len(), 1);
    agent.terminate();
}

/// An incident whose rule was removed from the configuration while the agent was down is
/// closed at the next start (its alert no longer exists to resolve it).
#[test]
fn an_incident_of_a_rule_removed_while_the_agent_was_down_is_closed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let agent = alerting(dir.path(), true);
    let hot = wait_for(Duration::from_secs(20), || {
        feed(&agent, 10.0);
        std::thread::sleep(Duration::from_millis(200));
        hot_firing(&agent).filter(|a| a["incident_id"].is_i64())
    })
    .unwrap_or_else(|| panic!("Hot not firing with an incident:\n{}", agent.log_text()));
    agent.terminate();
    let agent = alerting(dir.path(), false);
    let closed = wait_for(Duration::from_secs(20), || {
        incident_list(&agent)
            .into_iter()
            .find(|i| i["id"] == hot["incident_id"])
            .filter(|i| !i["resolved"].is_null())
    });
    assert!(
        closed.is_some(),
        "incident still open: {:?}\n{}",
        incident_list(&agent),
        agent.log_text()
    );
    agent.terminate();
}
