//! MQTT peers: one builder of the connection options (client id, credentials, keepalive,
//! session, TLS with the CA, client certificates and their errors) for the MQTT sink and the
//! MQTT notifier, and [`check`], which reads the TLS files once so a bad one is a clear
//! error at `check-config` and at start instead of a silent fallback.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::{MqttOptions, TlsConfiguration, Transport};

/// The system's CA bundle, used when `ca_file` is not set.
pub const SYSTEM_CA: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Why an MQTT peer cannot be set up (permanent until the config or a file changes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// The URL is not `mqtt(s)://host[:port]`.
    #[error("{0}")]
    Url(String),
    /// A TLS file cannot be read or parsed.
    #[error("{key} {path}: {reason}")]
    Tls {
        /// `ca_file`, `cert_file` or `key_file`.
        key: &'static str,
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The TLS keys every MQTT peer table takes (flattened into `[[sink]]` and `[[notify]]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct TlsKeys {
    /// CA certificate (PEM) for `mqtts://`; default: the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Client certificate (PEM) for mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// Client key (PEM) for mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
}

impl TlsKeys {
    /// The files, borrowed.
    pub fn files(&self) -> TlsFiles<'_> {
        TlsFiles {
            ca_file: self.ca_file.as_deref(),
            cert_file: self.cert_file.as_deref(),
            key_file: self.key_file.as_deref(),
        }
    }

    /// The keys that are set (for "does not apply to this type" errors).
    pub fn set(&self) -> Vec<String> {
        [
            (self.ca_file.is_some(), "ca_file"),
            (self.cert_file.is_some(), "cert_file"),
            (self.key_file.is_some(), "key_file"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, k)| k.to_string())
        .collect()
    }

    /// Checks the keys together (no file is read: see [`check`]).
    pub fn validate(&self) -> Result<(), String> {
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err("`cert_file` and `key_file` go together".into());
        }
        Ok(())
    }
}

/// The TLS files of a peer (`mqtts://`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TlsFiles<'a> {
    /// CA certificates (PEM); `None`: the system's.
    pub ca_file: Option<&'a str>,
    /// Client certificate chain (PEM), for mutual TLS.
    pub cert_file: Option<&'a str>,
    /// Client private key (PEM), with `cert_file`.
    pub key_file: Option<&'a str>,
}

/// Everything a connection to one broker needs.
#[derive(Debug, Clone)]
pub struct Endpoint<'a> {
    /// `mqtt(s)://host[:port]`.
    pub url: &'a str,
    /// The client id.
    pub client_id: String,
    /// User name and password.
    pub credentials: &'a super::Credentials,
    /// Keepalive interval.
    pub keepalive: Duration,
    /// A new session on every connect.
    pub clean_session: bool,
    /// TLS files, used with `mqtts://`.
    pub tls: TlsFiles<'a>,
}

fn tls_err(key: &'static str, path: &str, reason: impl std::fmt::Display) -> SetupError {
    SetupError::Tls {
        key,
        path: path.to_string(),
        reason: reason.to_string(),
    }
}

