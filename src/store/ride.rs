//! Sinks' cursor bookkeeping carried by the writer's commits. A raw-feed sink that has sent
//! everything the store holds offers its place ([`RideState::offer`]: its cursor and batch
//! size). The writer's next commit that stores chunks right after that place, no more
//! points than the batch size, then writes in its own transaction what the sink would have
//! committed before sending them: the acknowledgement it holds and the in-flight mark of
//! that commit's chunks ([`Riders::carry`], the same [`sinks::ack_and_mark_in`]). The sink
//! finds its next batch marked ([`RideState::is_carried`]) and sends it without a commit of
//! its own: on the reference workload the two sinks' one commit per batch each was more than
//! half of the store's commits, each a WAL page, the page it shared with the commit before
//! and a page of the WAL index written again (docs/performance.md). What the sink sends is
//! exactly what the mark names, or it marks its batch itself as before; an offer is taken
//! only with `try_lock`, so the writer never waits on a sink.
//!
//! One registry per database file ([`Riders::of`]), joined by each raw-feed sink's cursor;
//! the state of a cursor that does not join (a rollup feed) is its own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Instant;

use rusqlite::Connection;

use super::sinks::{self, Ack};

/// The sinks of one database file that may have their bookkeeping carried.
#[derive(Default)]
pub struct Riders {
    riders: Mutex<Vec<Weak<Rider>>>,
}

/// Every live registry, by database file.
static REGISTRY: OnceLock<Mutex<HashMap<PathBuf, Weak<Riders>>>> = OnceLock::new();

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Riders {
    /// The registry of the database file `db` (shared by its writer and its sinks' cursors
    /// in this process).
    pub fn of(db: &Path) -> Arc<Riders> {
        let mut map = lock(REGISTRY.get_or_init(Default::default));
        map.retain(|_, r| r.strong_count() > 0);
        if let Some(r) = map.get(db).and_then(Weak::upgrade) {
            return r;
        }
        let r = Arc::new(Riders::default());
        map.insert(db.to_path_buf(), Arc::downgrade(&r));
        r
    }

    /// Registers `rider`; it leaves when dropped.
    pub fn join(&self, rider: &Arc<Rider>) {
        let mut v = lock(&self.riders);
        v.retain(|r| r.strong_count() > 0);
        v.push(Arc::downgrade(rider));
    }

    /// In the writer's transaction `tx`, which stored chunks `after + 1 ..= through`
    /// (`points` points in all): for each sink that offered `after` as its place and takes
    /// `points` in one batch, writes its held acknowledgement and marks `through` in flight
    /// (each sink's rows only; a sink whose statement fails is left to mark itself). The
    /// sinks carried wait until [`Carried::done`] says whether the commit stored it.
    pub fn carry(
        &self,
        tx: &Connection,
        path: &Path,
        after: i64,
        through: i64,
        points: i64,
    ) -> Carried {
        let mut out = Carried {
            through,
            after,
            taken: Vec::new(),
        };
        let live: Vec<Arc<Rider>> = lock(&self.riders)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for rider in live {
            // A sink busy with its own state is left alone: the writer never waits on one.
            let Ok(mut st) = rider.state.try_lock() else {
                continue;
            };
            let fits = st
                .offer
                .is_some_and(|(at, max_points)| at == after && points <= max_points);
            if !fits || st.riding {
                continue;
            }
            let ack = st.pending.map(|(a, _)| a);
            match sinks::ack_and_mark_in(tx, path, &rider.name, ack.as_ref(), Some(through)) {
                Ok(()) => {
                    st.offer = None;
                    st.riding = true;
                    drop(st);
                    out.taken.push((rider, ack));
                }
                Err(e) => {
                    tracing::debug!(sink = %rider.name, error = %e, "cannot carry the sink's mark; it marks its batch itself");
                    st.offer = None;
                }
            }
        }
        out
    }

    /// Whether any sink offers its place now (the writer skips its lookups otherwise).
    pub fn any_offer(&self) -> bool {
        lock(&self.riders)
            .iter()
            .filter_map(Weak::upgrade)
            .any(|r| r.state.try_lock().is_ok_and(|s| s.offer.is_some()))
    }
}

/// What a writer's transaction carries for the sinks (see [`Riders::carry`]).
#[must_use = "say whether the commit stored it"]
pub struct Carried {
    after: i64,
    through: i64,
    taken: Vec<(Arc<Rider>, Option<Ack>)>,
}

impl Carried {
    /// Nothing carried.
    pub fn none() -> Carried {
        Carried {
            after: 0,
            through: 0,
            taken: Vec::new(),
        }
    }

    /// Sinks carried.
    pub fn len(&self) -> usize {
        self.taken.len()
    }

    /// Whether no sink was carried.
    pub fn is_empty(&self) -> bool {
        self.taken.is_empty()
    }

    /// The commit ended: when `stored`, each sink carried finds its batch marked and its
    /// acknowledgement stored; otherwise nothing changed for it (it marks itself).
    pub fn done(mut self, stored: bool) {
        self.release(stored);
    }

    fn release(&mut self, stored: bool) {
        for (rider, ack) in self.taken.drain(..) {
            let mut st = lock(&rider.state);
            st.riding = false;
            if stored {
                if st.pending.map(|(a, _)| a) == ack {
                    st.pending = None;
                }
                st.carried = Some((self.after, self.through));
            }
            drop(st);
            rider.turn.notify_all();
        }
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        // A transaction that ended early (an error before its commit) stored nothing.
        self.release(false);
    }
}

