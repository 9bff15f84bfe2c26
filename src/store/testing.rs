//! Test-only views of the tables that no production code needs (whole-table dumps, exact
//! row counts, a sink row with a chosen cursor, dictionary entries without chunks, an older
//! schema): kept here so that tests
//! elsewhere issue no SQL of their own. Compiled only for tests.

use std::path::Path;

use rusqlite::Connection;

use super::db_path;

fn conn(dir: &Path) -> Connection {
    Connection::open(db_path(dir)).expect("open the test store")
}

/// One `rollups` row, every column in table order.
pub type RollupRow = (
    i64,
    i64,
    i64,
    i64,
    f64,
    f64,
    f64,
    i64,
    f64,
    i64,
    f64,
    Vec<u8>,
);

/// Every tier row (`rollups` and `rollups_recent`), by tier, series and bucket.
pub fn rollup_rows(dir: &Path) -> Vec<RollupRow> {
    let c = conn(dir);
    let cols =
        "tier, series_id, bucket, count, sum, min, max, first_ts, first, last_ts, last, sketch";
    let mut st = c
        .prepare(&format!(
            "SELECT {cols} FROM rollups UNION ALL SELECT {cols} FROM rollups_recent \
             ORDER BY tier, series_id, bucket"
        ))
        .unwrap();
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
                r.get(9)?,
                r.get(10)?,
                r.get(11)?,
            ))
        })
        .unwrap();
    rows.map(|r| r.unwrap()).collect()
}

/// Rows of tier `key`, counted in the table (not the counter).
pub fn count_tier_rows(dir: &Path, key: i64) -> i64 {
    conn(dir)
        .query_row(
            "SELECT (SELECT COUNT(*) FROM rollups WHERE tier = ?1) \
                  + (SELECT COUNT(*) FROM rollups_recent WHERE tier = ?1)",
            [key],
            |r| r.get(0),
        )
        .unwrap()
}

/// Chunk rows in the store.
pub fn count_chunks(dir: &Path) -> i64 {
    conn(dir)
        .query_row("SELECT COUNT(*) FROM chunks", [], |r| r.get(0))
        .unwrap()
}

/// Adds sink `name` with its cursor at `cursor`.
pub fn add_sink(dir: &Path, name: &str, cursor: i64) {
    conn(dir)
        .execute(
            "INSERT INTO sinks (name, cursor_chunk_id) VALUES (?1, ?2)",
            rusqlite::params![name, cursor],
        )
        .unwrap();
}

/// Takes a current store back to schema version 3 as it would have been (no tier row
/// counters, no `clock_fix`), keeping its data.
pub fn downgrade_to_v3(dir: &Path) {
    let c = conn(dir);
    c.execute("DELETE FROM counters WHERE name LIKE 'rows_%'", [])
        .unwrap();
    c.execute("DELETE FROM schema_migrations WHERE version >= 4", [])
        .unwrap();
    c.execute("DROP TABLE clock_fix", []).unwrap();
    // Migration 0010's columns (bandwidth-aware forwarding).
    for col in [
        "rollup_tier",
        "rollup_cursor_bucket",
        "rollup_inflight_bucket",
        "rollup_evicted_rows",
    ] {
        c.execute(&format!("ALTER TABLE sinks DROP COLUMN {col}"), [])
            .unwrap();
    }
    // Migration 0011's column (the outbox bound).
    c.execute("ALTER TABLE notifiers DROP COLUMN pruned_unsent", [])
        .unwrap();
    // Migration 0017's merge cursor.
    c.execute("DROP TABLE merge_state", []).unwrap();
    // Migration 0015's index table: back to 0012's partial index.
    c.execute_batch(
        "DROP TRIGGER chunk_index_delete; DROP TRIGGER chunk_index_retime; DROP TABLE chunk_index; \
         CREATE INDEX chunks_tagset_ts_max ON chunks (tagset_id, ts_max) WHERE indexed = 1;",
    )
    .unwrap();
    // Migration 0012's unindexed tail: back to one full index.
    c.execute_batch(
        "DROP INDEX chunks_tagset_ts_max; ALTER TABLE chunks DROP COLUMN indexed; \
         DROP TABLE chunk_tail; CREATE INDEX chunks_tagset_ts_max ON chunks (tagset_id, ts_max);",
    )
    .unwrap();
    // Migration 0014's recent tier rows: back into the one tier table.
    let cols =
        "tier, series_id, bucket, count, sum, min, max, first_ts, first, last_ts, last, sketch";
    c.execute_batch(&format!(
        "INSERT INTO rollups ({cols}) SELECT {cols} FROM rollups_recent; DROP TABLE rollups_recent; \
         ALTER TABLE rollup_state DROP COLUMN settled_through;"
    ))
    .unwrap();
    c.pragma_update(None, "user_version", 3).unwrap();
}

