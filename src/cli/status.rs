//! `edgewatch status`: GETs `/api/v1/status` of the running agent, reads it into the typed
//! [`Status`] document and prints it as a table (or, with `--json`, the reply as sent). It
//! never opens the store: a stopped agent is an error that says so.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

use edgewatch::status::Status;

/// Arguments of `edgewatch status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Base URL of the agent (default: http://<[http] listen> of the config).
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Config file to take [http] listen and [http] token from.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Access token (default: [http] token of the config); sent as a bearer token.
    #[arg(long, value_name = "T")]
    token: Option<String>,
    /// Print the raw JSON document of /api/v1/status.
    #[arg(long)]
    json: bool,
}

/// `edgewatch status`.
pub fn run(a: StatusArgs) -> anyhow::Result<ExitCode> {
    status_command(a.url, a.config, a.token, a.json)
}

/// `edgewatch status`: GET /api/v1/status of the running agent and print it.
fn status_command(
    url: Option<String>,
    config: Option<PathBuf>,
    token: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // The config is only needed for what the flags leave out.
    let cfg = if url.is_none() || token.is_none() {
        Some(crate::load_config(config.as_deref())?)
    } else {
        None
    };
    let base = url.unwrap_or_else(|| agent_base(cfg.as_ref()));
    let token = token
        .filter(|t| !t.is_empty())
        .or_else(|| cfg.as_ref().and_then(agent_token));
    let (url, body) = fetch(
        &base,
        "/api/v1/status",
        token.as_deref(),
        "the status document",
    )?;
    let mut out = std::io::stdout().lock();
    if json {
        // As the agent sent it: an agent of another version may have keys this one lacks.
        let v: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("{url} did not answer JSON"))?;
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        let st: Status = serde_json::from_str(&body).with_context(|| {
            format!(
                "{url} did not answer a status document this edgewatch {} can read \
                 (is the agent another version? --json prints what it answered)",
                env!("CARGO_PKG_VERSION")
            )
        })?;
        out.write_all(render_status(&st, &base, edgewatch::now_ns()).as_bytes())?;
        out.write_all(render_notify(&st.notify, edgewatch::now_ns()).as_bytes())?;
        if let Some(c) = &st.config {
            out.write_all(render_config(c).as_bytes())?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The `config` part: the effective sha256, the layers, the last reload, what waits for a
/// restart.
fn render_config(c: &edgewatch::status::config::ConfigInfo) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "config:     sha256 {}; reloads {} applied, {} failed",
        c.sha256, c.reloads_applied, c.reloads_failed
    );
    for l in &c.layers {
        let state = serde_json::to_value(l.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "  layer {}: {state}{}{}",
            l.source,
            l.version.map(|v| format!(" v{v}")).unwrap_or_default(),
            l.error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
    }
    if let Some(r) = &c.last_reload {
        let what = if r.ok {
            format!(
                "applied {}",
                if r.applied.is_empty() {
                    "nothing (unchanged)".to_string()
                } else {
                    r.applied.join(", ")
                }
            )
        } else {
            format!("FAILED: {}", r.error.as_deref().unwrap_or("?"))
        };
        let _ = writeln!(o, "  last reload {} ({}): {what}", r.time, r.trigger);
    }
    if !c.restart_required.is_empty() {
        let _ = writeln!(
            o,
            "  restart required for: {}",
            c.restart_required.join(", ")
        );
    }
    o
}

/// A duration in seconds as `4s`, `3m12s`, `2h05m`, `3d04h`.
fn human_age(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "-".into();
    }
    let t = s.round() as u64;
    match t {
        0..=59 => format!("{t}s"),
        60..=3599 => format!("{}m{:02}s", t / 60, t % 60),
        3600..=86_399 => format!("{}h{:02}m", t / 3600, t % 3600 / 60),
        _ => format!("{}d{:02}h", t / 86_400, t % 86_400 / 3600),
    }
}

