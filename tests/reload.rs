//! Live reload on the real binary: SIGHUP, `POST /api/v1/reload`, `edgewatch reload` and
//! `[config] watch` each re-read the edited file and apply it in place. Alert rules keep
//! their firing instances (with their start), a removed rule resolves its instances; a sink
//! pointed at another real InfluxDB keeps its cursor (every point arrives once, the new
//! `[tags]` on the new ones); invalid files change nothing and say why; a listen address is
//! "restart required"; `/api/v1/config` redacts secrets; 8 writers during 20 reloads lose
//! nothing and are never refused.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::support::peers::{influx_count, influx_create_db, influxd_on, require, Peer};
use crate::support::{bin, free_port, get, post, signal, stored_points, wait_for, Agent};

/// No collectors, 1 s evaluations, no built-in rules.
const BASE: &str = "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n[jetson]\nenabled = false\n[rollup]\nenabled = false\n[alerts]\ninterval = \"1s\"\nbuiltin = false\n";

fn rule(name: &str, field: &str, threshold: f64) -> String {
    format!(
        "[[alert]]\nname = \"{name}\"\nmeasurement = \"m\"\nfield = \"{field}\"\nagg = \"max\"\n\
         window = \"5s\"\nop = \">\"\nthreshold = {threshold}\nfor = \"0s\"\n"
    )
}

fn alerts(agent: &Agent) -> Vec<Value> {
    let (code, body) = get(&agent.url("/api/v1/alerts")).expect("alerts");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["alerts"]
        .as_array()
        .unwrap()
        .clone()
}

fn instance(agent: &Agent, name: &str) -> Option<Value> {
    alerts(agent).into_iter().find(|a| a["name"] == name)
}

fn wait_state(agent: &Agent, name: &str, state: &str) -> Value {
    wait_for(Duration::from_secs(15), || {
        instance(agent, name).filter(|a| a["state"] == state)
    })
    .unwrap_or_else(|| {
        panic!(
            "{name} not {state}: {:?}\n{}",
            alerts(agent),
            agent.log_text()
        )
    })
}

/// Writes `m a=<a>,b=<b>` every 100 ms until dropped.
struct Feed {
    stop: Arc<AtomicBool>,
    t: Option<std::thread::JoinHandle<()>>,
}

impl Feed {
    fn start(agent: &Agent, a: f64, b: f64) -> Feed {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, url) = (stop.clone(), agent.url("/write"));
        let t = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let _ = post(&url, format!("m a={a},b={b}\n").as_bytes(), &[]);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Feed { stop, t: Some(t) }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.t.take() {
            let _ = t.join();
        }
    }
}

fn config_status(agent: &Agent) -> Value {
    agent.status()["config"].clone()
}

/// Waits until the status shows a reload newer than `after_ns`; returns it.
fn wait_reload(agent: &Agent, after_ns: i64) -> Value {
    wait_for(Duration::from_secs(15), || {
        let r = config_status(agent)["last_reload"].clone();
        (r["ts_ns"].as_i64().unwrap_or(0) > after_ns).then_some(r)
    })
    .unwrap_or_else(|| panic!("no reload after {after_ns}:\n{}", agent.log_text()))
}

fn last_reload_ns(agent: &Agent) -> i64 {
    config_status(agent)["last_reload"]["ts_ns"]
        .as_i64()
        .unwrap_or(0)
}

/// The alert outbox as the notifiers read it.
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

