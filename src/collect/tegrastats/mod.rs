//! The Jetson collector: runs NVIDIA's `tegrastats --interval <ms>`, parses each line it
//! prints with the `tegrastats-parser` crate and submits the sample as `jetson_*` lines.
//! If tegrastats exits, cannot be started, closes its stdout without exiting (it is then
//! stopped after 2 s), or stays alive but prints nothing for `stall_timeout` (default 30 s,
//! at least 5 intervals; it is then stopped), it is restarted with exponential backoff (1 s doubling to 60 s, minus
//! up to 25 % jitter, back to 1 s after a run of a minute or more). Its stderr is logged at
//! warn (at most 10 lines a minute). On shutdown it gets SIGTERM, then SIGKILL after a
//! second, and is waited for; it runs in its own process group and both signals go to the
//! whole group, so nothing it started outlives a clean shutdown (if the agent itself is
//! killed with SIGKILL, tegrastats dies of SIGPIPE at its next line). With
//! `[tegrastats] replay = "FILE"` it instead reads a recorded tegrastats log, one line per
//! interval, looping (for demos, tests and hosts that are not Jetsons). With neither a
//! replay file nor a tegrastats binary at `path` it logs one line and stays off.
//!
//! It never changes clocks or power modes (no `--start`/`--stop` or other tegrastats
//! options), runs nothing but the configured binary (and kill(1) to stop it), never blocks
//! the async runtime (files are read on the blocking pool, the pipes asynchronously), and
//! never buffers more than one line of tegrastats output (lines over 64 KiB are skipped).
//!
//! **Timestamps** are the agent's clock when the line is read, not the timestamp tegrastats
//! prints (JetPack 5+): that one is local time without a time zone, has one-second
//! resolution (several lines share it below a 1 s interval) and is absent on older
//! releases. A replayed log is stamped the same way, so it looks live.
//!
//! Measurements (a contract once released; see docs/collectors.md). Every number is a float;
//! `online` and `on` are booleans. A field tegrastats did not print (it depends on the SoC,
//! the release and on running as root) is left out, and a line without fields is not sent.
//!
//! | measurement | tags | fields |
//! |---|---|---|
//! | `jetson_mem` | | `ram_used_mb`, `ram_total_mb`, `ram_used_pct`, `lfb_blocks`, `lfb_block_mb` (largest free block: count and size), `swap_used_mb`, `swap_total_mb`, `swap_cached_mb`, `iram_used_mb`, `iram_total_mb`, `iram_lfb_mb` |
//! | `jetson_cpu` | | `cores` (listed), `cores_online`, `load_pct` (mean over online cores), `mts_fg_pct`, `mts_bg_pct` (Denver/Carmel), `edp_limit_mhz` (TK1/TX1) |
//! | `jetson_cpu` | `core` (0-based) | `online`; when online also `load_pct`, `freq_mhz` |
//! | `jetson_emc` | | `load_pct`, `freq_mhz` |
//! | `jetson_gpu` | | `load_pct`, `freq_mhz` (with per-GPC clocks: the highest) |
//! | `jetson_gpu` | `gpc` (0-based) | `freq_mhz`, only when printed per GPC (`GR3D_FREQ 0%@[305,1300]`) |
//! | `jetson_engine` | `engine` | `on` (`false` when printed `off`, then nothing else), `load_pct`, `freq_mhz` |
//! | `jetson_engine` | `engine`, `unit` | `load_pct` per unit (`PVA0_FREQ [10%,5%]@1152`) |
//! | `jetson_temp` | `zone` | `temp_c`, `peak_c` (JetPack 7.2 `cpu@52.9C/53.1C`) |
//! | `jetson_power` | `rail` | `current_mw`, `average_mw` (since tegrastats started), `peak_mw` (JetPack 7.2) |
//!
//! Names: `engine` is the printed name without a trailing `_FREQ`/`_LOAD`, so JetPack 5's
//! `VIC_FREQ`, JetPack 6's `VIC` and DRIVE's `VIC_LOAD` are one series (`GR3D2_FREQ`, the
//! second GPC of JetPack 5.0 Orin, is engine `GR3D2`). `zone` is the printed zone name in
//! lower case (JetPack 5 prints `CPU@`, JetPack 6 `cpu@`). `rail` is the name as printed; a
//! rail printed twice in one line (`NC` on JetPack 5 Orin) is `NC#2` the second time.
//! Sensors that report "not available" (`CV0@-256C`) and the `PMIC@100C` placeholder (a
//! constant alarm threshold, not a reading) are not stored. Unknown tokens are ignored.
//!
//! Layout: `config`, `error`, `status`, `mapper` (sample -> lines), `cli`
//! (`edgewatch tegrastats parse`), `replay`, `reader` (bounded lines from a pipe) and
//! `supervise` (the process and its restarts). This file holds the entry point.

mod cli;
pub(crate) mod config;
mod error;
mod mapper;
mod reader;
mod replay;
mod status;
mod supervise;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::queue::IngestHandle;
use crate::stats::Stats;

pub use cli::parse_command;
pub use config::TegrastatsConfig;
pub use error::TegrastatsError;
pub use mapper::{engine_tag, sample_to_lines};
pub use reader::{LineReader, RawLine};
use replay::run_replay;
pub use replay::Replay;
pub use status::TegrastatsStatus;
use supervise::run_process;
pub use supervise::{backoff_delay, StderrLimit, RESTART};

/// A silent tegrastats is given at least this many sampling intervals before it counts as
/// stalled.
pub const STALL_INTERVALS: u32 = 5;

/// Longest line read from tegrastats or a replay file; real lines are below 2 KiB.
pub const MAX_LINE_LEN: usize = 64 * 1024;
/// First restart delay.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A run at least this long resets the restart delay to [`BACKOFF_MIN`].
pub const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// How long tegrastats gets to exit after SIGTERM before SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(1);
/// How long tegrastats may keep running after closing its stdout before it is stopped.
pub const CLOSED_OUTPUT_GRACE: Duration = Duration::from_secs(2);
/// Stderr lines logged per minute; the rest are counted and summarised.
pub const STDERR_LINES_PER_MINUTE: u32 = 10;

/// Runs until `shutdown`, keeping `status` current.
pub async fn run(
    cfg: TegrastatsConfig,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: Arc<TegrastatsStatus>,
    jetson: Arc<crate::collect::jetson::JetsonStatus>,
    shutdown: CancellationToken,
) {
    if !cfg.enabled {
        status.set("off", "disabled in the configuration");
        return;
    }
    // The Jetson identity first (read once at start, a few files): then every point, the
    // first ones included, carries its tags.
    jetson.settled(std::time::Duration::from_secs(5)).await;
    if let Some(file) = cfg.replay.clone() {
        status.set("replaying", file.display().to_string());
        run_replay(
            file,
            cfg.interval.0,
            handle,
            stats,
            &status,
            &jetson,
            shutdown,
        )
        .await;
        return;
    }
    if !tokio::fs::try_exists(&cfg.path).await.unwrap_or(false) {
        tracing::info!(
            "tegrastats not found at {}; Jetson collector off",
            cfg.path.display()
        );
        status.set(
            "off",
            format!("tegrastats not found at {}", cfg.path.display()),
        );
        return;
    }
    run_process(cfg, handle, stats, &status, &jetson, shutdown).await;
}