fn human_bytes(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

/// `collectors.jetson` in one line: identity, power mode, jetson_clocks, throttling.
fn jetson_line(j: &edgewatch::status::Jetson, now_ns: i64) -> String {
    if j.state != "running" && j.state != "stopped" {
        return j.state.clone();
    }
    let or_q = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
    let mode = match (&j.power_mode, j.power_mode_id) {
        (Some(n), Some(i)) => format!("{n} (id {i})"),
        (None, Some(i)) => format!("id {i}"),
        (Some(n), None) => n.clone(),
        (None, None) => "?".into(),
    };
    let throttled = match (j.throttled, j.last_throttled_ns) {
        (Some(true), _) => "throttled now".to_string(),
        (_, Some(t)) => format!(
            "last throttled {} ago",
            human_age((now_ns - t) as f64 / 1e9)
        ),
        _ => "not throttled".into(),
    };
    format!(
        "{}, L4T {} (JetPack {}), power mode {mode}, jetson_clocks {}; {throttled}; processes {}{}{}",
        or_q(&j.module),
        or_q(&j.l4t),
        or_q(&j.jetpack),
        or_q(&j.jetson_clocks),
        j.processes,
        j.gpu_source
            .as_ref()
            .map(|g| format!("; GPU source {g}"))
            .unwrap_or_default(),
        if j.missing.is_empty() {
            String::new()
        } else {
            format!("; not found: {}", j.missing.join(", "))
        }
    )
}

/// The readable form of the status document.
/// The alert notifiers: one line each (nothing when none is configured).
fn render_notify(n: &edgewatch::status::notify::Notify, now_ns: i64) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    if n.notifiers.is_empty() {
        return o;
    }
    let _ = writeln!(o, "notify:");
    for k in &n.notifiers {
        let ago = |t: i64| format!("{} ago", human_age((now_ns - t) as f64 / 1e9));
        let mut line = format!(
            "  {} ({}){}: position {}, pending {}, delivered {}, dead letters {}, last ok {}",
            k.name,
            k.kind,
            if k.enabled { "" } else { " off" },
            k.position,
            k.pending_events,
            k.delivered,
            k.dead_letters,
            k.last_success_ns.map_or_else(|| "never".into(), ago),
        );
        if let Some(f) = k.firing {
            let _ = write!(line, ", firing {f}");
        }
        if let Some(e) = &k.last_error {
            let e: String = e.chars().take(80).collect();
            let _ = write!(line, "; last error: {e}");
            if let Some(t) = k.next_retry_ns.filter(|t| *t > now_ns) {
                let _ = write!(line, " (retry in {})", human_age((t - now_ns) as f64 / 1e9));
            }
        }
        if let Some(d) = &k.last_dead_letter {
            let r: String = d.reason.chars().take(60).collect();
            let _ = write!(line, "; last dead letter: seq {} {r}", d.seq);
        }
        let _ = writeln!(o, "{line}");
    }
    o
}

