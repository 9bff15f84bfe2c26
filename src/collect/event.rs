//! The device's events as points: every event the agent records (its own starts, restarts
//! and state changes, the Jetson's power-mode changes, kernel messages, watched processes)
//! is one point of the measurement `edgewatch_event`, built here so each has the same shape:
//! tags `kind` (what happened: `start`, `power_mode`, `xid`, `oom_kill`, ...), `severity`
//! (`info`, `warning`, `critical`) and `source` (`agent`, `jetson`, `kernel`, `process`,
//! `python`, ...), plus any tag of its own (a start's `version`); fields `message` (one
//! human sentence) and one field per detail (an Xid's `code`, `pid`, `name`). Points stored
//! before this shape carried the kind in a tag named `event`; readers accept both
//! ([`KIND_TAGS`]). Pure: it builds lines and never submits them.

use crate::model::{series_key, Line, Value};

/// The measurement of every event.
pub const MEASUREMENT: &str = "edgewatch_event";
/// The tags that name an event's kind, newest first (`event` before 0.2).
pub const KIND_TAGS: [&str; 2] = ["kind", "event"];

/// How bad an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Worth knowing (a start, a mode change).
    Info,
    /// Likely to explain degraded latency (a throttle, a restart).
    Warning,
    /// Something broke (a fatal Xid, a GPU off the bus, an OOM kill).
    Critical,
}

impl Severity {
    /// `info`, `warning` or `critical`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// One event, built with [`Event::new`] and the `tag`/`field` builders, written with
/// [`Event::line`].
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// What happened.
    pub kind: String,
    /// How bad.
    pub severity: Severity,
    /// Who saw it.
    pub source: String,
    /// Extra tags (keep them few: each value is a series).
    pub tags: Vec<(String, String)>,
    /// The sentence a person reads.
    pub message: String,
    /// The details, one field each.
    pub fields: Vec<(String, Value)>,
}

impl Event {
    /// An event of `kind` from `source` with its `message`.
    pub fn new(
        kind: impl Into<String>,
        severity: Severity,
        source: impl Into<String>,
        message: impl Into<String>,
    ) -> Event {
        Event {
            kind: kind.into(),
            severity,
            source: source.into(),
            tags: Vec::new(),
            message: message.into(),
            fields: Vec::new(),
        }
    }

    /// Adds a tag.
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Event {
        self.tags.push((key.into(), value.into()));
        self
    }

    /// Adds a detail field.
    pub fn field(mut self, key: impl Into<String>, value: Value) -> Event {
        self.fields.push((key.into(), value));
        self
    }

    /// The point at `ts` (ns).
    pub fn line(&self, ts: i64) -> Line {
        let mut tags: Vec<(&str, &str)> = vec![
            ("kind", self.kind.as_str()),
            ("severity", self.severity.as_str()),
            ("source", self.source.as_str()),
        ];
        tags.extend(self.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut fields = vec![("message".to_string(), Value::Str(self.message.clone()))];
        fields.extend(self.fields.iter().cloned());
        Line {
            key: series_key(MEASUREMENT, &tags),
            fields,
            ts,
            line_no: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_one_point_with_kind_severity_source_and_its_details() {
        let l = Event::new("xid", Severity::Critical, "kernel", "GPU Xid 79")
            .field("code", Value::I64(79))
            .field("name", Value::Str("python3".into()))
            .line(42);
        assert_eq!(
            l.key,
            "edgewatch_event,kind=xid,severity=critical,source=kernel"
        );
        assert_eq!(l.ts, 42);
        assert_eq!(
            l.fields[0],
            ("message".into(), Value::Str("GPU Xid 79".into()))
        );
        assert_eq!(l.fields[1], ("code".into(), Value::I64(79)));
        assert_eq!(Severity::Warning.as_str(), "warning");
        assert!(Severity::Critical > Severity::Warning);
    }
}
