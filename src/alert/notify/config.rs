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
    /// Username (HTTP basic auth; MQTT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Password (HTTP basic auth; MQTT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<Secret>,

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
        if self.bearer_token.is_some() && self.username.is_some() {
            return err("`bearer_token` and `username`/`password` exclude each other".into());
        }
        if self.password.is_some() && self.username.is_none() {
            return err("`password` needs `username`".into());
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
mod tests {
    use super::*;

    fn parse(t: &str) -> Result<NotifyConfig, String> {
        let c: NotifyConfig = toml::from_str(t).map_err(|e| e.to_string())?;
        c.validate().map(|_| c)
    }

    #[test]
    fn minimal_notifiers_need_few_keys() {
        let a = parse("type = \"alertmanager\"\nname = \"am\"\nurl = \"http://127.0.0.1:9093\"\n")
            .unwrap();
        assert_eq!(a.resend_interval(), Duration::from_secs(60));
        assert!(a.enabled);
        let m = parse(
            "type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h:1883\"\ntopic = \"e/{device_id}/alerts\"\n",
        )
        .unwrap();
        assert_eq!(m.qos, None);
        let w = parse("type = \"webhook\"\nname = \"w\"\nurl = \"https://ops.example/hook\"\nbearer_token = \"t0k\"\n[headers]\nX-Team = \"edge\"\n").unwrap();
        assert_eq!(w.headers["X-Team"], "edge");
        assert!(!format!("{w:?}").contains("t0k"), "token redacted");
    }

    #[test]
    fn wrong_or_missing_keys_are_named() {
        let cases = [
            ("type = \"pager\"\nname = \"p\"\nurl = \"http://h\"\n", "pager"),
            ("type = \"webhook\"\nname = \"w\"\n", "url"),
            ("type = \"webhook\"\nname = \"w\"\nurl = \"mqtt://h\"\n", "http://"),
            ("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nurll = 1\n", "urll"),
            ("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\ntopic = \"t\"\n", "topic"),
            ("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nresend_interval = \"1m\"\n", "resend_interval"),
            ("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\n", "topic"),
            ("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\nqos = 0\n", "qos"),
            ("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\nbearer_token = \"x\"\n", "bearer_token"),
            ("type = \"alertmanager\"\nname = \"a\"\nurl = \"http://h\"\nresend_interval = \"0s\"\n", "greater than zero"),
            ("type = \"alertmanager\"\nname = \"a\"\nurl = \"http://h\"\npassword = \"x\"\n", "username"),
            ("type = \"alertmanager\"\nname = \"\"\nurl = \"http://h\"\n", "name"),
        ];
        for (text, key) in cases {
            let e = parse(text).unwrap_err();
            assert!(e.contains(key), "{text:?}: {e}");
        }
    }

    #[test]
    fn duplicate_names_and_bad_tables_name_their_lines() {
        let text = "device_id = \"d\"\n\n[[notify]]\ntype = \"webhook\"\nname = \"x\"\nurl = \"http://h\"\n\n  [[ notify ]]\ntype = \"webhook\"\nname = \"x\"\nurl = \"http://h2\"\n";
        #[derive(Deserialize)]
        struct T {
            notify: Vec<NotifyConfig>,
        }
        let t: T = toml::from_str(&text.replace("device_id = \"d\"\n", "")).unwrap();
        let e = validate_all(&t.notify, text).unwrap_err();
        assert!(
            e.contains("\"x\" (line 8) is used twice (first (line 3))"),
            "{e}"
        );
        let bad = text.replace("http://h2", "ftp://h2");
        let t: T = toml::from_str(&bad.replace("device_id = \"d\"\n", "")).unwrap();
        let e = validate_all(&t.notify, &bad).unwrap_err();
        assert!(e.contains("ftp://h2") && e.contains("(line 8)"), "{e}");
    }

    #[test]
    fn retries_double_with_equal_jitter_up_to_the_cap() {
        let c = parse("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nmin_backoff = \"100ms\"\nmax_backoff = \"1s\"\n").unwrap();
        assert_eq!(c.retry_delay(1, 0.0), Duration::from_millis(50));
        assert_eq!(c.retry_delay(9, 0.0), Duration::from_millis(500));
        assert!(c.retry_delay(9, 0.99) < Duration::from_secs(1));
        // One declaration with the sinks' (crate::deliver::Retry): the same checks.
        let e = parse("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nmin_backoff = \"2s\"\nmax_backoff = \"1s\"\n").unwrap_err();
        assert!(e.contains("min_backoff") && e.contains("\"w\""), "{e}");
        let e = parse("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\ntimeout = \"soon\"\n")
            .unwrap_err();
        assert!(e.contains("timeout"), "{e}");
        // MQTT takes client certificates and a keepalive like the sink.
        let c = parse("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtts://h\"\ntopic = \"t\"\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nkeepalive = \"15s\"\n").unwrap();
        assert_eq!(c.tls_files().cert_file, Some("c.pem"));
        let e = parse("type = \"mqtt\"\nname = \"m\"\nurl = \"mqtts://h\"\ntopic = \"t\"\ncert_file = \"c.pem\"\n").unwrap_err();
        assert!(e.contains("key_file"), "{e}");
        let e =
            parse("type = \"webhook\"\nname = \"w\"\nurl = \"http://h\"\nkeepalive = \"15s\"\n")
                .unwrap_err();
        assert!(e.contains("keepalive"), "{e}");
    }
}
