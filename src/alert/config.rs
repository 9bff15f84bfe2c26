//! `[alerts]` (the evaluation period, the built-in rules and their tunable thresholds) and
//! `[[alert]]` (the user's rules). Each value is checked when read, so `check-config` names
//! the key and the line of a bad one: a rule name that is not `[A-Za-z_][A-Za-z0-9_]*`, an
//! aggregate the query engine does not have, an unknown operator, `no_data` mode or
//! duration; [`validate_all`] then refuses what needs the whole list (a name used twice) and
//! finds its line in the text. Only parses and validates; it never reads the store.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::config::values::{Delay, Interval};

/// Every built-in rule's name, in the order they are evaluated (defined in `rules.rs`; named
/// here so `disable` can be checked without `config` importing the engine).
pub const BUILTIN_NAMES: &[&str] = &[
    "GpuThrottling",
    "GpuTemperatureNearSlowdown",
    "JetsonTemperatureHigh",
    "InferenceLatencyRatioHigh",
    "LlmTtftRatioHigh",
    "ProcessRestarted",
    "AgentDroppingPoints",
    "SinkBacklogStale",
    "StoreNearDiskBudget",
    "ClockNotSet",
    "GpuXidError",
    "OomKill",
    "KernelThermalTrip",
    "KernelOverCurrent",
];

/// `[alerts]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// How often every rule is evaluated.
    pub interval: Interval,
    /// Whether the built-in rules run (a user's `[[alert]]` tables never remove them).
    pub builtin: bool,
    /// Built-in rules switched off by name.
    pub disable: Vec<String>,
    /// How long a built-in's condition must hold before it fires (throttling, temperature,
    /// dropped points, sink backlog, disk budget).
    pub builtin_for: Delay,
    /// `GpuTemperatureNearSlowdown`: fires within this many °C of the GPU's slowdown
    /// threshold.
    pub gpu_temp_margin_c: f64,
    /// `JetsonTemperatureHigh`: fires when a tegrastats zone is above this, °C.
    pub jetson_temp_limit_c: f64,
    /// `InferenceLatencyRatioHigh`: fires when P99/P50 of a model is above this.
    pub latency_ratio: f64,
    /// The window of `InferenceLatencyRatioHigh`.
    pub latency_ratio_window: Interval,
    /// How long `InferenceLatencyRatioHigh` must hold.
    pub latency_ratio_for: Delay,
    /// `LlmTtftRatioHigh`: fires when P99/P50 of an LLM's time to first token is above this
    /// (over `latency_ratio_window`, for `latency_ratio_for`).
    pub ttft_ratio: f64,
    /// `ProcessRestarted`: fires while a watched process's restart is this recent.
    pub process_restart_window: Interval,
    /// `SinkBacklogStale`: fires when a sink's oldest unsent point is older than this.
    pub sink_backlog_age: Interval,
    /// `StoreNearDiskBudget`: fires above this share of `[retention] max_bytes`, percent.
    pub disk_budget_pct: f64,
    /// `ClockNotSet`: fires when the clock has not been set for this long.
    pub clock_unset_for: Delay,
    /// `GpuXidError`, `OomKill`, `KernelThermalTrip`, `KernelOverCurrent`: fire while such a
    /// kernel event is in this last window (and resolve once it has left it).
    pub kernel_event_window: Interval,
    /// The alert outbox's bound while a notifier is disabled or down: most bytes of stored
    /// events (the latest event of each alert still firing is always kept).
    pub outbox_max_bytes: u64,
    /// ... and the oldest event kept.
    pub outbox_max_age: Interval,
    /// The base of incident links in notifications: a URL template where `{device_id}` is
    /// replaced (a fleet proxy's route to the device's UI); empty: the agent's own
    /// `http://` + `[http] listen`.
    pub external_url: String,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        let s = |n| std::time::Duration::from_secs(n);
        AlertsConfig {
            interval: Interval(s(15)),
            builtin: true,
            disable: Vec::new(),
            builtin_for: Interval(s(60)),
            gpu_temp_margin_c: 5.0,
            jetson_temp_limit_c: 90.0,
            latency_ratio: 3.0,
            latency_ratio_window: Interval(s(300)),
            latency_ratio_for: Interval(s(300)),
            ttft_ratio: 4.0,
            process_restart_window: Interval(s(600)),
            sink_backlog_age: Interval(s(3600)),
            disk_budget_pct: 90.0,
            clock_unset_for: Interval(s(600)),
            kernel_event_window: Interval(s(600)),
            outbox_max_bytes: 16 << 20,
            outbox_max_age: Interval(s(7 * 86_400)),
            external_url: String::new(),
        }
    }
}

