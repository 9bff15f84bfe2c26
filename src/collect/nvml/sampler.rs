//! The collector's logic over any [`GpuSource`], as a plain state machine: which metric
//! to read on which GPU, `NotSupported` bookkeeping and hourly re-probes, lost GPUs and
//! their retries (one [`crate::backoff::Backoff`]), and the status. Time is an argument
//! (`sample(ts)`); it never sleeps, never spawns and never submits to the queue.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::Backoff;

use crate::model::Batch;

use super::catalogue::{GpuIdentity, Metric, Reading, SystemInfo};
use super::error::{NvmlInitError, ReadError};
use super::lines::readings_to_lines;
use super::source::GpuSource;
use super::status::{GpuStatus, NvmlStatus};

/// What one sample produced.
#[derive(Debug, Default)]
pub struct SampleOutcome {
    /// Lines for the ingest queue.
    pub batch: Batch,
    /// Failed readings to count in `collector_errors` (GPU lost, driver errors).
    pub errors: u64,
}

/// First retry of a lost GPU after this long, doubling up to [`MAX_BACKOFF_NS`].
pub const FIRST_BACKOFF_NS: i64 = 10_000_000_000;
/// Longest wait between retries of a lost GPU (5 minutes).
pub const MAX_BACKOFF_NS: i64 = 300_000_000_000;
/// `NotSupported` metrics are probed again this often (1 hour), silently.
pub const REPROBE_NS: i64 = 3_600_000_000_000;

/// Retries of a lost GPU: [`FIRST_BACKOFF_NS`] doubling to [`MAX_BACKOFF_NS`], no jitter
/// (one local driver: nothing to spread out).
const LOST_GPU: Backoff = Backoff::new(
    Duration::from_nanos(FIRST_BACKOFF_NS as u64),
    Duration::from_nanos(MAX_BACKOFF_NS as u64),
);

struct GpuState {
    ident: GpuIdentity,
    /// Currently skipped.
    unsupported: BTreeSet<Metric>,
    /// Ever logged as unsupported (so a re-probe logs nothing).
    announced: BTreeSet<Metric>,
    /// Other errors already logged at warn.
    warned: BTreeSet<Metric>,
    statics: HashMap<Metric, Reading>,
    lost: bool,
    /// A loss was logged at warn and no clean sample has followed: a GPU that flaps
    /// (its handle answers, its reads say lost) logs once, and its backoff keeps growing.
    lost_logged: bool,
    retry_at: i64,
    /// Failed retries since the loss was logged: the next wait is `LOST_GPU.base(attempt)`.
    attempt: u32,
    reprobe_at: Option<i64>,
    last_error: Option<String>,
}

impl GpuState {
    fn new(ident: GpuIdentity) -> GpuState {
        GpuState {
            ident,
            unsupported: BTreeSet::new(),
            announced: BTreeSet::new(),
            warned: BTreeSet::new(),
            statics: HashMap::new(),
            lost: false,
            lost_logged: false,
            retry_at: 0,
            attempt: 0,
            reprobe_at: None,
            last_error: None,
        }
    }

    /// Seconds until the next retry of this lost GPU (for the logs).
    fn retry_in_s(&self) -> u64 {
        LOST_GPU.base(self.attempt).as_secs()
    }

    fn status(&self) -> GpuStatus {
        GpuStatus {
            index: self.ident.index,
            uuid: self.ident.uuid.clone(),
            name: self.ident.name.clone(),
            arch: self.ident.arch.clone(),
            cc: self.ident.cc.clone(),
            lost: self.lost,
            last_error: self.last_error.clone(),
            unsupported: self.unsupported.iter().map(|m| m.name().into()).collect(),
        }
    }

    /// Marks the GPU lost; returns whether this loss should be logged at warn.
    fn mark_lost(&mut self, ts: i64, why: String) -> bool {
        let first = !self.lost_logged;
        self.attempt = if first {
            0
        } else {
            self.attempt.saturating_add(1)
        };
        self.lost = true;
        self.lost_logged = true;
        self.retry_at = LOST_GPU.retry_at_ns(ts, self.attempt, 0.0);
        self.last_error = Some(why);
        first
    }
}

/// The collector's logic over any [`GpuSource`]: which metric to read on which GPU,
/// `NotSupported` bookkeeping, lost GPUs and their retries, and the status.
pub struct Sampler<S: GpuSource> {
    source: S,
    processes: bool,
    system: SystemInfo,
    gpus: Vec<GpuState>,
    status: Arc<NvmlStatus>,
}

impl<S: GpuSource> Sampler<S> {
    /// Discovers the GPUs of `source`; an error when it lists none. A GPU unreachable at
    /// start is kept, marked lost, and retried.
    pub fn new(
        mut source: S,
        processes: bool,
        status: Arc<NvmlStatus>,
    ) -> Result<Sampler<S>, NvmlInitError> {
        let system = source.system();
        let count = source
            .device_count()
            .map_err(|e| NvmlInitError::Other(format!("cannot count GPUs: {e}")))?;
        if count == 0 {
            return Err(NvmlInitError::NoGpu {
                driver: if system.driver.is_empty() {
                    "unknown".into()
                } else {
                    system.driver.clone()
                },
            });
        }
        let mut gpus = Vec::new();
        for index in 0..count {
            match source.identity(index) {
                Ok(ident) => gpus.push(GpuState::new(ident)),
                Err(e) => {
                    tracing::warn!(gpu = index, error = %e, "GPU unreachable at start; retrying later");
                    let mut g = GpuState::new(GpuIdentity {
                        index,
                        ..GpuIdentity::default()
                    });
                    // Retry at the first sample.
                    g.lost = true;
                    g.lost_logged = true;
                    g.last_error = Some(e.to_string());
                    gpus.push(g);
                }
            }
        }
        let sampler = Sampler {
            source,
            processes,
            system,
            gpus,
            status,
        };
        sampler.publish();
        Ok(sampler)
    }

