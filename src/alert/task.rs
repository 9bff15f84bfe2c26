//! The evaluator task: every `[alerts] interval` it evaluates each rule
//! ([`super::observe`]), moves each instance through the state machine ([`super::eval`]),
//! opens an incident for an instance that fires ([`super::incident::open`], before its
//! notification is enqueued so the event can name it), and records the evaluation's changes,
//! their history and their notifications in one transaction ([`crate::store::alerts`]).
//! State is loaded from the store at start, so a firing instance survives a restart with its
//! original start and is neither fired again nor forgotten. The evaluation runs on the
//! blocking pool on its own connections (a reader, and a small read-write one for its rows);
//! it never writes points and never delivers a notification (the notifiers read the outbox).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use rusqlite::Connection;
use tokio_util::sync::CancellationToken;

use super::eval::{step, Condition, Instance, Observation, State, Transition};
use super::event::{incident_path, AlertEvent, EventStatus, Firing};
use super::observe::{observe, DropHistory, Inputs, Labels};
use super::rules::{fmt_value, Rule};

/// Most incidents opened in one evaluation (each takes a triage snapshot, ~0.3 s); instances
/// beyond it in the same cycle fire without one.
pub const MAX_INCIDENTS_PER_CYCLE: usize = 8;
use super::view::{rfc3339, AlertItem, AlertsStatus, AlertsView, RuleError};
use crate::rollup::Plan;
use crate::store::alerts::{Change, Stored};
use crate::store::{Reader, StoreError};

/// Everything the evaluator needs, fixed at start.
#[derive(Clone)]
pub struct Setup {
    /// The rules.
    pub rules: Vec<Rule>,
    /// `[alerts] interval`.
    pub interval: std::time::Duration,
    /// The data directory.
    pub data_dir: PathBuf,
    /// Tiers (the engine's source choice).
    pub plan: Arc<Plan>,
    /// What the non-series built-ins read.
    pub inputs: Inputs,
    /// `device_id` and the `[tags]`, on every notification.
    pub identity: Vec<(String, String)>,
    /// The agent's base URL (`http://` + `[http] listen`), for incident links.
    pub base_url: String,
}

/// A stable identity of an instance: FNV-1a (64 bit) of the rule name and its group labels,
/// in hex. Stable across versions and restarts (unlike `std`'s hasher).
pub fn fingerprint(rule: &str, labels: &Labels) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(rule.as_bytes());
    for (k, v) in labels {
        eat(&[0]);
        eat(k.as_bytes());
        eat(&[1]);
        eat(v.as_bytes());
    }
    format!("{h:016x}")
}

/// One remembered instance.
#[derive(Debug, Clone)]
struct Entry {
    rule: usize,
    labels: Labels,
    instance: Instance,
}

/// The evaluator's state between evaluations.
pub struct Evaluator {
    setup: Setup,
    /// By (rule name, fingerprint).
    entries: BTreeMap<(String, String), Entry>,
    drops: DropHistory,
    reader: Reader,
    conn: Connection,
    db: PathBuf,
    evaluations: u64,
    /// Failures logged per rule (the log is rate-limited by powers of two).
    failures: BTreeMap<String, u64>,
}

impl Evaluator {
    /// Opens its connections and loads the stored instances (of rules that still exist).
    pub fn open(setup: Setup, now: i64) -> Result<Evaluator, StoreError> {
        let reader = Reader::open(&setup.data_dir)?;
        let (conn, db) = crate::store::open(&setup.data_dir, crate::store::Mode::Cursor)?;
        let mut entries = BTreeMap::new();
        for s in crate::store::alerts::load(&conn, &db)? {
            match setup.rules.iter().position(|r| r.name == s.rule) {
                Some(rule) => {
                    entries.insert(
                        (s.rule, s.fingerprint),
                        Entry {
                            rule,
                            labels: s.labels,
                            instance: s.instance,
                        },
                    );
                }
                None => tracing::info!(
                    rule = %s.rule,
                    "a stored alert instance belongs to a rule no longer configured; ignored"
                ),
            }
        }
        Ok(Evaluator {
            setup,
            entries,
            drops: DropHistory::new(now),
            reader,
            conn,
            db,
            evaluations: 0,
            failures: BTreeMap::new(),
        })
    }

