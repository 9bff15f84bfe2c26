//! The forwarder's side of the store: a read-only connection that reads raw chunks after a
//! cursor and decodes them into [`Point`]s, and a small read-write connection that moves a
//! sink's cursor (and records dead letters, and its progress through an eviction-fallback
//! span) in short `BEGIN IMMEDIATE` transactions, with a busy timeout, beside the ingest
//! writer and the rollup job. It never reads the ingest queue.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::encode::{series, Point, Series};
use crate::store::{codec, db_path, StoreError};

fn sq(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |source| StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    }
}

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

/// Reads raw chunks in id order.
pub struct Source {
    conn: Connection,
    path: PathBuf,
    identity: Vec<(String, String)>,
    tagsets: HashMap<i64, Arc<Series>>,
    fields: HashMap<i64, Arc<str>>,
}

impl Source {
    /// Opens `dir`'s store read-only; `identity` tags are added to every point.
    pub fn open(dir: &Path, identity: Vec<(String, String)>) -> Result<Source, StoreError> {
        // The store's own read-only handle: same flags, cache and schema-version check.
        let crate::store::Reader { conn, path } = crate::store::Reader::open(dir)?;
        Ok(Source {
            conn,
            path,
            identity,
            tagsets: HashMap::new(),
            fields: HashMap::new(),
        })
    }

    fn reload(&mut self) -> Result<(), StoreError> {
        let e = sq(&self.path);
        let mut st = self
            .conn
            .prepare_cached("SELECT id, key FROM tagsets")
            .map_err(&e)?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
            .map_err(&e)?;
        for row in rows {
            let (id, key) = row.map_err(&e)?;
            self.tagsets
                .entry(id)
                .or_insert_with(|| Arc::new(series(&key, &self.identity)));
        }
        let mut st = self
            .conn
            .prepare_cached("SELECT id, field FROM series")
            .map_err(&e)?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
            .map_err(&e)?;
        for row in rows {
            let (id, f) = row.map_err(&e)?;
            self.fields.entry(id).or_insert_with(|| f.into());
        }
        Ok(())
    }

