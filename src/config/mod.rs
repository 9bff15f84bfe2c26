//! Typed configuration: the annotated default file `config/edgewatch.toml` is compiled in
//! and is the single source of defaults; a user file, `EDGEWATCH_*` environment variables
//! and command-line flags are layered over it in that order. Unknown keys are errors, and
//! every error names the key and, for files, the line. This module only parses and
//! validates; it never opens sockets or files other than the config file itself.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub mod clock;
pub mod digest;
pub mod layers;
pub mod load;
pub mod log;
pub mod values;

pub use digest::config_sha256;
pub use values::{Interval, Secret};

/// The built-in default configuration, exactly as shipped in `config/edgewatch.toml`.
pub const DEFAULT_CONFIG: &str = include_str!("../../config/edgewatch.toml");

/// Prefix of environment variables that override config keys.
pub const ENV_PREFIX: &str = "EDGEWATCH_";

/// Everything the agent can be configured with.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[http]`
    pub http: HttpConfig,
    /// `[udp]`
    pub udp: UdpConfig,
    /// `[storage]`
    pub storage: StorageConfig,
    /// `[ingest]`
    pub ingest: IngestConfig,
    /// `[host]`
    pub host: HostConfig,
    /// `[tegrastats]`
    pub tegrastats: crate::collect::tegrastats::config::TegrastatsConfig,
    /// `[nvml]`
    pub nvml: crate::collect::nvml::config::NvmlConfig,
    /// `[jetson]`
    pub jetson: crate::collect::jetson::config::JetsonConfig,
    /// `[kmsg]`
    pub kmsg: crate::collect::kmsg::config::KmsgConfig,
    /// `[rollup]`
    pub rollup: crate::rollup::config::RollupConfig,
    /// `[retention]`
    pub retention: crate::rollup::config::RetentionConfig,
    /// `[inference]`
    pub inference: crate::engine::config::InferenceConfig,
    /// `[log]`
    pub log: LogConfig,
    /// `[clock]`
    pub clock: clock::ClockConfig,
    /// `[health]`
    pub health: HealthConfig,
    /// `[config]`: how the running agent follows its config file (live reload).
    pub config: ConfigFileConfig,
    /// Top-level `device_id`: added to every forwarded point (unset: `/etc/machine-id`, else
    /// the host name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// `[tags]`: static tags added to every forwarded point.
    pub tags: std::collections::BTreeMap<String, String>,
    /// `[[sink]]`: where the forwarder sends (see `src/forward/`).
    pub sink: Vec<crate::forward::config::SinkConfig>,
    /// `[[scrape]]`: Prometheus endpoints to scrape (see `src/collect/scrape/`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scrape: Vec<crate::collect::scrape::config::ScrapeConfig>,
    /// `[[process]]`: watched processes (see `src/collect/process/`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub process: Vec<crate::collect::process::config::ProcessConfig>,
    /// `[process_watch]`: how often the watched processes are scanned.
    pub process_watch: crate::collect::process::config::ProcessWatchConfig,
    /// `[alerts]`: evaluation period and the built-in rules (see `src/alert/`).
    pub alerts: crate::alert::config::AlertsConfig,
    /// `[[alert]]`: the user's alert rules.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alert: Vec<crate::alert::config::AlertRuleConfig>,
    /// `[[notify]]`: where alert notifications go (see `src/alert/notify/`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<crate::alert::notify::config::NotifyConfig>,
    /// `[fleet]`: signed remote config layers (see `src/fleet/`).
    pub fleet: crate::fleet::config::FleetConfig,
}

/// `[http]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Body limit after decompression.
    pub max_body_bytes: u64,
    /// Access token (bearer, `Token`, basic-auth password or `p=`); empty: none.
    pub token: Secret,
    /// Whether `/metrics` answers without the token.
    pub metrics_open: bool,
    /// Measurements `/metrics` exports from the store (empty: every one).
    pub metrics_include: Vec<MeasurementPattern>,
    /// Measurements `/metrics` leaves out (after `metrics_include`).
    pub metrics_exclude: Vec<MeasurementPattern>,
}

/// A measurement name, or a prefix ending in `*` (`gpu*`), as `[http] metrics_include` and
/// `metrics_exclude` list them; refused when read if empty or with `*` anywhere else.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(try_from = "String", into = "String")]
pub struct MeasurementPattern(String);

