//! The triage snapshot's shape and its ranking: turns window-vs-baseline numbers, events and
//! version sets into [`Finding`]s with a score and a sentence, and ranks them, likely cause
//! first, each stating the interval it compared ([`stamp`]). Pure: no store, no clock, no
//! /proc; `gather.rs` reads the numbers.
//!
//! Scores are normalised so that 1.0 is "clearly moved" on every scale, and only findings
//! at or above [`MIN_SCORE`] are kept:
//! - ratios (latency, input sizes, memory, clocks): `|ln(window / baseline)| / ln(1.25)`
//!   (1.25x or 0.8x is 1.0; 2.7x is 4.5);
//! - percentages (utilisation, CPU, memory, EMC load): `|Δ| / 10` points;
//! - temperatures: `Δ / 3` °C (only warming counts), plus [`THROTTLE_SCORE`] when a
//!   throttle reason became active in the window;
//! - discrete facts have fixed scores: a version change [`VERSION_SCORE`], an agent start or
//!   power-mode change [`EVENT_SCORE`], any other event [`OTHER_EVENT_SCORE`].

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// Findings scoring below this are left out.
pub const MIN_SCORE: f64 = 1.0;
/// A version seen in the window but not in the baseline.
pub const VERSION_SCORE: f64 = 5.0;
/// An agent start or power-mode change inside the window.
pub const EVENT_SCORE: f64 = 4.0;
/// Any other `edgewatch_event` inside the window (a `warning` one scores [`EVENT_SCORE`]).
pub const OTHER_EVENT_SCORE: f64 = 3.0;
/// A `critical` event inside the window (a fatal GPU error, an OOM kill).
pub const CRITICAL_EVENT_SCORE: f64 = 6.0;
/// Added to a thermal finding when a throttle reason became active in the window.
pub const THROTTLE_SCORE: f64 = 3.0;

/// A throttle flag counts as newly active when its share of samples grew by this much.
const THROTTLE_SHARE: f64 = 0.25;

/// Which step of the spike routine a finding belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    /// 1: agent starts, power-mode changes, other agent events.
    Events,
    /// 2: GPU utilisation and memory.
    Gpu,
    /// 3: host CPU and memory, EMC.
    Contention,
    /// 4: `input_length`, `batch_size`.
    Input,
    /// 5: temperatures, throttling, clocks.
    Thermal,
    /// 6: driver, CUDA, JetPack, `model_version`.
    Versions,
}

/// One thing that moved between the baseline and the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// The routine's step.
    pub step: Step,
    /// What was compared, stable across incidents (`inference.input_length.p99`, ...).
    pub key: String,
    /// The series it is about (`model=yolov8n`, `gpu=0`, `zone=CPU`), empty for the device.
    pub scope: String,
    /// The sentence shown first ("input_length p99 2.7x baseline").
    pub message: String,
    /// How far it moved (see the module docs); findings are sorted by it.
    pub score: f64,
    /// The baseline value, for numeric findings.
    pub baseline: Option<f64>,
    /// The window value, for numeric findings.
    pub window: Option<f64>,
    /// The interval compared: the spike window (for events, with its lead), ns. Set by
    /// [`stamp`], which also names it in `message`.
    pub window_from_ns: i64,
    /// See `window_from_ns`.
    pub window_to_ns: i64,
    /// The baseline it was compared with (none for events), ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_from_ns: Option<i64>,
    /// See `baseline_from_ns`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_to_ns: Option<i64>,
}

/// `ns` as `HH:MM:SS` (UTC).
pub fn clock(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns)
        .format("%H:%M:%S")
        .to_string()
}

