//! Store-and-forward: every `[[sink]]` (InfluxDB 1.x/2.x over HTTP, Prometheus remote write,
//! MQTT) reads raw chunks
//! from the store after its own durable cursor (`sinks.cursor_chunk_id`), sends them in
//! batches, and moves the cursor only after the remote end acknowledged the batch (HTTP 2xx,
//! MQTT PUBACK). The backlog is the store itself: offline for a day means a day of chunks
//! after the cursor, drained oldest-first (optionally rate-limited) when the link returns,
//! while new chunks keep arriving behind them.
//!
//! Layout: [`config`] (the `[[sink]]` table), [`encode`] (line protocol, JSON, gzip; pure),
//! [`store`] (read chunks, move the cursor, dead letters), [`rollup`] (`forward =
//! "rollup:1m"`: a tier's final buckets instead of raw chunks, through the same loops; the
//! point a rollup row becomes), `influx` (a blocking thread per sink, `ureq`; its loop is
//! shared by every HTTP sink), [`remote_write`] (protobuf + snappy through that loop), `mqtt`
//! (a task per sink, `rumqttc`). A sink's first send after its link returns (and at start
//! with a backlog) waits a random part of `reconnect_jitter` ([`Reconnect`]). Whether a
//! partial batch should wait and the rate limit are pure functions here with time as an
//! argument; what an answer means, the auth, the MQTT connection and the retry loop are the
//! delivery core's ([`crate::deliver`]), shared with the notifiers.
//!
//! It never reads the ingest queue and never writes points: its only writes are its own
//! `sinks` and `sink_fallback` rows and `dead_letters`, in short transactions.

pub mod config;
pub mod encode;
pub mod histogram;
mod influx;
mod mqtt;
pub mod remote_write;
pub mod rollup;
pub mod store;
pub mod topics;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

pub use config::{SinkConfig, SinkKind};

use crate::deliver::Report;
use crate::status::{Forward, Sink, StatusCell};

/// Whether a batch of `points` should go now: full, or its oldest pending point waited
/// `max_delay` (`waited` since the forwarder first saw it).
pub fn batch_ready(
    points: usize,
    max_points: usize,
    waited: Duration,
    max_delay: Duration,
) -> bool {
    points >= max_points || waited >= max_delay
}

/// A token bucket in points per second (burst: one batch). `now` is seconds on any clock.
#[derive(Debug, Clone)]
pub struct RateLimit {
    rate: f64,
    next_free: f64,
}

impl RateLimit {
    /// `rate` points/s; 0 = unlimited.
    pub fn new(rate: u64) -> Self {
        RateLimit {
            rate: rate as f64,
            next_free: f64::MIN,
        }
    }

    /// How long to wait before sending `points` at time `now`; reserves them.
    pub fn reserve(&mut self, now: f64, points: usize) -> Duration {
        if self.rate <= 0.0 {
            return Duration::ZERO;
        }
        let start = self.next_free.max(now);
        self.next_free = start + points as f64 / self.rate;
        Duration::from_secs_f64((start - now).max(0.0))
    }
}

/// Drain rate over a sliding window of acknowledgements.
#[derive(Debug, Default)]
pub struct RateMeter {
    samples: std::collections::VecDeque<(f64, u64)>,
}

impl RateMeter {
    /// Records `points` acknowledged at `now` (seconds); returns points/s over the last 5 s.
    pub fn add(&mut self, now: f64, points: u64) -> f64 {
        self.samples.push_back((now, points));
        self.rate(now)
    }

    /// Points/s over the last 5 s at `now`.
    pub fn rate(&mut self, now: f64) -> f64 {
        while self.samples.front().is_some_and(|s| now - s.0 > 5.0) {
            self.samples.pop_front();
        }
        let Some(first) = self.samples.front() else {
            return 0.0;
        };
        let total: u64 = self.samples.iter().map(|s| s.1).sum();
        let span = (now - first.0).max(1.0);
        total as f64 / span
    }
}

/// One sink's live status: the forwarder updates it, `/api/v1/status` copies it.
#[derive(Debug, Default)]
pub struct SinkStatus(StatusCell<Sink>);

impl SinkStatus {
    /// Applies `f` to the state.
    pub fn update(&self, f: impl FnOnce(&mut Sink)) {
        self.0.update(f);
    }

    /// A copy of the state. In rollup mode the loops' cursor is a bucket start: it is shown
    /// as `rollup_cursor_ns`, and `cursor_chunk_id` as 0.
    pub fn get(&self) -> Sink {
        let mut s = self.0.snapshot();
        if s.forward != "raw" && !s.forward.is_empty() {
            s.rollup_cursor_ns = Some(s.cursor_chunk_id);
            s.cursor_chunk_id = 0;
        }
        s
    }

