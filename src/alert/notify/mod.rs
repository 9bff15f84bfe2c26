//! Notifiers (`[[notify]]`): deliver the alert outbox's events to Alertmanager (API v2),
//! MQTT brokers and webhooks, store-and-forward. Each notifier is one blocking thread with
//! its own store connection and its own durable position in the outbox: it sends the events
//! after its position one at a time in `seq` order and moves the position only after the
//! receiver acknowledged (HTTP 2xx, MQTT PUBACK). A receiver that is down keeps the events
//! in the outbox; they go, in order and resolves included, when it returns. A kill -9
//! between the acknowledgement and the position's commit sends that one event again (at
//! most one duplicate per fault).
//!
//! What an answer means, the auth, the MQTT connection and the retry loop are the delivery
//! core's ([`crate::deliver`], shared with the sinks): 2xx delivered; 400/422 the receiver
//! will never take this event: it is dead-lettered (kept with the reason, shown in the
//! status) and the notifier moves on; credentials refused (401/403/407), a wrong path
//! (404/405/410), a body limit below one event (413) and any other 4xx pause the notifier on
//! that event (kept, shown with the reason, tried again every `max_backoff`), never drop it;
//! 408, 5xx and transport errors back off with jitter; 429/503 wait their `Retry-After`.
//! Alertmanager is also re-sent the set of firing
//! instances (the latest event per fingerprint as of the position, read from the outbox, so
//! it survives restarts) every `resend_interval`, as it expects.
//!
//! One more task prunes the outbox every minute: rows every configured notifier has passed
//! go, except the latest event of each instance still firing.
//!
//! Layout: [`config`] (`[[notify]]`), [`payload`] (what is sent; pure), `http`
//! (Alertmanager and webhook over `ureq`), `mqtt` (`rumqttc`). It never writes points and
//! never reads alert rules: its only writes are its own `notifiers` and
//! `notify_dead_letters` rows and the pruning of `alert_outbox`.

pub mod config;
mod http;
mod mqtt;
pub mod payload;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

pub use config::{NotifyConfig, NotifyKind};

use crate::alert::event::AlertEvent;
use crate::deliver::{nap, Outcome, Report, Retrier};
use crate::status::notify::{Notifier, Notify, NotifyDeadLetter};
use crate::status::StatusCell;
use crate::store::outbox::{Outbox, OutboxBound, Row};

/// A way to reach one receiver. Blocking; called from the notifier's thread only.
trait Transport: Send {
    /// Sends event `seq`.
    fn send(&mut self, seq: i64, ev: &AlertEvent) -> Outcome;
    /// Re-sends the firing instances (Alertmanager); `None`: this receiver takes no resends.
    fn resend(&mut self, _firing: &[AlertEvent]) -> Option<Outcome> {
        None
    }
    /// Closes the connection, if any (clean stop).
    fn close(&mut self) {}
}

/// One notifier's live status: the notifier's thread updates it, `/api/v1/status` copies it
/// (failures are recorded through [`Report`], as a sink's).
pub type NotifierStatus = StatusCell<Notifier>;

/// Every notifier's status: what `/api/v1/status` shows under `notify`.
#[derive(Debug, Default, Clone)]
pub struct NotifyStatus {
    /// One per configured notifier, in config order.
    pub notifiers: Vec<Arc<NotifierStatus>>,
}

impl NotifyStatus {
    /// The `notify` part of the status document.
    pub fn snapshot(&self) -> Notify {
        Notify {
            notifiers: self.notifiers.iter().map(|n| n.snapshot()).collect(),
        }
    }
}

/// The running notifiers and the pruning task.
pub struct Notifiers {
    /// Their status.
    pub status: NotifyStatus,
    threads: Vec<(String, std::thread::JoinHandle<()>)>,
}

