//! Incidents in the fleet's tools, end to end on the real binary, nothing staged: a latency
//! spike written through `/write` fires a rule; the incident's explanation reaches Debian's
//! `prometheus-alertmanager` as annotations (`findings`, `split`, `incident` under
//! `[alerts] external_url`), its opening and closing reach a real InfluxDB 1.x as
//! `edgewatch_incident` points, the whole incident reaches a real mosquitto on
//! `edgewatch/{device_id}/incidents`, and `edgewatch incident show` fetches it from the agent.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::support::peers::*;
use crate::support::*;

const RULE: &str = "InferenceP99High";

/// Health on (its start event is in the incident's events), 1 s evaluations, a per-model p99
/// rule over 4 s that fires after 2 s; links under a fleet proxy's route.
const BASE: &str = r#"[health]
enabled = true
interval = "1s"
[host]
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
external_url = "http://127.0.0.1:1/fleet/devices/{device_id}/ui/"
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
"#;

/// Writes `inference,model=a wall_ms=<w>,batch_size=<b>i` every 100 ms until dropped.
struct Feeder {
    v: Arc<Mutex<(f64, i64)>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Feeder {
    fn start(url: String) -> Feeder {
        let v = Arc::new(Mutex::new((10.0, 1)));
        let stop = Arc::new(AtomicBool::new(false));
        let (v2, s2) = (v.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                let (w, b) = *v2.lock().unwrap();
                let body = format!(
                    "inference,model=a wall_ms={w},gpu_ms={},batch_size={b}i\n",
                    w * 0.8
                );
                let _ = post(&url, body.as_bytes(), &[]);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Feeder {
            v,
            stop,
            thread: Some(thread),
        }
    }

    fn set(&self, wall: f64, batch: i64) {
        *self.v.lock().unwrap() = (wall, batch);
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

fn instance(agent: &Agent, state: &str) -> Option<Value> {
    json(agent, "/api/v1/alerts")["alerts"]
        .as_array()?
        .iter()
        .find(|a| a["name"] == RULE && a["labels"]["model"] == "a" && a["state"] == state)
        .cloned()
}

/// `edgewatch_incident` rows in InfluxDB: (state, incident_id, rule tag, top_finding).
fn influx_incidents(influx: &Influxd) -> Vec<(String, i64, String, Value, Value)> {
    let v = influx.query(
        "edge",
        "SELECT state, incident_id, top_finding, top_score FROM edgewatch_incident \
         WHERE device_id = 'dev-7' GROUP BY rule",
    );
    let mut out = Vec::new();
    for s in v["results"][0]["series"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let rule = s["tags"]["rule"].as_str().unwrap_or_default().to_string();
        for r in s["values"].as_array().unwrap() {
            out.push((
                r[1].as_str().unwrap_or_default().to_string(),
                r[2].as_i64().unwrap_or(-1),
                rule.clone(),
                r[3].clone(),
                r[4].clone(),
            ));
        }
    }
    out
}

/// The `Incidents` annotation of dashboard `file`.
fn annotation(file: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("dashboards")
        .join(file);
    let d: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    d["annotations"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "Incidents")
        .cloned()
        .unwrap_or_else(|| panic!("no Incidents annotation in {file}"))
}

fn cli(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(bin()).args(args).output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// One spike, every fleet-side view of its incident: Alertmanager's alert carries the top
/// three findings (one per line), the split and the external link; InfluxDB gets the open
/// and then the resolved point with the incident's id and top finding; the MQTT topic gets
/// the whole incident once; `edgewatch incident show` prints it, and `--json` is the API's
/// answer.
#[test]
fn an_incident_reaches_alertmanager_influxdb_mqtt_and_the_cli_with_its_explanation() {
    for p in [Peer::Alertmanager, Peer::Influxdb, Peer::Mosquitto] {
        if !require(p) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let am = Alertmanager::start(&dir.path().join("am"), free_port(), "5m");
    let influx = Influxd::start(&dir.path().join("influx"));
    influx_create_db(&influx, "edge");
    let mq_port = free_port();
    let _mq = Mosquitto::start(&dir.path().join("mq"), mq_port, None);
    let sub = Sub::start_subscribed(
        mq_port,
        "edgewatch/dev-7/incidents",
        "incident-sub",
        &dir.path().join("incidents.txt"),
        None,
    );
    let cfg = format!(
        "{BASE}[[notify]]\ntype = \"alertmanager\"\nname = \"am\"\nurl = \"http://127.0.0.1:{}\"\n\
         min_backoff = \"100ms\"\nmax_backoff = \"500ms\"\ntimeout = \"2s\"\n\
         [[sink]]\ntype = \"influxdb\"\nname = \"fleet\"\nurl = \"http://{}\"\nversion = 1\n\
         database = \"edge\"\nmax_delay = \"100ms\"\nreconnect_jitter = \"0s\"\n\
         [[sink]]\ntype = \"mqtt\"\nname = \"mq\"\nurl = \"mqtt://127.0.0.1:{mq_port}\"\n\
         topic = \"ew/points\"\nmax_delay = \"100ms\"\nreconnect_jitter = \"0s\"\n",
        am.port, influx.http
    );
    let agent = Agent::start_with_env(dir.path(), &cfg, &[("EDGEWATCH_DEVICE_ID", "dev-7")]);
    // A baseline over the last 40 minutes, then the spike: 10x the latency with 8x the batch
    // size, most of it GPU time.
    let now = edgewatch::now_ns();
    let back: String = (24..480)
        .map(|i| {
            format!(
                "inference,model=a wall_ms=10,gpu_ms=8,batch_size=1i {}\n",
                now - i * 5_000_000_000
            )
        })
        .collect();
    let (code, text) = post(&agent.url("/write"), back.as_bytes(), &[]).unwrap();
    assert_eq!(code, 204, "{text}");
    let feed = Feeder::start(agent.url("/write"));
    // The agent's inventory, retained on its info topic: a subscriber arriving later gets it.
    let info = wait_for(Duration::from_secs(15), || {
        let o = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &mq_port.to_string()])
            .args(["-t", "edgewatch/dev-7/info", "-C", "1", "-W", "2"])
            .output()
            .ok()?;
        serde_json::from_slice::<Value>(&o.stdout).ok()
    })
    .unwrap_or_else(|| panic!("no retained info:\n{}", agent.log_text()));
    assert_eq!(info["device_id"], "dev-7", "{info}");
    assert_eq!(info["tags"]["version"], env!("CARGO_PKG_VERSION"), "{info}");
    assert_eq!(
        info["tags"]["config_sha256"].as_str().map(str::len),
        Some(64),
        "{info}"
    );
    assert!(info["fields"]["backlog_points"].is_i64(), "{info}");
    std::thread::sleep(Duration::from_secs(1));
    feed.set(100.0, 8);
    let firing = wait_for(Duration::from_secs(20), || instance(&agent, "firing"))
        .unwrap_or_else(|| panic!("never fired:\n{}", agent.log_text()));
    let id = firing["incident_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("no incident: {firing}"));
    let inc = json(&agent, &format!("/api/v1/incidents/{id}"));
    let findings: Vec<&str> = inc["snapshot"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["message"].as_str().unwrap())
        .collect();
    assert!(!findings.is_empty(), "the spike has findings: {inc}");
    let top3 = findings[..findings.len().min(3)].join("\n");
    assert!(
        inc["snapshot"]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["key"].as_str().unwrap_or("").contains("batch_size")),
        "the larger batches are found: {inc}"
    );
    let split = inc["snapshot"]["split"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("a split: {inc}"));
    assert!(split.contains("gpu_ms"), "{split}");
    let link = format!("http://127.0.0.1:1/fleet/devices/dev-7/ui/#/incidents/{id}");

    // Alertmanager lists the alert with the explanation.
    let a = wait_for(Duration::from_secs(15), || {
        am.alerts()
            .into_iter()
            .find(|a| a["labels"]["alertname"] == RULE)
    })
    .unwrap_or_else(|| panic!("never reached alertmanager:\n{}", agent.log_text()));
    assert_eq!(a["annotations"]["findings"], top3.as_str(), "{a}");
    assert_eq!(a["annotations"]["split"], split, "{a}");
    assert_eq!(a["annotations"]["incident"], link.as_str(), "{a}");
    assert_eq!(a["generatorURL"], link.as_str(), "{a}");

    // The open point in InfluxDB.
    let rows = wait_for(Duration::from_secs(15), || {
        Some(influx_incidents(&influx)).filter(|r| !r.is_empty())
    })
    .unwrap_or_else(|| panic!("no incident point in InfluxDB:\n{}", agent.log_text()));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1, rows[0].2.as_str()),
        ("open", id, RULE)
    );
    assert_eq!(rows[0].3, findings[0], "{rows:?}");
    assert_eq!(
        rows[0].4.as_f64(),
        inc["snapshot"]["findings"][0]["score"].as_f64()
    );

    // The dashboard's `Incidents` annotation finds it, as Grafana would run it.
    let ann = annotation("influxdb-fleet.json")["query"]
        .as_str()
        .unwrap()
        .replace("$timeFilter", "time > now() - 1h")
        .replace("$device_id", "(dev\\-7)");
    let r = influx.query("edge", &ann);
    let s = &r["results"][0]["series"][0];
    let col = |name: &str| {
        let i = s["columns"]
            .as_array()
            .unwrap()
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("no column {name}: {r}"));
        s["values"][0][i].clone()
    };
    assert_eq!(col("rule"), RULE, "{r}");
    assert_eq!(col("top_finding"), findings[0], "{r}");
    assert_eq!(col("state"), "open", "{r}");
    assert_eq!(col("device_id"), "dev-7", "{r}");

    // The whole incident on the MQTT topic, once.
    let msg = wait_for(Duration::from_secs(15), || {
        let text = sub.text();
        let docs: Vec<Value> = text
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (!docs.is_empty()).then_some(docs)
    })
    .unwrap_or_else(|| panic!("no snapshot on MQTT:\n{}", agent.log_text()));
    assert_eq!(msg.len(), 1, "{msg:?}");
    assert_eq!(msg[0]["id"], id);
    assert_eq!(msg[0]["device_id"], "dev-7");
    assert_eq!(msg[0]["snapshot"], inc["snapshot"]);

    // The CLI, as the fleet side runs it.
    let base = agent.url("");
    let (ok, out, err) = cli(&["incident", "show", &id.to_string(), "--agent", &base]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("incident {id}: {RULE} {{")),
        "{out}"
    );
    assert!(out.contains(&format!("  1. {}", findings[0])), "{out}");
    assert!(out.contains(&format!("split: {split}")), "{out}");
    let (ok, out, err) = cli(&[
        "incident",
        "show",
        &id.to_string(),
        "--agent",
        &base,
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["snapshot"], inc["snapshot"]);
    // An id the agent does not hold, and no agent at all: clear errors.
    let (ok, _, err) = cli(&["incident", "show", "999999", "--agent", &base]);
    assert!(!ok && err.contains("404"), "{err}");
    let dead = format!("http://127.0.0.1:{}", free_port());
    let (ok, _, err) = cli(&["incident", "show", "1", "--agent", &dead]);
    assert!(!ok && err.contains("cannot reach the agent"), "{err}");

    // The recovery: the resolved point follows, with the same id.
    feed.set(10.0, 1);
    wait_for(Duration::from_secs(20), || instance(&agent, "inactive"))
        .unwrap_or_else(|| panic!("never resolved:\n{}", agent.log_text()));
    let rows = wait_for(Duration::from_secs(15), || {
        Some(influx_incidents(&influx)).filter(|r| r.len() == 2)
    })
    .unwrap_or_else(|| panic!("{:?}\n{}", influx_incidents(&influx), agent.log_text()));
    assert_eq!(
        (rows[1].0.as_str(), rows[1].1),
        ("resolved", id),
        "{rows:?}"
    );
    // Still one snapshot message: a resolve publishes none.
    std::thread::sleep(Duration::from_millis(500));
    let docs = sub.text().lines().filter(|l| l.starts_with('{')).count();
    assert_eq!(docs, 1);
    drop(feed);
}

/// The PromQL dashboard's `Incidents` annotation against a real VictoriaMetrics fed by a
/// real agent through `prometheus_remote_write`: the incident's opening is a sample of
/// `edgewatch_incident_incident_id` whose value is its id, labelled with the rule, the
/// alert's labels and the device.
#[test]
fn the_incidents_annotation_finds_an_incident_in_victoriametrics() {
    if !require(Peer::VictoriaMetrics) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let vm = VictoriaMetrics::start_on(&dir.path().join("vm"), port);
    let cfg = format!(
        "{BASE}[[sink]]\ntype = \"prometheus_remote_write\"\nname = \"rw\"\n\
         url = \"http://127.0.0.1:{port}/api/v1/write\"\nmax_delay = \"50ms\"\n"
    );
    let agent = Agent::start_with_env(dir.path(), &cfg, &[("EDGEWATCH_DEVICE_ID", "dev-7")]);
    let feed = Feeder::start(agent.url("/write"));
    feed.set(100.0, 8);
    let firing = wait_for(Duration::from_secs(20), || instance(&agent, "firing"))
        .unwrap_or_else(|| panic!("never fired:\n{}", agent.log_text()));
    let id = firing["incident_id"].as_i64().expect("an incident");
    let expr = annotation("victoriametrics-fleet.json")["expr"]
        .as_str()
        .unwrap()
        .replace("$device", "dev-7");
    let end = edgewatch::now_ns() / 1_000_000_000 + 30;
    let series = wait_for(Duration::from_secs(20), || {
        vm.flush();
        let r = vm.query_range(&expr, end - 600, end, "15s");
        assert_eq!(r["status"], "success", "{expr}: {r}");
        r["data"]["result"]
            .as_array()
            .filter(|a| !a.is_empty())
            .cloned()
    })
    .unwrap_or_else(|| panic!("{expr}: no rows\n{}", sink_status(&agent, "rw")));
    assert_eq!(series.len(), 1, "{series:?}");
    let m = &series[0]["metric"];
    assert_eq!(m["rule"], RULE, "{m}");
    assert_eq!(m["device_id"], "dev-7", "{m}");
    assert_eq!(m["severity"], "critical", "{m}");
    assert_eq!(m["model"], "a", "{m}");
    let value = series[0]["values"][0][1].as_str().unwrap();
    assert_eq!(value, id.to_string(), "{series:?}");
}

/// `check-config` refuses an `[alerts] external_url` a receiver could not open, naming the
/// key, and takes a good one and the new `[health] inventory_interval`.
#[test]
fn check_config_refuses_a_relative_external_url() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    let (code, err) = check_config(&file, "[alerts]\nexternal_url = \"fleet.example/ui\"\n");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("external_url") && err.contains("absolute http:// or https:// URL"),
        "{err}"
    );
    let (code, err) = check_config(
        &file,
        "[alerts]\nexternal_url = \"https://fleet.example/d/{device_id}/ui\"\n\
         [health]\ninventory_interval = \"30s\"\n",
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = check_config(&file, "[health]\ninventory_interval = \"0s\"\n");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("inventory_interval"), "{err}");
}
