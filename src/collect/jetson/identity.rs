//! What a Jetson is and how it is set, from files: the module (`/proc/device-tree/model`),
//! the L4T release (`/etc/nv_tegra_release`) and its JetPack, the nvpmodel power mode
//! (`/var/lib/nvpmodel/status` named by `/etc/nvpmodel.conf`) and the jetson_clocks state
//! (clocks pinned: cpufreq and GPU devfreq minimum equal to their maximum), and the tags
//! they become on every `jetson_*` point. The parsers are pure functions of file contents;
//! this module reads files and never runs anything (`nvpmodel -q` is the collector's).

use std::path::Path;

use crate::model::{series_key, split_series_key, Line};

use super::fs::{dirs, gpu_devfreq_nodes, name_of, read, read_num};

/// What a Jetson is and how it is set.
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// jetson_clocks: `Some(true)` when every CPU policy and the GPU have their minimum
    /// clock pinned to their maximum; `None` when no clock file could be read.
    pub jetson_clocks: Option<bool>,
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

    /// `on` / `off`, when known.
    pub fn jetson_clocks_tag(&self) -> Option<&'static str> {
        self.jetson_clocks.map(|on| if on { "on" } else { "off" })
    }

    /// The identity tags of every `jetson_*` point: `module`, `l4t`, `jetpack`,
    /// `power_mode` (name, else id), `power_mode_id`, `jetson_clocks`; unknown ones left
    /// out.
    pub fn tags(&self) -> Vec<(&'static str, String)> {
        let mut t = Vec::new();
        let mut add = |k: &'static str, v: Option<String>| {
            if let Some(v) = v.filter(|v| !v.is_empty()) {
                t.push((k, v));
            }
        };
        add("module", self.module.clone());
        add("l4t", self.l4t.clone());
        add("jetpack", self.jetpack.clone());
        add("power_mode", self.power_mode_tag());
        add("power_mode_id", self.power_mode_id.map(|i| i.to_string()));
        add(
            "jetson_clocks",
            self.jetson_clocks_tag().map(str::to_string),
        );
        t
    }
}

/// Adds `tags` to `line` when its measurement starts with `jetson_`, keeping a tag the line
/// already has. Pure.
pub fn tag_line(line: &mut Line, tags: &[(&'static str, String)]) {
    if tags.is_empty() || !line.key.starts_with("jetson_") {
        return;
    }
    let (measurement, mut have) = split_series_key(&line.key);
    let before = have.len();
    for (k, v) in tags {
        if !have.iter().any(|(hk, _)| hk == k) {
            have.push((k.to_string(), v.clone()));
        }
    }
    if have.len() == before {
        return;
    }
    let refs: Vec<(&str, &str)> = have.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    line.key = series_key(&measurement, &refs);
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
        "36.4.7" => "6.2.1",
        "38.2.0" | "38.2.1" | "38.2.2" => "7.0",
        "38.4.0" => "7.1",
        "39.2.0" => "7.2",
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

/// Whether `min == max` for every pair read; `None` when none could be read. Pure.
pub fn pinned(pairs: &[(f64, f64)]) -> Option<bool> {
    (!pairs.is_empty()).then(|| pairs.iter().all(|(min, max)| min >= max))
}

/// The jetson_clocks state under `root`: the (min, max) clock of every cpufreq policy
/// (`scaling_min_freq`, `scaling_max_freq`) and of the GPU's devfreq device (`min_freq`,
/// `max_freq`) — jetson_clocks pins each minimum to its maximum. The EMC clock is left
/// out (its floor is only in BPMP debugfs).
pub fn read_jetson_clocks(root: &Path) -> Option<bool> {
    let sys = root.join("sys");
    let mut pairs = Vec::new();
    for d in dirs(&sys.join("devices/system/cpu/cpufreq")) {
        if !name_of(&d).starts_with("policy") {
            continue;
        }
        if let (Some(min), Some(max)) = (
            read_num(&d.join("scaling_min_freq")),
            read_num(&d.join("scaling_max_freq")),
        ) {
            pairs.push((min, max));
        }
    }
    if let Some(d) = gpu_devfreq_nodes(root).into_iter().next() {
        if let (Some(min), Some(max)) =
            (read_num(&d.join("min_freq")), read_num(&d.join("max_freq")))
        {
            pairs.push((min, max));
        }
    }
    pinned(&pairs)
}

/// Reads the identity under `root` (the power mode from the status file only).
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
        jetson_clocks: read_jetson_clocks(root),
    }
}
