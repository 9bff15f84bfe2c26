//! The Jetson state collector (`[jetson]`): the module's identity (`/proc/device-tree/model`),
//! its L4T release (`/etc/nv_tegra_release`) and the JetPack it belongs to, the nvpmodel
//! power mode (`/var/lib/nvpmodel/status` with names from `/etc/nvpmodel.conf`, else
//! `nvpmodel -q` at most once a minute) and the jetson_clocks state (`identity.rs`);
//! throttling as `jetson_throttle` points (`throttle.rs`); per-process GPU memory from the
//! nvmap debugfs client list as `jetson_process` points (`nvmap.rs`). A power-mode or
//! jetson_clocks change is an `edgewatch_event` point (`kind=power_mode`,
//! `event=jetson_clocks`). Where the GPU clock and load come from is chosen by `gpu.rs`
//! (a devfreq node such as Thor's `gpu-gpc-0`, NVML, or none) and chosen again while on a
//! fallback, so a devfreq node that appears after start is picked up; a change is logged
//! once, counted and an `edgewatch_event` (`kind=gpu_source`). The identity is also the tag set of every `jetson_*` point,
//! the tegrastats collector's included ([`JetsonStatus::tag_batch`]), and the
//! `collectors.jetson` object of `/api/v1/status`.
//!
//! Everything is read from files under a configurable root (`[jetson] root`, `/` on a
//! device; tests point it at a fake tree); the parsers are pure functions of file contents.
//! It never changes a clock or a power mode, never spawns anything but `nvpmodel -q` (only
//! without a status file, at most once a minute), and on a machine that is not a Jetson
//! (no `nv_tegra_release` and no "Jetson"/"NVIDIA" device-tree model) it logs one line and
//! stays off. What it cannot find on a Jetson (a file missing or unreadable) it names in
//! one log line at start and in the status, and leaves those fields out.

pub mod config;
mod fs;
pub mod gpu;
pub mod identity;
pub mod nvmap;
pub mod throttle;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::model::{Batch, Line, Value};
use crate::queue::IngestHandle;
use crate::stats::Stats;
use crate::status::StatusCell;

pub use config::JetsonConfig;
pub use gpu::{choose, nvml_answer, Choice, GpuProbe, GpuReading, NvmlAnswer, Source};
pub use identity::{
    jetpack_of, mode_name, parse_l4t, parse_model, parse_nvpmodel_query, parse_nvpmodel_status,
    read_identity, read_jetson_clocks, tag_line, Identity,
};
pub use throttle::{read_throttle, read_throttle_with, throttle_line, Throttle};

/// The collector's live state: the `collectors.jetson` status part and the identity tags
/// that every `jetson_*` point carries. Shared by the collector (which writes it) with the
/// API and the tegrastats collector (which read it).
#[derive(Debug)]
pub struct JetsonStatus(
    StatusCell<Shared>,
    tokio::sync::watch::Sender<bool>,
    crate::collect::gpu_mem::GpuMemByPid,
);

impl Default for JetsonStatus {
    fn default() -> Self {
        let mut s = Shared::default();
        s.status.state = "not started".into();
        JetsonStatus(
            StatusCell::new(s),
            tokio::sync::watch::channel(false).0,
            Default::default(),
        )
    }
}

#[derive(Debug, Clone, Default)]
struct Shared {
    status: crate::status::Jetson,
    tags: Vec<(&'static str, String)>,
}

impl JetsonStatus {
    /// The nvmap per-process memory of the last sample, for the watched-process collector.
    pub fn process_mem(&self) -> &crate::collect::gpu_mem::GpuMemByPid {
        &self.2
    }

    /// A copy of the status part.
    pub fn snapshot(&self) -> crate::status::Jetson {
        self.0.read(|s| s.status.clone())
    }

    /// Records a state (`off: <why>`, `running`). Any state but "not started" settles the
    /// identity (see [`JetsonStatus::settled`]).
    pub fn set_state(&self, state: impl Into<String>) {
        let state = state.into();
        self.0.update(|s| s.status.state = state);
        self.1.send_replace(true);
    }

