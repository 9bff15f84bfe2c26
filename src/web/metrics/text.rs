//! The text exposition format (0.0.4) by hand: names and label names from any text, base
//! units, escaping, and the [`FamilyWriter`] that writes one gauge family sample by sample.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;

use crate::model::split_series_key;

/// One family being written: `# HELP`/`# TYPE` go out with its first sample, so a family
/// without a fresh sample is left out whole.
pub struct FamilyWriter<'a> {
    name: &'a str,
    help: String,
    labels: Vec<&'a str>,
    factor: f64,
    started: bool,
    /// Tag key -> label name, for this family.
    names: HashMap<String, String>,
    /// Per label, the index of its tag in the sample being written.
    values: Vec<Option<usize>>,
}

impl<'a> FamilyWriter<'a> {
    /// A gauge family `name` with `labels` (sorted, unique) whose values are multiplied by
    /// `factor`.
    pub fn new(name: &'a str, help: String, labels: Vec<&'a str>, factor: f64) -> Self {
        let n = labels.len();
        FamilyWriter {
            name,
            help,
            labels,
            factor,
            started: false,
            names: HashMap::new(),
            values: vec![None; n],
        }
    }

    /// Writes one sample with the tags of its series (raw tag keys).
    pub fn sample<W: Write + ?Sized, K: AsRef<str>, V: AsRef<str>>(
        &mut self,
        out: &mut W,
        tags: &[(K, V)],
        value: f64,
    ) -> std::io::Result<()> {
        let v = value * self.factor;
        if !v.is_finite() {
            return Ok(());
        }
        if !self.started {
            self.started = true;
            out.write_all(b"# HELP ")?;
            out.write_all(self.name.as_bytes())?;
            out.write_all(b" ")?;
            escape(out, &self.help, false)?;
            out.write_all(b"\n# TYPE ")?;
            out.write_all(self.name.as_bytes())?;
            out.write_all(b" gauge\n")?;
        }
        for slot in &mut self.values {
            *slot = None;
        }
        for (j, (k, _)) in tags.iter().enumerate() {
            let k = k.as_ref();
            let l = match self.names.get(k) {
                Some(l) => l,
                None => self
                    .names
                    .entry(k.to_string())
                    .or_insert_with(|| label_name(k)),
            };
            if let Ok(i) = self.labels.binary_search(&l.as_str()) {
                self.values[i] = Some(j);
            }
        }
        out.write_all(self.name.as_bytes())?;
        if !self.labels.is_empty() {
            out.write_all(b"{")?;
            for (i, (l, val)) in self.labels.iter().zip(&self.values).enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                out.write_all(l.as_bytes())?;
                out.write_all(b"=\"")?;
                escape(out, val.map_or("", |j| tags[j].1.as_ref()), true)?;
                out.write_all(b"\"")?;
            }
            out.write_all(b"}")?;
        }
        // The number as the `prometheus` crate writes it (Rust's shortest round-trip form).
        writeln!(out, " {v}")
    }
}

/// Text-format escaping: `\` and newline, and `"` in label values.
pub(super) fn escape<W: Write + ?Sized>(out: &mut W, s: &str, quote: bool) -> std::io::Result<()> {
    let mut rest = s;
    while let Some(i) = rest.find(|c| c == '\\' || c == '\n' || (quote && c == '"')) {
        out.write_all(&rest.as_bytes()[..i])?;
        out.write_all(match rest.as_bytes()[i] {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            _ => b"\\\"",
        })?;
        rest = &rest[i + 1..];
    }
    out.write_all(rest.as_bytes())
}

/// The tags of a canonical series key (`m,k=v,...`), borrowed from it when it holds no
/// escape (the common case), else unescaped by [`split_series_key`].
pub(super) fn key_tags(key: &str) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    if key.contains('\\') {
        return split_series_key(key)
            .1
            .into_iter()
            .map(|(k, v)| (Cow::Owned(k), Cow::Owned(v)))
            .collect();
    }
    key.split(',')
        .skip(1)
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (Cow::Borrowed(k), Cow::Borrowed(v))
        })
        .collect()
}

pub(super) fn family_help(field: &str, measurement: &str, factor: f64) -> String {
    format!(
        "Newest {field} of measurement {measurement} (edgewatch store){}.",
        if factor == 1.0 { "" } else { ", in base units" }
    )
}

/// A valid snake_case name from any text: `[a-z0-9_]` (`camelCase` becomes `camel_case`),
/// not starting with a digit.
pub fn metric_name(raw: &str) -> String {
    let mut s = String::with_capacity(raw.len() + 4);
    let mut prev_lower = false;
    for c in raw.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            s.push('_');
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        s.push(if c.is_ascii_alphanumeric() {
            c.to_ascii_lowercase()
        } else {
            '_'
        });
    }
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// Prometheus wants base units and no abbreviated unit in a name (`promtool check metrics`
/// refuses `_ms`, `_mb`, `_s`, ...): a trailing time or size unit becomes `seconds` or `bytes`
/// with the factor to apply (sizes in MB are MiB, as /proc, NVML and tegrastats report them);
/// one inside the name is spelled out. Other units (`pct`, `mhz`, `mw`, `c`) stay as they are.
pub fn base_unit(name: &str) -> (String, f64) {
    const KI: f64 = 1024.0;
    let mut parts: Vec<&str> = name.split('_').collect();
    let mut factor = 1.0;
    if parts.len() > 1 {
        let last = parts.len() - 1;
        let (unit, f) = match parts[last] {
            "ns" => ("seconds", 1e-9),
            "us" => ("seconds", 1e-6),
            "ms" => ("seconds", 1e-3),
            "s" | "sec" => ("seconds", 1.0),
            "m" => ("minutes", 1.0),
            "h" => ("seconds", 3600.0),
            "d" => ("seconds", 86400.0),
            "b" => ("bytes", 1.0),
            "kb" => ("bytes", KI),
            "mb" => ("bytes", KI * KI),
            "gb" => ("bytes", KI * KI * KI),
            "tb" => ("bytes", KI * KI * KI * KI),
            "pb" => ("bytes", KI * KI * KI * KI * KI),
            _ => ("", 1.0),
        };
        if !unit.is_empty() {
            parts[last] = unit;
            factor = f;
        }
    }
    let name = parts
        .iter()
        .enumerate()
        .map(|(i, p)| match *p {
            _ if i == 0 => *p,
            "ns" => "nanoseconds",
            "us" => "microseconds",
            "ms" => "milliseconds",
            "s" | "sec" => "seconds",
            "m" => "minutes",
            "h" => "hours",
            "d" => "days",
            "b" => "bytes",
            "kb" => "kibibytes",
            "mb" => "mebibytes",
            "gb" => "gibibytes",
            "tb" => "tebibytes",
            "pb" => "pebibytes",
            other => other,
        })
        .collect::<Vec<_>>()
        .join("_");
    (name, factor)
}

/// A valid label name from a tag key (`__` is reserved by Prometheus: such keys get `tag`).
pub fn label_name(raw: &str) -> String {
    let s = metric_name(raw);
    if s.starts_with("__") {
        format!("tag{s}")
    } else {
        s
    }
}
