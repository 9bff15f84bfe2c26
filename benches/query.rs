//! Query benchmark: builds a store with the Writer directly (20 `inference` series, field
//! `wall_ms`: 30 days at 1 point/min, then the last 24 h at 1 point/s ending now), runs the
//! rollup job after each of the two (`Job::run_once`, as `edgewatch maintain` does) so the
//! sparse history (every point its own 1-min row) and the dense day (60 points per row) get
//! their own rollup rate, then times the dashboard queries through the query engine exactly
//! as `GET /api/v1/query` calls it (`api::agg_query_from_params` + `engine::query` on one
//! long-lived `Reader`, not over HTTP) and prints a compact table: write time, rollup rates,
//! and median / max of each query.
//!
//! Targets: every dashboard query under 50 ms; rollup of dense data well above the ingest
//! rate (~500k points/s; "well above" read as at least twice).
//!
//! Run: `cargo bench --bench query`. `BENCH_RUNS=50` to time each query more often
//! (default 20); `BENCH_BATCH=N` sets the rollup's `batch_points` (default 100000).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use edgewatch::config::{Config, Synchronous};
use edgewatch::model::{series_key, Batch, Line, Value};
use edgewatch::rollup::{Job, Plan};
use edgewatch::store::{Reader, Writer};

const NS: i64 = 1_000_000_000;
const SERIES: usize = 20;
const BATCH: usize = 5_000;
const RECENT_S: i64 = 24 * 3_600;
const HISTORY_MIN: i64 = 30 * 24 * 60;
const TARGET_MS: f64 = 50.0;
const INGEST_RATE: f64 = 500_000.0;

/// Deterministic log-normal-ish latencies per model: xorshift uniforms, Box-Muller normal.
struct Gen {
    x: u64,
}

