//! The agent's own families (`edgewatch_*`) from the typed status document, encoded with
//! the `prometheus` crate, and `ALERTS` for the pending and firing alert instances.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use prometheus::{CounterVec, GaugeVec, Opts, Registry};

use super::text::{escape, label_name};
use crate::status::{self, Status};

/// The registry of one scrape.
struct Scrape {
    reg: Registry,
    gauges: HashMap<String, GaugeVec>,
    counters: HashMap<String, CounterVec>,
}

impl Scrape {
    fn new() -> Scrape {
        Scrape {
            reg: Registry::new(),
            gauges: HashMap::new(),
            counters: HashMap::new(),
        }
    }

    /// Sets `name{labels}`; the first call of a name fixes its label names. False (and
    /// nothing set) when the name is taken by another family or the labels do not fit.
    fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: f64) -> bool {
        if !self.gauges.contains_key(name) {
            let names: Vec<&str> = labels.iter().map(|l| l.0).collect();
            let Ok(g) = GaugeVec::new(Opts::new(name, help), &names) else {
                return false;
            };
            if self.reg.register(Box::new(g.clone())).is_err() {
                return false;
            }
            self.gauges.insert(name.to_string(), g);
        }
        let values: Vec<&str> = labels.iter().map(|l| l.1).collect();
        match self.gauges[name].get_metric_with_label_values(&values) {
            Ok(m) => {
                m.set(v);
                true
            }
            Err(_) => false,
        }
    }

    fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: f64) {
        if !self.counters.contains_key(name) {
            let names: Vec<&str> = labels.iter().map(|l| l.0).collect();
            let Ok(c) = CounterVec::new(Opts::new(name, help), &names) else {
                return;
            };
            if self.reg.register(Box::new(c.clone())).is_err() {
                return;
            }
            self.counters.insert(name.to_string(), c);
        }
        let values: Vec<&str> = labels.iter().map(|l| l.1).collect();
        if let Ok(m) = self.counters[name].get_metric_with_label_values(&values) {
            if v.is_finite() && v > 0.0 {
                m.inc_by(v);
            }
        }
    }

    fn encode(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.reg.gather())
            .unwrap_or_default()
    }
}

/// A boolean as a gauge value.
fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// The agent's own health from the status document: every `edgewatch_*` family is named,
/// typed and described here, next to the field it exports (renaming a field does not rename
/// a metric; removing one fails to compile).
fn health(s: &mut Scrape, st: &Status) {
    agent(s, &st.agent);
    ingest(s, &st.ingest);
    store(s, &st.store);
    if let Some(r) = &st.rollup {
        rollup(s, r);
    }
    if let Some(c) = &st.clock {
        clock(s, c);
    }
    for k in &st.forward.sinks {
        sink(s, k);
    }
    collectors(s, &st.collectors);
    notify(s, &st.notify);
    if let Some(c) = &st.config {
        config(s, c);
    }
}

/// The effective config's identity and the reloads: `edgewatch_config_info{sha256}` and
/// `edgewatch_config_reloads_total{result="applied|failed"}`.
fn config(s: &mut Scrape, c: &status::config::ConfigInfo) {
    s.gauge(
        "edgewatch_config_info",
        "The effective configuration running (1), by the sha256 of its canonical TOML.",
        &[("sha256", c.sha256.as_str())],
        1.0,
    );
    for (result, n) in [("applied", c.reloads_applied), ("failed", c.reloads_failed)] {
        s.counter(
            "edgewatch_config_reloads_total",
            "Configuration reloads since start, applied or failed (invalid: nothing changed).",
            &[("result", result)],
            n as f64,
        );
    }
}

