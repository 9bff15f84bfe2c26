//! Where readings come from: the [`GpuSource`] trait and [`NvmlSource`], its
//! implementation over the real NVML library (`libnvidia-ml.so.1` through `nvml-wrapper`).
//! Every call may block. It only reads: no NVML `set_*` call, ever.

use std::collections::{BTreeMap, HashMap};

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{Bits, NvmlError};
use nvml_wrapper::Nvml;

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
