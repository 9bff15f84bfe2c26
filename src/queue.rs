//! The bounded queue between every producer (HTTP, UDP, collectors) and the single writer.
//!
//! Capacity is counted in points (lines), enforced by a semaphore whose permits
//! travel with each batch and return only after the writer has committed it, so memory is
//! bounded by what is in flight, not by what producers offer: the queue never holds more
//! than its capacity. Producers never wait: when the queue is full, `submit` fails at once
//! and the caller decides (HTTP answers 503 with `Retry-After`, UDP and collectors drop and
//! count). A batch larger than the whole capacity can never fit and is refused the same
//! way, never split (a batch is committed entirely or not at all): HTTP checks
//! [`IngestHandle::admits`] first and answers 413 naming `[ingest] queue_points`; UDP and
//! collectors drop and count it, and the queue logs it once at warn.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::model::{Batch, Rejection};

/// The writer's answer to one submitted batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Ack {
    /// Committed; the listed lines were refused (type conflict, series cap).
    Committed {
        /// Refused lines.
        rejected: Vec<Rejection>,
    },
    /// The transaction failed and nothing of the batch was stored.
    Failed {
        /// Why (e.g. disk full).
        error: String,
        /// Whether trying again later may succeed.
        retryable: bool,
    },
}

/// A batch on its way to the writer.
pub struct Request {
    /// The lines.
    pub batch: Batch,
    /// Where to send the outcome, if the producer waits for it.
    pub ack: Option<oneshot::Sender<Ack>>,
    /// Queue capacity held until the writer is done with the batch.
    pub permit: OwnedSemaphorePermit,
    /// With an empty batch and an acknowledgement: answered as soon as the writer has
    /// taken everything queued before it (held or committed), without a commit of its own
    /// ([`IngestHandle::catch_up`]). Otherwise an empty acknowledged batch is a barrier
    /// that commits what is held ([`IngestHandle::settle`]).
    pub catch_up: bool,
}

/// Why a batch was not queued.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    /// Not enough room right now (retry later), or a batch larger than the whole capacity
    /// (never fits: see [`IngestHandle::admits`]).
    #[error("ingest queue full ({queued} of {capacity} points waiting)")]
    Full {
        /// Points waiting.
        queued: usize,
        /// Capacity.
        capacity: usize,
    },
    /// The writer has stopped (shutdown).
    #[error("the agent is shutting down")]
    Closed,
}

/// The producers' end of the queue; cheap to clone.
#[derive(Clone)]
pub struct IngestHandle {
    tx: mpsc::UnboundedSender<Request>,
    permits: Arc<Semaphore>,
    capacity: usize,
    /// Whether an oversized batch was already logged (once per run).
    warned_oversized: Arc<AtomicBool>,
}

/// Creates the queue: the producers' handle and the writer's receiver.
pub fn channel(capacity_points: usize) -> (IngestHandle, mpsc::UnboundedReceiver<Request>) {
    let capacity = capacity_points.min(Semaphore::MAX_PERMITS);
    let (tx, rx) = mpsc::unbounded_channel();
    (
        IngestHandle {
            tx,
            permits: Arc::new(Semaphore::new(capacity)),
            capacity,
            warned_oversized: Arc::new(AtomicBool::new(false)),
        },
        rx,
    )
}

impl IngestHandle {
    /// Whether a batch of `points` can ever be queued: at most the capacity.
    pub fn admits(&self, points: usize) -> bool {
        points <= self.capacity
    }

