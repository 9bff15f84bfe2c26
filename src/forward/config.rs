//! `[[sink]]` tables: one typed, validated struct per sink. Parsing only; nothing here opens
//! a socket or a file. Secrets (`password`, `token`) are redacted in `Debug`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::values::{Delay, Interval, Secret};
use crate::deliver::Retry;

/// The kind of remote end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// InfluxDB (1.x `/write` or 2.x `/api/v2/write`), or anything speaking those APIs.
    Influxdb,
    /// An MQTT broker.
    Mqtt,
    /// A Prometheus remote write 1.0 receiver (Prometheus, VictoriaMetrics, Mimir, Thanos
    /// receive, ...): protobuf `WriteRequest`, snappy block format.
    #[serde(rename = "prometheus_remote_write")]
    PrometheusRemoteWrite,
}

impl SinkKind {
    /// The `type` value as written in the config and shown in the status.
    pub fn name(self) -> &'static str {
        match self {
            SinkKind::Influxdb => "influxdb",
            SinkKind::Mqtt => "mqtt",
            SinkKind::PrometheusRemoteWrite => "prometheus_remote_write",
        }
    }
}

/// Payload format of MQTT messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// InfluxDB line protocol (Telegraf `data_format = "influx"`).
    Line,
    /// `{"device_id", "seq", "part", "parts", "points": [{measurement, tags, fields, time}]}`.
    Json,
}

/// How a remote-write sink's histograms are sent (`histogram_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HistFormat {
    /// Prometheus native histograms (remote write 1.0 `Histogram`), schema 8.
    #[default]
    Native,
    /// VictoriaMetrics `vmrange` bucket counters, one per sketch bin.
    Vmrange,
}

/// The fields sent as histograms by default (`histogram_fields`): the `inference` and `llm`
/// latencies of the README's conventions.
pub const DEFAULT_HIST_FIELDS: [&str; 5] = [
    "inference.wall_ms",
    "inference.gpu_ms",
    "llm.ttft_ms",
    "llm.itl_ms",
    "llm.e2e_ms",
];

/// The name of the cursor (and status entry) of sink `name`'s histograms.
pub fn hist_sink_name(name: &str) -> String {
    format!("{name}#histograms")
}

// -- Bandwidth-aware forwarding: the `forward` key's value (src/forward/rollup.rs uses it) --
/// The tiers a sink may forward: name and resolution in seconds.
pub const TIERS: [(&str, i64); 2] = [("1m", 60), ("1h", 3600)];

/// What a sink forwards (`forward` in `[[sink]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub enum ForwardMode {
    /// Every raw point (default).
    #[default]
    Raw,
    /// One point per series, field and bucket of the rollup tier of this resolution
    /// (seconds).
    Rollup(i64),
}

impl ForwardMode {
    /// The tier's resolution in seconds; `None` in raw mode.
    pub fn tier_s(self) -> Option<i64> {
        match self {
            ForwardMode::Raw => None,
            ForwardMode::Rollup(s) => Some(s),
        }
    }

    /// The tier's name (`1m`) in rollup mode.
    pub fn tier_name(self) -> Option<&'static str> {
        let s = self.tier_s()?;
        TIERS.iter().find(|t| t.1 == s).map(|t| t.0)
    }
}

impl TryFrom<String> for ForwardMode {
    type Error = String;

    fn try_from(v: String) -> Result<Self, String> {
        if v == "raw" {
            return Ok(ForwardMode::Raw);
        }
        if let Some(t) = v.strip_prefix("rollup:") {
            if let Some((_, s)) = TIERS.iter().find(|(n, _)| *n == t) {
                return Ok(ForwardMode::Rollup(*s));
            }
        }
        Err(format!(
            "forward = {v:?}: expected \"raw\", \"rollup:1m\" or \"rollup:1h\""
        ))
    }
}

impl From<ForwardMode> for String {
    fn from(m: ForwardMode) -> String {
        m.to_string()
    }
}

impl std::fmt::Display for ForwardMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.tier_name() {
            None => f.write_str("raw"),
            Some(n) => write!(f, "rollup:{n}"),
        }
    }
}

// -- end `forward` --

