//! The embedded SQLite time-series store: opening and migrating the database, the series
//! dictionary, committing batches of lines, and reading raw points back.
//!
//! Exactly one [`Writer`] exists per database (the writer task owns it); any number of
//! read-only [`Reader`]s may run beside it, in this process or another (`edgewatch query`),
//! because the database runs in WAL mode. This module never touches the network.

pub mod codec;
pub mod query;
pub mod rollup;
pub mod sketch;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use crate::config::Synchronous;
use crate::model::{split_series_key, Batch, Kind, Rejection};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}
pub use embedded::MIGRATIONS;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "edgewatch.db";

/// Store failures. `retryable` tells a caller whether trying again may help.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite reported an error.
    #[error("database error on {path}: {source}")]
    Sqlite {
        /// Database file.
        path: PathBuf,
        /// The SQLite error.
        source: rusqlite::Error,
    },
    /// The data directory cannot be created or read.
    #[error("cannot use data directory {path}: {source}")]
    Dir {
        /// Directory.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The database was written by a newer edgewatch.
    #[error(
        "database {path} has schema version {found}, newer than this edgewatch supports ({supported}); \
         upgrade edgewatch (it will not downgrade or modify a newer database)"
    )]
    TooNew {
        /// Database file.
        path: PathBuf,
        /// Its schema version.
        found: u32,
        /// The newest this binary knows.
        supported: u32,
    },
    /// No database exists where a reader expected one.
    #[error("no edgewatch database at {0} (is --data-dir right?)")]
    Missing(PathBuf),
    /// A BLOB failed to decode.
    #[error("corrupt point data in {path}: {source}")]
    Corrupt {
        /// Database file.
        path: PathBuf,
        /// Decoder error.
        source: codec::CodecError,
    },
}

impl StoreError {
    /// True when the same operation may succeed later (disk full, database busy).
    pub fn retryable(&self) -> bool {
        match self {
            StoreError::Sqlite { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(
                    rusqlite::ErrorCode::DiskFull
                        | rusqlite::ErrorCode::DatabaseBusy
                        | rusqlite::ErrorCode::DatabaseLocked
                        | rusqlite::ErrorCode::SystemIoFailure
                )
            ),
            _ => false,
        }
    }

    /// True when the disk (or the store's quota) is full.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, StoreError::Sqlite { source, .. }
            if source.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull))
    }
}

/// Path of the database file in `dir`.
pub fn db_path(dir: &Path) -> PathBuf {
    dir.join(DB_FILE)
}

/// The newest schema version this binary knows.
pub fn latest_version() -> u32 {
    MIGRATIONS.last().map(|m| m.0).unwrap_or(0)
}

fn sql_err(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |source| StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    }
}

/// Applies every pending migration in one transaction; refuses a newer database.
fn migrate(conn: &mut Connection, path: &Path) -> Result<u32, StoreError> {
    let e = sql_err(path);
    let current: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(&e)?;
    let latest = latest_version();
    if current > latest {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found: current,
            supported: latest,
        });
    }
    if current == latest {
        return Ok(current);
    }
    let tx = conn.transaction().map_err(&e)?;
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        tracing::info!(version, name, "applying database migration");
        tx.execute_batch(sql).map_err(&e)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_ns) VALUES (?1, ?2, ?3)",
            params![version, name, crate::now_ns()],
        )
        .map_err(&e)?;
        tx.pragma_update(None, "user_version", version)
            .map_err(&e)?;
    }
    tx.commit().map_err(&e)?;
    Ok(latest)
}

