//! A remote-write sink's histograms (`histograms = true`): the latency sketches of the final
//! 1-minute buckets ([`super::store::Feed::Sketches`]) sent as cumulative histograms a fleet
//! store merges exactly, in one of two forms (`histogram_format`):
//! - `native`: one Prometheus native histogram per series, `<measurement>_<field>_hist`,
//!   schema 8 (bucket bounds grow by 2^(1/256), 0.27 %), each sketch bin's count in the
//!   bucket holding the bin's value;
//! - `vmrange`: VictoriaMetrics bucket counters `<measurement>_<field>_hist_bucket` with a
//!   `vmrange="lo...hi"` label per sketch bin (its exact bounds, 1.005 % wide), plus
//!   `_hist_count` and `_hist_sum`.
//!
//! Labels are the point series' (tags, `device_id`, `[tags]`). A series' sample for bucket
//! `b` is stamped at the bucket's end, `b + 1 min`, and holds everything folded through `b`:
//! counters that only grow. A series (or a `vmrange` bucket) seen for the first time starts
//! with a zero sample at `b`, so `rate`/`increase` count its first minute too. The running
//! totals live in `hist-<sink>.json` beside the store, rewritten (atomically) before the
//! cursor moves: a restart, or a backlog drained days later, continues them; rows at or
//! before a series' last folded bucket are never folded twice. Losing the file restarts the
//! totals at zero (a counter reset, flagged `reset_hint = YES` on native histograms).
//!
//! On an `influxdb` sink (InfluxQL cannot merge histograms) the same thread sends each
//! minute's own bins as fields of `<measurement>_hist` ([`influx_point`]) for InfluxQL to
//! add and `edgewatch fleet-quantile` to merge ([`bins_quantile`]).
//!
//! It never reads the store (its points come from the sink loop), never classifies an
//! answer (`crate::deliver` does: a Prometheus without native histograms pauses the sink
//! with that reason), and never sends the raw points (the sink's own thread does).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use prost::Message as _;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::config::{HistFormat, SinkConfig};
use super::encode::Point;
use super::influx::{run_http, Encoded, Wire};
use super::remote_write::proto::{
    histogram::ResetHint, BucketSpan, Histogram, Label, Sample, TimeSeries, WriteRequest,
};
use super::remote_write::{metric_name, tag_labels};
use super::rollup::{sketch_row, SketchRow, SKETCH_TIER_S};
use super::SinkCtx;
use crate::deliver::{Auth, HttpPeer, Outcome, Peer};
use crate::store::sketch::{bin_bounds, bin_value, MIN_INDEXABLE};

/// The native histogram schema: bucket bounds `2^(i / 2^8)`, each 0.27 % wider than the
/// last, under the sketch's own 1.005 % bins (see docs/forwarding.md for the error budget).
pub const SCHEMA: i32 = 8;

const MINUTE_NS: i64 = SKETCH_TIER_S * 1_000_000_000;

/// One series' running totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// The last bucket folded in (start, ns).
    pub last: i64,
    /// Sum of the values.
    pub sum: f64,
    /// Values counted as zero.
    pub zero: u64,
    /// Positive bins.
    pub pos: BTreeMap<i32, u64>,
    /// Negative bins (by magnitude's key).
    pub neg: BTreeMap<i32, u64>,
}

impl Totals {
    fn count(&self) -> u64 {
        self.zero + self.pos.values().sum::<u64>() + self.neg.values().sum::<u64>()
    }

    fn add(&mut self, r: &SketchRow) {
        self.last = r.bucket;
        self.sum += r.sum;
        self.zero += r.zero;
        for (k, c) in &r.pos {
            *self.pos.entry(*k).or_default() += c;
        }
        for (k, c) in &r.neg {
            *self.neg.entry(*k).or_default() += c;
        }
    }
}

/// The durable totals of one sink, by series (`<line-protocol key> <field>`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Totals by series.
    pub series: BTreeMap<String, Totals>,
}

/// The state file of sink `name` in store directory `dir`.
pub fn state_path(dir: &Path, name: &str) -> PathBuf {
    let safe: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    dir.join(format!("hist-{safe}.json"))
}

