//! The rollup tiers' tables: bucket rows (one [`Acc`] per tier, series and bucket) and each
//! tier's cursor and watermark (`rollup_state`). Reads for the query engine (only the columns
//! a query needs, see [`Need`]), the forwarder's eviction fallback and rollup-mode sinks
//! ([`named_rows`], [`pending`]); reads and writes for the rollup job, inside its
//! transactions.
//!
//! A tier's rows live in two tables split by bucket ([`Place`]): `rollups_recent`, keyed by
//! time, takes the rows of buckets newer than the tier's [`State::settled`], so a fold's one
//! new row per series fills a few adjacent pages; [`settle_step`] moves final buckets in bulk
//! into `rollups`, keyed by series, where a series' range is one short scan. Every read here
//! covers both, so callers never see the split.
//!
//! Never folds points or decides what to evict: the rollup job does (`crate::rollup`); the
//! bucket maths is [`super::bucket`].

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use super::bucket::Acc;
use super::open::Ctx;
use super::sketch::Sketch;
use super::StoreError;

/// A tier's progress (`rollup_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Id of the last chunk folded into the tier.
    pub cursor: i64,
    /// Newest point time the tier has seen (capped at the wall clock); `i64::MIN`: none.
    pub watermark: i64,
    /// Points merged into buckets that were already final.
    pub late: i64,
    /// When the job last moved the cursor, ns (0: never).
    pub updated: i64,
    /// The newest bucket moved to `rollups` ([`settle_step`]): rows of buckets at or below
    /// it are there, newer ones in `rollups_recent`; `i64::MIN`: none moved yet.
    pub settled: i64,
}

impl Default for State {
    fn default() -> Self {
        State {
            cursor: 0,
            watermark: i64::MIN,
            late: 0,
            updated: 0,
            settled: i64::MIN,
        }
    }
}

/// Tier `key`'s progress (the default when the tier never ran).
pub fn state(conn: &Connection, path: &Path, key: i64) -> Result<State, StoreError> {
    conn.prepare_cached(
        "SELECT cursor, watermark_ns, late_points, updated_ns, settled_through FROM rollup_state \
         WHERE tier = ?1",
    )
    .and_then(|mut st| {
        st.query_row(params![key], |r| {
            Ok(State {
                cursor: r.get(0)?,
                watermark: r.get(1)?,
                late: r.get(2)?,
                updated: r.get(3)?,
                settled: r.get(4)?,
            })
        })
        .optional()
    })
    .map(Option::unwrap_or_default)
    .ctx(path)
}

/// Stores tier `key`'s progress, inside the caller's transaction (the one that wrote the
/// buckets of the chunks up to `s.cursor`).
pub fn put_state(tx: &Connection, path: &Path, key: i64, s: &State) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO rollup_state \
         (tier, cursor, watermark_ns, late_points, updated_ns, settled_through) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut st| {
        st.execute(params![
            key,
            s.cursor,
            s.watermark,
            s.late,
            s.updated,
            s.settled
        ])
    })
    .map(|_| ())
    .ctx(path)
}

/// Which parts of each rollup row a query reads: fewer columns are a measurable share of a
/// dashboard query (each column is decoded by SQLite and read through a call). Parts not read
/// are left empty in the [`Acc`]s (`count` is always right).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// count and sum: mean, sum, count.
    Sum,
    /// count, min and max.
    MinMax,
    /// count, first and last: last, rate.
    FirstLast,
    /// The sketch alone (with its count, min and max): percentiles.
    Sketch,
    /// Everything.
    All,
}

