//! The typed representation of one tegrastats sample.
//!
//! Units are normalised across releases: sizes are mebibytes as `f64`
//! (tegrastats' `kB`/`MB`/`GB` are binary units, so `512kB` is `0.5` MB),
//! clocks are MHz, loads are percent, temperatures are °C and power is mW.

use std::collections::BTreeMap;

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

/// One parsed tegrastats line.
///
/// Every field is optional because the set of fields differs by SoC, L4T
/// release, power mode and whether tegrastats runs as root. A field that was
/// not printed is `None` (or an empty collection); with the `serde` feature it
/// is left out of the serialized form, except `timestamp`, which is always
/// written (as `null` when absent).
///
/// Map keys are the names exactly as tegrastats printed them (no case folding
/// and no stripping of `_FREQ`/`_LOAD` suffixes). Should a name occur twice in
/// one line (AGX Orin on JetPack 5 prints a power rail called `NC` twice), the
/// second occurrence is stored as `NAME#2`, the third as `NAME#3`, and so on;
/// `#` never occurs in a name tegrastats prints, so these keys cannot collide.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Sample {
    /// Leading `MM-DD-YYYY HH:MM:SS` timestamp exactly as printed (JetPack 5
    /// and later), local time without a zone. Several lines can share one
    /// value when the sampling interval is below a second.
    pub timestamp: Option<String>,
    /// `RAM used/totalMB (lfb NxSIZE)`.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub ram: Option<Ram>,
    /// `SWAP used/totalMB (cached NMB)`; absent when no swap is active.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub swap: Option<Swap>,
    /// `IRAM used/totalkB(lfb NkB)`; Tegra X1 boards (TX1, Nano), root only.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub iram: Option<Iram>,
    /// One entry per CPU core, in core order; `None` for a core printed as
    /// `off` (or as an empty slot).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Vec::is_empty"))]
    pub cpus: Vec<Option<Cpu>>,
    /// External memory controller: `EMC_FREQ` (or legacy `EMC`).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub emc: Option<Emc>,
    /// GPU: `GR3D_FREQ` (or legacy `GR3D`). The separate second-GPC token
    /// `GR3D2_FREQ` of JetPack 5.0 is stored in [`engines`](Self::engines).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub gr3d: Option<Gr3d>,
    /// `MTS fg N% bg N%` (Denver/Carmel CPUs: TX2, Xavier; JetPack ≤ 4, root).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub mts: Option<Mts>,
    /// `EDP limit N` (TK1/TX1 legacy format), in MHz.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub edp_limit_mhz: Option<u32>,
    /// Every other `NAME value` clock/engine token (`APE`, `NVENC`, `NVDEC1`,
    /// `VIC_FREQ`, `NVDLA0_LOAD`, `PVA0_FREQ`, `GR3D2_FREQ`, `AVP`, …), keyed
    /// by the name as printed. See [`Sample::engine`] for a look-up that
    /// ignores the `_FREQ`/`_LOAD` suffix.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "BTreeMap::is_empty"))]
    pub engines: BTreeMap<String, Engine>,
    /// Temperatures in °C keyed by thermal-zone name as printed (`CPU`,
    /// `cpu`, `tj`, `soc012`, …). For JetPack 7.2's `name@curC/maxC` form
    /// this holds the first (current) value. Readings that are sentinels for
    /// "sensor not available" are not stored here but in
    /// [`invalid_temps`](Self::invalid_temps). The constant `PMIC` reading
    /// *is* stored here; see [`is_placeholder_temperature`](crate::is_placeholder_temperature).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "BTreeMap::is_empty"))]
    pub temps_c: BTreeMap<String, f64>,
    /// Second value of JetPack 7.2's `name@curC/maxC` temperature form, in
    /// °C, keyed like [`temps_c`](Self::temps_c). NVIDIA does not document
    /// it; observed values are consistent with a running maximum.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "BTreeMap::is_empty"))]
    pub temps_peak_c: BTreeMap<String, f64>,
    /// Names of thermal zones whose reading was a "not available" sentinel:
    /// any value at or below −256 °C (AGX Orin prints `CV0@-256C` for powered
    /// down sensors). In line order.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Vec::is_empty"))]
    pub invalid_temps: Vec<String>,
    /// Power rails in mW keyed by rail name as printed (`VDD_IN`,
    /// `POM_5V_GPU`, `VIN_SYS_5V0`, `GPU`, …).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "BTreeMap::is_empty"))]
    pub power_mw: BTreeMap<String, Rail>,
    /// Whitespace-separated tokens that were not understood, in line order.
    /// Never dropped: an unexpected token lands here and parsing goes on.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Vec::is_empty"))]
    pub unknown: Vec<String>,
}