/// The alert notifiers: `edgewatch_notify_*{notifier="name", type="..."}`.
fn notify(s: &mut Scrape, n: &status::notify::Notify) {
    for k in &n.notifiers {
        let l = [("notifier", k.name.as_str()), ("type", k.kind.as_str())];
        s.gauge(
            "edgewatch_notify_pending_events",
            "Alert events in the outbox the notifier has not delivered yet.",
            &l,
            k.pending_events as f64,
        );
        s.gauge(
            "edgewatch_notify_position",
            "Last outbox sequence number the notifier's receiver acknowledged (or dead-lettered).",
            &l,
            k.position as f64,
        );
        s.counter(
            "edgewatch_notify_delivered_total",
            "Alert events the notifier's receiver acknowledged, all time.",
            &l,
            k.delivered as f64,
        );
        s.counter(
            "edgewatch_notify_failures_total",
            "Failed delivery attempts since the agent started (retried).",
            &l,
            k.failures as f64,
        );
        s.counter(
            "edgewatch_notify_dead_letters_total",
            "Alert events the receiver refused as bad (4xx), set aside, all time.",
            &l,
            k.dead_letters as f64,
        );
        if let Some(t) = k.last_success_ns {
            s.gauge(
                "edgewatch_notify_last_success_seconds",
                "When the notifier's receiver last acknowledged, Unix time (absent: never).",
                &l,
                t as f64 / 1e9,
            );
        }
    }
}

fn agent(s: &mut Scrape, a: &status::Agent) {
    s.gauge(
        "edgewatch_build_info",
        "The agent's version.",
        &[("version", &a.version)],
        1.0,
    );
    s.gauge(
        "edgewatch_uptime_seconds",
        "Seconds since the agent started.",
        &[],
        a.uptime_s as f64,
    );
    if let Some(b) = a.disk_written_bytes {
        s.counter(
            "edgewatch_disk_written_bytes_total",
            "Bytes the agent caused to be written to storage since it started (/proc/self/io write_bytes): its wear on the device's flash.",
            &[],
            b as f64,
        );
    }
}

fn ingest(s: &mut Scrape, i: &status::Ingest) {
    let counters = [
        (
            "edgewatch_points_written_total",
            "Points (lines) committed to the store.",
            i.points_written,
        ),
        (
            "edgewatch_values_written_total",
            "Field values committed to the store.",
            i.values_written,
        ),
        (
            "edgewatch_points_rejected_total",
            "Points refused: parse errors, type conflicts, series cap.",
            i.points_rejected,
        ),
        (
            "edgewatch_points_dropped_total",
            "Points dropped because the queue was full or their commit failed.",
            i.points_dropped,
        ),
        (
            "edgewatch_http_writes_throttled_total",
            "HTTP writes answered 503 (queue full).",
            i.writes_throttled,
        ),
        (
            "edgewatch_http_writes_too_large_total",
            "HTTP writes answered 413.",
            i.writes_too_large,
        ),
        (
            "edgewatch_udp_datagrams_total",
            "UDP datagrams received.",
            i.udp_datagrams,
        ),
        (
            "edgewatch_commits_total",
            "Transactions committed by the writer.",
            i.commits,
        ),
        (
            "edgewatch_commit_errors_total",
            "Transactions that failed (disk full, IO error).",
            i.commit_errors,
        ),
        (
            "edgewatch_journal_appends_total",
            "Acknowledged writes made durable by a journal append before their commit (one append per group).",
            i.journal_appends,
        ),
        (
            "edgewatch_journal_written_bytes_total",
            "Bytes the journal appends cost the storage (padded records written directly, or the pages a synced append dirtied).",
            i.journal_bytes,
        ),
    ];
    for (name, help, v) in counters {
        s.counter(name, help, &[], v as f64);
    }
    s.gauge(
        "edgewatch_queue_points",
        "Points waiting between ingest and the writer.",
        &[],
        i.queue_points as f64,
    );
    s.gauge(
        "edgewatch_queue_capacity_points",
        "Queue capacity in points.",
        &[],
        i.queue_capacity as f64,
    );
    s.gauge(
        "edgewatch_write_latency_seconds",
        "Duration of the writer's last commit.",
        &[],
        i.last_commit_ms * 1e-3,
    );
}

