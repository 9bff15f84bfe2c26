//! The columnar chunk encoding (format 1, the first byte [`MARKER`]). A chunk holds the
//! points of one tag set: one timestamp column shared by every field, then one column per
//! series. Layout: `MARKER`, `varint(points)`, the time column (`ts - ts_min` of the row, an
//! integer column: jittered regular times pack to the jitter's bits), `varint(columns)`,
//! then per column `zigzag-varint(series id)`, a kind byte (0 float, 1 int, 2 uint, 3 bool,
//! 4 string), a presence byte (0: in every point; 1: a bitmap of the points follows) and
//! its values: floats per [`super::floats`], ints, uints (their bit pattern) and bools (0/1)
//! per [`super::ints`] (a constant or boolean column is a few bytes in all), strings as
//! `varint(len)` + UTF-8.
//!
//! Times are relative to the row's `ts_min`, so moving every point by the same step only
//! changes the row's bounds. Values of one point come back in the chunk's column order
//! (the order in which the fields first appeared in it). A point that names a series twice,
//! or a series that changes type, cannot be a column: such a chunk is written point by point
//! behind [`POINTS_MARKER`] instead (the writer never produces one). Pure; the decoder
//! never panics on corrupt input.

use super::bits::{get_u8, get_varint, put_varint, unzigzag, zigzag};
use super::{floats, ints, legacy, CodecError};
use crate::model::Value;

/// First byte of a columnar chunk. Legacy chunks start with the zigzag varint of a
/// non-negative time delta, whose low bit is always 0; every versioned format starts odd.
pub const MARKER: u8 = 0x03;

/// First byte of a point-by-point chunk (the legacy body follows).
pub const POINTS_MARKER: u8 = 0x05;

/// Most points a chunk may claim (a decoder bound; the writer packs at most 2048).
pub const MAX_POINTS: usize = 1 << 16;

const K_F64: u8 = 0;
const K_I64: u8 = 1;
const K_U64: u8 = 2;
const K_BOOL: u8 = 3;
const K_STR: u8 = 4;

enum Vals {
    F64(Vec<f64>),
    I64(Vec<i64>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
    Str(Vec<String>),
}

impl Vals {
    fn for_value(v: &Value) -> Vals {
        match v {
            Value::F64(_) => Vals::F64(Vec::new()),
            Value::I64(_) => Vals::I64(Vec::new()),
            Value::U64(_) => Vals::U64(Vec::new()),
            Value::Bool(_) => Vals::Bool(Vec::new()),
            Value::Str(_) => Vals::Str(Vec::new()),
        }
    }

    /// True when `v` is of this column's kind.
    fn holds(&self, v: &Value) -> bool {
        matches!(
            (self, v),
            (Vals::F64(_), Value::F64(_))
                | (Vals::I64(_), Value::I64(_))
                | (Vals::U64(_), Value::U64(_))
                | (Vals::Bool(_), Value::Bool(_))
                | (Vals::Str(_), Value::Str(_))
        )
    }

    /// Appends `v`; false when it is of another kind.
    fn push(&mut self, v: &Value) -> bool {
        match (self, v) {
            (Vals::F64(c), Value::F64(x)) => c.push(*x),
            (Vals::I64(c), Value::I64(x)) => c.push(*x),
            (Vals::U64(c), Value::U64(x)) => c.push(*x),
            (Vals::Bool(c), Value::Bool(x)) => c.push(*x),
            (Vals::Str(c), Value::Str(x)) => c.push(x.clone()),
            _ => return false,
        }
        true
    }

    fn kind(&self) -> u8 {
        match self {
            Vals::F64(_) => K_F64,
            Vals::I64(_) => K_I64,
            Vals::U64(_) => K_U64,
            Vals::Bool(_) => K_BOOL,
            Vals::Str(_) => K_STR,
        }
    }

