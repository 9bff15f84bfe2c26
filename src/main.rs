//! The `edgewatch` command line: the binary's edge, where errors become messages and exit
//! codes. This file parses the command line, sets up logging and dispatches; each subcommand
//! lives in its own file under `cli/` and is a thin call into the library.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use edgewatch::config::Config;

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
    Run(cli::run::RunArgs),
    /// Validate a config file (and EDGEWATCH_* variables); print the effective config.
    CheckConfig(cli::check_config::CheckConfigArgs),
    /// List NVIDIA GPUs seen through NVML, their tags, and which metrics each supports.
    Gpus,
    /// Jetson tegrastats tools.
    Tegrastats {
        #[command(subcommand)]
        command: cli::tegrastats::TegrastatsCommand,
    },
    /// Print stored points (reads the store directly; safe while the agent runs).
    Query(cli::query::QueryArgs),
    /// Show the running agent's status (ingest, store, rollup, collectors, forwarding sinks).
    Status(cli::status::StatusArgs),
    /// Run rollup, retention and the disk budget once, then exit (safe while the agent runs).
    Maintain(cli::maintain::MaintainArgs),
    /// Show the running agent's alerts: every rule's instances, firing first.
    Alerts(cli::alerts::AlertsArgs),
    /// Fetch an incident's triage snapshot from a reachable agent (`incident show ID --agent URL`).
    Incident(cli::incident::IncidentArgs),
    /// Signed remote config: make the fleet's key, sign a config fragment, publish it.
    Fleet {
        #[command(subcommand)]
        command: cli::fleet::FleetCommand,
    },
    /// Fleet-wide quantiles of a latency field from InfluxDB 1.x, merged from the agents'
    /// sketch bins (sinks with `histograms = true`).
    FleetQuantile(cli::fleet_quantile::FleetQuantileArgs),
    /// Reload the running agent's config now; non-zero exit (and the reason) when invalid.
    Reload(cli::reload::ReloadArgs),
}

/// Logs to stderr, filtered by `RUST_LOG` when it is set and valid, else by `[log] level`
/// (`edgewatch::config::log`); an invalid `RUST_LOG` is said once, as a warning.
fn init_logging(level: &str) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let rust_log = std::env::var("RUST_LOG").ok();
    let (filter, ignored) = edgewatch::config::log::effective_filter(rust_log.as_deref(), level);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
    if let Some(e) = ignored {
        tracing::warn!("RUST_LOG ignored, logging with [log] level = {level:?}: {e}");
    }
}

fn load_config(path: Option<&std::path::Path>) -> anyhow::Result<Config> {
    Ok(Config::load(path, std::env::vars())?)
}

/// Keeps glibc's allocator from growing RSS under bursty ingest: at most two arenas
/// (instead of 8 per core, one per thread that allocates) and a fixed mmap threshold so
/// request-sized buffers go back to the OS when freed. Measured with
/// `cargo bench --bench ingest`: peak RSS fell from ~29 MB to the figure in docs/performance.md.
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
    if !matches!(cli.command, Command::Run(_)) {
        // A one-shot command piped into `head` ends quietly when the reader goes, as other
        // command-line tools do (the agent itself keeps Rust's ignored SIGPIPE: a socket
        // write to a gone peer must be an error, not a kill).
        // SAFETY: resetting a signal to its default action before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match cli.command {
        Command::Run(args) => cli::run::run(args),
        Command::Tegrastats { command } => cli::tegrastats::run(command),
        Command::Gpus => cli::gpus::run(),
        Command::Maintain(args) => cli::maintain::run(args),
        Command::Status(args) => cli::status::run(args),
        Command::CheckConfig(args) => cli::check_config::run(args),
        Command::Query(args) => cli::query::run(args),
        Command::Alerts(args) => cli::alerts::run(args),
        Command::Incident(args) => cli::incident::run(args),
        Command::Fleet { command } => cli::fleet::run(command),
        Command::FleetQuantile(args) => cli::fleet_quantile::run(args),
        Command::Reload(args) => cli::reload::run(args),
    }
}