/// Puts the database in `auto_vacuum = INCREMENTAL` mode, so the rollup job's
/// `PRAGMA incremental_vacuum` can give evicted pages back to the file system. On a new
/// database the pragma alone is enough (it must precede the first table); a database created
/// before this mode existed needs one `VACUUM` outside WAL mode, done here once, at open,
/// before ingest starts (it rewrites the file: seconds per GB). Runs before WAL is turned on.
fn ensure_incremental_vacuum(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let e = sql_err(path);
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .map_err(&e)?;
    if mode == 2 {
        return Ok(());
    }
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
        .map_err(&e)?;
    let tables: i64 = conn
        .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
        .map_err(&e)?;
    if tables > 0 {
        tracing::info!(db = %path.display(), "switching the store to incremental auto-vacuum (one-time VACUUM)");
        // VACUUM cannot change auto_vacuum in WAL mode; WAL is turned back on by the caller.
        conn.execute_batch(
            "PRAGMA journal_mode = DELETE; PRAGMA auto_vacuum = INCREMENTAL; VACUUM;",
        )
        .map_err(&e)?;
    }
    Ok(())
}

/// Everything the writer caches about the series dictionary.
#[derive(Default)]
struct Dictionary {
    tagsets: HashMap<String, i64>,
    /// (tagset id, field) -> (series id, kind)
    series: HashMap<i64, HashMap<String, (i64, Kind)>>,
    series_count: usize,
}

/// The single writer of a database.
pub struct Writer {
    conn: Connection,
    path: PathBuf,
    dict: Dictionary,
    max_series: usize,
    buf: Vec<u8>,
}

/// What one committed batch did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WriteSummary {
    /// Points (lines) stored.
    pub points: usize,
    /// Field values stored.
    pub values: usize,
    /// Points refused, with reasons.
    pub rejected: Vec<Rejection>,
}

impl Writer {
    /// Opens (creating and migrating if needed) the database in `dir`.
    pub fn open(dir: &Path, max_series: usize, sync: Synchronous) -> Result<Writer, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = db_path(dir);
        let err_path = path.clone();
        let e = sql_err(&err_path);
        let mut conn = Connection::open(&path).map_err(&e)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(&e)?;
        // Refuse a newer database before anything below could modify it (the one-time
        // VACUUM, the journal mode, migrations).
        let version: u32 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(&e)?;
        if version > latest_version() {
            return Err(StoreError::TooNew {
                path,
                found: version,
                supported: latest_version(),
            });
        }
        ensure_incremental_vacuum(&conn, &path)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(&e)?;
        conn.pragma_update(
            None,
            "synchronous",
            match sync {
                Synchronous::Normal => "NORMAL",
                Synchronous::Full => "FULL",
            },
        )
        .map_err(&e)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(&e)?;
        // Small cache: the writer appends; steady RSS matters more than read speed here.
        conn.pragma_update(None, "cache_size", -2048).map_err(&e)?;
        migrate(&mut conn, &path)?;
        let mut w = Writer {
            conn,
            path,
            dict: Dictionary::default(),
            max_series,
            buf: Vec::with_capacity(256),
        };
        w.load_dictionary()?;
        Ok(w)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of series in the dictionary.
    pub fn series_count(&self) -> usize {
        self.dict.series_count
    }

