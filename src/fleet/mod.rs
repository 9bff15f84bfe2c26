//! Signed remote config for the fleet: the layers `all`, each group of `[fleet] groups` and
//! `device`, merged in that order above the local file ([`layers::FleetLayers`] implements
//! [`Layers`]). A layer is a TOML fragment in a signed document ([`doc`]); the transports
//! ([`mqtt`]: retained topics, [`http`]: polled URLs) hand each document they receive to
//! [`receive`], which checks it, asks the reloader (through a [`ReloadSender`]) to apply the
//! effective config, and keeps the layer only if that worked. At start the stored layers are
//! applied before anything connects ([`settle_at_start`]). This module never applies a
//! config to the running agent itself (the reloader does) and never writes outside
//! `<data_dir>/fleet/`.

pub mod config;
pub mod doc;
pub mod http;
pub mod layers;
pub mod merge;
pub mod mqtt;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::layers::{Layers, ReloadReport, ReloadRequest, ReloadSender, Trigger};
pub use layers::{FleetLayers, Offer};

/// How long a transport waits for the reloader's answer.
const RELOAD_WAIT: Duration = Duration::from_secs(120);

/// At start, before anything connects: the stored layers settled so the effective config
/// validates. `load` loads the effective config through the layers as the agent does
/// (`reload::Source::load`) and returns its sha256; a layer whose effective config does
/// not validate is dropped (marked `failed`), highest first, until it does. A local file
/// that is invalid on its own is the error.
pub fn settle_at_start(
    layers: &FleetLayers,
    load: impl Fn(&dyn Layers) -> Result<String, String>,
) -> Result<(), String> {
    loop {
        match load(layers) {
            Ok(sha) => {
                layers.set_effective_sha(&sha);
                layers.write_report();
                return Ok(());
            }
            Err(e) => match layers.drop_top(&e) {
                Some(source) => tracing::error!(
                    layer = %source, error = %e,
                    "stored fleet layer not applied: the effective config with it is invalid"
                ),
                None => return Err(e),
            },
        }
    }
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
