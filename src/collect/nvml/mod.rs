//! The NVIDIA GPU collector: reads every GPU that NVML (`libnvidia-ml.so.1`, through
//! `nvml-wrapper`) lists, every interval, and submits the readings to the ingest queue like
//! any other producer. It is on by default and switches itself off with one log line where
//! there is no NVIDIA driver, no GPU, or a driver/library mismatch; the agent runs on.
//! A metric a GPU answers `NotSupported` for (most of them on Jetson Orin, where tegrastats
//! stays the source) is logged once and skipped for that GPU; a GPU that falls off the bus
//! is logged, shown as lost in `/api/v1/status` and retried with backoff while the others
//! keep being polled. NVML calls run on a blocking thread, never on the async workers.
//! This module only reads: it never changes a GPU setting (no NVML `set_*` call), never
//! writes to the store, and never panics on what the driver answers.
//!
//! The readings come from a small trait, [`GpuSource`] ([`NvmlSource`] over NVML,
//! `FakeGpu` for tests and the benchmark, compiled only under `cfg(test)` or the
//! `test-fakes` feature); turning readings into lines
//! ([`readings_to_lines`]) and the bookkeeping ([`Sampler`]) are plain functions of them.
//!
//! Measurements (a contract once released; see docs/collectors.md). Memory is in MiB (`_mb`, as the
//! `host` collector), gauges are floats, counters/bitmasks/flags/modes are integers.
//!
//! `gpu`, tags `gpu` (NVML index), `uuid`, `name`, `arch` (e.g. `Ampere`), `cc` (CUDA
//! compute capability, e.g. `8.6`), `driver` (e.g. `550.54.15`), `cuda` (CUDA driver
//! version, e.g. `12.4`); a tag NVML cannot tell is left out:
//!
//! | field | type | unit / meaning | NVML |
//! |---|---|---|---|
//! | `util_gpu_pct`, `util_mem_pct` | float | % busy over the driver's sample period | `nvmlDeviceGetUtilizationRates` |
//! | `mem_total_mb`, `mem_used_mb`, `mem_free_mb` | float | MiB of device memory | `nvmlDeviceGetMemoryInfo_v2` |
//! | `bar1_total_mb`, `bar1_used_mb`, `bar1_free_mb` | float | MiB of BAR1 aperture | `nvmlDeviceGetBAR1MemoryInfo` |
//! | `temp_c` | float | °C, GPU die | `nvmlDeviceGetTemperature` |
//! | `temp_slowdown_c`, `temp_shutdown_c`, `temp_max_operating_c` | float | °C thresholds (HW slowdown, shutdown, GPU max operating) | `nvmlDeviceGetTemperatureThreshold` |
//! | `power_w` | float | W, board draw | `nvmlDeviceGetPowerUsage` |
//! | `power_limit_w` | float | W, enforced limit | `nvmlDeviceGetEnforcedPowerLimit` |
//! | `energy_mj` | integer | mJ (millijoules) since the driver loaded | `nvmlDeviceGetTotalEnergyConsumption` |
//! | `clock_graphics_mhz`, `clock_sm_mhz`, `clock_mem_mhz`, `clock_video_mhz` | float | MHz, current | `nvmlDeviceGetClockInfo` |
//! | `clock_graphics_max_mhz`, `clock_sm_max_mhz`, `clock_mem_max_mhz`, `clock_video_max_mhz` | float | MHz, maximum | `nvmlDeviceGetMaxClockInfo` |
//! | `throttle_reasons` | integer | raw clock-event (throttle) reason bitmask, unknown bits kept | `nvmlDeviceGetCurrentClocksThrottleReasons` |
//! | `throttle_idle`, `throttle_app_clocks`, `throttle_power_cap`, `throttle_hw_slowdown`, `throttle_sync_boost`, `throttle_sw_thermal`, `throttle_hw_thermal`, `throttle_power_brake`, `throttle_display_clocks` | integer | 0/1, one per named reason (bits 0x1, 0x2, 0x4, 0x8, 0x10, 0x20, 0x40, 0x80, 0x100) | same call |
//! | `pcie_tx_kib_s`, `pcie_rx_kib_s` | float | PCIe throughput in **kilobytes**/s, as NVML reports it (20 ms window) | `nvmlDeviceGetPcieThroughput` |
//! | `pcie_link_gen`, `pcie_link_width` | integer | current link generation and lane count | `nvmlDeviceGetCurrPcieLinkGeneration/Width` |
//! | `fan_pct` | float | % of max fan speed, mean over the GPU's fans | `nvmlDeviceGetNumFans`, `nvmlDeviceGetFanSpeed_v2` |
//! | `ecc_enabled` | integer | 0/1, ECC currently on | `nvmlDeviceGetEccMode` |
//! | `ecc_corrected`, `ecc_uncorrected` | integer | volatile ECC error counts (since the driver loaded); only while ECC is on | `nvmlDeviceGetTotalEccErrors` |
//! | `mig_mode`, `mig_mode_pending` | integer | 0/1, MIG mode now / after the next reset | `nvmlDeviceGetMigMode` |
//!
//! `gpu_mig`, tags `gpu`, `uuid` (the parent GPU's), `mig` (MIG device slot), `mig_uuid`;
//! only while MIG mode is on: `mem_total_mb`, `mem_used_mb`, `mem_free_mb` (float, MiB held
//! by that MIG instance; `nvmlDeviceGetMigDeviceHandleByIndex` + `nvmlDeviceGetMemoryInfo_v2`).
//!
//! `gpu_process`, tags `gpu`, `uuid`, `pid`, `process` (executable base name); only with
//! `[nvml] processes = true`: `mem_used_mb` (float, MiB; left out where the driver cannot
//! tell), `sm_util_pct`, `mem_util_pct` (float, %, where the GPU supports per-process
//! utilization; 0 for a listed process with no utilization sample since the last poll)
//! (`nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3`, `nvmlDeviceGetProcessUtilization`).
//!
//! Thresholds and maximum clocks do not change while the driver runs: they are read once
//! per GPU and repeated in every sample. `NotSupported` metrics are probed again hourly,
//! silently.
//!
//! Layout: `config` ([`NvmlConfig`]), `error`, `catalogue` (metrics and readings), `lines`
//! (readings -> lines), `status`, `sampler` (the state machine), `report` (`edgewatch
//! gpus`), `source` (NVML) and, under `cfg(test)` or the `test-fakes` feature only, `fake`.
//! This file holds the run loop.

