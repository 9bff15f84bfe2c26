//! The MQTT sink (`rumqttc`): batches published at QoS 1 (default) to a topic template, up
//! to `inflight` batches unacknowledged; the cursor moves over the longest acknowledged
//! prefix on PUBACK. A retained status topic says `online` on connect, `offline` on a clean
//! stop, and the broker says `offline` (last will) when the link dies.
//!
//! Each connection gets a fresh client and event loop (polled in its own task, never
//! cancelled mid-write). When a connection dies, the batches it had in flight are read again
//! from the cursor and republished on the next connection with the same sequence numbers:
//! at most `inflight` batches per fault can reach a consumer twice, and they are counted.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::encode::{self, Point};
use super::store::{Cursor, Source};
use super::{batch_ready, config::Format, RateLimit, RateMeter, Reconnect, SinkCtx};
use crate::deliver::{mqtt, Outcome, Retrier};

/// What the connection task reports.
enum Ev {
    Connected,
    /// A publish left with this packet id (0 for QoS 0).
    Sent(u16),
    /// The broker acknowledged this packet id.
    Acked(u16),
    Down(String),
}

/// One batch in flight.
struct Flight {
    seq: i64,
    last: i64,
    points: i64,
    ts_max: i64,
    remaining: usize,
    /// A batch of rollup points covering an eviction gap: the job's offset once it is
    /// acknowledged.
    fallback_end: Option<usize>,
}

/// An eviction gap being covered from the rollup tier (see [`super::fallback_span`]).
struct FallbackJob {
    span: super::FallbackSpan,
    /// Points acknowledged.
    acked: usize,
    /// Points published on this connection.
    sent: usize,
}

fn qos(q: u8) -> QoS {
    match q {
        0 => QoS::AtMostOnce,
        2 => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
    }
}

fn options(ctx: &SinkCtx) -> Result<MqttOptions, String> {
    let cfg = &ctx.cfg;
    let e = mqtt::Endpoint {
        url: &cfg.url,
        client_id: cfg
            .client_id
            .clone()
            .unwrap_or_else(|| format!("edgewatch-{}-{}", ctx.device_id, cfg.name)),
        credentials: &cfg.credentials,
        keepalive: cfg.keepalive.map_or(Duration::from_secs(30), |k| k.0),
        clean_session: cfg.clean_session.unwrap_or(false),
        tls: cfg.tls_files(),
    };
    let mut o = mqtt::options(&e).map_err(|e| e.to_string())?;
    o.set_max_packet_size(64 * 1024, cfg.max_bytes.saturating_mul(2).max(256 * 1024));
    o.set_inflight(100);
    o.set_last_will(LastWill::new(
        status_topic(ctx),
        "offline",
        QoS::AtLeastOnce,
        true,
    ));
    Ok(o)
}

fn status_topic(ctx: &SinkCtx) -> String {
    encode::topic(
        ctx.cfg
            .status_topic
            .as_deref()
            .unwrap_or("edgewatch/{device_id}/status"),
        &ctx.device_id,
        "",
    )
}

/// Messages (topic, payload) of one batch.
fn messages(
    ctx: &SinkCtx,
    seq: i64,
    first: i64,
    last: i64,
    points: &[Point],
) -> Vec<(String, Vec<u8>)> {
    let shape = Shape {
        template: ctx.cfg.topic.as_deref().unwrap_or("edgewatch/{device_id}"),
        device_id: &ctx.device_id,
        format: ctx.cfg.format.unwrap_or(Format::Line),
        gzip: ctx.cfg.gzip(),
        max_bytes: ctx.cfg.max_bytes,
    };
    shape.messages(seq, first, last, points)
}

/// How a sink turns a batch into MQTT messages.
struct Shape<'a> {
    template: &'a str,
    device_id: &'a str,
    format: Format,
    gzip: bool,
    /// Largest payload before compression; a batch over it goes as several parts (a single
    /// point over it goes alone).
    max_bytes: usize,
}

