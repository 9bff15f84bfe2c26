//! The MQTT sink's messages beside a batch, derived from points the batch carries: for each
//! `edgewatch_incident` point that opens an incident, the whole incident (its row and triage
//! snapshot, as `GET /api/v1/incidents/{id}` shows it) on `edgewatch/{device_id}/incidents`,
//! not retained; and for the newest `edgewatch_agent_info` point of the batch (the agent's
//! inventory, `collect/inventory.rs`) a retained JSON message on `edgewatch/{device_id}/info`
//! (`{device_id, ts, tags, fields}`), so a new subscriber sees every agent at once. They are
//! part of their batch: the cursor passes the batch only once the
//! broker acknowledged them too, so they go through store-and-forward like the points
//! (and, like them, at most the batches in flight per fault go twice). The incident is read
//! by id through the store's typed function, never from the incidents table here. Pure but
//! for that read (a closure); never publishes.

use super::encode::Point;
use crate::alert::incident::explain::MEASUREMENT;
use crate::model::Value;
use crate::store::incidents::IncidentRow;
use crate::store::StoreError;

/// One message to publish with a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Extra {
    /// Its topic.
    pub topic: String,
    /// Its payload (JSON).
    pub payload: Vec<u8>,
    /// Whether the broker keeps it for later subscribers.
    pub retain: bool,
}

/// The topic of incident snapshots.
pub const INCIDENT_TOPIC: &str = "edgewatch/{device_id}/incidents";

/// The topic of the agent's inventory (retained).
pub const INFO_TOPIC: &str = "edgewatch/{device_id}/info";

/// The retained inventory message of the newest `edgewatch_agent_info` point in `points`.
pub fn info(device_id: &str, points: &[Point]) -> Option<Extra> {
    let p = points
        .iter()
        .filter(|p| p.series.measurement == crate::collect::inventory::MEASUREMENT)
        .max_by_key(|p| p.ts)?;
    let (tags, fields) = super::encode::json_maps(p);
    let doc = serde_json::json!({
        "device_id": device_id,
        "ts": crate::alert::notify::payload::rfc3339(p.ts),
        "tags": tags,
        "fields": fields,
    });
    Some(Extra {
        topic: INFO_TOPIC.replace("{device_id}", device_id),
        payload: serde_json::to_vec(&doc).unwrap_or_default(),
        retain: true,
    })
}

/// The ids of the incidents that `points` open (`edgewatch_incident` points with
/// `state = "open"`), in order, each once.
pub fn opened_incidents(points: &[Point]) -> Vec<i64> {
    let mut ids = Vec::new();
    for p in points
        .iter()
        .filter(|p| p.series.measurement == MEASUREMENT)
    {
        let field = |k: &str| p.fields.iter().find(|f| &*f.0 == k).map(|f| &f.1);
        let open = matches!(field("state"), Some(Value::Str(s)) if s == "open");
        if let (true, Some(Value::I64(id))) = (open, field("incident_id")) {
            if !ids.contains(id) {
                ids.push(*id);
            }
        }
    }
    ids
}

/// The messages beside a batch of `points`: each opened incident read through `incident`
/// (an incident no longer stored, pruned or never there, is skipped with a log line).
pub fn extras(
    device_id: &str,
    points: &[Point],
    mut incident: impl FnMut(i64) -> Result<Option<IncidentRow>, StoreError>,
) -> Result<Vec<Extra>, StoreError> {
    let mut out = Vec::new();
    for id in opened_incidents(points) {
        match incident(id)? {
            Some(row) => {
                let mut doc = crate::alert::incident::view::to_json(&row);
                doc["device_id"] = device_id.into();
                out.push(Extra {
                    topic: INCIDENT_TOPIC.replace("{device_id}", device_id),
                    payload: serde_json::to_vec(&doc).unwrap_or_default(),
                    retain: false,
                });
            }
            None => tracing::warn!(
                incident = id,
                "an incident point names an incident the store no longer holds; its snapshot is not published"
            ),
        }
    }
    out.extend(info(device_id, points));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn point(measurement: &str, state: &str, id: i64) -> Point {
        Point {
            series: Arc::new(super::super::encode::series(
                &format!("{measurement},rule=R"),
                &[],
            )),
            ts: 1,
            fields: vec![
                (Arc::from("state"), Value::Str(state.into())),
                (Arc::from("incident_id"), Value::I64(id)),
            ],
        }
    }

    fn row(id: i64) -> IncidentRow {
        IncidentRow {
            id,
            rule: "R".into(),
            labels: Default::default(),
            value: Some(2.0),
            threshold: Some(1.0),
            active_since_ns: 1,
            fired_ns: 2,
            resolved_ns: None,
            top_finding: Some("x".into()),
            snapshot: Some("{\"findings\":[{\"message\":\"x\"}]}".into()),
        }
    }

    #[test]
    fn each_opened_incident_goes_once_with_its_snapshot() {
        let pts = [
            point(MEASUREMENT, "open", 3),
            point(MEASUREMENT, "resolved", 2),
            point("other", "open", 4),
            point(MEASUREMENT, "open", 3),
            point(MEASUREMENT, "open", 5),
        ];
        assert_eq!(opened_incidents(&pts), [3, 5]);
        let out = extras("jet-1", &pts, |id| Ok((id == 3).then(|| row(3)))).unwrap();
        assert_eq!(out.len(), 1, "5 is not stored: skipped");
        assert_eq!(out[0].topic, "edgewatch/jet-1/incidents");
        assert!(!out[0].retain);
        let v: serde_json::Value = serde_json::from_slice(&out[0].payload).unwrap();
        assert_eq!(v["id"], 3);
        assert_eq!(v["device_id"], "jet-1");
        assert_eq!(v["snapshot"]["findings"][0]["message"], "x");
    }

    #[test]
    fn the_newest_inventory_point_goes_retained() {
        let info_point = |ts: i64, v: &str| Point {
            series: Arc::new(super::super::encode::series(
                &format!("edgewatch_agent_info,version={v}"),
                &[("device_id".to_string(), "jet-1".to_string())],
            )),
            ts,
            fields: vec![(Arc::from("backlog_points"), Value::I64(7))],
        };
        let pts = [
            info_point(2_000_000_000, "2"),
            info_point(1_000_000_000, "1"),
        ];
        let out = extras("jet-1", &pts, |_| Ok(None)).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].topic, "edgewatch/jet-1/info");
        assert!(out[0].retain);
        let v: serde_json::Value = serde_json::from_slice(&out[0].payload).unwrap();
        assert_eq!(v["tags"]["version"], "2");
        assert_eq!(v["tags"]["device_id"], "jet-1");
        assert_eq!(v["fields"]["backlog_points"], 7);
        assert_eq!(v["ts"], "1970-01-01T00:00:02Z");
        assert!(info("jet-1", &[point(MEASUREMENT, "open", 1)]).is_none());
    }

    #[test]
    fn a_store_error_fails_the_batch() {
        let pts = [point(MEASUREMENT, "open", 3)];
        let e = extras("d", &pts, |_| {
            Err(StoreError::Sqlite {
                path: "x".into(),
                source: rusqlite::Error::InvalidQuery,
            })
        });
        assert!(e.is_err());
    }
}
