//! The `sinks`, `sink_fallback` and `dead_letters` tables: a forwarder's durable state
//! ([`Durable`]: cursor, batch sequence, totals, its place in an eviction-fallback span) and
//! its moves ([`ack`], [`dead_letter`], [`fallback_ack`], ...), each one statement or one
//! short `BEGIN IMMEDIATE` transaction on the forwarder's [`super::Mode::Cursor`] connection
//! (a batch's bookkeeping, its cursor move and its fallback progress commit together); and,
//! for the rollup job and the status page, which raw chunks each sink had not forwarded yet
//! when eviction took them ([`record_eviction`], inside the eviction's transaction, and
//! [`evictions`]). A sink in rollup mode (`rollup_tier > 0`, migration 0010) keeps its place
//! in that tier (`rollup_cursor_bucket`) through the same moves; raw eviction skips it and
//! tier eviction counts the rows it had not sent ([`record_rollup_eviction`]).
//!
//! Never decides when a cursor moves: the forwarder calls [`ack`] only after the remote end
//! acknowledged.

use std::path::Path;

use rusqlite::{params, Connection, TransactionBehavior};

use super::chunks::ChunkSize;
use super::open::Ctx;
use super::StoreError;

/// What eviction took from one sink before it forwarded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// Sink name.
    pub sink: String,
    /// Chunks.
    pub chunks: i64,
    /// Points.
    pub points: i64,
    /// Newest chunk id among them.
    pub through: i64,
}

/// Adds the chunks of `evicted` above each sink's cursor to that sink's eviction totals,
/// inside the eviction's transaction; returns what each sink lost (sinks that lost nothing
/// are left out).
pub fn record_eviction(
    tx: &Connection,
    path: &Path,
    evicted: &[ChunkSize],
) -> Result<Vec<Lost>, StoreError> {
    let cursors: Vec<(String, i64)> = tx
        // A rollup-mode sink (`rollup_tier > 0`) holds no raw chunks: raw eviction takes
        // nothing from it (its loss is counted by `record_rollup_eviction`).
        .prepare_cached("SELECT name, cursor_chunk_id FROM sinks WHERE rollup_tier = 0")
        .and_then(|mut st| {
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .and_then(|rows| rows.collect())
        })
        .ctx(path)?;
    let mut out = Vec::new();
    for (sink, cursor) in cursors {
        let lost: Vec<_> = evicted.iter().filter(|c| c.id > cursor).collect();
        if lost.is_empty() {
            continue;
        }
        let l = Lost {
            sink,
            chunks: lost.len() as i64,
            points: lost.iter().map(|c| c.n).sum(),
            through: lost.iter().map(|c| c.id).max().unwrap_or(0),
        };
        tx.prepare_cached(
            "UPDATE sinks SET evicted_unforwarded_chunks = evicted_unforwarded_chunks + ?2, \
             evicted_unforwarded_points = evicted_unforwarded_points + ?3, \
             evicted_through_chunk_id = MAX(evicted_through_chunk_id, ?4) WHERE name = ?1",
        )
        .and_then(|mut st| st.execute(params![l.sink, l.chunks, l.points, l.through]))
        .ctx(path)?;
        out.push(l);
    }
    Ok(out)
}

/// One sink's cursor and eviction totals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evictions {
    /// Sink name.
    pub name: String,
    /// Last chunk id the sink's remote end acknowledged.
    pub cursor: i64,
    /// Raw chunks evicted before the sink forwarded them, all time.
    pub chunks: i64,
    /// Their points.
    pub points: i64,
    /// Newest chunk id among them.
    pub through: i64,
}

/// Every sink's cursor and eviction totals, by name.
pub fn evictions(conn: &Connection, path: &Path) -> Result<Vec<Evictions>, StoreError> {
    let mut st = conn
        .prepare_cached(
            "SELECT name, cursor_chunk_id, evicted_unforwarded_chunks, evicted_unforwarded_points, \
             evicted_through_chunk_id FROM sinks ORDER BY name",
        )
        .ctx(path)?;
    st.query_map([], |r| {
        Ok(Evictions {
            name: r.get(0)?,
            cursor: r.get(1)?,
            chunks: r.get(2)?,
            points: r.get(3)?,
            through: r.get(4)?,
        })
    })
    .and_then(|rows| rows.collect())
    .ctx(path)
}

