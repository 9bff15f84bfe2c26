//! Alert rules on the real binary: evaluated every second over short windows, read back
//! through `/api/v1/alerts`, the history, `/metrics` (`ALERTS`, checked by promtool),
//! `edgewatch alerts`, and the store's outbox (read with SQLite, as the notifiers read it).
//! A spike fires after `for` and resolves, per `group_by` instance; a kill -9 while firing
//! keeps the instance firing with its start and enqueues no second firing; `no_data` modes;
//! `ratio_of`; every built-in rule tripped by the data that should trip it (the NVML stand-in,
//! a tegrastats replay, a dead sink, a rejected line, a tiny disk budget, an unset clock)
//! and quiet on an ordinary agent; malformed rules refused with key and line.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::support::{get, get_with, points_in_file, post, wait_for, Agent};

/// The base of every agent here: no collectors, 1 s evaluations, no built-ins (a test that
/// wants them turns them on).
const BASE: &str = "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n[jetson]\nenabled = false\n[alerts]\ninterval = \"1s\"\nbuiltin = false\n";

fn alerts(agent: &Agent) -> Vec<Value> {
    let (code, body) = get(&agent.url("/api/v1/alerts")).expect("alerts");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["alerts"].as_array().unwrap().clone()
}

/// The instances of `rule` (by name) whose labels include `labels`.
fn instance(agent: &Agent, rule: &str, labels: &[(&str, &str)]) -> Option<Value> {
    alerts(agent)
        .into_iter()
        .find(|a| a["name"] == rule && labels.iter().all(|(k, v)| a["labels"][*k] == *v))
}