/// One `[[sink]]` table. Keys that do not apply to the sink's `type` are errors.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    /// `influxdb`, `mqtt` or `prometheus_remote_write`.
    #[serde(rename = "type")]
    pub kind: SinkKind,
    /// Unique name; keys the durable cursor in the store.
    pub name: String,
    /// `http(s)://host:port` (InfluxDB), `mqtt(s)://host:port` (MQTT), or the whole write
    /// URL of a remote write receiver (`http://vm:8428/api/v1/write`).
    pub url: String,
    /// Off: the sink keeps its cursor and does not send.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Most points per batch.
    #[serde(default = "d_max_points")]
    pub max_points: usize,
    /// Most bytes per batch (uncompressed payload; a single chunk may exceed it).
    #[serde(default = "d_max_bytes")]
    pub max_bytes: usize,
    /// How long a partial batch may wait for more points.
    #[serde(default = "d_max_delay")]
    pub max_delay: Delay,
    /// Most points per second sent (metered links); 0 = no limit.
    #[serde(default)]
    pub max_rate: u64,
    /// `timeout`, `min_backoff`, `max_backoff` (also how often a paused sink tries again).
    #[serde(flatten)]
    pub retry: Retry,
    // -- Bandwidth-aware forwarding and reconnect storms (src/forward/rollup.rs) --
    /// What the sink forwards: `raw` (every point, default) or `rollup:1m` / `rollup:1h`
    /// (one point per series, field and final bucket of that tier: mean, min, max, count,
    /// p50, p90, p99, tagged `edgewatch_rollup`).
    #[serde(default, skip_serializing_if = "is_raw")]
    pub forward: ForwardMode,
    /// When the link returns after failures, and at start with a backlog, the first send
    /// waits a random delay in `[0, reconnect_jitter)` so a fleet coming back together does
    /// not hit the receiver in the same second; 0 = off.
    #[serde(default = "d_reconnect_jitter")]
    pub reconnect_jitter: Delay,
    // -- end bandwidth-aware forwarding --
    /// gzip payloads (default: on for InfluxDB, off for MQTT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gzip: Option<bool>,
    /// `username`, `password`: InfluxDB 1.x and remote write basic auth, MQTT credentials.
    #[serde(flatten)]
    pub credentials: crate::deliver::Credentials,

    // InfluxDB
    /// 1 (`/write`) or 2 (`/api/v2/write`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u8>,
    /// 1.x database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// 1.x retention policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<String>,
    /// 2.x organization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org: Option<String>,
    /// 2.x bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// 2.x token; for `prometheus_remote_write`, the bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,

    // Prometheus remote write
    /// Extra HTTP headers on every request (`X-Scope-OrgID`, a proxy's key, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<std::collections::BTreeMap<String, Secret>>,

    // MQTT
    /// Topic template: `{device_id}`, `{measurement}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Retained `online`/`offline` topic (template like `topic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_topic: Option<String>,
    /// 0, 1 (default) or 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<u8>,
    /// Client id (default `edgewatch-{device_id}-{name}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// MQTT keepalive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<Delay>,
    /// Start a new session on every connect (default false: persistent session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_session: Option<bool>,
    /// Batches published and not yet acknowledged at once (default 1: a fault duplicates at
    /// most one batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inflight: Option<usize>,
    /// `line` (default) or `json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Format>,
    /// `ca_file` (default: the system's CAs), `cert_file` and `key_file` (mutual TLS).
    #[serde(flatten)]
    pub tls: crate::deliver::mqtt::TlsKeys,
    /// Remote write: also send the 1-minute latency sketches as histograms (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histograms: Option<bool>,
    /// Which `measurement.field`s become histograms (default [`DEFAULT_HIST_FIELDS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram_fields: Option<Vec<String>>,
    /// `native` (default) or `vmrange`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram_format: Option<HistFormat>,
}

