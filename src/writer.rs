//! The single writer of ingested points: the only code that stores what producers submit
//! (new chunks, and the series dictionary they extend). It runs on its own OS thread, takes
//! every batch waiting in the queue (up to `max_batch_points`), commits them in one
//! transaction (group commit), then answers each producer and releases its queue capacity.
//! It stops when every producer handle is dropped and the queue is empty, so shutdown
//! flushes everything that was accepted. It is not the only code that writes SQLite: the
//! rollup job (tiers, eviction, vacuum), the forwarders (their cursors and dead letters) and
//! the clock hold (the times of held chunks once the clock is set) each write their own
//! derived state on their own connection, never a new point.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::model::Rejection;
use crate::queue::{Ack, Request};
use crate::stats::Stats;
use crate::store::{Staged, StoreError, Writer};

/// An acknowledged write of at most this many points goes to the journal (one synced
/// append) and is answered before its commit; so does a larger one with at most
/// [`JOURNAL_POINTS_PER_TAGSET`] points per tag set on average. Any other is committed at
/// once, with everything held beside it, and answered after. A commit costs 9-17 pages
/// however little it holds, plus a chunk row per tag set; a journal record about 12-20
/// bytes a value. A small write, or a wide one (a point for each of hundreds of series: a
/// scrape, Telegraf's batches), costs far less journaled and then stored in chunks of
/// seconds; a deep one (long runs of one series, a bulk import) already fills its own
/// chunks and pages, and journaling it would only write it twice.
pub const JOURNAL_MAX_POINTS: usize = 256;

/// See [`JOURNAL_MAX_POINTS`].
pub const JOURNAL_POINTS_PER_TAGSET: usize = 8;

/// Whether an acknowledged write's checked lines go to the journal (see
/// [`JOURNAL_MAX_POINTS`]).
fn journal_worthy(staged: &Staged) -> bool {
    staged.points() <= JOURNAL_MAX_POINTS
        || staged.points() <= JOURNAL_POINTS_PER_TAGSET * staged.tagsets()
}

/// Runs the writer until the queue closes. Blocking: call from a dedicated thread.
///
/// Points are held up to `flush_interval` so that seconds of them share one commit (and
/// one fsync): one commit per interval instead of one per request, which is most of the
/// pages the store writes. What is held depends on who waits:
/// - points nobody waits on (UDP, collectors) are held as they are: a crash loses at most
///   the interval of them, and they were promised to no one;
/// - a small or wide acknowledged write (an HTTP write of at most [`JOURNAL_MAX_POINTS`]
///   lines, or of a few points per tag set) is checked, appended to the journal (synced in `full` mode) and answered, then held: it
///   is durable from its answer on, and a restart replays it (see `store::journal`);
/// - a deep acknowledged write (long runs per tag set), and a reader's barrier (`IngestHandle::settle`: an empty
///   acknowledged batch), are committed at once with everything held, and answered after.
///
/// What is held is readable without a commit through the store's view of it
/// ([`crate::store::HeldView`], given with [`Writer::keep_held`]): each request's lines go
/// there as they are held, and leave it as their commit becomes visible. The alert cycle
/// reads that way.
///
/// A held request keeps its queue capacity until its commit, so memory stays bounded by
/// the queue. When a commit fails (full or read-only disk), the journaled requests stay
/// held (they were answered: they are never dropped) and are committed again at each
/// interval; what was not journaled is answered with the error (or dropped and counted),
/// and until a commit succeeds every new request is refused with the same error. Zero,
/// or a store without a journal, commits every batch at once.
pub fn run(
    mut store: Writer,
    mut rx: UnboundedReceiver<Request>,
    max_batch_points: usize,
    flush_interval: Duration,
    stats: Arc<Stats>,
) {
    // A timer for the timed wait while points are held: this thread's own, tiny runtime
    // (the agent's runtime must not be blocked on). Without one, nothing is held.
    let timer = if flush_interval.is_zero() {
        None
    } else {
        match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => Some(rt),
            Err(e) => {
                tracing::warn!(error = %e, "writer: no timer; committing every batch at once");
                None
            }
        }
    };
    let mut head = Head {
        held: Vec::new(),
        points: 0,
        failing: None,
        deadline: None,
        journal: timer.is_some() && store.has_journal(),
        max_batch_points,
        flush_interval,
    };
    if let Some(staged) = store.take_unstored() {
        // Replayed at open, not stored: held like any journaled write, tried again at the
        // interval (or the next request), never dropped.
        head.hold(
            &store,
            Held {
                values: staged.values(),
                staged: Arc::new(staged),
                journaled: true,
                ack: None,
                _permit: None,
            },
        );
        head.failing = Some(("the journal's records are not stored yet".into(), true));
        head.deadline = Some(Instant::now() + flush_interval);
    }
    let mut pending: Vec<Request> = Vec::new();
    loop {
        let next = match (head.deadline, &timer) {
            (Some(at), Some(rt)) => {
                let wait = at.saturating_duration_since(Instant::now());
                match rt.block_on(async { tokio::time::timeout(wait, rx.recv()).await }) {
                    Ok(Some(req)) => Some(Wake::Req(req)),
                    Ok(None) => None,
                    Err(_) => Some(Wake::Due),
                }
            }
            _ => rx.blocking_recv().map(Wake::Req),
        };
        match next {
            Some(Wake::Req(req)) => {
                let mut points = req.batch.len();
                pending.push(req);
                while points < max_batch_points {
                    match rx.try_recv() {
                        Ok(req) => {
                            points += req.batch.len();
                            pending.push(req);
                        }
                        Err(_) => break,
                    }
                }
                head.take(&mut store, &mut pending, &stats);
            }
            Some(Wake::Due) => head.commit(&mut store, &stats),
            None => {
                if !head.held.is_empty() {
                    head.commit(&mut store, &stats);
                }
                break;
            }
        }
    }
    if !head.held.is_empty() {
        tracing::error!(
            points = head.points,
            "writer: stopping with acknowledged points not committed; they stay in the journal for the next start"
        );
    }
    tracing::debug!("writer: queue closed and drained");
}

