//! Write wear of small-chunk merging (`store::compact`): the WAL pages its steps write for
//! each hour of the reference device's data, on a store that grows hour by hour, and what
//! the chunks look like afterwards.
//!
//! The agent merges what every consumer has passed; on a device that is the 1h tier's
//! cursor, which moves once an hour, so an hour of small chunks becomes mergeable at once.
//! This bench writes the workload (`common/workload.rs`: tegrastats-like gauges at 1 Hz,
//! host every 10 s, `BENCH_INFERENCES` inferences a second, `BENCH_SCRAPED` scraped tag sets
//! every 15 s) through the real writer, one commit a second. At each hour's end the 1h
//! tier's cursor moves to the end of the hour before (so, as in the agent, what merges lies
//! behind a newer hour's pages), and the agent's merge steps (`Limits::default()`: ranges
//! of 100,000 points, as the default `[rollup] batch_points` gives the agent) run until none
//! is left, counting each step's WAL frames (the WAL is truncated before it, autocheckpoint
//! off), and the pages left free. `BENCH_SHRINK_MIB=N` also gives free pages back past N MiB
//! (`PRAGMA incremental_vacuum`, as the agent's job does past its threshold) and counts
//! those frames too. From the second merge on a step also meets what the previous hour
//! left (carried or waiting chunks): hours 2 on are the steady state.
//!
//! The merge steps' Rust heap peak (over what was allocated before them; SQLite's own page
//! cache is not counted) shows how much of a range a step holds at once.
//!
//! Run: `cargo bench --bench merge_wear` (`BENCH_HOURS=4` by default).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// The system allocator, counting the bytes allocated now and their peak.
struct Counting;

static HEAP: AtomicUsize = AtomicUsize::new(0);
static HEAP_PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = HEAP.fetch_add(by, Ordering::Relaxed) + by;
    HEAP_PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call goes to `System` with the caller's arguments; the counters only
// observe the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        HEAP.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            HEAP.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

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
    let shrink_mib = env("BENCH_SHRINK_MIB", 0);
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
        "{:>4} {:>10} {:>6} {:>9} {:>9} {:>11} {:>10} {:>9} {:>10} {:>12}",
        "hour",
        "values",
        "steps",
        "removed",
        "written",
        "WAL frames",
        "WAL MB",
        "merge ms",
        "free pages",
        "heap peak MB"
    );
    let mut steady = (0i64, 0i64, 0u64);
    let mut folded = 0i64;
    for h in 0..hours {
        let mut values = 0u64;
        for s in h * 3600..(h + 1) * 3600 {
            let batch = device.second(s);
            values += batch.values() as u64;
            writer.write(&[&batch]).expect("commit");
        }
        // The 1h tier's fold at the hour's end: it has folded the hour before this one, as
        // the agent's tier does an hour after (it folds an hour once it has closed, and
        // merging waits for every tier): merged pages lie behind this hour's.
        conn.execute(
            "INSERT OR REPLACE INTO rollup_state (tier, cursor, watermark_ns, late_points, updated_ns) \
             VALUES (3600, ?1, 0, 0, 0)",
            [folded],
        )
        .expect("tier cursor");
        folded = conn
            .query_row("SELECT COALESCE(MAX(id), 0) FROM chunks", [], |r| r.get(0))
            .expect("newest chunk");
        truncate(&conn);
        let (mut steps, mut frames) = (0, 0);
        let mut pass = compact::Pass::default();
        let base = HEAP.load(Ordering::Relaxed);
        HEAP_PEAK.store(base, Ordering::Relaxed);
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
        let heap_peak = HEAP_PEAK.load(Ordering::Relaxed).saturating_sub(base);
        // Pages the merges freed (and the hour's writes did not reuse). With
        // `BENCH_SHRINK_MIB` set, free pages past that many MiB are given back as the
        // agent's job did before (`PRAGMA incremental_vacuum`, moving pages from the file's
        // end into the holes), its frames counted with the merges'.
        let free: i64 = conn
            .query_row("PRAGMA freelist_count", [], |r| r.get(0))
            .expect("freelist_count");
        if shrink_mib > 0 && free * PAGE as i64 >= shrink_mib << 20 {
            // One page a step: stepped to the end, as `space::shrink` does.
            let mut st = conn.prepare("PRAGMA incremental_vacuum").expect("vacuum");
            let mut rows = st.query([]).expect("vacuum");
            while rows.next().expect("vacuum step").is_some() {}
            drop(rows);
            drop(st);
            frames += truncate(&conn);
        }
        println!(
            "{:>4} {:>10} {:>6} {:>9} {:>9} {:>11} {:>10.2} {:>9.0} {:>10} {:>12.2}",
            h + 1,
            values,
            steps,
            pass.removed,
            pass.written,
            frames,
            frames as f64 * (PAGE + 24) as f64 / 1e6,
            ms,
            free,
            heap_peak as f64 / 1e6
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
