//! `edgewatch check-config FILE`: loads a config file (with EDGEWATCH_* variables) and the
//! agent's start-up listener policy, as `run` would, reads the files the peers need (MQTT
//! TLS certificates and keys), and prints the effective config. Never opens the store or a
//! socket.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

#[derive(clap::Args)]
pub struct CheckConfigArgs {
    /// The file to check.
    file: PathBuf,
}

pub fn run(args: CheckConfigArgs) -> anyhow::Result<ExitCode> {
    let file = args.file;
    // Through the layers, as `run` loads it (none above the file without `[fleet]`).
    let loaded = edgewatch::config::Config::load_layered(
        Some(&file),
        std::env::vars(),
        &edgewatch::config::layers::LocalOnly,
    )?;
    let cfg = loaded.config;
    // The agent's own start-up check: the same policy, the same message.
    let listeners = edgewatch::web::auth::check_listeners(&cfg.http, &cfg.udp)
        .with_context(|| format!("{}: the agent would refuse to start", file.display()))?;
    if let Some(addr) = listeners.udp_open {
        eprintln!(
            "warning: [udp] allow_unauthenticated = true: UDP on {addr} takes writes \
             from any machine that can reach it, without a token"
        );
    }
    // Files the peers will need (MQTT TLS): read and parsed now, not at the first connect.
    let peers = edgewatch::agent::peer_setup_errors(&cfg);
    if !peers.is_empty() {
        anyhow::bail!("{}: {}", file.display(), peers.join("; "));
    }
    println!("{}: ok (sha256 {})", file.display(), loaded.sha256);
    println!("{cfg:#?}");
    Ok(ExitCode::SUCCESS)
}
