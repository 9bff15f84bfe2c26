//! Alert delivery from the durable outbox to real receivers: Debian's
//! `prometheus-alertmanager`, `mosquitto`, and a webhook endpoint (a small HTTP server in
//! this process on loopback that records what it gets and answers as told). The events are
//! put in the outbox the way the evaluator does, through the library (`store::outbox::
//! enqueue` on a connection of the test's own), before the agent starts or while it runs.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgewatch::alert::event::{AlertEvent, EventStatus};
use edgewatch::store::{self, Mode};

use crate::support::peers::*;
use crate::support::*;

/// Whole milliseconds (Alertmanager keeps ms), well in the past.
fn t(minutes_ago: i64) -> i64 {
    let now_ms = edgewatch_now_ns() / 1_000_000;
    (now_ms - minutes_ago * 60_000) * 1_000_000
}

fn edgewatch_now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn rfc3339_ms(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn event(name: &str, status: EventStatus, starts: i64, ends: Option<i64>) -> AlertEvent {
    AlertEvent {
        rule: name.into(),
        status,
        labels: BTreeMap::from([
            ("alertname".into(), name.into()),
            ("severity".into(), "warning".into()),
            ("device_id".into(), "jet-1".into()),
        ]),
        annotations: BTreeMap::from([("summary".into(), format!("{name} is off"))]),
        starts_at_ns: starts,
        ends_at_ns: ends,
        value: Some(42.0),
        incident_id: Some(1),
        fingerprint: format!("{name}{{device_id=jet-1}}"),
    }
}

/// Appends `events` to the outbox of the store in `data` (created and migrated if new;
/// the agent may be running: a second connection, WAL).
fn enqueue(data: &Path, events: &[AlertEvent]) -> Vec<i64> {
    let (conn, path) = if data.join(store::DB_FILE).exists() {
        store::open(data, Mode::Cursor).unwrap()
    } else {
        store::open(data, Mode::Writer(edgewatch::config::Synchronous::Full)).unwrap()
    };
    events
        .iter()
        .map(|e| store::outbox::enqueue(&conn, &path, e, edgewatch_now_ns()).unwrap())
        .collect()
}

fn notifier_status(agent: &Agent, name: &str) -> serde_json::Value {
    let s = agent.status();
    s["notify"]["notifiers"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no notifier {name} in {s}"))
}

fn am_notify(port: u16, extra: &str) -> String {
    format!(
        "device_id = \"jet-1\"\n[[notify]]\ntype = \"alertmanager\"\nname = \"am\"\n\
         url = \"http://127.0.0.1:{port}\"\nmin_backoff = \"100ms\"\nmax_backoff = \"500ms\"\n\
         timeout = \"2s\"\n{extra}"
    )
}

fn find<'a>(alerts: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    alerts.iter().find(|a| a["labels"]["alertname"] == name)
}

#[test]
fn alertmanager_gets_live_events_with_their_labels_and_the_agents_times() {
    if !require(Peer::Alertmanager) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let am = Alertmanager::start(&dir.path().join("am"), free_port(), "5m");
    let agent = agent_with(dir.path(), &am_notify(am.port, ""));
    // Written while the agent runs, by a second connection, as the evaluator would.
    let (a0, b0, b1) = (t(30), t(20), t(10));
    enqueue(
        &agent.dir,
        &[
            event("GpuHot", EventStatus::Firing, a0, None),
            event("SlowBatch", EventStatus::Firing, b0, None),
            event("SlowBatch", EventStatus::Resolved, b0, Some(b1)),
        ],
    );
    // A resolved alert leaves Alertmanager's list once its endsAt has passed.
    let alerts = wait_for(Duration::from_secs(20), || {
        let a = am.alerts();
        (am.received("resolved") >= 1
            && find(&a, "GpuHot").is_some()
            && find(&a, "SlowBatch").is_none())
        .then_some(a)
    })
    .unwrap_or_else(|| panic!("alertmanager never got the events:\n{}", agent.log_text()));
    let hot = find(&alerts, "GpuHot").unwrap();
    assert_eq!(hot["labels"]["device_id"], "jet-1", "{hot}");
    assert_eq!(hot["labels"]["severity"], "warning", "{hot}");
    assert_eq!(hot["annotations"]["summary"], "GpuHot is off", "{hot}");
    assert_eq!(
        hot["startsAt"],
        rfc3339_ms(a0),
        "startsAt as the agent saw it: {hot}"
    );
    assert_eq!(hot["status"]["state"], "active", "{hot}");
    assert!(find(&alerts, "SlowBatch").is_none(), "resolved: {alerts:?}");
    let n = wait_for(Duration::from_secs(5), || {
        let n = notifier_status(&agent, "am");
        (n["pending_events"] == 0 && n["delivered"] == 3).then_some(n)
    })
    .unwrap_or_else(|| panic!("status: {}", notifier_status(&agent, "am")));
    assert_eq!(n["type"], "alertmanager", "{n}");
    assert_eq!(n["position"], 3, "{n}");
    let (_, metrics) = get(&agent.url("/metrics")).unwrap();
    assert!(
        metrics
            .contains("edgewatch_notify_delivered_total{notifier=\"am\",type=\"alertmanager\"} 3"),
        "{metrics}"
    );
}

#[test]
fn alertmanager_down_while_an_alert_fires_and_resolves_gets_both_with_the_original_times() {
    if !require(Peer::Alertmanager) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (a0, a1) = (t(40), t(35));
    // An end the receiver can still show: a resolve whose end lies ahead of its clock.
    let (c0, c1) = (t(30), t(-30));
    enqueue(
        &dir.path().join("data"),
        &[
            event("FanStall", EventStatus::Firing, a0, None),
            event("PowerCap", EventStatus::Firing, c0, None),
            event("FanStall", EventStatus::Resolved, a0, Some(a1)),
            event("PowerCap", EventStatus::Resolved, c0, Some(c1)),
        ],
    );
    let agent = agent_with(dir.path(), &am_notify(port, ""));
    let down = wait_for(Duration::from_secs(10), || {
        let n = notifier_status(&agent, "am");
        (n["failures"].as_u64().unwrap_or(0) >= 2 && n["pending_events"] == 4).then_some(n)
    })
    .unwrap_or_else(|| panic!("{}", notifier_status(&agent, "am")));
    assert!(
        down["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("cannot reach"),
        "{down}"
    );
    assert!(down["next_retry_ns"].is_i64(), "{down}");
    assert_eq!(down["delivered"], 0, "{down}");

    let am = Alertmanager::start(&dir.path().join("am"), port, "5m");
    let n = wait_for(Duration::from_secs(15), || {
        let n = notifier_status(&agent, "am");
        (n["delivered"] == 4).then_some(n)
    })
    .unwrap_or_else(|| panic!("not delivered after the start:\n{}", agent.log_text()));
    assert_eq!(n["pending_events"], 0, "{n}");
    assert!(n["last_error"].is_null(), "{n}");
    // Alertmanager counts an alert whose end lies ahead as firing.
    assert_eq!(am.received("resolved"), 1);
    assert!(am.received("firing") >= 3);
    let alerts = am.alerts();
    assert!(find(&alerts, "FanStall").is_none(), "resolved: {alerts:?}");
    let cap = find(&alerts, "PowerCap").expect("PowerCap");
    assert_eq!(cap["startsAt"], rfc3339_ms(c0), "{cap}");
    assert_eq!(
        cap["endsAt"],
        rfc3339_ms(c1),
        "the resolve's own end time: {cap}"
    );
}

#[test]
fn resends_keep_a_firing_alert_alive_in_alertmanager() {
    if !require(Peer::Alertmanager) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let am = Alertmanager::start(&dir.path().join("am"), free_port(), "2s");
    enqueue(
        &dir.path().join("data"),
        &[event("DiskFull", EventStatus::Firing, t(5), None)],
    );
    let agent = agent_with(
        dir.path(),
        &am_notify(am.port, "resend_interval = \"500ms\"\n"),
    );
    wait_for(Duration::from_secs(10), || {
        find(&am.alerts(), "DiskFull").map(|_| ())
    })
    .expect("DiskFull reaches alertmanager");
    // The control: an alert posted once, never again, expires after resolve_timeout (2 s).
    let body = format!(
        "[{{\"labels\":{{\"alertname\":\"Once\"}},\"startsAt\":\"{}\"}}]",
        rfc3339_ms(t(5))
    );
    let (code, _) = post(
        &am.url("/api/v2/alerts"),
        body.as_bytes(),
        &[("Content-Type", "application/json")],
    )
    .unwrap();
    assert_eq!(code, 200);
    std::thread::sleep(Duration::from_secs(5));
    let alerts = am.alerts();
    assert!(
        find(&alerts, "Once").is_none(),
        "the control expired: {alerts:?}"
    );
    let disk = find(&alerts, "DiskFull").unwrap_or_else(|| panic!("DiskFull expired: {alerts:?}"));
    assert_eq!(disk["status"]["state"], "active", "{disk}");
    let n = notifier_status(&agent, "am");
    assert_eq!(n["firing"], 1, "{n}");
    assert!(n["last_resend_ns"].is_i64(), "{n}");
}

/// Answers to give, in order: (status, Retry-After).
type Script = Arc<Mutex<VecDeque<(u16, Option<&'static str>)>>>;

/// A webhook endpoint on loopback: records every request's JSON body with the status it
/// answers: the next scripted (status, Retry-After), else 200, after `delay`.
struct Hook {
    port: u16,
    bodies: Arc<Mutex<Vec<(u16, serde_json::Value)>>>,
    script: Script,
}

impl Hook {
    fn start(delay: Duration) -> Hook {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let script: Script = Default::default();
        let (b, s) = (bodies.clone(), script.clone());
        std::thread::spawn(move || {
            for stream in l.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut r = BufReader::new(stream.try_clone().unwrap());
                let mut len = 0usize;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0u8; len];
                if r.read_exact(&mut body).is_err() {
                    continue;
                }
                let (code, ra) = s.lock().unwrap().pop_front().unwrap_or((200, None));
                if let Ok(v) = serde_json::from_slice(&body) {
                    b.lock().unwrap().push((code, v));
                }
                std::thread::sleep(delay);
                let extra = ra
                    .map(|v| format!("Retry-After: {v}\r\n"))
                    .unwrap_or_default();
                let _ = write!(
                    stream,
                    "HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n{extra}\r\nno"
                );
            }
        });
        Hook {
            port,
            bodies,
            script,
        }
    }

    /// The `seq` of every request answered 2xx, in arrival order.
    fn seqs(&self) -> Vec<i64> {
        self.requests()
            .into_iter()
            .filter(|r| r.0 == 200)
            .map(|r| r.1)
            .collect()
    }

    /// (answer, `seq`) of every request, in arrival order.
    fn requests(&self) -> Vec<(u16, i64)> {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(c, b)| Some((*c, b["seq"].as_i64()?)))
            .collect()
    }

    fn body(&self, i: usize) -> serde_json::Value {
        self.bodies.lock().unwrap()[i].1.clone()
    }
}

