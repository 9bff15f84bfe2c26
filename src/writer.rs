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
use std::time::Instant;

use tokio::sync::mpsc::UnboundedReceiver;

use crate::queue::{Ack, Request};
use crate::stats::Stats;
use crate::store::Writer;

/// Runs the writer until the queue closes. Blocking: call from a dedicated thread.
pub fn run(
    mut store: Writer,
    mut rx: UnboundedReceiver<Request>,
    max_batch_points: usize,
    stats: Arc<Stats>,
) {
    let mut pending: Vec<Request> = Vec::new();
    while let Some(first) = rx.blocking_recv() {
        let mut points = first.batch.len();
        pending.push(first);
        while points < max_batch_points {
            match rx.try_recv() {
                Ok(req) => {
                    points += req.batch.len();
                    pending.push(req);
                }
                Err(_) => break,
            }
        }
        commit(&mut store, &mut pending, &stats);
    }
    tracing::debug!("writer: queue closed and drained");
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
