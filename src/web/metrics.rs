//! `GET /metrics`: the Prometheus text exposition (format 0.0.4) of the latest value of every
//! numeric series in the store, tags as labels, and the agent's own health (`edgewatch_*`,
//! from the same JSON as `/api/v1/status`). Built on each scrape from a read of the store:
//! nothing is kept in memory between scrapes and the writer thread is never touched.
//!
//! Names: a series `measurement,tags field=` becomes the gauge `measurement_field{tags}`
//! (snake_case; characters outside `[a-z0-9_]` become `_`), e.g. `gpu_temp_c{gpu="0",...}`,
//! in base units where the field names a time or size unit ([`base_unit`]: `wall_ms` ->
//! `inference_wall_seconds`, `mem_used_mb` -> `gpu_mem_used_bytes`); the `edgewatch_` prefix is kept for the agent's own metrics. Strings are left out; booleans
//! are 0/1. A series whose newest point is older than [`LATEST_WINDOW_NS`] is left out, as
//! Prometheus would mark it stale.
//!
//! Encoding uses the `prometheus` crate's `TextEncoder` (escaping, name and label checks,
//! duplicate detection): the classic text format is what `promtool check metrics` checks and
//! what every scraper accepts, where `prometheus-client` writes OpenMetrics (`# EOF`,
//! `_total` suffixes added for you), a second format to negotiate for no gain here.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::ControlFlow;

use prometheus::{CounterVec, GaugeVec, Opts, Registry};
use serde_json::Value as J;

use crate::model::Kind;
use crate::store::bucket::numeric;
use crate::store::chunks::{self, Scan};
use crate::store::{dict, Reader, StoreError};

/// How far back the newest point of a series may be to be exported: 5 minutes.
pub const LATEST_WINDOW_NS: i64 = 300 * 1_000_000_000;
/// Chunks read per tag set at most when looking for the newest value of each field.
const MAX_CHUNKS_PER_TAGSET: usize = 4;
/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The newest value of one numeric series.
#[derive(Debug, Clone, PartialEq)]
pub struct Latest {
    /// Measurement.
    pub measurement: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Field.
    pub field: String,
    /// Timestamp, ns.
    pub ts: i64,
    /// The value.
    pub value: f64,
}

/// The newest value of every numeric series with a point at or after `since`: per tag set,
/// the newest chunks (by `ts_max`, through the `(tagset_id, ts_max)` index) until every field
/// has a value or [`MAX_CHUNKS_PER_TAGSET`] were read.
pub fn latest(reader: &Reader, since: i64) -> Result<Vec<Latest>, StoreError> {
    let (conn, path) = (reader.conn(), reader.path());
    // tagset id -> (measurement, tags, [(series id, field)])
    type Fields = Vec<(i64, String)>;
    let mut sets: BTreeMap<i64, (String, BTreeMap<String, String>, Fields)> = BTreeMap::new();
    let all = dict::load(conn, path)?;
    let mut by_id: HashMap<i64, dict::Tagset> =
        all.tagsets.into_iter().map(|t| (t.id, t)).collect();
    for s in all.series {
        if s.kind == Kind::Str {
            continue;
        }
        let Some(set) = by_id.get_mut(&s.tagset_id) else {
            continue;
        };
        sets.entry(s.tagset_id)
            .or_insert_with(|| {
                (
                    std::mem::take(&mut set.measurement),
                    std::mem::take(&mut set.tags),
                    Vec::new(),
                )
            })
            .2
            .push((s.id, s.field));
    }
    let mut out = Vec::new();
    for (tid, (measurement, tags, fields)) in sets {
        let wanted: HashMap<i64, usize> =
            fields.iter().enumerate().map(|(i, f)| (f.0, i)).collect();
        let mut newest: Vec<Option<(i64, f64)>> = vec![None; fields.len()];
        let scan = Scan {
            tagset: Some(tid),
            ts_from: Some(since),
            newest_first: true,
            limit: Some(MAX_CHUNKS_PER_TAGSET),
            ..Scan::default()
        };
        chunks::scan(conn, path, &scan, |c| {
            c.decode(path, |t, sid, v| {
                let (Some(&i), Some(x)) = (wanted.get(&sid), numeric(&v)) else {
                    return;
                };
                if t >= since && newest[i].map_or(true, |(nt, _)| t >= nt) {
                    newest[i] = Some((t, x));
                }
            })?;
            Ok(if newest.iter().all(Option::is_some) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            })
        })?;
        for ((_, field), n) in fields.into_iter().zip(newest) {
            if let Some((ts, value)) = n {
                out.push(Latest {
                    measurement: measurement.clone(),
                    tags: tags.clone(),
                    field,
                    ts,
                    value,
                });
            }
        }
    }
    Ok(out)
}

