//! The data model shared by every stage: a parsed line of Influx line protocol
//! ([`Line`]), its field values ([`Value`]) and the batches ([`Batch`]) that travel from
//! ingest through the bounded queue to the writer. A series is measurement + sorted tag
//! set + field key; the measurement + tag set part is kept as one canonical string, the
//! *series key* (`cpu,host=a,region=eu`), escaped exactly as line protocol escapes it.
//! This module holds plain data only: no IO, no parsing.

use serde::Serialize;

/// One field value as line protocol types it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Value {
    /// `1.5`
    F64(f64),
    /// `3i`
    I64(i64),
    /// `3u`
    U64(u64),
    /// `true` / `false`
    Bool(bool),
    /// `"text"`: stored and returned, never aggregated.
    Str(String),
}

/// The type of a field; fixed for a series at its first write, as InfluxDB does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// 64-bit float.
    Float = 0,
    /// Signed integer.
    Int = 1,
    /// Unsigned integer.
    UInt = 2,
    /// Boolean.
    Bool = 3,
    /// String.
    Str = 4,
}

impl Kind {
    /// The stable number stored in the database.
    pub fn code(self) -> i64 {
        self as i64
    }

    /// Inverse of [`Kind::code`].
    pub fn from_code(code: i64) -> Option<Kind> {
        Some(match code {
            0 => Kind::Float,
            1 => Kind::Int,
            2 => Kind::UInt,
            3 => Kind::Bool,
            4 => Kind::Str,
            _ => return None,
        })
    }

    /// Name used in errors and the API.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Float => "float",
            Kind::Int => "integer",
            Kind::UInt => "unsigned",
            Kind::Bool => "boolean",
            Kind::Str => "string",
        }
    }
}

impl Value {
    /// The kind of this value.
    pub fn kind(&self) -> Kind {
        match self {
            Value::F64(_) => Kind::Float,
            Value::I64(_) => Kind::Int,
            Value::U64(_) => Kind::UInt,
            Value::Bool(_) => Kind::Bool,
            Value::Str(_) => Kind::Str,
        }
    }

    /// The value as a number, for aggregation; `None` for strings.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F64(v) => Some(v),
            Value::I64(v) => Some(v as f64),
            Value::U64(v) => Some(v as f64),
            Value::Bool(v) => Some(if v { 1.0 } else { 0.0 }),
            Value::Str(_) => None,
        }
    }
}

/// One line of line protocol: a series key, its fields and a timestamp in ns.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Canonical series key: escaped measurement, then `,k=v` tags sorted by key.
    pub key: String,
    /// Field key and value, in input order.
    pub fields: Vec<(String, Value)>,
    /// Unix epoch nanoseconds.
    pub ts: i64,
    /// 1-based line number in the request body (0 for collector-made lines).
    pub line_no: u32,
}

/// Lines travelling together to the writer; committed in one transaction.
#[derive(Debug, Default)]
pub struct Batch {
    /// The lines.
    pub lines: Vec<Line>,
}

impl Batch {
    /// Number of points (lines) in the batch.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// True when the batch holds no line.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Number of field values in the batch.
    pub fn values(&self) -> usize {
        self.lines.iter().map(|l| l.fields.len()).sum()
    }
}

/// A line the writer refused, with the reason (series cap, field type conflict).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejection {
    /// 1-based line number in the request body.
    pub line: u32,
    /// Why it was refused.
    pub error: String,
}

/// Builds a canonical series key from a measurement and tags (unescaped input).
/// Tags are sorted by key; used by collectors, which make their lines directly.
pub fn series_key(measurement: &str, tags: &[(&str, &str)]) -> String {
    let mut sorted: Vec<&(&str, &str)> = tags.iter().filter(|(_, v)| !v.is_empty()).collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut key = String::with_capacity(measurement.len() + 16 * tags.len());
    escape_into(&mut key, measurement, &[',', ' ']);
    for (k, v) in sorted {
        key.push(',');
        escape_into(&mut key, k, &[',', '=', ' ']);
        key.push('=');
        escape_into(&mut key, v, &[',', '=', ' ']);
    }
    key
}

/// Escapes `s` for line protocol, backslash-escaping each char in `special`.
pub fn escape_into(out: &mut String, s: &str, special: &[char]) {
    for c in s.chars() {
        if special.contains(&c) {
            out.push('\\');
        }
        out.push(c);
    }
}

/// Splits a canonical series key into its unescaped measurement and tags.
pub fn split_series_key(key: &str) -> (String, Vec<(String, String)>) {
    let mut measurement = String::new();
    let mut tags: Vec<(String, String)> = Vec::new();
    // 0 = measurement, 1 = tag key, 2 = tag value
    let mut state = 0u8;
    let mut escaped = false;
    for c in key.chars() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
            continue;
        } else if c == ',' {
            tags.push((String::new(), String::new()));
            state = 1;
            continue;
        } else if c == '=' && state == 1 {
            state = 2;
            continue;
        }
        match (state, tags.last_mut()) {
            (1, Some(t)) => t.0.push(c),
            (2, Some(t)) => t.1.push(c),
            _ => measurement.push(c),
        }
    }
    (measurement, tags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_key_sorts_and_escapes() {
        let k = series_key("cpu load", &[("z", "1"), ("a=b", "x,y"), ("empty", "")]);
        assert_eq!(k, r"cpu\ load,a\=b=x\,y,z=1");
        let (m, tags) = split_series_key(&k);
        assert_eq!(m, "cpu load");
        assert_eq!(
            tags,
            vec![("a=b".into(), "x,y".into()), ("z".into(), "1".into())]
        );
    }
}