/// A rule's name: `[A-Za-z_][A-Za-z0-9_]*` (it becomes the `alertname` label).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct RuleName(pub String);

impl TryFrom<String> for RuleName {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if is_name(&s) {
            Ok(RuleName(s))
        } else {
            Err(format!(
                "invalid alert name {s:?}: write a letter or `_`, then letters, digits or `_` \
                 (e.g. \"InferenceP99High\")"
            ))
        }
    }
}

impl From<RuleName> for String {
    fn from(n: RuleName) -> String {
        n.0
    }
}

impl fmt::Display for RuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `s` is a valid rule (Prometheus metric-style) name.
pub fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// An aggregate name the query engine has (`engine::Agg::parse` accepts exactly these; a
/// test in `rules.rs` holds the two together), kept as written (`p99`, `mean`, ...). Checked
/// here without importing the engine, which imports `config`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct AggName {
    /// As written.
    pub name: String,
}

impl TryFrom<String> for AggName {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let known = matches!(
            s.as_str(),
            "mean" | "avg" | "min" | "max" | "sum" | "count" | "rate" | "last"
        ) || crate::store::bucket::parse_percentile(&s).is_some();
        if known {
            Ok(AggName { name: s })
        } else {
            Err(format!(
                "invalid agg {s:?}: expected mean, min, max, sum, count, rate, last or a percentile like p50, p99, p999"
            ))
        }
    }
}

impl From<AggName> for String {
    fn from(a: AggName) -> String {
        a.name
    }
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Op {
    /// `>`
    #[serde(rename = ">")]
    Gt,
    /// `>=`
    #[serde(rename = ">=")]
    Ge,
    /// `<`
    #[serde(rename = "<")]
    Lt,
    /// `<=`
    #[serde(rename = "<=")]
    Le,
    /// `==`
    #[serde(rename = "==")]
    Eq,
    /// `!=`
    #[serde(rename = "!=")]
    Ne,
}

impl Op {
    /// Whether `value op threshold` holds.
    pub fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Op::Gt => value > threshold,
            Op::Ge => value >= threshold,
            Op::Lt => value < threshold,
            Op::Le => value <= threshold,
            Op::Eq => value == threshold,
            Op::Ne => value != threshold,
        }
    }

    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Eq => "==",
            Op::Ne => "!=",
        }
    }
}

/// What an empty window means for an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NoData {
    /// The condition is false (a firing instance resolves).
    #[default]
    Ok,
    /// The instance keeps its state (and its timers) until data returns.
    Keep,
    /// The condition is true (a silent source is itself the alert).
    Firing,
}

/// One `[[alert]]` table.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AlertRuleConfig {
    /// Unique; the `alertname` label. A built-in's name replaces that built-in.
    pub name: RuleName,
    /// The measurement watched.
    pub measurement: String,
    /// Its numeric field.
    pub field: String,
    /// Tags a series must have.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// One instance per combination of these tags' values (empty: one instance).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_by: Vec<String>,
    /// The aggregate over the window.
    pub agg: AggName,
    /// When set, the value is `agg / ratio_of` over the same data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_of: Option<AggName>,
    /// The window the aggregate covers, ending at the evaluation.
    pub window: Interval,
    /// How the value is compared with `threshold`.
    pub op: Op,
    /// The threshold.
    pub threshold: f64,
    /// How long the condition must hold before the instance fires (`"0s"`: at once).
    #[serde(rename = "for", default = "zero")]
    pub for_: Delay,
    /// How long a firing instance keeps firing after its condition cleared.
    #[serde(default = "zero")]
    pub keep_firing_for: Delay,
    /// What an empty window means.
    #[serde(default)]
    pub no_data: NoData,
    /// The `severity` label.
    #[serde(default = "warning")]
    pub severity: String,
    /// The `summary` annotation: `{value}`, `{threshold}` and `{label}` are replaced.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub summary: String,
    /// Extra labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

fn zero() -> Delay {
    Interval(std::time::Duration::ZERO)
}

fn warning() -> String {
    "warning".into()
}

/// `[alerts] external_url`: empty, or an absolute `http(s)://` URL (a link a receiver can
/// open).
pub fn check_external_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        _ if url.is_empty() => Ok(()),
        Some(r) if !r.is_empty() && !r.starts_with('/') && !url.contains(char::is_whitespace) => {
            Ok(())
        }
        _ => Err(format!(
            "[alerts] key `external_url`: {url:?} is not an absolute http:// or https:// URL \
             (e.g. \"https://fleet.example/devices/{{device_id}}/ui\"; leave it empty for the \
             agent's own address)"
        )),
    }
}

