//! The rollup tiers' tables: bucket rows (`rollups`: one [`Acc`] per tier, series and
//! bucket) and each tier's cursor and watermark (`rollup_state`). Reads for the query engine
//! (only the columns a query needs, see [`Need`]), the forwarder's eviction fallback and
//! rollup-mode sinks ([`named_rows`], [`pending`]);
//! reads and writes for the rollup job, inside its transactions.
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
}

impl Default for State {
    fn default() -> Self {
        State {
            cursor: 0,
            watermark: i64::MIN,
            late: 0,
            updated: 0,
        }
    }
}

/// Tier `key`'s progress (the default when the tier never ran).
pub fn state(conn: &Connection, path: &Path, key: i64) -> Result<State, StoreError> {
    conn.prepare_cached(
        "SELECT cursor, watermark_ns, late_points, updated_ns FROM rollup_state WHERE tier = ?1",
    )
    .and_then(|mut st| {
        st.query_row(params![key], |r| {
            Ok(State {
                cursor: r.get(0)?,
                watermark: r.get(1)?,
                late: r.get(2)?,
                updated: r.get(3)?,
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
        "INSERT OR REPLACE INTO rollup_state (tier, cursor, watermark_ns, late_points, updated_ns) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut st| st.execute(params![key, s.cursor, s.watermark, s.late, s.updated]))
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

impl Need {
    fn sql(self) -> &'static str {
        match self {
            Need::Sum => "SELECT bucket, count, sum FROM rollups \
                WHERE tier = ?1 AND series_id = ?2 AND bucket >= ?3 AND bucket <= ?4 ORDER BY bucket",
            Need::MinMax => "SELECT bucket, count, min, max FROM rollups \
                WHERE tier = ?1 AND series_id = ?2 AND bucket >= ?3 AND bucket <= ?4 ORDER BY bucket",
            Need::FirstLast => "SELECT bucket, count, first_ts, first, last_ts, last FROM rollups \
                WHERE tier = ?1 AND series_id = ?2 AND bucket >= ?3 AND bucket <= ?4 ORDER BY bucket",
            Need::Sketch => "SELECT bucket, sketch FROM rollups \
                WHERE tier = ?1 AND series_id = ?2 AND bucket >= ?3 AND bucket <= ?4 ORDER BY bucket",
            Need::All => "SELECT bucket, count, sum, min, max, first_ts, first, last_ts, last, sketch \
                FROM rollups WHERE tier = ?1 AND series_id = ?2 AND bucket >= ?3 AND bucket <= ?4 ORDER BY bucket",
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
    let mut st = conn.prepare_cached(need.sql()).ctx(path)?;
    let mut rows = st.query(params![key, sid, lo, hi]).ctx(path)?;
    while let Some(r) = rows.next().ctx(path)? {
        let bucket: i64 = r.get(0).ctx(path)?;
        f(bucket, need.read(r).ctx(path)?)?;
    }
    Ok(())
}

/// The oldest bucket of tier `key` (`None`: no rows); eviction deletes a tier's oldest
/// buckets, so a row cache compares it between reads.
pub fn oldest_bucket(conn: &Connection, path: &Path, key: i64) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached("SELECT MIN(bucket) FROM rollups WHERE tier = ?1")
        .and_then(|mut st| st.query_row(params![key], |r| r.get(0)))
        .ctx(path)
}

/// [`read_range`] for each series of `sids` in turn, with one prepared statement for all of
/// them: `f(index in sids, bucket, row)`.
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
    let mut st = conn.prepare_cached(need.sql()).ctx(path)?;
    for (i, sid) in sids.iter().enumerate() {
        let mut rows = st.query(params![key, sid, lo, hi]).ctx(path)?;
        while let Some(r) = rows.next().ctx(path)? {
            let bucket: i64 = r.get(0).ctx(path)?;
            f(i, bucket, need.read(r).ctx(path)?)?;
        }
    }
    Ok(())
}

/// The stored rows of tier `key` (resolution `res_ns`) and series `sid` at `buckets`
/// (ascending): one slot per bucket, `None` where there is no row yet, `Some(Err(()))` where
/// its sketch is corrupt. One range read over the buckets (rows in the range that are not
/// asked for are skipped undecoded), or point reads when the buckets are sparse in a wide
/// range (e.g. one late point).
pub fn read_buckets(
    tx: &Connection,
    path: &Path,
    key: i64,
    res_ns: i64,
    sid: i64,
    buckets: &[i64],
) -> Result<Vec<Option<Result<Acc, ()>>>, StoreError> {
    let mut out: Vec<Option<Result<Acc, ()>>> = (0..buckets.len()).map(|_| None).collect();
    let (Some(&lo), Some(&hi)) = (buckets.first(), buckets.last()) else {
        return Ok(out);
    };
    let span = (hi - lo) / res_ns + 1;
    if span <= 4 * buckets.len() as i64 + 64 {
        let mut st = tx
            .prepare_cached(
                "SELECT bucket, count, sum, min, max, first_ts, first, last_ts, last, sketch FROM rollups \
                 WHERE tier = ?1 AND series_id = ?2 AND bucket >= ?3 AND bucket <= ?4 ORDER BY bucket",
            )
            .ctx(path)?;
        let mut rows = st.query(params![key, sid, lo, hi]).ctx(path)?;
        let mut k = 0;
        while let Some(r) = rows.next().ctx(path)? {
            let b: i64 = r.get(0).ctx(path)?;
            while k < buckets.len() && buckets[k] < b {
                k += 1;
            }
            if k == buckets.len() {
                break;
            }
            if buckets[k] == b {
                out[k] = Some(read_acc_at(r, 1).ctx(path)?);
            }
        }
    } else {
        let mut get = tx
            .prepare_cached(
                "SELECT count, sum, min, max, first_ts, first, last_ts, last, sketch FROM rollups \
                 WHERE tier = ?1 AND series_id = ?2 AND bucket = ?3",
            )
            .ctx(path)?;
        for (slot, b) in out.iter_mut().zip(buckets) {
            *slot = get
                .query_row(params![key, sid, b], read_acc)
                .optional()
                .ctx(path)?;
        }
    }
    Ok(out)
}

/// Writes one bucket row, inside the caller's transaction: a plain insert when it is new
/// (`exists == false`), else a replace by its merge.
pub fn put(
    tx: &Connection,
    path: &Path,
    key: i64,
    sid: i64,
    bucket: i64,
    acc: &Acc,
    exists: bool,
) -> Result<(), StoreError> {
    let sql = if exists {
        "INSERT OR REPLACE INTO rollups (tier, series_id, bucket, count, sum, min, max, \
         first_ts, first, last_ts, last, sketch) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
    } else {
        "INSERT INTO rollups (tier, series_id, bucket, count, sum, min, max, \
         first_ts, first, last_ts, last, sketch) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
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

/// Deletes about `limit` of the oldest rows of tier `key` with `bucket <= last_bucket`,
/// whole buckets at a time (all rows before the `limit`-th oldest one's bucket; always
/// progress, even when one bucket holds more than `limit` rows), inside the caller's
/// transaction; returns how many.
pub fn delete_oldest(
    tx: &Connection,
    path: &Path,
    key: i64,
    last_bucket: i64,
    limit: i64,
) -> Result<u64, StoreError> {
    let bound: Option<i64> = tx
        .query_row(
            "SELECT bucket FROM rollups WHERE tier = ?1 AND bucket <= ?2 ORDER BY bucket LIMIT 1 OFFSET ?3",
            params![key, last_bucket, limit],
            |r| r.get(0),
        )
        .optional()
        .ctx(path)?;
    let upto = match bound {
        Some(b) => {
            let first: i64 = tx
                .query_row(
                    "SELECT MIN(bucket) FROM rollups WHERE tier = ?1",
                    params![key],
                    |r| r.get(0),
                )
                .ctx(path)?;
            if b > first {
                b - 1
            } else {
                b
            }
        }
        None => last_bucket,
    };
    // Rows a rollup-mode sink had not sent yet are counted against it (see
    // `sinks::record_rollup_eviction`), in this transaction.
    super::sinks::record_rollup_eviction(tx, path, key, upto)?;
    let n = tx
        .execute(
            "DELETE FROM rollups WHERE tier = ?1 AND bucket <= ?2",
            params![key, upto],
        )
        .ctx(path)?;
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
    let mut st = conn
        .prepare_cached(
            "SELECT t.key, s.field, r.bucket, r.series_id, r.count, r.sum, r.min, r.max, r.sketch \
             FROM rollups r \
             JOIN series s ON s.id = r.series_id JOIN tagsets t ON t.id = s.tagset_id \
             WHERE r.tier = ?1 AND r.bucket >= ?2 AND r.bucket < ?3 \
             AND (r.bucket > ?4 OR (r.bucket = ?4 AND r.series_id > ?5)) \
             ORDER BY r.bucket, r.series_id LIMIT ?6",
        )
        .ctx(path)?;
    let (after_bucket, after_series) = after.unwrap_or((i64::MIN, i64::MIN));
    let limit = limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
    st.query_map(
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
    .and_then(|rows| rows.collect())
    .ctx(path)
}

/// Rows of tier `key` with `after < bucket <= through`: (rows, distinct buckets, the oldest
/// bucket). What a rollup-mode sink has not sent yet (one range of the `(tier, bucket)`
/// index).
pub fn pending(
    conn: &Connection,
    path: &Path,
    key: i64,
    after: i64,
    through: i64,
) -> Result<(i64, i64, Option<i64>), StoreError> {
    conn.prepare_cached(
        "SELECT COUNT(*), COUNT(DISTINCT bucket), MIN(bucket) FROM rollups \
         WHERE tier = ?1 AND bucket > ?2 AND bucket <= ?3",
    )
    .and_then(|mut st| {
        st.query_row(params![key, after, through], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
    })
    .ctx(path)
}