/// Creates sink `name`'s row if it does not exist yet (cursor 0).
pub fn ensure(conn: &Connection, path: &Path, name: &str) -> Result<(), StoreError> {
    conn.execute(
        "INSERT OR IGNORE INTO sinks (name) VALUES (?1)",
        params![name],
    )
    .map(|_| ())
    .ctx(path)
}

/// Records which feed sink `name` forwards: rollup tier `tier` (its resolution in seconds),
/// or raw chunks (0). A sink entering rollup mode starts at the bucket holding the newest
/// point it acknowledged before (that bucket is sent whole: overlap rather than a hole, as
/// the eviction fallback does), or at the oldest row for a sink that never sent anything;
/// a sink already in rollup mode (on any tier) keeps its place in time. Its raw cursor is
/// kept as it is: a sink switched back to raw resumes raw forwarding where it stopped.
pub fn set_mode(conn: &Connection, path: &Path, name: &str, tier: i64) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE sinks SET rollup_cursor_bucket = CASE \
           WHEN ?2 > 0 AND (rollup_tier = 0 OR rollup_cursor_bucket IS NULL) THEN \
             CASE WHEN forwarded_ts_max > 0 \
               THEN forwarded_ts_max - (forwarded_ts_max % (?2 * 1000000000)) - 1 \
               ELSE -9223372036854775808 END \
           ELSE rollup_cursor_bucket END, \
         rollup_tier = ?2 WHERE name = ?1",
        params![name, tier],
    )
    .map(|_| ())
    .ctx(path)
}

/// Retention or the disk budget is about to delete the rows of tier `tier` with
/// `bucket <= upto`: counts, for every sink forwarding that tier, the rows among them it has
/// not sent yet (`rollup_evicted_rows`, shown as `evicted_unforwarded_points`), inside the
/// eviction's transaction. The sink's reads skip the gap on their own (they read the next
/// bucket that exists).
pub fn record_rollup_eviction(
    tx: &Connection,
    path: &Path,
    tier: i64,
    upto: i64,
) -> Result<(), StoreError> {
    tx.prepare_cached(
        "UPDATE sinks SET rollup_evicted_rows = rollup_evicted_rows + \
           (SELECT COUNT(*) FROM rollups r WHERE r.tier = ?1 \
            AND r.bucket > COALESCE(sinks.rollup_cursor_bucket, -9223372036854775808) \
            AND r.bucket <= ?2) + \
           (SELECT COUNT(*) FROM rollups_recent r WHERE r.tier = ?1 \
            AND r.bucket > COALESCE(sinks.rollup_cursor_bucket, -9223372036854775808) \
            AND r.bucket <= ?2) \
         WHERE rollup_tier = ?1 \
         AND COALESCE(rollup_cursor_bucket, -9223372036854775808) < ?2",
    )
    .and_then(|mut st| st.execute(params![tier, upto]))
    .map(|_| ())
    .ctx(path)
}

/// Creates sink `name`'s row if needed and counts as replayed what was in flight when the
/// agent last stopped: a raw batch (`inflight_through_chunk_id` above the cursor) and the
/// batches of an eviction-fallback span (`sink_fallback.inflight`), in one `BEGIN IMMEDIATE`
/// transaction; returns the row.
pub fn open_row(conn: &mut Connection, path: &Path, name: &str) -> Result<Durable, StoreError> {
    open_row_in(conn, path, name, 0)
}