impl Gen {
    fn uniform(&mut self) -> f64 {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        // 53 random bits in (0, 1].
        ((self.x >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn wall_ms(&mut self, model: usize) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        // Median 4..~23 ms depending on the model, sigma 0.35.
        let mu = (4.0 + model as f64).ln();
        (mu + 0.35 * z).exp()
    }
}

/// Writes `count` time steps of every series, `step_ns` apart from `start_ns`, interleaved
/// by time (as live ingest would), in batches of `BATCH` lines. Returns (points, write time).
fn write_range(
    w: &mut Writer,
    keys: &[String],
    gen: &mut Gen,
    start_ns: i64,
    step_ns: i64,
    count: i64,
) -> (usize, Duration) {
    let mut spent = Duration::ZERO;
    let mut points = 0;
    let mut batch = Batch::default();
    let flush = |batch: &mut Batch, w: &mut Writer, spent: &mut Duration| {
        let t = Instant::now();
        let sum = w.write(&[&*batch]).expect("write failed");
        *spent += t.elapsed();
        assert!(sum[0].rejected.is_empty(), "{:?}", sum[0].rejected);
        batch.lines.clear();
        sum[0].points
    };
    for i in 0..count {
        let ts = start_ns + i * step_ns;
        for (m, key) in keys.iter().enumerate() {
            batch.lines.push(Line {
                key: key.clone(),
                fields: vec![("wall_ms".into(), Value::F64(gen.wall_ms(m)))],
                ts,
                line_no: batch.lines.len() as u32 + 1,
            });
        }
        if batch.lines.len() >= BATCH {
            points += flush(&mut batch, w, &mut spent);
        }
    }
    if !batch.is_empty() {
        points += flush(&mut batch, w, &mut spent);
    }
    (points, spent)
}

struct Timing {
    name: &'static str,
    tier: String,
    series: usize,
    points: usize,
    first_ms: f64,
    median_ms: f64,
    max_ms: f64,
    json_ms: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Times one query string form through the engine as the `/api/v1/query` handler runs it.
fn time_query(
    reader: &Reader,
    plan: &Plan,
    name: &'static str,
    params: &[(&str, &str)],
    runs: usize,
) -> Timing {
    let q: HashMap<String, String> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut engine = Vec::with_capacity(runs);
    let mut json = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let aq = edgewatch::api::agg_query_from_params(&q, edgewatch::now_ns())
            .expect("bad query")
            .expect("not an aggregate query");
        let res =
            edgewatch::engine::query(reader, plan, &aq, edgewatch::now_ns()).expect("query failed");
        engine.push(ms(t.elapsed()));
        // The handler's reply: `json!(result)` serialized into the response body.
        let t = Instant::now();
        let body = serde_json::to_vec(&serde_json::json!(res)).expect("json");
        json.push(ms(t.elapsed()));
        std::hint::black_box(body);
        last = Some(res);
    }
    let res = last.expect("at least one run");
    let first_ms = engine[0];
    let max_ms = engine.iter().copied().fold(0.0, f64::max);
    Timing {
        name,
        tier: res.tier.clone(),
        series: res.series.len(),
        points: res.series.iter().map(|s| s.points.len()).sum(),
        first_ms,
        median_ms: median(&mut engine),
        max_ms,
        json_ms: median(&mut json),
    }
}

fn main() {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(20);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("edgewatch");
    let keys: Vec<String> = (0..SERIES)
        .map(|m| series_key("inference", &[("model", &format!("m{m}"))]))
        .collect();
    let mut gen = Gen {
        x: 0x9E37_79B9_7F4A_7C15,
    };

    // 1. The store: 30 days at 1/min, then the last 24 h at 1/s, ending now (write order =
    // time order, as an agent that ran for 31 days would have written it).
    let now_s = edgewatch::now_ns() / NS;
    let recent_start = (now_s - RECENT_S + 1) * NS;
    let history_start = recent_start - HISTORY_MIN * 60 * NS;
    println!(
        "query benchmark: {SERIES} series; 24 h at 1/s ({} points) + 30 d at 1/min ({} points), batches of {BATCH} lines",
        SERIES as i64 * RECENT_S,
        SERIES as i64 * HISTORY_MIN
    );
    // Written and rolled up in two rounds, so the two shapes of data get their own rate:
    // the history is sparse (one point per 1-min bucket: every point is a row written),
    // the recent day dense (60 points per 1-min row), as a 1 Hz latency series is.
    // Rollup runs as `edgewatch maintain` runs it (default plan: tiers 1m and 1h, raw
    // retention 48 h, so the history's raw chunks are evicted once rolled up).
    let mut plan = Plan::from_config(&Config::default()).expect("plan");
    if let Some(b) = std::env::var("BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        plan.batch_points = b;
    }
    let rollup = |dir: &std::path::Path| {
        let mut job = Job::open(dir, plan.clone()).expect("open rollup job");
        let t = Instant::now();
        let report = job
            .run_once(edgewatch::now_ns(), &|| false)
            .expect("rollup failed");
        (report, t.elapsed())
    };
    let wall = Instant::now();
    let mut w = Writer::open(&dir, 100_000, Synchronous::Normal).expect("open writer");
    let (hist_points, hist_write) =
        write_range(&mut w, &keys, &mut gen, history_start, 60 * NS, HISTORY_MIN);
    let (hist_report, hist_rollup) = rollup(&dir);
    let (recent_points, recent_write) =
        write_range(&mut w, &keys, &mut gen, recent_start, NS, RECENT_S);
    drop(w);
    let build_wall = wall.elapsed();
    let written = hist_points + recent_points;
    let write_time = hist_write + recent_write;
    let db_path = edgewatch::store::db_path(&dir);
    let raw_bytes = edgewatch::store::disk_bytes(&db_path);
    let (recent_report, recent_rollup) = rollup(&dir);
    assert_eq!(hist_report.points, hist_points as u64, "history rolled up");
    assert_eq!(
        recent_report.points, recent_points as u64,
        "recent rolled up"
    );
    let rate = |points: u64, t: Duration| points as f64 / t.as_secs_f64();
    let rollup_time = hist_rollup + recent_rollup;
    let rollup_rate = rate(written as u64, rollup_time);
    let dense_rate = rate(recent_report.points, recent_rollup);

    // 3. Dashboard queries, on one long-lived reader (as the API holds one).
    let reader = Reader::open(&dir).expect("open reader");
    let base = [("measurement", "inference"), ("field", "wall_ms")];
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
        base.iter().chain(extra).copied().collect()
    };
    let timings = [
        time_query(
            &reader,
            &plan,
            "24h step=1m agg=p99",
            &with(&[("from", "-24h"), ("step", "1m"), ("agg", "p99")]),
            runs,
        ),
        time_query(
            &reader,
            &plan,
            "24h step=1m agg=mean",
            &with(&[("from", "-24h"), ("step", "1m"), ("agg", "mean")]),
            runs,
        ),
        time_query(
            &reader,
            &plan,
            "30d step=1h agg=p99",
            &with(&[("from", "-30d"), ("step", "1h"), ("agg", "p99")]),
            runs,
        ),
    ];

    // The rollup part of /api/v1/status (read on every status and /metrics request).
    let mut status_ms: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let v = edgewatch::rollup::status(&reader, &plan, edgewatch::now_ns())
                .expect("rollup status");
            std::hint::black_box(v);
            ms(t.elapsed())
        })
        .collect();
    let status_first = status_ms[0];
    let status_median = median(&mut status_ms);

    // 4. The table.
    println!(
        "\n{:<24} {:>10} {:>10} {:>12} {:>14}",
        "store build", "points", "write s", "points/s", "wall s (+gen)"
    );
    println!(
        "{:<24} {:>10} {:>10.2} {:>12.0} {:>14}",
        "history 30d @1/min",
        hist_points,
        hist_write.as_secs_f64(),
        hist_points as f64 / hist_write.as_secs_f64(),
        ""
    );
    println!(
        "{:<24} {:>10} {:>10.2} {:>12.0} {:>14}",
        "recent 24h @1/s",
        recent_points,
        recent_write.as_secs_f64(),
        recent_points as f64 / recent_write.as_secs_f64(),
        ""
    );
    println!(
        "{:<24} {:>10} {:>10.2} {:>12.0} {:>14.2}",
        "total",
        written,
        write_time.as_secs_f64(),
        written as f64 / write_time.as_secs_f64(),
        build_wall.as_secs_f64()
    );
    println!(
        "store on disk after the last write: {:.1} MB",
        raw_bytes as f64 / 1e6
    );

    println!(
        "\n{:<24} {:>10} {:>10} {:>12} {:>8} {:>10} {:>10}",
        "rollup (run_once)", "points", "time s", "points/s", "steps", "evicted", "db MB"
    );
    for (name, report, t) in [
        ("sparse 30d @1/min", &hist_report, hist_rollup),
        ("dense 24h @1/s", &recent_report, recent_rollup),
    ] {
        println!(
            "{:<24} {:>10} {:>10.2} {:>12.0} {:>8} {:>10} {:>10.1}",
            name,
            report.points,
            t.as_secs_f64(),
            rate(report.points, t),
            report.steps,
            report.evicted_points,
            report.db_bytes as f64 / 1e6
        );
    }
    println!(
        "{:<24} {:>10} {:>10.2} {:>12.0}",
        "total",
        written,
        rollup_time.as_secs_f64(),
        rollup_rate
    );
    println!(
        "  target: well above ingest (~{:.0}k points/s): dense x{:.2}, total x{:.2} -> {}",
        INGEST_RATE / 1e3,
        dense_rate / INGEST_RATE,
        rollup_rate / INGEST_RATE,
        if dense_rate > 2.0 * INGEST_RATE {
            "ok"
        } else {
            "BELOW"
        }
    );

    println!(
        "\n{:<24} {:>5} {:>6} {:>7} {:>9} {:>10} {:>8} {:>8} {:>6}",
        "query (engine, n runs)",
        "tier",
        "series",
        "points",
        "first ms",
        "median ms",
        "max ms",
        "json ms",
        "<50ms"
    );
    for t in &timings {
        println!(
            "{:<24} {:>5} {:>6} {:>7} {:>9.2} {:>10.2} {:>8.2} {:>8.2} {:>6}",
            t.name,
            t.tier,
            t.series,
            t.points,
            t.first_ms,
            t.median_ms,
            t.max_ms,
            t.json_ms,
            if t.max_ms < TARGET_MS {
                "yes"
            } else if t.median_ms < TARGET_MS {
                "median"
            } else {
                "NO"
            }
        );
    }
    println!(
        "{:<24} {:>5} {:>6} {:>7} {:>9.2} {:>10.2}",
        "status (rollup part)", "", "", "", status_first, status_median
    );
    println!(
        "({runs} runs per query; median/max over all runs including the first; engine time = \
         agg_query_from_params + engine::query; json = serializing the reply, not included)"
    );
    tail_scan();
}

