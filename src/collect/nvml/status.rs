//! The collector's status for `/api/v1/status` (`"nvml"`): state line, versions, samples
//! and one entry per GPU. A shared holder the sampler updates; it never reads NVML.

use std::sync::Mutex;

use serde_json::json;

use super::catalogue::SystemInfo;

/// One GPU as `/api/v1/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuStatus {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Architecture.
    pub arch: String,
    /// Compute capability.
    pub cc: String,
    /// Unreachable: fell off the bus, needs a reset, or NVML will not hand out its handle
    /// (the reason is in `last_error`); retried with backoff (10 s doubling to 5 min).
    pub lost: bool,
    /// The last error seen on this GPU, if any.
    pub last_error: Option<String>,
    /// Metrics this GPU answered `NotSupported` for.
    pub unsupported: Vec<&'static str>,
}

#[derive(Debug, Clone)]
struct StatusInner {
    state: String,
    system: SystemInfo,
    gpus: Vec<GpuStatus>,
    samples: u64,
    last_sample_us: Option<u64>,
}

/// The collector's state for `/api/v1/status`; shared (`Arc`), updated after each sample.
#[derive(Debug)]
pub struct NvmlStatus {
    inner: Mutex<StatusInner>,
}

impl Default for NvmlStatus {
    fn default() -> Self {
        NvmlStatus {
            inner: Mutex::new(StatusInner {
                state: "not started".into(),
                system: SystemInfo::default(),
                gpus: Vec::new(),
                samples: 0,
                last_sample_us: None,
            }),
        }
    }
}

impl NvmlStatus {
    /// A status saying "not started".
    pub fn new() -> NvmlStatus {
        NvmlStatus::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut StatusInner) -> R) -> R {
        // A panic elsewhere while holding the lock leaves plain data behind: keep using it.
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Sets the state line: `"running"`, `"off: <reason>"`, `"stopped"`, ...
    pub fn set_state(&self, state: impl Into<String>) {
        let s = state.into();
        self.with(|i| i.state = s);
    }

    /// The state line.
    pub fn state(&self) -> String {
        self.with(|i| i.state.clone())
    }

    /// Every GPU's status.
    pub fn gpus(&self) -> Vec<GpuStatus> {
        self.with(|i| i.gpus.clone())
    }

    pub(super) fn update(&self, system: &SystemInfo, gpus: Vec<GpuStatus>) {
        self.with(|i| {
            if &i.system != system {
                i.system = system.clone();
            }
            i.gpus = gpus;
        });
    }

    pub(super) fn record_sample_us(&self, us: u64) {
        self.with(|i| {
            i.samples += 1;
            i.last_sample_us = Some(us);
        });
    }

    /// JSON for `/api/v1/status` under `"nvml"`: `state`, `driver`, `cuda`, `samples`,
    /// `last_sample_us` (wall time of the last sample, NVML calls included) and `gpus`
    /// (`index`, `uuid`, `name`, `arch`, `cc`, `lost`, `last_error`, `unsupported`).
    pub fn snapshot(&self) -> serde_json::Value {
        let i = self.with(|i| i.clone());
        let gpus: Vec<serde_json::Value> = i
            .gpus
            .iter()
            .map(|g| serde_json::to_value(g).unwrap_or(serde_json::Value::Null))
            .collect();
        json!({
            "state": i.state,
            "driver": i.system.driver,
            "cuda": i.system.cuda,
            "samples": i.samples,
            "last_sample_us": i.last_sample_us,
            "gpus": gpus,
        })
    }
}
