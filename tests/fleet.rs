//! The fleet in small: ten real agents (each its own data dir, `device_id`, port) hold a few
//! minutes of the reference device's data written while their InfluxDB was down, then the
//! real `influxd` comes up and all of them drain into it at once. Every device's points
//! arrive exactly once: the count per device and measurement equals what was written, and
//! InfluxDB's own count of the points it accepted over HTTP (a duplicate counts there
//! although it then overwrites itself in storage) equals the total written. The full-size
//! run is `python3 scripts/fleet.py` (docs/forwarding.md, "Fleet").

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::peers::{agent_with, influx_create_db, require, sink_status, Peer};
use crate::support::{free_port, post, wait_for, Agent, Influxd};

/// Devices in the fleet.
const DEVICES: usize = 10;
/// Seconds of the reference device each one holds.
const BACKLOG_S: i64 = 180;

/// Identity tags of the Jetson modules the fleet mixes (as the `[jetson]` collector tags).
const MODULES: [&str; 3] = [
    "jetpack=6.2,l4t=36.4.3,module=NVIDIA\\ Jetson\\ Orin\\ Nano\\ Developer\\ Kit,power_mode=15W,power_mode_id=0",
    "jetpack=5.1.2,l4t=35.4.1,module=Jetson\\ AGX\\ Orin,power_mode=MAXN,power_mode_id=0",
    "jetpack=5.1.2,l4t=35.4.1,module=NVIDIA\\ Jetson\\ Xavier\\ NX\\ Developer\\ Kit,power_mode=MODE_20W_6CORE,power_mode_id=8",
];

/// Per measurement, a field every line of it carries (what the receiver counts).
const COUNTED: [(&str, &str); 7] = [
    ("inference", "wall_ms"),
    ("jetson_mem", "ram_used_mb"),
    ("jetson_cpu", "load_pct"),
    ("jetson_gpu", "load_pct"),
    ("jetson_temp", "temp_c"),
    ("jetson_power", "current_mw"),
    ("host", "cpu_pct"),
];

/// `seconds` of the reference device from `t0` (ns): tegrastats at 1 Hz, the host collector
/// every 10 s, 30 inferences/s over two models. Returns the lines and the count per
/// measurement.
fn backlog(ident: &str, t0: i64, seconds: i64) -> (Vec<String>, BTreeMap<String, i64>) {
    let mut lines = Vec::new();
    let mut counts = BTreeMap::new();
    let mut push = |m: &str, l: String| {
        *counts.entry(m.to_string()).or_insert(0) += 1;
        lines.push(l);
    };
    for s in 0..seconds {
        let t = t0 + s * 1_000_000_000;
        let v = (s % 17) as f64;
        push(
            "jetson_mem",
            format!(
                "jetson_mem,{ident} ram_used_mb={},ram_total_mb=7620 {t}",
                3000.0 + v
            ),
        );
        push(
            "jetson_cpu",
            format!("jetson_cpu,{ident} cores=6i,load_pct={} {t}", 20.0 + v),
        );
        for c in 0..6 {
            push(
                "jetson_cpu",
                format!("jetson_cpu,core={c},{ident} online=true,load_pct={v},freq_mhz=1728 {t}"),
            );
        }
        push(
            "jetson_gpu",
            format!("jetson_gpu,{ident} load_pct={},freq_mhz=1020 {t}", 50.0 + v),
        );
        for z in ["cpu", "gpu", "soc0", "tj"] {
            push(
                "jetson_temp",
                format!("jetson_temp,{ident},zone={z} temp_c={} {t}", 50.0 + v),
            );
        }
        for r in ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"] {
            push(
                "jetson_power",
                format!(
                    "jetson_power,{ident},rail={r} current_mw={}i {t}",
                    4000 + s % 300
                ),
            );
        }
        if s % 10 == 0 {
            push(
                "host",
                format!("host cpu_pct={},mem_used_mb=3000,load1=1.5 {t}", 30.0 + v),
            );
        }
        for k in 0..30 {
            let model = if k % 3 == 0 { "resnet50" } else { "yolov8n" };
            push(
                "inference",
                format!(
                    "inference,app=camera,model={model} wall_ms={},gpu_ms={},ok=true {}",
                    10.0 + (k as f64) / 4.0 + v,
                    7.0 + v,
                    t + k * 33_333_333
                ),
            );
        }
    }
    (lines, counts)
}

/// `SELECT count(field) FROM m GROUP BY device_id` for every counted measurement:
/// device -> measurement -> points.
fn counts_per_device(i: &Influxd) -> BTreeMap<String, BTreeMap<String, i64>> {
    let mut out: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for (m, f) in COUNTED {
        let r = i.query(
            "fleet",
            &format!("SELECT count(\"{f}\") FROM \"{m}\" GROUP BY \"device_id\""),
        );
        let res = &r["results"][0];
        assert!(res["error"].is_null(), "{m}: {res}");
        for s in res["series"].as_array().into_iter().flatten() {
            let dev = s["tags"]["device_id"].as_str().unwrap().to_string();
            let n = s["values"][0][1].as_i64().unwrap();
            out.entry(dev).or_default().insert(m.to_string(), n);
        }
    }
    out
}

