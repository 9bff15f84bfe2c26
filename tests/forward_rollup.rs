//! Bandwidth-aware forwarding and reconnect storms: a `forward = "rollup:1m"` sink against a
//! real InfluxDB (through the fault proxy, for a kill -9 mid-drain), the eviction fallback's
//! percentiles, the reconnect jitter across real agent processes, and five agents against
//! one throttling receiver (429 + `Retry-After`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::support::peers::*;
use crate::support::throttle::Throttle;
use crate::support::*;

const MIN: i64 = 60_000_000_000;

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// Collectors off; the rollup job every second with a one-minute lateness.
const ROLLING: &str =
    "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n\
     [rollup]\nenabled = true\ninterval = \"1s\"\nlateness = \"1m\"\n";

/// An InfluxDB query answered with ns epochs.
fn influx_q(i: &Influxd, q: &str) -> serde_json::Value {
    let r = ureq::post(&format!("http://{}/query", i.http))
        .query("db", "edge")
        .query("epoch", "ns")
        .query("q", q)
        .call()
        .expect("influx query");
    serde_json::from_str(&r.into_string().unwrap()).unwrap()
}

/// The store's own answer for `agg` of field `field` of `m,gpu=<gpu>` per minute.
fn store_minutes(
    agent: &Agent,
    gpu: u32,
    field: &str,
    agg: &str,
    from: i64,
    to: i64,
) -> Vec<(i64, f64)> {
    let (code, body) = get(&agent.url(&format!(
        "/api/v1/query?measurement=m&field={field}&tag.gpu={gpu}&from={from}&to={to}&step=1m&agg={agg}"
    )))
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["tier"], "1m", "{body}");
    v["series"][0]["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_i64().unwrap(), p[1].as_f64().unwrap()))
        .collect()
}