    /// Reads whole chunks with id > `after`, oldest first, until `max_points` points (at
    /// least one chunk).
    pub fn read(&mut self, after: i64, max_points: usize) -> Result<Chunks, StoreError> {
        let mut rows: Vec<(i64, i64, i64, i64, Vec<u8>)> = Vec::new();
        let mut full = false;
        {
            let e = sq(&self.path);
            // Chunks stamped by a clock that is not set yet wait (see crate::clock).
            let hold = crate::clock::hold_from(&self.conn)
                .map_err(&e)?
                .unwrap_or(i64::MAX);
            let mut st = self
                .conn
                .prepare_cached(
                    "SELECT id, tagset_id, ts_min, n, data FROM chunks WHERE id > ?1 AND id < ?3 ORDER BY id LIMIT ?2",
                )
                .map_err(&e)?;
            let mut q = st
                .query(params![after, max_points.clamp(1, 100_000) as i64, hold])
                .map_err(&e)?;
            let mut points = 0usize;
            while let Some(r) = q.next().map_err(&e)? {
                let n: i64 = r.get(3).map_err(&e)?;
                if !rows.is_empty() && points + n.max(0) as usize > max_points {
                    full = true;
                    break;
                }
                points += n.max(0) as usize;
                rows.push((
                    r.get(0).map_err(&e)?,
                    r.get(1).map_err(&e)?,
                    r.get(2).map_err(&e)?,
                    n,
                    r.get(4).map_err(&e)?,
                ));
                if points >= max_points {
                    full = true;
                    break;
                }
            }
        }
        let mut out = Chunks {
            full,
            ..Chunks::default()
        };
        for (id, tagset, ts_min, n, data) in rows {
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
                Vec::with_capacity(n.max(0) as usize);
            codec::decode_chunk(&data, ts_min, |ts, sid, v| decoded.push((ts, sid, v))).map_err(
                |source| StoreError::Corrupt {
                    path: self.path.clone(),
                    source,
                },
            )?;
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

    /// Backlog after `cursor`: (points, chunks, ts_min of the oldest chunk).
    pub fn backlog(&self, cursor: i64) -> Result<(i64, i64, Option<i64>), StoreError> {
        let e = sq(&self.path);
        let (points, chunks): (i64, i64) = self
            .conn
            .query_row(
                "SELECT COALESCE(SUM(n), 0), COUNT(*) FROM chunks WHERE id > ?1",
                params![cursor],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(&e)?;
        let oldest: Option<i64> = self
            .conn
            .query_row(
                "SELECT ts_min FROM chunks WHERE id > ?1 ORDER BY id LIMIT 1",
                params![cursor],
                |r| r.get(0),
            )
            .optional()
            .map_err(&e)?;
        Ok((points, chunks, oldest))
    }
}

/// A sink's durable state as stored in `sinks`.
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
/// [`Cursor::fallback_ack`].
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

/// Rollup rows standing in for evicted raw data, in the order they are sent.
#[derive(Debug, Default)]
pub struct RollupRows {
    /// One point per series, field and bucket.
    pub points: Vec<Point>,
    /// (bucket, series id) of each point: its place in the span.
    pub keys: Vec<(i64, i64)>,
}

/// Records `p` for sink `name` inside `tx`: the batch's sequence number, its points, and
/// either the place reached in the span or, when it ends the span, that the gap is covered.
fn record_fallback(
    tx: &rusqlite::Transaction<'_>,
    name: &str,
    seq: i64,
    p: &FallbackProgress,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE sinks SET batch_seq = MAX(batch_seq, ?2), \
         fallback_through_chunk_id = MAX(fallback_through_chunk_id, ?3), \
         fallback_points = fallback_points + ?4 WHERE name = ?1",
        params![name, seq, p.done.unwrap_or(0), p.points],
    )?;
    if p.done.is_some() {
        tx.execute("DELETE FROM sink_fallback WHERE sink = ?1", params![name])?;
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
        )?;
    }
    Ok(())
}

/// The sink's cursor row, through its own read-write connection.
pub struct Cursor {
    conn: Connection,
    path: PathBuf,
    name: String,
}

impl Cursor {
    /// Opens a read-write connection and makes sure the sink's row exists. If batches were in
    /// flight when the agent last stopped (raw, or parts of an eviction-fallback span),
    /// counts them as replayed.
    pub fn open(dir: &Path, name: &str) -> Result<(Cursor, Durable), StoreError> {
        let path = db_path(dir);
        let p2 = path.clone();
        let e = sq(&p2);
        let mut conn = Connection::open(&path).map_err(&e)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(&e)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(&e)?;
        conn.pragma_update(None, "cache_size", -256).map_err(&e)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&e)?;
        tx.execute(
            "INSERT OR IGNORE INTO sinks (name) VALUES (?1)",
            params![name],
        )
        .map_err(&e)?;
        tx.execute(
            "UPDATE sinks SET replayed_batches = replayed_batches + 1, inflight_through_chunk_id = 0 \
             WHERE name = ?1 AND inflight_through_chunk_id > cursor_chunk_id",
            params![name],
        )
        .map_err(&e)?;
        tx.execute(
            "UPDATE sinks SET replayed_batches = replayed_batches + \
             (SELECT inflight FROM sink_fallback WHERE sink = ?1) \
             WHERE name = ?1 AND (SELECT inflight FROM sink_fallback WHERE sink = ?1) > 0",
            params![name],
        )
        .map_err(&e)?;
        tx.execute(
            "UPDATE sink_fallback SET inflight = 0 WHERE sink = ?1",
            params![name],
        )
        .map_err(&e)?;
        tx.commit().map_err(&e)?;
        let c = Cursor {
            conn,
            path: path.clone(),
            name: name.to_string(),
        };
        let d = c.load()?;
        Ok((c, d))
    }

