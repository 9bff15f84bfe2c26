//! Ingest benchmark: pushes N points (default 1,000,000; 4 fields each, realistic tags)
//! over HTTP in 5,000-line batches on one keep-alive connection, first to edgewatch, then to
//! a real InfluxDB 1.x fed the same bodies the same way, and prints committed points/s,
//! server CPU microseconds per point, peak RSS and bytes on disk per point side by side.
//!
//! Run: `cargo bench --bench ingest` (needs `influxd` from Debian's `influxdb` for the
//! comparison; without it only edgewatch is measured). `BENCH_POINTS=200000` for a
//! shorter run; `BENCH_SYNC=normal` to run edgewatch with the opt-in synchronous = "normal"
//! (default: "full", as the agent).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::*;

const BATCH: usize = 5_000;

fn bodies(points: usize) -> Vec<Vec<u8>> {
    let start_ms: i64 = (edgewatch::now_ns() / 1_000_000) - points as i64;
    let models = ["yolov8n", "resnet50", "whisper-tiny", "llama-3.2-1b"];
    let mut out = Vec::new();
    let mut body = String::with_capacity(BATCH * 160);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..points {
        // xorshift: cheap, deterministic "measurements"
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let model = models[i % models.len()];
        let wall = 5.0 + (x % 10_000) as f64 / 100.0;
        let gpu = wall * 0.6;
        let queue = (x >> 20) % 500;
        use std::fmt::Write;
        let _ = writeln!(
            body,
            "inference,app=camera-{},model={model},model_version=v{},stage=detect wall_ms={wall:.3},gpu_ms={gpu:.3},queue_ms={}.{},batch_size={}i {}",
            i % 3,
            1 + i % 2,
            queue / 100,
            queue % 100,
            1 << (i % 4),
            (start_ms + i as i64) * 1_000_000
        );
        if (i + 1) % BATCH == 0 {
            out.push(std::mem::take(&mut body).into_bytes());
        }
    }
    if !body.is_empty() {
        out.push(body.into_bytes());
    }
    out
}

struct Run {
    name: &'static str,
    points: usize,
    secs: f64,
    cpu_us: u64,
    peak_rss_kb: u64,
    disk_bytes: u64,
}

fn push(url: &str, bodies: &[Vec<u8>], pid: i32) -> (f64, u64) {
    let agent = ureq::AgentBuilder::new().build();
    let cpu0 = cpu_us(pid);
    let t = Instant::now();
    for b in bodies {
        loop {
            match agent.post(url).send_bytes(b) {
                Ok(r) if r.status() == 204 => break,
                Err(ureq::Error::Status(503, _)) => std::thread::sleep(Duration::from_millis(5)),
                other => panic!("write failed: {:?}", other.map(|r| r.status())),
            }
        }
    }
    (t.elapsed().as_secs_f64(), cpu_us(pid) - cpu0)
}

fn main() {
    let points: usize = std::env::var("BENCH_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let sync = std::env::var("BENCH_SYNC").unwrap_or_else(|_| "full".into());
    let bodies = bodies(points);
    let body_bytes: usize = bodies.iter().map(Vec::len).sum();
    println!(
        "ingest benchmark: {points} points, 4 fields each, {} bodies of {BATCH} lines ({:.1} MB of line protocol)",
        bodies.len(),
        body_bytes as f64 / 1e6
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();

    {
        let dir = tmp.path().join("edgewatch");
        std::fs::create_dir_all(&dir).unwrap();
        let agent = Agent::start(
            &dir,
            &format!("[host]\nenabled = false\n[storage]\nsynchronous = \"{sync}\"\n"),
        );
        let (secs, cpu) = push(&agent.url("/write?db=bench"), &bodies, agent.pid());
        let peak = status_kb(agent.pid(), "VmHWM");
        let st = agent.status();
        assert_eq!(st["ingest"]["points_written"].as_u64(), Some(points as u64));
        let data = agent.dir.clone();
        let (code, _) = agent.terminate();
        assert_eq!(code, Some(0));
        runs.push(Run {
            name: "edgewatch",
            points,
            secs,
            cpu_us: cpu,
            peak_rss_kb: peak,
            disk_bytes: dir_bytes(&data),
        });
    }

    if Influxd::available() {
        let dir = tmp.path().join("influxdb");
        let influx = Influxd::start(&dir);
        influx.query("", "CREATE DATABASE bench");
        let (secs, cpu) = push(
            &format!("http://{}/write?db=bench", influx.http),
            &bodies,
            influx.child.id() as i32,
        );
        let peak = status_kb(influx.child.id() as i32, "VmHWM");
        // Let InfluxDB snapshot its cache into compressed TSM files and compact them.
        let tsm = wait_for(Duration::from_secs(60), || {
            let wal = dir_bytes(&dir.join("wal/bench"));
            let data = dir_bytes(&dir.join("data/bench"));
            (data > 0 && wal < 1_000_000).then_some(data)
        })
        .unwrap_or_else(|| dir_bytes(&dir.join("data/bench")));
        runs.push(Run {
            name: "influxdb 1.x",
            points,
            secs,
            cpu_us: cpu,
            peak_rss_kb: peak,
            disk_bytes: tsm,
        });
    } else {
        println!("(influxd not found: install Debian's `influxdb` for the comparison)");
    }

    println!(
        "\n{:<14} {:>12} {:>14} {:>14} {:>12}",
        "server", "points/s", "cpu µs/point", "peak RSS MB", "bytes/point"
    );
    for r in &runs {
        println!(
            "{:<14} {:>12.0} {:>14.2} {:>14.1} {:>12.1}",
            r.name,
            r.points as f64 / r.secs,
            r.cpu_us as f64 / r.points as f64,
            r.peak_rss_kb as f64 / 1024.0,
            r.disk_bytes as f64 / r.points as f64
        );
    }
    if runs.len() == 2 {
        let (a, b) = (&runs[0], &runs[1]);
        println!(
            "\nedgewatch/influxdb: throughput x{:.2}, cpu per point x{:.2}, peak RSS x{:.2}, disk per point x{:.2}",
            b.secs / a.secs,
            (a.cpu_us as f64) / (b.cpu_us as f64),
            a.peak_rss_kb as f64 / b.peak_rss_kb as f64,
            a.disk_bytes as f64 / b.disk_bytes as f64
        );
    }
    println!("(edgewatch synchronous = {sync}; influxdb: default WAL settings, disk = compacted TSM files)");
}