/// Points InfluxDB accepted over HTTP since it started: every one it was sent, duplicates
/// included.
fn points_accepted(i: &Influxd) -> i64 {
    let r = i.query("fleet", "SHOW STATS FOR 'httpd'");
    let s = &r["results"][0]["series"][0];
    let col = s["columns"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| c == "pointsWrittenOK")
        .expect("pointsWrittenOK in SHOW STATS");
    s["values"][0][col].as_i64().unwrap()
}

/// Writes `lines` through the agent's `/write` in 5,000-line requests.
fn write_backlog(agent: &Agent, lines: &[String]) {
    for part in lines.chunks(5000) {
        let body = part.join("\n");
        let (code, resp) = post(&agent.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{resp}");
    }
}

/// A receiver that is down on a port the test keeps: every connection is accepted and
/// closed at once; the port is free again once this is dropped.
struct Refuser {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Refuser {
    fn hold(port: u16) -> Refuser {
        let l = std::net::TcpListener::bind(("127.0.0.1", port)).expect("hold the port");
        l.set_nonblocking(true).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                match l.accept() {
                    Ok((c, _)) => drop(c),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Refuser {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Refuser {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn ten_agents_drain_a_backlog_into_one_influxdb_exactly_once() {
    if !require(Peer::Influxdb) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let influx_dir = dir.path().join("influx");
    // The database exists before the agents' first attempt: created on another port.
    {
        let i = Influxd::start(&influx_dir);
        influx_create_db(&i, "fleet");
    }
    let port = free_port();
    // The receiver is down, but its port stays ours: another test's agent or peer must not
    // take it meanwhile (an agent there once took the whole backlog as a gateway).
    let down = Refuser::hold(port);
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let t0 = (now_s - BACKLOG_S - 60) * 1_000_000_000;

    let mut agents = Vec::new();
    let mut want: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    let mut total = 0;
    for d in 0..DEVICES {
        let id = format!("dev-{:03}", d + 1);
        let agent = agent_with(
            &dir.path().join(&id),
            &format!(
                "device_id = \"{id}\"\n[[sink]]\ntype = \"influxdb\"\nname = \"fleet\"\n\
                 url = \"http://127.0.0.1:{port}\"\nversion = 1\ndatabase = \"fleet\"\n\
                 max_delay = \"100ms\"\nmin_backoff = \"100ms\"\nmax_backoff = \"500ms\"\n"
            ),
        );
        let (lines, counts) = backlog(MODULES[d % MODULES.len()], t0, BACKLOG_S);
        write_backlog(&agent, &lines);
        total += lines.len() as i64;
        want.insert(id, counts);
        agents.push((agent, lines.len() as i64));
    }
    // The outage is real: every sink holds its whole backlog and has failed against the
    // closed port.
    for (agent, n) in &agents {
        let s = wait_for(Duration::from_secs(10), || {
            let s = sink_status(agent, "fleet");
            (s["backlog_points"] == *n && s["errors"].as_u64().unwrap_or(0) >= 1).then_some(s)
        });
        assert!(s.is_some(), "{}", sink_status(agent, "fleet"));
    }

    drop(down);
    let started = Instant::now();
    let influx = Influxd::start_on(&influx_dir, port);
    let drained = wait_for(Duration::from_secs(25), || {
        agents
            .iter()
            .all(|(a, _)| sink_status(a, "fleet")["backlog_points"] == 0)
            .then_some(())
    });
    let took = started.elapsed();
    assert!(
        drained.is_some(),
        "not drained after {took:?}: {:?}",
        agents
            .iter()
            .map(|(a, _)| sink_status(a, "fleet")["backlog_points"].clone())
            .collect::<Vec<_>>()
    );
    eprintln!("{DEVICES} agents drained {total} points in {took:?}");

    // Exactly once: per device and measurement, what was written; nothing else; nothing
    // accepted twice; every agent acknowledged each of its points once.
    assert_eq!(counts_per_device(&influx), want);
    assert_eq!(
        points_accepted(&influx),
        total,
        "InfluxDB accepted a different number of points than the fleet wrote (sent twice, or lost)"
    );
    for (agent, n) in &agents {
        let s = sink_status(agent, "fleet");
        assert_eq!(s["forwarded_points"], *n, "{s}");
        assert_eq!(s["dead_letter_points"], 0, "{s}");
    }
}

/// The counted fields exist in the generated data (a guard on the test itself).
#[test]
fn the_backlog_covers_every_counted_measurement() {
    let (lines, counts) = backlog(MODULES[0], 0, 10);
    assert_eq!(counts.values().sum::<i64>(), lines.len() as i64);
    for (m, f) in COUNTED {
        let n = lines
            .iter()
            .filter(|l| l.starts_with(&format!("{m},")) || l.starts_with(&format!("{m} ")))
            .filter(|l| l.contains(&format!(" {f}=")) || l.contains(&format!(",{f}=")))
            .count() as i64;
        assert_eq!(Some(&n), counts.get(m), "{m}.{f}");
    }
}
