//! The query engine: aggregates of one field over time steps (`step` + `agg`), read from the
//! coarsest rollup tier that fits, and the derived inference signals (percentile ratios,
//! throughput, GPU share, overhead, batch efficiency, the latency-throughput curve and its
//! knee). Read-only: it runs on a [`Reader`] and never writes.
//!
//! Choosing the source ([`choose_source`], pure): among tiers whose resolution divides the
//! step, the coarsest whose retention covers `from`; if none covers it, the one that keeps
//! the longest; if no tier's resolution divides the step (finer than 1 min, or e.g. 90 s),
//! the raw points. A tier answers with its rows *plus* the raw chunks it has not rolled up
//! yet (ids above its cursor), so the newest step is complete and no point is counted twice.
//!
//! Steps are epoch-aligned: step `k` covers `[k*step, (k+1)*step)`, and the query covers the
//! steps from the one holding `from` to the one holding `to` (whole rollup buckets; the edges
//! are not cut inside a bucket). Percentiles from tiers merge the buckets' DDSketches (within
//! 0.5% relative of the exact value, see `store/sketch.rs`); from raw points they are exact
//! (rank `floor(q * (n - 1))` of the sorted values). `rate` is the per-second change of the
//! step's last value against the previous step's last (the step's first for the first step),
//! computed per series and summed over a group. Empty steps are left out.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;

use serde::Serialize;

use crate::rollup::{Plan, Tier};
use crate::store::bucket::{bucket_start, numeric, parse_percentile, Acc};
use crate::store::chunks::{self, Scan};
use crate::store::{dict, tiers, Reader, StoreError};

const NS: i64 = 1_000_000_000;
/// Most steps one query may return per series.
pub const MAX_STEPS: i64 = 200_000;

/// Why a query failed: a bad request (400) or the store (500).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is invalid; the message says what to change.
    #[error("{0}")]
    BadQuery(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A rollup row does not decode.
    #[error("corrupt rollup row in {0}")]
    Corrupt(std::path::PathBuf),
}

/// An aggregate function.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Agg {
    /// Mean.
    Mean,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum.
    Sum,
    /// Number of values.
    Count,
    /// Per-second change of the last value.
    Rate,
    /// Last value.
    Last,
    /// A quantile in `[0, 1]` (`p50`, `p99`, `p999`, ...).
    Quantile(f64),
}

impl Agg {
    /// Parses `mean`, `min`, `max`, `sum`, `count`, `rate`, `last` or `pNN`.
    pub fn parse(s: &str) -> Result<Agg, String> {
        Ok(match s {
            "mean" | "avg" => Agg::Mean,
            "min" => Agg::Min,
            "max" => Agg::Max,
            "sum" => Agg::Sum,
            "count" => Agg::Count,
            "rate" => Agg::Rate,
            "last" => Agg::Last,
            other => Agg::Quantile(parse_percentile(other).ok_or_else(|| {
                format!(
                    "invalid agg {other:?}: expected mean, min, max, sum, count, rate, last or a percentile like p50, p99, p999"
                )
            })?),
        })
    }
}

/// An aggregate query.
#[derive(Debug, Clone)]
pub struct AggQuery {
    /// Measurement.
    pub measurement: String,
    /// Field (required).
    pub field: String,
    /// Tags that must match.
    pub tags: Vec<(String, String)>,
    /// `None`: one series per tag set; `Some(keys)`: merge series with equal values of
    /// `keys` (empty: everything into one series).
    pub group_by: Option<Vec<String>>,
    /// Inclusive start, ns.
    pub from: i64,
    /// Inclusive end, ns.
    pub to: i64,
    /// Step, ns.
    pub step_ns: i64,
    /// Aggregate.
    pub agg: Agg,
    /// The agg's name as asked, echoed in the answer.
    pub agg_name: String,
}

/// One output series.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AggSeries {
    /// Its tags (the group-by tags when grouped).
    pub tags: BTreeMap<String, String>,
    /// `[step_start_ns, value]`, in time order.
    pub points: Vec<(i64, f64)>,
}

/// The answer to an [`AggQuery`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AggResult {
    /// Measurement.
    pub measurement: String,
    /// Field.
    pub field: String,
    /// Aggregate, as asked.
    pub agg: String,
    /// Step, ns.
    pub step_ns: i64,
    /// `raw` or the tier's name.
    pub tier: String,
    /// First step start, ns.
    pub from: i64,
    /// End, ns.
    pub to: i64,
    /// Series.
    pub series: Vec<AggSeries>,
}