/// [`open_row`] for a sink that forwards rollup tier `tier` (resolution in seconds; 0 = raw
/// chunks): records the mode first (see [`set_mode`]), so the sink's cursor in the returned
/// row is its place in that feed.
pub fn open_row_in(
    conn: &mut Connection,
    path: &Path,
    name: &str,
    tier: i64,
) -> Result<Durable, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(path)?;
    ensure(&tx, path, name)?;
    set_mode(&tx, path, name, tier)?;
    let replay_through: i64 = tx
        .query_row(
            "SELECT CASE WHEN rollup_tier = 0 AND inflight_through_chunk_id > cursor_chunk_id \
               THEN inflight_through_chunk_id \
             WHEN rollup_tier > 0 AND rollup_inflight_bucket > rollup_cursor_bucket \
               THEN rollup_inflight_bucket ELSE 0 END FROM sinks WHERE name = ?1",
            params![name],
            |r| r.get(0),
        )
        .ctx(path)?;
    tx.execute(
        "UPDATE sinks SET replayed_batches = replayed_batches + 1, inflight_through_chunk_id = 0 \
         WHERE name = ?1 AND rollup_tier = 0 AND inflight_through_chunk_id > cursor_chunk_id",
        params![name],
    )
    .ctx(path)?;
    tx.execute(
        "UPDATE sinks SET replayed_batches = replayed_batches + 1, rollup_inflight_bucket = NULL \
         WHERE name = ?1 AND rollup_tier > 0 AND rollup_inflight_bucket > rollup_cursor_bucket",
        params![name],
    )
    .ctx(path)?;
    tx.execute(
        "UPDATE sinks SET replayed_batches = replayed_batches + \
         (SELECT inflight FROM sink_fallback WHERE sink = ?1) \
         WHERE name = ?1 AND (SELECT inflight FROM sink_fallback WHERE sink = ?1) > 0",
        params![name],
    )
    .ctx(path)?;
    tx.execute(
        "UPDATE sink_fallback SET inflight = 0 WHERE sink = ?1",
        params![name],
    )
    .ctx(path)?;
    tx.commit().ctx(path)?;
    let mut d = load(conn, path, name)?;
    d.replay_through = replay_through;
    Ok(d)
}

/// A sink's durable state as stored in `sinks` (and `sink_fallback`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Durable {
    /// Last chunk id acknowledged.
    pub cursor: i64,
    /// Last batch sequence number acknowledged.
    pub seq: i64,
    /// Points acknowledged, all time.
    pub forwarded: i64,
    /// Points dead-lettered, all time.
    pub dead_points: i64,
    /// Batches sent again after a fault, all time.
    pub replayed: i64,
    /// Raw points evicted before this sink forwarded them.
    pub evicted_points: i64,
    /// Newest chunk id evicted before forwarding.
    pub evicted_through: i64,
    /// Points sent from the rollup tier in place of evicted raw data.
    pub fallback_points: i64,
    /// Highest chunk id whose eviction gap was covered from the rollup tier.
    pub fallback_through: i64,
    /// Last acknowledgement time, ns (0 = never).
    pub last_success_ns: i64,
    /// Newest point time acknowledged.
    pub forwarded_ts_max: i64,
    /// While an eviction-fallback span is being sent: how far it got; `None` before the
    /// first acknowledgement or when no span is in progress.
    pub fallback_pos: Option<FallbackPos>,
    /// The rollup tier the sink forwards (resolution in seconds), 0 for raw chunks. In
    /// rollup mode `cursor` is the start (ns) of the last bucket acknowledged and
    /// `evicted_points` counts the tier's rows evicted before they were sent.
    pub rollup_tier: i64,
    /// Set by [`open_row`] only: the last chunk id (rollup: bucket) of the batch that was in
    /// flight when the agent last stopped, 0 when none: it is sent again with exactly that
    /// content.
    pub replay_through: i64,
}

/// The place reached in an eviction-fallback span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackPos {
    /// Where the span starts (ns): it names the span.
    pub from: i64,
    /// The last rollup row acknowledged (bucket, series id), in the order the span is sent.
    pub row: (i64, i64),
}

/// One acknowledged (or dead-lettered) batch of an eviction-fallback span, as recorded by
/// [`fallback_ack`] (or [`dead_letter`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FallbackProgress {
    /// Rollup points in the batch.
    pub points: i64,
    /// The last rollup row of the batch and its span: where the span resumes after a
    /// restart. `None` for an empty span.
    pub reached: Option<FallbackPos>,
    /// Batches of the span still in flight after this one.
    pub inflight: i64,
    /// `Some(through)` when this batch ends the span: the eviction gap through chunk
    /// `through` is covered.
    pub done: Option<i64>,
}

