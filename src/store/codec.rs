//! The encodings of a chunk of points (`chunks.data`), versioned by the first byte: the
//! legacy point-by-point form ([`legacy`], format 0, first byte even), the columnar form
//! ([`columnar`], format 1, first byte [`columnar::MARKER`]) and the point-by-point form
//! behind a format byte (format 2, [`columnar::POINTS_MARKER`], for points that cannot be
//! columns). A legacy chunk whose points span more than 2^63 ns could start odd; the
//! writer never made one (its first byte is the delta to the chunk's oldest point). New chunks are columnar;
//! every function here reads both, so a store written before keeps reading without a
//! rewrite (`edgewatch maintain --recompress` converts it, see [`super::compact`]).
//!
//! Pure functions of their input: no IO, no clock. Decoding never panics on corrupt input;
//! it returns a [`CodecError`] saying where and what (and, once the store adds it, which
//! chunk).

pub(crate) mod bits;
pub mod columnar;
mod floats;
mod ints;
pub mod legacy;

pub use columnar::{ChunkEncoder, Encoded};
pub use legacy::{encode_point_header, encode_value};

use crate::model::Value;

/// A BLOB that does not decode (corruption, or a format newer than this binary).
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
#[error("{}{what} at byte {offset}", chunk.map(|c| format!("chunk {c}: ")).unwrap_or_default())]
pub struct CodecError {
    /// The chunk's id, when the caller knows it.
    pub chunk: Option<i64>,
    /// Where decoding stopped.
    pub offset: usize,
    /// What was wrong.
    pub what: &'static str,
}

impl CodecError {
    pub(crate) fn at(offset: usize, what: &'static str) -> Self {
        CodecError {
            chunk: None,
            offset,
            what,
        }
    }

    /// The same error, naming chunk `id`.
    pub fn in_chunk(self, id: i64) -> Self {
        CodecError {
            chunk: Some(id),
            ..self
        }
    }
}

/// How a chunk is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Point by point, as written before the columnar form (no format byte).
    Legacy,
    /// Point by point behind a format byte ([`columnar::POINTS_MARKER`]): what the encoder
    /// writes for points that cannot be columns.
    Points,
    /// Columnar.
    Columnar,
}

/// The format of `buf` (an empty chunk is legacy: it has no points either way).
pub fn format(buf: &[u8]) -> Result<Format, CodecError> {
    match buf.first() {
        None => Ok(Format::Legacy),
        Some(b) if b & 1 == 0 => Ok(Format::Legacy),
        Some(&columnar::MARKER) => Ok(Format::Columnar),
        Some(&columnar::POINTS_MARKER) => Ok(Format::Points),
        Some(_) => Err(CodecError::at(
            0,
            "unknown chunk format (written by a newer edgewatch?)",
        )),
    }
}

/// Decodes a chunk point by point: `f(ts, values)` with the point's `(series id, value)`s
/// (the callee may drain them). `ts_min` is the row's.
pub fn decode_points(
    buf: &[u8],
    ts_min: i64,
    f: impl FnMut(i64, &mut Vec<(i64, Value)>),
) -> Result<(), CodecError> {
    match format(buf)? {
        Format::Legacy => legacy::decode_points(buf, ts_min, f),
        Format::Points => legacy::decode_points(&buf[1..], ts_min, f)
            .map_err(|e| CodecError::at(e.offset + 1, e.what)),
        Format::Columnar => columnar::decode_points(buf, ts_min, f),
    }
}

/// Decodes a chunk, calling `f(ts, series_id, value)` for every value in order.
pub fn decode_chunk(
    buf: &[u8],
    ts_min: i64,
    mut f: impl FnMut(i64, i64, Value),
) -> Result<(), CodecError> {
    decode_points(buf, ts_min, |ts, vals| {
        for (sid, v) in vals.drain(..) {
            f(ts, sid, v);
        }
    })
}

/// Re-encodes any chunk in the columnar form (the same points in the same order).
pub fn reencode(buf: &[u8], ts_min: i64) -> Result<Option<Encoded>, CodecError> {
    let mut enc = ChunkEncoder::new();
    decode_points(buf, ts_min, |ts, vals| {
        enc.push(ts, vals.iter().map(|(s, v)| (*s, v)))
    })?;
    Ok(enc.finish())
}

