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
//! for years, so it is defined here (versioned), not by a crate's serde derive; and it needs
//! the negative/zero handling above. Decoding never panics on corrupt input; it returns an
//! error. Non-finite values (NaN, ±inf) are never added: the caller skips them.
//!
//! The BLOB takes the smallest of three forms, told apart by its first byte; every form
//! decodes to the same sketch, and version 1 (the only form before) stays readable:
//! 1. dense: every bin count from the lowest to the highest key, one varint each (a zero
//!    costs a byte), the form of a latency bucket whose bins are mostly filled;
//! 2. sparse: the non-empty bins only, each as (gap to the previous key, count), the form
//!    of a bucket of a few values far apart (two values a decade apart are 230 dense bins);
//! 3. constant: the count and the one value of a bucket whose values are all equal (a
//!    steady gauge), whose bins follow from it.
//!
//! The dense and sparse forms stay packed when decoded: a quantile reads the bytes as they
//! are (down from the top bin of the dense form, up the few pairs of the sparse one),
//! without building the stores; the constant form decodes to the one bin it stands for.

/// Relative accuracy of every quantile the sketch returns.
pub const ALPHA: f64 = 0.005;
/// Values with a smaller magnitude count as zero.
pub const MIN_INDEXABLE: f64 = 1e-9;
/// Values with a larger magnitude are binned as this value (min/max stay exact).
pub const MAX_INDEXABLE: f64 = 1e18;
/// The first byte of each form of the BLOB (see the module docs).
const FORM_DENSE: u8 = 1;
const FORM_SPARSE: u8 = 2;
const FORM_CONSTANT: u8 = 3;

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
}

/// Non-empty bins, `(key, count)` in key order.
pub type Bins = Vec<(i32, u64)>;

/// A DDSketch of `f64` values with exact count, min and max.
///
/// A decoded sketch keeps its bins in their encoded (varint) form, `packed`, until it is
/// changed: a quantile of a decoded bucket (the common query case, one bucket per step) is
/// read straight from those bytes, without building the dense stores.
#[derive(Debug, Clone)]
pub struct Sketch {
    positive: Store,
    negative: Store,
    zero: u64,
    count: u64,
    min: f64,
    max: f64,
    /// When set, the stores are these bytes (validated, exactly as in the encoded form from
    /// the positive store's offset to the end) and `positive`/`negative` are empty.
    packed: Option<Box<[u8]>>,
    /// Where the positive counts lie in `packed` (found once, when decoded).
    layout: Layout,
}

/// The shape of a packed form: the positive store's first key, the byte range of its
/// counts, and the negative store's length. In the sparse form the counts are the
/// positive store's (key or gap, count) pairs and the lengths count pairs.
#[derive(Debug, Clone, Copy, Default)]
struct Layout {
    sparse: bool,
    pos_offset: i32,
    pos_len: u32,
    counts_start: u32,
    counts_end: u32,
    neg_len: u32,
}

impl PartialEq for Sketch {
    fn eq(&self, other: &Sketch) -> bool {
        let (a, b) = (self.stores(), other.stores());
        self.zero == other.zero
            && self.count == other.count
            && self.min == other.min
            && self.max == other.max
            && *a.0 == *b.0
            && *a.1 == *b.1
    }
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
            packed: None,
            layout: Layout::default(),
        }
    }
}

/// Parses the packed stores (positive, then negative) of either form.
fn unpack_stores(p: &[u8], sparse: bool) -> Result<[Store; 2], SketchError> {
    let mut pos = 0usize;
    let mut stores = [Store::default(), Store::default()];
    if sparse {
        for store in &mut stores {
            let n = get_varint(p, &mut pos)?;
            let mut key = 0i32;
            for i in 0..n {
                let v = get_varint(p, &mut pos)?;
                // Checked when decoded: keys in range.
                key = sparse_key(i == 0, v, key);
                store.add(key, get_varint(p, &mut pos)?);
            }
        }
        return Ok(stores);
    }
    for store in &mut stores {
        let (offset, len) = store_header(p, &mut pos)?;
        store.offset = offset;
        store.counts.reserve(len);
        for _ in 0..len {
            store.counts.push(get_varint(p, &mut pos)?);
        }
    }
    Ok(stores)
}