/// Timestamp of a line of line protocol.
fn line_ts(l: &str) -> i64 {
    l.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn rollup_sink_sends_each_final_minute_once_with_the_store_values_across_a_kill9() {
    if !require(Peer::Influxdb) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let influx = Influxd::start(&dir.path().join("influx"));
    influx_create_db(&influx, "edge");
    // Offline (502) while the data is written and rolled up.
    let proxy = FaultProxy::start(influx.http);
    proxy.down.store(true, Ordering::SeqCst);
    // 30 minutes x 3 tag sets x 2 fields = 180 rows; 50 points a batch = 8 whole minutes
    // (48 rows): four batches.
    let cfg = format!(
        "{ROLLING}[[sink]]\ntype = \"influxdb\"\nname = \"r\"\nurl = \"http://127.0.0.1:{}\"\n\
         version = 1\ndatabase = \"edge\"\nforward = \"rollup:1m\"\nmax_points = 50\n\
         max_delay = \"50ms\"\nmin_backoff = \"50ms\"\nmax_backoff = \"300ms\"\n\
         reconnect_jitter = \"0s\"\n",
        proxy.port
    );
    let adir = dir.path().join("agent");
    std::fs::create_dir_all(&adir).unwrap();
    let agent = Agent::start(&adir, &cfg);
    let now = now_ns();
    let start = (now - 40 * MIN) / MIN * MIN;
    let mut body = String::new();
    for i in 0..30 * 60i64 {
        for g in 0..3i64 {
            let lat = ((i * 37 + g * 11) % 200) as f64 / 4.0 + g as f64;
            body.push_str(&format!(
                "m,gpu={g} lat={lat},n={}i {}\n",
                i % 7,
                start + i * 1_000_000_000
            ));
        }
    }
    // A point now moves the watermark: every minute above is final (lateness 1 min), the
    // marker's own minute is not.
    body.push_str(&format!("mark v=1 {now}\n"));
    let (code, resp) = post(&agent.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
    assert_eq!(code, 204, "{resp}");
    let s = wait_for(Duration::from_secs(20), || {
        let s = sink_status(&agent, "r");
        (s["backlog_points"] == 180 && s["backlog_chunks"] == 30).then_some(s)
    })
    .unwrap_or_else(|| panic!("{}\n{}", sink_status(&agent, "r"), agent.log_text()));
    assert_eq!(s["forward"], "rollup:1m", "{s}");
    assert_eq!(s["forwarded_points"], 0, "{s}");
    // The link returns; the third batch reaches InfluxDB but is never answered: kill -9.
    proxy.stall_at.store(3, Ordering::SeqCst);
    proxy.down.store(false, Ordering::SeqCst);
    let delivered = || proxy.delivered.lock().unwrap().clone();
    wait_for(Duration::from_secs(20), || {
        (delivered().len() >= 3).then_some(())
    })
    .unwrap_or_else(|| panic!("{}\n{}", sink_status(&agent, "r"), agent.log_text()));
    std::thread::sleep(Duration::from_millis(300));
    let s = sink_status(&agent, "r");
    assert_eq!(s["forwarded_points"], 96, "two batches acknowledged: {s}");
    agent.kill9();
    proxy.stall_at.store(usize::MAX, Ordering::SeqCst);
    let agent = Agent::start(&adir, &cfg);
    let s = wait_for(Duration::from_secs(20), || {
        let s = sink_status(&agent, "r");
        (s["backlog_points"] == 0 && s["forwarded_points"] == 180).then_some(s)
    })
    .unwrap_or_else(|| panic!("{}\n{}", sink_status(&agent, "r"), agent.log_text()));
    assert!(s["replayed_batches"].as_i64().unwrap() >= 1, "{s}");
    assert!(
        s["rollup_cursor_ns"].as_i64().unwrap() >= start + 29 * MIN,
        "{s}"
    );
    // On the wire: whole minutes in order; only the batch in flight at the kill came twice.
    let bodies = delivered();
    let mut batches: Vec<Vec<String>> = Vec::new();
    for b in &bodies {
        let lines: Vec<String> = b.lines().map(str::to_string).collect();
        if batches.last() != Some(&lines) {
            batches.push(lines);
        }
    }
    assert_eq!(bodies.len(), 5, "four batches and one replay: {bodies:#?}");
    assert_eq!(
        bodies[2], bodies[3],
        "the batch in flight is sent again as it was"
    );
    let mut last = i64::MIN;
    let mut per_minute: BTreeMap<(String, i64), usize> = BTreeMap::new();
    for b in &batches {
        let ts: Vec<i64> = b.iter().map(|l| line_ts(l)).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{b:#?}");
        assert!(ts[0] > last, "batches in bucket order, whole minutes");
        last = *ts.last().unwrap();
        assert_eq!(ts.len() % 6, 0, "whole minutes of 6 rows");
        for l in b {
            assert!(l.contains("edgewatch_rollup=60s"), "{l}");
            let series = l.split(' ').next().unwrap().to_string();
            let fields = l.split(' ').nth(1).unwrap();
            let field = fields.split('_').next().unwrap();
            *per_minute
                .entry((format!("{series} {field}"), line_ts(l)))
                .or_default() += 1;
        }
    }
    assert_eq!(
        per_minute.len(),
        180,
        "one point per series x field x minute"
    );
    assert!(per_minute.values().all(|&c| c == 1));
    // In InfluxDB: no raw point, no point of a minute that was not final, 30 minutes per
    // series, each equal to the store's own answer.
    let raw = influx_q(&influx, "SELECT count(lat) FROM m");
    assert!(raw["results"][0]["series"].is_null(), "{raw}");
    let mark = influx_q(&influx, "SELECT count(v_mean) FROM mark");
    assert!(mark["results"][0]["series"].is_null(), "{mark}");
    let to = start + 30 * MIN - 1;
    for g in 0..3u32 {
        for (field, aggs) in [
            (
                "lat",
                &["mean", "min", "max", "count", "p50", "p90", "p99"][..],
            ),
            ("n", &["mean", "count", "p99"][..]),
        ] {
            let cols: Vec<String> = aggs.iter().map(|a| format!("{field}_{a}")).collect();
            let r = influx_q(
                &influx,
                &format!(
                    "SELECT {} FROM m WHERE gpu = '{g}' AND edgewatch_rollup = '60s'",
                    cols.join(", ")
                ),
            );
            let rows = r["results"][0]["series"][0]["values"].as_array().unwrap();
            assert_eq!(rows.len(), 30, "{r}");
            for (k, agg) in aggs.iter().enumerate() {
                let want = store_minutes(&agent, g, field, agg, start, to);
                assert_eq!(want.len(), 30);
                for (row, (ts, v)) in rows.iter().zip(&want) {
                    assert_eq!(row[0].as_i64().unwrap(), *ts);
                    let got = row[k + 1].as_f64().unwrap();
                    assert!(
                        (got - v).abs() <= 1e-9 * v.abs().max(1.0),
                        "gpu {g} {field}_{agg} at {ts}: influx {got}, store {v}"
                    );
                }
            }
        }
    }
}

#[test]
fn rollup_mode_is_refused_for_other_spellings_and_missing_tiers_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("e.toml");
    let sink =
        "[[sink]]\ntype = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://127.0.0.1:1\"\ntopic = \"t\"\n";
    for (extra, want) in [
        ("forward = \"rollup:5m\"\n", "line 6"),
        (
            "forward = \"rollups\"\n",
            "expected \"raw\", \"rollup:1m\" or \"rollup:1h\"",
        ),
    ] {
        std::fs::write(&cfg, format!("{sink}{extra}")).unwrap();
        let out = std::process::Command::new(bin())
            .arg("check-config")
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains("forward") && err.contains(want), "{err}");
    }
    std::fs::write(
        &cfg,
        format!("[rollup]\ntiers = [\"1m\"]\n{sink}forward = \"rollup:1h\"\n"),
    )
    .unwrap();
    let out = std::process::Command::new(bin())
        .arg("check-config")
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("rollup:1h") && err.contains("[rollup] tiers"),
        "{err}"
    );
}

