//! Pure mapping: one parsed tegrastats [`Sample`] -> `jetson_*` lines (the table in the
//! collector's module documentation). No IO, no clock: the timestamp is an argument.

use tegrastats_parser::{GpuFreq, Sample};

use crate::model::{series_key, Line, Value};

/// Fields of one line under construction; numbers become floats.
#[derive(Default)]
struct Fields(Vec<(String, Value)>);

impl Fields {
    fn num<T: Into<f64>>(&mut self, name: &str, v: Option<T>) -> &mut Self {
        if let Some(v) = v {
            self.0.push((name.to_string(), Value::F64(v.into())));
        }
        self
    }

    fn flag(&mut self, name: &str, v: bool) -> &mut Self {
        self.0.push((name.to_string(), Value::Bool(v)));
        self
    }

    /// Appends a line with these fields to `out`, unless there are none.
    fn push_to(self, out: &mut Vec<Line>, key: String, ts: i64) {
        if !self.0.is_empty() {
            out.push(Line {
                key,
                fields: self.0,
                ts,
                line_no: 0,
            });
        }
    }
}

/// An engine merged over its printed spellings (`VIC`, `VIC_FREQ`, `VIC_LOAD`).
#[derive(Default)]
struct MergedEngine {
    on: bool,
    load_pct: Option<u32>,
    freq_mhz: Option<u32>,
    unit_loads_pct: Vec<u32>,
}

/// The `engine` tag for a printed engine name: without a trailing `_FREQ` or `_LOAD`.
pub fn engine_tag(printed: &str) -> &str {
    ["_FREQ", "_LOAD"]
        .iter()
        .find_map(|s| printed.strip_suffix(s).filter(|b| !b.is_empty()))
        .unwrap_or(printed)
}

