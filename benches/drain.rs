//! Drain benchmark: a 1,000,000-point backlog written while every sink's remote end is down
//! (sinks point at closed ports), then the real peer is started and the time until the sink
//! acknowledged every point is measured: points/s, the agent's CPU (utime + stime from
//! /proc) per point and its peak RSS (VmHWM, reset before each drain) while draining.
//! Sinks, drained one after another from the same store: InfluxDB 1.x (gzip, one request in
//! flight), mosquitto with the default window (`inflight = 1`) and with `inflight = 4`.
//!
//! Run: `cargo bench --bench drain` (needs `influxd` and `mosquitto`; a missing peer's sink
//! is skipped). `BENCH_POINTS=200000` for a shorter run.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::peers::*;
use support::*;

struct Run {
    name: &'static str,
    points: i64,
    secs: f64,
    cpu_us: u64,
    peak_rss_kb: u64,
}

fn forwarded(agent: &Agent, name: &str) -> i64 {
    sink_status(agent, name)["forwarded_points"]
        .as_i64()
        .unwrap_or(0)
}

/// Resets VmHWM, starts the clock, waits until sink `name` acknowledged `n` points.
fn drain(agent: &Agent, name: &'static str, n: i64) -> Run {
    let pid = agent.pid();
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    let before = forwarded(agent, name);
    let cpu0 = cpu_us(pid);
    let t = Instant::now();
    // Polled every 100 ms (each poll is a status request the agent answers).
    let end = Instant::now() + Duration::from_secs(600);
    let ok = loop {
        if forwarded(agent, name) - before >= n {
            break Some(());
        }
        if Instant::now() > end {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let secs = t.elapsed().as_secs_f64();
    assert!(
        ok.is_some(),
        "{name} did not drain: {}",
        sink_status(agent, name)
    );
    Run {
        name,
        points: n,
        secs,
        cpu_us: cpu_us(pid) - cpu0,
        peak_rss_kb: status_kb(pid, "VmHWM"),
    }
}

fn main() {
    let points: usize = std::env::var("BENCH_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let tmp = tempfile::tempdir().unwrap();
    let (pi, pm1, pm4) = (free_port(), free_port(), free_port());
    let mq = |name: &str, port: u16, extra: &str| {
        format!(
            "[[sink]]\ntype = \"mqtt\"\nname = \"{name}\"\nurl = \"mqtt://127.0.0.1:{port}\"\n\
             topic = \"bench/{{device_id}}\"\nmin_backoff = \"50ms\"\nmax_backoff = \"300ms\"\n{extra}"
        )
    };
    let top = format!(
        "device_id = \"bench-1\"\n[[sink]]\ntype = \"influxdb\"\nname = \"influx\"\n\
         url = \"http://127.0.0.1:{pi}\"\nversion = 1\ndatabase = \"edge\"\n\
         min_backoff = \"50ms\"\nmax_backoff = \"300ms\"\n{}{}",
        mq("mqtt-inflight1", pm1, ""),
        mq("mqtt-inflight4", pm4, "inflight = 4\n"),
    );
    let agent = agent_with(&tmp.path().join("agent"), &top);
    // Recent timestamps, 1 ms apart, ending now.
    let t0 = edgewatch::now_ns() - points as i64 * 1_000_000;
    let t = Instant::now();
    let mut i = 0;
    while i < points {
        let end = (i + 10_000).min(points);
        let mut body = String::with_capacity(80 * (end - i));
        for j in i..end {
            body.push_str(&format!(
                "inference,model=yolov8n,stage=detect wall_ms={}.{},batch_size={}i {}\n",
                5 + j % 40,
                j % 1000,
                1 << (j % 4),
                t0 + j as i64 * 1_000_000
            ));
        }
        let (code, resp) = post(&agent.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{resp}");
        i = end;
    }
    println!(
        "drain benchmark: {points} points (2 fields) written in {:.1} s while every sink was down",
        t.elapsed().as_secs_f64()
    );
    let n = points as i64;
    wait_for(Duration::from_secs(30), || {
        ["influx", "mqtt-inflight1", "mqtt-inflight4"]
            .iter()
            .all(|s| sink_status(&agent, s)["backlog_points"] == n)
            .then_some(())
    })
    .expect("backlog visible in the status");
    println!(
        "agent RSS before draining: {:.1} MB",
        status_kb(agent.pid(), "VmRSS") as f64 / 1024.0
    );
    let mut runs = Vec::new();
    let _influx = if Influxd::available() {
        let i = influxd_on(&tmp.path().join("influx"), pi);
        influx_create_db(&i, "edge");
        runs.push(drain(&agent, "influx", n));
        let got = wait_for(Duration::from_secs(30), || {
            let c = influx_count_field(&i, "inference", "wall_ms");
            (c == n).then_some(c)
        });
        assert!(
            got.is_some(),
            "influxdb holds {} points",
            influx_count_field(&i, "inference", "wall_ms")
        );
        Some(i)
    } else {
        println!("(influxd not found: InfluxDB skipped)");
        None
    };
    let mut brokers = Vec::new();
    if Mosquitto::available() {
        for (name, port) in [("mqtt-inflight1", pm1), ("mqtt-inflight4", pm4)] {
            brokers.push(Mosquitto::start(&tmp.path().join(name), port, None));
            runs.push(drain(&agent, name, n));
        }
    } else {
        println!("(mosquitto not found: MQTT skipped)");
    }
    println!(
        "\n{:<16} {:>12} {:>10} {:>14} {:>14}",
        "sink", "points/s", "seconds", "cpu µs/point", "peak RSS MB"
    );
    for r in &runs {
        println!(
            "{:<16} {:>12.0} {:>10.2} {:>14.2} {:>14.1}",
            r.name,
            r.points as f64 / r.secs,
            r.secs,
            r.cpu_us as f64 / r.points as f64,
            r.peak_rss_kb as f64 / 1024.0
        );
    }
    println!("(default batch: max_points = 5000; InfluxDB 1.x with gzip; MQTT QoS 1, line format, no gzip; one agent, the other sinks idle)");
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
}

/// `SELECT count(<field>) FROM <m>` in database `edge`.
fn influx_count_field(i: &Influxd, m: &str, field: &str) -> i64 {
    let v = i.query("edge", &format!("SELECT count({field}) FROM {m}"));
    v["results"][0]["series"][0]["values"][0][1]
        .as_i64()
        .unwrap_or(0)
}
