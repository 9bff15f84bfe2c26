//! The six-step spike routine over the store: for each step, the measurements the agent's
//! collectors and the apps write (names as written by `collect::{health, host, nvml,
//! tegrastats, jetson}` and the `inference` convention), read through [`Gather`] and turned
//! into findings by `snapshot.rs`. Read-only; the ranking and the sentences are not here.

use std::collections::BTreeMap;

use super::gather::{Gather, Pair, Pairs};
use super::snapshot::{self, scope_of, Finding, Split, Step};
use crate::alert::event::Firing;
use crate::engine::EngineError;

/// NVML throttle-reason flags (`gpu` fields) that slow a GPU down, with their words.
const GPU_THROTTLES: [(&str, &str); 5] = [
    ("throttle_sw_thermal", "thermal slowdown"),
    ("throttle_hw_thermal", "hardware thermal slowdown"),
    ("throttle_hw_slowdown", "hardware slowdown"),
    ("throttle_power_cap", "power cap"),
    ("throttle_power_brake", "power brake"),
];

/// `jetson_throttle` flags.
const JETSON_THROTTLES: [(&str, &str); 2] = [
    ("throttled", "throttled"),
    ("gpu_capped", "GPU clock capped"),
];

type Tags = Vec<(String, String)>;

/// The series per-model findings are restricted to: the rule's own tags when it watches
/// `inference`, else the instance's `model` label, else nothing (every model).
pub fn model_scope(f: &Firing) -> Tags {
    if f.measurement.as_deref() == Some("inference") && !f.tags.is_empty() {
        return f.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    }
    f.labels
        .get("model")
        .or_else(|| f.tags.get("model"))
        .map(|m| vec![("model".to_string(), m.clone())])
        .unwrap_or_default()
}

/// The GPU the instance names (`gpu` label), if any.
pub fn gpu_scope(f: &Firing) -> Tags {
    f.labels
        .get("gpu")
        .map(|g| vec![("gpu".to_string(), g.clone())])
        .unwrap_or_default()
}

fn by_tag(pairs: Pairs, key: &str) -> BTreeMap<String, Pair> {
    let mut out: BTreeMap<String, Pair> = BTreeMap::new();
    for (t, p) in pairs {
        out.entry(t.get(key).cloned().unwrap_or_default())
            .or_default()
            .merge(&p);
    }
    out
}

fn scoped(key: &str, v: &str) -> String {
    if v.is_empty() {
        String::new()
    } else {
        format!("{key}={v}")
    }
}

/// The upper value the GPU, contention and thermal steps compare: a spike shorter than the
/// window still moves it, where it would be diluted in a mean.
const UPPER: f64 = 0.95;
/// The lower value clocks compare (a clock drops when throttled).
const LOWER: f64 = 0.05;

/// What the routine found, unranked, and whether each step had data.
pub struct Found {
    /// Every finding comparing the window with the baseline, before ranking.
    pub findings: Vec<Finding>,
    /// The events' findings (over the events' span, no baseline).
    pub event_findings: Vec<Finding>,
    /// The events read.
    pub events: Vec<snapshot::Event>,
    /// Step name -> data was there to compare.
    pub checked: BTreeMap<String, bool>,
    /// Wall vs GPU.
    pub split: Option<Split>,
}

