//! The parts of the running agent that a reload restarts: each collector, the scrapes, the
//! rollup job, the alert evaluator and the config watcher run as a group on their own child
//! of the sources' token; each sink on its own child of the forwarders' token; the
//! notifiers as one group on another. [`Parts::apply`] stops a changed group (and waits for
//! it), then starts it with its new section, and swaps the status holders the API reads.
//! Ingest (the listeners, the queue, the writer) is not here: it never restarts. Final
//! shutdown keeps the agent's order: the sources' token is cancelled by the agent, the
//! rollup job is awaited, then the forwarders and notifiers stop, then the other groups.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::diff::{Changes, Part};
use crate::config::layers::ReloadSender;
use crate::config::Config;
use crate::queue::IngestHandle;
use crate::stats::Stats;
use crate::status::Live;

/// How long a reload waits for a stopped part before it starts the new one anyway.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// What every part is started with: the ingest handle, the status holders the API reads,
/// and the parents of the parts' tokens.
#[derive(Clone)]
pub struct Shared {
    /// Producers' handle.
    pub handle: IngestHandle,
    /// Counters.
    pub stats: Arc<Stats>,
    /// The database file.
    pub db_path: PathBuf,
    /// The agent's base URL (incident links).
    pub base_url: String,
    /// The running config's status part (the inventory reports its sha256).
    pub config: Arc<crate::status::config::ConfigState>,
    /// The config file (the watcher's), if any.
    pub config_path: Option<PathBuf>,
    /// Where the watcher sends.
    pub reload: ReloadSender,
    /// Collector statuses that outlive their collector.
    pub nvml: Arc<crate::collect::nvml::NvmlStatus>,
    /// See `nvml`.
    pub tegrastats: Arc<crate::collect::tegrastats::TegrastatsStatus>,
    /// See `nvml`.
    pub jetson: Arc<crate::collect::jetson::JetsonStatus>,
    /// See `nvml`.
    pub kmsg: Arc<crate::collect::kmsg::KmsgStatus>,
    /// Replaced with the scrape targets.
    pub scrape: Live<crate::collect::scrape::ScrapeStatus>,
    /// Replaced with the watched processes.
    pub process: Live<crate::collect::process::ProcessStatus>,
    /// Rebuilt from the running sinks.
    pub forward: Live<crate::forward::ForwardStatus>,
    /// Replaced with the notifiers.
    pub notify: Live<crate::alert::notify::NotifyStatus>,
    /// Replaced with `[rollup]`/`[retention]`.
    pub plan: Live<crate::rollup::Plan>,
    /// Replaced with `[inference]`.
    pub inference: Live<crate::engine::InferenceConfig>,
    /// The evaluator's snapshot (kept across its restarts).
    pub alerts_view: Arc<crate::alert::view::AlertsView>,
    /// What the writer holds for its next commit (the alert cycle reads it).
    pub held: Arc<crate::store::HeldView>,
    /// Parent of the collectors', rollup's, evaluator's and watcher's tokens.
    pub sources: CancellationToken,
    /// Parent of the sinks' and notifiers' tokens.
    pub forward_stop: CancellationToken,
}

struct Group {
    stop: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

struct SinkRun {
    stop: CancellationToken,
    run: crate::forward::Forwarders,
}

/// The running restartable parts.
pub struct Parts {
    shared: Shared,
    groups: BTreeMap<Part, Group>,
    sinks: BTreeMap<String, SinkRun>,
    notifiers: Option<(CancellationToken, crate::alert::notify::Notifiers)>,
}

/// Every part, in start order.
const ALL: &[Part] = &[
    Part::Host,
    Part::Process,
    Part::Jetson,
    Part::Kmsg,
    Part::Health,
    Part::Tegrastats,
    Part::Nvml,
    Part::Scrape,
    Part::Alerts,
    Part::Rollup,
    Part::Watch,
];

impl Parts {
    /// Starts every part of `cfg`.
    pub fn start(cfg: &Config, shared: Shared) -> Parts {
        let mut p = Parts {
            shared,
            groups: BTreeMap::new(),
            sinks: BTreeMap::new(),
            notifiers: None,
        };
        for sc in cfg.sink.iter().filter(|s| s.enabled) {
            p.start_sink(cfg, &sc.name);
        }
        p.publish_sinks(cfg);
        p.start_notifiers(cfg);
        for part in ALL {
            p.start_part(*part, cfg);
        }
        p
    }

