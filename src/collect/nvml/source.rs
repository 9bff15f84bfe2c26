//! Where readings come from: the [`GpuSource`] trait and [`NvmlSource`], its
//! implementation over the real NVML library (`libnvidia-ml.so.1` through `nvml-wrapper`).
//! Every call may block. It only reads: no NVML `set_*` call, ever.
//!
//! Older drivers lack the newer versioned entry points the wrapper calls
//! (`nvmlDeviceGetMemoryInfo_v2`, `nvmlSystemGetCudaDriverVersion_v2`,
//! `nvmlDeviceGetFanSpeed_v2`/`nvmlDeviceGetNumFans`, the `_v3` process lists): where the
//! library has no such symbol, the older entry point is called instead (raw, through the
//! wrapper's loaded library and the device handle); a metric with neither is NotSupported.
//! `nvmlInit_v2`, `nvmlDeviceGetCount_v2` and `nvmlDeviceGetHandleByIndex_v2` have no
//! fallback: drivers without them predate everything else the agent reads.

use std::collections::{BTreeMap, HashMap};
use std::os::raw::{c_int, c_uint};

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{nvml_sym, nvml_try, nvml_try_count, Bits, NvmlError};
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use super::catalogue::{
    GpuIdentity, GpuProcess, Metric, MigInstance, ProcessUtil, Reading, SystemInfo,
};
use super::error::{handle_error, NvmlInitError, ReadError};

/// Where readings come from: NVML ([`NvmlSource`]) or, in tests, a fake (`FakeGpu`). Every
/// call may block (NVML talks to the kernel driver); callers keep it off the async workers.
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

/// `r`, or where the library lacks the symbol `r` needed, what `older` answers.
fn or_older<T>(
    r: Result<T, NvmlError>,
    older: impl FnOnce() -> Result<T, NvmlError>,
) -> Result<T, NvmlError> {
    match r {
        Err(NvmlError::FailedToLoadSymbol(_)) => older(),
        r => r,
    }
}