/// `edgewatch reload --config <its file>` (the agent's address and token from the file):
/// (exit code, stdout, stderr).
fn reload_cmd(agent: &Agent, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .arg("reload")
        .arg("--config")
        .arg(agent.config_path())
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn reload_api(agent: &Agent) -> (u16, Value) {
    let (code, body) = post(&agent.url("/api/v1/reload"), b"", &[]).unwrap();
    (code, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// SIGHUP with one rule's threshold lowered: that rule fires (the new threshold is in use),
/// and the other rule, firing before, stays firing with its original start and no second
/// firing event.
#[test]
fn sighup_changes_a_threshold_and_a_firing_alert_keeps_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &format!(
            "{BASE}{}{}",
            rule("AHigh", "a", 50.0),
            rule("BHigh", "b", 1000.0)
        ),
    );
    let _feed = Feed::start(&agent, 100.0, 100.0);
    let before = wait_state(&agent, "AHigh", "firing");
    wait_state(&agent, "BHigh", "inactive");
    let sha = config_status(&agent)["sha256"]
        .as_str()
        .unwrap()
        .to_string();
    let t = last_reload_ns(&agent);

    agent.rewrite_config(&format!(
        "{BASE}{}{}",
        rule("AHigh", "a", 50.0),
        rule("BHigh", "b", 10.0)
    ));
    signal(agent.pid(), "HUP");
    let r = wait_reload(&agent, t);
    assert_eq!(r["trigger"], "signal", "{r}");
    assert_eq!(r["ok"], true, "{r}");
    assert!(
        r["applied"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "alert rules"),
        "{r}"
    );
    wait_state(&agent, "BHigh", "firing");
    let after = wait_state(&agent, "AHigh", "firing");
    assert_eq!(before["active_since"], after["active_since"], "{after}");
    assert_ne!(config_status(&agent)["sha256"], sha.as_str());
    // One firing event for AHigh: it was never resolved and fired again.
    let a_events: Vec<Value> = outbox(&agent.dir)
        .into_iter()
        .filter(|e| e["rule"] == "AHigh")
        .collect();
    assert_eq!(a_events.len(), 1, "{a_events:?}");
    assert_eq!(config_status(&agent)["reloads_applied"], 1);
}

/// A rule removed from the file while firing: `edgewatch reload` says so, its instance is
/// resolved in the history and the outbox (a resolve event naming the removal), and it is
/// gone from `/api/v1/alerts`.
#[test]
fn a_removed_rule_resolves_its_instance() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &format!(
            "{BASE}{}{}",
            rule("AHigh", "a", 50.0),
            rule("BHigh", "b", 1000.0)
        ),
    );
    let _feed = Feed::start(&agent, 100.0, 1.0);
    wait_state(&agent, "AHigh", "firing");
    agent.rewrite_config(&format!("{BASE}{}", rule("BHigh", "b", 1000.0)));
    let (code, out, err) = reload_cmd(&agent, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("applied: alert rule AHigh removed"), "{out}");
    let (_, body) = get(&agent.url("/api/v1/alerts/history?from=-1h")).unwrap();
    let h: Value = serde_json::from_str(&body).unwrap();
    let last = h["history"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|r| r["name"] == "AHigh")
        .cloned()
        .unwrap();
    assert_eq!(last["transition"], "resolved", "{h}");
    let events: Vec<Value> = outbox(&agent.dir)
        .into_iter()
        .filter(|e| e["rule"] == "AHigh")
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1]["status"], "resolved", "{events:?}");
    assert!(
        events[1]["annotations"]["summary"]
            .as_str()
            .unwrap()
            .contains("removed"),
        "{events:?}"
    );
    wait_for(Duration::from_secs(5), || {
        instance(&agent, "AHigh").is_none().then_some(())
    })
    .expect("AHigh gone from /api/v1/alerts");
    assert!(instance(&agent, "BHigh").is_some());
}