/// A store's offset and length; anything out of range is corrupt.
fn store_header(buf: &[u8], pos: &mut usize) -> Result<(i32, usize), SketchError> {
    let offset =
        i32::try_from(unzigzag(get_varint(buf, pos)?)).map_err(|_| SketchError { offset: *pos })?;
    let len = get_varint(buf, pos)? as usize;
    // Bounded by construction (see the module docs); anything larger is corrupt.
    if len > 20_000 {
        return Err(SketchError { offset: *pos });
    }
    Ok((offset, len))
}

/// Reads past `len` varint counts and returns their sum. The common case, every count
/// under 128 (one byte each), is checked and summed eight bytes at a time (SWAR: the
/// release build is size-optimised, so the byte loop is not vectorised for us); anything
/// else takes the varint loop.
fn scan_counts(buf: &[u8], pos: &mut usize, len: usize) -> Result<u64, SketchError> {
    if let Some(s) = buf.get(*pos..pos.saturating_add(len)) {
        const LOW: u64 = 0x00FF_00FF_00FF_00FF;
        let (mut high, mut total) = (0u64, 0u64);
        let mut words = s.chunks_exact(8);
        for w in &mut words {
            let w = u64::from_le_bytes(w.try_into().unwrap_or_default());
            high |= w;
            // Four 16-bit lanes of byte-pair sums (each <= 510), then their sum in the
            // top lane (<= 2040, no carry between lanes).
            let pairs = (w & LOW) + ((w >> 8) & LOW);
            total += pairs.wrapping_mul(0x0001_0001_0001_0001) >> 48;
        }
        for &b in words.remainder() {
            high |= u64::from(b);
            total += u64::from(b);
        }
        if high & 0x8080_8080_8080_8080 == 0 {
            *pos += len;
            return Ok(total);
        }
    }
    let mut total = 0u64;
    for _ in 0..len {
        total = total.wrapping_add(get_varint(buf, pos)?);
    }
    Ok(total)
}

/// The varint that ends just before `end`, reading backwards no further than `start`
/// (the last byte of a varint is the only one under 0x80); returns it and where it starts.
fn varint_before(buf: &[u8], start: usize, end: usize) -> Result<(u64, usize), SketchError> {
    let err = SketchError { offset: end };
    let last = end.checked_sub(1).filter(|&l| l >= start).ok_or(err)?;
    // Fast path: a one-byte count after the start or after another varint's last byte.
    if let Some(&b) = buf.get(last) {
        if b < 0x80 && (last == start || buf.get(last - 1).is_some_and(|&p| p < 0x80)) {
            return Ok((u64::from(b), last));
        }
    }
    let mut from = last;
    while from > start && buf.get(from - 1).is_some_and(|&b| b >= 0x80) {
        from -= 1;
    }
    let mut pos = from;
    let v = get_varint(buf, &mut pos)?;
    if pos != end {
        return Err(SketchError { offset: pos });
    }
    Ok((v, from))
}

/// The magnitudes bin `key` holds: `(γ^(key-1), γ^key]` (the lowest and highest bins also
/// hold what was clamped into them).
pub fn bin_bounds(key: i32) -> (f64, f64) {
    let g = gamma_ln();
    ((f64::from(key - 1) * g).exp(), (f64::from(key) * g).exp())
}