/// Runs the six steps.
pub fn run(g: &Gather<'_>, firing: &Firing) -> Result<Found, EngineError> {
    let mut out = Vec::new();
    let mut checked = BTreeMap::new();
    let models = model_scope(firing);
    let gpus = gpu_scope(firing);

    // 1. Events in the window and just before it.
    let events = g.events(g.events)?;
    checked.insert("events".into(), true);
    let event_findings = snapshot::event_findings(&events);

    // 2. GPU utilisation and memory.
    let mut gpu_data = false;
    for (gpu, p) in by_tag(g.pairs("gpu", "util_gpu_pct", &gpus)?, "gpu") {
        gpu_data = true;
        out.extend(snapshot::points_finding(
            Step::Gpu,
            "gpu.util_gpu_pct",
            &scoped("gpu", &gpu),
            &format!("GPU {gpu} utilization p95"),
            p.base.quantile(UPPER),
            p.win.quantile(UPPER),
        ));
    }
    for (gpu, p) in by_tag(g.pairs("gpu", "mem_used_mb", &gpus)?, "gpu") {
        gpu_data = true;
        out.extend(snapshot::ratio_finding(
            Step::Gpu,
            "gpu.mem_used_mb",
            &scoped("gpu", &gpu),
            &format!("GPU {gpu} memory used p95"),
            p.base.quantile(UPPER),
            p.win.quantile(UPPER),
            false,
        ));
    }
    let gr3d = g.merged("jetson_gpu", "load_pct", &[], |t| !t.contains_key("gpc"))?;
    if gr3d.base.count() + gr3d.win.count() > 0 {
        gpu_data = true;
        out.extend(snapshot::points_finding(
            Step::Gpu,
            "jetson_gpu.load_pct",
            "",
            "GPU (GR3D) load p95",
            gr3d.base.quantile(UPPER),
            gr3d.win.quantile(UPPER),
        ));
    }
    let ram = g.merged("jetson_mem", "ram_used_mb", &[], |_| true)?;
    if ram.base.count() + ram.win.count() > 0 {
        gpu_data = true;
        out.extend(snapshot::ratio_finding(
            Step::Gpu,
            "jetson_mem.ram_used_mb",
            "",
            "shared RAM used p95",
            ram.base.quantile(UPPER),
            ram.win.quantile(UPPER),
            false,
        ));
    }
    checked.insert("gpu".into(), gpu_data);

    // 3. Contention: host CPU and memory, EMC, tegrastats CPU load.
    let mut host_data = false;
    for (key, field, label) in [
        ("host.cpu_pct", "cpu_pct", "host CPU p95"),
        ("host.mem_used_pct", "mem_used_pct", "host memory used p95"),
    ] {
        let p = g.merged("host", field, &[], |_| true)?;
        if p.base.count() + p.win.count() > 0 {
            host_data = true;
        }
        out.extend(snapshot::points_finding(
            Step::Contention,
            key,
            "",
            label,
            p.base.quantile(UPPER),
            p.win.quantile(UPPER),
        ));
    }
    for (m, key, label) in [
        (
            "jetson_emc",
            "jetson_emc.load_pct",
            "EMC (memory controller) load p95",
        ),
        (
            "jetson_cpu",
            "jetson_cpu.load_pct",
            "CPU load (tegrastats) p95",
        ),
    ] {
        let p = g.merged(m, "load_pct", &[], |t| !t.contains_key("core"))?;
        if p.base.count() + p.win.count() > 0 {
            host_data = true;
        }
        out.extend(snapshot::points_finding(
            Step::Contention,
            key,
            "",
            label,
            p.base.quantile(UPPER),
            p.win.quantile(UPPER),
        ));
    }
    checked.insert("contention".into(), host_data);

    // 4. Input size, per model.
    let mut input_data = false;
    for field in ["input_length", "batch_size"] {
        for (model, p) in by_tag(g.pairs("inference", field, &models)?, "model") {
            input_data = true;
            for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
                out.extend(snapshot::ratio_finding(
                    Step::Input,
                    &format!("inference.{field}.{name}"),
                    &scoped("model", &model),
                    &format!("{field} {name}"),
                    p.base.quantile(q),
                    p.win.quantile(q),
                    false,
                ));
            }
        }
    }
    checked.insert("input".into(), input_data);

    // 5. Thermals, throttling, clocks.
    let mut thermal_data = false;
    let temps = by_tag(g.pairs("gpu", "temp_c", &gpus)?, "gpu");
    let mut flags: BTreeMap<String, Vec<(&str, f64, f64)>> = BTreeMap::new();
    for (field, words) in GPU_THROTTLES {
        for (gpu, p) in by_tag(g.pairs("gpu", field, &gpus)?, "gpu") {
            flags.entry(gpu).or_default().push((
                words,
                p.base.mean().unwrap_or(0.0),
                p.win.mean().unwrap_or(0.0),
            ));
        }
    }
    let mut gpu_ids: Vec<&String> = temps.keys().chain(flags.keys()).collect();
    gpu_ids.sort();
    gpu_ids.dedup();
    for gpu in gpu_ids {
        thermal_data = true;
        let t = temps.get(gpu);
        out.extend(snapshot::thermal_finding(
            "gpu.thermal",
            &scoped("gpu", gpu),
            &format!("GPU {gpu} p95"),
            t.and_then(|p| p.base.quantile(UPPER)),
            t.and_then(|p| p.win.quantile(UPPER)),
            flags.get(gpu).map_or(&[][..], |v| &v[..]),
        ));
    }
    for (gpu, p) in by_tag(g.pairs("gpu", "clock_sm_mhz", &gpus)?, "gpu") {
        out.extend(snapshot::ratio_finding(
            Step::Thermal,
            "gpu.clock_sm_mhz",
            &scoped("gpu", &gpu),
            &format!("GPU {gpu} SM clock p5"),
            p.base.quantile(LOWER),
            p.win.quantile(LOWER),
            true,
        ));
    }
    for (zone, p) in by_tag(g.pairs("jetson_temp", "temp_c", &[])?, "zone") {
        thermal_data = true;
        out.extend(snapshot::thermal_finding(
            "jetson_temp.temp_c",
            &scoped("zone", &zone),
            &format!("{zone} zone p95"),
            p.base.quantile(UPPER),
            p.win.quantile(UPPER),
            &[],
        ));
    }
    let mut jflags = Vec::new();
    for (field, words) in JETSON_THROTTLES {
        let p = g.merged("jetson_throttle", field, &[], |_| true)?;
        if p.base.count() + p.win.count() > 0 {
            thermal_data = true;
            jflags.push((
                words,
                p.base.mean().unwrap_or(0.0),
                p.win.mean().unwrap_or(0.0),
            ));
        }
    }
    out.extend(snapshot::thermal_finding(
        "jetson_throttle",
        "",
        "Jetson",
        None,
        None,
        &jflags,
    ));
    let jclock = g.merged("jetson_throttle", "gpu_freq_mhz", &[], |_| true)?;
    out.extend(snapshot::ratio_finding(
        Step::Thermal,
        "jetson_throttle.gpu_freq_mhz",
        "",
        "Jetson GPU clock p5",
        jclock.base.quantile(LOWER),
        jclock.win.quantile(LOWER),
        true,
    ));
    for (t, p) in g.pairs("thermal", "temp_c", &[])? {
        thermal_data = true;
        let zone = t.get("zone").cloned().unwrap_or_default();
        let sensor = t.get("sensor").cloned().unwrap_or_default();
        out.extend(snapshot::thermal_finding(
            "thermal.temp_c",
            &scope_of(&t),
            &format!("{} p95", format!("{zone} {sensor}").trim()),
            p.base.quantile(UPPER),
            p.win.quantile(UPPER),
            &[],
        ));
    }
    checked.insert("thermal".into(), thermal_data);

    // 6. Versions seen in the window vs the baseline.
    let mut version_data = false;
    let mut versions = |m: &str,
                        field: &str,
                        tags: &[(String, String)],
                        key: &str,
                        by: &str,
                        what: &str|
     -> Result<(), EngineError> {
        for (group, (base, win)) in g.tag_values(m, field, tags, key, by)? {
            version_data = true;
            let label = if group.is_empty() {
                what.to_string()
            } else {
                format!("{what} of {by} {group}")
            };
            out.extend(snapshot::version_finding(
                &format!("{m}.{key}"),
                &scoped(by, &group),
                &label,
                &base,
                &win,
            ));
        }
        Ok(())
    };
    versions(
        "inference",
        "wall_ms",
        &models,
        "model_version",
        "model",
        "model_version",
    )?;
    versions(
        "gpu",
        "util_gpu_pct",
        &gpus,
        "driver",
        "gpu",
        "NVIDIA driver",
    )?;
    versions("gpu", "util_gpu_pct", &gpus, "cuda", "gpu", "CUDA version")?;
    versions(
        "jetson_throttle",
        "thermal_trips",
        &[],
        "jetpack",
        "",
        "JetPack",
    )?;
    versions("jetson_throttle", "thermal_trips", &[], "l4t", "", "L4T")?;
    versions(
        "edgewatch_agent",
        "uptime_s",
        &[],
        "version",
        "",
        "edgewatch version",
    )?;
    checked.insert("versions".into(), version_data);

    // The wall-vs-GPU split over the same series.
    let wall = g.merged("inference", "wall_ms", &models, |_| true)?;
    let gpu_ms = g.merged("inference", "gpu_ms", &models, |_| true)?;
    let split = snapshot::split(
        wall.base.mean(),
        wall.win.mean(),
        gpu_ms.base.mean(),
        gpu_ms.win.mean(),
    );
    Ok(Found {
        findings: out,
        event_findings,
        events,
        checked,
        split,
    })
}