/// Malformed TOML, an unknown key, a wrong type and an invalid rule: each refused with its
/// reason by `edgewatch reload` (non-zero) and the API (422), shown in the status; the
/// running config, its alert and the stored points stay as they were.
#[test]
fn invalid_configs_change_nothing_and_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let good = format!("{BASE}{}", rule("AHigh", "a", 50.0));
    let agent = Agent::start(dir.path(), &good);
    let _feed = Feed::start(&agent, 100.0, 1.0);
    let firing = wait_state(&agent, "AHigh", "firing");
    let sha = config_status(&agent)["sha256"].clone();
    let stored = stored_points(&agent, "measurement=m").len();
    assert!(stored > 0);
    let cases = [
        ("[alerts\ninterval = \"1s\"\n", "line"),
        ("[host]\nintervl = \"5s\"\n", "intervl"),
        ("[host]\ninterval = 5\n", "interval"),
        (
            "[[alert]]\nname = \"Bad\"\nmeasurement = \"m\"\nfield = \"a\"\nagg = \"max\"\nwindow = \"5s\"\nop = \"=>\"\nthreshold = 1\n",
            "op",
        ),
    ];
    for (i, (bad, says)) in cases.iter().enumerate() {
        agent.rewrite_config(&format!("{good}{bad}"));
        let mut url = Vec::new();
        if *says == "line" {
            // Malformed: written whole, not merged as sections; the command cannot read the
            // address from it.
            std::fs::write(agent.config_path(), bad).unwrap();
            url = vec!["--url".to_string(), agent.url("")];
        }
        let url: Vec<&str> = url.iter().map(String::as_str).collect();
        let (code, out, err) = reload_cmd(&agent, &url);
        assert_ne!(code, 0, "case {i}: {out}{err}");
        assert!(
            err.contains("reload refused") && err.contains(says),
            "case {i}: {err}"
        );
        let (code, report) = reload_api(&agent);
        assert_eq!(code, 422, "case {i}: {report}");
        assert_eq!(report["ok"], false);
        assert!(report["error"].as_str().unwrap().contains(says), "{report}");
        let c = config_status(&agent);
        assert_eq!(c["sha256"], sha, "case {i}");
        assert_eq!(c["last_reload"]["ok"], false);
        assert!(
            c["last_reload"]["error"].as_str().unwrap().contains(says),
            "case {i}: {c}"
        );
        assert_eq!(c["reloads_failed"], 2 * (i as u64 + 1), "case {i}");
    }
    // Still running as before: the rule fires with its start, the points are there and
    // more arrive.
    let still = wait_state(&agent, "AHigh", "firing");
    assert_eq!(still["active_since"], firing["active_since"]);
    wait_for(Duration::from_secs(5), || {
        (stored_points(&agent, "measurement=m").len() > stored).then_some(())
    })
    .expect("points still stored");
    // And a good file applies again.
    agent.rewrite_config(&good);
    let (code, report) = reload_api(&agent);
    assert_eq!(code, 200, "{report}");
    assert_eq!(report["applied"], serde_json::json!([]), "{report}");
}

/// A changed `http.listen` is reported as needing a restart (the answer and the status),
/// the agent keeps serving on the old address, and the rest of the file still applies.
#[test]
fn a_listen_change_is_restart_required() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), BASE);
    let other = format!("127.0.0.1:{}", free_port());
    let mut text = std::fs::read_to_string(agent.config_path()).unwrap();
    text = text.replace(&agent.http.to_string(), &other);
    text.push_str("[tags]\nsite = \"b\"\n");
    std::fs::write(agent.config_path(), text).unwrap();
    let (code, r) = reload_api(&agent);
    assert_eq!(code, 200, "{r}");
    assert_eq!(
        r["restart_required"],
        serde_json::json!(["http.listen"]),
        "{r}"
    );
    assert!(
        r["applied"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "device_id and [tags]"),
        "{r}"
    );
    let c = config_status(&agent);
    assert_eq!(
        c["restart_required"],
        serde_json::json!(["http.listen"]),
        "{c}"
    );
    assert!(get(&format!("http://{other}/health")).is_err());
    // The command, told where the agent runs (its file now names the new address), prints
    // what needs a restart.
    let udp = format!("127.0.0.1:{}", crate::support::free_udp_port());
    let text = std::fs::read_to_string(agent.config_path())
        .unwrap()
        .replace(&agent.udp.to_string(), &udp);
    std::fs::write(agent.config_path(), text).unwrap();
    let (code, out, err) = reload_cmd(&agent, &["--url", &agent.url("")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("restart required: udp.listen"), "{out}");
    assert!(!out.contains("http.listen"), "{out}");
    let status = Command::new(bin())
        .args(["status", "--url", &agent.url("")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("restart required for: http.listen"), "{text}");
}

/// `[config] watch = true`: an edit of the file (a new rule) is picked up without a signal.
#[test]
fn watch_picks_up_a_file_edit() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), &format!("{BASE}[config]\nwatch = true\n"));
    let t = last_reload_ns(&agent);
    agent.rewrite_config(&format!(
        "{BASE}[config]\nwatch = true\n{}",
        rule("Added", "a", 5.0)
    ));
    let r = wait_reload(&agent, t);
    assert_eq!(r["trigger"], "watch", "{r}");
    assert_eq!(r["ok"], true, "{r}");
    wait_for(Duration::from_secs(5), || instance(&agent, "Added"))
        .unwrap_or_else(|| panic!("rule not added: {:?}", alerts(&agent)));
}