/// The rustls client config of `files`: a `ca_file` given must hold at least one PEM
/// certificate and every one of them must be a valid trust anchor; the system bundle (no
/// `ca_file`) keeps what it can parse but must yield at least one.
pub fn tls_config(files: &TlsFiles<'_>) -> Result<rustls::ClientConfig, SetupError> {
    let ca = files.ca_file.unwrap_or(SYSTEM_CA);
    let pem = std::fs::read(ca).map_err(|e| tls_err("ca_file", ca, format!("cannot read: {e}")))?;
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_err("ca_file", ca, format!("not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(tls_err("ca_file", ca, "no PEM certificate in it"));
    }
    let mut roots = rustls::RootCertStore::empty();
    if files.ca_file.is_some() {
        for (i, c) in certs.into_iter().enumerate() {
            roots.add(c).map_err(|e| {
                tls_err(
                    "ca_file",
                    ca,
                    format!("certificate {} is not usable: {e}", i + 1),
                )
            })?;
        }
    } else {
        let (added, _ignored) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(tls_err("ca_file", ca, "no usable certificate in it"));
        }
    }
    let b = rustls::ClientConfig::builder().with_root_certificates(roots);
    match (files.cert_file, files.key_file) {
        (Some(c), Some(k)) => {
            let cp = std::fs::read(c)
                .map_err(|e| tls_err("cert_file", c, format!("cannot read: {e}")))?;
            let kp = std::fs::read(k)
                .map_err(|e| tls_err("key_file", k, format!("cannot read: {e}")))?;
            let chain = rustls_pemfile::certs(&mut &cp[..])
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| tls_err("cert_file", c, format!("not PEM: {e}")))?;
            if chain.is_empty() {
                return Err(tls_err("cert_file", c, "no PEM certificate in it"));
            }
            let key = rustls_pemfile::private_key(&mut &kp[..])
                .map_err(|e| tls_err("key_file", k, format!("not PEM: {e}")))?
                .ok_or_else(|| tls_err("key_file", k, "no private key in it"))?;
            b.with_client_auth_cert(chain, key)
                .map_err(|e| tls_err("cert_file", c, format!("refused with its key: {e}")))
        }
        (None, None) => Ok(b.with_no_client_auth()),
        (Some(c), None) => Err(tls_err("key_file", c, "cert_file needs key_file")),
        (None, Some(k)) => Err(tls_err("cert_file", k, "key_file needs cert_file")),
    }
}

/// Checks what the endpoint at `url` will need at connect time: for `mqtts://`, that its
/// TLS files read and parse. Run by `check-config` and before a peer starts.
pub fn check(url: &str, files: &TlsFiles<'_>) -> Result<(), SetupError> {
    if url.starts_with("mqtts://") {
        tls_config(files)?;
    }
    Ok(())
}

/// The connection options of `e` (TLS set up for `mqtts://`).
pub fn options(e: &Endpoint<'_>) -> Result<MqttOptions, SetupError> {
    let (scheme, host, port) = super::host_port(e.url).map_err(SetupError::Url)?;
    let mut o = MqttOptions::new(e.client_id.clone(), host, port);
    o.set_keep_alive(e.keepalive.max(Duration::from_secs(1)));
    o.set_clean_session(e.clean_session);
    if let Some(u) = &e.credentials.username {
        o.set_credentials(
            u.clone(),
            e.credentials
                .password
                .as_ref()
                .map(|p| p.expose().to_string())
                .unwrap_or_default(),
        );
    }
    if scheme == "mqtts" {
        o.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(
            Arc::new(tls_config(&e.tls)?),
        )));
    }
    Ok(o)
}

/// rumqttc's connect timeout (whole seconds, at least 1) for a peer's `timeout`.
pub fn connect_timeout_s(timeout: Duration) -> u64 {
    timeout.as_secs_f64().ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_that_does_not_parse_is_an_error_not_a_fallback() {
        let d = tempfile::tempdir().unwrap();
        let garbage = d.path().join("ca.pem");
        std::fs::write(&garbage, "this is not a certificate\n").unwrap();
        let g = garbage.to_str().unwrap();
        let files = TlsFiles {
            ca_file: Some(g),
            ..Default::default()
        };
        let e = check("mqtts://127.0.0.1:8883", &files).unwrap_err();
        assert!(
            e.to_string().contains("ca_file") && e.to_string().contains(g),
            "{e}"
        );
        // A PEM block that is no certificate DER.
        let bad = d.path().join("bad.pem");
        std::fs::write(
            &bad,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let files = TlsFiles {
            ca_file: bad.to_str(),
            ..Default::default()
        };
        let e = check("mqtts://127.0.0.1:8883", &files).unwrap_err();
        assert!(e.to_string().contains("not usable"), "{e}");
        let missing = TlsFiles {
            ca_file: Some("/nonexistent/ca.pem"),
            ..Default::default()
        };
        assert!(check("mqtts://h", &missing)
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
        // Plain mqtt:// reads no file.
        assert!(check("mqtt://h", &missing).is_ok());
    }
}
