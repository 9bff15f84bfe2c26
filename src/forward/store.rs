//! The forwarder's side of the store: a read-only connection that reads raw chunks after a
//! cursor and decodes them into [`Point`]s (names from the store's dictionary), and a small
//! read-write connection ([`Mode::Cursor`]) through which a sink's cursor moves (and its dead
//! letters, and its progress through an eviction-fallback span, are recorded), beside the
//! ingest writer and the rollup job. Every statement is a typed function of `crate::store`
//! ([`sinks`], [`chunks`], [`dict`], [`tiers`]); this file turns rows into points and
//! issues no SQL. It never reads the ingest queue.
//!
//! A sink in rollup mode (`forward = "rollup:1m"`, [`Feed::Rollup`]) reads the rows of that
//! tier instead of chunks, through the same [`Source::read`] and the same [`Cursor`] moves:
//! its cursor is then the start of the last bucket acknowledged (see [`super::rollup`]).

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::encode::{series, Point, Series};
use crate::store::chunks::{self, Chunk, Scan};
use crate::store::incidents::IncidentRow;
use crate::store::ride::{RideState, Rider, Riders};
use crate::store::sinks::{self, Ack};
use crate::store::sketch::Sketch;
use crate::store::tiers::NamedRow;
use crate::store::{clockfix, dict, tiers, Ctx, Mode, Reader, StoreError};

pub use crate::store::sinks::{Durable, FallbackPos, FallbackProgress, Refused};

/// A run of whole chunks read after a cursor.
#[derive(Debug, Default)]
pub struct Chunks {
    /// First chunk id read (0 when empty).
    pub first: i64,
    /// Last chunk id read: the cursor once this batch is acknowledged.
    pub last: i64,
    /// Points, in chunk-id order.
    pub points: Vec<Point>,
    /// The read stopped because the next chunk would not fit in `max_points`: the batch is
    /// as full as whole chunks allow (send it now, do not wait for `max_delay`).
    pub full: bool,
}

/// What a sink reads from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Feed {
    /// Raw chunks, by chunk id (`forward = "raw"`).
    #[default]
    Raw,
    /// The final buckets of a rollup tier, by bucket (`forward = "rollup:1m"`).
    Rollup {
        /// The tier's resolution, seconds (its `rollups.tier` key).
        tier_s: i64,
        /// `[rollup] lateness`, ns: when a bucket is final.
        lateness_ns: i64,
    },
    /// The sketches of the final 1-minute buckets, one point per row carrying the row's bins
    /// ([`super::rollup::sketch_point`]), under the point series' own tags: what a sink's
    /// histograms are made of (`histograms = true`).
    Sketches {
        /// `[rollup] lateness`, ns.
        lateness_ns: i64,
    },
}

impl Feed {
    /// The rollup tier (seconds), 0 for raw chunks: the mode recorded in the sink's row.
    pub fn tier_s(self) -> i64 {
        match self {
            Feed::Raw => 0,
            Feed::Rollup { tier_s, .. } => tier_s,
            Feed::Sketches { .. } => super::rollup::SKETCH_TIER_S,
        }
    }

    /// A feed of tier rows: (tier, lateness, whether rows carry their sketches).
    fn tier_rows(self) -> Option<(i64, i64, bool)> {
        match self {
            Feed::Raw => None,
            Feed::Rollup {
                tier_s,
                lateness_ns,
            } => Some((tier_s, lateness_ns, false)),
            Feed::Sketches { lateness_ns } => {
                Some((super::rollup::SKETCH_TIER_S, lateness_ns, true))
            }
        }
    }
}

/// Reads raw chunks in id order (or, in rollup mode, tier rows in bucket order).
pub struct Source {
    db: Reader,
    identity: Vec<(String, String)>,
    tagsets: HashMap<i64, Arc<Series>>,
    fields: HashMap<i64, Arc<str>>,
    feed: Feed,
    /// Rollup mode: the forwarded tag sets by series key (with `edgewatch_rollup`).
    rollup_series: HashMap<String, Arc<Series>>,
    /// A batch read and given back unsent ([`Source::keep`]).
    kept: Option<Kept>,
}

/// A batch a sink read and did not send yet, and the read it answered.
struct Kept {
    after: i64,
    max_points: usize,
    chunks: Chunks,
}

/// A chunk row as read, before its tag set is looked up.
struct Raw {
    id: i64,
    tagset_id: i64,
    ts_min: i64,
    ts_max: i64,
    n: i64,
    data: Vec<u8>,
}

impl Source {
    /// Opens `dir`'s store read-only; `identity` tags are added to every point.
    pub fn open(dir: &Path, identity: Vec<(String, String)>) -> Result<Source, StoreError> {
        Self::open_feed(dir, identity, Feed::Raw)
    }

    /// [`Source::open`] reading `feed`.
    pub fn open_feed(
        dir: &Path,
        identity: Vec<(String, String)>,
        feed: Feed,
    ) -> Result<Source, StoreError> {
        let identity = match feed {
            Feed::Raw | Feed::Sketches { .. } => identity,
            Feed::Rollup { tier_s, .. } => super::rollup::rollup_identity(&identity, tier_s),
        };
        Ok(Source {
            db: Reader::open(dir)?,
            identity,
            tagsets: HashMap::new(),
            fields: HashMap::new(),
            feed,
            rollup_series: HashMap::new(),
            kept: None,
        })
    }

