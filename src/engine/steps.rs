//! Per-step accumulation: [`StepAcc`] (a rollup accumulator plus, from raw points, every
//! value for exact percentiles), [`Steps`] (one tag set's steps in time order), the value of
//! an agg for one step ([`value`]) and per-second [`rates`]. Pure: no store, no IO.

use super::{Agg, NS};
use crate::store::bucket::Acc;

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
    pub(super) fn absorb(&mut self, other: StepAcc) {
        if self.acc.count == 0 && self.exact.is_none() {
            *self = other;
        } else {
            self.merge(&other);
        }
    }

    pub(super) fn merge(&mut self, other: &StepAcc) {
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
                // The value at the rank in sorted order, found without sorting them all.
                let mut v = v.clone();
                let rank = (q * (v.len() - 1) as f64).floor() as usize;
                Some(*v.select_nth_unstable_by(rank, f64::total_cmp).1)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::bucket::bucket_start;

    #[test]
    fn rates_are_per_second_against_the_previous_steps_last_value() {
        let mut steps = Steps::default();
        for (t, v) in [(0, 0.0), (10 * NS, 10.0), (60 * NS, 60.0), (70 * NS, 90.0)] {
            steps.at(bucket_start(t, 60 * NS)).acc.add(t, v);
        }
        assert_eq!(rates(&steps), vec![(0, 1.0), (60 * NS, 80.0 / 60.0)]);
    }
}
