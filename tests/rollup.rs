//! Rollup tiers, sketches, retention, disk budget and the query engine, through the real
//! binary: HTTP ingest, `edgewatch maintain`, `/api/v1/query?step=&agg=`,
//! `/api/v1/inference`, `/api/v1/status`, and a kill -9 in the middle of a rollup.
//! (Accuracy on 1,000,000 points per distribution, budget eviction and resumption are also
//! tested at library level in `src/rollup/tests.rs`, where they run in seconds.)

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value as J;

use crate::support::*;

const QUIET: &str = "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n[rollup]\nenabled = false\nbatch_points = 3000\n";
const MIN_NS: i64 = 60_000_000_000;

fn maintain(data: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(bin())
        .arg("maintain")
        .arg("--data-dir")
        .arg(data)
        .args(extra)
        .output()
        .expect("run maintain")
}

/// Writes `minutes` minutes of inference points (5 per second) ending a few minutes ago;
/// returns (first minute start ns, values per minute).
fn write_inference(agent: &Agent, minutes: i64) -> (i64, Vec<Vec<f64>>) {
    let now = edgewatch::now_ns();
    let t0 = (now - (minutes + 5) * MIN_NS) / MIN_NS * MIN_NS;
    let mut per_minute = Vec::new();
    let mut seed = 12345u64;
    for m in 0..minutes {
        let mut body = String::new();
        let mut vals = Vec::new();
        for i in 0..300 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let u = (seed >> 11) as f64 / (1u64 << 53) as f64;
            let wall = 10.0 + 40.0 * u * u;
            vals.push(wall);
            let ts = t0 + m * MIN_NS + i * 200_000_000;
            body.push_str(&format!(
                "inference,model=yolo wall_ms={wall},gpu_ms={},batch_size=4i {ts}\n",
                wall * 0.6
            ));
        }
        let (code, resp) = post(&agent.url("/write"), body.as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{resp}");
        per_minute.push(vals);
    }
    (t0, per_minute)
}

fn exact(vals: &[f64], q: f64) -> f64 {
    let mut v = vals.to_vec();
    v.sort_by(f64::total_cmp);
    v[(q * (v.len() - 1) as f64).floor() as usize]
}

