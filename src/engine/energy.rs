//! Energy per inference for `/api/v1/inference` and per output token for `/api/v1/llm`: the
//! board's input power and the GPU rail, integrated by trapezoids over the stored,
//! time-stamped power samples of each step, then attributed to the workloads that ran in the
//! step by their share of summed `gpu_ms` in the covered time (falling back to `wall_ms`,
//! then to counts). A workload is a model of the `inference` measurement or of `llm`; an LLM
//! request's `e2e_ms` counts as both its wall and its GPU time (decoding keeps the GPU busy
//! for the whole request), and its `output_tokens` are summed over the same covered time,
//! the divisor of tokens per joule. Read-only; it never
//! writes and never invents a number: a step whose power samples cover less than half of
//! it has no energy (`null` in the answer), and so has every model's energy per inference
//! in that step.
//!
//! Which series is the board's input: the first tegrastats rail of [`BOARD_RAILS`] present,
//! else the sum of every `jetson_power` rail (a lower bound: `lower_bound` is set; AGX Orin
//! and AGX Xavier print no input rail), else NVML's energy counter `energy_mj` of every
//! `gpu` (by difference), else NVML's `power_w` of every `gpu` (summed). The GPU rail: the
//! first of [`GPU_RAILS`], else the same NVML series. Rails are `current_mw` (mW), NVML
//! `power_w` (W) and `energy_mj` (mJ); energies are mJ.
//!
//! Integration ([`integrate`], pure): consecutive samples of one series at most `max_gap`
//! apart form a piece, integrated by a trapezoid; a piece crossing a step boundary is cut
//! there by linear interpolation. `max_gap` is 5 times the series' median sample interval,
//! so a stopped collector leaves a hole rather than a straight line across it. An energy
//! counter's consecutive samples are a piece of constant power, so the integral is the
//! counter's difference. From a rollup tier (long ranges) each step's mean power is held
//! from its first to its last sample and consecutive steps are joined by a trapezoid when
//! at most a step apart (an approximation at step granularity: a hole inside a step is not
//! seen; a counter uses each step's first and last values, exact). A step's coverage is
//! the time its pieces span (where every summed series has pieces); under 50 % of the step
//! (clipped to the query's end) means `null`. Above, the energy of the covered time is
//! divided by the inferences in that time only (exactly from raw points; from a tier, the
//! step's inferences taken as spread evenly between its first and last, [`Done::within`]),
//! so a collector gap does not dilute it over inferences no sample measured. Each step
//! reports its coverage.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

mod integrate;

pub use integrate::{
    contains, covered, integrate, intersect, max_gap, pieces_from_counter, pieces_from_samples,
    pieces_from_steps, span_len, step_power, Piece, Spans, StepPower,
};

use super::{choose_source, collect, EngineError, Need, Source, NS};
use crate::rollup::Plan;
use crate::store::bucket::{numeric, Acc};
use crate::store::chunks::{self, Scan};
use crate::store::{dict, Reader};

/// The least share of a step that power samples must cover for its energy to be reported.
pub const MIN_COVERAGE: f64 = 0.5;

/// Board input rails, in order of preference: `VDD_IN` (Orin Nano/NX, Xavier NX, TX1/TX2
/// on JetPack 3), `POM_5V_IN` (Nano, TX2 on JetPack 4), `VIN` (Thor, when printed). AGX
/// Orin and AGX Xavier print no input rail: their sum of rails is a lower bound.
pub const BOARD_RAILS: [&str; 3] = ["VDD_IN", "POM_5V_IN", "VIN"];
/// GPU rails, in order of preference: `VDD_GPU_SOC` (AGX Orin: GPU and SoC), `VDD_GPU`
/// (Thor), `GPU` (AGX Xavier), `POM_5V_GPU` (Nano, TX2), `VDD_CPU_GPU_CV` (Orin Nano/NX,
/// Xavier NX: CPU, GPU and CV together).
pub const GPU_RAILS: [&str; 5] = [
    "VDD_GPU_SOC",
    "VDD_GPU",
    "GPU",
    "POM_5V_GPU",
    "VDD_CPU_GPU_CV",
];

/// The first of `prefs` among the `present` rails. Pure.
pub fn pick_rail<'a>(present: &[String], prefs: &[&'a str]) -> Option<&'a str> {
    prefs
        .iter()
        .find(|p| present.iter().any(|r| r == *p))
        .copied()
}

/// What one model did in one step, as read: every inference's time and value (raw points),
/// or the step's aggregate (from a tier: count, sum, first and last time).
#[derive(Debug, Clone, PartialEq)]
pub enum Done {
    /// `(ts, value)` of each inference.
    Points(Vec<(i64, f64)>),
    /// A tier's aggregate.
    Agg {
        /// Inferences.
        count: u64,
        /// Summed value.
        sum: f64,
        /// The first inference's time, ns.
        first: i64,
        /// The last inference's time, ns.
        last: i64,
    },
}

impl Default for Done {
    fn default() -> Self {
        Done::Points(Vec::new())
    }
}