    /// The labels a receiver sees for an instance of `rule`.
    fn event_labels(&self, rule: &Rule, group: &Labels) -> BTreeMap<String, String> {
        let mut l: BTreeMap<String, String> = self.setup.identity.iter().cloned().collect();
        l.extend(group.iter().map(|(k, v)| (k.clone(), v.clone())));
        l.extend(rule.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        l.insert("severity".into(), rule.severity.clone());
        l.insert("alertname".into(), rule.name.clone());
        l
    }

    fn event(
        &self,
        rule: &Rule,
        group: &Labels,
        fp: &str,
        i: &Instance,
        status: EventStatus,
        now: i64,
    ) -> AlertEvent {
        let mut annotations = BTreeMap::new();
        annotations.insert("summary".into(), rule.render_summary(group, i.value));
        if let Some(v) = i.value {
            annotations.insert("value".into(), fmt_value(v));
        }
        if let Some(id) = i.incident_id {
            annotations.insert(
                "incident".into(),
                format!("{}{}", self.setup.base_url, incident_path(id)),
            );
        }
        AlertEvent {
            rule: rule.name.clone(),
            status,
            labels: self.event_labels(rule, group),
            annotations,
            starts_at_ns: i.fired_ns.or(i.active_since_ns).unwrap_or(now),
            ends_at_ns: (status == EventStatus::Resolved).then_some(now),
            value: i.value,
            incident_id: i.incident_id,
            fingerprint: fp.to_string(),
        }
    }

    /// One evaluation at `now`: every rule, every instance; returns what the readers see.
    /// At most [`MAX_INCIDENTS_PER_CYCLE`] instances that fire in it get an incident.
    pub fn evaluate(&mut self, now: i64) -> (Vec<AlertItem>, AlertsStatus) {
        let started = Instant::now();
        let mut rule_errors = Vec::new();
        let mut next: BTreeMap<(String, String), Entry> = BTreeMap::new();
        let mut changes: Vec<Change> = Vec::new();
        // Tag-set lookups shared by every rule of this cycle.
        let mut cycle = super::observe::Cycle::default();
        // A snapshot costs a few queries and a /proc sample (~0.3 s): a storm of instances
        // firing together (a new rule over a whole fleet of series) opens incidents for the
        // first few and fires the rest without one, rather than stalling the evaluation.
        let mut incident_budget = MAX_INCIDENTS_PER_CYCLE;
        let mut incidents_skipped = 0usize;
        for (ri, rule) in self.setup.rules.iter().enumerate() {
            let observed = match observe(
                &mut cycle,
                rule,
                &self.reader,
                &self.setup.plan,
                &self.setup.inputs,
                &mut self.drops,
                now,
            ) {
                Ok(o) => {
                    self.failures.remove(&rule.name);
                    o
                }
                Err(e) => {
                    let n = self.failures.entry(rule.name.clone()).or_default();
                    *n += 1;
                    if n.is_power_of_two() {
                        tracing::warn!(rule = %rule.name, error = %e, failures = *n, "alert rule evaluation failed");
                    }
                    rule_errors.push(RuleError {
                        rule: rule.name.clone(),
                        error: e.to_string(),
                    });
                    // Keep its instances as they are until it evaluates again.
                    for (k, e) in self.entries.iter().filter(|(_, e)| e.rule == ri) {
                        next.insert(k.clone(), e.clone());
                    }
                    continue;
                }
            };
            let cond = Condition {
                op: rule.op,
                threshold: rule.threshold,
                for_ns: rule.for_ns,
                keep_firing_for_ns: rule.keep_firing_for_ns,
                no_data: rule.no_data,
            };
            let mut seen: Vec<(Labels, Observation)> = observed
                .into_iter()
                .map(|(l, v)| (l, Observation::Value(v)))
                .collect();
            // Instances remembered but not seen this time: an empty window.
            for ((name, _), e) in &self.entries {
                if *name == rule.name && !seen.iter().any(|(l, _)| *l == e.labels) {
                    seen.push((e.labels.clone(), Observation::NoData));
                }
            }
            // No data at all under `no_data = "firing"`: the rule's own instance.
            if seen.is_empty() && rule.no_data == super::config::NoData::Firing {
                seen.push((Labels::new(), Observation::NoData));
            }
            for (labels, obs) in seen {
                let fp = fingerprint(&rule.name, &labels);
                let key = (rule.name.clone(), fp.clone());
                let prev = self
                    .entries
                    .get(&key)
                    .map(|e| e.instance.clone())
                    .unwrap_or_default();
                let (mut inst, t) = step(&prev, obs, &cond, now);
                let mut event = None;
                if t == Some(Transition::Firing) {
                    inst.incident_id = if incident_budget > 0 {
                        incident_budget -= 1;
                        self.open_incident(rule, &labels, &inst, now)
                    } else {
                        incidents_skipped += 1;
                        None
                    };
                    event = Some(self.event(rule, &labels, &fp, &inst, EventStatus::Firing, now));
                } else if t == Some(Transition::Resolved) {
                    let fired = prev_merged(&prev, &inst);
                    event =
                        Some(self.event(rule, &labels, &fp, &fired, EventStatus::Resolved, now));
                }
                // Rows change on a transition; a firing instance's row also follows the last
                // time its condition held when `keep_firing_for` needs that across a restart.
                // Nothing else is rewritten per evaluation (measured: upserting every active
                // row each cycle was most of a cycle with hundreds firing, benches/alerts.rs).
                let refresh = inst.state == State::Firing
                    && rule.keep_firing_for_ns > 0
                    && inst.last_true_ns != prev.last_true_ns;
                if t.is_some() || refresh {
                    changes.push(Change {
                        stored: Stored {
                            rule: rule.name.clone(),
                            fingerprint: fp.clone(),
                            labels: labels.clone(),
                            instance: inst.clone(),
                        },
                        transition: t,
                        event,
                    });
                }
                // Inactive instances are shown while they have data; dropped once they have
                // none.
                if inst.state != State::Inactive || matches!(obs, Observation::Value(_)) {
                    next.insert(
                        key,
                        Entry {
                            rule: ri,
                            labels,
                            instance: inst,
                        },
                    );
                }
            }
        }
        if incidents_skipped > 0 {
            tracing::warn!(
                skipped = incidents_skipped,
                opened = MAX_INCIDENTS_PER_CYCLE,
                "more instances fired in one evaluation than incidents are opened per cycle; the rest fire without an incident"
            );
        }
        let store_error = match crate::store::alerts::record(
            &mut self.conn,
            &self.db,
            &changes,
            now,
        ) {
            Ok(()) => {
                self.entries = next;
                // The incidents of instances that resolved (recorded above) are closed too; a
                // failure is logged and the alert's resolve goes on regardless.
                let resolved = changes
                    .iter()
                    .filter(|c| c.transition == Some(Transition::Resolved))
                    .filter_map(|c| c.event.as_ref()?.incident_id);
                for id in resolved {
                    if let Err(e) = super::incident::resolve(&self.setup.data_dir, id, now) {
                        tracing::warn!(incident = id, error = %e, "cannot mark the incident resolved");
                    }
                }
                None
            }
            Err(e) => {
                // The state stays as it was: the next evaluation makes the same transitions
                // again and records them then.
                tracing::warn!(error = %e, "cannot record alert state; retrying next evaluation");
                Some(e.to_string())
            }
        };
        self.evaluations += 1;
        let items = self.items();
        let status = AlertsStatus {
            rules: self.setup.rules.len() as u64,
            firing: items.iter().filter(|i| i.state == "firing").count() as u64,
            pending: items.iter().filter(|i| i.state == "pending").count() as u64,
            evaluations: self.evaluations,
            last_evaluation_ns: Some(now),
            last_duration_ms: Some(started.elapsed().as_secs_f64() * 1000.0),
            rule_errors,
            store_error,
            active: items
                .iter()
                .filter(|i| i.state != "inactive")
                .cloned()
                .collect(),
        };
        (items, status)
    }

    /// Opens the incident of an instance that fires; a failure is logged and the alert goes
    /// on without one.
    fn open_incident(&self, rule: &Rule, labels: &Labels, i: &Instance, now: i64) -> Option<i64> {
        let (measurement, field) = rule.measurement_field();
        let mut tags = rule.tag_filter();
        tags.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        let firing = Firing {
            rule: rule.name.clone(),
            labels: labels.clone(),
            measurement,
            field,
            tags,
            value: i.value,
            threshold: Some(rule.threshold),
            active_since_ns: i.active_since_ns.unwrap_or(now),
            fired_ns: now,
        };
        match super::incident::open(&self.setup.data_dir, &firing, now) {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(rule = %rule.name, error = %e, "cannot store the incident; the alert fires without one");
                None
            }
        }
    }

