//! Access control for every listener: which addresses may listen without a credential,
//! which HTTP requests need the `[http] token`, and whether a request carries it. The policy
//! ([`check_listeners`], [`Access::decide`], [`Access::allows`]) and the credential parsing
//! ([`presented_tokens`]) are pure; [`guard`] is the thin warp filter in front of every
//! route. It never looks at bodies and never logs a credential.
//!
//! Policy: a listener that other machines can reach ([`reachable_from_others`]: any address
//! but loopback) needs a credential check or an explicit opt-in. HTTP: with no token nothing
//! is checked, which is only allowed on loopback ([`Access::new`] refuses a non-loopback
//! address without one). With a token, writes (any method but GET/HEAD, and the write paths)
//! always need it, as does `/api/v1/config`; reads need it too when the server listens on a non-loopback address,
//! except `/health` and, with `metrics_open`, `/metrics`. The token is read from the
//! `Authorization` header on every path, and from `p=` in the query string on `/write`
//! only (InfluxDB 1.x clients). UDP carries no credential at all, so a non-loopback
//! `[udp] listen` is refused unless `[udp] allow_unauthenticated = true`.

use std::convert::Infallible;
use std::net::SocketAddr;

use base64::Engine as _;
use subtle::ConstantTimeEq;
use warp::http::{HeaderMap, Method, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply};

use crate::config::values::Secret;
use crate::config::{HttpConfig, UdpConfig};

/// Why the agent must not start with this access configuration.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// HTTP beyond loopback with nothing to check requests against.
    #[error(
        "[http] listen = {0} is reachable from other machines but no [http] token is set: \
         set one (e.g. EDGEWATCH_HTTP__TOKEN=$(openssl rand -hex 16)) or listen on 127.0.0.1"
    )]
    NoToken(SocketAddr),
    /// UDP beyond loopback without the opt-in: UDP writes carry no credential.
    #[error(
        "[udp] listen = {0} is reachable from other machines, and UDP writes carry no \
         credential (the [http] token does not apply to them): listen on 127.0.0.1, or set \
         [udp] enabled = false, or accept unauthenticated writes from the network with \
         [udp] allow_unauthenticated = true (EDGEWATCH_UDP__ALLOW_UNAUTHENTICATED=true)"
    )]
    UdpUnauthenticated(SocketAddr),
}

/// The one rule every listener follows: an address other machines can reach (anything but
/// loopback, including `0.0.0.0`) must check a credential or be opted in explicitly.
pub fn reachable_from_others(listen: SocketAddr) -> bool {
    !listen.ip().is_loopback()
}

/// The listeners' access, checked before anything binds (the agent) or as a dry run
/// (`edgewatch check-config`).
pub struct Listeners {
    /// The HTTP policy.
    pub access: Access,
    /// The UDP address that takes unauthenticated writes from the network by the
    /// `allow_unauthenticated` opt-in (to be logged at warn); `None` when UDP is off or on
    /// loopback.
    pub udp_open: Option<SocketAddr>,
}

/// Checks every listener of the config against the policy; an error when one would take
/// requests from other machines without a credential check or an opt-in.
pub fn check_listeners(http: &HttpConfig, udp: &UdpConfig) -> Result<Listeners, AccessError> {
    let access = Access::new(http)?;
    let udp_open = if udp.enabled && reachable_from_others(udp.listen) {
        if !udp.allow_unauthenticated {
            return Err(AccessError::UdpUnauthenticated(udp.listen));
        }
        Some(udp.listen)
    } else {
        None
    };
    Ok(Listeners { access, udp_open })
}

/// The access policy of a running server.
#[derive(Clone)]
pub struct Access {
    token: Secret,
    open_reads: bool,
    metrics_open: bool,
}

/// What a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing.
    Open,
    /// The token.
    Token,
}

/// The rejection of a request without a valid token.
#[derive(Debug)]
pub struct Unauthorized;

