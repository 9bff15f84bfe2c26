//! Write wear of small-chunk merging (`store::compact`): the WAL pages its steps write for
//! each hour of the reference device's data, on a store that grows hour by hour, and what
//! the chunks look like afterwards.
//!
//! The agent merges what every consumer has passed; on a device that is the 1h tier's
//! cursor, which moves once an hour, so an hour of small chunks becomes mergeable at once.
//! This bench writes the workload (`common/workload.rs`: tegrastats-like gauges at 1 Hz,
//! host every 10 s, `BENCH_INFERENCES` inferences a second, `BENCH_SCRAPED` scraped tag sets
//! every 15 s) through the real writer, one commit a second, and after each hour runs the
//! agent's merge steps (`Limits::default()`: ranges of 100,000 points, as the default
//! `[rollup] batch_points` gives the agent) until none is left, counting each step's WAL
//! frames (the WAL is truncated before it, autocheckpoint off). From the second hour on a
//! step also meets what the previous hour left (carried or waiting chunks): those hours are
//! the steady state.
//!
//! Run: `cargo bench --bench merge_wear` (`BENCH_HOURS=4` by default).

use std::time::Instant;

use edgewatch::config::Synchronous;
use edgewatch::store::chunks::{self, Scan};
use edgewatch::store::{compact, Mode, Reader, Writer};
use std::ops::ControlFlow;

#[path = "common/workload.rs"]
mod workload;
use workload::Device;

/// The store's page size.
const PAGE: u64 = edgewatch::store::open::PAGE_SIZE as u64;

fn env(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let hours = env("BENCH_HOURS", 4);
    let inferences = env("BENCH_INFERENCES", 35);
    let scraped = env("BENCH_SCRAPED", 140) as usize;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut writer = Writer::open(dir.path(), 100_000, Synchronous::Normal).expect("open store");
    let mut device = Device::new(inferences, scraped);
    let (mut conn, path) = edgewatch::store::open(dir.path(), Mode::Job).expect("job connection");
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .expect("autocheckpoint off");
    let wal = dir
        .path()
        .join(format!("{}-wal", edgewatch::store::DB_FILE));
    // Frames the WAL holds since the last truncation (each a page plus a 24-byte header,
    // after the 32-byte file header), then truncates it.
    let truncate = |conn: &rusqlite::Connection| -> i64 {
        let bytes = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        let busy: i64 = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .expect("checkpoint");
        assert_eq!(busy, 0, "checkpoint blocked");
        (bytes.saturating_sub(32) / (PAGE + 24)) as i64
    };
    println!(
        "reference workload: {inferences} inferences/s, {scraped} scraped tag sets; merge steps after each hour"
    );
    println!(
        "{:>4} {:>10} {:>6} {:>9} {:>9} {:>11} {:>10} {:>9}",
        "hour", "values", "steps", "removed", "written", "WAL frames", "WAL MB", "merge ms"
    );
    let mut steady = (0i64, 0i64, 0u64);
    for h in 0..hours {
        let mut values = 0u64;
        for s in h * 3600..(h + 1) * 3600 {
            let batch = device.second(s);
            values += batch.values() as u64;
            writer.write(&[&batch]).expect("commit");
        }
        truncate(&conn);
        let (mut steps, mut frames) = (0, 0);
        let mut pass = compact::Pass::default();
        let t = Instant::now();
        while let Some(p) =
            compact::merge_step(&mut conn, &path, &compact::Limits::default()).expect("merge step")
        {
            pass.add(&p);
            steps += 1;
            frames += truncate(&conn);
            assert!(steps < 1000, "does not converge");
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        println!(
            "{:>4} {:>10} {:>6} {:>9} {:>9} {:>11} {:>10.2} {:>9.0}",
            h + 1,
            values,
            steps,
            pass.removed,
            pass.written,
            frames,
            frames as f64 * (PAGE + 24) as f64 / 1e6,
            ms
        );
        if h > 0 {
            steady = (steady.0 + 1, steady.1 + frames, steady.2 + values);
        }
    }
    if steady.0 > 0 {
        println!(
            "steady state (hours 2-{hours}): {:.0} WAL frames/h, {:.2} MB/h of WAL, {:.1} frames per 10,000 values",
            steady.1 as f64 / steady.0 as f64,
            steady.1 as f64 * (PAGE + 24) as f64 / 1e6 / steady.0 as f64,
            steady.1 as f64 * 1e4 / steady.2 as f64
        );
    }
    // What the chunks look like: how many, how full, how dense.
    let r = Reader::open(dir.path()).expect("reader");
    let (mut n_chunks, mut n_points, mut full_points, mut bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut small = 0u64;
    chunks::scan(r.conn(), r.path(), &Scan::default(), |c| {
        n_chunks += 1;
        n_points += c.n as u64;
        bytes += c.bytes as u64;
        if c.n >= compact::SMALL_POINTS {
            full_points += c.n as u64;
        } else {
            small += 1;
        }
        Ok(ControlFlow::Continue(()))
    })
    .expect("scan");
    println!(
        "chunks: {n_chunks} ({small} small), {:.0} points a chunk, {:.1} % of points in chunks of at least {} points, {:.3} chunk bytes a point",
        n_points as f64 / n_chunks.max(1) as f64,
        100.0 * full_points as f64 / n_points.max(1) as f64,
        compact::SMALL_POINTS,
        bytes as f64 / n_points.max(1) as f64
    );
}
