//! Jetson collector (being written): runs `tegrastats`, parses its lines with the
//! `tegrastats-parser` crate into `jetson_*` measurements.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::config::Interval;
use crate::queue::IngestHandle;
use crate::stats::Stats;

/// `[tegrastats]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TegrastatsConfig {
    /// Run the collector when `path` exists (or `replay` is set).
    pub enabled: bool,
    /// The tegrastats binary.
    pub path: PathBuf,
    /// Sampling interval passed as `--interval <ms>`.
    pub interval: Interval,
    /// A recorded tegrastats log to replay (looping) instead of running tegrastats.
    pub replay: Option<PathBuf>,
}

impl Default for TegrastatsConfig {
    fn default() -> Self {
        TegrastatsConfig {
            enabled: true,
            path: PathBuf::from("/usr/bin/tegrastats"),
            interval: Interval(std::time::Duration::from_secs(1)),
            replay: None,
        }
    }
}

/// Runs until `shutdown`.
pub async fn run(
    cfg: TegrastatsConfig,
    handle: IngestHandle,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) {
    let _ = (cfg, handle, stats, shutdown);
}

/// `edgewatch tegrastats parse [FILE|-]`: one JSON object per input line on `out`, errors
/// naming the line on `err`. Returns false when any line failed.
pub fn parse_command(
    input: Option<&Path>,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> std::io::Result<bool> {
    let _ = (input, out, err);
    Ok(true)
}
