//! Reading raw points back: the series list and raw-point queries by measurement, field,
//! tags and time range. Read-only; aggregation over rollups lives elsewhere.

use std::collections::{BTreeMap, HashMap};

use rusqlite::params;
use serde::Serialize;

use super::{codec, sql_err, Reader, StoreError};
use crate::model::{Kind, Value};

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
    /// True when `limit` cut the result short.
    pub truncated: bool,
}

struct TagsetRow {
    id: i64,
    measurement: String,
    tags: BTreeMap<String, String>,
}

impl Reader {
    fn tagsets(&self, measurement: Option<&str>) -> Result<Vec<TagsetRow>, StoreError> {
        let e = sql_err(&self.path);
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT id, measurement, tags FROM tagsets WHERE ?1 IS NULL OR measurement = ?1 ORDER BY key",
            )
            .map_err(&e)?;
        let rows = st
            .query_map(params![measurement], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(&e)?;
        let mut out = Vec::new();
        for row in rows {
            let (id, measurement, tags) = row.map_err(&e)?;
            let tags = serde_json::from_str(&tags).unwrap_or_default();
            out.push(TagsetRow {
                id,
                measurement,
                tags,
            });
        }
        Ok(out)
    }

    fn fields_of(&self, tagset: i64) -> Result<Vec<(i64, String, Kind)>, StoreError> {
        let e = sql_err(&self.path);
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT id, field, kind FROM series WHERE tagset_id = ?1 ORDER BY field",
            )
            .map_err(&e)?;
        let rows = st
            .query_map(params![tagset], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
            .map_err(&e)?;
        let mut out = Vec::new();
        for row in rows {
            let (id, field, kind) = row.map_err(&e)?;
            out.push((id, field, Kind::from_code(kind).unwrap_or(Kind::Float)));
        }
        Ok(out)
    }

    /// Every series, optionally of one measurement, ordered by key and field.
    pub fn series(&self, measurement: Option<&str>) -> Result<Vec<SeriesInfo>, StoreError> {
        let mut out = Vec::new();
        for ts in self.tagsets(measurement)? {
            for (_, field, kind) in self.fields_of(ts.id)? {
                out.push(SeriesInfo {
                    measurement: ts.measurement.clone(),
                    tags: ts.tags.clone(),
                    field,
                    kind: kind.name(),
                });
            }
        }
        Ok(out)
    }

    /// Raw points of every series matching `q`.
    pub fn query_raw(&self, q: &RawQuery) -> Result<RawResult, StoreError> {
        let e = sql_err(&self.path);
        let mut series = Vec::new();
        let mut total = 0usize;
        let mut truncated = false;
        for ts in self.tagsets(Some(&q.measurement))? {
            if !q.tags.iter().all(|(k, v)| ts.tags.get(k) == Some(v)) {
                continue;
            }
            let fields: Vec<_> = self
                .fields_of(ts.id)?
                .into_iter()
                .filter(|(_, f, _)| q.field.as_deref().map_or(true, |want| want == f))
                .collect();
            if fields.is_empty() {
                continue;
            }
            let index: HashMap<i64, usize> =
                fields.iter().enumerate().map(|(i, f)| (f.0, i)).collect();
            let mut points: Vec<Vec<(i64, Value)>> = vec![Vec::new(); fields.len()];
            let mut st = self
                .conn
                .prepare_cached(
                    "SELECT ts_min, data FROM chunks WHERE tagset_id = ?1 AND ts_max >= ?2 AND ts_min <= ?3 ORDER BY id",
                )
                .map_err(&e)?;
            let mut rows = st.query(params![ts.id, q.from, q.to]).map_err(&e)?;
            while let Some(row) = rows.next().map_err(&e)? {
                if total >= q.limit {
                    truncated = true;
                    break;
                }
                let ts_min: i64 = row.get(0).map_err(&e)?;
                let data =
                    row.get_ref(1)
                        .map_err(&e)?
                        .as_blob()
                        .map_err(|err| StoreError::Sqlite {
                            path: self.path.clone(),
                            source: err.into(),
                        })?;
                let (from, to, limit) = (q.from, q.to, q.limit);
                codec::decode_chunk(data, ts_min, |t, sid, v| {
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
                })
                .map_err(|source| StoreError::Corrupt {
                    path: self.path.clone(),
                    source,
                })?;
            }
            for ((_, field, kind), mut pts) in fields.into_iter().zip(points) {
                // Chunks of different commits may overlap in time (late points).
                pts.sort_by_key(|p| p.0);
                if pts.is_empty() {
                    continue;
                }
                series.push(SeriesPoints {
                    measurement: ts.measurement.clone(),
                    tags: ts.tags.clone(),
                    field,
                    kind: kind.name(),
                    points: pts,
                });
            }
            if truncated {
                break;
            }
        }
        Ok(RawResult { series, truncated })
    }
}