    fn value(&self, i: usize) -> Option<Value> {
        Some(match self {
            Vals::F64(c) => Value::F64(*c.get(i)?),
            Vals::I64(c) => Value::I64(*c.get(i)?),
            Vals::U64(c) => Value::U64(*c.get(i)?),
            Vals::Bool(c) => Value::Bool(*c.get(i)?),
            Vals::Str(c) => Value::Str(c.get(i)?.clone()),
        })
    }
}

struct Column {
    sid: i64,
    /// Points (indices) that have a value, ascending.
    rows: Vec<u32>,
    vals: Vals,
}

/// One encoded chunk row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// The packed points.
    pub data: Vec<u8>,
    /// Oldest point time, ns.
    pub ts_min: i64,
    /// Newest point time, ns.
    pub ts_max: i64,
    /// Points.
    pub n: usize,
}

/// Builds one chunk from points pushed in order; [`ChunkEncoder::finish`] packs them.
#[derive(Default)]
pub struct ChunkEncoder {
    ts: Vec<i64>,
    cols: Vec<Column>,
    /// Series id -> column (foldhash: looked up for points that name their series in
    /// another order than the columns').
    index: foldhash::HashMap<i64, usize>,
    /// Points kept in the legacy form once a point did not fit columns: (time, packed
    /// values, value count).
    legacy: Option<Vec<(i64, Vec<u8>, usize)>>,
    seen: Vec<i64>,
}

impl ChunkEncoder {
    /// An empty chunk.
    pub fn new() -> Self {
        Self::default()
    }

    /// Points pushed since the last [`ChunkEncoder::finish`].
    pub fn len(&self) -> usize {
        self.legacy.as_ref().map_or(self.ts.len(), |l| l.len())
    }

    /// True when no point is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds one point: its time and its values, `(series id, value)`.
    pub fn push<'v>(
        &mut self,
        ts: i64,
        values: impl IntoIterator<Item = (i64, &'v Value)> + Clone,
    ) {
        if self.legacy.is_none() && !self.fits(values.clone()) {
            self.switch_to_points();
        }
        if let Some(points) = &mut self.legacy {
            let mut buf = Vec::new();
            let mut n = 0;
            for (sid, v) in values {
                legacy::encode_value(&mut buf, sid, v);
                n += 1;
            }
            points.push((ts, buf, n));
            return;
        }
        let row = self.ts.len() as u32;
        self.ts.push(ts);
        for (i, (sid, v)) in values.into_iter().enumerate() {
            let slot = match self.slot(i, sid) {
                Some(i) => i,
                None => {
                    self.cols.push(Column {
                        sid,
                        rows: Vec::new(),
                        vals: Vals::for_value(v),
                    });
                    self.index.insert(sid, self.cols.len() - 1);
                    self.cols.len() - 1
                }
            };
            let col = &mut self.cols[slot];
            col.rows.push(row);
            col.vals.push(v);
        }
    }