/// Sink `name`'s row, with its place in an eviction-fallback span if one is in progress.
pub fn load(conn: &Connection, path: &Path, name: &str) -> Result<Durable, StoreError> {
    conn.prepare_cached(
        "SELECT CASE WHEN s.rollup_tier > 0 \
           THEN COALESCE(s.rollup_cursor_bucket, -9223372036854775808) ELSE s.cursor_chunk_id END, \
         s.batch_seq, s.forwarded_points, s.dead_letter_points, s.replayed_batches, \
         CASE WHEN s.rollup_tier > 0 THEN s.rollup_evicted_rows ELSE s.evicted_unforwarded_points END, \
         s.evicted_through_chunk_id, \
         s.fallback_points, s.fallback_through_chunk_id, s.last_success_ns, s.forwarded_ts_max, \
         f.span_from, f.bucket, f.series_id, s.rollup_tier FROM sinks s \
         LEFT JOIN sink_fallback f ON f.sink = s.name \
         WHERE s.name = ?1",
    )
    .and_then(|mut st| {
        st.query_row(params![name], |r| {
            Ok(Durable {
                cursor: r.get(0)?,
                seq: r.get(1)?,
                forwarded: r.get(2)?,
                dead_points: r.get(3)?,
                replayed: r.get(4)?,
                evicted_points: r.get(5)?,
                evicted_through: r.get(6)?,
                fallback_points: r.get(7)?,
                fallback_through: r.get(8)?,
                last_success_ns: r.get(9)?,
                forwarded_ts_max: r.get(10)?,
                fallback_pos: match (r.get(11)?, r.get(12)?, r.get(13)?) {
                    (Some(from), Some(b), Some(s)) => Some(FallbackPos { from, row: (b, s) }),
                    _ => None,
                },
                rollup_tier: r.get(14)?,
                replay_through: 0,
            })
        })
    })
    .ctx(path)
}

/// Records that batches through chunk `through` (rollup mode: bucket `through`) are being
/// sent (one small write).
pub fn mark_inflight(
    conn: &Connection,
    path: &Path,
    name: &str,
    through: i64,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE sinks SET \
         inflight_through_chunk_id = CASE WHEN rollup_tier > 0 THEN inflight_through_chunk_id ELSE ?2 END, \
         rollup_inflight_bucket = CASE WHEN rollup_tier > 0 THEN ?2 ELSE rollup_inflight_bucket END \
         WHERE name = ?1",
    )
    .and_then(|mut st| st.execute(params![name, through]))
    .map(|_| ())
    .ctx(path)
}

/// An acknowledged batch: what moves with the cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// Last chunk id of the batch.
    pub through: i64,
    /// Its sequence number.
    pub seq: i64,
    /// Its points.
    pub points: i64,
    /// Its newest point time.
    pub ts_max: i64,
    /// When it was acknowledged, ns.
    pub now_ns: i64,
}

/// The remote end acknowledged everything through chunk `a.through` (rollup mode: every row
/// of the buckets through `a.through`): moves the cursor (when `a` is given), and records
/// the next batch as in flight ([`mark_inflight`], when `through` is given), in one short
/// transaction: an acknowledged batch's cursor move riding the next batch's mark, one
/// commit where there were two.
pub fn ack_and_mark(
    conn: &mut Connection,
    path: &Path,
    name: &str,
    a: Option<&Ack>,
    through: Option<i64>,
) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(path)?;
    ack_and_mark_in(&tx, path, name, a, through)?;
    tx.commit().ctx(path)
}

/// [`ack_and_mark`]'s statements in a transaction of the caller's (a writer's commit
/// carrying the sink's move: `super::ride`).
pub fn ack_and_mark_in(
    tx: &Connection,
    path: &Path,
    name: &str,
    a: Option<&Ack>,
    through: Option<i64>,
) -> Result<(), StoreError> {
    if let Some(a) = a {
        tx.prepare_cached(
            "UPDATE sinks SET \
             cursor_chunk_id = CASE WHEN rollup_tier > 0 THEN cursor_chunk_id ELSE MAX(cursor_chunk_id, ?2) END, \
             rollup_cursor_bucket = CASE WHEN rollup_tier > 0 THEN MAX(rollup_cursor_bucket, ?2) ELSE rollup_cursor_bucket END, \
             batch_seq = MAX(batch_seq, ?3), \
             forwarded_points = forwarded_points + ?4, last_success_ns = ?5, \
             forwarded_ts_max = MAX(forwarded_ts_max, ?6) WHERE name = ?1",
        )
        .and_then(|mut st| st.execute(params![name, a.through, a.seq, a.points, a.now_ns, a.ts_max]))
        .ctx(path)?;
    }
    if let Some(through) = through {
        mark_inflight(tx, path, name, through)?;
    }
    Ok(())
}