fn hook_notify(port: u16) -> String {
    format!(
        "device_id = \"jet-1\"\n[[notify]]\ntype = \"webhook\"\nname = \"hook\"\n\
         url = \"http://127.0.0.1:{port}/hook\"\nmin_backoff = \"100ms\"\nmax_backoff = \"500ms\"\n\
         bearer_token = \"s3cret\"\n"
    )
}

#[test]
fn webhook_kill9_mid_delivery_loses_nothing_and_keeps_order() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Hook::start(Duration::from_millis(150));
    let evs: Vec<AlertEvent> = (0..12)
        .map(|i| {
            let st = if i % 2 == 0 {
                EventStatus::Firing
            } else {
                EventStatus::Resolved
            };
            let s = t(60 - i);
            event(
                &format!("A{}", i / 2),
                st,
                s,
                (st == EventStatus::Resolved).then_some(s + 1_000_000),
            )
        })
        .collect();
    let seqs = enqueue(&dir.path().join("data"), &evs);
    let agent = agent_with(dir.path(), &hook_notify(hook.port));
    wait_for(Duration::from_secs(10), || {
        (hook.seqs().len() >= 4).then_some(())
    })
    .expect("delivery started");
    // The receiver fails from now on: the event being sent is retried, never acknowledged.
    hook.script.lock().unwrap().extend([(500, None); 1000]);
    wait_for(Duration::from_secs(10), || {
        (hook.requests().iter().filter(|r| r.0 == 500).count() >= 2).then_some(())
    })
    .expect("retrying");
    agent.kill9();
    hook.script.lock().unwrap().clear();
    let agent = agent_with(dir.path(), &hook_notify(hook.port));
    wait_for(Duration::from_secs(15), || {
        let got = hook.seqs();
        seqs.iter().all(|s| got.contains(s)).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "missing after restart: {:?}\n{}",
            hook.seqs(),
            agent.log_text()
        )
    });
    let got = hook.seqs();
    // Every event acknowledged, in order; at most one repeat (an acknowledgement the kill
    // kept from being recorded).
    let mut dups = 0;
    for w in got.windows(2) {
        assert!(w[1] >= w[0], "out of order: {got:?}");
        if w[1] == w[0] {
            dups += 1;
        }
    }
    assert!(dups <= 1, "more than one duplicate: {got:?}");
    let first = hook.body(0);
    assert_eq!(first["version"], "4", "{first}");
    assert_eq!(first["receiver"], "hook", "{first}");
    assert_eq!(first["status"], "firing", "{first}");
    assert_eq!(first["alerts"][0]["labels"]["alertname"], "A0", "{first}");
    assert_eq!(
        first["alerts"][0]["startsAt"],
        rfc3339_ms(evs[0].starts_at_ns),
        "{first}"
    );
    let second = hook.body(1);
    assert_eq!(second["alerts"][0]["status"], "resolved", "{second}");
    let n = wait_for(Duration::from_secs(5), || {
        let n = notifier_status(&agent, "hook");
        (n["pending_events"] == 0).then_some(n)
    })
    .unwrap_or_else(|| panic!("{}", notifier_status(&agent, "hook")));
    assert_eq!(n["position"], seqs[11], "{n}");
}

