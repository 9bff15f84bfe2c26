//! `edgewatch run`: the agent itself, on a multi-threaded tokio runtime, until SIGINT or
//! SIGTERM. The config is loaded through its layers (the local file alone without
//! `[fleet]`); flags override the config's data_dir and listen addresses, on every reload
//! too. Nothing else is read here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use crate::init_logging;

#[derive(clap::Args)]
pub struct RunArgs {
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
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let source = edgewatch::reload::Source {
        path: args.config,
        env: std::env::vars().collect(),
        flags: edgewatch::reload::Flags {
            data_dir: args.data_dir,
            http_listen: args.http_listen,
            udp_listen: args.udp_listen,
        },
    };
    // The layers above the local file: none without `[fleet]`.
    let layers = Arc::new(edgewatch::config::layers::LocalOnly);
    let boot = edgewatch::agent::Boot::load(source, layers).map_err(anyhow::Error::msg)?;
    init_logging(&boot.loaded.config.log.level);
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
        edgewatch::agent::run(boot, token).await
    })?;
    Ok(ExitCode::SUCCESS)
}
