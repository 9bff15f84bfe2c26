//! The seam between the local config file and what sits above it, and the request that
//! applies a config in place. `reload` applies an effective config to the running agent;
//! `fleet` fetches, verifies and stores the remote layers (`all`, each group, the device)
//! that [`Layers::effective`] merges above the local file. Pure types: this module does no
//! IO and knows neither the agent nor the transports.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The config layers above the local file, lowest first, merged into one table.
pub trait Layers: Send + Sync {
    /// `local` (the local file parsed as a table) with every applied layer merged above
    /// it. An error names the layer and what is wrong with it.
    fn effective(&self, local: toml::Table) -> Result<Effective, String>;
    /// Each layer's state, local file first, for `/api/v1/status` `config.layers`.
    fn status(&self) -> Vec<LayerStatus>;
}

/// The merged table and which layer set each key.
#[derive(Debug, Clone, Default)]
pub struct Effective {
    /// The merged config table (validated as a whole by the caller).
    pub table: toml::Table,
    /// Dotted key (`alerts.ttft_ratio`, `alert.LatencyHigh.threshold`) -> the layer that
    /// set it (`file`, `all`, `group:NAME`, `device`). Keys no layer set are defaults.
    pub set_by: BTreeMap<String, String>,
}

/// One layer's state as the status reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LayerStatus {
    /// `file`, `all`, `group:NAME` or `device`.
    pub source: String,
    /// The signed document's version (none for the local file).
    pub version: Option<u64>,
    /// sha256 (hex) of the layer's text.
    pub sha256: String,
    /// When it was applied (ns since the epoch), if it was.
    pub applied_at_ns: Option<i64>,
    /// `applied`, `failed` (valid document, invalid effective config) or `refused`
    /// (signature, version, size or a locked key).
    pub state: LayerState,
    /// Why it failed or was refused.
    pub error: Option<String>,
}

/// See [`LayerStatus::state`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LayerState {
    /// In the running config.
    Applied,
    /// Valid on its own, but the effective config with it was not.
    Failed,
    /// Refused before merging.
    Refused,
}

/// No layer above the local file: the agent without `[fleet]`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalOnly;

impl Layers for LocalOnly {
    fn effective(&self, local: toml::Table) -> Result<Effective, String> {
        Ok(Effective {
            table: local,
            set_by: BTreeMap::new(),
        })
    }
    fn status(&self) -> Vec<LayerStatus> {
        Vec::new()
    }
}

/// What asked for a reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP.
    Signal,
    /// `POST /api/v1/reload` (`edgewatch reload`).
    Api,
    /// `[config] watch = true` saw the file change.
    FileWatch,
    /// A fleet layer changed (`all`, `group:NAME`, `device`).
    Fleet {
        /// The layer that changed.
        source: String,
    },
}

/// A request to re-read the local file, merge the layers and apply the result in place.
#[derive(Debug)]
pub struct ReloadRequest {
    /// Why.
    pub trigger: Trigger,
    /// Where the report goes, if anyone waits for it.
    pub reply: Option<tokio::sync::oneshot::Sender<ReloadReport>>,
}

/// The sending side every reload trigger holds.
pub type ReloadSender = tokio::sync::mpsc::Sender<ReloadRequest>;

/// The outcome of one reload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReloadReport {
    /// The new config is running (false: nothing changed).
    pub ok: bool,
    /// Why it was not applied.
    pub error: Option<String>,
    /// sha256 (hex) of the effective config now running.
    pub sha256: String,
    /// What changed and was applied in place (`alert rules`, `sink influx`, ...).
    pub applied: Vec<String>,
    /// Keys that changed but need a restart (`http.listen`, `storage.data_dir`).
    pub restart_required: Vec<String>,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trigger::Signal => f.write_str("signal"),
            Trigger::Api => f.write_str("api"),
            Trigger::FileWatch => f.write_str("watch"),
            Trigger::Fleet { source } => write!(f, "fleet:{source}"),
        }
    }
}
