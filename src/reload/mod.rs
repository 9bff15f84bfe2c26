//! Live reload: one task in the agent owns the running config and the config layers, takes
//! [`ReloadRequest`]s (SIGHUP, `POST /api/v1/reload`, the file watcher, fleet layers) one at
//! a time, re-reads the local file, merges the layers and validates the result whole (what
//! `check-config` checks). An invalid config changes nothing: the report and the status
//! carry the reason. A valid one is compared with the running one ([`diff`]) and applied in
//! place by restarting only the changed parts ([`parts`]); keys only a restart applies
//! (listen addresses, the store) are kept as they run and reported as `restart_required`.
//! It never touches ingest: the listeners, the queue and the writer are not restarted, so
//! writes are never refused for a reload.

pub mod diff;
pub mod parts;
pub mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::layers::{
    LayerState, LayerStatus, Layers, ReloadReport, ReloadRequest, ReloadSender, Trigger,
};
use crate::config::load::{canonical, redacted_table, setters, sha256_hex, Loaded};
use crate::config::{Config, ConfigError};
use crate::status::config::{ConfigState, LastReload};

pub use parts::{Parts, Shared};

/// Reload requests waiting at most (a trigger that finds the queue full is answered by the
/// reload already queued, which reads the same file).
pub const QUEUE: usize = 4;

/// The request channel.
pub fn channel() -> (ReloadSender, mpsc::Receiver<ReloadRequest>) {
    mpsc::channel(QUEUE)
}

/// Command-line flags of `edgewatch run` that override the file (kept on every reload).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--http-listen`.
    pub http_listen: Option<SocketAddr>,
    /// `--udp-listen`.
    pub udp_listen: Option<SocketAddr>,
}

/// Where the config comes from: the file, the environment as the agent started with it,
/// and the flags.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// The local file (`None`: the built-in default).
    pub path: Option<PathBuf>,
    /// The `EDGEWATCH_*` variables.
    pub env: Vec<(String, String)>,
    /// The flags.
    pub flags: Flags,
}

impl Source {
    /// Loads the effective config through `layers`, flags applied (parsed and validated as
    /// a file is; [`validate`] checks the rest).
    pub fn load(&self, layers: &dyn Layers) -> Result<Loaded, String> {
        let mut l = Config::load_layered(self.path.as_deref(), self.env.clone(), layers)
            .map_err(|e: ConfigError| e.to_string())?;
        let f = &self.flags;
        if let Some(d) = &f.data_dir {
            l.config.storage.data_dir = d.clone();
        }
        if let Some(a) = f.http_listen {
            l.config.http.listen = a;
        }
        if let Some(a) = f.udp_listen {
            l.config.udp.listen = a;
        }
        l.sha256 = sha256_hex(canonical(&l.config).as_bytes());
        Ok(l)
    }
}

/// What the agent checks before it starts, beyond parsing: the listener policy, the peers'
/// TLS files, the rollup plan.
pub fn validate(cfg: &Config) -> Result<(), String> {
    crate::web::auth::check_listeners(&cfg.http, &cfg.udp).map_err(|e| e.to_string())?;
    let peers = peer_setup_errors(cfg);
    if !peers.is_empty() {
        return Err(peers.join("; "));
    }
    crate::rollup::Plan::from_config(cfg).map_err(|e| e.to_string())?;
    Ok(())
}

/// What keeps a configured sink or notifier from ever connecting, found by reading its files
/// (an MQTT `ca_file`, `cert_file` or `key_file` that does not read or parse), one message
/// per peer naming its table. `check-config` and a reload refuse such a config; `run` logs
/// each at start.
pub fn peer_setup_errors(cfg: &Config) -> Vec<String> {
    use crate::deliver::mqtt::check;
    let sinks = cfg.sink.iter().filter_map(|s| {
        check(&s.url, &s.tls_files())
            .err()
            .map(|e| format!("[[sink]] {:?}: {e}", s.name))
    });
    let notifiers = cfg.notify.iter().filter_map(|n| {
        check(&n.url, &n.tls_files())
            .err()
            .map(|e| format!("[[notify]] {:?}: {e}", n.name))
    });
    let fleet = cfg.fleet.mqtt.iter().filter_map(|url| {
        check(url, &cfg.fleet.tls_files())
            .err()
            .map(|e| format!("[fleet] mqtt: {e}"))
    });
    sinks.chain(notifiers).chain(fleet).collect()
}

/// The reloader: the running config and its parts.
pub struct Reloader {
    source: Source,
    layers: Arc<dyn Layers>,
    /// As the agent started (what `restart_required` compares against).
    started: Config,
    /// As last loaded (the effective config).
    loaded: Config,
    /// As it runs: `loaded` with the restart-only keys of `started`.
    running: Config,
    file_sha256: String,
    parts: Parts,
    state: Arc<ConfigState>,
}

impl Reloader {
    /// The reloader of an agent started on `loaded` (its parts already running); records the
    /// config's status.
    pub fn new(
        source: Source,
        layers: Arc<dyn Layers>,
        loaded: &Loaded,
        parts: Parts,
        state: Arc<ConfigState>,
    ) -> Reloader {
        let r = Reloader {
            source,
            layers,
            started: loaded.config.clone(),
            loaded: loaded.config.clone(),
            running: loaded.config.clone(),
            file_sha256: loaded.file_sha256.clone(),
            parts,
            state,
        };
        r.publish(loaded);
        r
    }