#[test]
fn webhook_4xx_is_dead_lettered_and_reported_503_waits_its_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Hook::start(Duration::ZERO);
    hook.script
        .lock()
        .unwrap()
        .extend([(400, None), (503, Some("1"))]);
    let seqs = enqueue(
        &dir.path().join("data"),
        &[
            event("Bad", EventStatus::Firing, t(3), None),
            event("Busy", EventStatus::Firing, t(2), None),
            event("Fine", EventStatus::Firing, t(1), None),
        ],
    );
    let agent = agent_with(dir.path(), &hook_notify(hook.port));
    let n = wait_for(Duration::from_secs(10), || {
        let n = notifier_status(&agent, "hook");
        (n["delivered"] == 2 && n["pending_events"] == 0).then_some(n)
    })
    .unwrap_or_else(|| panic!("{}\n{}", notifier_status(&agent, "hook"), agent.log_text()));
    assert_eq!(n["dead_letters"], 1, "{n}");
    assert_eq!(n["last_dead_letter"]["seq"], seqs[0], "{n}");
    assert_eq!(n["last_dead_letter"]["status"], 400, "{n}");
    assert!(
        n["last_dead_letter"]["reason"]
            .as_str()
            .unwrap()
            .contains("HTTP 400"),
        "{n}"
    );
    assert!(n["failures"].as_u64().unwrap() >= 2, "{n}");
    // The refused event once, the busy one twice (after its Retry-After), then on.
    assert_eq!(
        hook.requests(),
        [
            (400, seqs[0]),
            (503, seqs[1]),
            (200, seqs[1]),
            (200, seqs[2])
        ]
    );
    let (_, metrics) = get(&agent.url("/metrics")).unwrap();
    assert!(
        metrics
            .contains("edgewatch_notify_dead_letters_total{notifier=\"hook\",type=\"webhook\"} 1"),
        "{metrics}"
    );
    let out = std::process::Command::new(bin())
        .args(["status", "--url", &agent.url("")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("hook") && text.contains("dead letters 1"),
        "{text}"
    );
}

