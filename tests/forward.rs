//! Store-and-forward against real peers: InfluxDB 1.x (Debian `influxdb`), a fault-injecting
//! proxy in front of it, a second edgewatch as an InfluxDB 2.x receiver, and mosquitto
//! (plain and TLS with a CA made here).

use std::time::Duration;

use crate::support::peers::*;
use crate::support::*;

const T0: i64 = 1_764_000_000_000_000_000;

fn influx_sink(name: &str, url: &str, extra: &str) -> String {
    format!(
        "[[sink]]\ntype = \"influxdb\"\nname = \"{name}\"\nurl = \"{url}\"\nversion = 1\ndatabase = \"edge\"\n\
         max_delay = \"50ms\"\nmin_backoff = \"50ms\"\nmax_backoff = \"500ms\"\n{extra}"
    )
}

#[test]
fn influx_backlog_of_100k_points_written_while_down_arrives_exactly_once() {
    if !Influxd::available() {
        eprintln!("skipped: no influxd");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let top = format!(
        "device_id = \"jet-1\"\n[tags]\nsite = \"lab\"\n{}",
        influx_sink("influx", &format!("http://127.0.0.1:{port}"), "")
    );
    let agent = agent_with(dir.path(), &top);
    write_points(&agent, "m", 0, 100_000, T0);
    let s = wait_for(Duration::from_secs(10), || {
        let s = sink_status(&agent, "influx");
        (s["backlog_points"] == 100_000 && s["last_error"].is_string()).then_some(s)
    })
    .expect("backlog visible");
    assert_eq!(s["connected"], false, "{s}");
    assert!(s["oldest_unsent_age_s"].as_f64().is_some(), "{s}");
    let influx = influxd_on(&dir.path().join("influx"), port);
    influx_create_db(&influx, "edge");
    let ok = wait_for(Duration::from_secs(40), || {
        (influx_count(&influx, "edge", "m") == 100_000).then_some(())
    });
    assert!(
        ok.is_some(),
        "count {} {}",
        influx_count(&influx, "edge", "m"),
        agent.log_text()
    );
    let s = wait_for(Duration::from_secs(5), || {
        let s = sink_status(&agent, "influx");
        (s["backlog_points"] == 0).then_some(s)
    })
    .unwrap();
    assert_eq!(s["forwarded_points"], 100_000, "{s}");
    assert_eq!(s["connected"], true);
    // Identity tags, original timestamps, ascending.
    let v = influx.query(
        "edge",
        "SELECT v FROM m WHERE device_id = 'jet-1' AND site = 'lab' ORDER BY time ASC LIMIT 3",
    );
    let vals = &v["results"][0]["series"][0]["values"];
    assert_eq!(vals[0][1], 0, "{v}");
    assert_eq!(vals[2][1], 2, "{v}");
    let v = influx.query("edge", "SELECT last(v) FROM m");
    assert_eq!(v["results"][0]["series"][0]["values"][0][1], 99_999);
}

#[test]
fn influx_faults_500_429_400_401_lose_nothing_but_the_dead_letter() {
    if !Influxd::available() {
        eprintln!("skipped: no influxd");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let influx = Influxd::start(&dir.path().join("influx"));
    influx_create_db(&influx, "edge");
    let proxy = FaultProxy::start(influx.http);
    proxy.push(500, None);
    proxy.push(429, Some(("Retry-After", "1")));
    proxy.push(400, None);
    proxy.push(401, None);
    let top = influx_sink(
        "f",
        &format!("http://127.0.0.1:{}", proxy.port),
        "max_points = 1000\n",
    );
    let agent = agent_with(dir.path(), &top);
    write_points(&agent, "m", 0, 10_000, T0);
    let s = wait_for(Duration::from_secs(30), || {
        let s = sink_status(&agent, "f");
        (s["backlog_points"] == 0 && s["forwarded_points"].as_i64().unwrap_or(0) > 0).then_some(s)
    })
    .unwrap_or_else(|| panic!("{} {}", sink_status(&agent, "f"), agent.log_text()));
    let dead = s["dead_letter_points"].as_i64().unwrap();
    assert!(dead > 0 && dead <= 2048, "{s}");
    assert_eq!(s["dead_letter_batches"], 1, "{s}");
    assert_eq!(
        s["forwarded_points"].as_i64().unwrap() + dead,
        10_000,
        "{s}"
    );
    assert_eq!(influx_count(&influx, "edge", "m"), 10_000 - dead);
    assert!(s["replayed_batches"].as_i64().unwrap() >= 2, "{s}");
    let statuses: Vec<u16> = proxy.requests.lock().unwrap().iter().map(|r| r.0).collect();
    assert_eq!(&statuses[..4], &[500, 429, 400, 401], "{statuses:?}");
    assert!(
        agent.log_text().contains("credentials refused"),
        "{}",
        agent.log_text()
    );
    // The dead letter stays inspectable, with its reason and payload.
    let conn = rusqlite::Connection::open(agent.dir.join("edgewatch.db")).unwrap();
    let (status, reason, payload): (i64, String, Vec<u8>) = conn
        .query_row(
            "SELECT status, reason, payload FROM dead_letters",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(status, 400);
    assert!(reason.contains("injected 400"), "{reason}");
    assert_eq!(
        String::from_utf8(payload).unwrap().lines().count() as i64,
        dead
    );
}

#[test]
fn v2_sink_into_a_second_edgewatch_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let gw = agent_with(&dir.path().join("gw"), "");
    let top = format!(
        "device_id = \"dev-9\"\n[[sink]]\ntype = \"influxdb\"\nname = \"gw\"\nurl = \"http://{}\"\norg = \"fleet\"\nbucket = \"edge\"\ntoken = \"t0k\"\nmax_delay = \"50ms\"\n",
        gw.http
    );
    let edge = agent_with(&dir.path().join("edge"), &top);
    write_points(&edge, "m", 0, 5_000, T0);
    let ok = wait_for(Duration::from_secs(20), || {
        let (c, b) = get(&gw
            .url("/api/v1/query?measurement=m&from=0&to=4000000000000000000&tag.device_id=dev-9"))
        .ok()?;
        let v: serde_json::Value = serde_json::from_str(&b).ok()?;
        (c == 200 && v["series"][0]["points"].as_array().map(|a| a.len()) == Some(5_000))
            .then_some(())
    });
    assert!(
        ok.is_some(),
        "{}\n{}",
        sink_status(&edge, "gw"),
        edge.log_text()
    );
}

fn mqtt_sink(port: u16, scheme: &str, extra: &str) -> String {
    format!(
        "device_id = \"d1\"\n[[sink]]\ntype = \"mqtt\"\nname = \"mq\"\nurl = \"{scheme}://127.0.0.1:{port}\"\n\
         topic = \"ew/{{device_id}}\"\nmax_delay = \"50ms\"\nmin_backoff = \"50ms\"\nmax_backoff = \"300ms\"\n\
         max_points = 1000\ninflight = 2\n{extra}"
    )
}

#[test]
fn mqtt_drain_survives_broker_restart_and_agent_kill9_with_counted_duplicates() {
    if !Mosquitto::available() {
        eprintln!("skipped: no mosquitto");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let broker = Mosquitto::start(&dir.path().join("mq"), port, None);
    let sub = Sub::start(port, "ew/d1", "sub-data", &dir.path().join("sub.txt"), None);
    let st = Sub::start(
        port,
        "edgewatch/d1/status",
        "sub-status",
        &dir.path().join("status.txt"),
        None,
    );
    std::thread::sleep(Duration::from_millis(300)); // let the subscribers' SUBSCRIBE land
    let n = 60_000;
    let cfg = mqtt_sink(port, "mqtt", "max_rate = 20000\n");
    let agent = agent_with(dir.path(), &cfg);
    write_points(&agent, "m", 0, n, T0);
    // Broker restart in the middle of the drain.
    wait_for(Duration::from_secs(20), || {
        (sink_status(&agent, "mq")["forwarded_points"].as_i64()? > 10_000).then_some(())
    })
    .expect("draining");
    broker.stop();
    wait_for(Duration::from_secs(10), || {
        (sink_status(&agent, "mq")["connected"] == false).then_some(())
    })
    .expect("sees the broker down");
    let broker = Mosquitto::start(&dir.path().join("mq"), port, None);
    // Agent kill -9 in the middle of the drain.
    wait_for(Duration::from_secs(20), || {
        (sink_status(&agent, "mq")["forwarded_points"].as_i64()? > 35_000).then_some(())
    })
    .expect("draining again");
    let http = agent.http.port();
    agent.kill9();
    assert!(
        wait_for(Duration::from_secs(10), || st
            .text()
            .contains("offline")
            .then_some(()))
        .is_some(),
        "last will"
    );
    let agent = agent_on(dir.path(), &cfg, http);
    let s = wait_for(Duration::from_secs(30), || {
        let s = sink_status(&agent, "mq");
        (s["backlog_points"] == 0 && s["forwarded_points"].as_i64()? >= n as i64).then_some(s)
    })
    .unwrap_or_else(|| panic!("{}\n{}", sink_status(&agent, "mq"), agent.log_text()));
    let (seqs, ts) = wait_for(Duration::from_secs(10), || {
        let (seqs, ts) = parse_mqtt(&sub.text());
        let mut u = ts.clone();
        u.sort();
        u.dedup();
        (u.len() == n).then_some((seqs, ts))
    })
    .unwrap_or_else(|| {
        panic!("subscriber got {} distinct points", {
            let mut u = parse_mqtt(&sub.text()).1;
            u.sort();
            u.dedup();
            u.len()
        })
    });
    let dups = ts.len() - n;
    // Two faults, at most `inflight` (2) batches each; a batch is whole chunks (<= 2048
    // points here, since one chunk is never split).
    let mut distinct = seqs.clone();
    distinct.sort();
    distinct.dedup();
    let dup_batches = seqs.len() - distinct.len();
    assert!(dup_batches <= 2 * 2, "{dup_batches} duplicate batches");
    assert!(dups <= 2 * 2 * 2048, "{dups} duplicate points");
    assert!(s["replayed_batches"].as_i64().unwrap() >= 1, "{s}");
    // Sequence numbers only grow, except for replays of the batches in flight.
    let mut u = seqs.clone();
    u.sort();
    u.dedup();
    assert_eq!(
        u.len() as i64,
        *u.last().unwrap(),
        "no gap in sequence numbers"
    );
    assert!(st.text().contains("online"));
    drop(broker);
}

#[test]
fn mqtt_over_tls_with_a_test_ca() {
    if !Mosquitto::available() {
        eprintln!("skipped: no mosquitto");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::make(&dir.path().join("pki"));
    let port = free_port();
    let _broker = Mosquitto::start(&dir.path().join("mq"), port, Some(&ca));
    let sub = Sub::start(
        port,
        "ew/d1",
        "tls-sub",
        &dir.path().join("sub.txt"),
        Some(&ca.ca),
    );
    std::thread::sleep(Duration::from_millis(300));
    let cfg = mqtt_sink(
        port,
        "mqtts",
        &format!("ca_file = \"{}\"\n", ca.ca.display()),
    );
    let agent = agent_with(dir.path(), &cfg);
    write_points(&agent, "m", 0, 3_000, T0);
    let ok = wait_for(Duration::from_secs(20), || {
        (parse_mqtt(&sub.text()).1.len() >= 3_000).then_some(())
    });
    assert!(
        ok.is_some(),
        "{}\n{}",
        sink_status(&agent, "mq"),
        agent.log_text()
    );
    assert_eq!(sink_status(&agent, "mq")["connected"], true);
}
