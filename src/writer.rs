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

use crate::queue::{Ack, Request};
use crate::stats::Stats;
use crate::store::Writer;

/// Runs the writer until the queue closes. Blocking: call from a dedicated thread.
///
/// A request someone waits on (an HTTP write, answered only once its points are committed
/// and, in `full`, synced) is committed at once, with everything waiting beside it. Points
/// nobody waits on (UDP, collectors) are held up to `flush_interval` so that seconds of
/// them share one commit: one commit (and one fsync) per interval instead of one per
/// datagram or collector tick, which is most of the pages the store writes. They are not
/// acknowledged to anyone, so holding them loses nothing promised; a crash loses at most
/// the interval of them. Zero commits every batch at once.
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
    let mut pending: Vec<Request> = Vec::new();
    let mut points = 0usize;
    let mut urgent = false;
    let mut deadline: Option<Instant> = None;
    loop {
        let next = match (deadline, &timer) {
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
                urgent |= req.ack.is_some();
                points += req.batch.len();
                pending.push(req);
                while points < max_batch_points {
                    match rx.try_recv() {
                        Ok(req) => {
                            urgent |= req.ack.is_some();
                            points += req.batch.len();
                            pending.push(req);
                        }
                        Err(_) => break,
                    }
                }
                if urgent || points >= max_batch_points || timer.is_none() {
                    commit(&mut store, &mut pending, &stats);
                    (points, urgent, deadline) = (0, false, None);
                } else if deadline.is_none() {
                    deadline = Some(Instant::now() + flush_interval);
                }
            }
            Some(Wake::Due) => {
                commit(&mut store, &mut pending, &stats);
                (points, urgent, deadline) = (0, false, None);
            }
            None => {
                if !pending.is_empty() {
                    commit(&mut store, &mut pending, &stats);
                }
                break;
            }
        }
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

fn commit(store: &mut Writer, pending: &mut Vec<Request>, stats: &Stats) {
    let started = Instant::now();
    let batches: Vec<&crate::model::Batch> = pending.iter().map(|r| &r.batch).collect();
    let result = store.write(&batches);
    let elapsed = started.elapsed();
    stats.last_commit_us.store(
        elapsed.as_micros() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    stats.commit_seconds.0.observe(elapsed.as_secs_f64());
    match result {
        Ok(summaries) => {
            Stats::add(&stats.commits, 1);
            for (req, sum) in pending.drain(..).zip(summaries) {
                Stats::add(&stats.points_written, sum.points as u64);
                Stats::add(&stats.values_written, sum.values as u64);
                Stats::add(&stats.points_rejected, sum.rejected.len() as u64);
                if req.ack.is_none() && !sum.rejected.is_empty() {
                    // Collectors and UDP have nobody to answer: log (rate-limited by the
                    // fact that the same series keeps failing the same way) and count.
                    tracing::debug!(first = %sum.rejected[0].error, count = sum.rejected.len(), "lines refused");
                }
                if let Some(ack) = req.ack {
                    let _ = ack.send(Ack::Committed {
                        rejected: sum.rejected,
                    });
                }
                // `req.permit` drops here: the queue capacity comes back.
            }
        }
        Err(e) => {
            Stats::add(&stats.commit_errors, 1);
            // A read-only store (remounted read-only after an IO error, a permission
            // change) may become writable again without a restart: retryable, like a full
            // disk. Either way nothing of these batches is acknowledged.
            let read_only = e.is_read_only();
            let retryable = e.retryable() || read_only;
            tracing::error!(error = %e, retryable, batches = pending.len(), "commit failed; nothing of these batches was stored");
            let error = if e.is_disk_full() {
                format!("store is full (disk or quota): {e}")
            } else if read_only {
                format!("store is read-only: {e}")
            } else {
                e.to_string()
            };
            for req in pending.drain(..) {
                if req.ack.is_none() {
                    Stats::add(&stats.points_dropped, req.batch.len() as u64);
                }
                if let Some(ack) = req.ack {
                    let _ = ack.send(Ack::Failed {
                        error: error.clone(),
                        retryable,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;
    use crate::model::{Batch, Line, Value};
    use crate::queue::{channel, Ack};
    use std::sync::atomic::Ordering;

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

    fn start(
        dir: &std::path::Path,
        flush: Duration,
    ) -> (
        crate::queue::IngestHandle,
        Arc<Stats>,
        std::thread::JoinHandle<()>,
    ) {
        let store = Writer::open(dir, 1000, Synchronous::Full).unwrap();
        let (h, rx) = channel(10_000);
        let stats = Arc::new(Stats::default());
        let s = stats.clone();
        let t = std::thread::spawn(move || run(store, rx, 20_000, flush, s));
        (h, stats, t)
    }

    #[test]
    fn held_points_share_the_commit_of_the_next_acknowledged_write() {
        let dir = tempfile::tempdir().unwrap();
        // An hour: nothing but the acknowledged write (or the end) can commit them.
        let (h, stats, t) = start(dir.path(), Duration::from_secs(3600));
        for _ in 0..5 {
            h.submit(batch("udp", 3), false).unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            stats.commits.load(Ordering::Relaxed),
            0,
            "held, not committed"
        );
        assert_eq!(h.queued(), 15, "held points keep their queue capacity");
        let ack = h.submit(batch("http", 2), true).unwrap().unwrap();
        let answer = ack.blocking_recv().unwrap();
        assert_eq!(answer, Ack::Committed { rejected: vec![] });
        assert_eq!(
            stats.commits.load(Ordering::Relaxed),
            1,
            "one commit for all"
        );
        assert_eq!(
            stored(dir.path()),
            17,
            "the answer came after every point was stored"
        );
        assert_eq!(h.queued(), 0);
        drop(h);
        t.join().unwrap();
    }

    #[test]
    fn held_points_are_committed_after_the_interval_and_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let (h, stats, t) = start(dir.path(), Duration::from_millis(100));
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
        let (h2, stats2, t2) = {
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
        let (h, stats, t) = start(dir.path(), Duration::ZERO);
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