    /// Reads the row.
    pub fn load(&self) -> Result<Durable, StoreError> {
        self.conn
            .query_row(
                "SELECT s.cursor_chunk_id, s.batch_seq, s.forwarded_points, s.dead_letter_points, \
                 s.replayed_batches, s.evicted_unforwarded_points, s.evicted_through_chunk_id, \
                 s.fallback_points, s.fallback_through_chunk_id, s.last_success_ns, s.forwarded_ts_max, \
                 f.span_from, f.bucket, f.series_id FROM sinks s \
                 LEFT JOIN sink_fallback f ON f.sink = s.name \
                 WHERE s.name = ?1",
                params![self.name],
                |r| {
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
                    })
                },
            )
            .map_err(sq(&self.path))
    }

    /// Records that batches through chunk `through` are being sent (one small write).
    pub fn mark_inflight(&mut self, through: i64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE sinks SET inflight_through_chunk_id = ?2 WHERE name = ?1",
                params![self.name, through],
            )
            .map(|_| ())
            .map_err(sq(&self.path))
    }

    /// The remote end acknowledged everything through chunk `through` (batch `seq`, `points`
    /// points): moves the cursor, in one short transaction.
    pub fn ack(
        &mut self,
        through: i64,
        seq: i64,
        points: i64,
        ts_max: i64,
        now_ns: i64,
    ) -> Result<(), StoreError> {
        let e = sq(&self.path);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&e)?;
        tx.execute(
            "UPDATE sinks SET cursor_chunk_id = MAX(cursor_chunk_id, ?2), batch_seq = MAX(batch_seq, ?3), \
             forwarded_points = forwarded_points + ?4, last_success_ns = ?5, \
             forwarded_ts_max = MAX(forwarded_ts_max, ?6) WHERE name = ?1",
            params![self.name, through, seq, points, now_ns, ts_max],
        )
        .map_err(&e)?;
        tx.commit().map_err(&e)
    }

    /// The remote end refused the batch as bad data: keeps it in `dead_letters` and moves the
    /// cursor past it, in one transaction. A refused batch of rollup points (`fallback`) is
    /// kept the same way, but the raw cursor stays where it is and the span moves on past it
    /// (as [`Cursor::fallback_ack`] records).
    #[allow(clippy::too_many_arguments)]
    pub fn dead_letter(
        &mut self,
        first: i64,
        through: i64,
        seq: i64,
        points: i64,
        status: u16,
        reason: &str,
        payload: &[u8],
        now_ns: i64,
        fallback: Option<&FallbackProgress>,
    ) -> Result<(), StoreError> {
        let e = sq(&self.path);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&e)?;
        tx.execute(
            "INSERT INTO dead_letters (sink, first_chunk_id, last_chunk_id, points, status, reason, created_ns, payload) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![self.name, first, through, points, status, reason, now_ns, payload],
        )
        .map_err(&e)?;
        tx.execute(
            "UPDATE sinks SET cursor_chunk_id = MAX(cursor_chunk_id, ?2), batch_seq = MAX(batch_seq, ?3), \
             dead_letter_points = dead_letter_points + ?4 WHERE name = ?1",
            params![
                self.name,
                if fallback.is_some() { 0 } else { through },
                seq,
                points
            ],
        )
        .map_err(&e)?;
        if let Some(p) = fallback {
            record_fallback(&tx, &self.name, seq, p).map_err(&e)?;
        }
        tx.commit().map_err(&e)
    }

    /// Dead-lettered batches of this sink.
    pub fn dead_letter_batches(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row(
                "SELECT COUNT(*) FROM dead_letters WHERE sink = ?1",
                params![self.name],
                |r| r.get(0),
            )
            .map_err(sq(&self.path))
    }

    /// Counts a batch sent again after a fault.
    pub fn count_replay(&mut self) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE sinks SET replayed_batches = replayed_batches + 1 WHERE name = ?1",
                params![self.name],
            )
            .map(|_| ())
            .map_err(sq(&self.path))
    }

    /// Rollup rows covering the raw span the sink lost to eviction: the buckets of tier
    /// `tier_s` from `from_ns` (inclusive) to `to_ns` (exclusive), after the row `after`
    /// (bucket, series id) when a span is resumed, ordered by bucket then series id, as
    /// points of measurement `<measurement>` with fields `<field>_mean`, `_min`, `_max`,
    /// `_count` and the tag `edgewatch_rollup=<tier>s`, so consumers can tell them from raw
    /// points.
    pub fn fallback_points(
        &self,
        tier_s: i64,
        from_ns: i64,
        to_ns: i64,
        after: Option<(i64, i64)>,
        identity: &[(String, String)],
    ) -> Result<RollupRows, StoreError> {
        let e = sq(&self.path);
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT t.key, s.field, r.bucket, r.count, r.sum, r.min, r.max, r.series_id FROM rollups r \
                 JOIN series s ON s.id = r.series_id JOIN tagsets t ON t.id = s.tagset_id \
                 WHERE r.tier = ?1 AND r.bucket >= ?2 AND r.bucket < ?3 \
                 AND (r.bucket > ?4 OR (r.bucket = ?4 AND r.series_id > ?5)) \
                 ORDER BY r.bucket, r.series_id",
            )
            .map_err(&e)?;
        let mut ident = identity.to_vec();
        ident.push(("edgewatch_rollup".into(), format!("{tier_s}s")));
        let mut cache: HashMap<String, Arc<Series>> = HashMap::new();
        let (after_bucket, after_series) = after.unwrap_or((i64::MIN, i64::MIN));
        let rows = st
            .query_map(
                params![tier_s, from_ns, to_ns, after_bucket, after_series],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, f64>(4)?,
                        r.get::<_, f64>(5)?,
                        r.get::<_, f64>(6)?,
                        r.get::<_, i64>(7)?,
                    ))
                },
            )
            .map_err(&e)?;
        let mut out = RollupRows::default();
        for row in rows {
            let (key, field, bucket, count, sum, min, max, series_id) = row.map_err(&e)?;
            let s = cache
                .entry(key.clone())
                .or_insert_with(|| Arc::new(series(&key, &ident)))
                .clone();
            use crate::model::Value::*;
            out.points.push(Point {
                series: s,
                ts: bucket,
                fields: vec![
                    (
                        format!("{field}_mean").into(),
                        F64(sum / count.max(1) as f64),
                    ),
                    (format!("{field}_min").into(), F64(min)),
                    (format!("{field}_max").into(), F64(max)),
                    (format!("{field}_count").into(), I64(count)),
                ],
            });
            out.keys.push((bucket, series_id));
        }
        Ok(out)
    }

    /// Records that `inflight` batches of an eviction-fallback span are handed to the remote
    /// end and not acknowledged yet (one small write; counted as replayed at the next start
    /// if the agent stops before their acknowledgement).
    pub fn mark_fallback_inflight(&mut self, inflight: i64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO sink_fallback (sink, inflight) VALUES (?1, ?2) \
                 ON CONFLICT (sink) DO UPDATE SET inflight = excluded.inflight",
                params![self.name, inflight],
            )
            .map(|_| ())
            .map_err(sq(&self.path))
    }

    /// A batch of rollup points sent in place of evicted raw data was acknowledged: records,
    /// in one transaction, its sequence number (MQTT consumers drop duplicates by it, so a
    /// number is never reused for other data), its points, and the place reached in the span
    /// (so a restart resumes after it and sends again at most the batches in flight), or,
    /// when it ends the span, that the eviction gap is covered. The raw cursor does not move:
    /// raw chunks that survived below the gap are still sent.
    pub fn fallback_ack(&mut self, seq: i64, p: &FallbackProgress) -> Result<(), StoreError> {
        let e = sq(&self.path);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&e)?;
        record_fallback(&tx, &self.name, seq, p).map_err(&e)?;
        tx.commit().map_err(&e)
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
        let conn = Connection::open(db_path(dir.path())).unwrap();
        conn.execute_batch(
            "INSERT INTO tagsets (id, key, measurement, tags) VALUES (1, 'm,k=v', 'm', '{\"k\":\"v\"}');
             INSERT INTO series (id, tagset_id, field, kind, created_ns) VALUES (1, 1, 'a', 0, 0), (2, 1, 'b', 0, 0);
             UPDATE sinks SET evicted_through_chunk_id = 5, evicted_unforwarded_points = 600 WHERE name = 's';",
        )
        .unwrap();
        for b in 0..5 {
            for sid in [2, 1] {
                conn.execute(
                    "INSERT INTO rollups (tier, series_id, bucket, count, sum, min, max, first_ts, first, last_ts, last, sketch) \
                     VALUES (60, ?1, ?2, 60, 60.0, 0.0, 2.0, ?2, 0.0, ?2, 2.0, x'')",
                    params![sid, b * MIN],
                )
                .unwrap();
            }
        }
        let src = Source::open(dir.path(), vec![("device_id".into(), "d".into())]).unwrap();
        (dir, src, cur)
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
        cur.dead_letter(0, 5, 3, 4, 400, "bad", b"x", 1, Some(&p))
            .unwrap();
        let d = cur.load().unwrap();
        assert_eq!(d.cursor, 0);
        assert_eq!((d.seq, d.dead_points, d.fallback_points), (3, 4, 4));
        assert_eq!(d.fallback_pos.map(|p| p.row), Some((MIN, 2)));
        let rest = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        assert_eq!(rest.rows.points.len(), 6);
    }

    #[test]
    fn a_place_recorded_in_another_span_is_ignored() {
        let (dir, src, mut cur) = store_with_an_eviction_gap();
        let span = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        // Seven points acknowledged: the place is (3 min, series 1) in the span from MIN.
        cur.fallback_ack(1, &span.progress(0, 7, 0)).unwrap();
        let rest = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        assert_eq!(rest.rows.points.len(), 3);
        // Raw data acknowledged since moves the start of the span: a new span, sent whole.
        let conn = Connection::open(db_path(dir.path())).unwrap();
        conn.execute(
            "UPDATE sinks SET forwarded_ts_max = ?1 WHERE name = 's'",
            params![2 * MIN + 5],
        )
        .unwrap();
        let other = crate::forward::fallback_span(Some(60), &ident(), &src, &cur).unwrap();
        assert!(!other.resumed);
        assert_eq!(other.from, 2 * MIN);
        assert_eq!(other.rows.points.len(), 6);
    }
}