    /// Applies `c` (from the running config to `cfg`): stops and starts what changed.
    /// Returns what else it did (the rules whose instances it resolved).
    pub async fn apply(&mut self, cfg: &Config, c: &Changes) -> Vec<String> {
        let mut notes = Vec::new();
        // Sinks: stopped ones first, then the restarted ones, on their stored cursors.
        // Every stop is asked at once, then awaited: a reload waits for the slowest part,
        // not for their sum.
        let mut sinks = Vec::new();
        for name in c.sinks.stop.iter().chain(&c.sinks.restart) {
            if let Some(s) = self.sinks.remove(name) {
                s.stop.cancel();
                sinks.push(s);
            }
        }
        let mut groups = Vec::new();
        for part in &c.parts {
            if let Some(g) = self.groups.remove(part) {
                g.stop.cancel();
                groups.push((*part, g));
            }
        }
        let mut notifiers = None;
        if c.parts.contains(&Part::Notify) {
            if let Some((stop, n)) = self.notifiers.take() {
                stop.cancel();
                notifiers = Some(n);
            }
        }
        let t = std::time::Instant::now();
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        for s in sinks {
            s.run.join(deadline).await;
        }
        for (part, g) in groups {
            join(g.tasks, deadline).await;
            tracing::debug!(
                part = part.name(),
                ms = t.elapsed().as_millis() as u64,
                "part stopped"
            );
        }
        if let Some(n) = notifiers {
            n.join(deadline).await;
        }
        tracing::debug!(ms = t.elapsed().as_millis() as u64, "changed parts stopped");
        for name in c.sinks.restart.iter().chain(&c.sinks.start) {
            self.start_sink(cfg, name);
        }
        self.publish_sinks(cfg);
        for part in c.parts.iter().copied() {
            match part {
                Part::Notify => self.start_notifiers(cfg),
                Part::Inference => self.shared.inference.set(cfg.inference.clone()),
                part => {
                    if part == Part::Alerts {
                        notes.extend(self.resolve_removed(cfg).await);
                    }
                    self.start_part(part, cfg);
                }
            }
        }
        notes
    }

    /// With the evaluator stopped: resolves the stored instances of rules no longer
    /// configured.
    async fn resolve_removed(&self, cfg: &Config) -> Vec<String> {
        let rules: Vec<String> = crate::alert::rules::compile(&cfg.alerts, &cfg.alert)
            .into_iter()
            .map(|r| r.name)
            .collect();
        let dir = cfg.storage.data_dir.clone();
        let identity = crate::forward::identity(cfg).1;
        let base = self.shared.base_url.clone();
        let done = tokio::task::spawn_blocking(move || {
            crate::alert::task::resolve_removed(&dir, &rules, &identity, &base, crate::now_ns())
        })
        .await;
        match done {
            Ok(Ok(names)) => names
                .into_iter()
                .map(|n| {
                    tracing::info!(rule = %n, "alert rule removed: its instances are resolved");
                    format!("alert rule {n} removed: its instances resolved")
                })
                .collect(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot resolve the instances of removed alert rules");
                vec![format!(
                    "instances of removed alert rules not resolved: {e}"
                )]
            }
            Err(e) => vec![format!(
                "instances of removed alert rules not resolved: {e}"
            )],
        }
    }

    fn start_sink(&mut self, cfg: &Config, name: &str) {
        let Some(sc) = cfg.sink.iter().find(|s| s.name == name && s.enabled) else {
            return;
        };
        let one = Config {
            sink: vec![sc.clone()],
            ..cfg.clone()
        };
        let stop = self.shared.forward_stop.child_token();
        let plan = self.shared.plan.get();
        let run = crate::forward::start(
            &one,
            &cfg.storage.data_dir,
            plan.tiers.iter().map(|t| t.key()).min(),
            stop.clone(),
        );
        self.sinks.insert(name.to_string(), SinkRun { stop, run });
    }

