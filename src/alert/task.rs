//! The evaluator task: every `[alerts] interval` it evaluates each rule
//! ([`super::observe`]), moves each instance through the state machine ([`super::eval`]),
//! takes the incident snapshot of an instance that fires ([`super::incident::prepare`]), and
//! records the evaluation's changes, their history, their notifications and the incidents
//! they open or resolve in one transaction ([`crate::store::alerts`]): a commit that fails
//! leaves no incident, and the next evaluation, making the same transitions again, opens the
//! only one (one firing, one incident). State is loaded from the store at start, so a firing
//! instance survives a restart with its original start and is neither fired again nor
//! forgotten; an incident that no firing instance names then (its alert ended while the agent
//! was down, or its rule is gone) is closed at start. The evaluation runs on the
//! blocking pool on its own connections (a reader, and a small read-write one for its rows);
//! it never writes points into the store and never delivers a notification (the notifiers
//! read the outbox). Each incident it opens or closes becomes an `edgewatch_incident` point
//! submitted to the ingest queue after the commit, like any producer's (kept and submitted
//! again at the next evaluation while the queue is full, up to [`MAX_PENDING_POINTS`]), so
//! the sinks forward it; the firing and resolved events carry the incident's explanation
//! (`findings`, `split` and the `incident` link) in their outbox entries.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio_util::sync::CancellationToken;

use super::eval::{step, Condition, Instance, Observation, State, Transition};
use super::event::{AlertEvent, EventStatus, Firing};
use super::observe::{observe, DropHistory, Inputs, Labels};
use super::rules::{fmt_value, Rule};

/// Most incidents opened in one evaluation (each takes a triage snapshot: a few queries, ~8
/// ms CPU, and the cycle's one process sample, 0.25 s); instances beyond it in the same
/// cycle fire without one.
pub const MAX_INCIDENTS_PER_CYCLE: usize = 8;
/// Most incident points held while the ingest queue is full (the oldest go first, counted
/// as dropped points).
pub const MAX_PENDING_POINTS: usize = 1000;
use super::incident::explain::{Explanation, IncidentPoint, PointState};
use super::view::{rfc3339, AlertItem, AlertsStatus, AlertsView, RuleError};
use crate::model::{Batch, Line};
use crate::queue::{IngestHandle, SubmitError};
use crate::rollup::Plan;
use crate::stats::Stats;
use crate::store::alerts::{Change, Stored};
use crate::store::{HeldView, Reader, StoreError};

/// Everything the evaluator needs, fixed at start.
#[derive(Clone)]
pub struct Setup {
    /// The rules.
    pub rules: Vec<Rule>,
    /// `[alerts] interval`.
    pub interval: std::time::Duration,
    /// The data directory.
    pub data_dir: PathBuf,
    /// Tiers (the engine's source choice).
    pub plan: Arc<Plan>,
    /// What the non-series built-ins read.
    pub inputs: Inputs,
    /// `device_id` and the `[tags]`, on every notification.
    pub identity: Vec<(String, String)>,
    /// The base of incident links: `[alerts] external_url` with the device filled in, else
    /// the agent's own (`http://` + `[http] listen`); see
    /// [`super::incident::explain::link_base`].
    pub base_url: String,
    /// Where incident points go (the ingest queue) and the counters a dropped one is counted
    /// in; `None`: no incident points (tests of the evaluator alone).
    pub points: Option<(IngestHandle, Arc<Stats>)>,
    /// The points the writer holds for its next commit: rules read them with the store's,
    /// so a cycle needs no commit to see what arrived before it. `None`: rules read the
    /// store alone (tests and benches of the evaluator).
    pub held: Option<Arc<HeldView>>,
}

/// A stable identity of an instance: FNV-1a (64 bit) of the rule name and its group labels,
/// in hex. Stable across versions and restarts (unlike `std`'s hasher).
pub fn fingerprint(rule: &str, labels: &Labels) -> String {
    let mut h = crate::hash::Fnv64::new();
    h.write(rule.as_bytes());
    for (k, v) in labels {
        h.write(&[0]);
        h.write(k.as_bytes());
        h.write(&[1]);
        h.write(v.as_bytes());
    }
    format!("{:016x}", h.finish())
}

/// One remembered instance.
#[derive(Debug, Clone)]
struct Entry {
    rule: usize,
    labels: Labels,
    instance: Instance,
}

/// The evaluator's state between evaluations.
pub struct Evaluator {
    setup: Setup,
    /// By (rule name, fingerprint).
    entries: BTreeMap<(String, String), Entry>,
    drops: DropHistory,
    reader: Reader,
    conn: Connection,
    db: PathBuf,
    evaluations: u64,
    /// Failures logged per rule (the log is rate-limited by powers of two).
    failures: BTreeMap<String, u64>,
    /// How incident snapshots read (`None`: the built-in plan did not build; no incidents).
    incident_opts: Option<super::incident::Options>,
    /// Incident points not yet taken by the ingest queue (it was full), oldest first.
    pending_points: Vec<Line>,
    /// Incident points were queued by the last evaluation: [`run`] has them committed at
    /// once, so the sinks carry them to the centre without waiting out the writer's hold.
    queued_points: bool,
    /// Cancelled when the evaluator is stopped (a reload): an evaluation in progress stops
    /// between rules and records nothing.
    cancel: CancellationToken,
    /// Rollup rows kept across evaluations ([`crate::engine::rowcache`]); `None`: off.
    rows: Option<crate::engine::rowcache::RowCache>,
}