/// The unindexed tail's read cost: 200 tag sets, 20,000 one-point chunks (the writer's
/// `TAIL_MAX_ROWS`) all in the tail, then all indexed: one tag set's last 5 minutes and all
/// 200 tag sets' at once (`scan_tagsets`: the tail read once), median of 50 reads each.
fn tail_scan() {
    use edgewatch::store::chunks::{self, Scan};
    use std::ops::ControlFlow;
    const TAGSETS: i64 = 200;
    const COMMITS: i64 = 100;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut w = Writer::open(dir.path(), 100_000, Synchronous::Normal).expect("writer");
    for i in 0..COMMITS {
        let batch = Batch {
            lines: (0..TAGSETS)
                .map(|s| Line {
                    key: format!("m,s={s}"),
                    fields: vec![
                        ("a".to_string(), Value::F64((i * s) as f64)),
                        ("b".to_string(), Value::F64(i as f64 * 0.5)),
                    ],
                    ts: (1_000 + i) * NS,
                    line_no: 0,
                })
                .collect(),
        };
        w.write(&[&batch]).expect("write");
    }
    drop(w);
    let db = dir.path().join(edgewatch::store::DB_FILE);
    let mut conn = rusqlite::Connection::open(&db).expect("open");
    // Everything back into the tail (as if the writer had not indexed yet).
    conn.execute_batch("DELETE FROM chunk_index; UPDATE chunk_tail SET indexed_through = 0;")
        .expect("unindex");
    let window = Scan {
        ts_from: Some((1_000 + COMMITS - 300) * NS),
        ..Scan::default()
    };
    let time = |r: &Reader, many: bool| -> (f64, usize) {
        let mut t = Vec::new();
        let mut n = 0;
        for _ in 0..50 {
            n = 0;
            let start = Instant::now();
            let count = |c: &chunks::Chunk<'_>| {
                n += c.n as usize;
                Ok(ControlFlow::Continue(()))
            };
            if many {
                chunks::scan_tagsets(r.conn(), &db, &window, 1..=TAGSETS, count).expect("scan");
            } else {
                let one = Scan {
                    tagset: Some(TAGSETS / 2),
                    ..window.clone()
                };
                chunks::scan(r.conn(), &db, &one, count).expect("scan");
            }
            t.push(ms(start.elapsed()));
        }
        (median(&mut t), n)
    };
    let r = Reader::open(dir.path()).expect("reader");
    let (one_tail, n1) = time(&r, false);
    let (many_tail, n2) = time(&r, true);
    drop(r);
    let tx = conn.transaction().expect("tx");
    chunks::index_tail(&tx, &db).expect("index");
    tx.commit().expect("commit");
    let r = Reader::open(dir.path()).expect("reader");
    let (one_idx, m1) = time(&r, false);
    let (many_idx, m2) = time(&r, true);
    assert_eq!((n1, n2), (m1, m2), "the same points either way");
    println!(
        "\nunindexed tail, {} chunks of {TAGSETS} tag sets (median of 50 reads):",
        TAGSETS * COMMITS
    );
    println!("  one tag set:  {one_tail:.3} ms in the tail, {one_idx:.3} ms indexed ({n1} points)");
    println!(
        "  all {TAGSETS} at once: {many_tail:.3} ms in the tail, {many_idx:.3} ms indexed ({n2} points)"
    );
}