fn state_of(agent: &Agent, rule: &str, labels: &[(&str, &str)]) -> String {
    instance(agent, rule, labels)
        .map(|a| a["state"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// Waits until `rule`'s instance with `labels` is in `state`; panics with the answer if not.
fn wait_state(agent: &Agent, rule: &str, labels: &[(&str, &str)], state: &str, secs: u64) -> Value {
    wait_for(Duration::from_secs(secs), || {
        instance(agent, rule, labels).filter(|a| a["state"] == state)
    })
    .unwrap_or_else(|| {
        panic!(
            "{rule} {labels:?} not {state} in {secs} s: {:?}\n{}",
            alerts(agent),
            agent.log_text()
        )
    })
}

/// The outbox as the notifiers read it: (status, event) in order.
fn outbox(dir: &Path) -> Vec<Value> {
    let conn = rusqlite::Connection::open_with_flags(
        dir.join("edgewatch.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut st = conn
        .prepare("SELECT event FROM alert_outbox ORDER BY seq")
        .unwrap();
    let rows = st
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|r| serde_json::from_str(&r.unwrap()).unwrap())
        .collect();
    rows
}

fn history(agent: &Agent) -> Vec<Value> {
    let (code, body) = get(&agent.url("/api/v1/alerts/history?from=-1h")).unwrap();
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["history"].as_array().unwrap().clone()
}

/// Writes `line_of(value)` every 100 ms, the value read from a shared cell, to whatever URL
/// the shared cell holds (so it can follow a restarted agent), until dropped.
struct Feeder {
    values: Arc<Mutex<BTreeMap<String, f64>>>,
    url: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Feeder {
    /// `series` -> value: each tick writes `series value=<v>` (series = `m,tags field`).
    fn start(agent: &Agent) -> Feeder {
        let values: Arc<Mutex<BTreeMap<String, f64>>> = Arc::default();
        let url = Arc::new(Mutex::new(agent.url("/write")));
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (v, u, s, n) = (values.clone(), url.clone(), stop.clone(), sent.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let body: String = v
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(k, x)| format!("{k}={x}\n"))
                    .collect();
                if !body.is_empty() {
                    let target = u.lock().unwrap().clone();
                    if matches!(post(&target, body.as_bytes(), &[]), Ok((204, _))) {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Feeder {
            values,
            url,
            stop,
            sent,
            thread: Some(thread),
        }
    }

    fn set(&self, series_field: &str, v: f64) {
        self.values.lock().unwrap().insert(series_field.into(), v);
    }

    fn remove(&self, series_field: &str) {
        self.values.lock().unwrap().remove(series_field);
    }

    fn follow(&self, agent: &Agent) {
        *self.url.lock().unwrap() = agent.url("/write");
    }

    /// Waits until `n` more writes went through.
    fn wait_writes(&self, n: u64) {
        let target = self.sent.load(Ordering::Relaxed) + n;
        wait_for(Duration::from_secs(10), || {
            (self.sent.load(Ordering::Relaxed) >= target).then_some(())
        })
        .expect("feeder writes");
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const SPIKE_RULE: &str = r#"
[[alert]]
name = "P99High"
measurement = "inference"
field = "wall_ms"
group_by = ["model"]
agg = "p99"
window = "4s"
op = ">"
threshold = 50.0
for = "2s"
severity = "critical"
summary = "p99 of {model} is {value} ms (threshold {threshold})"
labels = { team = "vision" }
"#;

/// A latency spike on one model: pending, then firing after `for`, then resolved once the
/// window holds only normal latencies; the other model's instance stays inactive. The
/// history, the outbox (firing then resolved, one instance), `/metrics` and the CLI agree.
/// The status as stored (`X-Edgewatch-Read: stored`): reading it commits nothing.
fn stored_status(agent: &Agent) -> Value {
    let (code, body) = get_with(
        &agent.url("/api/v1/status"),
        &[("X-Edgewatch-Read", "stored")],
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Rules read the points the writer holds for its next commit (`[ingest] flush_interval`,
/// here a minute) with the store's: a held point is seen by the next cycle, and cycle after
/// cycle commits nothing (the writer's commit count and the database file stay as they
/// were). A held spike that fires the rule is committed before the incident is opened, so
/// the incident's snapshot, which reads the store, holds it; the incident's own point is
/// committed at once, for the sinks.
#[test]
fn rules_see_held_points_without_a_commit_and_a_firing_commits_them_first() {
    let dir = tempfile::tempdir().unwrap();
    let rule = "[[alert]]\nname = \"HeldHigh\"\nmeasurement = \"held_alert\"\nfield = \"v\"\nagg = \"max\"\nwindow = \"30s\"\nop = \">\"\nthreshold = 5\nfor = \"0s\"\n";
    let agent = Agent::start(
        dir.path(),
        &format!("{BASE}[ingest]\nflush_interval = \"60s\"\n{rule}"),
    );
    let evaluations = || {
        stored_status(&agent)["alerts"]["evaluations"]
            .as_u64()
            .unwrap_or(0)
    };
    let commits = || stored_status(&agent)["ingest"]["commits"].as_u64().unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || (evaluations() >= 1)
            .then_some(()))
        .is_some(),
        "no evaluation: {}",
        agent.log_text()
    );
    let before = commits();
    let in_file = || points_in_file(&agent.dir.join("edgewatch.db"), "held_alert");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64
    };
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let send = |v: f64| {
        sock.send_to(
            format!("held_alert,app=x v={v} {}\n", now()).as_bytes(),
            agent.udp,
        )
        .unwrap()
    };
    send(1.0);
    let seen = wait_for(Duration::from_secs(10), || {
        instance(&agent, "HeldHigh", &[]).filter(|a| a["value"] == 1.0)
    });
    assert!(
        seen.is_some(),
        "the held point is not seen: {:?}",
        alerts(&agent)
    );
    let then = evaluations();
    assert!(
        wait_for(Duration::from_secs(15), || (evaluations() >= then + 3)
            .then_some(()))
        .is_some(),
        "evaluations stopped"
    );
    assert_eq!(
        commits(),
        before,
        "an alert cycle committed the held points"
    );
    assert_eq!(in_file(), 0, "an alert cycle committed the held points");
    // The spike fires the rule; its cycle commits what is held first.
    send(9.0);
    let firing = wait_state(&agent, "HeldHigh", &[], "firing", 10);
    assert_eq!(firing["value"], 9.0, "{firing}");
    assert_eq!(
        in_file(),
        2,
        "the firing's points were not committed before it"
    );
    assert!(commits() > before);
    // Its `edgewatch_incident` point is committed at once (for the sinks), not held a
    // minute.
    let db = agent.dir.join("edgewatch.db");
    assert!(
        wait_for(Duration::from_secs(10), || {
            (points_in_file(&db, "edgewatch_incident") >= 1).then_some(())
        })
        .is_some(),
        "the incident's point is still held"
    );
    let id = firing["incident_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("no incident: {firing}"));
    let (code, body) = get(&agent.url(&format!("/api/v1/incidents/{id}"))).unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("held_alert"), "{body}");
}

#[test]
fn a_spike_fires_after_for_and_resolves_per_group() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_with_env(
        dir.path(),
        &format!("[tags]\nsite = \"lab\"\n{BASE}{SPIKE_RULE}"),
        &[("EDGEWATCH_DEVICE_ID", "dev-1")],
    );
    let feed = Feeder::start(&agent);
    feed.set("inference,model=a wall_ms", 10.0);
    feed.set("inference,model=b wall_ms", 12.0);
    wait_state(&agent, "P99High", &[("model", "a")], "inactive", 10);
    wait_state(&agent, "P99High", &[("model", "b")], "inactive", 10);
    feed.set("inference,model=a wall_ms", 100.0);
    let pending = wait_state(&agent, "P99High", &[("model", "a")], "pending", 10);
    let firing = wait_state(&agent, "P99High", &[("model", "a")], "firing", 10);
    assert_eq!(pending["active_since"], firing["active_since"]);
    assert_eq!(firing["value"], 100.0);
    assert_eq!(firing["labels"]["team"], "vision");
    assert_eq!(firing["labels"]["severity"], "critical");
    assert_eq!(state_of(&agent, "P99High", &[("model", "b")]), "inactive");

    // Exposed as Prometheus exposes its own alerts, in a valid exposition.
    let (_, metrics) = get(&agent.url("/metrics")).unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("ALERTS{"))
        .unwrap_or_else(|| panic!("no ALERTS:\n{metrics}"));
    for part in [
        "alertname=\"P99High\"",
        "alertstate=\"firing\"",
        "model=\"a\"",
        "team=\"vision\"",
    ] {
        assert!(line.contains(part), "{line}");
    }
    assert!(line.ends_with("} 1"), "{line}");
    assert!(!metrics.contains("model=\"b\",severity"), "{metrics}");
    crate::support::promtool_check(&metrics);
    // The status summary.
    let st = agent.status();
    assert_eq!(st["alerts"]["firing"], 1, "{}", st["alerts"]);
    assert!(st["alerts"]["last_duration_ms"].as_f64().is_some());
    // The CLI prints it.
    let out = std::process::Command::new(crate::support::bin())
        .args(["alerts", "--url", &agent.url("")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let first = text.lines().nth(1).unwrap_or_default();
    assert!(
        first.starts_with("P99High") && first.contains("FIRING") && first.contains("model=a"),
        "{text}"
    );

    feed.set("inference,model=a wall_ms", 10.0);
    wait_state(&agent, "P99High", &[("model", "a")], "inactive", 10);

    let h: Vec<(String, String)> = history(&agent)
        .iter()
        .filter(|r| r["labels"]["model"] == "a")
        .map(|r| {
            (
                r["transition"].as_str().unwrap().to_string(),
                r["time"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let kinds: Vec<&str> = h.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["pending", "firing", "resolved"], "{h:?}");
    let t = |s: &str| humantime::parse_rfc3339(s).unwrap();
    let held = t(&h[1].1).duration_since(t(&h[0].1)).unwrap();
    assert!(
        held >= Duration::from_secs(2),
        "fired after {held:?}, for = 2s"
    );

    let events = outbox(&agent.dir);
    let st: Vec<&str> = events
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(st, ["firing", "resolved"], "{events:?}");
    let (f, r) = (&events[0], &events[1]);
    assert_eq!(f["fingerprint"], r["fingerprint"]);
    assert_eq!(f["starts_at_ns"], r["starts_at_ns"]);
    assert!(f["ends_at_ns"].is_null());
    assert!(r["ends_at_ns"].as_i64().unwrap() > f["starts_at_ns"].as_i64().unwrap());
    let labels = &f["labels"];
    for (k, v) in [
        ("alertname", "P99High"),
        ("severity", "critical"),
        ("device_id", "dev-1"),
        ("site", "lab"),
        ("model", "a"),
        ("team", "vision"),
    ] {
        assert_eq!(labels[k], v, "{labels}");
    }
    assert_eq!(
        f["annotations"]["summary"],
        "p99 of a is 100 ms (threshold 50)"
    );
    assert_eq!(f["annotations"]["value"], "100");
}

/// kill -9 while firing: after the restart the instance is still firing with its original
/// start, the outbox holds one firing event only, and the resolve after recovery is
/// enqueued with the original start.
#[test]
fn a_firing_alert_survives_kill_9_and_still_resolves() {
    let dir = tempfile::tempdir().unwrap();
    let rule = "[[alert]]\nname = \"Hot\"\nmeasurement = \"m\"\nfield = \"v\"\nagg = \"max\"\nwindow = \"5s\"\nop = \">\"\nthreshold = 5\nfor = \"0s\"\n";
    let agent = Agent::start(dir.path(), &format!("{BASE}{rule}"));
    let feed = Feeder::start(&agent);
    feed.set("m v", 10.0);
    let before = wait_state(&agent, "Hot", &[], "firing", 10);
    agent.kill9();
    let agent = Agent::start(dir.path(), &format!("{BASE}{rule}"));
    feed.follow(&agent);
    // A few evaluations after the restart.
    agent.wait_evaluations(3, "evaluations after restart");
    let after = wait_state(&agent, "Hot", &[], "firing", 5);
    assert_eq!(after["active_since"], before["active_since"]);
    let firing: Vec<Value> = outbox(&agent.dir)
        .into_iter()
        .filter(|e| e["status"] == "firing")
        .collect();
    assert_eq!(firing.len(), 1, "{firing:?}");
    feed.set("m v", 1.0);
    feed.wait_writes(2);
    wait_state(&agent, "Hot", &[], "inactive", 15);
    let events = outbox(&agent.dir);
    let st: Vec<&str> = events
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(st, ["firing", "resolved"]);
    assert_eq!(events[0]["starts_at_ns"], events[1]["starts_at_ns"]);
}

/// `no_data`: an empty window is fine (`ok`), keeps a firing instance firing (`keep`), or is
/// itself the alert (`firing`).
#[test]
fn no_data_modes() {
    let dir = tempfile::tempdir().unwrap();
    let rule = |name: &str, m: &str, mode: &str| {
        format!("[[alert]]\nname = \"{name}\"\nmeasurement = \"{m}\"\nfield = \"v\"\nagg = \"max\"\nwindow = \"1s\"\nop = \">\"\nthreshold = 5\nno_data = \"{mode}\"\n")
    };
    let agent = Agent::start(
        dir.path(),
        &format!(
            "{BASE}{}{}{}{}",
            rule("SilentOk", "silent", "ok"),
            rule("SilentFiring", "silent", "firing"),
            rule("FlakyOk", "flaky", "ok"),
            rule("FlakyKeep", "flaky", "keep"),
        ),
    );
    let feed = Feeder::start(&agent);
    let silent = wait_state(&agent, "SilentFiring", &[], "firing", 10);
    assert!(silent["value"].is_null(), "{silent}");
    feed.set("flaky v", 10.0);
    wait_state(&agent, "FlakyOk", &[], "firing", 10);
    wait_state(&agent, "FlakyKeep", &[], "firing", 10);
    feed.remove("flaky v");
    wait_state(&agent, "FlakyOk", &[], "inactive", 10);
    // Two more evaluations over an empty window: `keep` holds.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(state_of(&agent, "FlakyKeep", &[]), "firing");
    assert_eq!(state_of(&agent, "SilentOk", &[]), "inactive");
    assert_eq!(state_of(&agent, "SilentFiring", &[]), "firing");
}

/// `ratio_of` (a user's P99/P50) and the built-ins `InferenceLatencyRatioHigh` and
/// `LlmTtftRatioHigh` on the same long tail: 1 in 10 requests 10x slower gives P99/P50 = 10;
/// a steady model stays quiet. A user's rule on the `llm` measurement (TTFT p99 above a
/// threshold, docs/alerts.md's example) works like any other.
#[test]
fn ratio_of_and_the_builtin_latency_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = format!(
        "{BASE}builtin = true\nbuiltin_for = \"0s\"\nlatency_ratio_window = \"3s\"\nlatency_ratio_for = \"0s\"\n\
         [[alert]]\nname = \"TailRatio\"\nmeasurement = \"inference\"\nfield = \"wall_ms\"\ngroup_by = [\"model\"]\nagg = \"p99\"\nratio_of = \"p50\"\nwindow = \"3s\"\nop = \">\"\nthreshold = 5\n\
         [[alert]]\nname = \"LlmTtftP99High\"\nmeasurement = \"llm\"\nfield = \"ttft_ms\"\ngroup_by = [\"model\"]\nagg = \"p99\"\nwindow = \"3s\"\nop = \">\"\nthreshold = 1500\n"
    );
    let agent = Agent::start(dir.path(), &cfg);
    // 10 points per write, one 100 ms among nine 10 ms, for model `tail`; `flat` all 10.
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut fired = None;
    while std::time::Instant::now() < deadline {
        let t = now();
        let mut body = String::new();
        for i in 0..10i64 {
            let v = if i == 0 { 100 } else { 10 };
            body.push_str(&format!("inference,model=tail wall_ms={v} {}\n", t + i));
            body.push_str(&format!("inference,model=flat wall_ms=10 {}\n", t + i));
            // TTFT in ms: the tail model's slow one is over the 1.5 s threshold.
            let ttft = if i == 0 { 2000 } else { 200 };
            body.push_str(&format!(
                "llm,model=tail ttft_ms={ttft},e2e_ms=3000 {}\n",
                t + i
            ));
            body.push_str(&format!(
                "llm,model=flat ttft_ms=200,e2e_ms=3000 {}\n",
                t + i
            ));
        }
        assert_eq!(
            post(&agent.url("/write"), body.as_bytes(), &[]).unwrap().0,
            204
        );
        let a = instance(&agent, "TailRatio", &[("model", "tail")]);
        let b = instance(&agent, "InferenceLatencyRatioHigh", &[("model", "tail")]);
        let c = instance(&agent, "LlmTtftRatioHigh", &[("model", "tail")]);
        let d = instance(&agent, "LlmTtftP99High", &[("model", "tail")]);
        if let (Some(a), Some(b), Some(c), Some(d)) = (a, b, c, d) {
            if [&a, &b, &c, &d].iter().all(|x| x["state"] == "firing") {
                fired = Some((a, b, c, d));
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (a, b, c, d) = fired.unwrap_or_else(|| panic!("not firing: {:?}", alerts(&agent)));
    assert_eq!(a["value"], 10.0, "{a}");
    assert_eq!(b["value"], 10.0, "{b}");
    assert_eq!(c["value"], 10.0, "{c}");
    assert_eq!(d["value"], 2000.0, "{d}");
    for rule in ["LlmTtftRatioHigh", "LlmTtftP99High"] {
        assert_eq!(state_of(&agent, rule, &[("model", "flat")]), "inactive");
    }
    assert_eq!(
        state_of(&agent, "TailRatio", &[("model", "flat")]),
        "inactive"
    );
    assert_eq!(
        state_of(&agent, "InferenceLatencyRatioHigh", &[("model", "flat")]),
        "inactive"
    );
}

/// The firing built-ins of an agent, as (rule, labels).
fn firing_builtins(agent: &Agent) -> Vec<(String, Value)> {
    alerts(agent)
        .into_iter()
        .filter(|a| a["state"] == "firing" && a["builtin"] == true)
        .map(|a| (a["name"].as_str().unwrap().to_string(), a["labels"].clone()))
        .collect()
}

/// An ordinary agent (every collector that runs here, built-ins on with no delay) fires
/// no built-in.
#[test]
fn builtins_stay_quiet_on_an_ordinary_agent() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        "[alerts]\ninterval = \"1s\"\nbuiltin_for = \"0s\"\nlatency_ratio_for = \"0s\"\nclock_unset_for = \"0s\"\n",
    );
    let feed = Feeder::start(&agent);
    feed.set("inference,model=a wall_ms", 10.0);
    agent.wait_evaluations(3, "evaluations");
    assert_eq!(firing_builtins(&agent), vec![]);
    let st = agent.status();
    assert_eq!(st["alerts"]["rules"], 14, "{}", st["alerts"]);
    assert_eq!(st["alerts"]["rule_errors"], serde_json::json!([]));
}

/// A dead sink whose backlog ages past `sink_backlog_age`, and a rejected line: each fires
/// its built-in, with the sink named.
#[test]
fn builtins_fire_on_a_stale_sink_and_rejected_points() {
    let dir = tempfile::tempdir().unwrap();
    let dead = crate::support::free_port();
    let agent = Agent::start(
        dir.path(),
        &format!(
            "{BASE}builtin = true\nbuiltin_for = \"0s\"\nsink_backlog_age = \"2s\"\n\
             [[sink]]\ntype = \"influxdb\"\nname = \"dead\"\nurl = \"http://127.0.0.1:{dead}\"\nversion = 1\ndatabase = \"x\"\n"
        ),
    );
    assert!(firing_builtins(&agent)
        .iter()
        .all(|(n, _)| n != "AgentDroppingPoints"));
    assert_eq!(post(&agent.url("/write"), b"m v=1\n", &[]).unwrap().0, 204);
    let (code, _) = post(&agent.url("/write"), b"m v=\n", &[]).unwrap();
    assert_ne!(code, 204);
    let sink = wait_state(
        &agent,
        "SinkBacklogStale",
        &[("sink", "dead")],
        "firing",
        15,
    );
    assert!(sink["value"].as_f64().unwrap() > 2.0, "{sink}");
    wait_state(&agent, "AgentDroppingPoints", &[], "firing", 10);
    assert_eq!(state_of(&agent, "StoreNearDiskBudget", &[]), "inactive");
}

/// The clock earlier than `[clock] min_valid` fires `ClockNotSet` after `clock_unset_for`,
/// and a store over its (tiny) disk budget fires `StoreNearDiskBudget`.
#[test]
fn builtin_fires_while_the_clock_is_not_set() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &format!("{BASE}builtin = true\nbuiltin_for = \"0s\"\nclock_unset_for = \"1s\"\n[clock]\nmin_valid = \"2100-01-01T00:00:00Z\"\n[retention]\nmax_bytes = 4096\n"),
    );
    wait_state(&agent, "ClockNotSet", &[], "pending", 10);
    wait_state(&agent, "ClockNotSet", &[], "firing", 10);
    let b = wait_state(&agent, "StoreNearDiskBudget", &[], "firing", 10);
    assert!(b["value"].as_f64().unwrap() > 90.0, "{b}");
    assert_eq!(state_of(&agent, "SinkBacklogStale", &[]), "inactive");
}

/// NVML through the stand-in library: GPU 0 in thermal slowdown and 3 °C under its
/// slowdown temperature fires both GPU built-ins for `gpu=0`; GPU 1 (idle, cool) fires none.
#[test]
fn builtins_fire_on_nvml_throttling_and_temperature() {
    let lib = crate::nvml_stub::new_lib();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.txt");
    std::fs::write(
        &scenario,
        "driver 550.54.15\ncuda 12040\ngpus 2\n\
         gpu 0 name NVIDIA A2\ngpu 0 uuid GPU-a\ngpu 0 utilization 90 20\n\
         gpu 0 temperature 87\ngpu 0 temp_slowdown 90\ngpu 0 throttle_reasons 32\n\
         gpu 1 name NVIDIA A2\ngpu 1 uuid GPU-b\ngpu 1 utilization 0 0\n\
         gpu 1 temperature 40\ngpu 1 temp_slowdown 90\ngpu 1 throttle_reasons 5\n",
    )
    .unwrap();
    let cfg = BASE.replace(
        "[nvml]\nenabled = false\n",
        "[nvml]\ninterval = \"200ms\"\n",
    );
    let agent = Agent::start_with_env(
        dir.path(),
        &format!("{cfg}builtin = true\nbuiltin_for = \"0s\"\n"),
        &[
            ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
            ("NVML_STUB_SCENARIO", scenario.to_str().unwrap()),
        ],
    );
    let t = wait_state(&agent, "GpuThrottling", &[("gpu", "0")], "firing", 15);
    assert_eq!(t["value"], 1.0);
    let m = wait_state(
        &agent,
        "GpuTemperatureNearSlowdown",
        &[("gpu", "0")],
        "firing",
        15,
    );
    assert_eq!(m["value"], 3.0);
    // GPU 1: idle (0x1) and power cap (0x4) are not a slowdown; 50 °C of margin.
    assert_eq!(
        state_of(&agent, "GpuThrottling", &[("gpu", "1")]),
        "inactive"
    );
    assert_eq!(
        state_of(&agent, "GpuTemperatureNearSlowdown", &[("gpu", "1")]),
        "inactive"
    );
}

/// A replayed AGX Orin tegrastats log: the zones above the limit (cpu and tj at 52.3 °C)
/// fire, the cooler ones (soc0-2, 48-49.5 °C) do not.
#[test]
fn builtin_fires_on_a_hot_jetson_zone() {
    let dir = tempfile::tempdir().unwrap();
    let log = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tegrastats/agx-orin-jp6.log");
    let cfg = BASE.replace(
        "[tegrastats]\nenabled = false\n",
        &format!(
            "[tegrastats]\npath = \"/nonexistent/tegrastats\"\nreplay = \"{}\"\ninterval = \"100ms\"\n",
            log.display()
        ),
    );
    let agent = Agent::start(
        dir.path(),
        &format!("{cfg}builtin = true\nbuiltin_for = \"0s\"\njetson_temp_limit_c = 50.5\n"),
    );
    let cpu = wait_state(
        &agent,
        "JetsonTemperatureHigh",
        &[("zone", "cpu")],
        "firing",
        15,
    );
    assert!(cpu["value"].as_f64().unwrap() > 50.5, "{cpu}");
    wait_state(
        &agent,
        "JetsonTemperatureHigh",
        &[("zone", "tj")],
        "firing",
        10,
    );
    for zone in ["soc0", "soc1", "soc2"] {
        assert_eq!(
            state_of(&agent, "JetsonTemperatureHigh", &[("zone", zone)]),
            "inactive",
            "{zone}"
        );
    }
}

/// `check-config` refuses a malformed rule naming the key and the line.
#[test]
fn malformed_rules_are_refused_with_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = "[[alert]]\nname = \"A\"\nmeasurement = \"m\"\nfield = \"f\"\nagg = \"max\"\nwindow = \"1m\"\nop = \">\"\nthreshold = 1\n";
    for (bad, key, line) in [
        (good.replace("agg = \"max\"", "agg = \"p1000x\""), "agg", 5),
        (good.replace("op = \">\"", "op = \"~\""), "op", 7),
        (
            good.replace("window = \"1m\"", "window = \"1 fortnite\""),
            "window",
            6,
        ),
        (
            good.replace("threshold = 1", "threshold = 1\nthreshhold = 2"),
            "threshhold",
            9,
        ),
        (good.replace("name = \"A\"", "name = \"a-b\""), "name", 2),
        (format!("{good}{good}"), "name", 10),
    ] {
        let f = dir.path().join("c.toml");
        std::fs::write(&f, &bad).unwrap();
        let out = std::process::Command::new(crate::support::bin())
            .arg("check-config")
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}");
        assert!(err.contains(key), "{key}: {err}");
        assert!(
            err.contains(&format!("line {line}")),
            "{key} line {line}: {err}"
        );
    }
}