impl Done {
    /// Adds an aggregate (merged with what is there: counts and sums added, the span
    /// widened).
    pub fn add_agg(&mut self, count: u64, sum: f64, first: i64, last: i64) {
        if count == 0 {
            return;
        }
        *self = match std::mem::take(self) {
            Done::Agg {
                count: c,
                sum: s,
                first: f,
                last: l,
            } => Done::Agg {
                count: c + count,
                sum: s + sum,
                first: f.min(first),
                last: l.max(last),
            },
            Done::Points(p) => {
                let (pc, ps) = (p.len() as u64, p.iter().map(|x| x.1).sum::<f64>());
                let (pf, pl) = (
                    p.iter().map(|x| x.0).min().unwrap_or(first),
                    p.iter().map(|x| x.0).max().unwrap_or(last),
                );
                Done::Agg {
                    count: count + pc,
                    sum: sum + ps,
                    first: first.min(pf),
                    last: last.max(pl),
                }
            }
        };
    }

    /// The inferences and their summed value within `spans`: exact from points; from an
    /// aggregate, the share of its span (first to last inference) that `spans` cover, the
    /// inferences taken as spread evenly over it (a single instant: all or none). Pure.
    pub fn within(&self, spans: &[(i64, i64)]) -> (f64, f64) {
        match self {
            Done::Points(p) => p
                .iter()
                .filter(|(t, _)| contains(spans, *t))
                .fold((0.0, 0.0), |(n, s), (_, v)| (n + 1.0, s + v)),
            Done::Agg {
                count,
                sum,
                first,
                last,
            } => {
                let share = if last > first {
                    span_len(&intersect(spans, &[(*first, *last)])) as f64 / (last - first) as f64
                } else if contains(spans, *first) {
                    1.0
                } else {
                    0.0
                };
                (*count as f64 * share, sum * share)
            }
        }
    }
}

/// A model's `wall_ms` and `gpu_ms` in a step, within `spans`.
pub fn work_within(done: &[Done], spans: &[(i64, i64)]) -> Work {
    let (wall_n, wall_ms) = done[0].within(spans);
    let (gpu_n, gpu_ms) = done[1].within(spans);
    Work {
        gpu_ms,
        wall_ms,
        count: wall_n.max(gpu_n),
        tokens: done.get(2).map_or(0.0, |d| d.within(spans).1),
    }
}

/// What one model did in one step, for attribution.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    /// Sum of `gpu_ms`.
    pub gpu_ms: f64,
    /// Sum of `wall_ms`.
    pub wall_ms: f64,
    /// Inferences (fractional when estimated from a tier, see [`Done::within`]).
    pub count: f64,
    /// Output tokens (LLM workloads).
    pub tokens: f64,
}

/// Each model's share of a step's energy: its part of the summed `gpu_ms` when any is
/// positive, else of `wall_ms`, else of the counts, else of the output tokens (a scraped
/// LLM server reports tokens, not requests' times); all zero when nothing ran. Pure.
pub fn shares(work: &[Work]) -> Vec<f64> {
    let pick = |f: fn(&Work) -> f64| -> Option<Vec<f64>> {
        let total: f64 = work.iter().map(f).sum();
        (total > 0.0 && total.is_finite()).then(|| work.iter().map(|w| f(w) / total).collect())
    };
    pick(|w| w.gpu_ms)
        .or_else(|| pick(|w| w.wall_ms))
        .or_else(|| pick(|w| w.count))
        .or_else(|| pick(|w| w.tokens))
        .unwrap_or_else(|| vec![0.0; work.len()])
}

/// One power source: its name, its series as pieces, and whether it is a lower bound.
#[derive(Debug, Clone, Default)]
pub struct Power {
    /// e.g. `tegrastats:VDD_IN`, `tegrastats:sum_of_rails`, `nvml:power_w`.
    pub source: Option<String>,
    /// Pieces per summed series.
    pub series: Vec<Vec<Piece>>,
    /// The sum of rails: the board draws at least this.
    pub lower_bound: bool,
}

/// A workload energy is attributed to: the measurement (`inference` or `llm`), the model,
/// and the `scrape` target that reported it (empty for points an app sent).
pub type Workload = (&'static str, String, String);

/// The measurements whose work shares the energy: `(measurement, wall field, GPU field,
/// tokens field)`.
const WORKLOADS: [(&str, &str, &str, Option<&str>); 2] = [
    ("inference", "wall_ms", "gpu_ms", None),
    ("llm", "e2e_ms", "e2e_ms", Some("output_tokens")),
];

/// One model's energy in one step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelStep {
    /// Board energy attributed to the model, mJ.
    pub board_mj: Option<f64>,
    /// GPU-rail energy attributed to the model, mJ.
    pub gpu_mj: Option<f64>,
    /// Inferences in the time the board's power covers (the divisor of its energy).
    pub count: f64,
    /// Inferences in the time the GPU rail covers, in the steps whose GPU energy is known
    /// (the divisor of the GPU energy).
    pub gpu_count: f64,
    /// Output tokens (LLM requests) in the time the board's power covers.
    pub tokens: f64,
}

impl ModelStep {
    /// `energy_mj_per_inference`, `gpu_energy_mj_per_inference`, `inferences_per_joule`.
    pub fn per_inference(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        let per = |e: Option<f64>, n: f64| e.filter(|_| n > 0.0).map(|e| e / n);
        let ipj = self
            .board_mj
            .filter(|e| *e > 0.0 && self.count > 0.0)
            .map(|e| self.count / (e / 1000.0));
        (
            per(self.board_mj, self.count),
            per(self.gpu_mj, self.gpu_count),
            ipj,
        )
    }