    /// The config state the API reads, for `loaded`.
    pub fn state_for(
        loaded: &Loaded,
        reload: ReloadSender,
        layers: Arc<dyn Layers>,
    ) -> Arc<ConfigState> {
        Arc::new(ConfigState {
            layers,
            // The sha256 from the start: the inventory may report before the first publish.
            info: crate::status::StatusCell::new(crate::status::config::ConfigInfo {
                sha256: loaded.sha256.clone(),
                ..Default::default()
            }),
            effective: crate::status::StatusCell::new(Arc::new(effective_json(loaded))),
            reload,
        })
    }

    /// Takes requests until `stop`; returns the parts for the agent's ordered shutdown.
    pub async fn run(
        mut self,
        mut rx: mpsc::Receiver<ReloadRequest>,
        stop: CancellationToken,
    ) -> Parts {
        loop {
            let req = tokio::select! {
                _ = stop.cancelled() => break,
                r = rx.recv() => match r {
                    Some(r) => r,
                    None => { stop.cancelled().await; break; }
                },
            };
            let report = self.reload(&req.trigger).await;
            if let Some(reply) = req.reply {
                let _ = reply.send(report);
            }
        }
        self.parts
    }

    /// One reload.
    pub async fn reload(&mut self, trigger: &Trigger) -> ReloadReport {
        let (source, layers) = (self.source.clone(), self.layers.clone());
        let loaded = tokio::task::spawn_blocking(move || {
            let l = source.load(&*layers)?;
            validate(&l.config)?;
            Ok(l)
        })
        .await
        .unwrap_or_else(|e| Err(format!("reload task failed: {e}")));
        let loaded = match loaded {
            Ok(l) => l,
            Err(error) => {
                tracing::warn!(%trigger, %error, "config reload refused; the running config is unchanged");
                let report = ReloadReport {
                    ok: false,
                    error: Some(error),
                    sha256: self.state.info.read(|i| i.sha256.clone()),
                    applied: Vec::new(),
                    restart_required: Vec::new(),
                };
                self.record(trigger, &report);
                return report;
            }
        };
        let restart_required = diff::changes(&self.loaded, &loaded.config).restart_required;
        let target = diff::pin(&loaded.config, &self.started);
        let changes = diff::changes(&self.running, &target);
        let mut applied = changes.applied();
        if !changes.is_empty() {
            applied.extend(self.parts.apply(&target, &changes).await);
        }
        self.running = target;
        self.loaded = loaded.config.clone();
        self.file_sha256 = loaded.file_sha256.clone();
        let report = ReloadReport {
            ok: true,
            error: None,
            sha256: loaded.sha256.clone(),
            applied,
            restart_required,
        };
        tracing::info!(
            %trigger,
            sha256 = %report.sha256,
            applied = ?report.applied,
            restart_required = ?report.restart_required,
            "config reloaded"
        );
        self.publish(&loaded);
        self.record(trigger, &report);
        report
    }

    /// Records the effective config `l` in the state.
    fn publish(&self, l: &Loaded) {
        let pending = diff::changes(&self.started, &self.loaded).restart_required;
        let mut layers = vec![LayerStatus {
            source: "file".into(),
            version: None,
            sha256: self.file_sha256.clone(),
            applied_at_ns: Some(crate::now_ns()),
            state: LayerState::Applied,
            error: None,
        }];
        layers.extend(
            self.layers
                .status()
                .into_iter()
                .filter(|l| l.source != "file"),
        );
        self.state.info.update(|i| {
            i.sha256 = l.sha256.clone();
            i.layers = layers;
            i.restart_required = pending;
        });
        self.state
            .effective
            .update(|e| *e = Arc::new(effective_json(l)));
    }

    fn record(&self, trigger: &Trigger, r: &ReloadReport) {
        let now = crate::now_ns();
        self.state.info.update(|i| {
            if r.ok {
                i.reloads_applied += 1;
            } else {
                i.reloads_failed += 1;
            }
            i.last_reload = Some(LastReload {
                time: crate::alert::view::rfc3339(now),
                ts_ns: now,
                trigger: trigger.to_string(),
                ok: r.ok,
                error: r.error.clone(),
                applied: r.applied.clone(),
                restart_required: r.restart_required.clone(),
            });
        });
    }
}

/// `/api/v1/config`'s answer for `l`.
fn effective_json(l: &Loaded) -> serde_json::Value {
    serde_json::json!({
        "sha256": l.sha256,
        "config": redacted_table(&l.config),
        "set_by": setters(&l.config, &l.set_by),
    })
}

/// Sends a reload request on each SIGHUP until `stop`.
pub async fn on_sighup(reload: ReloadSender, stop: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; reload with `edgewatch reload`");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            tracing::info!("SIGHUP: reloading the config");
            let req = ReloadRequest {
                trigger: Trigger::Signal,
                reply: None,
            };
            if let Err(mpsc::error::TrySendError::Closed(_)) = reload.try_send(req) {
                return;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (reload, stop);
    }
}

/// Asks for a reload and waits for its report (the API's and `edgewatch reload`'s way).
pub async fn request(reload: &ReloadSender, trigger: Trigger) -> Result<ReloadReport, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    reload
        .send(ReloadRequest {
            trigger,
            reply: Some(tx),
        })
        .await
        .map_err(|_| "the agent is shutting down".to_string())?;
    rx.await
        .map_err(|_| "the agent is shutting down".to_string())
}