#[test]
fn mqtt_subscriber_sees_every_event_in_seq_order_across_a_broker_outage() {
    if !require(Peer::Mosquitto) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let broker = Mosquitto::start(&dir.path().join("mq"), port, None);
    let sub = Sub::start_subscribed(
        port,
        "edge/jet-1/alerts",
        "notify-test",
        &dir.path().join("sub.txt"),
        None,
    );
    let evs: Vec<AlertEvent> = (0..14)
        .map(|i| event(&format!("M{i}"), EventStatus::Firing, t(20 - i), None))
        .collect();
    let mut seqs = enqueue(&dir.path().join("data"), &evs[..6]);
    let agent = agent_with(
        dir.path(),
        &format!(
            "device_id = \"jet-1\"\n[[notify]]\ntype = \"mqtt\"\nname = \"mq\"\n\
             url = \"mqtt://127.0.0.1:{port}\"\ntopic = \"edge/{{device_id}}/alerts\"\n\
             min_backoff = \"100ms\"\nmax_backoff = \"500ms\"\ntimeout = \"1s\"\n"
        ),
    );
    // The rest while it runs.
    seqs.extend(enqueue(&agent.dir, &evs[6..10]));
    let got = wait_for(Duration::from_secs(15), || {
        let got: Vec<serde_json::Value> = sub
            .text()
            .lines()
            .filter(|l| l.starts_with('{'))
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (got.len() >= 10).then_some(got)
    })
    .unwrap_or_else(|| panic!("subscriber got:\n{}\n{}", sub.text(), agent.log_text()));
    let got_seqs: Vec<i64> = got.iter().filter_map(|m| m["seq"].as_i64()).collect();
    assert_eq!(got_seqs, seqs, "seq order");
    assert_eq!(got[0]["device_id"], "jet-1");
    assert_eq!(got[0]["rule"], "M0");
    assert_eq!(got[0]["status"], "firing");
    assert_eq!(got[0]["starts_at"], edgewatch_rfc3339(evs[0].starts_at_ns));
    let n = wait_for(Duration::from_secs(5), || {
        let n = notifier_status(&agent, "mq");
        (n["delivered"] == 10).then_some(n)
    })
    .unwrap_or_else(|| panic!("{}", notifier_status(&agent, "mq")));
    assert_eq!(n["type"], "mqtt", "{n}");

    // The broker goes away (the subscriber's session persists); events made meanwhile wait
    // in the outbox and go, in order, when it is back.
    drop(sub);
    broker.stop();
    let more = enqueue(&agent.dir, &evs[10..]);
    wait_for(Duration::from_secs(10), || {
        let n = notifier_status(&agent, "mq");
        (n["pending_events"] == 4 && n["failures"].as_u64().unwrap_or(0) >= 2).then_some(())
    })
    .unwrap_or_else(|| panic!("{}", notifier_status(&agent, "mq")));
    let broker = Mosquitto::start(&dir.path().join("mq"), port, None);
    let sub = Sub::start(
        port,
        "edge/jet-1/alerts",
        "notify-test",
        &dir.path().join("sub2.txt"),
        None,
    );
    let got = wait_for(Duration::from_secs(15), || {
        let got: Vec<i64> = sub
            .text()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["seq"].as_i64())
            .collect();
        (got.len() >= 4).then_some(got)
    })
    .unwrap_or_else(|| panic!("after the outage:\n{}\n{}", sub.text(), agent.log_text()));
    assert_eq!(got, more, "seq order after the outage");

    // A broker that takes the message and never acknowledges it (frozen): the event stays
    // pending; it counts as delivered only once the broker is back and acknowledged it.
    wait_for(Duration::from_secs(5), || {
        (notifier_status(&agent, "mq")["delivered"] == 14).then_some(())
    })
    .unwrap_or_else(|| panic!("{}", notifier_status(&agent, "mq")));
    let pid = broker.child.id() as i32;
    signal(pid, "STOP");
    let frozen = enqueue(
        &agent.dir,
        &[event("Frozen", EventStatus::Firing, t(1), None)],
    )[0];
    std::thread::sleep(Duration::from_millis(2500));
    let n = notifier_status(&agent, "mq");
    signal(pid, "CONT");
    assert_eq!(
        (n["delivered"].as_i64(), n["pending_events"].as_i64()),
        (Some(14), Some(1)),
        "{n}"
    );
    let copies = wait_for(Duration::from_secs(15), || {
        let n = sub.text().matches(&format!("\"seq\":{frozen},")).count();
        (n >= 1 && notifier_status(&agent, "mq")["delivered"] == 15).then_some(n)
    })
    .unwrap_or_else(|| panic!("after the freeze:\n{}\n{}", sub.text(), agent.log_text()));
    assert!(copies <= 2, "at most one duplicate: {}", sub.text());
}

fn edgewatch_rfc3339(ns: i64) -> String {
    edgewatch::alert::notify::payload::rfc3339(ns)
}

#[test]
fn bad_notify_tables_are_refused_with_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    for (text, want) in [
        ("[[notify]]\ntype = \"pager\"\nname = \"p\"\nurl = \"http://h\"\n", "pager"),
        ("[[notify]]\ntype = \"webhook\"\nname = \"w\"\n", "url"),
        ("[[notify]]\ntype = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nretries = 3\n", "retries"),
        (
            "[[notify]]\ntype = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\n\n[[notify]]\ntype = \"webhook\"\nname = \"w\"\nurl = \"http://h2\"\n",
            "(line 6) is used twice",
        ),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let out = std::process::Command::new(bin())
            .arg("check-config")
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        assert!(err.contains(want) && err.contains("line"), "{text}: {err}");
    }
}
