//! `GET /metrics`: the Prometheus text exposition (format 0.0.4) of the latest value of every
//! numeric series in the store, tags as labels, and the agent's own health (`edgewatch_*`)
//! from the typed status document that `/api/v1/status` answers: each family's name, type
//! and help are written out next to the field it exports, never derived from a field name.
//!
//! The newest values come from [`LatestValues`], which the writer keeps as it commits (no
//! chunk is decoded per scrape); the names and tags come from the series dictionary, read
//! row by row through SQLite and written out as they are read, so a scrape holds one chunk
//! of output and the small [`Index`] (per measurement and field: the family name and its
//! label names), never the whole exposition or the whole dictionary. The writer thread is
//! never touched, and nothing is written to the store.
//!
//! Names of stored series: `measurement,tags field=` becomes the gauge
//! `measurement_field{tags}` (snake_case; characters outside `[a-z0-9_]` become `_`), e.g.
//! `gpu_temp_c{gpu="0",...}`, in base units where the field names a time or size unit
//! ([`base_unit`]: `wall_ms` -> `inference_wall_seconds`, `mem_used_mb` ->
//! `gpu_mem_used_bytes`); names starting `edgewatch_` are the agent's own and are not taken
//! from the store. Strings are left out; booleans are 0/1. A series whose newest point is
//! older than [`LATEST_WINDOW_NS`] is left out, as Prometheus would mark it stale. A family's
//! label names are the union of its members' tag keys (a missing one is an empty label,
//! which Prometheus treats as absent). `[http] metrics_include` / `metrics_exclude` choose
//! the measurements exported.
//!
//! The agent's own families are encoded with the `prometheus` crate's `TextEncoder`
//! (escaping, name and label checks, duplicate detection): the classic text format is what
//! `promtool check metrics` checks and what every scraper accepts, where `prometheus-client`
//! writes OpenMetrics (`# EOF`, `_total` suffixes added for you), a second format to
//! negotiate for no gain here. The store's families, up to `max_series` samples, are written
//! by [`FamilyWriter`] in the same format: the crate's registry holds every sample (a
//! `GaugeVec` child each) before encoding, which cost 1.9 s and hundreds of MB at 100,000
//! series.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::ops::ControlFlow;
use std::sync::Mutex;

use prometheus::{CounterVec, GaugeVec, Opts, Registry};

use crate::config::HttpConfig;
use crate::model::split_series_key;
use crate::status::{self, Status};
use crate::store::{dict, LatestValues, Reader, StoreError};

/// How far back the newest point of a series may be to be exported: 5 minutes.
pub const LATEST_WINDOW_NS: i64 = 300 * 1_000_000_000;
/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why writing the store's part of an exposition stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExpositionError {
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The scraper went away or stopped reading.
    #[error("scraper gone: {0}")]
    Client(#[from] std::io::Error),
}

/// The newest value of one numeric series (the pure [`render`]'s input).
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

/// One measurement + field of the store, as `/metrics` exports it.
#[derive(Debug, Clone, Default)]
struct Pair {
    /// Family name (base units applied).
    name: String,
    /// Factor to base units.
    factor: f64,
    /// Label names of its tag keys, seen so far.
    labels: BTreeSet<String>,
}

/// What `/metrics` keeps between scrapes: per measurement and field, its family name and
/// the label names of its tag keys. The dictionary only grows, so each scrape reads only
/// the series added since the last one. Size: one entry per measurement and field (a few
/// dozen on a device), never per tag set.
#[derive(Debug, Default)]
pub struct Index {
    after: i64,
    pairs: BTreeMap<String, BTreeMap<String, Pair>>,
}

impl Index {
    /// Reads the numeric series added since the last call.
    fn refresh(&mut self, reader: &Reader) -> Result<(), StoreError> {
        let pairs = &mut self.pairs;
        let mut after = self.after;
        dict::numeric_series_after(reader.conn(), reader.path(), after, |sid, m, f, key| {
            after = sid;
            let fields = match pairs.get_mut(m) {
                Some(x) => x,
                None => pairs.entry(m.to_string()).or_default(),
            };
            let pair = match fields.get_mut(f) {
                Some(p) => p,
                None => {
                    let (name, factor) = base_unit(&metric_name(&format!("{m}_{f}")));
                    fields.entry(f.to_string()).or_insert(Pair {
                        name,
                        factor,
                        labels: BTreeSet::new(),
                    })
                }
            };
            for (k, _) in key_tags(key) {
                pair.labels.insert(label_name(&k));
            }
            ControlFlow::Continue(())
        })?;
        self.after = after;
        Ok(())
    }
}