    fn error(&self, e: &str) {
        self.failed(e, None, false);
    }

    fn durable(&self, d: &store::Durable) {
        self.update(|s| {
            s.cursor_chunk_id = d.cursor;
            s.batch_seq = d.seq;
            s.forwarded_points = d.forwarded;
            s.dead_letter_points = d.dead_points;
            s.replayed_batches = d.replayed;
            s.evicted_unforwarded_points = d.evicted_points;
            s.fallback_points = d.fallback_points;
            s.last_success_ns = (d.last_success_ns > 0).then_some(d.last_success_ns);
        });
    }
}

impl Report for SinkStatus {
    fn failed(&self, reason: &str, retry_in: Option<Duration>, paused: bool) {
        self.0.failed(reason, retry_in, paused);
    }
}

/// Every sink's status; what `/api/v1/status` shows under `forward`.
#[derive(Debug, Default, Clone)]
pub struct ForwardStatus {
    /// Device identity added to forwarded points.
    pub device_id: String,
    /// One per configured sink.
    pub sinks: Vec<Arc<SinkStatus>>,
}

impl ForwardStatus {
    /// The `forward` part of the status document.
    pub fn snapshot(&self) -> Forward {
        Forward {
            device_id: self.device_id.clone(),
            sinks: self.sinks.iter().map(|s| s.get()).collect(),
        }
    }
}

/// The device identity: `device_id` from the config, else `/etc/machine-id`, else the host
/// name; plus the static `[tags]`. Returned as the tags added to every forwarded point.
pub fn identity(cfg: &crate::config::Config) -> (String, Vec<(String, String)>) {
    let id = cfg
        .device_id
        .clone()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| read_trimmed("/etc/machine-id"))
        .or_else(|| read_trimmed("/proc/sys/kernel/hostname"))
        .unwrap_or_else(|| "unknown".into());
    let mut tags: Vec<(String, String)> = vec![("device_id".into(), id.clone())];
    for (k, v) in &cfg.tags {
        if k != "device_id" {
            tags.push((k.clone(), v.clone()));
        }
    }
    (id, tags)
}

fn read_trimmed(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Everything a sink loop needs.
pub(crate) struct SinkCtx {
    pub cfg: SinkConfig,
    pub dir: PathBuf,
    pub device_id: String,
    pub identity: Vec<(String, String)>,
    pub status: Arc<SinkStatus>,
    /// Finest rollup tier (seconds), for the eviction fallback (`None` in rollup mode).
    pub fallback_tier_s: Option<i64>,
    /// What the sink reads: raw chunks, or a rollup tier (`forward`).
    pub feed: store::Feed,
}

/// Opens the sink's reading side and its cursor row for `ctx.feed` (every sink type's loop
/// starts here, so `forward = "rollup:1m"` applies to any of them).
pub(crate) fn open_store(
    ctx: &SinkCtx,
) -> Result<(store::Source, store::Cursor, store::Durable), crate::store::StoreError> {
    let s = store::Source::open_feed(&ctx.dir, ctx.identity.clone(), ctx.feed)?;
    let (c, d) = store::Cursor::open_feed(&ctx.dir, &ctx.cfg.name, ctx.feed)?;
    Ok((s, c, d))
}

/// Spreads a fleet's return (reconnect storms): whether the next send must first wait
/// [`SinkConfig::reconnect_delay`]: at start when there is a backlog, and once the link
/// answers again after it could not be reached (HTTP: a request got an answer after
/// connection failures; MQTT: CONNACK after the connection died). Pure; each loop keeps
/// one. A receiver that answers (429/503, `Retry-After`) is not "down": its answer governs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reconnect {
    /// A wait is owed before the next send.
    pub owed: bool,
    /// The link could not be reached since the last answer.
    pub down: bool,
}

impl Reconnect {
    /// At start: a wait is owed when `backlog_points > 0`.
    pub fn at_start(backlog_points: i64) -> Reconnect {
        Reconnect {
            owed: backlog_points > 0,
            down: false,
        }
    }

    /// The link could not be reached.
    pub fn failed(&mut self) {
        self.down = true;
    }

    /// The link answered: after a failure, a wait is owed before the next send.
    pub fn answered(&mut self) {
        if std::mem::take(&mut self.down) {
            self.owed = true;
        }
    }

    /// The wait to take before this send, `jitter` in `[0, 1)`, once per return (`None`:
    /// none owed, or `reconnect_jitter = "0s"`).
    pub fn take(&mut self, cfg: &SinkConfig, jitter: f64) -> Option<Duration> {
        if !std::mem::take(&mut self.owed) {
            return None;
        }
        Some(cfg.reconnect_delay(jitter)).filter(|d| !d.is_zero())
    }
}

