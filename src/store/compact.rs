//! Recompression of committed chunks, in bounded steps: small chunks of one tag set (one
//! per commit: at 1 Hz a tegrastats tag set gets a one-point chunk a second) are merged into
//! columnar chunks of up to [`TARGET_POINTS`] points, and chunks in the legacy form are
//! re-encoded in place. Each step is one short `BEGIN IMMEDIATE` transaction, like the
//! rollup job's.
//!
//! What it never breaks: only chunks at or below every consumer's cursor are merged (each
//! tier's `rollup_state.cursor`, each sink's `cursor_chunk_id`, and below the clock hold),
//! so a merged chunk is on the same side of every cursor as the chunks it replaces; it
//! keeps the largest of their ids (ids are never reused) and their points in id order, so
//! every reader sees the same points. A legacy chunk is re-encoded under its own id with
//! the same points. Never decides when to run: `edgewatch maintain --recompress` and the
//! caller's loop do.

use std::path::Path;

use rusqlite::{params, Connection, TransactionBehavior};

use super::codec::{self, ChunkEncoder, Format};
use super::open::Ctx;
use super::StoreError;

/// Points a merged chunk aims at (the writer's own maximum).
pub const TARGET_POINTS: usize = super::MAX_CHUNK_POINTS;

/// Chunks with fewer points than this are merge candidates.
pub const SMALL_POINTS: i64 = (TARGET_POINTS / 2) as i64;

/// How much one step may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Points read per step (at least one chunk's).
    pub max_points: usize,
    /// Merge every run of small chunks, even one that does not fill a chunk yet (a
    /// one-off pass); otherwise a tag set waits until its small chunks fill one.
    pub all: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_points: 100_000,
            all: false,
        }
    }
}

/// What a step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Chunk rows rewritten (merged or re-encoded).
    pub written: u64,
    /// Chunk rows deleted by merging.
    pub removed: u64,
    /// Legacy chunks re-encoded in place.
    pub converted: u64,
    /// Points in the rows it rewrote.
    pub points: u64,
    /// Bytes of the rows it read.
    pub bytes_before: u64,
    /// Bytes of the rows it wrote.
    pub bytes_after: u64,
}

impl Pass {
    /// Adds another step's figures.
    pub fn add(&mut self, o: &Pass) {
        self.written += o.written;
        self.removed += o.removed;
        self.converted += o.converted;
        self.points += o.points;
        self.bytes_before += o.bytes_before;
        self.bytes_after += o.bytes_after;
    }
}

/// The newest chunk id every consumer has passed (`i64::MAX` when nothing consumes).
fn horizon(tx: &Connection, path: &Path) -> Result<i64, StoreError> {
    tx.query_row(
        "SELECT MIN(c) FROM (SELECT cursor AS c FROM rollup_state \
         UNION ALL SELECT cursor_chunk_id FROM sinks \
         UNION ALL SELECT first_chunk_id - 1 FROM clock_fix)",
        [],
        |r| r.get::<_, Option<i64>>(0),
    )
    .map(|h| h.unwrap_or(i64::MAX))
    .ctx(path)
}

struct Row {
    id: i64,
    ts_min: i64,
    n: i64,
    data: Vec<u8>,
}

/// One merge step: the small chunks of the tag sets that have enough of them (or all, with
/// `limits.all`), up to `limits.max_points` points. `None` when nothing is left to merge.
pub fn merge_step(
    conn: &mut Connection,
    path: &Path,
    limits: &Limits,
) -> Result<Option<Pass>, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(path)?;
    let h = horizon(&tx, path)?;
    let need = if limits.all { 0 } else { TARGET_POINTS as i64 };
    let tagsets: Vec<i64> = tx
        .prepare_cached(
            "SELECT tagset_id FROM chunks WHERE id <= ?1 AND n < ?2 GROUP BY tagset_id \
             HAVING COUNT(*) > 1 AND SUM(n) >= ?3 ORDER BY MIN(id)",
        )
        .and_then(|mut st| {
            st.query_map(params![h, SMALL_POINTS, need], |r| r.get(0))
                .and_then(|rows| rows.collect())
        })
        .ctx(path)?;
    if tagsets.is_empty() {
        return Ok(None);
    }
    let mut pass = Pass::default();
    let mut budget = limits.max_points.max(1);
    let mut sel = tx
        .prepare_cached(
            "SELECT id, ts_min, n, data FROM chunks WHERE tagset_id = ?1 AND id <= ?2 \
             AND n < ?3 ORDER BY id LIMIT ?4",
        )
        .ctx(path)?;
    for tagset in tagsets {
        if budget == 0 {
            break;
        }
        let rows: Vec<Row> = sel
            .query_map(params![tagset, h, SMALL_POINTS, budget as i64], |r| {
                Ok(Row {
                    id: r.get(0)?,
                    ts_min: r.get(1)?,
                    n: r.get(2)?,
                    data: r.get(3)?,
                })
            })
            .and_then(|rows| rows.collect())
            .ctx(path)?;
        // Greedy runs in id order, each up to TARGET_POINTS points.
        let mut start = 0;
        while start < rows.len() {
            let mut end = start;
            let mut sum = 0usize;
            while end < rows.len() && sum + rows[end].n.max(0) as usize <= TARGET_POINTS {
                sum += rows[end].n.max(0) as usize;
                end += 1;
            }
            let end = end.max(start + 1);
            let run = &rows[start..end];
            let closed = end < rows.len() || sum >= TARGET_POINTS;
            if run.len() > 1 && (closed || limits.all) {
                merge(&tx, path, run, &mut pass)?;
            }
            budget = budget.saturating_sub(sum);
            start = end;
        }
    }
    drop(sel);
    tx.commit().ctx(path)?;
    Ok(Some(pass))
}