    /// What the readers see: every remembered instance, and one inactive line per rule that
    /// has none.
    fn items(&self) -> Vec<AlertItem> {
        let mut out = Vec::new();
        for (ri, rule) in self.setup.rules.iter().enumerate() {
            let mut any = false;
            for e in self.entries.values().filter(|e| e.rule == ri) {
                any = true;
                let mut labels = e.labels.clone();
                labels.extend(rule.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
                labels.insert("severity".into(), rule.severity.clone());
                out.push(AlertItem {
                    name: rule.name.clone(),
                    state: e.instance.state.as_str().into(),
                    labels,
                    value: e.instance.value,
                    active_since: (e.instance.state != State::Inactive)
                        .then_some(e.instance.active_since_ns)
                        .flatten()
                        .map(rfc3339),
                    incident_id: e.instance.incident_id,
                    builtin: rule.builtin,
                });
            }
            if !any {
                let mut labels = rule.labels.clone();
                labels.insert("severity".into(), rule.severity.clone());
                out.push(AlertItem {
                    name: rule.name.clone(),
                    state: "inactive".into(),
                    labels,
                    value: None,
                    active_since: None,
                    incident_id: None,
                    builtin: rule.builtin,
                });
            }
        }
        out
    }
}

/// The resolved event reports the instance as it fired (its start, its incident) with the
/// value that resolved it.
fn prev_merged(prev: &Instance, now: &Instance) -> Instance {
    Instance {
        value: now.value,
        ..prev.clone()
    }
}

/// Runs the evaluator until `stop` is cancelled.
pub async fn run(setup: Setup, view: Arc<AlertsView>, stop: CancellationToken) {
    let interval = setup.interval;
    let opened = tokio::task::spawn_blocking(move || Evaluator::open(setup, crate::now_ns())).await;
    let mut ev = match opened {
        Ok(Ok(ev)) => ev,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "alert evaluator cannot open the store; alerts are off");
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "alert evaluator failed to start; alerts are off");
            return;
        }
    };
    let mut ticker = crate::periodic::Ticker::new(interval);
    while ticker.next(&stop).await.is_some() {
        // The evaluation runs whole on the blocking pool; cancelling the wait for it would
        // not stop it, so it is awaited to the end (one evaluation is short).
        let done = tokio::task::spawn_blocking(move || {
            let out = ev.evaluate(crate::now_ns());
            (ev, out)
        })
        .await;
        match done {
            Ok((back, (items, status))) => {
                ev = back;
                view.set(items, status);
            }
            Err(e) => {
                tracing::error!(error = %e, "alert evaluation panicked; alerts are off");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_stable_and_tell_labels_apart() {
        let a = Labels::from([("model".to_string(), "a".to_string())]);
        let b = Labels::from([("model".to_string(), "b".to_string())]);
        assert_eq!(fingerprint("R", &a), fingerprint("R", &a.clone()));
        assert_ne!(fingerprint("R", &a), fingerprint("R", &b));
        assert_ne!(fingerprint("R", &a), fingerprint("S", &a));
        // Pinned: a change would orphan stored instances and re-fire them after an upgrade.
        assert_eq!(fingerprint("R", &Labels::new()), "af640f4c86024335");
    }
}