/// The three reads of rows with the columns `$cols` (after `bucket`): one series' range of
/// `rollups`; point reads of `rollups_recent`, one per bucket of the range (`?5`: the tier's
/// resolution, ns) and series of a list (`?2`, a JSON array of ids); a scan of
/// `rollups_recent`'s range, every series (the caller keeps those it asked for: a scan is
/// chosen when they are many of a bucket's rows). The recent reads end each row with its
/// `series_id`.
macro_rules! series_sql {
    ($cols:expr) => {
        [
            concat!(
                "SELECT bucket, ",
                $cols,
                " FROM rollups WHERE tier = ?1 AND series_id = ?2 AND bucket >= ?3 \
                 AND bucket <= ?4 ORDER BY bucket"
            ),
            // IN lists, not joins: a join may get a Bloom filter built by a scan of the tier.
            concat!(
                "WITH RECURSIVE b(x) AS (SELECT ?3 UNION ALL SELECT x + ?5 FROM b WHERE x + ?5 <= ?4) \
                 SELECT bucket, ",
                $cols,
                ", series_id FROM rollups_recent WHERE tier = ?1 AND bucket IN (SELECT x FROM b) \
                 AND series_id IN (SELECT value FROM json_each(?2))"
            ),
            concat!(
                "SELECT bucket, ",
                $cols,
                ", series_id FROM rollups_recent WHERE tier = ?1 AND bucket >= ?2 AND bucket <= ?3"
            ),
        ]
    };
}

/// Every aggregate column, in [`read_acc`]'s order.
macro_rules! all_cols {
    () => {
        "count, sum, min, max, first_ts, first, last_ts, last, sketch"
    };
}

/// Spans of at most this many buckets are read from `rollups_recent` by point reads (an
/// alert window, the recent part of a query: cheap either way); a longer one is scanned when
/// the series asked are at least a [`SCAN_RATIO`]th of a bucket's rows (a dashboard of every
/// model), else read by point reads (a tier that is not settled, see `Plan::settle_from_ns`,
/// holds months of buckets: a scan for a few series would read every series' rows).
const SHORT_SPAN: i64 = 64;

/// How many rows a scan reads in the time of one point read (a seek from the root), about.
const SCAN_RATIO: i64 = 10;

/// Rows of tier `key` in `rollups_recent` at `bucket` (one bucket's key range, counted).
fn rows_in_bucket(
    conn: &Connection,
    path: &Path,
    key: i64,
    bucket: i64,
) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT COUNT(*) FROM rollups_recent WHERE tier = ?1 AND bucket = ?2")
        .and_then(|mut st| st.query_row(params![key, bucket], |r| r.get(0)))
        .ctx(path)
}

impl Need {
    /// [`series_sql`] for this need.
    fn sql(self) -> &'static [&'static str; 3] {
        const SUM: [&str; 3] = series_sql!("count, sum");
        const MIN_MAX: [&str; 3] = series_sql!("count, min, max");
        const FIRST_LAST: [&str; 3] = series_sql!("count, first_ts, first, last_ts, last");
        const SKETCH: [&str; 3] = series_sql!("sketch");
        const ALL: [&str; 3] = series_sql!(all_cols!());
        match self {
            Need::Sum => &SUM,
            Need::MinMax => &MIN_MAX,
            Need::FirstLast => &FIRST_LAST,
            Need::Sketch => &SKETCH,
            Need::All => &ALL,
        }
    }

    /// How many columns [`Need::sql`] selects after `bucket`.
    fn columns(self) -> usize {
        match self {
            Need::Sum => 2,
            Need::MinMax => 3,
            Need::FirstLast => 5,
            Need::Sketch => 1,
            Need::All => 9,
        }
    }

    /// The row's aggregate, from the columns [`Need::sql`] selects (after `bucket`);
    /// `Err(())` when the sketch is corrupt.
    fn read(self, r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<Acc, ()>> {
        let count =
            |r: &rusqlite::Row<'_>| Ok::<_, rusqlite::Error>(r.get::<_, i64>(1)?.max(0) as u64);
        Ok(Ok(match self {
            Need::All => return read_acc_at(r, 1),
            Need::Sketch => {
                let Some(sketch) = r
                    .get_ref(1)?
                    .as_blob()
                    .ok()
                    .and_then(|b| Sketch::decode(b).ok())
                else {
                    return Ok(Err(()));
                };
                Acc {
                    count: sketch.count(),
                    min: sketch.min(),
                    max: sketch.max(),
                    sketch,
                    ..Acc::default()
                }
            }
            Need::Sum => Acc {
                count: count(r)?,
                sum: r.get(2)?,
                ..Acc::default()
            },
            Need::MinMax => Acc {
                count: count(r)?,
                min: r.get(2)?,
                max: r.get(3)?,
                ..Acc::default()
            },
            Need::FirstLast => Acc {
                count: count(r)?,
                first: (r.get(2)?, r.get(3)?),
                last: (r.get(4)?, r.get(5)?),
                ..Acc::default()
            },
        }))
    }
}

