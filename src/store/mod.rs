//! The embedded SQLite time-series store, and the only code that issues SQL against the
//! schema's tables: every other module calls the typed functions here.
//!
//! - [`open`] (one `open(dir, mode)` with the pragmas and the schema-version check;
//!   migrations; the [`Ctx`] error helper),
//! - [`write`] (the single [`Writer`]), [`latest`] (the newest value of each numeric series,
//!   kept by the writer), [`dict`] (the series dictionary), [`chunks`] (raw
//!   chunk scans and the few other statements on them), [`query`] (series list, raw queries),
//! - [`tiers`] (rollup rows and tier cursors), [`counters`], [`sinks`] (each forwarder's
//!   cursor, dead letters, fallback progress and eviction accounting), [`clockfix`] (the
//!   clock hold's rows), [`incidents`] (alert incidents and their triage snapshots, as text),
//! - [`compact`] (recompression: small chunks merged, legacy chunks re-encoded, in steps),
//! - pure encodings: [`codec`] (packed chunks: legacy and columnar), [`bucket`] (a bucket's aggregate and its
//!   maths), [`sketch`] (DDSketch).
//!
//! Exactly one [`Writer`] exists per database (the writer task owns it); any number of
//! read-only [`Reader`]s may run beside it, in this process or another (`edgewatch query`),
//! because the database runs in WAL mode. This module never touches the network and never
//! decides policy (what to roll up, evict, forward or hold): its callers do.

pub mod alerts;
pub mod bucket;
pub mod chunks;
pub mod clockfix;
pub mod codec;
pub mod compact;
pub mod counters;
pub mod dict;
pub mod held;
pub mod incidents;
pub mod journal;
pub mod latest;
pub mod open;
pub mod outbox;
pub mod query;
pub mod ride;
pub mod sinks;
pub mod sketch;
pub mod staged;
#[cfg(test)]
pub(crate) mod testing;
pub mod tiers;
pub mod write;

use std::path::{Path, PathBuf};

use rusqlite::Connection;