/// The value a bin answers with (within [`ALPHA`] of every magnitude in it).
pub fn bin_value(key: i32) -> f64 {
    value_of(key)
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
        self.unpack();
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
        if self.count == 0
            && self.packed.is_none()
            && self.positive.counts.is_empty()
            && self.negative.counts.is_empty()
        {
            // Merging into an empty sketch: a copy (of the packed bytes, when decoded).
            let (zero, min, max) = (self.zero, self.min, self.max);
            *self = other.clone();
            self.zero += zero;
            self.min = min.min(other.min);
            self.max = max.max(other.max);
            return;
        }
        self.unpack();
        let (pos, neg) = other.stores();
        self.positive.merge(&pos);
        self.negative.merge(&neg);
        self.zero += other.zero;
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// The non-empty bins: `(positive, negative, zero)`, each side as `(key, count)` in key
    /// order; bin `key` holds the magnitudes in [`bin_bounds`]`(key)`.
    pub fn bins(&self) -> (Bins, Bins, u64) {
        let (pos, neg) = self.stores();
        let list = |s: &Store| {
            s.counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| (s.offset + i as i32, c))
                .collect::<Vec<_>>()
        };
        (list(&pos), list(&neg), self.zero)
    }

    /// Number of values added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Smallest value added (`+inf` when empty).
    pub fn min(&self) -> f64 {
        self.min
    }

    /// Largest value added (`-inf` when empty).
    pub fn max(&self) -> f64 {
        self.max
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
        let answer = match &self.packed {
            None => self.rank_value(&self.positive, &self.negative, rank),
            Some(p) => match self.packed_rank_value(p, rank) {
                Ok(Some(a)) => a,
                // A negative store (rare): build the stores.
                Ok(None) | Err(_) => {
                    let (pos, neg) = self.stores();
                    self.rank_value(&pos, &neg, rank)
                }
            },
        };
        Some(answer.unwrap_or(self.max).clamp(self.min, self.max))
    }

    /// The value of the bin holding `rank`, walking negatives, zeros, then positives.
    fn rank_value(&self, positive: &Store, negative: &Store, rank: f64) -> Option<f64> {
        let mut cum = 0u64;
        for (i, c) in negative.counts.iter().enumerate().rev() {
            cum += c;
            if *c > 0 && cum as f64 > rank {
                return Some(-value_of(negative.offset + i as i32));
            }
        }
        cum += self.zero;
        if self.zero > 0 && cum as f64 > rank {
            return Some(0.0);
        }
        for (i, c) in positive.counts.iter().enumerate() {
            cum += c;
            if *c > 0 && cum as f64 > rank {
                return Some(value_of(positive.offset + i as i32));
            }
        }
        None
    }

    /// [`Sketch::rank_value`] straight from the packed bytes when the negative store is
    /// empty (`Ok(None)` when it is not: the caller builds the stores). Ranks in the upper
    /// half are found walking down from the largest bin, so a p99 reads a few bytes, not
    /// every bin.
    #[allow(clippy::type_complexity)]
    fn packed_rank_value(&self, p: &[u8], rank: f64) -> Result<Option<Option<f64>>, SketchError> {
        let l = self.layout;
        if l.neg_len > 0 {
            return Ok(None);
        }
        if self.zero > 0 && self.zero as f64 > rank {
            return Ok(Some(Some(0.0)));
        }
        if l.sparse {
            // Few pairs (the form is taken only when smaller than the dense one): walk up.
            let (mut at, mut cum, mut key) = (l.counts_start as usize, self.zero, 0i32);
            for i in 0..l.pos_len {
                let v = get_varint(p, &mut at)?;
                key = sparse_key(i == 0, v, key);
                cum += get_varint(p, &mut at)?;
                if cum as f64 > rank {
                    return Ok(Some(Some(value_of(key))));
                }
            }
            return Ok(Some(None));
        }
        let (start, end) = (l.counts_start as usize, l.counts_end as usize);
        // Without negatives, the positive bins hold every value but the zeros.
        let positives = self.count - self.zero;
        if rank >= self.zero as f64 + positives as f64 / 2.0 {
            // The answer is the lowest non-empty bin whose cumulative count (zeros + every
            // bin up to it) still exceeds `rank`.
            let mut above = 0u64;
            let mut answer = None;
            let mut at = end;
            for i in (0..l.pos_len).rev() {
                let (c, from) = varint_before(p, start, at)?;
                at = from;
                if c == 0 {
                    continue;
                }
                if (self.count - above) as f64 > rank {
                    answer = Some(i);
                } else {
                    break;
                }
                above += c;
            }
            return Ok(Some(answer.map(|i| value_of(l.pos_offset + i as i32))));
        }
        let mut cum = self.zero;
        let mut pos = start;
        for i in 0..l.pos_len {
            let c = get_varint(p, &mut pos)?;
            cum += c;
            if c > 0 && cum as f64 > rank {
                return Ok(Some(Some(value_of(l.pos_offset + i as i32))));
            }
        }
        Ok(Some(None))
    }

    /// The stores, borrowed, or built from the packed bytes.
    fn stores(&self) -> (std::borrow::Cow<'_, Store>, std::borrow::Cow<'_, Store>) {
        use std::borrow::Cow;
        match &self.packed {
            None => (Cow::Borrowed(&self.positive), Cow::Borrowed(&self.negative)),
            Some(p) => {
                // Validated when decoded, so this cannot fail.
                let [pos, neg] = unpack_stores(p, self.layout.sparse).unwrap_or_default();
                (Cow::Owned(pos), Cow::Owned(neg))
            }
        }
    }

    /// Builds the stores from the packed bytes, before a change.
    fn unpack(&mut self) {
        if let Some(p) = self.packed.take() {
            let [pos, neg] = unpack_stores(&p, self.layout.sparse).unwrap_or_default();
            self.positive = pos;
            self.negative = neg;
        }
    }

    /// The versioned BLOB form: the smallest of the three forms (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let (positive, negative) = self.stores();
        if let Some(v) = self.constant_value(&positive, &negative) {
            let mut out = Vec::with_capacity(11);
            out.push(FORM_CONSTANT);
            put_varint(&mut out, self.count);
            out.extend_from_slice(&v.to_le_bytes());
            return out;
        }
        let sparse = sparse_len(&positive) + sparse_len(&negative)
            < dense_len(&positive) + dense_len(&negative);
        self.encode_stores(&positive, &negative, sparse)
    }

    /// The dense form whatever is smaller (version 1, the form every release can read).
    #[cfg(test)]
    fn encode_dense(&self) -> Vec<u8> {
        let (positive, negative) = self.stores();
        self.encode_stores(&positive, &negative, false)
    }

    /// The dense or the sparse form of these stores.
    fn encode_stores(&self, positive: &Store, negative: &Store, sparse: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + positive.counts.len());
        out.push(if sparse { FORM_SPARSE } else { FORM_DENSE });
        put_varint(&mut out, self.count);
        out.extend_from_slice(&self.min.to_le_bytes());
        out.extend_from_slice(&self.max.to_le_bytes());
        put_varint(&mut out, self.zero);
        for store in [positive, negative] {
            if sparse {
                put_sparse(&mut out, store);
            } else {
                put_dense(&mut out, store);
            }
        }
        out
    }

    /// The one value of a sketch whose values are all equal, when its bins are exactly what
    /// adding that value `count` times makes (so the constant form loses nothing).
    fn constant_value(&self, positive: &Store, negative: &Store) -> Option<f64> {
        let v = self.min;
        if self.count == 0 || v != self.max || !v.is_finite() {
            return None;
        }
        let (pos, neg) = (single_bin(positive), single_bin(negative));
        let fits = if v >= MIN_INDEXABLE {
            self.zero == 0 && neg == Some(None) && pos == Some(Some((key_of(v), self.count)))
        } else if v <= -MIN_INDEXABLE {
            self.zero == 0 && pos == Some(None) && neg == Some(Some((key_of(-v), self.count)))
        } else {
            self.zero == self.count && pos == Some(None) && neg == Some(None)
        };
        fits.then_some(v)
    }

    /// Parses [`Sketch::encode`]'s output (any form); never panics.
    pub fn decode(buf: &[u8]) -> Result<Sketch, SketchError> {
        match buf.first() {
            Some(&FORM_DENSE) => Sketch::decode_packed(buf, false),
            Some(&FORM_SPARSE) => Sketch::decode_packed(buf, true),
            Some(&FORM_CONSTANT) => Sketch::decode_constant(buf),
            _ => Err(SketchError { offset: 0 }),
        }
    }

    /// The constant form: the count, then the value.
    fn decode_constant(buf: &[u8]) -> Result<Sketch, SketchError> {
        let mut pos = 1usize;
        let count = get_varint(buf, &mut pos)?;
        let v = get_f64(buf, &mut pos)?;
        if count == 0 || !v.is_finite() || pos != buf.len() {
            return Err(SketchError { offset: pos });
        }
        let mut s = Sketch {
            count,
            min: v,
            max: v,
            ..Sketch::default()
        };
        if v >= MIN_INDEXABLE {
            s.positive.add(key_of(v), count);
        } else if v <= -MIN_INDEXABLE {
            s.negative.add(key_of(-v), count);
        } else {
            s.zero = count;
        }
        Ok(s)
    }

    /// The dense or the sparse form, kept packed: checked (the stores' bounds, and for the
    /// sparse form keys in range and no empty bin; the total) without building the stores.
    fn decode_packed(buf: &[u8], sparse: bool) -> Result<Sketch, SketchError> {
        let mut pos = 1usize;
        let err = |offset| SketchError { offset };
        let count = get_varint(buf, &mut pos)?;
        let min = get_f64(buf, &mut pos)?;
        let max = get_f64(buf, &mut pos)?;
        let zero = get_varint(buf, &mut pos)?;
        let start = pos;
        // A store's first key, its length (bins, or pairs), the sum of its counts and where
        // its counts start.
        let store = |pos: &mut usize| -> Result<(i32, u64, u64, usize), SketchError> {
            if sparse {
                let n = get_varint(buf, pos)?;
                let at = *pos;
                let (first, total) = sparse_span(buf, pos, n)?;
                Ok((first, n, total, at))
            } else {
                let (offset, len) = store_header(buf, pos)?;
                let at = *pos;
                let total = scan_counts(buf, pos, len)?;
                Ok((offset, len as u64, total, at))
            }
        };
        let (pos_offset, pos_len, pos_total, counts_start) = store(&mut pos)?;
        let counts_end = pos;
        let (_, neg_len, neg_total, _) = store(&mut pos)?;
        if pos != buf.len() || zero.wrapping_add(pos_total).wrapping_add(neg_total) != count {
            return Err(err(pos));
        }
        // Offsets into the packed copy, which starts at `start`; lengths are bounded (dense
        // stores by `store_header`, sparse ones by the key range), so all fit u32.
        let rel = |at: usize| u32::try_from(at - start).map_err(|_| err(at));
        let len = |n: u64| u32::try_from(n).map_err(|_| err(start));
        Ok(Sketch {
            zero,
            count,
            min,
            max,
            packed: Some(buf[start..].into()),
            layout: Layout {
                sparse,
                pos_offset,
                pos_len: len(pos_len)?,
                counts_start: rel(counts_start)?,
                counts_end: rel(counts_end)?,
                neg_len: len(neg_len)?,
            },
            ..Sketch::default()
        })
    }
}

