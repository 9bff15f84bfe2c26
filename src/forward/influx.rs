//! The InfluxDB sink: one blocking thread per sink (`ureq`), line protocol in ns precision,
//! gzip by default, to `/write` (1.x: `db`, `rp`, `u`/`p`) or `/api/v2/write` (2.x: `org`,
//! `bucket`, `Authorization: Token`). One batch in flight; the cursor moves on 2xx.
//!
//! The loop ([`run_http`]) is shared by every HTTP sink: what differs between them (the
//! encoder, the request) is a [`Wire`]; `remote_write` is the other one.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::encode::{self, Point};
use super::{
    batch_ready, classify_http, nap, refresh_backlog, Outcome, RateLimit, RateMeter, Reconnect,
    SinkCtx,
};
use crate::backoff::Jitter;

/// The write URL with its query string.
fn write_url(cfg: &super::SinkConfig) -> String {
    let base = cfg.url.trim_end_matches('/');
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    if cfg.influx_version() == 1 {
        let mut u = format!(
            "{base}/write?precision=ns&db={}",
            enc(cfg.database.as_deref().unwrap_or(""))
        );
        if let Some(rp) = &cfg.retention_policy {
            u.push_str(&format!("&rp={}", enc(rp)));
        }
        u
    } else {
        format!(
            "{base}/api/v2/write?precision=ns&org={}&bucket={}",
            enc(cfg.org.as_deref().unwrap_or("")),
            enc(cfg.bucket.as_deref().unwrap_or(""))
        )
    }
}

/// What an HTTP sink sends: the body of a batch and the request that carries it. The loop
/// around it (cursor, batching, retry, dead letters, status) is [`run_http`], the same for
/// every HTTP sink.
pub(crate) trait Wire {
    /// The sink type, for logs.
    fn kind(&self) -> &'static str;
    /// Encodes `points`, stopping after the point that takes the body to `max_bytes` or more
    /// (at least one point): the body, how many points it holds, and how many values in them
    /// the format cannot carry (skipped).
    fn body(&self, points: &[Point], max_bytes: usize) -> Encoded;
    /// Posts `body`; classifies the answer.
    fn send(&self, agent: &ureq::Agent, body: &[u8]) -> Outcome;
}

/// A batch's body, as a [`Wire`] encoded it.
pub(crate) struct Encoded {
    /// The request body.
    pub body: Vec<u8>,
    /// Points of the batch it holds (a prefix).
    pub used: usize,
    /// String values skipped (the format cannot carry them).
    pub skipped_strings: i64,
}

/// Line protocol to InfluxDB.
struct LineProtocol {
    cfg: super::SinkConfig,
    url: String,
    uint_as_int: bool,
}

impl Wire for LineProtocol {
    fn kind(&self) -> &'static str {
        "influxdb"
    }

    fn body(&self, points: &[Point], max_bytes: usize) -> Encoded {
        let (body, used) = body(points, self.uint_as_int, max_bytes);
        Encoded {
            body,
            used,
            skipped_strings: 0,
        }
    }

    fn send(&self, agent: &ureq::Agent, body: &[u8]) -> Outcome {
        send(agent, &self.cfg, &self.url, body)
    }
}

/// Sends one body; classifies the answer.
fn send(agent: &ureq::Agent, cfg: &super::SinkConfig, url: &str, body: &[u8]) -> Outcome {
    let mut req = agent
        .post(url)
        .set("Content-Type", "text/plain; charset=utf-8");
    let gz;
    let payload = if cfg.gzip() {
        req = req.set("Content-Encoding", "gzip");
        gz = encode::gzip(body);
        &gz[..]
    } else {
        body
    };
    if cfg.influx_version() == 1 {
        if let (Some(u), Some(p)) = (&cfg.username, &cfg.password) {
            use std::io::Write as _;
            let mut b = Vec::new();
            let _ = write!(b, "{u}:{}", p.expose());
            req = req.set("Authorization", &format!("Basic {}", base64(&b)));
        }
    } else if let Some(t) = &cfg.token {
        req = req.set("Authorization", &format!("Token {}", t.expose()));
    }
    match req.send_bytes(payload) {
        Ok(r) => classify_http(r.status(), None, ""),
        Err(ureq::Error::Status(code, r)) => {
            let ra = r.header("Retry-After").map(str::to_string);
            let body = r.into_string().unwrap_or_default();
            classify_http(code, ra.as_deref(), &body)
        }
        Err(e) => Outcome::Retry {
            reason: format!("cannot reach {}: {e}", cfg.url),
        },
    }
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Line protocol of `points`, cut at `max_bytes` on a chunk boundary is not needed here:
/// the source already cut at `max_points`; the byte limit trims whole points.
fn body(points: &[Point], uint_as_int: bool, max_bytes: usize) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(points.len() * 96);
    for (i, p) in points.iter().enumerate() {
        if i > 0 && out.len() >= max_bytes {
            return (out, i);
        }
        encode::line(&mut out, p, uint_as_int);
    }
    (out, points.len())
}

