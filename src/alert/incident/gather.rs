//! Reads what the triage snapshot compares: each field's statistics in the spike window and
//! in the baseline hour through the query engine (`engine::collect`: the 1-minute tier plus
//! the raw tail, as a dashboard reads), the `edgewatch_event` points of the window and the
//! newest per-process GPU memory points through the store's raw query, and which tag values
//! (versions) had data in each span. Read-only; it never scores anything (that is
//! `snapshot.rs`).

use std::collections::{BTreeMap, BTreeSet};

use super::snapshot::{Event, Process, Span};
use crate::collect::event::KIND_TAGS;
use crate::engine::{collect, EngineError, Need};
use crate::model::Value;
use crate::rollup::Plan;
use crate::store::query::RawQuery;
use crate::store::Reader;

/// The step the spans are read in: the finest rollup tier, so both spans are whole minutes.
pub const STEP_NS: i64 = 60_000_000_000;
/// Most event points read from one window.
const MAX_EVENTS: usize = 500;
/// Most per-process points read for the GPU-memory list.
const MAX_PROCESS_POINTS: usize = 20_000;

/// One span's merged statistics of one field.
#[derive(Debug, Clone, Default)]
pub struct Stat {
    acc: crate::store::bucket::Acc,
    /// Every value, while every step came from raw points (exact percentiles).
    exact: Option<Vec<f64>>,
    inexact: bool,
}

impl Stat {
    /// Adds one step's accumulator.
    pub fn absorb(&mut self, s: &crate::engine::StepAcc) {
        self.acc.merge(&s.acc);
        match (&s.exact, self.inexact) {
            (Some(v), false) => self.exact.get_or_insert_with(Vec::new).extend_from_slice(v),
            _ => {
                self.inexact = true;
                self.exact = None;
            }
        }
    }

    /// Merges another span's statistics in.
    pub fn merge(&mut self, o: &Stat) {
        self.acc.merge(&o.acc);
        if self.inexact || o.inexact {
            self.inexact = true;
            self.exact = None;
        } else if let Some(v) = &o.exact {
            self.exact.get_or_insert_with(Vec::new).extend_from_slice(v);
        }
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.acc.count
    }

    /// Mean.
    pub fn mean(&self) -> Option<f64> {
        self.acc.mean()
    }

    /// The `q`-quantile: exact from raw values, else from the merged sketch.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.acc.count == 0 {
            return None;
        }
        match &self.exact {
            Some(v) if !v.is_empty() && !self.inexact => {
                let mut v = v.clone();
                v.sort_by(f64::total_cmp);
                Some(v[(q * (v.len() - 1) as f64).floor() as usize])
            }
            _ => self.acc.sketch.quantile(q),
        }
    }
}

/// Tag sets with their pairs.
pub type Pairs = Vec<(BTreeMap<String, String>, Pair)>;

/// One tag set's statistics in the baseline and in the window.
#[derive(Debug, Clone, Default)]
pub struct Pair {
    /// The baseline hour.
    pub base: Stat,
    /// The spike window.
    pub win: Stat,
}

impl Pair {
    /// Merges another tag set's pair in.
    pub fn merge(&mut self, o: &Pair) {
        self.base.merge(&o.base);
        self.win.merge(&o.win);
    }
}

/// `field` of every tag set of `measurement` matching `tags` over `[from, to]`, merged per
/// 1-minute step (step start, statistics), in time order.
#[allow(clippy::too_many_arguments)]
pub fn steps(
    reader: &Reader,
    plan: &Plan,
    measurement: &str,
    field: &str,
    tags: &[(String, String)],
    from: i64,
    to: i64,
    now: i64,
) -> Result<BTreeMap<i64, Stat>, EngineError> {
    let c = collect(
        reader,
        plan,
        measurement,
        field,
        tags,
        from,
        to,
        STEP_NS,
        Need::All,
        now,
    )?;
    let mut out: BTreeMap<i64, Stat> = BTreeMap::new();
    for (_, steps) in c.sets {
        for (t, s) in steps.iter() {
            out.entry(t).or_default().absorb(s);
        }
    }
    Ok(out)
}

/// What one snapshot reads with.
pub struct Gather<'a> {
    /// The store.
    pub reader: &'a Reader,
    /// Tiers (which one answers a 1-minute step).
    pub plan: &'a Plan,
    /// The baseline hour.
    pub base: Span,
    /// The spike window.
    pub win: Span,
    /// Where events are read: the window with a lead.
    pub events: Span,
    /// The evaluation time.
    pub now: i64,
}