/// Reads a rollup row's aggregate columns (count, sum, min, max, first_ts, first, last_ts,
/// last, sketch, in this order from column 0); `Err(())` when the sketch is corrupt.
pub fn read_acc(r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<Acc, ()>> {
    read_acc_at(r, 0)
}

/// [`read_acc`] starting at column `at`.
pub fn read_acc_at(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Result<Acc, ()>> {
    let blob = r.get_ref(at + 8)?;
    let sketch = match blob.as_blob().ok().map(Sketch::decode) {
        Some(Ok(s)) => s,
        _ => return Ok(Err(())),
    };
    Ok(Ok(Acc {
        count: r.get::<_, i64>(at)?.max(0) as u64,
        sum: r.get(at + 1)?,
        min: r.get(at + 2)?,
        max: r.get(at + 3)?,
        first: (r.get(at + 4)?, r.get(at + 5)?),
        last: (r.get(at + 6)?, r.get(at + 7)?),
        sketch,
    }))
}

/// Which table holds a tier row (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// `rollups`, keyed by series: buckets at or below the tier's [`State::settled`].
    Settled,
    /// `rollups_recent`, keyed by time: newer buckets.
    Recent,
}

impl Place {
    /// Where the row of `bucket` is, for a tier settled through `settled`.
    fn of(bucket: i64, settled: i64) -> Place {
        if bucket <= settled {
            Place::Settled
        } else {
            Place::Recent
        }
    }
}

/// The oldest and newest bucket of tier `key` in `rollups_recent` (`None`: no rows). Two
/// subqueries, so each is one seek.
fn recent_span(conn: &Connection, path: &Path, key: i64) -> Result<Option<(i64, i64)>, StoreError> {
    conn.prepare_cached(
        "SELECT (SELECT MIN(bucket) FROM rollups_recent WHERE tier = ?1), \
                (SELECT MAX(bucket) FROM rollups_recent WHERE tier = ?1)",
    )
    .and_then(|mut st| {
        st.query_row(params![key], |r| {
            Ok(r.get::<_, Option<i64>>(0)?.zip(r.get::<_, Option<i64>>(1)?))
        })
    })
    .ctx(path)
}

/// `(index in the series list, bucket, row)` of [`read_recent`].
type RecentRows = Vec<(usize, i64, Result<Acc, ()>)>;

/// The `rollups_recent` rows of tier `key` for the series of `sids` with `lo <= bucket <=
/// hi`: `(index in sids, bucket, row)`, sorted by index then bucket. One statement for all
/// the series: a point read per bucket and series, or a scan of the span's buckets (see
/// [`SHORT_SPAN`]).
fn read_recent(
    conn: &Connection,
    path: &Path,
    key: i64,
    sids: &[i64],
    lo: i64,
    hi: i64,
    need: Need,
) -> Result<RecentRows, StoreError> {
    let mut out = Vec::new();
    let Some((oldest, newest)) = recent_span(conn, path, key)? else {
        return Ok(out);
    };
    let res = key.saturating_mul(1_000_000_000).max(1);
    // The first bucket at or after `lo` and `oldest` (a bucket, so `lo` may be far below).
    let first = lo.max(oldest);
    let from = match super::bucket::bucket_start(first, res) {
        start if start < first => start.saturating_add(res),
        start => start,
    };
    let to = hi.min(newest);
    if from > to || sids.is_empty() {
        return Ok(out);
    }
    let mut index: foldhash::HashMap<i64, Vec<usize>> = Default::default();
    for (i, &sid) in sids.iter().enumerate() {
        index.entry(sid).or_default().push(i);
    }
    let [_, points_sql, scan_sql] = need.sql();
    let mut st;
    let mut rows;
    let span = (to - from) / res + 1;
    if span <= SHORT_SPAN
        || (sids.len() as i64).saturating_mul(SCAN_RATIO) < rows_in_bucket(conn, path, key, newest)?
    {
        // The series as a JSON array, for `json_each`.
        let list = format!(
            "[{}]",
            index
                .keys()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        );
        st = conn.prepare_cached(points_sql).ctx(path)?;
        rows = st.query(params![key, list, from, to, res]).ctx(path)?;
    } else {
        st = conn.prepare_cached(scan_sql).ctx(path)?;
        rows = st.query(params![key, from, to]).ctx(path)?;
    }
    let sid_col = 1 + need.columns();
    // Per series asked, in bucket order (rows come by bucket; each list is sorted below,
    // which is linear when it already is), then one list: a row is moved, not sorted among
    // all of them, and cloned only for a series asked twice.
    let mut by_index: Vec<Vec<(i64, Result<Acc, ()>)>> = sids.iter().map(|_| Vec::new()).collect();
    while let Some(r) = rows.next().ctx(path)? {
        let bucket: i64 = r.get(0).ctx(path)?;
        let sid: i64 = r.get(sid_col).ctx(path)?;
        if let Some((&last, rest)) = index.get(&sid).and_then(|at| at.split_last()) {
            let acc = need.read(r).ctx(path)?;
            for &i in rest {
                by_index[i].push((bucket, acc.clone()));
            }
            by_index[last].push((bucket, acc));
        }
    }
    out.reserve(by_index.iter().map(Vec::len).sum());
    for (i, mut rows) in by_index.into_iter().enumerate() {
        rows.sort_by_key(|r| r.0);
        out.extend(rows.into_iter().map(|(b, acc)| (i, b, acc)));
    }
    Ok(out)
}

/// The rows of tier `key` and series `sid` with `lo <= bucket <= hi`, in bucket order:
/// `f(bucket, aggregate)` (`Err(())`: the row's sketch is corrupt), reading only `need`.
#[allow(clippy::too_many_arguments)]
pub fn read_range<E: From<StoreError>>(
    conn: &Connection,
    path: &Path,
    key: i64,
    sid: i64,
    lo: i64,
    hi: i64,
    need: Need,
    mut f: impl FnMut(i64, Result<Acc, ()>) -> Result<(), E>,
) -> Result<(), E> {
    read_ranges(conn, path, key, &[sid], lo, hi, need, |_, b, acc| f(b, acc))
}

/// The oldest bucket of tier `key` (`None`: no rows); eviction deletes a tier's oldest
/// buckets, so a row cache compares it between reads.
pub fn oldest_bucket(conn: &Connection, path: &Path, key: i64) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached(
        "SELECT (SELECT MIN(bucket) FROM rollups WHERE tier = ?1), \
                (SELECT MIN(bucket) FROM rollups_recent WHERE tier = ?1)",
    )
    .and_then(|mut st| {
        st.query_row(params![key], |r| {
            let (a, b): (Option<i64>, Option<i64>) = (r.get(0)?, r.get(1)?);
            Ok(match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            })
        })
    })
    .ctx(path)
}

