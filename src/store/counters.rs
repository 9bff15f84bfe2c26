//! The `counters` table: monotonic totals kept across restarts and processes (evictions,
//! clock corrections) and each tier's live row count. [`bump`] runs inside the caller's
//! transaction, so a count moves exactly when the rows it counts do.
//!
//! Never resets a counter; the names are the callers' (see [`tier_rows`] for the one this
//! module spells itself, and [`corrupt_skipped`]).

use std::collections::HashMap;
use std::path::Path;

use rusqlite::{params, Connection};

use super::open::Ctx;
use super::StoreError;

/// Small chunks a merge replaced ([`super::compact`]): a reader that keeps decoded points
/// across reads learns from it that committed chunks changed.
pub const MERGED_RAW_CHUNKS: &str = "merged_raw_chunks";

/// The counter holding tier `tier_key`'s live row count (migration 0004).
pub fn tier_rows(tier_key: i64) -> String {
    format!("rows_{tier_key}")
}

/// The counter of points tier `tier_key`'s fold left out of a stored row whose sketch
/// does not decode (see `rollup::fold`).
pub fn corrupt_skipped(tier_key: i64) -> String {
    format!("corrupt_skipped_{tier_key}")
}

/// The counter `name` (0 when it does not exist yet).
pub fn get(conn: &Connection, path: &Path, name: &str) -> Result<i64, StoreError> {
    value(conn, name).ctx(path)
}

/// [`get`] with SQLite's own error (for callers that map errors themselves).
pub fn value(conn: &Connection, name: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT COALESCE((SELECT value FROM counters WHERE name = ?1), 0)")?
        .query_row([name], |r| r.get(0))
}

/// Every counter.
pub fn all(conn: &Connection, path: &Path) -> Result<HashMap<String, i64>, StoreError> {
    let mut st = conn
        .prepare_cached("SELECT name, value FROM counters")
        .ctx(path)?;
    st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .and_then(|rows| rows.collect())
        .ctx(path)
}

/// Adds `n` to the counter `name` (created at `n`), inside the caller's transaction.
pub fn bump(tx: &Connection, path: &Path, name: &str, n: i64) -> Result<(), StoreError> {
    if n == 0 {
        return Ok(());
    }
    tx.prepare_cached(
        "INSERT INTO counters (name, value) VALUES (?1, ?2) \
         ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
    )
    .and_then(|mut st| st.execute(params![name, n]))
    .map(|_| ())
    .ctx(path)
}
