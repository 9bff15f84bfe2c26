//! One float column (`f64` values, in order), exact to the bit. Values that are all short
//! decimals (`12.34`, `48.125`: every one equal, bit for bit, to `k / 10^d` for one `d` in
//! 0..=9 and an integer `k` below 2^53) are stored as the integers `k` in an integer column
//! ([`super::ints`]); anything else (NaN payloads, infinities, -0.0, subnormals, computed
//! values with full precision) falls back to XOR with the previous value (Gorilla): an equal
//! value costs one bit, a close one its meaningful middle bits. Pure.

use super::bits::{get_u8, BitReader, BitWriter};
use super::{ints, CodecError};

const DECIMAL: u8 = 0;
const XOR: u8 = 1;

/// Exact powers of ten (each is a double exactly).
const POW10: [f64; 10] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9];

/// Largest |k| stored as a decimal (every integer up to it is a double exactly).
const MAX_K: f64 = 9_007_199_254_740_992.0; // 2^53

/// `v` as `k` at `d` decimals, if that is exact to the bit.
fn scaled(v: f64, d: usize) -> Option<i64> {
    let k = (v * POW10[d]).round();
    if k.is_nan() || k.abs() >= MAX_K {
        return None;
    }
    let k = k as i64;
    ((k as f64 / POW10[d]).to_bits() == v.to_bits()).then_some(k)
}

/// The fewest decimals that hold every value exactly, if any do.
fn decimals(vals: &[f64]) -> Option<usize> {
    let mut d = 0usize;
    for &v in vals {
        while scaled(v, d).is_none() {
            d += 1;
            if d >= POW10.len() {
                return None;
            }
        }
    }
    Some(d)
}

/// Appends the column `vals` (the decoder is told the count).
pub(crate) fn encode(out: &mut Vec<u8>, vals: &[f64]) {
    if vals.is_empty() {
        return;
    }
    if let Some(d) = decimals(vals) {
        let ks: Option<Vec<i64>> = vals.iter().map(|&v| scaled(v, d)).collect();
        if let Some(ks) = ks {
            out.push(DECIMAL);
            out.push(d as u8);
            ints::encode(out, &ks);
            return;
        }
    }
    out.push(XOR);
    encode_xor(out, vals);
}

/// Gorilla-style XOR: `0` = same as before; `10` = XOR fits the previous window of
/// meaningful bits; `11` + 6 bits leading zeros + 6 bits (length - 1) + the bits.
fn encode_xor(out: &mut Vec<u8>, vals: &[f64]) {
    let mut w = BitWriter::new(out);
    let mut prev = vals[0].to_bits();
    w.put(prev, 64);
    let (mut lead, mut len) = (u32::MAX, 0u32);
    for v in &vals[1..] {
        let bits = v.to_bits();
        let x = bits ^ prev;
        prev = bits;
        if x == 0 {
            w.put(0, 1);
            continue;
        }
        let l = x.leading_zeros();
        let t = x.trailing_zeros();
        if lead != u32::MAX && l >= lead && t >= 64 - lead - len {
            w.put(0b01, 2);
            w.put(x >> (64 - lead - len), len);
        } else {
            lead = l;
            len = 64 - l - t;
            w.put(0b11, 2);
            w.put(u64::from(lead), 6);
            w.put(u64::from(len - 1), 6);
            w.put(x >> t, len);
        }
    }
    w.finish();
}

/// Reads a column of `count` values into `out` (appended). The XOR form has no length of
/// its own: it ends where its bits end, rounded up to a byte.
pub(crate) fn decode(
    buf: &[u8],
    pos: &mut usize,
    count: usize,
    out: &mut Vec<f64>,
) -> Result<(), CodecError> {
    if count == 0 {
        return Ok(());
    }
    let mode_at = *pos;
    match get_u8(buf, pos)? {
        DECIMAL => {
            let d = usize::from(get_u8(buf, pos)?);
            let p = *POW10
                .get(d)
                .ok_or(CodecError::at(*pos - 1, "too many decimals"))?;
            let mut ks = Vec::with_capacity(count);
            ints::decode(buf, pos, count, &mut ks)?;
            out.extend(ks.into_iter().map(|k| k as f64 / p));
            Ok(())
        }
        XOR => {
            let start = *pos;
            let mut r = BitReader::new(&buf[start..], start);
            let mut prev = r.get(64)?;
            out.push(f64::from_bits(prev));
            let (mut lead, mut len) = (0u32, 0u32);
            let mut have_window = false;
            for _ in 1..count {
                if r.get(1)? == 0 {
                    out.push(f64::from_bits(prev));
                    continue;
                }
                if r.get(1)? == 1 {
                    lead = r.get(6)? as u32;
                    len = r.get(6)? as u32 + 1;
                    if lead + len > 64 {
                        return Err(CodecError::at(start, "bad XOR window"));
                    }
                    have_window = true;
                } else if !have_window {
                    return Err(CodecError::at(start, "XOR window used before set"));
                }
                let x = r.get(len)? << (64 - lead - len);
                prev ^= x;
                out.push(f64::from_bits(prev));
            }
            *pos = start + r.bytes_read();
            Ok(())
        }
        _ => Err(CodecError::at(mode_at, "unknown float column mode")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(vals: &[f64]) -> usize {
        let mut buf = Vec::new();
        encode(&mut buf, vals);
        let mut pos = 0;
        let mut got = Vec::new();
        decode(&buf, &mut pos, vals.len(), &mut got).unwrap();
        let bits = |v: &[f64]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(vals));
        assert_eq!(pos, buf.len());
        buf.len()
    }

    #[test]
    fn decimals_become_small_integers() {
        let lat: Vec<f64> = (0..1000).map(|i| 10.0 + (i % 37) as f64 / 100.0).collect();
        assert_eq!(decimals(&lat), Some(2));
        assert!(
            round_trip(&lat) < 1000 * 2,
            "2-decimal latencies under 2 bytes"
        );
        assert_eq!(decimals(&[48.125, 1e12, -3.0]), Some(3));
        assert_eq!(decimals(&[48.125, 1e15]), None);
    }

    #[test]
    fn every_odd_bit_pattern_survives() {
        let odd = [
            f64::NAN,
            f64::from_bits(0x7ff0_0000_0000_0001),
            f64::from_bits(0xfff8_dead_beef_0001),
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            0.0,
            f64::MIN_POSITIVE / 3.0,
            f64::from_bits(1),
            f64::MAX,
            f64::MIN,
            0.1 + 0.2,
        ];
        assert_eq!(decimals(&odd), None);
        round_trip(&odd);
        round_trip(&[-0.0; 5]);
        round_trip(&[0.1 + 0.2, 0.1 + 0.2, 1.0 / 3.0]);
    }
}