/// [`read_range`] for each series of `sids` in turn: `f(index in sids, bucket, row)`. The
/// recent rows of every series are read at once, then each series' settled range, merged in
/// bucket order.
#[allow(clippy::too_many_arguments)]
pub fn read_ranges<E: From<StoreError>>(
    conn: &Connection,
    path: &Path,
    key: i64,
    sids: &[i64],
    lo: i64,
    hi: i64,
    need: Need,
    mut f: impl FnMut(usize, i64, Result<Acc, ()>) -> Result<(), E>,
) -> Result<(), E> {
    let recent = read_recent(conn, path, key, sids, lo, hi, need)?;
    let mut recent = recent.into_iter().peekable();
    let mut st = conn.prepare_cached(need.sql()[0]).ctx(path)?;
    for (i, &sid) in sids.iter().enumerate() {
        let mut rows = st.query(params![key, sid, lo, hi]).ctx(path)?;
        while let Some(r) = rows.next().ctx(path)? {
            let bucket: i64 = r.get(0).ctx(path)?;
            while let Some((_, b, acc)) = recent.next_if(|(at, b, _)| *at == i && *b < bucket) {
                f(i, b, acc)?;
            }
            f(i, bucket, need.read(r).ctx(path)?)?;
        }
        while let Some((_, b, acc)) = recent.next_if(|(at, _, _)| *at == i) {
            f(i, b, acc)?;
        }
    }
    Ok(())
}

