//! The series dictionary (`tagsets`, `series`): loading it whole (the writer's cache, a
//! forwarder's names, `/metrics`), looking up the tag sets of a measurement (from the table,
//! or from a reader's [`TagsetCache`], which holds them parsed and reads only new ids) and
//! the fields of a tag set, and the writer's inserts of new entries. Tags are stored as a
//! JSON object and handed out parsed.
//!
//! Never decides whether a new series may be created (the writer's series cap does) and
//! never deletes an entry.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use super::open::Ctx;
use super::StoreError;
use crate::model::Kind;

/// One tag set: measurement plus tags, with its canonical series key.
#[derive(Debug, Clone, PartialEq)]
pub struct Tagset {
    /// Row id (`chunks.tagset_id`).
    pub id: i64,
    /// Canonical key (`cpu,host=a`).
    pub key: String,
    /// Measurement.
    pub measurement: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

/// One series: a field of a tag set, with its type.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Row id (the id values are encoded with in chunks).
    pub id: i64,
    /// Its tag set.
    pub tagset_id: i64,
    /// Field key.
    pub field: String,
    /// Type, fixed at the first write.
    pub kind: Kind,
}

/// The whole dictionary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dictionary {
    /// Every tag set, by key.
    pub tagsets: Vec<Tagset>,
    /// Every series, by tag set and field.
    pub series: Vec<Series>,
}

fn tagset_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Tagset> {
    let tags: String = r.get(3)?;
    Ok(Tagset {
        id: r.get(0)?,
        key: r.get(1)?,
        measurement: r.get(2)?,
        tags: serde_json::from_str(&tags).unwrap_or_default(),
    })
}

fn series_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Series> {
    Ok(Series {
        id: r.get(0)?,
        tagset_id: r.get(1)?,
        field: r.get(2)?,
        kind: Kind::from_code(r.get(3)?).unwrap_or(Kind::Float),
    })
}

/// Reads the whole dictionary.
pub fn load(conn: &Connection, path: &Path) -> Result<Dictionary, StoreError> {
    let mut st = conn
        .prepare_cached("SELECT id, key, measurement, tags FROM tagsets ORDER BY key")
        .ctx(path)?;
    let tagsets = st
        .query_map([], tagset_row)
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .ctx(path)?;
    let mut st = conn
        .prepare_cached("SELECT id, tagset_id, field, kind FROM series ORDER BY tagset_id, field")
        .ctx(path)?;
    let series = st
        .query_map([], series_row)
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .ctx(path)?;
    Ok(Dictionary { tagsets, series })
}

/// The tag sets of `measurement` (every tag set when `None`), by key.
pub fn tagsets(
    conn: &Connection,
    path: &Path,
    measurement: Option<&str>,
) -> Result<Vec<Tagset>, StoreError> {
    // Two shapes, so that the one with a measurement uses its index.
    match measurement {
        Some(m) => conn
            .prepare_cached(
                "SELECT id, key, measurement, tags FROM tagsets WHERE measurement = ?1 ORDER BY key",
            )
            .and_then(|mut st| st.query_map(params![m], tagset_row)?.collect()),
        None => conn
            .prepare_cached("SELECT id, key, measurement, tags FROM tagsets ORDER BY key")
            .and_then(|mut st| st.query_map([], tagset_row)?.collect()),
    }
    .ctx(path)
}

/// Calls `f` with each tag set of `measurement` whose tags include every `(key, value)` of
/// `tags`, by key, one row at a time (only the current one is held); `f` stops the walk
/// with `Break`.
pub fn for_each_tagset<E: From<StoreError>>(
    conn: &Connection,
    path: &Path,
    measurement: &str,
    tags: &[(String, String)],
    mut f: impl FnMut(Tagset) -> Result<ControlFlow<()>, E>,
) -> Result<(), E> {
    let mut st = conn
        .prepare_cached(
            "SELECT id, key, measurement, tags FROM tagsets WHERE measurement = ?1 ORDER BY key",
        )
        .ctx(path)?;
    let mut rows = st.query(params![measurement]).ctx(path)?;
    while let Some(r) = rows.next().ctx(path)? {
        let t = tagset_row(r).ctx(path)?;
        if tags.iter().all(|(k, v)| t.tags.get(k) == Some(v)) && f(t)?.is_break() {
            break;
        }
    }
    Ok(())
}