/// Maps one parsed tegrastats sample to `jetson_*` lines stamped `ts` (Unix ns). Pure; see
/// the module documentation for the table.
pub fn sample_to_lines(sample: &Sample, ts: i64) -> Vec<Line> {
    let mut out = Vec::new();

    // jetson_mem
    let mut mem = Fields::default();
    if let Some(ram) = &sample.ram {
        mem.num("ram_used_mb", Some(ram.used_mb))
            .num("ram_total_mb", Some(ram.total_mb))
            .num(
                "ram_used_pct",
                (ram.total_mb > 0.0).then(|| ram.used_mb * 100.0 / ram.total_mb),
            )
            .num("lfb_blocks", ram.lfb_blocks)
            .num("lfb_block_mb", ram.lfb_block_mb);
    }
    if let Some(swap) = &sample.swap {
        mem.num("swap_used_mb", Some(swap.used_mb))
            .num("swap_total_mb", Some(swap.total_mb))
            .num("swap_cached_mb", swap.cached_mb);
    }
    if let Some(iram) = &sample.iram {
        mem.num("iram_used_mb", Some(iram.used_mb))
            .num("iram_total_mb", Some(iram.total_mb))
            .num("iram_lfb_mb", iram.lfb_mb);
    }
    mem.push_to(&mut out, "jetson_mem".into(), ts);

    // jetson_cpu (summary)
    let mut cpu = Fields::default();
    if !sample.cpus.is_empty() {
        let loads: Vec<f64> = sample
            .cpus
            .iter()
            .filter_map(|c| c.and_then(|c| c.load_pct))
            .map(f64::from)
            .collect();
        let mean = (!loads.is_empty()).then(|| loads.iter().sum::<f64>() / loads.len() as f64);
        cpu.num("cores", Some(sample.cpu_count() as f64))
            .num("cores_online", Some(sample.online_cpu_count() as f64))
            .num("load_pct", mean);
    }
    if let Some(mts) = &sample.mts {
        cpu.num("mts_fg_pct", Some(mts.fg_pct))
            .num("mts_bg_pct", Some(mts.bg_pct));
    }
    cpu.num("edp_limit_mhz", sample.edp_limit_mhz);
    cpu.push_to(&mut out, "jetson_cpu".into(), ts);

    // jetson_cpu,core=N
    for (n, core) in sample.cpus.iter().enumerate() {
        let mut f = Fields::default();
        match core {
            Some(c) => {
                f.flag("online", true)
                    .num("load_pct", c.load_pct)
                    .num("freq_mhz", c.freq_mhz);
            }
            None => {
                f.flag("online", false);
            }
        }
        f.push_to(
            &mut out,
            series_key("jetson_cpu", &[("core", &n.to_string())]),
            ts,
        );
    }

    // jetson_emc
    if let Some(emc) = &sample.emc {
        let mut f = Fields::default();
        f.num("load_pct", emc.load_pct)
            .num("freq_mhz", emc.freq_mhz);
        f.push_to(&mut out, "jetson_emc".into(), ts);
    }

    // jetson_gpu, jetson_gpu,gpc=N
    if let Some(gr3d) = &sample.gr3d {
        let mut f = Fields::default();
        f.num("load_pct", gr3d.load_pct)
            .num("freq_mhz", gr3d.freq_mhz.as_ref().and_then(GpuFreq::max));
        f.push_to(&mut out, "jetson_gpu".into(), ts);
        if let Some(GpuFreq::PerGpc(gpcs)) = &gr3d.freq_mhz {
            for (n, mhz) in gpcs.iter().enumerate() {
                let mut f = Fields::default();
                f.num("freq_mhz", Some(*mhz));
                f.push_to(
                    &mut out,
                    series_key("jetson_gpu", &[("gpc", &n.to_string())]),
                    ts,
                );
            }
        }
    }

    // jetson_engine,engine=NAME
    let mut engines: std::collections::BTreeMap<&str, MergedEngine> = Default::default();
    for (name, e) in &sample.engines {
        let m = engines.entry(engine_tag(name)).or_default();
        m.on |= !e.off;
        m.load_pct = m.load_pct.or(e.load_pct);
        m.freq_mhz = m.freq_mhz.or(e.freq_mhz);
        if m.unit_loads_pct.is_empty() {
            m.unit_loads_pct.clone_from(&e.unit_loads_pct);
        }
    }
    for (name, e) in &engines {
        let mut f = Fields::default();
        f.flag("on", e.on);
        if e.on {
            f.num("load_pct", e.load_pct).num("freq_mhz", e.freq_mhz);
        }
        f.push_to(
            &mut out,
            series_key("jetson_engine", &[("engine", *name)]),
            ts,
        );
        for (n, load) in e.unit_loads_pct.iter().enumerate() {
            let mut f = Fields::default();
            f.num("load_pct", Some(*load));
            f.push_to(
                &mut out,
                series_key(
                    "jetson_engine",
                    &[("engine", *name), ("unit", &n.to_string())],
                ),
                ts,
            );
        }
    }

    // jetson_temp,zone=name (lower case, unless two printed names differ only in case)
    let clashes = |name: &str| {
        sample
            .temps_c
            .keys()
            .filter(|k| k.eq_ignore_ascii_case(name))
            .count()
            > 1
    };
    for (name, temp) in sample.measured_temps() {
        let zone = if clashes(name) {
            name.to_string()
        } else {
            name.to_ascii_lowercase()
        };
        let mut f = Fields::default();
        f.num("temp_c", Some(temp))
            .num("peak_c", sample.temps_peak_c.get(name).copied());
        f.push_to(&mut out, series_key("jetson_temp", &[("zone", &zone)]), ts);
    }

    // jetson_power,rail=NAME
    for (name, rail) in &sample.power_mw {
        let mut f = Fields::default();
        f.num("current_mw", Some(rail.current))
            .num("average_mw", Some(rail.average))
            .num("peak_mw", rail.peak);
        f.push_to(
            &mut out,
            series_key("jetson_power", &[("rail", name.as_str())]),
            ts,
        );
    }
    out
}
