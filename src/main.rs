//! The `edgewatch` command line: the binary's edge, where errors become messages and exit
//! codes. Every subcommand is a thin call into the library.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

use edgewatch::config::Config;
use edgewatch::status::Status;
use edgewatch::store::Reader;

#[derive(Parser)]
#[command(
    name = "edgewatch",
    version,
    about = "Telemetry agent for edge-AI devices: inference latency, Jetson, NVIDIA GPU and host stats, stored locally and forwarded",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent (on the built-in default config unless --config is given).
    Run {
        /// Config file (TOML); keys it omits keep their defaults.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Store directory; overrides [storage] data_dir.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// HTTP address; overrides [http] listen.
        #[arg(long, value_name = "ADDR")]
        http_listen: Option<SocketAddr>,
        /// UDP address; overrides [udp] listen.
        #[arg(long, value_name = "ADDR")]
        udp_listen: Option<SocketAddr>,
    },
    /// Validate a config file (and EDGEWATCH_* variables); print the effective config.
    CheckConfig {
        /// The file to check.
        file: PathBuf,
    },
    /// List NVIDIA GPUs seen through NVML, their tags, and which metrics each supports.
    Gpus,
    /// Jetson tegrastats tools.
    Tegrastats {
        #[command(subcommand)]
        command: TegrastatsCommand,
    },
    /// Print stored points (reads the store directly; safe while the agent runs).
    Query {
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
    },
    /// Show the running agent's status (ingest, store, rollup, collectors, forwarding sinks).
    Status {
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
    },
    /// Run rollup, retention and the disk budget once, then exit (safe while the agent runs).
    Maintain {
        /// Store directory (default: the config's data_dir).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Config file (tiers, retention, budget).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Test aid for crash tests only: sleep this many ms after each committed rollup step.
        #[arg(long, hide = true, default_value_t = 0)]
        debug_pause_ms: u64,
    },
}