/// One family being written: `# HELP`/`# TYPE` go out with its first sample, so a family
/// without a fresh sample is left out whole.
pub struct FamilyWriter<'a> {
    name: &'a str,
    help: String,
    labels: Vec<&'a str>,
    factor: f64,
    started: bool,
    /// Tag key -> label name, for this family.
    names: HashMap<String, String>,
    /// Per label, the index of its tag in the sample being written.
    values: Vec<Option<usize>>,
}

impl<'a> FamilyWriter<'a> {
    /// A gauge family `name` with `labels` (sorted, unique) whose values are multiplied by
    /// `factor`.
    pub fn new(name: &'a str, help: String, labels: Vec<&'a str>, factor: f64) -> Self {
        let n = labels.len();
        FamilyWriter {
            name,
            help,
            labels,
            factor,
            started: false,
            names: HashMap::new(),
            values: vec![None; n],
        }
    }

    /// Writes one sample with the tags of its series (raw tag keys).
    pub fn sample<W: Write + ?Sized, K: AsRef<str>, V: AsRef<str>>(
        &mut self,
        out: &mut W,
        tags: &[(K, V)],
        value: f64,
    ) -> std::io::Result<()> {
        let v = value * self.factor;
        if !v.is_finite() {
            return Ok(());
        }
        if !self.started {
            self.started = true;
            out.write_all(b"# HELP ")?;
            out.write_all(self.name.as_bytes())?;
            out.write_all(b" ")?;
            escape(out, &self.help, false)?;
            out.write_all(b"\n# TYPE ")?;
            out.write_all(self.name.as_bytes())?;
            out.write_all(b" gauge\n")?;
        }
        for slot in &mut self.values {
            *slot = None;
        }
        for (j, (k, _)) in tags.iter().enumerate() {
            let k = k.as_ref();
            let l = match self.names.get(k) {
                Some(l) => l,
                None => self
                    .names
                    .entry(k.to_string())
                    .or_insert_with(|| label_name(k)),
            };
            if let Ok(i) = self.labels.binary_search(&l.as_str()) {
                self.values[i] = Some(j);
            }
        }
        out.write_all(self.name.as_bytes())?;
        if !self.labels.is_empty() {
            out.write_all(b"{")?;
            for (i, (l, val)) in self.labels.iter().zip(&self.values).enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                out.write_all(l.as_bytes())?;
                out.write_all(b"=\"")?;
                escape(out, val.map_or("", |j| tags[j].1.as_ref()), true)?;
                out.write_all(b"\"")?;
            }
            out.write_all(b"}")?;
        }
        // The number as the `prometheus` crate writes it (Rust's shortest round-trip form).
        writeln!(out, " {v}")
    }
}

/// Text-format escaping: `\` and newline, and `"` in label values.
fn escape<W: Write + ?Sized>(out: &mut W, s: &str, quote: bool) -> std::io::Result<()> {
    let mut rest = s;
    while let Some(i) = rest.find(|c| c == '\\' || c == '\n' || (quote && c == '"')) {
        out.write_all(&rest.as_bytes()[..i])?;
        out.write_all(match rest.as_bytes()[i] {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            _ => b"\\\"",
        })?;
        rest = &rest[i + 1..];
    }
    out.write_all(rest.as_bytes())
}

/// The tags of a canonical series key (`m,k=v,...`), borrowed from it when it holds no
/// escape (the common case), else unescaped by [`split_series_key`].
fn key_tags(key: &str) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    if key.contains('\\') {
        return split_series_key(key)
            .1
            .into_iter()
            .map(|(k, v)| (Cow::Owned(k), Cow::Owned(v)))
            .collect();
    }
    key.split(',')
        .skip(1)
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (Cow::Borrowed(k), Cow::Borrowed(v))
        })
        .collect()
}

fn family_help(field: &str, measurement: &str, factor: f64) -> String {
    format!(
        "Newest {field} of measurement {measurement} (edgewatch store){}.",
        if factor == 1.0 { "" } else { ", in base units" }
    )
}

