//! `[nvml]`: the collector's configuration. Only types and defaults; it reads nothing.

use std::time::Duration;

use crate::config::values::Interval;

/// `[nvml]`
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlConfig {
    /// Whether the collector runs (it also switches itself off where NVML is unavailable).
    pub enabled: bool,
    /// Sampling interval.
    pub interval: Interval,
    /// Whether per-process samples (`gpu_process`) are collected.
    pub processes: bool,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        NvmlConfig {
            enabled: true,
            interval: Interval(Duration::from_secs(5)),
            processes: false,
        }
    }
}
