//! The watched-process collector (`[[process]]`, `[process_watch]`): every `interval` it
//! lists `/proc`, reads `stat` and `cmdline` of pids it has not seen and `stat` of the
//! watched ones (`logic.rs` decides what that means), and submits `edgewatch_event` points
//! (`source=process`, tag `process=<label>`: `process_start`, `process_exit`,
//! `process_restart`) and one `process` point per label (`config.rs` has the rules). The
//! GPU memory of a watched pid comes from what the NVML and Jetson collectors last
//! published ([`crate::collect::gpu_mem`]); it never opens a GPU device itself. A pid that
//! vanishes mid-read is an exit, never an error. Its state is `collectors.process` in
//! `/api/v1/status`.

pub mod config;
pub mod logic;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::model::Batch;
use crate::queue::IngestHandle;
use crate::stats::Stats;
use crate::status::{ProcessEvent, ProcessWatch, StatusCell, WatchedProcess};

pub use config::{ProcessConfig, ProcessWatchConfig};
pub use logic::{Clock, ProcSource, Stat, Tracker};

/// `/proc` (or a copy of its layout) as a [`ProcSource`].
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
}

impl ProcFs {
    /// The source reading under `root` (`/proc`).
    pub fn new(root: impl Into<PathBuf>) -> ProcFs {
        ProcFs { root: root.into() }
    }

    /// `sysconf` clock ticks and page size, and `btime` from `<root>/stat` (0 where
    /// unreadable: start times are then relative to boot).
    pub fn clock(&self) -> Clock {
        // SAFETY: sysconf only reads a constant of the running system.
        let (hz, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let btime = std::fs::read_to_string(self.root.join("stat"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("btime "))
                    .and_then(|v| v.trim().parse::<i64>().ok())
            })
            .unwrap_or(0);
        Clock {
            hz: u64::try_from(hz).ok().filter(|h| *h > 0).unwrap_or(100),
            page: u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096),
            boot_ns: btime.saturating_mul(1_000_000_000),
        }
    }

    fn pid_dir(&self, pid: u32) -> PathBuf {
        self.root.join(pid.to_string())
    }
}

impl ProcSource for ProcFs {
    fn pids(&mut self) -> Vec<u32> {
        let Ok(dir) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .collect()
    }

    fn stat(&mut self, pid: u32) -> Option<Stat> {
        let text = std::fs::read_to_string(self.pid_dir(pid).join("stat")).ok()?;
        logic::parse_stat(&text)
    }

    fn cmdline(&mut self, pid: u32) -> Option<Vec<u8>> {
        std::fs::read(self.pid_dir(pid).join("cmdline")).ok()
    }
}

/// The collector's live status (`collectors.process`).
#[derive(Debug)]
pub struct ProcessStatus(StatusCell<ProcessWatch>);

impl ProcessStatus {
    /// "not started", one entry per rule.
    pub fn new(rules: &[ProcessConfig]) -> ProcessStatus {
        ProcessStatus(StatusCell::new(ProcessWatch {
            state: if rules.is_empty() {
                "off: no [[process]] configured".into()
            } else {
                "not started".into()
            },
            watched: rules
                .iter()
                .map(|r| WatchedProcess {
                    label: r.label(),
                    rule: r.rule_text(),
                    ..WatchedProcess::default()
                })
                .collect(),
            ..ProcessWatch::default()
        }))
    }

    /// The `collectors.process` object.
    pub fn snapshot(&self) -> ProcessWatch {
        self.0.snapshot()
    }

    fn set_state(&self, state: impl Into<String>) {
        let s = state.into();
        self.0.update(|w| w.state = s);
    }

    fn record(&self, tracker: &Tracker, ms: f64, gpu_mem: String) {
        self.0.update(|w| {
            w.scans += 1;
            w.last_scan_ms = Some(ms);
            w.tracked_pids = tracker.known_pids() as u64;
            w.gpu_mem = gpu_mem;
            w.watched = tracker
                .state()
                .iter()
                .map(|s| WatchedProcess {
                    label: s.label.clone(),
                    rule: s.rule.clone(),
                    running: s.pids.len() as u64,
                    pids: s.pids.clone(),
                    starts: s.starts,
                    exits: s.exits,
                    restarts: s.restarts,
                    last_event: s.last_event.as_ref().map(|(kind, ts, msg)| ProcessEvent {
                        kind: kind.clone(),
                        ts_ns: *ts,
                        message: msg.clone(),
                    }),
                })
                .collect();
        });
    }
}

