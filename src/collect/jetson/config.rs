//! `[jetson]`: the Jetson state collector's section. A leaf: it imports only the shared
//! value types (`config::values`), so `config` can hold it without importing the collector.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::values::Interval;

/// `[jetson]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JetsonConfig {
    /// Whether the collector runs (it stays off by itself on other machines).
    pub enabled: bool,
    /// Sampling interval.
    pub interval: Interval,
    /// Where `/proc`, `/sys`, `/etc` and `/var` are found.
    pub root: PathBuf,
    /// The `nvpmodel` binary, used only when no status file exists.
    pub nvpmodel: PathBuf,
    /// Per-process GPU memory (`jetson_process`) from the nvmap debugfs client list
    /// (readable by root only; off with one log line where it cannot be read).
    pub processes: bool,
    /// How often the GPU source is probed again while on a fallback (no devfreq node with
    /// its own load: NVML, none, or a node without a load file).
    pub gpu_reprobe: Interval,
}

impl Default for JetsonConfig {
    fn default() -> Self {
        JetsonConfig {
            enabled: true,
            interval: Interval(Duration::from_secs(5)),
            root: PathBuf::from("/"),
            nvpmodel: PathBuf::from("/usr/sbin/nvpmodel"),
            processes: true,
            gpu_reprobe: Interval(Duration::from_secs(30)),
        }
    }
}
