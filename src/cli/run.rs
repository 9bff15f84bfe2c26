//! `edgewatch run`: the agent itself, on a multi-threaded tokio runtime, until SIGINT or
//! SIGTERM. The config is loaded through its layers (the local file alone without
//! `[fleet]`; with it, the stored fleet layers, settled before anything starts, and the
//! fleet transports beside the agent); flags override the config's data_dir and listen
//! addresses, on every reload too. Nothing else is read here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

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
    // What this process wrote before it became the agent (the build of a `cargo run`,
    // which execs into it; a wrapper script) is not the agent's to report.
    edgewatch::collect::health::mark_written_start();
    let source = edgewatch::reload::Source {
        path: args.config,
        env: std::env::vars().collect(),
        flags: edgewatch::reload::Flags {
            data_dir: args.data_dir,
            http_listen: args.http_listen,
            udp_listen: args.udp_listen,
        },
    };
    // The local file alone says whether fleet layers sit above it: `[fleet]`, the data dir
    // and the device id are read from it (a layer may not change them unless allowed, and
    // the transports always follow the local `[fleet]`).
    let local = source
        .load(&edgewatch::config::layers::LocalOnly)
        .map_err(anyhow::Error::msg)?;
    let (layers, fleet): (Arc<dyn edgewatch::config::layers::Layers>, _) =
        if local.config.fleet.enabled() {
            let cfg = &local.config;
            let (device_id, _) = edgewatch::forward::identity(cfg);
            let fl = Arc::new(edgewatch::fleet::FleetLayers::open(
                &cfg.fleet,
                &cfg.storage.data_dir,
                &device_id,
            )?);
            edgewatch::fleet::settle_at_start(&fl, |l| source.load(l).map(|x| x.sha256))
                .map_err(anyhow::Error::msg)?;
            (fl.clone() as _, Some((fl, cfg.fleet.clone())))
        } else {
            (Arc::new(edgewatch::config::layers::LocalOnly) as _, None)
        };
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
        if let Some((layers, fleet_cfg)) = fleet {
            edgewatch::fleet::start(layers, &fleet_cfg, boot.reload_tx.clone(), token.clone());
        }
        edgewatch::agent::run(boot, token).await
    })?;
    Ok(ExitCode::SUCCESS)
}
