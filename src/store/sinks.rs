//! The `sinks` table as the rollup job and the status page see it: which raw chunks each
//! forwarder had not forwarded yet when eviction took them ([`record_eviction`], inside the
//! eviction's transaction) and the per-sink eviction totals ([`evictions`]).
//!
//! Never moves a sink's cursor: only its forwarder does, after the remote end acknowledged.

use std::path::Path;

use rusqlite::{params, Connection};

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
        .prepare_cached("SELECT name, cursor_chunk_id FROM sinks")
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
