//! Storage density benchmark: writes a realistic device workload through the real store (the
//! [`Writer`], one commit per second as the agent's writer does at this rate) and reports
//! raw bytes per value per measurement, the whole file's bytes per value, and how many days
//! of raw data fit in 1 GiB for a reference device.
//!
//! Workload (issue 19): 6 h of 40 tegrastats-like gauges at 1 Hz with timestamp jitter
//! (`jetson_*` tag sets as the tegrastats mapper writes them), host stats every 10 s and 10
//! inferences/s (three 2-decimal latencies, batch size, input length, ok): 2.17 M values.
//! Reference device: tegrastats at 1 Hz, host every 10 s, 30 inferences/s.
//!
//! Run: `cargo bench --bench storage` (any profile: sizes do not depend on it; `--profile
//! dev` builds fastest). `BENCH_HOURS=1` for a shorter run. After writing, the store is
//! measured as written and again after `edgewatch maintain --recompress`'s pass.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use edgewatch::config::Synchronous;
use edgewatch::store::chunks::{self, Scan};
use edgewatch::store::{dict, Reader, Writer};

#[path = "common/workload.rs"]
mod workload;
use workload::Device;

/// The workload's shape.
struct Workload {
    seconds: i64,
    inferences_per_s: i64,
}

/// Writes the workload into a new store in `dir`, one commit per second; returns the values
/// written and the seconds it took.
fn write(dir: &Path, w: &Workload) -> (u64, f64) {
    let mut writer = Writer::open(dir, 100_000, Synchronous::Normal).expect("open store");
    let mut device = Device::new(w.inferences_per_s, 0);
    let mut values = 0u64;
    let start = Instant::now();
    for s in 0..w.seconds {
        let batch = device.second(s);
        values += batch.values() as u64;
        writer.write(&[&batch]).expect("commit");
    }
    (values, start.elapsed().as_secs_f64())
}

/// Per measurement: chunks, values, chunk bytes.
#[derive(Default)]
struct Per {
    chunks: u64,
    values: u64,
    bytes: u64,
}

/// Chunk bytes and values per measurement, and the database file's size after a checkpoint
/// and VACUUM (so free pages do not count, as InfluxDB's figure is after a full compaction).
fn measure(dir: &Path) -> (BTreeMap<String, Per>, u64) {
    let r = Reader::open(dir).expect("reader");
    let d = dict::load(r.conn(), r.path()).expect("dictionary");
    let measurement: BTreeMap<i64, String> = d
        .tagsets
        .into_iter()
        .map(|t| (t.id, t.measurement))
        .collect();
    let mut per: BTreeMap<String, Per> = BTreeMap::new();
    chunks::scan(r.conn(), r.path(), &Scan::default(), |c| {
        let m = measurement.get(&c.tagset_id).cloned().unwrap_or_default();
        let p = per.entry(m).or_default();
        p.chunks += 1;
        p.bytes += c.bytes as u64;
        c.decode(r.path(), |_, _, _| p.values += 1)?;
        Ok(ControlFlow::Continue(()))
    })
    .expect("scan");
    drop(r);
    let db = edgewatch::store::db_path(dir);
    let conn = rusqlite::Connection::open(&db).expect("open");
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE); VACUUM;")
        .expect("vacuum");
    drop(conn);
    (per, edgewatch::store::disk_bytes(&db))
}

fn report(label: &str, per: &BTreeMap<String, Per>, file: u64) -> f64 {
    let values: u64 = per.values().map(|p| p.values).sum();
    let chunk_bytes: u64 = per.values().map(|p| p.bytes).sum();
    let chunks: u64 = per.values().map(|p| p.chunks).sum();
    // What the file holds beyond the chunk blobs (row headers, index, dictionary, pages),
    // shared out per chunk row.
    let per_row = file.saturating_sub(chunk_bytes) as f64 / chunks.max(1) as f64;
    println!("\n{label}: {values} values in {chunks} chunks, file {file} bytes");
    println!(
        "  {:<14} {:>9} {:>10} {:>12} {:>14}",
        "measurement", "chunks", "values", "data B/val", "on disk B/val"
    );
    for (m, p) in per {
        println!(
            "  {:<14} {:>9} {:>10} {:>12.2} {:>14.2}",
            m,
            p.chunks,
            p.values,
            p.bytes as f64 / p.values.max(1) as f64,
            (p.bytes as f64 + per_row * p.chunks as f64) / p.values.max(1) as f64
        );
    }
    let bpv = file as f64 / values.max(1) as f64;
    println!(
        "  {:<14} {:>9} {:>10} {:>12.2} {:>14.2}",
        "all",
        chunks,
        values,
        chunk_bytes as f64 / values.max(1) as f64,
        bpv
    );
    bpv
}