/// A valid snake_case name from any text: `[a-z0-9_]` (`camelCase` becomes `camel_case`),
/// not starting with a digit.
pub fn metric_name(raw: &str) -> String {
    let mut s = String::with_capacity(raw.len() + 4);
    let mut prev_lower = false;
    for c in raw.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            s.push('_');
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        s.push(if c.is_ascii_alphanumeric() {
            c.to_ascii_lowercase()
        } else {
            '_'
        });
    }
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// Prometheus wants base units and no abbreviated unit in a name (`promtool check metrics`
/// refuses `_ms`, `_mb`, `_s`, ...): a trailing time or size unit becomes `seconds` or `bytes`
/// with the factor to apply (sizes in MB are MiB, as /proc, NVML and tegrastats report them);
/// one inside the name is spelled out. Other units (`pct`, `mhz`, `mw`, `c`) stay as they are.
pub fn base_unit(name: &str) -> (String, f64) {
    const KI: f64 = 1024.0;
    let mut parts: Vec<&str> = name.split('_').collect();
    let mut factor = 1.0;
    if parts.len() > 1 {
        let last = parts.len() - 1;
        let (unit, f) = match parts[last] {
            "ns" => ("seconds", 1e-9),
            "us" => ("seconds", 1e-6),
            "ms" => ("seconds", 1e-3),
            "s" | "sec" => ("seconds", 1.0),
            "m" => ("minutes", 1.0),
            "h" => ("seconds", 3600.0),
            "d" => ("seconds", 86400.0),
            "b" => ("bytes", 1.0),
            "kb" => ("bytes", KI),
            "mb" => ("bytes", KI * KI),
            "gb" => ("bytes", KI * KI * KI),
            "tb" => ("bytes", KI * KI * KI * KI),
            "pb" => ("bytes", KI * KI * KI * KI * KI),
            _ => ("", 1.0),
        };
        if !unit.is_empty() {
            parts[last] = unit;
            factor = f;
        }
    }
    let name = parts
        .iter()
        .enumerate()
        .map(|(i, p)| match *p {
            _ if i == 0 => *p,
            "ns" => "nanoseconds",
            "us" => "microseconds",
            "ms" => "milliseconds",
            "s" | "sec" => "seconds",
            "m" => "minutes",
            "h" => "hours",
            "d" => "days",
            "b" => "bytes",
            "kb" => "kibibytes",
            "mb" => "mebibytes",
            "gb" => "gibibytes",
            "tb" => "tebibytes",
            "pb" => "pebibytes",
            other => other,
        })
        .collect::<Vec<_>>()
        .join("_");
    (name, factor)
}

/// A valid label name from a tag key (`__` is reserved by Prometheus: such keys get `tag`).
pub fn label_name(raw: &str) -> String {
    let s = metric_name(raw);
    if s.starts_with("__") {
        format!("tag{s}")
    } else {
        s
    }
}

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

fn num(v: &J) -> Option<f64> {
    match v {
        J::Number(n) => n.as_f64(),
        J::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        _ => None,
    }
}