impl warp::reject::Reject for Unauthorized {}

impl Access {
    /// The policy for `http`; an error when it would expose the agent without a token.
    pub fn new(http: &HttpConfig) -> Result<Access, AccessError> {
        let remote = reachable_from_others(http.listen);
        if remote && http.token.is_empty() {
            return Err(AccessError::NoToken(http.listen));
        }
        Ok(Access {
            token: http.token.clone(),
            open_reads: !remote,
            metrics_open: http.metrics_open,
        })
    }

    /// What a request for `path` with `method` needs (pure).
    pub fn decide(&self, method: &Method, path: &str) -> Need {
        if self.token.is_empty() || path == "/health" {
            return Need::Open;
        }
        let write = !(method == Method::GET || method == Method::HEAD)
            || path == "/write"
            || path == "/api/v2/write"
            || path == CONFIG_PATH;
        if write {
            Need::Token
        } else if self.open_reads || (self.metrics_open && path == "/metrics") {
            Need::Open
        } else {
            Need::Token
        }
    }

    /// True when one of the presented credentials equals the token (constant time).
    pub fn accepts(&self, presented: &[String]) -> bool {
        let want = self.token.expose().as_bytes();
        let mut ok = subtle::Choice::from(0);
        for p in presented {
            ok |= p.as_bytes().ct_eq(want);
        }
        bool::from(ok)
    }

    /// The whole decision for one request (pure): open, or needs the token and carries it.
    pub fn allows(&self, method: &Method, path: &str, headers: &HeaderMap, query: &str) -> bool {
        match self.decide(method, path) {
            Need::Open => true,
            Need::Token => self.accepts(&presented_tokens(path, headers, query)),
        }
    }
}

/// The effective config (secrets redacted, but the rest still says where the data goes):
/// it needs the token even on loopback, like a write.
pub const CONFIG_PATH: &str = "/api/v1/config";

/// The only path that reads the token from the query string (`p=`, as InfluxDB 1.x
/// clients send it); everywhere else a URL is too easily logged, bookmarked or shared.
pub const QUERY_TOKEN_PATH: &str = "/write";

