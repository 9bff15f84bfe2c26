//! The `chunks` table: scanning raw chunks by id or by time ([`scan`], with a [`Scan`]
//! filter, handing each row to a callback that may decode it), and the few other statements
//! on it: counts and sums for status and backlog, the next id, eviction's delete and the
//! clock hold's in-place retime. Chunks are written only by the ingest writer
//! ([`super::Writer`]); their encoding lives in [`super::codec`].
//!
//! Never interprets what a chunk means to a caller (tiers, cursors, holds): callers say which
//! ids and times they want.

use std::ops::ControlFlow;
use std::path::Path;

use rusqlite::{params_from_iter, Connection, OptionalExtension};

use super::open::Ctx;
use super::{codec, StoreError};
use crate::model::Value;

/// Points a merged chunk aims at (the writer's own maximum); see [`super::compact`].
pub const TARGET_POINTS: usize = super::MAX_CHUNK_POINTS;

/// Chunks with fewer points than this are merge candidates (and not counted as "full" by
/// the write-rate reading).
pub const SMALL_POINTS: i64 = (TARGET_POINTS / 2) as i64;

/// One chunk row, borrowed from the scan.
#[derive(Debug, Clone, Copy)]
pub struct Chunk<'a> {
    /// Chunk id (insertion order, never reused).
    pub id: i64,
    /// Its tag set.
    pub tagset_id: i64,
    /// Oldest point time, ns.
    pub ts_min: i64,
    /// Newest point time, ns.
    pub ts_max: i64,
    /// Points in the chunk.
    pub n: i64,
    /// Encoded size, bytes.
    pub bytes: i64,
    /// The packed points (empty when the scan was asked for [`Scan::without_data`]).
    pub data: &'a [u8],
}

impl Chunk<'_> {
    /// Decodes every value: `f(ts, series_id, value)`, in stored order, whatever the
    /// chunk's format. `path` and the chunk's id name it in the error.
    pub fn decode(&self, path: &Path, f: impl FnMut(i64, i64, Value)) -> Result<(), StoreError> {
        codec::decode_chunk(self.data, self.ts_min, f).map_err(|source| StoreError::Corrupt {
            path: path.to_path_buf(),
            source: source.in_chunk(self.id),
        })
    }
}

/// Which chunks a [`scan`] reads. Every bound is optional; the default reads every chunk
/// in id order.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Only ids above this.
    pub after: Option<i64>,
    /// Only ids below this.
    pub before: Option<i64>,
    /// Only ids at or below this.
    pub through: Option<i64>,
    /// Only this tag set.
    pub tagset: Option<i64>,
    /// Only chunks whose newest point is at or after this (ns).
    pub ts_from: Option<i64>,
    /// Only chunks whose oldest point is at or before this (ns).
    pub ts_to: Option<i64>,
    /// Only chunks whose newest point is before this (ns).
    pub older_than: Option<i64>,
    /// At most this many rows.
    pub limit: Option<usize>,
    /// Newest `ts_max` first instead of id order.
    pub newest_first: bool,
    /// Leave `data` out (sizes and counts only: no blob is read).
    pub without_data: bool,
}

/// Which chunks of a tag set's scan a statement reads (see [`Scan::sql_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The indexed ones and the unindexed tail.
    Both,
    /// Only the indexed ones (through `chunk_index`).
    Indexed,
    /// Only the unindexed tail, of the tag sets in a JSON array (`?1`).
    TailOfMany,
}

impl Scan {
    /// The statement and its parameters (see [`Scan::sql_of`]).
    fn sql(&self) -> (String, Vec<i64>) {
        self.sql_of(Part::Both)
    }

    /// The statement and its parameters. With a tag set, two parts: the indexed chunks
    /// through `chunk_index` (by tag set and `ts_max`), and the unindexed tail (ids above
    /// `chunk_tail.indexed_through`, at most a few minutes of commits, see [`TAIL_SECONDS`])
    /// by rowid. The tag set (or, for [`Part::TailOfMany`], the JSON array of tag sets) is
    /// always `?1`.
    fn sql_of(&self, part: Part) -> (String, Vec<i64>) {
        let mut args = Vec::new();
        if self.tagset.is_some() || part == Part::TailOfMany {
            args.push(self.tagset.unwrap_or(0));
        }
        // (column, operator, parameter number); `id` and `ts_max` come from the index entry
        // in the indexed part.
        let mut bounds: Vec<(&str, &str, usize)> = Vec::new();
        let mut bound = |col: &'static str, op: &'static str, v: Option<i64>| {
            if let Some(v) = v {
                args.push(v);
                bounds.push((col, op, args.len()));
            }
        };
        bound("id", ">", self.after);
        bound("id", "<", self.before);
        bound("id", "<=", self.through);
        bound("ts_max", ">=", self.ts_from);
        bound("ts_min", "<=", self.ts_to);
        bound("ts_max", "<", self.older_than);
        let conds = |index: &str, row: &str, skip_after: bool| -> String {
            let mut out = String::new();
            for &(col, op, n) in &bounds {
                if skip_after && col == "id" && op == ">" {
                    continue;
                }
                let table = if col == "ts_min" { row } else { index };
                out.push_str(&format!(" AND {table}{col} {op} ?{n}"));
            }
            out
        };
        let data = if self.without_data { "NULL" } else { "data" };
        let cols = |t: &str| {
            format!(
                "SELECT {t}id AS id, {t}tagset_id AS tagset_id, {t}ts_min AS ts_min, \
                 {t}ts_max AS ts_max, {t}n AS n, length({t}data), {}{data} FROM ",
                if self.without_data { "" } else { t }
            )
        };
        let indexed = || {
            format!(
                "{}chunk_index i CROSS JOIN chunks c ON c.id = i.id WHERE i.tagset_id = ?1{}",
                cols("c."),
                conds("i.", "c.", false)
            )
        };
        let tail = |tagsets: &str| {
            let after = bounds.iter().find(|b| b.0 == "id" && b.1 == ">");
            let lower = match after {
                Some(&(_, _, n)) => format!("MAX((SELECT indexed_through FROM chunk_tail), ?{n})"),
                None => "(SELECT indexed_through FROM chunk_tail)".to_string(),
            };
            format!(
                "{}chunks WHERE id > {lower} AND tagset_id {tagsets}{}",
                cols(""),
                conds("", "", true)
            )
        };
        let mut sql = match (part, self.tagset.is_some()) {
            (Part::TailOfMany, _) => tail("IN (SELECT value FROM json_each(?1))"),
            (Part::Indexed, true) => indexed(),
            (Part::Both, true) => format!("{} UNION ALL {}", indexed(), tail("= ?1")),
            (_, false) => format!("{}chunks WHERE 1{}", cols(""), conds("", "", false)),
        };
        sql.push_str(if self.newest_first {
            " ORDER BY ts_max DESC"
        } else {
            " ORDER BY id"
        });
        if let Some(l) = self.limit {
            args.push(i64::try_from(l).unwrap_or(i64::MAX));
            sql.push_str(&format!(" LIMIT ?{}", args.len()));
        }
        (sql, args)
    }
}

