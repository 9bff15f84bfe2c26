//! SIGTERM flush, restart persistence, kill -9 recovery during heavy ingest, and the
//! refusal of a database written by a newer edgewatch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::support::*;

const QUIET: &str = "[host]\nenabled = false\n[tegrastats]\nenabled = false\n";

/// Starts `edgewatch run` on `data` (free ports), expects it to fail at start, returns its
/// stderr.
fn refused_start(data: &std::path::Path) -> String {
    let out = std::process::Command::new(bin())
        .args(["run", "--data-dir", data.to_str().unwrap(), "--http-listen"])
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--udp-listen")
        .arg(format!("127.0.0.1:{}", free_udp_port()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn count(agent: &Agent, q: &str) -> usize {
    let (code, body) = get(&agent.url(&format!(
        "/api/v1/query?from=-1h&to=now&limit=100000000&{q}"
    )))
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["points"].as_array().unwrap().len())
        .sum()
}

#[test]
fn sigterm_flushes_and_exits_0_quickly_and_data_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    // Recent timestamps: retention rightly drops points from 1970 once rolled up.
    let base = edgewatch::now_ns() - 60_000_000_000;
    let body: String = (0..5000)
        .map(|i| format!("persist,k=a v={i} {}\n", base + i))
        .collect();
    assert_eq!(
        post(&agent.url("/write"), body.as_bytes(), &[]).unwrap().0,
        204
    );
    let log = agent.log.clone();
    let (code, took) = agent.terminate();
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    // Everything stopped in order, nothing hit the deadline (a producer handle kept alive
    // would keep the queue open and the writer waiting).
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("shutdown deadline"), "{text}");
    let agent = Agent::start(dir.path(), QUIET);
    assert_eq!(count(&agent, "measurement=persist"), 5000);
    assert!(agent.log_text().contains("store open"));
}

/// Points stored per value of tag `tag`, for the series matching `q`.
fn count_by_tag(agent: &Agent, q: &str, tag: &str) -> std::collections::BTreeMap<String, usize> {
    let (code, body) = get(&agent.url(&format!(
        "/api/v1/query?from=-1h&to=now&limit=100000000&{q}"
    )))
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut out = std::collections::BTreeMap::new();
    for s in v["series"].as_array().unwrap() {
        let key = s["tags"][tag].as_str().unwrap_or("").to_string();
        *out.entry(key).or_default() += s["points"].as_array().unwrap().len();
    }
    out
}

/// SIGTERM while a client writes as fast as it can: exit 0, and after a restart every
/// acknowledged request is there whole; the only other data is at most the one request the
/// agent stored but could no longer answer.
#[test]
fn sigterm_during_ingest_still_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let url = agent.url("/write");
    let stop = AtomicBool::new(false);
    // Request numbers answered 204, in order (one request at a time).
    let acked: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let base = edgewatch::now_ns() - 60_000_000_000;
                let body: String = (0..1000)
                    .map(|j| format!("busy,b={i} v={j} {}\n", base + j))
                    .collect();
                match post(&url, body.as_bytes(), &[]) {
                    Ok((204, _)) => acked.lock().unwrap().push(i),
                    _ => break,
                }
                i += 1;
            }
        });
        // Signal in the middle of the stream, once it is flowing.
        let flowing = wait_for(Duration::from_secs(20), || {
            (acked.lock().unwrap().len() >= 5).then_some(())
        });
        let pid = agent.pid();
        signal(pid, "TERM");
        stop.store(true, Ordering::Relaxed);
        assert!(
            flowing.is_some(),
            "fewer than 5 writes acknowledged in 20 s"
        );
    });
    let mut agent = agent;
    let status = agent.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", agent.log_text());
    drop(agent);
    let acked = acked.into_inner().unwrap();
    assert!(acked.len() >= 5, "{} writes acknowledged", acked.len());
    let agent = Agent::start(dir.path(), QUIET);
    let stored = count_by_tag(&agent, "measurement=busy", "b");
    for id in &acked {
        assert_eq!(
            stored.get(&id.to_string()),
            Some(&1000),
            "acknowledged request {id} lost or partial"
        );
    }
    // Anything else is the next request, whole, stored as the agent stopped answering.
    let next = (acked.len()).to_string();
    let extra: Vec<_> = stored
        .iter()
        .filter(|(k, _)| k.parse::<usize>().map_or(true, |k| k >= acked.len()))
        .collect();
    assert!(
        extra.is_empty() || extra == vec![(&next, &1000)],
        "stored beyond the {} acknowledged requests: {extra:?}",
        acked.len()
    );
    assert_eq!(
        count(&agent, "measurement=busy"),
        (acked.len() + extra.len()) * 1000
    );
}

