//! The InfluxDB sink: one blocking thread per sink (`ureq`), line protocol in ns precision,
//! gzip by default, to `/write` (1.x: `db`, `rp`, `u`/`p`) or `/api/v2/write` (2.x: `org`,
//! `bucket`, `Authorization: Token`). One batch in flight; the cursor moves on 2xx.
//!
//! The loop ([`run_http`]) is shared by every HTTP sink: what differs between them (the
//! encoder, the request) is a [`Wire`]; `remote_write` is the other one.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::encode::{self, Point};
use super::store::Chunks;
use super::{batch_ready, refresh_backlog, RateLimit, RateMeter, Reconnect, SinkCtx};
use crate::deliver::{nap, Auth, HttpPeer, Outcome, Peer, Retrier};

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
    fn send(&self, body: &[u8]) -> Outcome;
    /// The receiver acknowledged `points` (a whole batch, before the cursor moves past it):
    /// state kept beside the cursor is made durable here. An error keeps the cursor where it
    /// is (the batch goes again).
    fn acked(&self, _points: &[Point]) -> Result<(), String> {
        Ok(())
    }
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
pub(crate) struct LineProtocol {
    peer: HttpPeer,
    gzip: bool,
    uint_as_int: bool,
}

impl LineProtocol {
    pub(crate) fn new(cfg: &super::SinkConfig) -> LineProtocol {
        let auth = if cfg.influx_version() == 1 {
            match (&cfg.credentials.username, &cfg.credentials.password) {
                (Some(u), Some(p)) => Auth::Basic {
                    user: u.clone(),
                    password: Some(p.clone()),
                },
                _ => Auth::None,
            }
        } else {
            cfg.token.clone().map_or(Auth::None, Auth::Token)
        };
        LineProtocol {
            peer: HttpPeer::new(Peer::Sink, write_url(cfg), cfg.retry.timeout.0, &auth, []),
            gzip: cfg.gzip(),
            uint_as_int: cfg.influx_version() == 1,
        }
    }
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

    fn send(&self, body: &[u8]) -> Outcome {
        let text = ("Content-Type", "text/plain; charset=utf-8");
        if self.gzip {
            self.peer
                .post(&[text, ("Content-Encoding", "gzip")], &encode::gzip(body))
        } else {
            self.peer.post(&[text], body)
        }
    }
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

/// One chunk (or rollup bucket) the receiver refused as too large (413), sent in parts of
/// `size` points, halved on each further 413 down to single points; a single point still
/// refused is dead-lettered with the reason. The cursor moves once the whole chunk is
/// through; the parts' progress is not persisted (a crash sends the chunk again, which is
/// the at-least-once of one batch in flight).
struct Split {
    first: i64,
    last: i64,
    points: Vec<Point>,
    off: usize,
    size: usize,
    /// Points of the chunk acknowledged so far.
    acked: i64,
}

impl Split {
    fn new(first: i64, last: i64, points: Vec<Point>) -> Split {
        let size = (points.len() / 2).max(1);
        Split {
            first,
            last,
            points,
            off: 0,
            size,
            acked: 0,
        }
    }

    fn part(&self) -> &[Point] {
        let end = (self.off + self.size).min(self.points.len());
        &self.points[self.off..end]
    }

