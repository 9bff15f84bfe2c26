//! What travels with an alert beyond the device: the incident's explanation as notification
//! annotations (`findings`: the top three ranked findings, one per line; `split`: the
//! wall-vs-GPU sentence; `incident`: the link, under `[alerts] external_url` when set) and
//! the `edgewatch_incident` point each incident's opening and closing becomes (stored and
//! forwarded like any point, so the fleet's tools can draw it). Pure: it reads a snapshot
//! (typed, or its stored JSON text) and builds values; it never reads the store, never
//! submits a point and never sends anything.

use std::collections::BTreeMap;

use super::snapshot::Snapshot;
use crate::alert::event::{incident_path, AlertEvent};
use crate::model::{series_key, Line, Value};

/// Findings named in the `findings` annotation.
pub const TOP_FINDINGS: usize = 3;

/// The measurement of incident points.
pub const MEASUREMENT: &str = "edgewatch_incident";

/// The `findings` annotation of a snapshot without a ranked finding.
pub const NO_FINDING: &str =
    "no finding: nothing the six-step routine reads moved from its baseline";

/// An incident's explanation, as notifications and incident points carry it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Explanation {
    /// The top [`TOP_FINDINGS`] findings' sentences, likely cause first.
    pub findings: Vec<String>,
    /// The first finding's score.
    pub top_score: Option<f64>,
    /// The wall-vs-GPU sentence, when `inference` data exists.
    pub split: Option<String>,
}

impl Explanation {
    /// The explanation of a snapshot just taken.
    pub fn of(s: &Snapshot) -> Explanation {
        Explanation {
            findings: s
                .findings
                .iter()
                .take(TOP_FINDINGS)
                .map(|f| f.message.clone())
                .collect(),
            top_score: s.findings.first().map(|f| f.score),
            split: s.split.as_ref().map(|s| s.message.clone()),
        }
    }

    /// The explanation of a stored snapshot (its JSON text); text that does not read gives
    /// an empty one.
    pub fn from_json(text: &str) -> Explanation {
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        let findings = v["findings"].as_array().cloned().unwrap_or_default();
        Explanation {
            findings: findings
                .iter()
                .filter_map(|f| f["message"].as_str().map(str::to_string))
                .take(TOP_FINDINGS)
                .collect(),
            top_score: findings.first().and_then(|f| f["score"].as_f64()),
            split: v["split"]["message"].as_str().map(str::to_string),
        }
    }

    /// Sets the `findings` and `split` annotations of `ev` (`split` only when known).
    pub fn annotate(&self, ev: &mut AlertEvent) {
        let findings = if self.findings.is_empty() {
            NO_FINDING.to_string()
        } else {
            self.findings.join("\n")
        };
        ev.annotations.insert("findings".into(), findings);
        if let Some(s) = &self.split {
            ev.annotations.insert("split".into(), s.clone());
        }
    }
}

/// The base of incident links: `external_url` with `{device_id}` filled in (without a
/// trailing `/`), or `local` (the agent's own address) when `external_url` is empty.
pub fn link_base(external_url: &str, device_id: &str, local: &str) -> String {
    if external_url.is_empty() {
        return local.to_string();
    }
    external_url
        .replace("{device_id}", device_id)
        .trim_end_matches('/')
        .to_string()
}

/// An incident's link under `base` (see [`link_base`]).
pub fn link(base: &str, id: i64) -> String {
    format!("{base}{}", incident_path(id))
}

/// Whether an incident point says it opened or resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointState {
    /// The alert fired and the incident was opened.
    Open,
    /// The alert resolved (or ended while the agent was down) and the incident was closed.
    Resolved,
}

impl PointState {
    /// The `state` field.
    pub fn as_str(self) -> &'static str {
        match self {
            PointState::Open => "open",
            PointState::Resolved => "resolved",
        }
    }
}

/// One incident's opening or closing as data.
#[derive(Debug, Clone, PartialEq)]
pub struct IncidentPoint<'a> {
    /// The incident's id.
    pub id: i64,
    /// The rule's name (tag `rule`).
    pub rule: &'a str,
    /// The alert's labels (tags; `alertname` is left out: it is `rule`). A label named
    /// `rule` is left out too: the tag is the rule's name.
    pub labels: &'a BTreeMap<String, String>,
    /// Open or resolved (field `state`).
    pub state: PointState,
    /// The value that fired, or resolved it.
    pub value: Option<f64>,
    /// The rule's threshold.
    pub threshold: Option<f64>,
    /// The explanation (fields `top_finding`, `top_score`).
    pub explanation: &'a Explanation,
    /// When it opened or closed, ns.
    pub ts_ns: i64,
}

