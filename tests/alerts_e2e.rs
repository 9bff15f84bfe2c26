//! The alert chain end to end, nothing staged: points written through `/write` to the real
//! agent, its evaluator (1 s), the incident it opens, its outbox and notifier, and Debian's
//! `prometheus-alertmanager`, read back through Alertmanager's `GET /api/v2/alerts` and its
//! metrics, the agent's `/api/v1/alerts`, history and incidents, and the Alerts tab in
//! Chromium (`tests/web/alerts_live.mjs`). Alertmanager up, down while the alert fires and
//! resolves, and the agent killed with -9 while it fires.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::support::peers::*;
use crate::support::*;

const RULE: &str = "InferenceP99High";
const MS: i64 = 1_000_000;

/// No collectors, 1 s evaluations, no built-ins, a per-model p99 rule over 4 s that fires
/// after 2 s (a 4 s window: a writer slowed by a loaded machine leaves no empty window), and
/// `[tags]`.
const BASE: &str = r#"[host]
enabled = false
[tegrastats]
enabled = false
[nvml]
enabled = false
[jetson]
enabled = false
[alerts]
interval = "1s"
builtin = false
[tags]
site = "lab"
[[alert]]
name = "InferenceP99High"
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

fn config(am_port: u16) -> String {
    format!(
        "{BASE}[[notify]]\ntype = \"alertmanager\"\nname = \"am\"\nurl = \"http://127.0.0.1:{am_port}\"\n\
         resend_interval = \"1s\"\nmin_backoff = \"100ms\"\nmax_backoff = \"500ms\"\ntimeout = \"2s\"\n"
    )
}

fn start_agent(dir: &Path, am_port: u16) -> Agent {
    Agent::start_with_env(dir, &config(am_port), &[("EDGEWATCH_DEVICE_ID", "dev-1")])
}