/// The stored rows of tier `key` (resolution `res_ns`, settled through `settled`) and series
/// `sid` at `buckets` (ascending): one slot per bucket, `None` where there is no row yet,
/// `Some(Err(()))` where its sketch is corrupt. Settled buckets by one range read over them
/// (rows in the range that are not asked for are skipped undecoded), or point reads when
/// they are sparse in a wide range (e.g. one late point); recent ones by point reads.
pub fn read_buckets(
    tx: &Connection,
    path: &Path,
    key: i64,
    res_ns: i64,
    settled: i64,
    sid: i64,
    buckets: &[i64],
) -> Result<Vec<Option<Result<Acc, ()>>>, StoreError> {
    let mut out: Vec<Option<Result<Acc, ()>>> = (0..buckets.len()).map(|_| None).collect();
    let split = buckets.partition_point(|&b| Place::of(b, settled) == Place::Settled);
    let (old, new) = buckets.split_at(split);
    if !new.is_empty() {
        let mut get = tx
            .prepare_cached(concat!(
                "SELECT ",
                all_cols!(),
                " FROM rollups_recent WHERE tier = ?1 AND bucket = ?2 AND series_id = ?3"
            ))
            .ctx(path)?;
        for (slot, b) in out[split..].iter_mut().zip(new) {
            *slot = get
                .query_row(params![key, b, sid], read_acc)
                .optional()
                .ctx(path)?;
        }
    }
    let (Some(&lo), Some(&hi)) = (old.first(), old.last()) else {
        return Ok(out);
    };
    let span = (hi - lo) / res_ns + 1;
    if span <= 4 * old.len() as i64 + 64 {
        let mut st = tx.prepare_cached(Need::All.sql()[0]).ctx(path)?;
        let mut rows = st.query(params![key, sid, lo, hi]).ctx(path)?;
        let mut k = 0;
        while let Some(r) = rows.next().ctx(path)? {
            let b: i64 = r.get(0).ctx(path)?;
            while k < old.len() && old[k] < b {
                k += 1;
            }
            if k == old.len() {
                break;
            }
            if old[k] == b {
                out[k] = Some(read_acc_at(r, 1).ctx(path)?);
            }
        }
    } else {
        let mut get = tx
            .prepare_cached(concat!(
                "SELECT ",
                all_cols!(),
                " FROM rollups WHERE tier = ?1 AND series_id = ?2 AND bucket = ?3"
            ))
            .ctx(path)?;
        for (slot, b) in out.iter_mut().zip(old) {
            *slot = get
                .query_row(params![key, sid, b], read_acc)
                .optional()
                .ctx(path)?;
        }
    }
    Ok(out)
}

/// Writes one bucket row of a tier settled through `settled`, inside the caller's
/// transaction, in the table [`Place::of`] names: a plain insert when it is new (`exists ==
/// false`), else a replace by its merge.
#[allow(clippy::too_many_arguments)]
pub fn put(
    tx: &Connection,
    path: &Path,
    key: i64,
    settled: i64,
    sid: i64,
    bucket: i64,
    acc: &Acc,
    exists: bool,
) -> Result<(), StoreError> {
    macro_rules! insert {
        ($verb:literal, $table:literal) => {
            concat!(
                $verb,
                " INTO ",
                $table,
                " (tier, series_id, bucket, ",
                all_cols!(),
                ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
            )
        };
    }
    let sql = match (Place::of(bucket, settled), exists) {
        (Place::Settled, true) => insert!("INSERT OR REPLACE", "rollups"),
        (Place::Settled, false) => insert!("INSERT", "rollups"),
        (Place::Recent, true) => insert!("INSERT OR REPLACE", "rollups_recent"),
        (Place::Recent, false) => insert!("INSERT", "rollups_recent"),
    };
    tx.prepare_cached(sql)
        .and_then(|mut st| {
            st.execute(params![
                key,
                sid,
                bucket,
                acc.count as i64,
                acc.sum,
                acc.min,
                acc.max,
                acc.first.0,
                acc.first.1,
                acc.last.0,
                acc.last.1,
                acc.sketch.encode(),
            ])
        })
        .map(|_| ())
        .ctx(path)
}

