//! One integer column (`i64` values, in order): constant, or frame-of-reference bit-packing
//! in blocks of [`BLOCK`] over the values or over their deltas, whichever is smaller. Each
//! block stores its minimum and a bit width, so one outlier widens only its own block.
//! Timestamps (deltas: a regular interval with jitter packs to the jitter's bits), scaled
//! decimals, integers, unsigned integers (as their bit pattern) and booleans all use it.
//! Pure; all arithmetic wraps, so every `i64` round-trips.

use super::bits::{get_u8, get_varint, put_varint, unzigzag, zigzag, BitReader, BitWriter};
use super::CodecError;

/// Values per bit-packed block.
pub(crate) const BLOCK: usize = 128;

const CONST: u8 = 0;
const VALUES: u8 = 1;
const DELTAS: u8 = 2;

fn width(min: i64, max: i64) -> u32 {
    64 - (max.wrapping_sub(min) as u64).leading_zeros()
}

fn min_max(block: &[i64]) -> (i64, i64) {
    block
        .iter()
        .fold((i64::MAX, i64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// Packed size in bits of `vals` as blocks (headers estimated at 3 bytes).
fn packed_bits(vals: impl Iterator<Item = i64> + Clone, len: usize) -> usize {
    let mut total = 0usize;
    let mut it = vals;
    let mut left = len;
    while left > 0 {
        let n = left.min(BLOCK);
        let (lo, hi) = it
            .clone()
            .take(n)
            .fold((i64::MAX, i64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        total += 24 + n * width(lo, hi) as usize;
        for _ in 0..n {
            it.next();
        }
        left -= n;
    }
    total
}

fn put_blocks(out: &mut Vec<u8>, vals: &[i64]) {
    for block in vals.chunks(BLOCK) {
        let (lo, hi) = min_max(block);
        let w = width(lo, hi);
        put_varint(out, zigzag(lo));
        out.push(w as u8);
        let mut bits = BitWriter::new(out);
        for &v in block {
            bits.put(v.wrapping_sub(lo) as u64, w);
        }
        bits.finish();
    }
}

fn get_blocks(
    buf: &[u8],
    pos: &mut usize,
    count: usize,
    out: &mut Vec<i64>,
) -> Result<(), CodecError> {
    let mut left = count;
    while left > 0 {
        let n = left.min(BLOCK);
        let lo = unzigzag(get_varint(buf, pos)?);
        let w = u32::from(get_u8(buf, pos)?);
        if w > 64 {
            return Err(CodecError::at(*pos - 1, "bit width over 64"));
        }
        let bytes = (n * w as usize).div_ceil(8);
        let end = pos
            .checked_add(bytes)
            .filter(|e| *e <= buf.len())
            .ok_or(CodecError::at(*pos, "truncated block"))?;
        let mut r = BitReader::new(&buf[*pos..end], *pos);
        for _ in 0..n {
            out.push(lo.wrapping_add(r.get(w)? as i64));
        }
        *pos = end;
        left -= n;
    }
    Ok(())
}

/// Appends the column `vals` (the decoder is told the count).
pub(crate) fn encode(out: &mut Vec<u8>, vals: &[i64]) {
    let Some(&first) = vals.first() else {
        return;
    };
    if vals.iter().all(|&v| v == first) {
        out.push(CONST);
        put_varint(out, zigzag(first));
        return;
    }
    let deltas = vals.windows(2).map(|w| w[1].wrapping_sub(w[0]));
    let as_deltas = packed_bits(deltas.clone(), vals.len() - 1) + 8 * 5;
    let as_values = packed_bits(vals.iter().copied(), vals.len());
    if as_deltas < as_values {
        out.push(DELTAS);
        put_varint(out, zigzag(first));
        let d: Vec<i64> = deltas.collect();
        put_blocks(out, &d);
    } else {
        out.push(VALUES);
        put_blocks(out, vals);
    }
}

/// Reads a column of `count` values into `out` (appended).
pub(crate) fn decode(
    buf: &[u8],
    pos: &mut usize,
    count: usize,
    out: &mut Vec<i64>,
) -> Result<(), CodecError> {
    if count == 0 {
        return Ok(());
    }
    let mode_at = *pos;
    match get_u8(buf, pos)? {
        CONST => {
            let v = unzigzag(get_varint(buf, pos)?);
            out.resize(out.len() + count, v);
        }
        VALUES => get_blocks(buf, pos, count, out)?,
        DELTAS => {
            let start = out.len();
            let mut prev = unzigzag(get_varint(buf, pos)?);
            out.push(prev);
            get_blocks(buf, pos, count - 1, out)?;
            for v in &mut out[start + 1..] {
                prev = prev.wrapping_add(*v);
                *v = prev;
            }
        }
        _ => return Err(CodecError::at(mode_at, "unknown integer column mode")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(vals: &[i64]) -> usize {
        let mut buf = Vec::new();
        encode(&mut buf, vals);
        let mut pos = 0;
        let mut got = Vec::new();
        decode(&buf, &mut pos, vals.len(), &mut got).unwrap();
        assert_eq!(got, vals);
        assert_eq!(pos, buf.len());
        buf.len()
    }

    #[test]
    fn extremes_constants_and_jittered_times() {
        round_trip(&[i64::MIN, i64::MAX, 0, -1, i64::MAX, i64::MIN]);
        assert!(round_trip(&[7; 1000]) <= 3);
        // 1 s apart with +-15 ms of jitter: ~26 bits a value, not 64.
        let mut x = 1u64;
        let times: Vec<i64> = (0..2048)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                i * 1_000_000_000 + (x >> 40) as i64 % 15_000_000
            })
            .collect();
        let n = round_trip(&times);
        assert!(n < 2048 * 27 / 8 + 200, "{n}");
    }
}