impl IncidentPoint<'_> {
    /// The `edgewatch_incident` point: tags `rule` and the labels; fields `state`,
    /// `incident_id`, and `value`, `threshold`, `top_finding`, `top_score` where known (a
    /// non-finite number is left out).
    pub fn line(&self) -> Line {
        let mut tags: Vec<(&str, &str)> = vec![("rule", self.rule)];
        tags.extend(
            self.labels
                .iter()
                .filter(|(k, v)| k.as_str() != "alertname" && k.as_str() != "rule" && !v.is_empty())
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        let mut fields: Vec<(String, Value)> = vec![
            ("state".into(), Value::Str(self.state.as_str().into())),
            ("incident_id".into(), Value::I64(self.id)),
        ];
        let num = |name: &str, v: Option<f64>| {
            v.filter(|x| x.is_finite())
                .map(|x| (name.to_string(), Value::F64(x)))
        };
        fields.extend(num("value", self.value));
        fields.extend(num("threshold", self.threshold));
        if let Some(f) = self.explanation.findings.first() {
            fields.push(("top_finding".into(), Value::Str(f.clone())));
        }
        fields.extend(num("top_score", self.explanation.top_score));
        Line {
            key: series_key(MEASUREMENT, &tags),
            fields,
            ts: self.ts_ns,
            line_no: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::event::EventStatus;

    const SNAP: &str = r#"{"findings":[
        {"message":"a","score":3.5},{"message":"b","score":2},{"message":"c","score":1},
        {"message":"d","score":0.9}],
        "split":{"message":"wall_ms mean +90.0 ms; no gpu_ms to split it"}}"#;

    fn event() -> AlertEvent {
        AlertEvent {
            rule: "R".into(),
            status: EventStatus::Firing,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            starts_at_ns: 1,
            ends_at_ns: None,
            value: None,
            incident_id: None,
            fingerprint: "f".into(),
        }
    }

    #[test]
    fn the_top_three_findings_one_per_line_and_the_split() {
        let x = Explanation::from_json(SNAP);
        assert_eq!(x.findings, ["a", "b", "c"]);
        assert_eq!(x.top_score, Some(3.5));
        let mut ev = event();
        x.annotate(&mut ev);
        assert_eq!(ev.annotations["findings"], "a\nb\nc");
        assert_eq!(
            ev.annotations["split"],
            "wall_ms mean +90.0 ms; no gpu_ms to split it"
        );
    }

    #[test]
    fn no_findings_say_so_and_unreadable_text_explains_nothing() {
        let x = Explanation::from_json("{\"findings\":[]}");
        let mut ev = event();
        x.annotate(&mut ev);
        assert_eq!(ev.annotations["findings"], NO_FINDING);
        assert!(!ev.annotations.contains_key("split"));
        assert_eq!(Explanation::from_json("not json"), Explanation::default());
    }

    #[test]
    fn links_use_the_external_url_with_the_device_or_the_local_address() {
        let ext = "https://fleet.example/devices/{device_id}/ui/";
        assert_eq!(
            link(&link_base(ext, "jet-7", "http://127.0.0.1:9400"), 4),
            "https://fleet.example/devices/jet-7/ui/#/incidents/4"
        );
        assert_eq!(
            link(&link_base("", "jet-7", "http://127.0.0.1:9400"), 4),
            "http://127.0.0.1:9400/#/incidents/4"
        );
    }

    #[test]
    fn incident_points_carry_rule_labels_state_and_the_top_finding() {
        let labels = BTreeMap::from([
            ("alertname".to_string(), "R".to_string()),
            ("model".to_string(), "a b".to_string()),
            ("severity".to_string(), "critical".to_string()),
        ]);
        let x = Explanation::from_json(SNAP);
        let p = IncidentPoint {
            id: 9,
            rule: "R",
            labels: &labels,
            state: PointState::Open,
            value: Some(100.0),
            threshold: Some(50.0),
            explanation: &x,
            ts_ns: 5,
        };
        let l = p.line();
        assert_eq!(
            l.key,
            "edgewatch_incident,model=a\\ b,rule=R,severity=critical"
        );
        assert_eq!(l.ts, 5);
        let f: BTreeMap<_, _> = l.fields.iter().cloned().collect();
        assert_eq!(f["state"], Value::Str("open".into()));
        assert_eq!(f["incident_id"], Value::I64(9));
        assert_eq!(f["value"], Value::F64(100.0));
        assert_eq!(f["threshold"], Value::F64(50.0));
        assert_eq!(f["top_finding"], Value::Str("a".into()));
        assert_eq!(f["top_score"], Value::F64(3.5));
        let none = Explanation::default();
        let l = IncidentPoint {
            state: PointState::Resolved,
            value: Some(f64::NAN),
            explanation: &none,
            ..p
        }
        .line();
        let f: BTreeMap<_, _> = l.fields.iter().cloned().collect();
        assert_eq!(f["state"], Value::Str("resolved".into()));
        assert!(!f.contains_key("value") && !f.contains_key("top_finding"));
    }
}
