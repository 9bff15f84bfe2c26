//! Opening the database: one [`open`] for every kind of connection the agent holds (the
//! ingest writer, read-only readers, the rollup job, a forwarder's cursor), each with its
//! pragmas, and the schema-version check done once, here. The writer's open also creates the
//! data directory and applies pending migrations in one transaction. Also the one helper
//! ([`Ctx`]) that puts the database path on a SQLite error.
//!
//! A database written by a newer schema is refused before anything could modify it. Nothing
//! here reads or writes the schema's tables beyond `schema_migrations`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OpenFlags};

use super::{db_path, latest_version, StoreError, MIGRATIONS};
use crate::config::Synchronous;

/// WAL bytes past which a commit checkpoints (SQLite's default is 1,000 pages): 16 MiB,
/// whatever the page size; less under a disk budget too small for it
/// (`rollup::wal_checkpoint_bytes`, [`space::checkpoint_every`]). Measured by
/// `scripts/device_budget.py --io-trace` (docs/performance.md).
pub const WAL_CHECKPOINT_BYTES: i64 = 16 << 20;

/// Page size of a new database, set explicitly rather than left to the SQLite build. Every
/// commit writes a few pages whatever it stores (page 1, a pointer map, `sqlite_sequence`, a
/// sink's row, the leaves it appends to), each a whole WAL frame, so smaller pages write
/// less: on the reference workload 2 KiB wrote 10-13 % fewer bytes than 4 KiB for 2 % more
/// store. They were not taken: a tier row longer than ~490 bytes (the sketch of a dense,
/// widely spread latency series) no longer fits a 2 KiB page and spills to an overflow page,
/// and the 24-hour p99 dashboard query at 1-minute steps took 56-59 ms instead of 32-33 ms
/// (`cargo bench --bench query`; target 50 ms). docs/performance.md has the runs. An existing
/// database keeps its page size.
pub const PAGE_SIZE: i64 = 4_096;

/// What a connection is for; decides its flags, pragmas and which schema versions it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Read-only, beside a running writer (API, engine, `/metrics`, `edgewatch query`,
    /// forwarders' reads). The database must exist and not be newer than this binary.
    ReadOnly,
    /// The single ingest writer: creates the directory and the database if needed, switches
    /// it to incremental auto-vacuum and WAL, and migrates it to the current schema.
    Writer(Synchronous),
    /// The rollup job, the clock hold and `edgewatch maintain`: a second read-write
    /// connection with a larger cache. The database must exist at exactly this binary's
    /// schema version (the writer migrates; this never does).
    Job,
    /// A forwarder's cursor: a small read-write connection for short transactions on its
    /// own rows. Same version rule as [`Mode::Job`].
    Cursor,
}

/// Puts the database path on a SQLite error: `stmt.execute(..).ctx(path)?`.
pub trait Ctx<T> {
    /// The result with its error as [`StoreError::Sqlite`] on `path`.
    fn ctx(self, path: &Path) -> Result<T, StoreError>;
}

