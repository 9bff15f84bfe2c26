//! `edgewatch query`: stored points printed as CSV or JSON, read from the store directly
//! (safe while the agent runs). The flags become the same typed queries as `/api/v1/query`'s
//! parameters — raw points, or aggregates over rollup tiers with `--step`/`--agg` — checked by
//! the same words (`engine::request`), so both accept and refuse the same things. Read-only.
//! The agent holds what it receives up to `[ingest] flush_interval` before committing it,
//! and the file shows only what is committed; so a query of the config's store first asks
//! the agent running with that config to commit what it holds (its status, read for the
//! latest, does: one commit), unless `--stored`. No agent there is not an error.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::ValueEnum;

use edgewatch::engine::request::{self, DEFAULT_LIMIT};
use edgewatch::engine::AggQuery;
use edgewatch::store::query::RawQuery;
use edgewatch::store::Reader;

use crate::load_config;

#[derive(clap::Args)]
pub struct QueryArgs {
    /// Store directory (default: the config's data_dir).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Config file to take data_dir from.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Measurement.
    #[arg(long)]
    measurement: String,
    /// Only this field.
    #[arg(long)]
    field: Option<String>,
    /// Tag filter `key=value`; repeatable.
    #[arg(long = "tag", value_name = "K=V")]
    tags: Vec<String>,
    /// Start: RFC 3339, epoch ns, or relative like -15m (default: 1 hour before --to).
    #[arg(long, allow_hyphen_values = true)]
    from: Option<String>,
    /// End (default: now).
    #[arg(long, allow_hyphen_values = true)]
    to: Option<String>,
    /// Most points printed.
    #[arg(long)]
    limit: Option<usize>,
    /// Aggregate over steps of this length (1m, 1h, ...), from the coarsest rollup tier
    /// that fits; with --agg (default mean).
    #[arg(long)]
    step: Option<String>,
    /// Aggregate: mean, min, max, sum, count, rate, last, p50, p90, p95, p99, p999, ...
    #[arg(long)]
    agg: Option<String>,
    /// Merge series across every tag but these (comma-separated; empty: all into one).
    #[arg(long)]
    group_by: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Csv)]
    format: Format,
    /// Read only what the store file holds: do not first ask the agent running with the
    /// config to commit the points it holds (they reach the file at its next commit, up to
    /// `[ingest] flush_interval` later).
    #[arg(long)]
    stored: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Csv,
    Json,
}

/// The `--tag k=v` filters, sorted by key; a key given twice keeps its last value.
fn tag_filters(tags: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = BTreeMap::new();
    for t in tags {
        let Some((k, v)) = t.split_once('=') else {
            bail!("invalid --tag {t:?}: expected key=value");
        };
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out.into_iter().collect())
}

pub fn run(a: QueryArgs) -> anyhow::Result<ExitCode> {
    // The config: for the store (without --data-dir), the tiers (with --step/--agg) and the
    // agent that writes the store.
    let is_agg = request::is_agg(a.step.as_deref(), a.agg.as_deref());
    let cfg = if a.data_dir.is_none() || a.config.is_some() || is_agg {
        Some(load_config(a.config.as_deref())?)
    } else {
        None
    };
    let dir = match (a.data_dir, &cfg) {
        (Some(d), _) => d,
        (None, Some(c)) => c.storage.data_dir.clone(),
        (None, None) => bail!("no store to read: give --data-dir or --config"),
    };
    if let Some(c) = cfg
        .as_ref()
        .filter(|c| !a.stored && c.storage.data_dir == dir)
    {
        commit_held(c);
    }
    let tags = tag_filters(&a.tags)?;
    let now = edgewatch::now_ns();
    let measurement = request::measurement(Some(&a.measurement)).map_err(anyhow::Error::msg)?;
    let (from, to) =
        request::time_range(a.from.as_deref(), a.to.as_deref(), now).map_err(anyhow::Error::msg)?;
    let (step, agg) = (a.step.as_deref(), a.agg.as_deref());
    if is_agg {
        let field = request::agg_field(a.field.as_deref()).map_err(anyhow::Error::msg)?;
        let (agg, agg_name) = request::agg(agg).map_err(anyhow::Error::msg)?;
        let step_ns = request::step(step, from, to).map_err(anyhow::Error::msg)?;
        let q = AggQuery {
            measurement,
            field,
            tags,
            group_by: a.group_by.as_deref().map(request::group_by),
            from,
            to,
            step_ns,
            agg,
            agg_name,
        };
        let Some(c) = &cfg else {
            bail!("no config for the rollup tiers");
        };
        let plan = edgewatch::rollup::Plan::from_config(c)?;
        return print_agg(&Reader::open(&dir)?, &plan, &q, now, a.format);
    }
    let q = RawQuery {
        measurement,
        field: request::field(a.field.as_deref()),
        tags,
        from,
        to,
        limit: a.limit.unwrap_or(DEFAULT_LIMIT),
    };
    print_raw(&Reader::open(&dir)?, &q, a.format)
}

