//! The read side of the evaluator, in memory: the instances of the last evaluation (what
//! `GET /api/v1/alerts`, `edgewatch alerts` and the `ALERTS` series of `/metrics` show) and
//! the evaluator's own health (the `alerts` object of `/api/v1/status`). The evaluator
//! replaces the whole snapshot after each evaluation; readers take a copy. Never touches the
//! store.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// One alert instance as answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertItem {
    /// The rule's name.
    pub name: String,
    /// `inactive`, `pending` or `firing`.
    pub state: String,
    /// The instance's labels: its group labels, the rule's labels and `severity`.
    pub labels: BTreeMap<String, String>,
    /// The last evaluated value (`null`: no data).
    pub value: Option<f64>,
    /// When the condition started to hold, RFC 3339 (`null` while inactive).
    pub active_since: Option<String>,
    /// The incident opened when it fired.
    pub incident_id: Option<i64>,
    /// Whether the rule is built in.
    pub builtin: bool,
}

/// A rule whose last evaluation failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleError {
    /// The rule.
    pub rule: String,
    /// What failed.
    pub error: String,
}

/// The `alerts` object of `/api/v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertsStatus {
    /// Rules evaluated (built-ins and the user's).
    pub rules: u64,
    /// Instances firing.
    pub firing: u64,
    /// Instances pending.
    pub pending: u64,
    /// Evaluations done since start.
    pub evaluations: u64,
    /// When the last evaluation ran, ns (`null`: not yet).
    pub last_evaluation_ns: Option<i64>,
    /// How long it took, ms.
    pub last_duration_ms: Option<f64>,
    /// Incidents it opened (each with a triage snapshot).
    #[serde(default)]
    pub last_incidents: u64,
    /// Of its duration, the time their snapshots took, ms.
    #[serde(default)]
    pub last_incidents_ms: f64,
    /// Rules whose last evaluation failed.
    pub rule_errors: Vec<RuleError>,
    /// The last failure to record state in the store, if the last evaluation had one.
    pub store_error: Option<String>,
    /// The pending and firing instances (`/metrics` exports them as `ALERTS`).
    #[serde(default)]
    pub active: Vec<AlertItem>,
}

/// The snapshot shared between the evaluator and the readers.
#[derive(Debug, Default)]
pub struct AlertsView(Mutex<(Vec<AlertItem>, AlertsStatus)>);

impl AlertsView {
    /// Replaces the snapshot.
    pub fn set(&self, alerts: Vec<AlertItem>, status: AlertsStatus) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = (alerts, status);
    }

    /// The instances of the last evaluation.
    pub fn alerts(&self) -> Vec<AlertItem> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// The evaluator's health.
    pub fn status(&self) -> AlertsStatus {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
    }
}

/// Nanoseconds since the epoch as RFC 3339 (UTC, to the millisecond).
pub fn rfc3339(ns: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}