/// What ended a wait of the writer.
enum Wake {
    /// A request arrived.
    Req(Request),
    /// The held points are due.
    Due,
}

/// One request's checked lines, held for the next commit.
struct Held {
    /// Shared with the store's [`crate::store::HeldView`], where readers see it.
    staged: Arc<Staged>,
    /// Answered already (its lines are in the journal): never dropped.
    journaled: bool,
    /// The answer still owed after the commit, and the lines it refused.
    ack: Option<(oneshot::Sender<Ack>, Vec<Rejection>)>,
    /// Values in `staged`.
    values: usize,
    /// The request's queue capacity, released after the commit (none for the journal's
    /// records a start could not store).
    _permit: Option<OwnedSemaphorePermit>,
}

/// The writer's held requests and its state between commits.
struct Head {
    held: Vec<Held>,
    /// Points in `held`.
    points: usize,
    /// The error of the last commit while it failed: new requests are refused with it.
    failing: Option<(String, bool)>,
    /// When the held points are due.
    deadline: Option<Instant>,
    /// Whether small acknowledged writes go to the journal.
    journal: bool,
    max_batch_points: usize,
    flush_interval: Duration,
}

impl Head {
    /// Holds `h` for the next commit, where the store's readers see it too.
    fn hold(&mut self, store: &Writer, h: Held) {
        self.points += h.staged.points();
        if let Some(view) = store.held_view() {
            view.hold(h.staged.clone());
        }
        self.held.push(h);
    }

