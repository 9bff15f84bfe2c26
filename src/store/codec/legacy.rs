//! The legacy packed encoding of a chunk (format 0, written before the columnar one and
//! still read): per point `zigzag-varint(ts - prev)` (`prev` starts at the row's `ts_min`),
//! `varint(number of values)`, then per value `varint(series_id << 3 | tag)` and its
//! payload: float = 8 bytes little-endian, int = zigzag varint, uint = varint, bool = none
//! (tag 3 false, 4 true), string = varint length + UTF-8 bytes. Its first byte is always
//! even (the first delta is never negative), which is how [`super`] tells it apart.
//! Pure functions; decoding never panics on corrupt input, it returns an error.

use super::bits::{get_varint, put_varint, unzigzag, zigzag};
use super::CodecError;
use crate::model::Value;

const T_FLOAT: u64 = 0;
const T_INT: u64 = 1;
const T_UINT: u64 = 2;
const T_FALSE: u64 = 3;
const T_TRUE: u64 = 4;
const T_STR: u64 = 5;

/// Appends one value of series `series_id`.
pub fn encode_value(out: &mut Vec<u8>, series_id: i64, value: &Value) {
    let sid = (series_id as u64) << 3;
    match value {
        Value::F64(f) => {
            put_varint(out, sid | T_FLOAT);
            out.extend_from_slice(&f.to_le_bytes());
        }
        Value::I64(i) => {
            put_varint(out, sid | T_INT);
            put_varint(out, zigzag(*i));
        }
        Value::U64(u) => {
            put_varint(out, sid | T_UINT);
            put_varint(out, *u);
        }
        Value::Bool(b) => put_varint(out, sid | if *b { T_TRUE } else { T_FALSE }),
        Value::Str(s) => {
            put_varint(out, sid | T_STR);
            put_varint(out, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// Appends a point header: its timestamp as a delta from `prev` and its value count.
pub fn encode_point_header(out: &mut Vec<u8>, prev: i64, ts: i64, values: usize) {
    put_varint(out, zigzag(ts.wrapping_sub(prev)));
    put_varint(out, values as u64);
}

/// Decodes a chunk point by point: `f(ts, values)` (the callee may drain them).
pub fn decode_points(
    buf: &[u8],
    ts_min: i64,
    mut f: impl FnMut(i64, &mut Vec<(i64, Value)>),
) -> Result<(), CodecError> {
    let mut pos = 0usize;
    let mut ts = ts_min;
    let mut point = Vec::new();
    while pos < buf.len() {
        point.clear();
        ts = decode_point(buf, &mut pos, ts, &mut point)?;
        f(ts, &mut point);
    }
    Ok(())
}

/// Decodes the point at `pos` (written by [`encode_point_header`] and [`encode_value`]s
/// after a point at `prev`): appends its values to `out`, returns its time.
pub fn decode_point(
    buf: &[u8],
    pos: &mut usize,
    prev: i64,
    out: &mut Vec<(i64, Value)>,
) -> Result<i64, CodecError> {
    let ts = prev.wrapping_add(unzigzag(get_varint(buf, pos)?));
    let n = get_varint(buf, pos)?;
    for _ in 0..n {
        out.push(decode_value(buf, pos)?);
    }
    Ok(ts)
}

/// Decodes a chunk, calling `f(ts, series_id, value)` for every value in order.
pub fn decode_chunk(
    buf: &[u8],
    ts_min: i64,
    mut f: impl FnMut(i64, i64, Value),
) -> Result<(), CodecError> {
    let mut pos = 0usize;
    let mut ts = ts_min;
    while pos < buf.len() {
        ts = ts.wrapping_add(unzigzag(get_varint(buf, &mut pos)?));
        let n = get_varint(buf, &mut pos)?;
        for _ in 0..n {
            let (sid, v) = decode_value(buf, &mut pos)?;
            f(ts, sid, v);
        }
    }
    Ok(())
}

/// Re-times a chunk: every point's timestamp `t` becomes `map(t)`, values untouched (copied
/// byte for byte). Returns the new data with its new `(ts_min, ts_max)` and how many points
/// `map` moved. The point count and order are kept.
pub fn retime_chunk(
    buf: &[u8],
    ts_min: i64,
    map: impl Fn(i64) -> i64,
) -> Result<(Vec<u8>, i64, i64, u64), CodecError> {
    // Pass 1: the points (new time, value bytes).
    let mut points: Vec<(i64, u64, std::ops::Range<usize>)> = Vec::new();
    let mut pos = 0usize;
    let mut ts = ts_min;
    let mut moved = 0u64;
    while pos < buf.len() {
        ts = ts.wrapping_add(unzigzag(get_varint(buf, &mut pos)?));
        let n = get_varint(buf, &mut pos)?;
        let start = pos;
        for _ in 0..n {
            decode_value(buf, &mut pos)?;
        }
        let t = map(ts);
        if t != ts {
            moved += 1;
        }
        points.push((t, n, start..pos));
    }
    let lo = points.iter().map(|p| p.0).min().unwrap_or(ts_min);
    let hi = points.iter().map(|p| p.0).max().unwrap_or(ts_min);
    // Pass 2: the same points from the new base.
    let mut out = Vec::with_capacity(buf.len() + 8);
    let mut prev = lo;
    for (t, n, bytes) in points {
        put_varint(&mut out, zigzag(t.wrapping_sub(prev)));
        put_varint(&mut out, n);
        out.extend_from_slice(&buf[bytes]);
        prev = t;
    }
    Ok((out, lo, hi, moved))
}

/// Decodes a sequence of values with no point headers, calling `f` for each.
pub fn decode(buf: &[u8], mut f: impl FnMut(i64, Value)) -> Result<(), CodecError> {
    let mut pos = 0usize;
    while pos < buf.len() {
        let (sid, v) = decode_value(buf, &mut pos)?;
        f(sid, v);
    }
    Ok(())
}

fn decode_value(buf: &[u8], pos: &mut usize) -> Result<(i64, Value), CodecError> {
    let head = get_varint(buf, pos)?;
    let sid = (head >> 3) as i64;
    let value = match head & 7 {
        T_FLOAT => {
            let bytes: [u8; 8] = buf
                .get(*pos..*pos + 8)
                .and_then(|s| s.try_into().ok())
                .ok_or(CodecError::at(*pos, "bad legacy value"))?;
            *pos += 8;
            Value::F64(f64::from_le_bytes(bytes))
        }
        T_INT => Value::I64(unzigzag(get_varint(buf, pos)?)),
        T_UINT => Value::U64(get_varint(buf, pos)?),
        T_FALSE => Value::Bool(false),
        T_TRUE => Value::Bool(true),
        T_STR => {
            let len = get_varint(buf, pos)? as usize;
            let end = pos
                .checked_add(len)
                .ok_or(CodecError::at(*pos, "bad legacy value"))?;
            let bytes = buf
                .get(*pos..end)
                .ok_or(CodecError::at(*pos, "bad legacy value"))?;
            let s =
                std::str::from_utf8(bytes).map_err(|_| CodecError::at(*pos, "bad legacy value"))?;
            *pos = end;
            Value::Str(s.to_string())
        }
        _ => return Err(CodecError::at(*pos, "bad legacy value")),
    };
    Ok((sid, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_kind() {
        let vals = vec![
            (1, Value::F64(-12.25)),
            (300, Value::I64(i64::MIN)),
            (7, Value::I64(-1)),
            (1 << 40, Value::U64(u64::MAX)),
            (2, Value::Bool(true)),
            (3, Value::Bool(false)),
            (4, Value::Str("héllo \"x\"".into())),
        ];
        let mut buf = Vec::new();
        for (id, v) in &vals {
            encode_value(&mut buf, *id, v);
        }
        let mut got = Vec::new();
        decode(&buf, |id, v| got.push((id, v))).unwrap();
        assert_eq!(got, vals);
    }

    #[test]
    fn retime_moves_only_what_the_map_moves_and_keeps_points_and_values() {
        // Two points share a time (kept apart), one has two values, one is a string.
        let pts: [(i64, &[(i64, Value)]); 4] = [
            (1_000, &[(1, Value::F64(1.5)), (2, Value::I64(-3))]),
            (1_000, &[(1, Value::F64(2.5))]),
            (9_000_000_000_000_000_000, &[(3, Value::Str("ok".into()))]),
            (500, &[(1, Value::Bool(true))]),
        ];
        let mut buf = Vec::new();
        let mut prev = 500;
        for (ts, vals) in &pts {
            encode_point_header(&mut buf, prev, *ts, vals.len());
            for (sid, v) in *vals {
                encode_value(&mut buf, *sid, v);
            }
            prev = *ts;
        }
        let floor = 1_000_000_000_000_000_000;
        let step = 1_764_000_000_000_000_000;
        let (out, lo, hi, moved) =
            retime_chunk(&buf, 500, |t| if t < floor { t + step } else { t }).unwrap();
        assert_eq!(moved, 3);
        assert_eq!((lo, hi), (step + 500, 9_000_000_000_000_000_000));
        let mut got = Vec::new();
        decode_chunk(&out, lo, |ts, sid, v| got.push((ts, sid, v))).unwrap();
        let want: Vec<(i64, i64, Value)> = pts
            .iter()
            .flat_map(|(ts, vals)| {
                let t = if *ts < floor { ts + step } else { *ts };
                vals.iter().map(move |(sid, v)| (t, *sid, v.clone()))
            })
            .collect();
        assert_eq!(got, want);
        // Identity: the same bytes back.
        let (same, lo, hi, moved) = retime_chunk(&buf, 500, |t| t).unwrap();
        assert_eq!(
            (same, lo, hi, moved),
            (buf.clone(), 500, 9_000_000_000_000_000_000, 0)
        );
        // Corrupt input is an error, not a panic.
        assert!(retime_chunk(&buf[..buf.len() - 3], 500, |t| t + 1).is_err());
    }

    #[test]
    fn chunks_round_trip_with_time_deltas() {
        let mut buf = Vec::new();
        let pts = [(100i64, 1.5f64), (90, 2.5), (i64::MAX, 3.5)];
        let mut prev = 90;
        for (ts, v) in pts {
            encode_point_header(&mut buf, prev, ts, 1);
            encode_value(&mut buf, 3, &Value::F64(v));
            prev = ts;
        }
        let mut got = Vec::new();
        decode_chunk(&buf, 90, |ts, sid, v| got.push((ts, sid, v))).unwrap();
        assert_eq!(
            got,
            pts.iter()
                .map(|(t, v)| (*t, 3, Value::F64(*v)))
                .collect::<Vec<_>>()
        );
        for cut in 0..buf.len() {
            let _ = decode_chunk(&buf[..cut], 0, |_, _, _| {});
        }
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        let mut buf = Vec::new();
        encode_value(&mut buf, 9, &Value::Str("abcdef".into()));
        for cut in 0..buf.len() {
            let _ = decode(&buf[..cut], |_, _| {});
        }
        assert!(decode(&[0x80; 20], |_, _| {}).is_err());
        assert!(decode(&[0x06], |_, _| {}).is_err());
    }
}