/// Checks what needs the whole config: every rule's own constraints and that no name is
/// used twice. `text` is the config file the rules came from, to name the line.
pub fn validate_all(
    alerts: &AlertsConfig,
    rules: &[AlertRuleConfig],
    text: &str,
) -> Result<(), String> {
    check_external_url(&alerts.external_url)?;
    let mut seen = std::collections::HashSet::new();
    for (i, r) in rules.iter().enumerate() {
        let which = format!("[[alert]] {:?}", r.name.0);
        let at = |key: &str| {
            name_line(text, &r.name.0, key, 1).map_or(String::new(), |l| format!(" (line {l})"))
        };
        if !seen.insert(r.name.0.as_str()) {
            let line = name_line(text, &r.name.0, "name", 2)
                .map_or(String::new(), |l| format!(" (line {l})"));
            return Err(format!(
                "{which}{line}: key `name`: the name is used twice; each [[alert]] needs its own"
            ));
        }
        if r.measurement.trim().is_empty() {
            return Err(format!(
                "{which}{}: key `measurement` must not be empty",
                at("measurement")
            ));
        }
        if r.field.trim().is_empty() {
            return Err(format!(
                "{which}{}: key `field` must not be empty",
                at("field")
            ));
        }
        if r.group_by.iter().any(|k| k.trim().is_empty()) {
            return Err(format!(
                "{which}{}: key `group_by` holds an empty tag name",
                at("group_by")
            ));
        }
        if !r.threshold.is_finite() {
            return Err(format!(
                "{which}{}: key `threshold` must be a finite number",
                at("threshold")
            ));
        }
        if r.severity.trim().is_empty() {
            return Err(format!(
                "{which}{}: key `severity` must not be empty",
                at("severity")
            ));
        }
        let _ = i;
    }
    for name in &alerts.disable {
        if !BUILTIN_NAMES.contains(&name.as_str()) {
            return Err(format!(
                "[alerts]: key `disable`: {name:?} is not a built-in rule (they are: {})",
                BUILTIN_NAMES.join(", ")
            ));
        }
    }
    for (key, v) in [
        ("gpu_temp_margin_c", alerts.gpu_temp_margin_c),
        ("jetson_temp_limit_c", alerts.jetson_temp_limit_c),
        ("latency_ratio", alerts.latency_ratio),
        ("ttft_ratio", alerts.ttft_ratio),
        ("disk_budget_pct", alerts.disk_budget_pct),
    ] {
        if !v.is_finite() {
            return Err(format!("[alerts]: key `{key}` must be a finite number"));
        }
    }
    Ok(())
}