/// The last bucket of about `limit` of the oldest rows, whole buckets: all rows before the
/// bucket of the `limit`-th oldest row (`nth_sql` finds it from `(key, through, limit)`),
/// or that bucket itself when it is the oldest, `first` (always progress); `None` when there
/// are fewer rows.
fn whole_buckets(
    tx: &Connection,
    path: &Path,
    nth_sql: &str,
    (key, through, limit): (i64, i64, i64),
    first: i64,
) -> Result<Option<i64>, StoreError> {
    let nth: Option<i64> = tx
        .prepare_cached(nth_sql)
        .and_then(|mut st| {
            st.query_row(params![key, through, limit], |r| r.get(0))
                .optional()
        })
        .ctx(path)?;
    Ok(nth.map(|b| if b > first { b - 1 } else { b }))
}

/// Most rows one [`settle_step`] moves (whole buckets; at least one bucket). Its sort by
/// series stays in memory under the job's 4 MiB cache (a few hundred bytes a row), so no
/// temporary file is written; an hour of 600 series moves in four steps, each writing
/// about a page per series.
pub const SETTLE_ROWS: i64 = 10_000;

/// Moves the oldest buckets of tier `key` at or below `through` from `rollups_recent` into
/// `rollups` when the oldest is at or below `only_if_oldest_by` (about [`SETTLE_ROWS`] rows,
/// whole buckets, the oldest bucket always), inside
/// the caller's transaction, in series order so each series' page is written once; returns
/// the rows moved and the bucket through which every row now is in `rollups` (`None`:
/// nothing at or below `through`). The caller stores that bucket as the tier's
/// [`State::settled`] in the same transaction.
pub fn settle_step(
    tx: &Connection,
    path: &Path,
    key: i64,
    through: i64,
    only_if_oldest_by: i64,
) -> Result<Option<(u64, i64)>, StoreError> {
    let Some((oldest, _)) = recent_span(tx, path, key)? else {
        return Ok(None);
    };
    if oldest > through || oldest > only_if_oldest_by {
        return Ok(None);
    }
    let upto = whole_buckets(
        tx,
        path,
        "SELECT bucket FROM rollups_recent WHERE tier = ?1 AND bucket <= ?2 \
         ORDER BY bucket LIMIT 1 OFFSET ?3",
        (key, through, SETTLE_ROWS),
        oldest,
    )?
    .unwrap_or(through);
    let moved = tx
        .prepare_cached(concat!(
            "INSERT INTO rollups (tier, series_id, bucket, ",
            all_cols!(),
            ") SELECT tier, series_id, bucket, ",
            all_cols!(),
            " FROM rollups_recent WHERE tier = ?1 AND bucket <= ?2 ORDER BY series_id, bucket"
        ))
        .and_then(|mut st| st.execute(params![key, upto]))
        .ctx(path)?;
    tx.prepare_cached("DELETE FROM rollups_recent WHERE tier = ?1 AND bucket <= ?2")
        .and_then(|mut st| st.execute(params![key, upto]))
        .ctx(path)?;
    Ok(Some((moved as u64, upto)))
}

