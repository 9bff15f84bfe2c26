//! Delivery to a peer, the one owner for sinks (`src/forward`) and notifiers
//! (`src/alert/notify`): both send ordered records from a durable position to a remote peer
//! and move the position only on its acknowledgement. What they share lives here and only
//! here: what an answer means ([`answer`]: one classification with a small per-peer
//! policy), how a request proves who it is and reads its answer ([`http`]: [`Auth`],
//! [`HttpPeer`]), how an MQTT connection is set up ([`mqtt`]: options, TLS, client
//! certificates, keepalive, and the file checks behind a clear error), and the retry loop
//! ([`retry`]: the `timeout`/`min_backoff`/`max_backoff` keys, [`Retrier`]: the wait, the
//! status line and the rate-limited log of each failure, and [`nap`]).
//!
//! The policy (pure, [`classify`]):
//!
//! | answer | sink | notifier |
//! |---|---|---|
//! | 2xx | acknowledged | acknowledged |
//! | 400, 422 (bad content) | dead letter, move on | dead letter, move on |
//! | 401, 403, 407 (credentials) | pause: keep, retry every `max_backoff` | the same |
//! | 404, 405, 410 (wrong path) | pause | pause |
//! | 413 (too large) | split the batch down to single points; one point still refused is a dead letter | pause (an event cannot be split) |
//! | other 4xx | pause | pause |
//! | 429, 503 with `Retry-After` | wait it (at most 1 h) | the same |
//! | 408, 5xx, no answer | back off (`min_backoff` doubling to `max_backoff`, equal jitter) | the same |
//!
//! Nothing here touches the store or decides when a position moves: the sink or notifier
//! loop does, with what this module tells it.

pub mod answer;
pub mod http;
pub mod mqtt;
pub mod retry;

pub use answer::{classify, parse_retry_after, Outcome, Peer, MAX_RETRY_AFTER};
pub use http::{Auth, Credentials, HttpPeer};
pub use retry::{nap, Report, Retrier, Retry};

/// Splits `scheme://host:port[/path]` into (scheme, host, port).
pub fn host_port(url: &str) -> Result<(String, String, u16), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("url {url:?} has no scheme"))?;
    let hostport = rest.split('/').next().unwrap_or("");
    let default = match scheme {
        "http" => 80,
        "https" => 443,
        "mqtt" => 1883,
        "mqtts" => 8883,
        _ => return Err(format!("url {url:?}: unknown scheme {scheme:?}")),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
            h.trim_start_matches('[').trim_end_matches(']').to_string(),
            p.parse::<u16>()
                .map_err(|_| format!("url {url:?}: invalid port {p:?}"))?,
        ),
        _ => (hostport.to_string(), default),
    };
    if host.is_empty() {
        return Err(format!("url {url:?} has no host"));
    }
    Ok((scheme.to_string(), host, port))
}

/// A peer table read from TOML and checked, as the config loader does (tests of both
/// tables).
#[cfg(test)]
pub(crate) fn parse_table<T: serde::de::DeserializeOwned>(
    text: &str,
    validate: impl Fn(&T) -> Result<(), String>,
) -> Result<T, String> {
    let t: T = toml::from_str(text).map_err(|e| e.to_string())?;
    validate(&t).map(|()| t)
}
