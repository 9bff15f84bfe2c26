//! Wires the running agent together and owns its lifecycle: opens the store, starts the
//! writer thread, binds HTTP and UDP, starts the collectors, and on SIGINT/SIGTERM shuts
//! down in order — sources stop first, the queue drains into the store, then the writer
//! commits and exits — against a deadline, logging anything still running.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use warp::Filter;

use crate::stats::Stats;
use crate::store::{Reader, StoreError, Writer};

/// Why the agent could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The rollup configuration is invalid.
    #[error(transparent)]
    Rollup(#[from] crate::rollup::RollupError),
    /// The access configuration is unsafe (HTTP off loopback without a token, UDP off
    /// loopback without `allow_unauthenticated`).
    #[error(transparent)]
    Access(#[from] crate::web::auth::AccessError),
    /// A listener could not bind.
    #[error("cannot listen on {what} {addr}: {source} (is another edgewatch or InfluxDB running? change [{what}] listen)")]
    Bind {
        /// `http` or `udp`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
}

/// Before ingest starts: if the clock is not set, records this boot so the points stamped by
/// it can be corrected later (see [`crate::clock`]). A failure here is logged, not fatal: the
/// agent then simply does not hold anything back.
async fn note_clock(dir: &std::path::Path, floor: i64) -> bool {
    let dir = dir.to_path_buf();
    let noted = tokio::task::spawn_blocking(move || {
        let now = crate::now_ns();
        let (mut conn, _) = crate::rollup::open_conn(&dir).map_err(|e| e.to_string())?;
        let unset =
            crate::clock::note_start(&mut conn, floor, now, &crate::clock::Machine::read(now))
                .map_err(|e| e.to_string())?;
        // A hold left by an earlier run (the clock got set while the agent was down) still
        // needs settling.
        let left = crate::clock::hold_from(&conn).map_err(|e| e.to_string())?;
        Ok::<_, String>((unset, left.is_some()))
    })
    .await;
    match noted {
        Ok(Ok((false, left))) => left,
        Ok(Ok((true, _))) => {
            tracing::warn!(
                min_valid = %humantime::format_rfc3339(
                    std::time::UNIX_EPOCH + Duration::from_nanos(floor.max(0) as u64)
                ),
                "the clock is not set (earlier than min_valid): storing as usual, holding rollup \
                 and forwarding until it is set, then correcting the times"
            );
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot record the clock state");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "clock check failed");
            false
        }
    }
}

/// While a hold is recorded: checks every 2 s whether the clock is set and, once it is,
/// corrects the held points and lifts the hold (whether or not the rollup job runs).
async fn watch_clock(dir: std::path::PathBuf, floor: i64, stop: CancellationToken) {
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        let dir = dir.clone();
        let step = tokio::task::spawn_blocking(move || {
            let now = crate::now_ns();
            let (mut conn, _) = crate::rollup::open_conn(&dir).map_err(|e| e.to_string())?;
            crate::clock::settle(&mut conn, floor, now, &crate::clock::Machine::read(now))
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match step {
            Ok((crate::clock::Settle::Ready, _)) => {
                tracing::info!("clock set: held points released to rollup and forwarding");
                return;
            }
            Ok(_) => failures = 0,
            Err(e) => {
                failures += 1;
                if failures.is_power_of_two() {
                    tracing::warn!(error = %e, failures, "cannot settle the clock hold; retrying");
                }
            }
        }
    }
}

/// Total time allowed for shutdown.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(4);

/// How the agent starts: the loaded config, where it came from (for reloads), the layers
/// above the local file, and the reload channel (its sender may be handed to other
/// triggers, such as the fleet layers, before the agent starts).
pub struct Boot {
    /// The effective config, validated.
    pub loaded: crate::config::load::Loaded,
    /// The file, environment and flags it came from.
    pub source: crate::reload::Source,
    /// The layers above the local file.
    pub layers: Arc<dyn crate::config::layers::Layers>,
    /// The reload channel's sending side.
    pub reload_tx: crate::config::layers::ReloadSender,
    /// Its receiving side (the reloader's).
    pub reload_rx: tokio::sync::mpsc::Receiver<crate::config::layers::ReloadRequest>,
}

impl Boot {
    /// Loads the config from `source` through `layers` and opens the reload channel.
    pub fn load(
        source: crate::reload::Source,
        layers: Arc<dyn crate::config::layers::Layers>,
    ) -> Result<Boot, String> {
        let loaded = source.load(&*layers)?;
        let (reload_tx, reload_rx) = crate::reload::channel();
        Ok(Boot {
            loaded,
            source,
            layers,
            reload_tx,
            reload_rx,
        })
    }
}

/// Runs the agent until `shutdown` is cancelled.
pub async fn run(boot: Boot, shutdown: CancellationToken) -> Result<(), AgentError> {
    let cfg = boot.loaded.config.clone();
    let started = Instant::now();
    let listeners = crate::web::auth::check_listeners(&cfg.http, &cfg.udp)?;
    let access = listeners.access;
    if let Some(addr) = listeners.udp_open {
        tracing::warn!(
            %addr,
            "[udp] allow_unauthenticated = true: UDP takes writes from any machine that can \
             reach this address, without a token"
        );
    }
    let stats = Arc::new(Stats::default());
    let plan = Arc::new(crate::rollup::Plan::from_config(&cfg)?);
    let dir = cfg.storage.data_dir.clone();
    let max_series = cfg.storage.max_series.get();
    let sync = cfg.storage.synchronous;
    let latest = Arc::new(crate::store::LatestValues::new());
    let keep = latest.clone();
    // What the writer holds for its next commit, read by the alert cycle with the store.
    let held = Arc::new(crate::store::HeldView::new());
    let hold = held.clone();
    // A small disk budget bounds the WAL to the room it leaves it (the writer makes most
    // of the commits, so most of the checkpoints).
    let wal_bytes = crate::rollup::wal_checkpoint_bytes(plan.max_bytes);
    let store = tokio::task::spawn_blocking(move || {
        let w = Writer::open(&dir, max_series, sync).map(|mut w| {
            w.keep_latest(keep);
            w.keep_held(hold);
            w
        })?;
        w.checkpoint_every(wal_bytes)?;
        Ok::<_, StoreError>(w)
    })
    .await
    .map_err(|e| StoreError::Dir {
        path: cfg.storage.data_dir.clone(),
        source: std::io::Error::other(e.to_string()),
    })??;
    let db_path = store.path().to_path_buf();
    tracing::info!(db = %db_path.display(), series = store.series_count(), "store open");
    let reader = Reader::open(&cfg.storage.data_dir)?;
    let clock_held = note_clock(&cfg.storage.data_dir, plan.clock_floor_ns).await;

    let (handle, rx) = crate::queue::channel(cfg.ingest.queue_points.get());
    let writer_stats = stats.clone();
    // Held points keep their queue capacity until committed: never more than half of it, so
    // that producers always find room.
    let max_batch = cfg
        .ingest
        .max_batch_points
        .get()
        .min((cfg.ingest.queue_points.get() / 2).max(1));
    let flush = cfg.ingest.flush_interval.0;
    let writer = std::thread::Builder::new()
        .name("edgewatch-writer".into())
        .spawn(move || crate::writer::run(store, rx, max_batch, flush, writer_stats))
        .map_err(|source| StoreError::Dir {
            path: db_path.clone(),
            source,
        })?;

    // A configuration that changed since the last run is an event beside the data (one of
    // the agent's own events: written, like the others, when `[health]` is on; the
    // fingerprint is kept either way).
    match crate::collect::config_change::at_start(&cfg, &cfg.storage.data_dir, crate::now_ns()) {
        Ok(Some(line)) if cfg.health.enabled => {
            tracing::info!("configuration changed since the last run");
            crate::collect::submit(
                &handle,
                &stats,
                crate::model::Batch { lines: vec![line] },
                "agent",
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "config change not recorded"),
    }
    // Sources: the listeners and every restartable part stop on this token.
    let sources = CancellationToken::new();
    let write_ctx = crate::ingest::http::WriteCtx {
        handle: handle.clone(),
        stats: stats.clone(),
        max_body: cfg.http.max_body_bytes,
    };
    // A peer whose TLS files do not read or parse cannot send until they are fixed: say so
    // clearly now (its data is kept; its status shows the same reason).
    for e in peer_setup_errors(&cfg) {
        tracing::error!(error = %e, "a sink or notifier cannot connect until this is fixed");
    }
    // The forwarders and notifiers stop on their own token, after the sources.
    let forward_stop = CancellationToken::new();
    let config_state = crate::reload::Reloader::state_for(
        &boot.loaded,
        boot.reload_tx.clone(),
        boot.layers.clone(),
    );
    let alerts_view = Arc::new(crate::alert::view::AlertsView::default());
    let api_ctx = crate::api::ApiCtx {
        read: crate::api::Read::Latest,
        hold: flush,
        notify: Default::default(),
        forward: Default::default(),
        nvml: Arc::new(crate::collect::nvml::NvmlStatus::default()),
        tegrastats: Arc::new(crate::collect::tegrastats::TegrastatsStatus::default()),
        scrape: Default::default(),
        jetson: Arc::new(crate::collect::jetson::JetsonStatus::default()),
        kmsg: Arc::new(crate::collect::kmsg::KmsgStatus::default()),
        process: crate::status::Live::new(crate::collect::process::ProcessStatus::new(
            &cfg.process,
        )),
        reader: Arc::new(Mutex::new(reader)),
        held: Some(held.clone()),
        plan: crate::status::Live::new((*plan).clone()),
        inference: crate::status::Live::new(cfg.inference.clone()),
        stats: stats.clone(),
        handle: handle.clone(),
        started,
        max_series,
        synchronous: cfg.storage.synchronous,
        db_path: db_path.clone(),
        latest,
        http: Arc::new(cfg.http.clone()),
        alerts: alerts_view.clone(),
        config: config_state.clone(),
    };
    // What the parts share, taken before the routes own the context (the context holds an
    // ingest handle: it must go with the server, or the queue never closes).
    let shared = crate::reload::Shared {
        handle: handle.clone(),
        stats: stats.clone(),
        db_path: db_path.clone(),
        base_url: String::new(),
        config: config_state.clone(),
        config_path: boot.source.path.clone(),
        reload: boot.reload_tx.clone(),
        nvml: api_ctx.nvml.clone(),
        tegrastats: api_ctx.tegrastats.clone(),
        jetson: api_ctx.jetson.clone(),
        kmsg: api_ctx.kmsg.clone(),
        scrape: api_ctx.scrape.clone(),
        process: api_ctx.process.clone(),
        forward: api_ctx.forward.clone(),
        notify: api_ctx.notify.clone(),
        plan: api_ctx.plan.clone(),
        inference: api_ctx.inference.clone(),
        alerts_view,
        held,
        sources: sources.clone(),
        forward_stop: forward_stop.clone(),
    };
    let routes = crate::web::auth::guard(access)
        .and(
            crate::ingest::http::routes(write_ctx)
                .or(crate::api::routes(api_ctx.clone()))
                .unify()
                .or(crate::web::routes(api_ctx))
                .unify(),
        )
        .recover(crate::web::auth::recover);
    let http_stop = sources.clone();
    let (http_addr, http_server) = warp::serve(routes)
        .try_bind_with_graceful_shutdown(
            cfg.http.listen,
            async move { http_stop.cancelled().await },
        )
        .map_err(|e| AgentError::Bind {
            what: "http",
            addr: cfg.http.listen,
            source: std::io::Error::other(e.to_string()),
        })?;
    let http_task = tokio::spawn(http_server);
    tracing::info!(addr = %http_addr, "http listening");

    let mut tasks = Vec::new();
    if clock_held {
        tasks.push((
            "clock watch",
            tokio::spawn(watch_clock(
                cfg.storage.data_dir.clone(),
                plan.clock_floor_ns,
                sources.clone(),
            )),
        ));
    }
    if cfg.udp.enabled {
        let sock = tokio::net::UdpSocket::bind(cfg.udp.listen)
            .await
            .map_err(|source| AgentError::Bind {
                what: "udp",
                addr: cfg.udp.listen,
                source,
            })?;
        tracing::info!(addr = %sock.local_addr().unwrap_or(cfg.udp.listen), "udp listening");
        tasks.push((
            "udp",
            tokio::spawn(crate::ingest::udp::serve(
                sock,
                cfg.udp.precision.0,
                handle.clone(),
                stats.clone(),
                sources.clone(),
            )),
        ));
    }
    drop(handle);
    // Collectors, scrapes, sinks, notifiers, the alert evaluator, the rollup job: the parts
    // a reload restarts, owned by the reloader from here on.
    let parts = crate::reload::Parts::start(
        &cfg,
        crate::reload::Shared {
            base_url: format!("http://{http_addr}"),
            ..shared
        },
    );
    let reloader =
        crate::reload::Reloader::new(boot.source, boot.layers, &boot.loaded, parts, config_state);
    tasks.push((
        "sighup",
        tokio::spawn(crate::reload::on_sighup(boot.reload_tx, sources.clone())),
    ));
    let reloader = tokio::spawn(reloader.run(boot.reload_rx, sources.clone()));

    shutdown.cancelled().await;
    let deadline = tokio::time::Instant::now() + SHUTDOWN_DEADLINE;
    tracing::info!("shutting down: stopping sources");
    sources.cancel();
    if tokio::time::timeout_at(deadline, http_task).await.is_err() {
        tracing::warn!("http server still had requests in flight at the deadline");
    }
    // A reload in progress finishes first (its parts stop with the rest).
    match tokio::time::timeout_at(deadline, reloader).await {
        Ok(Ok(parts)) => parts.shutdown(deadline).await,
        Ok(Err(e)) => tracing::warn!(error = %e, "the reloader failed; its parts stop unordered"),
        Err(_) => tracing::warn!(task = "reloader", "still running at the shutdown deadline"),
    }
    forward_stop.cancel();
    for (name, t) in tasks {
        if tokio::time::timeout_at(deadline, t).await.is_err() {
            tracing::warn!(task = name, "still running at the shutdown deadline");
        }
    }
    // Every producer handle is gone now: the writer drains the queue and returns.
    let joined = tokio::task::spawn_blocking(move || writer.join());
    match tokio::time::timeout_at(deadline + Duration::from_millis(800), joined).await {
        Ok(_) => tracing::info!(
            points = Stats::get(&stats.points_written),
            "writer flushed; stopped cleanly"
        ),
        Err(_) => tracing::warn!("writer still committing at the shutdown deadline"),
    }
    Ok(())
}

pub use crate::reload::peer_setup_errors;

/// Resolves when SIGINT or SIGTERM arrives.
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
