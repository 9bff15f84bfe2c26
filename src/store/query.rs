//! Reading raw points back: the series list and raw-point queries by measurement, field,
//! tags and time range. Read-only; aggregation over rollups lives elsewhere.

use std::collections::{BTreeMap, HashMap};

use std::ops::ControlFlow;

use serde::Serialize;

use super::chunks::{self, Scan};
use super::{dict, Reader, StoreError};
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
    /// True when `limit` cut the result short.
    pub truncated: bool,
}

impl Reader {
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

    /// Raw points of every series matching `q`.
    pub fn query_raw(&self, q: &RawQuery) -> Result<RawResult, StoreError> {
        let mut series = Vec::new();
        let mut total = 0usize;
        let mut truncated = false;
        for ts in dict::tagsets(&self.conn, &self.path, Some(&q.measurement))? {
            if !q.tags.iter().all(|(k, v)| ts.tags.get(k) == Some(v)) {
                continue;
            }
            let fields: Vec<_> = dict::fields(&self.conn, &self.path, ts.id)?
                .into_iter()
                .filter(|s| q.field.as_deref().map_or(true, |want| want == s.field))
                .collect();
            if fields.is_empty() {
                continue;
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
            for (f, mut pts) in fields.into_iter().zip(points) {
                // Chunks of different commits may overlap in time (late points).
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
            if truncated {
                break;
            }
        }
        Ok(RawResult { series, truncated })
    }
}