fn store(s: &mut Scrape, st: &status::Store) {
    s.gauge(
        "edgewatch_db_bytes",
        "Database plus WAL on disk.",
        &[],
        st.db_bytes as f64,
    );
    if let Some(n) = st.series {
        s.gauge("edgewatch_series", "Series in the store.", &[], n as f64);
    }
    s.gauge(
        "edgewatch_series_limit",
        "Most series the store creates.",
        &[],
        st.max_series as f64,
    );
    s.gauge(
        "edgewatch_store_synchronous_full",
        "1: every acknowledged write is fsynced first (synchronous = full); 0: normal.",
        &[],
        if st.synchronous == crate::config::Synchronous::Full {
            1.0
        } else {
            0.0
        },
    );
}

fn rollup(s: &mut Scrape, r: &status::Rollup) {
    s.gauge(
        "edgewatch_db_budget_bytes",
        "Disk budget of the store (0: none).",
        &[],
        r.budget.max_bytes as f64,
    );
    for t in &r.tiers {
        let l = [("tier", t.name.as_str())];
        // NaN (unknown) while data waits for the job's first run, rather than no series.
        s.gauge(
            "edgewatch_rollup_lag_seconds",
            "How far the tier's rollup is behind (0: caught up; NaN: not run yet).",
            &l,
            t.lag_s.unwrap_or(f64::NAN),
        );
        s.gauge(
            "edgewatch_rollup_fold_interval_seconds",
            "How often the rollup job folds the tier (the lag stays below it in normal running).",
            &l,
            t.fold_every_s as f64,
        );
        s.gauge(
            "edgewatch_rollup_pending_chunks",
            "Raw chunks not yet folded into the tier.",
            &l,
            t.pending_chunks as f64,
        );
        s.gauge(
            "edgewatch_rollup_rows",
            "Rows of the tier.",
            &l,
            t.rows as f64,
        );
        s.counter(
            "edgewatch_rollup_late_points_total",
            "Points that landed in a final bucket.",
            &l,
            t.late_points as f64,
        );
        s.counter(
            "edgewatch_evicted_rows_total",
            "Tier rows evicted by retention or the disk budget.",
            &l,
            t.evicted_rows as f64,
        );
        s.counter(
            "edgewatch_rollup_corrupt_skipped_points_total",
            "Late points left out of a stored tier row whose sketch does not decode.",
            &l,
            t.corrupt_skipped_points as f64,
        );
    }
    s.counter(
        "edgewatch_evicted_raw_chunks_total",
        "Raw chunks evicted by retention or the disk budget.",
        &[],
        r.evicted.raw_chunks as f64,
    );
    s.counter(
        "edgewatch_evicted_raw_points_total",
        "Raw points evicted by retention or the disk budget.",
        &[],
        r.evicted.raw_points as f64,
    );
    for k in &r.sinks {
        s.counter(
            "edgewatch_sink_evicted_unforwarded_points_total",
            "Points evicted before the sink forwarded them.",
            &[("sink", &k.name)],
            k.evicted_unforwarded_points as f64,
        );
    }
}

fn clock(s: &mut Scrape, c: &status::Clock) {
    s.gauge(
        "edgewatch_clock_set",
        "1 when the clock reads later than [clock] min_valid (0: not set; rollup and forwarding wait).",
        &[],
        flag(c.set),
    );
    s.gauge(
        "edgewatch_clock_holding",
        "1 while points stamped before the clock was set are held back from rollup and forwarding.",
        &[],
        flag(c.held_from_chunk_id.is_some()),
    );
    s.counter(
        "edgewatch_clock_fixed_points_total",
        "Points whose times were corrected once the clock was set.",
        &[],
        c.fixed_points as f64,
    );
    s.counter(
        "edgewatch_clock_unfixable_points_total",
        "Points an earlier boot stamped on an unset clock, which could not be corrected.",
        &[],
        c.unfixable_points as f64,
    );
}

