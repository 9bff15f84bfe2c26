//! The packed encoding of one line's field values inside a `points.data` BLOB.
//!
//! Each value is `varint(series_id << 3 | tag)` followed by its payload: float = 8 bytes
//! little-endian, int = zigzag varint, uint = varint, bool = none (tag 3 false, 4 true),
//! string = varint length + UTF-8 bytes. Pure functions; decoding never panics on corrupt
//! input, it returns an error.

use crate::model::Value;

const T_FLOAT: u64 = 0;
const T_INT: u64 = 1;
const T_UINT: u64 = 2;
const T_FALSE: u64 = 3;
const T_TRUE: u64 = 4;
const T_STR: u64 = 5;

/// A BLOB that does not decode (corruption, or a newer format).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("corrupt point data at byte {offset}")]
pub struct CodecError {
    /// Where decoding stopped.
    pub offset: usize,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(buf: &[u8], pos: &mut usize) -> Result<u64, CodecError> {
    let mut v: u64 = 0;
    let mut shift = 0u32;
    loop {
        let b = *buf.get(*pos).ok_or(CodecError { offset: *pos })?;
        *pos += 1;
        if shift > 63 {
            return Err(CodecError { offset: *pos });
        }
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(v);
        }
        shift += 7;
    }
}

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
            put_varint(out, ((i << 1) ^ (i >> 63)) as u64);
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

/// Decodes every (series id, value) of a BLOB, calling `f` for each.
pub fn decode(buf: &[u8], mut f: impl FnMut(i64, Value)) -> Result<(), CodecError> {
    let mut pos = 0usize;
    while pos < buf.len() {
        let head = get_varint(buf, &mut pos)?;
        let sid = (head >> 3) as i64;
        let value = match head & 7 {
            T_FLOAT => {
                let bytes: [u8; 8] = buf
                    .get(pos..pos + 8)
                    .and_then(|s| s.try_into().ok())
                    .ok_or(CodecError { offset: pos })?;
                pos += 8;
                Value::F64(f64::from_le_bytes(bytes))
            }
            T_INT => {
                let z = get_varint(buf, &mut pos)?;
                Value::I64(((z >> 1) as i64) ^ -((z & 1) as i64))
            }
            T_UINT => Value::U64(get_varint(buf, &mut pos)?),
            T_FALSE => Value::Bool(false),
            T_TRUE => Value::Bool(true),
            T_STR => {
                let len = get_varint(buf, &mut pos)? as usize;
                let end = pos.checked_add(len).ok_or(CodecError { offset: pos })?;
                let bytes = buf.get(pos..end).ok_or(CodecError { offset: pos })?;
                let s = std::str::from_utf8(bytes).map_err(|_| CodecError { offset: pos })?;
                pos = end;
                Value::Str(s.to_string())
            }
            _ => return Err(CodecError { offset: pos }),
        };
        f(sid, value);
    }
    Ok(())
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