/// `nvmlMemory_t`, what `nvmlDeviceGetMemoryInfo` (before `_v2`) fills.
#[repr(C)]
#[derive(Default)]
struct MemoryV1 {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlProcessInfo_v1_t`, what the process lists before `_v2` fill.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: u64,
}

/// What NVML puts in `usedGpuMemory` when it cannot tell (`NVML_VALUE_NOT_AVAILABLE`).
const VALUE_NOT_AVAILABLE: u64 = u64::MAX;

/// Device memory as (total, used, free) bytes: `nvmlDeviceGetMemoryInfo_v2`, or the
/// original `nvmlDeviceGetMemoryInfo` on a driver without it.
fn memory(nvml: &Nvml, dev: &Device<'_>) -> Result<(u64, u64, u64), NvmlError> {
    or_older(dev.memory_info().map(|m| (m.total, m.used, m.free)), || {
        let sym = nvml_sym(nvml.lib().nvmlDeviceGetMemoryInfo.as_ref())?;
        let mut m = MemoryV1::default();
        // SAFETY: the handle comes from `nvml`, still initialised; `m` has the layout of
        // `nvmlMemory_t` and outlives the call, which only writes into it.
        nvml_try(unsafe { sym(dev.handle(), (&mut m as *mut MemoryV1).cast()) })?;
        Ok((m.total, m.used, m.free))
    })
}

/// CUDA driver version (1000 * major + 10 * minor): `_v2`, or the original call.
fn cuda_version(nvml: &Nvml) -> Result<i32, NvmlError> {
    or_older(nvml.sys_cuda_driver_version(), || {
        let sym = nvml_sym(nvml.lib().nvmlSystemGetCudaDriverVersion.as_ref())?;
        let mut v: c_int = 0;
        // SAFETY: NVML is initialised; the call writes one int into `v`.
        nvml_try(unsafe { sym(&mut v) })?;
        Ok(v)
    })
}

/// Each fan's speed, %: `nvmlDeviceGetNumFans` + `nvmlDeviceGetFanSpeed_v2`, or on a
/// driver without them the original `nvmlDeviceGetFanSpeed` (the first fan only).
fn fans(nvml: &Nvml, dev: &Device<'_>) -> Result<Vec<u32>, NvmlError> {
    let newer = dev.num_fans().and_then(|n| {
        if n == 0 {
            return Err(NvmlError::NotSupported);
        }
        (0..n).map(|i| dev.fan_speed(i)).collect()
    });
    or_older(newer, || {
        let sym = nvml_sym(nvml.lib().nvmlDeviceGetFanSpeed.as_ref())?;
        let mut pct: c_uint = 0;
        // SAFETY: the handle comes from `nvml`, still initialised; the call writes one
        // unsigned int into `pct`.
        nvml_try(unsafe { sym(dev.handle(), &mut pct) })?;
        Ok(vec![pct])
    })
}

/// Running processes as (pid, used bytes): `_v3`, then `_v2`, then the original call.
fn processes(
    nvml: &Nvml,
    dev: &Device<'_>,
    graphics: bool,
) -> Result<Vec<(u32, Option<u64>)>, NvmlError> {
    let from_wrapper = |list: Vec<ProcessInfo>| {
        list.into_iter()
            .map(|p| {
                let used = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                (p.pid, used)
            })
            .collect()
    };
    let v3 = if graphics {
        dev.running_graphics_processes()
    } else {
        dev.running_compute_processes()
    };
    or_older(v3.map(from_wrapper), || {
        let v2 = if graphics {
            dev.running_graphics_processes_v2()
        } else {
            dev.running_compute_processes_v2()
        };
        or_older(v2.map(from_wrapper), || {
            let lib = nvml.lib();
            let sym = if graphics {
                nvml_sym(lib.nvmlDeviceGetGraphicsRunningProcesses.as_ref())?
            } else {
                nvml_sym(lib.nvmlDeviceGetComputeRunningProcesses.as_ref())?
            };
            // SAFETY: the handle comes from `nvml`, still initialised. The first call
            // only writes the count; the second gets a buffer of `count` entries with the
            // layout of `nvmlProcessInfo_v1_t` and writes at most `count` of them.
            unsafe {
                let handle = dev.handle();
                let mut count: c_uint = 0;
                nvml_try_count(sym(handle, &mut count, std::ptr::null_mut()))?;
                if count == 0 {
                    return Ok(Vec::new());
                }
                // Room for processes that start between the two calls.
                count = count.saturating_add(5);
                let mut buf = vec![ProcessInfoV1::default(); count as usize];
                nvml_try(sym(handle, &mut count, buf.as_mut_ptr().cast()))?;
                buf.truncate(count as usize);
                Ok(buf
                    .into_iter()
                    .map(|p| {
                        let used =
                            (p.used_gpu_memory != VALUE_NOT_AVAILABLE).then_some(p.used_gpu_memory);
                        (p.pid, used)
                    })
                    .collect())
            }
        })
    })
}

impl NvmlSource {
    /// Loads `libnvidia-ml.so.1` and initialises NVML (blocking; tens of ms).
    pub fn init() -> Result<NvmlSource, NvmlInitError> {
        Self::with(Nvml::init())
    }

    /// [`NvmlSource::init`] with the NVML library at `path` instead of the system's
    /// `libnvidia-ml.so.1` (the benchmark loads a stand-in this way).
    pub fn init_from(path: &std::path::Path) -> Result<NvmlSource, NvmlInitError> {
        Self::with(Nvml::builder().lib_path(path.as_os_str()).init())
    }

    fn with(nvml: Result<Nvml, NvmlError>) -> Result<NvmlSource, NvmlInitError> {
        Ok(NvmlSource {
            nvml: nvml.map_err(NvmlInitError::from_nvml)?,
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
            cuda: cuda_version(&self.nvml)
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
            Metric::Memory => memory(&self.nvml, &dev).map(|(total, used, free)| Reading::Memory {
                total,
                used,
                free,
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
            Metric::Fan => fans(&self.nvml, &dev).map(Reading::Fans),
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
                    let Ok((total, used, free)) = memory(&self.nvml, &mig) else {
                        continue;
                    };
                    migs.push(MigInstance {
                        index: slot,
                        uuid: mig.uuid().unwrap_or_default(),
                        total,
                        used,
                        free,
                    });
                }
                Ok(Reading::MigInstances(migs))
            }
            Metric::Processes => {
                let compute = processes(&self.nvml, &dev, false);
                let graphics = processes(&self.nvml, &dev, true);
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
                for (pid, used) in list {
                    let e = by_pid.entry(pid).or_insert(None);
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
