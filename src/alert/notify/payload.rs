//! What each receiver is sent, built from outbox events: Alertmanager's v2 `PostableAlert`
//! array, Alertmanager's webhook message (version 4) and the MQTT JSON message, plus the
//! RFC 3339 times they carry (the times the agent saw, never the delivery time). Pure: no
//! I/O, no clock.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::alert::event::{AlertEvent, EventStatus};

/// `ns` (Unix) as RFC 3339 UTC with the sub-second digits it needs.
pub fn rfc3339(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns).to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// Alertmanager's zero time, which its webhook sends as `endsAt` of a firing alert.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// The event's `generatorURL`: the incident's URL when the annotation is absolute.
fn generator_url(ev: &AlertEvent) -> Option<String> {
    ev.annotations
        .get("incident")
        .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
        .cloned()
}

fn status_word(s: EventStatus) -> &'static str {
    match s {
        EventStatus::Firing => "firing",
        EventStatus::Resolved => "resolved",
    }
}

/// One alert of `POST /api/v2/alerts`.
#[derive(Debug, Serialize)]
struct PostableAlert<'a> {
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
    #[serde(rename = "startsAt")]
    starts_at: String,
    /// Set for a resolved event; absent while firing (Alertmanager then expires the alert
    /// after its `resolve_timeout` unless it is re-sent).
    #[serde(rename = "endsAt", skip_serializing_if = "Option::is_none")]
    ends_at: Option<String>,
    #[serde(rename = "generatorURL", skip_serializing_if = "Option::is_none")]
    generator_url: Option<String>,
}

/// The body of `POST {url}/api/v2/alerts` for `events` (a JSON array).
pub fn alertmanager(events: &[&AlertEvent]) -> Vec<u8> {
    let alerts: Vec<PostableAlert<'_>> = events
        .iter()
        .map(|ev| PostableAlert {
            labels: &ev.labels,
            annotations: &ev.annotations,
            starts_at: rfc3339(ev.starts_at_ns),
            ends_at: match ev.status {
                EventStatus::Resolved => Some(rfc3339(ev.ends_at_ns.unwrap_or(ev.starts_at_ns))),
                EventStatus::Firing => None,
            },
            generator_url: generator_url(ev),
        })
        .collect();
    serde_json::to_vec(&alerts).unwrap_or_else(|_| b"[]".to_vec())
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct WebhookAlert<'a> {
    status: &'static str,
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
    starts_at: String,
    ends_at: String,
    #[serde(rename = "generatorURL")]
    generator_url: String,
    fingerprint: &'a str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct WebhookMessage<'a> {
    version: &'static str,
    group_key: String,
    truncated_alerts: u32,
    status: &'static str,
    receiver: &'a str,
    group_labels: BTreeMap<String, String>,
    common_labels: &'a BTreeMap<String, String>,
    common_annotations: &'a BTreeMap<String, String>,
    #[serde(rename = "externalURL")]
    external_url: String,
    alerts: Vec<WebhookAlert<'a>>,
    /// Not in Alertmanager's shape: the outbox order, so a receiver can see duplicates and
    /// order.
    seq: i64,
}

/// The body of a webhook POST for one event, in Alertmanager's webhook payload shape
/// (version 4; one alert, its labels also the common labels; `receiver` is the notifier's
/// name), plus `seq`.
pub fn webhook(receiver: &str, seq: i64, ev: &AlertEvent) -> Vec<u8> {
    let status = status_word(ev.status);
    let msg = WebhookMessage {
        version: "4",
        group_key: format!("{{}}:{{fingerprint=\"{}\"}}", ev.fingerprint),
        truncated_alerts: 0,
        status,
        receiver,
        group_labels: BTreeMap::from([("alertname".to_string(), ev.rule.clone())]),
        common_labels: &ev.labels,
        common_annotations: &ev.annotations,
        external_url: String::new(),
        alerts: vec![WebhookAlert {
            status,
            labels: &ev.labels,
            annotations: &ev.annotations,
            starts_at: rfc3339(ev.starts_at_ns),
            ends_at: match (ev.status, ev.ends_at_ns) {
                (EventStatus::Resolved, Some(e)) => rfc3339(e),
                _ => ZERO_TIME.to_string(),
            },
            generator_url: generator_url(ev).unwrap_or_default(),
            fingerprint: &ev.fingerprint,
        }],
        seq,
    };
    serde_json::to_vec(&msg).unwrap_or_default()
}

#[derive(Debug, Serialize)]
struct MqttMessage<'a> {
    seq: i64,
    device_id: &'a str,
    status: &'static str,
    rule: &'a str,
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
    starts_at: String,
    ends_at: Option<String>,
    value: Option<f64>,
    incident_id: Option<i64>,
    fingerprint: &'a str,
}