/// Commits a cursor move that has waited long enough for a batch to carry it
/// ([`store::Cursor::settle`]), and refreshes backlog figures in the status (at most every
/// `every`).
pub(crate) fn refresh_backlog(
    src: &store::Source,
    cursor: &mut store::Cursor,
    status: &SinkStatus,
    last: &mut Option<Instant>,
    every: Duration,
) {
    if let Err(e) = cursor.settle() {
        tracing::debug!(error = %e, "cannot persist a held cursor move yet (kept in memory)");
    }
    if last.is_some_and(|t| t.elapsed() < every) {
        return;
    }
    *last = Some(Instant::now());
    let Ok(d) = cursor.load() else { return };
    status.durable(&d);
    let dead = cursor.dead_letter_batches().unwrap_or(0);
    if let Ok((points, chunks, oldest)) = src.backlog(d.cursor) {
        let now = crate::now_ns();
        status.update(|s| {
            s.backlog_points = points;
            s.backlog_chunks = chunks;
            s.dead_letter_batches = dead;
            s.oldest_unsent_age_s = oldest.map(|t| (now.saturating_sub(t)).max(0) as f64 / 1e9);
        });
    }
}

/// If retention or the disk budget evicted raw chunks this sink had not forwarded, the
/// rollup rows of the lost span still to send (see [`fallback_span`]).
pub(crate) fn fallback_due(
    ctx: &SinkCtx,
    src: &store::Source,
    cursor: &store::Cursor,
) -> Option<FallbackSpan> {
    fallback_span(ctx.fallback_tier_s, &ctx.identity, src, cursor)
}

/// The rollup rows of an eviction gap still to send.
#[derive(Debug)]
pub(crate) struct FallbackSpan {
    /// The points, in the order they are sent, and the place of each in the span.
    pub rows: store::RollupRows,
    /// The chunk id the gap runs through.
    pub through: i64,
    /// Where the span starts (ns): it names the span.
    pub from: i64,
    /// Part of the span was acknowledged before (by an earlier run): these are the rest.
    pub resumed: bool,
}

impl FallbackSpan {
    /// The progress to record once `points[..end]` are acknowledged, `done_before` of them
    /// before this batch, with `inflight` batches of the span still unacknowledged.
    pub fn progress(
        &self,
        done_before: usize,
        end: usize,
        inflight: usize,
    ) -> store::FallbackProgress {
        let end = end.min(self.rows.points.len());
        store::FallbackProgress {
            points: end.saturating_sub(done_before) as i64,
            reached: end
                .checked_sub(1)
                .and_then(|i| self.rows.keys.get(i).copied())
                .map(|row| store::FallbackPos {
                    from: self.from,
                    row,
                }),
            inflight: inflight as i64,
            done: (end >= self.rows.points.len()).then_some(self.through),
        }
    }
}

/// The eviction fallback. When eviction took raw chunks this sink had not sent (chunk ids up
/// to `evicted_through`, above both its cursor and the last gap already covered), the span
/// runs from the start of the finest-tier bucket holding the newest point the sink
/// acknowledged to the oldest raw point still pending after the evicted chunks (or to the
/// end, when none is left). Every bucket that starts in that span is returned, one point
/// per series, field and bucket, tagged `edgewatch_rollup=<tier>s`, with fields
/// `<field>_mean`, `_min`, `_max`, `_count`, `_p50`, `_p90` and `_p99` (see
/// [`store::Cursor::fallback_points`]),
/// ordered by bucket then series. A span is sent in several batches; each acknowledged
/// batch records the last row it carried, and a span resumed after a restart starts after
/// that row, so a crash sends again only the batches that were in flight.
///
/// The edges overlap the raw data on purpose (a bucket partly sent raw is sent whole as a
/// rollup point too): the contract is no silent hole, not no overlap. Rollup points are
/// distinct series (the tag), so they never overwrite raw points. Only numeric fields have
/// rollups; evicted strings and booleans are counted (`evicted_unforwarded_points`) but
/// cannot be replaced.
pub(crate) fn fallback_span(
    tier: Option<i64>,
    identity: &[(String, String)],
    src: &store::Source,
    cursor: &store::Cursor,
) -> Option<FallbackSpan> {
    let tier = tier?;
    let d = cursor.load().ok()?;
    if d.evicted_through <= d.cursor.max(d.fallback_through) {
        return None;
    }
    let to = src
        .backlog(d.evicted_through)
        .ok()
        .and_then(|b| b.2)
        .unwrap_or(i64::MAX);
    let from = if d.forwarded_ts_max > 0 {
        d.forwarded_ts_max - d.forwarded_ts_max.rem_euclid(tier * 1_000_000_000)
    } else {
        i64::MIN
    };
    // A place recorded in this span (not in one abandoned earlier) is where it resumes.
    let after = d.fallback_pos.filter(|p| p.from == from).map(|p| p.row);
    let rows = cursor
        .fallback_points(tier, from, to, after, identity)
        .ok()?;
    Some(FallbackSpan {
        rows,
        through: d.evicted_through,
        from,
        resumed: after.is_some(),
    })
}

