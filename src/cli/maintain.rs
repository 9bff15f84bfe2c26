//! `edgewatch maintain`: one pass of rollup, retention and the disk budget on a store, then
//! exit; safe while the agent runs. Migrates an older store first, as the agent would.
//! Prints what the pass did as one JSON object.

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
    // Migrates an older store as the agent would; a no-op on a current one.
    drop(edgewatch::store::Writer::open(
        &dir,
        cfg.storage.max_series.get(),
        cfg.storage.synchronous,
    )?);
    let mut job = edgewatch::rollup::Job::open(&dir, plan)?;
    job.pause_between_steps = std::time::Duration::from_millis(args.debug_pause_ms);
    let r = job.run_once(edgewatch::now_ns(), &|| false)?;
    println!(
        "{}",
        serde_json::json!({
            "rolled_up_points": r.points, "rolled_up_chunks": r.chunks, "steps": r.steps,
            "evicted_chunks": r.evicted_chunks, "evicted_points": r.evicted_points,
            "evicted_rows": r.evicted_rows, "db_bytes": r.db_bytes,
            "clock_held": r.clock_held, "clock_fixed_points": r.clock_fixed_points,
        })
    );
    Ok(ExitCode::SUCCESS)
}