/// The agent's own health from the `/api/v1/status` JSON.
fn health(s: &mut Scrape, status: &J) {
    let ingest = &status["ingest"];
    for (key, name, help) in [
        (
            "points_written",
            "edgewatch_points_written_total",
            "Points (lines) committed to the store.",
        ),
        (
            "values_written",
            "edgewatch_values_written_total",
            "Field values committed to the store.",
        ),
        (
            "points_rejected",
            "edgewatch_points_rejected_total",
            "Points refused: parse errors, type conflicts, series cap.",
        ),
        (
            "points_dropped",
            "edgewatch_points_dropped_total",
            "Points dropped because the queue was full or their commit failed.",
        ),
        (
            "writes_throttled",
            "edgewatch_http_writes_throttled_total",
            "HTTP writes answered 503 (queue full).",
        ),
        (
            "writes_too_large",
            "edgewatch_http_writes_too_large_total",
            "HTTP writes answered 413.",
        ),
        (
            "udp_datagrams",
            "edgewatch_udp_datagrams_total",
            "UDP datagrams received.",
        ),
        (
            "commits",
            "edgewatch_commits_total",
            "Transactions committed by the writer.",
        ),
        (
            "commit_errors",
            "edgewatch_commit_errors_total",
            "Transactions that failed (disk full, IO error).",
        ),
    ] {
        if let Some(v) = num(&ingest[key]) {
            s.counter(name, help, &[], v);
        }
    }
    let gauges: [(&J, &str, &str, f64); 8] = [
        (
            &ingest["queue_points"],
            "edgewatch_queue_points",
            "Points waiting between ingest and the writer.",
            1.0,
        ),
        (
            &ingest["queue_capacity"],
            "edgewatch_queue_capacity_points",
            "Queue capacity in points.",
            1.0,
        ),
        (
            &ingest["last_commit_ms"],
            "edgewatch_write_latency_seconds",
            "Duration of the writer's last commit.",
            0.001,
        ),
        (
            &status["store"]["db_bytes"],
            "edgewatch_db_bytes",
            "Database plus WAL on disk.",
            1.0,
        ),
        (
            &status["store"]["series"],
            "edgewatch_series",
            "Series in the store.",
            1.0,
        ),
        (
            &status["store"]["max_series"],
            "edgewatch_series_limit",
            "Most series the store creates.",
            1.0,
        ),
        (
            &status["rollup"]["budget"]["max_bytes"],
            "edgewatch_db_budget_bytes",
            "Disk budget of the store (0: none).",
            1.0,
        ),
        (
            &status["uptime_s"],
            "edgewatch_uptime_seconds",
            "Seconds since the agent started.",
            1.0,
        ),
    ];
    for (v, name, help, scale) in gauges {
        if let Some(v) = num(v) {
            s.gauge(name, help, &[], v * scale);
        }
    }
    if let Some(v) = status["version"].as_str() {
        s.gauge(
            "edgewatch_build_info",
            "The agent's version.",
            &[("version", v)],
            1.0,
        );
    }
    let collectors = &status["collectors"];
    if let Some(v) = num(&collectors["errors"]) {
        s.counter(
            "edgewatch_collector_errors_total",
            "Collector samples that failed.",
            &[],
            v,
        );
    }
    if let Some(state) = collectors["nvml"]["state"].as_str() {
        s.gauge(
            "edgewatch_nvml_state",
            "NVML collector state (1 for the current one).",
            &[("state", state)],
            1.0,
        );
        let gpus = collectors["nvml"]["gpus"].as_array().map_or(0, Vec::len);
        s.gauge(
            "edgewatch_nvml_gpus",
            "GPUs the NVML collector samples.",
            &[],
            gpus as f64,
        );
    }
    let teg = &collectors["tegrastats"];
    if let Some(state) = teg["state"].as_str() {
        s.gauge(
            "edgewatch_tegrastats_state",
            "tegrastats collector state (1 for the current one).",
            &[("state", state)],
            1.0,
        );
        for (key, name, help) in [
            (
                "samples",
                "edgewatch_tegrastats_samples_total",
                "tegrastats lines parsed and submitted.",
            ),
            (
                "bad_lines",
                "edgewatch_tegrastats_bad_lines_total",
                "tegrastats lines that could not be parsed.",
            ),
            (
                "restarts",
                "edgewatch_tegrastats_restarts_total",
                "Times tegrastats exited, failed or stalled and was restarted.",
            ),
            (
                "stalls",
                "edgewatch_tegrastats_stalls_total",
                "Times tegrastats printed nothing for stall_timeout and was stopped.",
            ),
        ] {
            if let Some(v) = num(&teg[key]) {
                s.counter(name, help, &[], v);
            }
        }
        if let Some(v) = num(&teg["last_sample_age_s"]) {
            s.gauge(
                "edgewatch_tegrastats_last_sample_age_seconds",
                "Seconds since the last tegrastats sample.",
                &[],
                v,
            );
        }
    }
    let clock = &status["clock"];
    if let Some(set) = clock["set"].as_bool() {
        s.gauge(
            "edgewatch_clock_set",
            "1 when the clock reads later than [clock] min_valid (0: not set; rollup and forwarding wait).",
            &[],
            if set { 1.0 } else { 0.0 },
        );
        s.gauge(
            "edgewatch_clock_holding",
            "1 while points stamped before the clock was set are held back from rollup and forwarding.",
            &[],
            if clock["held_from_chunk_id"].is_null() { 0.0 } else { 1.0 },
        );
        if let Some(v) = num(&clock["fixed_points"]) {
            s.counter(
                "edgewatch_clock_fixed_points_total",
                "Points whose times were corrected once the clock was set.",
                &[],
                v,
            );
        }
    }
    let rollup = &status["rollup"];
    for t in rollup["tiers"].as_array().into_iter().flatten() {
        let tier = t["name"].as_str().unwrap_or("");
        let l = [("tier", tier)];
        // NaN (unknown) while data waits for the job's first run, rather than no series.
        let lag = num(&t["lag_s"]).unwrap_or(f64::NAN);
        s.gauge(
            "edgewatch_rollup_lag_seconds",
            "How far the tier's rollup is behind (0: caught up; NaN: not run yet).",
            &l,
            lag,
        );
        if let Some(v) = num(&t["pending_chunks"]) {
            s.gauge(
                "edgewatch_rollup_pending_chunks",
                "Raw chunks not yet folded into the tier.",
                &l,
                v,
            );
        }
        if let Some(v) = num(&t["rows"]) {
            s.gauge("edgewatch_rollup_rows", "Rows of the tier.", &l, v);
        }
        if let Some(v) = num(&t["late_points"]) {
            s.counter(
                "edgewatch_rollup_late_points_total",
                "Points that landed in a final bucket.",
                &l,
                v,
            );
        }
    }
    if let Some(ev) = rollup["evicted"].as_object() {
        for (k, v) in ev {
            let Some(v) = num(v) else { continue };
            match k.strip_prefix("rows_") {
                Some(tier) => s.counter(
                    "edgewatch_evicted_rows_total",
                    "Tier rows evicted by retention or the disk budget.",
                    &[("tier", tier)],
                    v,
                ),
                None => s.counter(
                    &metric_name(&format!("edgewatch_evicted_{k}_total")),
                    "Raw data evicted by retention or the disk budget.",
                    &[],
                    v,
                ),
            }
        }
    }
    for sink in rollup["sinks"].as_array().into_iter().flatten() {
        let name = sink["name"].as_str().unwrap_or("");
        if let Some(v) = num(&sink["evicted_unforwarded_points"]) {
            s.counter(
                "edgewatch_sink_evicted_unforwarded_points_total",
                "Points evicted before the sink forwarded them.",
                &[("sink", name)],
                v,
            );
        }
    }
    sinks(s, status);
}