/// Reads a state file; a missing one is an empty state. An unreadable or corrupt one is an
/// error (the caller decides: the sink starts its totals again, and says so).
pub fn load(path: &Path) -> Result<State, String> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// One histogram sample to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Emit {
    /// Index into the request's series list (see [`Folded::series`]).
    pub series: usize,
    /// Time, ms.
    pub ms: i64,
    /// The totals at that time (empty for a first series' zero sample).
    pub totals: Totals,
    /// The first sample of the series since its totals (re)started.
    pub first: bool,
    /// Bins that were empty before this sample: `(sign, key)`, sign 1, -1, or 0 for the zero
    /// bin (a `vmrange` counter starts at 0 one minute earlier).
    pub new_bins: Vec<(i8, i32)>,
}

/// What a batch adds: the samples, the series they belong to (labels without `__name__`,
/// and the metric base name `<measurement>_<field>`), and the totals after it.
#[derive(Debug, Default)]
pub struct Folded {
    /// (base name, tag labels) per series.
    pub series: Vec<(String, Vec<Label>)>,
    /// Samples, in batch order (time order within a series).
    pub emits: Vec<Emit>,
    /// Totals after the batch, of the series it touched.
    pub after: HashMap<String, Totals>,
}

/// Folds `points` (sketch points of the fields in `fields`, `measurement.field`) onto
/// `state`, pure: rows at or before a series' last folded bucket are left out.
pub fn fold(state: &State, points: &[Point], fields: &HashSet<String>) -> Folded {
    let mut out = Folded::default();
    let mut index: HashMap<String, usize> = HashMap::new();
    for p in points {
        let Some(r) = sketch_row(p) else { continue };
        let m = &p.series.measurement;
        if !fields.contains(&format!("{m}.{}", r.field)) {
            continue;
        }
        let key = format!("{} {}", p.series.prefix, r.field);
        let prev = out
            .after
            .get(&key)
            .or_else(|| state.series.get(&key))
            .cloned();
        if prev.as_ref().is_some_and(|t| r.bucket <= t.last) {
            continue;
        }
        let at = *index.entry(key.clone()).or_insert_with(|| {
            let (labels, _) = tag_labels(&p.series);
            out.series.push((format!("{m}_{}", r.field), labels));
            out.series.len() - 1
        });
        let first = prev.is_none();
        let mut t = prev.unwrap_or_default();
        if first {
            out.emits.push(Emit {
                series: at,
                ms: r.bucket.div_euclid(1_000_000),
                totals: Totals::default(),
                first: true,
                new_bins: Vec::new(),
            });
        }
        let new_bins: Vec<(i8, i32)> = r
            .pos
            .iter()
            .filter(|(k, c)| *c > 0 && !t.pos.contains_key(k))
            .map(|(k, _)| (1, *k))
            .chain(
                r.neg
                    .iter()
                    .filter(|(k, c)| *c > 0 && !t.neg.contains_key(k))
                    .map(|(k, _)| (-1, *k)),
            )
            .chain((r.zero > 0 && t.zero == 0).then_some((0, 0)))
            .collect();
        t.add(&r);
        out.emits.push(Emit {
            series: at,
            ms: (r.bucket + MINUTE_NS).div_euclid(1_000_000),
            totals: t.clone(),
            first: false,
            new_bins,
        });
        out.after.insert(key, t);
    }
    out
}

/// Labels `tags` plus `__name__ = name` and `extra`, sorted by name.
fn labels(name: &str, tags: &[Label], extra: Option<Label>) -> Vec<Label> {
    let mut l = Vec::with_capacity(tags.len() + 2);
    l.push(Label {
        name: "__name__".into(),
        value: metric_name(name),
    });
    l.extend(tags.iter().cloned());
    l.extend(extra);
    l.sort_by(|a, b| a.name.cmp(&b.name));
    l
}

/// The schema-8 bucket index holding sketch bin `key`'s value.
pub fn native_index(key: i32) -> i32 {
    (bin_value(key).log2() * f64::from(1 << SCHEMA)).ceil() as i32
}