impl<T> Ctx<T> for rusqlite::Result<T> {
    fn ctx(self, path: &Path) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// `e` with the operating system's cause made explicit where SQLite hides it: an IO error
/// whose failing call got `EROFS` becomes [`StoreError::ReadOnlyFs`]. Call right after the
/// failing statement on `conn` (SQLite keeps the last call's errno per connection).
pub(crate) fn os_cause(conn: &rusqlite::Connection, e: StoreError) -> StoreError {
    match e {
        StoreError::Sqlite { path, source }
            if source.sqlite_error_code() == Some(rusqlite::ErrorCode::SystemIoFailure) =>
        {
            // SAFETY: `conn.handle()` is the live connection's handle, used only for this
            // read of its last OS error number.
            let errno = unsafe { rusqlite::ffi::sqlite3_system_errno(conn.handle()) };
            if errno == libc::EROFS {
                StoreError::ReadOnlyFs { path, source }
            } else {
                StoreError::Sqlite { path, source }
            }
        }
        other => other,
    }
}

impl<T> Ctx<T> for Result<T, rusqlite::types::FromSqlError> {
    fn ctx(self, path: &Path) -> Result<T, StoreError> {
        self.map_err(|e| StoreError::Sqlite {
            path: path.to_path_buf(),
            source: e.into(),
        })
    }
}

/// Opens the database in `dir` for `mode`; returns the connection and the file's path.
pub fn open(dir: &Path, mode: Mode) -> Result<(Connection, PathBuf), StoreError> {
    let path = db_path(dir);
    if let Mode::Writer(_) = mode {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
        // A read-only file system (remounted after IO errors) or directory: say so, rather
        // than SQLite's "unable to open database file".
        writable(dir).map_err(|source| StoreError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
    } else if !path.exists() {
        return Err(StoreError::Missing(path));
    }
    let conn = match mode {
        Mode::ReadOnly => Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        ),
        _ => Connection::open(&path),
    }
    .ctx(&path)?;
    conn.busy_timeout(Duration::from_secs(5)).ctx(&path)?;
    // The query planner's stability guarantee: a plan never depends on a bound value. Without
    // it SQLite plans a `LIMIT ?` with the value bound and marks the statement stale when
    // the parameter is bound again, so every run of such a cached statement (the sinks'
    // chunk reads) was parsed and planned twice: 4 % of the agent's CPU in a profile of
    // the reference workload. No plan here uses a bound value: there is no `sqlite_stat4`,
    // and the one LIKE (the series search) matches with a leading `%`, which no index serves.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .ctx(&path)?;
    // Refuse a newer database before anything below could modify it (the one-time VACUUM,
    // the journal mode, migrations).
    check_version(&conn, &path, mode)?;
    if let Mode::Writer(_) = mode {
        new_database_page_size(&conn, &path)?;
    }
    if mode != Mode::ReadOnly {
        // Whichever read-write connection commits past this much WAL checkpoints. A
        // checkpoint writes every page the WAL holds into the database file once, however
        // often it changed: the rarer, the fewer times the hot pages (the chunk tail, the
        // dictionary's last leaf, counters, cursors) are rewritten. Durability does not
        // depend on it (see `Synchronous`); the WAL's size does (WAL_CHECKPOINT_BYTES).
        space::checkpoint_every(&conn, &path, WAL_CHECKPOINT_BYTES as u64)?;
    }
    match mode {
        Mode::ReadOnly => {
            conn.pragma_update(None, "cache_size", -1024).ctx(&path)?;
            // Every query shape the API and the engine run stays prepared (the default 16
            // is fewer than the shapes there are: each eviction is a re-parse on the next
            // query).
            conn.set_prepared_statement_cache_capacity(64);
            Ok((conn, path))
        }
        Mode::Writer(sync) => {
            let mut conn = conn;
            ensure_incremental_vacuum(&conn, &path)?;
            conn.pragma_update(None, "journal_mode", "WAL").ctx(&path)?;
            conn.pragma_update(
                None,
                "synchronous",
                match sync {
                    Synchronous::Normal => "NORMAL",
                    Synchronous::Full => "FULL",
                },
            )
            .ctx(&path)?;
            conn.pragma_update(None, "foreign_keys", "ON").ctx(&path)?;
            // Small cache: the writer appends; steady RSS matters more than read speed.
            conn.pragma_update(None, "cache_size", -2048).ctx(&path)?;
            migrate(&mut conn, &path)?;
            // Statement journals in memory: once one outgrew 64 KiB SQLite kept it in a
            // temp file for the connection's life and rewrote its pages there for every
            // chunk insert (~7 writes a second on the reference workload, flushed to the
            // card every 30 s). The writer's statements touch a few pages each; set after the
            // migrations, whose sorts may be large.
            conn.pragma_update(None, "temp_store", "MEMORY")
                .ctx(&path)?;
            Ok((conn, path))
        }
        Mode::Job => {
            conn.pragma_update(None, "journal_mode", "WAL").ctx(&path)?;
            // NORMAL: the job acknowledges nothing to anyone. A power cut may roll back its
            // last transactions (a rollup step, an eviction, a clock fix), never tear one:
            // each is redone from the state it committed with it. Checkpoints sync in NORMAL
            // too, so the writer's synced frames are never lost through the job.
            conn.pragma_update(None, "synchronous", "NORMAL")
                .ctx(&path)?;
            conn.pragma_update(None, "cache_size", -4096).ctx(&path)?;
            Ok((conn, path))
        }
        Mode::Cursor => {
            // FULL whatever `[storage] synchronous` says: a cursor move records that a remote
            // acknowledged a batch; rolled back by a power cut it would re-send that batch.
            // One sync per forwarded batch is cheap.
            conn.pragma_update(None, "synchronous", "FULL").ctx(&path)?;
            conn.pragma_update(None, "cache_size", -256).ctx(&path)?;
            // One-row updates: their statement journals stay in memory (see the writer's).
            conn.pragma_update(None, "temp_store", "MEMORY")
                .ctx(&path)?;
            Ok((conn, path))
        }
    }
}

/// `Ok` when the process may write in `dir` (access(2) W_OK: catches a read-only mount
/// even for root).
fn writable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The schema version of an open database (`PRAGMA user_version`).
pub fn schema_version(conn: &Connection, path: &Path) -> Result<u32, StoreError> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .ctx(path)
}

