//! A fake [`GpuSource`] for the unit tests and `benches/nvml.rs`. Compiled only for tests
//! and with the `test-fakes` cargo feature: never part of the release binary.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::catalogue::{GpuIdentity, GpuProcess, Metric, ProcessUtil, Reading, SystemInfo};
use super::error::ReadError;
use super::sampler::Sampler;
use super::source::GpuSource;
use super::status::NvmlStatus;

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
