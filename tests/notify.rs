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
use std::time::{Duration, Instant};

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

/// One request a [`Hook`] got.
#[derive(Clone)]
struct Req {
    code: u16,
    body: serde_json::Value,
    /// Headers, names in lower case.
    headers: BTreeMap<String, String>,
    at: Instant,
}

/// A webhook endpoint on loopback: records every request (JSON body, headers, arrival time)
/// with the status it answers: 401 when `auth` is set and the request's `Authorization`
/// differs, else the next scripted (status, Retry-After), else 200, after `delay`. With
/// `kill_at = (n, pid)` it SIGKILLs `pid` right after writing its n-th 200: the agent is
/// killed after the receiver acknowledged and before it can record that.
struct Hook {
    port: u16,
    reqs: Arc<Mutex<Vec<Req>>>,
    script: Script,
    auth: Arc<Mutex<Option<String>>>,
    kill_at: Arc<Mutex<Option<(usize, u32)>>>,
}

impl Hook {
    fn start(delay: Duration) -> Hook {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let reqs: Arc<Mutex<Vec<Req>>> = Default::default();
        let script: Script = Default::default();
        let auth: Arc<Mutex<Option<String>>> = Default::default();
        let kill_at: Arc<Mutex<Option<(usize, u32)>>> = Default::default();
        let (b, s, a, k) = (reqs.clone(), script.clone(), auth.clone(), kill_at.clone());
        std::thread::spawn(move || {
            let mut oks = 0usize;
            for stream in l.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut r = BufReader::new(stream.try_clone().unwrap());
                let mut headers = BTreeMap::new();
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                    }
                }
                let len: usize = headers
                    .get("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0u8; len];
                if r.read_exact(&mut body).is_err() {
                    continue;
                }
                let want = a.lock().unwrap().clone();
                let (code, ra) = match want {
                    Some(w) if headers.get("authorization") != Some(&w) => (401, None),
                    _ => s.lock().unwrap().pop_front().unwrap_or((200, None)),
                };
                if let Ok(v) = serde_json::from_slice(&body) {
                    b.lock().unwrap().push(Req {
                        code,
                        body: v,
                        headers,
                        at: Instant::now(),
                    });
                }
                std::thread::sleep(delay);
                let extra = ra
                    .map(|v| format!("Retry-After: {v}\r\n"))
                    .unwrap_or_default();
                let _ = write!(
                    stream,
                    "HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n{extra}\r\nno"
                );
                let _ = stream.flush();
                if code == 200 {
                    oks += 1;
                    let mut g = k.lock().unwrap();
                    if let Some((n, pid)) = *g {
                        if oks == n {
                            // SAFETY: kill(2) on the agent this test started.
                            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                            *g = None;
                        }
                    }
                }
            }
        });
        Hook {
            port,
            reqs,
            script,
            auth,
            kill_at,
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
        self.reqs
            .lock()
            .unwrap()
            .iter()
            .filter_map(|r| Some((r.code, r.body["seq"].as_i64()?)))
            .collect()
    }

    fn all(&self) -> Vec<Req> {
        self.reqs.lock().unwrap().clone()
    }

    fn body(&self, i: usize) -> serde_json::Value {
        self.reqs.lock().unwrap()[i].body.clone()
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
    *hook.auth.lock().unwrap() = Some("Bearer s3cret".into());
    let agent = agent_with(dir.path(), &hook_notify(hook.port));
    // Killed right after the receiver acknowledged an event, before the agent could record
    // it: that event goes again after the restart (the one duplicate allowed).
    let n = hook.seqs().len() + 3;
    *hook.kill_at.lock().unwrap() = Some((n, agent.child.id()));
    wait_for(Duration::from_secs(10), || {
        hook.kill_at.lock().unwrap().is_none().then_some(())
    })
    .expect("the acknowledgement to kill after");
    agent.kill9();
    assert_eq!(hook.seqs().len(), n, "{:?}", hook.requests());
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
    // Nothing was refused: every request carried the configured bearer token.
    assert!(
        hook.requests().iter().all(|r| r.0 == 200),
        "{:?}",
        hook.requests()
    );
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
    // ... and the second try came only once the Retry-After (1 s) had passed, although the
    // notifier's own backoff is 100 ms.
    let all = hook.all();
    let waited = all[2].at.duration_since(all[1].at);
    assert!(
        waited >= Duration::from_millis(950) && waited < Duration::from_secs(5),
        "{waited:?}"
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

/// Regression (review defect 1): a notifier pointed at a wrong path (404, 405) or a receiver
/// whose body limit is below one event (413) used to dead-letter every alert and move past
/// it. Now it pauses on the event with the reason and delivers everything, in order, once
/// the receiver takes it.
#[test]
fn a_wrong_path_or_body_limit_pauses_the_notifier_and_loses_no_alert() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Hook::start(Duration::ZERO);
    hook.script
        .lock()
        .unwrap()
        .extend([(404, None), (404, None), (405, None), (413, None)]);
    let seqs = enqueue(
        &dir.path().join("data"),
        &[
            event("A", EventStatus::Firing, t(3), None),
            event("B", EventStatus::Firing, t(2), None),
        ],
    );
    let agent = agent_with(dir.path(), &hook_notify(hook.port));
    let paused = wait_for(Duration::from_secs(10), || {
        let n = notifier_status(&agent, "hook");
        (n["paused"] == true).then_some(n)
    })
    .unwrap_or_else(|| panic!("{}", notifier_status(&agent, "hook")));
    let why = paused["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("HTTP 404") && why.contains("check the url"),
        "{paused}"
    );
    assert_eq!(paused["dead_letters"], 0, "{paused}");
    let n = wait_for(Duration::from_secs(15), || {
        let n = notifier_status(&agent, "hook");
        (n["delivered"] == 2).then_some(n)
    })
    .unwrap_or_else(|| panic!("{}\n{}", notifier_status(&agent, "hook"), agent.log_text()));
    assert_eq!(n["dead_letters"], 0, "{n}");
    assert_eq!(n["paused"], false, "{n}");
    assert_eq!(
        hook.requests(),
        [
            (404, seqs[0]),
            (404, seqs[0]),
            (405, seqs[0]),
            (413, seqs[0]),
            (200, seqs[0]),
            (200, seqs[1])
        ]
    );
    // Paused means `max_backoff` (500 ms) between tries of the same event, never a hot loop.
    let all = hook.all();
    for w in all[..5].windows(2) {
        let gap = w[1].at.duration_since(w[0].at);
        assert!(gap >= Duration::from_millis(400), "{gap:?}");
    }
}

/// Notifier auth reaches the receiver as configured: the receiver refuses (401) any request
/// whose `Authorization` is not the expected one, so a wrong or missing header shows as no
/// delivery. Basic auth with extra headers, and a wrong bearer token (paused, kept).
#[test]
fn notifier_basic_auth_and_headers_reach_the_receiver_and_a_wrong_token_pauses() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Hook::start(Duration::ZERO);
    *hook.auth.lock().unwrap() = Some("Basic ZWRnZTpwQHNz".into()); // edge:p@ss
    enqueue(
        &dir.path().join("data"),
        &[event("A", EventStatus::Firing, t(2), None)],
    );
    let cfg = format!(
        "device_id = \"jet-1\"\n[[notify]]\ntype = \"webhook\"\nname = \"hook\"\n\
         url = \"http://127.0.0.1:{}/hook\"\nmin_backoff = \"100ms\"\nmax_backoff = \"300ms\"\n\
         username = \"edge\"\npassword = \"p@ss\"\nheaders = {{ X-Scope-OrgID = \"fleet-7\" }}\n",
        hook.port
    );
    let agent = agent_with(dir.path(), &cfg);
    wait_for(Duration::from_secs(10), || {
        (notifier_status(&agent, "hook")["delivered"] == 1).then_some(())
    })
    .unwrap_or_else(|| panic!("{:?}\n{}", hook.requests(), agent.log_text()));
    let r = &hook.all()[0];
    assert_eq!(r.code, 200);
    assert_eq!(
        r.headers.get("x-scope-orgid").map(String::as_str),
        Some("fleet-7")
    );
    assert_eq!(
        r.headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    drop(agent);

    // A wrong bearer token: refused, paused, the event kept (not dead-lettered).
    let dir = tempfile::tempdir().unwrap();
    let hook = Hook::start(Duration::ZERO);
    *hook.auth.lock().unwrap() = Some("Bearer right".into());
    enqueue(
        &dir.path().join("data"),
        &[event("A", EventStatus::Firing, t(2), None)],
    );
    let agent = agent_with(dir.path(), &hook_notify(hook.port)); // bearer_token = "s3cret"
    let n = wait_for(Duration::from_secs(10), || {
        let n = notifier_status(&agent, "hook");
        (n["paused"] == true && hook.requests().len() >= 2).then_some(n)
    })
    .unwrap_or_else(|| panic!("{}", notifier_status(&agent, "hook")));
    assert!(
        n["last_error"].as_str().unwrap().contains("credentials"),
        "{n}"
    );
    assert_eq!(
        (n["delivered"].as_i64(), n["dead_letters"].as_i64()),
        (Some(0), Some(0))
    );
    assert_eq!(n["pending_events"], 1, "{n}");
    assert!(hook
        .all()
        .iter()
        .all(|r| r.headers.get("authorization").map(String::as_str) == Some("Bearer s3cret")));
}

/// Threads named `prefix*` of process `pid` (the kernel keeps 15 bytes of a thread's name).
fn threads_named(pid: u32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim().starts_with(prefix))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Regression (review defect 10): each MQTT connect that timed out left its connection
/// thread behind (rumqttc kept trying for 5 s more). Against a listener that accepts and
/// never answers, retried every ~0.3 s, the agent keeps at most one such thread.
#[test]
fn mqtt_notifier_connect_timeouts_leave_no_threads_behind() {
    let dir = tempfile::tempdir().unwrap();
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    std::thread::spawn(move || {
        for s in silent.incoming().flatten() {
            h.lock().unwrap().push(s); // accepted, never answered
        }
    });
    enqueue(
        &dir.path().join("data"),
        &[event("A", EventStatus::Firing, t(2), None)],
    );
    let cfg = format!(
        "device_id = \"jet-1\"\n[[notify]]\ntype = \"mqtt\"\nname = \"mq\"\n\
         url = \"mqtt://127.0.0.1:{port}\"\ntopic = \"e/{{device_id}}/alerts\"\n\
         timeout = \"200ms\"\nmin_backoff = \"100ms\"\nmax_backoff = \"100ms\"\n"
    );
    let agent = agent_with(dir.path(), &cfg);
    let pid = agent.child.id();
    let mut most = 0;
    let end = Instant::now() + Duration::from_secs(8);
    while Instant::now() < end {
        most = most.max(threads_named(pid, "notify-mqtt-con"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let n = notifier_status(&agent, "mq");
    assert!(
        n["failures"].as_u64().unwrap() >= 4,
        "it kept retrying: {n}"
    );
    assert!(
        held.lock().unwrap().len() >= 4,
        "connections reached the listener"
    );
    assert!(most <= 1, "{most} connection threads at once");
    assert_eq!(n["pending_events"], 1, "{n}");
}

/// Regression (review defect 10): a CA file that does not parse was silently skipped (the
/// connection then failed with an unrelated TLS error, or trusted less than intended). Now
/// `check-config` refuses it naming the key and the file, for sinks and notifiers, and a
/// running agent says so at start and in the notifier's status (its events kept).
#[test]
fn a_ca_file_that_does_not_parse_is_refused_at_check_and_reported_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let notify = format!(
        "[[notify]]\ntype = \"mqtt\"\nname = \"mq\"\nurl = \"mqtts://127.0.0.1:{}\"\n\
         topic = \"e/alerts\"\nca_file = \"{}\"\n",
        free_port(),
        ca.display()
    );
    let sink = format!(
        "[[sink]]\ntype = \"mqtt\"\nname = \"s\"\nurl = \"mqtts://127.0.0.1:{}\"\n\
         topic = \"e\"\nca_file = \"{}\"\n",
        free_port(),
        ca.display()
    );
    for (text, table) in [(&notify, "[[notify]] \"mq\""), (&sink, "[[sink]] \"s\"")] {
        let f = dir.path().join("c.toml");
        std::fs::write(&f, text).unwrap();
        let out = std::process::Command::new(bin())
            .arg("check-config")
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        assert!(
            err.contains(table) && err.contains("ca_file") && err.contains("ca.pem"),
            "{err}"
        );
    }
    enqueue(
        &dir.path().join("data"),
        &[event("A", EventStatus::Firing, t(2), None)],
    );
    let agent = agent_with(dir.path(), &notify);
    let n = wait_for(Duration::from_secs(10), || {
        let n = notifier_status(&agent, "mq");
        n["last_error"].is_string().then_some(n)
    })
    .unwrap_or_else(|| panic!("{}", agent.log_text()));
    assert!(n["last_error"].as_str().unwrap().contains("ca_file"), "{n}");
    assert_eq!(n["paused"], true, "{n}");
    assert_eq!(n["pending_events"], 1, "{n}");
    assert!(agent.log_text().contains("ca_file"), "{}", agent.log_text());
}

/// Regression (review defect 7): while a notifier is disabled, the outbox grew without
/// bound. It is now held within `[alerts] outbox_max_bytes`: the oldest events go unsent
/// (counted, with a warning in the status), the latest event of each alert still firing
/// stays.
#[test]
fn the_outbox_is_bounded_while_a_notifier_is_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut evs = vec![event("StillHot", EventStatus::Firing, t(90), None)];
    for i in 0..100 {
        let s = t(80 - i / 2);
        evs.push(event(&format!("Flap{i}"), EventStatus::Firing, s, None));
        evs.push(event(
            &format!("Flap{i}"),
            EventStatus::Resolved,
            s,
            Some(s + 1_000_000),
        ));
    }
    let seqs = enqueue(&data, &evs);
    let cfg = "device_id = \"jet-1\"\n[alerts]\noutbox_max_bytes = 20000\n\
               [[notify]]\ntype = \"webhook\"\nname = \"off\"\nurl = \"http://127.0.0.1:9/x\"\n\
               enabled = false\n";
    let agent = agent_with(dir.path(), cfg);
    let n = wait_for(Duration::from_secs(10), || {
        let n = notifier_status(&agent, "off");
        (n["pruned_unsent"].as_i64().unwrap_or(0) > 0).then_some(n)
    })
    .unwrap_or_else(|| panic!("{}\n{}", notifier_status(&agent, "off"), agent.log_text()));
    assert!(
        n["warning"].as_str().unwrap_or_default().contains("pruned"),
        "{n}"
    );
    assert_eq!(n["position"], 0, "{n}");
    let (conn, _) = store::open(&agent.dir, Mode::ReadOnly).unwrap();
    let (rows, bytes, first): (i64, i64, i64) = conn
        .query_row(
            "SELECT COUNT(*), SUM(LENGTH(event)), MIN(seq) FROM alert_outbox",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert!(bytes <= 20_000, "{bytes} bytes in {rows} rows");
    assert_eq!(first, seqs[0], "the firing alert's latest event is kept");
    assert_eq!(
        n["pruned_unsent"].as_i64().unwrap() + rows,
        evs.len() as i64,
        "{n}"
    );
    assert!(
        agent.log_text().contains("over its bound"),
        "{}",
        agent.log_text()
    );
}