/// Brings the store to its steady state: what `edgewatch maintain --recompress` does
/// (merge runs of small chunks, re-encode what is left in the legacy form). Returns steps.
fn recompress(dir: &Path) -> Option<u64> {
    use edgewatch::store::compact;
    let (mut conn, path) =
        edgewatch::store::open(dir, edgewatch::store::Mode::Job).expect("job connection");
    let limits = compact::Limits {
        all: true,
        ..compact::Limits::default()
    };
    let mut steps = 0;
    while compact::merge_step(&mut conn, &path, &limits)
        .expect("merge step")
        .is_some()
    {
        steps += 1;
    }
    let mut after = 0;
    while let (_, Some(next)) =
        compact::convert_step(&mut conn, &path, after, 5_000).expect("convert step")
    {
        after = next;
        steps += 1;
    }
    Some(steps)
}

/// Would a general-purpose compressor on top pay? Deflate (flate2's pure-Rust miniz_oxide,
/// already a dependency) over every chunk's data: bytes saved and the CPU it costs.
fn deflate_on_top(dir: &Path) {
    use std::io::Write;
    let r = Reader::open(dir).expect("reader");
    let (mut raw, mut packed, mut values) = (0u64, 0u64, 0u64);
    let t = Instant::now();
    chunks::scan(r.conn(), r.path(), &Scan::default(), |c| {
        let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(c.data).expect("deflate");
        packed += z.finish().expect("deflate").len() as u64;
        raw += c.data.len() as u64;
        Ok(ControlFlow::Continue(()))
    })
    .expect("scan");
    let secs = t.elapsed().as_secs_f64();
    chunks::scan(r.conn(), r.path(), &Scan::default(), |c| {
        c.decode(r.path(), |_, _, _| values += 1)?;
        Ok(ControlFlow::Continue(()))
    })
    .expect("scan");
    println!(
        "  deflate on top: chunk data {raw} -> {packed} bytes ({:.2} -> {:.2} B/value, {:.1}% smaller), {:.0} ns a value to compress",
        raw as f64 / values.max(1) as f64,
        packed as f64 / values.max(1) as f64,
        100.0 * (1.0 - packed as f64 / raw.max(1) as f64),
        secs * 1e9 / values.max(1) as f64
    );
}

fn run(label: &str, w: &Workload) -> (f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (values, secs) = write(dir.path(), w);
    println!(
        "\n== {label}: {} s, {values} values written in {secs:.1} s ({:.0} values/s)",
        w.seconds,
        values as f64 / secs
    );
    let (per, file) = measure(dir.path());
    let written = report("as written", &per, file);
    let t = Instant::now();
    let steps = recompress(dir.path());
    let secs = t.elapsed().as_secs_f64();
    let (per, file) = measure(dir.path());
    let label = format!(
        "after recompress ({} steps, {secs:.1} s)",
        steps.unwrap_or(0)
    );
    let compact = report(&label, &per, file);
    deflate_on_top(dir.path());
    (written, compact)
}

fn main() {
    let hours: f64 = std::env::var("BENCH_HOURS")
        .ok()
        .and_then(|h| h.parse().ok())
        .unwrap_or(6.0);
    let seconds = (hours * 3600.0) as i64;
    run(
        "issue 19 workload",
        &Workload {
            seconds,
            inferences_per_s: 10,
        },
    );
    // The reference device, measured over a shorter span and extrapolated per value.
    let ref_seconds = seconds.min(3600);
    let (written, compact) = run(
        "reference device (tegrastats 1 Hz, host 10 s, 30 inferences/s)",
        &Workload {
            seconds: ref_seconds,
            inferences_per_s: 30,
        },
    );
    let per_day = 86_400.0 * (40.0 + 5.0 / 10.0 + 30.0 * 6.0);
    let gib = (1u64 << 30) as f64;
    println!(
        "\nreference device: {per_day:.0} values/day; days of raw data in 1 GiB: {:.1} as written, {:.1} after recompress",
        gib / (written * per_day),
        gib / (compact * per_day)
    );
}