    /// Queues `batch` if there is room; with `want_ack`, returns the receiver of the
    /// writer's answer. A batch the queue can never hold ([`IngestHandle::admits`] false)
    /// is refused as [`SubmitError::Full`] and the queue is left as it was.
    pub fn submit(
        &self,
        batch: Batch,
        want_ack: bool,
    ) -> Result<Option<oneshot::Receiver<Ack>>, SubmitError> {
        if !self.admits(batch.len()) {
            if !want_ack && !self.warned_oversized.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    points = batch.len(),
                    queue_points = self.capacity,
                    "a batch larger than the whole ingest queue was dropped (counted in \
                     points_dropped; logged once): raise [ingest] queue_points"
                );
            }
            return Err(SubmitError::Full {
                queued: self.queued(),
                capacity: self.capacity,
            });
        }
        // An empty batch still takes one permit: it goes through the writer like any other.
        let need = batch.len().max(1);
        let permit = match self.permits.clone().try_acquire_many_owned(need as u32) {
            Ok(p) => p,
            Err(TryAcquireError::NoPermits) => {
                return Err(SubmitError::Full {
                    queued: self.queued(),
                    capacity: self.capacity,
                })
            }
            Err(TryAcquireError::Closed) => return Err(SubmitError::Closed),
        };
        let (ack, rx) = if want_ack {
            let (t, r) = oneshot::channel();
            (Some(t), Some(r))
        } else {
            (None, None)
        };
        self.tx
            .send(Request {
                batch,
                ack,
                permit,
                catch_up: false,
            })
            .map_err(|_| SubmitError::Closed)?;
        Ok(rx)
    }

    /// Returns once everything queued before the call is committed (or its commit failed):
    /// what a reader calls for read-your-writes, since the writer holds points (UDP,
    /// collectors, and small HTTP writes once journaled) up to `[ingest] flush_interval`
    /// before their commit. Free when nothing is queued or held; otherwise an empty batch
    /// with an acknowledgement (taking no queue capacity), which the writer commits at once
    /// with everything held beside it. A closed queue returns at once: the reader sees what
    /// is committed.
    pub async fn settle(&self) {
        self.barrier(false).await
    }

    /// Returns once the writer has taken everything queued before the call: each point is
    /// then stored or held, and a reader that reads the held points with the store
    /// ([`crate::store::Reader::read_with_held`]) sees all of it. Unlike [`Self::settle`],
    /// nothing is committed for it. Free when nothing is queued or held; a closed queue
    /// returns at once.
    pub async fn catch_up(&self) {
        self.barrier(true).await
    }

    /// An empty request with an acknowledgement, taking no queue capacity (held points may
    /// fill the whole queue, and a barrier is what lets them out), answered after
    /// everything queued before it.
    async fn barrier(&self, catch_up: bool) {
        if self.queued() == 0 {
            return;
        }
        let Ok(permit) = self.permits.clone().try_acquire_many_owned(0) else {
            return;
        };
        let (ack, rx) = oneshot::channel();
        let req = Request {
            batch: Batch::default(),
            ack: Some(ack),
            permit,
            catch_up,
        };
        if self.tx.send(req).is_ok() {
            let _ = rx.await;
        }
    }

    /// Points waiting in the queue or being committed.
    pub fn queued(&self) -> usize {
        self.capacity - self.permits.available_permits()
    }

    /// Capacity in points.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Line, Value};

    fn batch(points: usize) -> Batch {
        Batch {
            lines: vec![
                Line {
                    key: "m".into(),
                    fields: vec![("f".into(), Value::F64(1.0))],
                    ts: 0,
                    line_no: 1,
                };
                points
            ],
        }
    }

    #[test]
    fn full_queue_refuses_until_the_writer_releases() {
        let (h, mut rx) = channel(10);
        h.submit(batch(6), false).unwrap();
        assert_eq!(h.queued(), 6);
        assert!(matches!(
            h.submit(batch(5), false),
            Err(SubmitError::Full { queued: 6, .. })
        ));
        let req = rx.try_recv().unwrap();
        drop(req); // the writer is done: permits come back
        assert_eq!(h.queued(), 0);
        h.submit(batch(5), false).unwrap();
    }

    #[test]
    fn a_batch_larger_than_the_queue_is_refused_and_leaves_the_queue_as_it_was() {
        let (h, mut rx) = channel(4);
        assert!(!h.admits(5));
        assert!(matches!(
            h.submit(batch(5), true),
            Err(SubmitError::Full {
                queued: 0,
                capacity: 4
            })
        ));
        assert!(h.submit(batch(9), false).is_err());
        assert_eq!(h.queued(), 0);
        assert!(rx.try_recv().is_err(), "nothing of it was queued");
        // Exactly the capacity fits an empty queue; then the queue is full.
        assert!(h.admits(4));
        h.submit(batch(4), false).unwrap();
        assert_eq!(h.queued(), 4);
        assert!(h.submit(batch(1), false).is_err());
        assert_eq!(rx.try_recv().unwrap().batch.len(), 4);
    }
}