/// Where the watched pids' GPU memory is read from (the GPU collectors' latest samples).
#[derive(Clone)]
pub struct GpuSources {
    /// The NVML collector's status (its `gpu_process` memory).
    pub nvml: Arc<crate::collect::nvml::NvmlStatus>,
    /// The Jetson collector's status (its nvmap client list).
    pub jetson: Arc<crate::collect::jetson::JetsonStatus>,
}

impl GpuSources {
    /// The freshest map (NVML first), with where it came from; a map older than
    /// `max_age_ns` is not used.
    fn read(
        &self,
        now: i64,
        max_age_ns: i64,
    ) -> (Option<std::collections::HashMap<u32, u64>>, String) {
        if let Some(m) = self.nvml.process_mem.latest(now, max_age_ns) {
            return (Some(m), "nvml".into());
        }
        if let Some(m) = self.jetson.process_mem().latest(now, max_age_ns) {
            return (Some(m), "nvmap".into());
        }
        (
            None,
            "none: no recent per-process GPU memory ([nvml] processes = true on a GPU \
             with a driver, or [jetson] processes as root on a Jetson)"
                .into(),
        )
    }
}

/// Runs the collector until shutdown (returns at once without `[[process]]` tables).
pub async fn run(
    rules: Vec<ProcessConfig>,
    cfg: ProcessWatchConfig,
    gpu: GpuSources,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: Arc<ProcessStatus>,
    shutdown: CancellationToken,
) {
    run_on(
        Path::new("/proc"),
        rules,
        cfg,
        gpu,
        handle,
        stats,
        status,
        shutdown,
    )
    .await
}

/// [`run`] over the `/proc` layout at `root`.
#[allow(clippy::too_many_arguments)]
pub async fn run_on(
    root: &Path,
    rules: Vec<ProcessConfig>,
    cfg: ProcessWatchConfig,
    gpu: GpuSources,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: Arc<ProcessStatus>,
    shutdown: CancellationToken,
) {
    if rules.is_empty() {
        return;
    }
    let mut src = ProcFs::new(root);
    if std::fs::read_dir(root).is_err() {
        tracing::warn!(root = %root.display(), "process watch off: cannot list the process table");
        status.set_state(format!("off: cannot list {}", root.display()));
        return;
    }
    let window = i64::try_from(cfg.restart_window.0.as_nanos()).unwrap_or(i64::MAX);
    let interval_ns = i64::try_from(cfg.interval.0.as_nanos()).unwrap_or(i64::MAX);
    // A GPU map older than three scans (or 30 s) is not the process's current memory.
    let max_age = interval_ns.saturating_mul(3).max(30_000_000_000);
    let mut tracker = Tracker::new(rules.clone(), src.clock(), window, std::process::id());
    tracing::info!(
        watched = rules.len(),
        interval = ?cfg.interval.0,
        "process watch started: {}",
        rules.iter().map(|r| r.rule_text()).collect::<Vec<_>>().join(", ")
    );
    status.set_state("running");
    let mut ticker = crate::periodic::Ticker::new(cfg.interval.0);
    while ticker.next(&shutdown).await.is_some() {
        let now = crate::now_ns();
        let (map, from) = gpu.read(now, max_age);
        // A few hundred small procfs reads: off the async threads.
        let job = tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            let out = tracker.scan(&mut src, now, map.as_ref());
            (tracker, src, out, t.elapsed().as_secs_f64() * 1000.0)
        });
        let (t, s, out, ms) = match job.await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "process scan failed; process watch stops");
                Stats::add(&stats.collector_errors, 1);
                status.set_state(format!("off: scan failed: {e}"));
                return;
            }
        };
        tracker = t;
        src = s;
        for (kind, label, message) in &out.events {
            tracing::info!(kind = %kind, process = %label, "{message}");
        }
        status.record(&tracker, ms, from);
        super::submit(&handle, &stats, Batch { lines: out.lines }, "process");
    }
    status.set_state("stopped");
}

#[cfg(test)]
mod tests;
