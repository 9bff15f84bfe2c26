//! Wires the running agent together and owns its lifecycle: opens the store, starts the
//! writer thread, binds HTTP and UDP, starts the collectors, and on SIGINT/SIGTERM shuts
//! down in order — sources stop first, the queue drains into the store, then the writer
//! commits and exits — against a deadline, logging anything still running.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use warp::Filter;

use crate::config::Config;
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

/// Runs the agent until `shutdown` is cancelled.
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<(), AgentError> {
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
    let store = tokio::task::spawn_blocking(move || {
        Writer::open(&dir, max_series, sync).map(|mut w| {
            w.keep_latest(keep);
            w
        })
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
    let max_batch = cfg.ingest.max_batch_points.get();
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
    // Sources.
    let sources = CancellationToken::new();
    let write_ctx = crate::ingest::http::WriteCtx {
        handle: handle.clone(),
        stats: stats.clone(),
        max_body: cfg.http.max_body_bytes,
    };
    let nvml_status = Arc::new(crate::collect::nvml::NvmlStatus::default());
    let tegrastats_status = Arc::new(crate::collect::tegrastats::TegrastatsStatus::default());
    let scrape_status = Arc::new(crate::collect::scrape::ScrapeStatus::new(&cfg.scrape));
    let jetson_status = Arc::new(crate::collect::jetson::JetsonStatus::default());
    let kmsg_status = Arc::new(crate::collect::kmsg::KmsgStatus::default());
    let process_status = Arc::new(crate::collect::process::ProcessStatus::new(&cfg.process));
    // A peer whose TLS files do not read or parse cannot send until they are fixed: say so
    // clearly now (its data is kept; its status shows the same reason).
    for e in peer_setup_errors(&cfg) {
        tracing::error!(error = %e, "a sink or notifier cannot connect until this is fixed");
    }
    // Forwarders: their own store connections, their own token (stopped with the sources).
    let forward_stop = CancellationToken::new();
    let forwarders = crate::forward::start(
        &cfg,
        &cfg.storage.data_dir,
        plan.tiers.iter().map(|t| t.key()).min(),
        forward_stop.clone(),
    );
    // Alert notifiers: their own threads and store connections, their own token (stopped
    // with the forwarders).
    let notifiers = crate::alert::notify::start(
        &cfg.notify,
        &cfg.storage.data_dir,
        &crate::forward::identity(&cfg).0,
        crate::alert::notify::outbox_bound(&cfg.alerts),
        forward_stop.clone(),
    );

    // The alert evaluator's snapshot for the readers (the task starts with the others).
    let alerts_view = Arc::new(crate::alert::view::AlertsView::default());
    let api_ctx = crate::api::ApiCtx {
        notify: Arc::new(notifiers.status.clone()),
        forward: Arc::new(forwarders.status.clone()),
        nvml: nvml_status.clone(),
        tegrastats: tegrastats_status.clone(),
        scrape: scrape_status.clone(),
        jetson: jetson_status.clone(),
        kmsg: kmsg_status.clone(),
        process: process_status.clone(),
        reader: Arc::new(Mutex::new(reader)),
        plan: plan.clone(),
        inference: Arc::new(cfg.inference.clone()),
        stats: stats.clone(),
        handle: handle.clone(),
        started,
        max_series,
        synchronous: cfg.storage.synchronous,
        db_path: db_path.clone(),
        latest,
        http: Arc::new(cfg.http.clone()),
        alerts: alerts_view.clone(),
    };
    // What the health collector reads, taken before the routes own the context (the context
    // holds an ingest handle: it must go with the server, or the queue never closes).
    let health_src = crate::collect::health::Sources {
        handle: handle.clone(),
        db_path: db_path.clone(),
        forward: api_ctx.forward.clone(),
        tegrastats: Some(tegrastats_status.clone()),
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
    if cfg.host.enabled {
        tasks.push((
            "host collector",
            tokio::spawn(crate::collect::host::run(
                cfg.host.interval.0,
                handle.clone(),
                stats.clone(),
                sources.clone(),
            )),
        ));
    }
    if !cfg.process.is_empty() {
        let gpu = crate::collect::process::GpuSources {
            nvml: nvml_status.clone(),
            jetson: jetson_status.clone(),
        };
        tasks.push((
            "process watch",
            tokio::spawn(crate::collect::process::run(
                cfg.process.clone(),
                cfg.process_watch.clone(),
                gpu,
                handle.clone(),
                stats.clone(),
                process_status,
                sources.clone(),
            )),
        ));
    }
    if cfg.jetson.enabled {
        tasks.push((
            "jetson collector",
            tokio::spawn(crate::collect::jetson::run(
                cfg.jetson.clone(),
                handle.clone(),
                stats.clone(),
                jetson_status.clone(),
                Some(nvml_status.clone()),
                sources.clone(),
            )),
        ));
    } else {
        jetson_status.set_state("off: disabled in the configuration");
    }
    if cfg.kmsg.enabled {
        tasks.push((
            "kmsg collector",
            tokio::spawn(crate::collect::kmsg::run(
                cfg.kmsg.clone(),
                cfg.storage.data_dir.clone(),
                handle.clone(),
                stats.clone(),
                kmsg_status,
                sources.clone(),
            )),
        ));
    } else {
        kmsg_status.set_state("off: disabled in the configuration");
    }
    if cfg.health.enabled {
        let inventory = crate::collect::inventory::Sources {
            handle: handle.clone(),
            device_id: crate::forward::identity(&cfg).0,
            config_sha256: crate::config::config_sha256(&cfg),
            jetson: cfg.jetson.enabled.then(|| jetson_status.clone()),
            nvml: cfg.nvml.enabled.then(|| nvml_status.clone()),
            forward: health_src.forward.clone(),
        };
        tasks.push((
            "inventory",
            tokio::spawn(crate::collect::inventory::run(
                cfg.health.inventory_interval.0,
                stats.clone(),
                inventory,
                sources.clone(),
            )),
        ));
        tasks.push((
            "health collector",
            tokio::spawn(crate::collect::health::run(
                cfg.health.interval.0,
                stats.clone(),
                health_src,
                sources.clone(),
            )),
        ));
    } else {
        drop(health_src);
    }
    // Also when disabled: it then only records "off" in the status and returns.
    tasks.push((
        "tegrastats collector",
        tokio::spawn(crate::collect::tegrastats::run(
            cfg.tegrastats.clone(),
            handle.clone(),
            stats.clone(),
            tegrastats_status,
            jetson_status,
            sources.clone(),
        )),
    ));
    if cfg.nvml.enabled {
        tasks.push((
            "nvml collector",
            tokio::spawn(crate::collect::nvml::run(
                cfg.nvml.clone(),
                handle.clone(),
                stats.clone(),
                nvml_status,
                sources.clone(),
            )),
        ));
    } else {
        nvml_status.set_state("off: disabled in the configuration");
    }
    if !cfg.scrape.is_empty() {
        tasks.push((
            "scrape",
            tokio::spawn(crate::collect::scrape::run(
                cfg.scrape.clone(),
                handle.clone(),
                stats.clone(),
                scrape_status,
                sources.clone(),
            )),
        ));
    }
    // The alert evaluator: its own connections, its own rows; stops with the sources.
    let alert_rules = crate::alert::rules::compile(&cfg.alerts, &cfg.alert);
    if !alert_rules.is_empty() {
        let setup = crate::alert::task::Setup {
            rules: alert_rules,
            interval: cfg.alerts.interval.0,
            data_dir: cfg.storage.data_dir.clone(),
            plan: plan.clone(),
            inputs: crate::alert::observe::Inputs {
                stats: stats.clone(),
                forward: Arc::new(forwarders.status.clone()),
                db_path: db_path.clone(),
                max_bytes: plan.max_bytes,
                clock_floor_ns: plan.clock_floor_ns,
            },
            identity: crate::forward::identity(&cfg).1,
            base_url: crate::alert::incident::explain::link_base(
                &cfg.alerts.external_url,
                &crate::forward::identity(&cfg).0,
                &format!("http://{http_addr}"),
            ),
            points: Some((handle.clone(), stats.clone())),
        };
        tasks.push((
            "alert evaluator",
            tokio::spawn(crate::alert::task::run(setup, alerts_view, sources.clone())),
        ));
    }
    drop(handle);
    // The rollup job: a second writer connection in small transactions, on its own token
    // so it stops with the sources (it holds no producer handle).
    let rollup_task = plan.enabled.then(|| {
        tokio::spawn(crate::rollup::run(
            cfg.storage.data_dir.clone(),
            (*plan).clone(),
            sources.clone(),
        ))
    });

    shutdown.cancelled().await;
    let deadline = tokio::time::Instant::now() + SHUTDOWN_DEADLINE;
    tracing::info!("shutting down: stopping sources");
    sources.cancel();
    if tokio::time::timeout_at(deadline, http_task).await.is_err() {
        tracing::warn!("http server still had requests in flight at the deadline");
    }
    if let Some(t) = rollup_task {
        if tokio::time::timeout_at(deadline, t).await.is_err() {
            tracing::warn!(task = "rollup", "still running at the shutdown deadline");
        }
    }
    forward_stop.cancel();
    forwarders.join(deadline).await;
    notifiers.join(deadline).await;
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

/// Resolves when SIGINT or SIGTERM arrives.
/// What keeps a configured sink or notifier from ever connecting, found by reading its files
/// (an MQTT `ca_file`, `cert_file` or `key_file` that does not read or parse), one message
/// per peer naming its table. `check-config` refuses such a config; `run` logs each at start.
pub fn peer_setup_errors(cfg: &Config) -> Vec<String> {
    use crate::deliver::mqtt::check;
    let sinks = cfg.sink.iter().filter_map(|s| {
        check(&s.url, &s.tls_files())
            .err()
            .map(|e| format!("[[sink]] {:?}: {e}", s.name))
    });
    let notifiers = cfg.notify.iter().filter_map(|n| {
        check(&n.url, &n.tls_files())
            .err()
            .map(|e| format!("[[notify]] {:?}: {e}", n.name))
    });
    let fleet = cfg.fleet.mqtt.iter().filter_map(|url| {
        check(url, &cfg.fleet.tls_files())
            .err()
            .map(|e| format!("[fleet] mqtt: {e}"))
    });
    sinks.chain(notifiers).chain(fleet).collect()
}

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