    /// Number of GPUs found.
    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    /// Driver and CUDA versions.
    pub fn system(&self) -> &SystemInfo {
        &self.system
    }

    /// The source (tests change the fake's readings through it); a test hook, compiled
    /// only with the fakes.
    #[cfg(any(test, feature = "test-fakes"))]
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    fn publish(&self) {
        let gpus = self.gpus.iter().map(GpuState::status).collect();
        self.status.update(&self.system, gpus);
    }

    /// Reads every GPU once; lines are stamped `ts` (Unix ns), which also drives retry and
    /// re-probe timing. Blocks for as long as the NVML calls take.
    pub fn sample(&mut self, ts: i64) -> SampleOutcome {
        let mut out = SampleOutcome::default();
        let processes = self.processes;
        for g in &mut self.gpus {
            let idx = g.ident.index;
            if g.lost {
                if ts < g.retry_at {
                    continue;
                }
                match self.source.identity(idx) {
                    Ok(ident) => {
                        // It may be another board in that slot now: forget what was cached.
                        g.ident = ident;
                        g.lost = false;
                        g.statics.clear();
                        g.unsupported.clear();
                        g.warned.clear();
                        g.reprobe_at = None;
                        g.last_error = None;
                    }
                    Err(e) => {
                        g.attempt = g.attempt.saturating_add(1);
                        g.retry_at = LOST_GPU.retry_at_ns(ts, g.attempt, 0.0);
                        g.last_error = Some(e.to_string());
                        tracing::debug!(gpu = idx, uuid = %g.ident.uuid, error = %e, retry_in_s = g.retry_in_s(), "GPU still unreachable");
                        continue;
                    }
                }
            }
            match g.reprobe_at {
                None => g.reprobe_at = Some(ts.saturating_add(REPROBE_NS)),
                Some(at) if ts >= at => {
                    g.unsupported.clear();
                    g.reprobe_at = Some(ts.saturating_add(REPROBE_NS));
                }
                Some(_) => {}
            }
            let mut readings: Vec<(Metric, Reading)> = Vec::with_capacity(Metric::ALL.len());
            let mut newly_unsupported: Vec<&'static str> = Vec::new();
            let mut mig_on = false;
            for metric in Metric::ALL {
                if (metric.is_per_process() && !processes)
                    || (metric == Metric::MigInstances && !mig_on)
                    || g.unsupported.contains(&metric)
                {
                    continue;
                }
                if let Some(r) = g.statics.get(&metric) {
                    readings.push((metric, r.clone()));
                    continue;
                }
                match self.source.read(idx, metric) {
                    Ok(r) => {
                        if let Reading::MigMode { current, .. } = r {
                            mig_on = current;
                        }
                        if metric.is_static() {
                            g.statics.insert(metric, r.clone());
                        }
                        readings.push((metric, r));
                    }
                    Err(ReadError::NotSupported) => {
                        g.unsupported.insert(metric);
                        if g.announced.insert(metric) {
                            newly_unsupported.push(metric.name());
                        }
                    }
                    Err(ReadError::GpuLost(why)) => {
                        out.errors += 1;
                        if g.mark_lost(ts, format!("{}: {why}", metric.name())) {
                            tracing::warn!(
                                gpu = idx, uuid = %g.ident.uuid, name = %g.ident.name, error = %why,
                                "GPU lost (fallen off the bus or needs a reset); still polling the other GPUs, retrying this one with backoff"
                            );
                        } else {
                            tracing::debug!(gpu = idx, uuid = %g.ident.uuid, error = %why, retry_in_s = g.retry_in_s(), "GPU lost again");
                        }
                        break;
                    }
                    Err(ReadError::Other(why)) => {
                        out.errors += 1;
                        if g.warned.insert(metric) {
                            tracing::warn!(gpu = idx, uuid = %g.ident.uuid, metric = metric.name(), error = %why, "NVML read failed (logged once per GPU and metric)");
                        } else {
                            tracing::debug!(gpu = idx, uuid = %g.ident.uuid, metric = metric.name(), error = %why, "NVML read failed");
                        }
                        g.last_error = Some(format!("{}: {why}", metric.name()));
                    }
                }
            }
            if !g.lost && g.lost_logged {
                g.lost_logged = false;
                g.attempt = 0;
                tracing::info!(gpu = idx, uuid = %g.ident.uuid, name = %g.ident.name, "GPU reachable again; sampling it");
            }
            if !newly_unsupported.is_empty() {
                tracing::info!(
                    gpu = idx, uuid = %g.ident.uuid, name = %g.ident.name,
                    "NVML does not support {} on this GPU; skipping (on Jetson, tegrastats is the source)",
                    newly_unsupported.join(", ")
                );
            }
            out.batch
                .lines
                .extend(readings_to_lines(&self.system, &g.ident, &readings, ts));
        }
        self.publish();
        out
    }
}