/// Every credential a request for `path` presents: `Authorization: Bearer|Token <t>`, the
/// password of `Authorization: Basic`, and on [`QUERY_TOKEN_PATH`] only, `p=<t>` in the
/// query string.
pub fn presented_tokens(path: &str, headers: &HeaderMap, query: &str) -> Vec<String> {
    let mut out = Vec::new();
    for v in headers.get_all(warp::http::header::AUTHORIZATION) {
        let Ok(v) = v.to_str() else { continue };
        let Some((scheme, rest)) = v.trim().split_once(' ') else {
            continue;
        };
        let rest = rest.trim();
        match scheme.to_ascii_lowercase().as_str() {
            "bearer" | "token" => out.push(rest.to_string()),
            "basic" => {
                if let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(rest) {
                    if let Ok(text) = String::from_utf8(raw) {
                        if let Some((_, pass)) = text.split_once(':') {
                            out.push(pass.to_string());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    if path == QUERY_TOKEN_PATH {
        for pair in query.split('&') {
            if let Some(p) = pair.strip_prefix("p=") {
                out.push(percent_decode(p));
            }
        }
    }
    out
}

/// Decodes `%XX` and `+` of a query-string value; malformed escapes stay as they are.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The filter in front of every route: passes, or rejects with [`Unauthorized`].
pub fn guard(access: Access) -> impl Filter<Extract = (), Error = warp::Rejection> + Clone {
    let query = warp::query::raw().or(warp::any().map(String::new)).unify();
    warp::method()
        .and(warp::path::full())
        .and(warp::header::headers_cloned())
        .and(query)
        .and_then(
            move |method: Method, path: warp::path::FullPath, headers: HeaderMap, q: String| {
                let ok = access.allows(&method, path.as_str(), &headers, &q);
                async move {
                    if ok {
                        Ok(())
                    } else {
                        Err(warp::reject::custom(Unauthorized))
                    }
                }
            },
        )
        .untuple_one()
}

/// 401 with a challenge a browser answers with its login dialog (basic auth: any user
/// name, the token as password) and API clients read as "send the token".
pub fn unauthorized() -> Response {
    let mut r = warp::reply::with_status(
        warp::reply::json(&serde_json::json!({
            "error": "unauthorized: send the [http] token as `Authorization: Bearer <token>` (or basic auth with the token as password; on /write also `p=<token>`)"
        })),
        StatusCode::UNAUTHORIZED,
    )
    .into_response();
    r.headers_mut().insert(
        warp::http::header::WWW_AUTHENTICATE,
        warp::http::HeaderValue::from_static("Basic realm=\"edgewatch\", charset=\"UTF-8\""),
    );
    r
}

/// Answers [`Unauthorized`] with 401 and every other rejection as the API does.
pub async fn recover(r: warp::Rejection) -> Result<Response, Infallible> {
    if r.find::<Unauthorized>().is_some() {
        return Ok(unauthorized());
    }
    crate::api::recover(r).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(listen: &str, token: &str, metrics_open: bool) -> Result<Access, AccessError> {
        Access::new(&HttpConfig {
            listen: listen.parse().unwrap(),
            token: Secret::new(token),
            metrics_open,
            ..HttpConfig::default()
        })
    }

    #[test]
    fn the_effective_config_needs_the_token_even_on_loopback() {
        let a = access("127.0.0.1:9400", "t0k", false).unwrap();
        assert_eq!(a.decide(&Method::GET, CONFIG_PATH), Need::Token);
        assert_eq!(a.decide(&Method::GET, "/api/v1/status"), Need::Open);
        assert_eq!(a.decide(&Method::POST, "/api/v1/reload"), Need::Token);
        let open = access("127.0.0.1:9400", "", false).unwrap();
        assert_eq!(open.decide(&Method::GET, CONFIG_PATH), Need::Open);
    }

    #[test]
    fn non_loopback_without_a_token_is_refused() {
        let e = access("0.0.0.0:9400", "", false).err().unwrap().to_string();
        assert!(e.contains("EDGEWATCH_HTTP__TOKEN"), "{e}");
        assert!(access("[::1]:9400", "", false).is_ok());
        assert!(access("127.0.0.1:9400", "", false).is_ok());
    }

    #[test]
    fn loopback_with_a_token_guards_writes_only() {
        let a = access("127.0.0.1:9400", "t", false).unwrap();
        assert_eq!(a.decide(&Method::GET, "/api/v1/status"), Need::Open);
        assert_eq!(a.decide(&Method::GET, "/"), Need::Open);
        assert_eq!(a.decide(&Method::POST, "/write"), Need::Token);
        assert_eq!(a.decide(&Method::POST, "/api/v2/write"), Need::Token);
        let none = access("127.0.0.1:9400", "", false).unwrap();
        assert_eq!(none.decide(&Method::POST, "/write"), Need::Open);
    }

    #[test]
    fn remote_guards_everything_but_health_and_open_metrics() {
        let a = access("0.0.0.0:9400", "t", false).unwrap();
        assert_eq!(a.decide(&Method::GET, "/health"), Need::Open);
        assert_eq!(a.decide(&Method::GET, "/metrics"), Need::Token);
        assert_eq!(a.decide(&Method::GET, "/"), Need::Token);
        assert_eq!(a.decide(&Method::GET, "/ping"), Need::Token);
        let m = access("0.0.0.0:9400", "t", true).unwrap();
        assert_eq!(m.decide(&Method::GET, "/metrics"), Need::Open);
        assert_eq!(m.decide(&Method::GET, "/api/v1/query"), Need::Token);
    }

    #[test]
    fn every_client_style_of_credential_is_read() {
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer abc".parse().unwrap());
        assert_eq!(presented_tokens("/api/v1/query", &h, ""), vec!["abc"]);
        h.insert("authorization", "Token def".parse().unwrap());
        assert_eq!(presented_tokens("/api/v2/write", &h, ""), vec!["def"]);
        // user:pa:ss
        h.insert("authorization", "Basic dXNlcjpwYTpzcw==".parse().unwrap());
        assert_eq!(presented_tokens("/", &h, ""), vec!["pa:ss"]);
        let empty = HeaderMap::new();
        assert_eq!(
            presented_tokens("/write", &empty, "db=x&u=edge&p=a%2Bb+c"),
            vec!["a+b c"]
        );
        let a = access("0.0.0.0:9400", "a+b c", false).unwrap();
        assert!(a.accepts(&presented_tokens("/write", &empty, "p=a%2Bb+c")));
        assert!(!a.accepts(&["a+b".into(), String::new()]));
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn query_string_token_counts_on_write_only() {
        let empty = HeaderMap::new();
        for path in [
            "/api/v2/write",
            "/api/v1/query",
            "/api/v1/status",
            "/metrics",
            "/",
            "/write/",
            "/writes",
        ] {
            assert!(
                presented_tokens(path, &empty, "u=edge&p=t").is_empty(),
                "p= read on {path}"
            );
        }
        let remote = access("0.0.0.0:9400", "t", false).unwrap();
        assert!(remote.allows(&Method::POST, "/write", &empty, "u=edge&p=t"));
        assert!(!remote.allows(&Method::POST, "/write", &empty, "p=x"));
        for (method, path) in [
            (Method::POST, "/api/v2/write"),
            (Method::GET, "/api/v1/query"),
            (Method::GET, "/api/v1/status"),
            (Method::GET, "/metrics"),
            (Method::GET, "/"),
        ] {
            assert!(
                !remote.allows(&method, path, &empty, "p=t"),
                "{method} {path} let in by p="
            );
        }
        // The header is read on every path.
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer t".parse().unwrap());
        assert!(remote.allows(&Method::GET, "/api/v1/status", &h, ""));
        assert!(remote.allows(&Method::GET, "/health", &empty, "p=wrong"));
    }

    fn udp(listen: &str, enabled: bool, allow: bool) -> UdpConfig {
        UdpConfig {
            listen: listen.parse().unwrap(),
            enabled,
            allow_unauthenticated: allow,
            ..UdpConfig::default()
        }
    }

    #[test]
    fn udp_off_loopback_needs_the_opt_in_whatever_the_http_token() {
        let http = HttpConfig {
            token: Secret::new("t"),
            ..HttpConfig::default()
        };
        let e = check_listeners(&http, &udp("0.0.0.0:8089", true, false))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("[udp] listen = 0.0.0.0:8089") && e.contains("allow_unauthenticated = true"),
            "{e}"
        );
        let e = check_listeners(&http, &udp("192.0.2.7:8089", true, false));
        assert!(matches!(e, Err(AccessError::UdpUnauthenticated(_))));
        let ok = check_listeners(&http, &udp("0.0.0.0:8089", true, true)).unwrap();
        assert_eq!(ok.udp_open, Some("0.0.0.0:8089".parse().unwrap()));
        for quiet in [
            udp("127.0.0.1:8089", true, false),
            udp("[::1]:8089", true, true),
            udp("0.0.0.0:8089", false, false),
        ] {
            assert_eq!(check_listeners(&http, &quiet).unwrap().udp_open, None);
        }
        // The HTTP rule is checked by the same entry point.
        let open_http = HttpConfig {
            listen: "0.0.0.0:9400".parse().unwrap(),
            ..HttpConfig::default()
        };
        assert!(matches!(
            check_listeners(&open_http, &udp("127.0.0.1:8089", true, false)),
            Err(AccessError::NoToken(_))
        ));
    }
}