    /// Rollup mode's [`Source::read`]: whole final buckets after bucket `after`, oldest
    /// first, until `max_points` rows (at least one bucket); `first`/`last` are bucket starts.
    fn read_rollup(
        &mut self,
        tier_s: i64,
        lateness_ns: i64,
        after: i64,
        max_points: usize,
        upto: i64,
        sketches: bool,
    ) -> Result<Chunks, StoreError> {
        let (conn, path) = (self.db.conn(), self.db.path());
        let state = tiers::state(conn, path, tier_s)?;
        let res_ns = tier_s.saturating_mul(1_000_000_000);
        let Some(through) =
            super::rollup::final_through(state.watermark, lateness_ns, res_ns).map(|t| t.min(upto))
        else {
            return Ok(Chunks::default());
        };
        if through <= after {
            return Ok(Chunks::default());
        }
        let max_points = max_points.clamp(1, 100_000);
        let to = through.saturating_add(1);
        let mut rows = tiers::named_sketch_rows(
            conn,
            path,
            tier_s,
            i64::MIN,
            to,
            Some((after, i64::MAX)),
            Some(max_points + 1),
        )?;
        let buckets: Vec<i64> = rows.iter().map(|r| r.0.bucket).collect();
        let full = match super::rollup::whole_buckets(&buckets, max_points) {
            Some((keep, full)) => {
                rows.truncate(keep);
                full
            }
            None => {
                let b = buckets[0];
                rows = tiers::named_sketch_rows(
                    conn,
                    path,
                    tier_s,
                    b,
                    b.saturating_add(1),
                    None,
                    None,
                )?;
                true
            }
        };
        let mut out = Chunks {
            full,
            ..Chunks::default()
        };
        for (r, sketch) in &rows {
            let series = self
                .rollup_series
                .entry(r.key.clone())
                .or_insert_with(|| Arc::new(series(&r.key, &self.identity)))
                .clone();
            out.points.push(match (sketches, sketch) {
                (false, _) => super::rollup::row_point(r, series),
                (true, Some(sk)) => super::rollup::sketch_point(r, sk, series),
                // A row whose sketch does not decode: no bins to merge (the cursor still
                // moves past it).
                (true, None) => super::rollup::sketch_point(r, &Sketch::new(), series),
            });
        }
        let rows: Vec<&NamedRow> = rows.iter().map(|(r, _)| r).collect();
        if let (Some(f), Some(l)) = (rows.first(), rows.last()) {
            out.first = f.bucket;
            out.last = l.bucket;
        }
        Ok(out)
    }

    /// Loads the dictionary entries not known yet (entries are never deleted or renamed).
    fn reload(&mut self) -> Result<(), StoreError> {
        let d = dict::load(self.db.conn(), self.db.path())?;
        for t in d.tagsets {
            self.tagsets
                .entry(t.id)
                .or_insert_with(|| Arc::new(series(&t.key, &self.identity)));
        }
        for s in d.series {
            self.fields.entry(s.id).or_insert_with(|| s.field.into());
        }
        Ok(())
    }

    /// Reads whole chunks with id > `after`, oldest first, until `max_points` points (at
    /// least one chunk).
    ///
    /// In rollup mode: whole final buckets of the tier after bucket `after` instead (see
    /// [`Feed::Rollup`]); `last` is then the last bucket's start, and an empty read has
    /// `last == 0` as a raw one does.
    pub fn read(&mut self, after: i64, max_points: usize) -> Result<Chunks, StoreError> {
        self.read_upto(after, max_points, i64::MAX)
    }

    /// [`Source::read`] of chunks (or rollup buckets) up to `upto` only: a batch sent again
    /// after a fault carries exactly what it carried the first time, never more, even when
    /// newer chunks arrived since (a consumer dropping repeats by sequence number would
    /// otherwise drop the difference).
    ///
    /// A batch given back by [`Source::keep`] for the same `after` and `max_points` is not
    /// read again: it is returned extended by what was committed after it, as far as
    /// `max_points` allows (a read to resend a batch, `upto` set, never uses it).
    pub fn read_upto(
        &mut self,
        after: i64,
        max_points: usize,
        upto: i64,
    ) -> Result<Chunks, StoreError> {
        let kept = self
            .kept
            .take()
            .filter(|k| k.after == after && k.max_points == max_points && upto == i64::MAX);
        let Some(Kept { chunks: mut c, .. }) = kept else {
            return self.read_stored(after, max_points, upto);
        };
        let room = max_points.saturating_sub(c.points.len());
        if c.full || room == 0 {
            c.full = true;
            return Ok(c);
        }
        let more = self.read_stored(c.last, room, upto)?;
        if more.last == 0 {
            return Ok(c);
        }
        if more.points.len() > room {
            // The next chunk (or bucket) alone does not fit beside the batch.
            c.full = true;
            return Ok(c);
        }
        c.points.extend(more.points);
        c.last = more.last;
        c.full = more.full;
        Ok(c)
    }

    /// Gives back a batch [`Source::read_upto`] returned for `after` and `max_points` and
    /// the sink did not send (not full, and not waited `max_delay` yet): the next read with
    /// the same arguments extends it instead of reading and decoding its chunks again. A
    /// sink polls every 500 ms, so a batch waiting out `max_delay` was read ten times; the
    /// reads were a fifth of the agent's CPU with everything on (docs/performance.md).
    pub fn keep(&mut self, after: i64, max_points: usize, chunks: Chunks) {
        if chunks.last != 0 {
            self.kept = Some(Kept {
                after,
                max_points,
                chunks,
            });
        }
    }