/// 600 points 1 s apart from `start`: `m,k=v v=<from + j>i`.
fn write_seconds(agent: &Agent, from: usize, n: usize, start: i64) {
    let mut body = String::new();
    for j in 0..n {
        body.push_str(&format!(
            "m,k=v v={}i {}\n",
            from + j,
            start + j as i64 * 1_000_000_000
        ));
    }
    let (code, resp) = post(&agent.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
    assert_eq!(code, 204, "{resp}");
}

#[test]
fn eviction_fallback_spans_carry_p50_p90_p99() {
    if !require(Peer::Influxdb) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let top = format!(
        "device_id = \"d1\"\n[[sink]]\ntype = \"influxdb\"\nname = \"i\"\nurl = \"http://127.0.0.1:{port}\"\n\
         version = 1\ndatabase = \"edge\"\nmax_delay = \"50ms\"\nmin_backoff = \"50ms\"\nmax_backoff = \"300ms\"\n"
    );
    let agent = agent_with(dir.path(), &top);
    // Ten old minutes (3 h ago) evicted before the sink sent them, ten recent ones kept.
    let now = now_ns();
    let old = (now - 180 * MIN) / MIN * MIN;
    write_seconds(&agent, 0, 600, old);
    write_seconds(&agent, 600, 600, (now - 10 * MIN) / MIN * MIN);
    let maint = dir.path().join("maintain.toml");
    std::fs::write(&maint, "[retention]\nraw = \"1h\"\n").unwrap();
    let out = std::process::Command::new(bin())
        .arg("maintain")
        .arg("--data-dir")
        .arg(&agent.dir)
        .arg("--config")
        .arg(&maint)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let influx = influxd_on(&dir.path().join("influx"), port);
    influx_create_db(&influx, "edge");
    wait_for(Duration::from_secs(30), || {
        (sink_status(&agent, "i")["fallback_points"] == 10).then_some(())
    })
    .unwrap_or_else(|| panic!("{}\n{}", sink_status(&agent, "i"), agent.log_text()));
    let r = influx_q(
        &influx,
        "SELECT v_p50, v_p90, v_p99, v_count FROM m WHERE edgewatch_rollup = '60s'",
    );
    let rows = r["results"][0]["series"][0]["values"].as_array().unwrap();
    assert_eq!(rows.len(), 10, "{r}");
    for (b, row) in rows.iter().enumerate() {
        assert_eq!(row[0].as_i64().unwrap(), old + b as i64 * MIN);
        assert_eq!(row[4], 60);
        // Minute b holds 60b .. 60b + 59: ranks 29, 53, 58 (floor(q * 59)), within 1%.
        for (k, rank) in [29.0, 53.0, 58.0].iter().enumerate() {
            let want = 60.0 * b as f64 + rank;
            let got = row[k + 1].as_f64().unwrap();
            assert!(
                (got - want).abs() <= 0.01 * want.max(1.0),
                "minute {b} q{k}: {got} vs {want}"
            );
        }
    }
}

/// An agent `d<i>` in `dir` whose InfluxDB sink points at `port`, with `extra` sink keys.
fn fleet_agent(dir: &std::path::Path, i: usize, port: u16, extra: &str) -> (String, Agent) {
    let top = format!(
        "device_id = \"d{i}\"\n[[sink]]\ntype = \"influxdb\"\nname = \"i\"\nurl = \"http://127.0.0.1:{port}\"\n\
         version = 1\ndatabase = \"edge\"\nmax_delay = \"50ms\"\nmin_backoff = \"50ms\"\nmax_backoff = \"500ms\"\n{extra}"
    );
    let a = agent_with(&dir.join(format!("a{i}")), &top);
    (top, a)
}

/// Distinct lines received per device.
fn lines_per_device(
    seen: &[crate::support::throttle::Request],
) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in seen {
        for l in &r.lines {
            if let Some(d) = l.split(',').find_map(|t| t.strip_prefix("device_id=")) {
                let d = d.split(' ').next().unwrap().to_string();
                out.entry(d).or_default().insert(l.clone());
            }
        }
    }
    out
}