/// The one schema-version check: never newer than this binary; exactly current for the
/// connections that do not migrate but write.
/// The oldest schema a read-only connection can read.
const READ_VERSION: u32 = 15;

fn check_version(conn: &Connection, path: &Path, mode: Mode) -> Result<(), StoreError> {
    let found = schema_version(conn, path)?;
    let latest = latest_version();
    if found > latest {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found,
            supported: latest,
        });
    }
    // Readers need the chunk index table (`0015_chunk_index.sql`) to read one tag set.
    let stale = match mode {
        Mode::Job | Mode::Cursor => found != latest,
        Mode::ReadOnly => found < READ_VERSION,
        Mode::Writer(_) => false,
    };
    if stale {
        return Err(StoreError::NotMigrated {
            path: path.to_path_buf(),
            found,
            expected: latest,
        });
    }
    Ok(())
}

/// Applies every pending migration in one transaction.
fn migrate(conn: &mut Connection, path: &Path) -> Result<u32, StoreError> {
    let current = schema_version(conn, path)?;
    let latest = latest_version();
    if current >= latest {
        return Ok(current);
    }
    let tx = conn.transaction().ctx(path)?;
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        tracing::info!(version, name, "applying database migration");
        tx.execute_batch(sql).ctx(path)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_ns) VALUES (?1, ?2, ?3)",
            params![version, name, crate::now_ns()],
        )
        .ctx(path)?;
        tx.pragma_update(None, "user_version", version).ctx(path)?;
    }
    tx.commit().ctx(path)?;
    Ok(latest)
}

/// Gives a database that has no page yet [`PAGE_SIZE`] pages; an existing one keeps its own.
/// Runs before anything writes the file (the auto-vacuum mode, WAL, the migrations).
fn new_database_page_size(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .ctx(path)?;
    if pages == 0 {
        conn.pragma_update(None, "page_size", PAGE_SIZE).ctx(path)?;
    }
    Ok(())
}

/// Puts the database in `auto_vacuum = INCREMENTAL` mode, so the rollup job's
/// `PRAGMA incremental_vacuum` can give evicted pages back to the file system. On a new
/// database the pragma alone is enough (it must precede the first table); a database created
/// before this mode existed needs one `VACUUM` outside WAL mode, done here once, at open,
/// before ingest starts (it rewrites the file: seconds per GB). Runs before WAL is turned on.
fn ensure_incremental_vacuum(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .ctx(path)?;
    if mode == 2 {
        return Ok(());
    }
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
        .ctx(path)?;
    let tables: i64 = conn
        .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
        .ctx(path)?;
    if tables > 0 {
        tracing::info!(db = %path.display(), "switching the store to incremental auto-vacuum (one-time VACUUM)");
        // VACUUM cannot change auto_vacuum in WAL mode; WAL is turned back on by the caller.
        conn.execute_batch(
            "PRAGMA journal_mode = DELETE; PRAGMA auto_vacuum = INCREMENTAL; VACUUM;",
        )
        .ctx(path)?;
    }
    Ok(())
}

/// Space and file maintenance on a [`Mode::Job`] connection.
pub mod space {
    use super::*;

    /// Bytes the store occupies: live pages plus the WAL file.
    pub fn db_bytes(conn: &Connection, path: &Path) -> Result<u64, StoreError> {
        Ok(pages_bytes(conn, path, "page_count")? + wal_bytes(path))
    }

    /// Bytes in the pages that hold data: `page_count` less the free pages, × `page_size`
    /// (the WAL not included).
    pub fn used_bytes(conn: &Connection, path: &Path) -> Result<u64, StoreError> {
        Ok(file_bytes(conn, path)?.saturating_sub(free_bytes(conn, path)?))
    }

