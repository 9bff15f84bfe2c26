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
//! [`FakeGpu`] for tests and the benchmark); turning readings into lines
//! ([`readings_to_lines`]) and the bookkeeping ([`Sampler`]) are plain functions of them.
//!
//! Measurements (a contract once released; see the README). Memory is in MiB (`_mb`, as the
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{Bits, NvmlError};
use nvml_wrapper::Nvml;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::config::Interval;
use crate::model::{series_key, Batch, Line, Value};
use crate::queue::IngestHandle;
use crate::stats::Stats;

/// `[nvml]`
#[derive(Debug, Clone, serde::Deserialize, PartialEq)]
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

/// Why one reading failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// This GPU (or driver) does not implement the query; skip it for this GPU.
    #[error("not supported")]
    NotSupported,
    /// The GPU fell off the bus, needs a reset, or its handle is gone.
    #[error("GPU lost: {0}")]
    GpuLost(String),
    /// Anything else (permission, driver error); counted and kept as the last error.
    #[error("{0}")]
    Other(String),
}

impl From<NvmlError> for ReadError {
    fn from(e: NvmlError) -> Self {
        match e {
            // A symbol missing from an older driver's library: that driver does not support it.
            NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_) => ReadError::NotSupported,
            NvmlError::GpuLost | NvmlError::ResetRequired => ReadError::GpuLost(e.to_string()),
            other => ReadError::Other(other.to_string()),
        }
    }
}

/// Maps an error from looking a device up: anything but "not supported" means the handle is
/// unusable, which for a GPU that was there at start means it is lost.
fn handle_error(e: NvmlError) -> ReadError {
    match ReadError::from(e) {
        ReadError::Other(m) => ReadError::GpuLost(m),
        r => r,
    }
}

/// Why NVML is unavailable; the message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum NvmlInitError {
    /// `libnvidia-ml.so.1` is not installed or could not be loaded.
    #[error(
        "no NVIDIA driver found: NVML (libnvidia-ml.so.1) could not be loaded ({0}); install \
         the NVIDIA driver to monitor discrete GPUs; on a Jetson use the tegrastats collector"
    )]
    LibraryMissing(String),
    /// The library loaded but the kernel driver is not running.
    #[error(
        "the NVIDIA kernel driver is not loaded (NVML: {0}); check `nvidia-smi` and \
         `lsmod | grep nvidia`"
    )]
    DriverNotLoaded(String),
    /// The user library and the kernel module are different versions.
    #[error(
        "NVIDIA driver/library version mismatch: libnvidia-ml.so.1 does not match the loaded \
         kernel module (usually a driver upgrade without a reboot); reboot or reload the \
         nvidia kernel module"
    )]
    VersionMismatch,
    /// The process may not open the NVIDIA device files.
    #[error(
        "no permission to talk to the NVIDIA driver ({0}); run edgewatch as a user that can \
         open /dev/nvidia*"
    )]
    NoPermission(String),
    /// NVML works but lists no GPU.
    #[error("no NVIDIA GPU found: NVML (driver {driver}) lists no device")]
    NoGpu {
        /// Driver version NVML reported.
        driver: String,
    },
    /// Any other NVML failure at start.
    #[error("NVML could not be initialised: {0}")]
    Other(String),
    /// The report could not be written.
    #[error("cannot write the GPU report: {0}")]
    Io(#[from] std::io::Error),
}

impl NvmlInitError {
    /// Classifies an error from `Nvml::init` or the first device queries.
    pub fn from_nvml(e: NvmlError) -> NvmlInitError {
        match e {
            // libloading's own text names the file and the dlopen reason.
            NvmlError::LibloadingError(inner) => NvmlInitError::LibraryMissing(inner.to_string()),
            NvmlError::LibraryNotFound
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound => NvmlInitError::LibraryMissing(e.to_string()),
            NvmlError::DriverNotLoaded => NvmlInitError::DriverNotLoaded(e.to_string()),
            NvmlError::LibRmVersionMismatch => NvmlInitError::VersionMismatch,
            NvmlError::NoPermission => NvmlInitError::NoPermission(e.to_string()),
            other => NvmlInitError::Other(other.to_string()),
        }
    }
}

/// One thing the collector asks NVML for; each is skipped on its own when a GPU does not
/// support it. `name()` is what `/api/v1/status` and `edgewatch gpus` show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// GPU and memory-controller utilization.
    Utilization,
    /// Device memory.
    Memory,
    /// BAR1 aperture memory.
    Bar1,
    /// GPU die temperature.
    Temperature,
    /// HW slowdown threshold.
    TempSlowdown,
    /// Shutdown threshold.
    TempShutdown,
    /// GPU max operating temperature.
    TempMaxOperating,
    /// Board power draw.
    Power,
    /// Enforced power limit.
    PowerLimit,
    /// Energy counter.
    Energy,
    /// Current graphics clock.
    ClockGraphics,
    /// Current SM clock.
    ClockSm,
    /// Current memory clock.
    ClockMem,
    /// Current video clock.
    ClockVideo,
    /// Max graphics clock.
    ClockGraphicsMax,
    /// Max SM clock.
    ClockSmMax,
    /// Max memory clock.
    ClockMemMax,
    /// Max video clock.
    ClockVideoMax,
    /// Clock-event (throttle) reasons.
    ThrottleReasons,
    /// PCIe transmit throughput.
    PcieTx,
    /// PCIe receive throughput.
    PcieRx,
    /// PCIe link generation.
    PcieLinkGen,
    /// PCIe link width.
    PcieLinkWidth,
    /// Fan speed.
    Fan,
    /// ECC mode and error counts.
    Ecc,
    /// MIG mode.
    MigMode,
    /// Memory per MIG instance (only read while MIG mode is on).
    MigInstances,
    /// Running processes and their memory (only with `processes = true`).
    Processes,
    /// Per-process SM/memory utilization (only with `processes = true`).
    ProcessUtilization,
}

/// Clock-event (throttle) reason bits and the 0/1 field each becomes.
pub const THROTTLE_REASONS: [(u64, &str); 9] = [
    (0x1, "throttle_idle"),
    (0x2, "throttle_app_clocks"),
    (0x4, "throttle_power_cap"),
    (0x8, "throttle_hw_slowdown"),
    (0x10, "throttle_sync_boost"),
    (0x20, "throttle_sw_thermal"),
    (0x40, "throttle_hw_thermal"),
    (0x80, "throttle_power_brake"),
    (0x100, "throttle_display_clocks"),
];

impl Metric {
    /// Every metric, in the order a sample reads them (MIG mode before MIG instances).
    pub const ALL: [Metric; 29] = [
        Metric::Utilization,
        Metric::Memory,
        Metric::Bar1,
        Metric::Temperature,
        Metric::TempSlowdown,
        Metric::TempShutdown,
        Metric::TempMaxOperating,
        Metric::Power,
        Metric::PowerLimit,
        Metric::Energy,
        Metric::ClockGraphics,
        Metric::ClockSm,
        Metric::ClockMem,
        Metric::ClockVideo,
        Metric::ClockGraphicsMax,
        Metric::ClockSmMax,
        Metric::ClockMemMax,
        Metric::ClockVideoMax,
        Metric::ThrottleReasons,
        Metric::PcieTx,
        Metric::PcieRx,
        Metric::PcieLinkGen,
        Metric::PcieLinkWidth,
        Metric::Fan,
        Metric::Ecc,
        Metric::MigMode,
        Metric::MigInstances,
        Metric::Processes,
        Metric::ProcessUtilization,
    ];

    /// Stable name, shown in the status and the `gpus` report.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Utilization => "utilization",
            Metric::Memory => "memory",
            Metric::Bar1 => "bar1",
            Metric::Temperature => "temperature",
            Metric::TempSlowdown => "temp_slowdown",
            Metric::TempShutdown => "temp_shutdown",
            Metric::TempMaxOperating => "temp_max_operating",
            Metric::Power => "power",
            Metric::PowerLimit => "power_limit",
            Metric::Energy => "energy",
            Metric::ClockGraphics => "clock_graphics",
            Metric::ClockSm => "clock_sm",
            Metric::ClockMem => "clock_mem",
            Metric::ClockVideo => "clock_video",
            Metric::ClockGraphicsMax => "clock_graphics_max",
            Metric::ClockSmMax => "clock_sm_max",
            Metric::ClockMemMax => "clock_mem_max",
            Metric::ClockVideoMax => "clock_video_max",
            Metric::ThrottleReasons => "throttle_reasons",
            Metric::PcieTx => "pcie_tx",
            Metric::PcieRx => "pcie_rx",
            Metric::PcieLinkGen => "pcie_link_gen",
            Metric::PcieLinkWidth => "pcie_link_width",
            Metric::Fan => "fan",
            Metric::Ecc => "ecc",
            Metric::MigMode => "mig_mode",
            Metric::MigInstances => "mig_instances",
            Metric::Processes => "processes",
            Metric::ProcessUtilization => "process_utilization",
        }
    }

    /// The measurement this metric's fields go to.
    pub fn measurement(self) -> &'static str {
        match self {
            Metric::MigInstances => "gpu_mig",
            Metric::Processes | Metric::ProcessUtilization => "gpu_process",
            _ => "gpu",
        }
    }

    /// Every field this metric can produce (the documented contract).
    pub fn fields(self) -> &'static [&'static str] {
        match self {
            Metric::Utilization => &["util_gpu_pct", "util_mem_pct"],
            Metric::Memory => &["mem_total_mb", "mem_used_mb", "mem_free_mb"],
            Metric::Bar1 => &["bar1_total_mb", "bar1_used_mb", "bar1_free_mb"],
            Metric::Temperature => &["temp_c"],
            Metric::TempSlowdown => &["temp_slowdown_c"],
            Metric::TempShutdown => &["temp_shutdown_c"],
            Metric::TempMaxOperating => &["temp_max_operating_c"],
            Metric::Power => &["power_w"],
            Metric::PowerLimit => &["power_limit_w"],
            Metric::Energy => &["energy_mj"],
            Metric::ClockGraphics => &["clock_graphics_mhz"],
            Metric::ClockSm => &["clock_sm_mhz"],
            Metric::ClockMem => &["clock_mem_mhz"],
            Metric::ClockVideo => &["clock_video_mhz"],
            Metric::ClockGraphicsMax => &["clock_graphics_max_mhz"],
            Metric::ClockSmMax => &["clock_sm_max_mhz"],
            Metric::ClockMemMax => &["clock_mem_max_mhz"],
            Metric::ClockVideoMax => &["clock_video_max_mhz"],
            Metric::ThrottleReasons => &[
                "throttle_reasons",
                "throttle_idle",
                "throttle_app_clocks",
                "throttle_power_cap",
                "throttle_hw_slowdown",
                "throttle_sync_boost",
                "throttle_sw_thermal",
                "throttle_hw_thermal",
                "throttle_power_brake",
                "throttle_display_clocks",
            ],
            Metric::PcieTx => &["pcie_tx_kib_s"],
            Metric::PcieRx => &["pcie_rx_kib_s"],
            Metric::PcieLinkGen => &["pcie_link_gen"],
            Metric::PcieLinkWidth => &["pcie_link_width"],
            Metric::Fan => &["fan_pct"],
            Metric::Ecc => &["ecc_enabled", "ecc_corrected", "ecc_uncorrected"],
            Metric::MigMode => &["mig_mode", "mig_mode_pending"],
            Metric::MigInstances => &["mem_total_mb", "mem_used_mb", "mem_free_mb"],
            Metric::Processes => &["mem_used_mb"],
            Metric::ProcessUtilization => &["sm_util_pct", "mem_util_pct"],
        }
    }

    /// Fixed while the driver runs: read once per GPU, then repeated from a cache.
    pub fn is_static(self) -> bool {
        matches!(
            self,
            Metric::TempSlowdown
                | Metric::TempShutdown
                | Metric::TempMaxOperating
                | Metric::ClockGraphicsMax
                | Metric::ClockSmMax
                | Metric::ClockMemMax
                | Metric::ClockVideoMax
        )
    }

    /// Only read with `processes = true`.
    pub fn is_per_process(self) -> bool {
        matches!(self, Metric::Processes | Metric::ProcessUtilization)
    }
}