impl TryFrom<String> for MeasurementPattern {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let body = s.strip_suffix('*').unwrap_or(&s);
        if s.is_empty() || body.contains('*') {
            return Err(format!(
                "invalid measurement pattern {s:?}: write a measurement name, or a prefix ending in `*` (e.g. \"gpu*\")"
            ));
        }
        Ok(MeasurementPattern(s))
    }
}

impl From<MeasurementPattern> for String {
    fn from(p: MeasurementPattern) -> String {
        p.0
    }
}

impl MeasurementPattern {
    /// Whether `measurement` is this name, or starts with this prefix.
    pub fn matches(&self, measurement: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => measurement.starts_with(prefix),
            None => measurement == self.0,
        }
    }
}

impl HttpConfig {
    /// Whether `/metrics` exports the store's series of `measurement`.
    pub fn metrics_exports(&self, measurement: &str) -> bool {
        (self.metrics_include.is_empty()
            || self.metrics_include.iter().any(|p| p.matches(measurement)))
            && !self.metrics_exclude.iter().any(|p| p.matches(measurement))
    }
}

/// `[udp]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UdpConfig {
    /// Whether the UDP listener runs.
    pub enabled: bool,
    /// Listen address.
    pub listen: SocketAddr,
    /// Timestamp precision of UDP lines.
    pub precision: PrecisionName,
    /// Accept UDP writes on a non-loopback `listen` (UDP carries no credential).
    pub allow_unauthenticated: bool,
}

/// `[storage]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Store directory.
    pub data_dir: PathBuf,
    /// Series cap.
    pub max_series: NonZeroUsize,
    /// SQLite synchronous mode.
    pub synchronous: Synchronous,
}

/// SQLite durability level of the ingest writer (the forwarders' cursors always sync).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// Durable across a crash of the process, not of the OS or a power cut: the WAL is
    /// synced only at checkpoints, so the writes acknowledged since the last one may roll
    /// back (WAL, synchronous=NORMAL). Opt-in.
    Normal,
    /// Durable across power loss: the WAL is synced before each commit returns, so before
    /// any 204 (WAL, synchronous=FULL). The default.
    #[default]
    Full,
}

/// `[ingest]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// Queue capacity in points.
    pub queue_points: NonZeroUsize,
    /// Group-commit size in points.
    pub max_batch_points: NonZeroUsize,
    /// How long points nobody waits on (UDP, collectors) may be held to share a commit.
    pub flush_interval: crate::config::values::Delay,
}

/// `[host]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// Whether the host collector runs.
    pub enabled: bool,
    /// Sampling interval.
    pub interval: Interval,
}

/// `[health]` (the agent's own health points, `crate::collect::health`)
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Write `edgewatch_agent` / `edgewatch_event` points.
    pub enabled: bool,
    /// How often.
    pub interval: Interval,
    /// How often the agent's inventory (`edgewatch_agent_info`: version, hardware, power
    /// mode, config hash) is written, `crate::collect::inventory`.
    pub inventory_interval: Interval,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            interval: Interval(Duration::from_secs(10)),
            inventory_interval: Interval(Duration::from_secs(60)),
        }
    }
}

/// `[config]`: whether the agent watches its config file and reloads it when it changes
/// (SIGHUP, `POST /api/v1/reload` and `edgewatch reload` work either way).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConfigFileConfig {
    /// Reload when the file's size, mtime or content changes (checked every 2 s).
    pub watch: bool,
}

/// `[log]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Log filter: a level or `target=level` pairs (`log::parse_filter`); checked when read.
    #[serde(deserialize_with = "log::deserialize_level")]
    pub level: String,
}

/// A validated timestamp precision name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrecisionName(pub crate::ingest::lineproto::Precision);

impl Serialize for PrecisionName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.name())
    }
}

impl<'de> Deserialize<'de> for PrecisionName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        crate::ingest::lineproto::Precision::parse(&s)
            .map(PrecisionName)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "invalid precision {s:?}: expected one of ns, us, ms, s, m, h"
                ))
            })
    }
}

/// Why a configuration could not be loaded. The message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// Bad TOML, an unknown key or a bad value in a file; the message names line and key.
    #[error("invalid config {origin}: {message}")]
    File {
        /// Which file.
        origin: String,
        /// toml's message, with line, column and key.
        message: String,
    },
    /// A layer above the local file could not be merged (the message names it).
    #[error("invalid config layers: {0}")]
    Layers(String),
    /// A bad environment override.
    #[error("invalid environment variable {var}: {message}")]
    Env {
        /// The variable.
        var: String,
        /// What is wrong.
        message: String,
    },
}

