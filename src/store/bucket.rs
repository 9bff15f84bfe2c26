//! One rollup bucket's aggregate ([`Acc`]) and the bucket maths shared by the rollup job and
//! the query engine. Pure: no SQL, no clock.
//!
//! An [`Acc`] is count, sum, min, max, first and last (with timestamps) and a
//! [`Sketch`]; merging two is exact for every part but `sum`'s floating-point rounding, and
//! the sketch keeps its relative-accuracy guarantee. Percentiles are always read from merged
//! sketches, never averaged.

use super::sketch::Sketch;
use crate::model::Value;

/// Start of the bucket of width `res_ns` that holds `ts` (epoch-aligned; works for negative
/// timestamps too).
pub fn bucket_start(ts: i64, res_ns: i64) -> i64 {
    ts - ts.rem_euclid(res_ns)
}

/// The number a stored value contributes to aggregates: floats, ints, uints, and bools as
/// 0/1. Strings (and non-finite floats) are never aggregated.
pub fn numeric(v: &Value) -> Option<f64> {
    let f = match v {
        Value::F64(f) => *f,
        Value::I64(i) => *i as f64,
        Value::U64(u) => *u as f64,
        Value::Bool(b) => f64::from(u8::from(*b)),
        Value::Str(_) => return None,
    };
    f.is_finite().then_some(f)
}

/// The aggregate of one series over one bucket (or any merged set of buckets).
#[derive(Debug, Clone, PartialEq)]
pub struct Acc {
    /// Values.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Earliest (ts, value); on equal timestamps the first merged wins.
    pub first: (i64, f64),
    /// Latest (ts, value); on equal timestamps the last merged wins.
    pub last: (i64, f64),
    /// Quantile sketch of every value.
    pub sketch: Sketch,
}

impl Default for Acc {
    fn default() -> Self {
        Acc {
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            first: (i64::MAX, 0.0),
            last: (i64::MIN, 0.0),
            sketch: Sketch::new(),
        }
    }
}

impl Acc {
    /// Adds one finite value at `ts`.
    pub fn add(&mut self, ts: i64, v: f64) {
        self.add_plain(ts, v);
        self.sketch.add(v);
    }

    /// Adds one finite value at `ts` to everything but the sketch (for a reader that never
    /// asks this accumulator for a percentile: it leaves the sketch empty).
    pub fn add_plain(&mut self, ts: i64, v: f64) {
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        if ts < self.first.0 {
            self.first = (ts, v);
        }
        if ts >= self.last.0 {
            self.last = (ts, v);
        }
    }

    /// Folds `other` (merged after `self`) into `self`.
    pub fn merge(&mut self, other: &Acc) {
        if other.count == 0 {
            return;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        if other.first.0 < self.first.0 {
            self.first = other.first;
        }
        if other.last.0 >= self.last.0 {
            self.last = other.last;
        }
        self.sketch.merge(&other.sketch);
    }

    /// Mean, or `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// Parses a percentile aggregate name into a quantile: `p50` -> 0.5, `p99` -> 0.99,
/// `p999` -> 0.999, `p9999` -> 0.9999, `p5` -> 0.05, `p99.9` -> 0.999, `p100` -> 1.
/// One or two digits (or a decimal point) are a percentage; three or more digits read as
/// `0.<digits>`, the usual shorthand.
pub fn parse_percentile(name: &str) -> Option<f64> {
    let digits = name.strip_prefix('p')?;
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    digits.parse::<f64>().ok()?;
    let q = if digits == "100" {
        1.0
    } else if digits.contains('.') || digits.len() <= 2 {
        format!("{digits}e-2").parse().ok()?
    } else {
        format!("0.{digits}").parse().ok()?
    };
    (0.0..=1.0).contains(&q).then_some(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_epoch_aligned_including_negative_times() {
        let m = 60_000_000_000;
        assert_eq!(bucket_start(0, m), 0);
        assert_eq!(bucket_start(m - 1, m), 0);
        assert_eq!(bucket_start(m, m), m);
        assert_eq!(bucket_start(-1, m), -m);
    }

    #[test]
    fn merge_keeps_first_last_by_time_and_equals_one_pass() {
        let pts = [(5, 1.0), (1, 2.0), (9, -3.0), (9, 4.0), (3, 0.0)];
        let mut whole = Acc::default();
        for (t, v) in pts {
            whole.add(t, v);
        }
        let (mut a, mut b) = (Acc::default(), Acc::default());
        for (t, v) in &pts[..2] {
            a.add(*t, *v);
        }
        for (t, v) in &pts[2..] {
            b.add(*t, *v);
        }
        a.merge(&b);
        assert_eq!(a, whole);
        assert_eq!(a.first, (1, 2.0));
        assert_eq!(a.last, (9, 4.0));
        assert_eq!((a.count, a.min, a.max, a.sum), (5, -3.0, 4.0, 4.0));
        assert_eq!(a.mean(), Some(0.8));
    }

    #[test]
    fn percentile_names() {
        assert_eq!(parse_percentile("p50"), Some(0.5));
        assert_eq!(parse_percentile("p99"), Some(0.99));
        assert_eq!(parse_percentile("p999"), Some(0.999));
        assert_eq!(parse_percentile("p5"), Some(0.05));
        assert_eq!(parse_percentile("p99.9"), Some(0.999));
        assert_eq!(parse_percentile("p100"), Some(1.0));
        assert_eq!(parse_percentile("p"), None);
        assert_eq!(parse_percentile("p1x"), None);
        assert_eq!(parse_percentile("mean"), None);
    }

    #[test]
    fn strings_are_never_numeric() {
        assert_eq!(numeric(&Value::Str("1".into())), None);
        assert_eq!(numeric(&Value::Bool(true)), Some(1.0));
        assert_eq!(numeric(&Value::F64(f64::NAN)), None);
    }
}
