//! The `incidents` rows: one per alert instance that fired, with its triage snapshot (JSON
//! text, made and read by `alert::incident`). The evaluator inserts and resolves them inside
//! the transaction that records the alert state (`store::alerts::record`), so one firing has
//! one incident whatever fails in between; [`close_unreferenced`] closes, at the evaluator's
//! start, those no firing instance names any more (left by a crash of an older version, or a
//! rule removed while the agent was down). Listed by fire time and read by id on any
//! connection. This file never builds or interprets a snapshot: it stores and returns its
//! text.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use super::{Ctx, StoreError};

/// An incident to store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewIncident<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// The instance's labels.
    pub labels: &'a BTreeMap<String, String>,
    /// The value that fired.
    pub value: Option<f64>,
    /// The rule's threshold.
    pub threshold: Option<f64>,
    /// When the condition first held, ns.
    pub active_since_ns: i64,
    /// When it fired, ns.
    pub fired_ns: i64,
    /// The first finding's sentence.
    pub top_finding: Option<&'a str>,
    /// The snapshot, JSON.
    pub snapshot: &'a str,
}

/// What an incident's row holds beyond the alert instance it belongs to (rule, labels,
/// value and times come from the instance when the row is inserted with its state).
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// The rule's threshold.
    pub threshold: Option<f64>,
    /// The first finding's sentence.
    pub top_finding: Option<String>,
    /// The snapshot, JSON.
    pub snapshot: String,
    /// The agent's base URL: the firing event's `incident` annotation is this plus the
    /// incident's path.
    pub link_base: String,
    /// The top findings and the split, for the notification and the incident point.
    pub explanation: crate::alert::incident::explain::Explanation,
}

/// A stored incident. `snapshot` is `None` in listings.
#[derive(Debug, Clone, PartialEq)]
pub struct IncidentRow {
    /// Its id.
    pub id: i64,
    /// The rule's name.
    pub rule: String,
    /// The instance's labels.
    pub labels: BTreeMap<String, String>,
    /// The value that fired.
    pub value: Option<f64>,
    /// The rule's threshold.
    pub threshold: Option<f64>,
    /// When the condition first held, ns.
    pub active_since_ns: i64,
    /// When it fired, ns.
    pub fired_ns: i64,
    /// When it resolved, ns, if known.
    pub resolved_ns: Option<i64>,
    /// The first finding's sentence.
    pub top_finding: Option<String>,
    /// The snapshot, JSON text (only from [`get`]).
    pub snapshot: Option<String>,
}

fn json_err(path: &Path, e: serde_json::Error) -> StoreError {
    StoreError::Sqlite {
        path: path.to_path_buf(),
        source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
    }
}

/// Stores `inc`; returns its id.
pub fn insert(conn: &Connection, path: &Path, inc: &NewIncident<'_>) -> Result<i64, StoreError> {
    let labels = serde_json::to_string(inc.labels).map_err(|e| json_err(path, e))?;
    conn.execute(
        "INSERT INTO incidents (rule, labels, value, threshold, active_since_ns, fired_ns, \
         top_finding, snapshot) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            inc.rule,
            labels,
            inc.value,
            inc.threshold,
            inc.active_since_ns,
            inc.fired_ns,
            inc.top_finding,
            inc.snapshot
        ],
    )
    .ctx(path)?;
    Ok(conn.last_insert_rowid())
}

/// Records that incident `id` resolved at `at_ns` (the first report wins); false when no
/// such incident is open.
pub fn resolve(conn: &Connection, path: &Path, id: i64, at_ns: i64) -> Result<bool, StoreError> {
    let n = conn
        .execute(
            "UPDATE incidents SET resolved_ns = ?2 WHERE id = ?1 AND resolved_ns IS NULL",
            params![id, at_ns],
        )
        .ctx(path)?;
    Ok(n == 1)
}

/// Marks resolved at `at_ns` every open incident whose id is not in `keep` (the incidents of
/// the instances still firing); returns their ids. For the evaluator's start: an incident
/// no firing instance names belongs to an alert that ended while the agent was down (or
/// was left by a state commit that never happened).
pub fn close_unreferenced(
    conn: &mut Connection,
    path: &Path,
    keep: &[i64],
    at_ns: i64,
) -> Result<Vec<i64>, StoreError> {
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .ctx(path)?;
    let open: Vec<i64> = {
        let mut st = tx
            .prepare("SELECT id FROM incidents WHERE resolved_ns IS NULL ORDER BY id")
            .ctx(path)?;
        let rows = st.query_map([], |r| r.get(0)).ctx(path)?;
        rows.collect::<rusqlite::Result<_>>().ctx(path)?
    };
    let mut closed = Vec::new();
    for id in open.into_iter().filter(|id| !keep.contains(id)) {
        if resolve(&tx, path, id, at_ns)? {
            closed.push(id);
        }
    }
    tx.commit().ctx(path)?;
    Ok(closed)
}