    fn load_dictionary(&mut self) -> Result<(), StoreError> {
        let e = sql_err(&self.path);
        let mut dict = Dictionary::default();
        {
            let mut st = self
                .conn
                .prepare("SELECT id, key FROM tagsets")
                .map_err(&e)?;
            let rows = st
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
                .map_err(&e)?;
            for row in rows {
                let (id, key) = row.map_err(&e)?;
                dict.tagsets.insert(key, id);
            }
            let mut st = self
                .conn
                .prepare("SELECT id, tagset_id, field, kind FROM series")
                .map_err(&e)?;
            let rows = st
                .query_map([], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, i64>(3)?,
                    ))
                })
                .map_err(&e)?;
            for row in rows {
                let (id, tagset, field, kind) = row.map_err(&e)?;
                let kind = Kind::from_code(kind).unwrap_or(Kind::Float);
                dict.series
                    .entry(tagset)
                    .or_default()
                    .insert(field, (id, kind));
                dict.series_count += 1;
            }
        }
        self.dict = dict;
        Ok(())
    }

    /// Commits `batches` in one transaction. On error nothing of them is stored (and the
    /// dictionary cache is reloaded so it matches the database again).
    pub fn write(&mut self, batches: &[&Batch]) -> Result<Vec<WriteSummary>, StoreError> {
        let result = self.write_inner(batches);
        if result.is_err() {
            if let Err(e) = self.load_dictionary() {
                tracing::error!(error = %e, "reloading the series dictionary failed");
            }
        }
        result
    }

    fn write_inner(&mut self, batches: &[&Batch]) -> Result<Vec<WriteSummary>, StoreError> {
        let path = self.path.clone();
        let e = sql_err(&path);
        let now = crate::now_ns();
        let tx = self.conn.transaction().map_err(&e)?;
        let mut out = Vec::with_capacity(batches.len());
        {
            let mut ins_chunk = tx
                .prepare_cached(
                    "INSERT INTO chunks (tagset_id, ts_min, ts_max, n, data) VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(&e)?;
            let mut ins_tagset = tx
                .prepare_cached("INSERT INTO tagsets (key, measurement, tags) VALUES (?1, ?2, ?3)")
                .map_err(&e)?;
            let mut ins_series = tx
                .prepare_cached(
                    "INSERT INTO series (tagset_id, field, kind, created_ns) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(&e)?;
            let dict = &mut self.dict;
            let values = &mut self.buf;
            // Points of this transaction grouped by tag set, in arrival order per tag set.
            let mut open: Vec<ChunkBuilder> = Vec::new();
            let mut open_index: HashMap<i64, usize> = HashMap::new();
            for batch in batches {
                let mut sum = WriteSummary::default();
                'lines: for line in &batch.lines {
                    // Check the whole line before storing any of it (InfluxDB semantics:
                    // a line is stored entirely or not at all).
                    let tagset_id = dict.tagsets.get(line.key.as_str()).copied();
                    let mut new_series = 0usize;
                    for (field, value) in &line.fields {
                        let known = tagset_id
                            .and_then(|t| dict.series.get(&t))
                            .and_then(|m| m.get(field.as_str()));
                        match known {
                            Some((_, kind)) if *kind != value.kind() => {
                                sum.rejected.push(Rejection {
                                    line: line.line_no,
                                    error: format!(
                                        "field type conflict: input field \"{field}\" on series \"{}\" is type {}, already exists as type {}",
                                        line.key,
                                        value.kind().name(),
                                        kind.name()
                                    ),
                                });
                                continue 'lines;
                            }
                            Some(_) => {}
                            None => new_series += 1,
                        }
                    }
                    if new_series > 0 && dict.series_count + new_series > self.max_series {
                        sum.rejected.push(Rejection {
                            line: line.line_no,
                            error: format!(
                                "series limit reached: the store holds {} series and max_series is {}; \
                                 \"{}\" would add {new_series} more (check for a tag with unbounded values, \
                                 or raise [storage] max_series)",
                                dict.series_count, self.max_series, line.key
                            ),
                        });
                        continue 'lines;
                    }
                    let tagset_id = match tagset_id {
                        Some(id) => id,
                        None => {
                            let (measurement, tags) = split_series_key(&line.key);
                            let tags_json = serde_json::to_string(
                                &tags
                                    .into_iter()
                                    .collect::<std::collections::BTreeMap<_, _>>(),
                            )
                            .unwrap_or_else(|_| "{}".into());
                            ins_tagset
                                .execute(params![line.key, measurement, tags_json])
                                .map_err(&e)?;
                            let id = tx.last_insert_rowid();
                            dict.tagsets.insert(line.key.clone(), id);
                            id
                        }
                    };
                    values.clear();
                    let fields = dict.series.entry(tagset_id).or_default();
                    for (field, value) in &line.fields {
                        let sid = match fields.get(field.as_str()) {
                            Some((sid, _)) => *sid,
                            None => {
                                ins_series
                                    .execute(params![tagset_id, field, value.kind().code(), now])
                                    .map_err(&e)?;
                                let sid = tx.last_insert_rowid();
                                fields.insert(field.clone(), (sid, value.kind()));
                                dict.series_count += 1;
                                sid
                            }
                        };
                        codec::encode_value(values, sid, value);
                    }
                    let slot = *open_index.entry(tagset_id).or_insert_with(|| {
                        open.push(ChunkBuilder::new(tagset_id));
                        open.len() - 1
                    });
                    let chunk = &mut open[slot];
                    chunk.push(line.ts, line.fields.len(), values);
                    if chunk.points.len() >= MAX_CHUNK_POINTS {
                        chunk.flush(&mut ins_chunk).map_err(&e)?;
                    }
                    sum.points += 1;
                    sum.values += line.fields.len();
                }
                out.push(sum);
            }
            for chunk in &mut open {
                chunk.flush(&mut ins_chunk).map_err(&e)?;
            }
        }
        tx.commit().map_err(&e)?;
        Ok(out)
    }
}

