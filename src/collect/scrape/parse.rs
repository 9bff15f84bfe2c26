//! The Prometheus text exposition format (0.0.4) and OpenMetrics text (1.0) parser: a page
//! in, its samples out, line by line. A malformed line is skipped and counted; the rest of
//! the page is kept (a whole-page `Result`, as the crates we looked at return, would lose a
//! target's every sample to one bad line). Pure: no IO, no clock, no allocation per line
//! beyond the sample it keeps.
//!
//! Understood: `# TYPE` (kept per family), `# HELP`/`# UNIT`/other comments (ignored),
//! `# EOF` (the end of an OpenMetrics page), label values with the `\\`, `\"` and `\n`
//! escapes, `NaN`, `+Inf`, `-Inf`, a trailing timestamp (0.0.4: integer milliseconds;
//! OpenMetrics: seconds, possibly fractional) and OpenMetrics exemplars (` # {...} v`,
//! ignored). It never validates that a family's samples are complete or sorted.

use std::collections::HashMap;

/// Which text format a page is in: the timestamp unit differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`: timestamps in ms.
    Prometheus,
    /// `application/openmetrics-text`: timestamps in seconds.
    OpenMetrics,
}

impl Format {
    /// The format a `Content-Type` header names (Prometheus text when unknown).
    pub fn from_content_type(ct: &str) -> Format {
        if ct
            .to_ascii_lowercase()
            .starts_with("application/openmetrics-text")
        {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }
}

/// A metric family's declared type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `counter`
    Counter,
    /// `gauge`
    Gauge,
    /// `histogram` (and OpenMetrics `gaugehistogram`)
    Histogram,
    /// `summary`
    Summary,
    /// `untyped`, `unknown`, `info`, `stateset` or none declared.
    Untyped,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name as written (`x_bucket`, `x_sum`, `x_total`, ...).
    pub name: String,
    /// Labels in written order, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The value (NaN and infinities included).
    pub value: f64,
    /// The exposition's timestamp, ns since the epoch, when written.
    pub ts_ns: Option<i64>,
}

impl Sample {
    /// A label's value.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A parsed page.
#[derive(Debug, Default)]
pub struct Page {
    /// The samples, in page order.
    pub samples: Vec<Sample>,
    /// Declared family types by family name.
    pub types: HashMap<String, Kind>,
    /// Lines skipped as malformed.
    pub bad_lines: u64,
    /// The first malformed line's number and reason, for the status.
    pub first_error: Option<String>,
}

impl Page {
    /// The declared type of the family `sample_name` belongs to, and whether the name is
    /// that family's `_created` sample (OpenMetrics' creation time: not a measurement).
    pub fn kind_of(&self, sample_name: &str) -> (Kind, bool) {
        if let Some(k) = self.types.get(sample_name) {
            return (*k, false);
        }
        for suffix in ["_bucket", "_sum", "_count", "_total", "_created"] {
            if let Some(base) = sample_name.strip_suffix(suffix) {
                if let Some(k) = self.types.get(base) {
                    return (*k, suffix == "_created");
                }
            }
        }
        (Kind::Untyped, false)
    }
}

/// Parses a whole page.
pub fn parse(text: &str, format: Format) -> Page {
    let mut page = Page::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            match words.next() {
                Some("EOF") if format == Format::OpenMetrics => break,
                Some("TYPE") => {
                    if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                        page.types.insert(name.to_string(), kind_from(kind));
                    }
                }
                _ => {}
            }
            continue;
        }
        match parse_sample(line, format) {
            Ok(s) => page.samples.push(s),
            Err(reason) => {
                page.bad_lines += 1;
                if page.first_error.is_none() {
                    page.first_error = Some(format!("line {}: {reason}", i + 1));
                }
            }
        }
    }
    page
}

