//! Turns a body of InfluxDB line protocol into a [`Batch`] plus per-line errors.
//!
//! Parsing is done by the `influxdb-line-protocol` crate (the parser of InfluxDB IOx);
//! this module adds what the agent needs around it: physical line numbers for partial-write
//! errors, timestamp precision, the server's clock for lines without a timestamp, and the
//! canonical series key. It is pure: no IO, time is an argument.

use influxdb_line_protocol::{parse_lines, split_lines, FieldValue};

use crate::model::{Batch, Line, Rejection, Value};

/// Timestamp precision of a write, as the `precision` query parameter names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// Nanoseconds (the default).
    Nanos,
    /// Microseconds.
    Micros,
    /// Milliseconds.
    Millis,
    /// Seconds.
    Seconds,
    /// Minutes (InfluxDB 1.x only).
    Minutes,
    /// Hours (InfluxDB 1.x only).
    Hours,
}

impl Precision {
    /// Parses InfluxDB's spellings: `ns`/`n`, `us`/`u`/`µ`, `ms`, `s`, `m`, `h`.
    pub fn parse(s: &str) -> Option<Precision> {
        Some(match s {
            "" | "n" | "ns" => Precision::Nanos,
            "u" | "us" | "µ" | "µs" => Precision::Micros,
            "ms" => Precision::Millis,
            "s" => Precision::Seconds,
            "m" => Precision::Minutes,
            "h" => Precision::Hours,
            _ => return None,
        })
    }

    /// The canonical short name (`ns`, `us`, `ms`, `s`, `m`, `h`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::Nanos => "ns",
            Precision::Micros => "us",
            Precision::Millis => "ms",
            Precision::Seconds => "s",
            Precision::Minutes => "m",
            Precision::Hours => "h",
        }
    }

    fn nanos(self) -> i64 {
        match self {
            Precision::Nanos => 1,
            Precision::Micros => 1_000,
            Precision::Millis => 1_000_000,
            Precision::Seconds => 1_000_000_000,
            Precision::Minutes => 60_000_000_000,
            Precision::Hours => 3_600_000_000_000,
        }
    }
}

/// The outcome of parsing one body.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The lines that parsed.
    pub batch: Batch,
    /// The lines that did not, with their 1-based line numbers.
    pub errors: Vec<Rejection>,
}

/// Parses `body`; lines without a timestamp get `now_ns`.
pub fn parse_body(body: &str, precision: Precision, now_ns: i64) -> Parsed {
    let mut out = Parsed::default();
    let mult = precision.nanos();
    let mut line_no: u32 = 1;
    for raw in split_lines(body) {
        let this_line = line_no;
        line_no = line_no.saturating_add(1 + raw.matches('\n').count() as u32);
        let text = raw.trim_matches(|c: char| c.is_ascii_whitespace());
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        match parse_one(text, mult, now_ns) {
            Ok(mut line) => {
                line.line_no = this_line;
                out.batch.lines.push(line);
            }
            Err(error) => out.errors.push(Rejection {
                line: this_line,
                error,
            }),
        }
    }
    out
}

fn parse_one(text: &str, mult: i64, now_ns: i64) -> Result<Line, String> {
    let parsed = match parse_lines(text).next() {
        Some(Ok(p)) => p,
        Some(Err(e)) => return Err(format!("unable to parse '{}': {e}", excerpt(text))),
        None => return Err(format!("unable to parse '{}'", excerpt(text))),
    };
    if text.contains('\u{FFFD}') {
        return Err(format!("invalid UTF-8 in '{}'", excerpt(text)));
    }
    let ts = match parsed.timestamp {
        Some(t) => t
            .checked_mul(mult)
            .ok_or_else(|| format!("timestamp {t} out of range in '{}'", excerpt(text)))?,
        None => now_ns,
    };
    let mut fields = Vec::with_capacity(parsed.field_set.len());
    for (k, v) in parsed.field_set.iter() {
        let key = k.as_str();
        if fields.iter().any(|(f, _): &(String, Value)| f == key) {
            return Err(format!("duplicate field '{key}' in '{}'", excerpt(text)));
        }
        let value = match v {
            FieldValue::F64(f) if !f.is_finite() => {
                return Err(format!("non-finite float in field '{key}'"))
            }
            FieldValue::F64(f) => Value::F64(*f),
            FieldValue::I64(i) => Value::I64(*i),
            FieldValue::U64(u) => Value::U64(*u),
            FieldValue::Boolean(b) => Value::Bool(*b),
            FieldValue::String(s) => Value::Str(s.as_str().to_string()),
        };
        fields.push((key.to_string(), value));
    }
    let key = parsed
        .series
        .generate_base()
        .map_err(|e| format!("invalid tag set in '{}': {e}", excerpt(text)))?
        .into_owned();
    Ok(Line {
        key,
        fields,
        ts,
        line_no: 0,
    })
}

/// The start of a line, for error messages (InfluxDB quotes the whole line; we cap it).
fn excerpt(text: &str) -> &str {
    match text.char_indices().nth(120) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_lines_get_keys_fields_and_scaled_timestamps() {
        let body = "inference,model=yolo,app=cam wall_ms=12.5,batch_size=4i,ok=true,note=\"a b\" 1700000000\n\
                    # comment\n\ncpu value=1u\n";
        let p = parse_body(body, Precision::Seconds, 42);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.batch.lines.len(), 2);
        let l = &p.batch.lines[0];
        assert_eq!(l.key, "inference,app=cam,model=yolo");
        assert_eq!(l.ts, 1_700_000_000_000_000_000);
        assert_eq!(l.line_no, 1);
        assert_eq!(
            l.fields,
            vec![
                ("wall_ms".into(), Value::F64(12.5)),
                ("batch_size".into(), Value::I64(4)),
                ("ok".into(), Value::Bool(true)),
                ("note".into(), Value::Str("a b".into())),
            ]
        );
        assert_eq!(p.batch.lines[1].line_no, 4);
        assert_eq!(p.batch.lines[1].ts, 42);
        assert_eq!(p.batch.values(), 5);
        assert_eq!(p.batch.len(), 2);
    }

    #[test]
    fn bad_lines_are_reported_by_line_number_and_good_ones_kept() {
        let body = "m f=1 1\nm f= 2\nm,t=1,t=2 f=1\nm f=1,f=2\nno_fields\nm f=3 99999999999999999999\nm f=4 4";
        let p = parse_body(body, Precision::Nanos, 0);
        let bad: Vec<u32> = p.errors.iter().map(|e| e.line).collect();
        assert_eq!(bad, vec![2, 3, 4, 5, 6]);
        assert_eq!(p.batch.lines.len(), 2);
        assert_eq!(p.batch.lines[1].line_no, 7);
    }

    #[test]
    fn precision_overflow_is_an_error_not_a_wrap() {
        let p = parse_body("m f=1 9223372036854775", Precision::Hours, 0);
        assert_eq!(p.errors.len(), 1);
        assert!(p.errors[0].error.contains("out of range"));
    }
}
