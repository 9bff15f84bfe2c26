//! Exact values for a representative set of real lines: at least one per
//! Jetson generation and per format family (see `tests/data/lines.tsv`).
//!
//! Expected samples are written out by hand from the printed lines and
//! compared with `assert_eq!` on the whole [`Sample`], so any field the
//! parser fills unexpectedly fails the test too.

mod common;

use tegrastats_parser::{
    parse_line, Cpu, Emc, Engine, GpuFreq, Gr3d, Iram, Mts, Rail, Ram, Sample, Swap,
};

/// Builder for expected samples.
#[derive(Default)]
struct Expect(Sample);

impl Expect {
    fn ts(mut self, t: &str) -> Self {
        self.0.timestamp = Some(t.to_owned());
        self
    }
    fn ram(mut self, used_mb: f64, total_mb: f64, blocks: u32, block_mb: f64) -> Self {
        self.0.ram = Some(Ram {
            used_mb,
            total_mb,
            lfb_blocks: Some(blocks),
            lfb_block_mb: Some(block_mb),
        });
        self
    }
    fn swap(mut self, used_mb: f64, total_mb: f64, cached_mb: f64) -> Self {
        self.0.swap = Some(Swap {
            used_mb,
            total_mb,
            cached_mb: Some(cached_mb),
        });
        self
    }
    fn iram(mut self, used_mb: f64, total_mb: f64, lfb_mb: f64) -> Self {
        self.0.iram = Some(Iram {
            used_mb,
            total_mb,
            lfb_mb: Some(lfb_mb),
        });
        self
    }
    /// `(load, freq)` per core, `None` for `off`.
    fn cpus(mut self, cores: &[Option<(u32, u32)>]) -> Self {
        self.0.cpus = cores
            .iter()
            .map(|c| {
                c.map(|(load, freq)| Cpu {
                    load_pct: Some(load),
                    freq_mhz: Some(freq),
                })
            })
            .collect();
        self
    }
    /// All cores at the same clock (also the legacy shared-clock form).
    fn cpus_at(self, loads: &[u32], freq: u32) -> Self {
        let cores: Vec<_> = loads.iter().map(|&l| Some((l, freq))).collect();
        self.cpus(&cores)
    }
    fn emc(mut self, load_pct: Option<u32>, freq_mhz: Option<u32>) -> Self {
        self.0.emc = Some(Emc { load_pct, freq_mhz });
        self
    }
    fn gr3d(mut self, load_pct: Option<u32>, freq_mhz: Option<GpuFreq>) -> Self {
        self.0.gr3d = Some(Gr3d { load_pct, freq_mhz });
        self
    }
    fn mts(mut self, fg_pct: u32, bg_pct: u32) -> Self {
        self.0.mts = Some(Mts { fg_pct, bg_pct });
        self
    }
    fn edp(mut self, mhz: u32) -> Self {
        self.0.edp_limit_mhz = Some(mhz);
        self
    }
    fn engine(mut self, name: &str, load: Option<u32>, freq: Option<u32>) -> Self {
        self.0
            .engines
            .insert(name.to_owned(), Engine::new(load, freq));
        self
    }
    fn off(mut self, names: &[&str]) -> Self {
        for name in names {
            self.0.engines.insert((*name).to_owned(), Engine::off());
        }
        self
    }
    fn temps(mut self, temps: &[(&str, f64)]) -> Self {
        for (name, t) in temps {
            self.0.temps_c.insert((*name).to_owned(), *t);
        }
        self
    }
    fn peaks(mut self, temps: &[(&str, f64)]) -> Self {
        for (name, t) in temps {
            self.0.temps_peak_c.insert((*name).to_owned(), *t);
        }
        self
    }
    fn invalid(mut self, names: &[&str]) -> Self {
        self.0.invalid_temps = names.iter().map(|n| (*n).to_owned()).collect();
        self
    }
    fn rails(mut self, rails: &[(&str, u32, u32)]) -> Self {
        for (name, current, average) in rails {
            self.0.power_mw.insert(
                (*name).to_owned(),
                Rail {
                    current: *current,
                    average: *average,
                    peak: None,
                },
            );
        }
        self
    }
    fn rails3(mut self, rails: &[(&str, u32, u32, u32)]) -> Self {
        for (name, current, average, peak) in rails {
            self.0.power_mw.insert(
                (*name).to_owned(),
                Rail {
                    current: *current,
                    average: *average,
                    peak: Some(*peak),
                },
            );
        }
        self
    }
}