impl Evaluator {
    /// Opens its connections, loads the stored instances (of rules that still exist) and
    /// closes, as resolved at `now`, every open incident that none of them names while
    /// firing: its alert ended while the agent was down (a crash after the resolve was
    /// recorded and before an older version closed the incident, a state commit that never
    /// happened, a rule removed from the configuration).
    pub fn open(setup: Setup, now: i64) -> Result<Evaluator, StoreError> {
        let reader = Reader::open(&setup.data_dir)?;
        let (mut conn, db) = crate::store::open(&setup.data_dir, crate::store::Mode::Cursor)?;
        let mut entries = BTreeMap::new();
        for s in crate::store::alerts::load(&conn, &db)? {
            match setup.rules.iter().position(|r| r.name == s.rule) {
                Some(rule) => {
                    entries.insert(
                        (s.rule, s.fingerprint),
                        Entry {
                            rule,
                            labels: s.labels,
                            instance: s.instance,
                        },
                    );
                }
                None => tracing::info!(
                    rule = %s.rule,
                    "a stored alert instance belongs to a rule no longer configured; ignored"
                ),
            }
        }
        let keep: Vec<i64> = entries
            .values()
            .filter(|e| e.instance.state == State::Firing)
            .filter_map(|e| e.instance.incident_id)
            .collect();
        let closed = crate::store::incidents::close_unreferenced(&mut conn, &db, &keep, now)?;
        let mut pending_points = Vec::new();
        if !closed.is_empty() {
            tracing::info!(
                incidents = ?closed,
                "closed the incidents whose alerts are no longer firing (they ended while the agent was down)"
            );
            for id in &closed {
                if let Some(row) = crate::store::incidents::get(&conn, &db, *id)? {
                    let mut labels: BTreeMap<String, String> =
                        setup.identity.iter().cloned().collect();
                    labels.extend(row.labels.clone());
                    let x = Explanation::from_json(row.snapshot.as_deref().unwrap_or(""));
                    pending_points.push(
                        IncidentPoint {
                            id: row.id,
                            rule: &row.rule,
                            labels: &labels,
                            state: PointState::Resolved,
                            value: None,
                            threshold: row.threshold,
                            explanation: &x,
                            ts_ns: now,
                        }
                        .line(),
                    );
                }
            }
        }
        let incident_opts = match super::incident::Options::new() {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::warn!(error = %e, "incident snapshots are off");
                None
            }
        };
        Ok(Evaluator {
            setup,
            entries,
            drops: DropHistory::new(now),
            reader,
            conn,
            db,
            evaluations: 0,
            failures: BTreeMap::new(),
            incident_opts,
            pending_points,
            queued_points: false,
            cancel: CancellationToken::new(),
            rows: Some(Default::default()),
        })
    }

    /// Turns the cross-evaluation row cache off (every evaluation reads all its rows): what
    /// `benches/alerts.rs` compares against (`BENCH_CACHE=0`); results are the same.
    pub fn without_row_cache(mut self) -> Evaluator {
        self.rows = None;
        self
    }

    /// The labels a receiver sees for an instance of `rule`.
    fn event_labels(&self, rule: &Rule, group: &Labels) -> BTreeMap<String, String> {
        let mut l: BTreeMap<String, String> = self.setup.identity.iter().cloned().collect();
        l.extend(group.iter().map(|(k, v)| (k.clone(), v.clone())));
        l.extend(rule.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        l.insert("severity".into(), rule.severity_of(group));
        l.insert("alertname".into(), rule.name.clone());
        l
    }

    fn event(
        &self,
        rule: &Rule,
        group: &Labels,
        fp: &str,
        i: &Instance,
        status: EventStatus,
        now: i64,
    ) -> AlertEvent {
        let mut annotations = BTreeMap::new();
        annotations.insert("summary".into(), rule.render_summary(group, i.value));
        if let Some(v) = i.value {
            annotations.insert("value".into(), fmt_value(v));
        }
        let mut ev = AlertEvent {
            rule: rule.name.clone(),
            status,
            labels: self.event_labels(rule, group),
            annotations,
            starts_at_ns: i.fired_ns.or(i.active_since_ns).unwrap_or(now),
            ends_at_ns: (status == EventStatus::Resolved).then_some(now),
            value: i.value,
            incident_id: None,
            fingerprint: fp.to_string(),
        };
        if let Some(id) = i.incident_id {
            super::incident::link_event(&mut ev, &self.setup.base_url, id);
        }
        ev
    }

    /// One evaluation at `now`: every rule, every instance; returns what the readers see.
    /// At most [`MAX_INCIDENTS_PER_CYCLE`] instances that fire in it get an incident.
    pub fn evaluate(&mut self, now: i64) -> (Vec<AlertItem>, AlertsStatus) {
        match self.evaluate_or_defer(now, false) {
            Some(out) => out,
            None => (self.items(), AlertsStatus::default()),
        }
    }

    /// [`Evaluator::evaluate`]; with `may_defer`, an evaluation in which an instance fires
    /// (and would get an incident) while the writer holds points stops there and records
    /// nothing (`None`): the caller commits the held points and evaluates again, so the
    /// incident's triage snapshot, which reads the store alone, sees the points that fired it.
    /// Firing is rare; every other cycle reads the held points without a commit.
    pub fn evaluate_or_defer(
        &mut self,
        now: i64,
        may_defer: bool,
    ) -> Option<(Vec<AlertItem>, AlertsStatus)> {
        let started = Instant::now();
        let mut rule_errors = Vec::new();
        let mut next: BTreeMap<(String, String), Entry> = BTreeMap::new();
        let mut changes: Vec<Change> = Vec::new();
        // The cycle's reads in one read transaction: one snapshot for every rule, the read
        // lock taken once rather than per statement, and with it what the writer holds (no
        // commit can fall between the two). Without it, each read takes its own.
        let (snapshot, held) = match &self.setup.held {
            Some(view) => match view.snapshot_with(|| self.reader.snapshot()) {
                Ok((tx, held)) => (Ok(tx), Some(held)),
                Err(e) => (Err(e), None),
            },
            None => (self.reader.snapshot(), None),
        };
        if let Err(e) = &snapshot {
            tracing::debug!(error = %e, "alert evaluation reads without a snapshot");
        }
        let defer_incidents = may_defer && held.as_ref().is_some_and(|h| !h.is_empty());
        // Tag-set lookups shared by every rule of this cycle.
        let mut cycle =
            super::observe::Cycle::with_rows(std::mem::take(&mut self.rows)).with_held(held);
        // Rules over the same field and window share one read.
        cycle.prepare(&self.reader, &self.setup.rules);
        // A snapshot costs a few queries (and the cycle's /proc sample): a storm of instances
        // firing together (a new rule over a whole fleet of series) opens incidents for the
        // first few and fires the rest without one, rather than stalling the evaluation.
        let mut incident_budget = MAX_INCIDENTS_PER_CYCLE;
        let mut incidents_skipped = 0usize;
        // Incidents opened and the time their snapshots took (reported apart in the status).
        let (mut incidents_opened, mut incident_time) = (0u64, Duration::ZERO);
        // The processes sampled for the cycle's first incident, shared by the others.
        let mut cycle_procs = None;
        // The stored explanation and threshold of each incident its alert's resolve closes.
        let mut closing: BTreeMap<i64, (Explanation, Option<f64>)> = BTreeMap::new();
        let remembered = by_rule(&self.entries, self.setup.rules.len());
        for (ri, rule) in self.setup.rules.iter().enumerate() {
            if self.cancel.is_cancelled() {
                // Stopped: nothing of this evaluation is recorded; the next evaluator, on the
                // stored state, makes the same transitions.
                return Some((self.items(), AlertsStatus::default()));
            }
            let mine = remembered.get(ri).map_or(&[][..], Vec::as_slice);
            let observed = match observe(
                &mut cycle,
                rule,
                &self.reader,
                &self.setup.plan,
                &self.setup.inputs,
                &mut self.drops,
                now,
            ) {
                Ok(o) => {
                    self.failures.remove(&rule.name);
                    o
                }
                Err(e) => {
                    let n = self.failures.entry(rule.name.clone()).or_default();
                    *n += 1;
                    if n.is_power_of_two() {
                        tracing::warn!(rule = %rule.name, error = %e, failures = *n, "alert rule evaluation failed");
                    }
                    rule_errors.push(RuleError {
                        rule: rule.name.clone(),
                        error: e.to_string(),
                    });
                    // Keep its instances as they are until it evaluates again.
                    for (k, e) in mine {
                        next.insert((*k).clone(), (*e).clone());
                    }
                    continue;
                }
            };
            let cond = Condition {
                op: rule.op,
                threshold: rule.threshold,
                for_ns: rule.for_ns,
                keep_firing_for_ns: rule.keep_firing_for_ns,
                no_data: rule.no_data,
            };
            let mut seen: Vec<(Labels, Observation)> = observed
                .into_iter()
                .map(|(l, v)| (l, Observation::Value(v)))
                .collect();
            // Instances remembered but not seen this time: an empty window.
            for labels in unseen(mine, &seen) {
                seen.push((labels, Observation::NoData));
            }
            // No data at all under `no_data = "firing"`: the rule's own instance.
            if seen.is_empty() && rule.no_data == super::config::NoData::Firing {
                seen.push((Labels::new(), Observation::NoData));
            }
            for (labels, obs) in seen {
                let fp = fingerprint(&rule.name, &labels);
                let key = (rule.name.clone(), fp.clone());
                let prev = self
                    .entries
                    .get(&key)
                    .map(|e| e.instance.clone())
                    .unwrap_or_default();
                let (mut inst, t) = step(&prev, obs, &cond, now);
                let mut event = None;
                let mut incident = None;
                if t == Some(Transition::Firing) {
                    if defer_incidents && incident_budget > 0 && self.incident_opts.is_some() {
                        // Its snapshot is to see the held points: commit them first.
                        drop(snapshot);
                        self.rows = cycle.finish();
                        return None;
                    }
                    // Its id comes with the commit (`record` sets it in the row and event).
                    inst.incident_id = None;
                    if incident_budget > 0 {
                        incident_budget -= 1;
                        let t0 = Instant::now();
                        incident =
                            self.prepare_incident(rule, &labels, &inst, now, &mut cycle_procs);
                        incident_time += t0.elapsed();
                        incidents_opened += u64::from(incident.is_some());
                    } else {
                        incidents_skipped += 1;
                    }
                    let mut ev = self.event(rule, &labels, &fp, &inst, EventStatus::Firing, now);
                    if let Some(d) = &incident {
                        d.explanation.annotate(&mut ev);
                    }
                    event = Some(ev);
                } else if t == Some(Transition::Resolved) {
                    let fired = prev_merged(&prev, &inst);
                    let mut ev = self.event(rule, &labels, &fp, &fired, EventStatus::Resolved, now);
                    if let Some(id) = fired.incident_id {
                        let (x, threshold) = self.stored_explanation(id);
                        x.annotate(&mut ev);
                        closing.insert(id, (x, threshold));
                    }
                    event = Some(ev);
                }
                // Rows change on a transition; a firing instance's row also follows the last
                // time its condition held when `keep_firing_for` needs that across a restart.
                // Nothing else is rewritten per evaluation (measured: upserting every active
                // row each cycle was most of a cycle with hundreds firing, benches/alerts.rs).
                let refresh = inst.state == State::Firing
                    && rule.keep_firing_for_ns > 0
                    && inst.last_true_ns != prev.last_true_ns;
                if t.is_some() || refresh {
                    changes.push(Change {
                        stored: Stored {
                            rule: rule.name.clone(),
                            fingerprint: fp.clone(),
                            labels: labels.clone(),
                            instance: inst.clone(),
                        },
                        transition: t,
                        event,
                        incident,
                    });
                }
                // Inactive instances are shown while they have data; dropped once they have
                // none.
                if inst.state != State::Inactive || matches!(obs, Observation::Value(_)) {
                    next.insert(
                        key,
                        Entry {
                            rule: ri,
                            labels,
                            instance: inst,
                        },
                    );
                }
            }
        }
        drop(snapshot);
        self.rows = cycle.finish();
        if incidents_skipped > 0 {
            tracing::warn!(
                skipped = incidents_skipped,
                opened = MAX_INCIDENTS_PER_CYCLE,
                "more instances fired in one evaluation than incidents are opened per cycle; the rest fire without an incident"
            );
        }
        let store_error = match crate::store::alerts::record(
            &mut self.conn,
            &self.db,
            &mut changes,
            now,
        ) {
            Ok(()) => {
                // The incidents opened in the commit.
                for c in changes.iter().filter(|c| c.incident.is_some()) {
                    let key = (c.stored.rule.clone(), c.stored.fingerprint.clone());
                    if let Some(e) = next.get_mut(&key) {
                        e.instance.incident_id = c.stored.instance.incident_id;
                    }
                    tracing::info!(
                        id = c.stored.instance.incident_id,
                        rule = %c.stored.rule,
                        "incident opened"
                    );
                }
                self.incident_points(&changes, &closing, now);
                self.entries = next;
                None
            }
            Err(e) => {
                // The state stays as it was and no incident was stored: the next evaluation
                // makes the same transitions again and records them (and opens the incident)
                // then.
                tracing::warn!(error = %e, "cannot record alert state; retrying next evaluation");
                Some(e.to_string())
            }
        };
        self.submit_points();
        self.evaluations += 1;
        let items = self.items();
        let status = AlertsStatus {
            rules: self.setup.rules.len() as u64,
            firing: items.iter().filter(|i| i.state == "firing").count() as u64,
            pending: items.iter().filter(|i| i.state == "pending").count() as u64,
            evaluations: self.evaluations,
            last_evaluation_ns: Some(now),
            last_duration_ms: Some(started.elapsed().as_secs_f64() * 1000.0),
            last_incidents: incidents_opened,
            last_incidents_ms: incident_time.as_secs_f64() * 1000.0,
            rule_errors,
            store_error,
            active: items
                .iter()
                .filter(|i| i.state != "inactive")
                .cloned()
                .collect(),
        };
        Some((items, status))
    }

    /// The explanation and threshold of stored incident `id` (for its resolve); a read that
    /// fails gives an empty explanation (the resolve still goes, with its link).
    fn stored_explanation(&self, id: i64) -> (Explanation, Option<f64>) {
        match crate::store::incidents::get(&self.conn, &self.db, id) {
            Ok(Some(row)) => (
                Explanation::from_json(row.snapshot.as_deref().unwrap_or("")),
                row.threshold,
            ),
            Ok(None) => (Explanation::default(), None),
            Err(e) => {
                tracing::warn!(id, error = %e, "cannot read the incident being closed; its resolve goes without its findings");
                (Explanation::default(), None)
            }
        }
    }

    /// Queues the points of the incidents opened and closed by the committed `changes`.
    fn incident_points(
        &mut self,
        changes: &[Change],
        closing: &BTreeMap<i64, (Explanation, Option<f64>)>,
        now: i64,
    ) {
        if self.setup.points.is_none() {
            return;
        }
        let none = (Explanation::default(), None);
        for c in changes {
            let (Some(ev), Some(id)) = (
                &c.event,
                c.stored
                    .instance
                    .incident_id
                    .or_else(|| c.event.as_ref().and_then(|e| e.incident_id)),
            ) else {
                continue;
            };
            let (state, explanation, threshold) = match (&c.incident, c.transition) {
                (Some(d), Some(Transition::Firing)) => {
                    (PointState::Open, &d.explanation, d.threshold)
                }
                (_, Some(Transition::Resolved)) => {
                    let (x, t) = closing.get(&id).unwrap_or(&none);
                    (PointState::Resolved, x, *t)
                }
                _ => continue,
            };
            self.pending_points.push(
                IncidentPoint {
                    id,
                    rule: &c.stored.rule,
                    labels: &ev.labels,
                    state,
                    value: c.stored.instance.value,
                    threshold,
                    explanation,
                    ts_ns: now,
                }
                .line(),
            );
        }
    }

    /// Submits the incident points waiting; while the queue is full they wait for the next
    /// evaluation (at most [`MAX_PENDING_POINTS`]: the oldest beyond go, counted as dropped).
    fn submit_points(&mut self) {
        let Some((handle, stats)) = &self.setup.points else {
            self.pending_points.clear();
            return;
        };
        if self.pending_points.is_empty() {
            return;
        }
        let over = self.pending_points.len().saturating_sub(MAX_PENDING_POINTS);
        if over > 0 {
            self.pending_points.drain(..over);
            Stats::add(&stats.points_dropped, over as u64);
            tracing::warn!(
                dropped = over,
                "incident points dropped: the ingest queue stayed full"
            );
        }
        let lines = std::mem::take(&mut self.pending_points);
        let n = lines.len();
        match handle.submit(
            Batch {
                lines: lines.clone(),
            },
            false,
        ) {
            Ok(_) => {
                self.queued_points = true;
                tracing::debug!(points = n, "incident points queued");
            }
            Err(SubmitError::Full { .. }) => {
                tracing::debug!(
                    points = n,
                    "ingest queue full: incident points wait for the next evaluation"
                );
                self.pending_points = lines;
            }
            Err(SubmitError::Closed) => {}
        }
    }

    /// Takes the snapshot of the incident of an instance that fires (stored with its state);
    /// a failure is logged and the alert goes on without one.
    fn prepare_incident(
        &self,
        rule: &Rule,
        labels: &Labels,
        i: &Instance,
        now: i64,
        procs: &mut Option<Vec<super::incident::snapshot::Process>>,
    ) -> Option<crate::store::incidents::Draft> {
        let (measurement, field) = rule.measurement_field();
        let mut tags = rule.tag_filter();
        tags.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        let firing = Firing {
            rule: rule.name.clone(),
            labels: labels.clone(),
            measurement,
            field,
            tags,
            window_ns: match &rule.watch {
                super::rules::Watch::Series(s) => Some(s.window_ns),
                super::rules::Watch::GpuTempMargin { window_ns }
                | super::rules::Watch::DroppedPoints { window_ns } => Some(*window_ns),
                _ => None,
            },
            value: i.value,
            threshold: Some(rule.threshold),
            active_since_ns: i.active_since_ns.unwrap_or(now),
            fired_ns: now,
        };
        let opts = match &self.incident_opts {
            Some(o) => o,
            None => {
                tracing::warn!(rule = %rule.name, "no incident options; the alert fires without an incident");
                return None;
            }
        };
        match super::incident::prepare_with(
            &self.reader,
            opts,
            &firing,
            now,
            &self.setup.base_url,
            procs,
        ) {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!(rule = %rule.name, error = %e, "cannot take the incident snapshot; the alert fires without an incident");
                None
            }
        }
    }

    /// What the readers see: every remembered instance, and one inactive line per rule that
    /// has none.
    fn items(&self) -> Vec<AlertItem> {
        let mut out = Vec::new();
        let remembered = by_rule(&self.entries, self.setup.rules.len());
        for (ri, rule) in self.setup.rules.iter().enumerate() {
            let mut any = false;
            for (_, e) in remembered.get(ri).map_or(&[][..], Vec::as_slice) {
                any = true;
                let mut labels = e.labels.clone();
                labels.extend(rule.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
                labels.insert("severity".into(), rule.severity_of(&e.labels));
                out.push(AlertItem {
                    name: rule.name.clone(),
                    state: e.instance.state.as_str().into(),
                    labels,
                    value: e.instance.value,
                    active_since: (e.instance.state != State::Inactive)
                        .then_some(e.instance.active_since_ns)
                        .flatten()
                        .map(rfc3339),
                    incident_id: e.instance.incident_id,
                    builtin: rule.builtin,
                });
            }
            if !any {
                let mut labels = rule.labels.clone();
                labels.insert("severity".into(), rule.severity.clone());
                out.push(AlertItem {
                    name: rule.name.clone(),
                    state: "inactive".into(),
                    labels,
                    value: None,
                    active_since: None,
                    incident_id: None,
                    builtin: rule.builtin,
                });
            }
        }
        out
    }
}

