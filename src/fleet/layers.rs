//! The fleet layers of one device (`all`, each group, `device`) and their durable copies:
//! each applied layer is its signed document as received, in `<data_dir>/fleet/`, written
//! atomically (mode 0600) only once the effective config with it was accepted. A document
//! offered by a transport is checked (size, form, signature, version, TOML, locked
//! sections) and held as the layer's candidate, which [`Layers::effective`] merges while
//! the reload it triggered runs; the reload's answer commits it or drops it (the previous
//! applied document stays). Never talks to a broker or a server, never applies a config.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

use super::doc;
use super::merge;
use crate::config::layers::{Effective, LayerState, LayerStatus, Layers, ReloadReport};

/// Why the layers cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum LayersError {
    /// `<data_dir>/fleet` cannot be created.
    #[error("cannot create {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// `[fleet] public_key` does not decode.
    #[error("[fleet] {0}")]
    Key(#[from] doc::DocError),
}

/// One verified document.
#[derive(Debug, Clone)]
struct Held {
    version: u64,
    sha256: String,
    fragment: toml::Table,
    text: Vec<u8>,
}

#[derive(Debug, Default)]
struct Slot {
    applied: Option<Held>,
    applied_at_ns: Option<i64>,
    candidate: Option<Held>,
    /// The highest version ever applied here (survives a layer dropped at start).
    floor: Option<(u64, String)>,
    state: Option<LayerState>,
    error: Option<String>,
}

/// Counters of the transports, for the status.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Counters {
    /// Documents received (MQTT messages, HTTP 200s).
    pub received: u64,
    /// HTTP polls answered 304.
    pub not_modified: u64,
    /// HTTP polls made.
    pub polls: u64,
    /// The broker connection, or the last poll: `connected`, `ok` or the error.
    pub link: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    slots: BTreeMap<String, Slot>,
    file_sha: String,
    effective_sha: String,
    counters: Counters,
}

/// What became of an offered document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// The version and text already applied: nothing to do.
    Unchanged,
    /// Held as the layer's candidate: reload now, then [`FleetLayers::commit`].
    Candidate {
        /// Its version.
        version: u64,
    },
    /// Refused before merging; the reason.
    Refused(String),
}

/// The remote layers of this device.
#[derive(Debug)]
pub struct FleetLayers {
    key: Vec<u8>,
    sources: Vec<String>,
    allow: Vec<String>,
    max: usize,
    dir: PathBuf,
    device_id: String,
    state: Mutex<State>,
    /// One document at a time goes through offer, reload and commit.
    pub(super) apply: tokio::sync::Mutex<()>,
}

/// The file of layer `source` in `dir`.
pub fn file_of(dir: &Path, source: &str) -> PathBuf {
    dir.join(format!("{}.signed", source.replace(':', "-")))
}

impl FleetLayers {
    /// Opens the layers of `cfg` kept in `<data_dir>/fleet/`, verifying each stored
    /// document again (one that no longer verifies is `refused` and not applied).
    pub fn open(
        cfg: &super::config::FleetConfig,
        data_dir: &Path,
        device_id: &str,
    ) -> Result<FleetLayers, LayersError> {
        let dir = data_dir.join("fleet");
        std::fs::create_dir_all(&dir).map_err(|source| LayersError::Dir {
            path: dir.clone(),
            source,
        })?;
        let layers = FleetLayers {
            key: doc::public_key(&cfg.public_key)?,
            sources: cfg.sources(),
            allow: cfg.allow.clone(),
            max: cfg.max_document_bytes,
            dir,
            device_id: device_id.to_string(),
            state: Mutex::new(State::default()),
            apply: tokio::sync::Mutex::new(()),
        };
        let mut st = layers.lock();
        for source in &layers.sources {
            let slot = st.slots.entry(source.clone()).or_default();
            let path = file_of(&layers.dir, source);
            let text = match std::fs::read(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    slot.state = Some(LayerState::Refused);
                    slot.error = Some(format!("cannot read {}: {e}", path.display()));
                    continue;
                }
            };
            match layers.check(&text) {
                Ok(held) => {
                    slot.floor = Some((held.version, held.sha256.clone()));
                    slot.applied_at_ns = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map(|d| d.as_nanos() as i64);
                    slot.applied = Some(held);
                    slot.state = Some(LayerState::Applied);
                }
                Err(e) => {
                    tracing::warn!(layer = %source, error = %e, "stored fleet layer refused");
                    slot.state = Some(LayerState::Refused);
                    slot.error = Some(format!("stored document: {e}"));
                }
            }
        }
        drop(st);
        Ok(layers)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The layers, lowest first.
    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    /// The device this agent is.
    pub fn device_id(&self) -> &str {
        &self.device_id
    }