/// One sink's forwarding state: `edgewatch_sink_*{sink="name"}` gauges.
fn sink(s: &mut Scrape, k: &status::Sink) {
    let l = [("sink", k.name.as_str())];
    let gauges = [
        (
            "edgewatch_sink_connected",
            "1 while the sink's link is up (MQTT: connected; HTTP: the last request got an answer).",
            Some(flag(k.connected)),
        ),
        (
            "edgewatch_sink_paused",
            "1 while the sink is paused after its remote end answered 401/403.",
            Some(flag(k.paused)),
        ),
        (
            "edgewatch_sink_cursor_chunk_id",
            "Last chunk id the sink's remote end acknowledged.",
            Some(k.cursor_chunk_id as f64),
        ),
        (
            "edgewatch_sink_batch_seq",
            "Sequence number of the sink's last acknowledged batch.",
            Some(k.batch_seq as f64),
        ),
        (
            "edgewatch_sink_backlog_points",
            "Points the sink's remote end has not acknowledged yet.",
            Some(k.backlog_points as f64),
        ),
        (
            "edgewatch_sink_backlog_chunks",
            "Chunks the sink's remote end has not acknowledged yet.",
            Some(k.backlog_chunks as f64),
        ),
        (
            "edgewatch_sink_oldest_unsent_age_seconds",
            "Age of the oldest point the sink has not sent (absent: no backlog).",
            k.oldest_unsent_age_s,
        ),
        (
            "edgewatch_sink_last_success_seconds",
            "When the sink's remote end last acknowledged a batch, Unix time (absent: never).",
            k.last_success_ns.map(|t| t as f64 / 1e9),
        ),
        (
            "edgewatch_sink_last_error_seconds",
            "When the sink last failed, Unix time (absent: no error).",
            k.last_error_ns.map(|t| t as f64 / 1e9),
        ),
        (
            "edgewatch_sink_errors",
            "Errors the sink has seen since the agent started.",
            Some(k.errors as f64),
        ),
        (
            "edgewatch_sink_dead_letter_batches",
            "Batches the sink's remote end refused as bad data (kept in dead_letters).",
            Some(k.dead_letter_batches as f64),
        ),
        (
            "edgewatch_sink_dead_letter_points",
            "Points of the batches kept in dead_letters.",
            Some(k.dead_letter_points as f64),
        ),
        (
            "edgewatch_sink_forwarded_points",
            "Points the sink's remote end acknowledged, all time.",
            Some(k.forwarded_points as f64),
        ),
        (
            "edgewatch_sink_replayed_batches",
            "Batches sent again after a fault (each may have been duplicated once).",
            Some(k.replayed_batches as f64),
        ),
        (
            "edgewatch_sink_drain_rate_pps",
            "Points per second the sink's remote end acknowledged, last 5 s.",
            Some(k.drain_rate_pps),
        ),
        (
            "edgewatch_sink_max_rate_pps",
            "The sink's configured rate limit, points per second (0: none).",
            Some(k.max_rate_pps as f64),
        ),
        (
            "edgewatch_sink_evicted_unforwarded_points",
            "Raw points evicted before the sink forwarded them.",
            Some(k.evicted_unforwarded_points as f64),
        ),
        (
            "edgewatch_sink_fallback_points",
            "Rollup points sent in place of raw points evicted before the sink sent them.",
            Some(k.fallback_points as f64),
        ),
    ];
    for (name, help, v) in gauges {
        if let Some(v) = v {
            s.gauge(name, help, &l, v);
        }
    }
}