/// Spans and deltas of `(index, count)` in index order: runs separated by gaps of up to two
/// empty buckets are one span (an empty bucket costs a byte, a span two or three).
fn spans(buckets: &[(i32, u64)]) -> (Vec<BucketSpan>, Vec<i64>) {
    let mut spans: Vec<BucketSpan> = Vec::new();
    let mut deltas = Vec::with_capacity(buckets.len());
    let mut prev_count = 0i64;
    let mut next: Option<i32> = None;
    for &(i, c) in buckets {
        match next {
            Some(n) if i >= n && i - n <= 2 => {
                for _ in n..i {
                    deltas.push(-prev_count);
                    prev_count = 0;
                }
                if let Some(s) = spans.last_mut() {
                    s.length += (i - n) as u32 + 1;
                }
            }
            _ => spans.push(BucketSpan {
                offset: next.map_or(i, |n| i - n),
                length: 1,
            }),
        }
        let c = c as i64;
        deltas.push(c - prev_count);
        prev_count = c;
        next = Some(i + 1);
    }
    (spans, deltas)
}

/// The native histogram of `t` at `ms`.
pub fn native(t: &Totals, ms: i64, hint: ResetHint) -> Histogram {
    let side = |bins: &BTreeMap<i32, u64>| {
        let mut b: Vec<(i32, u64)> = Vec::with_capacity(bins.len());
        for (&k, &c) in bins {
            let i = native_index(k);
            match b.last_mut() {
                // Two sketch bins never share a bucket (1.005 % > 0.27 %); kept safe anyway.
                Some(last) if last.0 == i => last.1 += c,
                _ => b.push((i, c)),
            }
        }
        spans(&b)
    };
    let (positive_spans, positive_deltas) = side(&t.pos);
    let (negative_spans, negative_deltas) = side(&t.neg);
    Histogram {
        count: Some(super::remote_write::proto::histogram::Count::CountInt(
            t.count(),
        )),
        sum: t.sum,
        schema: SCHEMA,
        zero_threshold: MIN_INDEXABLE,
        zero_count: Some(super::remote_write::proto::histogram::ZeroCount::ZeroCountInt(t.zero)),
        negative_spans,
        negative_deltas,
        negative_counts: Vec::new(),
        positive_spans,
        positive_deltas,
        positive_counts: Vec::new(),
        reset_hint: hint as i32,
        timestamp: ms,
    }
}

/// A bound as `vmrange` writes it (4 significant digits: adjacent bins, 1 % apart, differ).
fn bound(v: f64) -> String {
    format!("{v:.3e}")
}

/// The `vmrange` label of positive (`sign = 1`) or negative sketch bin `key`.
pub fn vmrange(key: i32, sign: i8) -> String {
    let (lo, hi) = bin_bounds(key);
    if sign < 0 {
        format!("{}...{}", bound(-hi), bound(-lo))
    } else {
        format!("{}...{}", bound(lo), bound(hi))
    }
}

/// The `vmrange` of the zero bin.
pub fn zero_vmrange() -> String {
    format!("0...{}", bound(MIN_INDEXABLE))
}

/// The request of a fold in `format`.
pub fn request(f: &Folded, format: HistFormat) -> WriteRequest {
    let mut series: Vec<TimeSeries> = Vec::new();
    match format {
        HistFormat::Native => {
            let mut at: Vec<Option<usize>> = vec![None; f.series.len()];
            for e in &f.emits {
                let i = *at[e.series].get_or_insert_with(|| {
                    let (base, tags) = &f.series[e.series];
                    series.push(TimeSeries {
                        labels: labels(&format!("{base}_hist"), tags, None),
                        ..TimeSeries::default()
                    });
                    series.len() - 1
                });
                let hint = if e.first {
                    ResetHint::Yes
                } else {
                    ResetHint::No
                };
                series[i].histograms.push(native(&e.totals, e.ms, hint));
            }
        }
        HistFormat::Vmrange => {
            // (series, name suffix, vmrange) -> index in `series`.
            let mut at: HashMap<(usize, &'static str, String), usize> = HashMap::new();
            let mut push = |s: usize, suffix: &'static str, range: Option<String>, x: Sample| {
                let i = *at
                    .entry((s, suffix, range.clone().unwrap_or_default()))
                    .or_insert_with(|| {
                        let (base, tags) = &f.series[s];
                        let extra = range.map(|r| Label {
                            name: "vmrange".into(),
                            value: r,
                        });
                        series.push(TimeSeries {
                            labels: labels(&format!("{base}_hist_{suffix}"), tags, extra),
                            ..TimeSeries::default()
                        });
                        series.len() - 1
                    });
                series[i].samples.push(x);
            };
            for e in &f.emits {
                let sample = |value: f64| Sample {
                    value,
                    timestamp: e.ms,
                };
                push(e.series, "count", None, sample(e.totals.count() as f64));
                push(e.series, "sum", None, sample(e.totals.sum));
                if e.first {
                    continue;
                }
                let range = |sign: i8, k: i32| match sign {
                    0 => zero_vmrange(),
                    s => vmrange(k, s),
                };
                for &(sign, k) in &e.new_bins {
                    // A bin seen for the first time starts at 0 at the bucket's start.
                    push(
                        e.series,
                        "bucket",
                        Some(range(sign, k)),
                        Sample {
                            value: 0.0,
                            timestamp: e.ms - MINUTE_NS / 1_000_000,
                        },
                    );
                }
                let bins = e
                    .totals
                    .pos
                    .iter()
                    .map(|(&k, &c)| (range(1, k), c))
                    .chain(e.totals.neg.iter().map(|(&k, &c)| (range(-1, k), c)))
                    .chain((e.totals.zero > 0).then(|| (range(0, 0), e.totals.zero)));
                for (r, c) in bins {
                    push(e.series, "bucket", Some(r), sample(c as f64));
                }
            }
        }
    }
    WriteRequest { timeseries: series }
}

