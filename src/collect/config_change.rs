//! The configuration-change event: at each start the agent fingerprints its effective
//! configuration section by section (`[http]`, `[alerts]`, `[[sink]]`, ...: a 64-bit FNV-1a
//! hash of each section's canonical JSON, so no value, and no secret, is written out),
//! compares it with the fingerprint the previous run left in `<data_dir>/config.fingerprint`
//! and, when a section differs, records one `edgewatch_event` (`kind=config_change`,
//! `source=agent`, info) naming the changed sections, so "the alert threshold changed at
//! 14:02" sits beside the data it changed. Today a configuration is applied by a restart, so
//! the event's `how` field is `restart`. The first start (no fingerprint yet) records
//! nothing. Reading and writing the file are the only effects; the comparison is pure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::event::{Event, Severity};
use crate::config::Config;
use crate::model::{Line, Value};

/// The fingerprint file's name inside `data_dir`.
pub const FILE: &str = "config.fingerprint";

/// Section name → hash (hex) of its canonical JSON.
pub type Fingerprint = BTreeMap<String, String>;

/// Why the fingerprint could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum ConfigChangeError {
    /// The configuration did not serialize (a bug: it was parsed from the same shape).
    #[error("cannot serialize the configuration: {0}")]
    Serialize(#[from] serde_json::Error),
    /// The file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The fingerprint of `cfg`: one hash per top-level section.
pub fn fingerprint(cfg: &Config) -> Result<Fingerprint, ConfigChangeError> {
    let value = serde_json::to_value(cfg)?;
    let mut out = Fingerprint::new();
    if let serde_json::Value::Object(map) = value {
        for (k, v) in map {
            let text = serde_json::to_string(&v)?;
            out.insert(k, format!("{:016x}", crate::hash::fnv1a(text.as_bytes())));
        }
    }
    Ok(out)
}

/// The sections added, removed or changed from `before` to `now`, sorted.
pub fn changed(before: &Fingerprint, now: &Fingerprint) -> Vec<String> {
    let mut keys: Vec<&String> = before.keys().chain(now.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| before.get(*k) != now.get(*k))
        .cloned()
        .collect()
}

/// The event for `sections` changed, applied by `how` (`restart`).
pub fn event(sections: &[String], how: &str, ts: i64) -> Line {
    let list = sections.join(", ");
    Event::new(
        "config_change",
        Severity::Info,
        "agent",
        format!("configuration changed since the last run ({how}): {list}"),
    )
    .field("sections", Value::Str(sections.join(",")))
    .field("how", Value::Str(how.into()))
    .line(ts)
}

/// Compares `cfg` with the previous run's fingerprint in `data_dir`, keeps the new one and
/// returns the event when a section changed. An unreadable or corrupt old file counts as
/// none (logged): the next start compares again.
pub fn at_start(cfg: &Config, data_dir: &Path, ts: i64) -> Result<Option<Line>, ConfigChangeError> {
    let path = data_dir.join(FILE);
    let now = fingerprint(cfg)?;
    let before: Option<Fingerprint> = match std::fs::read(&path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(fp) => Some(fp),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "config fingerprint unreadable; starting a new one");
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the config fingerprint");
            None
        }
    };
    if before.as_ref() != Some(&now) {
        // Owner-only: the hashes cover secrets too.
        let bytes = serde_json::to_vec_pretty(&now)?;
        crate::fsutil::write_atomic(&path, &bytes, 0o600).map_err(|source| {
            ConfigChangeError::Write {
                path: path.clone(),
                source,
            }
        })?;
    }
    Ok(before.and_then(|b| {
        let sections = changed(&b, &now);
        (!sections.is_empty()).then(|| event(&sections, "restart", ts))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_toml_str(text, "test").expect("config")
    }

    #[test]
    fn the_changed_sections_are_named_and_nothing_else() {
        let a = fingerprint(&cfg("[alerts]\nlatency_ratio = 3.0\n")).unwrap();
        let b = fingerprint(&cfg("[alerts]\nlatency_ratio = 5.0\n")).unwrap();
        assert_eq!(changed(&a, &b), vec!["alerts".to_string()]);
        assert!(changed(&a, &a).is_empty());
        let mut c = b.clone();
        c.remove("alerts");
        c.insert("extra".into(), "1".into());
        assert_eq!(changed(&b, &c), vec!["alerts".to_string(), "extra".into()]);
    }

    #[test]
    fn first_start_is_quiet_then_a_change_is_one_event() {
        let dir = tempfile::tempdir().unwrap();
        let one = cfg("[alerts]\nlatency_ratio = 3.0\n");
        let two = cfg("[alerts]\nlatency_ratio = 5.0\n");
        assert!(at_start(&one, dir.path(), 1).unwrap().is_none());
        assert!(at_start(&one, dir.path(), 2).unwrap().is_none());
        let ev = at_start(&two, dir.path(), 3).unwrap().expect("event");
        assert!(ev.key.contains("kind=config_change"), "{}", ev.key);
        let sections = ev.fields.iter().find(|f| f.0 == "sections").map(|f| &f.1);
        assert_eq!(sections, Some(&Value::Str("alerts".into())));
        assert!(at_start(&two, dir.path(), 4).unwrap().is_none());
        // A corrupt file is a fresh start, not an error.
        std::fs::write(dir.path().join(FILE), b"{not json").unwrap();
        assert!(at_start(&one, dir.path(), 5).unwrap().is_none());
        assert!(at_start(&two, dir.path(), 6).unwrap().is_some());
    }

    #[test]
    fn no_value_is_written_out() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg("[http]\ntoken = \"s3cret-token-value\"\n");
        at_start(&c, dir.path(), 1).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(!text.contains("s3cret"), "{text}");
    }
}