/// The tag sets of `measurement` whose tags include every `(key, value)` of `tags`, by
/// key: only the matching ones are held.
pub fn tagsets_matching(
    conn: &Connection,
    path: &Path,
    measurement: &str,
    tags: &[(String, String)],
) -> Result<Vec<Tagset>, StoreError> {
    let mut out = Vec::new();
    for_each_tagset(conn, path, measurement, tags, |t| {
        out.push(t);
        Ok::<_, StoreError>(ControlFlow::Continue(()))
    })?;
    Ok(out)
}

/// Most tag sets a [`TagsetCache`] holds; past it the cache lets go and lookups scan the
/// table (about 300 bytes a tag set: 3 MB at the cap).
pub const MAX_CACHED_TAGSETS: usize = 10_000;

/// The dictionary's tag sets held by one reader, grouped by measurement, so that a caller
/// looking up the tag sets of a measurement many times (an alert evaluation's snapshots, a
/// dashboard's panels) does not read and parse the whole table each time. Filled on first
/// use, then with only the rows above the highest id read: tag sets are never changed or
/// deleted, so new ids are all that can differ, and the reader's connection never sees a
/// row it has not committed. Past [`MAX_CACHED_TAGSETS`] it empties itself for good and
/// [`TagsetCache::matching`] scans the table as [`tagsets_matching`] does.
#[derive(Debug)]
pub struct TagsetCache {
    /// The highest id read (0: nothing read yet).
    last_id: i64,
    /// Per measurement, its tag sets by key.
    by_measurement: HashMap<Box<str>, Vec<CachedTagset>>,
    len: usize,
    /// Most tag sets held.
    cap: usize,
    /// The dictionary outgrew the cap.
    over: bool,
}

impl Default for TagsetCache {
    fn default() -> Self {
        TagsetCache::with_cap(MAX_CACHED_TAGSETS)
    }
}

#[derive(Debug)]
struct CachedTagset {
    id: i64,
    key: Box<str>,
    /// By tag key.
    tags: Box<[(Box<str>, Box<str>)]>,
}

impl CachedTagset {
    fn matches(&self, want: &[(String, String)]) -> bool {
        want.iter()
            .all(|(k, v)| self.tags.iter().any(|(tk, tv)| **tk == **k && **tv == **v))
    }
}

impl TagsetCache {
    /// An empty cache that holds at most `cap` tag sets.
    pub fn with_cap(cap: usize) -> Self {
        TagsetCache {
            last_id: 0,
            by_measurement: HashMap::new(),
            len: 0,
            cap,
            over: false,
        }
    }

    /// Whether the dictionary outgrew the cap (lookups scan the table).
    pub fn is_over(&self) -> bool {
        self.over
    }

    /// The tag sets of `measurement` whose tags include every `(key, value)` of `tags`, by
    /// key: what [`tagsets_matching`] returns, from memory after the first call.
    pub fn matching(
        &mut self,
        conn: &Connection,
        path: &Path,
        measurement: &str,
        tags: &[(String, String)],
    ) -> Result<Vec<Tagset>, StoreError> {
        self.refresh(conn, path)?;
        if self.over {
            return tagsets_matching(conn, path, measurement, tags);
        }
        let Some(sets) = self.by_measurement.get(measurement) else {
            return Ok(Vec::new());
        };
        Ok(sets
            .iter()
            .filter(|c| c.matches(tags))
            .map(|c| Tagset {
                id: c.id,
                key: c.key.to_string(),
                measurement: measurement.to_string(),
                tags: c
                    .tags
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            })
            .collect())
    }