impl Config {
    /// The built-in defaults.
    pub fn builtin() -> Config {
        // The embedded file is checked by a unit test; failing here is a build defect.
        Self::from_toml_str(DEFAULT_CONFIG, "<built-in>")
            .expect("embedded default config must be valid")
    }

    /// Parses a config text; keys it leaves out keep their built-in defaults.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::File {
            origin: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        crate::forward::config::validate_all(&cfg.sink).map_err(|message| ConfigError::File {
            origin: origin.to_string(),
            message,
        })?;
        crate::forward::config::validate_modes(&cfg.sink, &cfg.rollup.tiers).map_err(
            |message| ConfigError::File {
                origin: origin.to_string(),
                message,
            },
        )?;
        crate::collect::scrape::config::validate_all(&cfg.scrape).map_err(|message| {
            ConfigError::File {
                origin: origin.to_string(),
                message,
            }
        })?;
        crate::collect::kmsg::config::validate(&cfg.kmsg).map_err(|message| ConfigError::File {
            origin: origin.to_string(),
            message,
        })?;
        crate::collect::process::config::validate_all(&cfg.process).map_err(|message| {
            ConfigError::File {
                origin: origin.to_string(),
                message,
            }
        })?;
        crate::alert::notify::config::validate_all(&cfg.notify, text).map_err(|message| {
            ConfigError::File {
                origin: origin.to_string(),
                message,
            }
        })?;
        crate::alert::config::validate_all(&cfg.alerts, &cfg.alert, text).map_err(|message| {
            ConfigError::File {
                origin: origin.to_string(),
                message,
            }
        })?;
        crate::fleet::config::validate(&cfg.fleet).map_err(|message| ConfigError::File {
            origin: origin.to_string(),
            message,
        })?;
        Ok(cfg)
    }

    /// Loads the effective config: built-in defaults, then `path` if given, then the
    /// environment variables in `env`.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
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
        let cfg = Self::from_toml_str(&text, &origin)?;
        cfg.with_env(env)
    }

    /// Applies `EDGEWATCH_SECTION__KEY=value` overrides.
    pub fn with_env(
        self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut overrides: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX))
            .collect();
        if overrides.is_empty() {
            return Ok(self);
        }
        overrides.sort();
        let mut table = toml::Table::try_from(&self).map_err(|e| ConfigError::Env {
            var: "(all)".into(),
            message: e.to_string(),
        })?;
        for (var, raw) in &overrides {
            let path = var[ENV_PREFIX.len()..].to_ascii_lowercase();
            let parts: Vec<&str> = path.split("__").collect();
            let value = parse_env_value(raw);
            let env_err = |message: String| ConfigError::Env {
                var: var.clone(),
                message,
            };
            match parts.as_slice() {
                // The device's identity: always a string, whatever it looks like.
                ["device_id"] => {
                    table.insert("device_id".into(), toml::Value::String(raw.clone()));
                }
                // Static tags: any key (`EDGEWATCH_TAGS__SITE=lab` adds or replaces `site`).
                ["tags", key] if !key.is_empty() => {
                    let tags = table
                        .entry("tags")
                        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                    if let Some(t) = tags.as_table_mut() {
                        t.insert((*key).to_string(), toml::Value::String(raw.clone()));
                    }
                }
                [section, key] if !section.is_empty() && !key.is_empty() => {
                    let sec = table
                        .get_mut(*section)
                        .and_then(|v| v.as_table_mut())
                        .ok_or_else(|| env_err(format!("unknown config section [{section}]")))?;
                    if !sec.contains_key(*key) {
                        return Err(env_err(format!("unknown key `{key}` in [{section}]")));
                    }
                    sec.insert((*key).to_string(), value);
                }
                _ => {
                    return Err(env_err(
                        "expected EDGEWATCH_<SECTION>__<KEY> (e.g. EDGEWATCH_HTTP__LISTEN), \
                         EDGEWATCH_DEVICE_ID or EDGEWATCH_TAGS__<TAG>"
                            .into(),
                    ))
                }
            }
            // Check each override on its own so the error names the variable.
            Config::deserialize(table.clone()).map_err(|e| env_err(e.to_string()))?;
        }
        Config::deserialize(table).map_err(|e| ConfigError::Env {
            var: "(combined)".into(),
            message: e.to_string(),
        })
    }
}