/// Adds tag set `key` (of `measurement`, tags as a JSON object) with float series `fields`,
/// through the writer's own inserts; returns the tag set's id and the series' ids, in
/// `fields` order.
pub fn add_tagset(
    dir: &Path,
    key: &str,
    measurement: &str,
    tags_json: &str,
    fields: &[&str],
) -> (i64, Vec<i64>) {
    let c = conn(dir);
    let mut ins = super::dict::Inserts::begin_on_first(&c);
    let tagset = ins.tagset(key, measurement, tags_json).unwrap();
    let series = fields
        .iter()
        .map(|f| ins.series(tagset, f, crate::model::Kind::Float, 0).unwrap())
        .collect();
    ins.commit().unwrap();
    (tagset, series)
}

/// Overwrites chunk `id`'s data (corruption tests).
pub fn set_chunk_data(dir: &Path, id: i64, data: &[u8]) {
    conn(dir)
        .execute(
            "UPDATE chunks SET data = ?2 WHERE id = ?1",
            rusqlite::params![id, data],
        )
        .unwrap();
}

/// Records a tier cursor (as the rollup job would after folding through `cursor`).
pub fn set_tier_cursor(dir: &Path, tier: i64, cursor: i64) {
    conn(dir)
        .execute(
            "INSERT OR REPLACE INTO rollup_state (tier, cursor, watermark_ns, late_points, updated_ns) \
             VALUES (?1, ?2, 0, 0, 0)",
            [tier, cursor],
        )
        .unwrap();
}

/// Rows of tier `key` in `rollups` (settled) and in `rollups_recent`.
pub fn tier_rows_by_table(dir: &Path, key: i64) -> (i64, i64) {
    conn(dir)
        .query_row(
            "SELECT (SELECT COUNT(*) FROM rollups WHERE tier = ?1), \
                    (SELECT COUNT(*) FROM rollups_recent WHERE tier = ?1)",
            [key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
}

/// Copies the WAL into the database and empties it (no reader may be open).
pub fn checkpoint_truncate(dir: &Path) {
    let (busy, _, _): (i64, i64, i64) = conn(dir)
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(busy, 0, "the checkpoint could not finish");
}

/// The store's page size in bytes.
pub fn page_size(dir: &Path) -> u64 {
    conn(dir)
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap()
}

/// Frames (page writes) in the WAL file now.
pub fn wal_frames(dir: &Path) -> u64 {
    let wal = dir.join(format!("{}-wal", super::DB_FILE));
    let len = std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0);
    len.saturating_sub(32) / (page_size(dir) + 24)
}

/// The page number of each frame in the WAL now, in order.
pub fn wal_pages(dir: &Path) -> Vec<u32> {
    let wal = dir.join(format!("{}-wal", super::DB_FILE));
    let bytes = std::fs::read(wal).unwrap_or_default();
    let page = page_size(dir) as usize;
    bytes
        .get(32..)
        .unwrap_or_default()
        .chunks_exact(page + 24)
        .map(|f| u32::from_be_bytes([f[0], f[1], f[2], f[3]]))
        .collect()
}

/// Parses `body` (line protocol, ns) as received at `now` and writes it with a writer of
/// its own, as one commit; panics on any parse error.
pub fn write_body(dir: &Path, body: &str, now: i64) {
    let parsed =
        crate::ingest::lineproto::parse_body(body, crate::ingest::lineproto::Precision::Nanos, now);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    super::Writer::open(dir, 1_000, crate::config::Synchronous::Normal)
        .unwrap()
        .write(&[&parsed.batch])
        .unwrap();
}