    fn done(&self) -> bool {
        self.off >= self.points.len()
    }
}

/// The InfluxDB sink's thread.
pub(crate) fn run(ctx: SinkCtx, stop: CancellationToken) {
    let wire = LineProtocol::new(&ctx.cfg);
    run_http(ctx, stop, &wire);
}

/// What one request carries and how its answer moves the cursor.
enum Batch {
    /// Whole chunks `first..=last` (or rollup buckets).
    Raw { first: i64, last: i64 },
    /// Rows of an eviction gap.
    Fallback,
    /// A part of a chunk being split.
    Part,
}

/// An HTTP sink's thread: reads batches after the cursor, sends them through `wire`, and
/// moves the cursor on 2xx.
pub(crate) fn run_http(ctx: SinkCtx, stop: CancellationToken, wire: &dyn Wire) {
    let kind = wire.kind();
    let name = ctx.cfg.name.clone();
    let mut retry = Retrier::new("sink", &name, ctx.cfg.retry);
    // Opening can fail while the store is busy: retry with backoff until stopped.
    let Some((mut src, mut cur, d)) =
        retry.until_ok("cannot open the store", &stop, &*ctx.status, || {
            super::open_store(&ctx)
        })
    else {
        return;
    };
    ctx.status.durable(&d);
    tracing::info!(sink = %name, kind, url = %ctx.cfg.url, cursor = d.cursor, "sink started");
    let started = Instant::now();
    let mut rate = RateLimit::new(ctx.cfg.max_rate);
    let mut meter = RateMeter::default();
    let mut cursor = d.cursor;
    let mut seq = d.seq;
    let mut max_points = ctx.cfg.max_points;
    let mut pending_since: Option<Instant> = None;
    let mut last_refresh = None;
    let poll = ctx
        .cfg
        .max_delay
        .0
        .clamp(Duration::from_millis(20), Duration::from_millis(500));
    let mut retrying = false;
    let mut fb: Option<Fallback> = None;
    let mut split: Option<Split> = None;
    // Reconnect storms: the first send at start with a backlog, and the first after the link
    // answers again, wait a random part of `reconnect_jitter`.
    let mut reconnect = Reconnect::at_start(src.backlog(cursor).map_or(0, |b| b.0));
    while !stop.is_cancelled() {
        refresh_backlog(
            &src,
            &mut cur,
            &ctx.status,
            &mut last_refresh,
            Duration::from_secs(1),
        );
        let now_s = started.elapsed().as_secs_f64();
        ctx.status.update(|s| s.drain_rate_pps = meter.rate(now_s));
        // Eviction took raw data this sink never sent: send the rollup rows instead, in
        // batches of `max_points` / `max_bytes`, before any more raw data. Each acknowledged
        // batch records how far the span got, so a restart in between resumes after it.
        if fb.is_none() && split.is_none() {
            if let Some(span) = super::fallback_due(&ctx, &src, &cur) {
                let through = span.through;
                if span.rows.points.is_empty() {
                    if !span.resumed {
                        tracing::warn!(sink = %name, through_chunk = through, "raw data this sink had not sent was evicted and the rollup tier has no rows for that span (non-numeric fields, or rows evicted too); counted in evicted_unforwarded_points");
                    }
                    if let Err(e) = cur.fallback_ack(seq, &span.progress(0, 0, 0)) {
                        let d = retry.local("cannot record the eviction gap", &e, &*ctx.status);
                        if !nap(&stop, d) {
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
        let mut full = false;
        let (batch, points) = if let Some(sp) = &split {
            (Batch::Part, sp.part().to_vec())
        } else if let Some(f) = &fb {
            let pts = &f.span.rows.points;
            (
                Batch::Fallback,
                pts[f.off..(f.off + max_points).min(pts.len())].to_vec(),
            )
        } else {
            match src.read(cursor, max_points) {
                Ok(c) => {
                    full = c.full;
                    (
                        Batch::Raw {
                            first: c.first,
                            last: c.last,
                        },
                        c.points,
                    )
                }
                Err(e) => {
                    let d = retry.local("cannot read the store", &e, &*ctx.status);
                    if !nap(&stop, d) {
                        break;
                    }
                    continue;
                }
            }
        };
        if let Batch::Raw { last: 0, .. } = batch {
            pending_since = None;
            // Caught up: the writer's next commit may mark this sink's next batch itself.
            if !retrying {
                cur.offer(cursor, max_points);
            }
            if !nap(&stop, poll) {
                break;
            }
            continue;
        }
        let since = *pending_since.get_or_insert_with(Instant::now);
        // A batch a writer's commit marked is sent at once: that commit batched its points.
        let carried = matches!(batch, Batch::Raw { last, .. } if cur.is_carried(cursor, last));
        let waiting = !full
            && !carried
            && !batch_ready(
                points.len(),
                max_points,
                since.elapsed(),
                ctx.cfg.max_delay.0,
            );
        if let (true, &Batch::Raw { first, last }) = (waiting, &batch) {
            // Not sent yet: the next read extends it rather than reading it again.
            src.keep(
                cursor,
                max_points,
                Chunks {
                    first,
                    last,
                    points,
                    full,
                },
            );
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
        // limit goes whole (unless the receiver refuses it as too large: then it is split).
        // Rollup batches and parts have no chunk boundary: the rest goes next time.
        if used < points.len() {
            if let Batch::Raw { .. } = batch {
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
        }
        let points = &points[..used];
        let wait = rate.reserve(started.elapsed().as_secs_f64(), points.len());
        if !wait.is_zero() && !nap(&stop, wait) {
            break;
        }
        if let Some(d) = reconnect.take(&ctx.cfg, retry.jitter()) {
            tracing::info!(sink = %name, wait_ms = d.as_millis() as u64, "link back with a backlog: spreading the first send (reconnect_jitter)");
            if !nap(&stop, d) {
                break;
            }
        }
        if retrying {
            let _ = cur.count_replay();
        }
        match batch {
            Batch::Fallback => {
                let _ = cur.mark_fallback_inflight(1);
            }
            Batch::Raw { last, .. } => {
                let _ = cur.mark_inflight(last);
            }
            Batch::Part => {}
        }
        let outcome = wire.send(&payload);
        match &outcome {
            Outcome::Retry {
                unreachable: true, ..
            } => reconnect.failed(),
            _ => reconnect.answered(),
        }
        let now = crate::now_ns();
        let n = points.len() as i64;
        let ts_max = points.iter().map(|p| p.ts).max().unwrap_or(0);
        // A 413 on what cannot be made smaller (one point) is that point's dead letter.
        let outcome = match outcome {
            Outcome::Shrink { reason } if points.len() <= 1 => Outcome::DeadLetter {
                status: 413,
                reason: format!("{reason} (a single point over the receiver's body limit)"),
            },
            o => o,
        };
        let sleep = match outcome {
            Outcome::Ack => {
                let r = match batch {
                    Batch::Fallback => {
                        let f = fb.as_mut().expect("a fallback batch has its span");
                        let end = f.off + points.len();
                        let progress = f.span.progress(f.off, end, 0);
                        let r = cur.fallback_ack(seq, &progress);
                        if r.is_ok() {
                            f.off = end;
                            ctx.status.update(|s| s.fallback_points += progress.points);
                            if progress.done.is_some() {
                                fb = None;
                                last_refresh = None;
                                tracing::info!(sink = %name, "eviction gap covered from the rollup tier");
                            }
                        }
                        r.map(|()| 0).map_err(|e| e.to_string())
                    }
                    Batch::Raw { last, .. } => match wire.acked(points) {
                        Err(e) => Err(e),
                        Ok(()) => {
                            seq += 1;
                            cur.ack(last, seq, n, ts_max, now)
                                .map(|()| {
                                    cursor = last;
                                    n
                                })
                                .map_err(|e| e.to_string())
                        }
                    },
                    Batch::Part => {
                        let sp = split.as_mut().expect("a part has its split");
                        sp.off += points.len();
                        sp.acked += n;
                        finish_split(&mut split, &mut cur, &mut seq, &mut cursor, ts_max, now)
                            .map_err(|e| e.to_string())
                    }
                };
                match r {
                    Err(e) => {
                        tracing::warn!(sink = %name, error = %e, "cannot persist the cursor (the batch will be sent again)");
                        seq = cur.load().map(|d| d.seq).unwrap_or(seq);
                        Some(retry.local("cannot persist the cursor", &e, &*ctx.status))
                    }
                    Ok(forwarded) => {
                        retry.succeeded();
                        retrying = false;
                        pending_since = None;
                        // After a 413, grow back towards the configured batch size.
                        max_points = max_points.saturating_mul(2).min(ctx.cfg.max_points);
                        let rate_now = meter.add(started.elapsed().as_secs_f64(), n as u64);
                        ctx.status.update(|s| {
                            s.connected = true;
                            s.paused = false;
                            s.last_error = None;
                            s.next_retry_ns = None;
                            s.last_success_ns = Some(now);
                            s.cursor_chunk_id = cursor;
                            s.batch_seq = seq;
                            s.drain_rate_pps = rate_now;
                            s.forwarded_points += forwarded;
                            s.skipped_string_values += skipped_strings;
                        });
                        None
                    }
                }
            }
            Outcome::DeadLetter { status, reason } => {
                seq += 1;
                // The chunks the refused points came from (a fallback batch: the raw cursor and
                // the gap it covers, as before the split existed).
                let (first, through, moves) = match (&batch, &split, &fb) {
                    (Batch::Raw { first, last }, _, _) => (*first, *last, true),
                    (Batch::Part, Some(sp), _) => (sp.first, sp.last, false),
                    (_, _, Some(f)) => (cursor, f.span.through, true),
                    _ => (cursor, cursor, true),
                };
                tracing::warn!(sink = %name, status, %reason, first_chunk = first, last_chunk = through, points = n, "refused as bad data; kept in dead_letters");
                let progress = fb
                    .as_ref()
                    .filter(|_| matches!(batch, Batch::Fallback))
                    .map(|f| f.span.progress(f.off, f.off + points.len(), 0));
                let r = cur.dead_letter(&super::store::Refused {
                    first,
                    through,
                    moves_cursor: moves,
                    seq,
                    points: n,
                    status,
                    reason: &reason,
                    payload: &payload,
                    now_ns: now,
                    fallback: progress.as_ref(),
                });
                ctx.status.error(&reason);
                match r {
                    Err(e) => {
                        tracing::warn!(sink = %name, error = %e, "cannot record the dead letter (will retry)");
                        seq -= 1;
                        Some(retry.local("cannot record the dead letter", &e, &*ctx.status))
                    }
                    Ok(()) => {
                        match batch {
                            Batch::Fallback => {
                                if let (Some(f), Some(p)) = (fb.as_mut(), progress) {
                                    f.off += points.len();
                                    ctx.status.update(|s| s.fallback_points += p.points);
                                    if p.done.is_some() {
                                        fb = None;
                                    }
                                }
                            }
                            Batch::Raw { last, .. } => cursor = last,
                            Batch::Part => {
                                if let Some(sp) = split.as_mut() {
                                    sp.off += points.len();
                                }
                                if let Err(e) = finish_split(
                                    &mut split,
                                    &mut cur,
                                    &mut seq,
                                    &mut cursor,
                                    ts_max,
                                    now,
                                ) {
                                    tracing::warn!(sink = %name, error = %e, "cannot persist the cursor (the chunk will be sent again)");
                                }
                            }
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
            }
            Outcome::Shrink { reason } => {
                match batch {
                    // Several chunks: fewer next time.
                    Batch::Raw { first, last } if first != last && max_points > 1 => {
                        max_points = (points.len() / 2).max(1);
                    }
                    // One chunk (or bucket): split it.
                    Batch::Raw { first, last } => {
                        tracing::warn!(sink = %name, chunk = last, points = n, "the receiver refuses one chunk as too large; sending it in parts");
                        split = Some(Split::new(first, last, points.to_vec()));
                    }
                    Batch::Fallback => max_points = (points.len() / 2).max(1),
                    Batch::Part => {
                        if let Some(sp) = split.as_mut() {
                            sp.size = (sp.size / 2).max(1);
                        }
                    }
                }
                Some(retry.after(&Outcome::Shrink { reason }, &*ctx.status))
            }
            other => {
                retrying = true;
                let d = retry.after(&other, &*ctx.status);
                let reached = !matches!(
                    other,
                    Outcome::Retry {
                        unreachable: true,
                        ..
                    }
                );
                ctx.status.update(|s| s.connected = reached);
                Some(d)
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

/// Once every part of a split chunk is through (acknowledged or dead-lettered), moves the
/// cursor past the chunk. Returns the points acknowledged by this call's commit.
fn finish_split(
    split: &mut Option<Split>,
    cur: &mut super::store::Cursor,
    seq: &mut i64,
    cursor: &mut i64,
    ts_max: i64,
    now: i64,
) -> Result<i64, crate::store::StoreError> {
    let Some(sp) = split.as_ref().filter(|s| s.done()) else {
        return Ok(0);
    };
    let ts = sp.points.iter().map(|p| p.ts).max().unwrap_or(ts_max);
    cur.ack(sp.last, *seq + 1, sp.acked, ts, now)?;
    *seq += 1;
    *cursor = sp.last;
    let acked = sp.acked;
    *split = None;
    Ok(acked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_urls() {
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
    }
}