/// The histogram side of a remote-write sink.
struct HistWire {
    name: String,
    peer: HttpPeer,
    format: HistFormat,
    fields: HashSet<String>,
    path: PathBuf,
    state: Mutex<State>,
}

impl HistWire {
    fn new(cfg: &SinkConfig, path: PathBuf, state: State) -> HistWire {
        let auth = Auth::basic_or_bearer(&cfg.credentials, cfg.token.as_ref());
        let headers = cfg
            .headers
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.expose()));
        HistWire {
            name: cfg.name.clone(),
            peer: HttpPeer::new(
                Peer::Sink,
                cfg.url.clone(),
                cfg.retry.timeout.0,
                &auth,
                headers,
            ),
            format: cfg.histogram_format(),
            fields: cfg.histogram_fields().into_iter().collect(),
            path,
            state: Mutex::new(state),
        }
    }
}

impl Wire for HistWire {
    fn kind(&self) -> &'static str {
        "prometheus_remote_write histograms"
    }

    fn body(&self, points: &[Point], _max_bytes: usize) -> Encoded {
        // A batch is whole 1-minute buckets (`max_points` rows): it goes whole.
        let folded = {
            let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            fold(&st, points, &self.fields)
        };
        let raw = request(&folded, self.format).encode_to_vec();
        let body = match snap::raw::Encoder::new().compress_vec(&raw) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(sink = %self.name, error = %e, bytes = raw.len(), "cannot snappy-compress the histograms");
                Vec::new()
            }
        };
        Encoded {
            body,
            used: points.len(),
            skipped_strings: 0,
        }
    }

    fn send(&self, body: &[u8]) -> Outcome {
        self.peer.post(
            &[
                ("Content-Type", "application/x-protobuf"),
                ("Content-Encoding", "snappy"),
                ("X-Prometheus-Remote-Write-Version", "0.1.0"),
            ],
            body,
        )
    }

    fn acked(&self, points: &[Point]) -> Result<(), String> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let folded = fold(&st, points, &self.fields);
        if folded.after.is_empty() {
            return Ok(());
        }
        let mut next = st.clone();
        next.series.extend(folded.after);
        let bytes = serde_json::to_vec(&next).map_err(|e| e.to_string())?;
        crate::fsutil::write_atomic(&self.path, &bytes, 0o640)
            .map_err(|e| format!("cannot write {}: {e}", self.path.display()))?;
        *st = next;
        Ok(())
    }
}

/// The histogram thread of a sink with `histograms = true`: its own cursor (named
/// [`super::config::hist_sink_name`]) through the 1-minute tier's final buckets.
pub(crate) fn run(ctx: SinkCtx, stop: CancellationToken) {
    let path = state_path(&ctx.dir, &ctx.cfg.name);
    let state = match load(&path) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(sink = %ctx.cfg.name, error = %e, "cannot read the histogram totals: they start again from zero (a counter reset for the fleet store)");
            State::default()
        }
    };
    let wire = HistWire::new(&ctx.cfg, path, state);
    run_http(ctx, stop, &wire);
}