impl Shape<'_> {
    /// The payload of `pts` without its part number: the lines (the numbered comment goes in
    /// front later), or the JSON document numbered `(0, 0)` (renumbered later).
    fn unnumbered(&self, pts: &[&Point]) -> Vec<u8> {
        match self.format {
            Format::Line => {
                let mut b = Vec::new();
                for p in pts {
                    encode::line(&mut b, p, false);
                }
                b
            }
            Format::Json => encode::json(self.device_id, 0, (0, 0), pts),
        }
    }

    /// Splits `pts` in halves until each part's payload fits `max_bytes`; each part comes
    /// with its unnumbered payload, so a batch that fits is encoded once.
    fn fit<'p>(&self, pts: Vec<&'p Point>, out: &mut Vec<(Vec<&'p Point>, Vec<u8>)>) {
        // The part number is written once all parts are known; leave room for it.
        let budget = self.max_bytes.saturating_sub(96).max(1);
        let body = self.unnumbered(&pts);
        if pts.len() > 1 && body.len() > budget {
            let mut left = pts;
            let right = left.split_off(left.len() / 2);
            self.fit(left, out);
            self.fit(right, out);
        } else {
            out.push((pts, body));
        }
    }

    fn messages(
        &self,
        seq: i64,
        first: i64,
        last: i64,
        points: &[Point],
    ) -> Vec<(String, Vec<u8>)> {
        let mut groups: Vec<(String, Vec<&Point>)> = Vec::new();
        if self.template.contains("{measurement}") {
            let mut index: HashMap<&str, usize> = HashMap::new();
            for p in points {
                let i = *index
                    .entry(p.series.measurement.as_str())
                    .or_insert_with(|| {
                        groups.push((
                            encode::topic(self.template, self.device_id, &p.series.measurement),
                            Vec::new(),
                        ));
                        groups.len() - 1
                    });
                groups[i].1.push(p);
            }
        } else {
            groups.push((
                encode::topic(self.template, self.device_id, ""),
                points.iter().collect(),
            ));
        }
        let mut parts: Vec<(String, Vec<&Point>, Vec<u8>)> = Vec::new();
        for (topic, pts) in groups {
            let mut fitted = Vec::new();
            self.fit(pts, &mut fitted);
            parts.extend(fitted.into_iter().map(|(p, b)| (topic.clone(), p, b)));
        }
        let n = parts.len();
        parts
            .into_iter()
            .enumerate()
            .map(|(i, (topic, pts, lines))| {
                let part = (i + 1, n);
                let body = match self.format {
                    Format::Line => {
                        let mut b =
                            encode::seq_comment(seq, first, last, part.0, part.1).into_bytes();
                        b.extend_from_slice(&lines);
                        b
                    }
                    // The number sits inside the document: encode it again, numbered.
                    Format::Json => encode::json(self.device_id, seq, part, &pts),
                };
                let body = if self.gzip { encode::gzip(&body) } else { body };
                (topic, body)
            })
            .collect()
    }
}

/// Connects and polls one connection until it dies or `closing` is cancelled.
async fn connection(
    mut el: rumqttc::EventLoop,
    tx: mpsc::UnboundedSender<Ev>,
    closing: CancellationToken,
) {
    loop {
        let ev = tokio::select! {
            // Only taken after the driver sent DISCONNECT (or gave up): nothing left to lose.
            _ = closing.cancelled() => return,
            ev = el.poll() => ev,
        };
        let msg = match ev {
            Ok(Event::Incoming(Packet::ConnAck(_))) => Ev::Connected,
            Ok(Event::Incoming(Packet::PubAck(a))) => Ev::Acked(a.pkid),
            Ok(Event::Incoming(Packet::PubComp(a))) => Ev::Acked(a.pkid),
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => Ev::Sent(pkid),
            Ok(Event::Outgoing(Outgoing::Disconnect)) => {
                let _ = tx.send(Ev::Down("disconnected".into()));
                return;
            }
            Ok(_) => continue,
            Err(e) => {
                let _ = tx.send(Ev::Down(e.to_string()));
                return;
            }
        };
        if tx.send(msg).is_err() {
            return;
        }
    }
}