    /// The `forward` status: the running sinks in config order.
    fn publish_sinks(&self, cfg: &Config) {
        let status = crate::forward::ForwardStatus {
            device_id: crate::forward::identity(cfg).0,
            sinks: cfg
                .sink
                .iter()
                .filter_map(|s| self.sinks.get(&s.name))
                .flat_map(|r| r.run.status.sinks.iter().cloned())
                .collect(),
        };
        self.shared.forward.set(status);
    }

    fn start_notifiers(&mut self, cfg: &Config) {
        let stop = self.shared.forward_stop.child_token();
        let n = crate::alert::notify::start(
            &cfg.notify,
            &cfg.storage.data_dir,
            &crate::forward::identity(cfg).0,
            crate::alert::notify::outbox_bound(&cfg.alerts),
            stop.clone(),
        );
        self.shared.notify.set(n.status.clone());
        self.notifiers = Some((stop, n));
    }

    fn start_part(&mut self, part: Part, cfg: &Config) {
        let stop = self.shared.sources.child_token();
        let tasks = spawn(part, cfg, &self.shared, &stop);
        self.groups.insert(part, Group { stop, tasks });
    }

    /// The final shutdown, after the agent cancelled the sources' token: the rollup job
    /// first, then the forwarders and notifiers, then every other part, by `deadline`.
    /// Dropping `self` then drops the last producer handles this side holds.
    pub async fn shutdown(mut self, deadline: tokio::time::Instant) {
        if let Some(g) = self.groups.remove(&Part::Rollup) {
            join(g.tasks, deadline).await;
        }
        self.shared.forward_stop.cancel();
        for (_, s) in std::mem::take(&mut self.sinks) {
            s.run.join(deadline).await;
        }
        if let Some((_, n)) = self.notifiers.take() {
            n.join(deadline).await;
        }
        for (_, g) in std::mem::take(&mut self.groups) {
            join(g.tasks, deadline).await;
        }
    }
}

async fn join(tasks: Vec<(&'static str, JoinHandle<()>)>, deadline: tokio::time::Instant) {
    for (name, t) in tasks {
        if tokio::time::timeout_at(deadline, t).await.is_err() {
            tracing::warn!(task = name, "still running at the deadline");
        }
    }
}

/// Starts `part` of `cfg` on `stop`; what it records in the status when it is off.
fn spawn(
    part: Part,
    cfg: &Config,
    sh: &Shared,
    stop: &CancellationToken,
) -> Vec<(&'static str, JoinHandle<()>)> {
    let (h, st, stop) = (sh.handle.clone(), sh.stats.clone(), stop.clone());
    let mut out = Vec::new();
    match part {
        Part::Host if cfg.host.enabled => out.push((
            "host collector",
            tokio::spawn(crate::collect::host::run(cfg.host.interval.0, h, st, stop)),
        )),
        Part::Process => {
            let status = Arc::new(crate::collect::process::ProcessStatus::new(&cfg.process));
            sh.process.set_arc(status.clone());
            if !cfg.process.is_empty() {
                let gpu = crate::collect::process::GpuSources {
                    nvml: sh.nvml.clone(),
                    jetson: sh.jetson.clone(),
                };
                out.push((
                    "process watch",
                    tokio::spawn(crate::collect::process::run(
                        cfg.process.clone(),
                        cfg.process_watch.clone(),
                        gpu,
                        h,
                        st,
                        status,
                        stop,
                    )),
                ));
            }
        }
        Part::Jetson if cfg.jetson.enabled => out.push((
            "jetson collector",
            tokio::spawn(crate::collect::jetson::run(
                cfg.jetson.clone(),
                h,
                st,
                sh.jetson.clone(),
                Some(sh.nvml.clone()),
                stop,
            )),
        )),
        Part::Jetson => sh.jetson.set_state("off: disabled in the configuration"),
        Part::Kmsg if cfg.kmsg.enabled => out.push((
            "kmsg collector",
            tokio::spawn(crate::collect::kmsg::run(
                cfg.kmsg.clone(),
                cfg.storage.data_dir.clone(),
                h,
                st,
                sh.kmsg.clone(),
                stop,
            )),
        )),
        Part::Kmsg => sh.kmsg.set_state("off: disabled in the configuration"),
        Part::Health if cfg.health.enabled => {
            let src = crate::collect::health::Sources {
                handle: h,
                db_path: sh.db_path.clone(),
                forward: sh.forward.clone(),
                tegrastats: Some(sh.tegrastats.clone()),
            };
            let inventory = crate::collect::inventory::Sources {
                handle: src.handle.clone(),
                device_id: crate::forward::identity(cfg).0,
                config: sh.config.clone(),
                groups: cfg.fleet.groups.join(","),
                jetson: cfg.jetson.enabled.then(|| sh.jetson.clone()),
                nvml: cfg.nvml.enabled.then(|| sh.nvml.clone()),
                forward: sh.forward.clone(),
            };
            out.push((
                "inventory",
                tokio::spawn(crate::collect::inventory::run(
                    cfg.health.inventory_interval.0,
                    st.clone(),
                    inventory,
                    stop.clone(),
                )),
            ));
            out.push((
                "health collector",
                tokio::spawn(crate::collect::health::run(
                    cfg.health.interval.0,
                    st,
                    src,
                    stop,
                )),
            ));
        }
        // Also when disabled: it then only records "off" in the status and returns.
        Part::Tegrastats => out.push((
            "tegrastats collector",
            tokio::spawn(crate::collect::tegrastats::run(
                cfg.tegrastats.clone(),
                h,
                st,
                sh.tegrastats.clone(),
                sh.jetson.clone(),
                stop,
            )),
        )),
        Part::Nvml if cfg.nvml.enabled => out.push((
            "nvml collector",
            tokio::spawn(crate::collect::nvml::run(
                cfg.nvml.clone(),
                h,
                st,
                sh.nvml.clone(),
                stop,
            )),
        )),
        Part::Nvml => sh.nvml.set_state("off: disabled in the configuration"),
        Part::Scrape => {
            let status = Arc::new(crate::collect::scrape::ScrapeStatus::new(&cfg.scrape));
            sh.scrape.set_arc(status.clone());
            if !cfg.scrape.is_empty() {
                out.push((
                    "scrape",
                    tokio::spawn(crate::collect::scrape::run(
                        cfg.scrape.clone(),
                        h,
                        st,
                        status,
                        stop,
                    )),
                ));
            }
        }
        Part::Alerts => {
            let rules = crate::alert::rules::compile(&cfg.alerts, &cfg.alert);
            if rules.is_empty() {
                sh.alerts_view
                    .set(Vec::new(), crate::alert::view::AlertsStatus::default());
                return out;
            }
            let plan = sh.plan.get();
            let setup = crate::alert::task::Setup {
                rules,
                interval: cfg.alerts.interval.0,
                data_dir: cfg.storage.data_dir.clone(),
                plan: plan.clone(),
                inputs: crate::alert::observe::Inputs {
                    stats: st,
                    forward: sh.forward.clone(),
                    db_path: sh.db_path.clone(),
                    max_bytes: plan.max_bytes,
                    clock_floor_ns: plan.clock_floor_ns,
                },
                identity: crate::forward::identity(cfg).1,
                base_url: crate::alert::incident::explain::link_base(
                    &cfg.alerts.external_url,
                    &crate::forward::identity(cfg).0,
                    &sh.base_url,
                ),
                points: Some((h, sh.stats.clone())),
                held: Some(sh.held.clone()),
            };
            out.push((
                "alert evaluator",
                tokio::spawn(crate::alert::task::run(setup, sh.alerts_view.clone(), stop)),
            ));
        }
        Part::Rollup => match crate::rollup::Plan::from_config(cfg) {
            Ok(plan) => {
                sh.plan.set(plan.clone());
                if plan.enabled {
                    out.push((
                        "rollup",
                        tokio::spawn(crate::rollup::run(cfg.storage.data_dir.clone(), plan, stop)),
                    ));
                }
            }
            // Validated before any reload is applied; at start the agent refused it.
            Err(e) => tracing::error!(error = %e, "rollup plan refused; the job is not running"),
        },
        Part::Watch if cfg.config.watch => {
            if let Some(path) = sh.config_path.clone() {
                out.push((
                    "config watch",
                    tokio::spawn(super::watch::run(path, sh.reload.clone(), stop)),
                ));
            } else {
                tracing::warn!("[config] watch = true but the agent runs on the built-in config: nothing to watch");
            }
        }
        Part::Inference | Part::Notify => {}
        _ => {}
    }
    out
}