/// Unindexed chunks the writer lets accumulate before it indexes them (with
/// [`TAIL_ROWS_PER_TAGSET`] of each tag set), or [`TAIL_SECONDS`] of them, whichever
/// comes first.
pub const TAIL_ROWS: i64 = 1_000;

/// Unindexed chunks per tag set in the tail the writer waits for (beside [`TAIL_ROWS`])
/// before it indexes them: indexing writes about one `chunk_index` leaf per tag set (its
/// entries are ordered by tag set), so this many chunks share each leaf written.
pub const TAIL_ROWS_PER_TAGSET: i64 = 64;

/// Unindexed chunks at which the writer indexes the tail whatever else holds: every read
/// of one tag set scans the tail by rowid (0.36 ms at this many rows against 0.05 ms
/// indexed, `cargo bench --bench query`), and reads of many tag sets scan it once.
pub const TAIL_MAX_ROWS: i64 = 20_000;

/// Seconds the writer lets unindexed chunks accumulate before it indexes them. Each
/// indexing writes about a leaf per tag set, and more once a tag set's entries outgrow a
/// leaf: on the reference device workload (~20 chunks a second over ~180 tag sets, the index
/// ~280 leaves after an hour) one indexing wrote ~390 leaves, every 30 s before
/// `0015_chunk_index.sql`. [`TAIL_MAX_ROWS`] bounds the tail on a busier device.
pub const TAIL_SECONDS: u64 = 900;

/// Indexes every chunk above `chunk_tail.indexed_through` (the writer's periodic step, and
/// `maintain --recompress`'s first, inside the caller's transaction): one `chunk_index`
/// entry per chunk, inserted in index order; the chunk rows are not touched. Returns the
/// new `indexed_through`: the newest chunk id. Reads the bound from the table, not from the
/// caller, so a second indexer (`maintain` beside the agent) never indexes a chunk twice.
pub fn index_tail(tx: &Connection, path: &Path) -> Result<i64, StoreError> {
    let through = indexed_through(tx, path)?;
    let newest = newest_id(tx, path)?.max(through);
    if newest == through {
        return Ok(through);
    }
    // OR IGNORE: a statement that cannot abort half-way needs no statement journal (it
    // would hold a copy of every index leaf it changes: ~1.6 MB at ~390 leaves); an entry
    // already there is one this chunk already has.
    tx.prepare_cached(
        "INSERT OR IGNORE INTO chunk_index (tagset_id, ts_max, id) SELECT tagset_id, ts_max, id \
         FROM chunks WHERE id > ?1 AND id <= ?2 ORDER BY tagset_id, ts_max, id",
    )
    .and_then(|mut st| st.execute([through, newest]))
    .ctx(path)?;
    tx.prepare_cached("UPDATE chunk_tail SET indexed_through = ?1 WHERE id = 1")
        .and_then(|mut st| st.execute([newest]))
        .ctx(path)?;
    Ok(newest)
}

/// The id through which every chunk is indexed (see [`index_tail`]).
pub fn indexed_through(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT indexed_through FROM chunk_tail WHERE id = 1")
        .and_then(|mut st| st.query_row([], |r| r.get(0)))
        .ctx(path)
}

