//! `[[notify]]` tables: one typed, validated struct per notifier (Alertmanager, MQTT,
//! webhook). Parsing and checking only; nothing here opens a socket or a file. Secrets
//! (`password`, `bearer_token`) are redacted in `Debug`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::values::{Delay, Interval, Secret};
use crate::deliver::Retry;

/// The kind of receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NotifyKind {
    /// Prometheus Alertmanager, API v2 (`POST {url}/api/v2/alerts`).
    Alertmanager,
    /// An MQTT broker: one JSON message per event.
    Mqtt,
    /// Any HTTP endpoint: `POST {url}` with Alertmanager's webhook payload.
    Webhook,
}

impl NotifyKind {
    /// As written in the config (`alertmanager`, `mqtt`, `webhook`).
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyKind::Alertmanager => "alertmanager",
            NotifyKind::Mqtt => "mqtt",
            NotifyKind::Webhook => "webhook",
        }
    }
}

/// One `[[notify]]` table. Keys that do not apply to the notifier's `type` are errors.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// `alertmanager`, `mqtt` or `webhook`.
    #[serde(rename = "type")]
    pub kind: NotifyKind,
    /// Unique name; keys the durable position in the outbox.
    pub name: String,
    /// `http(s)://host:port[/path]` (Alertmanager: its base URL; webhook: the endpoint) or
    /// `mqtt(s)://host:port`.
    pub url: String,
    /// Off: the notifier keeps its position (and the events after it) and does not send.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// `timeout`, `min_backoff`, `max_backoff` (also how often a paused notifier, whose
    /// credentials or path were refused, tries the same event again).
    #[serde(flatten)]
    pub retry: Retry,

    // Alertmanager
    /// How often firing alerts are re-sent (Alertmanager expires an alert without `endsAt`
    /// after its `resolve_timeout`). Default 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resend_interval: Option<Interval>,

    // HTTP (Alertmanager, webhook)
    /// `Authorization: Bearer ...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token: Option<Secret>,
    /// Extra request headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// `username`, `password`: HTTP basic auth, MQTT credentials.
    #[serde(flatten)]
    pub credentials: crate::deliver::Credentials,

    // MQTT
    /// Topic template: `{device_id}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// 1 (default) or 2; 0 would acknowledge nothing and is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<u8>,
    /// Client id (default `edgewatch-{device_id}-notify-{name}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// `ca_file` (default: the system's CAs), `cert_file` and `key_file` (mutual TLS).
    #[serde(flatten)]
    pub tls: crate::deliver::mqtt::TlsKeys,
    /// MQTT keepalive (default 30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<Delay>,
}

fn yes() -> bool {
    true
}

/// The default `resend_interval`.
pub const DEFAULT_RESEND: Duration = Duration::from_secs(60);

