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

use rusqlite::{params, Connection, OpenFlags};

use super::{db_path, latest_version, StoreError, MIGRATIONS};
use crate::config::Synchronous;

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
    // Refuse a newer database before anything below could modify it (the one-time VACUUM,
    // the journal mode, migrations).
    check_version(&conn, &path, mode)?;
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
            Ok((conn, path))
        }
        Mode::Job => {
            conn.pragma_update(None, "journal_mode", "WAL").ctx(&path)?;
            conn.pragma_update(None, "synchronous", "NORMAL")
                .ctx(&path)?;
            conn.pragma_update(None, "cache_size", -4096).ctx(&path)?;
            Ok((conn, path))
        }
        Mode::Cursor => {
            conn.pragma_update(None, "synchronous", "NORMAL")
                .ctx(&path)?;
            conn.pragma_update(None, "cache_size", -256).ctx(&path)?;
            Ok((conn, path))
        }
    }
}

/// The schema version of an open database (`PRAGMA user_version`).
pub fn schema_version(conn: &Connection, path: &Path) -> Result<u32, StoreError> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .ctx(path)
}

/// The one schema-version check: never newer than this binary; exactly current for the
/// connections that do not migrate but write.
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
    if matches!(mode, Mode::Job | Mode::Cursor) && found != latest {
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
        let pages: i64 = conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .ctx(path)?;
        let size: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .ctx(path)?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let wal = std::fs::metadata(PathBuf::from(wal))
            .map(|m| m.len())
            .unwrap_or(0);
        Ok((pages.max(0) * size.max(0)) as u64 + wal)
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
        let mut st = conn.prepare("PRAGMA incremental_vacuum").ctx(path)?;
        let mut rows = st.query([]).ctx(path)?;
        while rows.next().ctx(path)?.is_some() {}
        drop(rows);
        drop(st);
        let (busy, _, _): (i64, i64, i64) = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .ctx(path)?;
        Ok(busy == 0)
    }

    /// Gives SQLite's page cache back (between rollup runs).
    pub fn release_memory(conn: &Connection, path: &Path) -> Result<(), StoreError> {
        conn.execute_batch("PRAGMA shrink_memory").ctx(path)
    }
}
