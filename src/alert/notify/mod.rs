//! Notifiers (`[[notify]]`): deliver the alert outbox's events to Alertmanager (API v2),
//! MQTT brokers and webhooks, store-and-forward. Each notifier is one blocking thread with
//! its own store connection and its own durable position in the outbox: it sends the events
//! after its position one at a time in `seq` order and moves the position only after the
//! receiver acknowledged (HTTP 2xx, MQTT PUBACK). A receiver that is down keeps the events
//! in the outbox; they go, in order and resolves included, when it returns. A kill -9
//! between the acknowledgement and the position's commit sends that one event again (at
//! most one duplicate per fault).
//!
//! What an answer means is [`classify`] (pure): 2xx delivered; 401/403/407 credentials
//! refused (the event is kept, tried again every `max_backoff`); 408, 5xx and transport
//! errors retried with backoff and jitter ([`crate::backoff`] through
//! [`NotifyConfig::retry_delay`]); 429/503 wait their `Retry-After`; any other 4xx means the
//! receiver will never take this event: it is dead-lettered (kept with the reason, shown in
//! the status) and the notifier moves on. Alertmanager is also re-sent the set of firing
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
use crate::backoff::Jitter;
use crate::status::notify::{Notifier, Notify, NotifyDeadLetter};
use crate::status::StatusCell;
use crate::store::outbox::{Outbox, Row};

/// What to do after the receiver answered (or did not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged: move the position.
    Ack,
    /// The receiver will never take this event (4xx): keep it aside and move on.
    DeadLetter {
        /// HTTP status.
        status: u16,
        /// The receiver's reason.
        reason: String,
    },
    /// Credentials refused (401, 403, 407): keep the event, try again every `max_backoff`.
    Pause {
        /// What to tell the user.
        reason: String,
    },
    /// Overloaded (429, 503) with a `Retry-After`: wait that long.
    RetryAfter {
        /// How long.
        after: Duration,
        /// Status line.
        reason: String,
    },
    /// Anything else (408, 5xx, timeouts, connection errors): back off and retry.
    Retry {
        /// What failed.
        reason: String,
    },
}

/// Classifies an HTTP answer from Alertmanager or a webhook.
pub fn classify(status: u16, retry_after: Option<&str>, body: &str) -> Outcome {
    let body = body.trim();
    let reason = if body.is_empty() {
        format!("HTTP {status}")
    } else {
        format!(
            "HTTP {status}: {}",
            body.chars().take(300).collect::<String>()
        )
    };
    match status {
        200..=299 => Outcome::Ack,
        401 | 403 | 407 => Outcome::Pause {
            reason: format!(
                "{reason} (credentials refused: check the notifier's username/password or \
                 bearer_token; events are kept)"
            ),
        },
        429 | 503 => match retry_after
            .and_then(|v| crate::forward::parse_retry_after(v, std::time::SystemTime::now()))
        {
            Some(after) => Outcome::RetryAfter { after, reason },
            None => Outcome::Retry { reason },
        },
        408 => Outcome::Retry { reason },
        400..=499 => Outcome::DeadLetter { status, reason },
        _ => Outcome::Retry { reason },
    }
}

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

/// One notifier's live status: the notifier's thread updates it, `/api/v1/status` copies it.
#[derive(Debug, Default)]
pub struct NotifierStatus(StatusCell<Notifier>);

impl NotifierStatus {
    /// Applies `f` to the state.
    pub fn update(&self, f: impl FnOnce(&mut Notifier)) {
        self.0.update(f);
    }

    /// A copy of the state.
    pub fn get(&self) -> Notifier {
        self.0.snapshot()
    }

    fn error(&self, e: &str, retry_in: Option<Duration>) {
        let now = crate::now_ns();
        self.update(|s| {
            s.last_error = Some(e.to_string());
            s.last_error_ns = Some(now);
            s.failures += 1;
            s.next_retry_ns = retry_in
                .map(|d| now.saturating_add(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)));
        });
    }
}

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
            notifiers: self.notifiers.iter().map(|n| n.get()).collect(),
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

