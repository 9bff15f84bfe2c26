//! `edgewatch alerts`: GETs `/api/v1/alerts` of the running agent and prints one line per
//! alert instance (rule, state, value, since when, labels), firing first; `--json` prints the
//! reply as sent. It never opens the store: a stopped agent is an error that says so.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use edgewatch::alert::view::AlertItem;

/// Arguments of `edgewatch alerts`.
#[derive(clap::Args)]
pub struct AlertsArgs {
    /// Base URL of the agent (default: http://<[http] listen> of the config).
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Config file to take [http] listen and [http] token from.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Access token (default: [http] token of the config); sent as a bearer token.
    #[arg(long, value_name = "T")]
    token: Option<String>,
    /// Print the raw JSON answer of /api/v1/alerts.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Deserialize)]
struct Answer {
    alerts: Vec<AlertItem>,
}

/// `edgewatch alerts`.
pub fn run(a: AlertsArgs) -> anyhow::Result<ExitCode> {
    let cfg = if a.url.is_none() || a.token.is_none() {
        Some(crate::load_config(a.config.as_deref())?)
    } else {
        None
    };
    let base = a
        .url
        .unwrap_or_else(|| super::status::agent_base(cfg.as_ref()));
    let token = a
        .token
        .filter(|t| !t.is_empty())
        .or_else(|| cfg.as_ref().and_then(super::status::agent_token));
    let (url, body) =
        super::status::fetch(&base, "/api/v1/alerts", token.as_deref(), "the alerts")?;
    let mut out = std::io::stdout().lock();
    if a.json {
        let v: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("{url} did not answer JSON"))?;
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        let ans: Answer = serde_json::from_str(&body).with_context(|| {
            format!("{url} did not answer an alert list this edgewatch can read")
        })?;
        out.write_all(render(&ans.alerts).as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The table: firing, then pending, then inactive; by rule name within each.
fn render(alerts: &[AlertItem]) -> String {
    let rank = |s: &str| match s {
        "firing" => 0,
        "pending" => 1,
        _ => 2,
    };
    let mut rows: Vec<&AlertItem> = alerts.iter().collect();
    rows.sort_by(|a, b| (rank(&a.state), &a.name).cmp(&(rank(&b.state), &b.name)));
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|a| {
            let labels: Vec<String> = a
                .labels
                .iter()
                .filter(|(k, _)| *k != "severity")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            [
                a.name.clone(),
                a.state.to_uppercase(),
                a.value
                    .map_or("-".into(), edgewatch::alert::rules::fmt_value),
                a.active_since.clone().unwrap_or_else(|| "-".into()),
                labels.join(","),
            ]
        })
        .collect();
    let head = ["RULE", "STATE", "VALUE", "SINCE", "LABELS"];
    let mut width = head.map(str::len);
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |c: [&str; 5]| {
        let mut l = String::new();
        for (i, s) in c.iter().enumerate() {
            if i == 4 {
                l.push_str(s);
            } else {
                l.push_str(&format!("{s:<w$}  ", w = width[i]));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(head);
    for c in &cells {
        line([&c[0], &c[1], &c[2], &c[3], &c[4]]);
    }
    out
}