fn yes() -> bool {
    true
}
fn d_max_points() -> usize {
    5000
}
fn d_max_bytes() -> usize {
    1024 * 1024
}
/// 5 s: each batch is an upstream request and two synced cursor commits on the device
/// (marked in flight, then acknowledged); at 1 s those were most of a live sink's writes
/// to flash. Prometheus' remote write waits as long for a partial batch.
fn d_max_delay() -> Delay {
    Interval(Duration::from_secs(5))
}
fn is_raw(m: &ForwardMode) -> bool {
    *m == ForwardMode::Raw
}
/// 10 s: 100 devices returning together start about 10 per second, at a cost of at most
/// 10 s more delay after an outage that lasted longer (see docs/forwarding.md).
fn d_reconnect_jitter() -> Delay {
    Interval(Duration::from_secs(10))
}

impl SinkConfig {
    /// Checks the keys that depend on `type`; the message names the sink and the key.
    pub fn validate(&self) -> Result<(), String> {
        let n = &self.name;
        let err = |m: String| Err(format!("[[sink]] {n:?}: {m}"));
        if n.is_empty() {
            return Err("[[sink]]: `name` must not be empty".into());
        }
        if let Err(e) = self.retry.validate() {
            return err(e);
        }
        if self.max_points == 0 || self.max_bytes == 0 {
            return err("`max_points` and `max_bytes` must be greater than zero".into());
        }
        let set = |o: bool, k: &str| (o).then(|| k.to_string());
        match self.kind {
            SinkKind::Influxdb => {
                if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
                    return err(format!(
                        "url {:?} must start with http:// or https://",
                        self.url
                    ));
                }
                let wrong: Vec<String> = [
                    set(self.topic.is_some(), "topic"),
                    set(self.status_topic.is_some(), "status_topic"),
                    set(self.qos.is_some(), "qos"),
                    set(self.client_id.is_some(), "client_id"),
                    set(self.keepalive.is_some(), "keepalive"),
                    set(self.clean_session.is_some(), "clean_session"),
                    set(self.inflight.is_some(), "inflight"),
                    set(self.format.is_some(), "format"),
                ]
                .into_iter()
                .flatten()
                .chain(self.tls.set())
                .collect();
                if !wrong.is_empty() {
                    return err(format!("keys {wrong:?} apply to type = \"mqtt\" only"));
                }
                if self.headers.is_some() {
                    return err(
                        "`headers` applies to type = \"prometheus_remote_write\" only".into(),
                    );
                }
                match self.influx_version() {
                    1 => {
                        if self.database.as_deref().unwrap_or("").is_empty() {
                            return err("InfluxDB 1.x needs `database`".into());
                        }
                        if self.org.is_some() || self.bucket.is_some() || self.token.is_some() {
                            return err("`org`, `bucket` and `token` apply to version = 2; use `database`, `username`, `password` with version = 1".into());
                        }
                    }
                    2 => {
                        if self.bucket.as_deref().unwrap_or("").is_empty() {
                            return err("InfluxDB 2.x needs `bucket` (and `org`, `token`); for InfluxDB 1.x set version = 1 and `database`".into());
                        }
                        if self.database.is_some() || self.retention_policy.is_some() {
                            return err(
                                "`database` and `retention_policy` apply to version = 1".into()
                            );
                        }
                    }
                    v => return err(format!("version = {v}: expected 1 or 2")),
                }
            }
            SinkKind::Mqtt => {
                if !(self.url.starts_with("mqtt://") || self.url.starts_with("mqtts://")) {
                    return err(format!(
                        "url {:?} must start with mqtt:// or mqtts://",
                        self.url
                    ));
                }
                let wrong: Vec<String> = [
                    set(self.version.is_some(), "version"),
                    set(self.database.is_some(), "database"),
                    set(self.retention_policy.is_some(), "retention_policy"),
                    set(self.org.is_some(), "org"),
                    set(self.bucket.is_some(), "bucket"),
                    set(self.token.is_some(), "token"),
                ]
                .into_iter()
                .flatten()
                .collect();
                if !wrong.is_empty() {
                    return err(format!("keys {wrong:?} apply to type = \"influxdb\" only"));
                }
                if self.headers.is_some() {
                    return err(
                        "`headers` applies to type = \"prometheus_remote_write\" only".into(),
                    );
                }
                if self.topic.as_deref().unwrap_or("").is_empty() {
                    return err("MQTT needs `topic`, e.g. \"edgewatch/{device_id}\"".into());
                }
                if self.qos.unwrap_or(1) > 2 {
                    return err("qos must be 0, 1 or 2".into());
                }
                if self.inflight == Some(0) {
                    return err("inflight must be at least 1".into());
                }
                if let Err(e) = self.tls.validate() {
                    return err(e);
                }
            }
            SinkKind::PrometheusRemoteWrite => {
                if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
                    return err(format!(
                        "url {:?} must be the receiver's write URL, e.g. http://127.0.0.1:8428/api/v1/write",
                        self.url
                    ));
                }
                let wrong: Vec<String> = [
                    set(self.version.is_some(), "version"),
                    set(self.database.is_some(), "database"),
                    set(self.retention_policy.is_some(), "retention_policy"),
                    set(self.org.is_some(), "org"),
                    set(self.bucket.is_some(), "bucket"),
                    set(self.gzip.is_some(), "gzip"),
                    set(self.topic.is_some(), "topic"),
                    set(self.status_topic.is_some(), "status_topic"),
                    set(self.qos.is_some(), "qos"),
                    set(self.client_id.is_some(), "client_id"),
                    set(self.keepalive.is_some(), "keepalive"),
                    set(self.clean_session.is_some(), "clean_session"),
                    set(self.inflight.is_some(), "inflight"),
                    set(self.format.is_some(), "format"),
                ]
                .into_iter()
                .flatten()
                .chain(self.tls.set())
                .collect();
                if !wrong.is_empty() {
                    return err(format!("keys {wrong:?} do not apply to type = \"prometheus_remote_write\" (payloads are always snappy; auth is `username`/`password`, `token` or `headers`)"));
                }
                if let Err(e) = self.credentials.validate(self.token.as_ref(), "token") {
                    return err(e);
                }
                for k in self.headers.iter().flat_map(|h| h.keys()) {
                    if k.is_empty()
                        || !k
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    {
                        return err(format!(
                            "header name {k:?} must be letters, digits, '-' or '_'"
                        ));
                    }
                    if [
                        "content-type",
                        "content-encoding",
                        "x-prometheus-remote-write-version",
                    ]
                    .contains(&k.to_ascii_lowercase().as_str())
                    {
                        return err(format!("header {k:?} is set by the sink itself"));
                    }
                }
            }
        }
        if let Err(e) = self.validate_histograms() {
            return err(e);
        }
        if let Err(e) = host_port(&self.url) {
            return err(e);
        }
        Ok(())
    }

    /// InfluxDB API version (default 2).
    pub fn influx_version(&self) -> u8 {
        self.version.unwrap_or(2)
    }

    /// The wait before retry number `failures` (1 = after the first failure), `jitter` in
    /// `[0, 1)`.
    pub fn retry_delay(&self, failures: u32, jitter: f64) -> Duration {
        self.retry.delay(failures, jitter)
    }

    /// The wait before the first send after the link returns (or at start with a backlog),
    /// `jitter` in `[0, 1)`: uniform in `[0, reconnect_jitter)`.
    pub fn reconnect_delay(&self, jitter: f64) -> Duration {
        self.reconnect_jitter.0.mul_f64(jitter.clamp(0.0, 1.0))
    }

    /// The MQTT TLS files.
    pub fn tls_files(&self) -> crate::deliver::mqtt::TlsFiles<'_> {
        self.tls.files()
    }

    /// Whether the sink sends histograms (`histograms = true`).
    pub fn histograms(&self) -> bool {
        self.histograms == Some(true)
    }

    /// The `measurement.field`s sent as histograms.
    pub fn histogram_fields(&self) -> Vec<String> {
        match &self.histogram_fields {
            Some(f) => f.clone(),
            None => DEFAULT_HIST_FIELDS.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The histogram format.
    pub fn histogram_format(&self) -> HistFormat {
        self.histogram_format.unwrap_or_default()
    }

    /// The histogram format's name, as configured.
    pub fn histogram_format_name(&self) -> &'static str {
        match self.histogram_format() {
            HistFormat::Native => "native",
            HistFormat::Vmrange => "vmrange",
        }
    }

    /// Checks the histogram keys: remote write only, fields as `measurement.field`.
    fn validate_histograms(&self) -> Result<(), String> {
        let set = self.histograms.is_some()
            || self.histogram_fields.is_some()
            || self.histogram_format.is_some();
        if !set {
            return Ok(());
        }
        if self.kind == SinkKind::Mqtt {
            return Err("`histograms`, `histogram_fields` and `histogram_format` apply to type = \"prometheus_remote_write\" or \"influxdb\"".into());
        }
        if self.kind == SinkKind::Influxdb && self.histogram_format.is_some() {
            return Err("`histogram_format` applies to type = \"prometheus_remote_write\" only (InfluxDB gets the sketch bins as fields of `<measurement>_hist`, see docs/forwarding.md)".into());
        }
        if !self.histograms()
            && (self.histogram_fields.is_some() || self.histogram_format.is_some())
        {
            return Err(
                "`histogram_fields` and `histogram_format` need `histograms = true`".into(),
            );
        }
        for f in self.histogram_fields.iter().flatten() {
            let ok = f
                .split_once('.')
                .is_some_and(|(m, k)| !m.is_empty() && !k.is_empty());
            if !ok {
                return Err(format!(
                    "histogram_fields entry {f:?} must be \"measurement.field\", e.g. \"inference.wall_ms\""
                ));
            }
        }
        if self.histogram_fields.as_ref().is_some_and(|f| f.is_empty()) {
            return Err(
                "histogram_fields is empty: list at least one field, or set histograms = false"
                    .into(),
            );
        }
        Ok(())
    }

    /// Whether payloads are gzipped.
    pub fn gzip(&self) -> bool {
        self.gzip.unwrap_or(self.kind == SinkKind::Influxdb)
    }
}

