//! Collectors: tasks that sample the machine on an interval and submit lines to the
//! ingest queue like any other producer. A collector never writes to the store and never
//! blocks ingest: when the queue is full its sample is dropped and counted.

pub mod config_change;
pub mod event;
pub mod gpu_mem;
pub mod health;
pub mod host;
pub mod inventory;
pub mod jetson;
pub mod kmsg;
pub mod nvml;
pub mod own_events;
pub mod process;
pub mod scrape;
pub mod tegrastats;

use std::sync::Arc;

use crate::model::Batch;
use crate::queue::{IngestHandle, SubmitError};
use crate::stats::Stats;

/// Submits a collector's sample without waiting; drops and counts it when the queue is full.
pub fn submit(handle: &IngestHandle, stats: &Arc<Stats>, batch: Batch, source: &str) {
    if batch.lines.is_empty() {
        return;
    }
    let points = batch.len() as u64;
    match handle.submit(batch, false) {
        Ok(_) => {}
        Err(SubmitError::Full { .. }) => {
            Stats::add(&stats.points_dropped, points);
            tracing::debug!(source, "ingest queue full: collector sample dropped");
        }
        Err(SubmitError::Closed) => {}
    }
}
