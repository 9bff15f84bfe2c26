//! The collector's part of the status document (`collectors.nvml`, a
//! [`crate::status::Nvml`]): state line, versions, samples and one entry per GPU. A shared
//! holder the sampler updates; it never reads NVML.

use crate::status::{Nvml, StatusCell};

use super::catalogue::SystemInfo;

/// One GPU as `/api/v1/status` shows it.
pub use crate::status::Gpu as GpuStatus;

/// The collector's live status; shared (`Arc`), updated after each sample.
#[derive(Debug)]
pub struct NvmlStatus {
    cell: StatusCell<Nvml>,
    /// The `gpu_process` memory of the last sample (with `[nvml] processes = true`), for
    /// the watched-process collector.
    pub process_mem: crate::collect::gpu_mem::GpuMemByPid,
}

impl Default for NvmlStatus {
    fn default() -> Self {
        NvmlStatus {
            cell: StatusCell::new(Nvml {
                state: "not started".into(),
                ..Nvml::default()
            }),
            process_mem: Default::default(),
        }
    }
}

impl NvmlStatus {
    /// A status saying "not started".
    pub fn new() -> NvmlStatus {
        NvmlStatus::default()
    }

    /// Sets the state line: `"running"`, `"off: <reason>"`, `"stopped"`, ...
    pub fn set_state(&self, state: impl Into<String>) {
        let s = state.into();
        self.cell.update(|i| i.state = s);
    }

    /// The state line.
    pub fn state(&self) -> String {
        self.cell.read(|i| i.state.clone())
    }

    /// Every GPU's status.
    pub fn gpus(&self) -> Vec<GpuStatus> {
        self.cell.read(|i| i.gpus.clone())
    }

    pub(super) fn update(&self, system: &SystemInfo, gpus: Vec<GpuStatus>) {
        self.cell.update(|i| {
            i.driver.clone_from(&system.driver);
            i.cuda.clone_from(&system.cuda);
            i.gpus = gpus;
        });
    }

    pub(super) fn record_sample_us(&self, us: u64) {
        self.cell.update(|i| {
            i.samples += 1;
            i.last_sample_us = Some(us);
        });
    }

    /// The `collectors.nvml` part of the status document: `state`, `driver`, `cuda`,
    /// `samples`, `last_sample_us` (wall time of the last sample, NVML calls included) and
    /// `gpus`.
    pub fn snapshot(&self) -> Nvml {
        self.cell.snapshot()
    }
}