fn collectors(s: &mut Scrape, c: &status::Collectors) {
    s.counter(
        "edgewatch_collector_errors_total",
        "Collector samples that failed.",
        &[],
        c.errors as f64,
    );
    s.gauge(
        "edgewatch_nvml_state",
        "NVML collector state (1 for the current one).",
        &[("state", &c.nvml.state)],
        1.0,
    );
    s.gauge(
        "edgewatch_nvml_gpus",
        "GPUs the NVML collector samples.",
        &[],
        c.nvml.gpus.len() as f64,
    );
    scrape_targets(s, &c.scrape);
    watched_processes(s, &c.process.watched);
    let t = &c.tegrastats;
    s.gauge(
        "edgewatch_tegrastats_state",
        "tegrastats collector state (1 for the current one).",
        &[("state", &t.state)],
        1.0,
    );
    let counters = [
        (
            "edgewatch_tegrastats_samples_total",
            "tegrastats lines parsed and submitted.",
            t.samples,
        ),
        (
            "edgewatch_tegrastats_bad_lines_total",
            "tegrastats lines that could not be parsed.",
            t.bad_lines,
        ),
        (
            "edgewatch_tegrastats_restarts_total",
            "Times tegrastats exited, failed or stalled and was restarted.",
            t.restarts,
        ),
        (
            "edgewatch_tegrastats_stalls_total",
            "Times tegrastats printed nothing for stall_timeout and was stopped.",
            t.stalls,
        ),
    ];
    for (name, help, v) in counters {
        s.counter(name, help, &[], v as f64);
    }
    if let Some(age) = t.last_sample_age_s {
        s.gauge(
            "edgewatch_tegrastats_last_sample_age_seconds",
            "Seconds since the last tegrastats sample.",
            &[],
            age,
        );
    }
    kmsg(s, &c.kmsg);
}

/// The kernel log collector's families.
fn kmsg(s: &mut Scrape, k: &status::Kmsg) {
    s.gauge(
        "edgewatch_kmsg_state",
        "Kernel log collector state (1 for the current one).",
        &[("state", &k.state)],
        1.0,
    );
    let counters = [
        (
            "edgewatch_kmsg_records_total",
            "Kernel log records read.",
            k.records,
        ),
        (
            "edgewatch_kmsg_events_total",
            "Kernel events (Xid, OOM kill, thermal, ...) submitted.",
            k.events,
        ),
        (
            "edgewatch_kmsg_dropped_total",
            "Kernel events dropped by the flood bound ([kmsg] max_events_per_s).",
            k.dropped,
        ),
        (
            "edgewatch_kmsg_lost_total",
            "Kernel log records overwritten before they were read.",
            k.lost,
        ),
    ];
    for (name, help, v) in counters {
        s.counter(name, help, &[], v as f64);
    }
}

/// One family per number of `collectors.process.watched[]`, labelled by `process`.
fn watched_processes(s: &mut Scrape, watched: &[status::WatchedProcess]) {
    for w in watched {
        let l = [("process", w.label.as_str())];
        s.gauge(
            "edgewatch_process_running",
            "Processes matching the watched label at the last scan.",
            &l,
            w.running as f64,
        );
        let counters = [
            (
                "edgewatch_process_starts_total",
                "Starts of the watched label since the agent started.",
                w.starts,
            ),
            (
                "edgewatch_process_exits_total",
                "Exits of the watched label since the agent started.",
                w.exits,
            ),
            (
                "edgewatch_process_restarts_total",
                "Restarts (an exit, then a start within restart_window) of the watched label.",
                w.restarts,
            ),
        ];
        for (name, help, v) in counters {
            s.counter(name, help, &l, v as f64);
        }
    }
}