/// Per-sink forwarding state, whatever its exact shape: `sinks` or `forward` (or
/// `forward.sinks`), as an array of objects with `name` or an object keyed by name; every
/// numeric or boolean member `k` (one level of nesting joined with `_`) becomes
/// `edgewatch_sink_k{sink="name"}`.
fn sinks(s: &mut Scrape, status: &J) {
    let forward = &status["forward"];
    let forward = if forward.get("sinks").is_some() {
        &forward["sinks"]
    } else {
        forward
    };
    let mut list: Vec<(String, &J)> = Vec::new();
    for v in [&status["sinks"], forward] {
        match v {
            J::Array(a) => list.extend(
                a.iter()
                    .filter_map(|o| Some((o["name"].as_str()?.to_string(), o))),
            ),
            J::Object(m) => list.extend(
                m.iter()
                    .filter(|(_, o)| o.is_object())
                    .map(|(n, o)| (n.clone(), o)),
            ),
            _ => {}
        }
    }
    let mut seen = BTreeSet::new();
    for (name, o) in list {
        let Some(m) = o.as_object() else { continue };
        for (k, v) in m {
            let leaves: Vec<(String, f64)> = match v {
                J::Object(inner) => inner
                    .iter()
                    .filter_map(|(k2, v2)| num(v2).map(|x| (format!("{k}_{k2}"), x)))
                    .collect(),
                other => num(other).map(|x| (k.clone(), x)).into_iter().collect(),
            };
            for (k, x) in leaves {
                let (metric, factor) = base_unit(&metric_name(&format!("edgewatch_sink_{k}")));
                if seen.insert((metric.clone(), name.clone())) {
                    s.gauge(
                        &metric,
                        "Forwarding state of the sink (see /api/v1/status).",
                        &[("sink", &name)],
                        x * factor,
                    );
                }
            }
        }
    }
}

