//! Throttling as `jetson_throttle` points, from files: the GPU clock against its current
//! cap and its hardware maximum (devfreq `cur_freq`, `max_freq`, `available_frequencies`)
//! and its load where the node has one (from the source `gpu.rs` chose),
//! the CPU clocks against theirs (cpufreq `scaling_cur_freq`, `scaling_max_freq`,
//! `cpuinfo_max_freq`), thermal trip points passed (`thermal_zone*/trip_point_*`), the
//! over-current event counters of the `soctherm_oc` hwmon (`oc<N>_event_cnt`: OC1 under
//! voltage, OC2 average and OC3 instantaneous over-current on Orin) and the alarms of the
//! INA3221/INA238 power monitors (`curr*_crit_alarm`, `curr*_max_alarm`, ...). Reading only;
//! it never changes a clock.

use std::path::Path;

use crate::model::{series_key, Line, Value};

use super::fs::{dirs, gpu_devfreq_nodes, name_of, read, read_num};
use super::gpu::GpuReading;
use super::identity::Identity;

/// Throttling state from one read of the tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Throttle {
    /// GPU clock now, MHz.
    pub gpu_freq_mhz: Option<f64>,
    /// GPU cap now, MHz.
    pub gpu_max_mhz: Option<f64>,
    /// GPU hardware maximum, MHz.
    pub gpu_hw_max_mhz: Option<f64>,
    /// GPU load from its devfreq node, %.
    pub gpu_load_pct: Option<f64>,
    /// Highest CPU clock now, MHz.
    pub cpu_freq_mhz: Option<f64>,
    /// Highest CPU cap now (`scaling_max_freq`), MHz.
    pub cpu_max_mhz: Option<f64>,
    /// Highest CPU hardware maximum (`cpuinfo_max_freq`), MHz.
    pub cpu_hw_max_mhz: Option<f64>,
    /// A CPU policy capped below its hardware maximum.
    pub cpu_capped: Option<bool>,
    /// Trip points passed.
    pub thermal_trips: u32,
    /// Over-current counters `(N, count)` of `oc<N>_event_cnt`, in order.
    pub oc_counters: Vec<(u32, u64)>,
    /// Power-monitor alarms set, when any alarm file exists.
    pub current_alarms: Option<u32>,
}

impl Throttle {
    /// Sum of the over-current counters, when any exists.
    pub fn oc_events(&self) -> Option<u64> {
        (!self.oc_counters.is_empty()).then(|| {
            self.oc_counters
                .iter()
                .map(|c| c.1)
                .fold(0u64, u64::saturating_add)
        })
    }
}

/// Whether an hwmon file is a power monitor's alarm: `curr*`, `in*` or `power*` with
/// `_crit_alarm`, `_max_alarm`, `_lcrit_alarm` or `_min_alarm` (under-voltage).
fn is_alarm(name: &str) -> bool {
    (name.starts_with("curr") || name.starts_with("in") || name.starts_with("power"))
        && ["_crit_alarm", "_max_alarm", "_lcrit_alarm", "_min_alarm"]
            .iter()
            .any(|s| name.ends_with(s))
}

/// `oc3_event_cnt` -> 3.
fn oc_index(name: &str) -> Option<u32> {
    name.strip_prefix("oc")?
        .strip_suffix("_event_cnt")?
        .parse()
        .ok()
}

/// Reads the throttling state under `root`, the GPU from its best devfreq node.
pub fn read_throttle(root: &Path) -> Throttle {
    let gpu = gpu_devfreq_nodes(root)
        .iter()
        .find_map(|n| super::gpu::read_node(n));
    read_throttle_with(root, gpu)
}

