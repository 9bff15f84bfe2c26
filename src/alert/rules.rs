//! The rules the evaluator runs: the user's `[[alert]]` tables and the built-in rules, both
//! compiled into one [`Rule`] shape (what is watched, the condition and its timing, the
//! labels). Built-ins are defined here, from `[alerts]`'s tunable thresholds; a user rule
//! with a built-in's name replaces it, and `[alerts] disable` switches one off. Pure: it
//! reads no store and no clock.

use std::collections::BTreeMap;

use super::config::{AggName, AlertRuleConfig, AlertsConfig, NoData, Op};
use crate::engine::Agg;

const NS: i64 = 1_000_000_000;

pub use super::config::BUILTIN_NAMES;

/// An aggregate of one or more fields of a measurement over a window, through the query
/// engine.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesSpec {
    /// Measurement.
    pub measurement: String,
    /// Fields; with several, an instance's value is the largest of theirs.
    pub fields: Vec<String>,
    /// Tags a series must have.
    pub tags: Vec<(String, String)>,
    /// Tag keys of an instance (empty: one instance for all matching series).
    pub group_by: Vec<String>,
    /// Tag values whose series are left out (`zone = "pmic"`).
    pub exclude: Vec<(String, String)>,
    /// The aggregate over the window.
    pub agg: Agg,
    /// The value is `agg / ratio_of` when set.
    pub ratio_of: Option<Agg>,
    /// The window, ns.
    pub window_ns: i64,
}

/// What a rule watches.
#[derive(Debug, Clone, PartialEq)]
pub enum Watch {
    /// An aggregate over stored series.
    Series(SeriesSpec),
    /// Per GPU: its HW slowdown threshold minus its temperature (last of each over the
    /// window), °C.
    GpuTempMargin {
        /// The window, ns.
        window_ns: i64,
    },
    /// Points the agent dropped or rejected over the window (its own counters).
    DroppedPoints {
        /// The window, ns.
        window_ns: i64,
    },
    /// Per sink: the age of its oldest unsent point, seconds (the forwarder's status).
    SinkBacklogAge,
    /// The store's size as a percentage of `[retention] max_bytes` (none without a budget).
    DiskBudget,
    /// 1 while the clock is earlier than `[clock] min_valid`, else 0.
    ClockUnset,
}

/// One rule, ready to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// `alertname`.
    pub name: String,
    /// Whether it is one of [`BUILTIN_NAMES`] (and not replaced by a user rule).
    pub builtin: bool,
    /// What it watches.
    pub watch: Watch,
    /// The comparison.
    pub op: Op,
    /// The threshold.
    pub threshold: f64,
    /// Pending this long before firing, ns.
    pub for_ns: i64,
    /// Firing this long after the condition cleared, ns.
    pub keep_firing_for_ns: i64,
    /// What an empty window means.
    pub no_data: NoData,
    /// `severity` label.
    pub severity: String,
    /// When set, an instance's group label of this name is its `severity` (a kernel event's
    /// own severity), in place of [`Rule::severity`].
    pub severity_from: Option<String>,
    /// `summary` template.
    pub summary: String,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
}

impl Rule {
    /// The `severity` label of the instance with `group` labels.
    pub fn severity_of(&self, group: &BTreeMap<String, String>) -> String {
        self.severity_from
            .as_ref()
            .and_then(|k| group.get(k))
            .unwrap_or(&self.severity)
            .clone()
    }

    /// The measurement and field it watches, when it watches one series field.
    pub fn measurement_field(&self) -> (Option<String>, Option<String>) {
        match &self.watch {
            Watch::Series(s) => (Some(s.measurement.clone()), s.fields.first().cloned()),
            Watch::GpuTempMargin { .. } => (Some("gpu".into()), Some("temp_c".into())),
            _ => (None, None),
        }
    }

    /// The rule's tag filter (series rules).
    pub fn tag_filter(&self) -> BTreeMap<String, String> {
        match &self.watch {
            Watch::Series(s) => s.tags.iter().cloned().collect(),
            _ => BTreeMap::new(),
        }
    }