/// `/api/v1/config` needs the token, shows the sink's password as `<redacted>` (nowhere in
/// the answer in clear) and names `file` and `default` as setters; `/metrics` exports the
/// effective sha256.
#[test]
fn the_effective_config_is_redacted_and_names_its_setters() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &format!(
            "{BASE}[http]\ntoken = \"t0ken-abc\"\nmetrics_open = true\n[[sink]]\ntype = \"influxdb\"\nname = \"i\"\n\
             url = \"http://127.0.0.1:{}\"\nversion = 1\ndatabase = \"e\"\nusername = \"u\"\npassword = \"s3cret-pw\"\n",
            free_port()
        ),
    );
    let (code, _) = get(&agent.url("/api/v1/config")).unwrap();
    assert_eq!(code, 401);
    let r = ureq::get(&agent.url("/api/v1/config"))
        .set("Authorization", "Bearer t0ken-abc")
        .call()
        .unwrap();
    let body = r.into_string().unwrap();
    assert!(
        !body.contains("s3cret-pw") && !body.contains("t0ken-abc"),
        "{body}"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["config"]["sink"][0]["password"], "<redacted>", "{v}");
    assert_eq!(v["config"]["http"]["token"], "<redacted>", "{v}");
    assert_eq!(v["config"]["sink"][0]["username"], "u");
    assert_eq!(v["set_by"]["sink.i.password"], "file", "{v}");
    assert_eq!(v["set_by"]["alerts.interval"], "file", "{v}");
    assert_eq!(v["set_by"]["retention.raw"], "default", "{v}");
    let sha = v["sha256"].as_str().unwrap().to_string();
    let (_, metrics) = get(&agent.url("/metrics")).unwrap();
    assert!(
        metrics.contains(&format!("edgewatch_config_info{{sha256=\"{sha}\"}} 1")),
        "{metrics}"
    );
    assert!(metrics.contains("edgewatch_config_reloads_total{result=\"applied\"} 0"));
    // The reload endpoint is a write: the token.
    let (code, _) = post(&agent.url("/api/v1/reload"), b"", &[]).unwrap();
    assert_eq!(code, 401);
    let (code, out, err) = reload_cmd(&agent, &[]);
    assert_eq!(code, 0, "{out}{err}");
}