fn render_status(v: &Status, base: &str, now_ns: i64) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    // What the agent has written to storage since it started: its wear on the flash, and
    // the rate once a minute has passed (the start's own writes weigh less by then).
    let written = v.agent.disk_written_bytes.map_or_else(String::new, |b| {
        let up = v.agent.uptime_s as f64;
        let rate = if up >= 60.0 {
            format!(" ({}/h)", human_bytes(b as f64 * 3600.0 / up))
        } else {
            String::new()
        };
        format!(
            "; {} written to storage since start{rate}",
            human_bytes(b as f64)
        )
    });
    let _ = writeln!(
        o,
        "edgewatch {} at {base}, up {}{written}",
        v.agent.version,
        human_age(v.agent.uptime_s as f64)
    );
    let i = &v.ingest;
    let _ = writeln!(
        o,
        "ingest:     {} points written, {} rejected, {} dropped, {} throttled; queue {}/{}; last commit {:.1} ms",
        i.points_written,
        i.points_rejected,
        i.points_dropped,
        i.writes_throttled,
        i.queue_points,
        i.queue_capacity,
        i.last_commit_ms,
    );
    let s = &v.store;
    let budget = v.rollup.as_ref().map_or(0, |r| r.budget.max_bytes);
    let _ = writeln!(
        o,
        "store:      {} of {} ({} series of {} max) in {}, synchronous = {}",
        human_bytes(s.db_bytes as f64),
        if budget > 0 {
            format!("{} budget", human_bytes(budget as f64))
        } else {
            "no budget".into()
        },
        s.series.map_or_else(|| "?".into(), |n| n.to_string()),
        s.max_series,
        s.path.display(),
        match s.synchronous {
            edgewatch::config::Synchronous::Full =>
                "full (acknowledged writes survive a power cut)",
            edgewatch::config::Synchronous::Normal =>
                "normal (a power cut may lose writes acknowledged since the last checkpoint)",
        },
    );
    if let Some(w) = &s.write {
        let _ = writeln!(
            o,
            "writing:    {:.0} values/s, {}/s ({:.2} bytes a value); runway {}",
            w.values_per_s,
            human_bytes(w.bytes_per_s),
            w.bytes_per_value,
            match w.runway_s {
                Some(r) => format!(
                    "{} before eviction begins",
                    edgewatch::status::rate::human_duration(r)
                ),
                None => "unlimited (no budget)".into(),
            },
        );
    }
    match &v.rollup {
        Some(r) => {
            let tiers: Vec<String> = r
                .tiers
                .iter()
                .map(|t| {
                    format!(
                        "{} lag {} ({} chunks pending, folded every {})",
                        t.name,
                        t.lag_s.map_or_else(|| "not run yet".into(), human_age),
                        t.pending_chunks,
                        human_age(t.fold_every_s as f64)
                    )
                })
                .collect();
            let _ = writeln!(
                o,
                "rollup:     {}; evicted {} raw points",
                if tiers.is_empty() {
                    "no tiers".into()
                } else {
                    tiers.join(", ")
                },
                r.evicted.raw_points
            );
        }
        None => {
            let _ = writeln!(
                o,
                "rollup:     unknown (the agent could not read its store)"
            );
        }
    }
    let c = &v.collectors;
    let nv = &c.nvml;
    let g = nv.gpus.len();
    let _ = writeln!(
        o,
        "collectors: {} errors; nvml {}{}",
        c.errors,
        nv.state,
        if g > 0 {
            format!(
                " ({g} GPU{}, driver {})",
                if g == 1 { "" } else { "s" },
                nv.driver
            )
        } else {
            String::new()
        }
    );
    // An agent without the [jetson] part (older) leaves it empty: no line.
    if !c.jetson.state.is_empty() {
        let _ = writeln!(o, "jetson:     {}", jetson_line(&c.jetson, now_ns));
    }
    let sinks = &v.forward.sinks;
    if sinks.is_empty() {
        let _ = writeln!(o, "forwarding: no sinks configured");
        return o;
    }
    let _ = writeln!(o, "forwarding: device_id {}", v.forward.device_id);
    let head = [
        "SINK",
        "TYPE",
        "STATE",
        "BACKLOG",
        "OLDEST",
        "LAST OK",
        "DEAD",
        "RATE/S",
        "FALLBACK",
        "LAST ERROR",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|h| h.to_string()).collect()];
    for k in sinks {
        let state = if k.paused {
            "paused"
        } else if k.connected {
            "connected"
        } else {
            "down"
        };
        let last_ok = k
            .last_success_ns
            .map(|t| format!("{} ago", human_age((now_ns - t) as f64 / 1e9)))
            .unwrap_or_else(|| "never".into());
        let err = k
            .last_error
            .as_deref()
            .map(|e| {
                let e: String = e.chars().take(60).collect();
                match k.last_error_ns {
                    Some(t) => format!("{} ago: {e}", human_age((now_ns - t) as f64 / 1e9)),
                    None => e,
                }
            })
            .unwrap_or_else(|| "-".into());
        rows.push(vec![
            k.name.clone(),
            k.kind.clone(),
            state.to_string(),
            k.backlog_points.to_string(),
            k.oldest_unsent_age_s.map_or_else(|| "-".into(), human_age),
            last_ok,
            format!("{} ({} pts)", k.dead_letter_batches, k.dead_letter_points),
            format!("{:.0}", k.drain_rate_pps),
            format!("{}/{}", k.fallback_points, k.evicted_unforwarded_points),
            err,
        ]);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
        let _ = writeln!(o, "  {}", line.trim_end());
    }
    let _ = writeln!(
        o,
        "  (FALLBACK: rollup points sent / raw points evicted before this sink sent them)"
    );
    o
}

/// The base URL of the agent running with `cfg`: `http://` and its `[http] listen` (loopback
/// for an unspecified address, on which such an agent answers too); the default listen
/// without a config.
pub(crate) fn agent_base(cfg: Option<&edgewatch::config::Config>) -> String {
    let listen = cfg
        .map(|c| c.http.listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9400)));
    let host = if listen.ip().is_unspecified() {
        if listen.is_ipv4() {
            "127.0.0.1".to_string()
        } else {
            "[::1]".to_string()
        }
    } else if listen.is_ipv6() {
        format!("[{}]", listen.ip())
    } else {
        listen.ip().to_string()
    };
    format!("http://{host}:{}", listen.port())
}

/// `[http] token` of `cfg`, when it sets one.
pub(crate) fn agent_token(cfg: &edgewatch::config::Config) -> Option<String> {
    Some(cfg.http.token.expose().to_string()).filter(|t| !t.is_empty())
}

/// GETs `path` from the agent at `base` (with `token` as a bearer token) and returns the URL
/// and the body; a refused token, an error answer and an unreachable agent each get a clear
/// message. `what` names the document in a read error. Shared by `status` and `alerts`.
pub(crate) fn fetch(
    base: &str,
    path: &str,
    token: Option<&str>,
    what: &str,
) -> anyhow::Result<(String, String)> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(10))
        .build();
    let mut req = agent.get(&url);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let body = match req.call() {
        Ok(r) => r.into_string().with_context(|| format!("reading {what}"))?,
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
    Ok((url, body))
}