/// Asks the agent running with `cfg` to commit the points it holds, so that the file read
/// next holds every point it received before this call: a GET of its status, which reads
/// for the latest (docs/reading-data.md). An agent that is not running is no error (the
/// file holds everything then); one that answers with an error gets a note on stderr.
fn commit_held(cfg: &edgewatch::config::Config) {
    let base = crate::cli::status::agent_base(Some(cfg));
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(10))
        .build();
    let mut req = agent.get(&format!("{base}/api/v1/status"));
    if let Some(t) = crate::cli::status::agent_token(cfg) {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    match req.call() {
        Ok(_) | Err(ureq::Error::Transport(_)) => {}
        Err(ureq::Error::Status(code, _)) => eprintln!(
            "note: the agent at {base} answered {code} when asked to commit the points it \
             holds; this answer has only what it has committed"
        ),
    }
}

fn print_agg(
    reader: &Reader,
    plan: &edgewatch::rollup::Plan,
    q: &AggQuery,
    now: i64,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let res = edgewatch::engine::query(reader, plan, q, now)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match format {
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, &res)?;
            writeln!(out)?;
        }
        Format::Csv => {
            writeln!(out, "time,time_ns,tags,tier,agg,value")?;
            for s in &res.series {
                let tags: Vec<String> = s.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let tags = csv_field(&tags.join(";"));
                for (ts, v) in &s.points {
                    writeln!(
                        out,
                        "{},{ts},{tags},{},{},{v}",
                        rfc3339(*ts),
                        res.tier,
                        csv_field(&res.agg)
                    )?;
                }
            }
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn print_raw(reader: &Reader, q: &RawQuery, format: Format) -> anyhow::Result<ExitCode> {
    let res = reader.query_raw(q)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match format {
        Format::Json => {
            serde_json::to_writer_pretty(
                &mut out,
                &serde_json::json!({
                    "measurement": q.measurement, "from": q.from, "to": q.to,
                    "tier": "raw", "truncated": res.truncated, "series": res.series,
                }),
            )?;
            writeln!(out)?;
        }
        Format::Csv => {
            writeln!(out, "time,time_ns,measurement,tags,field,value")?;
            for s in &res.series {
                let tags: Vec<String> = s.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let tags = csv_field(&tags.join(";"));
                for (ts, v) in &s.points {
                    let value = match v {
                        edgewatch::model::Value::Str(s) => csv_field(s),
                        other => serde_json::to_string(other)?,
                    };
                    writeln!(
                        out,
                        "{},{ts},{},{tags},{},{value}",
                        rfc3339(*ts),
                        csv_field(&s.measurement),
                        csv_field(&s.field)
                    )?;
                }
            }
        }
    }
    out.flush()?;
    if res.truncated {
        eprintln!("note: output truncated at the limit; narrow the range or raise --limit");
    }
    Ok(ExitCode::SUCCESS)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn rfc3339(ns: i64) -> String {
    chrono::DateTime::from_timestamp(
        ns.div_euclid(1_000_000_000),
        ns.rem_euclid(1_000_000_000) as u32,
    )
    .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
    .unwrap_or_default()
}