/// A batch the remote end refused as bad data.
#[derive(Debug, Clone, Copy)]
pub struct Refused<'a> {
    /// First chunk id of the batch.
    pub first: i64,
    /// Last chunk id of the batch.
    pub through: i64,
    /// Whether the cursor moves past `through` (false: one part of a chunk being split).
    pub moves_cursor: bool,
    /// Its sequence number.
    pub seq: i64,
    /// Its points.
    pub points: i64,
    /// The HTTP status.
    pub status: u16,
    /// The server's answer.
    pub reason: &'a str,
    /// The batch as sent, before compression.
    pub payload: &'a [u8],
    /// When, ns.
    pub now_ns: i64,
    /// A batch of rollup points sent for evicted raw data: the raw cursor stays, and the
    /// span moves on past it (as [`fallback_ack`] records).
    pub fallback: Option<&'a FallbackProgress>,
}

/// Keeps a refused batch in `dead_letters` and moves the cursor past it (or, for a fallback
/// batch, the span), in one `BEGIN IMMEDIATE` transaction.
pub fn dead_letter(
    conn: &mut Connection,
    path: &Path,
    name: &str,
    d: &Refused<'_>,
) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(path)?;
    tx.execute(
        "INSERT INTO dead_letters (sink, first_chunk_id, last_chunk_id, points, status, reason, created_ns, payload) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![name, d.first, d.through, d.points, d.status, d.reason, d.now_ns, d.payload],
    )
    .ctx(path)?;
    tx.execute(
        "UPDATE sinks SET \
         cursor_chunk_id = CASE WHEN rollup_tier > 0 THEN cursor_chunk_id ELSE MAX(cursor_chunk_id, ?2) END, \
         rollup_cursor_bucket = CASE WHEN rollup_tier > 0 AND ?5 THEN MAX(rollup_cursor_bucket, ?2) \
           ELSE rollup_cursor_bucket END, \
         batch_seq = MAX(batch_seq, ?3), \
         dead_letter_points = dead_letter_points + ?4 WHERE name = ?1",
        params![
            name,
            if d.fallback.is_some() || !d.moves_cursor { 0 } else { d.through },
            d.seq,
            d.points,
            d.fallback.is_none()
        ],
    )
    .ctx(path)?;
    if let Some(p) = d.fallback {
        record_fallback(&tx, path, name, d.seq, p)?;
    }
    tx.commit().ctx(path)
}

/// Dead-lettered batches of sink `name`.
pub fn dead_letter_batches(conn: &Connection, path: &Path, name: &str) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT COUNT(*) FROM dead_letters WHERE sink = ?1")
        .and_then(|mut st| st.query_row(params![name], |r| r.get(0)))
        .ctx(path)
}

/// Counts a batch sent again after a fault.
pub fn count_replay(conn: &Connection, path: &Path, name: &str) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE sinks SET replayed_batches = replayed_batches + 1 WHERE name = ?1",
        params![name],
    )
    .map(|_| ())
    .ctx(path)
}

/// Records that `inflight` batches of an eviction-fallback span are handed to the remote end
/// and not acknowledged yet (one small write; [`open_row`] counts them as replayed if the
/// agent stops before their acknowledgement).
pub fn mark_fallback_inflight(
    conn: &Connection,
    path: &Path,
    name: &str,
    inflight: i64,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO sink_fallback (sink, inflight) VALUES (?1, ?2) \
         ON CONFLICT (sink) DO UPDATE SET inflight = excluded.inflight",
        params![name, inflight],
    )
    .map(|_| ())
    .ctx(path)
}

/// A batch of rollup points sent in place of evicted raw data was acknowledged: records, in
/// one `BEGIN IMMEDIATE` transaction, its sequence number, its points, and the place reached
/// in the span or, when it ends the span (`p.done`), that the eviction gap is covered. The
/// raw cursor stays.
pub fn fallback_ack(
    conn: &mut Connection,
    path: &Path,
    name: &str,
    seq: i64,
    p: &FallbackProgress,
) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(path)?;
    record_fallback(&tx, path, name, seq, p)?;
    tx.commit().ctx(path)
}