/// An eviction gap being covered from the rollup tier.
struct Fallback {
    span: super::FallbackSpan,
    /// Points acknowledged (or dead-lettered) so far.
    off: usize,
}

/// Counts a store failure, shows it in the sink's status and sleeps the backoff it calls
/// for; false when stopped meanwhile.
fn fail_and_wait(
    ctx: &SinkCtx,
    stop: &CancellationToken,
    jitter: &mut Jitter,
    failures: &mut u32,
    error: &str,
) -> bool {
    *failures += 1;
    ctx.status.error(error);
    nap(stop, ctx.cfg.retry_delay(*failures, jitter.sample()))
}

/// The InfluxDB sink's thread.
pub(crate) fn run(ctx: SinkCtx, stop: CancellationToken) {
    let wire = LineProtocol {
        url: write_url(&ctx.cfg),
        uint_as_int: ctx.cfg.influx_version() == 1,
        cfg: ctx.cfg.clone(),
    };
    run_http(ctx, stop, &wire);
}

/// An HTTP sink's thread: reads batches after the cursor, sends them through `wire`, and
/// moves the cursor on 2xx.
pub(crate) fn run_http(ctx: SinkCtx, stop: CancellationToken, wire: &dyn Wire) {
    let kind = wire.kind();
    let name = ctx.cfg.name.clone();
    let mut jitter = Jitter::from_clock(&name);
    // Opening can fail while the store is busy: retry with backoff until stopped.
    let mut failures = 0u32;
    let (mut src, mut cur, d) = loop {
        match super::open_store(&ctx) {
            Ok((s, c, d)) => break (s, c, d),
            Err(e) => {
                tracing::warn!(sink = %name, error = %e, "forwarder cannot open the store");
                if !fail_and_wait(&ctx, &stop, &mut jitter, &mut failures, &e.to_string()) {
                    return;
                }
            }
        }
    };
    ctx.status.durable(&d);
    tracing::info!(sink = %name, kind, url = %ctx.cfg.url, cursor = d.cursor, "sink started");
    let agent = ureq::AgentBuilder::new().timeout(ctx.cfg.timeout.0).build();
    let started = Instant::now();
    let mut rate = RateLimit::new(ctx.cfg.max_rate);
    let mut meter = RateMeter::default();
    let mut cursor = d.cursor;
    let mut seq = d.seq;
    let mut max_points = ctx.cfg.max_points;
    let mut failures = 0u32;
    let mut logged_errors = 0u64;
    let mut pending_since: Option<Instant> = None;
    let mut last_refresh = None;
    let poll = ctx
        .cfg
        .max_delay
        .0
        .clamp(Duration::from_millis(20), Duration::from_millis(500));
    let mut retrying = false;
    let mut fb: Option<Fallback> = None;
    // Reconnect storms: the first send at start with a backlog, and the first after the link
    // answers again, wait a random part of `reconnect_jitter`.
    let mut reconnect = Reconnect::at_start(src.backlog(cursor).map_or(0, |b| b.0));
    while !stop.is_cancelled() {
        refresh_backlog(
            &src,
            &cur,
            &ctx.status,
            &mut last_refresh,
            Duration::from_secs(1),
        );
        let now_s = started.elapsed().as_secs_f64();
        ctx.status.update(|s| s.drain_rate_pps = meter.rate(now_s));
        // Eviction took raw data this sink never sent: send the rollup rows instead, in
        // batches of `max_points` / `max_bytes`, before any more raw data. Each acknowledged
        // batch records how far the span got, so a restart in between resumes after it.
        if fb.is_none() {
            if let Some(span) = super::fallback_due(&ctx, &src, &cur) {
                let through = span.through;
                if span.rows.points.is_empty() {
                    if !span.resumed {
                        tracing::warn!(sink = %name, through_chunk = through, "raw data this sink had not sent was evicted and the rollup tier has no rows for that span (non-numeric fields, or rows evicted too); counted in evicted_unforwarded_points");
                    }
                    if let Err(e) = cur.fallback_ack(seq, &span.progress(0, 0, 0)) {
                        if !fail_and_wait(&ctx, &stop, &mut jitter, &mut failures, &e.to_string()) {
                            break;
                        }
                    }
                    last_refresh = None;
                    continue;
                }
                if span.resumed {
                    tracing::info!(sink = %name, points = span.rows.points.len(), through_chunk = through, "resuming the eviction gap from the rollup tier after its last acknowledged batch");
                } else {
                    tracing::warn!(sink = %name, points = span.rows.points.len(), through_chunk = through, "raw data this sink had not sent was evicted; sending that span from the rollup tier (tag edgewatch_rollup)");
                }
                fb = Some(Fallback { span, off: 0 });
            }
        }
        let fallback = fb.as_ref().map(|f| {
            let pts = &f.span.rows.points;
            (
                f.span.through,
                pts[f.off..(f.off + max_points).min(pts.len())].to_vec(),
            )
        });
        let mut full = false;
        let (first, last, points, is_fallback) = match fallback {
            Some((through, pts)) => (cursor, through, pts, true),
            None => match src.read(cursor, max_points) {
                Ok(c) => {
                    full = c.full;
                    (c.first, c.last, c.points, false)
                }
                Err(e) => {
                    tracing::warn!(sink = %name, error = %e, "forwarder cannot read the store");
                    if !fail_and_wait(&ctx, &stop, &mut jitter, &mut failures, &e.to_string()) {
                        break;
                    }
                    continue;
                }
            },
        };
        if !is_fallback && last == 0 {
            pending_since = None;
            if !nap(&stop, poll) {
                break;
            }
            continue;
        }
        let since = *pending_since.get_or_insert_with(Instant::now);
        if !is_fallback
            && !full
            && !batch_ready(
                points.len(),
                max_points,
                since.elapsed(),
                ctx.cfg.max_delay.0,
            )
        {
            if !nap(
                &stop,
                poll.min(ctx.cfg.max_delay.0.saturating_sub(since.elapsed())),
            ) {
                break;
            }
            continue;
        }
        let Encoded {
            body: mut payload,
            mut used,
            mut skipped_strings,
        } = wire.body(&points, ctx.cfg.max_bytes);
        // A byte-limited batch must still end on a chunk boundary for the cursor: if the
        // byte limit cut it, send fewer chunks next time instead; a single chunk over the
        // limit goes whole. (Rollup batches have no chunks: the rest goes next time.)
        if used < points.len() && !is_fallback {
            if max_points > 1 {
                max_points = (used.max(1)).min(max_points / 2).max(1);
                continue;
            }
            Encoded {
                body: payload,
                used,
                skipped_strings,
            } = wire.body(&points, usize::MAX);
        }
        let points = &points[..used];
        let wait = rate.reserve(started.elapsed().as_secs_f64(), points.len());
        if !wait.is_zero() && !nap(&stop, wait) {
            break;
        }
        if let Some(d) = reconnect.take(&ctx.cfg, jitter.sample()) {
            tracing::info!(sink = %name, wait_ms = d.as_millis() as u64, "link back with a backlog: spreading the first send (reconnect_jitter)");
            if !nap(&stop, d) {
                break;
            }
        }
        if retrying {
            let _ = cur.count_replay();
        }
        if is_fallback {
            let _ = cur.mark_fallback_inflight(1);
        } else {
            let _ = cur.mark_inflight(last);
        }
        let outcome = wire.send(&agent, &payload);
        match &outcome {
            Outcome::Retry { reason } if reason.starts_with("cannot reach") => reconnect.failed(),
            _ => reconnect.answered(),
        }
        let now = crate::now_ns();
        let n = points.len() as i64;
        let ts_max = points.iter().map(|p| p.ts).max().unwrap_or(0);
        let sleep = match outcome {
            Outcome::Ack => {
                let r = if let Some(f) = fb.as_mut().filter(|_| is_fallback) {
                    let end = f.off + points.len();
                    let progress = f.span.progress(f.off, end, 0);
                    let r = cur.fallback_ack(seq, &progress);
                    if r.is_ok() {
                        f.off = end;
                        ctx.status.update(|s| s.fallback_points += progress.points);
                        if progress.done.is_some() {
                            fb = None;
                            last_refresh = None;
                            tracing::info!(sink = %name, through_chunk = last, "eviction gap covered from the rollup tier");
                        }
                    }
                    r
                } else {
                    seq += 1;
                    cur.ack(last, seq, n, ts_max, now)
                };
                if let Err(e) = r {
                    ctx.status.error(&e.to_string());
                    tracing::warn!(sink = %name, error = %e, "cannot persist the cursor (the batch will be sent again)");
                    seq = cur.load().map(|d| d.seq).unwrap_or(seq);
                    Some(Duration::from_millis(200))
                } else {
                    if !is_fallback {
                        cursor = last;
                    }
                    failures = 0;
                    retrying = false;
                    pending_since = None;
                    max_points = ctx.cfg.max_points;
                    let rate_now = meter.add(started.elapsed().as_secs_f64(), n as u64);
                    ctx.status.update(|s| {
                        s.connected = true;
                        s.paused = false;
                        s.last_error = None;
                        s.last_success_ns = Some(now);
                        s.cursor_chunk_id = cursor;
                        s.batch_seq = seq;
                        s.drain_rate_pps = rate_now;
                        if !is_fallback {
                            s.forwarded_points += n;
                        }
                        s.skipped_string_values += skipped_strings;
                    });
                    None
                }
            }
            Outcome::DeadLetter { status, reason } => {
                seq += 1;
                tracing::warn!(sink = %name, status, %reason, first_chunk = first, last_chunk = last, points = n, "batch refused as bad data; kept in dead_letters");
                let progress = fb
                    .as_ref()
                    .filter(|_| is_fallback)
                    .map(|f| f.span.progress(f.off, f.off + points.len(), 0));
                let r = cur.dead_letter(
                    first,
                    last,
                    seq,
                    n,
                    status,
                    &reason,
                    &payload,
                    now,
                    progress.as_ref(),
                );
                ctx.status.error(&reason);
                if let Err(e) = r {
                    tracing::warn!(sink = %name, error = %e, "cannot record the dead letter (will retry)");
                    seq -= 1;
                    Some(Duration::from_millis(200))
                } else {
                    if let (Some(f), Some(p)) = (fb.as_mut(), progress) {
                        f.off += points.len();
                        ctx.status.update(|s| s.fallback_points += p.points);
                        if p.done.is_some() {
                            fb = None;
                        }
                    } else {
                        cursor = last;
                    }
                    retrying = false;
                    pending_since = None;
                    last_refresh = None;
                    ctx.status.update(|s| {
                        s.connected = true;
                        s.cursor_chunk_id = cursor;
                        s.skipped_string_values += skipped_strings;
                    });
                    None
                }
            }
            Outcome::Pause { reason } => {
                logged_errors += 1;
                if logged_errors.is_power_of_two() {
                    tracing::error!(sink = %name, %reason, count = logged_errors, "sink paused");
                }
                ctx.status.error(&reason);
                ctx.status.update(|s| {
                    s.paused = true;
                    s.connected = true;
                });
                Some(ctx.cfg.max_backoff.0)
            }
            Outcome::Shrink { reason } => {
                ctx.status.error(&reason);
                max_points = (points.len() / 2).max(1);
                Some(Duration::ZERO)
            }
            Outcome::RetryAfter { after, reason } => {
                retrying = true;
                ctx.status.error(&reason);
                ctx.status.update(|s| s.connected = true);
                Some(after)
            }
            Outcome::Retry { reason } => {
                failures += 1;
                retrying = true;
                logged_errors += 1;
                if logged_errors.is_power_of_two() {
                    tracing::warn!(sink = %name, %reason, count = logged_errors, "send failed; backing off");
                }
                ctx.status.error(&reason);
                ctx.status
                    .update(|s| s.connected = !reason.starts_with("cannot reach"));
                Some(ctx.cfg.retry_delay(failures, jitter.sample()))
            }
        };
        if let Some(d) = sleep {
            if !nap(&stop, d) {
                break;
            }
        }
    }
    tracing::info!(sink = %name, kind, cursor, "sink stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_basic_auth() {
        let c: super::super::SinkConfig = toml::from_str(
            "type = \"influxdb\"\nname = \"a\"\nurl = \"http://h:1/\"\nversion = 1\ndatabase = \"my db\"\n",
        )
        .unwrap();
        assert_eq!(write_url(&c), "http://h:1/write?precision=ns&db=my%20db");
        let c: super::super::SinkConfig = toml::from_str(
            "type = \"influxdb\"\nname = \"a\"\nurl = \"http://h:1\"\norg = \"o\"\nbucket = \"b\"\n",
        )
        .unwrap();
        assert_eq!(
            write_url(&c),
            "http://h:1/api/v2/write?precision=ns&org=o&bucket=b"
        );
        assert_eq!(base64(b"edge:secret"), "ZWRnZTpzZWNyZXQ=");
        assert_eq!(base64(b"ab"), "YWI=");
    }
}
