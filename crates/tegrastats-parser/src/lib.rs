//! Parser for the output of NVIDIA Jetson's `tegrastats` utility, covering
//! every Jetson generation from Tegra K1 to Jetson Thor (JetPack 7.2).
//!
//! `tegrastats` prints one line per sample whose fields and spelling differ
//! by SoC, L4T release and privileges. This crate turns any of them into one
//! typed [`Sample`], with units normalised (MB, MHz, °C, mW):
//!
//! ```
//! use tegrastats_parser::{parse_line, Cpu, GpuFreq, Rail};
//!
//! // Jetson AGX Orin, JetPack 7.2 (L4T R39.2).
//! let s = parse_line(
//!     "07-25-2026 09:08:28 RAM 20642/62817MB (lfb 1x2MB) CPU [23%@2201,10%@2201,4%@2201,\
//!      14%@2201,30%@2201,18%@2201,10%@2201,10%@2201,33%@2201,7%@2201,5%@2201,27%@2201] \
//!      EMC_FREQ 3%@3199 GR3D_FREQ 12%@[1300,1300] NVENC0 off NVDEC0 off NVJPG0 off \
//!      NVJPG1 off VIC off OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off APE 174 \
//!      cpu@52.968C/52.968C soc2@48.406C/48.406C soc0@49.531C/49.531C gpu@47.625C/47.625C \
//!      VDD_GPU_SOC 5139mW/5139mW/5139mW VDD_CPU_CV 3268mW/3268mW/3268mW \
//!      VIN_SYS_5V0 5500mW/5500mW/5500mW",
//! )?;
//! assert_eq!(s.cpus[0], Some(Cpu { load_pct: Some(23), freq_mhz: Some(2201) }));
//! let gpu = s.gr3d.as_ref().unwrap();
//! assert_eq!(gpu.load_pct, Some(12));
//! assert_eq!(gpu.freq_mhz, Some(GpuFreq::PerGpc(vec![1300, 1300])));
//! assert!(s.engines["NVENC0"].off);
//! assert_eq!(s.temps_c["gpu"], 47.625);
//! assert_eq!(s.temps_peak_c["gpu"], 47.625);
//! assert_eq!(
//!     s.power_mw["VIN_SYS_5V0"],
//!     Rail { current: 5500, average: 5500, peak: Some(5500) }
//! );
//! assert!(s.unknown.is_empty());
//! # Ok::<(), tegrastats_parser::ParseError>(())
//! ```
//!
//! For a log file or a pipe from a running `tegrastats`, use [`Reader`],
//! which yields `(line_number, Result<Sample, ReadError>)`:
//!
//! ```no_run
//! use std::io::BufReader;
//! use std::process::{Command, Stdio};
//!
//! let mut child = Command::new("tegrastats")
//!     .args(["--interval", "1000"])
//!     .stdout(Stdio::piped())
//!     .spawn()?;
//! let stdout = BufReader::new(child.stdout.take().unwrap());
//! for (line, sample) in tegrastats_parser::Reader::new(stdout) {
//!     match sample {
//!         Ok(s) => println!("{line}: EMC {:?}", s.emc),
//!         Err(e) => eprintln!("line {line}: {e}"),
//!     }
//! }
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # What is understood
//!
//! | field | forms |
//! |---|---|
//! | timestamp | `MM-DD-YYYY HH:MM:SS` at the start (JetPack 5+) |
//! | [`Ram`] | `RAM 1180/3965MB (lfb 1x2MB)`, `(lfb 1x512kB)` |
//! | [`Swap`] | `SWAP 149/1024MB (cached 7MB)` |
//! | [`Iram`] | `IRAM 0/252kB(lfb 252kB)` (with or without the space) |
//! | [`Cpu`] list | `CPU [30%@1036,off,...]`; legacy `cpu [25%,7%]@2218` with one shared clock; `CPU [25%,7%, , ]@1734` with empty slots for offline cores; items without a clock |
//! | [`Emc`] | `EMC_FREQ 3%@2133`, `EMC_FREQ 0%`, `EMC_FREQ @3199`, legacy `EMC 3%@924` |
//! | [`Gr3d`] | `GR3D_FREQ 71%@1300`, `0%@[305,1300]` (per GPC), Thor `@[0,0,0]`, `0%`, legacy `GR3D 0%@252` |
//! | [`Mts`] | `MTS fg 0% bg 1%` |
//! | EDP | `EDP limit 1734` |
//! | [`Engine`]s | any upper-case `NAME` with `N`, `N%`, `N%@F`, `@F`, `off` or `[a%,b%]@F`: `APE`, `AVP`, `VDE`, `MSENC`, `NVENC`, `NVENC1_FREQ`, `NVDEC`, `NVJPG1`, `VIC_FREQ`, `VIC_LOAD`, `OFA`, `NVDLA0`, `PVA0_FREQ`, `GR3D2_FREQ`, … |
//! | temperatures | `CPU@43.5C`, `cv0@-256C`, JetPack 7.2 `cpu@52.968C/52.968C` |
//! | [`Rail`]s | `VDD_IN 1931/1931`, `VDD_IN 5079mW/5079mW`, JetPack 7.2 `VIN 87426mW/43713mW/87426mW` |
//!
//! Fields that only root sees (EMC/GR3D clocks, engines, `APE`, `MTS`,
//! `IRAM`) simply stay empty when tegrastats runs unprivileged.
//!
//! # Conventions
//!
//! * **Names are kept as printed.** `VIC_FREQ` (JetPack 5) and `VIC`
//!   (JetPack 6) are different keys; [`Sample::engine`] looks a base name up
//!   under all its spellings.
//! * **A bare engine number is a clock in MHz** (`APE 150`, `NVENC 716`).
//! * **`off` engines** are stored with [`Engine::off`] set and no load or
//!   clock, so they are distinguishable from engines that are absent.
//! * **Offline CPU cores** (`off`) are `None` entries of [`Sample::cpus`],
//!   keeping the core index of the others.
//! * **Unavailable sensors** (any reading ≤ −256 °C, e.g. `CV0@-256C`) are
//!   not temperatures: their names go to [`Sample::invalid_temps`].
//! * **`PMIC@100C` / `PMIC@50C`** is a constant threshold, not a sensor. It
//!   is kept in [`Sample::temps_c`] as printed and recognised by
//!   [`is_placeholder_temperature`]; [`Sample::measured_temps`] skips it.
//! * **Repeated names** (JetPack 5 AGX Orin prints the rail `NC`, "not
//!   connected", twice) get numbered keys: `NC`, `NC#2`.
//! * **Unknown tokens** are kept in [`Sample::unknown`] and never make a line
//!   fail. [`parse_line`] documents exactly which lines are errors.
//! * Sizes are binary: `1MB` = 1024 `kB`, `1GB` = 1024 `MB`.
//!
//! # Cargo features
//!
//! * `serde`: `Serialize`/`Deserialize` for all output types. The JSON
//!   object has the keys `timestamp` (string or `null`), `ram`
//!   {`used_mb`, `total_mb`, `lfb_blocks`, `lfb_block_mb`}, `swap`
//!   {`used_mb`, `total_mb`, `cached_mb`}, `iram` {`used_mb`, `total_mb`,
//!   `lfb_mb`}, `cpus` (array, `null` for an offline core, else
//!   {`load_pct`, `freq_mhz`}), `emc` {`load_pct`, `freq_mhz`}, `gr3d`
//!   {`load_pct`, `freq_mhz`: number or per-GPC array}, `mts` {`fg_pct`,
//!   `bg_pct`}, `edp_limit_mhz`, `engines` {NAME: {`load_pct`, `freq_mhz`,
//!   `unit_loads_pct`, `off`}}, `temps_c` {NAME: number}, `temps_peak_c`
//!   {NAME: number}, `invalid_temps` (array of names), `power_mw` {RAIL: {`current`,
//!   `average`, `peak`}} and `unknown` (array of tokens). Absent values and empty
//!   collections are omitted (except `timestamp`); `off` is written only
//!   when `true`.
//!
//! # Robustness
//!
//! The parser is a single pass over `split_ascii_whitespace` with bounded
//! look-ahead and no regular expressions. It contains no `unsafe`, and no
//! input can make it panic (checked with property tests and a `cargo fuzz`
//! target); its running time is linear in the line length.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![warn(rust_2018_idioms, unreachable_pub)]
// The no-panic guarantee, enforced outside unit tests.
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo
    )
)]

mod error;
mod parse;
mod reader;
mod types;

pub use error::{ParseError, ReadError};
pub use parse::{is_placeholder_temperature, parse_line};
pub use reader::{Reader, DEFAULT_MAX_LINE_LEN};
pub use types::{Cpu, Emc, Engine, GpuFreq, Gr3d, Iram, Mts, Rail, Ram, Sample, Swap};

/// Compiles and runs the examples in README.md as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
