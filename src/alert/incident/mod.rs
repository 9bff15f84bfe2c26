//! Incidents: when an alert instance fires, [`open`] takes the spike-triage snapshot and
//! stores it with the incident (rule, labels, value, threshold, start and fire times). The
//! snapshot compares the spike window (from the minute the alert's latency left its
//! baseline to the firing, at least a minute and at most 10 minutes before the condition
//! first held; see `window.rs`) with the hour before it, through the query engine (the
//! 1-minute tier plus the raw tail), following the six-step routine: events, GPU, contention
//! (plus the top processes by CPU, sampled from `/proc` at fire time, and by GPU memory, the
//! newest collected points), input size, thermals and throttling, versions; plus the
//! wall-vs-GPU split. The GPU, contention and thermal steps compare upper values (p95; the
//! p5 of clocks), so a spike shorter than its window still shows. Findings are ranked by how
//! far each moved from its baseline, the likely cause first (see `snapshot.rs` for the
//! scores), and each states the interval it compared.
//!
//! Files: `window.rs` (where the window starts), `gather.rs` (the reads: spans through the
//! engine, events, GPU processes),
//! `routine.rs` (the six steps and the measurement names they read), `snapshot.rs` (the
//! snapshot's shape, the scores and sentences, the ranking; pure), `procs.rs` (the CPU
//! sample of `/proc`). The rows are `store::incidents`. This module never writes points,
//! never evaluates rules and never sends anything: the evaluator calls [`prepare`] and stores
//! the incident with the instance's state (one transaction, so one firing has one incident);
//! notifiers only carry its URL and its explanation (`explain.rs`: the annotations and the
//! `edgewatch_incident` point, built here and put in the outbox entry and the ingest queue
//! by the evaluator).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::event::{AlertEvent, Firing};
use crate::rollup::{Plan, RetentionConfig, RollupConfig};
use crate::store::{incidents, Mode, Reader};

pub mod explain;
mod gather;
pub(crate) mod procs;
mod routine;
pub mod snapshot;
pub mod view;
pub mod window;

pub use snapshot::{Finding, Snapshot, Span, Step};

const NS: i64 = 1_000_000_000;
/// The window starts at most this long before the condition first held.
pub const LEAD_NS: i64 = 600 * NS;
/// Events are read from this long before the window (a restart just before the latency
/// rose is its likely cause).
pub const EVENT_LEAD_NS: i64 = 120 * NS;
/// The baseline: this long before the window.
pub const BASELINE_NS: i64 = 3600 * NS;
/// Processes listed per kind.
pub const TOP_PROCESSES: usize = 5;