    /// Number of tag sets held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads the tag sets added since the last call.
    fn refresh(&mut self, conn: &Connection, path: &Path) -> Result<(), StoreError> {
        if self.over {
            return Ok(());
        }
        let mut st = conn
            .prepare_cached(
                "SELECT id, key, measurement, tags FROM tagsets WHERE id > ?1 ORDER BY id",
            )
            .ctx(path)?;
        let mut rows = st.query(params![self.last_id]).ctx(path)?;
        let mut touched: Vec<Box<str>> = Vec::new();
        while let Some(r) = rows.next().ctx(path)? {
            let t = tagset_row(r).ctx(path)?;
            self.last_id = self.last_id.max(t.id);
            self.len += 1;
            if self.len > self.cap {
                tracing::debug!(
                    path = %path.display(),
                    cap = self.cap,
                    "more tag sets than the reader's cache holds: lookups scan the dictionary"
                );
                *self = TagsetCache {
                    over: true,
                    ..TagsetCache::with_cap(self.cap)
                };
                return Ok(());
            }
            let sets = match self.by_measurement.get_mut(t.measurement.as_str()) {
                Some(sets) => sets,
                None => self
                    .by_measurement
                    .entry(t.measurement.clone().into_boxed_str())
                    .or_default(),
            };
            if sets.last().is_some_and(|l| *l.key > *t.key)
                && !touched.iter().any(|m| **m == *t.measurement)
            {
                touched.push(t.measurement.clone().into_boxed_str());
            }
            sets.push(CachedTagset {
                id: t.id,
                key: t.key.into_boxed_str(),
                tags: t
                    .tags
                    .into_iter()
                    .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
                    .collect(),
            });
        }
        // Keys arrive by id: a measurement whose new keys sort before its last one is sorted
        // again (a stable sort of an ordered run plus a short tail).
        for m in touched {
            if let Some(sets) = self.by_measurement.get_mut(&m) {
                sets.sort_by(|a, b| a.key.cmp(&b.key));
            }
        }
        Ok(())
    }
}

/// The series of tag set `tagset`, by field.
pub fn fields(conn: &Connection, path: &Path, tagset: i64) -> Result<Vec<Series>, StoreError> {
    let mut st = conn
        .prepare_cached(
            "SELECT id, tagset_id, field, kind FROM series WHERE tagset_id = ?1 ORDER BY field",
        )
        .ctx(path)?;
    st.query_map(params![tagset], series_row)
        .and_then(|rows| rows.collect())
        .ctx(path)
}

/// The id of the numeric (not string) series `field` of tag set `tagset`, if any.
pub fn numeric_series(
    conn: &Connection,
    path: &Path,
    tagset: i64,
    field: &str,
) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached("SELECT id FROM series WHERE tagset_id = ?1 AND field = ?2 AND kind != 4")
        .and_then(|mut st| {
            st.query_row(params![tagset, field], |r| r.get(0))
                .optional()
        })
        .ctx(path)
}

/// Calls `f(series id, measurement, field, tag set key)` for every numeric (not string)
/// series with an id above `after`, by id, one row at a time; `f` stops the walk with
/// `Break`.
pub fn numeric_series_after(
    conn: &Connection,
    path: &Path,
    after: i64,
    mut f: impl FnMut(i64, &str, &str, &str) -> ControlFlow<()>,
) -> Result<(), StoreError> {
    let mut st = conn
        .prepare_cached(
            "SELECT s.id, t.measurement, s.field, t.key FROM series s \
             JOIN tagsets t ON t.id = s.tagset_id WHERE s.id > ?1 AND s.kind != 4 ORDER BY s.id",
        )
        .ctx(path)?;
    let mut rows = st.query(params![after]).ctx(path)?;
    while let Some(r) = rows.next().ctx(path)? {
        let text = |i| r.get_ref(i).and_then(|v| Ok(v.as_str()?));
        let (m, field, key) = (text(1).ctx(path)?, text(2).ctx(path)?, text(3).ctx(path)?);
        if f(r.get(0).ctx(path)?, m, field, key).is_break() {
            break;
        }
    }
    Ok(())
}