/// Sets the interval each of `findings` compared (`win`, against `base` when given) and
/// states it at the end of its sentence ("· 14:02:00–14:05:12 vs 13:02:00–14:02:00 UTC").
pub fn stamp(findings: &mut [Finding], win: Span, base: Option<Span>) {
    let text = match base {
        Some(b) => format!(
            " · {}–{} vs {}–{} UTC",
            clock(win.from_ns),
            clock(win.to_ns),
            clock(b.from_ns),
            clock(b.to_ns.saturating_add(1))
        ),
        None => format!(" · {}–{} UTC", clock(win.from_ns), clock(win.to_ns)),
    };
    for f in findings {
        f.window_from_ns = win.from_ns;
        f.window_to_ns = win.to_ns;
        f.baseline_from_ns = base.map(|b| b.from_ns);
        f.baseline_to_ns = base.map(|b| b.to_ns);
        f.message.push_str(&text);
    }
}

/// A finding's interval before [`stamp`] sets it.
const UNSTAMPED: Finding = Finding {
    step: Step::Events,
    key: String::new(),
    scope: String::new(),
    message: String::new(),
    score: 0.0,
    baseline: None,
    window: None,
    window_from_ns: 0,
    window_to_ns: 0,
    baseline_from_ns: None,
    baseline_to_ns: None,
};

/// A time range, ns, inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Span {
    /// Start.
    pub from_ns: i64,
    /// End.
    pub to_ns: i64,
}

/// Where the latency went: did `wall_ms` grow inside `gpu_ms` or outside it?
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Split {
    /// Mean `wall_ms` in the baseline.
    pub wall_ms_baseline: f64,
    /// Mean `wall_ms` in the window.
    pub wall_ms_window: f64,
    /// Mean `gpu_ms` in the baseline, when reported.
    pub gpu_ms_baseline: Option<f64>,
    /// Mean `gpu_ms` in the window, when reported.
    pub gpu_ms_window: Option<f64>,
    /// The share of the wall-time growth that `gpu_ms` accounts for (0..1), when wall grew
    /// and both are known.
    pub inside_gpu_share: Option<f64>,
    /// The sentence.
    pub message: String,
}

/// A process at fire time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Process {
    /// Process id.
    pub pid: i64,
    /// Its name (`comm`, or as the GPU collector named it).
    pub name: String,
    /// CPU use over the sample, percent of one core (CPU list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_pct: Option<f64>,
    /// Resident memory, MiB (CPU list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_mb: Option<f64>,
    /// GPU memory, MiB (GPU list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_mem_mb: Option<f64>,
    /// Where the GPU figure came from: `gpu_process` (NVML) or `jetson_process` (nvmap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// The top processes when the alert fired (not stored anywhere else: sampled then).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Processes {
    /// By CPU use, highest first.
    pub by_cpu: Vec<Process>,
    /// By GPU memory, highest first (the newest collected points).
    pub by_gpu_mem: Vec<Process>,
}

/// How the window's start was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowFrom {
    /// Where the alert's latency left its baseline.
    Latency,
    /// The rule's aggregation window before the condition first held.
    RuleWindow,
    /// The longest window (10 minutes before the condition first held).
    Lead,
}

/// The whole snapshot, stored as JSON with the incident.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// The spike window: from where the latency left its baseline to the firing (see
    /// `window.rs`).
    pub window: Span,
    /// The hour before the window.
    pub baseline: Span,
    /// How the window's start was found.
    pub window_from: WindowFrom,
    /// The sentence saying how.
    pub window_note: String,
    /// The span the events were read from: the window with a lead before it.
    pub events_window: Span,
    /// The events of `events_window`, in time order (at most [`MAX_EVENT_ROWS`], the newest).
    pub events: Vec<EventRow>,
    /// The series the per-model findings were restricted to.
    pub scope: BTreeMap<String, String>,
    /// Ranked, likely cause first.
    pub findings: Vec<Finding>,
    /// Wall vs GPU time, when `inference` data exists.
    pub split: Option<Split>,
    /// The top processes at fire time.
    pub processes: Processes,
    /// Which steps had data to compare (and which found nothing to read).
    pub checked: BTreeMap<String, bool>,
}