/// The 1-based line of `key` in the `nth` `[[alert]]` table named `name` in `text` (the
/// `name` line itself when the key is not written there).
fn name_line(text: &str, name: &str, key: &str, nth: usize) -> Option<usize> {
    // Split the text into [[alert]] tables: (first line, lines).
    let mut tables: Vec<(usize, Vec<(usize, &str)>)> = Vec::new();
    let mut inside = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.starts_with('[') {
            inside = t.replace(' ', "") == "[[alert]]";
            if inside {
                tables.push((i + 1, Vec::new()));
            }
            continue;
        }
        if inside {
            if let Some(last) = tables.last_mut() {
                last.1.push((i + 1, t));
            }
        }
    }
    let key_of = |l: &str| l.split('=').next().map(|k| k.trim().to_string());
    let named = tables.iter().filter(|(_, lines)| {
        lines.iter().any(|(_, l)| {
            key_of(l).as_deref() == Some("name")
                && l.split_once('=')
                    .map(|(_, v)| v.trim().trim_matches(['"', '\'']) == name)
                    .unwrap_or(false)
        })
    });
    let (start, lines) = named.clone().nth(nth - 1)?;
    lines
        .iter()
        .find(|(_, l)| key_of(l).as_deref() == Some(key))
        .or_else(|| {
            lines
                .iter()
                .find(|(_, l)| key_of(l).as_deref() == Some("name"))
        })
        .map(|(n, _)| *n)
        .or(Some(*start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const RULE: &str = r#"
[alerts]
interval = "1s"

[[alert]]
name = "InferenceP99High"
measurement = "inference"
field = "wall_ms"
tags = { model = "yolov8n" }
group_by = ["model"]
agg = "p99"
ratio_of = "p50"
window = "5m"
op = ">"
threshold = 40.0
for = "1m"
keep_firing_for = "0s"
no_data = "ok"
severity = "warning"
summary = "p99 latency of {model} is {value} ms (threshold {threshold})"
labels = { team = "vision" }
"#;

    fn load(text: &str) -> Result<Config, String> {
        Config::from_toml_str(text, "f").map_err(|e| e.to_string())
    }

    #[test]
    fn external_url_is_an_absolute_http_url_or_empty() {
        let ok =
            load("[alerts]\nexternal_url = \"https://fleet.example/d/{device_id}/ui\"\n").unwrap();
        assert_eq!(
            ok.alerts.external_url,
            "https://fleet.example/d/{device_id}/ui"
        );
        assert_eq!(load("").unwrap().alerts.external_url, "");
        for bad in [
            "fleet.example/ui",
            "ftp://x",
            "https://",
            "http:///x",
            "http://a b",
        ] {
            let e = load(&format!("[alerts]\nexternal_url = {bad:?}\n")).unwrap_err();
            assert!(
                e.contains("external_url") && e.contains("absolute"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_issue_example_loads_and_prints_back() {
        let c = load(RULE).unwrap();
        assert_eq!(c.alerts.interval.0.as_secs(), 1);
        let r = &c.alert[0];
        assert_eq!(r.name.0, "InferenceP99High");
        assert_eq!(r.agg.name, "p99");
        assert_eq!(r.ratio_of.as_ref().map(|a| a.name.as_str()), Some("p50"));
        assert_eq!(r.op, Op::Gt);
        assert_eq!(r.for_.0.as_secs(), 60);
        assert_eq!(r.no_data, NoData::Ok);
        assert_eq!(r.labels["team"], "vision");
        // The env layer round-trips the config through TOML.
        let again = c
            .clone()
            .with_env([("EDGEWATCH_ALERTS__INTERVAL".to_string(), "2s".to_string())])
            .unwrap();
        assert_eq!(again.alert, c.alert);
        assert_eq!(again.alerts.interval.0.as_secs(), 2);
    }

    /// Each malformed rule is refused naming its key and its line.
    #[test]
    fn malformed_rules_name_the_key_and_the_line() {
        let cases = [
            ("agg = \"p99\"", "agg = \"median\"", "agg", "invalid agg"),
            ("op = \">\"", "op = \"=>\"", "op", "unknown variant"),
            (
                "window = \"5m\"",
                "window = \"5 parsecs\"",
                "window",
                "invalid duration",
            ),
            ("for = \"1m\"", "for = \"soon\"", "for", "invalid duration"),
            (
                "no_data = \"ok\"",
                "no_data = \"maybe\"",
                "no_data",
                "unknown variant",
            ),
            (
                "severity = \"warning\"",
                "sevrity = \"warning\"",
                "sevrity",
                "unknown field",
            ),
            (
                "name = \"InferenceP99High\"",
                "name = \"9lives\"",
                "name",
                "invalid alert name",
            ),
        ];
        for (from, to, key, what) in cases {
            let text = RULE.replace(from, to);
            let line = text.lines().position(|l| l.starts_with(to)).unwrap() + 1;
            let e = load(&text).unwrap_err();
            assert!(e.contains(&format!("line {line}")), "{to}: {e}");
            assert!(e.contains(key), "{to}: {e}");
            assert!(e.contains(what), "{to}: {e}");
        }
    }

    #[test]
    fn a_name_used_twice_is_refused_at_its_second_line() {
        let text = format!("{RULE}\n[[alert]]\nname = \"InferenceP99High\"\nmeasurement = \"m\"\nfield = \"f\"\nagg = \"max\"\nwindow = \"1m\"\nop = \"<\"\nthreshold = 1\n");
        let line = text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.starts_with("name = \"InferenceP99High\""))
            .nth(1)
            .unwrap()
            .0
            + 1;
        let e = load(&text).unwrap_err();
        assert!(e.contains(&format!("line {line}")), "{e}");
        assert!(e.contains("used twice") && e.contains("`name`"), "{e}");
    }

    #[test]
    fn unknown_builtins_cannot_be_disabled() {
        let e = load("[alerts]\ndisable = [\"NoSuchRule\"]\n").unwrap_err();
        assert!(e.contains("disable") && e.contains("NoSuchRule"), "{e}");
        let c = load("[alerts]\ndisable = [\"ClockNotSet\"]\n").unwrap();
        assert_eq!(c.alerts.disable, vec!["ClockNotSet".to_string()]);
    }

    #[test]
    fn operators_compare() {
        assert!(Op::Gt.holds(2.0, 1.0) && !Op::Gt.holds(1.0, 1.0));
        assert!(Op::Ge.holds(1.0, 1.0) && Op::Le.holds(1.0, 1.0));
        assert!(Op::Lt.holds(0.0, 1.0) && Op::Ne.holds(0.0, 1.0) && Op::Eq.holds(1.0, 1.0));
        assert!(is_name("_a1") && !is_name("a-b") && !is_name(""));
    }
}