/// A remembered instance: its key (rule name, fingerprint) and entry.
type Remembered<'a> = (&'a (String, String), &'a Entry);

/// The remembered instances of each rule (by its index), in their key order: one pass over
/// them per cycle, where filtering them per rule grew with rules x instances.
fn by_rule(entries: &BTreeMap<(String, String), Entry>, rules: usize) -> Vec<Vec<Remembered<'_>>> {
    let mut out: Vec<Vec<Remembered<'_>>> = (0..rules).map(|_| Vec::new()).collect();
    for (k, e) in entries {
        if let Some(v) = out.get_mut(e.rule) {
            v.push((k, e));
        }
    }
    out
}

/// The labels of the remembered instances (in their order) that are not among `seen`: one
/// set lookup each, where scanning `seen` for each grew with the square of instances.
fn unseen(remembered: &[Remembered<'_>], seen: &[(Labels, Observation)]) -> Vec<Labels> {
    let have: std::collections::HashSet<&Labels> = seen.iter().map(|(l, _)| l).collect();
    remembered
        .iter()
        .filter(|(_, e)| !have.contains(&e.labels))
        .map(|(_, e)| e.labels.clone())
        .collect()
}

/// The resolved event reports the instance as it fired (its start, its incident) with the
/// value that resolved it.
fn prev_merged(prev: &Instance, now: &Instance) -> Instance {
    Instance {
        value: now.value,
        ..prev.clone()
    }
}

/// Runs the evaluator until `stop` is cancelled.
pub async fn run(setup: Setup, view: Arc<AlertsView>, stop: CancellationToken) {
    let interval = setup.interval;
    let opened = tokio::task::spawn_blocking(move || Evaluator::open(setup, crate::now_ns())).await;
    let mut ev = match opened {
        Ok(Ok(ev)) => ev,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "alert evaluator cannot open the store; alerts are off");
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "alert evaluator failed to start; alerts are off");
            return;
        }
    };
    // Restarted by a live reload: the count goes on.
    ev.evaluations = view.status().evaluations;
    ev.cancel = stop.clone();
    let mut ticker = crate::periodic::Ticker::new(interval);
    let ingest = ev.setup.points.as_ref().map(|(h, _)| h.clone());
    let reads_held = ev.setup.held.is_some();
    while ticker.next(&stop).await.is_some() {
        // Rules see every point received before the cycle, held ones included: they read
        // what the writer holds with the store (`Setup::held`), so the cycle costs the store
        // no commit.
        let mut may_defer = reads_held && ingest.is_some();
        loop {
            // The evaluation runs whole on the blocking pool; cancelling the wait for it
            // would not stop it, so it is awaited to the end (one evaluation is short).
            let done = tokio::task::spawn_blocking(move || {
                let out = ev.evaluate_or_defer(crate::now_ns(), may_defer);
                (ev, out)
            })
            .await;
            match done {
                Ok(_) if stop.is_cancelled() => return,
                Ok((back, Some((items, status)))) => {
                    ev = back;
                    view.set(items, status);
                    if std::mem::take(&mut ev.queued_points) {
                        if let Some(h) = &ingest {
                            h.settle().await;
                        }
                    }
                    break;
                }
                Ok((back, None)) => {
                    // An instance fires: its incident's snapshot reads the store, so the
                    // held points are committed first, and the cycle runs again.
                    ev = back;
                    if let Some(h) = &ingest {
                        h.settle().await;
                    }
                    may_defer = false;
                }
                Err(e) => {
                    tracing::error!(error = %e, "alert evaluation panicked; alerts are off");
                    return;
                }
            }
        }
    }
}