    /// `tokens_per_joule` and `joules_per_1k_tokens` (board energy over the output tokens
    /// in the time it covers).
    pub fn per_token(&self) -> (Option<f64>, Option<f64>) {
        let e = self.board_mj.filter(|e| *e > 0.0 && self.tokens > 0.0);
        (
            e.map(|e| self.tokens / (e / 1000.0)),
            e.map(|e| e / self.tokens),
        )
    }

    /// Adds another step (for the summary: only steps with energy count).
    pub fn add(&mut self, other: &ModelStep) {
        if let Some(b) = other.board_mj {
            self.board_mj = Some(self.board_mj.unwrap_or(0.0) + b);
            self.count += other.count;
            self.tokens += other.tokens;
        }
        if let Some(g) = other.gpu_mj {
            self.gpu_mj = Some(self.gpu_mj.unwrap_or(0.0) + g);
            self.gpu_count += other.gpu_count;
        }
    }
}

/// The energy of a query: per model and step, and the board's energy per step with what
/// no model used (steps without inferences).
#[derive(Debug, Clone, Default)]
pub struct Energy {
    /// Board power source.
    pub board: Power,
    /// GPU power source.
    pub gpu: Power,
    /// `(workload, step start)` -> that workload's energy.
    pub per_model: BTreeMap<(Workload, i64), ModelStep>,
    /// Each step with power or inferences.
    pub steps: Vec<StepEnergy>,
}

/// One step of [`Energy`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepEnergy {
    /// Step start, ns.
    pub t: i64,
    /// Board energy over the covered time, mJ, when known.
    pub board_mj: Option<f64>,
    /// GPU-rail energy over its covered time, mJ, when known.
    pub gpu_mj: Option<f64>,
    /// What no inference used: the board energy when no inference ran in the covered time.
    pub idle_mj: f64,
    /// The share of the step the board's power samples cover.
    pub coverage: f64,
    /// The share of the step the GPU rail's samples cover.
    pub gpu_coverage: f64,
    /// Inferences in the step (every model).
    pub inferences: f64,
    /// Of those, in the time the board's power covers (the ones its energy is divided by).
    pub covered_inferences: f64,
}

impl Energy {
    /// An `inference` model's energy in a step (zero inferences and no energy when
    /// unknown).
    pub fn get(&self, model: &str, t: i64) -> ModelStep {
        self.get_in("inference", model, "", t)
    }

    /// The energy of `model` of `measurement` (sent by an app, or scraped by target
    /// `scrape`) in a step.
    pub fn get_in(
        &self,
        measurement: &'static str,
        model: &str,
        scrape: &str,
        t: i64,
    ) -> ModelStep {
        self.per_model
            .get(&((measurement, model.to_string(), scrape.to_string()), t))
            .copied()
            .unwrap_or_default()
    }

