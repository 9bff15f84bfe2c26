//! Reading raw points back: the series list (in pages, with a filter), the distinct
//! measurement + field pairs, series counts and raw-point queries by measurement, field, tags
//! and time range. Read-only; aggregation over rollups lives elsewhere. A page or a count
//! reads the dictionary row by row and keeps only what it returns, never the whole of it.

use std::collections::{BTreeMap, HashMap};

use std::ops::ControlFlow;

use serde::Serialize;

use super::chunks::{self, Scan};
use super::{dict, Ctx, Reader, StoreError};
use crate::model::Value;

/// One series of the dictionary.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SeriesInfo {
    /// Measurement.
    pub measurement: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Field key.
    pub field: String,
    /// Field type name.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// A raw-point query.
#[derive(Debug, Clone, Default)]
pub struct RawQuery {
    /// Measurement (required).
    pub measurement: String,
    /// Only this field, if set.
    pub field: Option<String>,
    /// Tags that must match exactly.
    pub tags: Vec<(String, String)>,
    /// Inclusive start, ns.
    pub from: i64,
    /// Inclusive end, ns.
    pub to: i64,
    /// Most points returned over all series.
    pub limit: usize,
}

/// Points of one series.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SeriesPoints {
    /// Measurement.
    pub measurement: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Field key.
    pub field: String,
    /// Field type name.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `[ts_ns, value]` pairs in time order.
    pub points: Vec<(i64, Value)>,
}

/// Result of a raw query.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RawResult {
    /// Matching series with their points.
    pub series: Vec<SeriesPoints>,
    /// True when `limit` (or [`MAX_RAW_SERIES`]) cut the result short.
    pub truncated: bool,
}

/// Most series one raw query answers (each carries its tags); past it the answer is cut
/// and says `truncated`.
pub const MAX_RAW_SERIES: usize = 5_000;

/// Which series a page of the listing holds.
#[derive(Debug, Clone, Default)]
pub struct SeriesFilter {
    /// Only this measurement.
    pub measurement: Option<String>,
    /// Words that must each appear (ASCII case-insensitive) in `key field` (the tag set's
    /// canonical key, a space, the field).
    pub words: Vec<String>,
    /// Only series after this `(tag set key, field)` (the previous page's last).
    pub after: Option<(String, String)>,
    /// Most series in the page.
    pub limit: usize,
}

/// One measurement + field, with the number of its series.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FieldInfo {
    /// Measurement.
    pub measurement: String,
    /// Field key.
    pub field: String,
    /// Field type name.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Series (tag sets) with this field.
    pub series: i64,
}

/// `WHERE` terms for `words` on `key || ' ' || field` (LIKE, `\` escapes), appended to
/// `sql` with their arguments.
fn like_words(sql: &mut String, args: &mut Vec<rusqlite::types::Value>, words: &[String]) {
    for w in words {
        let mut pat = String::from("%");
        for c in w.chars() {
            if matches!(c, '%' | '_' | '\\') {
                pat.push('\\');
            }
            pat.push(c);
        }
        pat.push('%');
        args.push(pat.into());
        sql.push_str(&format!(
            " AND (t.key || ' ' || s.field) LIKE ?{} ESCAPE '\\'",
            args.len()
        ));
    }
}

