//! The alert evaluator's rows: `alert_instances` (each pending or firing instance, so a
//! restart resumes it with its original start) and `alert_history` (every transition with
//! its value). One evaluation's changes are written in one `BEGIN IMMEDIATE` transaction on
//! the evaluator's own connection, together with the outbox entries their notifications
//! need ([`super::outbox::enqueue`]) and the incidents they open or resolve
//! ([`super::incidents`]), so a transition is never recorded without its notification, and
//! a firing whose commit fails leaves no incident behind (the retry opens the only one).
//! Never decides a state: `alert::eval` does.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{params, Connection, TransactionBehavior};
use serde::Serialize;

use super::open::Ctx;
use super::StoreError;
use crate::alert::eval::{Instance, State, Transition};
use crate::alert::event::AlertEvent;

/// One stored instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// Rule name.
    pub rule: String,
    /// Fingerprint (rule and group labels).
    pub fingerprint: String,
    /// Group labels.
    pub labels: BTreeMap<String, String>,
    /// Its state.
    pub instance: Instance,
}

/// One instance's change in an evaluation: its new state, the transition if any and the
/// notification to enqueue if any.
#[derive(Debug, Clone)]
pub struct Change {
    /// The instance after the evaluation.
    pub stored: Stored,
    /// The transition made.
    pub transition: Option<Transition>,
    /// The notification (firing, resolved).
    pub event: Option<AlertEvent>,
    /// The incident to open with a firing (its id is then set in the instance, its history
    /// row and its event).
    pub incident: Option<super::incidents::Draft>,
}

/// One row of the history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryRow {
    /// Row id (order of recording).
    pub id: i64,
    /// When, ns.
    pub ts_ns: i64,
    /// Rule name.
    pub rule: String,
    /// Fingerprint.
    pub fingerprint: String,
    /// Group labels.
    pub labels: BTreeMap<String, String>,
    /// `pending`, `firing`, `resolved` or `cancelled`.
    pub transition: String,
    /// The state after it.
    pub state: String,
    /// The value that caused it.
    pub value: Option<f64>,
    /// The incident, for a firing.
    pub incident_id: Option<i64>,
}

fn labels_json(labels: &BTreeMap<String, String>) -> String {
    serde_json::to_string(labels).unwrap_or_else(|_| "{}".into())
}

fn labels_of(text: &str) -> BTreeMap<String, String> {
    serde_json::from_str(text).unwrap_or_default()
}

/// Every stored (pending or firing) instance.
pub fn load(conn: &Connection, path: &Path) -> Result<Vec<Stored>, StoreError> {
    let mut st = conn
        .prepare_cached(
            "SELECT rule, fingerprint, labels, state, active_since_ns, fired_ns, last_true_ns, \
             value, incident_id FROM alert_instances ORDER BY rule, fingerprint",
        )
        .ctx(path)?;
    let rows = st
        .query_map([], |r| {
            let state: String = r.get(3)?;
            Ok(Stored {
                rule: r.get(0)?,
                fingerprint: r.get(1)?,
                labels: labels_of(&r.get::<_, String>(2)?),
                instance: Instance {
                    state: State::parse(&state).unwrap_or(State::Inactive),
                    active_since_ns: r.get(4)?,
                    fired_ns: r.get(5)?,
                    last_true_ns: r.get(6)?,
                    value: r.get(7)?,
                    incident_id: r.get(8)?,
                },
            })
        })
        .ctx(path)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().ctx(path)
}