/// How often a caught-up notifier looks for new events.
const POLL: Duration = Duration::from_millis(100);
/// How often the outbox is pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The outbox bound of `[alerts]`, as the store takes it.
pub fn outbox_bound(a: &crate::alert::config::AlertsConfig) -> OutboxBound {
    OutboxBound {
        max_bytes: i64::try_from(a.outbox_max_bytes).unwrap_or(i64::MAX),
        max_age_ns: i64::try_from(a.outbox_max_age.0.as_nanos()).unwrap_or(i64::MAX),
    }
}

/// Starts one thread per enabled notifier and the pruning thread (which also holds the
/// outbox within `bound`). `device_id` fills topic templates and MQTT messages.
pub fn start(
    notifiers: &[NotifyConfig],
    dir: &Path,
    device_id: &str,
    bound: OutboxBound,
    stop: CancellationToken,
) -> Notifiers {
    let mut status = NotifyStatus::default();
    let mut threads = Vec::new();
    for cfg in notifiers {
        let st = Arc::new(NotifierStatus::default());
        st.update(|s| {
            s.kind = cfg.kind.as_str().to_string();
            s.name = cfg.name.clone();
            s.enabled = cfg.enabled;
        });
        status.notifiers.push(st.clone());
        let ctx = Ctx {
            cfg: cfg.clone(),
            dir: dir.to_path_buf(),
            device_id: device_id.to_string(),
            status: st,
        };
        let stop = stop.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("notify-{}", cfg.name))
            .spawn(move || run(ctx, stop));
        match spawned {
            Ok(h) => threads.push((cfg.name.clone(), h)),
            Err(e) => {
                tracing::error!(notifier = %cfg.name, error = %e, "cannot start the notifier thread")
            }
        }
    }
    let names: Vec<String> = notifiers.iter().map(|n| n.name.clone()).collect();
    let dir = dir.to_path_buf();
    match std::thread::Builder::new()
        .name("notify-prune".into())
        .spawn(move || prune_loop(&dir, &names, &bound, &stop))
    {
        Ok(h) => threads.push(("outbox pruning".into(), h)),
        Err(e) => tracing::error!(error = %e, "cannot start the outbox pruning thread"),
    }
    Notifiers { status, threads }
}