impl Sample {
    /// Looks up an engine by its base name, trying `name`, then
    /// `name_FREQ`, then `name_LOAD`, so that `engine("VIC")` finds `VIC`
    /// (JetPack 6), `VIC_FREQ` (JetPack 5) and `VIC_LOAD` (DRIVE OS) alike.
    ///
    /// ```
    /// let s = tegrastats_parser::parse_line(
    ///     "RAM 3168/6851MB (lfb 2x4MB) CPU [23%@1397,17%@1192] VIC_FREQ 115 APE 150",
    /// )?;
    /// assert_eq!(s.engine("VIC").and_then(|e| e.freq_mhz), Some(115));
    /// # Ok::<(), tegrastats_parser::ParseError>(())
    /// ```
    pub fn engine(&self, name: &str) -> Option<&Engine> {
        if let Some(e) = self.engines.get(name) {
            return Some(e);
        }
        ["_FREQ", "_LOAD"].iter().find_map(|suffix| {
            let mut key = String::with_capacity(name.len() + suffix.len());
            key.push_str(name);
            key.push_str(suffix);
            self.engines.get(&key)
        })
    }

    /// Temperatures that are real measurements: [`temps_c`](Self::temps_c)
    /// without the constant placeholders recognised by
    /// [`is_placeholder_temperature`](crate::is_placeholder_temperature).
    pub fn measured_temps(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        self.temps_c
            .iter()
            .filter(|(name, _)| !crate::is_placeholder_temperature(name))
            .map(|(name, value)| (name.as_str(), *value))
    }

    /// Number of CPU cores listed, online or not.
    pub fn cpu_count(&self) -> usize {
        self.cpus.len()
    }

    /// Number of CPU cores that are online (not printed as `off`).
    pub fn online_cpu_count(&self) -> usize {
        self.cpus.iter().filter(|c| c.is_some()).count()
    }
}

/// Main memory: `RAM 18202/62841MB (lfb 466x4MB)`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Ram {
    /// Memory in use, MB.
    pub used_mb: f64,
    /// Total memory, MB.
    pub total_mb: f64,
    /// Number of free blocks of the largest free size (`466` in `466x4MB`).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub lfb_blocks: Option<u32>,
    /// Size of the largest free block, MB (`4.0` in `466x4MB`, `0.5` in
    /// `1x512kB`).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub lfb_block_mb: Option<f64>,
}

/// Swap: `SWAP 86/31420MB (cached 0MB)`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Swap {
    /// Swap in use, MB.
    pub used_mb: f64,
    /// Total swap, MB.
    pub total_mb: f64,
    /// Swap cache, MB.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub cached_mb: Option<f64>,
}

/// Tegra X1 internal RAM: `IRAM 0/252kB(lfb 252kB)`, converted to MB.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Iram {
    /// IRAM in use, MB.
    pub used_mb: f64,
    /// Total IRAM, MB.
    pub total_mb: f64,
    /// Largest free block, MB.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub lfb_mb: Option<f64>,
}

/// One online CPU core: `16%@1949` in `CPU [16%@1949,...]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Cpu {
    /// Load in percent of the core's current frequency.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub load_pct: Option<u32>,
    /// Current frequency, MHz. In the legacy `cpu [a%,b%]@F` format every
    /// core gets the one shared frequency `F`.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub freq_mhz: Option<u32>,
}

/// External memory controller: `EMC_FREQ 3%@2133`, `EMC_FREQ 0%`,
/// `EMC_FREQ @3199`, legacy `EMC 0%@1600`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Emc {
    /// Bandwidth use in percent of the current EMC clock (absent when
    /// printed as `@F`).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub load_pct: Option<u32>,
    /// EMC clock, MHz (absent when not running as root on JetPack ≤ 5).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub freq_mhz: Option<u32>,
}