    /// True when the point's values can join the columns: no series twice, no type change.
    fn fits<'v>(&mut self, values: impl IntoIterator<Item = (i64, &'v Value)>) -> bool {
        self.seen.clear();
        for (i, (sid, v)) in values.into_iter().enumerate() {
            if self.seen.contains(&sid) {
                return false;
            }
            self.seen.push(sid);
            if let Some(c) = self.slot(i, sid) {
                if !self.cols[c].vals.holds(v) {
                    return false;
                }
            }
        }
        true
    }

    /// The column of series `sid`, the `i`-th value of a point: a point usually names its
    /// series in the order of the chunk's columns, so column `i` is tried before the index.
    fn slot(&self, i: usize, sid: i64) -> Option<usize> {
        match self.cols.get(i) {
            Some(c) if c.sid == sid => Some(i),
            _ => self.index.get(&sid).copied(),
        }
    }

    /// Moves the pending points to the legacy form (values of a point in column order).
    fn switch_to_points(&mut self) {
        let mut points: Vec<(i64, Vec<u8>, usize)> =
            self.ts.iter().map(|&t| (t, Vec::new(), 0)).collect();
        let mut cursor = vec![0usize; self.cols.len()];
        for (row, p) in points.iter_mut().enumerate() {
            for (c, col) in self.cols.iter().enumerate() {
                if col.rows.get(cursor[c]) == Some(&(row as u32)) {
                    if let Some(v) = col.vals.value(cursor[c]) {
                        legacy::encode_value(&mut p.1, col.sid, &v);
                        p.2 += 1;
                    }
                    cursor[c] += 1;
                }
            }
        }
        self.ts.clear();
        self.cols.clear();
        self.index.clear();
        self.legacy = Some(points);
    }

    /// Packs the pending points into one chunk row and starts an empty one (`None` when
    /// nothing is pending).
    pub fn finish(&mut self) -> Option<Encoded> {
        if let Some(points) = self.legacy.take() {
            return legacy_chunk(&points);
        }
        let ts_min = *self.ts.iter().min()?;
        let ts_max = *self.ts.iter().max()?;
        let n = self.ts.len();
        let mut out = Vec::with_capacity(16 + n * 4);
        out.push(MARKER);
        put_varint(&mut out, n as u64);
        let rel: Vec<i64> = self.ts.iter().map(|t| t.wrapping_sub(ts_min)).collect();
        ints::encode(&mut out, &rel);
        put_varint(&mut out, self.cols.len() as u64);
        for col in &self.cols {
            put_varint(&mut out, zigzag(col.sid));
            out.push(col.vals.kind());
            if col.rows.len() == n {
                out.push(0);
            } else {
                out.push(1);
                let mut bitmap = vec![0u8; n.div_ceil(8)];
                for &r in &col.rows {
                    bitmap[r as usize / 8] |= 1 << (r % 8);
                }
                out.extend_from_slice(&bitmap);
            }
            match &col.vals {
                Vals::F64(c) => floats::encode(&mut out, c),
                Vals::I64(c) => ints::encode(&mut out, c),
                Vals::U64(c) => {
                    let bits: Vec<i64> = c.iter().map(|&u| u as i64).collect();
                    ints::encode(&mut out, &bits)
                }
                Vals::Bool(c) => {
                    let bits: Vec<i64> = c.iter().map(|&b| i64::from(b)).collect();
                    ints::encode(&mut out, &bits)
                }
                Vals::Str(c) => {
                    for s in c {
                        put_varint(&mut out, s.len() as u64);
                        out.extend_from_slice(s.as_bytes());
                    }
                }
            }
        }
        self.ts.clear();
        self.cols.clear();
        self.index.clear();
        Some(Encoded {
            data: out,
            ts_min,
            ts_max,
            n,
        })
    }
}

fn legacy_chunk(points: &[(i64, Vec<u8>, usize)]) -> Option<Encoded> {
    let ts_min = points.iter().map(|p| p.0).min()?;
    let ts_max = points.iter().map(|p| p.0).max()?;
    let mut data = vec![POINTS_MARKER];
    let mut prev = ts_min;
    for (ts, vals, n) in points {
        legacy::encode_point_header(&mut data, prev, *ts, *n);
        data.extend_from_slice(vals);
        prev = *ts;
    }
    Some(Encoded {
        data,
        ts_min,
        ts_max,
        n: points.len(),
    })
}