/// Starts the histogram thread of sink `sc` (`histograms = true`: remote write or InfluxDB): its status
/// (listed as `<name>#histograms`) and its handle (`None` when the thread cannot start).
fn start_histograms(
    sc: &SinkConfig,
    dir: &Path,
    device_id: &str,
    ident: &[(String, String)],
    lateness_ns: i64,
    stop: CancellationToken,
) -> (Arc<SinkStatus>, Option<Handle>) {
    let name = config::hist_sink_name(&sc.name);
    let st = Arc::new(SinkStatus::default());
    st.update(|s| {
        s.name = name.clone();
        s.kind = sc.kind.name().into();
        s.url = sc.url.clone();
        s.max_rate_pps = sc.max_rate;
        s.forward = match sc.kind {
            SinkKind::Influxdb => "histograms:bins".into(),
            _ => format!("histograms:{}", sc.histogram_format_name()),
        };
    });
    let mut cfg = sc.clone();
    cfg.name = name.clone();
    let ctx = SinkCtx {
        cfg,
        dir: dir.to_path_buf(),
        device_id: device_id.to_string(),
        identity: ident.to_vec(),
        status: st.clone(),
        fallback_tier_s: None,
        feed: store::Feed::Sketches { lateness_ns },
    };
    let influx = sc.kind == SinkKind::Influxdb;
    let h = std::thread::Builder::new()
        .name(format!("fwd-{name}"))
        .spawn(move || {
            if influx {
                histogram::run_influx(ctx, stop)
            } else {
                histogram::run(ctx, stop)
            }
        });
    match h {
        Ok(h) => (st, Some(Handle::Thread(h))),
        Err(e) => {
            tracing::error!(sink = %name, error = %e, "cannot start the histogram sink");
            (st, None)
        }
    }
}

/// The running forwarders.
pub struct Forwarders {
    /// Their status, for the API.
    pub status: ForwardStatus,
    /// Threads (InfluxDB) and tasks (MQTT), by sink name.
    pub handles: Vec<(String, Handle)>,
}

/// A sink's thread or task.
pub enum Handle {
    /// A blocking thread.
    Thread(std::thread::JoinHandle<()>),
    /// A tokio task.
    Task(tokio::task::JoinHandle<()>),
}

/// Starts every enabled sink of `cfg` on the store in `dir` (already migrated). Each stops
/// when `stop` is cancelled, after persisting its cursor.
pub fn start(
    cfg: &crate::config::Config,
    dir: &Path,
    fallback_tier_s: Option<i64>,
    stop: CancellationToken,
) -> Forwarders {
    let lateness_ns = i64::try_from(cfg.rollup.lateness.0.as_nanos()).unwrap_or(i64::MAX);
    let (device_id, ident) = identity(cfg);
    let mut status = ForwardStatus {
        device_id: device_id.clone(),
        sinks: Vec::new(),
    };
    let mut handles = Vec::new();
    for sc in cfg.sink.iter().filter(|s| s.enabled) {
        let st = Arc::new(SinkStatus::default());
        st.update(|s| {
            s.name = sc.name.clone();
            s.kind = sc.kind.name().into();
            s.url = sc.url.clone();
            s.max_rate_pps = sc.max_rate;
            s.forward = sc.forward.to_string();
        });
        let feed = match sc.forward.tier_s() {
            None => store::Feed::Raw,
            Some(tier_s) => store::Feed::Rollup {
                tier_s,
                lateness_ns,
            },
        };
        status.sinks.push(st.clone());
        let ctx = SinkCtx {
            cfg: sc.clone(),
            dir: dir.to_path_buf(),
            device_id: device_id.clone(),
            identity: ident.clone(),
            status: st,
            // A rollup-mode sink reads the tier itself: raw eviction leaves it no gap.
            fallback_tier_s: fallback_tier_s.filter(|_| feed == store::Feed::Raw),
            feed,
        };
        if sc.histograms() {
            let hist = start_histograms(sc, dir, &device_id, &ident, lateness_ns, stop.clone());
            status.sinks.push(hist.0);
            if let Some(h) = hist.1 {
                handles.push((config::hist_sink_name(&sc.name), h));
            }
        }
        let stop = stop.clone();
        let h = match sc.kind {
            SinkKind::Influxdb => std::thread::Builder::new()
                .name(format!("fwd-{}", sc.name))
                .spawn(move || influx::run(ctx, stop))
                .map(Handle::Thread),
            SinkKind::Mqtt => Ok(Handle::Task(tokio::spawn(mqtt::run(ctx, stop)))),
            SinkKind::PrometheusRemoteWrite => std::thread::Builder::new()
                .name(format!("fwd-{}", sc.name))
                .spawn(move || remote_write::run(ctx, stop))
                .map(Handle::Thread),
        };
        match h {
            Ok(h) => handles.push((sc.name.clone(), h)),
            Err(e) => tracing::error!(sink = %sc.name, error = %e, "cannot start the sink"),
        }
    }
    Forwarders { status, handles }
}