#[test]
fn agents_starting_with_a_backlog_spread_their_first_sends_over_reconnect_jitter() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let extra = "reconnect_jitter = \"10s\"\n";
    // Five devices write while the receiver is down, then stop.
    let mut tops = Vec::new();
    for i in 0..5 {
        let (top, a) = fleet_agent(dir.path(), i, port, extra);
        write_points(&a, "m", 0, 20, 1_764_000_000_000_000_000);
        wait_for(Duration::from_secs(10), || {
            (sink_status(&a, "i")["backlog_points"] == 20).then_some(())
        })
        .expect("backlog");
        let (code, _) = a.terminate();
        assert_eq!(code, Some(0));
        tops.push(top);
    }
    // The receiver is up; the five start again together, each with its backlog.
    let rx = Throttle::start(port, false, 1);
    let mut spawned = Vec::new();
    let mut agents = Vec::new();
    for (i, top) in tops.iter().enumerate() {
        spawned.push(Instant::now());
        agents.push(agent_with(&dir.path().join(format!("a{i}")), top));
    }
    wait_for(Duration::from_secs(20), || {
        let per = lines_per_device(&rx.seen());
        (per.len() == 5 && per.values().all(|l| l.len() == 20)).then_some(())
    })
    .unwrap_or_else(|| panic!("{:?}", lines_per_device(&rx.seen())));
    let seen = rx.seen();
    let delays: Vec<f64> = (0..5)
        .map(|i| {
            let tag = format!("device_id=d{i}");
            let first = seen
                .iter()
                .find(|r| r.lines.iter().any(|l| l.contains(&tag)))
                .unwrap();
            first.at.duration_since(spawned[i]).as_secs_f64()
        })
        .collect();
    eprintln!("first send after start, s: {delays:.2?}");
    let (lo, hi) = delays
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &d| (lo.min(d), hi.max(d)));
    // Uniform over [0, 10 s) each: five within one second of each other has odds ~5e-4;
    // without the jitter they all go within the start-up time (~0.1 s).
    assert!(hi - lo >= 1.0, "first sends not spread: {delays:?}");
    assert!(hi < 13.0, "{delays:?}");
    assert!(agents[0].log_text().contains("reconnect_jitter"));
}