    /// Size, form, signature, TOML and locked sections: everything but the version.
    fn check(&self, text: &[u8]) -> Result<Held, String> {
        let d = doc::parse(text, self.max).map_err(|e| e.to_string())?;
        d.verify(&self.key).map_err(|e| e.to_string())?;
        let fragment: toml::Table = toml::from_str(&d.body).map_err(|e| {
            format!(
                "the fragment is not valid TOML: {}",
                e.to_string().trim_end()
            )
        })?;
        merge::check_locked(&fragment, &self.allow)?;
        Ok(Held {
            version: d.version,
            sha256: doc::sha256_hex(text),
            fragment,
            text: text.to_vec(),
        })
    }

    /// Checks a document received for layer `source` and holds it as the candidate.
    pub fn offer(&self, source: &str, text: &[u8]) -> Offer {
        let mut st = self.lock();
        st.counters.received += 1;
        let Some(slot) = st.slots.get_mut(source) else {
            return Offer::Refused(format!("{source} is not a layer of this device"));
        };
        let refuse = |slot: &mut Slot, why: String| {
            slot.state = Some(LayerState::Refused);
            slot.error = Some(why.clone());
            Offer::Refused(why)
        };
        let held = match self.check(text) {
            Ok(h) => h,
            Err(e) => return refuse(slot, e),
        };
        if let Some((v, sha)) = &slot.floor {
            if held.version < *v {
                let why = format!(
                    "version {} is older than version {v}, already applied (replay refused)",
                    held.version
                );
                return refuse(slot, why);
            }
            if held.version == *v {
                if held.sha256 == *sha {
                    // The running document again (a retained message on connect): any
                    // refusal since is over.
                    if slot.applied.is_some() {
                        slot.state = Some(LayerState::Applied);
                        slot.error = None;
                    }
                    return Offer::Unchanged;
                }
                let why = format!(
                    "version {v} is already applied with another text: sign the change as a higher version"
                );
                return refuse(slot, why);
            }
        }
        let version = held.version;
        slot.candidate = Some(held);
        Offer::Candidate { version }
    }

    /// Ends the reload of `source`'s candidate: kept (and stored) if `report.ok`, else
    /// dropped with the layer marked `failed`.
    pub fn commit(&self, source: &str, report: &ReloadReport) {
        let mut st = self.lock();
        if report.ok {
            st.effective_sha = report.sha256.clone();
        }
        let Some(slot) = st.slots.get_mut(source) else {
            return;
        };
        let Some(held) = slot.candidate.take() else {
            return;
        };
        if !report.ok {
            slot.state = Some(LayerState::Failed);
            slot.error = Some(format!(
                "version {}: {}",
                held.version,
                report
                    .error
                    .as_deref()
                    .unwrap_or("the effective config was not applied")
            ));
            return;
        }
        let path = file_of(&self.dir, source);
        if let Err(e) = crate::fsutil::write_atomic(&path, &held.text, 0o600) {
            // Running, but not durable: say so; the next start runs the previous one.
            tracing::error!(file = %path.display(), error = %e, "fleet layer applied but not stored");
            slot.error = Some(format!("applied but not stored ({}): {e}", path.display()));
        } else {
            slot.error = None;
        }
        slot.floor = Some((held.version, held.sha256.clone()));
        slot.applied = Some(held);
        slot.applied_at_ns = Some(crate::now_ns());
        slot.state = Some(LayerState::Applied);
    }