    /// Waits until the collector has read the identity (or is off), at most `limit`: the
    /// tegrastats collector's first points then carry the identity tags like the rest.
    pub async fn settled(&self, limit: std::time::Duration) {
        let mut rx = self.1.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|s| *s)).await;
    }

    /// Adds the identity tags to every `jetson_*` line of `batch` (none before the
    /// collector has read the identity, or when it is off).
    pub fn tag_batch(&self, batch: &mut Batch) {
        let tags = self.0.read(|s| s.tags.clone());
        if tags.is_empty() {
            return;
        }
        for l in &mut batch.lines {
            tag_line(l, &tags);
        }
    }

    fn set_identity(&self, id: &Identity) {
        self.0.update(|s| {
            s.tags = id.tags();
            let st = &mut s.status;
            st.module.clone_from(&id.module);
            st.l4t.clone_from(&id.l4t);
            st.jetpack.clone_from(&id.jetpack);
            st.power_mode.clone_from(&id.power_mode);
            st.power_mode_id = id.power_mode_id;
            st.jetson_clocks = id.jetson_clocks_tag().map(str::to_string);
        });
        self.1.send_replace(true);
    }

    fn update(&self, f: impl FnOnce(&mut crate::status::Jetson)) {
        self.0.update(|s| f(&mut s.status));
    }
}

/// What a tree lacks, as the names logged and shown in the status. Pure over the reads.
pub fn missing(id: &Identity, t: &Throttle, mode_source: bool) -> Vec<String> {
    let mut m = Vec::new();
    let mut miss = |cond: bool, what: &str| {
        if cond {
            m.push(what.to_string());
        }
    };
    miss(id.module.is_none(), "module (proc/device-tree/model)");
    miss(id.l4t.is_none(), "L4T release (etc/nv_tegra_release)");
    miss(
        id.l4t.is_some() && id.jetpack.is_none(),
        "JetPack (L4T release not in the known list)",
    );
    miss(
        !mode_source,
        "power mode (var/lib/nvpmodel/status, and no nvpmodel binary)",
    );
    miss(
        id.power_mode_id.is_some() && id.power_mode.is_none(),
        "power mode name (etc/nvpmodel.conf)",
    );
    miss(
        id.jetson_clocks.is_none(),
        "jetson_clocks state (no cpufreq or GPU devfreq min/max)",
    );
    miss(
        t.gpu_freq_mhz.is_none(),
        "GPU clock (sys/class/devfreq/<gpu>)",
    );
    miss(
        t.cpu_freq_mhz.is_none(),
        "CPU clocks (sys/devices/system/cpu/cpufreq)",
    );
    miss(
        t.oc_counters.is_empty(),
        "over-current counters (hwmon oc*_event_cnt)",
    );
    miss(
        t.current_alarms.is_none(),
        "power-monitor alarms (hwmon ina*)",
    );
    m
}

/// The collector's state between samples.
pub struct JetsonCollector {
    root: PathBuf,
    nvpmodel: PathBuf,
    processes: bool,
    identity: Identity,
    prev_oc: Option<u64>,
    last_query: Option<Instant>,
    status: Arc<JetsonStatus>,
    gpu: GpuProbe,
    nvml: Option<Arc<crate::collect::nvml::NvmlStatus>>,
}

impl JetsonCollector {
    /// A collector reading under `root`.
    pub fn new(cfg: &JetsonConfig, status: Arc<JetsonStatus>) -> JetsonCollector {
        JetsonCollector {
            root: cfg.root.clone(),
            nvpmodel: cfg.nvpmodel.clone(),
            processes: cfg.processes,
            identity: Identity::default(),
            prev_oc: None,
            last_query: None,
            status,
            gpu: GpuProbe::new(cfg.gpu_reprobe.0),
            nvml: None,
        }
    }

    /// Judges NVML as a GPU source from its collector's status.
    pub fn with_nvml(mut self, nvml: Arc<crate::collect::nvml::NvmlStatus>) -> Self {
        self.nvml = Some(nvml);
        self
    }

