//! The `clock_fix` table: the hold recorded while this boot's clock is not set (see
//! [`crate::clock`] for what it means and when it is settled). Typed reads and writes of its
//! rows; the writes run inside the caller's `BEGIN IMMEDIATE` transaction.
//!
//! Never decides whether the clock is set and never touches chunks.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use super::open::Ctx;
use super::StoreError;

/// One boot's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fix {
    /// `/proc/sys/kernel/random/boot_id` of the boot.
    pub boot_id: String,
    /// Realtime minus `CLOCK_BOOTTIME` when it was noted, ns.
    pub offset_ns: i64,
    /// First chunk id written on the unset clock.
    pub first_chunk_id: i64,
    /// Last chunk id already corrected (0: none).
    pub fixed_through: i64,
    /// When the correction started (0: not yet), ns.
    pub synced_ns: i64,
}

/// The chunk id from which rollup and forwarding must wait (`None`: nothing held).
pub fn hold_from(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached("SELECT MIN(first_chunk_id) FROM clock_fix")?
        .query_row([], |r| r.get(0))
}

/// Every record but `boot_id`'s, oldest first.
pub fn others(tx: &Connection, path: &Path, boot_id: &str) -> Result<Vec<Fix>, StoreError> {
    let mut st = tx
        .prepare_cached(
            "SELECT boot_id, offset_ns, first_chunk_id, fixed_through, synced_ns FROM clock_fix \
             WHERE boot_id != ?1 ORDER BY first_chunk_id",
        )
        .ctx(path)?;
    st.query_map([boot_id], fix_row)
        .and_then(|rows| rows.collect())
        .ctx(path)
}

fn fix_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Fix> {
    Ok(Fix {
        boot_id: r.get(0)?,
        offset_ns: r.get(1)?,
        first_chunk_id: r.get(2)?,
        fixed_through: r.get(3)?,
        synced_ns: r.get(4)?,
    })
}

/// `boot_id`'s record, if any.
pub fn get(tx: &Connection, path: &Path, boot_id: &str) -> Result<Option<Fix>, StoreError> {
    tx.prepare_cached(
        "SELECT boot_id, offset_ns, first_chunk_id, fixed_through, synced_ns FROM clock_fix \
         WHERE boot_id = ?1",
    )
    .and_then(|mut st| st.query_row([boot_id], fix_row).optional())
    .ctx(path)
}

/// Records `boot_id`'s hold from chunk `first_chunk_id` on.
pub fn insert(
    tx: &Connection,
    path: &Path,
    boot_id: &str,
    offset_ns: i64,
    first_chunk_id: i64,
    now: i64,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO clock_fix (boot_id, offset_ns, first_chunk_id, noted_ns) VALUES (?1, ?2, ?3, ?4)",
        params![boot_id, offset_ns, first_chunk_id, now],
    )
    .map(|_| ())
    .ctx(path)
}

/// Notes how far `boot_id`'s chunks are corrected and when the correction started.
pub fn set_progress(
    tx: &Connection,
    path: &Path,
    boot_id: &str,
    fixed_through: i64,
    synced_ns: i64,
) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE clock_fix SET fixed_through = ?2, synced_ns = ?3 WHERE boot_id = ?1",
        params![boot_id, fixed_through, synced_ns],
    )
    .map(|_| ())
    .ctx(path)
}

/// Deletes `boot_id`'s record (the hold lifts when no record is left).
pub fn delete(tx: &Connection, path: &Path, boot_id: &str) -> Result<(), StoreError> {
    tx.execute("DELETE FROM clock_fix WHERE boot_id = ?1", [boot_id])
        .map(|_| ())
        .ctx(path)
}