/// One MIG instance's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInstance {
    /// MIG device slot on the parent GPU.
    pub index: u32,
    /// MIG device UUID (`MIG-...`); empty if unknown.
    pub uuid: String,
    /// Bytes.
    pub total: u64,
    /// Bytes.
    pub used: u64,
    /// Bytes.
    pub free: u64,
}

/// One process using a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// Process id (as the driver sees it: the host's pid namespace).
    pub pid: u32,
    /// Executable base name; empty if unknown.
    pub name: String,
    /// GPU memory used, bytes; `None` where the driver cannot tell.
    pub used_bytes: Option<u64>,
}

/// One process's utilization over the last poll period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessUtil {
    /// Process id.
    pub pid: u32,
    /// SM (3D/compute) utilization, %.
    pub sm_pct: u32,
    /// Frame-buffer memory utilization, %.
    pub mem_pct: u32,
}

/// What one [`Metric`] read returned, in NVML's own units.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// GPU and memory utilization, %.
    Utilization {
        /// GPU busy, %.
        gpu_pct: u32,
        /// Memory controller busy, %.
        mem_pct: u32,
    },
    /// Memory in bytes (device memory or BAR1).
    Memory {
        /// Bytes.
        total: u64,
        /// Bytes.
        used: u64,
        /// Bytes.
        free: u64,
    },
    /// Degrees Celsius.
    Celsius(u32),
    /// Milliwatts.
    Milliwatts(u32),
    /// Millijoules.
    Millijoules(u64),
    /// MHz.
    Mhz(u32),
    /// Raw clock-event reason bitmask.
    Bitmask(u64),
    /// Kilobytes per second.
    KBytesPerSec(u32),
    /// A plain number (PCIe link generation or width).
    Count(u32),
    /// Speed of each fan, %.
    Fans(Vec<u32>),
    /// ECC mode and volatile counts (counts only while enabled).
    Ecc {
        /// ECC currently on.
        enabled: bool,
        /// Corrected (single-bit) errors.
        corrected: Option<u64>,
        /// Uncorrected (double-bit) errors.
        uncorrected: Option<u64>,
    },
    /// MIG mode now and pending.
    MigMode {
        /// On now.
        current: bool,
        /// On after the next reset.
        pending: bool,
    },
    /// MIG instances.
    MigInstances(Vec<MigInstance>),
    /// Running processes.
    Processes(Vec<GpuProcess>),
    /// Per-process utilization.
    ProcessUtilization(Vec<ProcessUtil>),
}

/// Driver-wide versions, used as tags on every `gpu` line; empty when unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemInfo {
    /// Driver version, e.g. `550.54.15`.
    pub driver: String,
    /// CUDA driver version, e.g. `12.4`.
    pub cuda: String,
}

