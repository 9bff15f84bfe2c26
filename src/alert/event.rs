//! The unit of alert delivery: one [`AlertEvent`] per state change of an alert instance
//! (firing, resolved), appended to the durable outbox by the evaluator in the transaction that
//! records the change, and sent by every notifier in outbox order. Also [`Firing`], what the
//! evaluator hands the incident snapshot. Pure data; no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Whether an event says an instance fires or has resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventStatus {
    /// The instance entered (or is still in) the firing state.
    Firing,
    /// The instance stopped firing; `ends_at_ns` is set.
    Resolved,
}

/// One notification about one alert instance, as stored in the outbox (JSON) and sent by
/// every notifier. Times are when the agent saw them, not when delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertEvent {
    /// The rule's name (`alertname`).
    pub rule: String,
    /// Firing or resolved.
    pub status: EventStatus,
    /// Every label the receiver sees: `alertname`, `severity`, `device_id`, the `[tags]`, the
    /// instance's group labels and the rule's `labels`.
    pub labels: BTreeMap<String, String>,
    /// `summary`, `value`, `incident` (URL of the incident on the device) where known.
    pub annotations: BTreeMap<String, String>,
    /// When the instance started firing (Unix ns).
    pub starts_at_ns: i64,
    /// When it resolved (Unix ns); `None` while firing.
    pub ends_at_ns: Option<i64>,
    /// The evaluated value at this change, if any.
    pub value: Option<f64>,
    /// The incident opened when the instance fired.
    pub incident_id: Option<i64>,
    /// Stable identity of the instance: the rule name and its group labels (the same for the
    /// firing and the resolved event of one instance, and across restarts).
    pub fingerprint: String,
}

/// What the evaluator hands the incident snapshot when an instance fires.
#[derive(Debug, Clone, PartialEq)]
pub struct Firing {
    /// The rule's name.
    pub rule: String,
    /// The instance's labels (group labels; for built-in rules the labels naming the cause).
    pub labels: BTreeMap<String, String>,
    /// The rule's measurement and field, when it watches one.
    pub measurement: Option<String>,
    /// See `measurement`.
    pub field: Option<String>,
    /// The rule's tag filter plus the instance's group labels: the series the rule watched.
    pub tags: BTreeMap<String, String>,
    /// The window the rule aggregates over, ns, when it has one (the incident's window
    /// falls back to it when the rule watches no latency).
    pub window_ns: Option<i64>,
    /// The value that fired.
    pub value: Option<f64>,
    /// The rule's threshold.
    pub threshold: Option<f64>,
    /// When the condition first held (pending start, Unix ns).
    pub active_since_ns: i64,
    /// When the instance fired (the evaluation time, Unix ns).
    pub fired_ns: i64,
}

/// Path of an incident's page in the web UI, relative to the agent's base URL.
pub fn incident_path(id: i64) -> String {
    format!("/#/incidents/{id}")
}