/// Re-times a chunk: every point's timestamp `t` becomes `map(t)`, values untouched.
/// Returns the new data with its new `(ts_min, ts_max)` and how many points `map` moved.
/// The point count and order and the chunk's format are kept (a legacy chunk's value
/// bytes are copied byte for byte).
pub fn retime_chunk(
    buf: &[u8],
    ts_min: i64,
    map: impl Fn(i64) -> i64,
) -> Result<(Vec<u8>, i64, i64, u64), CodecError> {
    match format(buf)? {
        Format::Legacy => legacy::retime_chunk(buf, ts_min, map),
        Format::Points => {
            let (body, lo, hi, moved) = legacy::retime_chunk(&buf[1..], ts_min, map)
                .map_err(|e| CodecError::at(e.offset + 1, e.what))?;
            let mut out = Vec::with_capacity(body.len() + 1);
            out.push(columnar::POINTS_MARKER);
            out.extend_from_slice(&body);
            Ok((out, lo, hi, moved))
        }
        Format::Columnar => {
            let mut enc = ChunkEncoder::new();
            let mut moved = 0u64;
            decode_points(buf, ts_min, |ts, vals| {
                let t = map(ts);
                if t != ts {
                    moved += 1;
                }
                enc.push(t, vals.iter().map(|(s, v)| (*s, v)));
            })?;
            Ok(match enc.finish() {
                Some(e) => (e.data, e.ts_min, e.ts_max, moved),
                None => (Vec::new(), ts_min, ts_min, 0),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A value as comparable bits (floats by bit pattern: NaN payloads, -0.0).
    fn key(v: &Value) -> (u8, u64, String) {
        match v {
            Value::F64(f) => (0, f.to_bits(), String::new()),
            Value::I64(i) => (1, *i as u64, String::new()),
            Value::U64(u) => (2, *u, String::new()),
            Value::Bool(b) => (3, u64::from(*b), String::new()),
            Value::Str(s) => (4, 0, s.clone()),
        }
    }

    type Point = (i64, Vec<(i64, Value)>);

    /// Points as comparable keys, each point's values ordered by series (the columnar form
    /// returns a point's values in column order).
    type Keyed = (i64, Vec<(i64, (u8, u64, String))>);

    fn keys(points: &[Point]) -> Vec<Keyed> {
        points
            .iter()
            .map(|(t, vals)| {
                let mut k: Vec<_> = vals.iter().map(|(s, v)| (*s, key(v))).collect();
                k.sort_by_key(|(s, _)| *s);
                (*t, k)
            })
            .collect()
    }

    fn adversarial_f64() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<u64>().prop_map(f64::from_bits),
            (-100_000i64..100_000, 0u32..4).prop_map(|(k, d)| k as f64 / 10f64.powi(d as i32)),
            prop::sample::select(vec![
                f64::NAN,
                f64::from_bits(0x7ff0_0000_0000_0001),
                f64::from_bits(0xfff8_0000_dead_beef),
                f64::INFINITY,
                f64::NEG_INFINITY,
                -0.0,
                0.0,
                f64::from_bits(1),
                f64::MIN_POSITIVE / 7.0,
                f64::MAX,
                f64::MIN,
            ]),
        ]
    }

    /// A value of the kind series `sid` has (kind = sid % 5), so columns are possible.
    fn value_for(sid: i64) -> BoxedStrategy<Value> {
        match sid % 5 {
            0 => adversarial_f64().prop_map(Value::F64).boxed(),
            1 => prop_oneof![any::<i64>(), Just(i64::MIN), Just(i64::MAX), -3i64..3]
                .prop_map(Value::I64)
                .boxed(),
            2 => prop_oneof![any::<u64>(), Just(u64::MAX), Just(0u64), 0u64..5]
                .prop_map(Value::U64)
                .boxed(),
            3 => any::<bool>().prop_map(Value::Bool).boxed(),
            _ => ".{0,12}".prop_map(Value::Str).boxed(),
        }
    }

    fn times() -> impl Strategy<Value = Vec<i64>> {
        prop_oneof![
            prop::collection::vec(any::<i64>(), 1..40),
            (
                any::<i64>(),
                prop::collection::vec(-20_000_000i64..20_000_000, 1..300)
            )
                .prop_map(|(t0, jitter)| {
                    (0..jitter.len() as i64)
                        .map(|i| (t0 >> 2).wrapping_add(i * 1_000_000_000 + jitter[i as usize]))
                        .collect()
                }),
        ]
    }

    fn points() -> impl Strategy<Value = Vec<Point>> {
        times().prop_flat_map(|ts| {
            let n = ts.len();
            let per_point = prop::collection::btree_set(1i64..12, 0..6).prop_flat_map(|sids| {
                sids.into_iter()
                    .map(|s| value_for(s).prop_map(move |v| (s, v)))
                    .collect::<Vec<_>>()
            });
            prop::collection::vec(per_point, n)
                .prop_map(move |vals| ts.iter().copied().zip(vals).collect())
        })
    }

    fn encode(points: &[Point]) -> Option<Encoded> {
        let mut enc = ChunkEncoder::new();
        for (t, vals) in points {
            enc.push(*t, vals.iter().map(|(s, v)| (*s, v)));
        }
        enc.finish()
    }

    fn decode_all(e: &Encoded) -> Vec<Point> {
        let mut got = Vec::new();
        decode_points(&e.data, e.ts_min, |t, vals| {
            got.push((t, std::mem::take(vals)))
        })
        .unwrap();
        got
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn every_chunk_round_trips_exactly(points in points()) {
            let e = encode(&points).unwrap();
            prop_assert_eq!(format(&e.data), Ok(Format::Columnar));
            prop_assert_eq!(e.n, points.len());
            prop_assert_eq!(e.ts_min, points.iter().map(|p| p.0).min().unwrap());
            prop_assert_eq!(e.ts_max, points.iter().map(|p| p.0).max().unwrap());
            prop_assert_eq!(keys(&decode_all(&e)), keys(&points));
            // Retimed by a step: the same values at the moved times.
            let (data, lo, _, moved) = retime_chunk(&e.data, e.ts_min, |t| t.wrapping_add(7)).unwrap();
            let mut got = Vec::new();
            decode_points(&data, lo, |t, vals| got.push((t, std::mem::take(vals)))).unwrap();
            let shifted: Vec<Point> = points.iter().map(|(t, v)| (t.wrapping_add(7), v.clone())).collect();
            prop_assert_eq!(keys(&got), keys(&shifted));
            prop_assert_eq!(moved, points.len() as u64);
        }

        #[test]
        fn points_that_cannot_be_columns_fall_back_to_the_legacy_form(
            points in prop::collection::vec(
                (any::<i64>(), prop::collection::vec((0i64..4, (0i64..5).prop_flat_map(value_for)), 0..5)),
                1..30,
            )
        ) {
            // Series repeat within a point and change type: still exact, in some form.
            let e = encode(&points).unwrap();
            let mut got = Vec::new();
            decode_points(&e.data, e.ts_min, |t, vals| got.push((t, std::mem::take(vals)))).unwrap();
            prop_assert_eq!(keys(&got), keys(&points));
        }

        #[test]
        fn corrupt_bytes_are_errors_never_panics(
            points in points(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
            noise in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let e = encode(&points).unwrap();
            let mut bad = e.data.clone();
            for (i, b) in &flips {
                let at = i.index(bad.len());
                bad[at] ^= b | 1;
            }
            let _ = decode_chunk(&bad, e.ts_min, |_, _, _| {});
            let _ = retime_chunk(&bad, e.ts_min, |t| t + 1);
            let _ = decode_chunk(&e.data[..cut.index(e.data.len())], e.ts_min, |_, _, _| {});
            let mut tagged = vec![MARKER_FOR_TESTS];
            tagged.extend_from_slice(&noise);
            let _ = decode_chunk(&tagged, 0, |_, _, _| {});
            let _ = decode_chunk(&noise, 0, |_, _, _| {});
        }
    }

    const MARKER_FOR_TESTS: u8 = columnar::MARKER;

    #[test]
    fn legacy_chunks_still_decode_and_unknown_formats_are_refused() {
        let mut old = Vec::new();
        encode_point_header(&mut old, 100, 100, 2);
        encode_value(&mut old, 1, &Value::F64(1.5));
        encode_value(&mut old, 2, &Value::Str("x".into()));
        encode_point_header(&mut old, 100, 250, 1);
        encode_value(&mut old, 1, &Value::F64(-0.0));
        assert_eq!(format(&old), Ok(Format::Legacy));
        let mut got = Vec::new();
        decode_chunk(&old, 100, |t, s, v| got.push((t, s, key(&v)))).unwrap();
        let want = vec![
            (100, 1, key(&Value::F64(1.5))),
            (100, 2, key(&Value::Str("x".into()))),
            (250, 1, key(&Value::F64(-0.0))),
        ];
        assert_eq!(got, want);
        // Re-encoded: the same points, columnar and smaller.
        let e = reencode(&old, 100).unwrap().unwrap();
        assert_eq!(format(&e.data), Ok(Format::Columnar));
        let mut again = Vec::new();
        decode_chunk(&e.data, e.ts_min, |t, s, v| again.push((t, s, key(&v)))).unwrap();
        assert_eq!(again, want);
        // A format this binary does not know is an error, not a guess.
        let e = decode_chunk(&[0x07, 0, 0], 0, |_, _, _| {}).unwrap_err();
        assert!(e.to_string().contains("unknown chunk format"), "{e}");
        assert_eq!(
            e.in_chunk(42).to_string().split(':').next(),
            Some("chunk 42")
        );
    }

    #[test]
    fn a_jittered_two_gauge_series_packs_in_a_quarter_of_the_legacy_size() {
        // 2048 points, 1 s apart with +-15 ms jitter, two 0-decimal gauges.
        let mut x = 7u64;
        let mut enc = ChunkEncoder::new();
        let (mut a, mut b) = (50.0f64, 1500.0f64);
        for i in 0..2048i64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            a = (a + ((x >> 60) as f64 - 7.5)).clamp(0.0, 100.0).round();
            b = (b + ((x >> 56 & 0xf) as f64 - 7.5) * 10.0).round();
            let t = 1_760_000_000_000_000_000 + i * 1_000_000_000 + (x >> 40) as i64 % 15_000_000;
            let (va, vb) = (Value::F64(a), Value::F64(b));
            enc.push(t, [(1, &va), (2, &vb)]);
        }
        let e = enc.finish().unwrap();
        // The jittered time (~26 bits a point) is most of it; legacy took 9 bytes a value.
        let per_value = e.data.len() as f64 / 4096.0;
        assert!(per_value < 2.5, "{per_value} bytes a value");
    }
}