/// Decodes a columnar chunk point by point: `f(ts, values)` with the point's
/// `(series id, value)`s (the callee may drain them).
pub fn decode_points(
    buf: &[u8],
    ts_min: i64,
    mut f: impl FnMut(i64, &mut Vec<(i64, Value)>),
) -> Result<(), CodecError> {
    let mut pos = 0usize;
    if get_u8(buf, &mut pos)? != MARKER {
        return Err(CodecError::at(0, "not a columnar chunk"));
    }
    let n = get_varint(buf, &mut pos)? as usize;
    if n > MAX_POINTS {
        return Err(CodecError::at(1, "too many points"));
    }
    let mut ts = Vec::with_capacity(n);
    ints::decode(buf, &mut pos, n, &mut ts)?;
    let ncols = get_varint(buf, &mut pos)? as usize;
    if ncols > buf.len() {
        return Err(CodecError::at(pos, "too many columns"));
    }
    let mut cols: Vec<(i64, Option<Vec<u8>>, std::vec::IntoIter<Value>)> =
        Vec::with_capacity(ncols);
    for _ in 0..ncols {
        let sid = unzigzag(get_varint(buf, &mut pos)?);
        let kind_at = pos;
        let kind = get_u8(buf, &mut pos)?;
        let presence_at = pos;
        let (bitmap, m) = match get_u8(buf, &mut pos)? {
            0 => (None, n),
            1 => {
                let len = n.div_ceil(8);
                let bytes = buf
                    .get(pos..pos + len)
                    .ok_or(CodecError::at(pos, "truncated presence bitmap"))?;
                pos += len;
                let m = (0..n)
                    .filter(|&i| bytes[i / 8] & (1 << (i % 8)) != 0)
                    .count();
                (Some(bytes.to_vec()), m)
            }
            _ => return Err(CodecError::at(presence_at, "bad presence byte")),
        };
        let vals = decode_values(buf, &mut pos, kind, kind_at, m)?;
        cols.push((sid, bitmap, vals.into_iter()));
    }
    if pos != buf.len() {
        return Err(CodecError::at(pos, "trailing bytes"));
    }
    let mut point = Vec::with_capacity(cols.len());
    for (i, t) in ts.into_iter().enumerate() {
        point.clear();
        for (sid, bitmap, vals) in &mut cols {
            let present = bitmap
                .as_ref()
                .map_or(true, |b| b[i / 8] & (1 << (i % 8)) != 0);
            if present {
                let v = vals
                    .next()
                    .ok_or(CodecError::at(pos, "column shorter than its bitmap"))?;
                point.push((*sid, v));
            }
        }
        f(ts_min.wrapping_add(t), &mut point);
    }
    Ok(())
}

fn decode_values(
    buf: &[u8],
    pos: &mut usize,
    kind: u8,
    kind_at: usize,
    m: usize,
) -> Result<Vec<Value>, CodecError> {
    Ok(match kind {
        K_F64 => {
            let mut c = Vec::with_capacity(m);
            floats::decode(buf, pos, m, &mut c)?;
            c.into_iter().map(Value::F64).collect()
        }
        K_I64 | K_U64 | K_BOOL => {
            let mut c = Vec::with_capacity(m);
            ints::decode(buf, pos, m, &mut c)?;
            match kind {
                K_I64 => c.into_iter().map(Value::I64).collect(),
                K_U64 => c.into_iter().map(|v| Value::U64(v as u64)).collect(),
                _ => c
                    .into_iter()
                    .map(|v| match v {
                        0 => Ok(Value::Bool(false)),
                        1 => Ok(Value::Bool(true)),
                        _ => Err(CodecError::at(kind_at, "boolean column holds a non-0/1")),
                    })
                    .collect::<Result<_, _>>()?,
            }
        }
        K_STR => {
            let mut c = Vec::with_capacity(m);
            for _ in 0..m {
                let len = get_varint(buf, pos)? as usize;
                let end = pos
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or(CodecError::at(*pos, "truncated string"))?;
                let s = std::str::from_utf8(&buf[*pos..end])
                    .map_err(|_| CodecError::at(*pos, "string is not UTF-8"))?;
                c.push(Value::Str(s.to_string()));
                *pos = end;
            }
            c
        }
        _ => return Err(CodecError::at(kind_at, "unknown column kind")),
    })
}
