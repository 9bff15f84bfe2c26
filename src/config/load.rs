//! Loading through layers: the local file read as a table, the layers above it merged by
//! [`Layers::effective`], the merged table validated whole (what `check-config` checks),
//! then the `EDGEWATCH_*` environment. Also the effective config's identity (the sha256 of
//! its canonical serialization), its redacted form and which layer set each key, for
//! `/api/v1/config` and the status. Pure apart from reading the one config file; it never
//! applies anything (`crate::reload` does).

use std::collections::BTreeMap;
use std::path::Path;

use super::layers::{Effective, Layers};
use super::{Config, ConfigError, DEFAULT_CONFIG, ENV_PREFIX};

/// A loaded, validated effective config.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The config (env overrides applied).
    pub config: Config,
    /// sha256 (hex) of [`canonical`] of `config`.
    pub sha256: String,
    /// sha256 (hex) of the local file's text (of the built-in default without a file).
    pub file_sha256: String,
    /// Dotted key -> the layer that set it (`file`, `env`, a fleet layer); keys not listed
    /// are defaults.
    pub set_by: BTreeMap<String, String>,
}

impl Config {
    /// Loads the effective config: the file at `path` (the built-in default without one)
    /// as a table, `layers` merged above it, the result validated as a whole exactly as
    /// [`Config::from_toml_str`] validates a file, then the environment variables in `env`.
    /// With no layer above the file, errors name the file's lines.
    pub fn load_layered(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        layers: &dyn Layers,
    ) -> Result<Loaded, ConfigError> {
        let (text, origin) = match path {
            Some(p) => (
                std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_path_buf(),
                    source,
                })?,
                p.display().to_string(),
            ),
            None => (DEFAULT_CONFIG.to_string(), "<built-in>".to_string()),
        };
        let file_err = |message: String| ConfigError::File {
            origin: origin.clone(),
            message,
        };
        let local: toml::Table =
            toml::from_str(&text).map_err(|e| file_err(e.to_string().trim_end().to_string()))?;
        let Effective { table, set_by } = layers
            .effective(local.clone())
            .map_err(ConfigError::Layers)?;
        let config = if table == local {
            Config::from_toml_str(&text, &origin)?
        } else {
            // The validators name lines: give them the merged table as text.
            let merged = toml::to_string(&table).map_err(|e| ConfigError::Layers(e.to_string()))?;
            Config::from_toml_str(&merged, &format!("{origin} with its layers"))?
        };
        let env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX))
            .collect();
        let config = config.with_env(env.iter().cloned())?;
        let mut by = BTreeMap::new();
        for key in leaf_keys(&local) {
            by.insert(key, "file".to_string());
        }
        by.extend(set_by);
        for (var, _) in &env {
            let key = var[ENV_PREFIX.len()..]
                .to_ascii_lowercase()
                .replace("__", ".");
            by.insert(key, "env".to_string());
        }
        Ok(Loaded {
            sha256: sha256_hex(canonical(&config).as_bytes()),
            file_sha256: sha256_hex(text.as_bytes()),
            config,
            set_by: by,
        })
    }
}

pub use super::digest::{canonical, sha256_hex};

/// The config as a table with every non-empty secret as `"<redacted>"`.
pub fn redacted_table(cfg: &Config) -> toml::Table {
    super::values::redacted(|| toml::Table::try_from(cfg)).unwrap_or_default()
}

/// Every leaf key of `table`, dotted; an array of tables that have a `name` is keyed by it
/// (`alert.LatencyHigh.threshold`), another array is one leaf.
pub fn leaf_keys(table: &toml::Table) -> Vec<String> {
    let mut out = Vec::new();
    walk(table, "", &mut out);
    out
}

fn walk(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => walk(t, &key, out),
            toml::Value::Array(items)
                if !items.is_empty()
                    && items
                        .iter()
                        .all(|i| i.get("name").and_then(|n| n.as_str()).is_some()) =>
            {
                for i in items {
                    if let (Some(t), Some(name)) =
                        (i.as_table(), i.get("name").and_then(|n| n.as_str()))
                    {
                        walk(t, &format!("{key}.{name}"), out);
                    }
                }
            }
            _ => out.push(key),
        }
    }
}

/// Which layer set each leaf key of `cfg`: `set_by`'s entry, else `default`.
pub fn setters(cfg: &Config, set_by: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let table = toml::Table::try_from(cfg).unwrap_or_default();
    leaf_keys(&table)
        .into_iter()
        .map(|k| {
            let who = set_by
                .get(&k)
                .cloned()
                .unwrap_or_else(|| "default".to_string());
            (k, who)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::layers::LocalOnly;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn layered_load_equals_the_plain_load_and_names_setters() {
        let text = "[tags]\nsite = \"lab\"\n[[sink]]\ntype = \"influxdb\"\nname = \"i\"\n\
                    url = \"http://127.0.0.1:8086\"\nversion = 1\ndatabase = \"e\"\npassword = \"pw\"\n";
        let f = file(text);
        let env = vec![("EDGEWATCH_HOST__INTERVAL".to_string(), "5s".to_string())];
        let l = Config::load_layered(Some(f.path()), env.clone(), &LocalOnly).unwrap();
        assert_eq!(l.config, Config::load(Some(f.path()), env).unwrap());
        assert_eq!(l.sha256.len(), 64);
        let who = setters(&l.config, &l.set_by);
        assert_eq!(who["tags.site"], "file");
        assert_eq!(who["sink.i.url"], "file");
        assert_eq!(who["host.interval"], "env");
        assert_eq!(who["host.enabled"], "default");
        let red = toml::to_string(&redacted_table(&l.config)).unwrap();
        assert!(
            red.contains("<redacted>") && !red.contains("\"pw\""),
            "{red}"
        );
    }

    #[test]
    fn the_hash_follows_every_value_secrets_included() {
        let a = Config::builtin();
        let mut b = a.clone();
        assert_eq!(
            sha256_hex(canonical(&a).as_bytes()),
            sha256_hex(canonical(&b).as_bytes())
        );
        b.http.token = crate::config::Secret::new("x");
        assert_ne!(canonical(&a), canonical(&b));
    }

    #[test]
    fn bad_files_name_the_line() {
        let f = file("[host]\ninterval = \"5s\"\nintervl = 3\n");
        let e = Config::load_layered(Some(f.path()), Vec::new(), &LocalOnly)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3") && e.contains("intervl"), "{e}");
        let f = file("[host\n");
        let e = Config::load_layered(Some(f.path()), Vec::new(), &LocalOnly)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1"), "{e}");
    }

    struct Above;
    impl Layers for Above {
        fn effective(&self, mut local: toml::Table) -> Result<Effective, String> {
            local.insert("device_id".into(), toml::Value::String("from-above".into()));
            Ok(Effective {
                table: local,
                set_by: BTreeMap::from([("device_id".to_string(), "all".to_string())]),
            })
        }
        fn status(&self) -> Vec<crate::config::layers::LayerStatus> {
            Vec::new()
        }
    }

    #[test]
    fn a_layer_above_the_file_is_validated_and_named() {
        let f = file("[tags]\nsite = \"lab\"\n");
        let l = Config::load_layered(Some(f.path()), Vec::new(), &Above).unwrap();
        assert_eq!(l.config.device_id.as_deref(), Some("from-above"));
        assert_eq!(l.set_by["device_id"], "all");
        let f = file("[host]\nintervl = 3\n");
        let e = Config::load_layered(Some(f.path()), Vec::new(), &Above)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("with its layers") && e.contains("intervl"),
            "{e}"
        );
    }
}