fn e() -> Expect {
    Expect::default()
}

fn single(mhz: u32) -> Option<GpuFreq> {
    Some(GpuFreq::Single(mhz))
}

fn per_gpc(mhz: &[u32]) -> Option<GpuFreq> {
    Some(GpuFreq::PerGpc(mhz.to_vec()))
}

/// `(fixture id, what it represents, expected sample)`.
fn cases() -> Vec<(u32, &'static str, Expect)> {
    vec![
        (
            43,
            "TK1, L4T R21: legacy cpu [..]@F, EMC, AVP, VDE, GR3D, EDP limit",
            e().ram(714.0, 1876.0, 139, 4.0)
                .swap(0.0, 2048.0, 0.0)
                .cpus_at(&[25, 7, 1, 1], 2218)
                .emc(Some(3), Some(924))
                .engine("AVP", Some(0), Some(81))
                .engine("VDE", None, Some(120))
                .gr3d(Some(0), single(252))
                .edp(0),
        ),
        (
            37,
            "TX1, L4T R24: legacy with NVDEC/MSENC clocks",
            e().ram(1104.0, 3995.0, 425, 4.0)
                .cpus_at(&[2, 5, 8, 11], 1734)
                .emc(Some(0), Some(1600))
                .engine("AVP", Some(1), Some(115))
                .engine("NVDEC", None, Some(192))
                .engine("MSENC", None, Some(192))
                .gr3d(Some(0), single(998))
                .edp(1734),
        ),
        (
            34,
            "TX1, L4T R28.1: legacy, GR3D last on the line",
            e().ram(3691.0, 3983.0, 3, 2.0)
                .swap(2780.0, 8192.0, 284.0)
                .cpus_at(&[1, 0, 4, 0], 1734)
                .emc(Some(0), Some(1600))
                .engine("APE", None, Some(25))
                .gr3d(Some(0), single(998)),
        ),
        (
            5,
            "TX2, JetPack 3 (R28): lfb in kB, MTS, rails without unit",
            e().ram(4722.0, 7844.0, 1, 0.5)
                .cpus(&[
                    Some((55, 2035)),
                    Some((14, 2034)),
                    Some((27, 2034)),
                    Some((55, 2035)),
                    Some((47, 2035)),
                    Some((45, 2035)),
                ])
                .emc(Some(2), Some(1866))
                .gr3d(Some(71), single(1300))
                .engine("APE", None, Some(150))
                .mts(0, 0)
                .temps(&[
                    ("BCPU", 45.0),
                    ("MCPU", 45.0),
                    ("GPU", 51.0),
                    ("PLL", 45.0),
                    ("AO", 47.5),
                    ("Tboard", 37.0),
                    ("Tdiode", 46.75),
                    ("PMIC", 100.0),
                    ("thermal", 46.4),
                ])
                .rails(&[
                    ("VDD_IN", 14025, 14416),
                    ("VDD_CPU", 2209, 2538),
                    ("VDD_GPU", 6854, 6903),
                    ("VDD_SOC", 1371, 1370),
                    ("VDD_WIFI", 19, 19),
                    ("VDD_DDR", 2702, 2702),
                ]),
        ),
        (
            22,
            "TX2, R28: Denver and A57 cores off",
            e().ram(1345.0, 7829.0, 1290, 4.0)
                .swap(0.0, 512.0, 0.0)
                .cpus(&[Some((2, 345)), None, None, None, None, None])
                .emc(Some(13), Some(40))
                .gr3d(Some(0), single(114))
                .engine("APE", None, Some(150))
                .temps(&[
                    ("BCPU", 35.0),
                    ("MCPU", 35.0),
                    ("GPU", 41.0),
                    ("PLL", 35.0),
                    ("AO", 35.5),
                    ("Tboard", 35.0),
                    ("Tdiode", 36.0),
                    ("PMIC", 100.0),
                    ("thermal", 35.5),
                ])
                .rails(&[
                    ("VDD_IN", 2003, 2658),
                    ("VDD_CPU", 320, 518),
                    ("VDD_GPU", 400, 735),
                    ("VDD_SOC", 400, 415),
                    ("VDD_WIFI", 0, 0),
                    ("VDD_DDR", 240, 348),
                ]),
        ),
        (
            4,
            "Nano, JetPack 4.2: IRAM, NVENC/NVDEC clocks, POM_5V rails",
            e().ram(1180.0, 3965.0, 1, 2.0)
                .swap(149.0, 1024.0, 7.0)
                .iram(0.0, 252.0 / 1024.0, 252.0 / 1024.0)
                .cpus_at(&[30, 33, 28, 26], 1036)
                .emc(Some(10), Some(1600))
                .gr3d(Some(0), single(76))
                .engine("NVENC", None, Some(716))
                .engine("NVDEC", None, Some(716))
                .engine("APE", None, Some(25))
                .temps(&[
                    ("PLL", 57.0),
                    ("CPU", 60.5),
                    ("PMIC", 100.0),
                    ("GPU", 59.0),
                    ("AO", 65.0),
                    ("thermal", 59.75),
                ])
                .rails(&[
                    ("POM_5V_IN", 4520, 4680),
                    ("POM_5V_GPU", 0, 0),
                    ("POM_5V_CPU", 1078, 1205),
                ]),
        ),
        (
            46,
            "Nano, JetPack 4.2: IRAM without SWAP",
            e().ram(1446.0, 3957.0, 458, 4.0)
                .iram(0.0, 252.0 / 1024.0, 252.0 / 1024.0)
                .cpus_at(&[17, 11, 21, 12], 1428)
                .emc(Some(2), Some(1600))
                .gr3d(Some(0), single(76))
                .engine("APE", None, Some(25))
                .temps(&[
                    ("PLL", 20.5),
                    ("CPU", 24.5),
                    ("PMIC", 100.0),
                    ("GPU", 21.0),
                    ("AO", 29.5),
                    ("thermal", 22.25),
                ])
                .rails(&[
                    ("POM_5V_IN", 2830, 1483),
                    ("POM_5V_GPU", 41, 31),
                    ("POM_5V_CPU", 943, 206),
                ]),
        ),
        (
            2,
            "AGX Xavier, JetPack 4.1: rails named GPU/CPU/SOC next to GPU@/CPU@ temps",
            e().ram(1736.0, 15827.0, 3283, 4.0)
                .cpus(&[
                    Some((1, 1160)),
                    Some((2, 1161)),
                    Some((0, 1189)),
                    Some((0, 1189)),
                    None,
                    None,
                    None,
                    None,
                ])
                .emc(Some(0), Some(665))
                .gr3d(Some(0), single(114))
                .engine("APE", None, Some(150))
                .mts(0, 0)
                .temps(&[
                    ("AO", 29.0),
                    ("GPU", 30.0),
                    ("iwlwifi", 34.0),
                    ("Tboard", 30.0),
                    ("Tdiode", 33.0),
                    ("AUX", 29.0),
                    ("CPU", 30.0),
                    ("thermal", 29.45),
                    ("PMIC", 100.0),
                ])
                .rails(&[
                    ("GPU", 466, 466),
                    ("CPU", 466, 466),
                    ("SOC", 932, 932),
                    ("CV", 0, 0),
                    ("VDDRQ", 0, 0),
                    ("SYS5V", 1854, 1854),
                ]),
        ),
        (
            14,
            "Xavier NX, JetPack 5.1.2: single-GPC array, VIC_FREQ, PMIC@50C, mW rails",
            e().ts("07-09-2024 13:31:31")
                .ram(3168.0, 6851.0, 2, 4.0)
                .swap(161.0, 3426.0, 0.0)
                .cpus(&[
                    Some((23, 1397)),
                    Some((17, 1192)),
                    Some((16, 1190)),
                    Some((13, 1190)),
                    Some((23, 1190)),
                    Some((10, 1190)),
                ])
                .emc(Some(2), Some(204))
                .gr3d(Some(0), per_gpc(&[114]))
                .engine("VIC_FREQ", None, Some(115))
                .engine("APE", None, Some(150))
                .temps(&[
                    ("AUX", 45.0),
                    ("CPU", 46.5),
                    ("thermal", 45.6),
                    ("AO", 45.0),
                    ("GPU", 45.5),
                    ("PMIC", 50.0),
                ])
                .rails(&[
                    ("VDD_IN", 2763, 2846),
                    ("VDD_CPU_GPU_CV", 650, 670),
                    ("VDD_SOC", 650, 711),
                ]),
        ),
        (
            52,
            "AGX Orin, JetPack 5.0.2: GR3D2_FREQ, -256C sentinels, NC rail twice",
            e().ts("10-16-2023 10:59:22")
                .ram(1205.0, 30623.0, 6429, 4.0)
                .swap(0.0, 15311.0, 0.0)
                .cpus(&[
                    Some((0, 729)),
                    Some((0, 729)),
                    Some((1, 729)),
                    Some((0, 729)),
                    Some((0, 729)),
                    Some((0, 730)),
                    Some((0, 730)),
                    Some((0, 729)),
                    Some((0, 729)),
                    Some((0, 729)),
                    Some((0, 729)),
                    Some((0, 729)),
                ])
                .emc(Some(0), Some(204))
                .gr3d(Some(0), single(114))
                .engine("GR3D2_FREQ", Some(0), Some(114))
                .engine("NVJPG1", None, Some(729))
                .engine("VIC_FREQ", None, Some(729))
                .engine("APE", None, Some(233))
                .temps(&[
                    ("CPU", 43.5),
                    ("Tdiode", 32.5),
                    ("SOC2", 40.062),
                    ("SOC0", 40.5),
                    ("GPU", 38.156),
                    ("SOC1", 39.125),
                ])
                .invalid(&["CV0", "CV1", "CV2"])
                .rails(&[
                    ("VDD_GPU_SOC", 4788, 4788),
                    ("VDD_CPU_CV", 798, 798),
                    ("VIN_SYS_5V0", 3842, 3842),
                    ("NC", 0, 0),
                    ("VDDQ_VDD2_1V8AO", 707, 707),
                    ("NC#2", 0, 0),
                ]),
        ),
        (
            55,
            "Orin NX, JetPack 5 non-root: EMC_FREQ 0%, GR3D_FREQ 0%, no rails",
            e().ts("08-21-2026 15:11:33")
                .ram(998.0, 15389.0, 3313, 4.0)
                .swap(0.0, 7694.0, 0.0)
                .cpus(&[
                    Some((4, 883)),
                    Some((0, 883)),
                    Some((1, 883)),
                    Some((0, 883)),
                    Some((0, 729)),
                    Some((0, 729)),
                    Some((0, 729)),
                    Some((0, 729)),
                ])
                .emc(Some(0), None)
                .gr3d(Some(0), None)
                .engine("GR3D2_FREQ", Some(0), Some(0))
                .temps(&[
                    ("CV0", 54.156),
                    ("CPU", 56.843),
                    ("SOC2", 54.906),
                    ("SOC0", 56.031),
                    ("CV1", 54.093),
                    ("GPU", 54.375),
                    ("tj", 57.468),
                    ("SOC1", 57.468),
                    ("CV2", 54.281),
                ]),
        ),
        (
            26,
            "DRIVE-like Orin: EMC_FREQ @F, two GR3D tokens, *_LOAD engines",
            e().ts("06-07-2023 14:39:03")
                .ram(18220.0, 24402.0, 872, 4.0)
                .cpus(&[
                    Some((48, 2009)),
                    Some((29, 2009)),
                    Some((38, 2009)),
                    Some((28, 2008)),
                    Some((34, 2008)),
                    Some((37, 2010)),
                    Some((35, 2010)),
                    Some((47, 2009)),
                    Some((28, 2001)),
                    Some((44, 2009)),
                    Some((32, 2009)),
                    Some((37, 2021)),
                ])
                .emc(None, Some(3199))
                .gr3d(Some(99), single(1274))
                .engine("GR3D2_FREQ", Some(99), Some(1274))
                .engine("NVENC_LOAD", Some(7), None)
                .engine("NVDEC_LOAD", Some(0), None)
                .engine("VIC_LOAD", Some(0), None)
                .engine("NVDLA0_LOAD", Some(0), None)
                .engine("NVDLA1_LOAD", Some(0), None)
                .engine("APE", None, Some(81))
                .temps(&[
                    ("CV0", 73.218),
                    ("CPU", 74.343),
                    ("SOC2", 73.906),
                    ("SOC0", 72.5),
                    ("CV1", 72.031),
                    ("GPU", 78.937),
                    ("tj", 78.937),
                    ("SOC1", 74.187),
                    ("CV2", 70.968),
                ]),
        ),
        (
            7,
            "AGX Orin, JetPack 6.2.1: per-GPC array, every engine listed, off",
            e().ts("05-09-2026 18:42:07")
                .ram(18202.0, 62841.0, 466, 4.0)
                .swap(86.0, 31420.0, 0.0)
                .cpus(&[
                    Some((16, 1949)),
                    Some((6, 1761)),
                    Some((4, 1222)),
                    Some((4, 2201)),
                    Some((4, 1036)),
                    Some((33, 1036)),
                    Some((0, 1036)),
                    Some((40, 1036)),
                    Some((3, 1190)),
                    Some((46, 1190)),
                    Some((6, 1190)),
                    Some((2, 1190)),
                ])
                .emc(Some(3), Some(2133))
                .gr3d(Some(0), per_gpc(&[0, 0]))
                .engine("NVENC", Some(78), Some(166))
                .engine("VIC", Some(32), Some(115))
                .engine("APE", None, Some(174))
                .off(&[
                    "NVDEC",
                    "NVJPG",
                    "NVJPG1",
                    "OFA",
                    "NVDLA0",
                    "NVDLA1",
                    "PVA0_FREQ",
                ])
                .temps(&[
                    ("cpu", 52.343),
                    ("soc2", 48.343),
                    ("soc0", 49.062),
                    ("tj", 52.343),
                    ("soc1", 49.531),
                ])
                .rails(&[
                    ("VDD_GPU_SOC", 2412, 2412),
                    ("VDD_CPU_CV", 1607, 1607),
                    ("VIN_SYS_5V0", 4607, 4657),
                ]),
        ),
        (
            17,
            "Orin Nano, JetPack 6 non-root: no EMC, GR3D load only, no engines",
            e().ts("06-18-2025 11:25:24")
                .ram(3452.0, 7620.0, 25, 4.0)
                .swap(1518.0, 16384.0, 174.0)
                .cpus(&[
                    Some((1, 1420)),
                    Some((2, 1420)),
                    Some((0, 1420)),
                    Some((2, 1420)),
                    Some((2, 729)),
                    Some((1, 729)),
                ])
                .gr3d(Some(0), None)
                .temps(&[
                    ("cpu", 50.031),
                    ("soc2", 49.031),
                    ("soc0", 50.0),
                    ("gpu", 49.031),
                    ("tj", 50.25),
                    ("soc1", 50.25),
                ])
                .rails(&[
                    ("VDD_IN", 4824, 4824),
                    ("VDD_CPU_GPU_CV", 518, 518),
                    ("VDD_SOC", 1475, 1475),
                ]),
        ),
        (
            10,
            "AGX Thor, L4T R38.4: GR3D_FREQ @[..] without load, *_FREQ @F engines",
            e().ts("05-17-2026 10:00:33")
                .ram(4280.0, 125773.0, 29, 4.0)
                .swap(0.0, 2048.0, 0.0)
                .cpus(&[
                    Some((0, 972)),
                    Some((0, 972)),
                    Some((0, 972)),
                    Some((0, 972)),
                    Some((1, 972)),
                    Some((0, 972)),
                    Some((1, 972)),
                    Some((0, 972)),
                    Some((0, 2601)),
                    Some((17, 2601)),
                    Some((1, 972)),
                    Some((9, 972)),
                    Some((0, 972)),
                    Some((1, 972)),
                ])
                .emc(Some(0), Some(665))
                .gr3d(None, per_gpc(&[0, 0, 0]))
                .engine("NVENC0_FREQ", None, Some(0))
                .engine("NVENC1_FREQ", None, Some(0))
                .engine("NVDEC0_FREQ", None, Some(0))
                .engine("NVDEC1_FREQ", None, Some(0))
                .engine("NVJPG0_FREQ", None, Some(0))
                .engine("OFA_FREQ", None, Some(0))
                .engine("APE", None, Some(300))
                .off(&["VIC", "PVA0_FREQ"])
                .temps(&[
                    ("cpu", 35.25),
                    ("tj", 36.031),
                    ("soc012", 36.062),
                    ("soc345", 34.5),
                ])
                .rails(&[
                    ("VDD_GPU", 0, 0),
                    ("VDD_CPU_SOC_MSS", 4923, 4544),
                    ("VIN_SYS_5V0", 4327, 4227),
                ]),
        ),
        (
            58,
            "AGX Thor, L4T R38.4: busy GPCs, VIN rail, no SWAP",
            e().ts("04-21-2026 15:50:52")
                .ram(105265.0, 125772.0, 34, 4.0)
                .cpus_at(&[0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 8, 0, 0], 972)
                .emc(Some(0), Some(2750))
                .gr3d(None, per_gpc(&[314, 314, 314]))
                .engine("NVENC0_FREQ", None, Some(314))
                .engine("NVENC1_FREQ", None, Some(314))
                .engine("NVDEC0_FREQ", None, Some(314))
                .engine("NVDEC1_FREQ", None, Some(314))
                .engine("NVJPG0_FREQ", None, Some(314))
                .engine("OFA_FREQ", None, Some(315))
                .engine("APE", None, Some(300))
                .off(&["VIC", "PVA0_FREQ"])
                .temps(&[
                    ("cpu", 37.343),
                    ("tj", 38.875),
                    ("soc012", 37.468),
                    ("gpu", 38.875),
                    ("soc345", 37.406),
                ])
                .rails(&[
                    ("VDD_GPU", 1962, 1962),
                    ("VDD_CPU_SOC_MSS", 5887, 5887),
                    ("VIN_SYS_5V0", 5635, 5635),
                    ("VIN", 19780, 19780),
                ]),
        ),
        (
            1,
            "AGX Orin, JetPack 7.2: temp/temp, three-value rails, NVENC0 off",
            e().ts("07-25-2026 09:08:28")
                .ram(20642.0, 62817.0, 1, 2.0)
                .cpus(&[
                    Some((23, 2201)),
                    Some((10, 2201)),
                    Some((4, 2201)),
                    Some((14, 2201)),
                    Some((30, 2201)),
                    Some((18, 2201)),
                    Some((10, 2201)),
                    Some((10, 2201)),
                    Some((33, 2201)),
                    Some((7, 2201)),
                    Some((5, 2201)),
                    Some((27, 2201)),
                ])
                .emc(Some(3), Some(3199))
                .gr3d(Some(12), per_gpc(&[1300, 1300]))
                .off(&[
                    "NVENC0",
                    "NVDEC0",
                    "NVJPG0",
                    "NVJPG1",
                    "VIC",
                    "OFA",
                    "NVDLA0",
                    "NVDLA1",
                    "PVA0_FREQ",
                ])
                .engine("APE", None, Some(174))
                .temps(&[
                    ("cpu", 52.968),
                    ("soc2", 48.406),
                    ("soc0", 49.531),
                    ("gpu", 47.625),
                ])
                .peaks(&[
                    ("cpu", 52.968),
                    ("soc2", 48.406),
                    ("soc0", 49.531),
                    ("gpu", 47.625),
                ])
                .rails3(&[
                    ("VDD_GPU_SOC", 5139, 5139, 5139),
                    ("VDD_CPU_CV", 3268, 3268, 3268),
                    ("VIN_SYS_5V0", 5500, 5500, 5500),
                ]),
        ),
        (
            59,
            "AGX Thor, JetPack 7.2 non-root: plain temps, three-value rails",
            e().ts("07-02-2026 13:45:44")
                .ram(36529.0, 125749.0, 12, 4.0)
                .swap(11.0, 4096.0, 9.0)
                .cpus_at(&[2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2], 972)
                .temps(&[
                    ("cpu", 60.406),
                    ("tj", 63.281),
                    ("soc012", 58.468),
                    ("gpu", 62.906),
                    ("soc345", 63.281),
                ])
                .rails3(&[
                    ("VDD_GPU", 37528, 37528, 37528),
                    ("VDD_CPU_SOC_MSS", 18961, 18961, 18961),
                    ("VIN_SYS_5V0", 18331, 18331, 18331),
                    ("VIN", 87426, 43713, 87426),
                ]),
        ),
        (
            32,
            "Tegra X1 board with Charger/max170xx zones, no EMC",
            e().ram(2594.0, 3483.0, 2, 2.0)
                .swap(366.0, 4096.0, 14.0)
                .cpus_at(&[9, 9, 12, 8], 306)
                .gr3d(Some(2), None)
                .temps(&[
                    ("LCPU", 36.5),
                    ("CPU", 33.0),
                    ("Charger", 115.0),
                    ("Tdiode", 40.0),
                    ("PLL", 32.0),
                    ("GPU", 32.5),
                    ("thermal", 39.0),
                    ("AO", 41.5),
                    ("max170xx", 38.9),
                    ("PMIC", 100.0),
                    ("Tboard", 39.0),
                ]),
        ),
    ]
}

