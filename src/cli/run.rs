//! `edgewatch run`: the agent itself, on a multi-threaded tokio runtime, until SIGINT or
//! SIGTERM. Flags override the config's data_dir and listen addresses; nothing else is read
//! here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::{init_logging, load_config};

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
    let mut cfg = load_config(args.config.as_deref())?;
    if let Some(d) = args.data_dir {
        cfg.storage.data_dir = d;
    }
    if let Some(a) = args.http_listen {
        cfg.http.listen = a;
    }
    if let Some(a) = args.udp_listen {
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