/// The whole exposition: the agent's health, then one gauge family per measurement and
/// field (label names: the union of the family's tag keys; a missing tag is an empty label,
/// which Prometheus treats as absent).
pub fn render(status: &J, latest: &[Latest], commits: Option<&prometheus::Histogram>) -> String {
    let mut s = Scrape::new();
    health(&mut s, status);
    if let Some(h) = commits {
        // A clone shares the writer's buckets; a name clash only leaves it out.
        let _ = s.reg.register(Box::new(h.clone()));
    }
    let mut families: BTreeMap<(String, u64), Vec<&Latest>> = BTreeMap::new();
    for l in latest {
        let (name, factor) = base_unit(&metric_name(&format!("{}_{}", l.measurement, l.field)));
        families
            .entry((name, factor.to_bits()))
            .or_default()
            .push(l);
    }
    for ((name, factor), members) in families {
        let factor = f64::from_bits(factor);
        if name.starts_with("edgewatch_") {
            continue;
        }
        let keys: BTreeSet<String> = members
            .iter()
            .flat_map(|l| l.tags.keys().map(|k| label_name(k)))
            .collect();
        let keys: Vec<String> = keys.into_iter().collect();
        let help = format!(
            "Newest {} of measurement {} (edgewatch store){}.",
            members[0].field,
            members[0].measurement,
            if factor == 1.0 { "" } else { ", in base units" }
        );
        for l in members {
            let mut values: Vec<(&str, String)> =
                keys.iter().map(|k| (k.as_str(), String::new())).collect();
            for (k, v) in &l.tags {
                let k = label_name(k);
                if let Some(slot) = values.iter_mut().find(|s| s.0 == k) {
                    slot.1 = v.clone();
                }
            }
            let labels: Vec<(&str, &str)> = values.iter().map(|(k, v)| (*k, v.as_str())).collect();
            if !s.gauge(&name, &help, &labels, l.value * factor) {
                tracing::debug!(metric = %name, "left out of /metrics: name or labels clash");
                break;
            }
        }
    }
    s.encode()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(m: &str, tags: &[(&str, &str)], f: &str, v: f64) -> Latest {
        Latest {
            measurement: m.into(),
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            field: f.into(),
            ts: 1,
            value: v,
        }
    }

    #[test]
    fn names_and_labels_are_sanitized() {
        assert_eq!(
            metric_name("jetson_power_current-mw"),
            "jetson_power_current_mw"
        );
        assert_eq!(metric_name("1m.load"), "_1m_load");
        assert_eq!(label_name("__name__"), "tag__name__");
        assert_eq!(label_name("gpu.index"), "gpu_index");
        assert_eq!(label_name("modelVersion"), "model_version");
        assert_eq!(
            base_unit("inference_wall_ms"),
            ("inference_wall_seconds".into(), 1e-3)
        );
        assert_eq!(
            base_unit("gpu_mem_used_mb"),
            ("gpu_mem_used_bytes".into(), 1048576.0)
        );
        assert_eq!(
            base_unit("gpu_clock_sm_mhz"),
            ("gpu_clock_sm_mhz".into(), 1.0)
        );
        assert_eq!(
            base_unit("x_ms_total"),
            ("x_milliseconds_total".into(), 1.0)
        );
    }

    #[test]
    fn series_become_labelled_gauges_with_escaped_values() {
        let text = render(
            &serde_json::json!({"ingest": {"points_written": 5, "queue_points": 2}}),
            &[
                l(
                    "gpu",
                    &[("gpu", "0"), ("name", "A \"quoted\"\\name\n")],
                    "temp_c",
                    71.0,
                ),
                l("inference", &[("model", "yolo")], "wall_ms", 12.5),
                l(
                    "inference",
                    &[("model", "bert"), ("app", "x")],
                    "wall_ms",
                    30.0,
                ),
            ],
            None,
        );
        assert!(text.contains("# TYPE gpu_temp_c gauge"), "{text}");
        assert!(
            text.contains(r#"gpu_temp_c{gpu="0",name="A \"quoted\"\\name\n"} 71"#),
            "{text}"
        );
        assert!(
            text.contains(r#"inference_wall_seconds{app="",model="yolo"} 0.0125"#),
            "{text}"
        );
        assert!(
            text.contains(r#"inference_wall_seconds{app="x",model="bert"} 0.03"#),
            "{text}"
        );
        assert!(text.contains("edgewatch_points_written_total 5"), "{text}");
        assert!(text.contains("edgewatch_queue_points 2"), "{text}");
    }

    #[test]
    fn sinks_of_any_shape_are_exported() {
        let status = serde_json::json!({
            "sinks": [{"name": "influx", "backlog_points": 12, "connected": true, "last_error": "x"}],
            "forward": {"mqtt": {"backlog_points": 3, "oldest_unsent_age_s": 4.5}},
        });
        let text = render(&status, &[], None);
        assert!(
            text.contains(r#"edgewatch_sink_backlog_points{sink="influx"} 12"#),
            "{text}"
        );
        assert!(
            text.contains(r#"edgewatch_sink_connected{sink="influx"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"edgewatch_sink_oldest_unsent_age_seconds{sink="mqtt"} 4.5"#),
            "{text}"
        );
    }

    #[test]
    fn own_names_are_not_shadowed_by_data() {
        let text = render(
            &serde_json::json!({"ingest": {"queue_points": 2}}),
            &[l("edgewatch_queue", &[], "points", 9.0)],
            None,
        );
        assert!(text.contains("edgewatch_queue_points 2"), "{text}");
        assert!(!text.contains(" 9"), "{text}");
    }

    #[test]
    fn commit_durations_are_a_histogram() {
        let h = crate::stats::CommitHistogram::default();
        for secs in [0.0002, 0.003, 0.003, 0.2, 4.0] {
            h.0.observe(secs);
        }
        let text = render(&serde_json::json!({}), &[], Some(&h.0));
        for want in [
            "# TYPE edgewatch_commit_duration_seconds histogram",
            r#"edgewatch_commit_duration_seconds_bucket{le="0.0005"} 1"#,
            r#"edgewatch_commit_duration_seconds_bucket{le="0.005"} 3"#,
            r#"edgewatch_commit_duration_seconds_bucket{le="0.25"} 4"#,
            r#"edgewatch_commit_duration_seconds_bucket{le="+Inf"} 5"#,
            "edgewatch_commit_duration_seconds_count 5",
        ] {
            assert!(text.contains(want), "{want}:\n{text}");
        }
    }
}
