//! The alert outbox's rows and each notifier's durable place in it: the evaluator appends
//! [`AlertEvent`]s inside its own transaction ([`enqueue`]); a notifier reads them in `seq`
//! order after its own position ([`Outbox::after`]) and moves the position only after its
//! receiver acknowledged ([`Outbox::ack`]) or refused the event as bad
//! ([`Outbox::dead_letter`], which keeps the event and the reason). Also the set of
//! instances firing as of a position ([`Outbox::firing`]: the latest event per fingerprint,
//! what Alertmanager is re-sent) and pruning ([`Outbox::prune`]: rows every notifier has
//! passed, except the latest firing event of each instance, which that set needs).
//!
//! Never decides when a position moves or what a receiver's answer means: the notifier does.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{Ctx, Mode, StoreError};
use crate::alert::event::{AlertEvent, EventStatus};

/// Dead letters kept per notifier (the oldest go first).
pub const DEAD_LETTERS_KEPT: i64 = 1000;

/// How large the outbox may grow while a notifier is disabled or down (`[alerts]
/// outbox_max_bytes`, `outbox_max_age`); see [`Outbox::bound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxBound {
    /// Most bytes of stored events.
    pub max_bytes: i64,
    /// Oldest event kept, ns.
    pub max_age_ns: i64,
}

/// Appends `ev` to the outbox on `conn` (normally inside the caller's transaction, with the
/// state change it reports); returns its sequence number. `path` names the store in errors.
pub fn enqueue(
    conn: &Connection,
    path: &Path,
    ev: &AlertEvent,
    now_ns: i64,
) -> Result<i64, StoreError> {
    // Serializing plain strings, numbers and maps cannot fail; keep the error typed anyway.
    let body = serde_json::to_string(ev).map_err(|e| StoreError::Sqlite {
        path: path.to_path_buf(),
        source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
    })?;
    conn.prepare_cached(
        "INSERT INTO alert_outbox (created_ns, event, fingerprint, firing) VALUES (?1, ?2, ?3, ?4)",
    )
    .and_then(|mut st| {
        st.execute(params![
            now_ns,
            body,
            ev.fingerprint,
            ev.status == EventStatus::Firing
        ])
    })
    .ctx(path)?;
    Ok(conn.last_insert_rowid())
}

/// One outbox row as a notifier reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Delivery order.
    pub seq: i64,
    /// When it was appended (Unix ns).
    pub created_ns: i64,
    /// The event as stored (JSON), kept for dead letters.
    pub json: String,
    /// The event, or why its JSON could not be read (such a row is dead-lettered).
    pub event: Result<AlertEvent, String>,
}

/// A notifier's durable state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    /// The last `seq` acknowledged or dead-lettered (0: none yet).
    pub seq: i64,
    /// Events delivered, all time.
    pub delivered: i64,
    /// Events dead-lettered, all time.
    pub dead_letters: i64,
    /// When the receiver last acknowledged (Unix ns).
    pub last_success_ns: Option<i64>,
    /// Events pruned before this notifier sent them (the outbox was over its bound).
    pub pruned_unsent: i64,
}

/// One dead-lettered event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The outbox `seq` it had.
    pub seq: i64,
    /// HTTP status of the refusal (0 when the event itself could not be read).
    pub status: u16,
    /// The receiver's reason.
    pub reason: String,
    /// When (Unix ns).
    pub at_ns: i64,
}

/// A notifier's connection to the outbox: a small read-write connection
/// ([`Mode::Cursor`]: `synchronous = FULL`, so an acknowledged position survives a power cut).
pub struct Outbox {
    conn: Connection,
    path: PathBuf,
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let json: String = r.get(2)?;
    let event = serde_json::from_str::<AlertEvent>(&json).map_err(|e| e.to_string());
    Ok(Row {
        seq: r.get(0)?,
        created_ns: r.get(1)?,
        json,
        event,
    })
}

