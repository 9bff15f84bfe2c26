//! Payload encoders for forwarded points: InfluxDB line protocol (nanosecond timestamps, the
//! original ones, so a replayed batch overwrites itself), the JSON form, and gzip. Pure
//! functions of their input; no IO.

use std::io::Write as _;
use std::sync::Arc;

use crate::model::{escape_into, split_series_key, Value};

/// A tag set as forwarded: the stored series plus the device identity tags.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Measurement name (unescaped).
    pub measurement: String,
    /// Tags (unescaped), sorted by key, identity tags included.
    pub tags: Vec<(String, String)>,
    /// `measurement,k=v,...` escaped for line protocol.
    pub prefix: String,
}

/// One point to forward.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Its tag set.
    pub series: Arc<Series>,
    /// Original timestamp, ns.
    pub ts: i64,
    /// Field name and value.
    pub fields: Vec<(Arc<str>, Value)>,
}

/// Builds the forwarded tag set of stored series `key`, adding `identity` tags (device_id and
/// the static tags) that the point does not carry itself (its own value wins: line protocol
/// forbids duplicate tag keys).
pub fn series(key: &str, identity: &[(String, String)]) -> Series {
    let (measurement, mut tags) = split_series_key(key);
    for (k, v) in identity {
        if !v.is_empty() && !tags.iter().any(|(tk, _)| tk == k) {
            tags.push((k.clone(), v.clone()));
        }
    }
    tags.sort();
    let mut prefix = String::with_capacity(key.len() + 32);
    escape_into(&mut prefix, &measurement, &[',', ' ']);
    for (k, v) in &tags {
        prefix.push(',');
        escape_into(&mut prefix, k, &[',', '=', ' ']);
        prefix.push('=');
        escape_into(&mut prefix, v, &[',', '=', ' ']);
    }
    Series {
        measurement,
        tags,
        prefix,
    }
}

/// Appends `p` as one line of line protocol (with its newline). Non-finite floats are
/// skipped (line protocol cannot carry them); a point left with no field writes nothing.
/// `uint_as_int` writes unsigned values as `i` (InfluxDB 1.x has no `u` by default).
pub fn line(out: &mut Vec<u8>, p: &Point, uint_as_int: bool) {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(p.series.prefix.len() + 24 * p.fields.len() + 24);
    s.push_str(&p.series.prefix);
    let mut first = true;
    for (k, v) in &p.fields {
        if matches!(v, Value::F64(f) if !f.is_finite()) {
            continue;
        }
        s.push(if first { ' ' } else { ',' });
        first = false;
        escape_into(&mut s, k, &[',', '=', ' ']);
        s.push('=');
        let _ = match v {
            Value::F64(f) => write!(s, "{f}"),
            Value::I64(i) => write!(s, "{i}i"),
            Value::U64(u) if uint_as_int && *u <= i64::MAX as u64 => write!(s, "{u}i"),
            Value::U64(u) if uint_as_int => write!(s, "{}", *u as f64),
            Value::U64(u) => write!(s, "{u}u"),
            Value::Bool(b) => write!(s, "{b}"),
            Value::Str(t) => {
                s.push('"');
                escape_into(&mut s, t, &['"', '\\']);
                s.push('"');
                Ok(())
            }
        };
    }
    if first {
        return;
    }
    let _ = write!(s, " {}", p.ts);
    s.push('\n');
    out.extend_from_slice(s.as_bytes());
}

/// A point's tags and fields as JSON objects (the one JSON shape of a point's members, used
/// by the JSON batch and the retained inventory message).
pub fn json_maps(
    p: &Point,
) -> (
    serde_json::Map<String, serde_json::Value>,
    serde_json::Map<String, serde_json::Value>,
) {
    let tags = p
        .series
        .tags
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect();
    let fields = p
        .fields
        .iter()
        .map(|(k, v)| {
            let j = match v {
                Value::F64(f) => serde_json::json!(f),
                Value::I64(i) => (*i).into(),
                Value::U64(u) => (*u).into(),
                Value::Bool(b) => (*b).into(),
                Value::Str(s) => s.clone().into(),
            };
            (k.to_string(), j)
        })
        .collect();
    (tags, fields)
}