/// One family per number of `collectors.scrape[]`, labelled by target `name`.
fn scrape_targets(s: &mut Scrape, targets: &[status::ScrapeTarget]) {
    for t in targets {
        let l = [("name", t.name.as_str())];
        s.gauge(
            "edgewatch_scrape_up",
            "1 when the target's last scrape got a page, else 0.",
            &l,
            flag(t.up),
        );
        let counters = [
            (
                "edgewatch_scrape_scrapes_total",
                "Scrapes attempted.",
                t.scrapes,
            ),
            (
                "edgewatch_scrape_failures_total",
                "Scrapes that failed (down, timeout, HTTP error, too large, not text).",
                t.failures,
            ),
            (
                "edgewatch_scrape_samples_total",
                "Samples stored from the target.",
                t.samples_total,
            ),
            (
                "edgewatch_scrape_bad_lines_total",
                "Malformed exposition lines skipped.",
                t.bad_lines,
            ),
            (
                "edgewatch_scrape_non_finite_total",
                "Samples left out as NaN or infinite.",
                t.non_finite,
            ),
            (
                "edgewatch_scrape_triton_points_total",
                "triton points derived from the target's counters.",
                t.triton_points,
            ),
            (
                "edgewatch_scrape_llm_points_total",
                "llm points derived by the target's preset (vllm, llamacpp).",
                t.llm_points,
            ),
            (
                "edgewatch_scrape_preset_errors_total",
                "Preset metric families left out as malformed.",
                t.preset_errors,
            ),
        ];
        for (name, help, v) in counters {
            s.counter(name, help, &l, v as f64);
        }
        s.gauge(
            "edgewatch_scrape_last_samples",
            "Samples stored from the target's last page.",
            &l,
            t.samples as f64,
        );
        s.gauge(
            "edgewatch_scrape_last_bytes",
            "Body size of the target's last page, bytes.",
            &l,
            t.last_bytes as f64,
        );
        if let Some(ms) = t.last_duration_ms {
            s.gauge(
                "edgewatch_scrape_last_duration_seconds",
                "Wall time of the target's last scrape.",
                &l,
                ms / 1000.0,
            );
        }
    }
}

/// The agent's own families (and the writer's commit histogram), encoded whole: a few
/// dozen lines.
pub fn render_health(status: &Status, commits: Option<&prometheus::Histogram>) -> String {
    let mut s = Scrape::new();
    health(&mut s, status);
    if let Some(h) = commits {
        // A clone shares the writer's buckets; a name clash only leaves it out.
        let _ = s.reg.register(Box::new(h.clone()));
    }
    let mut text = s.encode();
    if let Some(a) = &status.alerts {
        text.push_str(&alerts_exposition(&a.active));
    }
    text
}

/// `ALERTS{alertname, alertstate, ...labels} 1` for every pending and firing instance, as
/// Prometheus exports its own alerts. Written by hand: the instances of different rules
/// carry different label names, which a `GaugeVec` (fixed label names) cannot hold. Empty
/// when nothing is pending or firing (Prometheus then has no `ALERTS` series either).
pub fn alerts_exposition(active: &[crate::alert::view::AlertItem]) -> String {
    let mut out: Vec<u8> = Vec::new();
    if active.is_empty() {
        return String::new();
    }
    out.extend_from_slice(
        b"# HELP ALERTS Alert instances pending or firing on this device (1 each).\n# TYPE ALERTS gauge\n",
    );
    let mut seen = BTreeSet::new();
    for a in active {
        let mut labels: BTreeMap<String, &str> = BTreeMap::new();
        for (k, v) in &a.labels {
            labels.insert(label_name(k), v);
        }
        labels.insert("alertname".into(), &a.name);
        labels.insert("alertstate".into(), &a.state);
        let mut line: Vec<u8> = b"ALERTS{".to_vec();
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                line.push(b',');
            }
            line.extend_from_slice(k.as_bytes());
            line.extend_from_slice(b"=\"");
            let _ = escape(&mut line, v, true);
            line.push(b'"');
        }
        line.extend_from_slice(b"} 1\n");
        // Two instances whose labels sanitize alike would be a duplicate series.
        if seen.insert(line.clone()) {
            out.extend_from_slice(&line);
        }
    }
    String::from_utf8(out).unwrap_or_default()
}