/// Bytes of a store in the dense form (without the sketch's header).
fn dense_len(store: &Store) -> usize {
    varint_len(zigzag(i64::from(store.offset)))
        + varint_len(store.counts.len() as u64)
        + store.counts.iter().map(|&c| varint_len(c)).sum::<usize>()
}

/// Bytes of a store in the sparse form.
fn sparse_len(store: &Store) -> usize {
    let mut n = 0u64;
    let mut len = 0usize;
    let mut prev: Option<i32> = None;
    for (i, &c) in store.counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let key = store.offset + i as i32;
        len += varint_len(c)
            + match prev {
                None => varint_len(zigzag(i64::from(key))),
                Some(p) => varint_len((key - p - 1) as u64),
            };
        prev = Some(key);
        n += 1;
    }
    len + varint_len(n)
}

fn put_dense(out: &mut Vec<u8>, store: &Store) {
    put_varint(out, zigzag(i64::from(store.offset)));
    put_varint(out, store.counts.len() as u64);
    for &c in &store.counts {
        put_varint(out, c);
    }
}

/// The number of non-empty bins, then the first one's key and count, then each next one's
/// gap (keys skipped) and count.
fn put_sparse(out: &mut Vec<u8>, store: &Store) {
    put_varint(out, store.counts.iter().filter(|&&c| c > 0).count() as u64);
    let mut prev: Option<i32> = None;
    for (i, &c) in store.counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let key = store.offset + i as i32;
        match prev {
            None => put_varint(out, zigzag(i64::from(key))),
            Some(p) => put_varint(out, (key - p - 1) as u64),
        }
        put_varint(out, c);
        prev = Some(key);
    }
}