/// Most points packed into one chunk row.
pub const MAX_CHUNK_POINTS: usize = 2048;

/// Accumulates the points of one tag set into chunk rows.
struct ChunkBuilder {
    tagset_id: i64,
    data: Vec<u8>,
    points: Vec<(i64, std::ops::Range<usize>, usize)>,
    values: Vec<u8>,
}

impl ChunkBuilder {
    fn new(tagset_id: i64) -> Self {
        ChunkBuilder {
            tagset_id,
            data: Vec::new(),
            points: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Adds one point whose encoded values are `encoded`.
    fn push(&mut self, ts: i64, count: usize, encoded: &[u8]) {
        let start = self.values.len();
        self.values.extend_from_slice(encoded);
        self.points.push((ts, start..self.values.len(), count));
    }

    /// Writes the pending points as one row (time deltas need `ts_min`, hence the two-step
    /// build) and starts a new chunk.
    fn flush(&mut self, insert: &mut rusqlite::CachedStatement<'_>) -> rusqlite::Result<()> {
        if self.points.is_empty() {
            return Ok(());
        }
        let ts_min = self.points.iter().map(|p| p.0).min().unwrap_or(0);
        let ts_max = self.points.iter().map(|p| p.0).max().unwrap_or(0);
        self.data.clear();
        let mut prev = ts_min;
        for (ts, range, count) in &self.points {
            codec::encode_point_header(&mut self.data, prev, *ts, *count);
            self.data.extend_from_slice(&self.values[range.clone()]);
            prev = *ts;
        }
        insert.execute(params![
            self.tagset_id,
            ts_min,
            ts_max,
            self.points.len() as i64,
            &self.data[..]
        ])?;
        self.points.clear();
        self.values.clear();
        Ok(())
    }
}

/// A read-only handle on a database; safe beside a running writer.
pub struct Reader {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
}

impl Reader {
    /// Opens the database in `dir` read-only. It must exist and not be newer than us.
    pub fn open(dir: &Path) -> Result<Reader, StoreError> {
        let path = db_path(dir);
        if !path.exists() {
            return Err(StoreError::Missing(path));
        }
        let err_path = path.clone();
        let e = sql_err(&err_path);
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(&e)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(&e)?;
        conn.pragma_update(None, "cache_size", -1024).map_err(&e)?;
        // Every query shape the API and the engine run stays prepared (the default 16 is
        // fewer than the shapes there are: each eviction is a re-parse on the next query).
        conn.set_prepared_statement_cache_capacity(64);
        let version: u32 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(&e)?;
        if version > latest_version() {
            return Err(StoreError::TooNew {
                path,
                found: version,
                supported: latest_version(),
            });
        }
        Ok(Reader { conn, path })
    }

    /// Bytes used on disk by the database and its WAL.
    pub fn disk_bytes(&self) -> u64 {
        disk_bytes(&self.path)
    }

    /// Number of series in the dictionary.
    pub fn series_count(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row("SELECT COUNT(*) FROM series", [], |r| r.get(0))
            .map_err(sql_err(&self.path))
    }

    /// Number of raw points stored.
    pub fn raw_points(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row("SELECT COALESCE(SUM(n), 0) FROM chunks", [], |r| r.get(0))
            .optional()
            .map(|v| v.unwrap_or(0))
            .map_err(sql_err(&self.path))
    }
}

/// Bytes used by a database file plus its `-wal` and `-shm` companions.
pub fn disk_bytes(db: &Path) -> u64 {
    let mut total = 0;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(m) = std::fs::metadata(PathBuf::from(p)) {
            total += m.len();
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::query::RawQuery;
    use super::*;
    use crate::ingest::lineproto::{parse_body, Precision};

    fn write(w: &mut Writer, body: &str) -> WriteSummary {
        let p = parse_body(body, Precision::Nanos, 0);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        w.write(&[&p.batch]).unwrap().remove(0)
    }

    fn q(measurement: &str) -> RawQuery {
        RawQuery {
            measurement: measurement.into(),
            from: i64::MIN,
            to: i64::MAX,
            limit: usize::MAX,
            ..Default::default()
        }
    }

    #[test]
    fn points_round_trip_in_time_order_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        write(
            &mut w,
            "m,t=a v=1,s=\"x\" 100\nm,t=a v=2 50\nm,t=b v=3i 75\n",
        );
        write(&mut w, "m,t=a v=4 60\n");
        let r = Reader::open(dir.path()).unwrap();
        let res = r.query_raw(&q("m")).unwrap();
        type Got = Vec<(String, String, Vec<(i64, crate::model::Value)>)>;
        let got: Got = res
            .series
            .into_iter()
            .map(|s| (s.tags["t"].clone(), s.field, s.points))
            .collect();
        use crate::model::Value::*;
        assert_eq!(
            got,
            vec![
                ("a".into(), "s".into(), vec![(100, Str("x".into()))]),
                (
                    "a".into(),
                    "v".into(),
                    vec![(50, F64(2.0)), (60, F64(4.0)), (100, F64(1.0))]
                ),
                ("b".into(), "v".into(), vec![(75, I64(3))]),
            ]
        );
        assert_eq!(r.raw_points().unwrap(), 4);
    }

    #[test]
    fn series_cap_and_type_conflicts_refuse_lines_not_batches() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 2, Synchronous::Normal).unwrap();
        let p = parse_body(
            "m a=1,b=2 1\nm c=3 2\nm a=1i 3\nm a=5 4\n",
            Precision::Nanos,
            0,
        );
        let sum = w.write(&[&p.batch]).unwrap().remove(0);
        assert_eq!(sum.points, 2);
        let lines: Vec<u32> = sum.rejected.iter().map(|r| r.line).collect();
        assert_eq!(lines, vec![2, 3]);
        assert!(sum.rejected[0].error.contains("series limit"));
        assert!(sum.rejected[1].error.contains("type conflict"));
    }

    #[test]
    fn a_newer_database_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        drop(Writer::open(dir.path(), 10, Synchronous::Normal).unwrap());
        let conn = Connection::open(db_path(dir.path())).unwrap();
        conn.pragma_update(None, "user_version", 999).unwrap();
        // A database without incremental auto-vacuum, as older stores are: refusing it must
        // not run the one-time VACUUM (or anything else that writes).
        conn.execute_batch("PRAGMA journal_mode = DELETE; PRAGMA auto_vacuum = NONE; VACUUM;")
            .unwrap();
        drop(conn);
        let before = std::fs::read(db_path(dir.path())).unwrap();
        let e = Writer::open(dir.path(), 10, Synchronous::Normal)
            .err()
            .unwrap();
        assert!(matches!(e, StoreError::TooNew { found: 999, .. }), "{e}");
        assert_eq!(
            std::fs::read(db_path(dir.path())).unwrap(),
            before,
            "refused but modified"
        );
        assert!(e.to_string().contains("upgrade edgewatch"));
        assert!(Reader::open(dir.path()).is_err());
    }
}
