//! `[tegrastats]`: the collector's configuration and the stall rule derived from it.
//! Only types and defaults; it reads nothing.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::STALL_INTERVALS;
use crate::config::values::Interval;

/// `[tegrastats]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TegrastatsConfig {
    /// Run the collector when `path` exists (or `replay` is set).
    pub enabled: bool,
    /// The tegrastats binary.
    pub path: PathBuf,
    /// Sampling interval passed as `--interval <ms>`.
    pub interval: Interval,
    /// A recorded tegrastats log to replay (looping) instead of running tegrastats.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<PathBuf>,
    /// Restart a tegrastats that is alive but has printed nothing for this long (at least
    /// [`STALL_INTERVALS`] sampling intervals are always allowed).
    pub stall_timeout: Interval,
}

impl Default for TegrastatsConfig {
    fn default() -> Self {
        TegrastatsConfig {
            enabled: true,
            path: PathBuf::from("/usr/bin/tegrastats"),
            interval: Interval(std::time::Duration::from_secs(1)),
            replay: None,
            stall_timeout: Interval(std::time::Duration::from_secs(30)),
        }
    }
}

impl TegrastatsConfig {
    /// How long tegrastats may stay silent before it is restarted: `stall_timeout`, but
    /// never under [`STALL_INTERVALS`] intervals (a slow interval is not a stall).
    pub fn stall_after(&self) -> Duration {
        self.stall_timeout
            .0
            .max(self.interval.0.saturating_mul(STALL_INTERVALS))
    }
}