/// Reads what the first scrape needs ahead of it (the newest values of the last window,
/// the index), so that scrape costs what later ones do. Called once at start-up.
pub fn warm(
    reader: &Mutex<Reader>,
    latest: &LatestValues,
    index: &Mutex<Index>,
    since: i64,
) -> Result<(), StoreError> {
    let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
    let r = reader.lock().unwrap_or_else(|p| p.into_inner());
    latest.seed(&r, since)?;
    index.refresh(&r)
}

/// Writes the store's families: every numeric series of an exported measurement whose
/// newest value (from `latest`) is at or after `since`. The reader is locked per
/// measurement and field, so other requests interleave with a long scrape.
pub fn write_store<W: Write + ?Sized>(
    reader: &Mutex<Reader>,
    latest: &LatestValues,
    http: &HttpConfig,
    index: &mut Index,
    since: i64,
    out: &mut W,
) -> Result<(), ExpositionError> {
    let lock = || reader.lock().unwrap_or_else(|p| p.into_inner());
    {
        let r = lock();
        latest.seed(&r, since)?;
        index.refresh(&r)?;
    }
    // Family name -> its (measurement, field, pair)s, in name order.
    let mut families: BTreeMap<&str, Vec<(&str, &str, &Pair)>> = BTreeMap::new();
    for (m, fields) in &index.pairs {
        if !http.metrics_exports(m) {
            continue;
        }
        for (f, p) in fields {
            if p.name.starts_with("edgewatch_") {
                continue;
            }
            families.entry(&p.name).or_default().push((m, f, p));
        }
    }
    for (name, members) in families {
        let (m0, f0, p0) = members[0];
        let labels: BTreeSet<&str> = members
            .iter()
            .filter(|x| x.2.factor == p0.factor)
            .flat_map(|x| x.2.labels.iter().map(String::as_str))
            .collect();
        let mut fam = FamilyWriter::new(
            name,
            family_help(f0, m0, p0.factor),
            labels.into_iter().collect(),
            p0.factor,
        );
        for (m, f, p) in members {
            if p.factor != p0.factor {
                tracing::debug!(metric = %name, measurement = %m, field = %f, "left out of /metrics: name clash");
                continue;
            }
            let r = lock();
            let mut failed = None;
            dict::numeric_members(r.conn(), r.path(), m, f, |sid, key| {
                let Some((_, v)) = latest.get(sid, since) else {
                    return ControlFlow::Continue(());
                };
                match fam.sample(out, &key_tags(key), v) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        failed = Some(e);
                        ControlFlow::Break(())
                    }
                }
            })?;
            if let Some(e) = failed {
                return Err(e.into());
            }
        }
    }
    Ok(())
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