    /// Why there is no energy at all, if so.
    pub fn reason(&self) -> Option<&'static str> {
        if self.board.source.is_none() {
            Some("no power samples: neither a tegrastats rail (jetson_power) nor NVML power_w (gpu) was stored in the range")
        } else if self.steps.iter().all(|s| s.board_mj.is_none()) {
            Some("power samples cover less than 50% of every step")
        } else {
            None
        }
    }

    /// The `energy` object of the answer.
    pub fn to_json(&self) -> serde_json::Value {
        let num = |v: Option<f64>| v.map_or(serde_json::Value::Null, |v| v.into());
        let board: f64 = self.steps.iter().filter_map(|s| s.board_mj).sum();
        let idle: f64 = self.steps.iter().map(|s| s.idle_mj).sum();
        let known = self.steps.iter().any(|s| s.board_mj.is_some());
        serde_json::json!({
            "source": self.board.source,
            "gpu_source": self.gpu.source,
            "lower_bound": self.board.lower_bound,
            "reason": self.reason(),
            "min_coverage": MIN_COVERAGE,
            "board_mj": num(known.then_some(board)),
            "attributed_mj": num(known.then_some(board - idle)),
            "idle_mj": num(known.then_some(idle)),
            "steps": self.steps.iter().map(|s| serde_json::json!({
                "t": s.t, "board_mj": num(s.board_mj), "gpu_mj": num(s.gpu_mj),
                "idle_mj": num(s.board_mj.map(|_| s.idle_mj)),
                "coverage": s.coverage, "gpu_coverage": s.gpu_coverage,
                "inferences": s.inferences, "covered_inferences": s.covered_inferences,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Turns one series' time-stamped samples (and the largest gap that is not a hole) into
/// pieces: [`pieces_from_samples`] for power, [`pieces_from_counter`] for an energy counter.
type ToPieces = fn(&[(i64, f64)], i64) -> Vec<Piece>;

/// The tag that names one power series of `measurement`: `rail` for `jetson_power`, whose
/// points also carry the Jetson's identity tags (`power_mode`, `jetson_clocks`, ...), so
/// one rail is several tag sets over time (one per power mode) and they are one series
/// here. `None`: each tag set is a series (NVML's `gpu`).
fn series_tag(measurement: &str) -> Option<&'static str> {
    (measurement == "jetson_power").then_some("rail")
}

/// The series key of a tag set `id` with `tags` (see [`series_tag`]).
fn series_of(measurement: &str, id: i64, tags: &BTreeMap<String, String>) -> String {
    match series_tag(measurement) {
        Some(k) => format!("{k}={}", tags.get(k).map(String::as_str).unwrap_or("")),
        None => format!("#{id}"),
    }
}

/// Samples `(ts, value * scale)` of `field` of every tag set of `measurement` with tag
/// `key` = `val` (any when `None`), per tag set with its tags, from raw points in
/// `[from, to]`.
#[allow(clippy::type_complexity)]
pub(super) fn raw_points(
    reader: &Reader,
    measurement: &str,
    field: &str,
    tag: Option<(&str, &str)>,
    from: i64,
    to: i64,
    scale: f64,
) -> Result<Vec<(i64, BTreeMap<String, String>, Vec<(i64, f64)>)>, EngineError> {
    let (conn, path) = (reader.conn(), reader.path());
    let mut out = Vec::new();
    for set in dict::tagsets(conn, path, Some(measurement))? {
        if let Some((k, v)) = tag {
            if set.tags.get(k).map(String::as_str) != Some(v) {
                continue;
            }
        }
        let Some(sid) = dict::numeric_series(conn, path, set.id, field)? else {
            continue;
        };
        let mut pts = Vec::new();
        let scan = Scan {
            tagset: Some(set.id),
            ts_from: Some(from),
            ts_to: Some(to),
            ..Scan::default()
        };
        chunks::scan(conn, path, &scan, |c| {
            c.decode(path, |ts, s, v| {
                if s == sid && ts >= from && ts <= to {
                    if let Some(f) = numeric(&v) {
                        pts.push((ts, f * scale));
                    }
                }
            })?;
            Ok(ControlFlow::Continue(()))
        })?;
        // The points the writer held when the read began (`Reader::read_with_held`).
        if let Some(held) = &*reader.held() {
            for (ts, s, v) in held.values_in(set.id, from, to) {
                if let Some(f) = numeric(v).filter(|_| s == sid) {
                    pts.push((ts, f * scale));
                }
            }
        }
        if !pts.is_empty() {
            out.push((set.id, set.tags, pts));
        }
    }
    Ok(out)
}

/// Time-ordered samples `(ts, value * scale)` (see [`raw_points`] for the arguments), per
/// series (tag sets of one [`series_tag`] value merged).
fn raw_samples(
    reader: &Reader,
    measurement: &str,
    field: &str,
    tag: Option<(&str, &str)>,
    from: i64,
    to: i64,
    scale: f64,
) -> Result<Vec<Vec<(i64, f64)>>, EngineError> {
    let mut out: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for (id, tags, pts) in raw_points(reader, measurement, field, tag, from, to, scale)? {
        out.entry(series_of(measurement, id, &tags))
            .or_default()
            .extend(pts);
    }
    Ok(out
        .into_values()
        .map(|mut pts| {
            pts.sort_by_key(|p| p.0);
            pts
        })
        .collect())
}

/// Where the query reads its power from and how.
struct Ctx<'a> {
    reader: &'a Reader,
    plan: &'a Plan,
    from: i64,
    to: i64,
    step_ns: i64,
    now: i64,
    raw: bool,
}

impl Ctx<'_> {
    /// The pieces of each matching series (see [`raw_samples`] for the arguments). Raw
    /// samples are read a step beyond each end, so the edge steps have their neighbours
    /// (the integration is clipped to the steps anyway).
    fn pieces(
        &self,
        measurement: &str,
        field: &str,
        tag: Option<(&str, &str)>,
        scale: f64,
    ) -> Result<Vec<Vec<Piece>>, EngineError> {
        if self.raw {
            return self.raw_pieces(measurement, field, tag, scale, pieces_from_samples);
        }
        let tags: Vec<(String, String)> = tag
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let c = collect(
            self.reader,
            self.plan,
            measurement,
            field,
            &tags,
            self.from,
            self.to,
            self.step_ns,
            Need::All,
            self.now,
        )?;
        // Tag sets of one series merged step by step.
        let mut merged: BTreeMap<String, BTreeMap<i64, Acc>> = BTreeMap::new();
        for (i, (tags, steps)) in c.sets.iter().enumerate() {
            let key = series_of(measurement, i as i64, tags);
            let series = merged.entry(key).or_default();
            for (t, s) in steps.iter() {
                series.entry(t).or_default().merge(&s.acc);
            }
        }
        Ok(merged
            .values()
            .map(|steps| {
                let agg: Vec<(i64, i64, f64)> = steps
                    .values()
                    .filter_map(|acc| {
                        let mean = acc.mean()?;
                        Some((acc.first.0, acc.last.0, mean * scale))
                    })
                    .collect();
                pieces_from_steps(&agg, self.step_ns)
            })
            .collect())
    }

    /// Raw samples of each series, read one step beyond the range on both sides so the edge
    /// steps get their closing pieces, turned into pieces by `to_pieces`.
    fn raw_pieces(
        &self,
        measurement: &str,
        field: &str,
        tag: Option<(&str, &str)>,
        scale: f64,
        to_pieces: ToPieces,
    ) -> Result<Vec<Vec<Piece>>, EngineError> {
        let series = raw_samples(
            self.reader,
            measurement,
            field,
            tag,
            self.from.saturating_sub(self.step_ns),
            self.to.saturating_add(self.step_ns),
            scale,
        )?;
        Ok(series
            .iter()
            .map(|s| {
                let ts: Vec<i64> = s.iter().map(|p| p.0).collect();
                to_pieces(s, max_gap(&ts))
            })
            .collect())
    }

    /// The pieces of an energy counter (see [`pieces_from_counter`]); from a tier, each
    /// step's first and last samples.
    fn counter_pieces(
        &self,
        measurement: &str,
        field: &str,
    ) -> Result<Vec<Vec<Piece>>, EngineError> {
        if self.raw {
            return self.raw_pieces(measurement, field, None, 1.0, pieces_from_counter);
        }
        let c = collect(
            self.reader,
            self.plan,
            measurement,
            field,
            &[],
            self.from,
            self.to,
            self.step_ns,
            Need::All,
            self.now,
        )?;
        Ok(c.sets
            .iter()
            .map(|(_, steps)| {
                let mut pts: Vec<(i64, f64)> = steps
                    .iter()
                    .filter(|(_, s)| s.acc.count > 0)
                    .flat_map(|(_, s)| [s.acc.first, s.acc.last])
                    .collect();
                pts.dedup_by_key(|p| p.0);
                pieces_from_counter(&pts, self.step_ns)
            })
            .collect())
    }

    /// The rails of `jetson_power` present in the range.
    fn rails(&self) -> Result<Vec<String>, EngineError> {
        let (conn, path) = (self.reader.conn(), self.reader.path());
        Ok(dict::tagsets(conn, path, Some("jetson_power"))?
            .into_iter()
            .filter_map(|s| s.tags.get("rail").cloned())
            .collect())
    }

    /// The first of `rails` with samples, else the fallback.
    fn power(&self, rails: &[&str], all_rails: bool) -> Result<Power, EngineError> {
        let present = self.rails()?;
        if let Some(rail) = pick_rail(&present, rails) {
            let series = self.pieces("jetson_power", "current_mw", Some(("rail", rail)), 1e-3)?;
            if !series.is_empty() {
                return Ok(Power {
                    source: Some(format!("tegrastats:{rail}")),
                    series,
                    lower_bound: false,
                });
            }
        }
        if all_rails && !present.is_empty() {
            let series = self.pieces("jetson_power", "current_mw", None, 1e-3)?;
            if !series.is_empty() {
                return Ok(Power {
                    source: Some("tegrastats:sum_of_rails".into()),
                    series,
                    lower_bound: true,
                });
            }
        }
        let series = self.counter_pieces("gpu", "energy_mj")?;
        if series.iter().any(|s| !s.is_empty()) {
            return Ok(Power {
                source: Some("nvml:energy_mj".into()),
                series,
                lower_bound: false,
            });
        }
        let series = self.pieces("gpu", "power_w", None, 1.0)?;
        Ok(Power {
            source: (!series.is_empty()).then(|| "nvml:power_w".into()),
            series,
            lower_bound: false,
        })
    }
}

/// One workload's work in one step: `wall`, `gpu` and output tokens.
type Doing = [Done; 3];

/// Per step and workload: the wall and GPU times of its requests and its output tokens,
/// from every measurement of [`WORKLOADS`] (every model, whatever the query's model
/// filter: attribution needs them all): each point with its time from raw points, each
/// step's aggregate from a tier.
fn work(ctx: &Ctx) -> Result<BTreeMap<i64, BTreeMap<Workload, Doing>>, EngineError> {
    let mut out: BTreeMap<i64, BTreeMap<Workload, Doing>> = BTreeMap::new();
    for (measurement, wall, gpu, tokens) in WORKLOADS {
        let fields = [Some(wall), Some(gpu), tokens];
        for (fi, field) in fields.iter().enumerate() {
            let Some(field) = *field else { continue };
            add_work(ctx, &mut out, measurement, field, fi)?;
        }
    }
    Ok(out)
}

/// The workload of a tag set of `measurement`.
fn workload(measurement: &'static str, tags: &BTreeMap<String, String>) -> Workload {
    let get = |k: &str| tags.get(k).cloned().unwrap_or_default();
    (measurement, get("model"), get("scrape"))
}

/// Adds `field` of `measurement` into slot `fi` of each step's workloads.
fn add_work(
    ctx: &Ctx,
    out: &mut BTreeMap<i64, BTreeMap<Workload, Doing>>,
    measurement: &'static str,
    field: &str,
    fi: usize,
) -> Result<(), EngineError> {
    if ctx.raw {
        for (_, tags, pts) in
            raw_points(ctx.reader, measurement, field, None, ctx.from, ctx.to, 1.0)?
        {
            let key = workload(measurement, &tags);
            for (ts, v) in pts {
                let t = ctx.from + (ts - ctx.from).div_euclid(ctx.step_ns) * ctx.step_ns;
                let done = out.entry(t).or_default().entry(key.clone()).or_default();
                match &mut done[fi] {
                    Done::Points(p) => p.push((ts, v)),
                    agg => agg.add_agg(1, v, ts, ts),
                }
            }
        }
        return Ok(());
    }
    let c = collect(
        ctx.reader,
        ctx.plan,
        measurement,
        field,
        &[],
        ctx.from,
        ctx.to,
        ctx.step_ns,
        Need::All,
        ctx.now,
    )?;
    for (tags, steps) in c.sets {
        let key = workload(measurement, &tags);
        for (t, s) in steps.iter() {
            let done = out.entry(t).or_default().entry(key.clone()).or_default();
            done[fi].add_agg(s.acc.count, s.acc.sum, s.acc.first.0, s.acc.last.0);
        }
    }
    Ok(())
}

/// Computes the energy of an inference query over steps of `step_ns` from `from` (aligned)
/// to `to`.
pub fn energy(
    reader: &Reader,
    plan: &Plan,
    from: i64,
    to: i64,
    step_ns: i64,
    now: i64,
) -> Result<Energy, EngineError> {
    let ctx = Ctx {
        reader,
        plan,
        from,
        to,
        step_ns,
        now,
        raw: choose_source(plan, step_ns, from, now) == Source::Raw,
    };
    let board = ctx.power(&BOARD_RAILS, true)?;
    let gpu = ctx.power(&GPU_RAILS, false)?;
    let work = work(&ctx)?;
    let mut e = Energy {
        board,
        gpu,
        ..Energy::default()
    };
    if e.board.series.is_empty() {
        return Ok(e);
    }
    // Every step with power or inferences.
    let mut t = from;
    while t <= to {
        let end = (t + step_ns).min(to.saturating_add(1));
        let board = step_power(&e.board.series, t, end);
        let gpu = step_power(&e.gpu.series, t, end);
        let models = work.get(&t).filter(|m| !m.is_empty());
        let mut step = StepEnergy {
            t,
            board_mj: board.mj,
            gpu_mj: gpu.mj,
            idle_mj: board.mj.unwrap_or(0.0),
            coverage: board.coverage,
            gpu_coverage: gpu.coverage,
            ..StepEnergy::default()
        };
        if let Some(models) = models {
            // The energy of the covered time goes to the inferences in it, split by their
            // work in it: an inference outside it used energy no sample measured.
            let in_board: Vec<Work> = models
                .values()
                .map(|d| work_within(d, &board.covered))
                .collect();
            let in_gpu: Vec<Work> = models
                .values()
                .map(|d| work_within(d, &gpu.covered))
                .collect();
            let (bs, gs) = (shares(&in_board), shares(&in_gpu));
            step.idle_mj = board.mj.unwrap_or(0.0) * (1.0 - bs.iter().sum::<f64>()).max(0.0);
            for (i, (model, d)) in models.iter().enumerate() {
                step.inferences += work_within(d, &[(t, end)]).count;
                step.covered_inferences += in_board[i].count;
                e.per_model.insert(
                    (model.clone(), t),
                    ModelStep {
                        board_mj: board.mj.map(|b| b * bs[i]),
                        gpu_mj: gpu.mj.map(|g| g * gs[i]),
                        count: in_board[i].count,
                        gpu_count: in_gpu[i].count,
                        tokens: in_board[i].tokens,
                    },
                );
            }
        }
        if board.mj.is_some() || models.is_some() {
            e.steps.push(step);
        }
        t += step_ns;
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = NS;

    /// The raw samples include what the writer holds when the read begins with it
    /// (`Reader::read_with_held`), and count each point once after its commit (in no
    /// particular order, as from chunks: the callers sort).
    #[test]
    fn raw_points_add_the_held_points_once() {
        use crate::model::{Batch, Line, Value};
        let dir = tempfile::tempdir().unwrap();
        let mut w =
            crate::store::Writer::open(dir.path(), 100, crate::config::Synchronous::Full).unwrap();
        let view = std::sync::Arc::new(crate::store::HeldView::new());
        w.keep_held(view.clone());
        let line = |ts: i64, v: f64| Line {
            key: "llm,model=m".into(),
            fields: vec![("ttft_ms".into(), Value::F64(v))],
            ts,
            line_no: 1,
        };
        let stage = |w: &mut crate::store::Writer, lines: Vec<Line>| {
            let (_, staged) = w.stage(&[&Batch { lines }]).unwrap().remove(0);
            std::sync::Arc::new(staged)
        };
        let stored = stage(&mut w, vec![line(5 * S, 50.0)]);
        w.commit([&*stored]).unwrap();
        // Held: one newer and one older than the stored point.
        let held = stage(&mut w, vec![line(7 * S, 70.0), line(3 * S, 30.0)]);
        view.hold(held.clone());
        let reader = Reader::open(dir.path()).unwrap();
        let read = |r: &Reader| -> Vec<(i64, f64)> {
            let got = raw_points(r, "llm", "ttft_ms", None, 0, 10 * S, 1.0).unwrap();
            let mut pts: Vec<_> = got.into_iter().flat_map(|(_, _, p)| p).collect();
            pts.sort_by_key(|p| p.0);
            pts
        };
        let with_held = || {
            reader
                .read_with_held(&view, |r| Ok::<_, EngineError>(read(r)))
                .unwrap()
        };
        let all = vec![(3 * S, 30.0), (5 * S, 50.0), (7 * S, 70.0)];
        assert_eq!(with_held(), all);
        assert_eq!(
            read(&reader),
            vec![(5 * S, 50.0)],
            "outside: the store only"
        );
        w.commit([&*held]).unwrap();
        assert_eq!(view.points(), 0);
        assert_eq!(with_held(), all, "committed: each once");
    }

    #[test]
    fn trapezoids_over_the_samples_cut_at_the_step_edges() {
        // 10 W at 0 s, 20 W at 2 s, 20 W at 4 s.
        let samples = [(0, 10.0), (2 * S, 20.0), (4 * S, 20.0)];
        let p = pieces_from_samples(&samples, max_gap(&[0, 2 * S, 4 * S]));
        assert_eq!(p.len(), 2);
        // Whole: (10+20)/2*2 + 20*2 = 30 + 40 = 70 J = 70000 mJ.
        assert_eq!(integrate(&p, 0, 4 * S), (70_000.0, 4 * S));
        // [0, 1 s): 10 W to 15 W over 1 s = 12.5 J.
        assert_eq!(integrate(&p, 0, S), (12_500.0, S));
        // [1 s, 3 s): 15->20 over 1 s (17.5 J) + 20 over 1 s (20 J) = 37.5 J.
        assert_eq!(integrate(&p, S, 3 * S), (37_500.0, 2 * S));
    }

    #[test]
    fn a_gap_is_a_hole_and_too_little_coverage_is_null() {
        // Samples every second, then a 20 s hole (more than 5 median intervals).
        let ts = [0, S, 2 * S, 22 * S, 23 * S];
        assert_eq!(max_gap(&ts), 5 * S);
        let samples: Vec<(i64, f64)> = ts.iter().map(|t| (*t, 5.0)).collect();
        let p = pieces_from_samples(&samples, max_gap(&ts));
        assert_eq!(p.len(), 3);
        // [0, 4 s): 2 s covered of 4 = 50 %: reported, 10 J.
        let four = step_power(std::slice::from_ref(&p), 0, 4 * S);
        assert_eq!(four.mj, Some(10_000.0));
        assert_eq!((four.coverage, four.covered), (0.5, vec![(0, 2 * S)]));
        // [0, 5 s): 2 of 5 s: null.
        assert_eq!(step_power(std::slice::from_ref(&p), 0, 5 * S).mj, None);
        // One sample alone covers nothing.
        let one = pieces_from_samples(&[(0, 5.0)], i64::MAX);
        assert_eq!(step_power(&[one], 0, S).mj, None);
        // No series at all: null; two summed series add up.
        assert_eq!(step_power(&[], 0, S).mj, None);
        assert_eq!(step_power(&[p.clone(), p], 0, 2 * S).mj, Some(20_000.0));
    }

    #[test]
    fn an_energy_counter_integrates_to_its_own_difference() {
        // 1000 mJ over 1 s, then 3000 mJ over 2 s, then a reset (driver reload).
        let samples = [(0, 5000.0), (S, 6000.0), (3 * S, 9000.0), (4 * S, 10.0)];
        let p = pieces_from_counter(&samples, 5 * S);
        assert_eq!(p.len(), 2);
        assert_eq!(integrate(&p, 0, 3 * S), (4000.0, 3 * S));
        // Half of the second stretch: 1500 mJ.
        assert_eq!(integrate(&p, S, 2 * S).0, 1500.0);
        assert_eq!(integrate(&p, 3 * S, 4 * S), (0.0, 0));
    }

    #[test]
    fn tier_steps_hold_their_mean_and_join_by_trapezoids() {
        // Step 0: samples 0..59 s mean 10 W; step 1: 60..119 s mean 20 W.
        let steps = [(0, 59 * S, 10.0), (60 * S, 119 * S, 20.0)];
        let p = pieces_from_steps(&steps, 5 * S);
        // 10 W * 59 s + (10+20)/2 * 1 s + 20 W * 59 s = 590 + 15 + 1180 = 1785 J.
        assert_eq!(integrate(&p, 0, 120 * S).0, 1_785_000.0);
        // The join is not drawn across a hole.
        assert_eq!(pieces_from_steps(&steps, S / 2).len(), 2);
    }

    #[test]
    fn rails_per_module_as_the_real_tegrastats_lines_print_them() {
        let r = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        // Orin Nano / Xavier NX (JetPack 5/6 lines of the fixtures).
        let nx = r(&["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]);
        assert_eq!(pick_rail(&nx, &BOARD_RAILS), Some("VDD_IN"));
        assert_eq!(pick_rail(&nx, &GPU_RAILS), Some("VDD_CPU_GPU_CV"));
        // AGX Orin: no input rail (the sum of rails is then a lower bound).
        let agx = r(&["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"]);
        assert_eq!(pick_rail(&agx, &BOARD_RAILS), None);
        assert_eq!(pick_rail(&agx, &GPU_RAILS), Some("VDD_GPU_SOC"));
        // Thor with VIN; AGX Xavier's short names; Nano's POM rails.
        let thor = r(&["VDD_GPU", "VDD_CPU_SOC_MSS", "VIN_SYS_5V0", "VIN"]);
        assert_eq!(pick_rail(&thor, &BOARD_RAILS), Some("VIN"));
        assert_eq!(pick_rail(&thor, &GPU_RAILS), Some("VDD_GPU"));
        let xavier = r(&["GPU", "CPU", "SOC", "CV", "VDDRQ", "SYS5V"]);
        assert_eq!(pick_rail(&xavier, &GPU_RAILS), Some("GPU"));
        let nano = r(&["POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"]);
        assert_eq!(pick_rail(&nano, &BOARD_RAILS), Some("POM_5V_IN"));
        assert_eq!(pick_rail(&nano, &GPU_RAILS), Some("POM_5V_GPU"));
    }

    #[test]
    fn attribution_by_gpu_time_then_wall_time_then_counts() {
        let w = |gpu_ms, wall_ms, count: u64| Work {
            gpu_ms,
            wall_ms,
            count: count as f64,
            tokens: 0.0,
        };
        assert_eq!(
            shares(&[w(30.0, 50.0, 3), w(10.0, 50.0, 1)]),
            vec![0.75, 0.25]
        );
        assert_eq!(
            shares(&[w(0.0, 60.0, 3), w(0.0, 20.0, 1)]),
            vec![0.75, 0.25]
        );
        assert_eq!(shares(&[w(0.0, 0.0, 1), w(0.0, 0.0, 3)]), vec![0.25, 0.75]);
        assert_eq!(shares(&[w(0.0, 0.0, 0)]), vec![0.0]);
        // Scraped LLM servers: tokens only.
        let t = |tokens| Work {
            tokens,
            ..w(0.0, 0.0, 0)
        };
        assert_eq!(shares(&[t(300.0), t(100.0)]), vec![0.75, 0.25]);
    }

    #[test]
    fn per_inference_values_and_the_summary_skip_unknown_steps() {
        let a = ModelStep {
            board_mj: Some(1000.0),
            gpu_mj: Some(400.0),
            count: 4.0,
            gpu_count: 4.0,
            tokens: 0.0,
        };
        assert_eq!(a.per_inference(), (Some(250.0), Some(100.0), Some(4.0)));
        // 1 J for 50 tokens: 50 tokens/J, 20 J per 1k tokens; no tokens, no figure.
        let llm = ModelStep { tokens: 50.0, ..a };
        assert_eq!(llm.per_token(), (Some(50.0), Some(20.0)));
        assert_eq!(a.per_token(), (None, None));
        let unknown = ModelStep {
            board_mj: None,
            gpu_mj: None,
            count: 10.0,
            gpu_count: 10.0,
            tokens: 0.0,
        };
        let no_gpu = ModelStep {
            board_mj: Some(500.0),
            gpu_mj: None,
            count: 5.0,
            gpu_count: 5.0,
            tokens: 0.0,
        };
        assert_eq!(unknown.per_inference(), (None, None, None));
        let mut sum = ModelStep::default();
        sum.add(&a);
        sum.add(&unknown);
        sum.add(&no_gpu);
        assert_eq!((sum.count, sum.gpu_count), (9.0, 4.0));
        assert_eq!(sum.per_inference().0, Some(1500.0 / 9.0));
        // The GPU energy divides by the inferences of the steps where it is known.
        assert_eq!(sum.per_inference().1, Some(100.0));
    }

    #[test]
    fn spans_merge_intersect_and_contain() {
        let p = |t0, t1| Piece {
            t0,
            w0: 1.0,
            t1,
            w1: 1.0,
        };
        assert_eq!(
            covered(&[p(5, 8), p(0, 3), p(3, 4), p(20, 30)], 1, 25),
            vec![(1, 4), (5, 8), (20, 25)]
        );
        assert_eq!(
            intersect(&[(0, 4), (6, 10)], &[(2, 7), (9, 20)]),
            vec![(2, 4), (6, 7), (9, 10)]
        );
        assert_eq!(span_len(&[(2, 4), (6, 7)]), 3);
        let s = [(0, 4), (6, 10)];
        assert!(contains(&s, 0) && contains(&s, 3) && contains(&s, 6));
        assert!(!contains(&s, 4) && !contains(&s, 5) && !contains(&s, 10));
        // Two summed series: only the time both cover counts, each over it.
        let a = vec![p(0, 10)];
        let b = vec![p(0, 6)];
        let both = step_power(&[a, b], 0, 10);
        assert_eq!(both.covered, vec![(0, 6)]);
        assert_eq!(both.coverage, 0.6);
    }

    /// A collector gap: 5 W sampled every second over 0-6 s, then nothing until 13 s; one
    /// inference a second all through the 10 s step. The 30 J of the covered 6 s belong to
    /// the 6 inferences in them (5 J each, what 5 W at one a second is), not to all 10
    /// (3 J each, reading low).
    #[test]
    fn a_collector_gap_divides_the_covered_energy_by_the_covered_inferences() {
        let ts: Vec<i64> = (0..=6).chain(13..=20).map(|i| i * S).collect();
        let samples: Vec<(i64, f64)> = ts.iter().map(|t| (*t, 5.0)).collect();
        let pieces = pieces_from_samples(&samples, max_gap(&ts));
        let step = step_power(&[pieces], 0, 10 * S);
        assert_eq!(step.covered, vec![(0, 6 * S)]);
        assert_eq!(step.coverage, 0.6);
        assert_eq!(step.mj, Some(30_000.0));
        let points: Vec<(i64, f64)> = (0..10).map(|k| (k * S + S / 2, 10.0)).collect();
        let done = [Done::Points(points.clone()), Done::Points(points)];
        let w = work_within(&done, &step.covered);
        assert_eq!((w.count, w.gpu_ms), (6.0, 60.0));
        let m = ModelStep {
            board_mj: step.mj,
            gpu_mj: None,
            count: w.count,
            gpu_count: 0.0,
            tokens: 0.0,
        };
        assert_eq!(m.per_inference().0, Some(5_000.0));
        assert_eq!(work_within(&done, &[(0, 10 * S)]).count, 10.0);
        // From a tier: 10 inferences between 0.5 s and 9.5 s; 5.5 s of those 9 covered.
        let agg = Done::Agg {
            count: 10,
            sum: 100.0,
            first: S / 2,
            last: 9 * S + S / 2,
        };
        let (n, sum) = agg.within(&step.covered);
        assert!((n - 10.0 * 5.5 / 9.0).abs() < 1e-9, "{n}");
        assert!((sum - 100.0 * 5.5 / 9.0).abs() < 1e-9, "{sum}");
        // One inference: all or nothing.
        let one = Done::Agg {
            count: 1,
            sum: 3.0,
            first: 7 * S,
            last: 7 * S,
        };
        assert_eq!(one.within(&step.covered), (0.0, 0.0));
        assert_eq!(one.within(&[(0, 10 * S)]), (1.0, 3.0));
    }
}