// Defaults for keys a user file leaves out. They must equal the embedded file's values:
// `defaults_match_the_embedded_file` checks that.
fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9400)),
            max_body_bytes: 25 * 1024 * 1024,
            token: Secret::default(),
            metrics_open: false,
            metrics_include: Vec::new(),
            metrics_exclude: Vec::new(),
        }
    }
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 8089)),
            precision: PrecisionName(crate::ingest::lineproto::Precision::Nanos),
            allow_unauthenticated: false,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: PathBuf::from("edgewatch-data"),
            max_series: nz(100_000),
            synchronous: Synchronous::Full,
        }
    }
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            queue_points: nz(50_000),
            max_batch_points: nz(20_000),
            flush_interval: crate::config::values::Interval(Duration::from_secs(15)),
        }
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            enabled: true,
            interval: Interval(Duration::from_secs(10)),
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
        }
    }
}

fn parse_env_value(raw: &str) -> toml::Value {
    // A bare TOML value (number, bool) if it parses as one; a string otherwise.
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => match t.remove("v") {
            Some(
                v @ (toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_)),
            ) => v,
            _ => toml::Value::String(raw.to_string()),
        },
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_match_the_embedded_file() {
        assert_eq!(
            Config::from_toml_str("", "empty").unwrap(),
            Config::builtin()
        );
        assert_eq!(Config::default(), Config::builtin());
    }

    #[test]
    fn builtin_defaults_are_the_documented_ones() {
        let c = Config::builtin();
        assert_eq!(c.http.listen.to_string(), "127.0.0.1:9400");
        assert_eq!(c.udp.listen.to_string(), "127.0.0.1:8089");
        assert_eq!(c.storage.data_dir, PathBuf::from("edgewatch-data"));
        assert_eq!(c.host.interval.0, Duration::from_secs(10));
    }

    #[test]
    fn a_partial_file_keeps_the_other_defaults() {
        let c = Config::from_toml_str("[http]\nlisten = \"127.0.0.1:1\"\n", "f").unwrap();
        assert_eq!(c.http.listen.port(), 1);
        assert_eq!(c.http.max_body_bytes, Config::builtin().http.max_body_bytes);
    }

    #[test]
    fn unknown_key_is_named_with_its_line() {
        let e = Config::from_toml_str("[http]\nlisten = \"127.0.0.1:1\"\nlisen = 3\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("lisen"), "{e}");
    }

    #[test]
    fn bad_value_is_named_with_its_line() {
        let e = Config::from_toml_str("\n[host]\ninterval = \"soon\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("interval") || e.contains("soon"), "{e}");
        let e = Config::from_toml_str("[http]\nlisten = \"nowhere\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn env_overrides_file_and_names_bad_vars() {
        let c = Config::builtin()
            .with_env(env(&[
                ("EDGEWATCH_HTTP__LISTEN", "127.0.0.1:7"),
                ("EDGEWATCH_STORAGE__MAX_SERIES", "5"),
                ("PATH", "/bin"),
            ]))
            .unwrap();
        assert_eq!(c.http.listen.port(), 7);
        assert_eq!(c.storage.max_series.get(), 5);
        let e = Config::builtin()
            .with_env(env(&[("EDGEWATCH_HTTP__LISTN", "x")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("EDGEWATCH_HTTP__LISTN") && e.contains("listn"),
            "{e}"
        );
        let e = Config::builtin()
            .with_env(env(&[("EDGEWATCH_STORAGE__MAX_SERIES", "0")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("EDGEWATCH_STORAGE__MAX_SERIES"), "{e}");
    }

    #[test]
    fn token_comes_from_the_env_and_is_redacted_in_debug() {
        let c = Config::builtin()
            .with_env(env(&[
                ("EDGEWATCH_HTTP__TOKEN", "s3cret-t0ken"),
                ("EDGEWATCH_HTTP__METRICS_OPEN", "true"),
            ]))
            .unwrap();
        assert_eq!(c.http.token.expose(), "s3cret-t0ken");
        assert!(c.http.metrics_open);
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("s3cret-t0ken"), "{dbg}");
        assert!(dbg.contains("<redacted>"), "{dbg}");
    }

    #[test]
    fn device_identity_and_sinks_survive_env_overrides() {
        let c = Config::from_toml_str(
            "device_id = \"jet-1\"\n[tags]\nsite = \"lab\"\n[[sink]]\ntype = \"influxdb\"\nname = \"i\"\n\
             url = \"http://127.0.0.1:8086\"\nversion = 1\ndatabase = \"edge\"\npassword = \"pw\"\n\
             max_delay = \"250ms\"\n[[sink]]\ntype = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://127.0.0.1:1883\"\n\
             topic = \"e/{device_id}\"\n",
            "f",
        )
        .unwrap();
        assert_eq!(c.sink.len(), 2);
        let again = c
            .clone()
            .with_env(env(&[("EDGEWATCH_LOG__LEVEL", "debug")]))
            .unwrap();
        assert_eq!(again.sink, c.sink);
        assert_eq!(again.device_id.as_deref(), Some("jet-1"));
        assert_eq!(again.tags["site"], "lab");
        let e = Config::from_toml_str(
            "[[sink]]\ntype = \"influxdb\"\nname = \"i\"\nurl = \"http://h:1\"\nversion = 1\n",
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("database") && e.contains("f.toml"), "{e}");
    }

    #[test]
    fn device_id_and_tags_come_from_the_environment_as_strings() {
        let c = Config::from_toml_str("[tags]\nsite = \"lab\"\nline = \"3\"\n", "f").unwrap();
        let c = c
            .with_env(env(&[
                ("EDGEWATCH_DEVICE_ID", "0042"),
                ("EDGEWATCH_TAGS__SITE", "plant-7"),
                ("EDGEWATCH_TAGS__RACK", "12"),
            ]))
            .unwrap();
        assert_eq!(c.device_id.as_deref(), Some("0042"));
        assert_eq!(c.tags["site"], "plant-7");
        assert_eq!(c.tags["rack"], "12");
        assert_eq!(c.tags["line"], "3");
        // Without a [tags] table in the file.
        let c = Config::builtin()
            .with_env(env(&[("EDGEWATCH_TAGS__SITE", "x")]))
            .unwrap();
        assert_eq!(c.tags["site"], "x");
        let e = Config::builtin()
            .with_env(env(&[("EDGEWATCH_TAGS", "x")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("EDGEWATCH_TAGS") && e.contains("EDGEWATCH_DEVICE_ID"),
            "{e}"
        );
    }

    #[test]
    fn the_effective_config_prints_as_toml_that_loads_back_equal() {
        let text = toml::to_string(&Config::builtin()).unwrap();
        assert_eq!(
            Config::from_toml_str(&text, "printed").unwrap(),
            Config::builtin()
        );
        // Every optional key and every section that is not a plain struct.
        let c = Config::from_toml_str(
            "device_id = \"jet-1\"\n[tags]\nsite = \"lab\"\n[http]\ntoken = \"t0k\"\n\
             [udp]\nprecision = \"ms\"\n[storage]\nsynchronous = \"full\"\n\
             [tegrastats]\nreplay = \"/tmp/t.log\"\n[retention]\nraw = \"1h 30m\"\n1m = \"7d\"\n\
             [inference]\noptimal_batch = { resnet = 8.0 }\n\
             [clock]\nmin_valid = \"2030-01-01T00:00:00Z\"\n\
             [[sink]]\ntype = \"influxdb\"\nname = \"i\"\nurl = \"http://127.0.0.1:8086\"\n\
             version = 1\ndatabase = \"edge\"\nusername = \"u\"\npassword = \"pw\"\nmax_delay = \"0s\"\n\
             [[sink]]\ntype = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://127.0.0.1:1883\"\n\
             topic = \"e/{device_id}\"\nkeepalive = \"30s\"\nformat = \"json\"\n",
            "f",
        )
        .unwrap();
        let text = toml::to_string(&c).unwrap();
        assert_eq!(
            Config::from_toml_str(&text, "printed").unwrap(),
            c,
            "{text}"
        );
        // Secrets are written as themselves (the env layering reloads them) ...
        assert!(text.contains("t0k") && text.contains("pw"), "{text}");
        // ... and redacted in Debug, which is what `check-config` prints.
        let dbg = format!("{c:#?}");
        assert!(!dbg.contains("t0k") && !dbg.contains("\"pw\""), "{dbg}");
    }

    #[test]
    fn env_round_trip_keeps_every_value() {
        let c = Config::builtin();
        let again = c.clone().with_env(env(&[("EDGEWATCH_LOG__LEVEL", "info")]));
        assert_eq!(again.unwrap(), c);
    }
}