impl Notifiers {
    /// Waits for every thread (after the stop token was cancelled) until `deadline`, logging
    /// those still running then.
    pub async fn join(self, deadline: tokio::time::Instant) {
        for (name, h) in self.threads {
            while !h.is_finished() {
                if tokio::time::Instant::now() >= deadline {
                    tracing::warn!(notifier = %name, "still running at the shutdown deadline");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

fn prune_loop(dir: &Path, names: &[String], bound: &OutboxBound, stop: &CancellationToken) {
    let mut outbox: Option<Outbox> = None;
    loop {
        if outbox.is_none() {
            outbox = Outbox::open(dir)
                .map_err(|e| tracing::warn!(error = %e, "outbox pruning cannot open the store"))
                .ok();
        }
        if let Some(o) = &mut outbox {
            match o.prune(names) {
                Ok(0) => {}
                Ok(n) => tracing::debug!(rows = n, "alert outbox pruned"),
                Err(e) => tracing::warn!(error = %e, "cannot prune the alert outbox"),
            }
            match o.bound(names, bound, crate::now_ns()) {
                Ok((_, lost)) => {
                    for (notifier, n) in lost {
                        tracing::warn!(%notifier, events = n, max_bytes = bound.max_bytes, max_age_s = bound.max_age_ns / 1_000_000_000, "alert outbox over its bound: events this notifier had not sent were pruned (the latest event of each firing alert is kept)");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot hold the alert outbox within its bound")
                }
            }
        }
        if !nap(stop, PRUNE_EVERY) {
            return;
        }
    }
}

/// Everything a notifier's thread needs.
struct Ctx {
    cfg: NotifyConfig,
    dir: PathBuf,
    device_id: String,
    status: Arc<NotifierStatus>,
}

fn transport(ctx: &Ctx) -> Box<dyn Transport> {
    match ctx.cfg.kind {
        NotifyKind::Alertmanager | NotifyKind::Webhook => Box::new(http::Http::new(&ctx.cfg)),
        NotifyKind::Mqtt => Box::new(mqtt::Mqtt::new(&ctx.cfg, &ctx.device_id)),
    }
}

/// Refreshes the backlog, totals and the newest dead letter in the status.
fn refresh(ctx: &Ctx, outbox: &Outbox, position: i64, firing: Option<u64>) {
    let name = &ctx.cfg.name;
    let pos = outbox.load(name);
    let pending = outbox.pending(position);
    let dead = outbox.dead_letters(name, 1);
    ctx.status.update(|s| {
        if let Ok(Some(p)) = pos {
            s.position = p.seq;
            s.delivered = p.delivered;
            s.dead_letters = p.dead_letters;
            s.last_success_ns = p.last_success_ns;
            s.pruned_unsent = p.pruned_unsent;
            s.warning = (p.pruned_unsent > 0).then(|| {
                format!(
                    "{} events were pruned before this notifier sent them: the alert outbox \
                     was over its bound ([alerts] outbox_max_bytes / outbox_max_age) while \
                     it was disabled or down",
                    p.pruned_unsent
                )
            });
        }
        if let Ok((n, _)) = pending {
            s.pending_events = n;
        }
        if let Ok(d) = dead {
            s.last_dead_letter = d.into_iter().next().map(|d| NotifyDeadLetter {
                seq: d.seq,
                status: d.status,
                reason: d.reason,
                at_ns: d.at_ns,
            });
        }
        if firing.is_some() {
            s.firing = firing;
        }
    });
}

/// The notifier's thread: deliver in order, resend (Alertmanager), back off on failures.
fn run(ctx: Ctx, stop: CancellationToken) {
    let name = ctx.cfg.name.clone();
    let mut retry = Retrier::new("notifier", &name, ctx.cfg.retry);
    let st: &dyn Report = &*ctx.status;
    // Opening can fail while the store is busy: retry with backoff until stopped.
    let Some(mut outbox) = retry.until_ok("cannot open the store", &stop, st, || {
        Outbox::open(&ctx.dir)
    }) else {
        return;
    };
    let Some(mut position) = retry.until_ok("cannot read the position", &stop, st, || {
        outbox.position(&name).map(|p| p.seq)
    }) else {
        return;
    };
    refresh(&ctx, &outbox, position, None);
    if !ctx.cfg.enabled {
        tracing::info!(notifier = %name, position, "notifier disabled: events are kept, nothing is sent");
        // Still shown as it is: the backlog grows, the bound may prune it.
        while nap(&stop, Duration::from_secs(1)) {
            refresh(&ctx, &outbox, position, None);
        }
        return;
    }
    if let Some(e) = setup_error(&ctx.cfg) {
        // Nothing can be sent until the config or the file changes: say so once, keep
        // every event, and stay visible in the status.
        tracing::error!(notifier = %name, error = %e, "notifier cannot start; its events are kept");
        ctx.status.failed(&e, None, true);
        return;
    }
    tracing::info!(notifier = %name, kind = ctx.cfg.kind.as_str(), url = %ctx.cfg.url, position, "notifier started");
    let mut tx = transport(&ctx);
    let resends = ctx.cfg.kind == NotifyKind::Alertmanager;
    let resend_every = ctx.cfg.resend_interval();
    // None: resend as soon as caught up (an Alertmanager restarted without its storage
    // learns the firing set at once).
    let mut next_resend: Option<Instant> = None;
    let mut last_refresh: Option<Instant> = None;
    while !stop.is_cancelled() {
        if !last_refresh.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            last_refresh = Some(Instant::now());
            refresh(&ctx, &outbox, position, None);
        }
        let rows = match outbox.after(position, 1) {
            Ok(r) => r,
            Err(e) => {
                let d = retry.local("cannot read the outbox", &e, st);
                if !nap(&stop, d) {
                    break;
                }
                continue;
            }
        };
        let Some(Row {
            seq, json, event, ..
        }) = rows.into_iter().next()
        else {
            // Caught up: the firing set to Alertmanager when due, then wait for new events.
            if resends && !next_resend.is_some_and(|t| Instant::now() < t) {
                let sleep = resend(&ctx, &outbox, &mut *tx, position, &mut retry);
                next_resend = Some(Instant::now() + sleep.unwrap_or(resend_every));
            }
            if !nap(&stop, POLL) {
                break;
            }
            continue;
        };
        let now = crate::now_ns();
        let outcome = match &event {
            Ok(ev) => tx.send(seq, ev),
            Err(e) => Outcome::DeadLetter {
                status: 0,
                reason: format!("the stored event cannot be read: {e}"),
            },
        };
        let sleep = match outcome {
            Outcome::Ack => match outbox.ack(&name, seq, crate::now_ns()) {
                Ok(()) => {
                    position = seq;
                    retry.succeeded();
                    ctx.status.update(|s| {
                        s.position = seq;
                        s.delivered += 1;
                        s.last_success_ns = Some(now);
                        s.last_error = None;
                        s.next_retry_ns = None;
                        s.paused = false;
                        s.pending_events = (s.pending_events - 1).max(0);
                    });
                    None
                }
                Err(e) => {
                    // Delivered, not recorded: it goes again (one duplicate).
                    tracing::warn!(notifier = %name, error = %e, seq, "cannot persist the position (the event will be sent again)");
                    Some(retry.local("cannot persist the position", &e, st))
                }
            },
            Outcome::DeadLetter { status, reason } => {
                tracing::warn!(notifier = %name, seq, status, %reason, "event refused by the receiver as bad; kept as a dead letter, moving on");
                match outbox.dead_letter(&name, seq, &json, status, &reason, now) {
                    Ok(()) => {
                        position = seq;
                        ctx.status.failed(&reason, None, false);
                        last_refresh = None;
                        None
                    }
                    Err(e) => {
                        tracing::warn!(notifier = %name, error = %e, "cannot record the dead letter (will retry)");
                        Some(retry.local("cannot record the dead letter", &e, st))
                    }
                }
            }
            other => Some(retry.after(&other, st)),
        };
        if let Some(d) = sleep {
            if !nap(&stop, d) {
                break;
            }
        }
    }
    tx.close();
    tracing::info!(notifier = %name, position, "notifier stopped");
}

/// Why `cfg` cannot send at all until the config or a file changes (an MQTT TLS file that
/// does not read or parse), if so.
fn setup_error(cfg: &NotifyConfig) -> Option<String> {
    match cfg.kind {
        NotifyKind::Mqtt => crate::deliver::mqtt::check(&cfg.url, &cfg.tls_files())
            .err()
            .map(|e| e.to_string()),
        NotifyKind::Alertmanager | NotifyKind::Webhook => None,
    }
}

/// Re-sends the firing set as of `position`; returns the wait before the next resend when it
/// failed (the backoff), `None` when it went (or there was nothing to send).
fn resend(
    ctx: &Ctx,
    outbox: &Outbox,
    tx: &mut dyn Transport,
    position: i64,
    retry: &mut Retrier,
) -> Option<Duration> {
    let rows = match outbox.firing(&ctx.cfg.name, position) {
        Ok(r) => r,
        Err(e) => return Some(retry.local("cannot read the firing set", &e, &*ctx.status)),
    };
    let firing: Vec<AlertEvent> = rows.into_iter().filter_map(|r| r.event.ok()).collect();
    ctx.status.update(|s| s.firing = Some(firing.len() as u64));
    if firing.is_empty() {
        return None;
    }
    match tx.resend(&firing)? {
        Outcome::Ack => {
            retry.succeeded();
            let now = crate::now_ns();
            ctx.status.update(|s| {
                s.last_resend_ns = Some(now);
                s.last_error = None;
                s.next_retry_ns = None;
                s.paused = false;
            });
            None
        }
        // A resend carries no event of its own to set aside: a refusal is retried.
        Outcome::DeadLetter { reason, .. } => Some(retry.after(
            &Outcome::Retry {
                reason,
                unreachable: false,
            },
            &*ctx.status,
        )),
        other => Some(retry.after(&other, &*ctx.status)),
    }
}
