//! `edgewatch fleet-quantile`: the fleet-wide quantiles of one latency field from an InfluxDB
//! 1.x that agents feed with `histograms = true` (`<measurement>_hist` points of sketch
//! bins). InfluxQL cannot merge histograms, so this asks it only to add each bin over the
//! window and the matching devices (`SELECT sum(*)`), then merges here: exact within the
//! sketch's 0.5 %. Reads only; never writes to InfluxDB or the store.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Context};

use edgewatch::engine::request;
use edgewatch::forward::histogram::bins_quantile;

/// Arguments of `edgewatch fleet-quantile`.
#[derive(Debug, clap::Args)]
pub struct FleetQuantileArgs {
    /// InfluxDB 1.x base URL, e.g. http://influx:8086.
    #[arg(long, value_name = "URL")]
    influx: String,
    /// Database.
    #[arg(long)]
    db: String,
    /// Measurement of the latency (its bins are in `<measurement>_hist`).
    #[arg(long, default_value = "inference")]
    measurement: String,
    /// Field.
    #[arg(long, default_value = "wall_ms")]
    field: String,
    /// Tag filter `key=value` (e.g. model=yolov8n); repeatable.
    #[arg(long = "tag", value_name = "K=V")]
    tags: Vec<String>,
    /// Start: RFC 3339, epoch ns, or relative like -1h (default: 1 hour before --to).
    #[arg(long, allow_hyphen_values = true)]
    from: Option<String>,
    /// End (default: now).
    #[arg(long, allow_hyphen_values = true)]
    to: Option<String>,
    /// Quantiles, comma-separated.
    #[arg(long, default_value = "0.5,0.9,0.99", value_delimiter = ',')]
    q: Vec<f64>,
    /// Basic auth user.
    #[arg(long)]
    username: Option<String>,
    /// Basic auth password (or EDGEWATCH_INFLUX_PASSWORD).
    #[arg(long, env = "EDGEWATCH_INFLUX_PASSWORD", hide_env_values = true)]
    password: Option<String>,
}

/// `'...'` as an InfluxQL string literal.
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// `"..."` as an InfluxQL identifier.
fn ident(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Runs the command.
pub fn run(a: FleetQuantileArgs) -> anyhow::Result<ExitCode> {
    let now = edgewatch::now_ns();
    let (from, to) =
        request::time_range(a.from.as_deref(), a.to.as_deref(), now).map_err(anyhow::Error::msg)?;
    if let Some(q) = a.q.iter().find(|q| !(0.0..=1.0).contains(*q)) {
        bail!("--q {q}: quantiles are between 0 and 1");
    }
    let mut cond = vec![
        format!("\"hist_field\" = {}", lit(&a.field)),
        format!("time >= {from}"),
        format!("time < {to}"),
    ];
    for t in &a.tags {
        let Some((k, v)) = t.split_once('=') else {
            bail!("--tag {t:?}: expected key=value");
        };
        cond.push(format!("{} = {}", ident(k), lit(v)));
    }
    let query = format!(
        "SELECT sum(*) FROM {} WHERE {}",
        ident(&format!("{}_hist", a.measurement)),
        cond.join(" AND ")
    );
    let url = format!("{}/query", a.influx.trim_end_matches('/'));
    let mut req = ureq::get(&url).query("db", &a.db).query("q", &query);
    if let Some(u) = &a.username {
        use base64::Engine as _;
        let b = base64::engine::general_purpose::STANDARD
            .encode(format!("{u}:{}", a.password.as_deref().unwrap_or("")));
        req = req.set("Authorization", &format!("Basic {b}"));
    }
    let body = match req.call() {
        Ok(r) => r.into_string()?,
        Err(ureq::Error::Status(code, r)) => {
            bail!(
                "{url}: HTTP {code}: {}",
                r.into_string().unwrap_or_default()
            )
        }
        Err(e) => return Err(e).with_context(|| format!("cannot query {url}")),
    };
    let v: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("{url}: not JSON: {body}"))?;
    let res = &v["results"][0];
    if let Some(e) = res["error"].as_str() {
        bail!("{url}: {e} (query: {query})");
    }
    let (mut pos, mut neg) = (BTreeMap::new(), BTreeMap::new());
    let (mut zero, mut count) = (0u64, 0u64);
    if let Some(s) = res["series"].get(0) {
        let cols = s["columns"].as_array().cloned().unwrap_or_default();
        let row = s["values"][0].as_array().cloned().unwrap_or_default();
        for (c, x) in cols.iter().zip(row.iter()) {
            let (Some(c), Some(n)) = (c.as_str(), x.as_f64()) else {
                continue;
            };
            let n = n.max(0.0).round() as u64;
            let Some(name) = c.strip_prefix("sum_") else {
                continue;
            };
            match name {
                "count" => count = n,
                "zero" => zero = n,
                "sum" => {}
                _ => {
                    let (side, key) = name.split_at(1);
                    let Ok(key) = key.parse::<i32>() else {
                        continue;
                    };
                    match side {
                        "p" => *pos.entry(key).or_insert(0) += n,
                        "n" => *neg.entry(key).or_insert(0) += n,
                        _ => {}
                    }
                }
            }
        }
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "count {count}")?;
    if count == 0 {
        eprintln!(
            "no {}_hist points for {} in the window (query: {query})",
            a.measurement, a.field
        );
        return Ok(ExitCode::from(1));
    }
    for q in &a.q {
        match bins_quantile(&pos, &neg, zero, *q) {
            Some(x) => writeln!(out, "q{q} {x}")?,
            None => writeln!(out, "q{q} -")?,
        }
    }
    Ok(ExitCode::SUCCESS)
}