/// `k=v,k=v` of `tags`.
pub fn scope_of(tags: &BTreeMap<String, String>) -> String {
    tags.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn short(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Ratio-scaled comparison (`label` is e.g. "input_length p99"): `None` without both values
/// or a positive baseline. `drops_only` keeps only decreases (clocks below their usual).
pub fn ratio_finding(
    step: Step,
    key: &str,
    scope: &str,
    label: &str,
    baseline: Option<f64>,
    window: Option<f64>,
    drops_only: bool,
) -> Option<Finding> {
    let (b, w) = (baseline?, window?);
    if !(b > 0.0 && w >= 0.0 && b.is_finite() && w.is_finite()) {
        return None;
    }
    if drops_only && w >= b {
        return None;
    }
    let r = w / b;
    let score = if w == 0.0 {
        10.0
    } else {
        r.ln().abs() / 1.25f64.ln()
    };
    let message = if r >= 1.0 {
        format!("{label} {r:.1}x baseline ({} → {})", short(b), short(w))
    } else {
        format!(
            "{label} {:.0}% below baseline ({} → {})",
            (1.0 - r) * 100.0,
            short(b),
            short(w)
        )
    };
    Some(Finding {
        step,
        key: key.into(),
        scope: scope.into(),
        message,
        score,
        baseline: Some(b),
        window: Some(w),
        ..UNSTAMPED
    })
}

/// Percentage-point comparison (utilisation, CPU, memory use, EMC load).
pub fn points_finding(
    step: Step,
    key: &str,
    scope: &str,
    label: &str,
    baseline: Option<f64>,
    window: Option<f64>,
) -> Option<Finding> {
    let (b, w) = (baseline?, window?);
    if !(b.is_finite() && w.is_finite()) {
        return None;
    }
    let d = w - b;
    Some(Finding {
        step,
        key: key.into(),
        scope: scope.into(),
        message: format!("{label} {d:+.0} pts ({b:.0} → {w:.0} %)"),
        score: d.abs() / 10.0,
        baseline: Some(b),
        window: Some(w),
        ..UNSTAMPED
    })
}

/// A device's temperature and throttle state: `throttles` are the reasons whose share of
/// samples in the window and in the baseline is given (`(name, baseline, window)`).
pub fn thermal_finding(
    key: &str,
    scope: &str,
    label: &str,
    baseline_c: Option<f64>,
    window_c: Option<f64>,
    throttles: &[(&str, f64, f64)],
) -> Option<Finding> {
    let warmed = match (baseline_c, window_c) {
        (Some(b), Some(w)) if b.is_finite() && w.is_finite() => Some((b, w)),
        _ => None,
    };
    let newly: Vec<&str> = throttles
        .iter()
        .filter(|(_, b, w)| *w > 0.0 && w - b >= THROTTLE_SHARE)
        .map(|(n, _, _)| *n)
        .collect();
    let still: Vec<&str> = throttles
        .iter()
        .filter(|(n, _, w)| *w > 0.0 && !newly.contains(n))
        .map(|(n, _, _)| *n)
        .collect();
    let mut score = warmed.map_or(0.0, |(b, w)| (w - b).max(0.0) / 3.0);
    if !newly.is_empty() {
        score += THROTTLE_SCORE;
    }
    let mut parts = Vec::new();
    if !newly.is_empty() {
        parts.push(format!("{} active", newly.join(", ")));
    }
    if !still.is_empty() {
        parts.push(format!("{} active before too", still.join(", ")));
    }
    if warmed.is_none() && parts.is_empty() {
        return None;
    }
    let message = match warmed {
        Some((b, w)) => {
            parts.insert(0, format!("{label} {:+.1} °C ({b:.1} → {w:.1} °C)", w - b));
            parts.join(", ")
        }
        None => format!("{label}: {}", parts.join(", ")),
    };
    Some(Finding {
        step: Step::Thermal,
        key: key.into(),
        scope: scope.into(),
        message,
        score,
        baseline: warmed.map(|p| p.0),
        window: warmed.map(|p| p.1),
        ..UNSTAMPED
    })
}

/// One `edgewatch_event` point in the window.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// When, ns.
    pub at_ns: i64,
    /// Its `event` tag (`start`, `power_mode`, `jetson_clocks`, ...).
    pub event: String,
    /// Its other tags (`version` of a start).
    pub tags: BTreeMap<String, String>,
    /// Its string fields (`from`, `to`).
    pub fields: BTreeMap<String, String>,
}

/// Events listed in a snapshot.
pub const MAX_EVENT_ROWS: usize = 100;

/// One event as the incident page lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRow {
    /// When, ns.
    pub at_ns: i64,
    /// `kind` (or the older `event` tag).
    pub kind: String,
    /// `info`, `warning` or `critical` (`info` when the point has none).
    pub severity: String,
    /// Who saw it (empty when the point has none).
    pub source: String,
    /// Its `message`, or its kind and fields for a point without one.
    pub message: String,
}

