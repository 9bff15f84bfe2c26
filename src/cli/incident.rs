//! `edgewatch incident show ID --agent URL`: GETs `/api/v1/incidents/{id}` of an agent the
//! caller can reach (the fleet side fetching the snapshot a notification named) and prints it
//! readably: the alert, its times, the ranked findings, the wall-vs-GPU split, the events
//! and the top processes; `--json` prints the reply as sent. It never opens a store.

use std::fmt::Write as _;
use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Context};
use serde_json::Value;

/// Arguments of `edgewatch incident`.
#[derive(clap::Args)]
pub struct IncidentArgs {
    #[command(subcommand)]
    cmd: IncidentCmd,
}

#[derive(clap::Subcommand)]
enum IncidentCmd {
    /// Fetch one incident's triage snapshot from an agent and print it.
    Show(ShowArgs),
}

#[derive(clap::Args)]
struct ShowArgs {
    /// The incident's id (the `incident_id` of the notification or of the
    /// `edgewatch_incident` point).
    id: i64,
    /// Base URL of the agent that opened it (e.g. http://10.0.0.7:9400, or the fleet proxy's
    /// route to it).
    #[arg(long, value_name = "URL")]
    agent: String,
    /// Access token of that agent ([http] token); sent as a bearer token.
    #[arg(
        long,
        value_name = "T",
        env = "EDGEWATCH_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Print the raw JSON answer of /api/v1/incidents/{id}.
    #[arg(long)]
    json: bool,
}

/// `edgewatch incident ...`.
pub fn run(a: IncidentArgs) -> anyhow::Result<ExitCode> {
    match a.cmd {
        IncidentCmd::Show(s) => show(s),
    }
}

fn show(a: ShowArgs) -> anyhow::Result<ExitCode> {
    if a.id <= 0 {
        bail!("incident ids are positive integers (got {})", a.id);
    }
    if !(a.agent.starts_with("http://") || a.agent.starts_with("https://")) {
        bail!(
            "--agent wants the agent's base URL, such as http://10.0.0.7:9400 (got {:?})",
            a.agent
        );
    }
    let token = a.token.filter(|t| !t.is_empty());
    let path = format!("/api/v1/incidents/{}", a.id);
    let what = format!("incident {}", a.id);
    let (url, body) = super::status::fetch(&a.agent, &path, token.as_deref(), &what)?;
    let v: Value =
        serde_json::from_str(&body).with_context(|| format!("{url} did not answer JSON"))?;
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        if v["id"].as_i64() != Some(a.id) || !v["snapshot"].is_object() {
            bail!("{url} did not answer an incident this edgewatch can read");
        }
        out.write_all(render(&v).as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn num(v: &Value) -> String {
    v.as_f64()
        .map_or("-".into(), edgewatch::alert::rules::fmt_value)
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

fn clock(ns: &Value) -> String {
    ns.as_i64()
        .map_or("-".into(), edgewatch::alert::incident::snapshot::clock)
}

/// The incident as text.
fn render(v: &Value) -> String {
    let mut o = String::new();
    let s = &v["snapshot"];
    let labels: Vec<String> = v["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, x)| format!("{k}={}", x.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "incident {}: {} {{{}}}",
        v["id"],
        text(&v["rule"]),
        labels.join(",")
    );
    let _ = writeln!(
        o,
        "fired     {}  value {} (threshold {})",
        text(&v["fired"]),
        num(&v["value"]),
        num(&v["threshold"])
    );
    let _ = writeln!(o, "started   {}", text(&v["started"]));
    let _ = writeln!(
        o,
        "resolved  {}",
        v["resolved"].as_str().unwrap_or("- (still open)")
    );
    let _ = writeln!(
        o,
        "window    {} to {} UTC, against the hour before ({})",
        clock(&s["window"]["from_ns"]),
        clock(&s["window"]["to_ns"]),
        text(&s["window_note"])
    );
    let findings = s["findings"].as_array().cloned().unwrap_or_default();
    if findings.is_empty() {
        let _ = writeln!(
            o,
            "\nfindings: none (nothing the routine reads moved from its baseline)"
        );
    } else {
        let _ = writeln!(o, "\nfindings, likely cause first:");
        for (i, f) in findings.iter().enumerate() {
            let scope = f["scope"].as_str().filter(|x| !x.is_empty());
            let _ = writeln!(
                o,
                "  {}. {}{}  [{}, score {}]",
                i + 1,
                text(&f["message"]),
                scope.map_or(String::new(), |x| format!(" ({x})")),
                text(&f["step"]),
                num(&f["score"])
            );
        }
    }
    if let Some(m) = s["split"]["message"].as_str() {
        let _ = writeln!(o, "\nsplit: {m}");
    }
    let events = s["events"].as_array().cloned().unwrap_or_default();
    if !events.is_empty() {
        let _ = writeln!(o, "\nevents:");
        for e in &events {
            let _ = writeln!(
                o,
                "  {}  {} {} ({}): {}",
                clock(&e["at_ns"]),
                text(&e["severity"]),
                text(&e["kind"]),
                text(&e["source"]),
                text(&e["message"])
            );
        }
    }
    for (key, title, figure, unit) in [
        ("by_cpu", "top processes by CPU", "cpu_pct", "% CPU"),
        (
            "by_gpu_mem",
            "top processes by GPU memory",
            "gpu_mem_mb",
            "MiB",
        ),
    ] {
        let procs = s["processes"][key].as_array().cloned().unwrap_or_default();
        if procs.is_empty() {
            continue;
        }
        let _ = writeln!(o, "\n{title}:");
        for p in &procs {
            let _ = writeln!(
                o,
                "  {:>7}  {:<20} {} {unit}",
                p["pid"],
                text(&p["name"]),
                num(&p[figure])
            );
        }
    }
    if let Some(c) = s["checked"].as_object() {
        let steps: Vec<String> = c
            .iter()
            .map(|(k, x)| format!("{k} {}", if x == true { "yes" } else { "no data" }))
            .collect();
        let _ = writeln!(o, "\nchecked: {}", steps.join(", "));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_incident_reads_as_text() {
        let v = serde_json::json!({
            "id": 7, "rule": "R", "labels": {"model": "a"}, "value": 100.0, "threshold": 50.0,
            "fired": "2026-01-01T00:00:10.000Z", "started": "2026-01-01T00:00:08.000Z",
            "resolved": null,
            "snapshot": {
                "window": {"from_ns": 0, "to_ns": 10_000_000_000i64}, "window_note": "n",
                "findings": [{"message": "batch_size p95 8x baseline", "scope": "model=a",
                              "step": "input", "score": 3.0}],
                "split": {"message": "wall_ms mean +90.0 ms; no gpu_ms to split it"},
                "events": [], "processes": {"by_cpu": [{"pid": 1, "name": "init", "cpu_pct": 2.5}],
                "by_gpu_mem": []}, "checked": {"gpu": false, "input": true}
            }
        });
        let t = render(&v);
        assert!(t.starts_with("incident 7: R {model=a}\n"), "{t}");
        assert!(t.contains("value 100 (threshold 50)"), "{t}");
        assert!(t.contains("resolved  - (still open)"), "{t}");
        assert!(
            t.contains("  1. batch_size p95 8x baseline (model=a)  [input, score 3]"),
            "{t}"
        );
        assert!(t.contains("split: wall_ms mean +90.0 ms"), "{t}");
        assert!(t.contains("init"), "{t}");
        assert!(t.contains("checked: gpu no data, input yes"), "{t}");
    }
}