/// One MQTT message for one event: `{seq, device_id, status, rule, labels, annotations,
/// starts_at, ends_at, value, incident_id, fingerprint}`, times in RFC 3339.
pub fn mqtt(device_id: &str, seq: i64, ev: &AlertEvent) -> Vec<u8> {
    let msg = MqttMessage {
        seq,
        device_id,
        status: status_word(ev.status),
        rule: &ev.rule,
        labels: &ev.labels,
        annotations: &ev.annotations,
        starts_at: rfc3339(ev.starts_at_ns),
        ends_at: ev.ends_at_ns.map(rfc3339),
        value: ev.value.filter(|v| v.is_finite()),
        incident_id: ev.incident_id,
        fingerprint: &ev.fingerprint,
    };
    serde_json::to_vec(&msg).unwrap_or_default()
}

/// The topic for `template` (`{device_id}` replaced).
pub fn topic(template: &str, device_id: &str) -> String {
    template.replace("{device_id}", device_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn ev(status: EventStatus) -> AlertEvent {
        AlertEvent {
            rule: "HighLatency".into(),
            status,
            labels: BTreeMap::from([
                ("alertname".into(), "HighLatency".into()),
                ("device_id".into(), "jet-1".into()),
            ]),
            annotations: BTreeMap::from([
                ("summary".into(), "p99 over 50 ms".into()),
                ("incident".into(), "http://jet-1:8086/#/incidents/7".into()),
            ]),
            starts_at_ns: 1_764_766_800_123_000_000,
            ends_at_ns: (status == EventStatus::Resolved).then_some(1_764_767_100_000_000_000),
            value: Some(f64::NAN),
            incident_id: Some(7),
            fingerprint: "HighLatency{}".into(),
        }
    }

    #[test]
    fn times_are_rfc3339_utc_as_the_agent_saw_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(1_764_766_800_123_000_000),
            "2025-12-03T13:00:00.123Z"
        );
        assert_eq!(rfc3339(1_500_000_001), "1970-01-01T00:00:01.500000001Z");
    }

    #[test]
    fn alertmanager_gets_ends_at_only_when_resolved() {
        let (f, r) = (ev(EventStatus::Firing), ev(EventStatus::Resolved));
        let v: Value = serde_json::from_slice(&alertmanager(&[&f, &r])).unwrap();
        assert_eq!(v[0]["labels"]["alertname"], "HighLatency");
        assert_eq!(v[0]["startsAt"], "2025-12-03T13:00:00.123Z");
        assert!(v[0].get("endsAt").is_none(), "{v}");
        assert_eq!(v[1]["endsAt"], "2025-12-03T13:05:00Z");
        assert_eq!(v[1]["generatorURL"], "http://jet-1:8086/#/incidents/7");
        let mut rel = f.clone();
        rel.annotations
            .insert("incident".into(), "/#/incidents/7".into());
        let v: Value = serde_json::from_slice(&alertmanager(&[&rel])).unwrap();
        assert!(
            v[0].get("generatorURL").is_none(),
            "relative URL left out: {v}"
        );
    }

    #[test]
    fn webhook_has_alertmanagers_shape() {
        let v: Value =
            serde_json::from_slice(&webhook("hook", 3, &ev(EventStatus::Firing))).unwrap();
        for k in [
            "version",
            "groupKey",
            "truncatedAlerts",
            "status",
            "receiver",
            "groupLabels",
            "commonLabels",
            "commonAnnotations",
            "externalURL",
            "alerts",
        ] {
            assert!(v.get(k).is_some(), "{k} missing: {v}");
        }
        assert_eq!(v["version"], "4");
        assert_eq!(v["receiver"], "hook");
        assert_eq!(v["seq"], 3);
        assert_eq!(v["alerts"][0]["status"], "firing");
        assert_eq!(v["alerts"][0]["endsAt"], "0001-01-01T00:00:00Z");
        assert_eq!(v["alerts"][0]["fingerprint"], "HighLatency{}");
        let v: Value =
            serde_json::from_slice(&webhook("hook", 4, &ev(EventStatus::Resolved))).unwrap();
        assert_eq!(v["status"], "resolved");
        assert_eq!(v["alerts"][0]["endsAt"], "2025-12-03T13:05:00Z");
    }

    #[test]
    fn mqtt_message_carries_seq_device_and_times() {
        let v: Value =
            serde_json::from_slice(&mqtt("jet-1", 9, &ev(EventStatus::Resolved))).unwrap();
        assert_eq!(v["seq"], 9);
        assert_eq!(v["device_id"], "jet-1");
        assert_eq!(v["status"], "resolved");
        assert_eq!(v["ends_at"], "2025-12-03T13:05:00Z");
        assert_eq!(v["value"], json!(null), "NaN is null");
        assert_eq!(topic("e/{device_id}/alerts", "jet-1"), "e/jet-1/alerts");
    }
}