#[test]
fn kill_9_during_heavy_ingest_keeps_every_acknowledged_point_and_an_intact_db() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let url = agent.url("/write");
    let acked: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..3 {
            let (url, acked, stop) = (&url, &acked, &stop);
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let id = t * 100_000 + i;
                    let base = edgewatch::now_ns() - 60_000_000_000;
                    let body: String = (0..2000)
                        .map(|j| format!("k9,req={id} v={j},w={j}i {}\n", base + j as i64))
                        .collect();
                    match post(url, body.as_bytes(), &[]) {
                        Ok((204, _)) => acked.lock().unwrap().push(id),
                        Ok((503, _)) => {}
                        _ => break, // the server died mid-request: unacknowledged
                    }
                    i += 1;
                }
            });
        }
        std::thread::sleep(Duration::from_millis(1500));
        let pid = agent.pid();
        signal(pid, "KILL");
        stop.store(true, Ordering::Relaxed);
    });
    drop(agent);
    let acked = acked.into_inner().unwrap();
    assert!(
        acked.len() > 3,
        "too few writes acknowledged before the kill: {}",
        acked.len()
    );
    // The database is intact.
    let db = dir.path().join("data/edgewatch.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(conn);
    // Every acknowledged request is there in full after a restart.
    let agent = Agent::start(dir.path(), QUIET);
    for id in acked {
        assert_eq!(
            count(&agent, &format!("measurement=k9&field=v&tag.req={id}")),
            2000,
            "req {id}"
        );
    }
}

#[test]
fn a_database_from_a_newer_edgewatch_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let data = agent.dir.clone();
    assert_eq!(agent.terminate().0, Some(0));
    let db = data.join("edgewatch.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "user_version", 9999).unwrap();
    drop(conn);
    let err = refused_start(&data);
    assert!(
        err.contains("newer than this edgewatch") && err.contains("9999"),
        "{err}"
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 9999);
}

#[test]
fn a_busy_port_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let out = std::process::Command::new(bin())
        .args([
            "run",
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--http-listen",
        ])
        .arg(addr.to_string())
        .arg("--udp-listen")
        .arg(format!("127.0.0.1:{}", free_udp_port()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen on http"), "{err}");
}

/// Two agents on one data directory would each replay and store the other's journal
/// records: the second is refused at its start, naming the cause, and the first goes on.
#[test]
fn a_second_agent_on_the_same_store_is_refused_and_the_first_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    assert_eq!(post(&agent.url("/write"), b"m v=1", &[]).unwrap().0, 204);
    let err = refused_start(&agent.dir);
    assert!(
        err.contains("edgewatch.journal") && err.contains("is the agent running"),
        "{err}"
    );
    assert_eq!(post(&agent.url("/write"), b"m v=2", &[]).unwrap().0, 204);
    assert_eq!(count(&agent, "measurement=m"), 2);
}

/// The agent's own health is stored as data (and so forwarded and rolled up like any
/// sample), and every start leaves an `edgewatch_event,kind=start` point: a restart shows up
/// in the data next to the latency it may explain.
#[test]
fn own_health_is_stored_and_each_start_is_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = format!("{QUIET}[health]\nenabled = true\ninterval = \"200ms\"\n");
    let agent = Agent::start(dir.path(), &cfg);
    let body: String = (0..100).map(|i| format!("m v={i}\n")).collect();
    assert_eq!(
        post(&agent.url("/write"), body.as_bytes(), &[]).unwrap().0,
        204
    );
    // `points_written` counts committed points: the status read for the latest commits the
    // write, which is otherwise held for the writer's interval.
    assert!(agent.status()["ingest"]["points_written"].as_u64() >= Some(100));
    let seen = wait_for(Duration::from_secs(10), || {
        (count(&agent, "measurement=edgewatch_agent&field=cpu_pct") >= 2).then_some(())
    });
    assert!(seen.is_some(), "{}", agent.log_text());
    let (_, body) = get(&agent
        .url("/api/v1/query?measurement=edgewatch_agent&field=points_written&from=-1h&to=now"))
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let written = v["series"][0]["points"]
        .as_array()
        .and_then(|p| p.last())
        .and_then(|p| p[1].as_f64())
        .unwrap_or(0.0);
    assert!(written >= 100.0, "{body}");
    assert!(count(&agent, "measurement=edgewatch_agent&field=rss_bytes") >= 2);
    assert!(
        count(
            &agent,
            "measurement=edgewatch_agent&field=disk_written_bytes"
        ) >= 2
    );
    // /metrics exposes the same health natively, not these series again.
    let (_, metrics) = get(&agent.url("/metrics")).unwrap();
    assert!(!metrics.contains("edgewatch_agent_"), "{metrics}");
    let first_pid = agent.pid();
    let log = agent.log.clone();
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("shutdown deadline"), "{text}");
    let agent = Agent::start(dir.path(), &cfg);
    let events = wait_for(Duration::from_secs(10), || {
        let n = count(
            &agent,
            "measurement=edgewatch_event&tag.kind=start&field=pid",
        );
        (n >= 2).then_some(n)
    });
    assert_eq!(events, Some(2), "{}", agent.log_text());
    let (_, body) = get(&agent
        .url("/api/v1/query?measurement=edgewatch_event&tag.kind=start&field=pid&from=-1h&to=now"))
    .unwrap();
    assert!(body.contains(&first_pid.to_string()), "{body}");
    assert!(body.contains(&agent.pid().to_string()), "{body}");
}
