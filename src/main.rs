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
                })
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckConfig { file } => {
            let cfg = load_config(Some(&file))?;
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