/// Records `p` for sink `name` inside the caller's transaction: the batch's sequence number,
/// its points, and either the place reached in the span or, when it ends the span, that the
/// gap is covered (the span's row goes).
fn record_fallback(
    tx: &Connection,
    path: &Path,
    name: &str,
    seq: i64,
    p: &FallbackProgress,
) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE sinks SET batch_seq = MAX(batch_seq, ?2), \
         fallback_through_chunk_id = MAX(fallback_through_chunk_id, ?3), \
         fallback_points = fallback_points + ?4 WHERE name = ?1",
        params![name, seq, p.done.unwrap_or(0), p.points],
    )
    .ctx(path)?;
    if p.done.is_some() {
        tx.execute("DELETE FROM sink_fallback WHERE sink = ?1", params![name])
            .ctx(path)?;
    } else {
        let from = p.reached.map(|r| r.from);
        let (bucket, series) = p.reached.map(|r| r.row).unzip();
        tx.execute(
            "INSERT INTO sink_fallback (sink, span_from, bucket, series_id, inflight) \
             VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (sink) DO UPDATE SET span_from = COALESCE(excluded.span_from, span_from), \
             bucket = COALESCE(excluded.bucket, bucket), \
             series_id = COALESCE(excluded.series_id, series_id), inflight = excluded.inflight",
            params![name, from, bucket, series, p.inflight],
        )
        .ctx(path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;
    use crate::store::{open, Mode, Writer};

    /// The forwarder's moves, through the functions the forwarder calls: the cursor only
    /// moves forward, a replay left in flight (raw or fallback) is counted once at open, a
    /// dead letter keeps the batch and moves the cursor (a fallback batch: the span).
    #[test]
    fn a_sink_row_moves_forward_only_and_counts_replays_and_dead_letters() {
        let dir = tempfile::tempdir().unwrap();
        drop(Writer::open(dir.path(), 10, Synchronous::Normal).unwrap());
        let (mut c, path) = open(dir.path(), Mode::Cursor).unwrap();
        assert_eq!(open_row(&mut c, &path, "s").unwrap(), Durable::default());
        mark_inflight(&c, &path, "s", 9).unwrap();
        let a = Ack {
            through: 5,
            seq: 2,
            points: 10,
            ts_max: 77,
            now_ns: 1,
        };
        ack_and_mark(&mut c, &path, "s", Some(&a), None).unwrap();
        let older = Ack {
            through: 3,
            seq: 1,
            ..a
        };
        ack_and_mark(&mut c, &path, "s", Some(&older), None).unwrap();
        let d = load(&c, &path, "s").unwrap();
        assert_eq!(
            (d.cursor, d.seq, d.forwarded, d.forwarded_ts_max),
            (5, 2, 20, 77)
        );
        // Reopened with chunks through 9 in flight: one replay, counted once.
        assert_eq!(open_row(&mut c, &path, "s").unwrap().replayed, 1);
        assert_eq!(open_row(&mut c, &path, "s").unwrap().replayed, 1);
        let r = Refused {
            first: 6,
            through: 8,
            moves_cursor: true,
            seq: 3,
            points: 4,
            status: 400,
            reason: "bad",
            payload: b"x",
            now_ns: 2,
            fallback: None,
        };
        dead_letter(&mut c, &path, "s", &r).unwrap();
        let pos = FallbackPos {
            from: 60,
            row: (120, 3),
        };
        let part = FallbackProgress {
            points: 4,
            reached: Some(pos),
            inflight: 2,
            done: None,
        };
        dead_letter(
            &mut c,
            &path,
            "s",
            &Refused {
                through: 99,
                fallback: Some(&part),
                ..r
            },
        )
        .unwrap();
        let d = load(&c, &path, "s").unwrap();
        assert_eq!((d.cursor, d.dead_points), (8, 8));
        assert_eq!((d.fallback_points, d.fallback_pos), (4, Some(pos)));
        assert_eq!(dead_letter_batches(&c, &path, "s").unwrap(), 2);
        // Two fallback batches were in flight at the stop: both counted, once.
        assert_eq!(open_row(&mut c, &path, "s").unwrap().replayed, 3);
        mark_fallback_inflight(&c, &path, "s", 0).unwrap();
        assert_eq!(open_row(&mut c, &path, "s").unwrap().replayed, 3);
        let end = FallbackProgress {
            points: 26,
            reached: None,
            inflight: 0,
            done: Some(12),
        };
        fallback_ack(&mut c, &path, "s", 4, &end).unwrap();
        count_replay(&c, &path, "s").unwrap();
        let d = load(&c, &path, "s").unwrap();
        assert_eq!(
            (d.seq, d.fallback_through, d.fallback_points, d.replayed),
            (4, 12, 30, 4)
        );
        assert_eq!(d.fallback_pos, None, "a covered gap leaves no place behind");
    }
}