/// Writes `inference,model=a wall_ms=<a>` and `model=b ... 12` every 100 ms to the URL in
/// the shared cell (so it follows a restarted agent), until dropped.
struct Feeder {
    a: Arc<Mutex<f64>>,
    url: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Feeder {
    fn start(agent: &Agent, a: f64) -> Feeder {
        let (va, url, stop) = (
            Arc::new(Mutex::new(a)),
            Arc::new(Mutex::new(agent.url("/write"))),
            Arc::new(AtomicBool::new(false)),
        );
        let (v, u, s) = (va.clone(), url.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let body = format!(
                    "inference,model=a wall_ms={}\ninference,model=b wall_ms=12\n",
                    *v.lock().unwrap()
                );
                let target = u.lock().unwrap().clone();
                let _ = post(&target, body.as_bytes(), &[]);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Feeder {
            a: va,
            url,
            stop,
            thread: Some(thread),
        }
    }

    fn set(&self, v: f64) {
        *self.a.lock().unwrap() = v;
    }

    fn follow(&self, agent: &Agent) {
        *self.url.lock().unwrap() = agent.url("/write");
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

fn json(agent: &Agent, path: &str) -> Value {
    let (code, body) = get(&agent.url(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(code, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// The instance of model `a` in `/api/v1/alerts`.
fn model_a(agent: &Agent) -> Option<Value> {
    json(agent, "/api/v1/alerts")["alerts"]
        .as_array()?
        .iter()
        .find(|a| a["name"] == RULE && a["labels"]["model"] == "a")
        .cloned()
}

fn wait_state(agent: &Agent, state: &str, secs: u64) -> Value {
    wait_for(Duration::from_secs(secs), || {
        model_a(agent).filter(|a| a["state"] == state)
    })
    .unwrap_or_else(|| {
        panic!(
            "model a not {state} in {secs} s: {:?}\n{}",
            model_a(agent),
            agent.log_text()
        )
    })
}

/// The time (ns) of model `a`'s history transitions of kind `kind`, in order.
fn transitions(agent: &Agent, kind: &str) -> Vec<i64> {
    json(agent, "/api/v1/alerts/history?from=-1h")["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["labels"]["model"] == "a" && r["transition"] == kind)
        .map(|r| r["ts_ns"].as_i64().unwrap())
        .collect()
}

/// Alertmanager's active alerts of the rule.
fn am_alerts(am: &Alertmanager) -> Vec<Value> {
    am.alerts()
        .into_iter()
        .filter(|a| a["labels"]["alertname"] == RULE)
        .collect()
}

/// An RFC 3339 time of Alertmanager's as Unix ms.
fn ms(v: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or_else(|| panic!("time: {v}")))
        .unwrap()
        .timestamp_millis()
}

fn notifier(agent: &Agent) -> Value {
    agent.status()["notify"]["notifiers"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == "am").cloned())
        .unwrap_or_else(|| panic!("no notifier am: {}", agent.status()))
}

/// The outbox as delivered: (status, starts_at_ns, ends_at_ns) in order.
fn outbox(data: &Path) -> Vec<(String, i64, Option<i64>)> {
    let conn = rusqlite::Connection::open_with_flags(
        data.join("edgewatch.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut st = conn
        .prepare("SELECT event FROM alert_outbox ORDER BY seq")
        .unwrap();
    let rows: Vec<Value> = st
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|r| serde_json::from_str(&r.unwrap()).unwrap())
        .collect();
    rows.iter()
        .map(|e| {
            (
                e["status"].as_str().unwrap().to_string(),
                e["starts_at_ns"].as_i64().unwrap(),
                e["ends_at_ns"].as_i64(),
            )
        })
        .collect()
}

/// A spike fires after `for`; Alertmanager shows it with every label, the annotations (the
/// incident's URL on the agent, which answers with the snapshot) and the agent's firing time
/// as `startsAt`; the recovery resolves it there, and closes the incident.
#[test]
fn a_spike_reaches_alertmanager_with_labels_times_and_incident_then_resolves() {
    if !require(Peer::Alertmanager) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let am = Alertmanager::start(&dir.path().join("am"), free_port(), "5m");
    let agent = start_agent(dir.path(), am.port);
    let feed = Feeder::start(&agent, 10.0);
    wait_state(&agent, "inactive", 10);
    feed.set(100.0);
    let firing = wait_state(&agent, "firing", 15);
    let pending_at = transitions(&agent, "pending");
    let fired_at = transitions(&agent, "firing");
    assert_eq!((pending_at.len(), fired_at.len()), (1, 1), "one spike");
    assert!(
        fired_at[0] - pending_at[0] >= 2_000 * MS,
        "fired after `for`"
    );
    assert_eq!(ms(&firing["active_since"]), pending_at[0] / MS, "{firing}");

    let alerts = wait_for(Duration::from_secs(10), || {
        Some(am_alerts(&am)).filter(|a| !a.is_empty())
    })
    .unwrap_or_else(|| panic!("never reached alertmanager:\n{}", agent.log_text()));
    assert_eq!(alerts.len(), 1, "model b stays quiet: {alerts:?}");
    let a = &alerts[0];
    for (k, v) in [
        ("alertname", RULE),
        ("severity", "critical"),
        ("device_id", "dev-1"),
        ("site", "lab"),
        ("model", "a"),
        ("team", "vision"),
    ] {
        assert_eq!(a["labels"][k], v, "label {k}: {a}");
    }
    assert_eq!(a["status"]["state"], "active", "{a}");
    assert_eq!(
        ms(&a["startsAt"]),
        fired_at[0] / MS,
        "startsAt is the agent's firing time: {a}"
    );
    assert_eq!(
        a["annotations"]["summary"], "p99 of a is 100 ms (threshold 50)",
        "{a}"
    );
    assert_eq!(a["annotations"]["value"], "100", "{a}");
    let id = firing["incident_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("no incident: {firing}"));
    assert_eq!(
        a["annotations"]["incident"],
        agent.url(&format!("/#/incidents/{id}")),
        "{a}"
    );
    let inc = json(&agent, &format!("/api/v1/incidents/{id}"));
    assert_eq!(inc["rule"], RULE, "{inc}");
    assert_eq!(inc["labels"]["model"], "a", "{inc}");
    assert!(inc["snapshot"]["findings"].is_array(), "{inc}");
    assert!(inc["resolved"].is_null(), "{inc}");

    feed.set(10.0);
    wait_state(&agent, "inactive", 15);
    let resolved_at = transitions(&agent, "resolved");
    assert_eq!(resolved_at.len(), 1);
    wait_for(Duration::from_secs(10), || {
        (am.received("resolved") >= 1 && am_alerts(&am).is_empty()).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "resolve not delivered: {:?} {}\n{}",
            am_alerts(&am),
            am.received("resolved"),
            agent.log_text()
        )
    });
    // The incident is closed at the resolve.
    let inc = json(&agent, &format!("/api/v1/incidents/{id}"));
    assert_eq!(inc["resolved_ns"], resolved_at[0], "{inc}");
}

/// Alertmanager down while the alert fires and resolves: once it starts, both events reach
/// it, in order, with the agent's original times.
#[test]
fn alertmanager_down_during_fire_and_resolve_gets_both_when_it_starts() {
    if !require(Peer::Alertmanager) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let agent = start_agent(dir.path(), port);
    let feed = Feeder::start(&agent, 10.0);
    wait_state(&agent, "inactive", 10);
    feed.set(100.0);
    wait_state(&agent, "firing", 15);
    feed.set(10.0);
    wait_state(&agent, "inactive", 15);
    let (fired, resolved) = (
        transitions(&agent, "firing"),
        transitions(&agent, "resolved"),
    );
    assert_eq!((fired.len(), resolved.len()), (1, 1));
    // The status follows the outbox at the notifier's next try.
    let down = wait_for(Duration::from_secs(5), || {
        Some(notifier(&agent)).filter(|n| n["pending_events"] == 2)
    })
    .unwrap_or_else(|| panic!("{}", notifier(&agent)));
    assert_eq!(down["delivered"], 0, "{down}");
    assert!(down["failures"].as_u64().unwrap_or(0) >= 1, "{down}");
    // What waits is what happened, with the agent's times.
    assert_eq!(
        outbox(&agent.dir),
        [
            ("firing".to_string(), fired[0], None),
            ("resolved".to_string(), fired[0], Some(resolved[0])),
        ]
    );

    let am = Alertmanager::start(&dir.path().join("am"), port, "5m");
    let n = wait_for(Duration::from_secs(15), || {
        Some(notifier(&agent)).filter(|n| n["delivered"] == 2)
    })
    .unwrap_or_else(|| panic!("not delivered: {}\n{}", notifier(&agent), agent.log_text()));
    assert_eq!(n["pending_events"], 0, "{n}");
    assert!(am.received("firing") >= 1);
    assert_eq!(
        am.received("resolved"),
        1,
        "the resolve counted as resolved"
    );
    assert!(am_alerts(&am).is_empty(), "resolved: {:?}", am_alerts(&am));
}

/// kill -9 while firing: after the restart the alert is still firing with its original
/// start, Alertmanager still holds one alert with the same `startsAt` (no second firing),
/// and the resolve after recovery reaches it.
#[test]
fn kill_9_while_firing_keeps_one_alert_in_alertmanager_and_delivers_the_resolve() {
    if !require(Peer::Alertmanager) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let am = Alertmanager::start(&dir.path().join("am"), free_port(), "5m");
    let agent = start_agent(dir.path(), am.port);
    let feed = Feeder::start(&agent, 10.0);
    wait_state(&agent, "inactive", 10);
    feed.set(100.0);
    let before = wait_state(&agent, "firing", 15);
    let first = wait_for(Duration::from_secs(10), || {
        am_alerts(&am).into_iter().next()
    })
    .expect("reaches alertmanager");
    agent.kill9();

    let agent = start_agent(dir.path(), am.port);
    feed.follow(&agent);
    agent.wait_evaluations(3, "evaluations after the restart");
    let after = wait_state(&agent, "firing", 5);
    assert_eq!(after["active_since"], before["active_since"]);
    assert_eq!(transitions(&agent, "firing").len(), 1, "fired once");
    // Resends (1 s) from the restarted agent keep the same alert.
    std::thread::sleep(Duration::from_secs(2));
    let alerts = am_alerts(&am);
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["startsAt"], first["startsAt"], "{alerts:?}");
    assert_eq!(alerts[0]["fingerprint"], first["fingerprint"], "{alerts:?}");

    feed.set(10.0);
    wait_state(&agent, "inactive", 15);
    wait_for(Duration::from_secs(10), || {
        (am.received("resolved") >= 1 && am_alerts(&am).is_empty()).then_some(())
    })
    .unwrap_or_else(|| panic!("resolve not delivered:\n{}", agent.log_text()));
    let sent: Vec<String> = outbox(&agent.dir).into_iter().map(|e| e.0).collect();
    assert_eq!(sent, ["firing", "resolved"]);
}

/// A real firing alert in Chromium: the Alerts tab lists it (and its history), the badge
/// says 1, and its incident's page opens from the row.
#[test]
fn a_real_firing_alert_in_the_alerts_tab() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        root.join("tests/web/node_modules/playwright-core").exists(),
        "run: npm install --no-save --prefix tests/web playwright-core@1"
    );
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on the notifier's port: delivery is not this test's concern.
    let agent = start_agent(dir.path(), free_port());
    let feed = Feeder::start(&agent, 10.0);
    wait_state(&agent, "inactive", 10);
    feed.set(100.0);
    let firing = wait_state(&agent, "firing", 15);
    let id = firing["incident_id"].as_i64().expect("incident");
    let out = Command::new("node")
        .arg(root.join("tests/web/alerts_live.mjs"))
        .arg(agent.url(""))
        .output()
        .expect("node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "alerts_live.mjs failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("bad report ({e}): {stdout}"));
    assert!(
        r["failure"].is_null(),
        "browser step failed: {}",
        r["failure"]
    );
    assert_eq!(r["errors"], serde_json::json!([]), "console errors");
    assert_eq!(r["badge"], "1", "{r}");
    let active = r["active"].as_array().unwrap();
    assert_eq!(active.len(), 1, "{r}");
    let row = active[0].as_str().unwrap();
    assert!(
        row.contains(RULE) && row.contains("firing") && row.contains("model=a"),
        "{row}"
    );
    assert_eq!(r["link"], format!("#/incidents/{id}"), "{r}");
    let hist: Vec<&str> = r["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        hist.iter()
            .any(|h| h.contains(RULE) && h.contains("firing")),
        "the history lists the firing: {hist:?}"
    );
    assert_eq!(
        r["title"],
        format!("Incident #{id} · {RULE}"),
        "the incident page opened from the row"
    );
    drop(feed);
}