/// The rows of `events` (the newest [`MAX_EVENT_ROWS`]), in time order.
pub fn event_rows(events: &[Event]) -> Vec<EventRow> {
    let skip = events.len().saturating_sub(MAX_EVENT_ROWS);
    events[skip..]
        .iter()
        .map(|e| {
            let message = match e.fields.get("message").filter(|m| !m.is_empty()) {
                Some(m) => m.clone(),
                None => {
                    let mut parts = vec![e.event.clone()];
                    parts.extend(
                        e.tags
                            .iter()
                            .filter(|(k, _)| !matches!(k.as_str(), "severity" | "source"))
                            .map(|(k, v)| format!("{k}={v}")),
                    );
                    parts.extend(e.fields.iter().map(|(k, v)| format!("{k}={v}")));
                    parts.join(" ")
                }
            };
            EventRow {
                at_ns: e.at_ns,
                kind: e.event.clone(),
                severity: e
                    .tags
                    .get("severity")
                    .cloned()
                    .unwrap_or_else(|| "info".into()),
                source: e.tags.get("source").cloned().unwrap_or_default(),
                message,
            }
        })
        .collect()
}

/// One finding per kind of event in the window.
pub fn event_findings(events: &[Event]) -> Vec<Finding> {
    let mut by_kind: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in events {
        by_kind.entry(e.event.as_str()).or_default().push(e);
    }
    let mut out = Vec::new();
    for (kind, evs) in by_kind {
        let n = evs.len();
        let times = if n == 1 { "" } else { " (several times)" };
        let last = evs[n - 1];
        let (message, score) = match kind {
            "start" => (
                format!(
                    "agent started in the window{times}{}",
                    last.tags
                        .get("version")
                        .map(|v| format!(" (version {v})"))
                        .unwrap_or_default()
                ),
                EVENT_SCORE,
            ),
            "power_mode" => (
                format!(
                    "power mode changed{times}: {} → {}",
                    evs[0].fields.get("from").map_or("?", String::as_str),
                    last.fields.get("to").map_or("?", String::as_str)
                ),
                EVENT_SCORE,
            ),
            other => {
                let detail = match (last.fields.get("from"), last.fields.get("to")) {
                    (Some(f), Some(t)) => format!(": {f} → {t}"),
                    _ => String::new(),
                };
                // The event's own sentence when it has one; its severity ranks it.
                let message = match last.fields.get("message").filter(|m| !m.is_empty()) {
                    Some(m) if n == 1 => m.clone(),
                    Some(m) => format!("{other} ×{n} in the window, last: {m}"),
                    None => format!("{other} event in the window{times}{detail}"),
                };
                let score = match last.tags.get("severity").map(String::as_str) {
                    Some("critical") => CRITICAL_EVENT_SCORE,
                    Some("warning") => EVENT_SCORE,
                    _ => OTHER_EVENT_SCORE,
                };
                (message, score)
            }
        };
        out.push(Finding {
            step: Step::Events,
            key: format!("event.{kind}"),
            scope: String::new(),
            message,
            score,
            baseline: None,
            window: Some(n as f64),
            ..UNSTAMPED
        });
    }
    out
}