impl Gather<'_> {
    /// `field` of every tag set of `measurement` matching `tags`, per tag set.
    pub fn pairs(
        &self,
        measurement: &str,
        field: &str,
        tags: &[(String, String)],
    ) -> Result<Pairs, EngineError> {
        let c = collect(
            self.reader,
            self.plan,
            measurement,
            field,
            tags,
            self.base.from_ns,
            self.win.to_ns,
            STEP_NS,
            Need::All,
            self.now,
        )?;
        let mut out = Vec::with_capacity(c.sets.len());
        for (set_tags, steps) in c.sets {
            let mut p = Pair::default();
            for (t, s) in steps.iter() {
                if t >= self.win.from_ns {
                    p.win.absorb(s);
                } else if t >= self.base.from_ns {
                    p.base.absorb(s);
                }
            }
            out.push((set_tags, p));
        }
        Ok(out)
    }

    /// `field` of every matching tag set merged into one pair, after `keep` picked the sets.
    pub fn merged(
        &self,
        measurement: &str,
        field: &str,
        tags: &[(String, String)],
        keep: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> Result<Pair, EngineError> {
        let mut p = Pair::default();
        for (t, one) in self.pairs(measurement, field, tags)? {
            if keep(&t) {
                p.merge(&one);
            }
        }
        Ok(p)
    }

    /// The values of tag `key` on tag sets of `measurement` (with data in `field`) in the
    /// baseline and in the window, grouped by the value of tag `by` (empty `by`: one group).
    #[allow(clippy::type_complexity)]
    pub fn tag_values(
        &self,
        measurement: &str,
        field: &str,
        tags: &[(String, String)],
        key: &str,
        by: &str,
    ) -> Result<BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>, EngineError> {
        let mut out: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
        for (t, p) in self.pairs(measurement, field, tags)? {
            let Some(v) = t.get(key) else { continue };
            let group = if by.is_empty() {
                String::new()
            } else {
                t.get(by).cloned().unwrap_or_default()
            };
            let e = out.entry(group).or_default();
            if p.base.count() > 0 {
                e.0.insert(v.clone());
            }
            if p.win.count() > 0 {
                e.1.insert(v.clone());
            }
        }
        Ok(out)
    }

    /// The `edgewatch_event` points of `span`, in time order.
    pub fn events(&self, span: Span) -> Result<Vec<Event>, EngineError> {
        let res = self.reader.query_raw(&RawQuery {
            measurement: "edgewatch_event".into(),
            field: None,
            tags: vec![],
            from: span.from_ns,
            to: span.to_ns,
            limit: MAX_EVENTS,
        })?;
        // One event is one point: its fields are separate series at the same timestamp.
        let mut by_point: BTreeMap<(i64, String), Event> = BTreeMap::new();
        for s in res.series {
            // The kind: `kind`, or `event` on points stored before it.
            let kind = KIND_TAGS
                .iter()
                .find_map(|k| s.tags.get(*k))
                .cloned()
                .unwrap_or_default();
            for (ts, v) in s.points {
                let e = by_point.entry((ts, kind.clone())).or_insert_with(|| Event {
                    at_ns: ts,
                    event: kind.clone(),
                    tags: s
                        .tags
                        .iter()
                        .filter(|(k, _)| !KIND_TAGS.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    fields: BTreeMap::new(),
                });
                let text = match v {
                    Value::Str(s) => s,
                    other => match crate::store::bucket::numeric(&other) {
                        Some(f) => f.to_string(),
                        None => continue,
                    },
                };
                e.fields.insert(s.field.clone(), text);
            }
        }
        Ok(by_point.into_values().collect())
    }

    /// The newest GPU memory per process in the last two minutes before the firing: NVML's
    /// `gpu_process mem_used_mb` and the Jetson nvmap's `jetson_process gpu_mem_mb`, highest
    /// first, at most `n`.
    pub fn gpu_processes(&self, n: usize) -> Result<Vec<Process>, EngineError> {
        let mut newest: BTreeMap<(String, i64), (i64, Process)> = BTreeMap::new();
        for (measurement, field) in [
            ("gpu_process", "mem_used_mb"),
            ("jetson_process", "gpu_mem_mb"),
        ] {
            let res = self.reader.query_raw(&RawQuery {
                measurement: measurement.into(),
                field: Some(field.into()),
                tags: vec![],
                from: self.win.to_ns.saturating_sub(120 * 1_000_000_000),
                to: self.win.to_ns,
                limit: MAX_PROCESS_POINTS,
            })?;
            for s in res.series {
                let Some(pid) = s.tags.get("pid").and_then(|p| p.parse::<i64>().ok()) else {
                    continue;
                };
                let Some((ts, v)) = s.points.last() else {
                    continue;
                };
                let Some(mb) = crate::store::bucket::numeric(v) else {
                    continue;
                };
                let name = s.tags.get("process").cloned().unwrap_or_default();
                let entry = newest.entry((measurement.to_string(), pid)).or_insert((
                    i64::MIN,
                    Process {
                        pid,
                        name: name.clone(),
                        cpu_pct: None,
                        rss_mb: None,
                        gpu_mem_mb: Some(0.0),
                        source: Some(measurement.to_string()),
                    },
                ));
                // Several GPUs: a process's memory on each adds up at the newest time.
                if *ts > entry.0 {
                    entry.0 = *ts;
                    entry.1.gpu_mem_mb = Some(mb);
                } else if *ts == entry.0 {
                    entry.1.gpu_mem_mb = Some(entry.1.gpu_mem_mb.unwrap_or(0.0) + mb);
                }
            }
        }
        let mut out: Vec<Process> = newest.into_values().map(|(_, p)| p).collect();
        out.sort_by(|a, b| {
            b.gpu_mem_mb
                .unwrap_or(0.0)
                .total_cmp(&a.gpu_mem_mb.unwrap_or(0.0))
                .then(a.pid.cmp(&b.pid))
        });
        out.truncate(n);
        Ok(out)
    }
}