/// What identifies a GPU in tags; empty strings where NVML cannot tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuIdentity {
    /// NVML index.
    pub index: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA A2`.
    pub name: String,
    /// Architecture, e.g. `Ampere`.
    pub arch: String,
    /// CUDA compute capability, e.g. `8.6`.
    pub cc: String,
}

/// Where readings come from: NVML ([`NvmlSource`]) or a fake ([`FakeGpu`]). Every call may
/// block (NVML talks to the kernel driver); callers keep it off the async workers.
pub trait GpuSource: Send {
    /// Driver and CUDA versions (empty when unknown).
    fn system(&mut self) -> SystemInfo;
    /// Number of GPUs.
    fn device_count(&mut self) -> Result<u32, ReadError>;
    /// The tags of GPU `gpu`; `Err` when the GPU cannot be reached.
    fn identity(&mut self, gpu: u32) -> Result<GpuIdentity, ReadError>;
    /// One metric of GPU `gpu`.
    fn read(&mut self, gpu: u32, metric: Metric) -> Result<Reading, ReadError>;
}

fn mib(bytes: u64) -> Value {
    Value::F64(bytes as f64 / 1_048_576.0)
}

fn f(k: &str, v: f64) -> (String, Value) {
    (k.to_string(), Value::F64(v))
}

fn i(k: &str, v: i64) -> (String, Value) {
    (k.to_string(), Value::I64(v))
}

/// The `gpu` fields one reading gives (none for the per-process and MIG readings, which
/// have their own measurements, or for a reading of the wrong shape).
pub fn gpu_fields(metric: Metric, reading: &Reading, out: &mut Vec<(String, Value)>) {
    let one = |out: &mut Vec<(String, Value)>, v: f64| {
        if let Some(name) = metric.fields().first() {
            out.push(f(name, v));
        }
    };
    match (metric, reading) {
        (Metric::Utilization, Reading::Utilization { gpu_pct, mem_pct }) => {
            out.push(f("util_gpu_pct", f64::from(*gpu_pct)));
            out.push(f("util_mem_pct", f64::from(*mem_pct)));
        }
        (Metric::Memory | Metric::Bar1, Reading::Memory { total, used, free }) => {
            if let [t, u, fr] = metric.fields() {
                out.push((t.to_string(), mib(*total)));
                out.push((u.to_string(), mib(*used)));
                out.push((fr.to_string(), mib(*free)));
            }
        }
        (
            Metric::Temperature
            | Metric::TempSlowdown
            | Metric::TempShutdown
            | Metric::TempMaxOperating,
            Reading::Celsius(c),
        ) => one(out, f64::from(*c)),
        (Metric::Power | Metric::PowerLimit, Reading::Milliwatts(mw)) => {
            one(out, f64::from(*mw) / 1000.0)
        }
        (Metric::Energy, Reading::Millijoules(mj)) => {
            out.push(i("energy_mj", i64::try_from(*mj).unwrap_or(i64::MAX)))
        }
        (
            Metric::ClockGraphics
            | Metric::ClockSm
            | Metric::ClockMem
            | Metric::ClockVideo
            | Metric::ClockGraphicsMax
            | Metric::ClockSmMax
            | Metric::ClockMemMax
            | Metric::ClockVideoMax,
            Reading::Mhz(mhz),
        ) => one(out, f64::from(*mhz)),
        (Metric::ThrottleReasons, Reading::Bitmask(bits)) => {
            // A bitmask: keep the bit pattern even if the top bit were ever set.
            out.push(i("throttle_reasons", *bits as i64));
            for (bit, name) in THROTTLE_REASONS {
                out.push(i(name, i64::from(bits & bit != 0)));
            }
        }
        (Metric::PcieTx | Metric::PcieRx, Reading::KBytesPerSec(kb)) => one(out, f64::from(*kb)),
        (Metric::PcieLinkGen | Metric::PcieLinkWidth, Reading::Count(n)) => {
            if let Some(name) = metric.fields().first() {
                out.push(i(name, i64::from(*n)));
            }
        }
        (Metric::Fan, Reading::Fans(speeds)) if !speeds.is_empty() => {
            let sum: f64 = speeds.iter().map(|s| f64::from(*s)).sum();
            out.push(f("fan_pct", sum / speeds.len() as f64));
        }
        (
            Metric::Ecc,
            Reading::Ecc {
                enabled,
                corrected,
                uncorrected,
            },
        ) => {
            out.push(i("ecc_enabled", i64::from(*enabled)));
            if *enabled {
                let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                if let Some(c) = corrected {
                    out.push(i("ecc_corrected", clamp(*c)));
                }
                if let Some(u) = uncorrected {
                    out.push(i("ecc_uncorrected", clamp(*u)));
                }
            }
        }
        (Metric::MigMode, Reading::MigMode { current, pending }) => {
            out.push(i("mig_mode", i64::from(*current)));
            out.push(i("mig_mode_pending", i64::from(*pending)));
        }
        _ => {}
    }
}

/// Turns one GPU's readings into lines stamped `ts`: one `gpu` line (if any field), one
/// `gpu_mig` line per MIG instance and one `gpu_process` line per process.
pub fn readings_to_lines(
    system: &SystemInfo,
    gpu: &GpuIdentity,
    readings: &[(Metric, Reading)],
    ts: i64,
) -> Vec<Line> {
    let index = gpu.index.to_string();
    let mut lines = Vec::new();
    let mut fields = Vec::with_capacity(48);
    for (metric, reading) in readings {
        gpu_fields(*metric, reading, &mut fields);
    }
    if !fields.is_empty() {
        let key = series_key(
            "gpu",
            &[
                ("gpu", &index),
                ("uuid", &gpu.uuid),
                ("name", &gpu.name),
                ("arch", &gpu.arch),
                ("cc", &gpu.cc),
                ("driver", &system.driver),
                ("cuda", &system.cuda),
            ],
        );
        lines.push(Line {
            key,
            fields,
            ts,
            line_no: 0,
        });
    }
    for (metric, reading) in readings {
        if let (Metric::MigInstances, Reading::MigInstances(migs)) = (metric, reading) {
            for m in migs {
                let slot = m.index.to_string();
                lines.push(Line {
                    key: series_key(
                        "gpu_mig",
                        &[
                            ("gpu", &index),
                            ("uuid", &gpu.uuid),
                            ("mig", &slot),
                            ("mig_uuid", &m.uuid),
                        ],
                    ),
                    fields: vec![
                        ("mem_total_mb".into(), mib(m.total)),
                        ("mem_used_mb".into(), mib(m.used)),
                        ("mem_free_mb".into(), mib(m.free)),
                    ],
                    ts,
                    line_no: 0,
                });
            }
        }
    }
    let util: Option<&Vec<ProcessUtil>> = readings.iter().find_map(|(_, r)| match r {
        Reading::ProcessUtilization(u) => Some(u),
        _ => None,
    });
    let procs = readings.iter().find_map(|(_, r)| match r {
        Reading::Processes(p) => Some(p),
        _ => None,
    });
    for p in procs.into_iter().flatten() {
        let mut pf = Vec::with_capacity(3);
        if let Some(b) = p.used_bytes {
            pf.push(("mem_used_mb".to_string(), mib(b)));
        }
        if let Some(util) = util {
            // NVML lists only processes that were busy since the last poll: absent means idle.
            let (sm, mem) = util
                .iter()
                .find(|u| u.pid == p.pid)
                .map(|u| (u.sm_pct, u.mem_pct))
                .unwrap_or((0, 0));
            pf.push(f("sm_util_pct", f64::from(sm)));
            pf.push(f("mem_util_pct", f64::from(mem)));
        }
        if pf.is_empty() {
            continue;
        }
        let pid = p.pid.to_string();
        lines.push(Line {
            key: series_key(
                "gpu_process",
                &[
                    ("gpu", &index),
                    ("uuid", &gpu.uuid),
                    ("pid", &pid),
                    ("process", &p.name),
                ],
            ),
            fields: pf,
            ts,
            line_no: 0,
        });
    }
    lines
}

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

    fn update(&self, system: &SystemInfo, gpus: Vec<GpuStatus>) {
        self.with(|i| {
            if &i.system != system {
                i.system = system.clone();
            }
            i.gpus = gpus;
        });
    }

    fn record_sample_us(&self, us: u64) {
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

/// What one sample produced.
#[derive(Debug, Default)]
pub struct SampleOutcome {
    /// Lines for the ingest queue.
    pub batch: Batch,
    /// Failed readings to count in `collector_errors` (GPU lost, driver errors).
    pub errors: u64,
}

/// First retry of a lost GPU after this long, doubling up to [`MAX_BACKOFF_NS`].
pub const FIRST_BACKOFF_NS: i64 = 10_000_000_000;
/// Longest wait between retries of a lost GPU (5 minutes).
pub const MAX_BACKOFF_NS: i64 = 300_000_000_000;
/// `NotSupported` metrics are probed again this often (1 hour), silently.
pub const REPROBE_NS: i64 = 3_600_000_000_000;

struct GpuState {
    ident: GpuIdentity,
    /// Currently skipped.
    unsupported: BTreeSet<Metric>,
    /// Ever logged as unsupported (so a re-probe logs nothing).
    announced: BTreeSet<Metric>,
    /// Other errors already logged at warn.
    warned: BTreeSet<Metric>,
    statics: HashMap<Metric, Reading>,
    lost: bool,
    /// A loss was logged at warn and no clean sample has followed: a GPU that flaps
    /// (its handle answers, its reads say lost) logs once, and its backoff keeps growing.
    lost_logged: bool,
    retry_at: i64,
    backoff: i64,
    reprobe_at: Option<i64>,
    last_error: Option<String>,
}

impl GpuState {
    fn new(ident: GpuIdentity) -> GpuState {
        GpuState {
            ident,
            unsupported: BTreeSet::new(),
            announced: BTreeSet::new(),
            warned: BTreeSet::new(),
            statics: HashMap::new(),
            lost: false,
            lost_logged: false,
            retry_at: 0,
            backoff: FIRST_BACKOFF_NS,
            reprobe_at: None,
            last_error: None,
        }
    }

    fn status(&self) -> GpuStatus {
        GpuStatus {
            index: self.ident.index,
            uuid: self.ident.uuid.clone(),
            name: self.ident.name.clone(),
            arch: self.ident.arch.clone(),
            cc: self.ident.cc.clone(),
            lost: self.lost,
            last_error: self.last_error.clone(),
            unsupported: self.unsupported.iter().map(|m| m.name()).collect(),
        }
    }

    /// Marks the GPU lost; returns whether this loss should be logged at warn.
    fn mark_lost(&mut self, ts: i64, why: String) -> bool {
        let first = !self.lost_logged;
        self.backoff = if first {
            FIRST_BACKOFF_NS
        } else {
            self.backoff.saturating_mul(2).min(MAX_BACKOFF_NS)
        };
        self.lost = true;
        self.lost_logged = true;
        self.retry_at = ts.saturating_add(self.backoff);
        self.last_error = Some(why);
        first
    }
}

/// The collector's logic over any [`GpuSource`]: which metric to read on which GPU,
/// `NotSupported` bookkeeping, lost GPUs and their retries, and the status.
pub struct Sampler<S: GpuSource> {
    source: S,
    processes: bool,
    system: SystemInfo,
    gpus: Vec<GpuState>,
    status: Arc<NvmlStatus>,
}

impl<S: GpuSource> Sampler<S> {
    /// Discovers the GPUs of `source`; an error when it lists none. A GPU unreachable at
    /// start is kept, marked lost, and retried.
    pub fn new(
        mut source: S,
        processes: bool,
        status: Arc<NvmlStatus>,
    ) -> Result<Sampler<S>, NvmlInitError> {
        let system = source.system();
        let count = source
            .device_count()
            .map_err(|e| NvmlInitError::Other(format!("cannot count GPUs: {e}")))?;
        if count == 0 {
            return Err(NvmlInitError::NoGpu {
                driver: if system.driver.is_empty() {
                    "unknown".into()
                } else {
                    system.driver.clone()
                },
            });
        }
        let mut gpus = Vec::new();
        for index in 0..count {
            match source.identity(index) {
                Ok(ident) => gpus.push(GpuState::new(ident)),
                Err(e) => {
                    tracing::warn!(gpu = index, error = %e, "GPU unreachable at start; retrying later");
                    let mut g = GpuState::new(GpuIdentity {
                        index,
                        ..GpuIdentity::default()
                    });
                    // Retry at the first sample.
                    g.lost = true;
                    g.lost_logged = true;
                    g.last_error = Some(e.to_string());
                    gpus.push(g);
                }
            }
        }
        let sampler = Sampler {
            source,
            processes,
            system,
            gpus,
            status,
        };
        sampler.publish();
        Ok(sampler)
    }

    /// Number of GPUs found.
    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    /// Driver and CUDA versions.
    pub fn system(&self) -> &SystemInfo {
        &self.system
    }

    /// The source (tests change the fake's readings through it).
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    fn publish(&self) {
        let gpus = self.gpus.iter().map(GpuState::status).collect();
        self.status.update(&self.system, gpus);
    }

    /// Reads every GPU once; lines are stamped `ts` (Unix ns), which also drives retry and
    /// re-probe timing. Blocks for as long as the NVML calls take.
    pub fn sample(&mut self, ts: i64) -> SampleOutcome {
        let mut out = SampleOutcome::default();
        let processes = self.processes;
        for g in &mut self.gpus {
            let idx = g.ident.index;
            if g.lost {
                if ts < g.retry_at {
                    continue;
                }
                match self.source.identity(idx) {
                    Ok(ident) => {
                        // It may be another board in that slot now: forget what was cached.
                        g.ident = ident;
                        g.lost = false;
                        g.statics.clear();
                        g.unsupported.clear();
                        g.warned.clear();
                        g.reprobe_at = None;
                        g.last_error = None;
                    }
                    Err(e) => {
                        g.backoff = g.backoff.saturating_mul(2).min(MAX_BACKOFF_NS);
                        g.retry_at = ts.saturating_add(g.backoff);
                        g.last_error = Some(e.to_string());
                        tracing::debug!(gpu = idx, uuid = %g.ident.uuid, error = %e, retry_in_s = g.backoff / 1_000_000_000, "GPU still unreachable");
                        continue;
                    }
                }
            }
            match g.reprobe_at {
                None => g.reprobe_at = Some(ts.saturating_add(REPROBE_NS)),
                Some(at) if ts >= at => {
                    g.unsupported.clear();
                    g.reprobe_at = Some(ts.saturating_add(REPROBE_NS));
                }
                Some(_) => {}
            }
            let mut readings: Vec<(Metric, Reading)> = Vec::with_capacity(Metric::ALL.len());
            let mut newly_unsupported: Vec<&'static str> = Vec::new();
            let mut mig_on = false;
            for metric in Metric::ALL {
                if (metric.is_per_process() && !processes)
                    || (metric == Metric::MigInstances && !mig_on)
                    || g.unsupported.contains(&metric)
                {
                    continue;
                }
                if let Some(r) = g.statics.get(&metric) {
                    readings.push((metric, r.clone()));
                    continue;
                }
                match self.source.read(idx, metric) {
                    Ok(r) => {
                        if let Reading::MigMode { current, .. } = r {
                            mig_on = current;
                        }
                        if metric.is_static() {
                            g.statics.insert(metric, r.clone());
                        }
                        readings.push((metric, r));
                    }
                    Err(ReadError::NotSupported) => {
                        g.unsupported.insert(metric);
                        if g.announced.insert(metric) {
                            newly_unsupported.push(metric.name());
                        }
                    }
                    Err(ReadError::GpuLost(why)) => {
                        out.errors += 1;
                        if g.mark_lost(ts, format!("{}: {why}", metric.name())) {
                            tracing::warn!(
                                gpu = idx, uuid = %g.ident.uuid, name = %g.ident.name, error = %why,
                                "GPU lost (fallen off the bus or needs a reset); still polling the other GPUs, retrying this one with backoff"
                            );
                        } else {
                            tracing::debug!(gpu = idx, uuid = %g.ident.uuid, error = %why, retry_in_s = g.backoff / 1_000_000_000, "GPU lost again");
                        }
                        break;
                    }
                    Err(ReadError::Other(why)) => {
                        out.errors += 1;
                        if g.warned.insert(metric) {
                            tracing::warn!(gpu = idx, uuid = %g.ident.uuid, metric = metric.name(), error = %why, "NVML read failed (logged once per GPU and metric)");
                        } else {
                            tracing::debug!(gpu = idx, uuid = %g.ident.uuid, metric = metric.name(), error = %why, "NVML read failed");
                        }
                        g.last_error = Some(format!("{}: {why}", metric.name()));
                    }
                }
            }
            if !g.lost && g.lost_logged {
                g.lost_logged = false;
                g.backoff = FIRST_BACKOFF_NS;
                tracing::info!(gpu = idx, uuid = %g.ident.uuid, name = %g.ident.name, "GPU reachable again; sampling it");
            }
            if !newly_unsupported.is_empty() {
                tracing::info!(
                    gpu = idx, uuid = %g.ident.uuid, name = %g.ident.name,
                    "NVML does not support {} on this GPU; skipping (on Jetson, tegrastats is the source)",
                    newly_unsupported.join(", ")
                );
            }
            out.batch
                .lines
                .extend(readings_to_lines(&self.system, &g.ident, &readings, ts));
        }
        self.publish();
        out
    }
}

/// Writes the `edgewatch gpus` report for `source`: versions, then each GPU with its tags
/// and, for every metric, whether it is supported, with the fields it gives.
pub fn write_report<S: GpuSource>(
    source: &mut S,
    out: &mut dyn Write,
) -> Result<(), NvmlInitError> {
    let system = source.system();
    let or_unknown = |s: &str| {
        if s.is_empty() {
            "unknown".to_string()
        } else {
            s.to_string()
        }
    };
    writeln!(
        out,
        "NVIDIA driver {}, CUDA driver {}",
        or_unknown(&system.driver),
        or_unknown(&system.cuda)
    )?;
    let count = source
        .device_count()
        .map_err(|e| NvmlInitError::Other(format!("cannot count GPUs: {e}")))?;
    if count == 0 {
        return Err(NvmlInitError::NoGpu {
            driver: or_unknown(&system.driver),
        });
    }
    writeln!(out, "{count} GPU(s)")?;
    for index in 0..count {
        writeln!(out)?;
        let ident = match source.identity(index) {
            Ok(id) => id,
            Err(e) => {
                writeln!(out, "GPU {index}: error: {e}")?;
                continue;
            }
        };
        writeln!(out, "GPU {index}: {}", or_unknown(&ident.name))?;
        writeln!(
            out,
            "  tags: gpu={index} uuid={} name={:?} arch={} cc={} driver={} cuda={}",
            or_unknown(&ident.uuid),
            ident.name,
            or_unknown(&ident.arch),
            or_unknown(&ident.cc),
            or_unknown(&system.driver),
            or_unknown(&system.cuda)
        )?;
        writeln!(out, "  {:<20} {:<16} fields", "metric", "support")?;
        let mut mig_on = false;
        for metric in Metric::ALL {
            let support = if metric == Metric::MigInstances && !mig_on {
                "n/a (MIG off)".to_string()
            } else {
                match source.read(index, metric) {
                    Ok(r) => {
                        if let Reading::MigMode { current, .. } = r {
                            mig_on = current;
                        }
                        "supported".to_string()
                    }
                    Err(ReadError::NotSupported) => "not supported".to_string(),
                    Err(e) => format!("error: {e}"),
                }
            };
            let mut fields = format!("{}: {}", metric.measurement(), metric.fields().join(", "));
            if metric.is_per_process() {
                fields.push_str(" (with [nvml] processes = true)");
            }
            writeln!(out, "  {:<20} {:<16} {fields}", metric.name(), support)?;
        }
    }
    Ok(())
}

/// `edgewatch gpus`: initialises NVML and writes [`write_report`] to `out`. Without a
/// driver (or GPU) returns an error whose message says so plainly; the caller prints it
/// and exits non-zero.
pub fn gpus_report(out: &mut dyn Write) -> Result<(), NvmlInitError> {
    let mut source = NvmlSource::init()?;
    write_report(&mut source, out)
}

/// [`GpuSource`] over the real NVML library.
pub struct NvmlSource {
    nvml: Nvml,
    /// Last per-process utilization timestamp seen, per GPU (µs, NVML's clock).
    util_seen: HashMap<u32, u64>,
    /// Process names by (GPU, pid), pruned to each GPU's processes of its last read.
    names: HashMap<(u32, u32), String>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmlSource")
    }
}

fn base_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).trim().to_string()
}

impl NvmlSource {
    /// Loads `libnvidia-ml.so.1` and initialises NVML (blocking; tens of ms).
    pub fn init() -> Result<NvmlSource, NvmlInitError> {
        let nvml = Nvml::init().map_err(NvmlInitError::from_nvml)?;
        Ok(NvmlSource {
            nvml,
            util_seen: HashMap::new(),
            names: HashMap::new(),
        })
    }

    fn process_name(&mut self, gpu: u32, pid: u32) -> String {
        if let Some(n) = self.names.get(&(gpu, pid)) {
            return n.clone();
        }
        let name = self
            .nvml
            .sys_process_name(pid, 256)
            .ok()
            .map(|n| base_name(&n))
            .filter(|n| !n.is_empty())
            .or_else(|| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .ok()
                    .map(|s| s.trim().to_string())
            })
            .unwrap_or_default();
        self.names.insert((gpu, pid), name.clone());
        name
    }
}

impl GpuSource for NvmlSource {
    fn system(&mut self) -> SystemInfo {
        SystemInfo {
            driver: self.nvml.sys_driver_version().unwrap_or_default(),
            cuda: self
                .nvml
                .sys_cuda_driver_version()
                .map(|v| {
                    format!(
                        "{}.{}",
                        nvml_wrapper::cuda_driver_version_major(v),
                        nvml_wrapper::cuda_driver_version_minor(v)
                    )
                })
                .unwrap_or_default(),
        }
    }

    fn device_count(&mut self) -> Result<u32, ReadError> {
        Ok(self.nvml.device_count()?)
    }

    fn identity(&mut self, gpu: u32) -> Result<GpuIdentity, ReadError> {
        let dev = self.nvml.device_by_index(gpu).map_err(handle_error)?;
        // A lost GPU fails every query; anything else just leaves that tag out.
        let text = |r: Result<String, NvmlError>| match r.map_err(ReadError::from) {
            Ok(s) => Ok(s),
            Err(ReadError::GpuLost(m)) => Err(ReadError::GpuLost(m)),
            Err(_) => Ok(String::new()),
        };
        let uuid = text(dev.uuid())?;
        let name = text(dev.name())?;
        let arch = text(dev.architecture().map(|a| a.to_string()))?;
        let cc = text(
            dev.cuda_compute_capability()
                .map(|c| format!("{}.{}", c.major, c.minor)),
        )?;
        Ok(GpuIdentity {
            index: gpu,
            uuid,
            name,
            arch,
            cc,
        })
    }

    fn read(&mut self, gpu: u32, metric: Metric) -> Result<Reading, ReadError> {
        let dev = self.nvml.device_by_index(gpu).map_err(handle_error)?;
        let threshold = |t| dev.temperature_threshold(t).map(Reading::Celsius);
        let clock = |c| dev.clock_info(c).map(Reading::Mhz);
        let max_clock = |c| dev.max_clock_info(c).map(Reading::Mhz);
        let r = match metric {
            Metric::Utilization => dev.utilization_rates().map(|u| Reading::Utilization {
                gpu_pct: u.gpu,
                mem_pct: u.memory,
            }),
            Metric::Memory => dev.memory_info().map(|m| Reading::Memory {
                total: m.total,
                used: m.used,
                free: m.free,
            }),
            Metric::Bar1 => dev.bar1_memory_info().map(|m| Reading::Memory {
                total: m.total,
                used: m.used,
                free: m.free,
            }),
            Metric::Temperature => dev
                .temperature(TemperatureSensor::Gpu)
                .map(Reading::Celsius),
            Metric::TempSlowdown => threshold(TemperatureThreshold::Slowdown),
            Metric::TempShutdown => threshold(TemperatureThreshold::Shutdown),
            Metric::TempMaxOperating => threshold(TemperatureThreshold::GpuMax),
            Metric::Power => dev.power_usage().map(Reading::Milliwatts),
            Metric::PowerLimit => dev.enforced_power_limit().map(Reading::Milliwatts),
            Metric::Energy => dev.total_energy_consumption().map(Reading::Millijoules),
            Metric::ClockGraphics => clock(Clock::Graphics),
            Metric::ClockSm => clock(Clock::SM),
            Metric::ClockMem => clock(Clock::Memory),
            Metric::ClockVideo => clock(Clock::Video),
            Metric::ClockGraphicsMax => max_clock(Clock::Graphics),
            Metric::ClockSmMax => max_clock(Clock::SM),
            Metric::ClockMemMax => max_clock(Clock::Memory),
            Metric::ClockVideoMax => max_clock(Clock::Video),
            // `_strict` hands back the raw bits when NVML sets one the wrapper does not
            // know (newer drivers): keep them in the raw bitmask.
            Metric::ThrottleReasons => match dev.current_throttle_reasons_strict() {
                Ok(r) => Ok(Reading::Bitmask(r.bits())),
                Err(NvmlError::IncorrectBits(Bits::U64(b))) => Ok(Reading::Bitmask(b)),
                Err(NvmlError::IncorrectBits(Bits::U32(b))) => Ok(Reading::Bitmask(u64::from(b))),
                Err(e) => Err(e),
            },
            Metric::PcieTx => dev
                .pcie_throughput(PcieUtilCounter::Send)
                .map(Reading::KBytesPerSec),
            Metric::PcieRx => dev
                .pcie_throughput(PcieUtilCounter::Receive)
                .map(Reading::KBytesPerSec),
            Metric::PcieLinkGen => dev.current_pcie_link_gen().map(Reading::Count),
            Metric::PcieLinkWidth => dev.current_pcie_link_width().map(Reading::Count),
            Metric::Fan => {
                let n = dev.num_fans()?;
                if n == 0 {
                    return Err(ReadError::NotSupported);
                }
                (0..n)
                    .map(|i| dev.fan_speed(i))
                    .collect::<Result<Vec<u32>, NvmlError>>()
                    .map(Reading::Fans)
            }
            Metric::Ecc => {
                let mode = dev.is_ecc_enabled()?;
                if mode.currently_enabled {
                    let count = |t| dev.total_ecc_errors(t, EccCounter::Volatile).ok();
                    Ok(Reading::Ecc {
                        enabled: true,
                        corrected: count(MemoryError::Corrected),
                        uncorrected: count(MemoryError::Uncorrected),
                    })
                } else {
                    Ok(Reading::Ecc {
                        enabled: false,
                        corrected: None,
                        uncorrected: None,
                    })
                }
            }
            Metric::MigMode => dev.mig_mode().map(|m| Reading::MigMode {
                current: m.current == 1,
                pending: m.pending == 1,
            }),
            Metric::MigInstances => {
                let max = dev.mig_device_count()?;
                let mut migs = Vec::new();
                for slot in 0..max {
                    let mig = match dev.mig_device_by_index(slot) {
                        Ok(m) => m,
                        // An empty slot.
                        Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                        Err(e) => return Err(e.into()),
                    };
                    // Memory the driver does not report for an instance: leave it out.
                    let Ok(mem) = mig.memory_info() else { continue };
                    migs.push(MigInstance {
                        index: slot,
                        uuid: mig.uuid().unwrap_or_default(),
                        total: mem.total,
                        used: mem.used,
                        free: mem.free,
                    });
                }
                Ok(Reading::MigInstances(migs))
            }
            Metric::Processes => {
                let compute = dev.running_compute_processes();
                let graphics = dev.running_graphics_processes();
                let (list, err) = match (compute, graphics) {
                    (Err(e), Err(_)) => (Vec::new(), Some(e)),
                    (Ok(mut c), Ok(g)) => {
                        c.extend(g);
                        (c, None)
                    }
                    (Ok(c), Err(_)) | (Err(_), Ok(c)) => (c, None),
                };
                if let Some(e) = err {
                    return Err(e.into());
                }
                // A process doing compute and graphics is listed twice: keep it once.
                let mut by_pid: BTreeMap<u32, Option<u64>> = BTreeMap::new();
                for p in list {
                    let used = match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    };
                    let e = by_pid.entry(p.pid).or_insert(None);
                    *e = (*e).max(used);
                }
                self.names
                    .retain(|(g, pid), _| *g != gpu || by_pid.contains_key(pid));
                let procs = by_pid
                    .into_iter()
                    .map(|(pid, used_bytes)| GpuProcess {
                        pid,
                        name: self.process_name(gpu, pid),
                        used_bytes,
                    })
                    .collect();
                return Ok(Reading::Processes(procs));
            }
            Metric::ProcessUtilization => {
                let since = self.util_seen.get(&gpu).copied();
                match dev.process_utilization_stats(since) {
                    Ok(samples) => {
                        // Several samples per process: keep each one's newest.
                        let mut newest: BTreeMap<u32, (u64, ProcessUtil)> = BTreeMap::new();
                        let mut max_ts = since.unwrap_or(0);
                        for s in samples {
                            max_ts = max_ts.max(s.timestamp);
                            let u = ProcessUtil {
                                pid: s.pid,
                                sm_pct: s.sm_util,
                                mem_pct: s.mem_util,
                            };
                            let e = newest.entry(s.pid).or_insert((s.timestamp, u));
                            if s.timestamp >= e.0 {
                                *e = (s.timestamp, u);
                            }
                        }
                        self.util_seen.insert(gpu, max_ts);
                        Ok(Reading::ProcessUtilization(
                            newest.into_values().map(|(_, u)| u).collect(),
                        ))
                    }
                    // No sample since `since`: nothing was busy.
                    Err(NvmlError::NotFound) => Ok(Reading::ProcessUtilization(Vec::new())),
                    Err(e) => Err(e),
                }
            }
        };
        r.map_err(ReadError::from)
    }
}

/// A fake [`GpuSource`] with fixed readings and chosen errors: used by the unit tests and
/// [`bench_fake_sample`]. A metric missing from a device's `readings` is `NotSupported`.
#[derive(Debug, Clone, Default)]
pub struct FakeGpu {
    /// Versions reported.
    pub system: SystemInfo,
    /// The GPUs.
    pub devices: Vec<FakeDevice>,
    /// Number of `read` calls so far.
    pub reads: u64,
}

/// One fake GPU.
#[derive(Debug, Clone, Default)]
pub struct FakeDevice {
    /// Its tags.
    pub identity: GpuIdentity,
    /// What each metric returns; absent = `NotSupported`.
    pub readings: BTreeMap<Metric, Result<Reading, ReadError>>,
    /// Every call fails with `GpuLost`.
    pub lost: bool,
}

impl FakeDevice {
    /// A data-centre-like GPU supporting every metric, MIG off, one busy process.
    pub fn typical(index: u32) -> FakeDevice {
        let mut r: BTreeMap<Metric, Result<Reading, ReadError>> = BTreeMap::new();
        let gib = 1u64 << 30;
        r.insert(
            Metric::Utilization,
            Ok(Reading::Utilization {
                gpu_pct: 42,
                mem_pct: 17,
            }),
        );
        r.insert(
            Metric::Memory,
            Ok(Reading::Memory {
                total: 16 * gib,
                used: 4 * gib,
                free: 12 * gib,
            }),
        );
        r.insert(
            Metric::Bar1,
            Ok(Reading::Memory {
                total: 256 << 20,
                used: 8 << 20,
                free: 248 << 20,
            }),
        );
        r.insert(Metric::Temperature, Ok(Reading::Celsius(55)));
        r.insert(Metric::TempSlowdown, Ok(Reading::Celsius(90)));
        r.insert(Metric::TempShutdown, Ok(Reading::Celsius(95)));
        r.insert(Metric::TempMaxOperating, Ok(Reading::Celsius(87)));
        r.insert(Metric::Power, Ok(Reading::Milliwatts(61_500)));
        r.insert(Metric::PowerLimit, Ok(Reading::Milliwatts(70_000)));
        r.insert(Metric::Energy, Ok(Reading::Millijoules(123_456_789)));
        r.insert(Metric::ClockGraphics, Ok(Reading::Mhz(1_410)));
        r.insert(Metric::ClockSm, Ok(Reading::Mhz(1_410)));
        r.insert(Metric::ClockMem, Ok(Reading::Mhz(6_251)));
        r.insert(Metric::ClockVideo, Ok(Reading::Mhz(1_275)));
        r.insert(Metric::ClockGraphicsMax, Ok(Reading::Mhz(1_770)));
        r.insert(Metric::ClockSmMax, Ok(Reading::Mhz(1_770)));
        r.insert(Metric::ClockMemMax, Ok(Reading::Mhz(6_251)));
        r.insert(Metric::ClockVideoMax, Ok(Reading::Mhz(1_650)));
        r.insert(Metric::ThrottleReasons, Ok(Reading::Bitmask(0x4 | 0x40)));
        r.insert(Metric::PcieTx, Ok(Reading::KBytesPerSec(2_048)));
        r.insert(Metric::PcieRx, Ok(Reading::KBytesPerSec(1_024)));
        r.insert(Metric::PcieLinkGen, Ok(Reading::Count(4)));
        r.insert(Metric::PcieLinkWidth, Ok(Reading::Count(8)));
        r.insert(Metric::Fan, Ok(Reading::Fans(vec![30, 40])));
        r.insert(
            Metric::Ecc,
            Ok(Reading::Ecc {
                enabled: true,
                corrected: Some(3),
                uncorrected: Some(0),
            }),
        );
        r.insert(
            Metric::MigMode,
            Ok(Reading::MigMode {
                current: false,
                pending: false,
            }),
        );
        r.insert(Metric::MigInstances, Ok(Reading::MigInstances(Vec::new())));
        r.insert(
            Metric::Processes,
            Ok(Reading::Processes(vec![
                GpuProcess {
                    pid: 4242,
                    name: "python3".into(),
                    used_bytes: Some(512 << 20),
                },
                GpuProcess {
                    pid: 77,
                    name: "Xorg".into(),
                    used_bytes: None,
                },
            ])),
        );
        r.insert(
            Metric::ProcessUtilization,
            Ok(Reading::ProcessUtilization(vec![ProcessUtil {
                pid: 4242,
                sm_pct: 63,
                mem_pct: 21,
            }])),
        );
        FakeDevice {
            identity: GpuIdentity {
                index,
                uuid: format!("GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd"),
                name: "NVIDIA A2".into(),
                arch: "Ampere".into(),
                cc: "8.6".into(),
            },
            readings: r,
            lost: false,
        }
    }
}

impl FakeGpu {
    /// `n` [`FakeDevice::typical`] GPUs, driver 550.54.15, CUDA 12.4.
    pub fn typical(n: u32) -> FakeGpu {
        FakeGpu {
            system: SystemInfo {
                driver: "550.54.15".into(),
                cuda: "12.4".into(),
            },
            devices: (0..n).map(FakeDevice::typical).collect(),
            reads: 0,
        }
    }

    fn device(&self, gpu: u32) -> Result<&FakeDevice, ReadError> {
        let d = self
            .devices
            .get(gpu as usize)
            .ok_or_else(|| ReadError::GpuLost(format!("no GPU {gpu}")))?;
        if d.lost {
            return Err(ReadError::GpuLost(
                "GPU has fallen off the bus (fake)".into(),
            ));
        }
        Ok(d)
    }
}

impl GpuSource for FakeGpu {
    fn system(&mut self) -> SystemInfo {
        self.system.clone()
    }

    fn device_count(&mut self) -> Result<u32, ReadError> {
        Ok(u32::try_from(self.devices.len()).unwrap_or(u32::MAX))
    }

    fn identity(&mut self, gpu: u32) -> Result<GpuIdentity, ReadError> {
        Ok(self.device(gpu)?.identity.clone())
    }

    fn read(&mut self, gpu: u32, metric: Metric) -> Result<Reading, ReadError> {
        self.reads += 1;
        self.device(gpu)?
            .readings
            .get(&metric)
            .cloned()
            .unwrap_or(Err(ReadError::NotSupported))
    }
}

/// Mean wall time of one sample over a [`FakeGpu`] with one typical GPU and
/// `processes = true`, over `iterations` samples: the collector's own cost (bookkeeping,
/// lines, status), NVML's call time excluded.
pub fn bench_fake_sample(iterations: usize) -> Duration {
    let status = Arc::new(NvmlStatus::new());
    let Ok(mut sampler) = Sampler::new(FakeGpu::typical(1), true, status) else {
        return Duration::ZERO;
    };
    let n = iterations.max(1);
    let start = Instant::now();
    let mut lines = 0usize;
    for k in 0..n {
        let out = sampler.sample(1_000_000_000 * k as i64);
        lines += out.batch.len();
    }
    let elapsed = start.elapsed();
    std::hint::black_box(lines);
    elapsed / u32::try_from(n).unwrap_or(u32::MAX)
}

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
    let mut tick = tokio::time::interval(cfg.interval.0);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
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
        if out.errors > 0 {
            Stats::add(&stats.collector_errors, out.errors);
        }
        super::submit(&handle, &stats, out.batch, "nvml");
    }
    // Dropping NVML calls nvmlShutdown: a blocking call too.
    let _ = tokio::task::spawn_blocking(move || drop(sampler)).await;
    status.set_state("stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::split_series_key;

    fn sampler(fake: FakeGpu, processes: bool) -> (Sampler<FakeGpu>, Arc<NvmlStatus>) {
        let status = Arc::new(NvmlStatus::new());
        let s = Sampler::new(fake, processes, status.clone()).unwrap();
        (s, status)
    }

    fn field<'a>(line: &'a Line, name: &str) -> Option<&'a Value> {
        line.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    fn lines_of<'a>(batch: &'a Batch, measurement: &str) -> Vec<&'a Line> {
        batch
            .lines
            .iter()
            .filter(|l| split_series_key(&l.key).0 == measurement)
            .collect()
    }

    #[test]
    fn config_defaults_and_unknown_keys() {
        let c = NvmlConfig::default();
        assert!(c.enabled);
        assert!(!c.processes);
        assert_eq!(c.interval.0, Duration::from_secs(5));
        let c: NvmlConfig = toml::from_str("processes = true\ninterval = \"1s\"").unwrap();
        assert!(c.processes && c.enabled);
        assert_eq!(c.interval.0, Duration::from_secs(1));
        assert!(toml::from_str::<NvmlConfig>("proceses = true").is_err());
    }

    #[test]
    fn gpu_line_is_tagged_with_index_uuid_name_arch_cc_and_versions() {
        let (mut s, _) = sampler(FakeGpu::typical(1), false);
        let out = s.sample(7);
        let gpu = lines_of(&out.batch, "gpu");
        assert_eq!(gpu.len(), 1);
        assert_eq!(gpu[0].ts, 7);
        let (_, tags) = split_series_key(&gpu[0].key);
        let tags: BTreeMap<String, String> = tags.into_iter().collect();
        let want: BTreeMap<String, String> = [
            ("gpu", "0"),
            ("uuid", "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"),
            ("name", "NVIDIA A2"),
            ("arch", "Ampere"),
            ("cc", "8.6"),
            ("driver", "550.54.15"),
            ("cuda", "12.4"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(tags, want);
        // A tag NVML cannot tell is left out, not written empty.
        let mut fake = FakeGpu::typical(1);
        fake.devices[0].identity.arch.clear();
        let (mut s, _) = sampler(fake, false);
        let out = s.sample(1);
        assert!(!out.batch.lines[0].key.contains("arch="));
    }

    #[test]
    fn every_metric_maps_to_its_documented_fields() {
        let (mut s, _) = sampler(FakeGpu::typical(1), false);
        let out = s.sample(1);
        let gpu = lines_of(&out.batch, "gpu")[0];
        let mib = |n: f64| Value::F64(n);
        let want: Vec<(&str, Value)> = vec![
            ("util_gpu_pct", Value::F64(42.0)),
            ("util_mem_pct", Value::F64(17.0)),
            ("mem_total_mb", mib(16384.0)),
            ("mem_used_mb", mib(4096.0)),
            ("mem_free_mb", mib(12288.0)),
            ("bar1_total_mb", mib(256.0)),
            ("bar1_used_mb", mib(8.0)),
            ("bar1_free_mb", mib(248.0)),
            ("temp_c", Value::F64(55.0)),
            ("temp_slowdown_c", Value::F64(90.0)),
            ("temp_shutdown_c", Value::F64(95.0)),
            ("temp_max_operating_c", Value::F64(87.0)),
            ("power_w", Value::F64(61.5)),
            ("power_limit_w", Value::F64(70.0)),
            ("energy_mj", Value::I64(123_456_789)),
            ("clock_graphics_mhz", Value::F64(1410.0)),
            ("clock_sm_mhz", Value::F64(1410.0)),
            ("clock_mem_mhz", Value::F64(6251.0)),
            ("clock_video_mhz", Value::F64(1275.0)),
            ("clock_graphics_max_mhz", Value::F64(1770.0)),
            ("clock_sm_max_mhz", Value::F64(1770.0)),
            ("clock_mem_max_mhz", Value::F64(6251.0)),
            ("clock_video_max_mhz", Value::F64(1650.0)),
            ("throttle_reasons", Value::I64(0x44)),
            ("throttle_idle", Value::I64(0)),
            ("throttle_app_clocks", Value::I64(0)),
            ("throttle_power_cap", Value::I64(1)),
            ("throttle_hw_slowdown", Value::I64(0)),
            ("throttle_sync_boost", Value::I64(0)),
            ("throttle_sw_thermal", Value::I64(0)),
            ("throttle_hw_thermal", Value::I64(1)),
            ("throttle_power_brake", Value::I64(0)),
            ("throttle_display_clocks", Value::I64(0)),
            ("pcie_tx_kib_s", Value::F64(2048.0)),
            ("pcie_rx_kib_s", Value::F64(1024.0)),
            ("pcie_link_gen", Value::I64(4)),
            ("pcie_link_width", Value::I64(8)),
            ("fan_pct", Value::F64(35.0)),
            ("ecc_enabled", Value::I64(1)),
            ("ecc_corrected", Value::I64(3)),
            ("ecc_uncorrected", Value::I64(0)),
            ("mig_mode", Value::I64(0)),
            ("mig_mode_pending", Value::I64(0)),
        ];
        let got: Vec<(&str, Value)> = gpu
            .fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        assert_eq!(got, want);
        // The documented list (`Metric::fields`, used by the report and the README) is
        // exactly what the gpu line carries.
        let documented: Vec<&str> = Metric::ALL
            .iter()
            .filter(|m| m.measurement() == "gpu")
            .flat_map(|m| m.fields().iter().copied())
            .collect();
        let names: Vec<&str> = want.iter().map(|(k, _)| *k).collect();
        assert_eq!(documented, names);
        // No MIG and no process lines unless asked for.
        assert_eq!(out.batch.len(), 1);
        // ECC off: the mode only, no counts.
        let mut fields = Vec::new();
        gpu_fields(
            Metric::Ecc,
            &Reading::Ecc {
                enabled: false,
                corrected: Some(9),
                uncorrected: None,
            },
            &mut fields,
        );
        assert_eq!(fields, vec![("ecc_enabled".to_string(), Value::I64(0))]);
        // A reading of the wrong shape gives nothing rather than a wrong field.
        let mut fields = Vec::new();
        gpu_fields(Metric::Power, &Reading::Celsius(3), &mut fields);
        assert!(fields.is_empty());
    }

    #[test]
    fn throttle_bitmask_becomes_one_flag_per_reason() {
        let gpu = GpuIdentity::default();
        let sys = SystemInfo::default();
        for (bit, name) in THROTTLE_REASONS {
            let lines = readings_to_lines(
                &sys,
                &gpu,
                &[(Metric::ThrottleReasons, Reading::Bitmask(bit | 0x1000))],
                0,
            );
            let l = &lines[0];
            // The raw mask keeps bits no named reason covers.
            assert_eq!(
                field(l, "throttle_reasons"),
                Some(&Value::I64((bit | 0x1000) as i64))
            );
            for (_, other) in THROTTLE_REASONS {
                let want = i64::from(other == name);
                assert_eq!(
                    field(l, other),
                    Some(&Value::I64(want)),
                    "{name} vs {other}"
                );
            }
        }
        let lines = readings_to_lines(
            &sys,
            &gpu,
            &[(Metric::ThrottleReasons, Reading::Bitmask(0))],
            0,
        );
        assert!(lines[0].fields[1..]
            .iter()
            .all(|(_, v)| *v == Value::I64(0)));
    }

    #[test]
    fn throttle_bits_match_nvml() {
        use nvml_wrapper::bitmasks::device::ThrottleReasons as T;
        let nvml = [
            (T::GPU_IDLE, "throttle_idle"),
            (T::APPLICATIONS_CLOCKS_SETTING, "throttle_app_clocks"),
            (T::SW_POWER_CAP, "throttle_power_cap"),
            (T::HW_SLOWDOWN, "throttle_hw_slowdown"),
            (T::SYNC_BOOST, "throttle_sync_boost"),
            (T::SW_THERMAL_SLOWDOWN, "throttle_sw_thermal"),
            (T::HW_THERMAL_SLOWDOWN, "throttle_hw_thermal"),
            (T::HW_POWER_BRAKE_SLOWDOWN, "throttle_power_brake"),
            (T::DISPLAY_CLOCK_SETTING, "throttle_display_clocks"),
        ];
        for ((bit, name), (t, n)) in THROTTLE_REASONS.iter().zip(nvml) {
            assert_eq!((*bit, *name), (t.bits(), n));
        }
    }

    #[test]
    fn not_supported_is_skipped_recorded_once_and_not_asked_again() {
        let mut fake = FakeGpu::typical(1);
        for m in [Metric::Bar1, Metric::Fan, Metric::Ecc, Metric::TempShutdown] {
            fake.devices[0]
                .readings
                .insert(m, Err(ReadError::NotSupported));
        }
        let (mut s, status) = sampler(fake, false);
        let out = s.sample(1);
        assert_eq!(out.errors, 0);
        let gpu = lines_of(&out.batch, "gpu")[0];
        assert!(field(gpu, "bar1_used_mb").is_none());
        assert!(field(gpu, "fan_pct").is_none());
        assert!(field(gpu, "ecc_enabled").is_none());
        assert!(field(gpu, "temp_shutdown_c").is_none());
        assert_eq!(field(gpu, "temp_c"), Some(&Value::F64(55.0)));
        let st = status.gpus();
        assert_eq!(
            st[0].unsupported,
            vec!["bar1", "temp_shutdown", "fan", "ecc"]
        );
        // Second sample: the unsupported ones and the cached thresholds/max clocks are not
        // asked for again.
        let before = s.source_mut().reads;
        let out = s.sample(2);
        let asked = s.source_mut().reads - before;
        let dynamic = Metric::ALL
            .iter()
            .filter(|m| !m.is_static() && !m.is_per_process() && **m != Metric::MigInstances)
            .count() as u64;
        assert_eq!(asked, dynamic - 3);
        assert_eq!(out.errors, 0);
        assert_eq!(
            field(lines_of(&out.batch, "gpu")[0], "temp_slowdown_c"),
            Some(&Value::F64(90.0))
        );
        // After an hour they are probed once more, and still reported unsupported.
        let before = s.source_mut().reads;
        s.sample(2 + REPROBE_NS);
        // The dynamic ones, plus the unsupported threshold (never cached).
        assert_eq!(s.source_mut().reads - before, dynamic + 1);
        assert_eq!(status.gpus()[0].unsupported.len(), 4);
    }

    /// Log lines (debug and up) of the whole test binary, captured from the first call on.
    /// A global subscriber, because a scoped one (`with_default`) misses events whose
    /// callsite another test thread registered first; callers filter on their own markers.
    fn captured_logs() -> Option<Arc<Mutex<Vec<u8>>>> {
        static BUF: std::sync::OnceLock<Option<Arc<Mutex<Vec<u8>>>>> = std::sync::OnceLock::new();
        BUF.get_or_init(|| {
            #[derive(Clone)]
            struct Buf(Arc<Mutex<Vec<u8>>>);
            impl Write for Buf {
                fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                    self.0
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(b);
                    Ok(b.len())
                }
                fn flush(&mut self) -> std::io::Result<()> {
                    Ok(())
                }
            }
            let buf = Arc::new(Mutex::new(Vec::new()));
            let w = Buf(buf.clone());
            let sub = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_ansi(false)
                .with_writer(move || w.clone())
                .finish();
            tracing::subscriber::set_global_default(sub)
                .ok()
                .map(|_| buf)
        })
        .clone()
    }

    #[test]
    fn not_supported_errors_and_losses_are_logged_once() {
        let Some(buf) = captured_logs() else {
            return; // another global subscriber is installed: nothing to observe
        };
        let mut fake = FakeGpu::typical(3);
        for (i, d) in fake.devices.iter_mut().enumerate() {
            d.identity.uuid = format!("GPU-logtest-{i}");
        }
        for m in [Metric::Bar1, Metric::Fan] {
            fake.devices[0].readings.remove(&m);
        }
        fake.devices[0]
            .readings
            .insert(Metric::Power, Err(ReadError::Other("boom".into())));
        // GPU 1 flaps: its handle answers, its memory read says lost, every time.
        fake.devices[1]
            .readings
            .insert(Metric::Memory, Err(ReadError::GpuLost("gone".into())));
        let (mut s, status) = sampler(fake, false);
        let mut errors = 0;
        for k in 0..6 {
            errors += s.sample(k * MAX_BACKOFF_NS * 2).errors;
        }
        // GPU 2 falls off the bus, then comes back.
        s.source_mut().devices[2].lost = true;
        s.source_mut().devices[2]
            .readings
            .insert(Metric::Temperature, Err(ReadError::GpuLost("gone".into())));
        s.sample(6 * MAX_BACKOFF_NS * 2);
        s.source_mut().devices[2].lost = false;
        s.source_mut().devices[2].readings = FakeDevice::typical(2).readings;
        s.sample(7 * MAX_BACKOFF_NS * 2);
        s.sample(8 * MAX_BACKOFF_NS * 2);
        assert_eq!(errors, 6 + 6); // each failed read counts, logged or not
        assert!(!status.gpus()[2].lost);

        let logs = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        let count = |gpu: &str, needle: &str| {
            logs.lines()
                .filter(|l| l.contains(&format!("uuid={gpu} ")) && l.contains(needle))
                .count()
        };
        let g0 = "GPU-logtest-0";
        assert_eq!(
            count(g0, "does not support bar1, fan on this GPU"),
            1,
            "{logs}"
        );
        assert_eq!(count(g0, "INFO"), 1, "{logs}");
        assert_eq!(count(g0, "WARN"), 1, "{logs}");
        assert_eq!(count(g0, "boom"), 9, "{logs}"); // the rest at debug
        let g1 = "GPU-logtest-1";
        assert_eq!(count(g1, "WARN"), 1, "{logs}");
        assert_eq!(count(g1, "GPU lost ("), 1, "{logs}");
        assert_eq!(count(g1, "GPU lost again"), 8, "{logs}");
        assert_eq!(count(g1, "INFO"), 0, "{logs}");
        let g2 = "GPU-logtest-2";
        assert_eq!(count(g2, "WARN"), 1, "{logs}");
        assert_eq!(count(g2, "GPU reachable again"), 1, "{logs}");
    }

    #[test]
    fn a_gpu_supporting_nothing_gives_no_line_and_no_error() {
        // Jetson Orin: NVML lists the GPU but answers NotSupported to nearly everything.
        let mut fake = FakeGpu::typical(1);
        fake.devices[0].readings.clear();
        fake.devices[0].identity.name = "Orin (nvgpu)".into();
        let (mut s, status) = sampler(fake, true);
        let out = s.sample(1);
        assert!(out.batch.is_empty());
        assert_eq!(out.errors, 0);
        let g = &status.gpus()[0];
        assert!(!g.lost && g.last_error.is_none());
        assert_eq!(g.unsupported.len(), Metric::ALL.len() - 1); // MIG instances never asked
        let before = s.source_mut().reads;
        s.sample(2);
        assert_eq!(s.source_mut().reads, before);
    }

    #[test]
    fn a_lost_gpu_does_not_stop_the_others_and_is_retried_with_backoff() {
        let mut fake = FakeGpu::typical(2);
        fake.devices[1].readings.insert(
            Metric::Temperature,
            Err(ReadError::GpuLost("GPU has fallen off the bus".into())),
        );
        let (mut s, status) = sampler(fake, false);
        let out = s.sample(0);
        assert_eq!(out.errors, 1);
        let gpus: Vec<String> = lines_of(&out.batch, "gpu")
            .iter()
            .map(|l| l.key.clone())
            .collect();
        // GPU 1's readings before the loss are still sent; GPU 0 is complete.
        assert_eq!(gpus.len(), 2);
        assert!(gpus[0].contains("gpu=0"));
        let st = status.gpus();
        assert!(!st[0].lost);
        assert!(st[1].lost);
        assert!(st[1]
            .last_error
            .as_deref()
            .unwrap()
            .contains("fallen off the bus"));
        // Now the whole GPU is gone; it is not polled until its backoff passes.
        s.source_mut().devices[1].lost = true;
        let out = s.sample(1_000_000_000);
        assert_eq!(out.errors, 0);
        assert_eq!(lines_of(&out.batch, "gpu").len(), 1);
        assert!(lines_of(&out.batch, "gpu")[0].key.contains("gpu=0"));
        // Retry after 10 s fails: the next wait doubles, and no error is counted again.
        let out = s.sample(FIRST_BACKOFF_NS);
        assert_eq!(out.errors, 0);
        assert_eq!(out.batch.len(), 1);
        assert!(status.gpus()[1].lost);
        // Back on the bus, but before the doubled backoff: still skipped.
        s.source_mut().devices[1].lost = false;
        s.source_mut().devices[1].readings = FakeDevice::typical(1).readings;
        let out = s.sample(FIRST_BACKOFF_NS * 2);
        assert_eq!(out.batch.len(), 1);
        let out = s.sample(FIRST_BACKOFF_NS * 3);
        assert_eq!(lines_of(&out.batch, "gpu").len(), 2);
        let st = status.gpus();
        assert!(!st[1].lost);
        assert_eq!(st[1].last_error, None);
    }

    #[test]
    fn a_gpu_unreachable_at_start_is_kept_and_retried() {
        let mut fake = FakeGpu::typical(2);
        fake.devices[0].lost = true;
        let (mut s, status) = sampler(fake, false);
        assert_eq!(s.gpu_count(), 2);
        assert!(status.gpus()[0].lost);
        s.source_mut().devices[0].lost = false;
        let out = s.sample(5);
        assert_eq!(lines_of(&out.batch, "gpu").len(), 2);
        assert_eq!(status.gpus()[0].name, "NVIDIA A2");
    }

    #[test]
    fn other_errors_are_counted_kept_and_the_metric_still_polled() {
        let mut fake = FakeGpu::typical(1);
        fake.devices[0].readings.insert(
            Metric::Power,
            Err(ReadError::Other("an internal driver error occurred".into())),
        );
        let (mut s, status) = sampler(fake, false);
        for ts in 1..=3 {
            let out = s.sample(ts);
            assert_eq!(out.errors, 1);
            let gpu = lines_of(&out.batch, "gpu")[0];
            assert!(field(gpu, "power_w").is_none());
            assert_eq!(field(gpu, "power_limit_w"), Some(&Value::F64(70.0)));
        }
        let g = &status.gpus()[0];
        assert!(!g.lost);
        assert_eq!(
            g.last_error.as_deref(),
            Some("power: an internal driver error occurred")
        );
        assert!(g.unsupported.is_empty());
    }

    #[test]
    fn process_samples_only_when_enabled() {
        let (mut s, _) = sampler(FakeGpu::typical(1), false);
        let before = s.source_mut().reads;
        let out = s.sample(1);
        assert!(lines_of(&out.batch, "gpu_process").is_empty());
        let asked = s.source_mut().reads - before;
        let (mut s, _) = sampler(FakeGpu::typical(1), true);
        let before = s.source_mut().reads;
        let out = s.sample(1);
        assert_eq!(s.source_mut().reads - before, asked + 2);
        let procs = lines_of(&out.batch, "gpu_process");
        assert_eq!(procs.len(), 2);
        assert_eq!(
            procs[0].key,
            "gpu_process,gpu=0,pid=4242,process=python3,uuid=GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
        );
        assert_eq!(
            procs[0].fields,
            vec![
                ("mem_used_mb".to_string(), Value::F64(512.0)),
                ("sm_util_pct".to_string(), Value::F64(63.0)),
                ("mem_util_pct".to_string(), Value::F64(21.0)),
            ]
        );
        // Memory unknown (WDDM-like) and no utilization sample: idle, memory left out.
        assert!(procs[1].key.contains("pid=77"));
        assert_eq!(
            procs[1].fields,
            vec![
                ("sm_util_pct".to_string(), Value::F64(0.0)),
                ("mem_util_pct".to_string(), Value::F64(0.0)),
            ]
        );
        // Per-process utilization unsupported: memory only.
        let mut fake = FakeGpu::typical(1);
        fake.devices[0].readings.remove(&Metric::ProcessUtilization);
        let (mut s, _) = sampler(fake, true);
        let out = s.sample(1);
        let procs = lines_of(&out.batch, "gpu_process");
        assert_eq!(procs.len(), 1);
        assert_eq!(
            procs[0].fields,
            vec![("mem_used_mb".to_string(), Value::F64(512.0))]
        );
    }

    #[test]
    fn mig_instances_are_read_only_while_mig_is_on() {
        let mut fake = FakeGpu::typical(1);
        fake.devices[0].readings.insert(
            Metric::MigInstances,
            Err(ReadError::Other("must not be asked".into())),
        );
        let (mut s, _) = sampler(fake, false);
        let out = s.sample(1);
        assert_eq!(out.errors, 0);
        assert!(lines_of(&out.batch, "gpu_mig").is_empty());

        let mut fake = FakeGpu::typical(1);
        let d = &mut fake.devices[0];
        d.readings.insert(
            Metric::MigMode,
            Ok(Reading::MigMode {
                current: true,
                pending: true,
            }),
        );
        d.readings
            .insert(Metric::Utilization, Err(ReadError::NotSupported));
        d.readings.insert(
            Metric::MigInstances,
            Ok(Reading::MigInstances(vec![
                MigInstance {
                    index: 0,
                    uuid: "MIG-a".into(),
                    total: 5 << 30,
                    used: 1 << 30,
                    free: 4 << 30,
                },
                MigInstance {
                    index: 3,
                    uuid: "MIG-b".into(),
                    total: 10 << 30,
                    used: 0,
                    free: 10 << 30,
                },
            ])),
        );
        let (mut s, _) = sampler(fake, false);
        let out = s.sample(1);
        let gpu = lines_of(&out.batch, "gpu")[0];
        assert_eq!(field(gpu, "mig_mode"), Some(&Value::I64(1)));
        let migs = lines_of(&out.batch, "gpu_mig");
        assert_eq!(migs.len(), 2);
        assert_eq!(
            migs[0].key,
            "gpu_mig,gpu=0,mig=0,mig_uuid=MIG-a,uuid=GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
        );
        assert_eq!(
            migs[1].fields,
            vec![
                ("mem_total_mb".to_string(), Value::F64(10240.0)),
                ("mem_used_mb".to_string(), Value::F64(0.0)),
                ("mem_free_mb".to_string(), Value::F64(10240.0)),
            ]
        );
    }

    #[test]
    fn no_gpu_is_a_clear_error() {
        let e = Sampler::new(FakeGpu::typical(0), false, Arc::new(NvmlStatus::new()))
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "no NVIDIA GPU found: NVML (driver 550.54.15) lists no device"
        );
    }

    #[test]
    fn init_errors_say_what_to_do() {
        let missing = NvmlInitError::from_nvml(NvmlError::LibraryNotFound).to_string();
        assert!(missing.starts_with("no NVIDIA driver found: NVML (libnvidia-ml.so.1)"));
        assert!(missing.contains("tegrastats"));
        let m = NvmlInitError::from_nvml(NvmlError::LibRmVersionMismatch).to_string();
        assert!(
            m.contains("version mismatch") && m.contains("reboot"),
            "{m}"
        );
        let m = NvmlInitError::from_nvml(NvmlError::DriverNotLoaded).to_string();
        assert!(m.contains("kernel driver is not loaded"), "{m}");
        let m = NvmlInitError::from_nvml(NvmlError::NoPermission).to_string();
        assert!(m.contains("/dev/nvidia"), "{m}");
        // Errors from one read.
        assert_eq!(
            ReadError::from(NvmlError::NotSupported),
            ReadError::NotSupported
        );
        assert_eq!(
            ReadError::from(NvmlError::FunctionNotFound),
            ReadError::NotSupported
        );
        assert!(matches!(
            ReadError::from(NvmlError::GpuLost),
            ReadError::GpuLost(_)
        ));
        assert!(matches!(
            ReadError::from(NvmlError::Unknown),
            ReadError::Other(_)
        ));
        assert!(matches!(
            handle_error(NvmlError::Unknown),
            ReadError::GpuLost(_)
        ));
    }

    #[test]
    fn the_real_library_missing_is_a_clean_error() {
        // On a machine with a driver this checks nothing; here (no libnvidia-ml) it checks
        // that loading fails cleanly with the plain message.
        if let Err(e) = NvmlSource::init() {
            let m = e.to_string();
            assert!(!m.is_empty());
            let mut out = Vec::new();
            let r = gpus_report(&mut out);
            assert_eq!(r.err().map(|e| e.to_string()), Some(m));
        }
    }

    #[test]
    fn report_lists_every_metric_with_its_support() {
        let mut fake = FakeGpu::typical(2);
        fake.devices[0]
            .readings
            .insert(Metric::Fan, Err(ReadError::NotSupported));
        fake.devices[0]
            .readings
            .insert(Metric::Ecc, Err(ReadError::Other("no permission".into())));
        fake.devices[1].lost = true;
        let mut out = Vec::new();
        write_report(&mut fake, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("NVIDIA driver 550.54.15, CUDA driver 12.4\n2 GPU(s)\n"));
        assert!(text.contains("GPU 0: NVIDIA A2\n"));
        assert!(text.contains("arch=Ampere cc=8.6"));
        for m in Metric::ALL {
            assert!(text.contains(&format!("  {:<20} ", m.name())), "{m:?}");
        }
        let row = |name: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(&format!("{name} ")))
                .unwrap()
                .to_string()
        };
        assert!(row("fan").contains("not supported"));
        assert!(row("ecc").contains("error: no permission"));
        assert!(row("temperature").contains("supported") && row("temperature").contains("temp_c"));
        assert!(row("mig_instances").contains("n/a (MIG off)"));
        assert!(text.contains("GPU 1: error: GPU lost"));
        let mut none = FakeGpu::typical(0);
        let e = write_report(&mut none, &mut Vec::new()).unwrap_err();
        assert!(matches!(e, NvmlInitError::NoGpu { .. }));
    }

    #[test]
    fn snapshot_describes_state_and_gpus() {
        let status = Arc::new(NvmlStatus::new());
        assert_eq!(status.snapshot()["state"], "not started");
        let mut fake = FakeGpu::typical(1);
        fake.devices[0].readings.remove(&Metric::Bar1);
        let mut s = Sampler::new(fake, false, status.clone()).unwrap();
        s.sample(1);
        status.set_state("running");
        let v = status.snapshot();
        assert_eq!(v["state"], "running");
        assert_eq!(v["driver"], "550.54.15");
        assert_eq!(v["cuda"], "12.4");
        let g = &v["gpus"][0];
        assert_eq!(g["index"], 0);
        assert_eq!(g["name"], "NVIDIA A2");
        assert_eq!(g["arch"], "Ampere");
        assert_eq!(g["lost"], false);
        assert_eq!(g["last_error"], serde_json::Value::Null);
        assert_eq!(g["unsupported"], json!(["bar1"]));
    }

    #[test]
    fn bench_fake_sample_measures_something() {
        let d = bench_fake_sample(200);
        eprintln!("fake sample (1 GPU, processes on): {d:?} per sample");
        assert!(d > Duration::ZERO);
        assert!(d < Duration::from_millis(50), "{d:?}");
    }

    #[tokio::test]
    async fn run_samples_off_the_workers_and_submits() {
        let (handle, mut rx) = crate::queue::channel(10_000);
        let stats = Arc::new(Stats::default());
        let status = Arc::new(NvmlStatus::new());
        let shutdown = CancellationToken::new();
        let cfg = NvmlConfig {
            interval: Interval(Duration::from_millis(5)),
            processes: true,
            ..NvmlConfig::default()
        };
        let task = tokio::spawn(run_with(
            cfg,
            || Ok(FakeGpu::typical(2)),
            handle,
            stats.clone(),
            status.clone(),
            shutdown.clone(),
        ));
        let req = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        // 2 gpu lines + 2 x 2 process lines.
        assert_eq!(req.batch.len(), 6);
        assert_eq!(status.state(), "running");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.state(), "stopped");
        let v = status.snapshot();
        assert!(v["samples"].as_u64().unwrap() >= 1);
        assert!(v["last_sample_us"].is_u64());
        assert_eq!(Stats::get(&stats.collector_errors), 0);
    }

    #[tokio::test]
    async fn run_without_nvml_logs_and_returns() {
        let (handle, _rx) = crate::queue::channel(10);
        let status = Arc::new(NvmlStatus::new());
        run_with(
            NvmlConfig::default(),
            || -> Result<FakeGpu, NvmlInitError> {
                Err(NvmlInitError::from_nvml(NvmlError::LibraryNotFound))
            },
            handle.clone(),
            Arc::new(Stats::default()),
            status.clone(),
            CancellationToken::new(),
        )
        .await;
        assert!(status.state().starts_with("off: no NVIDIA driver found"));
        let off = NvmlConfig {
            enabled: false,
            ..NvmlConfig::default()
        };
        run_with(
            off,
            || Ok(FakeGpu::typical(1)),
            handle,
            Arc::new(Stats::default()),
            status.clone(),
            CancellationToken::new(),
        )
        .await;
        assert!(status.state().starts_with("off: disabled"));
    }
}