mod catalogue;
pub(crate) mod config;
mod error;
#[cfg(any(test, feature = "test-fakes"))]
mod fake;
mod lines;
mod report;
mod sampler;
mod source;
mod status;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::queue::IngestHandle;
use crate::stats::Stats;

pub use catalogue::{
    GpuIdentity, GpuProcess, Metric, MigInstance, ProcessUtil, Reading, SystemInfo,
    THROTTLE_REASONS,
};
pub use config::NvmlConfig;
pub use error::{NvmlInitError, ReadError};
#[cfg(any(test, feature = "test-fakes"))]
pub use fake::{bench_fake_sample, FakeDevice, FakeGpu};
pub use lines::{gpu_fields, readings_to_lines};
pub use report::{gpus_report, write_report};
pub use sampler::{SampleOutcome, Sampler, FIRST_BACKOFF_NS, MAX_BACKOFF_NS, REPROBE_NS};
pub use source::{GpuSource, NvmlSource};
pub use status::{GpuStatus, NvmlStatus};

/// Runs the collector until `shutdown`: initialises NVML on a blocking thread (logging one
/// line and returning, with the status saying why, where it is unavailable), then samples
/// every `cfg.interval` on a blocking thread and submits the lines without waiting.
pub async fn run(
    cfg: NvmlConfig,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: Arc<NvmlStatus>,
    shutdown: CancellationToken,
) {
    run_with(cfg, NvmlSource::init, handle, stats, status, shutdown).await
}

/// [`run`] over any source; `init` runs on a blocking thread.
pub async fn run_with<S, F>(
    cfg: NvmlConfig,
    init: F,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: Arc<NvmlStatus>,
    shutdown: CancellationToken,
) where
    S: GpuSource + 'static,
    F: FnOnce() -> Result<S, NvmlInitError> + Send + 'static,
{
    if !cfg.enabled {
        status.set_state("off: disabled in config ([nvml] enabled = false)");
        return;
    }
    status.set_state("starting");
    let st = status.clone();
    let processes = cfg.processes;
    let started =
        tokio::task::spawn_blocking(move || init().and_then(|s| Sampler::new(s, processes, st)))
            .await;
    let mut sampler = match started {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!("nvml collector off: {e}");
            status.set_state(format!("off: {e}"));
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "nvml collector off: NVML initialisation failed");
            Stats::add(&stats.collector_errors, 1);
            status.set_state(format!("off: NVML initialisation failed: {e}"));
            return;
        }
    };
    tracing::info!(
        gpus = sampler.gpu_count(),
        driver = %sampler.system().driver,
        cuda = %sampler.system().cuda,
        interval = ?cfg.interval.0,
        processes,
        "nvml collector started"
    );
    status.set_state("running");
    let mut ticker = crate::periodic::Ticker::new(cfg.interval.0);
    while ticker.next(&shutdown).await.is_some() {
        let ts = crate::now_ns();
        // NVML calls block (PCIe throughput waits ~20 ms): never on an async worker.
        let job = tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            let out = sampler.sample(ts);
            let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            (sampler, out, us)
        });
        let (s, out, us) = match job.await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "nvml sample failed; collector stops");
                Stats::add(&stats.collector_errors, 1);
                status.set_state(format!("off: sampling failed: {e}"));
                return;
            }
        };
        sampler = s;
        status.record_sample_us(us);
        if processes {
            status
                .process_mem
                .publish_lines(ts, &out.batch.lines, "gpu_process", "mem_used_mb");
        }
        if out.errors > 0 {
            Stats::add(&stats.collector_errors, out.errors);
        }
        super::submit(&handle, &stats, out.batch, "nvml");
    }
    // Dropping NVML calls nvmlShutdown: a blocking call too.
    let _ = tokio::task::spawn_blocking(move || drop(sampler)).await;
    status.set_state("stopped");
}