    /// Checks `pending`'s lines and holds, journals or commits them (see [`run`]).
    fn take(&mut self, store: &mut Writer, pending: &mut Vec<Request>, stats: &Stats) {
        if self.failing.is_some() && !self.held.is_empty() {
            // Try again first: once the store takes the held points, new ones may follow.
            self.commit(store, stats);
        }
        if let Some((error, retryable)) = self.failing.clone() {
            if self.held.is_empty() {
                // Nothing is owed: the next commit will tell whether the store is back.
                self.failing = None;
            } else {
                refuse(pending.drain(..), &error, retryable, stats);
                return;
            }
        }
        let batches: Vec<&crate::model::Batch> = pending.iter().map(|r| &r.batch).collect();
        let staged = match store.stage(&batches) {
            Ok(s) => s,
            Err(e) => {
                Stats::add(&stats.commit_errors, 1);
                let (error, retryable) = describe(&e);
                tracing::error!(error = %e, retryable, batches = pending.len(), "checking new points failed; nothing of these batches was stored");
                refuse(pending.drain(..), &error, retryable, stats);
                return;
            }
        };
        let barrier = pending.iter().any(is_barrier);
        let large = pending
            .iter()
            .zip(&staged)
            .any(|(r, (_, s))| r.ack.is_some() && !journal_worthy(s));
        let new_points: usize = staged.iter().map(|(_, s)| s.points()).sum();
        let now =
            !self.journal || barrier || large || self.points + new_points >= self.max_batch_points;
        let mut entries: Vec<(Request, crate::store::WriteSummary, Staged)> = pending
            .drain(..)
            .zip(staged)
            .map(|(r, (sum, s))| (r, sum, s))
            .collect();
        // Small acknowledged writes: one journal record for all of them, then the answer.
        let mut journaled = false;
        if !now {
            let to_journal = || {
                entries
                    .iter()
                    .filter(|(r, _, s)| r.ack.is_some() && !s.is_empty())
                    .map(|(_, _, s)| s)
            };
            if to_journal().next().is_some() {
                let before = store.journal_written();
                match store.journal(to_journal()) {
                    Ok(_) => {
                        Stats::add(&stats.journal_appends, 1);
                        Stats::add(&stats.journal_bytes, store.journal_written() - before);
                        journaled = true;
                    }
                    Err(e) => {
                        Stats::add(&stats.commit_errors, 1);
                        let (error, retryable) = describe(&e);
                        tracing::error!(error = %e, retryable, "journal append failed; the acknowledged writes waiting on it were not stored");
                        let (failed, kept): (Vec<_>, Vec<_>) =
                            entries.into_iter().partition(|(r, _, _)| r.ack.is_some());
                        entries = kept;
                        for (req, _, _) in failed {
                            release_and_answer(
                                req.permit,
                                req.ack,
                                Ack::Failed {
                                    error: error.clone(),
                                    retryable,
                                },
                            );
                        }
                    }
                }
            }
        }
        for (req, sum, staged) in entries {
            Stats::add(&stats.points_rejected, sum.rejected.len() as u64);
            if req.ack.is_none() && !sum.rejected.is_empty() {
                // Collectors and UDP have nobody to answer: log (rate-limited by the
                // fact that the same series keeps failing the same way) and count.
                tracing::debug!(first = %sum.rejected[0].error, count = sum.rejected.len(), "lines refused");
            }
            if staged.is_empty() && !is_barrier(&req) {
                // Nothing to store (every line refused, an empty batch nobody waits on, or
                // a reader's catch-up: what came before it is held by now).
                release_and_answer(
                    req.permit,
                    req.ack,
                    Ack::Committed {
                        rejected: sum.rejected,
                    },
                );
                continue;
            }
            // (A barrier is in no record: it is answered by the commit.)
            let in_journal = journaled && req.ack.is_some() && !staged.is_empty();
            let ack = match req.ack {
                Some(ack) if in_journal => {
                    let _ = ack.send(Ack::Committed {
                        rejected: sum.rejected,
                    });
                    None
                }
                Some(ack) => Some((ack, sum.rejected)),
                None => None,
            };
            self.hold(
                store,
                Held {
                    journaled: in_journal,
                    values: sum.values,
                    staged: Arc::new(staged),
                    ack,
                    _permit: Some(req.permit),
                },
            );
        }
        if now {
            self.commit(store, stats);
        } else if self.deadline.is_none() && !self.held.is_empty() {
            self.deadline = Some(Instant::now() + self.flush_interval);
        }
    }

