//! Signed remote config for the fleet: the layers `all`, each group of `[fleet] groups` and
//! `device`, merged in that order above the local file ([`layers::FleetLayers`] implements
//! [`Layers`]). A layer is a TOML fragment in a signed document ([`doc`]); the transports
//! ([`mqtt`]: retained topics, [`http`]: polled URLs) hand each document they receive to
//! [`receive`], which checks it, asks the reloader (through a [`ReloadSender`]) to apply the
//! effective config, and keeps the layer only if that worked. At start the stored layers are
//! applied before anything connects ([`LocalSource::at_start`]). This module never applies a
//! config to the running agent itself (the reloader does) and never writes outside
//! `<data_dir>/fleet/`.

pub mod config;
pub mod doc;
pub mod http;
pub mod layers;
pub mod merge;
pub mod mqtt;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::layers::{Layers, ReloadReport, ReloadRequest, ReloadSender, Trigger};
use crate::config::{Config, ConfigError};
pub use layers::{FleetLayers, Offer};

/// How long a transport waits for the reloader's answer.
const RELOAD_WAIT: Duration = Duration::from_secs(120);

/// Where the local config comes from, to rebuild the effective config: the file (or the
/// built-in default), the `EDGEWATCH_*` variables, and the command-line overrides.
pub struct LocalSource {
    /// The local file, if any.
    pub path: Option<PathBuf>,
    /// The environment (only `EDGEWATCH_*` is read).
    pub env: Vec<(String, String)>,
    /// The command-line flags, applied last.
    pub overrides: Box<dyn Fn(&mut Config) + Send + Sync>,
}

impl LocalSource {
    /// The effective config: the local file's table with `layers` merged above it,
    /// validated as a whole, then the environment and the flags.
    pub fn load(&self, layers: &dyn Layers) -> Result<Config, ConfigError> {
        let (text, origin) = match &self.path {
            Some(p) => (
                std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.clone(),
                    source,
                })?,
                p.display().to_string(),
            ),
            None => (
                crate::config::DEFAULT_CONFIG.to_string(),
                "<built-in>".to_string(),
            ),
        };
        let file_err = |origin: &str, message: String| ConfigError::File {
            origin: origin.to_string(),
            message,
        };
        let local: toml::Table = toml::from_str(&text)
            .map_err(|e| file_err(&origin, e.to_string().trim_end().to_string()))?;
        let eff = layers
            .effective(local)
            .map_err(|m| file_err("(fleet layers)", m))?;
        let merged =
            toml::to_string(&eff.table).map_err(|e| file_err("(fleet layers)", e.to_string()))?;
        let mut cfg = Config::from_toml_str(&merged, &format!("{origin} with the fleet layers"))?
            .with_env(self.env.clone())?;
        (self.overrides)(&mut cfg);
        Ok(cfg)
    }

    /// At start, before anything connects: the effective config with the stored layers;
    /// a layer whose effective config does not validate is dropped (marked `failed`),
    /// highest first, until it does. A local file that is invalid on its own is the error.
    pub fn at_start(&self, layers: &FleetLayers) -> Result<Config, ConfigError> {
        loop {
            match self.load(layers) {
                Ok(cfg) => {
                    layers.set_effective_sha(&config_sha256(&cfg));
                    layers.write_report();
                    return Ok(cfg);
                }
                Err(e) => match layers.drop_top(&e.to_string()) {
                    Some(source) => tracing::error!(
                        layer = %source, error = %e,
                        "stored fleet layer not applied: the effective config with it is invalid"
                    ),
                    None => return Err(e),
                },
            }
        }
    }
}

/// sha256 (hex) of a config as the agent prints it.
pub fn config_sha256(cfg: &Config) -> String {
    doc::sha256_hex(toml::to_string(cfg).unwrap_or_default().as_bytes())
}

fn failed(error: String) -> ReloadReport {
    ReloadReport {
        ok: false,
        error: Some(error),
        sha256: String::new(),
        applied: Vec::new(),
        restart_required: Vec::new(),
    }
}

/// One document received for layer `source`: checked, merged through a reload, kept or
/// refused; the status file is rewritten. Returns what became of it.
pub async fn receive(
    layers: &FleetLayers,
    source: &str,
    text: &[u8],
    reload: &ReloadSender,
) -> Offer {
    let _one = layers.apply.lock().await;
    let offer = layers.offer(source, text);
    match &offer {
        Offer::Candidate { version } => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let req = ReloadRequest {
                trigger: Trigger::Fleet {
                    source: source.to_string(),
                },
                reply: Some(tx),
            };
            let report = if reload.send(req).await.is_err() {
                failed("the reloader is not running".into())
            } else {
                match tokio::time::timeout(RELOAD_WAIT, rx).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(_)) => failed("the reloader dropped the request".into()),
                    Err(_) => failed("no answer from the reloader in 120 s".into()),
                }
            };
            layers.commit(source, &report);
            if report.ok {
                tracing::info!(layer = %source, version, sha256 = %report.sha256, "fleet layer applied");
            } else {
                tracing::warn!(
                    layer = %source, version,
                    error = %report.error.as_deref().unwrap_or(""),
                    "fleet layer failed: the previous one stays"
                );
            }
        }
        Offer::Refused(why) => {
            tracing::warn!(layer = %source, reason = %why, "fleet document refused");
        }
        Offer::Unchanged => tracing::debug!(layer = %source, "fleet document already applied"),
    }
    layers.write_report();
    offer
}

/// Starts the transports `[fleet]` names; each stops with `stop`.
pub fn start(
    layers: Arc<FleetLayers>,
    cfg: &config::FleetConfig,
    reload: ReloadSender,
    stop: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    if cfg.mqtt.is_some() {
        tasks.push(tokio::spawn(mqtt::run(
            layers.clone(),
            cfg.clone(),
            reload.clone(),
            stop.clone(),
        )));
    }
    if cfg.url.is_some() {
        tasks.push(tokio::spawn(http::run(layers, cfg.clone(), reload, stop)));
    }
    tasks
}

/// Answers reload requests by validating the effective config with the candidate layer
/// (the whole check `check-config` does) without changing the running agent: the layer is
/// stored and runs from the next start. What answers until the in-place reloader is wired.
pub async fn validate_only(
    mut rx: tokio::sync::mpsc::Receiver<ReloadRequest>,
    layers: Arc<FleetLayers>,
    local: LocalSource,
) {
    while let Some(req) = rx.recv().await {
        let report = match local.load(&*layers) {
            Ok(cfg) => ReloadReport {
                ok: true,
                error: None,
                sha256: config_sha256(&cfg),
                applied: Vec::new(),
                restart_required: vec![match &req.trigger {
                    Trigger::Fleet { source } => format!("fleet layer {source}"),
                    other => format!("{other:?}"),
                }],
            },
            Err(e) => failed(e.to_string()),
        };
        if let Some(reply) = req.reply {
            let _ = reply.send(report);
        }
    }
}