pub use held::{HeldSnapshot, HeldView};
pub use latest::LatestValues;
pub use open::{open, Ctx, Mode};
pub use staged::Staged;
pub use write::{WriteSummary, Writer, CHUNK_SPLIT_NS, MAX_CHUNK_POINTS};

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
    /// A write failed because the file system holding the store is read-only (`EROFS`).
    #[error("{path} is on a read-only file system (turned read-only by the kernel, as after an IO error; repair and remount it): {source}")]
    ReadOnlyFs {
        /// Database file.
        path: PathBuf,
        /// The SQLite error ("disk I/O error").
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
    /// The ingest journal (`edgewatch.journal`) could not be written, synced or read.
    #[error("ingest journal {path}: {source}")]
    Journal {
        /// Journal file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// Another writer (a running agent) holds the store's journal.
    #[error(
        "{0} is locked by another edgewatch writer (is the agent running on this data \
         directory?)"
    )]
    InUse(PathBuf),
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
    /// The database is older than this binary and this connection does not migrate.
    #[error(
        "store {path} is at schema version {found}, expected {expected}: start the agent \
         (or `edgewatch maintain`) of this version once to migrate it"
    )]
    NotMigrated {
        /// Database file.
        path: PathBuf,
        /// Its schema version.
        found: u32,
        /// The version this binary writes.
        expected: u32,
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
            StoreError::ReadOnlyFs { .. } => true,
            StoreError::Journal { source, .. } => !matches!(
                source.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::PermissionDenied
            ),
            _ => false,
        }
    }

    /// True when the disk (or the store's quota) is full.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::Sqlite { source, .. } => {
                source.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
            }
            StoreError::Journal { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
            }
            _ => false,
        }
    }

    /// True when the store cannot be written because it (or its file system) is read-only:
    /// SQLite's own "read-only" answer, or a write the kernel refused with `EROFS` (a file
    /// system turned read-only under open files, as ext4 `errors=remount-ro` does after a
    /// failing block), which SQLite itself only reports as "disk I/O error".
    pub fn is_read_only(&self) -> bool {
        match self {
            StoreError::ReadOnlyFs { .. } => true,
            StoreError::Sqlite { source, .. } => {
                source.sqlite_error_code() == Some(rusqlite::ErrorCode::ReadOnly)
            }
            StoreError::Journal { source, .. } => source.raw_os_error() == Some(libc::EROFS),
            _ => false,
        }
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

/// A read-only handle on a database; safe beside a running writer.
pub struct Reader {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
    /// The tag sets this reader has looked up (see [`Reader::tagsets_matching`]).
    tagsets: std::cell::RefCell<dict::TagsetCache>,
    /// The write-rate sample's counts so far (see [`Reader::rate_sample`]).
    rate: std::cell::RefCell<chunks::RateCache>,
    /// What the writer held when the current read began, inside [`Reader::read_with_held`].
    held: std::cell::RefCell<Option<HeldSnapshot>>,
}

impl Reader {
    /// Opens the database in `dir` read-only. It must exist and not be newer than us.
    pub fn open(dir: &Path) -> Result<Reader, StoreError> {
        let (conn, path) = open(dir, Mode::ReadOnly)?;
        Ok(Reader {
            conn,
            path,
            tagsets: Default::default(),
            rate: Default::default(),
            held: Default::default(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The connection, for the typed functions of this module's submodules.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// One read transaction until the returned guard drops: every read on this reader in
    /// between sees the store as it was when this returned (the transaction's first read
    /// is made here, which is when SQLite takes the snapshot) and takes the database's read
    /// lock once, not once per statement (a caller with many short reads, e.g. an alert
    /// evaluation). Read-only: the guard's end is a rollback of nothing.
    pub fn snapshot(&self) -> Result<rusqlite::Transaction<'_>, StoreError> {
        let tx = self.conn.unchecked_transaction().ctx(&self.path)?;
        tx.prepare_cached("SELECT count(*) FROM (SELECT 1 FROM chunks LIMIT 1)")
            .and_then(|mut st| st.query_row([], |_| Ok(())))
            .ctx(&self.path)?;
        Ok(tx)
    }

    /// Runs `f` in one read transaction ([`Reader::snapshot`]) begun together with a
    /// [`HeldSnapshot`] of `view` ([`HeldView::snapshot_with`]): the point reads in `f` (the
    /// query engine's, [`Reader::query_raw`]) add what the writer held then to what the
    /// store held, so they see every point the writer had taken, each once, without a commit.
    pub fn read_with_held<T, E: From<StoreError>>(
        &self,
        view: &HeldView,
        f: impl FnOnce(&Reader) -> Result<T, E>,
    ) -> Result<T, E> {
        let (tx, snap) = view.snapshot_with(|| self.snapshot())?;
        let outer = self.held.replace(Some(snap));
        let out = f(self);
        self.held.replace(outer);
        drop(tx);
        out
    }

    /// What the writer held when this read began, inside [`Reader::read_with_held`] (else
    /// `None`): the points a point read adds to the store's.
    pub fn held(&self) -> std::cell::Ref<'_, Option<HeldSnapshot>> {
        self.held.borrow()
    }

    /// The tag sets of `measurement` whose tags include every `(key, value)` of `tags`, by
    /// key, through this reader's [`dict::TagsetCache`] (the table is read whole once, then
    /// only its new rows).
    pub fn tagsets_matching(
        &self,
        measurement: &str,
        tags: &[(String, String)],
    ) -> Result<Vec<dict::Tagset>, StoreError> {
        self.tagsets
            .borrow_mut()
            .matching(&self.conn, &self.path, measurement, tags)
    }

    /// Bytes used on disk by the database and its WAL.
    pub fn disk_bytes(&self) -> u64 {
        disk_bytes(&self.path)
    }

    /// The newest `window` chunks sampled for the status' write rate
    /// ([`chunks::rate_sample`]): each chunk is decoded once over this reader's life.
    pub fn rate_sample(&self, window: usize) -> Result<chunks::RateSample, StoreError> {
        chunks::rate_sample(&self.conn, &self.path, window, &mut self.rate.borrow_mut())
    }

    /// Number of series in the dictionary.
    pub fn series_count(&self) -> Result<i64, StoreError> {
        dict::series_count(&self.conn, &self.path)
    }

    /// Number of raw points stored.
    pub fn raw_points(&self) -> Result<i64, StoreError> {
        chunks::points_between(&self.conn, &self.path, i64::MIN, i64::MAX)
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
    use crate::config::Synchronous;
    use crate::ingest::lineproto::{parse_body, Precision};

    fn write(w: &mut Writer, body: &str) -> WriteSummary {
        let p = parse_body(body, Precision::Nanos, 0);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        w.write(&[&p.batch]).unwrap().remove(0)
    }

    /// Reads inside a snapshot all see the store as it was when the snapshot was taken,
    /// even a commit before their first read; after it, the writer's newer points.
    #[test]
    fn a_snapshot_reads_one_state_of_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 1_000, Synchronous::Normal).unwrap();
        write(&mut w, "m v=1 1\nm v=2 2\n");
        let r = Reader::open(dir.path()).unwrap();
        let snap = r.snapshot().unwrap();
        write(&mut w, "m v=3 3\n");
        assert_eq!(r.raw_points().unwrap(), 2);
        drop(snap);
        assert_eq!(r.raw_points().unwrap(), 3);
    }

    /// The reader's tag-set cache answers as the table does: the tag sets written after its
    /// first read (keys that sort before the ones it holds included), by key, filtered by
    /// tags; past its cap it lets go and scans the table, with the same answers.
    #[test]
    fn the_readers_tagset_cache_answers_as_the_table_does_as_tag_sets_arrive() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 1_000, Synchronous::Normal).unwrap();
        write(&mut w, "m,h=b,v=1 x=1 1\nm,h=c,v=1 x=1 1\nn,h=a x=1 1\n");
        let r = Reader::open(dir.path()).unwrap();
        let owned = |tags: &[(&str, &str)]| -> Vec<(String, String)> {
            tags.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let keys = |v: Vec<dict::Tagset>| v.into_iter().map(|t| t.key).collect::<Vec<_>>();
        let asks: [(&str, &[(&str, &str)]); 6] = [
            ("m", &[]),
            ("m", &[("v", "1")]),
            ("m", &[("h", "a"), ("v", "2")]),
            ("m", &[("h", "zz")]),
            ("n", &[]),
            ("none", &[]),
        ];
        // The reader's own cache, and one with a cap of 4, against the table.
        let mut small = dict::TagsetCache::with_cap(4);
        let check = |small: &mut dict::TagsetCache| {
            for (m, tags) in asks {
                let tags = owned(tags);
                let want = dict::tagsets_matching(&r.conn, &r.path, m, &tags).unwrap();
                assert_eq!(r.tagsets_matching(m, &tags).unwrap(), want, "{m} {tags:?}");
                let got = small.matching(&r.conn, &r.path, m, &tags).unwrap();
                assert_eq!(keys(got), keys(want), "cap 4: {m} {tags:?}");
            }
        };
        check(&mut small);
        assert_eq!(
            keys(r.tagsets_matching("m", &[]).unwrap()),
            ["m,h=b,v=1", "m,h=c,v=1"]
        );
        assert_eq!(r.tagsets.borrow().len(), 3);
        // New tag sets, one sorting first: read on the next lookup, in key order.
        write(&mut w, "m,h=a,v=2 x=1 2\nm,h=d,v=1 x=1 2\n");
        check(&mut small);
        assert_eq!(
            keys(r.tagsets_matching("m", &[]).unwrap()),
            ["m,h=a,v=2", "m,h=b,v=1", "m,h=c,v=1", "m,h=d,v=1"]
        );
        assert_eq!(r.tagsets.borrow().len(), 5);
        assert!(small.is_over(), "5 tag sets outgrow a cap of 4");
        assert!(small.is_empty());
        // Past its cap it scans: still every new tag set.
        write(&mut w, "m,h=e,v=1 x=1 3\n");
        check(&mut small);
        let v1 = small.matching(&r.conn, &r.path, "m", &owned(&[("v", "1")]));
        assert_eq!(v1.unwrap().len(), 4);
        // Tags come back whole, as the table's JSON has them.
        let got = r.tagsets_matching("m", &owned(&[("h", "a")])).unwrap();
        assert_eq!(
            got[0].tags,
            owned(&[("h", "a"), ("v", "2")]).into_iter().collect()
        );
        assert_eq!(got[0].measurement, "m");
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
        let conn = rusqlite::Connection::open(db_path(dir.path())).unwrap();
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
        for mode in [Mode::Job, Mode::Cursor] {
            let e = open(dir.path(), mode).err().unwrap();
            assert!(matches!(e, StoreError::TooNew { found: 999, .. }), "{e}");
        }
    }
}
