//! The Jetson state collector: the module's identity (`/proc/device-tree/model`), its L4T
//! release (`/etc/nv_tegra_release`) and the JetPack it belongs to, the nvpmodel power mode
//! (`/var/lib/nvpmodel/status` with names from `/etc/nvpmodel.conf`, else `nvpmodel -q` at
//! most once a minute), and throttling as `jetson_throttle` points: GPU clock against its
//! current and hardware maximum (devfreq), CPU clocks against theirs (cpufreq), thermal trip
//! points passed, and the over-current counters and alarms of the INA3221/INA238 hwmon
//! drivers. A power-mode change is an `edgewatch_event,event=power_mode` point.
//!
//! Everything is read from files under a configurable root (`[jetson] root`, `/` on a
//! device; tests point it at a fake tree in a temp dir); the parsers are pure functions of
//! file contents. It never changes a clock or a power mode, never spawns anything but
//! `nvpmodel -q` (only without a status file, at most once a minute, 5 s timeout), and on a
//! machine that is not a Jetson (no `nv_tegra_release` and no "Jetson"/"NVIDIA" device-tree
//! model) it logs one line and stays off.
//!
//! `jetson_throttle`, tags `module`, `l4t`, `power_mode` (name, else id): `gpu_freq_mhz`,
//! `gpu_max_mhz` (devfreq `max_freq`: the cap now, set by the power mode or thermal
//! management), `gpu_hw_max_mhz` (highest of `available_frequencies`), `gpu_capped` (the cap
//! below the hardware maximum); `cpu_freq_mhz` (highest current over the policies),
//! `cpu_capped` (a policy's `scaling_max_freq` below its `cpuinfo_max_freq`); `thermal_trips`
//! (trip points of type passive, hot or critical at or below their zone's temperature);
//! `oc_events` (sum of the `oc*_event_cnt` counters), `current_alarms` (`curr*_crit_alarm`,
//! `curr*_max_alarm`, `in*_crit_alarm` set); `power_mode_id`; `throttled` (a trip passed,
//! an alarm set, or an over-current counter grew since the previous sample).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::config::values::Interval;
use crate::model::{series_key, Batch, Line, Value};
use crate::queue::IngestHandle;
use crate::stats::Stats;

/// `[jetson]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JetsonConfig {
    /// Whether the collector runs (it stays off by itself on other machines).
    pub enabled: bool,
    /// Sampling interval.
    pub interval: Interval,
    /// Where `/proc`, `/sys`, `/etc` and `/var` are found.
    pub root: PathBuf,
    /// The `nvpmodel` binary, used only when no status file exists.
    pub nvpmodel: PathBuf,
}

impl Default for JetsonConfig {
    fn default() -> Self {
        JetsonConfig {
            enabled: true,
            interval: Interval(Duration::from_secs(5)),
            root: PathBuf::from("/"),
            nvpmodel: PathBuf::from("/usr/sbin/nvpmodel"),
        }
    }
}

/// What a Jetson is and how it is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Identity {
    /// `/proc/device-tree/model`, e.g. `NVIDIA Jetson Orin Nano Developer Kit`.
    pub module: Option<String>,
    /// L4T release, e.g. `36.3.0`.
    pub l4t: Option<String>,
    /// JetPack, where the L4T release maps to one.
    pub jetpack: Option<String>,
    /// nvpmodel mode id.
    pub power_mode_id: Option<u32>,
    /// nvpmodel mode name, e.g. `15W`, `MAXN`.
    pub power_mode: Option<String>,
}

impl Identity {
    /// Whether this looks like a Jetson at all.
    pub fn is_jetson(&self) -> bool {
        self.l4t.is_some()
            || self
                .module
                .as_deref()
                .is_some_and(|m| m.contains("Jetson") || m.contains("NVIDIA"))
    }

    /// The power mode as a tag value: its name, else its id.
    pub fn power_mode_tag(&self) -> Option<String> {
        self.power_mode
            .clone()
            .or_else(|| self.power_mode_id.map(|i| i.to_string()))
    }
}