fn kind_from(word: &str) -> Kind {
    match word {
        "counter" => Kind::Counter,
        "gauge" => Kind::Gauge,
        "histogram" | "gaugehistogram" => Kind::Histogram,
        "summary" => Kind::Summary,
        _ => Kind::Untyped,
    }
}

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// One sample line: `name{labels} value [timestamp] [# exemplar]`.
pub fn parse_sample(line: &str, format: Format) -> Result<Sample, &'static str> {
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
        i += 1;
    }
    let start = i;
    if i >= b.len() || !is_name_start(b[i]) {
        return Err("expected a metric name");
    }
    while i < b.len() && is_name_char(b[i]) {
        i += 1;
    }
    let name = &line[start..i];
    let mut labels = Vec::new();
    if i < b.len() && b[i] == b'{' {
        i += 1;
        loop {
            while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
                i += 1;
            }
            if i >= b.len() {
                return Err("unterminated label set");
            }
            if b[i] == b'}' {
                i += 1;
                break;
            }
            let ls = i;
            if !is_name_start(b[i]) {
                return Err("expected a label name");
            }
            while i < b.len() && is_name_char(b[i]) {
                i += 1;
            }
            let lname = &line[ls..i];
            while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
                i += 1;
            }
            if i >= b.len() || b[i] != b'=' {
                return Err("expected '=' after a label name");
            }
            i += 1;
            while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
                i += 1;
            }
            if i >= b.len() || b[i] != b'"' {
                return Err("expected a quoted label value");
            }
            i += 1;
            let mut value = String::new();
            let mut run = i;
            loop {
                if i >= b.len() {
                    return Err("unterminated label value");
                }
                match b[i] {
                    b'"' => {
                        value.push_str(&line[run..i]);
                        i += 1;
                        break;
                    }
                    b'\\' => {
                        value.push_str(&line[run..i]);
                        match b.get(i + 1) {
                            Some(b'\\') => value.push('\\'),
                            Some(b'"') => value.push('"'),
                            Some(b'n') => value.push('\n'),
                            _ => return Err("invalid escape in a label value"),
                        }
                        i += 2;
                        run = i;
                    }
                    _ => i += 1,
                }
            }
            if labels.iter().any(|(k, _): &(String, String)| k == lname) {
                return Err("duplicate label name");
            }
            labels.push((lname.to_string(), value));
            while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
                i += 1;
            }
            match b.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {}
                _ => return Err("expected ',' or '}' after a label"),
            }
        }
    }
    // The value, then an optional timestamp, then an optional exemplar.
    let rest = &line[i..];
    if !rest.starts_with([' ', '\t']) {
        return Err("expected whitespace before the value");
    }
    let rest = match rest.find(" # ") {
        Some(at) if format == Format::OpenMetrics => &rest[..at],
        _ => rest,
    };
    let mut words = rest.split_whitespace();
    let value = parse_value(words.next().ok_or("missing value")?)?;
    let ts_ns = match words.next() {
        None => None,
        Some(t) => Some(parse_ts(t, format)?),
    };
    if words.next().is_some() {
        return Err("unexpected text after the timestamp");
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
        ts_ns,
    })
}

fn parse_value(s: &str) -> Result<f64, &'static str> {
    match s {
        "NaN" => Ok(f64::NAN),
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        _ => {
            // Rust also reads "inf"/"infinity"/"nan" spelled any way; the formats do not.
            if s.bytes()
                .any(|c| c.is_ascii_alphabetic() && c != b'e' && c != b'E')
            {
                return Err("invalid value");
            }
            s.parse::<f64>().map_err(|_| "invalid value")
        }
    }
}