/// Reads the chunks `s` selects, handing each to `f` until it breaks or they run out.
pub fn scan(
    conn: &Connection,
    path: &Path,
    s: &Scan,
    mut f: impl FnMut(&Chunk<'_>) -> Result<ControlFlow<()>, StoreError>,
) -> Result<(), StoreError> {
    let (sql, args) = s.sql();
    let mut st = conn.prepare_cached(&sql).ctx(path)?;
    each_row(&mut st, path, params_from_iter(args), &mut f).map(|_| ())
}

/// [`scan`] of `s` for every tag set of `tagsets` (`s.tagset` is replaced), with one
/// prepared statement for all of them (a reader of many tag sets' windows: no statement
/// text built and looked up per tag set). The indexed chunks of each tag set in turn, then
/// the unindexed tail once for all of them (in id order; one pass over the tail instead of
/// one per tag set), so each tag set's chunks still come in id order. With `s.limit` or
/// `s.newest_first`, each tag set's chunks are read whole, in turn. Stops at the first break.
pub fn scan_tagsets(
    conn: &Connection,
    path: &Path,
    s: &Scan,
    tagsets: impl IntoIterator<Item = i64>,
    mut f: impl FnMut(&Chunk<'_>) -> Result<ControlFlow<()>, StoreError>,
) -> Result<(), StoreError> {
    let s = Scan {
        tagset: Some(0),
        ..s.clone()
    };
    let whole = s.limit.is_some() || s.newest_first;
    // The tag set is the statement's first parameter (see `Scan::sql_of`).
    let (sql, mut args) = s.sql_of(if whole { Part::Both } else { Part::Indexed });
    let mut st = conn.prepare_cached(&sql).ctx(path)?;
    let mut all = Vec::new();
    for t in tagsets {
        args[0] = t;
        all.push(t);
        if each_row(&mut st, path, params_from_iter(args.iter()), &mut f)?.is_break() {
            return Ok(());
        }
    }
    if whole || all.is_empty() {
        return Ok(());
    }
    let (sql, args) = s.sql_of(Part::TailOfMany);
    let list: Vec<String> = all.iter().map(i64::to_string).collect();
    let list = format!("[{}]", list.join(","));
    let mut params: Vec<rusqlite::types::Value> = args
        .into_iter()
        .map(rusqlite::types::Value::Integer)
        .collect();
    params[0] = rusqlite::types::Value::Text(list);
    let mut st = conn.prepare_cached(&sql).ctx(path)?;
    each_row(&mut st, path, params_from_iter(params), &mut f).map(|_| ())
}

/// Hands each chunk `st` returns to `f`, until it breaks (returned) or they run out.
fn each_row(
    st: &mut rusqlite::CachedStatement<'_>,
    path: &Path,
    params: impl rusqlite::Params,
    f: &mut impl FnMut(&Chunk<'_>) -> Result<ControlFlow<()>, StoreError>,
) -> Result<ControlFlow<()>, StoreError> {
    let mut rows = st.query(params).ctx(path)?;
    while let Some(r) = rows.next().ctx(path)? {
        if f(&chunk_of(r, path)?)?.is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// The chunk of a row of `Scan::sql`'s statement.
fn chunk_of<'r>(r: &'r rusqlite::Row<'_>, path: &Path) -> Result<Chunk<'r>, StoreError> {
    let data = match r.get_ref(6).ctx(path)? {
        rusqlite::types::ValueRef::Null => &[][..],
        v => v.as_blob().ctx(path)?,
    };
    Ok(Chunk {
        id: r.get(0).ctx(path)?,
        tagset_id: r.get(1).ctx(path)?,
        ts_min: r.get(2).ctx(path)?,
        ts_max: r.get(3).ctx(path)?,
        n: r.get(4).ctx(path)?,
        bytes: r.get::<_, Option<i64>>(5).ctx(path)?.unwrap_or(0),
        data,
    })
}

/// An owned copy of a chunk's identity and size (what eviction works from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSize {
    /// Chunk id.
    pub id: i64,
    /// Points.
    pub n: i64,
    /// Encoded bytes.
    pub bytes: i64,
}

/// Ids, point counts and sizes of the chunks `s` selects (no blob is read).
pub fn sizes(conn: &Connection, path: &Path, s: &Scan) -> Result<Vec<ChunkSize>, StoreError> {
    let s = Scan {
        without_data: true,
        ..s.clone()
    };
    let mut out = Vec::new();
    scan(conn, path, &s, |c| {
        out.push(ChunkSize {
            id: c.id,
            n: c.n,
            bytes: c.bytes,
        });
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(out)
}

/// The newest chunk id (0 when there is none).
pub fn newest_id(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT COALESCE(MAX(id), 0) FROM chunks")
        .and_then(|mut st| st.query_row([], |r| r.get(0)))
        .ctx(path)
}

/// The id the next chunk will get (AUTOINCREMENT: one past the largest ever used, even if
/// that chunk was evicted).
pub fn next_id(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    conn.query_row(
        "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'chunks'), 0) + 1",
        [],
        |r| r.get(0),
    )
    .ctx(path)
}

/// Chunks and points with `after < id < before`, and the oldest time among them (the
/// forwarders' backlog; `before = i64::MAX` for no upper bound).
pub fn backlog(
    conn: &Connection,
    path: &Path,
    after: i64,
    before: i64,
) -> Result<Backlog, StoreError> {
    let (points, chunks): (i64, i64) = conn
        .prepare_cached(
            "SELECT COALESCE(SUM(n), 0), COUNT(*) FROM chunks WHERE id > ?1 AND id < ?2",
        )
        .and_then(|mut st| st.query_row([after, before], |r| Ok((r.get(0)?, r.get(1)?))))
        .ctx(path)?;
    let oldest_ts: Option<i64> = conn
        .prepare_cached("SELECT ts_min FROM chunks WHERE id > ?1 AND id < ?2 ORDER BY id LIMIT 1")
        .and_then(|mut st| st.query_row([after, before], |r| r.get(0)).optional())
        .ctx(path)?;
    Ok(Backlog {
        points,
        chunks,
        oldest_ts,
    })
}

/// What [`backlog`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Points.
    pub points: i64,
    /// Chunks.
    pub chunks: i64,
    /// `ts_min` of the oldest of them.
    pub oldest_ts: Option<i64>,
}

/// `ts_min` of the first chunk with id above `after` (and below `before`, when given), read
/// without its data; `None` when there is none. Where a tier's next chunk lies: the rollup
/// job's closed-bucket check and the engine's finer-tier split.
pub fn first_ts_min_after(
    conn: &Connection,
    path: &Path,
    after: i64,
    before: Option<i64>,
) -> Result<Option<i64>, StoreError> {
    let mut first = None;
    let next = Scan {
        after: Some(after),
        before,
        limit: Some(1),
        without_data: true,
        ..Scan::default()
    };
    scan(conn, path, &next, |c| {
        first = Some(c.ts_min);
        Ok(ControlFlow::Break(()))
    })?;
    Ok(first)
}

/// Number of chunks with id above `after`.
pub fn count_after(conn: &Connection, path: &Path, after: i64) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT COUNT(*) FROM chunks WHERE id > ?1")
        .and_then(|mut st| st.query_row([after], |r| r.get(0)))
        .ctx(path)
}

/// Points stored in chunks with `from <= id < until`.
pub fn points_between(
    conn: &Connection,
    path: &Path,
    from: i64,
    until: i64,
) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT COALESCE(SUM(n), 0) FROM chunks WHERE id >= ?1 AND id < ?2")
        .and_then(|mut st| st.query_row([from, until], |r| r.get(0)))
        .ctx(path)
}

/// Deletes the chunks `ids`, inside the caller's transaction.
pub fn delete(
    tx: &Connection,
    path: &Path,
    ids: impl IntoIterator<Item = i64>,
) -> Result<(), StoreError> {
    let mut del = tx
        .prepare_cached("DELETE FROM chunks WHERE id = ?1")
        .ctx(path)?;
    for id in ids {
        del.execute([id]).ctx(path)?;
    }
    Ok(())
}

/// Replaces a chunk's times and packed points, keeping its id (the clock hold's correction,
/// the only rewrite of a committed chunk), inside the caller's transaction.
pub fn retime(
    tx: &Connection,
    path: &Path,
    id: i64,
    ts_min: i64,
    ts_max: i64,
    data: &[u8],
) -> Result<(), StoreError> {
    tx.prepare_cached("UPDATE chunks SET ts_min = ?2, ts_max = ?3, data = ?4 WHERE id = ?1")
        .and_then(|mut st| st.execute(rusqlite::params![id, ts_min, ts_max, data]))
        .map(|_| ())
        .ctx(path)
}

/// What the status document's write rate is computed from (see
/// [`crate::status::rate::write_rate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateSample {
    /// Points in the newest chunks.
    pub points: u64,
    /// Their values.
    pub values: u64,
    /// The time they span (newest point minus oldest), ns.
    pub span_ns: i64,
    /// Their bytes (data plus [`ROW_OVERHEAD`] a row).
    pub bytes: u64,
    /// Values in the newest full chunks (merged or large), if any.
    pub dense_values: u64,
    /// Their bytes (data plus [`ROW_OVERHEAD`] a row).
    pub dense_bytes: u64,
}

/// Bytes a chunk row costs beyond its data (record header, the other columns, its index
/// entry; measured with `cargo bench --bench storage`, rounded up).
pub const ROW_OVERHEAD: u64 = 48;

/// What [`rate_sample`] keeps between samples, so that each chunk is decoded once rather
/// than at every status read: the status decoded the newest 2,000 chunks on every read, a
/// few percent of the agent's CPU with the UI open (docs/performance.md).
#[derive(Debug, Default)]
pub struct RateCache {
    /// (id, points, values) of the window's chunks, by id.
    window: std::collections::VecDeque<(i64, i64, u64)>,
    /// (id, values, bytes) of the newest full chunks.
    dense: Vec<(i64, u64, u64)>,
}

/// Samples the newest `window` chunks (the current write rate) and the newest 8 full ones
/// (the density data settles at once recompressed). Their values are counted by decoding
/// each chunk once: `cache` keeps the counts of the chunks sampled before, and is counted
/// again whole when the store no longer holds what it counted (chunks evicted or merged
/// inside the window). Points, bytes and times are read from the store every time. A
/// corrupt chunk is an error naming it.
pub fn rate_sample(
    conn: &Connection,
    path: &Path,
    window: usize,
    cache: &mut RateCache,
) -> Result<RateSample, StoreError> {
    let from = newest_id(conn, path)?.saturating_sub(window as i64);
    while cache.window.front().is_some_and(|c| c.0 <= from) {
        cache.window.pop_front();
    }
    let mut s = RateSample::default();
    for whole in [false, true] {
        if whole {
            cache.window.clear();
        }
        let scan_from = cache.window.back().map_or(from, |c| c.0.max(from));
        scan(
            conn,
            path,
            &Scan {
                after: Some(scan_from),
                ..Scan::default()
            },
            |c| {
                let mut values = 0u64;
                c.decode(path, |_, _, _| values += 1)?;
                cache.window.push_back((c.id, c.n.max(0), values));
                Ok(ControlFlow::Continue(()))
            },
        )?;
        let through = cache.window.back().map_or(from, |c| c.0);
        let (count, points, lo, hi, bytes): (i64, i64, Option<i64>, Option<i64>, i64) = conn
            .prepare_cached(
                "SELECT count(*), COALESCE(sum(max(n, 0)), 0), min(ts_min), max(ts_max), \
                 COALESCE(sum(length(data)), 0) FROM chunks WHERE id > ?1 AND id <= ?2",
            )
            .and_then(|mut st| {
                st.query_row([from, through], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })
            })
            .ctx(path)?;
        let held: i64 = cache.window.iter().map(|c| c.1).sum();
        s = RateSample {
            points: points as u64,
            values: cache.window.iter().map(|c| c.2).sum(),
            span_ns: hi.zip(lo).map_or(0, |(h, l)| h.saturating_sub(l).max(0)),
            bytes: bytes as u64 + count as u64 * ROW_OVERHEAD,
            ..RateSample::default()
        };
        if count == cache.window.len() as i64 && points == held {
            break;
        }
    }
    let ids: Vec<i64> = conn
        .prepare_cached("SELECT id FROM chunks WHERE n >= ?1 ORDER BY id DESC LIMIT 8")
        .and_then(|mut st| {
            st.query_map([SMALL_POINTS], |r| r.get(0))?
                .collect::<Result<_, _>>()
        })
        .ctx(path)?;
    cache.dense.retain(|d| ids.contains(&d.0));
    for id in ids {
        if !cache.dense.iter().any(|d| d.0 == id) {
            let mut values = 0u64;
            let mut bytes = 0u64;
            scan(
                conn,
                path,
                &Scan {
                    after: Some(id - 1),
                    before: Some(id + 1),
                    ..Scan::default()
                },
                |c| {
                    codec::decode_chunk(c.data, c.ts_min, |_, _, _| values += 1).map_err(
                        |source| StoreError::Corrupt {
                            path: path.to_path_buf(),
                            source: source.in_chunk(c.id),
                        },
                    )?;
                    bytes = c.data.len() as u64;
                    Ok(ControlFlow::Continue(()))
                },
            )?;
            cache.dense.push((id, values, bytes));
        }
    }
    for d in &cache.dense {
        s.dense_values += d.1;
        s.dense_bytes += d.2 + ROW_OVERHEAD;
    }
    Ok(s)
}

/// Raw storage of one measurement (what `edgewatch maintain` reports).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Density {
    /// Measurement.
    pub measurement: String,
    /// Chunk rows.
    pub chunks: u64,
    /// Of them, still in the legacy encoding.
    pub legacy_chunks: u64,
    /// Points.
    pub points: u64,
    /// Field values.
    pub values: u64,
    /// Encoded bytes of its chunks.
    pub bytes: u64,
}