/// The device-tree model: NUL-terminated in the file.
pub fn parse_model(text: &str) -> Option<String> {
    let m = text.trim_end_matches('\0').trim();
    (!m.is_empty()).then(|| m.to_string())
}

/// `# R36 (release), REVISION: 3.0, GCID: ...` -> `36.3.0`.
pub fn parse_l4t(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.trim_start().starts_with("# R"))?;
    let major: String = line
        .trim_start()
        .strip_prefix("# R")?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let rev = line.split("REVISION:").nth(1)?.split(',').next()?.trim();
    if major.is_empty() || rev.is_empty() || !rev.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    let rev = if rev.matches('.').count() == 0 {
        format!("{rev}.0")
    } else {
        rev.to_string()
    };
    Some(format!("{major}.{rev}"))
}

/// The JetPack release of an L4T release (NVIDIA's release notes); `None` when unknown.
pub fn jetpack_of(l4t: &str) -> Option<&'static str> {
    Some(match l4t {
        "32.7.1" => "4.6.1",
        "32.7.2" => "4.6.2",
        "32.7.3" => "4.6.3",
        "32.7.4" => "4.6.4",
        "32.7.5" => "4.6.5",
        "35.1.0" => "5.0.2",
        "35.2.1" => "5.1",
        "35.3.1" => "5.1.1",
        "35.4.1" => "5.1.2",
        "35.5.0" => "5.1.3",
        "35.6.0" => "5.1.4",
        "36.3.0" => "6.0",
        "36.4.0" => "6.1",
        "36.4.3" => "6.2",
        "36.4.4" => "6.2.1",
        _ => return None,
    })
}

/// `/var/lib/nvpmodel/status` (`pmode:0002 fmode:quiet`) -> the mode id.
pub fn parse_nvpmodel_status(text: &str) -> Option<u32> {
    text.split_ascii_whitespace()
        .find_map(|t| t.strip_prefix("pmode:"))
        .and_then(|v| v.parse().ok())
}

/// The name of mode `id` in `/etc/nvpmodel.conf` (`< POWER_MODEL ID=2 NAME=15W >`).
pub fn mode_name(conf: &str, id: u32) -> Option<String> {
    conf.lines().find_map(|l| {
        let l = l.trim();
        let body = l.strip_prefix('<')?.strip_suffix('>')?.trim();
        let rest = body.strip_prefix("POWER_MODEL")?;
        let mut found_id = None;
        let mut name = None;
        for kv in rest.split_ascii_whitespace() {
            if let Some(v) = kv.strip_prefix("ID=") {
                found_id = v.parse::<u32>().ok();
            } else if let Some(v) = kv.strip_prefix("NAME=") {
                name = Some(v.to_string());
            }
        }
        (found_id == Some(id)).then_some(name).flatten()
    })
}

/// `nvpmodel -q` output (`NV Power Mode: 15W` then the id on its own line).
pub fn parse_nvpmodel_query(text: &str) -> (Option<String>, Option<u32>) {
    let name = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("NV Power Mode:"))
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty());
    let id = text.lines().find_map(|l| l.trim().parse::<u32>().ok());
    (name, id)
}

/// Throttling state from one read of the tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Throttle {
    /// GPU clock now, MHz.
    pub gpu_freq_mhz: Option<f64>,
    /// GPU cap now, MHz.
    pub gpu_max_mhz: Option<f64>,
    /// GPU hardware maximum, MHz.
    pub gpu_hw_max_mhz: Option<f64>,
    /// Highest CPU clock now, MHz.
    pub cpu_freq_mhz: Option<f64>,
    /// A CPU policy capped below its hardware maximum.
    pub cpu_capped: Option<bool>,
    /// Trip points passed.
    pub thermal_trips: u32,
    /// Sum of over-current event counters, when any exists.
    pub oc_events: Option<u64>,
    /// Current alarms set, when any alarm file exists.
    pub current_alarms: Option<u32>,
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn read_num(p: &Path) -> Option<f64> {
    read(p)?.trim().parse().ok()
}

