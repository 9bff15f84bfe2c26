//! The read side's JSON of an incident: a listing entry (`/api/v1/incidents`) or the whole
//! incident with its snapshot (`/api/v1/incidents/{id}`), from a stored row. Pure: it formats
//! times and parses the stored snapshot text; it never reads the store itself.

use serde_json::{json, Value};

use crate::alert::event::incident_path;
use crate::store::incidents::IncidentRow;

/// `ns` as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// One incident as JSON; with its snapshot when the row carries it.
pub fn to_json(r: &IncidentRow) -> Value {
    let mut v = json!({
        "id": r.id,
        "rule": r.rule,
        "labels": r.labels,
        "value": r.value,
        "threshold": r.threshold,
        "started": rfc3339(r.active_since_ns),
        "started_ns": r.active_since_ns,
        "fired": rfc3339(r.fired_ns),
        "fired_ns": r.fired_ns,
        "resolved": r.resolved_ns.map(rfc3339),
        "resolved_ns": r.resolved_ns,
        "top_finding": r.top_finding,
        "path": incident_path(r.id),
    });
    if let Some(text) = &r.snapshot {
        // Written by `open` from a typed snapshot; unreadable text is shown as null.
        v["snapshot"] = serde_json::from_str(text).unwrap_or(Value::Null);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_json_with_times_and_path() {
        let row = IncidentRow {
            id: 7,
            rule: "R".into(),
            labels: [("model".to_string(), "m".to_string())].into(),
            value: Some(1.5),
            threshold: Some(1.0),
            active_since_ns: 1_764_000_000_000_000_000,
            fired_ns: 1_764_000_060_500_000_000,
            resolved_ns: None,
            top_finding: Some("x".into()),
            snapshot: Some("{\"findings\":[]}".into()),
        };
        let v = to_json(&row);
        assert_eq!(v["fired"], "2025-11-24T16:01:00.500Z");
        assert_eq!(v["path"], "/#/incidents/7");
        assert_eq!(v["resolved"], Value::Null);
        assert_eq!(v["snapshot"]["findings"], json!([]));
        assert_eq!(v["labels"]["model"], "m");
    }
}