#[test]
fn maintain_rolls_up_and_the_query_engine_answers_percentiles_from_the_1m_tier() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let (t0, minutes) = write_inference(&agent, 20);
    let out = maintain(&agent.dir, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: J = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["rolled_up_points"], 20 * 300);

    let to = t0 + 20 * MIN_NS - 1;
    let (code, body) = get(&agent.url(&format!(
        "/api/v1/query?measurement=inference&field=wall_ms&tag.model=yolo&from={t0}&to={to}&step=1m&agg=p99"
    )))
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let v: J = serde_json::from_str(&body).unwrap();
    assert_eq!(v["tier"], "1m");
    assert_eq!(v["step_ns"], MIN_NS);
    let pts = v["series"][0]["points"].as_array().unwrap();
    assert_eq!(pts.len(), 20);
    for (p, vals) in pts.iter().zip(&minutes) {
        let (got, want) = (p[1].as_f64().unwrap(), exact(vals, 0.99));
        assert!(((got - want) / want).abs() <= 0.01, "{got} vs {want}");
    }
    // Finer than the finest tier: answered from raw points, exact.
    let (_, body) = get(&agent.url(&format!(
        "/api/v1/query?measurement=inference&field=wall_ms&from={t0}&to={to}&step=30s&agg=count&group_by=model"
    )))
    .unwrap();
    let v: J = serde_json::from_str(&body).unwrap();
    assert_eq!(v["tier"], "raw");
    assert_eq!(v["series"][0]["tags"], serde_json::json!({"model": "yolo"}));
    assert_eq!(v["series"][0]["points"][0][1], 150.0);
    // No step/agg: the raw behaviour is unchanged.
    let (_, body) = get(&agent.url(&format!(
        "/api/v1/query?measurement=inference&field=wall_ms&from={t0}&to={}",
        t0 + 999_999_999
    )))
    .unwrap();
    let v: J = serde_json::from_str(&body).unwrap();
    assert_eq!(v["tier"], "raw");
    assert_eq!(v["series"][0]["points"].as_array().unwrap().len(), 5);
    // Bad agg -> 400 naming it.
    let (code, body) =
        get(&agent.url("/api/v1/query?measurement=inference&field=wall_ms&step=1m&agg=median"))
            .unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("median"), "{body}");

    // Derived inference signals.
    let (code, body) = get(&agent.url(&format!(
        "/api/v1/inference?model=yolo&from={t0}&to={to}&step=1m"
    )))
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let v: J = serde_json::from_str(&body).unwrap();
    let m = &v["models"][0];
    assert_eq!(m["model"], "yolo");
    assert_eq!(m["steps"].as_array().unwrap().len(), 20);
    let share = m["summary"]["gpu_share"].as_f64().unwrap();
    assert!((share - 0.6).abs() < 1e-9, "{share}");
    assert!((m["steps"][0]["throughput_per_s"].as_f64().unwrap() - 5.0).abs() < 1e-9);
    assert!(m["summary"]["p99_p50"].as_f64().unwrap() > 1.0);

    // Status shows the tiers caught up.
    let s = agent.status();
    let tiers = s["rollup"]["tiers"].as_array().unwrap();
    assert_eq!(tiers[0]["name"], "1m");
    assert_eq!(tiers[0]["pending_chunks"], 0);
    assert_eq!(tiers[0]["rows"], 20 * 3);
    assert_eq!(s["rollup"]["evicted"]["raw_chunks"], 0);

    // The CLI prints the same answer.
    let out = Command::new(bin())
        .args(["query", "--data-dir"])
        .arg(&agent.dir)
        .args([
            "--measurement",
            "inference",
            "--field",
            "wall_ms",
            "--step",
            "1m",
            "--agg",
            "p99",
            "--format",
            "json",
        ])
        .arg(format!("--from={t0}"))
        .arg(format!("--to={to}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: J = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli["tier"], "1m");
    assert_eq!(cli["series"][0]["points"].as_array().unwrap().len(), 20);
}

fn rollup_rows(data: &Path) -> Vec<(i64, i64, i64, i64, f64, Vec<u8>)> {
    let conn = rusqlite::Connection::open(data.join("edgewatch.db")).unwrap();
    let mut st = conn
        .prepare(
            "SELECT tier, series_id, bucket, count, sum, sketch FROM rollups UNION ALL \
             SELECT tier, series_id, bucket, count, sum, sketch FROM rollups_recent ORDER BY 1, 2, 3",
        )
        .unwrap();
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap();
    rows.map(|r| r.unwrap()).collect()
}

#[test]
fn kill_9_during_maintain_then_rerun_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    write_inference(&agent, 30);
    agent.terminate();
    let data = dir.path().join("data");
    let copy = dir.path().join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(data.join("edgewatch.db"), copy.join("edgewatch.db")).unwrap();

    // Small steps (several transactions), the same for every run: steps are a function of
    // the cursor, so an interrupted run resumes on the same boundaries (same float sums).
    let cfg = dir.path().join("small.toml");
    std::fs::write(&cfg, "[rollup]\nbatch_points = 1000\n").unwrap();
    let cfg_arg = format!("--config={}", cfg.display());
    // Uninterrupted on the copy.
    let out = maintain(&copy, &[&cfg_arg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Interrupted: the same small steps, paused between commits, killed.
    let mut child = Command::new(bin())
        .arg("maintain")
        .arg("--data-dir")
        .arg(&data)
        .arg("--config")
        .arg(&cfg)
        .arg("--debug-pause-ms=300")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    signal(child.id() as i32, "KILL");
    let _ = child.wait();
    let partial = rollup_rows(&data);
    let full = rollup_rows(&copy);
    assert!(!full.is_empty());
    assert!(
        !partial.is_empty() && partial != full,
        "the kill should land between steps: {} of {} rows",
        partial.len(),
        full.len()
    );
    let out = maintain(&data, &[&cfg_arg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        rollup_rows(&data) == full,
        "rerun differs from the uninterrupted run"
    );
}