fn row(r: &rusqlite::Row<'_>, with_snapshot: bool) -> rusqlite::Result<IncidentRow> {
    let labels: String = r.get(2)?;
    Ok(IncidentRow {
        id: r.get(0)?,
        rule: r.get(1)?,
        // Written by `insert` only; an unreadable object reads as no labels.
        labels: serde_json::from_str(&labels).unwrap_or_default(),
        value: r.get(3)?,
        threshold: r.get(4)?,
        active_since_ns: r.get(5)?,
        fired_ns: r.get(6)?,
        resolved_ns: r.get(7)?,
        top_finding: r.get(8)?,
        snapshot: if with_snapshot { r.get(9)? } else { None },
    })
}

const COLUMNS: &str = "id, rule, labels, value, threshold, active_since_ns, fired_ns, \
                       resolved_ns, top_finding";

/// Incidents fired in `[from, to]`, newest first, at most `limit`; the second value is true
/// when more matched.
pub fn list(
    conn: &Connection,
    path: &Path,
    from: i64,
    to: i64,
    limit: usize,
) -> Result<(Vec<IncidentRow>, bool), StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM incidents WHERE fired_ns BETWEEN ?1 AND ?2 \
             ORDER BY fired_ns DESC, id DESC LIMIT ?3"
        ))
        .ctx(path)?;
    let take = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
    let mut out: Vec<IncidentRow> = stmt
        .query_map(params![from, to, take], |r| row(r, false))
        .ctx(path)?
        .collect::<rusqlite::Result<_>>()
        .ctx(path)?;
    let more = out.len() > limit;
    out.truncate(limit);
    Ok((out, more))
}

/// Incident `id` with its snapshot, if it exists.
pub fn get(conn: &Connection, path: &Path, id: i64) -> Result<Option<IncidentRow>, StoreError> {
    conn.query_row(
        &format!("SELECT {COLUMNS}, snapshot FROM incidents WHERE id = ?1"),
        params![id],
        |r| row(r, true),
    )
    .optional()
    .ctx(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;
    use crate::store::{Mode, Writer};

    #[test]
    fn incidents_round_trip_list_newest_first_and_resolve_once() {
        let dir = tempfile::tempdir().unwrap();
        drop(Writer::open(dir.path(), 10, Synchronous::Normal).unwrap());
        let (conn, path) = crate::store::open(dir.path(), Mode::Cursor).unwrap();
        let labels: BTreeMap<String, String> = [("model".to_string(), "m".to_string())].into();
        let mut ids = Vec::new();
        for fired in [100, 300, 200] {
            ids.push(
                insert(
                    &conn,
                    &path,
                    &NewIncident {
                        rule: "R",
                        labels: &labels,
                        value: Some(2.5),
                        threshold: None,
                        active_since_ns: fired - 10,
                        fired_ns: fired,
                        top_finding: Some("x"),
                        snapshot: "{\"findings\":[]}",
                    },
                )
                .unwrap(),
            );
        }
        let (rows, more) = list(&conn, &path, 0, 1000, 2).unwrap();
        assert!(more);
        assert_eq!(
            rows.iter().map(|r| r.fired_ns).collect::<Vec<_>>(),
            [300, 200]
        );
        assert_eq!(rows[0].labels, labels);
        assert_eq!(rows[0].snapshot, None);
        let (rows, more) = list(&conn, &path, 150, 250, 10).unwrap();
        assert!(!more);
        assert_eq!(rows.len(), 1);
        let one = get(&conn, &path, ids[0]).unwrap().unwrap();
        assert_eq!(one.snapshot.as_deref(), Some("{\"findings\":[]}"));
        assert_eq!(one.value, Some(2.5));
        assert!(get(&conn, &path, 999).unwrap().is_none());
        assert!(resolve(&conn, &path, ids[0], 500).unwrap());
        assert!(!resolve(&conn, &path, ids[0], 600).unwrap());
        assert_eq!(
            get(&conn, &path, ids[0]).unwrap().unwrap().resolved_ns,
            Some(500)
        );
    }
}
