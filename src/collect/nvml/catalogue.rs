//! The metric catalogue: every [`Metric`] the collector asks NVML for, the fields each
//! becomes (the documented contract), and the [`Reading`] shapes NVML answers with. Plain
//! data: nothing here talks to NVML.

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