    /// Commits everything held, in one transaction, and answers what is owed.
    fn commit(&mut self, store: &mut Writer, stats: &Stats) {
        self.deadline = None;
        if self.held.is_empty() {
            return;
        }
        let started = Instant::now();
        let result = store.commit(self.held.iter().map(|h| &*h.staged));
        let elapsed = started.elapsed();
        stats.last_commit_us.store(
            elapsed.as_micros() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        stats.commit_seconds.0.observe(elapsed.as_secs_f64());
        match result {
            Ok(()) => {
                Stats::add(&stats.commits, 1);
                self.failing = None;
                self.points = 0;
                for h in self.held.drain(..) {
                    let Held {
                        staged,
                        ack,
                        values,
                        _permit,
                        ..
                    } = h;
                    Stats::add(&stats.points_written, staged.points() as u64);
                    Stats::add(&stats.values_written, values as u64);
                    let (ack, rejected) = ack.unzip();
                    release_and_answer(
                        _permit,
                        ack,
                        Ack::Committed {
                            rejected: rejected.unwrap_or_default(),
                        },
                    );
                }
            }
            Err(e) => {
                Stats::add(&stats.commit_errors, 1);
                let (error, retryable) = describe(&e);
                let kept = self.held.iter().filter(|h| h.journaled).count();
                tracing::error!(error = %e, retryable, requests = self.held.len(), journaled = kept, "commit failed; what was not journaled was not stored, the journaled writes are kept and tried again");
                let mut points = 0;
                self.held.retain_mut(|h| {
                    if h.journaled {
                        points += h.staged.points();
                        return true;
                    }
                    match h.ack.take() {
                        Some((ack, _)) => release_and_answer(
                            h._permit.take(),
                            Some(ack),
                            Ack::Failed {
                                error: error.clone(),
                                retryable,
                            },
                        ),
                        None => Stats::add(&stats.points_dropped, h.staged.points() as u64),
                    }
                    false
                });
                self.points = points;
                if let Some(view) = store.held_view() {
                    view.reset(self.held.iter().map(|h| h.staged.clone()));
                }
                self.failing = Some((error, retryable));
                if !self.held.is_empty() {
                    self.deadline = Some(Instant::now() + self.flush_interval);
                }
            }
        }
    }
}

/// An empty request with an acknowledgement that asks for a commit of what is held
/// ([`crate::queue::IngestHandle::settle`]; a catch-up asks for none).
fn is_barrier(r: &Request) -> bool {
    r.ack.is_some() && r.batch.is_empty() && !r.catch_up
}

/// The answer's text for a store error, and whether trying again may help. A read-only
/// store (remounted read-only after an IO error, a permission change) may become writable
/// again without a restart: retryable, like a full disk.
fn describe(e: &StoreError) -> (String, bool) {
    let read_only = e.is_read_only();
    let retryable = e.retryable() || read_only;
    let error = if e.is_disk_full() {
        format!("store is full (disk or quota): {e}")
    } else if read_only {
        format!("store is read-only: {e}")
    } else {
        e.to_string()
    };
    (error, retryable)
}

/// Gives a request's queue capacity back, then sends its answer (if anyone waits for one):
/// in that order, so whoever the answer wakes (a reader's barrier, a producer about to retry,
/// `queued()`) finds the capacity free. Every answer that ends a request goes through here;
/// a journaled write's early answer does not (it keeps its capacity until the commit).
fn release_and_answer<P>(permit: P, ack: Option<oneshot::Sender<Ack>>, answer: Ack) {
    drop(permit);
    if let Some(ack) = ack {
        let _ = ack.send(answer);
    }
}

/// Answers every request with the error (nothing of them was stored); counts what nobody
/// waits on as dropped.
fn refuse(requests: impl Iterator<Item = Request>, error: &str, retryable: bool, stats: &Stats) {
    for req in requests {
        let Request {
            batch, ack, permit, ..
        } = req;
        if ack.is_none() {
            Stats::add(&stats.points_dropped, batch.len() as u64);
        }
        release_and_answer(
            permit,
            ack,
            Ack::Failed {
                error: error.to_string(),
                retryable,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;
    use crate::model::{Batch, Line, Value};
    use crate::queue::{channel, Ack};
    use crate::store::HeldView;
    use std::sync::atomic::Ordering;

    /// The capacity comes back before the answer is sent: a permit that looks, as it is
    /// dropped, for an answer already there.
    #[test]
    fn capacity_is_given_back_before_the_answer_is_sent() {
        struct Probe(std::sync::Arc<std::sync::Mutex<oneshot::Receiver<Ack>>>);
        impl Drop for Probe {
            fn drop(&mut self) {
                let answered = self.0.lock().unwrap().try_recv().is_ok();
                assert!(
                    !answered,
                    "the answer was sent before the capacity came back"
                );
            }
        }
        let (tx, rx) = oneshot::channel();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        release_and_answer(
            Probe(rx.clone()),
            Some(tx),
            Ack::Committed { rejected: vec![] },
        );
        let answer = rx.lock().unwrap().try_recv();
        assert_eq!(answer.ok(), Some(Ack::Committed { rejected: vec![] }));
    }

    fn batch(key: &str, n: usize) -> Batch {
        Batch {
            lines: (0..n)
                .map(|i| Line {
                    key: key.into(),
                    fields: vec![("f".into(), Value::F64(i as f64))],
                    ts: 1_700_000_000_000_000_000 + i as i64,
                    line_no: i as u32 + 1,
                })
                .collect(),
        }
    }

    fn stored(dir: &std::path::Path) -> i64 {
        let conn = rusqlite::Connection::open(dir.join("edgewatch.db")).unwrap();
        conn.query_row("SELECT COALESCE(SUM(n), 0) FROM chunks", [], |r| r.get(0))
            .unwrap()
    }

    /// A writer thread on a store in `dir`, with the store's view of what it holds.
    fn start(
        dir: &std::path::Path,
        flush: Duration,
    ) -> (
        crate::queue::IngestHandle,
        Arc<Stats>,
        std::thread::JoinHandle<()>,
        Arc<HeldView>,
    ) {
        let mut store = Writer::open(dir, 1000, Synchronous::Full).unwrap();
        let view = Arc::new(HeldView::new());
        store.keep_held(view.clone());
        let (h, rx) = channel(10_000);
        let stats = Arc::new(Stats::default());
        let s = stats.clone();
        let t = std::thread::spawn(move || run(store, rx, 20_000, flush, s));
        (h, stats, t, view)
    }

    #[test]
    fn a_small_acknowledged_write_is_answered_after_its_journal_append_and_committed_with_the_held_points(
    ) {
        let dir = tempfile::tempdir().unwrap();
        // An hour: nothing but a reader's barrier, a large write (or the end) commits.
        let (h, stats, t, view) = start(dir.path(), Duration::from_secs(3600));
        for _ in 0..5 {
            h.submit(batch("udp", 3), false).unwrap();
        }
        let ack = h.submit(batch("http", 2), true).unwrap().unwrap();
        let answer = ack.blocking_recv().unwrap();
        assert_eq!(answer, Ack::Committed { rejected: vec![] });
        assert_eq!(
            stats.commits.load(Ordering::Relaxed),
            0,
            "held, not committed"
        );
        assert_eq!(stats.journal_appends.load(Ordering::Relaxed), 1);
        assert_eq!(stored(dir.path()), 0);
        let journal = crate::store::journal::journal_path(dir.path());
        assert!(std::fs::metadata(&journal).unwrap().len() > 0);
        assert_eq!(h.queued(), 17, "held points keep their queue capacity");
        assert_eq!(view.points(), 17, "readers see what is held");
        // A reader's barrier commits everything held, in one commit.
        let barrier = h
            .submit(crate::model::Batch::default(), true)
            .unwrap()
            .unwrap();
        assert_eq!(
            barrier.blocking_recv().unwrap(),
            Ack::Committed { rejected: vec![] }
        );
        assert_eq!(
            stats.commits.load(Ordering::Relaxed),
            1,
            "one commit for all"
        );
        assert_eq!(stored(dir.path()), 17);
        assert_eq!(view.points(), 0, "stored, no longer held");
        assert_eq!(h.queued(), 0);
        // A write larger than the journal takes is committed at once, answered after.
        h.submit(batch("udp", 1), false).unwrap();
        let ack = h
            .submit(batch("bulk", JOURNAL_MAX_POINTS + 1), true)
            .unwrap()
            .unwrap();
        assert_eq!(
            ack.blocking_recv().unwrap(),
            Ack::Committed { rejected: vec![] }
        );
        assert_eq!(stats.commits.load(Ordering::Relaxed), 2);
        assert_eq!(stats.journal_appends.load(Ordering::Relaxed), 1);
        assert_eq!(stored(dir.path()), 17 + 1 + JOURNAL_MAX_POINTS as i64 + 1);
        // A wide one (a point for each of 300 series) is journaled: it would be 300 one-point
        // chunks.
        let mut wide = batch("x", 0);
        for i in 0..300 {
            wide.lines.extend(batch(&format!("wide,i={i}"), 1).lines);
        }
        let ack = h.submit(wide, true).unwrap().unwrap();
        assert_eq!(
            ack.blocking_recv().unwrap(),
            Ack::Committed { rejected: vec![] }
        );
        assert_eq!(stats.journal_appends.load(Ordering::Relaxed), 2);
        assert_eq!(stats.commits.load(Ordering::Relaxed), 2, "held");
        drop(h);
        t.join().unwrap();
    }

    /// A reader's catch-up returns once the writer has taken everything queued before it,
    /// and commits nothing: a raw read with the store's view of what is held then sees every
    /// point, and the same read after the commit sees each of them once.
    #[test]
    fn a_catch_up_returns_once_everything_queued_before_it_is_held_and_commits_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (h, stats, t, view) = start(dir.path(), Duration::from_secs(3600));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(h.catch_up());
        for _ in 0..4 {
            h.submit(batch("udp", 5), false).unwrap();
        }
        rt.block_on(h.catch_up());
        assert_eq!(view.points(), 20, "everything queued before it is held");
        assert_eq!(
            stats.commits.load(Ordering::Relaxed),
            0,
            "nothing committed"
        );
        assert_eq!(stored(dir.path()), 0);
        let reader = crate::store::Reader::open(dir.path()).unwrap();
        let q = crate::store::query::RawQuery {
            measurement: "udp".into(),
            from: 0,
            to: i64::MAX,
            limit: 1000,
            ..Default::default()
        };
        let points = |r: crate::store::query::RawResult| -> usize {
            r.series.iter().map(|s| s.points.len()).sum()
        };
        let with_held = || points(reader.read_with_held(&view, |r| r.query_raw(&q)).unwrap());
        assert_eq!(with_held(), 20);
        assert_eq!(points(reader.query_raw(&q).unwrap()), 0, "none stored");
        // A barrier commits them: stored now, and still counted once.
        rt.block_on(h.settle());
        assert_eq!(stats.commits.load(Ordering::Relaxed), 1);
        assert_eq!(view.points(), 0);
        assert_eq!(with_held(), 20);
        assert_eq!(points(reader.query_raw(&q).unwrap()), 20);
        drop(h);
        t.join().unwrap();
    }

    #[test]
    fn a_failed_commit_keeps_the_journaled_writes_refuses_new_ones_and_stores_them_once_it_can() {
        let dir = tempfile::tempdir().unwrap();
        let (h, stats, t, view) = start(dir.path(), Duration::from_millis(100));
        // The series exist (checking a write then needs no lock), and are committed.
        let ack = h.submit(batch("http", 2), true).unwrap().unwrap();
        assert!(matches!(
            ack.blocking_recv().unwrap(),
            Ack::Committed { .. }
        ));
        let until = Instant::now() + Duration::from_secs(10);
        while stored(dir.path()) < 2 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Another connection holds the write lock: every commit fails (busy, after the
        // store's 5 s busy timeout), as on a full or read-only disk.
        let blocker = rusqlite::Connection::open(dir.path().join("edgewatch.db")).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        // Points nobody waits on are dropped by the failed commit; readers stop seeing them.
        h.submit(batch("http", 2), false).unwrap();
        let ack = h.submit(batch("http", 3), true).unwrap().unwrap();
        assert_eq!(
            ack.blocking_recv().unwrap(),
            Ack::Committed { rejected: vec![] },
            "journaled: answered before its commit"
        );
        let until = Instant::now() + Duration::from_secs(20);
        while stats.commit_errors.load(Ordering::Relaxed) == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(stats.commit_errors.load(Ordering::Relaxed) >= 1);
        assert_eq!(stats.points_dropped.load(Ordering::Relaxed), 2);
        assert_eq!(view.points(), 3, "readers see what is still held");
        // While it fails, a new write is refused with the cause, and nothing of it is kept.
        let ack = h.submit(batch("refused", 4), true).unwrap().unwrap();
        match ack.blocking_recv().unwrap() {
            Ack::Failed { error, retryable } => {
                assert!(retryable, "{error}");
                assert!(error.contains("locked"), "{error}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(h.queued(), 3, "the journaled write is still held");
        // The lock goes: the held write is stored by the next try, the refused one never.
        blocker.execute_batch("ROLLBACK").unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while stored(dir.path()) < 5 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(stored(dir.path()), 5);
        assert_eq!(h.queued(), 0);
        assert_eq!(view.points(), 0);
        drop(h);
        t.join().unwrap();
        let conn = rusqlite::Connection::open(dir.path().join("edgewatch.db")).unwrap();
        let refused: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM tagsets WHERE key = 'refused'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(refused, 0, "refused before it was even checked");
        drop(Writer::open(dir.path(), 1000, Synchronous::Full).unwrap());
        assert_eq!(stored(dir.path()), 5, "nothing replayed twice");
    }

    #[test]
    fn records_a_start_cannot_store_are_kept_appended_after_and_stored_once_it_can() {
        let dir = tempfile::tempdir().unwrap();
        let journal = |w: &mut Writer, key: &str, n: usize| {
            let b = batch(key, n);
            let staged = w.stage(&[&b]).unwrap();
            w.journal(staged.iter().map(|(_, s)| s)).unwrap();
        };
        {
            let mut w = Writer::open(dir.path(), 1000, Synchronous::Full).unwrap();
            journal(&mut w, "http", 3);
            // The process dies: no commit.
        }
        // The next start cannot write (another connection holds the lock, as a full or
        // read-only disk would refuse): it still opens, keeping the records.
        let blocker = rusqlite::Connection::open(dir.path().join("edgewatch.db")).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        {
            let mut w = Writer::open(dir.path(), 1000, Synchronous::Full).unwrap();
            // A new record goes after them, not over them; then this run dies too.
            journal(&mut w, "http", 2);
        }
        blocker.execute_batch("ROLLBACK").unwrap();
        assert_eq!(stored(dir.path()), 0);
        drop(Writer::open(dir.path(), 1000, Synchronous::Full).unwrap());
        assert_eq!(stored(dir.path()), 5, "both runs' records, once");
        // The same with the writer thread: it holds them and stores them once it can.
        let mut w = Writer::open(dir.path(), 1000, Synchronous::Full).unwrap();
        journal(&mut w, "http", 4);
        drop(w);
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        let w = Writer::open(dir.path(), 1000, Synchronous::Full).unwrap();
        let (h, rx) = channel(10_000);
        let stats = Arc::new(Stats::default());
        let s = stats.clone();
        let t = std::thread::spawn(move || run(w, rx, 20_000, Duration::from_millis(100), s));
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(stored(dir.path()), 5, "not stored while the store refuses");
        blocker.execute_batch("ROLLBACK").unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while stored(dir.path()) < 9 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(stored(dir.path()), 9);
        drop(h);
        t.join().unwrap();
        drop(Writer::open(dir.path(), 1000, Synchronous::Full).unwrap());
        assert_eq!(stored(dir.path()), 9, "and never twice");
    }

    /// A commit of journaled writes records the journal's number on a page it writes anyway
    /// (`sqlite_sequence`, for the chunk ids), not on one of its own; a store migrated from
    /// before (its number in `chunk_tail`) keeps it, and replays exactly the records after it.
    #[test]
    fn a_journaled_commit_records_its_number_on_the_page_the_chunk_ids_write_anyway() {
        use crate::store::testing::{checkpoint_truncate, wal_pages};
        let dir = tempfile::tempdir().unwrap();
        let journal = |w: &mut Writer, n: usize| {
            let b = batch("http", n);
            let staged = w.stage(&[&b]).unwrap();
            w.journal(staged.iter().map(|(_, s)| s)).unwrap();
            staged
        };
        let mut w = Writer::open(dir.path(), 1000, Synchronous::Full).unwrap();
        let first = journal(&mut w, 3);
        w.commit(first.iter().map(|(_, s)| s)).unwrap();
        checkpoint_truncate(dir.path());
        let second = journal(&mut w, 2);
        w.commit(second.iter().map(|(_, s)| s)).unwrap();
        let conn = rusqlite::Connection::open(dir.path().join("edgewatch.db")).unwrap();
        let root = |name: &str| -> u32 {
            conn.query_row(
                "SELECT rootpage FROM sqlite_schema WHERE name = ?1",
                [name],
                |r| r.get(0),
            )
            .unwrap()
        };
        let pages = wal_pages(dir.path());
        assert!(pages.contains(&root("sqlite_sequence")), "{pages:?}");
        assert!(
            !pages.contains(&root("chunk_tail")),
            "a page of its own for the journal's number: {pages:?}"
        );
        let number = |conn: &rusqlite::Connection| -> i64 {
            conn.query_row(
                "SELECT seq FROM sqlite_sequence WHERE name = 'edgewatch.journal'",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        assert_eq!(number(&conn), 2);
        // A record appended and not stored, on a store rolled back to before 0016 with its
        // number in `chunk_tail`: the migration carries the number over, and the next open
        // stores that record only.
        journal(&mut w, 4);
        drop(w);
        conn.execute_batch(
            "DELETE FROM sqlite_sequence WHERE name = 'edgewatch.journal'; \
             UPDATE chunk_tail SET journal_seq = 2; \
             DROP TABLE merge_state; \
             DELETE FROM schema_migrations WHERE version >= 16; PRAGMA user_version = 15;",
        )
        .unwrap();
        assert_eq!(stored(dir.path()), 5);
        drop(Writer::open(dir.path(), 1000, Synchronous::Full).unwrap());
        assert_eq!(
            stored(dir.path()),
            9,
            "the record after the carried number, once"
        );
        assert_eq!(number(&conn), 3);
    }

    #[test]
    fn journaled_writes_a_crash_left_uncommitted_are_stored_at_the_next_open_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut w = Writer::open(dir.path(), 1000, Synchronous::Full).unwrap();
            let b1 = batch("http", 2);
            let b2 = batch("http", 3);
            let staged = w.stage(&[&b1, &b2]).unwrap();
            w.journal(staged.iter().map(|(_, s)| s)).unwrap();
            let b3 = batch("http", 4);
            let staged = w.stage(&[&b3]).unwrap();
            w.journal(staged.iter().map(|(_, s)| s)).unwrap();
            // The process dies here: no commit.
        }
        assert_eq!(stored(dir.path()), 0);
        drop(Writer::open(dir.path(), 1000, Synchronous::Full).unwrap());
        assert_eq!(stored(dir.path()), 9, "replayed at open");
        drop(Writer::open(dir.path(), 1000, Synchronous::Full).unwrap());
        assert_eq!(stored(dir.path()), 9, "and only once");
        // The next records go on from the stored sequence number and replay too.
        {
            let mut w = Writer::open(dir.path(), 1000, Synchronous::Full).unwrap();
            let b = batch("http", 5);
            let staged = w.stage(&[&b]).unwrap();
            assert_eq!(w.journal(staged.iter().map(|(_, s)| s)).unwrap(), 3);
        }
        drop(Writer::open(dir.path(), 1000, Synchronous::Full).unwrap());
        assert_eq!(stored(dir.path()), 14);
    }

    /// Staging commits the series it adds in a transaction it begins at the first insert
    /// (lines of known series need none), and a staging that fails part way keeps none of
    /// them and leaves no transaction open: the same lines stage once the cause is gone.
    #[test]
    fn a_staging_that_fails_part_way_keeps_no_series_and_the_next_one_stages() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 1000, Synchronous::Full).unwrap();
        let other = rusqlite::Connection::open(dir.path().join("edgewatch.db")).unwrap();
        let series = |field: &str| -> i64 {
            other
                .query_row(
                    "SELECT COUNT(*) FROM series WHERE field = ?1",
                    [field],
                    |r| r.get(0),
                )
                .unwrap()
        };
        let known = batch("known", 2);
        w.stage(&[&known]).unwrap();
        assert_eq!(series("f"), 1, "a new series is committed at once");
        other
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON series WHEN NEW.field = 'bad' \
                 BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
            )
            .unwrap();
        let mut mixed = batch("new", 1);
        mixed.lines[0].fields.push(("ok".into(), Value::F64(1.0)));
        mixed.lines[0].fields.push(("bad".into(), Value::F64(2.0)));
        let e = w.stage(&[&known, &mixed]).err().unwrap();
        assert!(e.to_string().contains("refused by the test"), "{e}");
        assert_eq!((series("ok"), series("bad")), (0, 0), "rolled back");
        // Known series still stage with the trigger in place.
        let (sum, _) = w.stage(&[&known]).unwrap().remove(0);
        assert_eq!(sum.points, 2);
        other.execute_batch("DROP TRIGGER refuse").unwrap();
        let staged = w.stage(&[&mixed]).unwrap();
        assert_eq!(staged[0].0.points, 1);
        assert_eq!((series("f"), series("ok"), series("bad")), (2, 1, 1));
    }

    #[test]
    fn held_points_are_committed_after_the_interval_and_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let (h, stats, t, _) = start(dir.path(), Duration::from_millis(100));
        h.submit(batch("udp", 4), false).unwrap();
        h.submit(batch("collector", 2), false).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while stats.commits.load(Ordering::Relaxed) == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            stats.commits.load(Ordering::Relaxed),
            1,
            "one commit for both"
        );
        assert_eq!(stored(dir.path()), 6);
        // Held when the queue closes (shutdown): committed before the writer returns.
        let (h2, stats2, t2, _) = {
            drop(h);
            t.join().unwrap();
            start(dir.path(), Duration::from_secs(3600))
        };
        h2.submit(batch("udp", 5), false).unwrap();
        drop(h2);
        t2.join().unwrap();
        assert_eq!(stats2.commits.load(Ordering::Relaxed), 1);
        assert_eq!(stored(dir.path()), 11, "nothing held is lost at shutdown");
    }

    #[test]
    fn zero_interval_commits_every_batch_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (h, stats, t, _) = start(dir.path(), Duration::ZERO);
        h.submit(batch("udp", 1), false).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while stats.commits.load(Ordering::Relaxed) == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(stored(dir.path()), 1);
        drop(h);
        t.join().unwrap();
    }
}