/// Replaces `run` (one tag set, id order) by one chunk under the largest id. A chunk that
/// does not decode stays as it is (logged; readers report it by id).
fn merge(tx: &Connection, path: &Path, run: &[Row], pass: &mut Pass) -> Result<(), StoreError> {
    let mut enc = ChunkEncoder::new();
    let mut merged: Vec<&Row> = Vec::with_capacity(run.len());
    for r in run {
        let mut points: Vec<(i64, Vec<(i64, crate::model::Value)>)> = Vec::new();
        match codec::decode_points(&r.data, r.ts_min, |ts, vals| {
            points.push((ts, std::mem::take(vals)))
        }) {
            Ok(()) => {
                for (ts, vals) in &points {
                    enc.push(*ts, vals.iter().map(|(s, v)| (*s, v)));
                }
                merged.push(r);
            }
            Err(e) => {
                tracing::warn!(chunk = r.id, error = %e.in_chunk(r.id), "cannot recompress a corrupt chunk; left as it is");
            }
        }
    }
    let (Some(last), true) = (merged.last(), merged.len() > 1) else {
        return Ok(());
    };
    let Some(e) = enc.finish() else {
        return Ok(());
    };
    tx.prepare_cached(
        "UPDATE chunks SET ts_min = ?2, ts_max = ?3, n = ?4, data = ?5 WHERE id = ?1",
    )
    .and_then(|mut st| st.execute(params![last.id, e.ts_min, e.ts_max, e.n as i64, e.data]))
    .ctx(path)?;
    super::chunks::delete(tx, path, merged[..merged.len() - 1].iter().map(|r| r.id))?;
    pass.written += 1;
    pass.removed += merged.len() as u64 - 1;
    pass.points += e.n as u64;
    pass.bytes_before += merged.iter().map(|r| r.data.len() as u64).sum::<u64>();
    pass.bytes_after += e.data.len() as u64;
    Ok(())
}

/// One conversion step: the legacy chunks among the `max_chunks` after id `after`,
/// re-encoded in place. Returns what it did and the id to continue after (`None`: done).
/// A chunk that does not decode is left as it is and logged (readers report it by id).
pub fn convert_step(
    conn: &mut Connection,
    path: &Path,
    after: i64,
    max_chunks: usize,
) -> Result<(Pass, Option<i64>), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(path)?;
    let rows: Vec<Row> = tx
        .prepare_cached("SELECT id, ts_min, n, data FROM chunks WHERE id > ?1 ORDER BY id LIMIT ?2")
        .and_then(|mut st| {
            st.query_map(params![after, max_chunks.max(1) as i64], |r| {
                Ok(Row {
                    id: r.get(0)?,
                    ts_min: r.get(1)?,
                    n: r.get(2)?,
                    data: r.get(3)?,
                })
            })
            .and_then(|rows| rows.collect())
        })
        .ctx(path)?;
    let mut pass = Pass::default();
    let next = rows.last().map(|r| r.id);
    for r in rows {
        if !matches!(codec::format(&r.data), Ok(Format::Legacy)) {
            continue;
        }
        match codec::reencode(&r.data, r.ts_min) {
            Ok(Some(e)) => {
                tx.prepare_cached(
                    "UPDATE chunks SET ts_min = ?2, ts_max = ?3, data = ?4 WHERE id = ?1",
                )
                .and_then(|mut st| st.execute(params![r.id, e.ts_min, e.ts_max, e.data]))
                .ctx(path)?;
                pass.written += 1;
                pass.converted += 1;
                pass.points += r.n.max(0) as u64;
                pass.bytes_before += r.data.len() as u64;
                pass.bytes_after += e.data.len() as u64;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(chunk = r.id, error = %e, "cannot recompress a corrupt chunk; left as it is");
            }
        }
    }
    tx.commit().ctx(path)?;
    Ok((pass, next))
}