impl Outbox {
    /// Opens the store in `dir` (it must exist, migrated by the writer).
    pub fn open(dir: &Path) -> Result<Outbox, StoreError> {
        let (conn, path) = super::open(dir, Mode::Cursor)?;
        Ok(Outbox { conn, path })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The notifier `name`'s durable state, its row created (position 0) if new: a new
    /// notifier delivers every event still in the outbox.
    pub fn position(&self, name: &str) -> Result<Position, StoreError> {
        self.conn
            .prepare_cached("INSERT OR IGNORE INTO notifiers (name) VALUES (?1)")
            .and_then(|mut st| st.execute(params![name]))
            .ctx(&self.path)?;
        Ok(self.load(name)?.unwrap_or_default())
    }

    /// The notifier `name`'s durable state, without creating its row (`None`: never
    /// registered).
    pub fn load(&self, name: &str) -> Result<Option<Position>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT position, delivered, dead_letters, last_success_ns, pruned_unsent \
                 FROM notifiers WHERE name = ?1",
            )
            .and_then(|mut st| {
                st.query_row(params![name], |r| {
                    Ok(Position {
                        seq: r.get(0)?,
                        delivered: r.get(1)?,
                        dead_letters: r.get(2)?,
                        last_success_ns: r.get(3)?,
                        pruned_unsent: r.get(4)?,
                    })
                })
                .optional()
            })
            .ctx(&self.path)
    }

    /// Up to `limit` rows after `position`, in `seq` order.
    pub fn after(&self, position: i64, limit: usize) -> Result<Vec<Row>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT seq, created_ns, event FROM alert_outbox WHERE seq > ?1 \
                 ORDER BY seq LIMIT ?2",
            )
            .and_then(|mut st| {
                st.query_map(params![position, limit as i64], row)?
                    .collect()
            })
            .ctx(&self.path)
    }

    /// Events after `position` (the notifier's backlog) and the newest `seq` (0: none).
    pub fn pending(&self, position: i64) -> Result<(i64, i64), StoreError> {
        self.conn
            .prepare_cached(
                "SELECT (SELECT COUNT(*) FROM alert_outbox WHERE seq > ?1), \
                 (SELECT COALESCE(MAX(seq), 0) FROM alert_outbox)",
            )
            .and_then(|mut st| st.query_row(params![position], |r| Ok((r.get(0)?, r.get(1)?))))
            .ctx(&self.path)
    }

    /// Records that `name`'s receiver acknowledged the event `seq`: the position moves there.
    pub fn ack(&self, name: &str, seq: i64, now_ns: i64) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "UPDATE notifiers SET position = MAX(position, ?2), delivered = delivered + 1, \
                 last_success_ns = ?3 WHERE name = ?1",
            )
            .and_then(|mut st| st.execute(params![name, seq, now_ns]))
            .ctx(&self.path)?;
        Ok(())
    }

    /// Keeps the refused event `seq` (its stored `json`) with the receiver's `status` and
    /// `reason`, and moves `name`'s position past it, in one transaction.
    pub fn dead_letter(
        &mut self,
        name: &str,
        seq: i64,
        json: &str,
        status: u16,
        reason: &str,
        now_ns: i64,
    ) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx(&self.path)?;
        tx.prepare_cached(
            "INSERT INTO notify_dead_letters (notifier, seq, event, status, reason, at_ns) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut st| st.execute(params![name, seq, json, status, reason, now_ns]))
        .ctx(&self.path)?;
        tx.prepare_cached(
            "UPDATE notifiers SET position = MAX(position, ?2), dead_letters = dead_letters + 1 \
             WHERE name = ?1",
        )
        .and_then(|mut st| st.execute(params![name, seq]))
        .ctx(&self.path)?;
        tx.prepare_cached(
            "DELETE FROM notify_dead_letters WHERE notifier = ?1 AND id <= \
             (SELECT id FROM notify_dead_letters WHERE notifier = ?1 ORDER BY id DESC \
              LIMIT 1 OFFSET ?2)",
        )
        .and_then(|mut st| st.execute(params![name, DEAD_LETTERS_KEPT]))
        .ctx(&self.path)?;
        tx.commit().ctx(&self.path)
    }

    /// The newest `limit` dead letters of `name`, newest first.
    pub fn dead_letters(&self, name: &str, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT seq, status, reason, at_ns FROM notify_dead_letters WHERE notifier = ?1 \
                 ORDER BY id DESC LIMIT ?2",
            )
            .and_then(|mut st| {
                st.query_map(params![name, limit as i64], |r| {
                    Ok(DeadLetter {
                        seq: r.get(0)?,
                        status: r.get(1)?,
                        reason: r.get(2)?,
                        at_ns: r.get(3)?,
                    })
                })?
                .collect()
            })
            .ctx(&self.path)
    }

    /// The instances firing as of `through` for `name`: the latest event (at or before
    /// `through`) of each fingerprint, where that event fires and was not dead-lettered by
    /// `name`; in `seq` order.
    pub fn firing(&self, name: &str, through: i64) -> Result<Vec<Row>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT o.seq, o.created_ns, o.event FROM alert_outbox o \
                 WHERE o.seq <= ?2 AND o.firing = 1 \
                   AND o.seq = (SELECT MAX(seq) FROM alert_outbox i \
                                WHERE i.fingerprint = o.fingerprint AND i.seq <= ?2) \
                   AND NOT EXISTS (SELECT 1 FROM notify_dead_letters d \
                                   WHERE d.notifier = ?1 AND d.seq = o.seq) \
                 ORDER BY o.seq",
            )
            .and_then(|mut st| st.query_map(params![name, through], row)?.collect())
            .ctx(&self.path)
    }

    /// Deletes the rows every notifier in `names` has passed (a name without a row yet is at
    /// 0, so nothing goes), keeping the latest event of each instance that still fires (the
    /// firing set needs it). No names: every row has been passed. Returns the rows deleted.
    pub fn prune(&self, names: &[String]) -> Result<usize, StoreError> {
        let mut floor: Option<i64> = None;
        for n in names {
            let p: Option<i64> = self
                .conn
                .prepare_cached("SELECT position FROM notifiers WHERE name = ?1")
                .and_then(|mut st| st.query_row(params![n], |r| r.get(0)).optional())
                .ctx(&self.path)?;
            let p = p.unwrap_or(0);
            floor = Some(floor.map_or(p, |f: i64| f.min(p)));
        }
        let floor = match floor {
            Some(f) => f,
            None => self.pending(0)?.1,
        };
        self.conn
            .prepare_cached(
                "DELETE FROM alert_outbox WHERE seq <= ?1 AND NOT (firing = 1 AND seq = \
                 (SELECT MAX(seq) FROM alert_outbox i WHERE i.fingerprint = alert_outbox.fingerprint))",
            )
            .and_then(|mut st| st.execute(params![floor]))
            .ctx(&self.path)
    }

    /// Holds the outbox within `bound` whatever the notifiers' positions: rows older than
    /// `max_age` (by `created_ns`, against `now_ns`), then the oldest rows while the events
    /// take more than `max_bytes`, go, except the latest event of each instance still firing
    /// (never pruned: the firing set and a late notifier need it). Every notifier in `names`
    /// counts the rows it had not passed yet (`pruned_unsent`), in the same transaction.
    /// Returns the rows deleted and, per name, how many of them it had not sent.
    pub fn bound(
        &mut self,
        names: &[String],
        bound: &OutboxBound,
        now_ns: i64,
    ) -> Result<(usize, Vec<(String, i64)>), StoreError> {
        const PRUNABLE: &str = "NOT (firing = 1 AND seq = (SELECT MAX(seq) FROM alert_outbox i \
             WHERE i.fingerprint = alert_outbox.fingerprint))";
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx(&self.path)?;
        let total: i64 = tx
            .prepare_cached("SELECT COALESCE(SUM(LENGTH(event)), 0) FROM alert_outbox")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .ctx(&self.path)?;
        let oldest_ns = now_ns.saturating_sub(bound.max_age_ns);
        // Everything too old goes; then the oldest prunable rows until the rest fits.
        let mut cut: i64 = tx
            .prepare_cached(&format!(
                "SELECT COALESCE(MAX(seq), 0) FROM alert_outbox WHERE created_ns < ?1 AND {PRUNABLE}"
            ))
            .and_then(|mut st| st.query_row(params![oldest_ns], |r| r.get(0)))
            .ctx(&self.path)?;
        if total > bound.max_bytes {
            let mut excess = total - bound.max_bytes;
            let mut st = tx
                .prepare_cached(&format!(
                    "SELECT seq, LENGTH(event) FROM alert_outbox WHERE {PRUNABLE} ORDER BY seq"
                ))
                .ctx(&self.path)?;
            let mut rows = st.query([]).ctx(&self.path)?;
            while excess > 0 {
                let Some(r) = rows.next().ctx(&self.path)? else {
                    break;
                };
                let (seq, len): (i64, i64) = (r.get(0).ctx(&self.path)?, r.get(1).ctx(&self.path)?);
                cut = cut.max(seq);
                excess -= len;
            }
        }
        if cut == 0 {
            return Ok((0, Vec::new()));
        }
        let mut lost = Vec::new();
        for n in names {
            let unsent: i64 = tx
                .prepare_cached(&format!(
                    "SELECT COUNT(*) FROM alert_outbox WHERE seq <= ?1 AND {PRUNABLE} AND seq > \
                     COALESCE((SELECT position FROM notifiers WHERE name = ?2), 0)"
                ))
                .and_then(|mut st| st.query_row(params![cut, n], |r| r.get(0)))
                .ctx(&self.path)?;
            if unsent > 0 {
                tx.prepare_cached(
                    "INSERT INTO notifiers (name) VALUES (?1) ON CONFLICT (name) DO NOTHING",
                )
                .and_then(|mut st| st.execute(params![n]))
                .ctx(&self.path)?;
                tx.prepare_cached(
                    "UPDATE notifiers SET pruned_unsent = pruned_unsent + ?2 WHERE name = ?1",
                )
                .and_then(|mut st| st.execute(params![n, unsent]))
                .ctx(&self.path)?;
                lost.push((n.clone(), unsent));
            }
        }
        let deleted = tx
            .prepare_cached(&format!(
                "DELETE FROM alert_outbox WHERE seq <= ?1 AND {PRUNABLE}"
            ))
            .and_then(|mut st| st.execute(params![cut]))
            .ctx(&self.path)?;
        tx.commit().ctx(&self.path)?;
        Ok((deleted, lost))
    }

    /// Rows in the outbox (all notifiers together).
    pub fn len(&self) -> Result<i64, StoreError> {
        self.conn
            .prepare_cached("SELECT COUNT(*) FROM alert_outbox")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .ctx(&self.path)
    }

    /// True when the outbox has no rows.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn ev(fp: &str, status: EventStatus, start: i64) -> AlertEvent {
        AlertEvent {
            rule: fp.into(),
            status,
            labels: BTreeMap::from([("alertname".into(), fp.into())]),
            annotations: BTreeMap::new(),
            starts_at_ns: start,
            ends_at_ns: (status == EventStatus::Resolved).then_some(start + 10),
            value: Some(1.0),
            incident_id: None,
            fingerprint: fp.into(),
        }
    }

    fn store() -> (tempfile::TempDir, Outbox, Connection, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let (w, p) =
            super::super::open(d.path(), Mode::Writer(crate::config::Synchronous::Normal)).unwrap();
        let o = Outbox::open(d.path()).unwrap();
        (d, o, w, p)
    }

    #[test]
    fn positions_move_on_ack_and_dead_letter_and_read_in_order() {
        let (_d, mut o, w, p) = store();
        let a = enqueue(&w, &p, &ev("a", EventStatus::Firing, 1), 100).unwrap();
        let b = enqueue(&w, &p, &ev("b", EventStatus::Firing, 2), 101).unwrap();
        let c = enqueue(&w, &p, &ev("a", EventStatus::Resolved, 1), 102).unwrap();
        assert!(a < b && b < c);
        assert_eq!(o.position("am").unwrap(), Position::default());
        let rows = o.after(0, 10).unwrap();
        assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), [a, b, c]);
        assert_eq!(rows[2].event.as_ref().unwrap().ends_at_ns, Some(11));
        o.ack("am", a, 5).unwrap();
        o.dead_letter("am", b, &rows[1].json, 400, "bad label", 6)
            .unwrap();
        let pos = o.position("am").unwrap();
        assert_eq!((pos.seq, pos.delivered, pos.dead_letters), (b, 1, 1));
        assert_eq!(pos.last_success_ns, Some(5));
        assert_eq!(o.after(pos.seq, 10).unwrap().len(), 1);
        assert_eq!(o.pending(pos.seq).unwrap(), (1, c));
        let dl = o.dead_letters("am", 10).unwrap();
        assert_eq!(
            (dl[0].seq, dl[0].status, dl[0].reason.as_str()),
            (b, 400, "bad label")
        );
    }

    #[test]
    fn firing_set_is_the_latest_event_per_instance_and_survives_pruning() {
        let (_d, mut o, w, p) = store();
        let a1 = enqueue(&w, &p, &ev("a", EventStatus::Firing, 1), 1).unwrap();
        let b1 = enqueue(&w, &p, &ev("b", EventStatus::Firing, 2), 2).unwrap();
        let a2 = enqueue(&w, &p, &ev("a", EventStatus::Resolved, 1), 3).unwrap();
        let c1 = enqueue(&w, &p, &ev("c", EventStatus::Firing, 4), 4).unwrap();
        let seqs = |rows: Vec<Row>| rows.iter().map(|r| r.seq).collect::<Vec<_>>();
        assert_eq!(seqs(o.firing("am", b1).unwrap()), [a1, b1]);
        assert_eq!(seqs(o.firing("am", c1).unwrap()), [b1, c1]);
        // Dead-lettered for this notifier: not re-sent to it.
        let json = o.after(0, 10).unwrap()[3].json.clone();
        o.position("am").unwrap();
        o.dead_letter("am", c1, &json, 400, "x", 1).unwrap();
        assert_eq!(seqs(o.firing("am", c1).unwrap()), [b1]);
        assert_eq!(seqs(o.firing("hook", c1).unwrap()), [b1, c1]);
        // "hook" has no row: nothing is pruned.
        let names = vec!["am".to_string(), "hook".to_string()];
        assert_eq!(o.prune(&names).unwrap(), 0);
        o.position("hook").unwrap();
        o.ack("hook", a2, 1).unwrap();
        // Both passed a2: a1 and a2 go (a resolved), b1 stays (still fires).
        assert_eq!(o.prune(&names).unwrap(), 2);
        assert_eq!(seqs(o.after(0, 10).unwrap()), [b1, c1]);
        assert_eq!(seqs(o.firing("hook", c1).unwrap()), [b1, c1]);
        // No notifier at all: everything passed, the firing instances' latest events stay.
        assert_eq!(o.prune(&[]).unwrap(), 0);
        assert_eq!(o.len().unwrap(), 2);
    }

    #[test]
    fn the_bound_prunes_unsent_events_but_keeps_each_firing_alerts_latest() {
        let (_d, mut o, w, p) = store();
        o.position("off").unwrap(); // a disabled notifier: it never moves
        let names = vec!["off".to_string()];
        // 50 instances firing then resolving, and one still firing at the very start.
        let keep = enqueue(&w, &p, &ev("hot", EventStatus::Firing, 1), 1).unwrap();
        for i in 0..50 {
            let fp = format!("i{i}");
            enqueue(&w, &p, &ev(&fp, EventStatus::Firing, 2), 10 + i).unwrap();
            enqueue(&w, &p, &ev(&fp, EventStatus::Resolved, 2), 10 + i).unwrap();
        }
        let last = enqueue(&w, &p, &ev("new", EventStatus::Firing, 3), 100).unwrap();
        let bytes = |o: &Outbox| -> i64 {
            o.after(0, 10_000)
                .unwrap()
                .iter()
                .map(|r| r.json.len() as i64)
                .sum()
        };
        let before = o.len().unwrap();
        assert_eq!(before, 102);
        let one = bytes(&o) / before;
        // Within the bound: nothing goes.
        let roomy = OutboxBound {
            max_bytes: bytes(&o),
            max_age_ns: i64::MAX,
        };
        assert_eq!(o.bound(&names, &roomy, 1_000).unwrap().0, 0);
        // Over it: the oldest go, the firing alerts' latest events stay, the loss counted.
        let tight = OutboxBound {
            max_bytes: one * 20,
            max_age_ns: i64::MAX,
        };
        let (deleted, lost) = o.bound(&names, &tight, 1_000).unwrap();
        assert!(deleted >= 80, "{deleted}");
        assert!(
            bytes(&o) <= tight.max_bytes,
            "{} > {}",
            bytes(&o),
            tight.max_bytes
        );
        assert_eq!(lost, vec![("off".to_string(), deleted as i64)]);
        let left: Vec<i64> = o.after(0, 1000).unwrap().iter().map(|r| r.seq).collect();
        assert_eq!(left.first(), Some(&keep), "the old firing event stays");
        assert_eq!(left.last(), Some(&last), "the newest stay");
        assert_eq!(o.position("off").unwrap().pruned_unsent, deleted as i64);
        assert_eq!(
            o.position("off").unwrap().seq,
            0,
            "the position does not move"
        );
        // Age: everything older than the window goes, except firing latest events.
        let old = OutboxBound {
            max_bytes: i64::MAX,
            max_age_ns: 10,
        };
        o.bound(&names, &old, 1_000).unwrap();
        let left: Vec<i64> = o.after(0, 1000).unwrap().iter().map(|r| r.seq).collect();
        assert_eq!(left, [keep, last]);
        // A notifier that had passed the pruned rows loses nothing.
        o.ack("off", last, 5).unwrap();
        enqueue(&w, &p, &ev("hot", EventStatus::Resolved, 1), 10_000).unwrap();
        let (_, lost) = o.bound(&names, &old, 10_000).unwrap();
        assert!(lost.is_empty(), "{lost:?}");
    }
}