/// Records one evaluation's changes in one transaction: the incident a firing opens (its id
/// written into the change), instance rows (deleted once inactive), a history row per
/// transition, an outbox entry per notification, and the resolve of the incident of an
/// instance that resolved. On an error nothing is recorded (the ids written into `changes`
/// then name no row).
pub fn record(
    conn: &mut Connection,
    path: &Path,
    changes: &mut [Change],
    now_ns: i64,
) -> Result<(), StoreError> {
    if changes.is_empty() {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(path)?;
    for c in changes.iter_mut() {
        if let Some(d) = &c.incident {
            let i = &c.stored.instance;
            let id = super::incidents::insert(
                &tx,
                path,
                &super::incidents::NewIncident {
                    rule: &c.stored.rule,
                    labels: &c.stored.labels,
                    value: i.value,
                    threshold: d.threshold,
                    active_since_ns: i.active_since_ns.or(i.fired_ns).unwrap_or(now_ns),
                    fired_ns: i.fired_ns.unwrap_or(now_ns),
                    top_finding: d.top_finding.as_deref(),
                    snapshot: &d.snapshot,
                },
            )?;
            c.stored.instance.incident_id = Some(id);
            if let Some(ev) = c.event.as_mut() {
                crate::alert::incident::link_event(ev, &d.link_base, id);
            }
        }
        if c.transition == Some(Transition::Resolved) {
            let id = c
                .stored
                .instance
                .incident_id
                .or(c.event.as_ref().and_then(|e| e.incident_id));
            if let Some(id) = id {
                super::incidents::resolve(&tx, path, id, now_ns)?;
            }
        }
        let s = &c.stored;
        let i = &s.instance;
        let labels = labels_json(&s.labels);
        if i.state == State::Inactive {
            tx.prepare_cached("DELETE FROM alert_instances WHERE rule = ?1 AND fingerprint = ?2")
                .ctx(path)?
                .execute(params![s.rule, s.fingerprint])
                .ctx(path)?;
        } else {
            tx.prepare_cached(
                "INSERT INTO alert_instances (rule, fingerprint, labels, state, active_since_ns, \
                 fired_ns, last_true_ns, value, incident_id, updated_ns) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
                 ON CONFLICT (rule, fingerprint) DO UPDATE SET labels = excluded.labels, \
                 state = excluded.state, active_since_ns = excluded.active_since_ns, \
                 fired_ns = excluded.fired_ns, last_true_ns = excluded.last_true_ns, \
                 value = excluded.value, incident_id = excluded.incident_id, \
                 updated_ns = excluded.updated_ns",
            )
            .ctx(path)?
            .execute(params![
                s.rule,
                s.fingerprint,
                labels,
                i.state.as_str(),
                i.active_since_ns,
                i.fired_ns,
                i.last_true_ns,
                i.value,
                i.incident_id,
                now_ns
            ])
            .ctx(path)?;
        }
        if let Some(t) = c.transition {
            tx.prepare_cached(
                "INSERT INTO alert_history (ts_ns, rule, fingerprint, labels, transition, state, \
                 value, incident_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .ctx(path)?
            .execute(params![
                now_ns,
                s.rule,
                s.fingerprint,
                labels,
                t.as_str(),
                i.state.as_str(),
                i.value,
                i.incident_id
            ])
            .ctx(path)?;
        }
        if let Some(ev) = &c.event {
            super::outbox::enqueue(&tx, path, ev, now_ns)?;
        }
    }
    tx.commit().ctx(path)
}

/// Transitions recorded in `[from, to]` (ns), oldest first, at most `limit`.
pub fn history(
    conn: &Connection,
    path: &Path,
    from: i64,
    to: i64,
    limit: usize,
) -> Result<Vec<HistoryRow>, StoreError> {
    let mut st = conn
        .prepare_cached(
            "SELECT id, ts_ns, rule, fingerprint, labels, transition, state, value, incident_id \
             FROM alert_history WHERE ts_ns >= ?1 AND ts_ns <= ?2 ORDER BY id LIMIT ?3",
        )
        .ctx(path)?;
    let rows = st
        .query_map(
            params![from, to, i64::try_from(limit).unwrap_or(i64::MAX)],
            |r| {
                Ok(HistoryRow {
                    id: r.get(0)?,
                    ts_ns: r.get(1)?,
                    rule: r.get(2)?,
                    fingerprint: r.get(3)?,
                    labels: labels_of(&r.get::<_, String>(4)?),
                    transition: r.get(5)?,
                    state: r.get(6)?,
                    value: r.get(7)?,
                    incident_id: r.get(8)?,
                })
            },
        )
        .ctx(path)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().ctx(path)
}

/// Makes every later state commit on the store of `conn` fail (`true`: a trigger aborts
/// each history insert, as a full disk or an I/O error would in the middle of the
/// transaction) or succeed again (`false`). Tests only.
#[cfg(test)]
pub(crate) fn fail_commits(conn: &Connection, fail: bool) {
    let sql = if fail {
        "CREATE TRIGGER IF NOT EXISTS test_fail_history BEFORE INSERT ON alert_history \
         BEGIN SELECT RAISE(ABORT, 'injected failure'); END;"
    } else {
        "DROP TRIGGER IF EXISTS test_fail_history;"
    };
    conn.execute_batch(sql)
        .expect("toggle the injected failure");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::event::EventStatus;
    use crate::config::Synchronous;

    fn event(status: EventStatus) -> AlertEvent {
        AlertEvent {
            rule: "R".into(),
            status,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            starts_at_ns: 1,
            ends_at_ns: None,
            value: Some(2.0),
            incident_id: None,
            fingerprint: "fp".into(),
        }
    }

    #[test]
    fn instances_history_and_outbox_move_together() {
        let dir = tempfile::tempdir().unwrap();
        let (_w, _) =
            super::super::open(dir.path(), super::super::Mode::Writer(Synchronous::Full)).unwrap();
        let (mut conn, path) = super::super::open(dir.path(), super::super::Mode::Cursor).unwrap();
        let labels = BTreeMap::from([("model".to_string(), "a".to_string())]);
        let firing = Stored {
            rule: "R".into(),
            fingerprint: "fp".into(),
            labels: labels.clone(),
            instance: Instance {
                state: State::Firing,
                active_since_ns: Some(5),
                fired_ns: Some(6),
                last_true_ns: Some(6),
                value: Some(2.0),
                incident_id: Some(9),
            },
        };
        record(
            &mut conn,
            &path,
            &mut [Change {
                stored: firing.clone(),
                transition: Some(Transition::Firing),
                event: Some(event(EventStatus::Firing)),
                incident: None,
            }],
            6,
        )
        .unwrap();
        assert_eq!(load(&conn, &path).unwrap(), vec![firing.clone()]);
        let mut gone = firing.clone();
        gone.instance.state = State::Inactive;
        record(
            &mut conn,
            &path,
            &mut [Change {
                stored: gone,
                transition: Some(Transition::Resolved),
                event: Some(event(EventStatus::Resolved)),
                incident: None,
            }],
            8,
        )
        .unwrap();
        assert!(load(&conn, &path).unwrap().is_empty());
        let h = history(&conn, &path, 0, 100, 10).unwrap();
        let t: Vec<&str> = h.iter().map(|r| r.transition.as_str()).collect();
        assert_eq!(t, ["firing", "resolved"]);
        assert_eq!(h[0].labels, labels);
        assert_eq!(h[0].incident_id, Some(9));
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM alert_outbox", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
        assert!(history(&conn, &path, 7, 100, 10).unwrap().len() == 1);
    }
}