/// After a live reload removed rules (the evaluator stopped): resolves, as of `now`, every
/// stored instance whose rule is not in `rules`: a firing one as any resolve is recorded
/// (history, its incident closed, an outbox event saying the rule was removed), a pending one
/// as cancelled. Returns the rules whose instances were resolved.
pub fn resolve_removed(
    data_dir: &std::path::Path,
    rules: &[String],
    identity: &[(String, String)],
    base_url: &str,
    now: i64,
) -> Result<Vec<String>, StoreError> {
    let (mut conn, db) = crate::store::open(data_dir, crate::store::Mode::Cursor)?;
    let mut changes = Vec::new();
    for s in crate::store::alerts::load(&conn, &db)? {
        if rules.contains(&s.rule) {
            continue;
        }
        let prev = s.instance.clone();
        let transition = match prev.state {
            State::Firing => Some(Transition::Resolved),
            State::Pending => Some(Transition::Cancelled),
            State::Inactive => None,
        };
        let event = (prev.state == State::Firing).then(|| {
            let mut labels: BTreeMap<String, String> = identity.iter().cloned().collect();
            labels.extend(s.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            labels.insert("alertname".into(), s.rule.clone());
            let mut ev = AlertEvent {
                rule: s.rule.clone(),
                status: EventStatus::Resolved,
                labels,
                annotations: BTreeMap::from([(
                    "summary".to_string(),
                    format!("rule {} removed from the configuration", s.rule),
                )]),
                starts_at_ns: prev.fired_ns.or(prev.active_since_ns).unwrap_or(now),
                ends_at_ns: Some(now),
                value: prev.value,
                incident_id: None,
                fingerprint: s.fingerprint.clone(),
            };
            if let Some(id) = prev.incident_id {
                super::incident::link_event(&mut ev, base_url, id);
            }
            ev
        });
        changes.push(Change {
            stored: Stored {
                instance: Instance {
                    state: State::Inactive,
                    ..prev
                },
                ..s
            },
            transition,
            event,
            incident: None,
        });
    }
    crate::store::alerts::record(&mut conn, &db, &mut changes, now)?;
    let mut names: Vec<String> = changes.into_iter().map(|c| c.stored.rule).collect();
    names.dedup();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Synchronous};
    use crate::ingest::lineproto::{parse_body, Precision};
    use crate::store::{incidents, Mode, Writer};

    const S: i64 = 1_000_000_000;
    const HOT: &str = "[alerts]\nbuiltin = false\n[[alert]]\nname = \"Hot\"\nmeasurement = \"m\"\nfield = \"v\"\nagg = \"max\"\nwindow = \"20s\"\nop = \">\"\nthreshold = 5\nfor = \"0s\"\n";
    const COLD: &str = "[alerts]\nbuiltin = false\n[[alert]]\nname = \"Cold\"\nmeasurement = \"m\"\nfield = \"v\"\nagg = \"max\"\nwindow = \"20s\"\nop = \"<\"\nthreshold = -100\nfor = \"0s\"\n";

    /// The evaluator of the rules in `toml` over the store in `dir`.
    fn evaluator(dir: &std::path::Path, toml: &str, now: i64) -> Evaluator {
        evaluator_reading(dir, toml, now, None)
    }

    /// [`evaluator`], reading what a writer holds in `held`.
    fn evaluator_reading(
        dir: &std::path::Path,
        toml: &str,
        now: i64,
        held: Option<Arc<HeldView>>,
    ) -> Evaluator {
        let cfg = Config::from_toml_str(toml, "test").unwrap();
        let plan = Plan::from_config(&cfg).unwrap();
        let setup = Setup {
            rules: super::super::rules::compile(&cfg.alerts, &cfg.alert),
            interval: std::time::Duration::from_secs(1),
            data_dir: dir.to_path_buf(),
            plan: Arc::new(plan.clone()),
            inputs: Inputs {
                stats: Arc::default(),
                forward: Default::default(),
                db_path: crate::store::db_path(dir),
                max_bytes: plan.max_bytes,
                clock_floor_ns: plan.clock_floor_ns,
            },
            identity: vec![("device_id".into(), "t".into())],
            base_url: "http://127.0.0.1:9".into(),
            points: None,
            held,
        };
        Evaluator::open(setup, now).unwrap()
    }

    /// `m v=<value>` every second over the 20 s before `now`.
    fn feed(dir: &std::path::Path, value: f64, now: i64) {
        let body: String = (0..20)
            .map(|i| format!("m v={value} {}\n", now - i * S))
            .collect();
        let parsed = parse_body(&body, Precision::Nanos, now);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let mut w = Writer::open(dir, 1_000, Synchronous::Normal).unwrap();
        w.write(&[&parsed.batch]).unwrap();
    }

    fn incidents_of(dir: &std::path::Path) -> Vec<incidents::IncidentRow> {
        let (conn, path) = crate::store::open(dir, Mode::Cursor).unwrap();
        incidents::list(&conn, &path, 0, i64::MAX, 100).unwrap().0
    }

    fn firing(items: &[AlertItem], rule: &str) -> Option<i64> {
        let i = items
            .iter()
            .find(|i| i.name == rule && i.state == "firing")?;
        Some(i.incident_id.unwrap_or(-1))
    }

    /// Rules read the points the writer holds with the store's, each point once: before its
    /// commit from the view, after it from the store. With points held, an instance that
    /// fires stops the evaluation unrecorded (its incident's snapshot reads the store: the
    /// caller commits first); without the deferral it fires with its incident.
    #[test]
    fn rules_count_held_points_once_and_a_firing_defers_to_their_commit() {
        const COUNT: &str = "[alerts]\nbuiltin = false\n[[alert]]\nname = \"Busy\"\nmeasurement = \"m\"\nfield = \"v\"\nagg = \"count\"\nwindow = \"20s\"\nop = \">\"\nthreshold = 7\nfor = \"0s\"\n";
        let dir = tempfile::tempdir().unwrap();
        let now = crate::now_ns();
        let view = Arc::new(HeldView::new());
        let mut w = Writer::open(dir.path(), 1_000, Synchronous::Normal).unwrap();
        w.keep_held(view.clone());
        let batch = |from: i64| {
            let body: String = (from..from + 5)
                .map(|i| format!("m v=1 {}\n", now - i * S))
                .collect();
            let parsed = parse_body(&body, Precision::Nanos, now);
            assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
            parsed.batch
        };
        // Five points stored, five held (as the writer thread holds them).
        w.write(&[&batch(0)]).unwrap();
        let held: Vec<Arc<crate::store::Staged>> = w
            .stage(&[&batch(5)])
            .unwrap()
            .into_iter()
            .map(|(_, s)| Arc::new(s))
            .collect();
        for s in &held {
            view.hold(s.clone());
        }
        let value = |items: &[AlertItem]| {
            items
                .iter()
                .find(|i| i.name == "Busy")
                .and_then(|i| i.value)
        };

        // The store alone has five: not firing.
        let mut blind = evaluator(dir.path(), COUNT, now);
        let (items, _) = blind.evaluate(now);
        assert_eq!(value(&items), Some(5.0));
        assert_eq!(firing(&items, "Busy"), None);

        // With the held five it fires; deferring, nothing is recorded.
        let mut ev = evaluator_reading(dir.path(), COUNT, now, Some(view.clone()));
        assert!(ev.evaluate_or_defer(now, true).is_none());
        assert!(incidents_of(dir.path()).is_empty());
        let (conn, path) = crate::store::open(dir.path(), Mode::Cursor).unwrap();
        assert!(crate::store::alerts::history(&conn, &path, 0, i64::MAX, 10)
            .unwrap()
            .is_empty());
        let (items, _) = ev.evaluate_or_defer(now, false).unwrap();
        assert_eq!(value(&items), Some(10.0));
        assert!(firing(&items, "Busy").is_some(), "{items:?}");
        assert_eq!(incidents_of(dir.path()).len(), 1);

        // Committed, the held points leave the view as they reach the store: still ten.
        w.commit(held.iter().map(|s| &**s)).unwrap();
        assert_eq!(view.points(), 0);
        let (items, _) = ev.evaluate_or_defer(now + 1, true).unwrap();
        assert_eq!(value(&items), Some(10.0));
        let (items, _) = blind.evaluate(now + 1);
        assert_eq!(value(&items), Some(10.0));
    }

    /// A stopped evaluator (a reload) abandons its evaluation between rules and records
    /// nothing; the next one, on the same store, makes the transition once.
    #[test]
    fn a_cancelled_evaluation_records_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::now_ns();
        feed(dir.path(), 10.0, now);
        let mut ev = evaluator(dir.path(), HOT, now);
        ev.cancel.cancel();
        ev.evaluate(now);
        let (conn, path) = crate::store::open(dir.path(), Mode::Cursor).unwrap();
        assert!(crate::store::alerts::history(&conn, &path, 0, i64::MAX, 10)
            .unwrap()
            .is_empty());
        assert!(crate::store::alerts::load(&conn, &path).unwrap().is_empty());
        let mut next = evaluator(dir.path(), HOT, now);
        let (items, _) = next.evaluate(now + S);
        assert!(firing(&items, "Hot").is_some(), "{items:?}");
        let h = crate::store::alerts::history(&conn, &path, 0, i64::MAX, 10).unwrap();
        assert_eq!(h.len(), 1, "{h:?}");
    }

    /// The state commit of a firing fails (after the snapshot was taken): no incident is
    /// left, and the next evaluation, which records the firing, opens the only one; its id
    /// is the instance's, the history's and the notification's.
    #[test]
    fn a_failed_state_commit_opens_no_second_incident() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::now_ns();
        feed(dir.path(), 10.0, now);
        let mut ev = evaluator(dir.path(), HOT, now);
        let (conn, path) = crate::store::open(dir.path(), Mode::Cursor).unwrap();
        crate::store::alerts::fail_commits(&conn, true);
        let (_, status) = ev.evaluate(now);
        assert!(
            status
                .store_error
                .as_deref()
                .unwrap_or("")
                .contains("injected failure"),
            "{:?}",
            status.store_error
        );
        crate::store::alerts::fail_commits(&conn, false);
        let (items, status) = ev.evaluate(now + S);
        assert_eq!(status.store_error, None);
        let rows = incidents_of(dir.path());
        assert_eq!(rows.len(), 1, "one firing, one incident: {rows:?}");
        let id = rows[0].id;
        assert_eq!(firing(&items, "Hot"), Some(id));
        assert_eq!(rows[0].resolved_ns, None);
        // The history and the notification name it.
        let h = crate::store::alerts::history(&conn, &path, 0, i64::MAX, 10).unwrap();
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h[0].incident_id, Some(id));
        let ev_text: String = conn
            .query_row("SELECT event FROM alert_outbox", [], |r| r.get(0))
            .unwrap();
        let event: AlertEvent = serde_json::from_str(&ev_text).unwrap();
        assert_eq!(event.incident_id, Some(id));
        assert_eq!(
            event.annotations["incident"],
            format!("http://127.0.0.1:9/#/incidents/{id}")
        );
        // Later evaluations keep it, and the resolve closes it in the same commit.
        let (items, _) = ev.evaluate(now + 2 * S);
        assert_eq!(firing(&items, "Hot"), Some(id));
        feed(dir.path(), 1.0, now + 30 * S);
        let (items, status) = ev.evaluate(now + 30 * S);
        assert_eq!(status.store_error, None);
        assert_eq!(firing(&items, "Hot"), None);
        let rows = incidents_of(dir.path());
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].resolved_ns, Some(now + 30 * S));
    }

    /// A storm: ten instances fire in one evaluation. The first `MAX_INCIDENTS_PER_CYCLE`
    /// get an incident, the rest fire without one, and the cycle's incidents share one
    /// process sample (each waits 0.25 s; one each held a cycle of eight for 2 s). The status
    /// counts them.
    #[test]
    fn a_storm_opens_a_bounded_number_of_incidents_that_share_one_process_sample() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::now_ns();
        let body: String = (0..10)
            .flat_map(|h| (0..20).map(move |i| format!("m,host=h{h} v=10 {}\n", now - i * S)))
            .collect();
        let parsed = parse_body(&body, Precision::Nanos, now);
        let mut w = Writer::open(dir.path(), 1_000, Synchronous::Normal).unwrap();
        w.write(&[&parsed.batch]).unwrap();
        drop(w);
        let toml = HOT.replace("for = \"0s\"\n", "for = \"0s\"\ngroup_by = [\"host\"]\n");
        let mut ev = evaluator(dir.path(), &toml, now);
        let before = super::super::incident::procs::SAMPLES.with(|c| c.get());
        let (items, status) = ev.evaluate(now);
        let samples = super::super::incident::procs::SAMPLES.with(|c| c.get()) - before;
        assert_eq!(status.store_error, None);
        let fired: Vec<Option<i64>> = items
            .iter()
            .filter(|i| i.name == "Hot" && i.state == "firing")
            .map(|i| i.incident_id)
            .collect();
        assert_eq!(fired.len(), 10, "{items:?}");
        assert_eq!(
            fired.iter().filter(|i| i.is_some()).count(),
            MAX_INCIDENTS_PER_CYCLE
        );
        assert_eq!(status.last_incidents, MAX_INCIDENTS_PER_CYCLE as u64);
        assert!(status.last_incidents_ms > 0.0);
        assert_eq!(samples, 1, "one process sample for the cycle's incidents");
        assert_eq!(incidents_of(dir.path()).len(), MAX_INCIDENTS_PER_CYCLE);
        // The next cycle opens none (nothing new fires) and takes no sample.
        let (_, status) = ev.evaluate(now + S);
        assert_eq!(status.last_incidents, 0);
        assert_eq!(
            super::super::incident::procs::SAMPLES.with(|c| c.get()) - before,
            1
        );
    }

    /// An incident no firing instance names at the evaluator's start is closed then: left
    /// open by a crash between the commit that recorded its alert's resolve (or a state
    /// commit that failed) and the incident's own update, as older versions did; or its
    /// rule removed while the agent was down. The incident of an instance still firing stays
    /// open.
    #[test]
    fn incidents_whose_alerts_ended_while_down_are_closed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::now_ns();
        feed(dir.path(), 10.0, now);
        // Hot fires, with its incident, and the agent stops.
        let mut ev = evaluator(dir.path(), HOT, now);
        let (items, _) = ev.evaluate(now);
        let hot = firing(&items, "Hot").expect("Hot fires");
        assert!(hot > 0);
        drop(ev);
        // An incident left by an older version that crashed before recording its state.
        let orphan = {
            let (conn, path) = crate::store::open(dir.path(), Mode::Cursor).unwrap();
            incidents::insert(
                &conn,
                &path,
                &incidents::NewIncident {
                    rule: "Hot",
                    labels: &Labels::new(),
                    value: Some(10.0),
                    threshold: Some(5.0),
                    active_since_ns: now - 60 * S,
                    fired_ns: now - 60 * S,
                    top_finding: None,
                    snapshot: "{}",
                },
            )
            .unwrap()
        };
        // Restarted with the same rule: only the orphan is closed; Hot still fires.
        let ev = evaluator(dir.path(), HOT, now + S);
        let rows = incidents_of(dir.path());
        let resolved = |id: i64| rows.iter().find(|r| r.id == id).unwrap().resolved_ns;
        assert_eq!(resolved(orphan), Some(now + S));
        assert_eq!(resolved(hot), None);
        drop(ev);
        // Restarted without the rule: its alert is gone, and so is its incident.
        let mut ev = evaluator(dir.path(), COLD, now + 2 * S);
        let rows = incidents_of(dir.path());
        assert_eq!(
            rows.iter().find(|r| r.id == hot).unwrap().resolved_ns,
            Some(now + 2 * S)
        );
        let (items, _) = ev.evaluate(now + 3 * S);
        assert!(items.iter().all(|i| i.name != "Hot"), "{items:?}");
    }

    /// The keys and `state` of the incident points in the queue's waiting requests.
    fn queued_points(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<crate::queue::Request>,
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while let Ok(r) = rx.try_recv() {
            for l in &r.batch.lines {
                let state = l
                    .fields
                    .iter()
                    .find(|f| f.0 == "state")
                    .map(|f| f.1.clone());
                if let Some(crate::model::Value::Str(s)) = state {
                    out.push((l.key.clone(), s));
                }
            }
        }
        out
    }

    /// An incident opened and resolved becomes two `edgewatch_incident` points in the ingest
    /// queue; while the queue is full they wait (nothing lost) and go at the next
    /// evaluation. Both outbox events carry `findings` and the link.
    #[test]
    fn incident_points_go_through_the_queue_and_wait_while_it_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::now_ns();
        feed(dir.path(), 10.0, now);
        let mut ev = evaluator(dir.path(), HOT, now);
        let (handle, mut rx) = crate::queue::channel(1);
        let stats = Arc::new(Stats::default());
        ev.setup.points = Some((handle.clone(), stats.clone()));
        // The queue is full: its one permit is held by a waiting batch.
        let blocker = Batch {
            lines: vec![Line {
                key: "x".into(),
                fields: vec![("v".into(), crate::model::Value::F64(1.0))],
                ts: 1,
                line_no: 0,
            }],
        };
        handle.submit(blocker, false).unwrap();
        let (items, _) = ev.evaluate(now);
        let id = firing(&items, "Hot").expect("fires");
        assert_eq!(ev.pending_points.len(), 1, "kept while the queue is full");
        assert_eq!(
            queued_points(&mut rx),
            vec![],
            "only the blocker was queued"
        );
        // The writer took the blocker (its permit is back): the point goes next time.
        ev.evaluate(now + S);
        assert!(ev.pending_points.is_empty());
        assert_eq!(
            queued_points(&mut rx),
            vec![(
                "edgewatch_incident,device_id=t,rule=Hot,severity=warning".to_string(),
                "open".to_string()
            )]
        );
        feed(dir.path(), 1.0, now + 30 * S);
        ev.evaluate(now + 30 * S);
        assert_eq!(
            queued_points(&mut rx),
            vec![(
                "edgewatch_incident,device_id=t,rule=Hot,severity=warning".to_string(),
                "resolved".to_string()
            )]
        );
        assert_eq!(Stats::get(&stats.points_dropped), 0);
        let (conn, _) = crate::store::open(dir.path(), Mode::Cursor).unwrap();
        let mut st = conn
            .prepare("SELECT event FROM alert_outbox ORDER BY seq")
            .unwrap();
        let events: Vec<AlertEvent> = st
            .query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .map(|t| serde_json::from_str(&t.unwrap()).unwrap())
            .collect();
        assert_eq!(events.len(), 2);
        for e in &events {
            assert!(e.annotations.contains_key("findings"), "{e:?}");
            assert_eq!(
                e.annotations["incident"],
                format!("http://127.0.0.1:9/#/incidents/{id}")
            );
        }
    }

    /// The instances each rule remembers come from one pass over them (in their key order,
    /// an unknown rule's left out), and those not seen this time are found by lookup, in
    /// that order.
    #[test]
    fn remembered_instances_are_found_by_rule_then_by_labels() {
        use super::super::eval::Instance;
        let l = |v: &str| Labels::from([("host".to_string(), v.to_string())]);
        let mut entries = BTreeMap::new();
        for (rule, name, v) in [
            (0, "A", "a"),
            (0, "A", "b"),
            (1, "B", "a"),
            (0, "A", "c"),
            (7, "Gone", "x"),
        ] {
            entries.insert(
                (name.to_string(), fingerprint(name, &l(v))),
                Entry {
                    rule,
                    labels: l(v),
                    instance: Instance::default(),
                },
            );
        }
        let by = by_rule(&entries, 2);
        let hosts = |r: &[Remembered<'_>]| -> Vec<String> {
            r.iter().map(|(_, e)| e.labels["host"].clone()).collect()
        };
        let in_key_order = |rule: &str| -> Vec<String> {
            entries
                .iter()
                .filter(|((n, _), _)| n == rule)
                .map(|(_, e)| e.labels["host"].clone())
                .collect()
        };
        assert_eq!(by.len(), 2);
        assert_eq!(hosts(&by[0]), in_key_order("A"));
        assert_eq!(hosts(&by[0]).len(), 3);
        assert_eq!(hosts(&by[1]), vec!["a".to_string()]);
        let seen = vec![
            (l("b"), Observation::Value(1.0)),
            (l("z"), Observation::Value(2.0)),
        ];
        let missing: Vec<String> = unseen(&by[0], &seen)
            .iter()
            .map(|m| m["host"].clone())
            .collect();
        let want: Vec<String> = in_key_order("A").into_iter().filter(|h| h != "b").collect();
        assert_eq!(missing, want);
        assert!(unseen(&by[1], &[(l("a"), Observation::NoData)]).is_empty());
    }

    #[test]
    fn fingerprints_are_stable_and_tell_labels_apart() {
        let a = Labels::from([("model".to_string(), "a".to_string())]);
        let b = Labels::from([("model".to_string(), "b".to_string())]);
        assert_eq!(fingerprint("R", &a), fingerprint("R", &a.clone()));
        assert_ne!(fingerprint("R", &a), fingerprint("R", &b));
        assert_ne!(fingerprint("R", &a), fingerprint("S", &a));
        // Pinned: a change would orphan stored instances and re-fire them after an upgrade.
        assert_eq!(fingerprint("R", &Labels::new()), "af640f4c86024335");
    }
}
