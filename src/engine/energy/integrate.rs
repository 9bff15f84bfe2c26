//! The pure integration of [`super`]: power samples into straight pieces (raw samples, an
//! energy counter, a tier's per-step means), their energy over a span by trapezoids, and
//! the time they cover (sorted disjoint spans), from which a step's coverage and the
//! inferences its energy is divided by follow. No I/O.

use super::{MIN_COVERAGE, NS};

/// A straight stretch of power between two instants: `(t0, w0)` to `(t1, w1)`, watts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Piece {
    /// Start, ns.
    pub t0: i64,
    /// Power at the start, W.
    pub w0: f64,
    /// End, ns (after `t0`).
    pub t1: i64,
    /// Power at the end, W.
    pub w1: f64,
}

/// 5 times the median interval of time-ordered `ts` (at least 1 ns); `i64::MAX` with
/// fewer than two distinct instants.
pub fn max_gap(ts: &[i64]) -> i64 {
    let mut gaps: Vec<i64> = ts
        .windows(2)
        .map(|w| w[1] - w[0])
        .filter(|g| *g > 0)
        .collect();
    if gaps.is_empty() {
        return i64::MAX;
    }
    gaps.sort_unstable();
    gaps[gaps.len() / 2].saturating_mul(5).max(1)
}

/// The pieces of time-ordered samples `(ts, watts)`: each consecutive pair at most
/// `max_gap` apart.
pub fn pieces_from_samples(samples: &[(i64, f64)], max_gap: i64) -> Vec<Piece> {
    samples
        .windows(2)
        .filter(|w| w[1].0 > w[0].0 && w[1].0 - w[0].0 <= max_gap)
        .map(|w| Piece {
            t0: w[0].0,
            w0: w[0].1,
            t1: w[1].0,
            w1: w[1].1,
        })
        .collect()
}

/// The pieces of an energy counter's time-ordered samples `(ts, mJ)` (NVML `energy_mj`):
/// each consecutive pair at most `max_gap` apart, as the constant power that explains its
/// difference, so integrating gives the counter's own difference. A counter that went
/// back (driver reloaded) leaves a hole.
pub fn pieces_from_counter(samples: &[(i64, f64)], max_gap: i64) -> Vec<Piece> {
    samples
        .windows(2)
        .filter(|w| w[1].0 > w[0].0 && w[1].0 - w[0].0 <= max_gap && w[1].1 >= w[0].1)
        .map(|w| {
            let watts = (w[1].1 - w[0].1) / 1000.0 / ((w[1].0 - w[0].0) as f64 / NS as f64);
            Piece {
                t0: w[0].0,
                w0: watts,
                t1: w[1].0,
                w1: watts,
            }
        })
        .collect()
}

/// The pieces of per-step aggregates `(first_ts, last_ts, mean_watts)` in time order (from
/// a rollup tier): the mean held from first to last, and a trapezoid from one step's last
/// sample to the next step's first when at most `max_gap` apart.
pub fn pieces_from_steps(steps: &[(i64, i64, f64)], max_gap: i64) -> Vec<Piece> {
    let mut out = Vec::new();
    for (i, &(first, last, mean)) in steps.iter().enumerate() {
        if last > first {
            out.push(Piece {
                t0: first,
                w0: mean,
                t1: last,
                w1: mean,
            });
        }
        if let Some(&(next_first, _, next_mean)) = steps.get(i + 1) {
            if next_first > last && next_first - last <= max_gap {
                out.push(Piece {
                    t0: last,
                    w0: mean,
                    t1: next_first,
                    w1: next_mean,
                });
            }
        }
    }
    out
}

/// The energy (mJ) of `pieces` within `[a, b)` and the time they cover there (ns). Pure.
pub fn integrate(pieces: &[Piece], a: i64, b: i64) -> (f64, i64) {
    let (mut mj, mut covered) = (0.0, 0i64);
    for p in pieces {
        let (lo, hi) = (p.t0.max(a), p.t1.min(b));
        if hi <= lo {
            continue;
        }
        let at = |t: i64| p.w0 + (p.w1 - p.w0) * (t - p.t0) as f64 / (p.t1 - p.t0) as f64;
        let seconds = (hi - lo) as f64 / NS as f64;
        mj += (at(lo) + at(hi)) / 2.0 * seconds * 1000.0;
        covered += hi - lo;
    }
    (mj, covered)
}

/// Time spans `[lo, hi)`, ns: sorted, disjoint.
pub type Spans = Vec<(i64, i64)>;

/// The time `pieces` cover within `[a, b)`, as sorted disjoint spans. Pure.
pub fn covered(pieces: &[Piece], a: i64, b: i64) -> Spans {
    let mut v: Vec<(i64, i64)> = pieces
        .iter()
        .map(|p| (p.t0.max(a), p.t1.min(b)))
        .filter(|(lo, hi)| hi > lo)
        .collect();
    v.sort_unstable();
    let mut out: Spans = Vec::with_capacity(v.len());
    for (lo, hi) in v {
        match out.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// The time both `x` and `y` cover. Pure.
pub fn intersect(x: &[(i64, i64)], y: &[(i64, i64)]) -> Spans {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < x.len() && j < y.len() {
        let (lo, hi) = (x[i].0.max(y[j].0), x[i].1.min(y[j].1));
        if hi > lo {
            out.push((lo, hi));
        }
        if x[i].1 < y[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The total length of `spans`, ns.
pub fn span_len(spans: &[(i64, i64)]) -> i64 {
    spans.iter().map(|(lo, hi)| hi - lo).sum()
}

/// Whether instant `t` lies in one of `spans`.
pub fn contains(spans: &[(i64, i64)], t: i64) -> bool {
    let i = spans.partition_point(|s| s.1 <= t);
    spans.get(i).is_some_and(|s| s.0 <= t)
}

/// One power source over one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepPower {
    /// The energy over `covered`, mJ; `None` when `coverage` is under [`MIN_COVERAGE`].
    pub mj: Option<f64>,
    /// The share of the step `covered` spans (0 to 1).
    pub coverage: f64,
    /// The time every summed series has samples around (the intersection of their
    /// coverages): the energy is theirs over it, and only inferences in it are counted.
    pub covered: Spans,
}

/// Several summed series within `[a, b)`: their common covered time and their energy over
/// it, `None` under [`MIN_COVERAGE`] (or without series). Pure.
pub fn step_power(series: &[Vec<Piece>], a: i64, b: i64) -> StepPower {
    if series.is_empty() || b <= a {
        return StepPower::default();
    }
    let mut common: Option<Spans> = None;
    for pieces in series {
        let c = covered(pieces, a, b);
        common = Some(match common {
            None => c,
            Some(x) => intersect(&x, &c),
        });
    }
    let covered = common.unwrap_or_default();
    let coverage = span_len(&covered) as f64 / (b - a) as f64;
    let mj = (coverage >= MIN_COVERAGE).then(|| {
        series
            .iter()
            .map(|p| {
                covered
                    .iter()
                    .map(|&(lo, hi)| integrate(p, lo, hi).0)
                    .sum::<f64>()
            })
            .sum()
    });
    StepPower {
        mj,
        coverage,
        covered,
    }
}