pub use crate::deliver::host_port;

/// Checks that every rollup-mode sink's tier is one of `[rollup] tiers` (`tiers`: their
/// configured names); the message names the sink, the key and the tiers.
pub fn validate_modes(sinks: &[SinkConfig], tiers: &[String]) -> Result<(), String> {
    for s in sinks.iter().filter(|s| s.histograms()) {
        let found = tiers
            .iter()
            .any(|t| humantime::parse_duration(t).is_ok_and(|d| d == Duration::from_secs(60)));
        if !found {
            return Err(format!(
                "[[sink]] {:?}: histograms = true sends the 1-minute sketches and needs a 1m tier in [rollup] tiers {tiers:?}",
                s.name
            ));
        }
    }
    for s in sinks {
        let Some(tier_s) = s.forward.tier_s() else {
            continue;
        };
        let found = tiers.iter().any(|t| {
            humantime::parse_duration(t)
                .is_ok_and(|d| d.as_secs() as i64 == tier_s && d.subsec_nanos() == 0)
        });
        if !found {
            return Err(format!(
                "[[sink]] {:?}: forward = \"{}\" needs a {tier_s}s tier in [rollup] tiers {tiers:?}",
                s.name, s.forward
            ));
        }
    }
    Ok(())
}

/// Checks every sink and that names are unique.
pub fn validate_all(sinks: &[SinkConfig]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for s in sinks {
        s.validate()?;
        if !seen.insert(s.name.clone()) {
            return Err(format!("[[sink]] name {:?} is used twice; names key the durable cursors and must be unique", s.name));
        }
        if s.histograms() && !seen.insert(hist_sink_name(&s.name)) {
            return Err(format!(
                "[[sink]] name {:?} is the histogram cursor of sink {:?}; pick another name",
                hist_sink_name(&s.name),
                s.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(t: &str) -> Result<SinkConfig, String> {
        crate::deliver::parse_table(t, SinkConfig::validate)
    }

    #[test]
    fn minimal_sinks_need_few_keys() {
        let i = parse("type = \"influxdb\"\nname = \"a\"\nurl = \"http://127.0.0.1:8086\"\nversion = 1\ndatabase = \"edge\"\n").unwrap();
        assert!(i.gzip());
        assert_eq!(i.max_points, 5000);
        let m = parse("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://127.0.0.1:1883\"\ntopic = \"t/{device_id}\"\n").unwrap();
        assert!(!m.gzip());
        assert_eq!(
            host_port(&m.url).unwrap(),
            ("mqtt".into(), "127.0.0.1".into(), 1883)
        );
    }

    #[test]
    fn wrong_or_missing_keys_are_named() {
        let e = parse("type = \"influxdb\"\nname = \"a\"\nurl = \"http://h:1\"\nversion = 1\n")
            .unwrap_err();
        assert!(e.contains("database"), "{e}");
        let e = parse("type = \"influxdb\"\nname = \"a\"\nurl = \"http://h:1\"\nversion = 1\ndatabase = \"d\"\ntopic = \"x\"\n").unwrap_err();
        assert!(e.contains("topic"), "{e}");
        let e = parse("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\n").unwrap_err();
        assert!(e.contains("topic"), "{e}");
        let e =
            parse("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\ntopik = 1\n")
                .unwrap_err();
        assert!(e.contains("topik"), "{e}");
        let e = parse("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\nmin_backoff = \"1m\"\nmax_backoff = \"10s\"\n").unwrap_err();
        assert!(
            e.contains("min_backoff") && e.contains("max_backoff"),
            "{e}"
        );
    }

    #[test]
    fn histogram_keys_are_checked() {
        let base = "type = \"prometheus_remote_write\"\nname = \"p\"\nurl = \"http://127.0.0.1:9090/api/v1/write\"\n";
        let p = parse(base).unwrap();
        assert!(!p.histograms());
        let h = parse(&format!("{base}histograms = true\n")).unwrap();
        assert!(h.histograms());
        assert_eq!(
            h.histogram_fields(),
            DEFAULT_HIST_FIELDS.map(String::from).to_vec()
        );
        assert_eq!(h.histogram_format(), HistFormat::Native);
        let v = parse(&format!(
            "{base}histograms = true\nhistogram_format = \"vmrange\"\nhistogram_fields = [\"app.lat_ms\"]\n"
        ))
        .unwrap();
        assert_eq!(v.histogram_format(), HistFormat::Vmrange);
        assert_eq!(v.histogram_fields(), vec!["app.lat_ms".to_string()]);
        for (bad, needle) in [
            (
                "histograms = true\nhistogram_format = \"le\"\n",
                "histogram_format",
            ),
            (
                "histograms = true\nhistogram_fields = [\"wall_ms\"]\n",
                "measurement.field",
            ),
            ("histograms = true\nhistogram_fields = []\n", "empty"),
            ("histogram_format = \"vmrange\"\n", "histograms = true"),
        ] {
            let e = parse(&format!("{base}{bad}")).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        let influx = "type = \"influxdb\"\nname = \"a\"\nurl = \"http://h:1\"\nversion = 1\ndatabase = \"d\"\nhistograms = true\n";
        assert!(parse(influx).unwrap().histograms());
        let e = parse(&format!("{influx}histogram_format = \"native\"\n")).unwrap_err();
        assert!(e.contains("prometheus_remote_write\" only"), "{e}");
        let e = parse(
            "type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\nhistograms = true\n",
        )
        .unwrap_err();
        assert!(e.contains("histograms"), "{e}");
        // The 1m tier is needed; the histogram cursor's name is taken.
        let tiers = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = validate_modes(std::slice::from_ref(&h), &tiers(&["1h"])).unwrap_err();
        assert!(e.contains("1m tier"), "{e}");
        assert_eq!(
            validate_modes(std::slice::from_ref(&h), &tiers(&["1m", "1h"])),
            Ok(())
        );
        let mut other = p.clone();
        other.name = "p#histograms".into();
        let e = validate_all(&[h, other]).unwrap_err();
        assert!(e.contains("p#histograms"), "{e}");
    }

    #[test]
    fn remote_write_sinks_take_auth_and_headers_and_refuse_other_keys() {
        let base = "type = \"prometheus_remote_write\"\nname = \"p\"\nurl = \"http://127.0.0.1:8428/api/v1/write\"\n";
        let p = parse(base).unwrap();
        assert_eq!(p.kind.name(), "prometheus_remote_write");
        assert!(!p.gzip());
        let h = parse(&format!(
            "{base}token = \"t\"\n[headers]\nX-Scope-OrgID = \"fleet\"\n"
        ))
        .unwrap();
        assert_eq!(h.headers.unwrap()["X-Scope-OrgID"].expose(), "fleet");
        assert!(!format!(
            "{:?}",
            parse(&format!("{base}[headers]\nX-Key = \"hush\"\n")).unwrap()
        )
        .contains("hush"));
        for (extra, want) in [
            ("gzip = true\n", "gzip"),
            ("database = \"d\"\n", "database"),
            ("topic = \"t\"\n", "topic"),
            ("token = \"t\"\nusername = \"u\"\n", "not both"),
            ("password = \"p\"\n", "username"),
            ("[headers]\nContent-Type = \"x\"\n", "set by the sink"),
            ("[headers]\n\"a b\" = \"x\"\n", "header name"),
        ] {
            let e = parse(&format!("{base}{extra}")).unwrap_err();
            assert!(e.contains(want), "{extra}: {e}");
        }
        let e = parse("type = \"prometheus_remote_write\"\nname = \"p\"\nurl = \"mqtt://h\"\n")
            .unwrap_err();
        assert!(e.contains("/api/v1/write"), "{e}");
        let e = parse("type = \"influxdb\"\nname = \"a\"\nurl = \"http://h:1\"\nversion = 1\ndatabase = \"d\"\n[headers]\nA = \"b\"\n").unwrap_err();
        assert!(e.contains("headers"), "{e}");
    }

    #[test]
    fn retries_double_with_equal_jitter_up_to_the_cap() {
        let c =
            parse("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\n").unwrap();
        let s = Duration::from_secs;
        assert_eq!(c.retry_delay(1, 0.0), Duration::from_millis(500));
        assert_eq!(c.retry_delay(1, 0.999_999).as_millis(), 999);
        assert_eq!(c.retry_delay(3, 0.0), s(2));
        assert_eq!(c.retry_delay(30, 0.0), s(30));
        assert!(c.retry_delay(30, 1.0) <= s(60));
        // Zero failures (a caller that retries before counting) waits like the first.
        assert_eq!(c.retry_delay(0, 0.0), c.retry_delay(1, 0.0));
        let c = parse("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\nmin_backoff = \"100ms\"\nmax_backoff = \"1s\"\n").unwrap();
        assert_eq!(c.retry_delay(2, 0.0), Duration::from_millis(100));
        assert_eq!(c.retry_delay(9, 0.0), Duration::from_millis(500));
    }

    #[test]
    fn forward_mode_and_reconnect_jitter() {
        let base = "type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\n";
        let c = parse(base).unwrap();
        assert_eq!(c.forward, super::ForwardMode::Raw);
        assert_eq!(c.reconnect_jitter.0, Duration::from_secs(10));
        assert_eq!(c.reconnect_delay(0.0), Duration::ZERO);
        assert_eq!(c.reconnect_delay(0.5), Duration::from_secs(5));
        assert!(c.reconnect_delay(0.999_999) < Duration::from_secs(10));
        let c = parse(&format!(
            "{base}forward = \"rollup:1m\"\nreconnect_jitter = \"0s\"\n"
        ))
        .unwrap();
        assert_eq!(c.forward.tier_s(), Some(60));
        assert_eq!(c.reconnect_delay(0.9), Duration::ZERO);
        // Another spelling: the key, the value, the line and what is accepted.
        let e = parse(&format!("{base}forward = \"rollup:60s\"\n")).unwrap_err();
        assert!(
            e.contains("forward") && e.contains("rollup:60s") && e.contains("line 5"),
            "{e}"
        );
        assert!(e.contains("\"rollup:1m\""), "{e}");
        // The tier must exist.
        let c = parse(&format!("{base}forward = \"rollup:1h\"\n")).unwrap();
        let e = validate_modes(std::slice::from_ref(&c), &["1m".into()]).unwrap_err();
        assert!(
            e.contains("\"m\"") && e.contains("rollup:1h") && e.contains("3600s"),
            "{e}"
        );
        assert!(validate_modes(&[c], &["1m".into(), "1h".into()]).is_ok());
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let i = parse("type = \"influxdb\"\nname = \"a\"\nurl = \"http://h:1\"\nbucket = \"b\"\ntoken = \"s3cret\"\n").unwrap();
        assert!(!format!("{i:?}").contains("s3cret"));
    }
}