fn parse_ts(s: &str, format: Format) -> Result<i64, &'static str> {
    match format {
        Format::Prometheus => s
            .parse::<i64>()
            .ok()
            .and_then(|ms| ms.checked_mul(1_000_000))
            .ok_or("invalid timestamp (integer milliseconds expected)"),
        Format::OpenMetrics => {
            let secs = parse_value(s).map_err(|_| "invalid timestamp")?;
            let ns = secs * 1e9;
            if ns.is_finite() && ns.abs() < i64::MAX as f64 {
                Ok(ns.round() as i64)
            } else {
                Err("invalid timestamp")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_escapes_specials_timestamps_and_types() {
        let text = "# HELP a_total A thing.\n# TYPE a_total counter\n\
            a_total{path=\"C:\\\\dir\",msg=\"say \\\"hi\\\"\\nbye\",} 3 1700000000123\n\
            # TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum NaN\nh_count +Inf\n\
            g -1.5e3\n";
        let p = parse(text, Format::Prometheus);
        assert_eq!(p.bad_lines, 0, "{:?}", p.first_error);
        assert_eq!(p.samples.len(), 5);
        let a = &p.samples[0];
        assert_eq!(a.label("path"), Some("C:\\dir"));
        assert_eq!(a.label("msg"), Some("say \"hi\"\nbye"));
        assert_eq!(a.ts_ns, Some(1_700_000_000_123_000_000));
        assert_eq!(p.samples[1].label("le"), Some("+Inf"));
        assert!(p.samples[2].value.is_nan());
        assert_eq!(p.samples[3].value, f64::INFINITY);
        assert_eq!(p.samples[4].value, -1500.0);
        assert_eq!(p.kind_of("h_bucket"), (Kind::Histogram, false));
        assert_eq!(p.kind_of("a_total"), (Kind::Counter, false));
        assert_eq!(p.kind_of("g"), (Kind::Untyped, false));
    }

    #[test]
    fn openmetrics_seconds_exemplars_created_and_eof() {
        let text = "# TYPE r counter\nr_total{a=\"b\"} 7 1700000000.5 # {trace_id=\"x\"} 1\n\
            r_created 1699999999\n# EOF\nafter 1\n";
        let p = parse(text, Format::OpenMetrics);
        assert_eq!(p.bad_lines, 0, "{:?}", p.first_error);
        assert_eq!(p.samples.len(), 2);
        assert_eq!(p.samples[0].ts_ns, Some(1_700_000_000_500_000_000));
        assert_eq!(p.kind_of("r_created"), (Kind::Counter, true));
    }

    #[test]
    fn malformed_lines_are_skipped_and_counted_the_rest_kept() {
        let text = "ok 1\n{x=\"y\"} 2\nbad{x=y} 3\nbad{x=\"y} 4\nnoval\nbad 1 2 3\n\
            bad x\nbad{a=\"1\",a=\"2\"} 1\nbad{a=\"\\q\"} 1\nbad inf\nok2{a=\"1\"} 2 5\n";
        let p = parse(text, Format::Prometheus);
        assert_eq!(p.samples.len(), 2);
        assert_eq!(p.bad_lines, 9);
        assert_eq!(
            p.first_error.as_deref(),
            Some("line 2: expected a metric name")
        );
        assert_eq!(p.samples[1].ts_ns, Some(5_000_000));
    }

    #[test]
    fn content_types_pick_the_timestamp_unit() {
        assert_eq!(
            Format::from_content_type("application/openmetrics-text; version=1.0.0"),
            Format::OpenMetrics
        );
        assert_eq!(
            Format::from_content_type("text/plain; version=0.0.4"),
            Format::Prometheus
        );
    }

    fn escape(v: &str) -> String {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    }

    proptest! {
        /// Any label values and any finite value written with the format's escapes read
        /// back unchanged.
        #[test]
        fn written_samples_read_back(
            name in "[a-zA-Z_:][a-zA-Z0-9_:]{0,20}",
            labels in proptest::collection::btree_map("[a-z_][a-z0-9_]{0,8}", any::<String>(), 0..5),
            value in any::<f64>().prop_filter("finite", |v| v.is_finite()),
            ts in proptest::option::of(-1_000_000_000_000i64..4_000_000_000_000),
        ) {
            let mut line = name.clone();
            if !labels.is_empty() {
                let parts: Vec<String> =
                    labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
                line.push('{');
                line.push_str(&parts.join(","));
                line.push('}');
            }
            line.push_str(&format!(" {value:?}"));
            if let Some(t) = ts {
                line.push_str(&format!(" {t}"));
            }
            // Label values may hold \r or other line breaks Rust's `lines` splits on only
            // when escaped; a raw '\n' is always escaped above.
            let s = parse_sample(&line, Format::Prometheus);
            let s = s.map_err(|e| TestCaseError::fail(format!("{e}: {line}")))?;
            prop_assert_eq!(&s.name, &name);
            let want: Vec<(String, String)> = labels.into_iter().collect();
            prop_assert_eq!(s.labels, want);
            prop_assert_eq!(s.value, value);
            prop_assert_eq!(s.ts_ns, ts.map(|t| t * 1_000_000));
        }

        /// Any text parses without panicking, and every line is either a sample or counted.
        #[test]
        fn any_text_is_handled(text in "\\PC{0,200}") {
            let p = parse(&text, Format::Prometheus);
            let _ = parse(&text, Format::OpenMetrics);
            prop_assert!(p.samples.len() as u64 + p.bad_lines <= text.lines().count() as u64);
        }
    }
}
