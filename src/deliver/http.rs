//! HTTP peers: one request builder (the peer's URL, timeout, auth and headers) and one
//! reading of the answer for every HTTP sink (InfluxDB, remote write) and notifier
//! (Alertmanager, webhook). Blocking `ureq`, on the peer's own thread. Nothing here retries:
//! the answer becomes an [`Outcome`] and the caller's [`super::Retrier`] decides.

use base64::Engine as _;

use super::answer::{classify, Outcome, Peer};
use crate::config::values::Secret;

/// The `username` and `password` keys every peer table takes (flattened into `[[sink]]`
/// and `[[notify]]`): HTTP basic auth, MQTT credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Credentials {
    /// User name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Password (needs `username`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<Secret>,
}

impl Credentials {
    /// Checks the keys together, and against a `token` key of the table (`token_key`: its
    /// name) that excludes them.
    pub fn validate(&self, token: Option<&Secret>, token_key: &str) -> Result<(), String> {
        if token.is_some() && (self.username.is_some() || self.password.is_some()) {
            return Err(format!(
                "use either `{token_key}` (bearer) or `username`/`password` (basic auth), not both"
            ));
        }
        if self.password.is_some() && self.username.is_none() {
            return Err("`password` needs `username`".into());
        }
        Ok(())
    }
}

/// How a peer proves who it is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Auth {
    /// No `Authorization` header.
    #[default]
    None,
    /// `Authorization: Basic base64(user:password)`.
    Basic {
        /// User name.
        user: String,
        /// Password (empty when absent).
        password: Option<Secret>,
    },
    /// `Authorization: Bearer <token>`.
    Bearer(Secret),
    /// `Authorization: Token <token>` (InfluxDB 2.x).
    Token(Secret),
}

impl Auth {
    /// Basic auth when a user name is set, else `token` as a bearer token, else none.
    pub fn basic_or_bearer(c: &Credentials, token: Option<&Secret>) -> Auth {
        match (&c.username, token) {
            (Some(u), _) => Auth::Basic {
                user: u.clone(),
                password: c.password.clone(),
            },
            (None, Some(t)) => Auth::Bearer(t.clone()),
            (None, None) => Auth::None,
        }
    }

    /// The `Authorization` header's value, if any.
    pub fn header(&self) -> Option<String> {
        match self {
            Auth::None => None,
            Auth::Basic { user, password } => {
                let pw = password.as_ref().map_or("", |p| p.expose());
                let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"));
                Some(format!("Basic {b}"))
            }
            Auth::Bearer(t) => Some(format!("Bearer {}", t.expose())),
            Auth::Token(t) => Some(format!("Token {}", t.expose())),
        }
    }
}

/// One HTTP peer: where to post and what every request carries.
pub struct HttpPeer {
    peer: Peer,
    agent: ureq::Agent,
    url: String,
    /// Auth and the configured headers, sent with every request (may hold secrets: never
    /// printed).
    headers: Vec<(String, String)>,
}

impl HttpPeer {
    /// A peer of kind `peer` at `url`: `timeout` per request, `auth`, and extra `headers`.
    pub fn new<'a>(
        peer: Peer,
        url: String,
        timeout: std::time::Duration,
        auth: &Auth,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> HttpPeer {
        let mut h: Vec<(String, String)> = Vec::new();
        if let Some(a) = auth.header() {
            h.push(("Authorization".into(), a));
        }
        h.extend(
            headers
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        HttpPeer {
            peer,
            agent: ureq::AgentBuilder::new().timeout(timeout).build(),
            url,
            headers: h,
        }
    }

    /// Posts `body` with `fixed` headers (content type and the like) before the peer's own;
    /// classifies the answer.
    pub fn post(&self, fixed: &[(&str, &str)], body: &[u8]) -> Outcome {
        let mut req = self.agent.post(&self.url).set(
            "User-Agent",
            concat!("edgewatch/", env!("CARGO_PKG_VERSION")),
        );
        for (k, v) in fixed {
            req = req.set(k, v);
        }
        for (k, v) in &self.headers {
            req = req.set(k, v);
        }
        match req.send_bytes(body) {
            Ok(r) => classify(self.peer, r.status(), None, ""),
            Err(ureq::Error::Status(code, r)) => {
                let ra = r.header("Retry-After").map(str::to_string);
                // A refusal's body is for the reason only: read a bounded prefix.
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(
                    &mut std::io::Read::take(r.into_reader(), 4096),
                    &mut text,
                );
                classify(self.peer, code, ra.as_deref(), &text)
            }
            Err(e) => Outcome::unreachable(format!("cannot reach {}: {e}", self.url)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_headers() {
        let basic = Auth::Basic {
            user: "edge".into(),
            password: Some(Secret::new("secret")),
        };
        assert_eq!(basic.header().unwrap(), "Basic ZWRnZTpzZWNyZXQ=");
        let nopw = Auth::Basic {
            user: "ab".into(),
            password: None,
        };
        assert_eq!(nopw.header().unwrap(), "Basic YWI6");
        assert_eq!(Auth::Bearer(Secret::new("t")).header().unwrap(), "Bearer t");
        assert_eq!(Auth::Token(Secret::new("t")).header().unwrap(), "Token t");
        assert_eq!(Auth::None.header(), None);
        assert_eq!(
            Auth::basic_or_bearer(&Credentials::default(), Some(&Secret::new("x"))),
            Auth::Bearer(Secret::new("x"))
        );
        let c = Credentials {
            username: None,
            password: Some(Secret::new("p")),
        };
        assert!(c
            .validate(None, "token")
            .unwrap_err()
            .contains("needs `username`"));
        let c = Credentials {
            username: Some("u".into()),
            password: None,
        };
        assert!(c
            .validate(Some(&Secret::new("t")), "bearer_token")
            .unwrap_err()
            .contains("bearer_token"));
    }
}