/// `s` as a JSON string.
fn json_str(out: &mut Vec<u8>, s: &str) {
    // Writing a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

impl Reader {
    /// One page of the series listing (see [`SeriesFilter`]), ordered by tag set key and
    /// field, written to `out` as a JSON array of `{measurement, tags, field, type}` as the
    /// rows are read (the stored tags are JSON already: copied, not parsed). Returns where
    /// the next page starts (`(key, field)` of the last series) when there may be more.
    pub fn series_page_json(
        &self,
        f: &SeriesFilter,
        out: &mut Vec<u8>,
    ) -> Result<Option<(String, String)>, StoreError> {
        use rusqlite::types::Value as V;
        let mut sql = String::from(
            "SELECT t.key, t.measurement, t.tags, s.field, s.kind FROM tagsets t \
             JOIN series s ON s.tagset_id = t.id WHERE 1",
        );
        let mut args: Vec<V> = Vec::new();
        if let Some(m) = &f.measurement {
            args.push(V::Text(m.clone()));
            sql.push_str(&format!(" AND t.measurement = ?{}", args.len()));
        }
        if let Some((k, field)) = &f.after {
            args.push(V::Text(k.clone()));
            args.push(V::Text(field.clone()));
            let (a, b) = (args.len() - 1, args.len());
            sql.push_str(&format!(
                " AND (t.key > ?{a} OR (t.key = ?{a} AND s.field > ?{b}))"
            ));
        }
        like_words(&mut sql, &mut args, &f.words);
        // One more than asked: whether there is a next page.
        args.push(V::Integer(
            f.limit.saturating_add(1).min(i64::MAX as usize) as i64
        ));
        sql.push_str(&format!(" ORDER BY t.key, s.field LIMIT ?{}", args.len()));
        let mut st = self.conn.prepare_cached(&sql).ctx(&self.path)?;
        let mut rows = st.query(rusqlite::params_from_iter(args)).ctx(&self.path)?;
        let (mut n, mut last) = (0usize, None::<(String, String)>);
        out.push(b'[');
        while let Some(r) = rows.next().ctx(&self.path)? {
            if n == f.limit {
                out.push(b']');
                return Ok(last);
            }
            let text = |i| r.get_ref(i).and_then(|v| Ok(v.as_str()?)).ctx(&self.path);
            let (key, m, tags, field) = (text(0)?, text(1)?, text(2)?, text(3)?);
            let kind = crate::model::Kind::from_code(r.get(4).ctx(&self.path)?)
                .unwrap_or(crate::model::Kind::Float);
            if n > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"measurement\":");
            json_str(out, m);
            out.extend_from_slice(b",\"tags\":");
            // Written by the writer with serde_json: an object, valid JSON.
            out.extend_from_slice(if tags.starts_with('{') {
                tags.as_bytes()
            } else {
                b"{}"
            });
            out.extend_from_slice(b",\"field\":");
            json_str(out, field);
            out.extend_from_slice(b",\"type\":");
            json_str(out, kind.name());
            out.push(b'}');
            n += 1;
            match &mut last {
                Some((k, fl)) => {
                    k.clear();
                    k.push_str(key);
                    fl.clear();
                    fl.push_str(field);
                }
                None => last = Some((key.to_string(), field.to_string())),
            }
        }
        out.push(b']');
        Ok(None)
    }

    /// How many series match `f`'s measurement and words (its cursor and limit ignored).
    pub fn series_matching(&self, f: &SeriesFilter) -> Result<i64, StoreError> {
        use rusqlite::types::Value as V;
        let mut sql = String::from(
            "SELECT COUNT(*) FROM tagsets t JOIN series s ON s.tagset_id = t.id WHERE 1",
        );
        let mut args: Vec<V> = Vec::new();
        if let Some(m) = &f.measurement {
            args.push(V::Text(m.clone()));
            sql.push_str(&format!(" AND t.measurement = ?{}", args.len()));
        }
        like_words(&mut sql, &mut args, &f.words);
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut st| st.query_row(rusqlite::params_from_iter(args), |r| r.get(0)))
            .ctx(&self.path)
    }

    /// The distinct measurement + field pairs (of one measurement if given), by
    /// measurement and field, at most `limit`; true when there were more.
    pub fn fields(
        &self,
        measurement: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<FieldInfo>, bool), StoreError> {
        let sql = format!(
            "SELECT t.measurement, s.field, s.kind, COUNT(*) FROM series s \
             JOIN tagsets t ON t.id = s.tagset_id {} \
             GROUP BY t.measurement, s.field, s.kind ORDER BY t.measurement, s.field LIMIT ?1",
            if measurement.is_some() {
                "WHERE t.measurement = ?2"
            } else {
                ""
            }
        );
        let mut st = self.conn.prepare_cached(&sql).ctx(&self.path)?;
        let n = limit.saturating_add(1).min(i64::MAX as usize) as i64;
        let mut rows = match measurement {
            Some(m) => st.query(rusqlite::params![n, m]),
            None => st.query(rusqlite::params![n]),
        }
        .ctx(&self.path)?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().ctx(&self.path)? {
            if out.len() == limit {
                return Ok((out, true));
            }
            out.push(FieldInfo {
                measurement: r.get(0).ctx(&self.path)?,
                field: r.get(1).ctx(&self.path)?,
                kind: crate::model::Kind::from_code(r.get(2).ctx(&self.path)?)
                    .unwrap_or(crate::model::Kind::Float)
                    .name(),
                series: r.get(3).ctx(&self.path)?,
            });
        }
        Ok((out, false))
    }

    /// How many tag sets of `measurement` matching `tags` have the numeric series `field`:
    /// what an aggregate query reads. Row by row; the tags of a row are parsed only when
    /// `tags` is not empty.
    pub fn count_numeric(
        &self,
        measurement: &str,
        field: &str,
        tags: &[(String, String)],
    ) -> Result<usize, StoreError> {
        let mut n = 0usize;
        dict::numeric_members(&self.conn, &self.path, measurement, field, |_, key| {
            if tags.is_empty() {
                n += 1;
            } else {
                let have = crate::model::split_series_key(key).1;
                if tags
                    .iter()
                    .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
                {
                    n += 1;
                }
            }
            ControlFlow::Continue(())
        })?;
        Ok(n)
    }

    /// One run of the numeric series `field` of the tag sets of `measurement` whose tag set
    /// id is above `after`, by tag set id: calls `f(series id, tag set key)` for each until
    /// `f` breaks. Returns the tag set id to resume after when `f` broke (there may be more),
    /// `None` when every member was read. One statement per call, so a caller that shares
    /// this reader can let go of it between runs (`/metrics` writes each run out unlocked).
    pub fn numeric_members_after(
        &self,
        measurement: &str,
        field: &str,
        after: i64,
        mut f: impl FnMut(i64, &str) -> ControlFlow<()>,
    ) -> Result<Option<i64>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT t.id, s.id, t.key FROM tagsets t JOIN series s \
                 ON s.tagset_id = t.id AND s.field = ?2 \
                 WHERE t.measurement = ?1 AND t.id > ?3 AND s.kind != 4 ORDER BY t.id",
            )
            .ctx(&self.path)?;
        let mut rows = st
            .query(rusqlite::params![measurement, field, after])
            .ctx(&self.path)?;
        while let Some(r) = rows.next().ctx(&self.path)? {
            #[cfg(any(test, feature = "test-fakes"))]
            fault::row(&self.path)?;
            let tagset: i64 = r.get(0).ctx(&self.path)?;
            let key = r.get_ref(2).and_then(|v| Ok(v.as_str()?)).ctx(&self.path)?;
            if f(r.get(1).ctx(&self.path)?, key).is_break() {
                return Ok(Some(tagset));
            }
        }
        Ok(None)
    }

    /// Every series, optionally of one measurement, ordered by key and field.
    pub fn series(&self, measurement: Option<&str>) -> Result<Vec<SeriesInfo>, StoreError> {
        let mut out = Vec::new();
        for ts in dict::tagsets(&self.conn, &self.path, measurement)? {
            for s in dict::fields(&self.conn, &self.path, ts.id)? {
                out.push(SeriesInfo {
                    measurement: ts.measurement.clone(),
                    tags: ts.tags.clone(),
                    field: s.field,
                    kind: s.kind.name(),
                });
            }
        }
        Ok(out)
    }

    /// Raw points of every series matching `q`: at most `q.limit` points and
    /// [`MAX_RAW_SERIES`] series (`truncated` says when either cut it). Tag sets are read
    /// one at a time; only the answer is held.
    pub fn query_raw(&self, q: &RawQuery) -> Result<RawResult, StoreError> {
        let mut series = Vec::new();
        let mut total = 0usize;
        let mut truncated = false;
        dict::for_each_tagset(&self.conn, &self.path, &q.measurement, &q.tags, |ts| {
            if series.len() >= MAX_RAW_SERIES {
                truncated = true;
                return Ok(ControlFlow::Break(()));
            }
            let fields: Vec<_> = dict::fields(&self.conn, &self.path, ts.id)?
                .into_iter()
                .filter(|s| q.field.as_deref().map_or(true, |want| want == s.field))
                .collect();
            if fields.is_empty() {
                return Ok(ControlFlow::Continue(()));
            }
            let index: HashMap<i64, usize> =
                fields.iter().enumerate().map(|(i, f)| (f.id, i)).collect();
            let mut points: Vec<Vec<(i64, Value)>> = vec![Vec::new(); fields.len()];
            let scan = Scan {
                tagset: Some(ts.id),
                ts_from: Some(q.from),
                ts_to: Some(q.to),
                ..Scan::default()
            };
            let (from, to, limit) = (q.from, q.to, q.limit);
            chunks::scan(&self.conn, &self.path, &scan, |c| {
                if total >= limit {
                    truncated = true;
                    return Ok(ControlFlow::Break(()));
                }
                c.decode(&self.path, |t, sid, v| {
                    if t < from || t > to {
                        return;
                    }
                    if let Some(&i) = index.get(&sid) {
                        if total < limit {
                            points[i].push((t, v));
                            total += 1;
                        } else {
                            truncated = true;
                        }
                    }
                })?;
                Ok(ControlFlow::Continue(()))
            })?;
            // The points the writer held when the read began (none outside
            // `read_with_held`): received, not committed yet.
            if let Some(held) = &*self.held() {
                for (t, sid, v) in held.values_in(ts.id, from, to) {
                    let Some(&i) = index.get(&sid) else { continue };
                    if total < limit {
                        points[i].push((t, v.clone()));
                        total += 1;
                    } else {
                        truncated = true;
                    }
                }
            }
            for (f, mut pts) in fields.into_iter().zip(points) {
                // Chunks of different commits may overlap in time (late points), and held
                // points may be older than stored ones.
                pts.sort_by_key(|p| p.0);
                if pts.is_empty() {
                    continue;
                }
                series.push(SeriesPoints {
                    measurement: ts.measurement.clone(),
                    tags: ts.tags.clone(),
                    field: f.field,
                    kind: f.kind.name(),
                    points: pts,
                });
            }
            Ok(if truncated {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            })
        })?;
        Ok(RawResult { series, truncated })
    }
}