    /// At start: takes the highest applied layer out of the effective config (its
    /// effective config did not validate); returns it, or `None` when none is left.
    pub fn drop_top(&self, error: &str) -> Option<String> {
        let mut st = self.lock();
        for source in self.sources.iter().rev() {
            if let Some(slot) = st.slots.get_mut(source) {
                if let Some(h) = slot.applied.take() {
                    slot.state = Some(LayerState::Failed);
                    slot.error = Some(format!("version {}: {error}", h.version));
                    return Some(source.clone());
                }
            }
        }
        None
    }

    /// Records the effective config's sha256 (at start).
    pub fn set_effective_sha(&self, sha: &str) {
        self.lock().effective_sha = sha.to_string();
    }

    /// Updates the transport counters.
    pub fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut self.lock().counters)
    }

    /// The status document (status topic, `<data_dir>/fleet/status.json`).
    pub fn report(&self) -> serde_json::Value {
        let layers = self.status();
        let st = self.lock();
        // The same on every device that runs the same layer documents.
        let fleet_sha = doc::sha256_hex(
            layers
                .iter()
                .filter(|l| l.source != "file" && l.state == LayerState::Applied)
                .map(|l| format!("{}={};", l.source, l.sha256))
                .collect::<String>()
                .as_bytes(),
        );
        serde_json::json!({
            "device_id": self.device_id,
            "sha256": st.effective_sha,
            "fleet_sha256": fleet_sha,
            "layers": layers,
            "transport": st.counters,
            "updated_at_ns": crate::now_ns(),
        })
    }

    /// Writes [`FleetLayers::report`] to `<data_dir>/fleet/status.json`.
    pub fn write_report(&self) -> serde_json::Value {
        let r = self.report();
        let path = self.dir.join("status.json");
        if let Err(e) = crate::fsutil::write_atomic(&path, r.to_string().as_bytes(), 0o600) {
            tracing::warn!(file = %path.display(), error = %e, "fleet status not written");
        }
        r
    }
}

impl Layers for FleetLayers {
    fn effective(&self, local: toml::Table) -> Result<Effective, String> {
        let mut st = self.lock();
        st.file_sha = doc::sha256_hex(toml::to_string(&local).unwrap_or_default().as_bytes());
        let mut out = Effective {
            table: local,
            set_by: BTreeMap::new(),
        };
        for k in collect_keys(&out.table, "") {
            out.set_by.insert(k, "file".into());
        }
        for source in &self.sources {
            let Some(slot) = st.slots.get(source) else {
                continue;
            };
            let Some(h) = slot.candidate.as_ref().or(slot.applied.as_ref()) else {
                continue;
            };
            merge::merge(&mut out.table, &h.fragment, source, &mut out.set_by)
                .map_err(|e| format!("layer {source} version {}: {e}", h.version))?;
        }
        Ok(out)
    }

    fn status(&self) -> Vec<LayerStatus> {
        let st = self.lock();
        let mut v = vec![LayerStatus {
            source: "file".into(),
            version: None,
            sha256: st.file_sha.clone(),
            applied_at_ns: None,
            state: LayerState::Applied,
            error: None,
        }];
        for source in &self.sources {
            let Some(slot) = st.slots.get(source) else {
                continue;
            };
            let Some(state) = slot.state else {
                continue;
            };
            v.push(LayerStatus {
                source: source.clone(),
                version: slot.applied.as_ref().map(|h| h.version),
                sha256: slot
                    .applied
                    .as_ref()
                    .map(|h| h.sha256.clone())
                    .unwrap_or_default(),
                applied_at_ns: slot.applied.as_ref().and(slot.applied_at_ns),
                state,
                error: slot.error.clone(),
            });
        }
        v
    }
}

/// Dotted keys of every leaf of `t` (named entries as `alert.NAME.key`).
fn collect_keys(t: &toml::Table, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in t {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(s) => out.extend(collect_keys(s, &path)),
            toml::Value::Array(a)
                if prefix.is_empty() && merge::NAMED_ARRAYS.contains(&k.as_str()) =>
            {
                for e in a {
                    if let (Some(n), Some(s)) =
                        (e.get("name").and_then(|n| n.as_str()), e.as_table())
                    {
                        out.extend(collect_keys(s, &format!("{path}.{n}")));
                    }
                }
            }
            _ => out.push(path),
        }
    }
    out
}

#[cfg(test)]
#[path = "layers_tests.rs"]
mod tests;