/// One sink's bookkeeping that a writer's commit may carry.
pub struct Rider {
    name: String,
    state: Mutex<RideState>,
    turn: Condvar,
}

/// A sink's bookkeeping held in memory (see [`Rider`]).
#[derive(Debug, Default)]
pub struct RideState {
    /// Acknowledged and not committed yet, and since when.
    pub pending: Option<(Ack, Instant)>,
    /// The sink has sent everything after this chunk id and takes this many points a batch.
    offer: Option<(i64, i64)>,
    /// A writer's commit carries this sink's move now.
    riding: bool,
    /// The store records the chunks after the first id through the second in flight, and
    /// the acknowledgement that was held then, by a writer's commit.
    carried: Option<(i64, i64)>,
}

impl Rider {
    /// A sink's state, for `name`'s row.
    pub fn new(name: &str) -> Arc<Rider> {
        Arc::new(Rider {
            name: name.to_string(),
            state: Mutex::new(RideState::default()),
            turn: Condvar::new(),
        })
    }

    /// The sink's state, once no writer's commit carries it.
    pub fn hold(&self) -> MutexGuard<'_, RideState> {
        let mut st = lock(&self.state);
        while st.riding {
            st = self.turn.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        st
    }
}

impl RideState {
    /// The sink has sent everything through chunk `after` and takes `max_points` a batch:
    /// the writer's next commit may mark its chunks for it.
    pub fn offer(&mut self, after: i64, max_points: usize) {
        self.offer = Some((after, i64::try_from(max_points).unwrap_or(i64::MAX)));
    }

    /// The sink moves its state itself: no commit may carry it until it offers again, and
    /// a mark carried before no longer stands for its next batch.
    pub fn withdraw(&mut self) {
        self.offer = None;
        self.carried = None;
    }

    /// Whether a writer's commit marked the batch after `after` through `through` in flight
    /// (and stored every acknowledgement held then).
    pub fn is_carried(&self, after: i64, through: i64) -> bool {
        self.carried == Some((after, through)) && self.pending.is_none()
    }

    /// A mark carried and not sent yet: (after, through).
    pub fn carried(&self) -> Option<(i64, i64)> {
        self.carried
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{open, Mode};

    fn ack(through: i64) -> Ack {
        Ack {
            through,
            seq: 1,
            points: 3,
            ts_max: 1,
            now_ns: 1,
        }
    }

    fn row(conn: &Connection) -> (i64, i64) {
        conn.query_row(
            "SELECT cursor_chunk_id, inflight_through_chunk_id FROM sinks WHERE name = 's'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    }

    /// A transaction that carried a sink and then did not commit leaves the sink as it was
    /// (its acknowledgement held, no mark); a sink busy with its own state is passed over
    /// rather than waited for; a sink's own move waits until the commit that carries it
    /// has ended, and then finds its acknowledgement stored.
    #[test]
    fn a_commit_carries_only_what_it_stores_and_never_waits_on_a_sink() {
        let dir = tempfile::tempdir().unwrap();
        drop(
            crate::store::Writer::open(dir.path(), 10, crate::config::Synchronous::Normal).unwrap(),
        );
        crate::store::testing::add_sink(dir.path(), "s", 0);
        let (mut conn, path) = open(dir.path(), Mode::Job).unwrap();
        let riders = Arc::new(Riders::default());
        let rider = Rider::new("s");
        riders.join(&rider);
        let offer = |pending| {
            let mut st = rider.hold();
            st.pending = pending;
            st.offer(5, 10);
        };
        offer(Some((ack(5), Instant::now())));
        assert!(riders.any_offer());

        // Over its batch size, or after another place: not carried.
        assert!(riders.carry(&conn, &path, 5, 6, 11).is_empty());
        assert!(riders.carry(&conn, &path, 4, 6, 1).is_empty());

        // Carried, then rolled back.
        let tx = conn.transaction().unwrap();
        let carried = riders.carry(&tx, &path, 5, 6, 10);
        assert_eq!(carried.len(), 1);
        drop(tx);
        drop(carried);
        assert_eq!(row(&conn), (0, 0));
        let st = rider.hold();
        assert!(st.pending.is_some() && st.carried().is_none());
        drop(st);

        // Busy: passed over.
        offer(Some((ack(5), Instant::now())));
        let busy = rider.hold();
        assert!(!riders.any_offer());
        assert!(riders.carry(&conn, &path, 5, 6, 1).is_empty());
        drop(busy);

        // Carried and stored: the sink's own move waits for the commit's end.
        let tx = conn.transaction().unwrap();
        let carried = riders.carry(&tx, &path, 5, 6, 1);
        assert_eq!(carried.len(), 1);
        let waiter = {
            let rider = rider.clone();
            std::thread::spawn(move || {
                let st = rider.hold();
                (st.pending.is_none(), st.is_carried(5, 6))
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "waits while the commit carries it");
        tx.commit().unwrap();
        carried.done(true);
        assert_eq!(waiter.join().unwrap(), (true, true));
        assert_eq!(row(&conn), (5, 6));
    }
}