/// A store that fails mid-read, for the tests of what a half-read answer does (tests and the
/// `test-fakes` feature only, never in the release binary): with `EW_FAULT_STORE_READ_ROWS`
/// set to row numbers (`2000,8000`), the read of each of those rows by
/// [`Reader::numeric_members_after`], counted over the whole process, fails with an I/O
/// error.
#[cfg(any(test, feature = "test-fakes"))]
mod fault {
    use std::path::Path;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    use super::StoreError;

    /// The environment variable naming the rows that fail.
    pub const VAR: &str = "EW_FAULT_STORE_READ_ROWS";

    static ROWS: AtomicU64 = AtomicU64::new(0);

    pub fn row(path: &Path) -> Result<(), StoreError> {
        static FAIL: OnceLock<Vec<u64>> = OnceLock::new();
        let fail = FAIL.get_or_init(|| {
            std::env::var(VAR)
                .unwrap_or_default()
                .split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect()
        });
        if fail.is_empty() {
            return Ok(());
        }
        let n = ROWS.fetch_add(1, Ordering::Relaxed) + 1;
        if !fail.contains(&n) {
            return Ok(());
        }
        tracing::warn!(row = n, "{VAR}: failing this read");
        Err(StoreError::Sqlite {
            path: path.to_path_buf(),
            source: rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                Some(format!("read of row {n} failed ({VAR})")),
            ),
        })
    }
}