fn dirs(p: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(p)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The Jetson GPU's devfreq device names (Orin `ga10b`, Xavier `gv11b`, TX2 `gp10b`, Nano
/// and TX1 `gm20b` or `gpu`).
fn is_gpu_devfreq(name: &str) -> bool {
    ["ga10b", "gv11b", "gp10b", "gm20b", ".gpu", "gpu"]
        .iter()
        .any(|n| name.ends_with(n))
}

/// Reads the identity under `root`.
pub fn read_identity(root: &Path) -> Identity {
    let module = read(&root.join("proc/device-tree/model")).and_then(|t| parse_model(&t));
    let l4t = read(&root.join("etc/nv_tegra_release")).and_then(|t| parse_l4t(&t));
    let jetpack = l4t.as_deref().and_then(jetpack_of).map(str::to_string);
    let power_mode_id =
        read(&root.join("var/lib/nvpmodel/status")).and_then(|t| parse_nvpmodel_status(&t));
    let power_mode = power_mode_id
        .and_then(|id| read(&root.join("etc/nvpmodel.conf")).and_then(|conf| mode_name(&conf, id)));
    Identity {
        module,
        l4t,
        jetpack,
        power_mode_id,
        power_mode,
    }
}

/// Reads the throttling state under `root`.
pub fn read_throttle(root: &Path) -> Throttle {
    let mut t = Throttle::default();
    let sys = root.join("sys");
    let mhz = |hz: f64| hz / 1e6;
    for d in dirs(&sys.join("class/devfreq")) {
        if !is_gpu_devfreq(&name_of(&d)) {
            continue;
        }
        t.gpu_freq_mhz = read_num(&d.join("cur_freq")).map(mhz);
        t.gpu_max_mhz = read_num(&d.join("max_freq")).map(mhz);
        t.gpu_hw_max_mhz = read(&d.join("available_frequencies")).and_then(|s| {
            s.split_ascii_whitespace()
                .filter_map(|v| v.parse::<f64>().ok())
                .reduce(f64::max)
                .map(mhz)
        });
        break;
    }
    for d in dirs(&sys.join("devices/system/cpu/cpufreq")) {
        if !name_of(&d).starts_with("policy") {
            continue;
        }
        if let Some(cur) = read_num(&d.join("scaling_cur_freq")) {
            let cur = cur / 1e3;
            t.cpu_freq_mhz = Some(t.cpu_freq_mhz.map_or(cur, |c: f64| c.max(cur)));
        }
        if let (Some(max), Some(hw)) = (
            read_num(&d.join("scaling_max_freq")),
            read_num(&d.join("cpuinfo_max_freq")),
        ) {
            t.cpu_capped = Some(t.cpu_capped.unwrap_or(false) || max < hw);
        }
    }
    for z in dirs(&sys.join("class/thermal")) {
        if !name_of(&z).starts_with("thermal_zone") {
            continue;
        }
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
        for f in dirs(&h) {
            let name = name_of(&f);
            if name.starts_with("oc") && name.ends_with("_event_cnt") {
                if let Some(v) = read_num(&f) {
                    *t.oc_events.get_or_insert(0) += v.max(0.0) as u64;
                }
            } else if (name.starts_with("curr") || name.starts_with("in"))
                && (name.ends_with("_crit_alarm") || name.ends_with("_max_alarm"))
            {
                if let Some(v) = read_num(&f) {
                    *t.current_alarms.get_or_insert(0) += u32::from(v > 0.0);
                }
            }
        }
    }
    t
}

/// The `jetson_throttle` line for a reading; `prev_oc` is the previous over-current total.
pub fn throttle_line(id: &Identity, t: &Throttle, prev_oc: Option<u64>, ts: i64) -> Line {
    let mut tags: Vec<(&str, String)> = Vec::new();
    if let Some(m) = &id.module {
        tags.push(("module", m.clone()));
    }
    if let Some(l) = &id.l4t {
        tags.push(("l4t", l.clone()));
    }
    if let Some(p) = id.power_mode_tag() {
        tags.push(("power_mode", p));
    }
    let tag_refs: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut fields: Vec<(String, Value)> = Vec::new();
    let mut f = |k: &str, v: Value| fields.push((k.to_string(), v));
    for (k, v) in [
        ("gpu_freq_mhz", t.gpu_freq_mhz),
        ("gpu_max_mhz", t.gpu_max_mhz),
        ("gpu_hw_max_mhz", t.gpu_hw_max_mhz),
        ("cpu_freq_mhz", t.cpu_freq_mhz),
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
    if let Some(oc) = t.oc_events {
        f(
            "oc_events",
            Value::I64(i64::try_from(oc).unwrap_or(i64::MAX)),
        );
    }
    if let Some(a) = t.current_alarms {
        f("current_alarms", Value::I64(i64::from(a)));
    }
    if let Some(id) = id.power_mode_id {
        f("power_mode_id", Value::I64(i64::from(id)));
    }
    let oc_grew = matches!((prev_oc, t.oc_events), (Some(a), Some(b)) if b > a);
    let throttled = t.thermal_trips > 0 || t.current_alarms.unwrap_or(0) > 0 || oc_grew;
    f("throttled", Value::Bool(throttled));
    Line {
        key: series_key("jetson_throttle", &tag_refs),
        fields,
        ts,
        line_no: 0,
    }
}

/// The `edgewatch_event,event=power_mode` point for a change from `old` to `new`.
pub fn power_mode_event(old: &Identity, new: &Identity, ts: i64) -> Line {
    let s = |i: &Identity| Value::Str(i.power_mode_tag().unwrap_or_default());
    Line {
        key: series_key("edgewatch_event", &[("event", "power_mode")]),
        fields: vec![("from".into(), s(old)), ("to".into(), s(new))],
        ts,
        line_no: 0,
    }
}

/// The collector's state between samples.
pub struct JetsonCollector {
    root: PathBuf,
    nvpmodel: PathBuf,
    identity: Identity,
    prev_oc: Option<u64>,
    last_query: Option<Instant>,
}

impl JetsonCollector {
    /// A collector reading under `root`.
    pub fn new(root: &Path, nvpmodel: &Path) -> JetsonCollector {
        JetsonCollector {
            root: root.to_path_buf(),
            nvpmodel: nvpmodel.to_path_buf(),
            identity: Identity::default(),
            prev_oc: None,
            last_query: None,
        }
    }

    /// The identity as last read.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The power mode from `nvpmodel -q` when there is no status file: at most once a
    /// minute, else the last one read.
    fn query_mode(&mut self, id: &mut Identity) {
        if id.power_mode_id.is_some() || !self.nvpmodel.is_file() {
            return;
        }
        if self
            .last_query
            .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
        {
            id.power_mode_id = self.identity.power_mode_id;
            id.power_mode.clone_from(&self.identity.power_mode);
            return;
        }
        self.last_query = Some(Instant::now());
        let out = std::process::Command::new(&self.nvpmodel)
            .arg("-q")
            .stdin(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let (name, mode) = parse_nvpmodel_query(&String::from_utf8_lossy(&o.stdout));
                id.power_mode = name;
                id.power_mode_id = mode;
            }
            Ok(o) => tracing::debug!(status = %o.status, "nvpmodel -q failed"),
            Err(e) => tracing::debug!(error = %e, "nvpmodel -q could not run"),
        }
    }

    /// One sample: the throttle point, and a power-mode event when the mode changed.
    pub fn sample(&mut self, ts: i64) -> Batch {
        let mut id = read_identity(&self.root);
        self.query_mode(&mut id);
        let t = read_throttle(&self.root);
        let mut lines = Vec::new();
        if self.identity.is_jetson() && id.power_mode_tag() != self.identity.power_mode_tag() {
            tracing::info!(from = ?self.identity.power_mode_tag(), to = ?id.power_mode_tag(), "power mode changed");
            lines.push(power_mode_event(&self.identity, &id, ts));
        }
        lines.push(throttle_line(&id, &t, self.prev_oc, ts));
        self.prev_oc = t.oc_events;
        self.identity = id;
        Batch { lines }
    }
}

/// Runs the collector until shutdown; off (one log line) on a machine that is not a Jetson.
pub async fn run(
    cfg: JetsonConfig,
    handle: IngestHandle,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) {
    let mut collector = JetsonCollector::new(&cfg.root, &cfg.nvpmodel);
    let id = read_identity(&cfg.root);
    if !id.is_jetson() {
        tracing::info!(root = %cfg.root.display(), "jetson collector off: not a Jetson (no nv_tegra_release, no Jetson device-tree model)");
        return;
    }
    tracing::info!(module = ?id.module, l4t = ?id.l4t, jetpack = ?id.jetpack, "jetson collector started");
    let mut ticker = crate::periodic::Ticker::new(cfg.interval.0);
    while ticker.next(&shutdown).await.is_some() {
        // A few dozen small sysfs files (and rarely nvpmodel -q): off the async threads.
        let (c, batch) = match tokio::task::spawn_blocking(move || {
            let b = collector.sample(crate::now_ns());
            (collector, b)
        })
        .await
        {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "jetson sample failed");
                return;
            }
        };
        collector = c;
        super::submit(&handle, &stats, batch, "jetson");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// An Orin Nano (JetPack 6) laid out as the Jetson Linux Developer Guide describes
    /// (device-tree model, nv_tegra_release, nvpmodel status and conf, devfreq `ga10b`,
    /// cpufreq policies, thermal zones with trips, an INA3221 hwmon with alarms and an
    /// over-current counter). Not checked on a device.
    fn orin_nano(root: &Path) {
        put(
            root,
            "proc/device-tree/model",
            "NVIDIA Jetson Orin Nano Developer Kit\0",
        );
        put(root, "etc/nv_tegra_release", "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, DATE: Mon May  6 17:34:21 UTC 2024\n# KERNEL_VARIANT: oot\n");
        put(root, "var/lib/nvpmodel/status", "pmode:0000 fmode:quiet\n");
        put(root, "etc/nvpmodel.conf", "< PARAM TYPE=FILE NAME=CPU_ONLINE >\n< POWER_MODEL ID=0 NAME=15W >\nCPU_ONLINE CORE_0 1\n< POWER_MODEL ID=1 NAME=7W >\n");
        let gpu = "sys/class/devfreq/17000000.ga10b";
        put(root, &format!("{gpu}/cur_freq"), "306000000\n");
        put(root, &format!("{gpu}/max_freq"), "624750000\n");
        put(
            root,
            &format!("{gpu}/available_frequencies"),
            "306000000 408000000 510000000 612000000 624750000\n",
        );
        for (p, cur, max) in [(0, 1510400, 1510400), (4, 729600, 1510400)] {
            let d = format!("sys/devices/system/cpu/cpufreq/policy{p}");
            put(root, &format!("{d}/scaling_cur_freq"), &format!("{cur}\n"));
            put(root, &format!("{d}/scaling_max_freq"), &format!("{max}\n"));
            put(root, &format!("{d}/cpuinfo_max_freq"), "1510400\n");
        }
        let z = "sys/class/thermal/thermal_zone0";
        put(root, &format!("{z}/type"), "cpu-thermal\n");
        put(root, &format!("{z}/temp"), "52000\n");
        put(root, &format!("{z}/trip_point_0_type"), "passive\n");
        put(root, &format!("{z}/trip_point_0_temp"), "99000\n");
        put(root, &format!("{z}/trip_point_1_type"), "critical\n");
        put(root, &format!("{z}/trip_point_1_temp"), "104500\n");
        let h = "sys/class/hwmon/hwmon1";
        put(root, &format!("{h}/name"), "ina3221\n");
        put(root, &format!("{h}/curr1_crit_alarm"), "0\n");
        put(root, &format!("{h}/curr1_max_alarm"), "0\n");
        put(root, &format!("{h}/oc1_event_cnt"), "0\n");
    }

    #[test]
    fn identity_of_an_orin_nano() {
        let dir = tempfile::tempdir().unwrap();
        orin_nano(dir.path());
        let id = read_identity(dir.path());
        assert_eq!(
            id.module.as_deref(),
            Some("NVIDIA Jetson Orin Nano Developer Kit")
        );
        assert_eq!(id.l4t.as_deref(), Some("36.3.0"));
        assert_eq!(id.jetpack.as_deref(), Some("6.0"));
        assert_eq!(
            (id.power_mode_id, id.power_mode.as_deref()),
            (Some(0), Some("15W"))
        );
        assert!(id.is_jetson());
        // An empty tree is not a Jetson.
        let empty = tempfile::tempdir().unwrap();
        assert!(!read_identity(empty.path()).is_jetson());
    }

    #[test]
    fn parsers() {
        assert_eq!(
            parse_l4t("# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref\n")
                .as_deref(),
            Some("35.4.1")
        );
        assert_eq!(parse_l4t("garbage"), None);
        assert_eq!(
            parse_nvpmodel_query("NV Power Mode: MAXN\n0\n"),
            (Some("MAXN".into()), Some(0))
        );
        assert_eq!(parse_nvpmodel_status("pmode:0003 fmode:cool"), Some(3));
        assert_eq!(jetpack_of("99.0.0"), None);
    }

    fn field<'a>(l: &'a Line, k: &str) -> Option<&'a Value> {
        l.fields.iter().find(|f| f.0 == k).map(|f| &f.1)
    }

    #[test]
    fn throttle_from_a_capped_devfreq_and_a_staged_over_current_counter() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        orin_nano(root);
        let mut c = JetsonCollector::new(root, &root.join("no-nvpmodel"));
        let b = c.sample(1);
        let l = b.lines.last().unwrap();
        assert_eq!(
            l.key,
            "jetson_throttle,l4t=36.3.0,module=NVIDIA\\ Jetson\\ Orin\\ Nano\\ Developer\\ Kit,power_mode=15W"
        );
        assert_eq!(field(l, "gpu_freq_mhz"), Some(&Value::F64(306.0)));
        assert_eq!(field(l, "gpu_hw_max_mhz"), Some(&Value::F64(624.75)));
        assert_eq!(field(l, "gpu_capped"), Some(&Value::Bool(false)));
        assert_eq!(field(l, "cpu_freq_mhz"), Some(&Value::F64(1510.4)));
        assert_eq!(field(l, "cpu_capped"), Some(&Value::Bool(false)));
        assert_eq!(field(l, "throttled"), Some(&Value::Bool(false)));
        assert_eq!(b.lines.len(), 1, "no event on the first sample");

        // Capped devfreq, an over-current event, a passed trip point, a mode change.
        let gpu = "sys/class/devfreq/17000000.ga10b";
        put(root, &format!("{gpu}/max_freq"), "408000000\n");
        put(root, "sys/class/hwmon/hwmon1/oc1_event_cnt", "2\n");
        put(
            root,
            "sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq",
            "729600\n",
        );
        put(root, "var/lib/nvpmodel/status", "pmode:0001 fmode:quiet\n");
        let b = c.sample(2);
        assert_eq!(b.lines.len(), 2);
        let ev = &b.lines[0];
        assert_eq!(ev.key, "edgewatch_event,event=power_mode");
        assert_eq!(field(ev, "from"), Some(&Value::Str("15W".into())));
        assert_eq!(field(ev, "to"), Some(&Value::Str("7W".into())));
        let l = &b.lines[1];
        assert!(l.key.ends_with("power_mode=7W"), "{}", l.key);
        assert_eq!(field(l, "gpu_max_mhz"), Some(&Value::F64(408.0)));
        assert_eq!(field(l, "gpu_capped"), Some(&Value::Bool(true)));
        assert_eq!(field(l, "cpu_capped"), Some(&Value::Bool(true)));
        assert_eq!(field(l, "oc_events"), Some(&Value::I64(2)));
        assert_eq!(field(l, "throttled"), Some(&Value::Bool(true)));
        // The counter stays: no longer throttled; a passed trip point is.
        let b = c.sample(3);
        assert_eq!(field(&b.lines[0], "throttled"), Some(&Value::Bool(false)));
        put(root, "sys/class/thermal/thermal_zone0/temp", "99500\n");
        let b = c.sample(4);
        assert_eq!(field(&b.lines[0], "thermal_trips"), Some(&Value::I64(1)));
        assert_eq!(field(&b.lines[0], "throttled"), Some(&Value::Bool(true)));
    }
}