impl Forwarders {
    /// Waits for every sink to stop, until `deadline`; logs the ones still running.
    pub async fn join(self, deadline: tokio::time::Instant) {
        for (name, h) in self.handles {
            let done = match h {
                Handle::Thread(t) => {
                    let j = tokio::task::spawn_blocking(move || t.join());
                    tokio::time::timeout_at(deadline, j).await.is_ok()
                }
                Handle::Task(t) => tokio::time::timeout_at(deadline, t).await.is_ok(),
            };
            if !done {
                tracing::warn!(sink = %name, "forwarder still running at the shutdown deadline (its cursor is durable; unacknowledged batches are sent again next start)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_batches_wait_for_max_delay() {
        let ms = Duration::from_millis;
        assert!(!batch_ready(10, 100, ms(10), ms(100)));
        assert!(batch_ready(10, 100, ms(100), ms(100)));
        assert!(batch_ready(100, 100, ms(0), ms(100)));
    }

    #[test]
    fn a_return_after_failures_waits_a_jittered_delay_once() {
        let cfg: SinkConfig = toml::from_str(
            "type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\nreconnect_jitter = \"8s\"\n",
        )
        .unwrap();
        // No backlog at start, no failure: no wait.
        let mut r = Reconnect::at_start(0);
        assert_eq!(r.take(&cfg, 0.5), None);
        // A backlog at start: one wait, uniform over [0, 8 s).
        let mut r = Reconnect::at_start(10);
        assert_eq!(r.take(&cfg, 0.25), Some(Duration::from_secs(2)));
        assert_eq!(r.take(&cfg, 0.25), None, "once");
        // Failures alone owe nothing; the first answer after them does, once.
        r.failed();
        r.failed();
        assert_eq!(r.take(&cfg, 0.75), None, "no wait while the link is down");
        r.answered();
        r.answered();
        assert_eq!(r.take(&cfg, 0.75), Some(Duration::from_secs(6)));
        assert_eq!(r.take(&cfg, 0.75), None);
        // Spread: 1000 draws from the one jitter generator cover the window evenly.
        let mut j = crate::backoff::Jitter::new(7, "s");
        let mut bins = [0u32; 8];
        for _ in 0..1000 {
            let mut r = Reconnect::at_start(1);
            let d = r.take(&cfg, j.sample()).unwrap_or_default();
            assert!(d < Duration::from_secs(8));
            bins[d.as_secs() as usize] += 1;
        }
        assert!(bins.iter().all(|&b| (80..=170).contains(&b)), "{bins:?}");
        // Zero window: off.
        let off: SinkConfig = toml::from_str(
            "type = \"mqtt\"\nname = \"m\"\nurl = \"mqtt://h\"\ntopic = \"t\"\nreconnect_jitter = \"0s\"\n",
        )
        .unwrap();
        assert_eq!(Reconnect::at_start(5).take(&off, 0.9), None);
    }

    #[test]
    fn rate_limit_spaces_batches() {
        let mut r = RateLimit::new(1000);
        assert_eq!(r.reserve(10.0, 500), Duration::ZERO);
        assert_eq!(r.reserve(10.0, 500), Duration::from_millis(500));
        assert_eq!(r.reserve(12.0, 500), Duration::ZERO);
        let mut u = RateLimit::new(0);
        assert_eq!(u.reserve(0.0, 1_000_000), Duration::ZERO);
        let mut m = RateMeter::default();
        m.add(0.0, 100);
        assert_eq!(m.add(2.0, 100), 100.0);
        assert_eq!(m.rate(100.0), 0.0);
    }
}