/// Deletes about `limit` of the oldest rows of tier `key` with `bucket <= last_bucket`,
/// whole buckets at a time (all rows before the `limit`-th oldest one's bucket; always
/// progress, even when one bucket holds more than `limit` rows), inside the caller's
/// transaction; returns how many. The settled rows go first (they are the older ones).
pub fn delete_oldest(
    tx: &Connection,
    path: &Path,
    key: i64,
    last_bucket: i64,
    limit: i64,
) -> Result<u64, StoreError> {
    let oldest = |table_sql: &str| -> Result<Option<i64>, StoreError> {
        tx.prepare_cached(table_sql)
            .and_then(|mut st| st.query_row(params![key], |r| r.get(0)))
            .ctx(path)
    };
    let settled_first = oldest("SELECT MIN(bucket) FROM rollups WHERE tier = ?1")?;
    let (first, nth_sql, last_sql) = match settled_first {
        Some(f) if f <= last_bucket => (
            f,
            "SELECT bucket FROM rollups WHERE tier = ?1 AND bucket <= ?2 ORDER BY bucket LIMIT 1 OFFSET ?3",
            "SELECT MAX(bucket) FROM rollups WHERE tier = ?1 AND bucket <= ?2",
        ),
        _ => match oldest("SELECT MIN(bucket) FROM rollups_recent WHERE tier = ?1")? {
            Some(f) if f <= last_bucket => (
                f,
                "SELECT bucket FROM rollups_recent WHERE tier = ?1 AND bucket <= ?2 \
                 ORDER BY bucket LIMIT 1 OFFSET ?3",
                "SELECT MAX(bucket) FROM rollups_recent WHERE tier = ?1 AND bucket <= ?2",
            ),
            _ => return Ok(0),
        },
    };
    let upto = match whole_buckets(tx, path, nth_sql, (key, last_bucket, limit), first)? {
        Some(b) => b,
        // Fewer than `limit` rows: all of this table's, not yet the other's.
        None => tx
            .prepare_cached(last_sql)
            .and_then(|mut st| {
                st.query_row(params![key, last_bucket], |r| r.get::<_, Option<i64>>(0))
            })
            .ctx(path)?
            .unwrap_or(last_bucket),
    };
    // Rows a rollup-mode sink had not sent yet are counted against it (see
    // `sinks::record_rollup_eviction`), in this transaction.
    super::sinks::record_rollup_eviction(tx, path, key, upto)?;
    let mut n = 0;
    for sql in [
        "DELETE FROM rollups WHERE tier = ?1 AND bucket <= ?2",
        "DELETE FROM rollups_recent WHERE tier = ?1 AND bucket <= ?2",
    ] {
        n += tx
            .prepare_cached(sql)
            .and_then(|mut st| st.execute(params![key, upto]))
            .ctx(path)?;
    }
    Ok(n as u64)
}

/// One bucket row with the names of its series: what a forwarder sends in place of evicted
/// raw data, or, for a rollup-mode sink (`forward = "rollup:1m"`), instead of raw data.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedRow {
    /// The tag set's canonical key.
    pub key: String,
    /// Field.
    pub field: String,
    /// Bucket start, ns.
    pub bucket: i64,
    /// Series id: with `bucket`, the row's place in a [`named_rows`] read.
    pub series_id: i64,
    /// Values.
    pub count: i64,
    /// Their sum.
    pub sum: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// The 0.5, 0.9 and 0.99 quantiles from the row's sketch (within the sketch's relative
    /// accuracy, the values the query engine answers for `p50`/`p90`/`p99` over this one
    /// bucket); `None` when the sketch is empty or does not decode.
    pub quantiles: Option<[f64; 3]>,
}

/// The quantiles [`NamedRow::quantiles`] carries.
pub const NAMED_QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// The rows of tier `key` with `from <= bucket < to`, ordered by bucket then series id,
/// starting after the row `after` (bucket, series id) when given: a read that stopped can
/// resume where it was. At most `limit` rows when given.
pub fn named_rows(
    conn: &Connection,
    path: &Path,
    key: i64,
    from: i64,
    to: i64,
    after: Option<(i64, i64)>,
    limit: Option<usize>,
) -> Result<Vec<NamedRow>, StoreError> {
    Ok(
        named_rows_with(conn, path, key, from, to, after, limit, false)?
            .into_iter()
            .map(|(r, _)| r)
            .collect(),
    )
}

/// [`named_rows`] with each row's decoded sketch (`None` when it has none or it does not
/// decode): what the histogram feed sends.
#[allow(clippy::too_many_arguments)]
pub fn named_sketch_rows(
    conn: &Connection,
    path: &Path,
    key: i64,
    from: i64,
    to: i64,
    after: Option<(i64, i64)>,
    limit: Option<usize>,
) -> Result<Vec<(NamedRow, Option<Sketch>)>, StoreError> {
    named_rows_with(conn, path, key, from, to, after, limit, true)
}