#[test]
fn five_agents_against_a_429_receiver_follow_retry_after_then_drain_everything_at_max_rate() {
    let dir = tempfile::tempdir().unwrap();
    // Throttling from the start: 429 with Retry-After: 2.
    let rx = Throttle::start(0, true, 2);
    // Each write committed at once (no held points): chunks of 100.
    let extra = "max_points = 250\nmax_rate = 1000\n[ingest]\nflush_interval = \"0s\"\n";
    let mut agents = Vec::new();
    for i in 0..5 {
        let (_, a) = fleet_agent(dir.path(), i, rx.port, extra);
        // 100 points a request: chunks of 100, batches of two chunks.
        for k in 0..20 {
            write_points(&a, "m", k * 100, 100, 1_764_000_000_000_000_000);
        }
        agents.push(a);
    }
    let first = wait_for(Duration::from_secs(10), || rx.seen().first().map(|r| r.at))
        .expect("a first request");
    std::thread::sleep(Duration::from_secs(8).saturating_sub(first.elapsed()));
    rx.throttle.store(false, Ordering::SeqCst);
    let opened = Instant::now();
    wait_for(Duration::from_secs(20), || {
        let per = lines_per_device(&rx.seen());
        (per.len() == 5 && per.values().all(|l| l.len() == 2000)).then_some(())
    })
    .unwrap_or_else(|| {
        let per = lines_per_device(&rx.seen());
        panic!(
            "{:?}",
            per.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>()
        )
    });
    let seen = rx.seen();
    let refused: Vec<Instant> = seen
        .iter()
        .filter(|r| r.status == 429)
        .map(|r| r.at)
        .collect();
    let secs = opened.duration_since(first).as_secs_f64();
    // Each agent waits the 2 s asked between tries: in any one second, at most one request
    // per agent; in all, at most 5 x (secs / 2 + 1).
    let busiest = refused
        .iter()
        .map(|t| {
            refused
                .iter()
                .filter(|u| **u >= *t && u.duration_since(*t) < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0);
    eprintln!(
        "429 phase: {} requests from 5 agents in {secs:.1} s (busiest second {busiest}); \
         then {} requests",
        refused.len(),
        seen.len() - refused.len()
    );
    assert!(busiest <= 5, "{busiest} requests in one second");
    assert!(
        refused.len() as f64 <= 5.0 * (secs / 2.0 + 1.0),
        "{}",
        refused.len()
    );
    // Everything arrived once the receiver accepted, and max_rate (1000 points/s, one batch
    // of burst) bounded each agent's drain: 2000 points take at least 1.75 s.
    for i in 0..5 {
        let tag = format!("device_id=d{i}");
        let mine: Vec<Instant> = seen
            .iter()
            .filter(|r| r.status == 204 && r.lines.iter().any(|l| l.contains(&tag)))
            .map(|r| r.at)
            .collect();
        let span = mine.last().unwrap().duration_since(mine[0]).as_secs_f64();
        assert!(
            span >= 1.5,
            "d{i} drained 2000 points in {span:.2} s at max_rate 1000"
        );
    }
    drop(agents);
}

#[test]
fn rollup_sink_over_mqtt_publishes_each_final_minute_once() {
    if !require(Peer::Mosquitto) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _broker = Mosquitto::start(&dir.path().join("mq"), port, None);
    let sub = Sub::start_subscribed(
        port,
        "ew/rollup",
        "sub-r",
        &dir.path().join("sub.txt"),
        None,
    );
    let cfg = format!(
        "{ROLLING}[[sink]]\ntype = \"mqtt\"\nname = \"mq\"\nurl = \"mqtt://127.0.0.1:{port}\"\n\
         topic = \"ew/rollup\"\nforward = \"rollup:1m\"\nmax_points = 8\nmax_delay = \"50ms\"\n\
         min_backoff = \"50ms\"\nmax_backoff = \"300ms\"\nreconnect_jitter = \"0s\"\n"
    );
    let adir = dir.path().join("agent");
    std::fs::create_dir_all(&adir).unwrap();
    let agent = Agent::start(&adir, &cfg);
    // 10 minutes of two tag sets, one field: 20 rows, in batches of 4 whole minutes.
    let now = now_ns();
    let start = (now - 20 * MIN) / MIN * MIN;
    let mut body = String::new();
    for i in 0..600i64 {
        for g in 0..2 {
            body.push_str(&format!(
                "m,gpu={g} v={} {}\n",
                i % 50,
                start + i * 1_000_000_000
            ));
        }
    }
    body.push_str(&format!("mark v=1 {now}\n"));
    let (code, resp) = post(&agent.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
    assert_eq!(code, 204, "{resp}");
    wait_for(Duration::from_secs(20), || {
        let s = sink_status(&agent, "mq");
        (s["forwarded_points"] == 20 && s["backlog_points"] == 0).then_some(())
    })
    .unwrap_or_else(|| panic!("{}\n{}", sink_status(&agent, "mq"), agent.log_text()));
    let got = wait_for(Duration::from_secs(10), || {
        let lines: Vec<String> = sub
            .text()
            .lines()
            .filter(|l| l.contains("edgewatch_rollup=60s"))
            .map(str::to_string)
            .collect();
        (lines.len() >= 20).then_some(lines)
    })
    .unwrap_or_else(|| panic!("{}", sub.text()));
    let keys: BTreeSet<(String, i64)> = got
        .iter()
        .map(|l| (l.split(' ').next().unwrap().to_string(), line_ts(l)))
        .collect();
    assert_eq!((got.len(), keys.len()), (20, 20), "{got:#?}");
    for l in &got {
        assert!(
            l.starts_with("m,") && l.contains("v_count=60i") && l.contains("v_p99="),
            "{l}"
        );
    }
    assert!(
        !sub.text().contains("mark"),
        "the marker's minute is not final"
    );
    assert!(
        !sub.text()
            .lines()
            .any(|l| l.starts_with("m,") && !l.contains("edgewatch_rollup")),
        "no raw point"
    );
}
