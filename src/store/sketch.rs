//! A mergeable quantile sketch with a relative-accuracy guarantee (DDSketch, Masson et al.,
//! VLDB 2019), as stored in `rollups.sketch`.
//!
//! Every value `v > 0` falls into the bin `k = ceil(log_γ v)` with `γ = (1 + α) / (1 - α)`;
//! a bin answers with `2γ^k / (γ + 1)`, which is within `α` (relative) of every value in it.
//! Negative values use a mirrored store keyed on `|v|`, and values with `|v| < MIN_INDEXABLE`
//! (including 0, e.g. an idle GPU's utilisation) are counted in a zero bin, so a quantile of
//! any mix of signs is still within `α` of the exact order statistic. Merging adds bin
//! counts, so a quantile of merged sketches is exactly the quantile of one sketch fed every
//! value: percentiles over any window are merged, never averaged.
//!
//! `α` is fixed at [`ALPHA`] = 0.5%, which keeps the 1% bound with room for the
//! difference between rank conventions. Keys are clamped to the range of
//! `[MIN_INDEXABLE, MAX_INDEXABLE]`, so a store never holds more than ~6,200 bins per sign,
//! whatever the input; a typical latency bucket (one to three decades of values) is a few
//! hundred bytes, a steady gauge a few bytes (measured in the unit test
//! `encoded_size_is_small_for_typical_buckets`).
//!
//! Hand-written rather than taken from a crate: the on-disk BLOB format must stay readable
//! for years, so it is defined here (versioned, varint-packed dense bins), not by a crate's
//! serde derive; and it needs the negative/zero handling above. It is ~200 lines of pure
//! code with its own tests. Decoding never panics on corrupt input; it returns an error.
//! Non-finite values (NaN, ±inf) are never added: the caller skips them.

/// Relative accuracy of every quantile the sketch returns.
pub const ALPHA: f64 = 0.005;
/// Values with a smaller magnitude count as zero.
pub const MIN_INDEXABLE: f64 = 1e-9;
/// Values with a larger magnitude are binned as this value (min/max stay exact).
pub const MAX_INDEXABLE: f64 = 1e18;
const FORMAT_VERSION: u8 = 1;

fn gamma_ln() -> f64 {
    ((1.0 + ALPHA) / (1.0 - ALPHA)).ln()
}

/// A BLOB that is not a sketch of this format.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("corrupt sketch at byte {offset}")]
pub struct SketchError {
    /// Where decoding stopped.
    pub offset: usize,
}

/// Dense counts of consecutive bin keys starting at `offset`.
#[derive(Debug, Clone, Default, PartialEq)]
struct Store {
    offset: i32,
    counts: Vec<u64>,
}

