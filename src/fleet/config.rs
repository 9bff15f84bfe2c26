//! `[fleet]`: the public key remote documents must be signed with, the device's groups, the
//! locked sections the local file unlocks, the size cap, and the transports (`mqtt` with the
//! MQTT sink's auth and TLS keys, `url` polled every `poll`). Parsing and checks only.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::values::{Interval, Secret};

/// `[fleet]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// ed25519 public key (base64, the line of `fleet.pub`); empty: fleet config off.
    pub public_key: String,
    /// The device's groups, lowest first.
    pub groups: Vec<String>,
    /// Locked sections (`fleet`, `http`, `udp`, `storage`) a fragment may change.
    pub allow: Vec<String>,
    /// Largest document accepted.
    pub max_document_bytes: usize,
    /// Broker: `mqtt://host:port` or `mqtts://host:port`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mqtt: Option<String>,
    /// Broker user name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Broker password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<Secret>,
    /// CA (PEM) for `mqtts://`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Client certificate (PEM) for mutual TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// Client key (PEM) for mutual TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// HTTP base URL: `<url>/all`, `<url>/group/<g>`, `<url>/device/<device_id>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// How often `url` is polled.
    pub poll: Interval,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            public_key: String::new(),
            groups: Vec::new(),
            allow: Vec::new(),
            max_document_bytes: 64 * 1024,
            mqtt: None,
            username: None,
            password: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            url: None,
            poll: Interval(Duration::from_secs(60)),
        }
    }
}

impl FleetConfig {
    /// Whether remote layers are read at all (a key is set).
    pub fn enabled(&self) -> bool {
        !self.public_key.trim().is_empty()
    }

    /// The layers, lowest first: `all`, `group:NAME` for each group, `device`.
    pub fn sources(&self) -> Vec<String> {
        let mut v = vec!["all".to_string()];
        v.extend(self.groups.iter().map(|g| format!("group:{g}")));
        v.push("device".into());
        v
    }

    /// The TLS files of the broker connection.
    pub fn tls_files(&self) -> crate::deliver::mqtt::TlsFiles<'_> {
        crate::deliver::mqtt::TlsFiles {
            ca_file: self.ca_file.as_deref(),
            cert_file: self.cert_file.as_deref(),
            key_file: self.key_file.as_deref(),
        }
    }

    /// The broker credentials.
    pub fn credentials(&self) -> crate::deliver::Credentials {
        crate::deliver::Credentials {
            username: self.username.clone(),
            password: self.password.clone(),
        }
    }
}

/// Checks `[fleet]` as a whole; the message names the key.
pub fn validate(c: &FleetConfig) -> Result<(), String> {
    let transport = c.mqtt.is_some() || c.url.is_some();
    if !c.enabled() {
        if transport {
            return Err(
                "[fleet] `mqtt` or `url` needs `public_key` (the line of fleet.pub)".into(),
            );
        }
        return Ok(());
    }
    super::doc::public_key(&c.public_key).map_err(|e| format!("[fleet] {e}"))?;
    for a in &c.allow {
        if !super::merge::LOCKED.contains(&a.as_str()) {
            return Err(format!(
                "[fleet] allow: {a:?} is not a locked section (one of fleet, http, udp, storage)"
            ));
        }
    }
    for g in &c.groups {
        if g.is_empty() || g.contains(['/', '+', '#', ' ']) {
            return Err(format!(
                "[fleet] groups: {g:?} is not a group name (no spaces, `/`, `+` or `#`)"
            ));
        }
    }
    if c.max_document_bytes < 256 {
        return Err("[fleet] max_document_bytes must be at least 256".into());
    }
    if let Some(m) = &c.mqtt {
        if !(m.starts_with("mqtt://") || m.starts_with("mqtts://")) {
            return Err(format!(
                "[fleet] mqtt = {m:?}: expected mqtt://host:port or mqtts://host:port"
            ));
        }
        crate::deliver::host_port(m).map_err(|e| format!("[fleet] mqtt: {e}"))?;
    }
    if c.password.is_some() && c.username.is_none() {
        return Err("[fleet] `password` needs `username`".into());
    }
    if c.cert_file.is_some() != c.key_file.is_some() {
        return Err("[fleet] `cert_file` and `key_file` go together".into());
    }
    if let Some(u) = &c.url {
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            return Err(format!("[fleet] url = {u:?}: expected http:// or https://"));
        }
        crate::deliver::host_port(u).map_err(|e| format!("[fleet] url: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<FleetConfig, String> {
        let c: FleetConfig = toml::from_str(s).map_err(|e| e.to_string())?;
        validate(&c).map(|()| c)
    }

    #[test]
    fn off_by_default_and_each_bad_key_is_named() {
        let c = parse("").unwrap();
        assert!(!c.enabled());
        assert_eq!(c.sources(), ["all", "device"]);
        let key = super::super::doc::generate().unwrap().1;
        let c = parse(&format!(
            "public_key = \"{key}\"\ngroups = [\"lab\", \"orin\"]\nmqtt = \"mqtt://127.0.0.1:1883\"\n"
        ))
        .unwrap();
        assert_eq!(c.sources(), ["all", "group:lab", "group:orin", "device"]);
        for (bad, says) in [
            ("mqtt = \"mqtt://h:1\"\n".to_string(), "public_key"),
            ("public_key = \"AAAA\"\n".to_string(), "32"),
            (
                format!("public_key = \"{key}\"\nallow = [\"tags\"]\n"),
                "allow",
            ),
            (
                format!("public_key = \"{key}\"\ngroups = [\"a/b\"]\n"),
                "groups",
            ),
            (
                format!("public_key = \"{key}\"\nmqtt = \"http://h\"\n"),
                "mqtt",
            ),
            (
                format!("public_key = \"{key}\"\nurl = \"ftp://h\"\n"),
                "url",
            ),
            (
                format!("public_key = \"{key}\"\npassword = \"p\"\n"),
                "username",
            ),
            (
                format!("public_key = \"{key}\"\nmax_document_bytes = 3\n"),
                "max_document_bytes",
            ),
            (format!("public_key = \"{key}\"\npol = \"1s\"\n"), "pol"),
        ] {
            let e = parse(&bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