/// Starts one thread per enabled notifier and the pruning thread. `device_id` fills topic
/// templates and MQTT messages.
pub fn start(
    notifiers: &[NotifyConfig],
    dir: &Path,
    device_id: &str,
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
        .spawn(move || prune_loop(&dir, &names, &stop))
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

/// Sleeps `d`, waking early (returning false) when `stop` is cancelled.
fn nap(stop: &CancellationToken, d: Duration) -> bool {
    let end = Instant::now() + d;
    loop {
        if stop.is_cancelled() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(25)));
    }
}

fn prune_loop(dir: &Path, names: &[String], stop: &CancellationToken) {
    let mut outbox: Option<Outbox> = None;
    loop {
        if outbox.is_none() {
            outbox = Outbox::open(dir)
                .map_err(|e| tracing::warn!(error = %e, "outbox pruning cannot open the store"))
                .ok();
        }
        if let Some(o) = &outbox {
            match o.prune(names) {
                Ok(0) => {}
                Ok(n) => tracing::debug!(rows = n, "alert outbox pruned"),
                Err(e) => tracing::warn!(error = %e, "cannot prune the alert outbox"),
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
    let mut jitter = Jitter::from_clock(&name);
    let mut failures = 0u32;
    // Opening can fail while the store is busy: retry with backoff until stopped.
    let mut outbox = loop {
        match Outbox::open(&ctx.dir) {
            Ok(o) => break o,
            Err(e) => {
                failures += 1;
                let d = ctx.cfg.retry_delay(failures, jitter.sample());
                tracing::warn!(notifier = %name, error = %e, "notifier cannot open the store");
                ctx.status.error(&e.to_string(), Some(d));
                if !nap(&stop, d) {
                    return;
                }
            }
        }
    };
    let mut position = loop {
        match outbox.position(&name) {
            Ok(p) => break p.seq,
            Err(e) => {
                failures += 1;
                let d = ctx.cfg.retry_delay(failures, jitter.sample());
                ctx.status.error(&e.to_string(), Some(d));
                if !nap(&stop, d) {
                    return;
                }
            }
        }
    };
    refresh(&ctx, &outbox, position, None);
    if !ctx.cfg.enabled {
        tracing::info!(notifier = %name, position, "notifier disabled: events are kept, nothing is sent");
        return;
    }
    failures = 0;
    tracing::info!(notifier = %name, kind = ctx.cfg.kind.as_str(), url = %ctx.cfg.url, position, "notifier started");
    let mut tx = transport(&ctx);
    let resends = ctx.cfg.kind == NotifyKind::Alertmanager;
    let resend_every = ctx.cfg.resend_interval();
    // None: resend as soon as caught up (an Alertmanager restarted without its storage
    // learns the firing set at once).
    let mut next_resend: Option<Instant> = None;
    let mut last_refresh: Option<Instant> = None;
    let mut logged = 0u64;
    while !stop.is_cancelled() {
        if !last_refresh.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            last_refresh = Some(Instant::now());
            refresh(&ctx, &outbox, position, None);
        }
        let rows = match outbox.after(position, 1) {
            Ok(r) => r,
            Err(e) => {
                failures += 1;
                let d = ctx.cfg.retry_delay(failures, jitter.sample());
                tracing::warn!(notifier = %name, error = %e, "notifier cannot read the outbox");
                ctx.status.error(&e.to_string(), Some(d));
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
                let sleep = resend(
                    &ctx,
                    &outbox,
                    &mut *tx,
                    position,
                    &mut failures,
                    &mut jitter,
                );
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
                    failures = 0;
                    ctx.status.update(|s| {
                        s.position = seq;
                        s.delivered += 1;
                        s.last_success_ns = Some(now);
                        s.last_error = None;
                        s.next_retry_ns = None;
                        s.pending_events = (s.pending_events - 1).max(0);
                    });
                    None
                }
                Err(e) => {
                    // Delivered, not recorded: it goes again (one duplicate).
                    tracing::warn!(notifier = %name, error = %e, seq, "cannot persist the position (the event will be sent again)");
                    ctx.status
                        .error(&e.to_string(), Some(Duration::from_millis(200)));
                    Some(Duration::from_millis(200))
                }
            },
            Outcome::DeadLetter { status, reason } => {
                tracing::warn!(notifier = %name, seq, status, %reason, "event refused by the receiver; kept as a dead letter, moving on");
                match outbox.dead_letter(&name, seq, &json, status, &reason, now) {
                    Ok(()) => {
                        position = seq;
                        ctx.status.error(&reason, None);
                        last_refresh = None;
                        None
                    }
                    Err(e) => {
                        tracing::warn!(notifier = %name, error = %e, "cannot record the dead letter (will retry)");
                        ctx.status
                            .error(&e.to_string(), Some(Duration::from_millis(200)));
                        Some(Duration::from_millis(200))
                    }
                }
            }
            Outcome::Pause { reason } => {
                logged += 1;
                if logged.is_power_of_two() {
                    tracing::error!(notifier = %name, %reason, count = logged, "notifier paused");
                }
                let d = ctx.cfg.max_backoff.0;
                ctx.status.error(&reason, Some(d));
                Some(d)
            }
            Outcome::RetryAfter { after, reason } => {
                ctx.status.error(&reason, Some(after));
                Some(after)
            }
            Outcome::Retry { reason } => {
                failures += 1;
                logged += 1;
                if logged.is_power_of_two() {
                    tracing::warn!(notifier = %name, %reason, count = logged, "notification failed; backing off");
                }
                let d = ctx.cfg.retry_delay(failures, jitter.sample());
                ctx.status.error(&reason, Some(d));
                Some(d)
            }
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

/// Re-sends the firing set as of `position`; returns the wait before the next resend when it
/// failed (the backoff), `None` when it went (or there was nothing to send).
fn resend(
    ctx: &Ctx,
    outbox: &Outbox,
    tx: &mut dyn Transport,
    position: i64,
    failures: &mut u32,
    jitter: &mut Jitter,
) -> Option<Duration> {
    let rows = match outbox.firing(&ctx.cfg.name, position) {
        Ok(r) => r,
        Err(e) => {
            ctx.status.error(&e.to_string(), None);
            return Some(Duration::from_secs(1));
        }
    };
    let firing: Vec<AlertEvent> = rows.into_iter().filter_map(|r| r.event.ok()).collect();
    ctx.status.update(|s| s.firing = Some(firing.len() as u64));
    if firing.is_empty() {
        return None;
    }
    match tx.resend(&firing)? {
        Outcome::Ack => {
            *failures = 0;
            let now = crate::now_ns();
            ctx.status.update(|s| {
                s.last_resend_ns = Some(now);
                s.last_error = None;
                s.next_retry_ns = None;
            });
            None
        }
        Outcome::RetryAfter { after, reason } => {
            ctx.status.error(&reason, Some(after));
            Some(after)
        }
        Outcome::Pause { reason } => {
            let d = ctx.cfg.max_backoff.0;
            ctx.status.error(&reason, Some(d));
            Some(d)
        }
        Outcome::DeadLetter { reason, .. } | Outcome::Retry { reason } => {
            *failures += 1;
            let d = ctx.cfg.retry_delay(*failures, jitter.sample());
            tracing::debug!(notifier = %ctx.cfg.name, %reason, "resend of the firing alerts failed");
            ctx.status.error(&reason, Some(d));
            Some(d)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified_as_the_docs_say() {
        assert_eq!(classify(200, None, ""), Outcome::Ack);
        assert_eq!(classify(204, None, ""), Outcome::Ack);
        for s in [400, 404, 413, 422] {
            assert!(
                matches!(classify(s, None, "bad"), Outcome::DeadLetter { status, .. } if status == s),
                "{s}"
            );
        }
        for s in [401, 403, 407] {
            assert!(
                matches!(classify(s, None, ""), Outcome::Pause { .. }),
                "{s}"
            );
        }
        for s in [408, 500, 502, 504] {
            assert!(
                matches!(classify(s, None, ""), Outcome::Retry { .. }),
                "{s}"
            );
        }
        assert_eq!(
            classify(429, Some("7"), ""),
            Outcome::RetryAfter {
                after: Duration::from_secs(7),
                reason: "HTTP 429".into()
            }
        );
        assert!(
            matches!(classify(503, Some("2"), ""), Outcome::RetryAfter { after, .. } if after == Duration::from_secs(2))
        );
        assert!(matches!(classify(503, None, ""), Outcome::Retry { .. }));
        assert!(matches!(
            classify(429, Some("soon"), ""),
            Outcome::Retry { .. }
        ));
    }
}
