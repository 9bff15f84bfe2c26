//! The encodings of a chunk of points (`chunks.data`), versioned by the first byte: the
//! legacy point-by-point form ([`legacy`], format 0, first byte even) and the columnar form
//! ([`columnar`], format 1, first byte [`columnar::MARKER`]). New chunks are columnar;
//! every function here reads both, so a store written before keeps reading without a
//! rewrite (`edgewatch maintain --recompress` converts it, see [`super::compact`]).
//!
//! Pure functions of their input: no IO, no clock. Decoding never panics on corrupt input;
//! it returns a [`CodecError`] saying where and what (and, once the store adds it, which
//! chunk).

mod bits;
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
    /// Point by point (written before the columnar form).
    Legacy,
    /// Columnar.
    Columnar,
}

/// The format of `buf` (an empty chunk is legacy: it has no points either way).
pub fn format(buf: &[u8]) -> Result<Format, CodecError> {
    match buf.first() {
        None => Ok(Format::Legacy),
        Some(b) if b & 1 == 0 => Ok(Format::Legacy),
        Some(&columnar::MARKER) => Ok(Format::Columnar),
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