/// A version change: `label` (e.g. "model_version of yolov8n") seen with values in the
/// baseline and in the window. Flagged when the window shows a value the baseline never did
/// (and the baseline had data at all).
pub fn version_finding(
    key: &str,
    scope: &str,
    label: &str,
    baseline: &BTreeSet<String>,
    window: &BTreeSet<String>,
) -> Option<Finding> {
    if baseline.is_empty() || window.is_subset(baseline) {
        return None;
    }
    let join = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
    let new: BTreeSet<String> = window.difference(baseline).cloned().collect();
    Some(Finding {
        step: Step::Versions,
        key: key.into(),
        scope: scope.into(),
        message: format!("{label} changed: {} → {}", join(baseline), join(&new)),
        score: VERSION_SCORE,
        baseline: None,
        window: None,
        ..UNSTAMPED
    })
}

/// The wall-vs-GPU split from the means of `wall_ms` and `gpu_ms`.
pub fn split(
    wall_b: Option<f64>,
    wall_w: Option<f64>,
    gpu_b: Option<f64>,
    gpu_w: Option<f64>,
) -> Option<Split> {
    let (wb, ww) = (wall_b?, wall_w?);
    let dw = ww - wb;
    let gpu = gpu_b.zip(gpu_w);
    let share = gpu
        .filter(|_| dw > 0.0)
        .map(|(b, w)| ((w - b) / dw).clamp(0.0, 1.0));
    let message = match (share, gpu) {
        _ if dw <= 0.0 => format!(
            "wall_ms mean did not grow ({} → {} ms)",
            short(wb),
            short(ww)
        ),
        (Some(s), Some((b, w))) => {
            let place = if s >= 0.5 {
                "inside GPU compute"
            } else {
                "outside GPU compute (queueing, copies, CPU)"
            };
            format!(
                "wall_ms mean {:+.1} ms, gpu_ms {:+.1} ms: {:.0}% of the growth is GPU time; the time went {place}",
                dw,
                w - b,
                s * 100.0
            )
        }
        _ => format!("wall_ms mean {dw:+.1} ms; no gpu_ms to split it"),
    };
    Some(Split {
        wall_ms_baseline: wb,
        wall_ms_window: ww,
        gpu_ms_baseline: gpu_b,
        gpu_ms_window: gpu_w,
        inside_gpu_share: share,
        message,
    })
}