/// Ingest never pauses for a reload: 8 clients write in a loop while 20 reloads (each one
/// changing the alert rules and the tags) are applied; no write is refused and every
/// acknowledged point is in the store.
#[test]
fn eight_writers_during_twenty_reloads_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), &format!("{BASE}{}", rule("R", "v", 1.0)));
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for c in 0..8 {
        let (stop, refused, url) = (stop.clone(), refused.clone(), agent.url("/write"));
        writers.push(std::thread::spawn(move || {
            let mut acked = 0u64;
            let t0 = 1_764_000_000_000_000_000i64;
            while !stop.load(Ordering::Relaxed) {
                let body: String = (0..50)
                    .map(|j| {
                        let n = acked as i64 + j;
                        format!("w,c={c} v={n}i {}\n", t0 + n * 1000)
                    })
                    .collect();
                match post(&url, body.as_bytes(), &[]) {
                    Ok((204, _)) => acked += 50,
                    other => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        eprintln!("writer {c}: {other:?}");
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            acked
        }));
    }
    for i in 0..20 {
        agent.rewrite_config(&format!(
            "{BASE}[tags]\nround = \"{i}\"\n{}",
            rule("R", "v", 1.0 + i as f64)
        ));
        let (code, r) = reload_api(&agent);
        assert_eq!(code, 200, "reload {i}: {r}");
        assert_eq!(r["ok"], true);
    }
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(refused.load(Ordering::Relaxed), 0, "writes refused");
    assert_eq!(config_status(&agent)["reloads_applied"], 20);
    for (c, n) in acked.iter().enumerate() {
        assert!(*n > 0, "writer {c} wrote nothing");
        let got = stored_points(&agent, &format!("measurement=w&tag.c={c}")).len() as u64;
        assert_eq!(got, *n, "writer {c}: acknowledged {n}, stored {got}");
    }
}

/// A sink pointed at another real InfluxDB by a reload keeps its cursor: the points written
/// before went to the first (once), the ones after to the second (once), none missing, none
/// sent twice; the new `[tags]` are on the new points.
#[test]
fn a_sink_moved_to_another_influxdb_keeps_its_cursor_and_takes_the_new_tags() {
    if !require(Peer::Influxdb) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (free_port(), free_port());
    let a = influxd_on(&dir.path().join("influx-a"), pa);
    let b = influxd_on(&dir.path().join("influx-b"), pb);
    influx_create_db(&a, "edge");
    influx_create_db(&b, "edge");
    let sink = |port: u16| {
        format!(
            "[[sink]]\ntype = \"influxdb\"\nname = \"main\"\nurl = \"http://127.0.0.1:{port}\"\n\
             version = 1\ndatabase = \"edge\"\nmax_delay = \"50ms\"\nreconnect_jitter = \"0s\"\n"
        )
    };
    let home = dir.path().join("agent");
    std::fs::create_dir_all(&home).unwrap();
    let agent = Agent::start(&home, &format!("{BASE}[tags]\nsite = \"a\"\n{}", sink(pa)));
    let t0 = 1_764_000_000_000_000_000i64;
    let write = |from: i64, n: i64| {
        let body: String = (from..from + n)
            .map(|i| format!("fw v={i}i {}\n", t0 + i * 1_000_000))
            .collect();
        let (code, r) = post(&agent.url("/write"), body.as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{r}");
    };
    write(0, 1000);
    wait_for(Duration::from_secs(20), || {
        (influx_count(&a, "edge", "fw") == 1000).then_some(())
    })
    .unwrap_or_else(|| panic!("first 1000 not in A:\n{}", agent.log_text()));
    agent.rewrite_config(&format!("{BASE}[tags]\nsite = \"b\"\n{}", sink(pb)));
    let (code, r) = reload_api(&agent);
    assert_eq!(code, 200, "{r}");
    assert!(
        r["applied"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x == "sink main restarted"),
        "{r}"
    );
    write(1000, 1000);
    wait_for(Duration::from_secs(20), || {
        (influx_count(&b, "edge", "fw") == 1000).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "next 1000 not in B ({}):\n{}",
            influx_count(&b, "edge", "fw"),
            agent.log_text()
        )
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        influx_count(&a, "edge", "fw"),
        1000,
        "A got points after the move"
    );
    assert_eq!(
        influx_count(&b, "edge", "fw"),
        1000,
        "B got a point twice or an old one"
    );
    let v = b.query("edge", "SELECT min(v), max(v) FROM fw WHERE site = 'b'");
    assert_eq!(v["results"][0]["series"][0]["values"][0][1], 1000, "{v}");
    assert_eq!(v["results"][0]["series"][0]["values"][0][2], 1999, "{v}");
    let v = a.query("edge", "SELECT count(v) FROM fw WHERE site = 'a'");
    assert_eq!(v["results"][0]["series"][0]["values"][0][1], 1000, "{v}");
    let s = agent.status();
    let main = s["forward"]["sinks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "main")
        .cloned()
        .unwrap();
    assert_eq!(main["forwarded_points"], 2000, "{main}");
    assert_eq!(main["url"], format!("http://127.0.0.1:{pb}"), "{main}");
}

/// A `[[scrape]]` added by a reload starts (its target in the status, up, scraping),
/// and one removed by the next reload stops (gone from the status).
#[test]
fn scrapes_start_and_stop_with_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), BASE);
    let scrape = format!(
        "[[scrape]]\nname = \"self\"\nurl = \"{}\"\ninterval = \"1s\"\n",
        agent.url("/metrics")
    );
    agent.rewrite_config(&format!("{BASE}{scrape}"));
    let (code, r) = reload_api(&agent);
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["applied"], serde_json::json!(["scrapes"]), "{r}");
    let target = wait_for(Duration::from_secs(10), || {
        let s = agent.status();
        let t = s["collectors"]["scrape"]
            .as_array()
            .and_then(|a| a.iter().find(|t| t["name"] == "self").cloned())?;
        (t["scrapes"].as_u64().unwrap_or(0) >= 2).then_some(t)
    })
    .unwrap_or_else(|| panic!("scrape not running:\n{}", agent.log_text()));
    assert_eq!(target["up"], true, "{target}");
    agent.rewrite_config(BASE);
    let (code, r) = reload_api(&agent);
    assert_eq!(code, 200, "{r}");
    let s = agent.status();
    assert_eq!(s["collectors"]["scrape"], serde_json::json!([]), "{s}");
}