impl NotifyConfig {
    /// Checks the keys that depend on `type`; the message names the notifier and the key.
    pub fn validate(&self) -> Result<(), String> {
        let n = &self.name;
        let err = |m: String| Err(format!("[[notify]] {n:?}: {m}"));
        if n.trim().is_empty() {
            return Err("[[notify]]: `name` must not be empty".into());
        }
        if self.url.trim().is_empty() {
            return err("`url` must not be empty".into());
        }
        if let Err(e) = self.retry.validate() {
            return err(e);
        }
        let set = |o: bool, k: &str| o.then(|| k.to_string());
        let http = [
            set(self.bearer_token.is_some(), "bearer_token"),
            set(!self.headers.is_empty(), "headers"),
        ];
        let tls: Vec<Option<String>> = self.tls.set().into_iter().map(Some).collect();
        let mqtt: Vec<Option<String>> = [
            set(self.topic.is_some(), "topic"),
            set(self.qos.is_some(), "qos"),
            set(self.client_id.is_some(), "client_id"),
            set(self.keepalive.is_some(), "keepalive"),
        ]
        .into_iter()
        .chain(tls)
        .collect();
        let am = [set(self.resend_interval.is_some(), "resend_interval")];
        let wrong_of = |groups: &[&[Option<String>]]| -> Vec<String> {
            groups
                .iter()
                .flat_map(|g| g.iter().flatten().cloned())
                .collect()
        };
        let (scheme_ok, wrong, applies) = match self.kind {
            NotifyKind::Alertmanager => (is_http(&self.url), wrong_of(&[&mqtt]), "type = \"mqtt\""),
            NotifyKind::Webhook => (is_http(&self.url), wrong_of(&[&mqtt, &am]), "another type"),
            NotifyKind::Mqtt => (
                self.url.starts_with("mqtt://") || self.url.starts_with("mqtts://"),
                wrong_of(&[&http, &am]),
                "another type",
            ),
        };
        if !scheme_ok {
            let want = match self.kind {
                NotifyKind::Mqtt => "mqtt:// or mqtts://",
                _ => "http:// or https://",
            };
            return err(format!("url {:?} must start with {want}", self.url));
        }
        if !wrong.is_empty() {
            return err(format!(
                "keys {wrong:?} do not apply to type = {:?} (they belong to {applies})",
                self.kind.as_str()
            ));
        }
        if let Err(e) = crate::deliver::host_port(&self.url) {
            return err(e);
        }
        if self.kind == NotifyKind::Mqtt {
            if self.topic.as_deref().unwrap_or("").is_empty() {
                return err("MQTT needs `topic`, e.g. \"edgewatch/{device_id}/alerts\"".into());
            }
            if let Err(e) = self.tls.validate() {
                return err(e);
            }
            if !matches!(self.qos.unwrap_or(1), 1 | 2) {
                return err(
                    "qos must be 1 or 2 (delivery needs the broker's acknowledgement)".into(),
                );
            }
        }
        if let Err(e) = self
            .credentials
            .validate(self.bearer_token.as_ref(), "bearer_token")
        {
            return err(e);
        }
        for k in self.headers.keys() {
            if k.is_empty()
                || !k
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return err(format!("headers: {k:?} is not a valid header name"));
            }
        }
        Ok(())
    }

    /// How often firing alerts are re-sent to Alertmanager.
    pub fn resend_interval(&self) -> Duration {
        self.resend_interval.map_or(DEFAULT_RESEND, |i| i.0)
    }

    /// The wait before retry number `failures` (1 = after the first failure), `jitter` in
    /// `[0, 1)`.
    pub fn retry_delay(&self, failures: u32, jitter: f64) -> Duration {
        self.retry.delay(failures, jitter)
    }

    /// The MQTT TLS files.
    pub fn tls_files(&self) -> crate::deliver::mqtt::TlsFiles<'_> {
        self.tls.files()
    }
}

fn is_http(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

/// Lines (1-based) of the `[[notify]]` headers in `text`, in order: where each table starts,
/// for error messages.
fn table_lines(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let t = l.trim_start();
            t.starts_with("[[") && t[2..].trim_start().starts_with("notify") && {
                let rest = t[2..].trim_start()["notify".len()..].trim_start();
                rest.starts_with("]]")
            }
        })
        .map(|(i, _)| i + 1)
        .collect()
}

/// Checks every notifier and that names are unique; a message names the table's line in
/// `text` (the config as written) where it can be found.
pub fn validate_all(notifiers: &[NotifyConfig], text: &str) -> Result<(), String> {
    let lines = table_lines(text);
    let at = |i: usize| {
        lines
            .get(i)
            .filter(|_| lines.len() == notifiers.len())
            .map(|l| format!(" (line {l})"))
            .unwrap_or_default()
    };
    let mut seen = std::collections::HashMap::new();
    for (i, n) in notifiers.iter().enumerate() {
        n.validate().map_err(|e| format!("{e}{}", at(i)))?;
        if let Some(first) = seen.insert(n.name.as_str(), i) {
            return Err(format!(
                "[[notify]] name {:?}{} is used twice (first{}); names key the durable \
                 positions and must be unique",
                n.name,
                at(i),
                at(first)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