/// Where a query's data comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Raw points.
    Raw,
    /// The plan's tier at this index.
    Tier(usize),
}

/// Picks the source for `step` over a range starting at `from` (pure; see the module docs).
pub fn choose_source(plan: &Plan, step_ns: i64, from: i64, now: i64) -> Source {
    let fits: Vec<usize> = plan
        .tiers
        .iter()
        .enumerate()
        .filter(|(_, t)| t.res_ns <= step_ns && step_ns % t.res_ns == 0)
        .map(|(i, _)| i)
        .collect();
    let covers = |t: &Tier| {
        t.retention_ns
            .map_or(true, |r| from >= now.saturating_sub(r))
    };
    if let Some(&i) = fits.iter().rev().find(|&&i| covers(&plan.tiers[i])) {
        return Source::Tier(i);
    }
    fits.iter()
        .copied()
        .max_by_key(|&i| plan.tiers[i].retention_ns.unwrap_or(i64::MAX))
        .map_or(Source::Raw, Source::Tier)
}

/// The per-step state: the aggregate and, from raw points, every value (exact percentiles).
#[derive(Debug, Clone, Default)]
pub struct StepAcc {
    /// Aggregate.
    pub acc: Acc,
    /// Every value, when read from raw points.
    pub exact: Option<Vec<f64>>,
}

impl StepAcc {
    /// Merges `other` in, moving it (no sketch copy) when this step is still empty: with one
    /// bucket per step, the common dashboard case, nothing is copied at all.
    fn absorb(&mut self, other: StepAcc) {
        if self.acc.count == 0 && self.exact.is_none() {
            *self = other;
        } else {
            self.merge(&other);
        }
    }

    fn merge(&mut self, other: &StepAcc) {
        self.acc.merge(&other.acc);
        match (&mut self.exact, &other.exact) {
            (Some(a), Some(b)) => a.extend_from_slice(b),
            (None, Some(b)) if self.acc.count == other.acc.count => self.exact = Some(b.clone()),
            _ => self.exact = None,
        }
    }

    /// The `q`-quantile: exact from raw values, else from the merged sketch.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        match &self.exact {
            Some(v) if !v.is_empty() => {
                let mut v = v.clone();
                v.sort_by(f64::total_cmp);
                Some(v[(q * (v.len() - 1) as f64).floor() as usize])
            }
            _ => self.acc.sketch.quantile(q),
        }
    }
}

/// Steps of one tag set, sorted by step start. A sorted vector rather than a map: rows
/// arrive in bucket order and raw points almost in time order, so nearly every
/// [`Steps::at`] is the last step or a new one appended after it (measured: the map's
/// inserts were ~12% of a 1-minute-step query).
#[derive(Debug, Clone, Default)]
pub struct Steps(Vec<(i64, StepAcc)>);

