//! `edgewatch reload`: asks the running agent to reload its config now (`POST
//! /api/v1/reload` with the configured token), prints what was applied in place and what
//! needs a restart, and exits non-zero printing the reason when the new config is invalid
//! (the agent then runs on unchanged). It never reads the store and never signals a process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

use edgewatch::config::layers::ReloadReport;

/// Arguments of `edgewatch reload`.
#[derive(clap::Args)]
pub struct ReloadArgs {
    /// Base URL of the agent (default: http://<[http] listen> of the config).
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Config file to take [http] listen and [http] token from.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Access token (default: [http] token of the config); sent as a bearer token.
    #[arg(long, value_name = "T")]
    token: Option<String>,
}

/// The base URL an agent listening on `listen` answers on from this machine.
pub fn local_base(listen: SocketAddr) -> String {
    let mut listen = listen;
    if listen.ip().is_unspecified() {
        listen.set_ip(if listen.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    format!("http://{listen}")
}

/// `edgewatch reload`.
pub fn run(a: ReloadArgs) -> anyhow::Result<ExitCode> {
    // The file as it is now: the agent is about to read the same one. A file that does not
    // load is still sent for (the agent reports why): its `[http] listen` and `token` are
    // then read from it as plain TOML where they can be, else from the flags or defaults.
    let (listen, file_token) = if a.url.is_none() || a.token.is_none() {
        match crate::load_config(a.config.as_deref()) {
            Ok(c) => (Some(c.http.listen), Some(c.http.token.expose().to_string())),
            Err(e) => {
                eprintln!("warning: {e:#}; asking the agent anyway");
                loose_http(a.config.as_deref())
            }
        }
    } else {
        (None, None)
    };
    let base = a.url.unwrap_or_else(|| {
        local_base(listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9400))))
    });
    let token = a
        .token
        .filter(|t| !t.is_empty())
        .or(file_token)
        .filter(|t| !t.is_empty());
    let url = format!("{}/api/v1/reload", base.trim_end_matches('/'));
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(130))
        .build();
    let mut req = agent.post(&url);
    if let Some(t) = &token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let body = match req.call() {
        Ok(r) => r.into_string().context("reading the reload report")?,
        Err(ureq::Error::Status(422, r)) => r.into_string().context("reading the reload report")?,
        Err(ureq::Error::Status(code @ (401 | 403), _)) => bail!(
            "{url} answered {code}: the agent wants a token (--token, or [http] token in --config)"
        ),
        Err(ureq::Error::Status(code, r)) => {
            let b = r.into_string().unwrap_or_default();
            bail!("{url} answered {code}: {}", b.trim())
        }
        Err(e) => bail!(
            "cannot reach the agent at {base} ({e}); is `edgewatch run` running there? \
             (--url, or --config for its [http] listen)"
        ),
    };
    let r: ReloadReport = serde_json::from_str(&body)
        .with_context(|| format!("{url} did not answer a reload report"))?;
    print!("{}", render(&r));
    if !r.ok {
        eprintln!(
            "reload refused: {}",
            r.error.as_deref().unwrap_or("(no reason given)")
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `[http] listen` and `token` of a config file that does not load as a config (an unknown
/// key, a bad rule), read as plain TOML; `None` where even that fails.
fn loose_http(path: Option<&std::path::Path>) -> (Option<SocketAddr>, Option<String>) {
    let table: Option<toml::Table> = path
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| t.parse().ok());
    let http = table.as_ref().and_then(|t| t.get("http"));
    let listen = http
        .and_then(|h| h.get("listen"))
        .and_then(|l| l.as_str())
        .and_then(|l| l.parse().ok());
    let token = http
        .and_then(|h| h.get("token"))
        .and_then(|t| t.as_str())
        .map(str::to_string);
    (listen, token)
}

/// The report as lines.
pub fn render(r: &ReloadReport) -> String {
    let mut o = String::new();
    if !r.ok {
        o.push_str("config not reloaded: the running config is unchanged\n");
        return o;
    }
    o.push_str(&format!("config reloaded (sha256 {})\n", r.sha256));
    if r.applied.is_empty() {
        o.push_str("applied: nothing changed\n");
    }
    for a in &r.applied {
        o.push_str(&format!("applied: {a}\n"));
    }
    for k in &r.restart_required {
        o.push_str(&format!(
            "restart required: {k} (takes effect at the next start)\n"
        ));
    }
    o
}