#[derive(Subcommand)]
enum TegrastatsCommand {
    /// Parse tegrastats lines (a file, or - / nothing for stdin) into one JSON object per line.
    Parse {
        /// Input file; `-` or absent reads stdin.
        file: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Csv,
    Json,
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn load_config(path: Option<&std::path::Path>) -> anyhow::Result<Config> {
    Ok(Config::load(path, std::env::vars())?)
}

/// Keeps glibc's allocator from growing RSS under bursty ingest: at most two arenas
/// (instead of 8 per core, one per thread that allocates) and a fixed mmap threshold so
/// request-sized buffers go back to the OS when freed. Measured with
/// `cargo bench --bench ingest`: peak RSS fell from ~29 MB to the figure in the README.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before any other
    // thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1024 * 1024);
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run {
            config,
            data_dir,
            http_listen,
            udp_listen,
        } => {
            let mut cfg = load_config(config.as_deref())?;
            if let Some(d) = data_dir {
                cfg.storage.data_dir = d;
            }
            if let Some(a) = http_listen {
                cfg.http.listen = a;
            }
            if let Some(a) = udp_listen {
                cfg.udp.listen = a;
            }
            init_logging(&cfg.log.level);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .max_blocking_threads(4)
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(async {
                let token = CancellationToken::new();
                let t = token.clone();
                tokio::spawn(async move {
                    edgewatch::agent::wait_for_signal().await;
                    t.cancel();
                });
                edgewatch::agent::run(cfg, token).await
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Tegrastats {
            command: TegrastatsCommand::Parse { file },
        } => {
            let input = file.filter(|f| f.as_os_str() != "-");
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let mut err = std::io::stderr().lock();
            let ok =
                edgewatch::collect::tegrastats::parse_command(input.as_deref(), &mut out, &mut err)
                    .context("reading tegrastats input")?;
            out.flush()?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Gpus => {
            let mut out = std::io::stdout().lock();
            match edgewatch::collect::nvml::gpus_report(&mut out) {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(e) => {
                    out.flush()?;
                    eprintln!("error: {e}");
                    Ok(ExitCode::from(2))
                }
            }
        }
        Command::Maintain {
            data_dir,
            config,
            debug_pause_ms,
        } => {
            let cfg = load_config(config.as_deref())?;
            init_logging(&cfg.log.level);
            let dir = data_dir.unwrap_or_else(|| cfg.storage.data_dir.clone());
            if !edgewatch::store::db_path(&dir).exists() {
                bail!(
                    "no edgewatch database in {} (is --data-dir right?)",
                    dir.display()
                );
            }
            let plan = edgewatch::rollup::Plan::from_config(&cfg)?;
            // Migrates an older store as the agent would; a no-op on a current one.
            drop(edgewatch::store::Writer::open(
                &dir,
                cfg.storage.max_series.get(),
                cfg.storage.synchronous,
            )?);
            let mut job = edgewatch::rollup::Job::open(&dir, plan)?;
            job.pause_between_steps = std::time::Duration::from_millis(debug_pause_ms);
            let r = job.run_once(edgewatch::now_ns(), &|| false)?;
            println!(
                "{}",
                serde_json::json!({
                    "rolled_up_points": r.points, "rolled_up_chunks": r.chunks, "steps": r.steps,
                    "evicted_chunks": r.evicted_chunks, "evicted_points": r.evicted_points,
                    "evicted_rows": r.evicted_rows, "db_bytes": r.db_bytes,
                    "clock_held": r.clock_held, "clock_fixed_points": r.clock_fixed_points,
                })
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Status {
            url,
            config,
            token,
            json,
        } => status_command(url, config, token, json),
        Command::CheckConfig { file } => {
            let cfg = load_config(Some(&file))?;
            // The agent's own start-up check: the same policy, the same message.
            let listeners = edgewatch::web::auth::check_listeners(&cfg.http, &cfg.udp)
                .with_context(|| format!("{}: the agent would refuse to start", file.display()))?;
            if let Some(addr) = listeners.udp_open {
                eprintln!(
                    "warning: [udp] allow_unauthenticated = true: UDP on {addr} takes writes \
                     from any machine that can reach it, without a token"
                );
            }
            println!("{}: ok", file.display());
            println!("{cfg:#?}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Query {
            data_dir,
            config,
            measurement,
            field,
            tags,
            from,
            to,
            limit,
            step,
            agg,
            group_by,
            format,
        } => {
            let dir = match data_dir {
                Some(d) => d,
                None => load_config(config.as_deref())?.storage.data_dir,
            };
            let mut params: HashMap<String, String> = HashMap::new();
            params.insert("measurement".into(), measurement);
            if let Some(f) = field {
                params.insert("field".into(), f);
            }
            for t in tags {
                let Some((k, v)) = t.split_once('=') else {
                    bail!("invalid --tag {t:?}: expected key=value");
                };
                params.insert(format!("tag.{k}"), v.to_string());
            }
            for (k, v) in [("from", from), ("to", to)] {
                if let Some(v) = v {
                    params.insert(k.into(), v);
                }
            }
            if let Some(l) = limit {
                params.insert("limit".into(), l.to_string());
            }
            for (k, v) in [("step", step), ("agg", agg), ("group_by", group_by)] {
                if let Some(v) = v {
                    params.insert(k.into(), v);
                }
            }
            let now = edgewatch::now_ns();
            if let Some(aq) = edgewatch::engine::agg_query_from_params(&params, now)
                .map_err(anyhow::Error::msg)?
            {
                let plan = edgewatch::rollup::Plan::from_config(&load_config(config.as_deref())?)?;
                let reader = Reader::open(&dir)?;
                let res = edgewatch::engine::query(&reader, &plan, &aq, now)?;
                let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                match format {
                    Format::Json => {
                        serde_json::to_writer_pretty(&mut out, &res)?;
                        writeln!(out)?;
                    }
                    Format::Csv => {
                        writeln!(out, "time,time_ns,tags,tier,agg,value")?;
                        for s in &res.series {
                            let tags: Vec<String> =
                                s.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
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
                return Ok(ExitCode::SUCCESS);
            }
            let q = edgewatch::api::raw_query_from_params(&params, edgewatch::now_ns())
                .map_err(anyhow::Error::msg)?;
            let reader = Reader::open(&dir)?;
            let res = reader.query_raw(&q)?;
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
                        let tags: Vec<String> =
                            s.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
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
    }
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
        Some(load_config(config.as_deref())?)
    } else {
        None
    };
    let base = match url {
        Some(u) => u,
        None => {
            let listen = cfg
                .as_ref()
                .map(|c| c.http.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9400)));
            // An agent listening on every address answers on loopback.
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
    };
    let token = token.filter(|t| !t.is_empty()).or_else(|| {
        cfg.as_ref()
            .map(|c| c.http.token.expose().to_string())
            .filter(|t| !t.is_empty())
    });
    let url = format!("{}/api/v1/status", base.trim_end_matches('/'));
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(10))
        .build();
    let mut req = agent.get(&url);
    if let Some(t) = &token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let body = match req.call() {
        Ok(r) => r.into_string().context("reading the status document")?,
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
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
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

/// The readable form of the status document.
fn render_status(v: &Status, base: &str, now_ns: i64) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "edgewatch {} at {base}, up {}",
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
        "store:      {} of {} ({} series of {} max) in {}",
        human_bytes(s.db_bytes as f64),
        if budget > 0 {
            format!("{} budget", human_bytes(budget as f64))
        } else {
            "no budget".into()
        },
        s.series.map_or_else(|| "?".into(), |n| n.to_string()),
        s.max_series,
        s.path.display(),
    );
    match &v.rollup {
        Some(r) => {
            let tiers: Vec<String> = r
                .tiers
                .iter()
                .map(|t| {
                    format!(
                        "{} lag {} ({} chunks pending)",
                        t.name,
                        t.lag_s.map_or_else(|| "not run yet".into(), human_age),
                        t.pending_chunks
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
