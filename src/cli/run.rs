//! `edgewatch run`: the agent itself, on a multi-threaded tokio runtime, until SIGINT or
//! SIGTERM. Flags override the config's data_dir and listen addresses; with `[fleet]`, the
//! stored fleet layers are merged above the local file before anything starts, and the
//! fleet transports start beside the agent. Nothing else is read here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

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
    let (data_dir, http_listen, udp_listen) = (args.data_dir, args.http_listen, args.udp_listen);
    let overrides = move |cfg: &mut edgewatch::config::Config| {
        if let Some(d) = &data_dir {
            cfg.storage.data_dir = d.clone();
        }
        if let Some(a) = http_listen {
            cfg.http.listen = a;
        }
        if let Some(a) = udp_listen {
            cfg.udp.listen = a;
        }
    };
    let mut cfg = load_config(args.config.as_deref())?;
    overrides(&mut cfg);
    init_logging(&cfg.log.level);
    // Fleet layers (src/fleet/): the stored ones are merged before anything starts.
    let fleet = if cfg.fleet.enabled() {
        let local = edgewatch::fleet::LocalSource {
            path: args.config.clone(),
            env: std::env::vars().collect(),
            overrides: Box::new(overrides),
        };
        let (device_id, _) = edgewatch::forward::identity(&cfg);
        let layers = Arc::new(edgewatch::fleet::FleetLayers::open(
            &cfg.fleet,
            &cfg.storage.data_dir,
            &device_id,
        )?);
        cfg = local.at_start(&layers)?;
        Some((layers, local, cfg.fleet.clone()))
    } else {
        None
    };
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
        if let Some((layers, local, fleet_cfg)) = fleet {
            // Until the in-place reloader is wired here, fleet changes are validated and
            // stored, and run from the next start.
            let (reload, requests) = tokio::sync::mpsc::channel(8);
            tokio::spawn(edgewatch::fleet::validate_only(
                requests,
                layers.clone(),
                local,
            ));
            edgewatch::fleet::start(layers, &fleet_cfg, reload, token.clone());
        }
        edgewatch::agent::run(cfg, token).await
    })?;
    Ok(ExitCode::SUCCESS)
}