/// Chunk bytes, points and values per measurement (every chunk is decoded to count its
/// values; a corrupt one is an error naming it).
pub fn density(conn: &Connection, path: &Path) -> Result<Vec<Density>, StoreError> {
    let mut st = conn
        .prepare(
            "SELECT t.measurement, c.id, c.ts_min, c.n, c.data FROM chunks c \
             JOIN tagsets t ON t.id = c.tagset_id ORDER BY t.measurement",
        )
        .ctx(path)?;
    let mut rows = st.query([]).ctx(path)?;
    let mut out: Vec<Density> = Vec::new();
    while let Some(r) = rows.next().ctx(path)? {
        let m: String = r.get(0).ctx(path)?;
        let (id, ts_min, n): (i64, i64, i64) = (
            r.get(1).ctx(path)?,
            r.get(2).ctx(path)?,
            r.get(3).ctx(path)?,
        );
        let data = match r.get_ref(4).ctx(path)? {
            rusqlite::types::ValueRef::Null => &[][..],
            v => v.as_blob().ctx(path)?,
        };
        if out.last().map_or(true, |d| d.measurement != m) {
            out.push(Density {
                measurement: m,
                ..Density::default()
            });
        }
        let Some(d) = out.last_mut() else { continue };
        let corrupt = |source: codec::CodecError| StoreError::Corrupt {
            path: path.to_path_buf(),
            source: source.in_chunk(id),
        };
        if codec::format(data).map_err(corrupt)? == codec::Format::Legacy {
            d.legacy_chunks += 1;
        }
        let mut values = 0u64;
        codec::decode_chunk(data, ts_min, |_, _, _| values += 1).map_err(corrupt)?;
        d.chunks += 1;
        d.points += n.max(0) as u64;
        d.values += values;
        d.bytes += data.len() as u64;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks without an index entry.
    fn unindexed(conn: &Connection) -> i64 {
        conn.query_row(
            "SELECT (SELECT COUNT(*) FROM chunks) - (SELECT COUNT(*) FROM chunk_index)",
            [],
            |r| r.get(0),
        )
        .unwrap()
    }

    #[test]
    fn scan_sql_names_only_the_bounds_given() {
        let (sql, args) = Scan {
            tagset: Some(3),
            after: Some(7),
            ts_from: Some(1),
            ts_to: Some(9),
            ..Scan::default()
        }
        .sql();
        let cols = |t: &str| {
            format!(
                "SELECT {t}id AS id, {t}tagset_id AS tagset_id, {t}ts_min AS ts_min, \
                 {t}ts_max AS ts_max, {t}n AS n, length({t}data), {t}data FROM "
            )
        };
        assert_eq!(
            sql,
            format!(
                "{}chunk_index i CROSS JOIN chunks c ON c.id = i.id WHERE i.tagset_id = ?1 \
                 AND i.id > ?2 AND i.ts_max >= ?3 AND c.ts_min <= ?4 UNION ALL {}chunks \
                 WHERE id > MAX((SELECT indexed_through FROM chunk_tail), ?2) AND tagset_id = ?1 \
                 AND ts_max >= ?3 AND ts_min <= ?4 ORDER BY id",
                cols("c."),
                cols("")
            )
        );
        assert_eq!(args, vec![3, 7, 1, 9]);
        let (sql, args) = Scan {
            newest_first: true,
            limit: Some(4),
            without_data: true,
            ..Scan::default()
        }
        .sql();
        assert!(
            sql.contains("NULL FROM chunks WHERE 1 ORDER BY ts_max DESC LIMIT ?1"),
            "{sql}"
        );
        assert_eq!(args, vec![4]);
        let (sql, args) = Scan {
            before: Some(5),
            ..Scan::default()
        }
        .sql_of(Part::TailOfMany);
        assert!(
            sql.ends_with(
                "chunks WHERE id > (SELECT indexed_through FROM chunk_tail) AND tagset_id \
                 IN (SELECT value FROM json_each(?1)) AND id < ?2 ORDER BY id"
            ),
            "{sql}"
        );
        assert_eq!(args, vec![0, 5]);
    }

    /// Chunks go in unindexed and are read by tag set all the same, before and after the
    /// writer indexes its tail (every `TAIL_ROWS` chunks here); the indexed part is read
    /// through the partial index, not by a scan of the table.
    #[test]
    fn the_unindexed_tail_is_read_by_tag_set_and_indexed_every_tail_rows() {
        use crate::config::Synchronous;
        use crate::model::{Batch, Line, Value};
        let dir = tempfile::tempdir().unwrap();
        let mut w = super::super::Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let commit = |w: &mut super::super::Writer, i: i64| {
            let line = |s: &str| Line {
                key: format!("m,s={s}"),
                fields: vec![("v".to_string(), Value::F64(i as f64))],
                ts: i,
                line_no: 0,
            };
            let batch = Batch {
                lines: vec![line("a"), line("b")],
            };
            w.write(&[&batch]).unwrap();
        };
        let conn = Connection::open(super::super::db_path(dir.path())).unwrap();
        let path = dir.path();
        let points_of = |tagset: i64| {
            let mut n = 0;
            scan(
                &conn,
                path,
                &Scan {
                    tagset: Some(tagset),
                    ..Scan::default()
                },
                |c| {
                    n += c.n;
                    Ok(ControlFlow::Continue(()))
                },
            )
            .unwrap();
            n
        };
        let tagset_a: i64 = conn
            .query_row("SELECT id FROM tagsets WHERE key = 'm,s=a'", [], |r| {
                r.get(0)
            })
            .unwrap_or(0);
        assert_eq!(tagset_a, 0, "no tag set before the first write");
        commit(&mut w, 1);
        let tagset_a: i64 = conn
            .query_row("SELECT id FROM tagsets WHERE key = 'm,s=a'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(indexed_through(&conn, path).unwrap(), 0);
        assert_eq!(points_of(tagset_a), 1, "the unindexed chunk is read");
        // Two chunks a commit: the tail is indexed at the commit that reaches TAIL_ROWS.
        let commits = TAIL_ROWS / 2 + 10;
        for i in 2..=commits {
            commit(&mut w, i);
        }
        let through = indexed_through(&conn, path).unwrap();
        assert!((TAIL_ROWS..TAIL_ROWS + 2).contains(&through), "{through}");
        assert_eq!(unindexed(&conn), commits * 2 - through);
        assert_eq!(
            points_of(tagset_a),
            commits,
            "indexed part and tail together"
        );
        let (sql, args) = Scan {
            tagset: Some(tagset_a),
            ..Scan::default()
        }
        .sql();
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            plan.iter()
                .any(|p| p.contains("SEARCH i USING PRIMARY KEY (tagset_id=?")),
            "{plan:?}"
        );
        assert!(
            plan.iter()
                .any(|p| p.contains("INTEGER PRIMARY KEY (rowid>?)")),
            "the tail is read by rowid: {plan:?}"
        );
    }

    /// With many tag sets a commit (a scrape, many models) the tail waits for
    /// `TAIL_ROWS_PER_TAGSET` chunks per tag set, not `TAIL_ROWS`: indexing writes a leaf
    /// per tag set, which a row count alone would do every commit or two.
    #[test]
    fn a_tail_of_many_tag_sets_is_indexed_once_it_holds_enough_chunks_of_each() {
        use crate::config::Synchronous;
        use crate::model::{Batch, Line, Value};
        let dir = tempfile::tempdir().unwrap();
        let mut w = super::super::Writer::open(dir.path(), 10_000, Synchronous::Normal).unwrap();
        let tagsets = 100i64;
        let commit = |w: &mut super::super::Writer, i: i64| {
            let batch = Batch {
                lines: (0..tagsets)
                    .map(|s| Line {
                        key: format!("m,s={s}"),
                        fields: vec![("v".to_string(), Value::F64(i as f64))],
                        ts: i,
                        line_no: 0,
                    })
                    .collect(),
            };
            w.write(&[&batch]).unwrap();
        };
        let conn = Connection::open(super::super::db_path(dir.path())).unwrap();
        let per_tagset = TAIL_ROWS_PER_TAGSET;
        assert!(
            tagsets * per_tagset > TAIL_ROWS + tagsets,
            "the test needs more tag sets"
        );
        for i in 1..per_tagset {
            commit(&mut w, i);
        }
        assert!((per_tagset - 1) * tagsets > TAIL_ROWS);
        assert_eq!(
            indexed_through(&conn, dir.path()).unwrap(),
            0,
            "past TAIL_ROWS chunks but fewer than TAIL_ROWS_PER_TAGSET of each tag set"
        );
        commit(&mut w, per_tagset);
        assert_eq!(
            indexed_through(&conn, dir.path()).unwrap(),
            per_tagset * tagsets
        );
        assert_eq!(unindexed(&conn), 0);
    }

    /// Writes `commits` commits of one point for each of `tagsets` tag sets (`fields`
    /// float fields each) through the writer; returns the writer and the data directory.
    fn store_with(
        tagsets: i64,
        fields: usize,
        commits: i64,
    ) -> (super::super::Writer, tempfile::TempDir) {
        use crate::config::Synchronous;
        let dir = tempfile::tempdir().unwrap();
        let mut w = super::super::Writer::open(dir.path(), 100_000, Synchronous::Normal).unwrap();
        commit_each(&mut w, tagsets, fields, 1..=commits);
        (w, dir)
    }

    /// Commits, for each second `i` of `seconds`, one point of each of `tagsets` tag sets
    /// (`fields` float fields each): one chunk per tag set and commit.
    fn commit_each(
        w: &mut super::super::Writer,
        tagsets: i64,
        fields: usize,
        seconds: std::ops::RangeInclusive<i64>,
    ) {
        use crate::model::{Batch, Line, Value};
        for i in seconds {
            let batch = Batch {
                lines: (0..tagsets)
                    .map(|s| Line {
                        key: format!("m,s={s}"),
                        fields: (0..fields)
                            .map(|f| (format!("f{f}"), Value::F64((i * 31 + f as i64) as f64)))
                            .collect(),
                        ts: i * 1_000_000_000,
                        line_no: 0,
                    })
                    .collect(),
            };
            w.write(&[&batch]).unwrap();
        }
    }

    /// One merge step over every chunk (`edgewatch maintain`'s), which must find some.
    fn merge_all(conn: &mut Connection, path: &Path) -> super::super::compact::Pass {
        super::super::compact::merge_step(
            conn,
            path,
            &super::super::compact::Limits {
                all: true,
                ..super::super::compact::Limits::default()
            },
        )
        .unwrap()
        .unwrap()
    }

    /// Index entries as they should be: one per chunk through `indexed_through`.
    fn index_is_true(conn: &Connection) {
        let entries = |sql: &str| -> Vec<(i64, i64, i64)> {
            conn.prepare(sql)
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        assert_eq!(
            entries("SELECT tagset_id, ts_max, id FROM chunk_index ORDER BY 1, 2, 3"),
            entries(
                "SELECT tagset_id, ts_max, id FROM chunks WHERE id <= \
                 (SELECT indexed_through FROM chunk_tail) ORDER BY 1, 2, 3"
            )
        );
    }

    /// Indexing the tail writes index pages only: the chunk rows are not rewritten (they
    /// were, with a flag on each row, before `0015_chunk_index.sql`: all raw data twice).
    #[test]
    fn indexing_the_tail_writes_index_pages_not_the_chunk_rows() {
        let (tagsets, commits) = (100, 10);
        let (w, dir) = store_with(tagsets, 30, commits);
        let path = dir.path();
        let mut conn = Connection::open(super::super::db_path(path)).unwrap();
        assert_eq!(unindexed(&conn), tagsets * commits, "nothing indexed yet");
        let chunk_pages: u64 = conn
            .query_row(
                "SELECT COUNT(*) FROM dbstat WHERE name = 'chunks'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        super::super::testing::checkpoint_truncate(path);
        assert_eq!(super::super::testing::wal_frames(path), 0);
        let tx = conn.transaction().unwrap();
        assert_eq!(index_tail(&tx, path).unwrap(), tagsets * commits);
        tx.commit().unwrap();
        let frames = super::super::testing::wal_frames(path);
        assert!(
            chunk_pages >= 40,
            "the test needs a bigger tail: {chunk_pages}"
        );
        assert!(
            frames * 4 < chunk_pages,
            "indexing wrote {frames} pages; the tail's rows fill {chunk_pages}"
        );
        assert_eq!(unindexed(&conn), 0);
        index_is_true(&conn);
        // A second indexer (or the writer after `maintain --recompress`) finds nothing to do.
        let tx = conn.transaction().unwrap();
        assert_eq!(index_tail(&tx, path).unwrap(), tagsets * commits);
        tx.commit().unwrap();
        index_is_true(&conn);
        drop(w);
    }

    /// The index entries follow their chunks through everything that deletes or retimes
    /// one: eviction's delete, a merge of small chunks (which keeps the newest id with the
    /// run's new `ts_max`) and the clock hold's retime, indexed or still in the tail.
    #[test]
    fn the_chunk_index_stays_true_through_eviction_merging_and_retiming() {
        let (w, dir) = store_with(3, 2, 40);
        let path = dir.path();
        let mut conn = Connection::open(super::super::db_path(path)).unwrap();
        let tx = conn.transaction().unwrap();
        index_tail(&tx, path).unwrap();
        tx.commit().unwrap();
        drop(w);
        delete(&conn, path, [1, 2, 5]).unwrap();
        index_is_true(&conn);
        let c = sizes(&conn, path, &Scan::default()).unwrap();
        let (id, data): (i64, Vec<u8>) = conn
            .query_row(
                "SELECT id, data FROM chunks WHERE id = ?1",
                [c[3].id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        retime(&conn, path, id, 7, 8, &data).unwrap();
        index_is_true(&conn);
        let merged = merge_all(&mut conn, path);
        assert!(merged.removed > 50, "{merged:?}");
        index_is_true(&conn);
        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM chunk_index", [], |r| r.get(0))
            .unwrap();
        assert!(left < 10, "{left} entries after merging");
    }

    /// The status' write-rate sample decodes each chunk once: the counts kept from earlier
    /// samples plus the chunks committed since give what a fresh sample gives, through new
    /// commits sliding the window, an eviction inside it, a retimed chunk and merging. A
    /// chunk already counted is not decoded again: made undecodable, it still lets the kept
    /// sample answer, while a fresh one names it.
    #[test]
    fn the_rate_sample_decodes_each_chunk_once_and_says_what_a_fresh_one_says() {
        let (mut w, dir) = store_with(3, 2, 10);
        let path = dir.path();
        let mut conn = Connection::open(super::super::db_path(path)).unwrap();
        let mut kept = RateCache::default();
        let fresh = |c: &Connection| rate_sample(c, path, 20, &mut RateCache::default());
        let first = rate_sample(&conn, path, 20, &mut kept).unwrap();
        assert_eq!(first, fresh(&conn).unwrap());
        assert_eq!((first.points, first.values), (20, 40));
        commit_each(&mut w, 3, 1, 11..=20);
        drop(w);
        let slid = rate_sample(&conn, path, 20, &mut kept).unwrap();
        assert_eq!(slid, fresh(&conn).unwrap());
        assert_eq!((slid.points, slid.values, kept.window.len()), (20, 20, 20));
        delete(&conn, path, [55]).unwrap();
        assert_eq!(
            rate_sample(&conn, path, 20, &mut kept).unwrap(),
            fresh(&conn).unwrap()
        );
        let data: Vec<u8> = conn
            .query_row("SELECT data FROM chunks WHERE id = 50", [], |r| r.get(0))
            .unwrap();
        retime(&conn, path, 50, 7, 8, &data).unwrap();
        let retimed = rate_sample(&conn, path, 20, &mut kept).unwrap();
        assert_eq!(retimed, fresh(&conn).unwrap());
        assert!(retimed.span_ns > 19_000_000_000, "{retimed:?}");
        merge_all(&mut conn, path);
        let merged = rate_sample(&conn, path, 20, &mut kept).unwrap();
        assert_eq!(merged, fresh(&conn).unwrap());
        let newest = newest_id(&conn, path).unwrap();
        retime(&conn, path, newest, 7, 8, b"not a chunk").unwrap();
        rate_sample(&conn, path, 20, &mut kept).unwrap();
        let e = fresh(&conn).err().unwrap();
        assert!(e.to_string().contains(&format!("chunk {newest}")), "{e}");
    }

    /// Reading many tag sets at once gives each tag set's chunks, indexed and in the tail,
    /// in id order, exactly as reading them one at a time does.
    #[test]
    fn scanning_many_tag_sets_reads_the_tail_once_and_finds_what_one_at_a_time_finds() {
        let (mut w, dir) = store_with(20, 1, 5);
        let path = dir.path();
        let mut conn = Connection::open(super::super::db_path(path)).unwrap();
        let tx = conn.transaction().unwrap();
        index_tail(&tx, path).unwrap();
        tx.commit().unwrap();
        // More chunks after indexing: the tail.
        commit_each(&mut w, 20, 1, 6..=8);
        assert_eq!(unindexed(&conn), 60);
        let tagset_of = |key: &str| -> i64 {
            conn.query_row("SELECT id FROM tagsets WHERE key = ?1", [key], |r| r.get(0))
                .unwrap()
        };
        let want: Vec<i64> = ["m,s=3", "m,s=11", "m,s=17"]
            .iter()
            .map(|k| tagset_of(k))
            .collect();
        let s = Scan {
            ts_from: Some(2_000_000_000),
            ..Scan::default()
        };
        let mut one_at_a_time: Vec<(i64, i64)> = Vec::new();
        for &t in &want {
            let s = Scan {
                tagset: Some(t),
                ..s.clone()
            };
            scan(&conn, path, &s, |c| {
                one_at_a_time.push((c.tagset_id, c.id));
                Ok(ControlFlow::Continue(()))
            })
            .unwrap();
        }
        let mut together: Vec<(i64, i64)> = Vec::new();
        scan_tagsets(&conn, path, &s, want.iter().copied(), |c| {
            together.push((c.tagset_id, c.id));
            Ok(ControlFlow::Continue(()))
        })
        .unwrap();
        assert_eq!(
            one_at_a_time.len(),
            3 * 7,
            "4 indexed and 3 tail chunks each"
        );
        for &t in &want {
            let of = |v: &[(i64, i64)]| -> Vec<i64> {
                v.iter().filter(|c| c.0 == t).map(|c| c.1).collect()
            };
            assert_eq!(of(&together), of(&one_at_a_time), "tag set {t}");
        }
        assert_eq!(together.len(), one_at_a_time.len());
    }

    /// However many tag sets, the tail is indexed once it holds `TAIL_MAX_ROWS` chunks (each
    /// read of one tag set scans it), before it reaches `TAIL_ROWS_PER_TAGSET` of each.
    #[test]
    fn the_tail_is_indexed_at_tail_max_rows_whatever_the_tag_sets() {
        let tagsets = 400;
        assert!(
            tagsets * TAIL_ROWS_PER_TAGSET > TAIL_MAX_ROWS,
            "the test needs more tag sets"
        );
        let commits = TAIL_MAX_ROWS / tagsets;
        let (mut w, dir) = store_with(tagsets, 1, commits - 1);
        let conn = Connection::open(super::super::db_path(dir.path())).unwrap();
        assert_eq!(indexed_through(&conn, dir.path()).unwrap(), 0);
        // The next commit (same writer: it counts the tail's tag sets) reaches TAIL_MAX_ROWS.
        use crate::model::{Batch, Line, Value};
        let batch = Batch {
            lines: (0..tagsets)
                .map(|s| Line {
                    key: format!("m,s={s}"),
                    fields: vec![("f0".to_string(), Value::F64(1.0))],
                    ts: (commits + 1) * 1_000_000_000,
                    line_no: 0,
                })
                .collect(),
        };
        w.write(&[&batch]).unwrap();
        assert_eq!(indexed_through(&conn, dir.path()).unwrap(), TAIL_MAX_ROWS);
        assert_eq!(unindexed(&conn), 0);
    }
}