    /// The summary with `{value}`, `{threshold}` and `{label}` filled in (an unknown name
    /// stays as written).
    pub fn render_summary(&self, labels: &BTreeMap<String, String>, value: Option<f64>) -> String {
        let mut out = String::new();
        let mut rest = self.summary.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let Some(close) = after.find('}') else {
                out.push_str(&rest[open..]);
                return out;
            };
            let key = &after[..close];
            match key {
                "value" => out.push_str(&value.map_or("no data".into(), fmt_value)),
                "threshold" => out.push_str(&fmt_value(self.threshold)),
                "alertname" => out.push_str(&self.name),
                k => match labels.get(k).or_else(|| self.labels.get(k)) {
                    Some(v) => out.push_str(v),
                    None => {
                        out.push('{');
                        out.push_str(key);
                        out.push('}');
                    }
                },
            }
            rest = &after[close + 1..];
        }
        out.push_str(rest);
        out
    }
}

/// A value for people: up to 3 decimals, trailing zeros dropped.
pub fn fmt_value(v: f64) -> String {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e15 {
        return format!("{}", v as i64);
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The engine's aggregate of a name `config` accepted (the same set: see the test); the
/// fallback is unreachable for a loaded config.
fn agg(a: &AggName) -> Agg {
    Agg::parse(&a.name).unwrap_or(Agg::Mean)
}

fn ns(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl From<&AlertRuleConfig> for Rule {
    fn from(c: &AlertRuleConfig) -> Rule {
        Rule {
            name: c.name.0.clone(),
            builtin: false,
            watch: Watch::Series(SeriesSpec {
                measurement: c.measurement.clone(),
                fields: vec![c.field.clone()],
                tags: c.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                group_by: c.group_by.clone(),
                exclude: Vec::new(),
                agg: agg(&c.agg),
                ratio_of: c.ratio_of.as_ref().map(agg),
                window_ns: ns(c.window.0),
            }),
            op: c.op,
            threshold: c.threshold,
            for_ns: ns(c.for_.0),
            keep_firing_for_ns: ns(c.keep_firing_for.0),
            no_data: c.no_data,
            severity: c.severity.clone(),
            severity_from: None,
            summary: c.summary.clone(),
            labels: c.labels.clone(),
        }
    }
}

/// The built-in rules as `[alerts]` sets them (all of them, before `disable`).
pub fn builtins(a: &AlertsConfig) -> Vec<Rule> {
    let hold = ns(a.builtin_for.0);
    let minute = 60 * NS;
    let rule = |name: &str, watch: Watch, op, threshold, for_ns, summary: &str| Rule {
        name: name.into(),
        builtin: true,
        watch,
        op,
        threshold,
        for_ns,
        keep_firing_for_ns: 0,
        no_data: NoData::Ok,
        severity: "warning".into(),
        severity_from: None,
        summary: summary.into(),
        labels: BTreeMap::new(),
    };
    let series = |measurement: &str, fields: &[&str], group: &str, agg, window_ns| SeriesSpec {
        measurement: measurement.into(),
        fields: fields.iter().map(|f| f.to_string()).collect(),
        tags: Vec::new(),
        group_by: vec![group.into()],
        exclude: Vec::new(),
        agg,
        ratio_of: None,
        window_ns,
    };
    let mut jetson = series("jetson_temp", &["temp_c"], "zone", Agg::Last, minute);
    // Jetson Nano-class boards print a fixed PMIC@100C that is no sensor reading.
    jetson.exclude = vec![("zone".into(), "pmic".into())];
    let mut ratio = series(
        "inference",
        &["wall_ms"],
        "model",
        Agg::Quantile(0.99),
        ns(a.latency_ratio_window.0),
    );
    ratio.ratio_of = Some(Agg::Quantile(0.5));
    let mut ttft = series(
        "llm",
        &["ttft_ms"],
        "model",
        Agg::Quantile(0.99),
        ns(a.latency_ratio_window.0),
    );
    ttft.ratio_of = Some(Agg::Quantile(0.5));
    // A kernel event of `kind` in the last window: the sum of its `count` field (1 per
    // event; more for a summary of kills without a log line).
    let kernel = |kind: &str, group: &str| SeriesSpec {
        measurement: crate::collect::event::MEASUREMENT.into(),
        fields: vec!["count".into()],
        tags: vec![
            ("kind".into(), kind.into()),
            ("source".into(), "kernel".into()),
        ],
        group_by: vec![group.into()],
        exclude: Vec::new(),
        agg: Agg::Sum,
        ratio_of: None,
        window_ns: ns(a.kernel_event_window.0),
    };
    let mut xid = rule(
        "GpuXidError",
        Watch::Series(kernel("xid", "severity")),
        Op::Gt,
        0.0,
        0,
        "{value} NVIDIA Xid error(s) of severity {severity} in the kernel log in the last \
         window (see the events for the codes and processes)",
    );
    xid.severity_from = Some("severity".into());
    let critical = |mut r: Rule| {
        r.severity = "critical".into();
        r
    };
    let kernel_rules = [
        xid,
        critical(rule(
            "OomKill",
            Watch::Series(kernel("oom_kill", "kind")),
            Op::Gt,
            0.0,
            0,
            "the OOM killer killed {value} process(es) in the last window",
        )),
        critical(rule(
            "KernelThermalTrip",
            Watch::Series(kernel("thermal_trip", "kind")),
            Op::Gt,
            0.0,
            0,
            "{value} thermal trip(s) in the kernel log in the last window",
        )),
        rule(
            "KernelOverCurrent",
            Watch::Series(kernel("overcurrent", "kind")),
            Op::Gt,
            0.0,
            0,
            "{value} over-current alarm(s) in the kernel log in the last window: the supply \
             may be under-sized",
        ),
    ];
    // One instance per watched-process label: the restart events of the window, counted.
    let mut restarts = series(
        crate::collect::event::MEASUREMENT,
        &["downtime_s"],
        "process",
        Agg::Count,
        ns(a.process_restart_window.0),
    );
    let restart_summary = format!(
        "watched process {{process}} restarted {{value}} times in the last {}",
        humantime::format_duration(a.process_restart_window.0)
    );
    restarts.tags = vec![
        ("kind".into(), "process_restart".into()),
        ("source".into(), "process".into()),
    ];
    let mut all = vec![
        rule(
            "GpuThrottling",
            Watch::Series(series(
                "gpu",
                &[
                    "throttle_hw_slowdown",
                    "throttle_sw_thermal",
                    "throttle_hw_thermal",
                    "throttle_power_brake",
                ],
                "gpu",
                Agg::Last,
                minute,
            )),
            Op::Gt,
            0.0,
            hold,
            "GPU {gpu} is throttling: thermal or power slowdown active",
        ),
        rule(
            "GpuTemperatureNearSlowdown",
            Watch::GpuTempMargin { window_ns: minute },
            Op::Lt,
            a.gpu_temp_margin_c,
            hold,
            "GPU {gpu} is {value} °C below its slowdown temperature (alert under {threshold})",
        ),
        rule(
            "JetsonTemperatureHigh",
            Watch::Series(jetson),
            Op::Gt,
            a.jetson_temp_limit_c,
            hold,
            "Jetson zone {zone} is at {value} °C (limit {threshold})",
        ),
        rule(
            "InferenceLatencyRatioHigh",
            Watch::Series(ratio),
            Op::Gt,
            a.latency_ratio,
            ns(a.latency_ratio_for.0),
            "P99/P50 latency of model {model} is {value} (above {threshold}): a long tail",
        ),
        rule(
            "LlmTtftRatioHigh",
            Watch::Series(ttft),
            Op::Gt,
            a.ttft_ratio,
            ns(a.latency_ratio_for.0),
            "P99/P50 time to first token of LLM {model} is {value} (above {threshold}): \
             long prompts or queueing",
        ),
        rule(
            "ProcessRestarted",
            Watch::Series(restarts),
            Op::Gt,
            0.0,
            0,
            &restart_summary,
        ),
        rule(
            "AgentDroppingPoints",
            Watch::DroppedPoints {
                window_ns: 5 * minute,
            },
            Op::Gt,
            0.0,
            hold,
            "the agent dropped or rejected {value} points in the last 5 minutes",
        ),
        rule(
            "SinkBacklogStale",
            Watch::SinkBacklogAge,
            Op::Gt,
            a.sink_backlog_age.0.as_secs_f64(),
            hold,
            "sink {sink}: the oldest unsent point is {value} s old (limit {threshold} s)",
        ),
        rule(
            "StoreNearDiskBudget",
            Watch::DiskBudget,
            Op::Gt,
            a.disk_budget_pct,
            hold,
            "the store uses {value} % of its disk budget (alert above {threshold} %)",
        ),
        rule(
            "ClockNotSet",
            Watch::ClockUnset,
            Op::Gt,
            0.0,
            ns(a.clock_unset_for.0),
            "the device clock is not set: points are held from rollup and forwarding",
        ),
    ];
    all.extend(kernel_rules);
    all
}

/// Every rule the evaluator runs: the enabled built-ins (unless a user rule has the same
/// name), then the user's rules in file order.
pub fn compile(alerts: &AlertsConfig, user: &[AlertRuleConfig]) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    if alerts.builtin {
        out.extend(builtins(alerts).into_iter().filter(|r| {
            !alerts.disable.contains(&r.name) && !user.iter().any(|u| u.name.0 == r.name)
        }));
    }
    out.extend(user.iter().map(Rule::from));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn builtins_are_on_by_default_and_survive_user_rules() {
        let c = Config::from_toml_str(
            "[[alert]]\nname = \"Mine\"\nmeasurement = \"m\"\nfield = \"f\"\nagg = \"max\"\nwindow = \"1m\"\nop = \">\"\nthreshold = 1\n",
            "f",
        )
        .unwrap();
        let rules = compile(&c.alerts, &c.alert);
        let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(&names[..BUILTIN_NAMES.len()], BUILTIN_NAMES);
        assert_eq!(names.last(), Some(&"Mine"));
        assert_eq!(BUILTIN_NAMES.len(), builtins(&c.alerts).len());
    }

    #[test]
    fn builtins_can_be_disabled_replaced_or_all_switched_off() {
        let c = Config::from_toml_str(
            "[alerts]\ndisable = [\"ClockNotSet\"]\n[[alert]]\nname = \"GpuThrottling\"\nmeasurement = \"gpu\"\nfield = \"throttle_reasons\"\nagg = \"last\"\nwindow = \"1m\"\nop = \">\"\nthreshold = 0\n",
            "f",
        )
        .unwrap();
        let rules = compile(&c.alerts, &c.alert);
        assert!(!rules.iter().any(|r| r.name == "ClockNotSet"));
        let g: Vec<&Rule> = rules.iter().filter(|r| r.name == "GpuThrottling").collect();
        assert_eq!(g.len(), 1);
        assert!(!g[0].builtin);
        let mut a = c.alerts.clone();
        a.builtin = false;
        assert_eq!(compile(&a, &[]).len(), 0);
    }

    /// The config accepts exactly the aggregate names the engine parses.
    #[test]
    fn config_and_engine_agree_on_agg_names() {
        for name in [
            "mean", "avg", "min", "max", "sum", "count", "rate", "last", "p50", "p99", "p999",
            "p0", "p100", "median", "p", "p1000x", "P99", "", "p9.9", "stddev",
        ] {
            assert_eq!(
                AggName::try_from(name.to_string()).is_ok(),
                Agg::parse(name).is_ok(),
                "{name}"
            );
        }
    }

    #[test]
    fn summaries_fill_value_threshold_and_labels() {
        let c = Config::builtin();
        let r = builtins(&c.alerts)
            .into_iter()
            .find(|r| r.name == "InferenceLatencyRatioHigh")
            .unwrap();
        let labels = BTreeMap::from([("model".to_string(), "yolo".to_string())]);
        assert_eq!(
            r.render_summary(&labels, Some(3.25)),
            "P99/P50 latency of model yolo is 3.25 (above 3): a long tail"
        );
        let mut r = r;
        r.summary = "{nope} {value} {".into();
        assert_eq!(r.render_summary(&labels, None), "{nope} no data {");
        assert_eq!(fmt_value(0.1 + 0.2), "0.3");
    }
}