/// Why an incident could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum IncidentError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// A query of the snapshot failed.
    #[error("incident snapshot query: {0}")]
    Engine(#[from] crate::engine::EngineError),
    /// The rollup plan is invalid.
    #[error("incident snapshot plan: {0}")]
    Plan(String),
    /// The snapshot did not serialize.
    #[error("incident snapshot: {0}")]
    Json(#[from] serde_json::Error),
}

/// How [`open_with`] reads.
#[derive(Debug, Clone)]
pub struct Options {
    /// Tiers, as the agent's `[rollup]` configures them (a tier the store does not hold is
    /// read from raw points, so the built-in default is always correct, if slower).
    pub plan: Plan,
    /// Where processes are read (`/proc`).
    pub proc_dir: PathBuf,
    /// Between the two reads of the processes' CPU time.
    pub cpu_sample: Duration,
}

impl Options {
    /// The built-in tiers, `/proc`, a 250 ms CPU sample.
    pub fn new() -> Result<Options, IncidentError> {
        Ok(Options {
            plan: Plan::new(&RollupConfig::default(), &RetentionConfig::default())
                .map_err(|e| IncidentError::Plan(e.to_string()))?,
            proc_dir: PathBuf::from("/proc"),
            cpu_sample: Duration::from_millis(250),
        })
    }
}

/// Takes the snapshot of `firing` from the store in `data_dir` (no processes sampled).
pub fn snapshot(
    reader: &Reader,
    plan: &Plan,
    firing: &Firing,
    now_ns: i64,
) -> Result<Snapshot, IncidentError> {
    let choice = window::choose(reader, plan, firing, now_ns)?;
    let (base, win) = (choice.baseline, choice.window);
    let events_window = Span {
        from_ns: win.from_ns.saturating_sub(EVENT_LEAD_NS),
        to_ns: win.to_ns,
    };
    let g = gather::Gather {
        reader,
        plan,
        base,
        win,
        events: events_window,
        now: now_ns,
    };
    let mut found = routine::run(&g, firing)?;
    snapshot::stamp(&mut found.findings, win, Some(base));
    snapshot::stamp(&mut found.event_findings, events_window, None);
    found.findings.append(&mut found.event_findings);
    let by_gpu_mem = g.gpu_processes(TOP_PROCESSES)?;
    Ok(Snapshot {
        window: win,
        baseline: base,
        window_from: choice.from,
        window_note: choice.note,
        events_window,
        events: snapshot::event_rows(&found.events),
        scope: routine::model_scope(firing).into_iter().collect(),
        findings: snapshot::rank(found.findings),
        split: found.split,
        processes: snapshot::Processes {
            by_cpu: Vec::new(),
            by_gpu_mem,
        },
        checked: found.checked,
    })
}

/// Takes the triage snapshot for `firing` and stores the incident in the store under
/// `data_dir`; returns its id. Blocking: call it from the blocking pool. `now_ns` is the
/// evaluation time. (The evaluator does not call this: it [`prepare`]s the snapshot and
/// stores the incident in the transaction that records the alert's state.)
pub fn open(data_dir: &Path, firing: &Firing, now_ns: i64) -> Result<Option<i64>, IncidentError> {
    open_with(data_dir, &Options::new()?, firing, now_ns)
}

/// [`open`] with the agent's tiers and a chosen proc directory.
pub fn open_with(
    data_dir: &Path,
    opts: &Options,
    firing: &Firing,
    now_ns: i64,
) -> Result<Option<i64>, IncidentError> {
    let draft = prepare(data_dir, opts, firing, now_ns, "")?;
    let (conn, path) = crate::store::open(data_dir, Mode::Cursor)?;
    let id = incidents::insert(
        &conn,
        &path,
        &incidents::NewIncident {
            rule: &firing.rule,
            labels: &firing.labels,
            value: firing.value,
            threshold: draft.threshold,
            active_since_ns: firing.active_since_ns,
            fired_ns: firing.fired_ns,
            top_finding: draft.top_finding.as_deref(),
            snapshot: &draft.snapshot,
        },
    )?;
    Ok(Some(id))
}

/// Takes the triage snapshot for `firing` (reads only): the incident's row but for what the
/// alert instance itself gives, to be stored with the instance's state
/// (`store::alerts::record`), so that a failed commit leaves no incident behind and the
/// retry opens the only one. `link_base` is the agent's base URL (see
/// [`incidents::Draft::link_base`]).
pub fn prepare(
    data_dir: &Path,
    opts: &Options,
    firing: &Firing,
    now_ns: i64,
    link_base: &str,
) -> Result<incidents::Draft, IncidentError> {
    let reader = Reader::open(data_dir)?;
    prepare_with(&reader, opts, firing, now_ns, link_base, &mut None)
}

/// [`prepare`] through `reader` (the evaluator's, inside its cycle's read snapshot), with
/// `procs` the processes sampled for an earlier incident of the same cycle, if any: the
/// incidents an evaluation opens describe the same moment, so they share one sample (each
/// sample waits `opts.cpu_sample`; eight of them held a cycle for 2 s).
pub fn prepare_with(
    reader: &Reader,
    opts: &Options,
    firing: &Firing,
    now_ns: i64,
    link_base: &str,
    procs: &mut Option<Vec<snapshot::Process>>,
) -> Result<incidents::Draft, IncidentError> {
    let started = std::time::Instant::now();
    let mut snap = snapshot(reader, &opts.plan, firing, now_ns)?;
    snap.processes.by_cpu = procs
        .get_or_insert_with(|| procs::top_by_cpu(&opts.proc_dir, opts.cpu_sample, TOP_PROCESSES))
        .clone();
    let text = serde_json::to_string(&snap)?;
    let top = snap.findings.first().map(|f| f.message.clone());
    let explanation = explain::Explanation::of(&snap);
    tracing::info!(
        rule = %firing.rule,
        findings = snap.findings.len(),
        top = top.as_deref().unwrap_or("-"),
        ms = started.elapsed().as_millis() as u64,
        "incident snapshot taken"
    );
    Ok(incidents::Draft {
        threshold: firing.threshold,
        top_finding: top,
        snapshot: text,
        link_base: link_base.to_string(),
        explanation,
    })
}

/// Names incident `id` in `event`: its `incident_id` and the `incident` annotation (the
/// incident's page under `base_url`: the agent's address, or `[alerts] external_url`; see
/// [`explain::link_base`]).
pub fn link_event(event: &mut AlertEvent, base_url: &str, id: i64) {
    event.incident_id = Some(id);
    event
        .annotations
        .insert("incident".into(), explain::link(base_url, id));
}