/// Reads the throttling state under `root` with the GPU as read from its chosen source
/// ([`super::gpu::GpuProbe`]).
pub fn read_throttle_with(root: &Path, gpu: Option<GpuReading>) -> Throttle {
    let mut t = Throttle::default();
    let sys = root.join("sys");
    if let Some(g) = gpu {
        t.gpu_freq_mhz = g.freq_mhz;
        t.gpu_max_mhz = g.max_mhz;
        t.gpu_hw_max_mhz = g.hw_max_mhz;
        t.gpu_load_pct = g.load_pct;
    }
    let highest = |acc: &mut Option<f64>, v: f64| *acc = Some(acc.map_or(v, |c| c.max(v)));
    for d in dirs(&sys.join("devices/system/cpu/cpufreq")) {
        if !name_of(&d).starts_with("policy") {
            continue;
        }
        if let Some(cur) = read_num(&d.join("scaling_cur_freq")) {
            highest(&mut t.cpu_freq_mhz, cur / 1e3);
        }
        let max = read_num(&d.join("scaling_max_freq"));
        let hw = read_num(&d.join("cpuinfo_max_freq"));
        if let Some(max) = max {
            highest(&mut t.cpu_max_mhz, max / 1e3);
        }
        if let Some(hw) = hw {
            highest(&mut t.cpu_hw_max_mhz, hw / 1e3);
        }
        if let (Some(max), Some(hw)) = (max, hw) {
            t.cpu_capped = Some(t.cpu_capped.unwrap_or(false) || max < hw);
        }
    }
    for z in dirs(&sys.join("class/thermal")) {
        if !name_of(&z).starts_with("thermal_zone") {
            continue;
        }
        // A zone whose sensor is off (Orin's GPU zone while the GPU is idle) reads as an
        // error: it passed no trip point.
        let Some(temp) = read_num(&z.join("temp")) else {
            continue;
        };
        for n in 0..32 {
            let Some(kind) = read(&z.join(format!("trip_point_{n}_type"))) else {
                break;
            };
            let hot = matches!(kind.trim(), "passive" | "hot" | "critical");
            if hot && read_num(&z.join(format!("trip_point_{n}_temp"))).is_some_and(|v| temp >= v) {
                t.thermal_trips += 1;
            }
        }
    }
    for h in dirs(&sys.join("class/hwmon")) {
        let chip = read(&h.join("name")).unwrap_or_default();
        let monitor = chip.trim().starts_with("ina");
        for f in dirs(&h) {
            let name = name_of(&f);
            if let Some(n) = oc_index(&name) {
                if let Some(v) = read_num(&f) {
                    t.oc_counters.push((n, v.max(0.0) as u64));
                }
            } else if monitor && is_alarm(&name) {
                if let Some(v) = read_num(&f) {
                    *t.current_alarms.get_or_insert(0) += u32::from(v > 0.0);
                }
            }
        }
    }
    t.oc_counters.sort_unstable();
    t
}

/// The `jetson_throttle` line for a reading; `prev_oc` is the previous over-current total.
/// Tags: the identity's (see [`Identity::tags`]).
pub fn throttle_line(id: &Identity, t: &Throttle, prev_oc: Option<u64>, ts: i64) -> Line {
    let tags = id.tags();
    let tag_refs: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut fields: Vec<(String, Value)> = Vec::new();
    let mut f = |k: &str, v: Value| fields.push((k.to_string(), v));
    for (k, v) in [
        ("gpu_freq_mhz", t.gpu_freq_mhz),
        ("gpu_max_mhz", t.gpu_max_mhz),
        ("gpu_hw_max_mhz", t.gpu_hw_max_mhz),
        ("gpu_load_pct", t.gpu_load_pct),
        ("cpu_freq_mhz", t.cpu_freq_mhz),
        ("cpu_max_mhz", t.cpu_max_mhz),
        ("cpu_hw_max_mhz", t.cpu_hw_max_mhz),
    ] {
        if let Some(v) = v {
            f(k, Value::F64(v));
        }
    }
    if let (Some(max), Some(hw)) = (t.gpu_max_mhz, t.gpu_hw_max_mhz) {
        f("gpu_capped", Value::Bool(max < hw));
    }
    if let Some(c) = t.cpu_capped {
        f("cpu_capped", Value::Bool(c));
    }
    f("thermal_trips", Value::I64(i64::from(t.thermal_trips)));
    let int = |v: u64| Value::I64(i64::try_from(v).unwrap_or(i64::MAX));
    if let Some(oc) = t.oc_events() {
        f("oc_events", int(oc));
    }
    for (n, v) in &t.oc_counters {
        f(&format!("oc{n}_events"), int(*v));
    }
    if let Some(a) = t.current_alarms {
        f("current_alarms", Value::I64(i64::from(a)));
    }
    if let Some(id) = id.power_mode_id {
        f("power_mode_id", Value::I64(i64::from(id)));
    }
    f("throttled", Value::Bool(is_throttled(t, prev_oc)));
    Line {
        key: series_key("jetson_throttle", &tag_refs),
        fields,
        ts,
        line_no: 0,
    }
}

/// A trip point passed, an alarm set, or an over-current counter grew since `prev_oc`.
pub fn is_throttled(t: &Throttle, prev_oc: Option<u64>) -> bool {
    let oc_grew = matches!((prev_oc, t.oc_events()), (Some(a), Some(b)) if b > a);
    t.thermal_trips > 0 || t.current_alarms.unwrap_or(0) > 0 || oc_grew
}