/// Keeps the findings scoring at least [`MIN_SCORE`], highest first (ties: routine order,
/// then key, so the order is stable).
pub fn rank(findings: Vec<Finding>) -> Vec<Finding> {
    let step_no = |s: Step| s as u8;
    let mut kept: Vec<Finding> = findings
        .into_iter()
        .filter(|f| f.score.is_finite() && f.score >= MIN_SCORE)
        .collect();
    kept.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(step_no(a.step).cmp(&step_no(b.step)))
            .then(a.key.cmp(&b.key))
            .then(a.scope.cmp(&b.scope))
    });
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_score_by_log_distance_and_read_as_sentences() {
        let f = ratio_finding(
            Step::Input,
            "k",
            "",
            "input_length p99",
            Some(100.0),
            Some(270.0),
            false,
        )
        .unwrap();
        assert_eq!(f.message, "input_length p99 2.7x baseline (100 → 270)");
        assert!((f.score - 2.7f64.ln() / 1.25f64.ln()).abs() < 1e-9);
        // 5% either way is noise.
        let n = ratio_finding(Step::Input, "k", "", "x", Some(100.0), Some(105.0), false);
        assert!(n.unwrap().score < MIN_SCORE);
        let d = ratio_finding(
            Step::Thermal,
            "k",
            "",
            "clk",
            Some(1000.0),
            Some(600.0),
            true,
        )
        .unwrap();
        assert_eq!(d.message, "clk 40% below baseline (1000 → 600)");
        assert!(d.score > MIN_SCORE);
        // Clocks: only drops count; no baseline, no finding.
        assert!(
            ratio_finding(Step::Thermal, "k", "", "c", Some(600.0), Some(900.0), true).is_none()
        );
        assert!(ratio_finding(Step::Input, "k", "", "c", None, Some(9.0), false).is_none());
        assert!(ratio_finding(Step::Input, "k", "", "c", Some(0.0), Some(9.0), false).is_none());
    }

    #[test]
    fn thermal_adds_warming_and_newly_active_throttling() {
        let f = thermal_finding(
            "gpu.thermal",
            "gpu=0",
            "GPU 0",
            Some(61.0),
            Some(68.0),
            &[("thermal slowdown", 0.0, 0.8), ("power cap", 0.5, 0.5)],
        )
        .unwrap();
        assert_eq!(
            f.message,
            "GPU 0 +7.0 °C (61.0 → 68.0 °C), thermal slowdown active, power cap active before too"
        );
        assert!((f.score - (7.0 / 3.0 + THROTTLE_SCORE)).abs() < 1e-9);
        // Flat and unthrottled: below the cut.
        let flat = thermal_finding("k", "", "GPU 0", Some(61.0), Some(61.5), &[]).unwrap();
        assert!(flat.score < MIN_SCORE);
        // Cooling never scores.
        let cool = thermal_finding("k", "", "GPU 0", Some(70.0), Some(60.0), &[]).unwrap();
        assert_eq!(cool.score, 0.0);
    }

    #[test]
    fn events_versions_and_split() {
        let ev = |k: &str, at| Event {
            at_ns: at,
            event: k.into(),
            tags: [("version".to_string(), "1.2.0".to_string())].into(),
            fields: [
                ("from".to_string(), "15W".to_string()),
                ("to".to_string(), "MAXN".to_string()),
            ]
            .into(),
        };
        let f = event_findings(&[ev("start", 1), ev("power_mode", 2), ev("start", 3)]);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].key, "event.power_mode");
        assert_eq!(f[0].message, "power mode changed: 15W → MAXN");
        assert_eq!(
            f[1].message,
            "agent started in the window (several times) (version 1.2.0)"
        );
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let v = version_finding(
            "k",
            "model=m",
            "model_version of m",
            &set(&["1"]),
            &set(&["1", "2"]),
        )
        .unwrap();
        assert_eq!(v.message, "model_version of m changed: 1 → 2");
        assert!(version_finding("k", "", "x", &set(&["1"]), &set(&["1"])).is_none());
        assert!(version_finding("k", "", "x", &set(&[]), &set(&["2"])).is_none());
        let s = split(Some(20.0), Some(60.0), Some(15.0), Some(19.0)).unwrap();
        assert_eq!(s.inside_gpu_share, Some(0.1));
        assert!(s.message.contains("outside GPU compute"), "{}", s.message);
        let s = split(Some(20.0), Some(60.0), Some(15.0), Some(50.0)).unwrap();
        assert!(s.message.contains("inside GPU compute"), "{}", s.message);
        assert!(split(Some(20.0), Some(19.0), None, None)
            .unwrap()
            .message
            .contains("did not grow"));
    }

    #[test]
    fn rank_drops_noise_and_puts_the_largest_move_first() {
        let mk = |key: &str, score: f64| Finding {
            step: Step::Gpu,
            key: key.into(),
            scope: String::new(),
            message: key.into(),
            score,
            baseline: None,
            window: None,
            ..UNSTAMPED
        };
        let r = rank(vec![
            mk("a", 1.5),
            mk("noise", 0.4),
            mk("b", 4.5),
            mk("nan", f64::NAN),
            mk("c", 2.0),
        ]);
        let keys: Vec<&str> = r.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(keys, ["b", "c", "a"]);
    }
}
