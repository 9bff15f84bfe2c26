//! The `config` part of the status document (the effective config's sha256, its layers, the
//! last reload and the reload counters) and [`ConfigState`], where the reloader records them
//! and the API reads them (with the redacted effective config of `/api/v1/config` and the
//! sender that `POST /api/v1/reload` asks on). Shapes and a holder only: it decides nothing.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::StatusCell;
use crate::config::layers::{LayerStatus, Layers, ReloadSender};

/// `config` in `/api/v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigInfo {
    /// sha256 (hex) of the effective config now running (its canonical TOML).
    pub sha256: String,
    /// The layers, the local file first.
    pub layers: Vec<LayerStatus>,
    /// The last reload (`null`: none since start).
    pub last_reload: Option<LastReload>,
    /// Keys changed since start that take effect only at the next restart.
    pub restart_required: Vec<String>,
    /// Reloads applied since start.
    pub reloads_applied: u64,
    /// Reloads refused (invalid config) since start.
    pub reloads_failed: u64,
}

/// One reload as the status shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LastReload {
    /// When (RFC 3339).
    pub time: String,
    /// When, ns since the epoch.
    pub ts_ns: i64,
    /// `signal`, `api`, `watch`, `fleet:<layer>`.
    pub trigger: String,
    /// Applied (false: nothing changed).
    pub ok: bool,
    /// Why not.
    pub error: Option<String>,
    /// The parts applied in place.
    pub applied: Vec<String>,
    /// Changed keys that need a restart.
    pub restart_required: Vec<String>,
}

/// The config's live state, shared by the reloader (writes) and the API (reads).
pub struct ConfigState {
    /// The status part.
    pub info: StatusCell<ConfigInfo>,
    /// `/api/v1/config`: `{sha256, config (secrets redacted), set_by}`.
    pub effective: StatusCell<Arc<serde_json::Value>>,
    /// Where reload requests go.
    pub reload: ReloadSender,
    /// The layers above the local file, whose states are read when the status is.
    pub layers: Arc<dyn Layers>,
}

impl ConfigState {
    /// The status part now. The layers' states are read live: a fleet layer is committed
    /// (or marked failed) after the reload that applied it answered, so a copy taken at
    /// the reload would show it one step behind.
    pub fn snapshot(&self) -> ConfigInfo {
        let mut info = self.info.snapshot();
        info.layers.retain(|l| l.source == "file");
        info.layers.extend(
            self.layers
                .status()
                .into_iter()
                .filter(|l| l.source != "file"),
        );
        info
    }
}