impl Steps {
    /// The step starting at `t`, created empty when missing.
    pub fn at(&mut self, t: i64) -> &mut StepAcc {
        let i = match self.0.last() {
            Some((last, _)) if *last == t => self.0.len() - 1,
            Some((last, _)) if *last > t => match self.0.binary_search_by_key(&t, |(k, _)| *k) {
                Ok(i) => i,
                Err(i) => {
                    self.0.insert(i, (t, StepAcc::default()));
                    i
                }
            },
            _ => {
                self.0.push((t, StepAcc::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }

    /// The step starting at `t`.
    pub fn get(&self, t: i64) -> Option<&StepAcc> {
        self.0
            .binary_search_by_key(&t, |(k, _)| *k)
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Step starts, in order.
    pub fn keys(&self) -> impl Iterator<Item = i64> + '_ {
        self.0.iter().map(|(t, _)| *t)
    }

    /// Steps, in order.
    pub fn values(&self) -> impl Iterator<Item = &StepAcc> {
        self.0.iter().map(|(_, s)| s)
    }

    /// `(start, step)` pairs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &StepAcc)> {
        self.0.iter().map(|(t, s)| (*t, s))
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No step at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl IntoIterator for Steps {
    type Item = (i64, StepAcc);
    type IntoIter = std::vec::IntoIter<(i64, StepAcc)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

pub use crate::store::tiers::Need;

/// What a query of `agg` reads from each rollup row.
pub fn need_of(agg: Agg) -> Need {
    match agg {
        Agg::Mean | Agg::Sum | Agg::Count => Need::Sum,
        Agg::Min | Agg::Max => Need::MinMax,
        Agg::Last | Agg::Rate => Need::FirstLast,
        Agg::Quantile(_) => Need::Sketch,
    }
}

/// What [`collect`] gathers: the source's name and, per tag set, its tags and steps.
pub struct Collected {
    /// `raw` or the tier's name.
    pub tier: String,
    /// First step start.
    pub from: i64,
    /// Per matching tag set.
    pub sets: Vec<(BTreeMap<String, String>, Steps)>,
}

/// Reads `field` of every tag set of `measurement` matching `tags` into steps of `step_ns`.
#[allow(clippy::too_many_arguments)]
pub fn collect(
    reader: &Reader,
    plan: &Plan,
    measurement: &str,
    field: &str,
    tags: &[(String, String)],
    from: i64,
    to: i64,
    step_ns: i64,
    need: Need,
    now: i64,
) -> Result<Collected, EngineError> {
    if step_ns <= 0 {
        return Err(EngineError::BadQuery("`step` must be positive".into()));
    }
    let from = bucket_start(from, step_ns);
    if to < from {
        return Err(EngineError::BadQuery(format!(
            "`from` is after `to` ({to})"
        )));
    }
    if (to - from) / step_ns > MAX_STEPS {
        return Err(EngineError::BadQuery(format!(
            "{} steps requested, at most {MAX_STEPS}: use a larger `step` or a shorter range",
            (to - from) / step_ns
        )));
    }
    let (conn, path) = (reader.conn(), reader.path());
    let source = choose_source(plan, step_ns, from, now);
    let (tier_name, tier) = match source {
        Source::Raw => ("raw".to_string(), None),
        Source::Tier(i) => (plan.tiers[i].name.clone(), Some(&plan.tiers[i])),
    };
    let cursor: i64 = match tier {
        Some(t) => tiers::state(conn, path, t.key())?.cursor,
        None => 0,
    };
    let mut sets = Vec::new();
    for set in dict::tagsets(conn, path, Some(measurement))? {
        if !tags.iter().all(|(k, v)| set.tags.get(k) == Some(v)) {
            continue;
        }
        let Some(sid) = dict::numeric_series(conn, path, set.id, field)? else {
            continue;
        };
        let mut steps = Steps::default();
        if let Some(t) = tier {
            let lo = bucket_start(from, t.res_ns);
            tiers::read_range(conn, path, t.key(), sid, lo, to, need, |bucket, acc| {
                let acc = acc.map_err(|()| EngineError::Corrupt(path.to_path_buf()))?;
                let slot = &mut steps.at(bucket_start(bucket, step_ns)).acc;
                if slot.count == 0 {
                    *slot = acc;
                } else {
                    slot.merge(&acc);
                }
                Ok::<_, EngineError>(())
            })?;
        }
        // Raw points: all of them for the raw source, else only chunks the tier has not
        // rolled up yet.
        let exact = tier.is_none();
        let scan = Scan {
            tagset: Some(set.id),
            after: Some(cursor),
            ts_from: Some(from),
            ts_to: Some(to),
            ..Scan::default()
        };
        chunks::scan(conn, path, &scan, |c| {
            c.decode(path, |ts, s, v| {
                if s != sid || ts < from || ts > to {
                    return;
                }
                if let Some(f) = numeric(&v) {
                    let step = steps.at(bucket_start(ts, step_ns));
                    step.acc.add(ts, f);
                    if exact {
                        step.exact.get_or_insert_with(Vec::new).push(f);
                    }
                }
            })?;
            Ok(ControlFlow::Continue(()))
        })?;
        if !steps.is_empty() {
            sets.push((set.tags, steps));
        }
    }
    Ok(Collected {
        tier: tier_name,
        from,
        sets,
    })
}

fn group_key(
    tags: &BTreeMap<String, String>,
    group_by: &Option<Vec<String>>,
) -> BTreeMap<String, String> {
    match group_by {
        None => tags.clone(),
        Some(keys) => keys
            .iter()
            .filter_map(|k| tags.get(k).map(|v| (k.clone(), v.clone())))
            .collect(),
    }
}

/// The value of `agg` for one step (not `rate`, which needs the previous step).
pub fn value(agg: Agg, s: &StepAcc) -> Option<f64> {
    let a = &s.acc;
    if a.count == 0 {
        return None;
    }
    match agg {
        Agg::Mean => a.mean(),
        Agg::Min => Some(a.min),
        Agg::Max => Some(a.max),
        Agg::Sum => Some(a.sum),
        Agg::Count => Some(a.count as f64),
        Agg::Last => Some(a.last.1),
        Agg::Quantile(q) => s.quantile(q),
        Agg::Rate => None,
    }
}

/// Per-second rates of one series' steps (see the module docs).
pub fn rates(steps: &Steps) -> Vec<(i64, f64)> {
    let mut out = Vec::new();
    let mut prev: Option<(i64, f64)> = None;
    for (t, s) in steps.iter() {
        let a = &s.acc;
        if a.count == 0 {
            continue;
        }
        let reference = prev.unwrap_or(a.first);
        let dt = a.last.0 - reference.0;
        if dt > 0 {
            out.push((t, (a.last.1 - reference.1) * NS as f64 / dt as f64));
        }
        prev = Some(a.last);
    }
    out
}

/// Runs an aggregate query.
pub fn query(
    reader: &Reader,
    plan: &Plan,
    q: &AggQuery,
    now: i64,
) -> Result<AggResult, EngineError> {
    let need = need_of(q.agg);
    let c = collect(
        reader,
        plan,
        &q.measurement,
        &q.field,
        &q.tags,
        q.from,
        q.to,
        q.step_ns,
        need,
        now,
    )?;
    let mut groups: BTreeMap<BTreeMap<String, String>, Vec<Steps>> = BTreeMap::new();
    for (tags, steps) in c.sets {
        groups
            .entry(group_key(&tags, &q.group_by))
            .or_default()
            .push(steps);
    }
    let mut series = Vec::new();
    for (tags, members) in groups {
        let points: Vec<(i64, f64)> = if q.agg == Agg::Rate {
            let mut sum: BTreeMap<i64, f64> = BTreeMap::new();
            for m in &members {
                for (t, r) in rates(m) {
                    *sum.entry(t).or_default() += r;
                }
            }
            sum.into_iter().collect()
        } else {
            // The first member is the base (with one member per group, the default, no
            // step is moved at all).
            let mut members = members.into_iter();
            let mut merged: Steps = members.next().unwrap_or_default();
            for m in members {
                for (t, s) in m {
                    merged.at(t).absorb(s);
                }
            }
            merged
                .iter()
                .filter_map(|(t, s)| value(q.agg, s).map(|v| (t, v)))
                .collect()
        };
        if !points.is_empty() {
            series.push(AggSeries { tags, points });
        }
    }
    Ok(AggResult {
        measurement: q.measurement.clone(),
        field: q.field.clone(),
        agg: q.agg_name.clone(),
        step_ns: q.step_ns,
        tier: c.tier,
        from: c.from,
        to: q.to,
        series,
    })
}

/// Parses `step` (`1m`, `30s`, `1h`, or integer nanoseconds).
pub fn parse_step(s: &str) -> Result<i64, String> {
    if let Ok(n) = s.parse::<i64>() {
        if n > 0 {
            return Ok(n);
        }
    }
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("invalid step {s:?}: {e} (write e.g. 1m, 1h)"))?;
    let ns = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    if ns <= 0 {
        return Err("`step` must be greater than zero".into());
    }
    Ok(ns)
}

/// Builds an [`AggQuery`] from the shared query-string form (`measurement`, `field`,
/// `tag.k=v`, `group_by`, `from`, `to`, `step`, `agg`); `None` when neither `step` nor `agg`
/// is given (a raw query).
pub fn agg_query_from_params(
    params: &HashMap<String, String>,
    now: i64,
) -> Result<Option<AggQuery>, String> {
    let step = params.get("step").filter(|s| !s.is_empty());
    let agg = params.get("agg").filter(|s| !s.is_empty());
    if step.is_none() && agg.is_none() {
        return Ok(None);
    }
    let raw = crate::api::raw_query_from_params(params, now)?;
    let field = raw
        .field
        .clone()
        .ok_or("aggregate queries need `field` (one numeric field)")?;
    let agg_name = agg.cloned().unwrap_or_else(|| "mean".into());
    let agg = Agg::parse(&agg_name)?;
    let step_ns = match step {
        Some(s) => parse_step(s)?,
        // One step over the whole range.
        None => raw.to.saturating_sub(raw.from).saturating_add(1).max(1),
    };
    let group_by = params.get("group_by").map(|g| {
        g.split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(String::from)
            .collect()
    });
    Ok(Some(AggQuery {
        measurement: raw.measurement,
        field,
        tags: raw.tags,
        group_by,
        from: raw.from,
        to: raw.to,
        step_ns,
        agg,
        agg_name,
    }))
}

/// `a / b`, when both are finite and `b > 0`.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

/// The knee of a curve `(x, y)` sorted by `x`: the index `i` where a two-segment
/// least-squares fit (`points[..=i]` and `points[i..]`, each at least 3 points with distinct
/// `x`) has the largest *increase* in slope. `None` when the curve is too short or never
/// gets steeper. Pure; O(n) with prefix sums.
pub fn knee(points: &[(f64, f64)]) -> Option<usize> {
    let n = points.len();
    if n < 5 {
        return None;
    }
    // Prefix sums of x, y, xx, xy.
    let mut pre = vec![[0.0f64; 4]; n + 1];
    for (i, (x, y)) in points.iter().enumerate() {
        let p = pre[i];
        pre[i + 1] = [p[0] + x, p[1] + y, p[2] + x * x, p[3] + x * y];
    }
    let slope = |a: usize, b: usize| -> Option<f64> {
        // Points a..b (exclusive).
        let k = (b - a) as f64;
        let s: Vec<f64> = (0..4).map(|j| pre[b][j] - pre[a][j]).collect();
        let var = s[2] - s[0] * s[0] / k;
        if var <= 1e-12 * (1.0 + s[2].abs()) {
            return None;
        }
        Some((s[3] - s[0] * s[1] / k) / var)
    };
    let mut best: Option<(usize, f64)> = None;
    for i in 2..n - 2 {
        let (Some(l), Some(r)) = (slope(0, i + 1), slope(i, n)) else {
            continue;
        };
        let jump = r - l;
        if jump > 1e-9 * (1.0 + l.abs() + r.abs()) && best.map_or(true, |(_, b)| jump > b) {
            best = Some((i, jump));
        }
    }
    best.map(|(i, _)| i)
}

/// `[inference]`
#[derive(Debug, Clone, Default, serde::Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct InferenceConfig {
    /// Model name -> its best batch size, for batch efficiency.
    pub optimal_batch: BTreeMap<String, f64>,
}

/// An inference-signals query.
#[derive(Debug, Clone)]
pub struct InferenceQuery {
    /// Only this model.
    pub model: Option<String>,
    /// Start, ns.
    pub from: i64,
    /// End, ns.
    pub to: i64,
    /// Step, ns.
    pub step_ns: i64,
}

fn json_num(v: Option<f64>) -> serde_json::Value {
    v.filter(|v| v.is_finite())
        .map_or(serde_json::Value::Null, |v| v.into())
}

/// Derived signals of the `inference` measurement per model and step: p50/p95/p99 of
/// `wall_ms` and `gpu_ms`, p99/p50 and p99/p95 of `wall_ms`, throughput (requests per
/// second), GPU share (sum gpu_ms / sum wall_ms), mean overhead (mean wall_ms - mean
/// gpu_ms), batch efficiency (mean `batch_size` / the model's `optimal_batch`), a summary
/// over the whole range, and the latency-throughput curve with its [`knee`].
pub fn inference(
    reader: &Reader,
    plan: &Plan,
    optimal_batch: &BTreeMap<String, f64>,
    q: &InferenceQuery,
    now: i64,
) -> Result<serde_json::Value, EngineError> {
    let tags: Vec<(String, String)> = q
        .model
        .iter()
        .map(|m| ("model".to_string(), m.clone()))
        .collect();
    let mut per_model: BTreeMap<String, [Steps; 3]> = BTreeMap::new();
    let mut tier = String::new();
    let mut from = q.from;
    for (fi, field) in ["wall_ms", "gpu_ms", "batch_size"].into_iter().enumerate() {
        let c = collect(
            reader,
            plan,
            "inference",
            field,
            &tags,
            q.from,
            q.to,
            q.step_ns,
            if fi < 2 { Need::All } else { Need::Sum },
            now,
        )?;
        tier = c.tier;
        from = c.from;
        for (set_tags, steps) in c.sets {
            let model = set_tags.get("model").cloned().unwrap_or_default();
            let slot = &mut per_model.entry(model).or_default()[fi];
            for (t, s) in steps {
                slot.at(t).merge(&s);
            }
        }
    }
    let step_s = q.step_ns as f64 / NS as f64;
    let signals = |w: &StepAcc, g: &StepAcc, b: &StepAcc, seconds: f64, opt: Option<f64>| {
        let (p50, p95, p99) = (w.quantile(0.5), w.quantile(0.95), w.quantile(0.99));
        let count = w.acc.count.max(g.acc.count);
        serde_json::json!({
            "count": count,
            "throughput_per_s": count as f64 / seconds,
            "wall_ms": {"p50": json_num(p50), "p95": json_num(p95), "p99": json_num(p99), "mean": json_num(w.acc.mean())},
            "gpu_ms": {"p50": json_num(g.quantile(0.5)), "p95": json_num(g.quantile(0.95)), "p99": json_num(g.quantile(0.99)), "mean": json_num(g.acc.mean())},
            "p99_p50": json_num(ratio(p99, p50)),
            "p99_p95": json_num(ratio(p99, p95)),
            "gpu_share": json_num(ratio(Some(g.acc.sum), Some(w.acc.sum)).filter(|_| g.acc.count > 0)),
            "overhead_ms": json_num(match (w.acc.mean(), g.acc.mean()) { (Some(a), Some(b)) => Some(a - b), _ => None }),
            "batch_mean": json_num(b.acc.mean()),
            "batch_efficiency": json_num(ratio(b.acc.mean(), opt)),
        })
    };
    let mut models = Vec::new();
    for (model, [wall, gpu, batch]) in per_model {
        let opt = optimal_batch.get(&model).copied();
        let mut times: Vec<i64> = wall.keys().chain(gpu.keys()).chain(batch.keys()).collect();
        times.sort_unstable();
        times.dedup();
        let empty = StepAcc::default();
        let mut steps = Vec::new();
        let mut curve: Vec<(f64, f64, f64, i64)> = Vec::new();
        let (mut tw, mut tg, mut tb) = (StepAcc::default(), StepAcc::default(), StepAcc::default());
        for t in &times {
            let w = wall.get(*t).unwrap_or(&empty);
            let g = gpu.get(*t).unwrap_or(&empty);
            let b = batch.get(*t).unwrap_or(&empty);
            tw.merge(w);
            tg.merge(g);
            tb.merge(b);
            let mut s = signals(w, g, b, step_s, opt);
            s["t"] = (*t).into();
            steps.push(s);
            if let (Some(p50), Some(p99)) = (w.quantile(0.5), w.quantile(0.99)) {
                curve.push((w.acc.count as f64 / step_s, p50, p99, *t));
            }
        }
        curve.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.3.cmp(&b.3)));
        let k = knee(&curve.iter().map(|c| (c.0, c.2)).collect::<Vec<_>>());
        let seconds = ((q.to - from) as f64 / NS as f64).max(step_s);
        models.push(serde_json::json!({
            "model": model,
            "optimal_batch": json_num(opt),
            "summary": signals(&tw, &tg, &tb, seconds, opt),
            "steps": steps,
            "curve": curve.iter().map(|c| serde_json::json!({"throughput_per_s": c.0, "p50_ms": c.1, "p99_ms": c.2, "t": c.3})).collect::<Vec<_>>(),
            "knee": k.map(|i| serde_json::json!({"throughput_per_s": curve[i].0, "p50_ms": curve[i].1, "p99_ms": curve[i].2, "t": curve[i].3})),
        }));
    }
    Ok(serde_json::json!({
        "measurement": "inference",
        "step_ns": q.step_ns,
        "tier": tier,
        "from": from,
        "to": q.to,
        "models": models,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollup::{RetentionConfig, RollupConfig};

    fn plan() -> Plan {
        Plan::new(&RollupConfig::default(), &RetentionConfig::default()).unwrap()
    }

    #[test]
    fn source_is_the_coarsest_tier_that_fits_and_covers() {
        let p = plan();
        let now = 400 * 86_400 * NS;
        let h = 3600 * NS;
        assert_eq!(choose_source(&p, NS, now - h, now), Source::Raw);
        assert_eq!(choose_source(&p, 90 * NS, now - h, now), Source::Raw);
        assert_eq!(
            choose_source(&p, 60 * NS, now - 24 * h, now),
            Source::Tier(0)
        );
        assert_eq!(
            choose_source(&p, 300 * NS, now - 24 * h, now),
            Source::Tier(0)
        );
        assert_eq!(choose_source(&p, h, now - 24 * h, now), Source::Tier(1));
        // 1 min retention (30 d) does not cover 60 days: the 1 h tier still fits a 2 h step.
        assert_eq!(
            choose_source(&p, 2 * h, now - 60 * 24 * h, now),
            Source::Tier(1)
        );
        // A 1 min step over 60 days: no tier both fits and covers; the longest-kept one that
        // fits answers.
        assert_eq!(
            choose_source(&p, 60 * NS, now - 60 * 24 * h, now),
            Source::Tier(0)
        );
    }

    #[test]
    fn knee_is_where_the_slope_jumps() {
        // Flat latency up to 100 req/s, then steep.
        let pts: Vec<(f64, f64)> = (0..20)
            .map(|i| {
                let x = 10.0 * i as f64;
                let y = if x <= 100.0 {
                    20.0 + 0.01 * x
                } else {
                    21.0 + 2.0 * (x - 100.0)
                };
                (x, y)
            })
            .collect();
        assert_eq!(knee(&pts), Some(10));
        // A straight line has no knee; neither has a too-short curve.
        let line: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 2.0 * i as f64)).collect();
        assert_eq!(knee(&line), None);
        assert_eq!(knee(&pts[..4]), None);
        // A curve that flattens (slope drops) has no knee either.
        let flat: Vec<(f64, f64)> = pts.iter().map(|(x, y)| (*x, -y)).collect();
        assert_eq!(knee(&flat), None);
    }

    #[test]
    fn ratios_and_rates() {
        assert_eq!(ratio(Some(30.0), Some(10.0)), Some(3.0));
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
        let mut steps = Steps::default();
        for (t, v) in [(0, 0.0), (10 * NS, 10.0), (60 * NS, 60.0), (70 * NS, 90.0)] {
            steps.at(bucket_start(t, 60 * NS)).acc.add(t, v);
        }
        assert_eq!(rates(&steps), vec![(0, 1.0), (60 * NS, 80.0 / 60.0)]);
    }

    #[test]
    fn agg_names_and_params() {
        assert_eq!(Agg::parse("p99"), Ok(Agg::Quantile(0.99)));
        assert!(Agg::parse("median").is_err());
        let p: HashMap<String, String> = [
            ("measurement", "m"),
            ("field", "v"),
            ("step", "1m"),
            ("agg", "p999"),
            ("group_by", "model"),
            ("from", "0"),
            ("to", "100"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let q = agg_query_from_params(&p, 1000).unwrap().unwrap();
        assert_eq!((q.step_ns, q.agg), (60 * NS, Agg::Quantile(0.999)));
        assert_eq!(q.group_by, Some(vec!["model".to_string()]));
        let mut raw = p.clone();
        raw.remove("step");
        raw.remove("agg");
        assert!(agg_query_from_params(&raw, 1000).unwrap().is_none());
        let mut nofield = p;
        nofield.remove("field");
        assert!(agg_query_from_params(&nofield, 1000).is_err());
    }
}

#[cfg(test)]
mod agg_tests {
    //! Every agg, read from the 1-minute tier plus a raw tail not rolled up yet, against the
    //! same agg computed directly from the points.
    use super::*;
    use crate::config::Synchronous;
    use crate::rollup::tests::write;
    use crate::rollup::{Job, RetentionConfig, RollupConfig};
    use crate::store::Writer;

    const NOW: i64 = 400 * 86_400 * NS;

    /// The agg of `pts` (time-ordered) by itself, as the engine defines it.
    fn expected(agg: Agg, pts: &[(i64, f64)], prev_last: Option<(i64, f64)>) -> f64 {
        let vals: Vec<f64> = pts.iter().map(|p| p.1).collect();
        let (first, last) = (pts[0], pts[pts.len() - 1]);
        match agg {
            Agg::Mean => vals.iter().sum::<f64>() / vals.len() as f64,
            Agg::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
            Agg::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Agg::Sum => vals.iter().sum(),
            Agg::Count => vals.len() as f64,
            Agg::Last => last.1,
            Agg::Rate => {
                let r = prev_last.unwrap_or(first);
                (last.1 - r.1) * NS as f64 / (last.0 - r.0) as f64
            }
            Agg::Quantile(q) => {
                let mut v = vals;
                v.sort_by(f64::total_cmp);
                v[(q * (v.len() - 1) as f64).floor() as usize]
            }
        }
    }

    /// `(step start, expected agg)` of time-ordered `pts` cut into steps.
    fn expected_steps(agg: Agg, pts: &[(i64, f64)], step: i64) -> Vec<(i64, f64)> {
        let mut out = Vec::new();
        let (mut i, mut prev) = (0, None);
        while i < pts.len() {
            let s = bucket_start(pts[i].0, step);
            let j = pts[i..]
                .iter()
                .position(|p| p.0 >= s + step)
                .map_or(pts.len(), |k| i + k);
            out.push((s, expected(agg, &pts[i..j], prev)));
            prev = Some(pts[j - 1]);
            i = j;
        }
        out
    }

    fn assert_close(what: &str, agg: Agg, got: &[(i64, f64)], want: &[(i64, f64)]) {
        assert_eq!(got.len(), want.len(), "{what}");
        // Percentiles come from sketches (0.5% relative); everything else is exact.
        let tol = if matches!(agg, Agg::Quantile(_)) {
            0.01
        } else {
            1e-9
        };
        for ((gt, gv), (wt, wv)) in got.iter().zip(want) {
            assert_eq!(gt, wt, "{what}");
            assert!(
                (gv - wv).abs() <= tol * wv.abs().max(1.0),
                "{what} at {gt}: {gv} vs {wv}"
            );
        }
    }

    #[test]
    fn every_agg_from_the_tier_and_the_raw_tail_equals_the_points() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let t0 = NOW - 2 * 3600 * NS;
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut series: Vec<(&str, Vec<(i64, f64)>)> = Vec::new();
        for (key, offset) in [("m,s=a", 0), ("m,s=b", 3 * NS)] {
            let pts: Vec<(i64, f64)> = (0..520)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (t0 + offset + i * 7 * NS, 1.0 + (x % 10_000) as f64 / 100.0)
                })
                .collect();
            series.push((key, pts));
        }
        // The first 50 minutes are rolled up; the last ~10 stay raw (the tail).
        let cut = t0 + 50 * 60 * NS;
        let part = |pts: &[(i64, f64)], before: bool| -> Vec<(i64, f64)> {
            pts.iter()
                .copied()
                .filter(|p| (p.0 < cut) == before)
                .collect()
        };
        for (key, pts) in &series {
            write(&mut w, key, &part(pts, true));
        }
        let plan = Plan::new(
            &RollupConfig {
                tiers: vec!["1m".into()],
                ..Default::default()
            },
            &RetentionConfig::default(),
        )
        .unwrap();
        Job::open(dir.path(), plan.clone())
            .unwrap()
            .run_once(NOW, &|| false)
            .unwrap();
        for (key, pts) in &series {
            write(&mut w, key, &part(pts, false));
        }
        let mut all: Vec<(i64, f64)> = series.iter().flat_map(|s| s.1.clone()).collect();
        all.sort_by_key(|p| p.0);
        let reader = Reader::open(dir.path()).unwrap();
        let aggs = [
            "mean", "min", "max", "sum", "count", "last", "rate", "p50", "p99",
        ];
        for step in [60 * NS, 300 * NS] {
            for name in aggs {
                let agg = Agg::parse(name).unwrap();
                let mut q = AggQuery {
                    measurement: "m".into(),
                    field: "v".into(),
                    tags: vec![],
                    group_by: None,
                    from: t0,
                    to: NOW,
                    step_ns: step,
                    agg,
                    agg_name: name.into(),
                };
                let res = query(&reader, &plan, &q, NOW).unwrap();
                assert_eq!(res.tier, "1m");
                assert_eq!(res.series.len(), 2, "{name}");
                for (got, (key, pts)) in res.series.iter().zip(&series) {
                    let what = format!("{name} step {step} {key}");
                    assert_close(&what, agg, &got.points, &expected_steps(agg, pts, step));
                }
                // Grouped into one series (rates add per series, so they are left out).
                if agg != Agg::Rate {
                    q.group_by = Some(vec![]);
                    let merged = query(&reader, &plan, &q, NOW).unwrap();
                    assert_eq!(merged.series.len(), 1);
                    let what = format!("grouped {name} step {step}");
                    let want = expected_steps(agg, &all, step);
                    assert_close(&what, agg, &merged.series[0].points, &want);
                }
            }
        }
    }
}