/// The sink's task.
pub(crate) async fn run(ctx: SinkCtx, stop: CancellationToken) {
    let name = ctx.cfg.name.clone();
    // Opening can fail while the store is busy: retry with backoff until stopped, as every
    // peer does (on the blocking pool: the store is blocking IO).
    let opened = tokio::task::spawn_blocking({
        let dir = ctx.dir.clone();
        let ident = ctx.identity.clone();
        let name = name.clone();
        let feed = ctx.feed;
        let status = ctx.status.clone();
        let stop = stop.clone();
        let mut retry = Retrier::new("sink", &name, ctx.cfg.retry);
        move || {
            let opened = retry.until_ok("cannot open the store", &stop, &*status, || {
                let s = Source::open_feed(&dir, ident.clone(), feed)?;
                let (c, d) = Cursor::open_feed(&dir, &name, feed)?;
                let backlog = s.backlog(d.cursor).map_or(0, |b| b.0);
                Ok::<_, crate::store::StoreError>((s, c, d, backlog))
            });
            (opened, retry)
        }
    })
    .await;
    let (src, cur, d, backlog, mut retry) = match opened {
        Ok((Some((s, c, d, b)), retry)) => (s, c, d, b, retry),
        // Stopped before the store opened.
        Ok((None, _)) => return,
        Err(e) => {
            tracing::error!(sink = %name, error = %e, "mqtt sink failed to start");
            return;
        }
    };
    ctx.status.durable(&d);
    let opts = match options(&ctx) {
        Ok(o) => o,
        Err(e) => {
            crate::deliver::Report::failed(&*ctx.status, &e, None, true);
            tracing::error!(sink = %name, error = %e, "mqtt sink is misconfigured; it is off (its data is kept)");
            return;
        }
    };
    tracing::info!(sink = %name, url = %ctx.cfg.url, cursor = d.cursor, "mqtt sink started");
    let db = Arc::new(Mutex::new((src, cur)));
    let q = qos(ctx.cfg.qos.unwrap_or(1));
    // One batch in flight by default: a fault then duplicates at most one batch (the
    // issue's guarantee); a larger window drains faster over high-latency links.
    let window = ctx.cfg.inflight.unwrap_or(1);
    let status_topic = status_topic(&ctx);
    let started = Instant::now();
    let mut rate = RateLimit::new(ctx.cfg.max_rate);
    let mut meter = RateMeter::default();
    let mut acked_cursor = d.cursor;
    let mut acked_seq = d.seq;
    let poll = ctx
        .cfg
        .max_delay
        .0
        .clamp(Duration::from_millis(20), Duration::from_millis(500));
    let mut last_refresh: Option<Instant> = None;
    let mut fb: Option<FallbackJob> = None;
    // Reconnect storms: after CONNACK, at start with a backlog and after the link died,
    // publishing waits a random part of `reconnect_jitter` (until `hold`).
    let mut reconnect = Reconnect::at_start(backlog);
    let mut hold: Option<Instant> = None;
    // Batches to send again exactly as they went before (their last chunk id): the one in
    // flight when the agent last stopped, then those a dead connection took with it. Same
    // numbers, same chunks: a consumer dropping repeats by (seq, part) loses nothing.
    let mut replay: VecDeque<i64> = VecDeque::new();
    if d.replay_through > d.cursor {
        replay.push_back(d.replay_through);
    }

    'connections: while !stop.is_cancelled() {
        if let Some(job) = fb.as_mut() {
            job.sent = job.acked;
        }
        let (client, el) = AsyncClient::new(opts.clone(), 64);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let closing = CancellationToken::new();
        let conn_task = tokio::spawn(connection(el, tx, closing.clone()));
        let mut connected = false;
        let mut read_cursor = acked_cursor;
        let mut next_seq = acked_seq;
        let mut inflight: VecDeque<Flight> = VecDeque::new();
        // Messages handed to the client whose packet id is not known yet: the batch seq, or
        // None for a status message.
        let mut unassigned: VecDeque<Option<i64>> = VecDeque::new();
        let mut pkids: HashMap<u16, Option<i64>> = HashMap::new();
        let mut pending_since: Option<Instant> = None;
        let mut down: Option<String> = None;
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => break,
                ev = rx.recv() => ev,
                _ = tokio::time::sleep(poll) => None,
            };
            match ev {
                Some(Ev::Connected) => {
                    connected = true;
                    retry.succeeded();
                    ctx.status.update(|s| {
                        s.connected = true;
                        s.last_error = None;
                    });
                    tracing::info!(sink = %name, "mqtt connected");
                    reconnect.answered();
                    if let Some(d) = reconnect.take(&ctx.cfg, retry.jitter()) {
                        tracing::info!(sink = %name, wait_ms = d.as_millis() as u64, "link back with a backlog: spreading the first publish (reconnect_jitter)");
                        hold = Some(Instant::now() + d);
                    }
                    unassigned.push_back(None);
                    let _ = client
                        .publish(&status_topic, QoS::AtLeastOnce, true, "online")
                        .await;
                }
                Some(Ev::Sent(pkid)) => {
                    if let Some(entry) = unassigned.pop_front() {
                        if q == QoS::AtMostOnce {
                            if let Some(seq) = entry {
                                if let Some(f) = inflight.iter_mut().find(|f| f.seq == seq) {
                                    f.remaining = f.remaining.saturating_sub(1);
                                }
                            }
                        } else {
                            pkids.insert(pkid, entry);
                        }
                    }
                }
                Some(Ev::Acked(pkid)) => {
                    if let Some(Some(seq)) = pkids.remove(&pkid) {
                        if let Some(f) = inflight.iter_mut().find(|f| f.seq == seq) {
                            f.remaining = f.remaining.saturating_sub(1);
                        }
                    }
                }
                Some(Ev::Down(e)) => {
                    down = Some(e);
                    break;
                }
                None => {}
            }
            // Move the cursor over the acknowledged prefix.
            let mut done: Option<(i64, i64, i64, i64)> = None;
            let mut fb_acked: Option<(i64, usize)> = None;
            while inflight.front().is_some_and(|f| f.remaining == 0) {
                let Some(f) = inflight.pop_front() else { break };
                if let Some(end) = f.fallback_end {
                    fb_acked = Some((f.seq, end));
                    continue;
                }
                let d = done.get_or_insert((0, 0, 0, i64::MIN));
                *d = (f.last, f.seq, d.2 + f.points, d.3.max(f.ts_max));
            }
            if let Some((last, seq, points, ts_max)) = done {
                let db2 = db.clone();
                let r = tokio::task::spawn_blocking(move || {
                    let mut g = db2.lock().unwrap_or_else(|p| p.into_inner());
                    g.1.ack(last, seq, points, ts_max, crate::now_ns())
                })
                .await;
                match r {
                    Ok(Ok(())) => {
                        acked_cursor = last;
                        acked_seq = seq;
                        let r = meter.add(started.elapsed().as_secs_f64(), points as u64);
                        ctx.status.update(|s| {
                            s.cursor_chunk_id = last;
                            s.batch_seq = seq;
                            s.forwarded_points += points;
                            s.last_success_ns = Some(crate::now_ns());
                            s.drain_rate_pps = r;
                        });
                    }
                    Ok(Err(e)) => {
                        // The batches were delivered; they will be sent again after a restart.
                        ctx.status.error(&e.to_string());
                        tracing::warn!(sink = %name, error = %e, "cannot persist the cursor");
                    }
                    Err(_) => {}
                }
            }
            if let (Some((seq, end)), Some(job)) = (fb_acked, fb.as_mut()) {
                // Record how far the span got with the batch's number, in one transaction: a
                // restart resumes after it, sending again only the batches still in flight
                // (with their numbers).
                let progress = job.span.progress(job.acked, end, inflight.len());
                job.acked = end;
                if progress.done.is_some() {
                    fb = None;
                    last_refresh = None;
                    tracing::info!(sink = %name, "eviction gap covered from the rollup tier");
                }
                let db2 = db.clone();
                let r = tokio::task::spawn_blocking(move || {
                    let mut g = db2.lock().unwrap_or_else(|p| p.into_inner());
                    g.1.fallback_ack(seq, &progress)
                })
                .await;
                match r {
                    Ok(Ok(())) => {
                        acked_seq = acked_seq.max(seq);
                        ctx.status.update(|s| {
                            s.batch_seq = acked_seq;
                            s.fallback_points += progress.points;
                            s.last_success_ns = Some(crate::now_ns());
                        });
                    }
                    Ok(Err(e)) => {
                        // Delivered; sent again (under the same number) after a restart.
                        ctx.status.error(&e.to_string());
                        tracing::warn!(sink = %name, error = %e, "cannot persist the progress of the eviction gap");
                    }
                    Err(_) => {}
                }
            }
            // Eviction took raw data this sink never sent: cover that span from the rollup
            // tier first, alone in the window.
            if connected && fb.is_none() && inflight.is_empty() && !stop.is_cancelled() {
                let db2 = db.clone();
                let tier = ctx.fallback_tier_s;
                let ident = ctx.identity.clone();
                let seq = acked_seq;
                let r = tokio::task::spawn_blocking(move || {
                    let mut g = db2.lock().unwrap_or_else(|p| p.into_inner());
                    let due = super::fallback_span(tier, &ident, &g.0, &g.1);
                    if let Some(span) = due.as_ref().filter(|s| s.rows.points.is_empty()) {
                        let _ = g.1.fallback_ack(seq, &span.progress(0, 0, 0));
                    }
                    due
                })
                .await;
                if let Ok(Some(span)) = r {
                    let (points, through) = (span.rows.points.len(), span.through);
                    if points == 0 {
                        if !span.resumed {
                            tracing::warn!(sink = %name, through_chunk = through, "raw data this sink had not sent was evicted and the rollup tier has no rows for that span; counted in evicted_unforwarded_points");
                        }
                    } else {
                        if span.resumed {
                            tracing::info!(sink = %name, points, through_chunk = through, "resuming the eviction gap from the rollup tier after its last acknowledged batch");
                        } else {
                            tracing::warn!(sink = %name, points, through_chunk = through, "raw data this sink had not sent was evicted; sending that span from the rollup tier (tag edgewatch_rollup)");
                        }
                        fb = Some(FallbackJob {
                            span,
                            acked: 0,
                            sent: 0,
                        });
                    }
                }
            }
            {
                let db2 = db.clone();
                let mut lr = last_refresh;
                let st = ctx.status.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    let mut guard = db2.lock().unwrap_or_else(|p| p.into_inner());
                    let g = &mut *guard;
                    super::refresh_backlog(&g.0, &mut g.1, &st, &mut lr, Duration::from_secs(1));
                    lr
                })
                .await
                .map(|lr| last_refresh = lr);
                let r = meter.rate(started.elapsed().as_secs_f64());
                ctx.status.update(|s| s.drain_rate_pps = r);
            }
            // Publish more while the window has room.
            if hold.is_some_and(|h| Instant::now() < h) {
                continue;
            }
            hold = None;
            while connected && inflight.len() < window && !stop.is_cancelled() {
                if let Some(job) = fb.as_mut() {
                    let all = &job.span.rows.points;
                    if job.sent >= all.len() {
                        break;
                    }
                    let end = (job.sent + ctx.cfg.max_points).min(all.len());
                    let pts = &all[job.sent..end];
                    let wait = rate.reserve(started.elapsed().as_secs_f64(), pts.len());
                    if !wait.is_zero() {
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                    next_seq += 1;
                    let through = job.span.through;
                    let msgs = messages(&ctx, next_seq, acked_cursor, through, pts);
                    inflight.push_back(Flight {
                        seq: next_seq,
                        last: through,
                        points: pts.len() as i64,
                        ts_max: pts.iter().map(|p| p.ts).max().unwrap_or(0),
                        remaining: msgs.len(),
                        fallback_end: Some(end),
                    });
                    job.sent = end;
                    {
                        // Counted as replayed at the next start if the agent stops first.
                        let db2 = db.clone();
                        let n = inflight.len() as i64;
                        let _ = tokio::task::spawn_blocking(move || {
                            db2.lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .1
                                .mark_fallback_inflight(n)
                        })
                        .await;
                    }
                    for (topic, payload) in msgs {
                        unassigned.push_back(Some(next_seq));
                        if let Err(e) = client.publish(topic, q, false, payload).await {
                            down = Some(e.to_string());
                            break;
                        }
                    }
                    if down.is_some() {
                        break;
                    }
                    continue;
                }
                let db2 = db.clone();
                let max_points = ctx.cfg.max_points;
                let after = read_cursor;
                let again = replay.front().copied();
                let upto = again.unwrap_or(i64::MAX);
                let device_id = ctx.device_id.clone();
                let caught_up = inflight.is_empty() && replay.is_empty();
                let read = tokio::task::spawn_blocking(move || {
                    let mut g = db2.lock().unwrap_or_else(|p| p.into_inner());
                    let c = g.0.read_upto(after, max_points, upto)?;
                    if c.last == 0 && caught_up {
                        // The writer's next commit may mark this sink's next batch itself.
                        g.1.offer(after, max_points);
                    }
                    let carried = c.last != 0 && g.1.is_carried(after, c.last);
                    // The incidents the batch's points open go with it (`topics.rs`).
                    let x = super::topics::extras(&device_id, &c.points, |id| g.0.incident(id))?;
                    Ok::<_, crate::store::StoreError>((c, x, carried))
                })
                .await;
                let (chunks, extras, carried) = match read {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => {
                        ctx.status.error(&e.to_string());
                        break;
                    }
                    Err(_) => break,
                };
                if chunks.last == 0 {
                    // Nothing left of a batch to send again (evicted meanwhile): go on.
                    if replay.pop_front().is_some() {
                        continue;
                    }
                    pending_since = None;
                    break;
                }
                let since = *pending_since.get_or_insert_with(Instant::now);
                if again.is_some() {
                    // Sent as it was, whatever its fill: it went before.
                    if chunks.last >= upto {
                        replay.pop_front();
                    }
                } else if !chunks.full
                    && !carried
                    && !batch_ready(
                        chunks.points.len(),
                        max_points,
                        since.elapsed(),
                        ctx.cfg.max_delay.0,
                    )
                {
                    // Not sent yet: the next read extends it rather than reading it again
                    // (the incidents it opens are looked up again with it then).
                    db.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                        .keep(after, max_points, chunks);
                    break;
                }
                let wait = rate.reserve(started.elapsed().as_secs_f64(), chunks.points.len());
                if !wait.is_zero() {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                next_seq += 1;
                let msgs = messages(&ctx, next_seq, chunks.first, chunks.last, &chunks.points);
                inflight.push_back(Flight {
                    seq: next_seq,
                    last: chunks.last,
                    points: chunks.points.len() as i64,
                    ts_max: chunks.points.iter().map(|p| p.ts).max().unwrap_or(0),
                    remaining: msgs.len() + extras.len(),
                    fallback_end: None,
                });
                {
                    let db2 = db.clone();
                    let through = chunks.last;
                    let _ = tokio::task::spawn_blocking(move || {
                        db2.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .1
                            .mark_inflight(through)
                    })
                    .await;
                }
                let all = msgs.into_iter().map(|(t, p)| (t, p, false));
                let all = all.chain(extras.into_iter().map(|x| (x.topic, x.payload, x.retain)));
                for (topic, payload, retain) in all {
                    unassigned.push_back(Some(next_seq));
                    if let Err(e) = client.publish(topic, q, retain, payload).await {
                        down = Some(e.to_string());
                        break;
                    }
                }
                read_cursor = chunks.last;
                pending_since = None;
            }
            if down.is_some() {
                break;
            }
        }
        // Leaving this connection: what it had in flight goes again, as it was, first.
        let lost = inflight.len();
        let again: Vec<i64> = inflight
            .iter()
            .filter(|f| f.fallback_end.is_none())
            .map(|f| f.last)
            .collect();
        for last in again.into_iter().rev() {
            if !replay.front().is_some_and(|&f| f <= last) {
                replay.push_front(last);
            }
        }
        if stop.is_cancelled() && down.is_none() {
            // Clean stop: say offline, disconnect, give the acks in flight a moment.
            if connected {
                let _ = client
                    .publish(&status_topic, QoS::AtLeastOnce, true, "offline")
                    .await;
                let _ = client.disconnect().await;
                let _ = tokio::time::timeout(Duration::from_millis(500), async {
                    while rx.recv().await.is_some() {}
                })
                .await;
            }
            closing.cancel();
            let _ = tokio::time::timeout(Duration::from_millis(200), conn_task).await;
            break 'connections;
        }
        closing.cancel();
        conn_task.abort();
        let reason = down.unwrap_or_else(|| "connection closed".into());
        reconnect.failed();
        hold = None;
        if lost > 0 {
            tracing::debug!(sink = %name, unacked_batches = lost, "mqtt link down with batches in flight (sent again on the next connection)");
        }
        let wait = retry.after(
            &Outcome::unreachable(format!("mqtt: {reason}")),
            &*ctx.status,
        );
        ctx.status.update(|s| s.connected = false);
        if lost > 0 {
            let db2 = db.clone();
            let in_span = fb.is_some();
            let _ = tokio::task::spawn_blocking(move || {
                let mut g = db2.lock().unwrap_or_else(|p| p.into_inner());
                for _ in 0..lost {
                    let _ = g.1.count_replay();
                }
                if in_span {
                    // Counted now: not again at the next start.
                    let _ = g.1.mark_fallback_inflight(0);
                }
            })
            .await;
        }
        {
            // The backlog keeps growing while the link is down: keep the status current.
            let db2 = db.clone();
            let mut lr = last_refresh;
            let st = ctx.status.clone();
            if let Ok(lr) = tokio::task::spawn_blocking(move || {
                let mut guard = db2.lock().unwrap_or_else(|p| p.into_inner());
                let g = &mut *guard;
                super::refresh_backlog(&g.0, &mut g.1, &st, &mut lr, Duration::from_secs(1));
                lr
            })
            .await
            {
                last_refresh = lr;
            }
            let r = meter.rate(started.elapsed().as_secs_f64());
            ctx.status.update(|s| s.drain_rate_pps = r);
        }
        tokio::select! {
            _ = stop.cancelled() => break 'connections,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    tracing::info!(sink = %name, cursor = acked_cursor, "mqtt sink stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Value;

    fn points(n: usize) -> Vec<Point> {
        let gpu = Arc::new(encode::series("gpu,gpu=0", &[]));
        let inf = Arc::new(encode::series("inference,model=yolo", &[]));
        (0..n)
            .map(|i| Point {
                series: if i % 3 == 0 { gpu.clone() } else { inf.clone() },
                ts: 1_764_000_000_000_000_000 + i as i64,
                fields: vec![("v".into(), Value::I64(i as i64))],
            })
            .collect()
    }

    fn shape(template: &str, format: Format, max_bytes: usize) -> Shape<'_> {
        Shape {
            template,
            device_id: "d1",
            format,
            gzip: false,
            max_bytes,
        }
    }

    /// Timestamps per (seq, part) of line-format payloads.
    fn line_parts(msgs: &[(String, Vec<u8>)]) -> Vec<(String, Vec<i64>)> {
        msgs.iter()
            .map(|(_, body)| {
                let text = String::from_utf8(body.clone()).unwrap();
                let mut lines = text.lines();
                let head = lines.next().unwrap().to_string();
                let ts = lines
                    .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
                    .collect();
                (head, ts)
            })
            .collect()
    }

    #[test]
    fn a_batch_fits_one_message_when_it_can() {
        let pts = points(100);
        let msgs = shape("e/{device_id}", Format::Line, 1 << 20).messages(7, 1, 2, &pts);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].0, "e/d1");
        let parts = line_parts(&msgs);
        assert_eq!(parts[0].0, "# edgewatch seq=7 chunks=1-2 part=1/1");
        assert_eq!(parts[0].1.len(), 100);
    }

    #[test]
    fn a_batch_over_max_bytes_goes_as_numbered_parts_in_order() {
        let pts = points(1000);
        let max = 4096;
        let msgs = shape("e/{device_id}", Format::Line, max).messages(7, 1, 2, &pts);
        assert!(msgs.len() > 5, "{} parts", msgs.len());
        assert!(msgs.iter().all(|(_, b)| b.len() <= max));
        let parts = line_parts(&msgs);
        let n = parts.len();
        for (i, (head, _)) in parts.iter().enumerate() {
            assert_eq!(
                head,
                &format!("# edgewatch seq=7 chunks=1-2 part={}/{n}", i + 1)
            );
        }
        let all: Vec<i64> = parts.into_iter().flat_map(|p| p.1).collect();
        let want: Vec<i64> = pts.iter().map(|p| p.ts).collect();
        assert_eq!(all, want, "every point once, in order");
        // Per measurement too, numbered across the whole batch.
        let msgs = shape("e/{device_id}/{measurement}", Format::Line, max).messages(8, 1, 2, &pts);
        let topics: std::collections::BTreeSet<&str> =
            msgs.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(topics.len(), 2);
        assert!(msgs.iter().all(|(_, b)| b.len() <= max));
        let count: usize = line_parts(&msgs).iter().map(|p| p.1.len()).sum();
        assert_eq!(count, 1000);
        // A single point larger than the limit still goes (alone).
        let msgs = shape("e/{device_id}", Format::Line, 10).messages(9, 1, 2, &pts[..3]);
        assert_eq!(msgs.len(), 3);
    }

    #[test]
    fn json_parts_carry_their_number() {
        let pts = points(600);
        let max = 8192;
        let msgs = shape("e/{device_id}", Format::Json, max).messages(3, 1, 2, &pts);
        assert!(msgs.len() > 2);
        let mut seen = 0;
        for (i, (_, body)) in msgs.iter().enumerate() {
            assert!(body.len() <= max);
            let j: serde_json::Value = serde_json::from_slice(body).unwrap();
            assert_eq!(j["seq"], 3);
            assert_eq!(j["part"], i + 1);
            assert_eq!(j["parts"], msgs.len());
            seen += j["points"].as_array().unwrap().len();
        }
        assert_eq!(seen, 600);
    }
}