impl Store {
    fn add(&mut self, key: i32, n: u64) {
        if self.counts.is_empty() {
            self.offset = key;
            self.counts.push(n);
            return;
        }
        if key < self.offset {
            let grow = (self.offset - key) as usize;
            self.counts.splice(0..0, std::iter::repeat(0).take(grow));
            self.offset = key;
        }
        let i = (key - self.offset) as usize;
        if i >= self.counts.len() {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += n;
    }

    fn merge(&mut self, other: &Store) {
        if other.counts.is_empty() {
            return;
        }
        // Grow once to cover both ranges, then add.
        let hi = other.offset + other.counts.len() as i32 - 1;
        self.add(other.offset, 0);
        self.add(hi, 0);
        let base = (other.offset - self.offset) as usize;
        for (i, c) in other.counts.iter().enumerate() {
            self.counts[base + i] += c;
        }
    }

    fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// A DDSketch of `f64` values with exact count, min and max.
#[derive(Debug, Clone, PartialEq)]
pub struct Sketch {
    positive: Store,
    negative: Store,
    zero: u64,
    count: u64,
    min: f64,
    max: f64,
}

impl Default for Sketch {
    fn default() -> Self {
        Sketch {
            positive: Store::default(),
            negative: Store::default(),
            zero: 0,
            count: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }
}

fn key_of(magnitude: f64) -> i32 {
    let m = magnitude.clamp(MIN_INDEXABLE, MAX_INDEXABLE);
    (m.ln() / gamma_ln()).ceil() as i32
}

fn value_of(key: i32) -> f64 {
    let g = gamma_ln().exp();
    2.0 * (f64::from(key) * gamma_ln()).exp() / (g + 1.0)
}

impl Sketch {
    /// An empty sketch.
    pub fn new() -> Sketch {
        Sketch::default()
    }

    /// Adds one value. Non-finite values are ignored.
    pub fn add(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        self.count += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        if v >= MIN_INDEXABLE {
            self.positive.add(key_of(v), 1);
        } else if v <= -MIN_INDEXABLE {
            self.negative.add(key_of(-v), 1);
        } else {
            self.zero += 1;
        }
    }

    /// Adds every value of `other` (exactly as if they had been added one by one).
    pub fn merge(&mut self, other: &Sketch) {
        if other.count == 0 {
            return;
        }
        self.positive.merge(&other.positive);
        self.negative.merge(&other.negative);
        self.zero += other.zero;
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Number of values added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The `q`-quantile (`0 <= q <= 1`): within [`ALPHA`] relative of the exact order
    /// statistic of rank `floor(q * (count - 1))`; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        if q == 0.0 {
            return Some(self.min);
        }
        if q == 1.0 {
            return Some(self.max);
        }
        let rank = q * (self.count - 1) as f64;
        let mut cum = 0u64;
        let mut answer = None;
        for (i, c) in self.negative.counts.iter().enumerate().rev() {
            cum += c;
            if *c > 0 && cum as f64 > rank {
                answer = Some(-value_of(self.negative.offset + i as i32));
                break;
            }
        }
        if answer.is_none() {
            cum += self.zero;
            if self.zero > 0 && cum as f64 > rank {
                answer = Some(0.0);
            }
        }
        if answer.is_none() {
            for (i, c) in self.positive.counts.iter().enumerate() {
                cum += c;
                if *c > 0 && cum as f64 > rank {
                    answer = Some(value_of(self.positive.offset + i as i32));
                    break;
                }
            }
        }
        Some(answer.unwrap_or(self.max).clamp(self.min, self.max))
    }

    /// The versioned BLOB form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.positive.counts.len());
        out.push(FORMAT_VERSION);
        put_varint(&mut out, self.count);
        out.extend_from_slice(&self.min.to_le_bytes());
        out.extend_from_slice(&self.max.to_le_bytes());
        put_varint(&mut out, self.zero);
        for store in [&self.positive, &self.negative] {
            put_varint(&mut out, zigzag(i64::from(store.offset)));
            put_varint(&mut out, store.counts.len() as u64);
            for c in &store.counts {
                put_varint(&mut out, *c);
            }
        }
        out
    }

    /// Parses [`Sketch::encode`]'s output; never panics.
    pub fn decode(buf: &[u8]) -> Result<Sketch, SketchError> {
        let mut pos = 0usize;
        let err = |offset| SketchError { offset };
        if buf.first() != Some(&FORMAT_VERSION) {
            return Err(err(0));
        }
        pos += 1;
        let count = get_varint(buf, &mut pos)?;
        let f = |pos: &mut usize| -> Result<f64, SketchError> {
            let b: [u8; 8] = buf
                .get(*pos..*pos + 8)
                .and_then(|s| s.try_into().ok())
                .ok_or(err(*pos))?;
            *pos += 8;
            Ok(f64::from_le_bytes(b))
        };
        let min = f(&mut pos)?;
        let max = f(&mut pos)?;
        let zero = get_varint(buf, &mut pos)?;
        let mut stores = [Store::default(), Store::default()];
        for store in &mut stores {
            let offset =
                i32::try_from(unzigzag(get_varint(buf, &mut pos)?)).map_err(|_| err(pos))?;
            let len = get_varint(buf, &mut pos)? as usize;
            // Bounded by construction (see the module docs); anything larger is corrupt.
            if len > 20_000 {
                return Err(err(pos));
            }
            store.offset = offset;
            store.counts.reserve(len);
            for _ in 0..len {
                store.counts.push(get_varint(buf, &mut pos)?);
            }
        }
        let [positive, negative] = stores;
        if pos != buf.len() || positive.total() + negative.total() + zero != count {
            return Err(err(pos));
        }
        Ok(Sketch {
            positive,
            negative,
            zero,
            count,
            min,
            max,
        })
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(buf: &[u8], pos: &mut usize) -> Result<u64, SketchError> {
    let mut v: u64 = 0;
    let mut shift = 0u32;
    loop {
        let b = *buf.get(*pos).ok_or(SketchError { offset: *pos })?;
        *pos += 1;
        if shift > 63 {
            return Err(SketchError { offset: *pos });
        }
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(v);
        }
        shift += 7;
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(sorted: &[f64], q: f64) -> f64 {
        sorted[(q * (sorted.len() - 1) as f64).floor() as usize]
    }

    fn rel(a: f64, b: f64) -> f64 {
        if b == 0.0 {
            a.abs()
        } else {
            ((a - b) / b).abs()
        }
    }

    /// A small deterministic generator (xorshift), so tests need no crate.
    fn rng(seed: u64) -> impl FnMut() -> f64 {
        let mut s = seed.max(1);
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn quantiles_of_mixed_signs_and_zeros_are_within_alpha() {
        let mut r = rng(7);
        let mut vals: Vec<f64> = (0..20_000)
            .map(|i| match i % 4 {
                0 => 0.0,
                1 => -(r() * 100.0 + 0.01),
                _ => r() * 1000.0 + 0.001,
            })
            .collect();
        let mut s = Sketch::new();
        for v in &vals {
            s.add(*v);
        }
        vals.sort_by(f64::total_cmp);
        for q in [0.0, 0.01, 0.1, 0.25, 0.3, 0.5, 0.9, 0.99, 0.999, 1.0] {
            let (got, want) = (s.quantile(q).unwrap(), exact(&vals, q));
            assert!(
                rel(got, want) <= ALPHA + 1e-12,
                "q={q} got {got} want {want}"
            );
        }
        assert_eq!(s.quantile(0.0), Some(vals[0]));
        assert_eq!(s.quantile(1.0), Some(vals[vals.len() - 1]));
    }

    #[test]
    fn all_zero_input_answers_zero() {
        let mut s = Sketch::new();
        for _ in 0..10 {
            s.add(0.0);
        }
        assert_eq!(s.quantile(0.99), Some(0.0));
        assert_eq!(Sketch::new().quantile(0.5), None);
    }

    #[test]
    fn merging_equals_adding_everything_to_one_sketch() {
        let mut r = rng(3);
        let vals: Vec<f64> = (0..5000).map(|_| (r() * 8.0).exp() - 2.0).collect();
        let mut whole = Sketch::new();
        let mut parts = vec![Sketch::new(); 7];
        for (i, v) in vals.iter().enumerate() {
            whole.add(*v);
            parts[i % 7].add(*v);
        }
        let mut merged = Sketch::new();
        for p in &parts {
            merged.merge(p);
        }
        assert_eq!(merged, whole);
    }

    #[test]
    fn encoding_round_trips_and_corrupt_input_is_an_error() {
        let mut s = Sketch::new();
        for v in [-5.0, 0.0, 1e-12, 3.5, 1e30, f64::NAN, 42.0] {
            s.add(v);
        }
        let buf = s.encode();
        assert_eq!(Sketch::decode(&buf).unwrap(), s);
        for cut in 0..buf.len() {
            assert!(Sketch::decode(&buf[..cut]).is_err());
        }
        assert!(Sketch::decode(&[9, 0]).is_err());
        let empty = Sketch::new();
        assert_eq!(Sketch::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn encoded_size_is_small_for_typical_buckets() {
        // One minute of 1 Hz latency samples between 10 and 40 ms.
        let mut r = rng(11);
        let mut s = Sketch::new();
        for _ in 0..60 {
            s.add(10.0 + r() * 30.0);
        }
        let minute = s.encode().len();
        // One hour of the same: the bins fill in, the range does not grow.
        for _ in 0..3540 {
            s.add(10.0 + r() * 30.0);
        }
        let hour = s.encode().len();
        let mut gauge = Sketch::new();
        for _ in 0..60 {
            gauge.add(55.0);
        }
        let steady = gauge.encode().len();
        assert!(minute < 300, "{minute}");
        assert!(hour < 400, "{hour}");
        assert!(steady < 40, "{steady}");
    }
}