    /// Bytes in the database file's pages, free ones included (`page_count` × `page_size`).
    pub fn file_bytes(conn: &Connection, path: &Path) -> Result<u64, StoreError> {
        pages_bytes(conn, path, "page_count")
    }

    /// Bytes in the database's free pages (`freelist_count` × `page_size`).
    pub fn free_bytes(conn: &Connection, path: &Path) -> Result<u64, StoreError> {
        pages_bytes(conn, path, "freelist_count")
    }

    /// The page count `PRAGMA count_pragma` reports, in bytes (× `page_size`).
    fn pages_bytes(conn: &Connection, path: &Path, count_pragma: &str) -> Result<u64, StoreError> {
        let pages: i64 = conn
            .query_row(&format!("PRAGMA {count_pragma}"), [], |r| r.get(0))
            .ctx(path)?;
        Ok(pages.max(0) as u64 * page_size(conn, path)?)
    }

    /// The database's page size in bytes (at least 512, SQLite's smallest).
    fn page_size(conn: &Connection, path: &Path) -> Result<u64, StoreError> {
        let size: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .ctx(path)?;
        Ok(size.max(512) as u64)
    }

    /// Bytes in the WAL file (0 when there is none).
    pub fn wal_bytes(path: &Path) -> u64 {
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        std::fs::metadata(PathBuf::from(wal))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// Whether the database is in incremental auto-vacuum mode (see the writer's open).
    pub fn incremental_vacuum(conn: &Connection, path: &Path) -> Result<bool, StoreError> {
        let mode: i64 = conn
            .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
            .ctx(path)?;
        Ok(mode == 2)
    }

    /// Returns free pages to the file system and truncates the WAL; `false` when a reader
    /// holding an old snapshot kept the WAL from being truncated (best effort).
    pub fn shrink(conn: &Connection, path: &Path) -> Result<bool, StoreError> {
        shrink_to(conn, path, 0, 0)
    }

    /// Gives back free pages until the file holds at most `fit` bytes of pages (none when it
    /// already does; never more than the free pages), and truncates the WAL when the file
    /// and the WAL together are over `fit + wal_room`. Free pages below `fit` stay for the
    /// next writes. `false` when a reader kept the WAL from being truncated (best effort).
    pub fn shrink_to(
        conn: &Connection,
        path: &Path,
        fit: u64,
        wal_room: u64,
    ) -> Result<bool, StoreError> {
        let page = page_size(conn, path)?;
        let excess = file_bytes(conn, path)?.saturating_sub(fit).div_ceil(page);
        let give = excess.min(free_bytes(conn, path)? / page);
        if give > 0 {
            // `incremental_vacuum(0)` would give back every free page: `give` is at least 1.
            let mut st = conn
                .prepare(&format!("PRAGMA incremental_vacuum({give})"))
                .ctx(path)?;
            let mut rows = st.query([]).ctx(path)?;
            while rows.next().ctx(path)?.is_some() {}
        }
        if file_bytes(conn, path)? + wal_bytes(path) <= fit.saturating_add(wal_room) {
            return Ok(true);
        }
        let (busy, _, _): (i64, i64, i64) = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .ctx(path)?;
        Ok(busy == 0)
    }

    /// Has this connection checkpoint past `bytes` of WAL instead of [`WAL_CHECKPOINT_BYTES`]
    /// (a disk budget too small for a WAL that long: see `rollup::wal_checkpoint_bytes`).
    pub fn checkpoint_every(conn: &Connection, path: &Path, bytes: u64) -> Result<(), StoreError> {
        let pages = (bytes / page_size(conn, path)?).max(16);
        conn.pragma_update(None, "wal_autocheckpoint", pages as i64)
            .ctx(path)
    }

    /// Gives SQLite's page cache back (between rollup runs).
    pub fn release_memory(conn: &Connection, path: &Path) -> Result<(), StoreError> {
        conn.execute_batch("PRAGMA shrink_memory").ctx(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Value;
    use crate::store::bucket::Acc;
    use crate::store::query::RawQuery;
    use crate::store::{clockfix, codec, counters, tiers, Reader, Writer};

    const NS: i64 = 1_000_000_000;
    const T0: i64 = 1_760_000_000 * NS;

    /// A store as edgewatch at schema version `version` left it: created without incremental
    /// auto-vacuum (as stores were before it), migrations applied by hand, holding data of
    /// every table that version had.
    fn old_store(dir: &Path, version: u32) -> Connection {
        let conn = Connection::open(db_path(dir)).unwrap();
        conn.pragma_update(None, "auto_vacuum", "NONE").unwrap();
        for (v, name, sql) in MIGRATIONS.iter().filter(|m| m.0 <= version) {
            conn.execute_batch(sql).unwrap();
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_ns) VALUES (?1, ?2, 1)",
                params![v, name],
            )
            .unwrap();
            conn.pragma_update(None, "user_version", v).unwrap();
        }
        conn.execute_batch(
            "INSERT INTO tagsets (id, key, measurement, tags) VALUES \
               (1, 'cpu,host=a', 'cpu', '{\"host\":\"a\"}'), \
               (2, 'gpu,gpu=0', 'gpu', '{\"gpu\":\"0\"}'); \
             INSERT INTO series (id, tagset_id, field, kind, created_ns) VALUES \
               (1, 1, 'usage', 0, 1), (2, 1, 'procs', 1, 1), (3, 2, 'temp_c', 0, 1);",
        )
        .unwrap();
        // Two chunks as the writer packs them: cpu (usage, procs) x 3, gpu temp_c x 2.
        let chunk = |points: &[(i64, Vec<(i64, Value)>)]| {
            let mut data = Vec::new();
            let mut prev = points[0].0;
            for (ts, values) in points {
                codec::encode_point_header(&mut data, prev, *ts, values.len());
                for (sid, v) in values {
                    codec::encode_value(&mut data, *sid, v);
                }
                prev = *ts;
            }
            data
        };
        let cpu = chunk(
            &(0..3)
                .map(|i| {
                    (
                        T0 + i * NS,
                        vec![(1, Value::F64(10.0 + i as f64)), (2, Value::I64(100 + i))],
                    )
                })
                .collect::<Vec<_>>(),
        );
        let gpu = chunk(&[
            (T0 + 30 * NS, vec![(3, Value::F64(55.5))]),
            (T0 + 90 * NS, vec![(3, Value::F64(61.0))]),
        ]);
        conn.execute(
            "INSERT INTO chunks (id, tagset_id, ts_min, ts_max, n, data) VALUES \
             (1, 1, ?1, ?2, 3, ?3), (2, 2, ?4, ?5, 2, ?6)",
            params![T0, T0 + 2 * NS, cpu, T0 + 30 * NS, T0 + 90 * NS, gpu],
        )
        .unwrap();
        if version >= 2 {
            // Both chunks rolled up: 1 min rows for the three float/int series, 1 h rows.
            for (tier, res) in [(60, 60 * NS), (3600, 3600 * NS)] {
                for (sid, pts) in [
                    (1, vec![(T0, 10.0), (T0 + NS, 11.0), (T0 + 2 * NS, 12.0)]),
                    (2, vec![(T0, 100.0), (T0 + NS, 101.0), (T0 + 2 * NS, 102.0)]),
                    (3, vec![(T0 + 30 * NS, 55.5), (T0 + 90 * NS, 61.0)]),
                ] {
                    let mut buckets: std::collections::BTreeMap<i64, Acc> = Default::default();
                    for (ts, v) in pts {
                        buckets
                            .entry(crate::store::bucket::bucket_start(ts, res))
                            .or_default()
                            .add(ts, v);
                    }
                    for (b, acc) in buckets {
                        // Settled: `rollups`, the one tier table of these versions.
                        tiers::put(&conn, &db_path(dir), tier, i64::MAX, sid, b, &acc, false)
                            .unwrap();
                    }
                }
                // The columns of version 2 (`tiers::put_state` writes today's).
                conn.execute(
                    "INSERT INTO rollup_state (tier, cursor, watermark_ns, late_points, updated_ns) \
                     VALUES (?1, 2, ?2, 0, ?3)",
                    rusqlite::params![tier, T0 + 90 * NS, T0 + 100 * NS],
                )
                .unwrap();
            }
            conn.execute_batch(
                "INSERT INTO sinks (name, cursor_chunk_id) VALUES ('influx', 1); \
                 INSERT INTO counters (name, value) VALUES ('evicted_raw_chunks', 4);",
            )
            .unwrap();
        }
        if version >= 3 {
            conn.execute_batch("UPDATE sinks SET batch_seq = 7, forwarded_points = 3")
                .unwrap();
        }
        if version >= 4 {
            // From 0004 on the job keeps each tier's row count beside its rows.
            counters::bump(&conn, &db_path(dir), &counters::tier_rows(60), 4).unwrap();
            counters::bump(&conn, &db_path(dir), &counters::tier_rows(3600), 3).unwrap();
        }
        conn
    }

    /// Every older schema version, holding data, upgrades through every later migration:
    /// the version and the migration log are current, 0004's backfill counted the rollup rows
    /// that were there, and the points, rollup rows, sink state and counters read back.
    #[test]
    fn an_older_store_with_data_upgrades_through_every_migration() {
        let latest = latest_version();
        assert!(latest >= 5, "this test knows migrations up to 0005");
        for start in 1..latest {
            let dir = tempfile::tempdir().unwrap();
            drop(old_store(dir.path(), start));
            let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
            let reader = Reader::open(dir.path()).unwrap();
            let (conn, path) = (reader.conn(), reader.path());
            let at = format!("from version {start}");
            assert_eq!(schema_version(conn, path).unwrap(), latest, "{at}");
            let logged: Vec<u32> = conn
                .prepare("SELECT version FROM schema_migrations ORDER BY version")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .map(|r| r.unwrap())
                .collect();
            assert_eq!(logged, (1..=latest).collect::<Vec<_>>(), "{at}");
            assert!(space::incremental_vacuum(conn, path).unwrap(), "{at}");
            // The raw points.
            let res = reader
                .query_raw(&RawQuery {
                    measurement: "cpu".into(),
                    from: i64::MIN,
                    to: i64::MAX,
                    limit: usize::MAX,
                    ..Default::default()
                })
                .unwrap();
            let got: Vec<(String, Vec<(i64, Value)>)> = res
                .series
                .into_iter()
                .map(|s| (s.field, s.points))
                .collect();
            assert_eq!(
                got,
                vec![
                    (
                        "procs".to_string(),
                        (0..3).map(|i| (T0 + i * NS, Value::I64(100 + i))).collect()
                    ),
                    (
                        "usage".to_string(),
                        (0..3)
                            .map(|i| (T0 + i * NS, Value::F64(10.0 + i as f64)))
                            .collect()
                    ),
                ],
                "{at}"
            );
            assert_eq!(reader.raw_points().unwrap(), 5, "{at}");
            // 0004: the live row count of each tier, counted from the rows there were.
            let rows_1m = if start >= 2 { 4 } else { 0 };
            let rows_1h = if start >= 2 { 3 } else { 0 };
            assert_eq!(
                counters::get(conn, path, &counters::tier_rows(60)).unwrap(),
                rows_1m,
                "{at}"
            );
            assert_eq!(
                counters::get(conn, path, &counters::tier_rows(3600)).unwrap(),
                rows_1h,
                "{at}"
            );
            assert_eq!(
                crate::store::testing::count_tier_rows(dir.path(), 60),
                rows_1m,
                "{at}"
            );
            if start >= 2 {
                assert_eq!(
                    counters::get(conn, path, "evicted_raw_chunks").unwrap(),
                    4,
                    "{at}"
                );
                // A rollup row reads back whole (sketch included).
                let mut accs = Vec::new();
                tiers::read_range(conn, path, 60, 3, 0, i64::MAX, tiers::Need::All, |b, a| {
                    accs.push((b, a.unwrap()));
                    Ok::<_, StoreError>(())
                })
                .unwrap();
                assert_eq!(accs.len(), 2, "{at}");
                assert_eq!((accs[0].1.count, accs[0].1.max), (1, 55.5), "{at}");
                assert_eq!(accs[1].1.sketch.count(), 1, "{at}");
                assert_eq!(tiers::state(conn, path, 3600).unwrap().cursor, 2, "{at}");
                let sinks = crate::store::sinks::evictions(conn, path).unwrap();
                assert_eq!((sinks[0].name.as_str(), sinks[0].cursor), ("influx", 1));
            }
            if start >= 3 {
                let seq: i64 = conn
                    .query_row("SELECT batch_seq FROM sinks", [], |r| r.get(0))
                    .unwrap();
                assert_eq!(seq, 7, "{at}");
            }
            // 0005: the clock hold's table exists, empty.
            assert_eq!(clockfix::hold_from(conn).unwrap(), None, "{at}");
            // The writer goes on after the old chunks (0002's AUTOINCREMENT ids).
            let p = crate::ingest::lineproto::parse_body(
                "cpu,host=a usage=1 5\n",
                crate::ingest::lineproto::Precision::Nanos,
                0,
            );
            w.write(&[&p.batch]).unwrap();
            assert_eq!(
                crate::store::chunks::newest_id(conn, path).unwrap(),
                3,
                "{at}"
            );
            assert_eq!(w.series_count(), 3, "{at}");
        }
    }

    /// A new store is made with [`PAGE_SIZE`] pages; a store made with another page size
    /// keeps it (changing it would rewrite the file). Each read-write connection checkpoints
    /// after [`WAL_CHECKPOINT_BYTES`] of WAL in the store's own pages.
    #[test]
    fn a_new_store_takes_the_chosen_page_size_and_an_existing_one_keeps_its_own() {
        let pragma = |c: &Connection, name: &str| -> i64 {
            c.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let (w, _) = open(dir.path(), Mode::Writer(Synchronous::Full)).unwrap();
        assert_eq!(pragma(&w, "page_size"), PAGE_SIZE);
        assert_eq!(
            pragma(&w, "wal_autocheckpoint"),
            WAL_CHECKPOINT_BYTES / PAGE_SIZE
        );
        let (job, _) = open(dir.path(), Mode::Job).unwrap();
        assert_eq!(
            pragma(&job, "wal_autocheckpoint"),
            WAL_CHECKPOINT_BYTES / PAGE_SIZE
        );
        drop((w, job));

        // A file made elsewhere with 8 KiB pages and a table of its own: the writer migrates
        // it (its one-time VACUUM included) and it keeps its pages and its rows.
        let other = tempfile::tempdir().unwrap();
        let c = Connection::open(db_path(other.path())).unwrap();
        c.execute_batch(
            "PRAGMA page_size = 8192; CREATE TABLE keep (x); INSERT INTO keep VALUES (7);",
        )
        .unwrap();
        drop(c);
        let mut writer = Writer::open(other.path(), 100, Synchronous::Full).unwrap();
        let p = crate::ingest::lineproto::parse_body(
            "cpu,host=a usage=1 5\n",
            crate::ingest::lineproto::Precision::Nanos,
            0,
        );
        writer.write(&[&p.batch]).unwrap();
        drop(writer);
        let (w, _) = open(other.path(), Mode::Writer(Synchronous::Full)).unwrap();
        assert_eq!(pragma(&w, "page_size"), 8192);
        assert_eq!(pragma(&w, "auto_vacuum"), 2);
        assert_eq!(
            pragma(&w, "wal_autocheckpoint"),
            WAL_CHECKPOINT_BYTES / 8192
        );
        let kept: i64 = w.query_row("SELECT x FROM keep", [], |r| r.get(0)).unwrap();
        let chunks: i64 = w
            .query_row("SELECT COUNT(*) FROM chunks", [], |r| r.get(0))
            .unwrap();
        assert_eq!((kept, chunks), (7, 1));
    }

    /// A cached statement with `LIMIT ?` (the sinks' chunk reads) is planned once: run
    /// again with another limit it is not parsed and planned again, on every kind of
    /// connection.
    #[test]
    fn a_bound_limit_does_not_make_a_statement_prepare_again() {
        let dir = tempfile::tempdir().unwrap();
        let (w, _) = open(dir.path(), Mode::Writer(Synchronous::Full)).unwrap();
        w.execute_batch("INSERT INTO counters (name, value) VALUES ('a', 1), ('b', 2), ('c', 3)")
            .unwrap();
        let (job, _) = open(dir.path(), Mode::Job).unwrap();
        let (cursor, _) = open(dir.path(), Mode::Cursor).unwrap();
        let (reader, _) = open(dir.path(), Mode::ReadOnly).unwrap();
        for (name, conn) in [
            ("writer", &w),
            ("job", &job),
            ("cursor", &cursor),
            ("reader", &reader),
        ] {
            let sql = "SELECT value FROM counters ORDER BY name LIMIT ?1";
            for limit in 1..=3i64 {
                let n = conn
                    .prepare_cached(sql)
                    .unwrap()
                    .query_map([limit], |r| r.get::<_, i64>(0))
                    .unwrap()
                    .count();
                assert_eq!(n as i64, limit, "{name}");
            }
            let st = conn.prepare_cached(sql).unwrap();
            assert_eq!(
                st.get_status(rusqlite::StatementStatus::RePrepare),
                0,
                "{name}: prepared again for each new limit"
            );
        }
    }
}