/// The key of a decoded sparse form's next bin: the first key itself, then a gap past the
/// previous one (keys were checked to be in range when decoded).
fn sparse_key(first: bool, v: u64, prev: i32) -> i32 {
    if first {
        unzigzag(v) as i32
    } else {
        prev.saturating_add(v as i32).saturating_add(1)
    }
}

/// Reads past `n` sparse bins, checking each key is in range (keys strictly rise, so there
/// are at most ~6,200) and each count non-zero; returns the first key (0 for none) and the
/// sum of the counts.
fn sparse_span(buf: &[u8], pos: &mut usize, n: u64) -> Result<(i32, u64), SketchError> {
    let (lo, hi) = (
        i64::from(key_of(MIN_INDEXABLE)),
        i64::from(key_of(MAX_INDEXABLE)),
    );
    let (mut first, mut key, mut total) = (0i64, 0i64, 0u64);
    for i in 0..n {
        let v = get_varint(buf, pos)?;
        key = if i == 0 {
            unzigzag(v)
        } else {
            i64::try_from(v)
                .ok()
                .and_then(|g| key.checked_add(g)?.checked_add(1))
                .ok_or(SketchError { offset: *pos })?
        };
        if key < lo || key > hi {
            return Err(SketchError { offset: *pos });
        }
        if i == 0 {
            first = key;
        }
        let c = get_varint(buf, pos)?;
        if c == 0 {
            return Err(SketchError { offset: *pos });
        }
        total = total.wrapping_add(c);
    }
    // In range, so it fits an i32.
    Ok((first as i32, total))
}