/// The point an InfluxDB sink sends for a sketch row (`histograms = true` on `influxdb`):
/// measurement `<measurement>_hist`, the series' tags plus `hist_field=<field>`, the minute's
/// start as its time, fields `count`, `sum`, `zero` and one `p<key>` / `n<key>` per
/// non-empty bin of that minute alone (not cumulative: InfluxQL's `sum()` adds them over
/// time and devices, and a minute sent twice overwrites itself). `None` for other points.
pub fn influx_point(p: &Point, fields: &HashSet<String>) -> Option<Point> {
    let r = sketch_row(p)?;
    let m = &p.series.measurement;
    if !fields.contains(&format!("{m}.{}", r.field)) {
        return None;
    }
    let mut tags = p.series.tags.clone();
    tags.retain(|(k, _)| k != "hist_field");
    tags.push(("hist_field".into(), r.field.to_string()));
    tags.sort();
    let measurement = format!("{m}_hist");
    let mut prefix = String::new();
    crate::model::escape_into(&mut prefix, &measurement, &[',', ' ']);
    for (k, v) in &tags {
        prefix.push(',');
        crate::model::escape_into(&mut prefix, k, &[',', '=', ' ']);
        prefix.push('=');
        crate::model::escape_into(&mut prefix, v, &[',', '=', ' ']);
    }
    let mut fields: Vec<(std::sync::Arc<str>, crate::model::Value)> = vec![
        ("count".into(), crate::model::Value::I64(r.count as i64)),
        ("sum".into(), crate::model::Value::F64(r.sum)),
        ("zero".into(), crate::model::Value::I64(r.zero as i64)),
    ];
    for (k, c) in &r.pos {
        fields.push((format!("p{k}").into(), crate::model::Value::I64(*c as i64)));
    }
    for (k, c) in &r.neg {
        fields.push((format!("n{k}").into(), crate::model::Value::I64(*c as i64)));
    }
    Some(Point {
        series: std::sync::Arc::new(super::encode::Series {
            measurement,
            tags,
            prefix,
        }),
        ts: r.bucket,
        fields,
    })
}

/// The `q`-quantile (`0 <= q <= 1`) of merged sketch bins, as [`crate::store::sketch::Sketch::quantile`]
/// answers it: the value of the bin holding rank `floor(q * (count - 1))`, walking negatives
/// (largest magnitude first), zeros, then positives. `None` when there are no values.
pub fn bins_quantile(
    pos: &BTreeMap<i32, u64>,
    neg: &BTreeMap<i32, u64>,
    zero: u64,
    q: f64,
) -> Option<f64> {
    let count = zero + pos.values().sum::<u64>() + neg.values().sum::<u64>();
    if count == 0 || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let rank = (q * (count - 1) as f64).floor();
    let mut cum = 0u64;
    for (&k, &c) in neg.iter().rev() {
        cum += c;
        if cum as f64 > rank {
            return Some(-bin_value(k));
        }
    }
    cum += zero;
    if cum as f64 > rank {
        return Some(0.0);
    }
    for (&k, &c) in pos {
        cum += c;
        if cum as f64 > rank {
            return Some(bin_value(k));
        }
    }
    pos.keys().next_back().map(|&k| bin_value(k))
}

/// An InfluxDB sink's histograms: its line protocol wire over [`influx_point`]s.
struct InfluxBins {
    inner: super::influx::LineProtocol,
    fields: HashSet<String>,
}

impl Wire for InfluxBins {
    fn kind(&self) -> &'static str {
        "influxdb histograms"
    }

    fn body(&self, points: &[Point], _max_bytes: usize) -> Encoded {
        // Whole 1-minute buckets: the batch goes whole.
        let pts: Vec<Point> = points
            .iter()
            .filter_map(|p| influx_point(p, &self.fields))
            .collect();
        let mut e = self.inner.body(&pts, usize::MAX);
        e.used = points.len();
        e
    }

    fn send(&self, body: &[u8]) -> Outcome {
        self.inner.send(body)
    }
}

/// The histogram thread of an InfluxDB sink with `histograms = true`.
pub(crate) fn run_influx(ctx: SinkCtx, stop: CancellationToken) {
    let wire = InfluxBins {
        inner: super::influx::LineProtocol::new(&ctx.cfg),
        fields: ctx.cfg.histogram_fields().into_iter().collect(),
    };
    run_http(ctx, stop, &wire);
}

#[cfg(test)]
mod tests;