#[allow(clippy::too_many_arguments)]
fn named_rows_with(
    conn: &Connection,
    path: &Path,
    key: i64,
    from: i64,
    to: i64,
    after: Option<(i64, i64)>,
    limit: Option<usize>,
    keep_sketch: bool,
) -> Result<Vec<(NamedRow, Option<Sketch>)>, StoreError> {
    macro_rules! named_sql {
        ($table:literal) => {
            concat!(
                "SELECT t.key, s.field, r.bucket, r.series_id, r.count, r.sum, r.min, r.max, r.sketch \
                 FROM ",
                $table,
                " r JOIN series s ON s.id = r.series_id JOIN tagsets t ON t.id = s.tagset_id \
                 WHERE r.tier = ?1 AND r.bucket >= ?2 AND r.bucket < ?3 \
                 AND (r.bucket > ?4 OR (r.bucket = ?4 AND r.series_id > ?5)) \
                 ORDER BY r.bucket, r.series_id LIMIT ?6"
            )
        };
    }
    let (after_bucket, after_series) = after.unwrap_or((i64::MIN, i64::MIN));
    let limit = limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
    let mut out = Vec::new();
    // Each table in (bucket, series) order; merged, as a bucket's rows are all in one table.
    for sql in [named_sql!("rollups"), named_sql!("rollups_recent")] {
        let mut st = conn.prepare_cached(sql).ctx(path)?;
        let rows = st
            .query_map(
                params![key, from, to, after_bucket, after_series, limit],
                |r| {
                    let sketch = r
                        .get_ref(8)?
                        .as_blob()
                        .ok()
                        .and_then(|b| Sketch::decode(b).ok());
                    let quantiles = sketch.as_ref().and_then(|sk| {
                        let q = NAMED_QUANTILES.map(|q| sk.quantile(q));
                        Some([q[0]?, q[1]?, q[2]?])
                    });
                    let row = NamedRow {
                        key: r.get(0)?,
                        field: r.get(1)?,
                        bucket: r.get(2)?,
                        series_id: r.get(3)?,
                        count: r.get(4)?,
                        sum: r.get(5)?,
                        min: r.get(6)?,
                        max: r.get(7)?,
                        quantiles,
                    };
                    Ok((row, sketch.filter(|_| keep_sketch)))
                },
            )
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .ctx(path)?;
        out.extend(rows);
    }
    out.sort_by_key(|(r, _)| (r.bucket, r.series_id));
    if let Ok(limit) = usize::try_from(limit) {
        out.truncate(limit);
    }
    Ok(out)
}

/// Rows of tier `key` with `after < bucket <= through`: (rows, distinct buckets, the oldest
/// bucket). What a rollup-mode sink has not sent yet (a range of the `(tier, bucket)`
/// index of each table).
pub fn pending(
    conn: &Connection,
    path: &Path,
    key: i64,
    after: i64,
    through: i64,
) -> Result<(i64, i64, Option<i64>), StoreError> {
    let mut total = (0i64, 0i64, None::<i64>);
    // A bucket's rows are all in one table, so the distinct buckets add up.
    for sql in [
        "SELECT COUNT(*), COUNT(DISTINCT bucket), MIN(bucket) FROM rollups \
         WHERE tier = ?1 AND bucket > ?2 AND bucket <= ?3",
        "SELECT COUNT(*), COUNT(DISTINCT bucket), MIN(bucket) FROM rollups_recent \
         WHERE tier = ?1 AND bucket > ?2 AND bucket <= ?3",
    ] {
        let (rows, buckets, oldest): (i64, i64, Option<i64>) = conn
            .prepare_cached(sql)
            .and_then(|mut st| {
                st.query_row(params![key, after, through], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
            })
            .ctx(path)?;
        total.0 += rows;
        total.1 += buckets;
        total.2 = match (total.2, oldest) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(total)
}