#[test]
fn representative_lines_have_exact_values() {
    let cases = cases();
    // At least one line per generation.
    for generation in [
        "TK1",
        "TX1",
        "TX2",
        "Nano",
        "Xavier",
        "Orin",
        "Thor",
        "JetPack 7.2",
    ] {
        assert!(
            cases.iter().any(|(_, what, _)| what.contains(generation)),
            "no case for {generation}"
        );
    }
    for (id, what, expected) in cases {
        let line = common::line(id);
        let got = parse_line(line).unwrap_or_else(|e| panic!("row {id} ({what}): {e}"));
        assert_eq!(got, expected.0, "row {id}: {what}");
    }
}

#[test]
fn lfb_block_of_512_kb_is_half_a_megabyte() {
    let s = parse_line(common::line(5)).unwrap();
    assert_eq!(s.ram.and_then(|r| r.lfb_block_mb), Some(0.5));
}

#[test]
fn helpers_on_real_lines() {
    let xavier = parse_line(common::line(2)).unwrap();
    assert_eq!(xavier.cpu_count(), 8);
    assert_eq!(xavier.online_cpu_count(), 4);
    let measured: Vec<_> = xavier.measured_temps().map(|(n, _)| n).collect();
    assert!(!measured.contains(&"PMIC"));
    assert_eq!(measured.len(), xavier.temps_c.len() - 1);

    let jp5 = parse_line(common::line(52)).unwrap();
    assert_eq!(jp5.engine("VIC").and_then(|e| e.freq_mhz), Some(729));
    let jp6 = parse_line(common::line(7)).unwrap();
    assert_eq!(jp6.engine("VIC").and_then(|e| e.freq_mhz), Some(115));
    let thor = parse_line(common::line(10)).unwrap();
    assert_eq!(thor.engine("NVENC0").and_then(|e| e.freq_mhz), Some(0));
    assert_eq!(
        thor.gr3d.and_then(|g| g.freq_mhz).and_then(|f| f.max()),
        Some(0)
    );
    let orin = parse_line(common::line(31)).unwrap();
    assert_eq!(
        orin.gr3d
            .and_then(|g| g.freq_mhz)
            .map(|f| f.as_slice().to_vec()),
        Some(vec![305, 305])
    );
}