    /// [`Source::read_upto`] from the store.
    fn read_stored(
        &mut self,
        after: i64,
        max_points: usize,
        upto: i64,
    ) -> Result<Chunks, StoreError> {
        if let Some((tier_s, lateness_ns, sketches)) = self.feed.tier_rows() {
            let mut c = self.read_rollup(tier_s, lateness_ns, after, max_points, upto, sketches)?;
            if c.points.is_empty() {
                c.last = 0;
            }
            return Ok(c);
        }
        let (conn, path) = (self.db.conn(), self.db.path());
        // Chunks stamped by a clock that is not set yet wait (see crate::clock).
        let hold = clockfix::hold_from(conn).ctx(path)?.unwrap_or(i64::MAX);
        let scan = Scan {
            after: Some(after),
            before: Some(hold.min(upto.saturating_add(1))),
            limit: Some(max_points.clamp(1, 100_000)),
            ..Scan::default()
        };
        let mut rows: Vec<Raw> = Vec::new();
        let mut full = false;
        let mut points = 0usize;
        chunks::scan(conn, path, &scan, |c| {
            let n = c.n.max(0) as usize;
            if !rows.is_empty() && points + n > max_points {
                full = true;
                return Ok(ControlFlow::Break(()));
            }
            points += n;
            rows.push(Raw {
                id: c.id,
                tagset_id: c.tagset_id,
                ts_min: c.ts_min,
                ts_max: c.ts_max,
                n: c.n,
                data: c.data.to_vec(),
            });
            if points >= max_points {
                full = true;
                return Ok(ControlFlow::Break(()));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        let mut out = Chunks {
            full,
            ..Chunks::default()
        };
        for raw in rows {
            let (id, tagset) = (raw.id, raw.tagset_id);
            if !self.tagsets.contains_key(&tagset) {
                self.reload()?;
            }
            let Some(series) = self.tagsets.get(&tagset).cloned() else {
                // A chunk whose tag set is gone cannot be forwarded; skip it loudly.
                tracing::warn!(
                    chunk = id,
                    tagset,
                    "chunk refers to an unknown tag set; skipped"
                );
                continue;
            };
            let mut decoded: Vec<(i64, i64, crate::model::Value)> =
                Vec::with_capacity(raw.n.max(0) as usize);
            Chunk {
                id,
                tagset_id: tagset,
                ts_min: raw.ts_min,
                ts_max: raw.ts_max,
                n: raw.n,
                bytes: raw.data.len() as i64,
                data: &raw.data,
            }
            .decode(self.db.path(), |ts, sid, v| decoded.push((ts, sid, v)))?;
            if decoded
                .iter()
                .any(|(_, sid, _)| !self.fields.contains_key(sid))
            {
                self.reload()?;
            }
            let mut cur: Option<Point> = None;
            for (ts, sid, v) in decoded {
                let name = self
                    .fields
                    .get(&sid)
                    .cloned()
                    .unwrap_or_else(|| format!("series_{sid}").into());
                match &mut cur {
                    Some(p) if p.ts == ts && !p.fields.iter().any(|(k, _)| *k == name) => {
                        p.fields.push((name, v))
                    }
                    _ => {
                        if let Some(p) = cur.take() {
                            out.points.push(p);
                        }
                        cur = Some(Point {
                            series: series.clone(),
                            ts,
                            fields: vec![(name, v)],
                        });
                    }
                }
            }
            if let Some(p) = cur {
                out.points.push(p);
            }
            if out.first == 0 {
                out.first = id;
            }
            out.last = id;
        }
        Ok(out)
    }

    /// Stored incident `id` with its snapshot (what the MQTT sink publishes beside the
    /// `edgewatch_incident` point that names it).
    pub fn incident(&self, id: i64) -> Result<Option<IncidentRow>, StoreError> {
        crate::store::incidents::get(self.db.conn(), self.db.path(), id)
    }

    /// Backlog after `cursor`: (points, chunks, ts_min of the oldest chunk). In rollup mode:
    /// (rows, buckets, the oldest bucket) of the final buckets not sent yet.
    pub fn backlog(&self, cursor: i64) -> Result<(i64, i64, Option<i64>), StoreError> {
        if let Some((tier_s, lateness_ns, _)) = self.feed.tier_rows() {
            let (conn, path) = (self.db.conn(), self.db.path());
            let state = tiers::state(conn, path, tier_s)?;
            let res_ns = tier_s.saturating_mul(1_000_000_000);
            return match super::rollup::final_through(state.watermark, lateness_ns, res_ns) {
                Some(through) if through > cursor => {
                    tiers::pending(conn, path, tier_s, cursor, through)
                }
                _ => Ok((0, 0, None)),
            };
        }
        let b = chunks::backlog(self.db.conn(), self.db.path(), cursor, i64::MAX)?;
        Ok((b.points, b.chunks, b.oldest_ts))
    }
}

/// Rollup rows standing in for evicted raw data, in the order they are sent.
#[derive(Debug, Default)]
pub struct RollupRows {
    /// One point per series, field and bucket.
    pub points: Vec<Point>,
    /// (bucket, series id) of each point: its place in the span.
    pub keys: Vec<(i64, i64)>,
}

/// How long an acknowledged batch's cursor move may wait in memory for the next batch's
/// in-flight mark to carry it (see [`Cursor::ack`]) before [`Cursor::settle`] commits it
/// alone: when the link goes quiet, how far behind the stored cursor may stay.
pub const ACK_DEFER: Duration = Duration::from_secs(30);

/// The sink's cursor row, through its own read-write connection.
///
/// An acknowledged batch's cursor move is not committed at once: it rides the next batch's
/// in-flight mark ([`Cursor::mark_inflight`]), one commit per batch instead of two. Each
/// commit of the sink's one-page row writes a WAL page: two a batch were 8 % of the bytes the
/// agent wrote on the reference device workload (docs/performance.md). What the store
/// holds is then at most one batch behind: a crash before the next batch's mark sends the
/// acknowledged batch once more (counted as replayed, with the same sequence number and
/// points), as a crash between send and acknowledgement always could. Reads through
/// [`Cursor::load`] see the move at once; [`Cursor::settle`] commits a move that waited
/// [`ACK_DEFER`], any other move of the row (dead letter, replay count, eviction-fallback
/// span) commits it first, and a clean stop (drop) commits it.
///
/// A raw-feed sink that has sent everything offers its place ([`Cursor::offer`]); the
/// writer's next commit may then carry that move and the next batch's mark in its own
/// transaction (`crate::store::ride`), and [`Cursor::mark_inflight`] of exactly that batch
/// commits nothing.
pub struct Cursor {
    conn: Connection,
    path: PathBuf,
    name: String,
    /// The acknowledgement held (shared with the writer's commits for a raw feed).
    rider: Arc<Rider>,
    /// The registry the rider joined (raw feed), kept alive with it.
    _riders: Option<Arc<Riders>>,
    /// The last commit that carried a move failed: acknowledgements commit at once (their
    /// error reaches the sink loop, which backs off) until one succeeds.
    failing: bool,
}

impl Cursor {
    /// Opens a read-write connection and makes sure the sink's row exists. If batches were in
    /// flight when the agent last stopped (raw, or parts of an eviction-fallback span),
    /// counts them as replayed (see [`sinks::open_row`]).
    pub fn open(dir: &Path, name: &str) -> Result<(Cursor, Durable), StoreError> {
        Self::open_feed(dir, name, Feed::Raw)
    }

    /// [`Cursor::open`] for a sink reading `feed`: records the mode in the sink's row (see
    /// [`sinks::set_mode`]); the cursor returned is the sink's place in that feed.
    pub fn open_feed(dir: &Path, name: &str, feed: Feed) -> Result<(Cursor, Durable), StoreError> {
        let (mut conn, path) = crate::store::open(dir, Mode::Cursor)?;
        let d = sinks::open_row_in(&mut conn, &path, name, feed.tier_s())?;
        let rider = Rider::new(name);
        let riders = (feed == Feed::Raw).then(|| {
            let r = Riders::of(&path);
            r.join(&rider);
            r
        });
        let c = Cursor {
            conn,
            path,
            name: name.to_string(),
            rider,
            _riders: riders,
            failing: false,
        };
        Ok((c, d))
    }

    /// Reads the row, with an acknowledgement not committed yet applied as its commit will.
    pub fn load(&self) -> Result<Durable, StoreError> {
        let st = self.rider.hold();
        let mut d = sinks::load(&self.conn, &self.path, &self.name)?;
        if let Some((a, _)) = &st.pending {
            d.cursor = d.cursor.max(a.through);
            d.seq = d.seq.max(a.seq);
            d.forwarded += a.points;
            d.last_success_ns = a.now_ns;
            d.forwarded_ts_max = d.forwarded_ts_max.max(a.ts_max);
        }
        Ok(d)
    }

    /// The sink has sent everything through chunk `after` and takes `max_points` points a
    /// batch: the writer's next commit may carry its held acknowledgement and mark its next
    /// batch (see [`Cursor`]). Any other move of the cursor withdraws the offer.
    pub fn offer(&self, after: i64, max_points: usize) {
        if self.failing {
            return;
        }
        self.rider.hold().offer(after, max_points);
    }

    /// Whether a writer's commit marked the batch after `after` through `through` in flight
    /// (the batch is then sent at once, as that commit already batched its points).
    pub fn is_carried(&self, after: i64, through: i64) -> bool {
        self.rider.hold().is_carried(after, through)
    }

    /// Records that batches through chunk `through` are being sent, with the cursor move of
    /// the batches acknowledged since the last commit: one small transaction, or none when a
    /// writer's commit marked exactly this batch already.
    pub fn mark_inflight(&mut self, through: i64) -> Result<(), StoreError> {
        let rider = self.rider.clone();
        let mut st = rider.hold();
        if st
            .carried()
            .is_some_and(|(after, _)| st.is_carried(after, through))
        {
            st.withdraw();
            return Ok(());
        }
        self.commit_held(&mut st, Some(through))
    }

    /// The remote end acknowledged everything through chunk `through` (batch `seq`, `points`
    /// points): moves the cursor. The move is held for the next [`Cursor::mark_inflight`]
    /// (see [`Cursor`]), unless the last commit failed: then it commits at once and its
    /// error is returned.
    pub fn ack(
        &mut self,
        through: i64,
        seq: i64,
        points: i64,
        ts_max: i64,
        now_ns: i64,
    ) -> Result<(), StoreError> {
        let a = Ack {
            through,
            seq,
            points,
            ts_max,
            now_ns,
        };
        let rider = self.rider.clone();
        let mut st = rider.hold();
        st.withdraw();
        st.pending = Some(match st.pending {
            None => (a, Instant::now()),
            Some((p, since)) => (
                Ack {
                    through: p.through.max(a.through),
                    seq: p.seq.max(a.seq),
                    points: p.points + a.points,
                    ts_max: p.ts_max.max(a.ts_max),
                    now_ns: a.now_ns,
                },
                since,
            ),
        });
        if self.failing {
            return self.flush_held(&mut st);
        }
        Ok(())
    }

    /// Commits an acknowledgement that has waited [`ACK_DEFER`] for a batch to carry it.
    /// The sink loops call it while they refresh their backlog figures.
    pub fn settle(&mut self) -> Result<(), StoreError> {
        self.settle_after(ACK_DEFER)
    }

    fn settle_after(&mut self, defer: Duration) -> Result<(), StoreError> {
        let rider = self.rider.clone();
        let mut st = rider.hold();
        match st.pending {
            Some((_, since)) if since.elapsed() >= defer => self.flush_held(&mut st),
            _ => Ok(()),
        }
    }

    /// Commits an acknowledgement held for the next batch, if any, now.
    pub fn flush(&mut self) -> Result<(), StoreError> {
        let rider = self.rider.clone();
        let mut st = rider.hold();
        self.flush_held(&mut st)
    }

    /// [`Cursor::flush`] with the state held: any move of the cursor's own withdraws an
    /// offer, so no commit of the writer carries what this one commits.
    fn flush_held(&mut self, st: &mut RideState) -> Result<(), StoreError> {
        self.commit_held(st, None)
    }

    /// Commits the acknowledgement held and, when given, `through` as the batch in flight,
    /// in one transaction (nothing to commit without either), after withdrawing any offer.
    fn commit_held(&mut self, st: &mut RideState, through: Option<i64>) -> Result<(), StoreError> {
        st.withdraw();
        let a = st.pending.map(|(a, _)| a);
        if a.is_none() && through.is_none() {
            return Ok(());
        }
        let r = sinks::ack_and_mark(&mut self.conn, &self.path, &self.name, a.as_ref(), through);
        self.committed(st, r)
    }

    /// After a commit that carried the held acknowledgement: drops it when stored, keeps it
    /// (and commits the next ones at once) when not.
    fn committed(
        &mut self,
        st: &mut RideState,
        r: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.failing = r.is_err();
        if r.is_ok() {
            st.pending = None;
        }
        r
    }

    /// The remote end refused `r` as bad data: keeps it in `dead_letters` and moves the
    /// cursor past it (unless `r.moves_cursor` is false: one part of a chunk being split),
    /// in one transaction. A refused batch of rollup points (`fallback`) is kept the same
    /// way, but the raw cursor stays where it is and the span moves on past it (as
    /// [`Cursor::fallback_ack`] records).
    pub fn dead_letter(&mut self, r: &Refused<'_>) -> Result<(), StoreError> {
        self.flush()?;
        sinks::dead_letter(&mut self.conn, &self.path, &self.name, r)
    }

    /// Dead-lettered batches of this sink.
    pub fn dead_letter_batches(&self) -> Result<i64, StoreError> {
        sinks::dead_letter_batches(&self.conn, &self.path, &self.name)
    }

    /// Counts a batch sent again after a fault.
    pub fn count_replay(&mut self) -> Result<(), StoreError> {
        self.flush()?;
        sinks::count_replay(&self.conn, &self.path, &self.name)
    }

    /// Rollup rows covering the raw span the sink lost to eviction: the buckets of tier
    /// `tier_s` from `from_ns` (inclusive) to `to_ns` (exclusive), after the row `after`
    /// (bucket, series id) when a span is resumed, ordered by bucket then series id, as
    /// points of measurement `<measurement>` with fields `<field>_mean`, `_min`, `_max`,
    /// `_count`, `_p50`, `_p90`, `_p99` (see [`super::rollup::row_point`]) and the tag
    /// `edgewatch_rollup=<tier>s`, so consumers can tell them from raw points.
    pub fn fallback_points(
        &self,
        tier_s: i64,
        from_ns: i64,
        to_ns: i64,
        after: Option<(i64, i64)>,
        identity: &[(String, String)],
    ) -> Result<RollupRows, StoreError> {
        let rows = tiers::named_rows(&self.conn, &self.path, tier_s, from_ns, to_ns, after, None)?;
        let ident = super::rollup::rollup_identity(identity, tier_s);
        let mut cache: HashMap<String, Arc<Series>> = HashMap::new();
        let mut out = RollupRows::default();
        for r in rows {
            let s = cache
                .entry(r.key.clone())
                .or_insert_with(|| Arc::new(series(&r.key, &ident)))
                .clone();
            out.points.push(super::rollup::row_point(&r, s));
            out.keys.push((r.bucket, r.series_id));
        }
        Ok(out)
    }

    /// Records that `inflight` batches of an eviction-fallback span are handed to the remote
    /// end and not acknowledged yet (one small write; counted as replayed at the next start
    /// if the agent stops before their acknowledgement).
    pub fn mark_fallback_inflight(&mut self, inflight: i64) -> Result<(), StoreError> {
        self.flush()?;
        sinks::mark_fallback_inflight(&self.conn, &self.path, &self.name, inflight)
    }

    /// A batch of rollup points sent in place of evicted raw data was acknowledged: records,
    /// in one transaction, its sequence number (MQTT consumers drop duplicates by it, so a
    /// number is never reused for other data), its points, and the place reached in the span
    /// (so a restart resumes after it and sends again at most the batches in flight), or,
    /// when it ends the span, that the eviction gap is covered. The raw cursor does not move:
    /// raw chunks that survived below the gap are still sent.
    pub fn fallback_ack(&mut self, seq: i64, p: &FallbackProgress) -> Result<(), StoreError> {
        self.flush()?;
        sinks::fallback_ack(&mut self.conn, &self.path, &self.name, seq, p)
    }
}

impl Drop for Cursor {
    /// A clean stop commits the acknowledgement held for the next batch, and takes back a
    /// mark a writer's commit made for a batch not sent yet (or the next start would count
    /// it as sent and replayed).
    fn drop(&mut self) {
        let rider = self.rider.clone();
        let mut st = rider.hold();
        if let Some((after, _)) = st.carried() {
            if self.commit_held(&mut st, Some(after)).is_err() {
                tracing::warn!(sink = %self.name, "cannot take back the mark of a batch not sent (counted as replayed at the next start)");
            }
        }
        if let Err(e) = self.flush_held(&mut st) {
            tracing::warn!(sink = %self.name, error = %e, "cannot persist the cursor at stop (its last batch will be sent again)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000_000_000;

    /// A migrated store with one tag set, two numeric series and five 1-minute buckets of
    /// each (10 rollup rows), and sink `s` that lost chunks through id 5 to eviction.
    fn store_with_an_eviction_gap() -> (tempfile::TempDir, Source, Cursor) {
        let dir = tempfile::tempdir().unwrap();
        drop(
            crate::store::Writer::open(dir.path(), 100, crate::config::Synchronous::Normal)
                .unwrap(),
        );
        let (cur, d) = Cursor::open(dir.path(), "s").unwrap();
        assert_eq!(d.fallback_pos, None);
        let (_, sids) = crate::store::testing::add_tagset(
            dir.path(),
            "m,k=v",
            "m",
            r#"{"k":"v"}"#,
            &["a", "b"],
        );
        assert_eq!(sids, [1, 2]);
        let (conn, path) = crate::store::open(dir.path(), Mode::Job).unwrap();
        let evicted = chunks::ChunkSize {
            id: 5,
            n: 600,
            bytes: 1,
        };
        sinks::record_eviction(&conn, &path, &[evicted]).unwrap();
        for b in 0..5 {
            for sid in [2, 1] {
                let acc = crate::store::bucket::Acc {
                    count: 60,
                    sum: 60.0,
                    min: 0.0,
                    max: 2.0,
                    first: (b * MIN, 0.0),
                    last: (b * MIN, 2.0),
                    ..Default::default()
                };
                tiers::put(&conn, &path, 60, i64::MIN, sid, b * MIN, &acc, false).unwrap();
            }
        }
        let src = Source::open(dir.path(), vec![("device_id".into(), "d".into())]).unwrap();
        (dir, src, cur)
    }

    /// The sink's stored row, read as another process would: (cursor, in flight, batch
    /// sequence, points forwarded).
    fn stored(dir: &Path) -> (i64, i64, i64, i64) {
        let (conn, _) = crate::store::open(dir, Mode::ReadOnly).unwrap();
        conn.query_row(
            "SELECT cursor_chunk_id, inflight_through_chunk_id, batch_seq, forwarded_points \
             FROM sinks WHERE name = 's'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap()
    }

    /// The agent dies with `cur` open (no clean stop): the next start's cursor and what it
    /// says, `(cursor, seq, replay_through, replayed)`.
    fn crash_and_reopen(dir: &Path, cur: Cursor) -> (Cursor, (i64, i64, i64, i64)) {
        std::mem::forget(cur);
        let (cur, d) = Cursor::open(dir, "s").unwrap();
        (cur, (d.cursor, d.seq, d.replay_through, d.replayed))
    }

    /// A batch a sink gives back unsent is not read again: the next read after the same
    /// cursor returns it extended by the chunks committed since, and only as far as
    /// `max_points` takes whole chunks. The proof it is not read again: its chunk is made
    /// undecodable in between, which a read from the store reports. A read with other
    /// arguments (another cursor, another size, a resend up to a chunk) reads the store.
    #[test]
    fn a_batch_given_back_is_extended_by_what_was_committed_since_not_read_again() {
        use crate::rollup::tests::write;
        let dir = tempfile::tempdir().unwrap();
        let mut w = crate::store::Writer::open(dir.path(), 100, crate::config::Synchronous::Normal)
            .unwrap();
        let pts = |from: i64, n: i64| -> Vec<(i64, f64)> {
            (from..from + n)
                .map(|i| (i * 1_000_000_000, i as f64))
                .collect()
        };
        write(&mut w, "m,s=a", &pts(1, 3));
        let mut src = Source::open(dir.path(), vec![]).unwrap();
        let first = src.read(0, 10).unwrap();
        assert_eq!(
            (first.first, first.last, first.points.len(), first.full),
            (1, 1, 3, false)
        );
        src.keep(0, 10, first);
        crate::store::testing::set_chunk_data(dir.path(), 1, b"not a chunk");
        write(&mut w, "m,s=a", &pts(4, 4));
        let grown = src.read(0, 10).unwrap();
        assert_eq!((grown.first, grown.last, grown.full), (1, 2, false));
        let ts: Vec<i64> = grown.points.iter().map(|p| p.ts / 1_000_000_000).collect();
        assert_eq!(ts, (1..=7).collect::<Vec<_>>());
        // The next chunk (5 points) does not fit beside 7 in 10: the batch is full as it is.
        src.keep(0, 10, grown);
        write(&mut w, "m,s=a", &pts(8, 5));
        let full = src.read(0, 10).unwrap();
        assert_eq!((full.last, full.points.len(), full.full), (2, 7, true));
        // Any other read goes to the store, and meets the damaged chunk.
        for (after, max, upto) in [(0, 20, i64::MAX), (0, 10, 2), (1, 10, i64::MAX)] {
            src.keep(
                0,
                10,
                Chunks {
                    first: 1,
                    last: 2,
                    points: full.points.clone(),
                    full: false,
                },
            );
            let fresh = src.read_upto(after, max, upto);
            if after == 0 {
                let e = fresh.err().unwrap();
                assert!(e.to_string().contains("chunk 1"), "{e}");
            } else {
                let c = fresh.unwrap();
                assert_eq!((c.first, c.last, c.points.len()), (2, 3, 9));
            }
        }
        // Given back and read once: the next read after the same cursor reads the store.
        src.keep(0, 10, full);
        src.read(0, 10).unwrap();
        assert!(src.read(0, 10).is_err());
    }

    /// A sink's cursor costs one commit per batch: each acknowledgement rides the next
    /// batch's in-flight mark. A crash meanwhile sends the acknowledged batch once more; a
    /// quiet link ([`ACK_DEFER`]), a clean stop or any other move of the row commits it; a
    /// failing store makes acknowledgements commit at once, so the loop sees the error.
    #[test]
    fn an_acknowledgement_rides_the_next_batchs_mark_and_is_never_lost() {
        use crate::store::testing::wal_frames;
        let dir = tempfile::tempdir().unwrap();
        drop(
            crate::store::Writer::open(dir.path(), 100, crate::config::Synchronous::Normal)
                .unwrap(),
        );
        let (mut cur, _) = Cursor::open(dir.path(), "s").unwrap();
        let before = wal_frames(dir.path());
        for i in 1..=10 {
            cur.mark_inflight(i * 10).unwrap();
            cur.ack(i * 10, i, 5, i * 100, i).unwrap();
        }
        assert_eq!(
            wal_frames(dir.path()) - before,
            10,
            "one one-page commit per batch (mark and ack were two)"
        );
        // The 9th acknowledgement went with the 10th mark; the 10th is held, and reads see it.
        assert_eq!(stored(dir.path()), (90, 100, 9, 45));
        let d = cur.load().unwrap();
        assert_eq!(
            (
                d.cursor,
                d.seq,
                d.forwarded,
                d.forwarded_ts_max,
                d.last_success_ns
            ),
            (100, 10, 50, 1000, 10)
        );
        // The agent dies here: the next start sends the 10th batch again, under its number.
        let (mut cur, replay) = crash_and_reopen(dir.path(), cur);
        assert_eq!(replay, (90, 9, 100, 1));
        cur.mark_inflight(100).unwrap();
        cur.ack(100, 10, 5, 1000, 11).unwrap();
        cur.ack(110, 11, 5, 1100, 12).unwrap();
        // A quiet link: held until ACK_DEFER, then committed alone.
        cur.settle().unwrap();
        assert_eq!(stored(dir.path()), (90, 100, 9, 45));
        cur.settle_after(Duration::ZERO).unwrap();
        assert_eq!(stored(dir.path()), (110, 100, 11, 55));
        // Another move of the row commits the held one first.
        cur.ack(120, 12, 5, 1200, 13).unwrap();
        cur.count_replay().unwrap();
        assert_eq!(stored(dir.path()), (120, 100, 12, 60));
        // A clean stop commits it.
        cur.ack(130, 13, 5, 1300, 14).unwrap();
        drop(cur);
        assert_eq!(stored(dir.path()), (130, 100, 13, 65));

        // A store that refuses writes: the mark fails and keeps the held move; the next
        // acknowledgement commits at once and returns the error; once the store takes
        // writes again everything held is stored, and moves are held again.
        let (mut cur, _) = Cursor::open(dir.path(), "s").unwrap();
        cur.ack(140, 14, 5, 1400, 15).unwrap();
        cur.conn.pragma_update(None, "query_only", true).unwrap();
        assert!(cur.mark_inflight(150).is_err());
        let err = cur.ack(150, 15, 5, 1500, 16).unwrap_err();
        assert!(err.to_string().contains("readonly"), "{err}");
        assert_eq!(stored(dir.path()), (130, 100, 13, 65));
        assert_eq!(cur.load().unwrap().forwarded, 75);
        cur.conn.pragma_update(None, "query_only", false).unwrap();
        cur.ack(160, 16, 5, 1600, 17).unwrap();
        assert_eq!(stored(dir.path()), (160, 100, 16, 80));
        cur.ack(170, 17, 5, 1700, 18).unwrap();
        assert_eq!(stored(dir.path()), (160, 100, 16, 80));
        assert_eq!(cur.load().unwrap().cursor, 170);
    }

    /// A caught-up sink's offer: the writer's next commit of chunks right after its place,
    /// within its batch size, carries the acknowledgement it holds and marks those chunks in
    /// flight in the writer's own transaction, and the sink's mark of that batch commits
    /// nothing. A batch over its size, a stale place or a move of its own leaves the mark to
    /// the sink as before; a clean stop takes back a mark not sent, and a crash after the
    /// send replays it under its number.
    ///
    /// An unsynced writer (`normal`) carries nothing: a sink's bookkeeping is always synced.
    #[test]
    fn a_caught_up_sinks_mark_and_acknowledgement_ride_the_writers_commit() {
        use crate::rollup::tests::write;
        use crate::store::testing::wal_frames;
        let dir = tempfile::tempdir().unwrap();
        let mut w =
            crate::store::Writer::open(dir.path(), 100, crate::config::Synchronous::Full).unwrap();
        let pts = |from: i64, n: i64| -> Vec<(i64, f64)> {
            (from..from + n)
                .map(|i| (i * 1_000_000_000, i as f64))
                .collect()
        };
        let mut chunk = 0;
        let mut next = |w: &mut crate::store::Writer, n: i64| {
            chunk += 1;
            write(w, "m,s=a", &pts(chunk * 10, n));
        };
        next(&mut w, 3);
        let (mut cur, _) = Cursor::open(dir.path(), "s").unwrap();
        let mut src = Source::open(dir.path(), vec![]).unwrap();
        // No offer yet: the sink marks chunk 1 itself; its acknowledgement is held.
        assert_eq!(src.read(0, 10).unwrap().last, 1);
        assert!(!cur.is_carried(0, 1));
        cur.mark_inflight(1).unwrap();
        cur.ack(1, 1, 3, 1, 1).unwrap();
        assert_eq!(stored(dir.path()), (0, 1, 0, 0));

        // Caught up: the next commit carries the held acknowledgement and marks chunk 2.
        assert_eq!(src.read(1, 10).unwrap().last, 0);
        cur.offer(1, 10);
        next(&mut w, 4);
        assert_eq!(stored(dir.path()), (1, 2, 1, 3), "in the writer's commit");
        let c = src.read(1, 10).unwrap();
        assert_eq!((c.first, c.last, c.points.len()), (2, 2, 4));
        assert!(cur.is_carried(1, 2));
        assert!(!cur.is_carried(1, 3), "only the batch it marked");
        let before = wal_frames(dir.path());
        cur.mark_inflight(2).unwrap();
        assert_eq!(wal_frames(dir.path()), before, "the sink commits nothing");
        cur.ack(2, 2, 4, 2, 2).unwrap();
        assert_eq!(cur.load().unwrap().forwarded, 7, "each batch counted once");

        // Over its batch size (5 points, 4 a batch): not carried.
        cur.offer(2, 4);
        next(&mut w, 5);
        assert_eq!(stored(dir.path()), (1, 2, 1, 3));
        assert!(!cur.is_carried(2, 3));
        // A stale place (chunk 3 came since): the commit of chunk 4 does not follow it.
        cur.offer(2, 10);
        next(&mut w, 1);
        assert_eq!(stored(dir.path()), (1, 2, 1, 3));
        assert!(!cur.is_carried(2, 4));
        cur.mark_inflight(4).unwrap();
        assert_eq!(
            stored(dir.path()),
            (2, 4, 2, 7),
            "the sink's own mark, as before"
        );
        cur.ack(4, 3, 6, 4, 3).unwrap();
        // A move of its own withdraws the offer.
        cur.offer(4, 10);
        cur.flush().unwrap();
        next(&mut w, 2);
        assert_eq!(stored(dir.path()), (4, 4, 3, 13));
        assert!(!cur.is_carried(4, 5));
        cur.mark_inflight(5).unwrap();
        cur.ack(5, 4, 2, 5, 4).unwrap();

        // Carried, then a clean stop before the send: the mark is taken back, and the next
        // start replays nothing (the acknowledgement it carried is kept).
        cur.offer(5, 10);
        next(&mut w, 1);
        assert_eq!(stored(dir.path()), (5, 6, 4, 15));
        drop(cur);
        let (mut cur, d) = Cursor::open(dir.path(), "s").unwrap();
        assert_eq!((d.cursor, d.seq, d.replayed, d.forwarded), (5, 4, 0, 15));
        // Chunk 6 was never sent: the sink sends it; then a batch carried and sent, and a
        // crash: the next start sends it again under its number.
        assert_eq!(src.read(5, 10).unwrap().last, 6);
        cur.mark_inflight(6).unwrap();
        cur.ack(6, 5, 1, 6, 5).unwrap();
        cur.offer(6, 10);
        next(&mut w, 1);
        assert!(cur.is_carried(6, 7));
        cur.mark_inflight(7).unwrap();
        let (mut cur, replay) = crash_and_reopen(dir.path(), cur);
        assert_eq!(replay, (6, 5, 7, 1));
        cur.mark_inflight(7).unwrap();
        cur.ack(7, 6, 1, 7, 6).unwrap();

        // An unsynced writer carries nothing.
        drop(w);
        let mut w = crate::store::Writer::open(dir.path(), 100, crate::config::Synchronous::Normal)
            .unwrap();
        cur.offer(7, 10);
        next(&mut w, 1);
        assert!(!cur.is_carried(7, 8));
        assert_eq!(stored(dir.path()), (6, 7, 5, 16));
    }

    fn ident() -> Vec<(String, String)> {
        vec![("device_id".into(), "d".into())]
    }

    #[test]
    fn a_fallback_span_resumes_after_its_last_acknowledged_batch() {
        let (dir, src, mut cur) = store_with_an_eviction_gap();
        let span = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        assert!(!span.resumed);
        assert_eq!(span.through, 5);
        let want: Vec<(i64, i64)> = (0..5).flat_map(|b| [(b * MIN, 1), (b * MIN, 2)]).collect();
        assert_eq!(span.rows.keys, want, "by bucket, then series");
        assert_eq!(span.rows.points.len(), 10);
        assert_eq!(span.rows.points[0].fields[0].0.as_ref(), "a_mean");
        // Three points acknowledged as batch 7, a fourth batch in flight, then a crash.
        let p = span.progress(0, 3, 1);
        assert_eq!(p.points, 3);
        let pos = FallbackPos {
            from: i64::MIN,
            row: (MIN, 1),
        };
        assert_eq!(p.reached, Some(pos));
        assert_eq!(p.done, None);
        cur.fallback_ack(7, &p).unwrap();
        cur.mark_fallback_inflight(1).unwrap();
        drop(cur);
        let (cur, d) = Cursor::open(dir.path(), "s").unwrap();
        assert_eq!(d.seq, 7);
        assert_eq!(d.fallback_points, 3);
        assert_eq!(d.fallback_pos, Some(pos));
        assert_eq!(d.replayed, 1, "the batch in flight is counted as replayed");
        assert_eq!(d.cursor, 0, "the raw cursor does not move");
        assert_eq!(d.fallback_through, 0, "the gap is not covered yet");
        // The rest, and only the rest.
        let rest = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        assert!(rest.resumed);
        assert_eq!(rest.rows.keys, want[3..].to_vec());
        drop(cur);
        // Counted once: a second start without a batch in flight adds nothing.
        let (mut cur, d) = Cursor::open(dir.path(), "s").unwrap();
        assert_eq!(d.replayed, 1);
        let p = rest.progress(0, 7, 0);
        assert_eq!(p.done, Some(5));
        cur.fallback_ack(8, &p).unwrap();
        let d = cur.load().unwrap();
        assert_eq!(
            (d.seq, d.fallback_points, d.fallback_through, d.fallback_pos),
            (8, 10, 5, None)
        );
        assert!(crate::forward::fallback_span(Some(60), &ident(), &src, &cur).is_none());
    }

    #[test]
    fn a_dead_lettered_fallback_batch_moves_the_span_on_in_the_same_transaction() {
        let (_dir, src, mut cur) = store_with_an_eviction_gap();
        let span = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        let p = span.progress(0, 4, 0);
        let r = Refused {
            first: 0,
            through: 5,
            moves_cursor: true,
            seq: 3,
            points: 4,
            status: 400,
            reason: "bad",
            payload: b"x",
            now_ns: 1,
            fallback: Some(&p),
        };
        cur.dead_letter(&r).unwrap();
        let d = cur.load().unwrap();
        assert_eq!(d.cursor, 0);
        assert_eq!((d.seq, d.dead_points, d.fallback_points), (3, 4, 4));
        assert_eq!(d.fallback_pos.map(|p| p.row), Some((MIN, 2)));
        let rest = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        assert_eq!(rest.rows.points.len(), 6);
    }

    #[test]
    fn a_place_recorded_in_another_span_is_ignored() {
        let (_dir, src, mut cur) = store_with_an_eviction_gap();
        let span = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        // Seven points acknowledged: the place is (3 min, series 1) in the span from MIN.
        cur.fallback_ack(1, &span.progress(0, 7, 0)).unwrap();
        let rest = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        assert_eq!(rest.rows.points.len(), 3);
        // Raw data acknowledged since moves the start of the span: a new span, sent whole.
        cur.ack(0, 1, 0, 2 * MIN + 5, 1).unwrap();
        let other = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        assert!(!other.resumed);
        assert_eq!(other.from, 2 * MIN);
        assert_eq!(other.rows.points.len(), 6);
    }

    /// A rollup-mode sink: whole final buckets in order, its own cursor (raw eviction and
    /// chunk merging ignore it), replays counted, its unsent rows counted when the tier
    /// evicts them, and a switch from raw mode starting at the newest bucket sent raw.
    #[test]
    fn a_rollup_feed_reads_final_buckets_whole_and_counts_evicted_rows() {
        let (dir, _src, mut raw) = store_with_an_eviction_gap();
        // Sink `s` (raw) sent a point at 2.5 min; the tier saw points up to 7 min.
        raw.ack(3, 1, 1, 2 * MIN + 30_000_000_000, 1).unwrap();
        drop(raw);
        let (conn, path) = crate::store::open(dir.path(), Mode::Job).unwrap();
        let state = tiers::State {
            cursor: 9,
            watermark: 7 * MIN,
            ..tiers::State::default()
        };
        tiers::put_state(&conn, &path, 60, &state).unwrap();
        let feed = Feed::Rollup {
            tier_s: 60,
            lateness_ns: 2 * MIN,
        };
        // Final: buckets ending by 5 min (0..=4 min): the five stored. A fresh sink reads
        // from the oldest row; 3 rows a batch = one whole bucket (2 rows) per batch.
        let mut src = Source::open_feed(dir.path(), ident(), feed).unwrap();
        let (mut cur, d) = Cursor::open_feed(dir.path(), "r", feed).unwrap();
        assert_eq!((d.cursor, d.rollup_tier), (i64::MIN, 60));
        assert_eq!(src.backlog(d.cursor).unwrap(), (10, 5, Some(0)));
        let c = src.read(d.cursor, 3).unwrap();
        assert_eq!((c.first, c.last, c.full, c.points.len()), (0, 0, true, 2));
        let p = &c.points[0];
        assert!(
            p.series.prefix.contains("edgewatch_rollup=60s"),
            "{}",
            p.series.prefix
        );
        assert_eq!(p.fields[0].0.as_ref(), "a_mean");
        let c = src.read(0, 100).unwrap();
        assert_eq!(
            (c.first, c.last, c.full, c.points.len()),
            (MIN, 4 * MIN, false, 8)
        );
        // A batch through 2 min in flight, then a crash: counted once; the cursor stays.
        cur.mark_inflight(2 * MIN).unwrap();
        cur.ack(MIN, 1, 4, MIN, 1).unwrap();
        drop(cur);
        let (mut cur, d) = Cursor::open_feed(dir.path(), "r", feed).unwrap();
        assert_eq!((d.cursor, d.replayed, d.forwarded), (MIN, 1, 4));
        assert_eq!(src.backlog(d.cursor).unwrap(), (6, 3, Some(2 * MIN)));
        // Raw eviction takes nothing from it; the tier's eviction of unsent rows is counted.
        let gone = chunks::ChunkSize {
            id: 7,
            n: 5,
            bytes: 1,
        };
        let lost = sinks::record_eviction(&conn, &path, &[gone]).unwrap();
        assert_eq!(
            lost.iter().map(|l| l.sink.as_str()).collect::<Vec<_>>(),
            ["s"]
        );
        tiers::delete_oldest(&conn, &path, 60, 2 * MIN, 100).unwrap();
        let d = cur.load().unwrap();
        assert_eq!(d.evicted_points, 2, "the 2 min rows were not sent");
        let c = src.read(d.cursor, 100).unwrap();
        assert_eq!(
            (c.first, c.last),
            (3 * MIN, 4 * MIN),
            "goes on with what is left"
        );
        cur.ack(c.last, 2, 4, c.last, 2).unwrap();
        assert_eq!(
            src.read(4 * MIN, 100).unwrap().last,
            0,
            "nothing final left"
        );
        // Sink `s` switched to rollup mode starts at the bucket of its newest raw point.
        let (_, d) = Cursor::open_feed(dir.path(), "s", feed).unwrap();
        assert_eq!(d.cursor, 2 * MIN - 1);
        assert_eq!(
            src.read(d.cursor, 100).unwrap().first,
            3 * MIN,
            "2 min is evicted"
        );
        // ... and back to raw: its raw cursor is where it was.
        let (_, d) = Cursor::open(dir.path(), "s").unwrap();
        assert_eq!((d.cursor, d.rollup_tier), (3, 0));
    }
}
