//! `edgewatch maintain`: one pass of rollup, retention and the disk budget on a store, then
//! exit; safe while the agent runs. Migrates an older store first, as the agent would.
//! Prints what the pass did as one JSON object, with the raw store's bytes per value by
//! measurement. `--recompress` also merges small chunks and re-encodes legacy ones into the
//! columnar form, in bounded steps (`store::compact`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;

use crate::{init_logging, load_config};

#[derive(clap::Args)]
pub struct MaintainArgs {
    /// Store directory (default: the config's data_dir).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Config file (tiers, retention, budget).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Also recompress: merge small chunks (every consumer has passed) and re-encode chunks
    /// in the legacy form, in bounded steps.
    #[arg(long)]
    recompress: bool,
    /// Test aid for crash tests only: sleep this many ms after each committed rollup step.
    #[arg(long, hide = true, default_value_t = 0)]
    debug_pause_ms: u64,
}

pub fn run(args: MaintainArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(args.config.as_deref())?;
    init_logging(&cfg.log.level);
    let dir = args
        .data_dir
        .unwrap_or_else(|| cfg.storage.data_dir.clone());
    if !edgewatch::store::db_path(&dir).exists() {
        bail!(
            "no edgewatch database in {} (is --data-dir right?)",
            dir.display()
        );
    }
    let plan = edgewatch::rollup::Plan::from_config(&cfg)?;
    // Migrates an older store as the agent would (a no-op on a current one), and stores
    // what the ingest journal holds when no agent runs on it (a running agent owns it).
    let (max_series, sync) = (cfg.storage.max_series.get(), cfg.storage.synchronous);
    match edgewatch::store::Writer::open(&dir, max_series, sync) {
        Ok(w) => drop(w),
        Err(edgewatch::store::StoreError::InUse(_)) => drop(
            edgewatch::store::Writer::open_unjournaled(&dir, max_series, sync)?,
        ),
        Err(e) => return Err(e.into()),
    }
    let mut job = edgewatch::rollup::Job::open(&dir, plan)?;
    job.pause_between_steps = std::time::Duration::from_millis(args.debug_pause_ms);
    let r = job.run_once(edgewatch::now_ns(), &|| false)?;
    drop(job);
    let (mut conn, path) = edgewatch::store::open(&dir, edgewatch::store::Mode::Job)?;
    let mut recompressed = edgewatch::store::compact::Pass::default();
    if args.recompress {
        use edgewatch::store::compact;
        let limits = compact::Limits {
            all: true,
            ..compact::Limits::default()
        };
        while let Some(p) = compact::merge_step(&mut conn, &path, &limits)? {
            recompressed.add(&p);
        }
        let mut after = 0;
        loop {
            let (p, next) = compact::convert_step(&mut conn, &path, after, 5_000)?;
            recompressed.add(&p);
            match next {
                Some(n) => after = n,
                None => break,
            }
        }
    }
    let density = edgewatch::store::chunks::density(&conn, &path)?;
    let by_measurement: serde_json::Map<String, serde_json::Value> = density
        .iter()
        .map(|d| {
            (
                d.measurement.clone(),
                serde_json::json!({
                    "chunks": d.chunks, "legacy_chunks": d.legacy_chunks, "points": d.points,
                    "values": d.values, "bytes": d.bytes,
                    "bytes_per_value": d.bytes as f64 / d.values.max(1) as f64,
                }),
            )
        })
        .collect();
    let (values, bytes) = density
        .iter()
        .fold((0u64, 0u64), |(v, b), d| (v + d.values, b + d.bytes));
    println!(
        "{}",
        serde_json::json!({
            "recompressed": {
                "chunks_written": recompressed.written, "chunks_removed": recompressed.removed,
                "legacy_converted": recompressed.converted, "points": recompressed.points,
                "bytes_before": recompressed.bytes_before, "bytes_after": recompressed.bytes_after,
            },
            "raw_values": values, "raw_bytes": bytes,
            "raw_bytes_per_value": bytes as f64 / values.max(1) as f64,
            "bytes_per_value": by_measurement,
            "rolled_up_points": r.points, "rolled_up_chunks": r.chunks, "steps": r.steps,
            "evicted_chunks": r.evicted_chunks, "evicted_points": r.evicted_points,
            "evicted_rows": r.evicted_rows, "db_bytes": r.db_bytes,
            "clock_held": r.clock_held, "clock_fixed_points": r.clock_fixed_points,
        })
    );
    Ok(ExitCode::SUCCESS)
}