/// The whole exposition from values in hand (pure): the agent's health, then one gauge
/// family per measurement and field, as a scrape writes them from the store.
pub fn render(
    status: &Status,
    latest: &[Latest],
    commits: Option<&prometheus::Histogram>,
) -> String {
    let mut out = render_health(status, commits).into_bytes();
    let mut families: BTreeMap<String, Vec<(&Latest, f64)>> = BTreeMap::new();
    for l in latest {
        let (name, factor) = base_unit(&metric_name(&format!("{}_{}", l.measurement, l.field)));
        families.entry(name).or_default().push((l, factor));
    }
    for (name, members) in &families {
        if name.starts_with("edgewatch_") {
            continue;
        }
        let factor = members[0].1;
        let labels: BTreeSet<String> = members
            .iter()
            .flat_map(|(l, _)| l.tags.keys().map(|k| label_name(k)))
            .collect();
        let first = members[0].0;
        let mut fam = FamilyWriter::new(
            name,
            family_help(&first.field, &first.measurement, factor),
            labels.iter().map(String::as_str).collect(),
            factor,
        );
        for (l, f) in members {
            if *f != factor {
                continue;
            }
            let tags: Vec<(&String, &String)> = l.tags.iter().collect();
            let _ = fam.sample(&mut out, &tags, l.value);
        }
    }
    String::from_utf8(out).unwrap_or_default()
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
    fn key_tags_borrow_plain_keys_and_unescape_others() {
        let plain = key_tags("m,a=1,b=x y");
        assert!(matches!(plain[0].0, Cow::Borrowed(_)));
        let got: Vec<(String, String)> = plain
            .into_iter()
            .chain(key_tags("m\\,x,a\\=b=c\\ d,e=\\,"))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let want = [("a", "1"), ("b", "x y"), ("a=b", "c d"), ("e", ",")];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
        assert!(key_tags("m").is_empty());
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
        let mut status = Status::default();
        status.ingest.points_written = 5;
        status.ingest.queue_points = 2;
        let text = render(
            &status,
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

    /// A status document with a known, distinct value in every exported field.
    fn known_status() -> Status {
        Status {
            notify: status::notify::Notify::default(),
            agent: status::Agent {
                version: "9.8.7".into(),
                uptime_s: 61,
            },
            ingest: status::Ingest {
                points_written: 101,
                values_written: 102,
                points_rejected: 103,
                points_dropped: 104,
                writes_throttled: 105,
                writes_too_large: 106,
                udp_datagrams: 107,
                queue_points: 108,
                queue_capacity: 109,
                commits: 110,
                commit_errors: 111,
                last_commit_ms: 12.5,
            },
            store: status::Store {
                path: "/var/lib/edgewatch/edgewatch.db".into(),
                db_bytes: 201,
                series: Some(202),
                max_series: 203,
                synchronous: crate::config::Synchronous::Full,
                write: None,
            },
            rollup: Some(status::Rollup {
                tiers: vec![
                    status::Tier {
                        name: "1m".into(),
                        resolution_s: 60,
                        retention_s: Some(86_400),
                        cursor_chunk_id: 300,
                        pending_chunks: 301,
                        lag_s: Some(30.5),
                        watermark_ns: Some(1),
                        late_points: 302,
                        rows: 303,
                        evicted_rows: 304,
                    },
                    status::Tier {
                        name: "1h".into(),
                        resolution_s: 3600,
                        retention_s: None,
                        cursor_chunk_id: 0,
                        pending_chunks: 311,
                        lag_s: None,
                        watermark_ns: None,
                        late_points: 312,
                        rows: 313,
                        evicted_rows: 314,
                    },
                ],
                newest_chunk_id: 320,
                raw_retention_s: 604_800,
                lateness_s: 60,
                evicted: status::Evicted {
                    raw_chunks: 321,
                    raw_points: 322,
                },
                sinks: vec![status::SinkEvictions {
                    name: "north".into(),
                    cursor_chunk_id: 323,
                    evicted_unforwarded_chunks: 324,
                    evicted_unforwarded_points: 325,
                    evicted_through_chunk_id: 326,
                }],
                budget: status::Budget {
                    max_bytes: 327,
                    db_bytes: 201,
                },
            }),
            clock: Some(status::Clock {
                set: true,
                min_valid_ns: 400,
                held_from_chunk_id: Some(401),
                fixed_points: 402,
                unfixable_points: 403,
            }),
            forward: status::Forward {
                device_id: "dev-1".into(),
                sinks: vec![
                    status::Sink {
                        name: "north".into(),
                        kind: "influxdb".into(),
                        url: "http://127.0.0.1:8086".into(),
                        connected: true,
                        paused: false,
                        next_retry_ns: None,
                        cursor_chunk_id: 501,
                        batch_seq: 502,
                        backlog_points: 503,
                        backlog_chunks: 504,
                        oldest_unsent_age_s: Some(4.5),
                        last_success_ns: Some(1_500_000_000),
                        last_error: Some("x".into()),
                        last_error_ns: Some(2_500_000_000),
                        errors: 505,
                        dead_letter_batches: 506,
                        dead_letter_points: 507,
                        forwarded_points: 508,
                        replayed_batches: 509,
                        drain_rate_pps: 510.5,
                        max_rate_pps: 511,
                        evicted_unforwarded_points: 512,
                        fallback_points: 513,
                        skipped_string_values: 0,
                        name_collisions: 0,

                        forward: "raw".into(),
                        rollup_cursor_ns: None,
                    },
                    // Nothing sent, nothing failed, no backlog: those series are absent.
                    status::Sink {
                        name: "south".into(),
                        kind: "mqtt".into(),
                        paused: true,
                        ..status::Sink::default()
                    },
                ],
            },
            collectors: status::Collectors {
                errors: 601,
                nvml: status::Nvml {
                    state: "running".into(),
                    driver: "550.54.15".into(),
                    cuda: "12.4".into(),
                    samples: 602,
                    last_sample_us: Some(603),
                    gpus: vec![status::Gpu::default(), status::Gpu::default()],
                },
                tegrastats: status::Tegrastats {
                    state: "replaying".into(),
                    detail: "x.log".into(),
                    pid: None,
                    starts: 701,
                    restarts: 702,
                    stalls: 703,
                    samples: 704,
                    bad_lines: 705,
                    last_sample_age_s: Some(0.25),
                },
                scrape: vec![],
                jetson: status::Jetson::default(),
            },
            alerts: None,
        }
    }

    #[test]
    fn scrape_targets_are_labelled_by_name() {
        let mut st = known_status();
        st.collectors.scrape = vec![status::ScrapeTarget {
            name: "triton".into(),
            up: true,
            scrapes: 3,
            failures: 1,
            samples: 40,
            samples_total: 120,
            bad_lines: 2,
            last_duration_ms: Some(12.5),
            ..status::ScrapeTarget::default()
        }];
        let text = render(&st, &[], None);
        for want in [
            "edgewatch_scrape_up{name=\"triton\"} 1\n",
            "edgewatch_scrape_failures_total{name=\"triton\"} 1\n",
            "edgewatch_scrape_samples_total{name=\"triton\"} 120\n",
            "edgewatch_scrape_bad_lines_total{name=\"triton\"} 2\n",
            "edgewatch_scrape_last_samples{name=\"triton\"} 40\n",
            "edgewatch_scrape_last_duration_seconds{name=\"triton\"} 0.0125\n",
        ] {
            assert!(text.contains(want), "{want} missing in:\n{text}");
        }
    }

    #[test]
    fn notifiers_are_labelled_by_name_and_type() {
        let mut st = known_status();
        st.notify.notifiers = vec![status::notify::Notifier {
            kind: "alertmanager".into(),
            name: "am".into(),
            position: 12,
            pending_events: 3,
            delivered: 9,
            failures: 4,
            dead_letters: 1,
            last_success_ns: Some(2_000_000_000),
            ..Default::default()
        }];
        let text = render(&st, &[], None);
        for want in [
            "edgewatch_notify_pending_events{notifier=\"am\",type=\"alertmanager\"} 3\n",
            "edgewatch_notify_position{notifier=\"am\",type=\"alertmanager\"} 12\n",
            "edgewatch_notify_delivered_total{notifier=\"am\",type=\"alertmanager\"} 9\n",
            "edgewatch_notify_failures_total{notifier=\"am\",type=\"alertmanager\"} 4\n",
            "edgewatch_notify_dead_letters_total{notifier=\"am\",type=\"alertmanager\"} 1\n",
            "edgewatch_notify_last_success_seconds{notifier=\"am\",type=\"alertmanager\"} 2\n",
        ] {
            assert!(text.contains(want), "{want} missing in:\n{text}");
        }
    }

    /// The `edgewatch_*` lines of an exposition (help, type and samples).
    fn own_lines(text: &str) -> String {
        text.lines()
            .filter(|l| l.contains("edgewatch_"))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// Every `edgewatch_*` family, exactly: a renamed field must not rename a metric, and
    /// a metric must follow the field it exports.
    #[test]
    fn the_agents_own_families_are_exactly_these() {
        let text = render(&known_status(), &[], None);
        let got = own_lines(&text);
        assert_eq!(got, OWN_FAMILIES, "got:\n{got}");
    }

    /// What [`known_status`] exports, every value traceable to one field.
    const OWN_FAMILIES: &str = r#"# HELP edgewatch_build_info The agent's version.
# TYPE edgewatch_build_info gauge
edgewatch_build_info{version="9.8.7"} 1
# HELP edgewatch_clock_fixed_points_total Points whose times were corrected once the clock was set.
# TYPE edgewatch_clock_fixed_points_total counter
edgewatch_clock_fixed_points_total 402
# HELP edgewatch_clock_holding 1 while points stamped before the clock was set are held back from rollup and forwarding.
# TYPE edgewatch_clock_holding gauge
edgewatch_clock_holding 1
# HELP edgewatch_clock_set 1 when the clock reads later than [clock] min_valid (0: not set; rollup and forwarding wait).
# TYPE edgewatch_clock_set gauge
edgewatch_clock_set 1
# HELP edgewatch_clock_unfixable_points_total Points an earlier boot stamped on an unset clock, which could not be corrected.
# TYPE edgewatch_clock_unfixable_points_total counter
edgewatch_clock_unfixable_points_total 403
# HELP edgewatch_collector_errors_total Collector samples that failed.
# TYPE edgewatch_collector_errors_total counter
edgewatch_collector_errors_total 601
# HELP edgewatch_commit_errors_total Transactions that failed (disk full, IO error).
# TYPE edgewatch_commit_errors_total counter
edgewatch_commit_errors_total 111
# HELP edgewatch_commits_total Transactions committed by the writer.
# TYPE edgewatch_commits_total counter
edgewatch_commits_total 110
# HELP edgewatch_db_budget_bytes Disk budget of the store (0: none).
# TYPE edgewatch_db_budget_bytes gauge
edgewatch_db_budget_bytes 327
# HELP edgewatch_db_bytes Database plus WAL on disk.
# TYPE edgewatch_db_bytes gauge
edgewatch_db_bytes 201
# HELP edgewatch_evicted_raw_chunks_total Raw chunks evicted by retention or the disk budget.
# TYPE edgewatch_evicted_raw_chunks_total counter
edgewatch_evicted_raw_chunks_total 321
# HELP edgewatch_evicted_raw_points_total Raw points evicted by retention or the disk budget.
# TYPE edgewatch_evicted_raw_points_total counter
edgewatch_evicted_raw_points_total 322
# HELP edgewatch_evicted_rows_total Tier rows evicted by retention or the disk budget.
# TYPE edgewatch_evicted_rows_total counter
edgewatch_evicted_rows_total{tier="1h"} 314
edgewatch_evicted_rows_total{tier="1m"} 304
# HELP edgewatch_http_writes_throttled_total HTTP writes answered 503 (queue full).
# TYPE edgewatch_http_writes_throttled_total counter
edgewatch_http_writes_throttled_total 105
# HELP edgewatch_http_writes_too_large_total HTTP writes answered 413.
# TYPE edgewatch_http_writes_too_large_total counter
edgewatch_http_writes_too_large_total 106
# HELP edgewatch_nvml_gpus GPUs the NVML collector samples.
# TYPE edgewatch_nvml_gpus gauge
edgewatch_nvml_gpus 2
# HELP edgewatch_nvml_state NVML collector state (1 for the current one).
# TYPE edgewatch_nvml_state gauge
edgewatch_nvml_state{state="running"} 1
# HELP edgewatch_points_dropped_total Points dropped because the queue was full or their commit failed.
# TYPE edgewatch_points_dropped_total counter
edgewatch_points_dropped_total 104
# HELP edgewatch_points_rejected_total Points refused: parse errors, type conflicts, series cap.
# TYPE edgewatch_points_rejected_total counter
edgewatch_points_rejected_total 103
# HELP edgewatch_points_written_total Points (lines) committed to the store.
# TYPE edgewatch_points_written_total counter
edgewatch_points_written_total 101
# HELP edgewatch_queue_capacity_points Queue capacity in points.
# TYPE edgewatch_queue_capacity_points gauge
edgewatch_queue_capacity_points 109
# HELP edgewatch_queue_points Points waiting between ingest and the writer.
# TYPE edgewatch_queue_points gauge
edgewatch_queue_points 108
# HELP edgewatch_rollup_lag_seconds How far the tier's rollup is behind (0: caught up; NaN: not run yet).
# TYPE edgewatch_rollup_lag_seconds gauge
edgewatch_rollup_lag_seconds{tier="1h"} NaN
edgewatch_rollup_lag_seconds{tier="1m"} 30.5
# HELP edgewatch_rollup_late_points_total Points that landed in a final bucket.
# TYPE edgewatch_rollup_late_points_total counter
edgewatch_rollup_late_points_total{tier="1h"} 312
edgewatch_rollup_late_points_total{tier="1m"} 302
# HELP edgewatch_rollup_pending_chunks Raw chunks not yet folded into the tier.
# TYPE edgewatch_rollup_pending_chunks gauge
edgewatch_rollup_pending_chunks{tier="1h"} 311
edgewatch_rollup_pending_chunks{tier="1m"} 301
# HELP edgewatch_rollup_rows Rows of the tier.
# TYPE edgewatch_rollup_rows gauge
edgewatch_rollup_rows{tier="1h"} 313
edgewatch_rollup_rows{tier="1m"} 303
# HELP edgewatch_series Series in the store.
# TYPE edgewatch_series gauge
edgewatch_series 202
# HELP edgewatch_series_limit Most series the store creates.
# TYPE edgewatch_series_limit gauge
edgewatch_series_limit 203
# HELP edgewatch_sink_backlog_chunks Chunks the sink's remote end has not acknowledged yet.
# TYPE edgewatch_sink_backlog_chunks gauge
edgewatch_sink_backlog_chunks{sink="north"} 504
edgewatch_sink_backlog_chunks{sink="south"} 0
# HELP edgewatch_sink_backlog_points Points the sink's remote end has not acknowledged yet.
# TYPE edgewatch_sink_backlog_points gauge
edgewatch_sink_backlog_points{sink="north"} 503
edgewatch_sink_backlog_points{sink="south"} 0
# HELP edgewatch_sink_batch_seq Sequence number of the sink's last acknowledged batch.
# TYPE edgewatch_sink_batch_seq gauge
edgewatch_sink_batch_seq{sink="north"} 502
edgewatch_sink_batch_seq{sink="south"} 0
# HELP edgewatch_sink_connected 1 while the sink's link is up (MQTT: connected; HTTP: the last request got an answer).
# TYPE edgewatch_sink_connected gauge
edgewatch_sink_connected{sink="north"} 1
edgewatch_sink_connected{sink="south"} 0
# HELP edgewatch_sink_cursor_chunk_id Last chunk id the sink's remote end acknowledged.
# TYPE edgewatch_sink_cursor_chunk_id gauge
edgewatch_sink_cursor_chunk_id{sink="north"} 501
edgewatch_sink_cursor_chunk_id{sink="south"} 0
# HELP edgewatch_sink_dead_letter_batches Batches the sink's remote end refused as bad data (kept in dead_letters).
# TYPE edgewatch_sink_dead_letter_batches gauge
edgewatch_sink_dead_letter_batches{sink="north"} 506
edgewatch_sink_dead_letter_batches{sink="south"} 0
# HELP edgewatch_sink_dead_letter_points Points of the batches kept in dead_letters.
# TYPE edgewatch_sink_dead_letter_points gauge
edgewatch_sink_dead_letter_points{sink="north"} 507
edgewatch_sink_dead_letter_points{sink="south"} 0
# HELP edgewatch_sink_drain_rate_pps Points per second the sink's remote end acknowledged, last 5 s.
# TYPE edgewatch_sink_drain_rate_pps gauge
edgewatch_sink_drain_rate_pps{sink="north"} 510.5
edgewatch_sink_drain_rate_pps{sink="south"} 0
# HELP edgewatch_sink_errors Errors the sink has seen since the agent started.
# TYPE edgewatch_sink_errors gauge
edgewatch_sink_errors{sink="north"} 505
edgewatch_sink_errors{sink="south"} 0
# HELP edgewatch_sink_evicted_unforwarded_points Raw points evicted before the sink forwarded them.
# TYPE edgewatch_sink_evicted_unforwarded_points gauge
edgewatch_sink_evicted_unforwarded_points{sink="north"} 512
edgewatch_sink_evicted_unforwarded_points{sink="south"} 0
# HELP edgewatch_sink_evicted_unforwarded_points_total Points evicted before the sink forwarded them.
# TYPE edgewatch_sink_evicted_unforwarded_points_total counter
edgewatch_sink_evicted_unforwarded_points_total{sink="north"} 325
# HELP edgewatch_sink_fallback_points Rollup points sent in place of raw points evicted before the sink sent them.
# TYPE edgewatch_sink_fallback_points gauge
edgewatch_sink_fallback_points{sink="north"} 513
edgewatch_sink_fallback_points{sink="south"} 0
# HELP edgewatch_sink_forwarded_points Points the sink's remote end acknowledged, all time.
# TYPE edgewatch_sink_forwarded_points gauge
edgewatch_sink_forwarded_points{sink="north"} 508
edgewatch_sink_forwarded_points{sink="south"} 0
# HELP edgewatch_sink_last_error_seconds When the sink last failed, Unix time (absent: no error).
# TYPE edgewatch_sink_last_error_seconds gauge
edgewatch_sink_last_error_seconds{sink="north"} 2.5
# HELP edgewatch_sink_last_success_seconds When the sink's remote end last acknowledged a batch, Unix time (absent: never).
# TYPE edgewatch_sink_last_success_seconds gauge
edgewatch_sink_last_success_seconds{sink="north"} 1.5
# HELP edgewatch_sink_max_rate_pps The sink's configured rate limit, points per second (0: none).
# TYPE edgewatch_sink_max_rate_pps gauge
edgewatch_sink_max_rate_pps{sink="north"} 511
edgewatch_sink_max_rate_pps{sink="south"} 0
# HELP edgewatch_sink_oldest_unsent_age_seconds Age of the oldest point the sink has not sent (absent: no backlog).
# TYPE edgewatch_sink_oldest_unsent_age_seconds gauge
edgewatch_sink_oldest_unsent_age_seconds{sink="north"} 4.5
# HELP edgewatch_sink_paused 1 while the sink is paused after its remote end answered 401/403.
# TYPE edgewatch_sink_paused gauge
edgewatch_sink_paused{sink="north"} 0
edgewatch_sink_paused{sink="south"} 1
# HELP edgewatch_sink_replayed_batches Batches sent again after a fault (each may have been duplicated once).
# TYPE edgewatch_sink_replayed_batches gauge
edgewatch_sink_replayed_batches{sink="north"} 509
edgewatch_sink_replayed_batches{sink="south"} 0
# HELP edgewatch_store_synchronous_full 1: every acknowledged write is fsynced first (synchronous = full); 0: normal.
# TYPE edgewatch_store_synchronous_full gauge
edgewatch_store_synchronous_full 1
# HELP edgewatch_tegrastats_bad_lines_total tegrastats lines that could not be parsed.
# TYPE edgewatch_tegrastats_bad_lines_total counter
edgewatch_tegrastats_bad_lines_total 705
# HELP edgewatch_tegrastats_last_sample_age_seconds Seconds since the last tegrastats sample.
# TYPE edgewatch_tegrastats_last_sample_age_seconds gauge
edgewatch_tegrastats_last_sample_age_seconds 0.25
# HELP edgewatch_tegrastats_restarts_total Times tegrastats exited, failed or stalled and was restarted.
# TYPE edgewatch_tegrastats_restarts_total counter
edgewatch_tegrastats_restarts_total 702
# HELP edgewatch_tegrastats_samples_total tegrastats lines parsed and submitted.
# TYPE edgewatch_tegrastats_samples_total counter
edgewatch_tegrastats_samples_total 704
# HELP edgewatch_tegrastats_stalls_total Times tegrastats printed nothing for stall_timeout and was stopped.
# TYPE edgewatch_tegrastats_stalls_total counter
edgewatch_tegrastats_stalls_total 703
# HELP edgewatch_tegrastats_state tegrastats collector state (1 for the current one).
# TYPE edgewatch_tegrastats_state gauge
edgewatch_tegrastats_state{state="replaying"} 1
# HELP edgewatch_udp_datagrams_total UDP datagrams received.
# TYPE edgewatch_udp_datagrams_total counter
edgewatch_udp_datagrams_total 107
# HELP edgewatch_uptime_seconds Seconds since the agent started.
# TYPE edgewatch_uptime_seconds gauge
edgewatch_uptime_seconds 61
# HELP edgewatch_values_written_total Field values committed to the store.
# TYPE edgewatch_values_written_total counter
edgewatch_values_written_total 102
# HELP edgewatch_write_latency_seconds Duration of the writer's last commit.
# TYPE edgewatch_write_latency_seconds gauge
edgewatch_write_latency_seconds 0.0125
"#;

    #[test]
    fn own_names_are_not_shadowed_by_data() {
        let mut status = Status::default();
        status.ingest.queue_points = 2;
        let text = render(&status, &[l("edgewatch_queue", &[], "points", 9.0)], None);
        assert!(text.contains("edgewatch_queue_points 2"), "{text}");
        assert!(!text.contains(" 9"), "{text}");
    }

    #[test]
    fn commit_durations_are_a_histogram() {
        let h = crate::stats::CommitHistogram::default();
        for secs in [0.0002, 0.003, 0.003, 0.2, 4.0] {
            h.0.observe(secs);
        }
        let text = render(&Status::default(), &[], Some(&h.0));
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
