//! `[kmsg]`: the kernel log collector's section. A leaf: it imports only the shared value
//! types (`config::values`), so `config` can hold it without importing the collector.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::values::Interval;

/// The Xid codes that NVIDIA's Xid catalog says need a GPU reset, a node reboot or a
/// hardware check (see `config/edgewatch.toml` for each code's reason).
pub const DEFAULT_FATAL_XIDS: &[u32] = &[48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120];

/// `[kmsg]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KmsgConfig {
    /// Whether the collector runs (default on Linux).
    pub enabled: bool,
    /// The kernel log device.
    pub device: PathBuf,
    /// Xid codes reported as `critical` (the others as `warning`).
    pub fatal_xids: Vec<u32>,
    /// Events per second kept in a flood (a token bucket refilled at this rate).
    pub max_events_per_s: u32,
    /// Events kept at once before the rate applies (the bucket's size).
    pub burst: u32,
    /// How often `/proc/vmstat` `oom_kill` is compared with the OOM kills logged.
    pub oom_check_interval: Interval,
}

impl Default for KmsgConfig {
    fn default() -> Self {
        KmsgConfig {
            enabled: cfg!(target_os = "linux"),
            device: PathBuf::from("/dev/kmsg"),
            fatal_xids: DEFAULT_FATAL_XIDS.to_vec(),
            max_events_per_s: 50,
            burst: 200,
            oom_check_interval: Interval(Duration::from_secs(10)),
        }
    }
}

/// Refuses a bound that would keep nothing (`max_events_per_s` or `burst` of 0).
pub fn validate(c: &KmsgConfig) -> Result<(), String> {
    if c.max_events_per_s == 0 {
        return Err("[kmsg] max_events_per_s must be at least 1".into());
    }
    if c.burst == 0 {
        return Err("[kmsg] burst must be at least 1".into());
    }
    Ok(())
}