    /// The GPU source as chosen by the last sample.
    pub fn gpu_choice(&self) -> Option<&Choice> {
        self.gpu.choice()
    }

    /// Chooses the GPU source when due and reads it; logs, counts and returns an event
    /// line for a change after the first choice.
    fn sample_gpu(&mut self, ts: i64) -> (Option<GpuReading>, Option<Line>) {
        let nvml = self.nvml.clone();
        let answer = move || {
            nvml.map_or(NvmlAnswer::Off("not running in this agent".into()), |s| {
                nvml_answer(&s.snapshot())
            })
        };
        let (reading, switched) = self.gpu.sample(&self.root, answer, Instant::now());
        let mut event = None;
        if let Some((old, new)) = switched {
            match &old {
                None => {
                    tracing::info!(source = %new.label(), reason = %new.reason, "jetson GPU source")
                }
                Some(o) => {
                    tracing::info!(from = %o.label(), to = %new.label(), reason = %new.reason, "jetson GPU source changed");
                    event = Some(change_event(
                        "gpu_source",
                        Some(o.label()),
                        Some(new.label()),
                        ts,
                    ));
                }
            }
        }
        if let Some(c) = self.gpu.choice() {
            let (label, reason, n) = (c.label(), c.reason.clone(), self.gpu.switches);
            let on_devfreq = matches!(c.source, Source::Devfreq(_));
            self.status.update(|s| {
                s.gpu_source = Some(label);
                s.gpu_source_reason = Some(reason);
                s.gpu_source_switches = n;
                if on_devfreq {
                    s.missing.retain(|m| !m.starts_with("GPU clock"));
                }
            });
        }
        (reading, event)
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

    /// Reads the tree once and logs (one line) what it lacks; `false` when it is not a
    /// Jetson.
    pub fn start(&mut self) -> bool {
        let id = read_identity(&self.root);
        if !id.is_jetson() {
            tracing::info!(root = %self.root.display(), "jetson collector off: not a Jetson (no nv_tegra_release, no Jetson device-tree model)");
            self.status.set_state(
                "off: not a Jetson (no etc/nv_tegra_release, no Jetson device-tree model)",
            );
            return false;
        }
        let mode_source = id.power_mode_id.is_some() || self.nvpmodel.is_file();
        let gone = missing(&id, &read_throttle(&self.root), mode_source);
        if !gone.is_empty() {
            tracing::info!(root = %self.root.display(), "jetson: not found or unreadable, left out: {}", gone.join("; "));
        }
        tracing::info!(module = ?id.module, l4t = ?id.l4t, jetpack = ?id.jetpack, power_mode = ?id.power_mode_tag(), jetson_clocks = ?id.jetson_clocks_tag(), "jetson collector started");
        self.status.set_identity(&id);
        self.status.update(|s| {
            s.state = "running".into();
            s.missing = gone;
            s.processes = if self.processes {
                "on".into()
            } else {
                "off: disabled in the configuration".into()
            };
        });
        true
    }

    /// The `jetson_process` lines, or `None` (logged once, then off) when the client list
    /// cannot be read.
    fn processes(&mut self, ts: i64) -> Vec<Line> {
        if !self.processes {
            return Vec::new();
        }
        let path = self.root.join(nvmap::CLIENTS);
        let read = std::fs::read_to_string(&path)
            .or_else(|e| std::fs::read_to_string(self.root.join(nvmap::MAPS)).map_err(|_| e));
        match read {
            Ok(text) => {
                let clients = nvmap::parse_clients(&text);
                self.status
                    .2
                    .publish(ts, clients.iter().map(|c| (c.pid, c.bytes)));
                self.status
                    .update(|s| s.process_count = Some(clients.len() as u64));
                nvmap::process_lines(&clients, ts)
            }
            Err(e) => {
                let why = format!(
                    "off: cannot read {} ({e}); it needs root and debugfs mounted",
                    path.display()
                );
                tracing::info!("jetson per-process GPU memory {why}");
                self.processes = false;
                self.status.update(|s| {
                    s.processes = why;
                    s.process_count = None;
                });
                Vec::new()
            }
        }
    }

    /// One sample: the throttle point, the process points, and an event when the power
    /// mode or the jetson_clocks state changed.
    pub fn sample(&mut self, ts: i64) -> Batch {
        let mut id = read_identity(&self.root);
        self.query_mode(&mut id);
        let (gpu, gpu_event) = self.sample_gpu(ts);
        let t = read_throttle_with(&self.root, gpu);
        let mut lines: Vec<Line> = gpu_event.into_iter().collect();
        let known = self.identity.is_jetson();
        if known && id.power_mode_tag() != self.identity.power_mode_tag() {
            tracing::info!(from = ?self.identity.power_mode_tag(), to = ?id.power_mode_tag(), "power mode changed");
            lines.push(change_event(
                "power_mode",
                self.identity.power_mode_tag(),
                id.power_mode_tag(),
                ts,
            ));
            self.status.update(|s| s.power_mode_changes += 1);
        }
        if known && id.jetson_clocks != self.identity.jetson_clocks {
            tracing::info!(from = ?self.identity.jetson_clocks_tag(), to = ?id.jetson_clocks_tag(), "jetson_clocks changed");
            lines.push(change_event(
                "jetson_clocks",
                self.identity.jetson_clocks_tag().map(str::to_string),
                id.jetson_clocks_tag().map(str::to_string),
                ts,
            ));
        }
        let throttled = throttle::is_throttled(&t, self.prev_oc);
        lines.push(throttle_line(&id, &t, self.prev_oc, ts));
        let tags = id.tags();
        for mut l in self.processes(ts) {
            tag_line(&mut l, &tags);
            lines.push(l);
        }
        self.prev_oc = t.oc_events();
        self.status.set_identity(&id);
        self.status.update(|s| {
            s.samples += 1;
            s.throttled = Some(throttled);
            if throttled {
                s.last_throttled_ns = Some(ts);
            }
        });
        self.identity = id;
        Batch { lines }
    }
}

/// The `edgewatch_event,kind=<what>` point (source `jetson`) for a change from `from` to
/// `to`.
pub fn change_event(what: &str, from: Option<String>, to: Option<String>, ts: i64) -> Line {
    let (from, to) = (from.unwrap_or_default(), to.unwrap_or_default());
    let show = |s: &str| {
        if s.is_empty() {
            "?".to_string()
        } else {
            s.to_string()
        }
    };
    crate::collect::event::Event::new(
        what,
        crate::collect::event::Severity::Info,
        "jetson",
        format!("{what} changed: {} → {}", show(&from), show(&to)),
    )
    .field("from", Value::Str(from))
    .field("to", Value::Str(to))
    .line(ts)
}

/// The `edgewatch_event,kind=power_mode` point for a change from `old` to `new`.
pub fn power_mode_event(old: &Identity, new: &Identity, ts: i64) -> Line {
    change_event("power_mode", old.power_mode_tag(), new.power_mode_tag(), ts)
}

/// Runs the collector until shutdown; off (one log line) on a machine that is not a Jetson.
pub async fn run(
    cfg: JetsonConfig,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: Arc<JetsonStatus>,
    nvml: Option<Arc<crate::collect::nvml::NvmlStatus>>,
    shutdown: CancellationToken,
) {
    let mut collector = JetsonCollector::new(&cfg, status.clone());
    if let Some(n) = nvml {
        collector = collector.with_nvml(n);
    }
    let started = tokio::task::spawn_blocking(move || {
        let ok = collector.start();
        (collector, ok)
    })
    .await;
    let (mut collector, ok) = match started {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "jetson collector could not start");
            status.set_state(format!("off: start failed: {e}"));
            return;
        }
    };
    if !ok {
        return;
    }
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
                status.set_state(format!("off: sample failed: {e}"));
                return;
            }
        };
        collector = c;
        super::submit(&handle, &stats, batch, "jetson");
    }
    status.set_state("stopped");
}

#[cfg(test)]
mod tests;