/// The JSON form of (part `part.0` of `part.1` of) a batch: `{"device_id", "seq", "part",
/// "parts", "points": [{"measurement", "tags", "fields", "time"}]}`; `time` is ns since the
/// epoch. A batch's parts share its `seq`: consumers drop duplicates by `(seq, part)`.
pub fn json(device_id: &str, seq: i64, part: (usize, usize), points: &[&Point]) -> Vec<u8> {
    let pts: Vec<serde_json::Value> = points
        .iter()
        .map(|p| {
            let (tags, fields) = json_maps(p);
            serde_json::json!({
                "measurement": p.series.measurement,
                "tags": tags,
                "fields": fields,
                "time": p.ts,
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "device_id": device_id,
        "seq": seq,
        "part": part.0,
        "parts": part.1,
        "points": pts,
    }))
    .unwrap_or_default()
}

/// The first line of a line-protocol MQTT message: a comment (consumers that parse line
/// protocol skip it) carrying the batch sequence number and chunk range.
pub fn seq_comment(
    seq: i64,
    first_chunk: i64,
    last_chunk: i64,
    part: usize,
    parts: usize,
) -> String {
    format!("# edgewatch seq={seq} chunks={first_chunk}-{last_chunk} part={part}/{parts}\n")
}

/// gzip at a fast level (the device's CPU matters more than a few bytes).
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 4 + 64),
        flate2::Compression::fast(),
    );
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

/// Expands `{device_id}` and `{measurement}` in a topic template.
pub fn topic(template: &str, device_id: &str, measurement: &str) -> String {
    template
        .replace("{device_id}", device_id)
        .replace("{measurement}", measurement)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Vec<(String, String)> {
        vec![
            ("device_id".into(), "jet 1".into()),
            ("site".into(), "a,b".into()),
        ]
    }

    #[test]
    fn identity_tags_are_added_sorted_and_escaped_once() {
        let s = series("infer\\ ence,model=yolo,site=own", &id());
        assert_eq!(s.measurement, "infer ence");
        assert_eq!(
            s.prefix,
            "infer\\ ence,device_id=jet\\ 1,model=yolo,site=own"
        );
    }

    #[test]
    fn line_protocol_round_trips_through_the_parser() {
        let p = Point {
            series: Arc::new(series("m,t=x", &id())),
            ts: 1_764_000_000_123_456_789,
            fields: vec![
                ("a b".into(), Value::F64(1.0)),
                ("c".into(), Value::I64(-3)),
                ("d".into(), Value::U64(7)),
                ("e".into(), Value::Bool(true)),
                ("f".into(), Value::Str("q\"\\z".into())),
                ("nan".into(), Value::F64(f64::NAN)),
            ],
        };
        let mut out = Vec::new();
        line(&mut out, &p, false);
        let text = String::from_utf8(out.clone()).unwrap();
        let parsed = crate::ingest::lineproto::parse_body(
            &text,
            crate::ingest::lineproto::Precision::Nanos,
            0,
        );
        assert!(parsed.errors.is_empty(), "{text} {:?}", parsed.errors);
        let l = &parsed.batch.lines[0];
        assert_eq!(l.ts, p.ts);
        assert_eq!(l.key, "m,device_id=jet\\ 1,site=a\\,b,t=x");
        assert_eq!(l.fields.len(), 5);
        let mut v1 = Vec::new();
        line(&mut v1, &p, true);
        assert!(String::from_utf8(v1).unwrap().contains("d=7i"));
        let none = Point {
            fields: vec![("x".into(), Value::F64(f64::INFINITY))],
            ..p
        };
        let mut out = Vec::new();
        line(&mut out, &none, false);
        assert!(out.is_empty());
    }

    #[test]
    fn json_and_topics() {
        let p = Point {
            series: Arc::new(series("m,t=x", &id())),
            ts: 5,
            fields: vec![("v".into(), Value::I64(2))],
        };
        let j: serde_json::Value = serde_json::from_slice(&json("d", 9, (2, 3), &[&p])).unwrap();
        assert_eq!(j["seq"], 9);
        assert_eq!(
            (j["part"].as_u64(), j["parts"].as_u64()),
            (Some(2), Some(3))
        );
        assert_eq!(j["points"][0]["tags"]["device_id"], "jet 1");
        assert_eq!(j["points"][0]["fields"]["v"], 2);
        assert_eq!(
            topic("e/{device_id}/{measurement}", "d1", "gpu"),
            "e/d1/gpu"
        );
        let g = gzip(b"hello");
        let mut d = flate2::read::GzDecoder::new(&g[..]);
        let mut s = String::new();
        std::io::Read::read_to_string(&mut d, &mut s).unwrap();
        assert_eq!(s, "hello");
    }
}