/// Calls `f(series id, tag set key)` for the numeric series `field` of every tag set of
/// `measurement`, one row at a time (through the measurement index); `f` stops the walk
/// with `Break`.
pub fn numeric_members(
    conn: &Connection,
    path: &Path,
    measurement: &str,
    field: &str,
    mut f: impl FnMut(i64, &str) -> ControlFlow<()>,
) -> Result<(), StoreError> {
    let mut st = conn
        .prepare_cached(
            "SELECT s.id, t.key FROM tagsets t JOIN series s \
             ON s.tagset_id = t.id AND s.field = ?2 WHERE t.measurement = ?1 AND s.kind != 4",
        )
        .ctx(path)?;
    let mut rows = st.query(params![measurement, field]).ctx(path)?;
    while let Some(r) = rows.next().ctx(path)? {
        let key = r.get_ref(1).and_then(|v| Ok(v.as_str()?)).ctx(path)?;
        if f(r.get(0).ctx(path)?, key).is_break() {
            break;
        }
    }
    Ok(())
}

/// Number of series.
pub fn series_count(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    conn.query_row("SELECT COUNT(*) FROM series", [], |r| r.get(0))
        .ctx(path)
}

/// The writer's inserts into the dictionary: inside a transaction the caller holds
/// ([`Inserts::within`]), or in one of their own begun at the first insert
/// ([`Inserts::begin_on_first`]: staging lines of known series, nearly every batch, then
/// costs no transaction, whose BEGIN and COMMIT SQLite would parse again each time). One
/// begun here is rolled back if dropped before [`Inserts::commit`].
pub(super) struct Inserts<'c> {
    conn: &'c Connection,
    own: bool,
    begun: bool,
}

impl<'c> Inserts<'c> {
    /// Inserts inside the caller's transaction.
    pub(super) fn within(conn: &'c Connection) -> Self {
        Inserts {
            conn,
            own: false,
            begun: false,
        }
    }

    /// Inserts that begin a transaction of their own when the first one comes.
    pub(super) fn begin_on_first(conn: &'c Connection) -> Self {
        Inserts {
            conn,
            own: true,
            begun: false,
        }
    }

    fn begin(&mut self) -> rusqlite::Result<()> {
        if self.own && !self.begun {
            self.conn.execute_batch("BEGIN")?;
            self.begun = true;
        }
        Ok(())
    }

    /// Commits the transaction begun here, if one was.
    pub(super) fn commit(mut self) -> rusqlite::Result<()> {
        if self.begun {
            self.conn.execute_batch("COMMIT")?;
            self.begun = false;
        }
        Ok(())
    }

    /// A new tag set; returns its id.
    pub(super) fn tagset(
        &mut self,
        key: &str,
        measurement: &str,
        tags_json: &str,
    ) -> rusqlite::Result<i64> {
        self.begin()?;
        self.conn
            .prepare_cached("INSERT INTO tagsets (key, measurement, tags) VALUES (?1, ?2, ?3)")?
            .execute(params![key, measurement, tags_json])?;
        Ok(self.conn.last_insert_rowid())
    }

    /// A new series; returns its id.
    pub(super) fn series(
        &mut self,
        tagset: i64,
        field: &str,
        kind: Kind,
        now: i64,
    ) -> rusqlite::Result<i64> {
        self.begin()?;
        self.conn
            .prepare_cached(
                "INSERT INTO series (tagset_id, field, kind, created_ns) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![tagset, field, kind.code(), now])?;
        Ok(self.conn.last_insert_rowid())
    }
}

impl Drop for Inserts<'_> {
    fn drop(&mut self) {
        if self.begun {
            // An error before the commit: nothing of the staging is kept (the writer then
            // reloads its dictionary from the store).
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                tracing::warn!(error = %e, "cannot roll back a failed staging");
            }
        }
    }
}