/// `Some(None)`: no non-empty bin; `Some(Some(bin))`: exactly one; `None`: more.
fn single_bin(store: &Store) -> Option<Option<(i32, u64)>> {
    let mut found = None;
    for (i, &c) in store.counts.iter().enumerate() {
        if c > 0 {
            if found.is_some() {
                return None;
            }
            found = Some((store.offset + i as i32, c));
        }
    }
    Some(found)
}

fn get_f64(buf: &[u8], pos: &mut usize) -> Result<f64, SketchError> {
    let b: [u8; 8] = buf
        .get(*pos..*pos + 8)
        .and_then(|s| s.try_into().ok())
        .ok_or(SketchError { offset: *pos })?;
    *pos += 8;
    Ok(f64::from_le_bytes(b))
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
fn get_varint(buf: &[u8], pos: &mut usize) -> Result<u64, SketchError> {
    // Fast path: most bin counts fit in one byte.
    if let Some(&b) = buf.get(*pos) {
        if b < 0x80 {
            *pos += 1;
            return Ok(u64::from(b));
        }
    }
    get_varint_long(buf, pos)
}

fn get_varint_long(buf: &[u8], pos: &mut usize) -> Result<u64, SketchError> {
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
    fn quantiles_read_from_the_packed_form_equal_the_built_stores() {
        let mut r = rng(5);
        for (lo, with_neg, with_zero) in
            [(5.0, false, false), (5.0, true, true), (0.1, false, true)]
        {
            let mut s = Sketch::new();
            for i in 0..3000 {
                s.add(lo + r() * 95.0);
                if with_neg && i % 5 == 0 {
                    s.add(-r() * 10.0 - 0.5);
                }
                if with_zero && i % 7 == 0 {
                    s.add(0.0);
                }
            }
            let packed = Sketch::decode(&s.encode()).unwrap();
            assert!(packed.packed.is_some());
            for q in [0.0, 0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0, 1.5] {
                assert_eq!(packed.quantile(q), s.quantile(q), "q={q}");
            }
            // Merging and adding from the packed form match too.
            let mut a = packed.clone();
            a.merge(&packed);
            a.add(7.0);
            let mut b = s.clone();
            b.merge(&s);
            b.add(7.0);
            assert_eq!(a, b);
            assert_eq!(a.encode(), b.encode());
            let mut e = Sketch::new();
            e.merge(&packed);
            assert_eq!(e.encode(), s.encode());
        }
    }

    #[test]
    fn packed_quantiles_match_the_built_stores_at_every_rank() {
        let mut r = rng(11);
        // A 1-minute bucket of 1 Hz latencies; one with bins over 127 (multi-byte counts);
        // one with zeros; one value.
        let cases: Vec<Vec<f64>> = vec![
            (0..60).map(|_| (2.0 + r() * 0.7).exp()).collect(),
            (0..50_000).map(|i| 10.0 + (i % 7) as f64 * 0.3).collect(),
            (0..500)
                .map(|i| if i % 3 == 0 { 0.0 } else { r() * 50.0 })
                .collect(),
            vec![4.2],
        ];
        for values in cases {
            let mut s = Sketch::new();
            values.iter().for_each(|&v| s.add(v));
            // The dense form as stored, and whichever form the encoder picks.
            let packed = Sketch::decode(&s.encode_dense()).unwrap();
            assert!(packed.packed.is_some());
            let picked = Sketch::decode(&s.encode()).unwrap();
            for k in 0..=1000 {
                let q = f64::from(k) / 1000.0;
                let n = values.len();
                assert_eq!(packed.quantile(q), s.quantile(q), "q={q} n={n}");
                assert_eq!(picked.quantile(q), s.quantile(q), "q={q} n={n}");
            }
        }
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
    /// Sketches that take each form, and the form each takes.
    fn one_of_each_form() -> Vec<(u8, Sketch)> {
        let sketch = |values: &[f64]| {
            let mut s = Sketch::new();
            values.iter().for_each(|&v| s.add(v));
            s
        };
        let mut r = rng(13);
        // An hour of 1 Hz latencies fills its bins; a minute of them is sparse already.
        let latencies: Vec<f64> = (0..3600).map(|_| 10.0 + r() * 30.0).collect();
        vec![
            (FORM_DENSE, sketch(&latencies)),
            // Two scrapes of a counter a decade apart; negatives and zeros far apart too.
            (FORM_SPARSE, sketch(&[4885.0, 31337.0])),
            (FORM_SPARSE, sketch(&[-2000.0, -3.0, 0.0, 1e-3, 7e5, 7e5])),
            (FORM_SPARSE, Sketch::new()),
            // Steady gauges: positive, negative, zero, clamped past the indexable range.
            (FORM_CONSTANT, sketch(&[55.0; 60])),
            (FORM_CONSTANT, sketch(&[-12.5; 6])),
            (FORM_CONSTANT, sketch(&[0.0; 4])),
            (FORM_CONSTANT, sketch(&[1e-12])),
            (FORM_CONSTANT, sketch(&[3e20, 3e20])),
        ]
    }

    #[test]
    fn each_form_round_trips_to_the_same_sketch_and_is_the_smallest() {
        for (form, s) in one_of_each_form() {
            let buf = s.encode();
            assert_eq!(buf[0], form, "{s:?}");
            let back = Sketch::decode(&buf).unwrap();
            assert_eq!(
                back.packed.is_some(),
                form != FORM_CONSTANT,
                "read as stored"
            );
            assert_eq!(back, s);
            assert_eq!(back.bins(), s.bins());
            assert_eq!(back.encode(), buf, "a decoded sketch encodes the same");
            for k in 0..=200 {
                let q = f64::from(k) / 200.0;
                assert_eq!(back.quantile(q), s.quantile(q), "q={q} {s:?}");
            }
            // Merging a decoded sketch of any form equals merging the original.
            let mut a = back.clone();
            a.merge(&Sketch::decode(&buf).unwrap());
            let mut b = s.clone();
            b.merge(&s);
            assert_eq!(a, b);
            // The dense form (what earlier releases stored) is never smaller, and still reads.
            let dense = s.encode_dense();
            assert!(buf.len() <= dense.len(), "{} > {}", buf.len(), dense.len());
            assert_eq!(Sketch::decode(&dense).unwrap(), s);
        }
        // The sizes that matter in a 1m tier: two values a decade apart were 190 bytes.
        let mut pair = Sketch::new();
        pair.add(4885.0);
        pair.add(31337.0);
        assert!(pair.encode().len() <= 30, "{}", pair.encode().len());
        assert!(pair.encode_dense().len() > 180);
        let mut gauge = Sketch::new();
        (0..60).for_each(|_| gauge.add(55.0));
        assert_eq!(gauge.encode().len(), 10);
    }

    #[test]
    fn a_dense_blob_written_by_an_earlier_release_still_decodes() {
        // A 1m row of the reference workload as stored before the other forms existed:
        // two values, 4885 and 31337 (187 dense bins, mostly empty).
        let mut blob = vec![0x01, 0x02];
        blob.extend_from_slice(&4885f64.to_le_bytes());
        blob.extend_from_slice(&31337f64.to_le_bytes());
        blob.extend_from_slice(&[0x00, 0xA4, 0x0D, 0xBB, 0x01, 0x01]);
        blob.extend_from_slice(&[0; 185]);
        blob.extend_from_slice(&[0x01, 0x00, 0x00]);
        let s = Sketch::decode(&blob).unwrap();
        assert_eq!((s.count(), s.min(), s.max()), (2, 4885.0, 31337.0));
        let (pos, neg, zero) = s.bins();
        assert_eq!((pos.len(), neg.len(), zero), (2, 0, 0));
        assert_eq!(s.quantile(0.5), Some(bin_value(pos[0].0)));
        assert_eq!(s.encode()[0], FORM_SPARSE, "rewritten in the smaller form");
    }

    #[test]
    fn a_corrupt_sparse_or_constant_blob_is_an_error_never_a_panic() {
        for (_, s) in one_of_each_form() {
            let buf = s.encode();
            for cut in 0..buf.len() {
                assert!(Sketch::decode(&buf[..cut]).is_err(), "cut at {cut}");
            }
            let mut longer = buf.clone();
            longer.push(0);
            assert!(Sketch::decode(&longer).is_err());
        }
        let header = |form: u8, count: u8| {
            let mut b = vec![form, count];
            b.extend_from_slice(&1f64.to_le_bytes());
            b.extend_from_slice(&2f64.to_le_bytes());
            b.push(0);
            b
        };
        let cases: Vec<(&str, Vec<u8>)> = vec![
            // One bin listed with a zero count.
            ("empty bin", [header(2, 0), vec![1, zig(50), 0, 0]].concat()),
            // A key far past the indexable range (the dense form would be huge).
            (
                "key out of range",
                [header(2, 1), vec![1, 0xFE, 0xFF, 0x7F, 1, 0]].concat(),
            ),
            // A gap that runs past the range.
            (
                "gap out of range",
                [header(2, 2), vec![2, zig(50), 1, 0xFF, 0xFF, 0x03, 1, 0]].concat(),
            ),
            // Bins that do not add up to the count.
            ("total", [header(2, 5), vec![1, zig(50), 1, 0]].concat()),
            // A constant of no value, or of nothing.
            (
                "constant NaN",
                [vec![3, 1], f64::NAN.to_le_bytes().to_vec()].concat(),
            ),
            (
                "constant inf",
                [vec![3, 1], f64::INFINITY.to_le_bytes().to_vec()].concat(),
            ),
            (
                "constant of none",
                [vec![3, 0], 1f64.to_le_bytes().to_vec()].concat(),
            ),
            ("unknown form", vec![4, 0]),
        ];
        for (what, blob) in cases {
            assert!(Sketch::decode(&blob).is_err(), "{what}");
        }
        // A well-formed sparse blob, to show the cases above fail for their reason only.
        let ok = [header(2, 2), vec![2, zig(50), 1, 3, 1, 0]].concat();
        let s = Sketch::decode(&ok).unwrap();
        assert_eq!(s.bins().0, vec![(50, 1), (54, 1)]);
    }

    fn zig(k: i32) -> u8 {
        u8::try_from(zigzag(i64::from(k))).unwrap()
    }
}