/// GPU: `GR3D_FREQ 71%@1300`, `GR3D_FREQ 0%@[305,1300]`, Thor's
/// `GR3D_FREQ @[0,0,0]`, non-root `GR3D_FREQ 0%`, legacy `GR3D 0%@998`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Gr3d {
    /// Utilisation in percent, one figure for the whole GPU (absent on Thor,
    /// which prints only clocks).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub load_pct: Option<u32>,
    /// GPU clock(s), MHz: one number, or one per GPC when printed as an
    /// array (`@[a,b]`, even with a single element).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub freq_mhz: Option<GpuFreq>,
}

/// The GPU clock as printed: a single value or a per-GPC array.
///
/// With the `serde` feature this is a plain JSON number or array.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
#[cfg_attr(feature = "serde", serde(untagged))]
pub enum GpuFreq {
    /// `GR3D_FREQ 71%@1300`.
    Single(u32),
    /// `GR3D_FREQ 0%@[305,1300]`: one clock per GPC, in printed order.
    PerGpc(Vec<u32>),
}

impl GpuFreq {
    /// All values as a slice (one element for [`GpuFreq::Single`]).
    pub fn as_slice(&self) -> &[u32] {
        match self {
            GpuFreq::Single(v) => std::slice::from_ref(v),
            GpuFreq::PerGpc(v) => v,
        }
    }

    /// Highest clock across GPCs, `None` for an empty array.
    pub fn max(&self) -> Option<u32> {
        self.as_slice().iter().copied().max()
    }
}

/// Denver/Carmel MTS load: `MTS fg 0% bg 1%`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Mts {
    /// Foreground load, percent.
    pub fg_pct: u32,
    /// Background load, percent.
    pub bg_pct: u32,
}

/// A hardware engine or clock, from `NAME value`.
///
/// | printed | `load_pct` | `freq_mhz` | `off` |
/// |---|---|---|---|
/// | `NVENC 79%@166` | 79 | 166 | false |
/// | `NVENC_LOAD 7%` | 7 | – | false |
/// | `NVENC0_FREQ @314` | – | 314 | false |
/// | `APE 150`, `VIC_FREQ 729` | – | 150, 729 | false |
/// | `NVDEC off` | – | – | true |
/// | `PVA0_FREQ [10%,5%]@1152` | – (see `unit_loads_pct`) | 1152 | false |
///
/// A bare number is always a clock in MHz (`APE 150`, `NVENC 716`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Engine {
    /// Utilisation, percent.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub load_pct: Option<u32>,
    /// Clock, MHz.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub freq_mhz: Option<u32>,
    /// Per-unit utilisation printed as an array, e.g. the per-VPU loads of
    /// `PVA0_FREQ [10%,5%]@1152` (documented for Jetson Linux r38).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Vec::is_empty")
    )]
    pub unit_loads_pct: Vec<u32>,
    /// `true` when printed as `off` (clock-gated or unused); the other
    /// fields are then empty. Serialized only when `true`.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_false"))]
    pub off: bool,
}

impl Engine {
    /// An engine printed as `off`.
    pub fn off() -> Self {
        Engine {
            off: true,
            ..Engine::default()
        }
    }

    /// An engine with the given load and clock.
    pub fn new(load_pct: Option<u32>, freq_mhz: Option<u32>) -> Self {
        Engine {
            load_pct,
            freq_mhz,
            ..Engine::default()
        }
    }
}

#[cfg(feature = "serde")]
fn is_false(b: &bool) -> bool {
    !*b
}

/// A power rail in mW: `VDD_IN 5079mW/5079mW`, old `VDD_IN 1931/1931`
/// (same unit, not printed), or JetPack 7.2's `VIN 87426mW/43713mW/87426mW`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Rail {
    /// Instantaneous power, mW.
    pub current: u32,
    /// Average since tegrastats started, mW.
    pub average: u32,
    /// Third value of the JetPack 7.2 form, mW: the maximum since
    /// tegrastats started (inferred from real lines; NVIDIA does not
    /// document it).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub peak: Option<u32>,
}
