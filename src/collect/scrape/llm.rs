//! LLM servers' `/metrics` -> one `llm` point per model per scrape interval, for targets
//! with `preset = "vllm"` or `preset = "llamacpp"`. A pure state machine like `triton`: it
//! keeps the previous scrape's counters, histograms and time, and turns the next scrape into
//! deltas; time is an argument. vLLM's histograms (`vllm:time_to_first_token_seconds`,
//! `vllm:inter_token_latency_seconds` or the older `vllm:time_per_output_token_seconds`,
//! `vllm:e2e_request_latency_seconds`, `vllm:request_queue_time_seconds`) give
//! `<stage>_p50_ms`, `_p90_ms` and `_p99_ms` from the interval's own observations (the delta
//! of each cumulative bucket), by linear interpolation inside the bucket that holds the rank
//! (Prometheus' `histogram_quantile` rule, so exact only to within the bucket; a rank in the
//! `+Inf` bucket gives the highest finite bound); counters give per-interval token counts and
//! rates; gauges are copied. Label sets of one model (vLLM's `engine`, `finished_reason`)
//! are summed; ratios are averaged. The first scrape of a model has no interval: its point
//! carries the gauges only. A server restart (any counter, bucket or count of the model
//! lower than before, or a histogram's bounds changed) makes the new values the interval's
//! deltas, as Prometheus' `rate` does: never a negative value. A malformed family (no `+Inf`
//! bucket, buckets not cumulative, a wrong declared type, a negative or NaN value) is left
//! out of the point and reported; the rest of the point is kept.

use std::collections::{BTreeMap, HashMap};

use super::parse::{Kind, Page};
use super::triton::{bound, histogram_quantile};
use crate::model::{series_key, Line, Value};

/// The measurement.
pub const MEASUREMENT: &str = "llm";

/// The percentiles written per histogram: (quantile, field suffix).
const QUANTILES: [(f64, &str); 3] = [(0.5, "p50"), (0.9, "p90"), (0.99, "p99")];

/// Which server a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// vLLM's OpenAI-compatible server (`vllm:*`, label `model_name`).
    Vllm,
    /// llama.cpp's `llama-server --metrics` (`llamacpp:*`, no model label).
    Llamacpp,
}

/// What a family is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A histogram in seconds; the stage names the fields (`ttft` -> `ttft_p50_ms`).
    Histogram(&'static str),
    /// A counter, by key.
    Counter(&'static str),
    /// A gauge summed over a model's label sets: the field.
    Sum(&'static str),
    /// A 0..1 ratio averaged over a model's label sets: the field.
    Ratio(&'static str),
}

impl Role {
    fn key(self) -> &'static str {
        match self {
            Role::Histogram(k) | Role::Counter(k) | Role::Sum(k) | Role::Ratio(k) => k,
        }
    }

    fn kind(self) -> Kind {
        match self {
            Role::Histogram(_) => Kind::Histogram,
            Role::Counter(_) => Kind::Counter,
            Role::Sum(_) | Role::Ratio(_) => Kind::Gauge,
        }
    }
}

/// One metric family of a preset. Families sharing a role key are alternatives, the first
/// present on the page wins (newer name first).
struct Family {
    name: &'static str,
    role: Role,
}

const fn fam(name: &'static str, role: Role) -> Family {
    Family { name, role }
}

/// vLLM's documented `/metrics` names (docs.vllm.ai, "Production Metrics").
const VLLM: &[Family] = &[
    fam("vllm:time_to_first_token_seconds", Role::Histogram("ttft")),
    fam("vllm:inter_token_latency_seconds", Role::Histogram("itl")),
    fam("vllm:time_per_output_token_seconds", Role::Histogram("itl")),
    fam("vllm:e2e_request_latency_seconds", Role::Histogram("e2e")),
    fam("vllm:request_queue_time_seconds", Role::Histogram("queue")),
    fam(
        "vllm:generation_tokens_total",
        Role::Counter("output_tokens"),
    ),
    fam("vllm:prompt_tokens_total", Role::Counter("prompt_tokens")),
    fam("vllm:request_success_total", Role::Counter("success")),
    fam("vllm:kv_cache_usage_perc", Role::Ratio("kv_cache_usage")),
    fam("vllm:gpu_cache_usage_perc", Role::Ratio("kv_cache_usage")),
    fam("vllm:num_requests_running", Role::Sum("requests_running")),
    fam("vllm:num_requests_waiting", Role::Sum("requests_waiting")),
];

/// llama.cpp server's documented `/metrics` names (tools/server/README.md, `GET /metrics`).
const LLAMACPP: &[Family] = &[
    fam(
        "llamacpp:prompt_tokens_total",
        Role::Counter("prompt_tokens"),
    ),
    fam(
        "llamacpp:tokens_predicted_total",
        Role::Counter("output_tokens"),
    ),
    fam(
        "llamacpp:tokens_predicted_seconds_total",
        Role::Counter("predicted_seconds"),
    ),
    fam(
        "llamacpp:kv_cache_usage_ratio",
        Role::Ratio("kv_cache_usage"),
    ),
    fam("llamacpp:kv_cache_tokens", Role::Sum("kv_cache_tokens")),
    fam(
        "llamacpp:requests_processing",
        Role::Sum("requests_processing"),
    ),
    fam("llamacpp:requests_deferred", Role::Sum("requests_deferred")),
];

impl Preset {
    /// The values `preset` accepts, for messages.
    pub const ALLOWED: &'static str = "\"vllm\", \"llamacpp\"";

    /// `vllm` / `llamacpp`.
    pub fn from_name(name: &str) -> Option<Preset> {
        match name {
            "vllm" => Some(Preset::Vllm),
            "llamacpp" => Some(Preset::Llamacpp),
            _ => None,
        }
    }

    /// The `server` tag.
    pub fn server(self) -> &'static str {
        match self {
            Preset::Vllm => "vllm",
            Preset::Llamacpp => "llamacpp",
        }
    }

    fn families(self) -> &'static [Family] {
        match self {
            Preset::Vllm => VLLM,
            Preset::Llamacpp => LLAMACPP,
        }
    }

    fn model_label(self) -> Option<&'static str> {
        match self {
            Preset::Vllm => Some("model_name"),
            Preset::Llamacpp => None,
        }
    }
}

/// One histogram of one model in one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
struct Hist {
    /// (upper bound, cumulative count), sorted by bound, the last `+Inf`.
    buckets: Vec<(f64, f64)>,
    sum: Option<f64>,
    /// `_count`, else the `+Inf` bucket.
    count: f64,
}

/// One model's values in one scrape (only well-formed families).
#[derive(Debug, Clone, Default, PartialEq)]
struct ModelState {
    counters: BTreeMap<&'static str, f64>,
    hists: BTreeMap<&'static str, Hist>,
    /// Gauge fields in the preset's order.
    gauges: Vec<(&'static str, f64)>,
}

/// A family as read from one page for one model, before checks.
#[derive(Debug, Default)]
struct Gathered {
    value: f64,
    n: u32,
    buckets: Vec<(f64, f64)>,
    sum: Option<f64>,
    count: Option<f64>,
    error: Option<String>,
}

impl Gathered {
    fn fail(&mut self, why: String) {
        if self.error.is_none() {
            self.error = Some(why);
        }
    }
}

/// What one scrape gave.
#[derive(Debug, Default)]
pub struct Update {
    /// The `llm` points.
    pub lines: Vec<Line>,
    /// Families left out as malformed, one message each.
    pub problems: Vec<String>,
}

/// The previous scrape per target.
#[derive(Debug)]
pub struct Llm {
    preset: Preset,
    /// The `model` tag when the page names none.
    model: String,
    prev: Option<(i64, HashMap<String, ModelState>)>,
}

impl Llm {
    /// A target's state; `model` is the tag for pages without a model label.
    pub fn new(preset: Preset, model: &str) -> Llm {
        Llm {
            preset,
            model: model.to_string(),
            prev: None,
        }
    }

    /// For a `[[scrape]]` target: `None` without a (valid) `preset`.
    pub fn for_target(cfg: &super::ScrapeConfig) -> Option<Llm> {
        let preset = Preset::from_name(cfg.preset.as_deref()?)?;
        Some(Llm::new(preset, cfg.model.as_deref().unwrap_or(&cfg.name)))
    }

    /// Takes one scrape's page (all samples, before include/exclude) and returns the
    /// points, stamped `now`, tagged `model`, `server`, `scrape` and `extra`.
    pub fn update(
        &mut self,
        page: &Page,
        now: i64,
        scrape: &str,
        extra: &[(&str, &str)],
    ) -> Update {
        let mut out = Update::default();
        let (cur, found) = self.read(page, &mut out.problems);
        if !found {
            out.problems.push(format!(
                "the page has none of the {} metrics this preset reads (is `preset` right?)",
                self.preset.server()
            ));
        }
        let prev = self.prev.take();
        let mut models: Vec<&String> = cur.keys().collect();
        models.sort();
        for model in models {
            let c = &cur[model];
            let before = prev.as_ref().and_then(|(at, m)| {
                m.get(model)
                    .map(|p| (p, (now - at) as f64 / 1_000_000_000.0))
            });
            let fields = interval_fields(self.preset, before, c, model, &mut out.problems);
            if fields.is_empty() {
                continue;
            }
            let mut tags: Vec<(&str, &str)> = extra.to_vec();
            tags.retain(|(k, _)| !matches!(*k, "model" | "server" | "scrape"));
            tags.extend([
                ("model", model.as_str()),
                ("server", self.preset.server()),
                ("scrape", scrape),
            ]);
            out.lines.push(Line {
                key: series_key(MEASUREMENT, &tags),
                fields,
                ts: now,
                line_no: 0,
            });
        }
        self.prev = Some((now, cur));
        out
    }

    /// The page's well-formed families per model, and whether any family was there.
    fn read(&self, page: &Page, problems: &mut Vec<String>) -> (HashMap<String, ModelState>, bool) {
        let families = self.preset.families();
        let mut got: HashMap<(String, usize), Gathered> = HashMap::new();
        for s in &page.samples {
            let Some((fi, part)) = families
                .iter()
                .enumerate()
                .find_map(|(i, f)| sample_part(f, &s.name).map(|p| (i, p)))
            else {
                continue;
            };
            let f = &families[fi];
            let model = self
                .preset
                .model_label()
                .and_then(|l| s.label(l))
                .filter(|m| !m.is_empty())
                .unwrap_or(&self.model);
            let g = got.entry((model.to_string(), fi)).or_default();
            let declared = page.kind_of(&s.name).0;
            if declared != Kind::Untyped && declared != f.role.kind() {
                g.fail(format!(
                    "declared {declared:?}, expected {:?}",
                    f.role.kind()
                ));
                continue;
            }
            if !s.value.is_finite() || s.value < 0.0 {
                g.fail(format!("{} has the value {}", s.name, s.value));
                continue;
            }
            match part {
                Part::Value => {
                    g.value += s.value;
                    g.n += 1;
                }
                Part::Sum => *g.sum.get_or_insert(0.0) += s.value,
                Part::Count => *g.count.get_or_insert(0.0) += s.value,
                Part::Bucket => match s.label("le").and_then(bound) {
                    Some(le) => match g.buckets.iter_mut().find(|(b, _)| *b == le) {
                        Some(b) => b.1 += s.value,
                        None => g.buckets.push((le, s.value)),
                    },
                    None => g.fail(format!(
                        "a bucket without a valid `le` ({:?})",
                        s.label("le").unwrap_or("")
                    )),
                },
            }
        }
        let found = !got.is_empty();
        let mut keys: Vec<(String, usize)> = got.keys().cloned().collect();
        keys.sort();
        let mut cur: HashMap<String, ModelState> = HashMap::new();
        for key in keys {
            let Some(mut g) = got.remove(&key) else {
                continue;
            };
            let (model, fi) = key;
            let f = &families[fi];
            let state = cur.entry(model.clone()).or_default();
            let taken = match f.role {
                Role::Histogram(k) => state.hists.contains_key(k),
                Role::Counter(k) => state.counters.contains_key(k),
                Role::Sum(k) | Role::Ratio(k) => state.gauges.iter().any(|(n, _)| *n == k),
            };
            if taken {
                continue;
            }
            if let Role::Histogram(_) = f.role {
                check_histogram(&mut g);
            }
            if let Role::Ratio(_) = f.role {
                if g.error.is_none() && g.n > 0 && g.value / f64::from(g.n) > 1.0 {
                    g.fail(format!(
                        "{} is above 1 (a ratio 0..1 is expected)",
                        g.value / f64::from(g.n)
                    ));
                }
            }
            if let Some(why) = g.error {
                problems.push(format!(
                    "{} (model {model:?}): {why}; left out of this interval",
                    f.name
                ));
                continue;
            }
            match f.role {
                Role::Histogram(k) => {
                    let count = g
                        .count
                        .or_else(|| g.buckets.last().map(|b| b.1))
                        .unwrap_or(0.0);
                    state.hists.insert(
                        k,
                        Hist {
                            buckets: g.buckets,
                            sum: g.sum,
                            count,
                        },
                    );
                }
                Role::Counter(k) if g.n > 0 => {
                    state.counters.insert(k, g.value);
                }
                Role::Sum(k) if g.n > 0 => state.gauges.push((k, g.value)),
                Role::Ratio(k) if g.n > 0 => state.gauges.push((k, g.value / f64::from(g.n))),
                _ => {}
            }
        }
        // Gauges in the preset's order, whatever the page's.
        for state in cur.values_mut() {
            state.gauges.sort_by_key(|(k, _)| {
                families
                    .iter()
                    .position(|f| f.role.key() == *k)
                    .unwrap_or(usize::MAX)
            });
        }
        (cur, found)
    }
}

/// Which sample of a family a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Value,
    Bucket,
    Sum,
    Count,
}

fn sample_part(f: &Family, name: &str) -> Option<Part> {
    match f.role {
        Role::Histogram(_) => {
            let rest = name.strip_prefix(f.name)?;
            match rest {
                "_bucket" => Some(Part::Bucket),
                "_sum" => Some(Part::Sum),
                "_count" => Some(Part::Count),
                _ => None,
            }
        }
        _ => (name == f.name).then_some(Part::Value),
    }
}

/// Sorts the buckets and checks the histogram can be read: buckets present, a `+Inf` one, a
/// finite one, cumulative counts.
fn check_histogram(g: &mut Gathered) {
    if g.error.is_some() {
        return;
    }
    if g.buckets.is_empty() {
        g.fail("no buckets".into());
        return;
    }
    g.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    if g.buckets.last().map(|b| b.0) != Some(f64::INFINITY) {
        g.fail("no +Inf bucket".into());
    } else if g.buckets.len() < 2 {
        g.fail("no finite bucket".into());
    } else if g.buckets.windows(2).any(|w| w[1].1 < w[0].1) {
        g.fail("the buckets are not cumulative (a higher `le` counts fewer)".into());
    }
}

/// Whether the server restarted between `prev` and `cur`: a counter, bucket or count went
/// down, or a histogram's bounds changed.
fn restarted(prev: &ModelState, cur: &ModelState) -> bool {
    let counter_down = cur
        .counters
        .iter()
        .any(|(k, v)| prev.counters.get(k).is_some_and(|p| v < p));
    let hist_down = cur.hists.iter().any(|(k, h)| {
        prev.hists.get(k).is_some_and(|p| {
            h.count < p.count
                || h.buckets.len() != p.buckets.len()
                || h.buckets
                    .iter()
                    .zip(&p.buckets)
                    .any(|(c, p)| c.0 != p.0 || c.1 < p.1)
        })
    });
    counter_down || hist_down
}

/// One histogram's interval: the buckets' deltas, the count and the sum.
struct HistDelta {
    buckets: Vec<(f64, f64)>,
    count: f64,
    sum: Option<f64>,
}

/// The interval's fields of one model; gauges only without a previous scrape (`before`:
/// the previous state and the seconds since).
fn interval_fields(
    preset: Preset,
    before: Option<(&ModelState, f64)>,
    cur: &ModelState,
    model: &str,
    problems: &mut Vec<String>,
) -> Vec<(String, Value)> {
    let mut f: Vec<(String, Value)> = Vec::new();
    let push = |f: &mut Vec<(String, Value)>, name: String, v: f64| {
        if v.is_finite() {
            f.push((name, Value::F64(v)));
        }
    };
    if let Some((prev, secs)) = before {
        let reset = restarted(prev, cur);
        let counter = |k: &str| -> Option<f64> {
            let c = *cur.counters.get(k)?;
            if reset {
                return Some(c);
            }
            prev.counters.get(k).map(|p| c - p)
        };
        let mut hists: BTreeMap<&str, HistDelta> = BTreeMap::new();
        for (stage, h) in &cur.hists {
            let d = if reset {
                Some(HistDelta {
                    buckets: h.buckets.clone(),
                    count: h.count,
                    sum: h.sum,
                })
            } else {
                prev.hists.get(stage).map(|p| HistDelta {
                    buckets: h
                        .buckets
                        .iter()
                        .zip(&p.buckets)
                        .map(|(c, p)| (c.0, c.1 - p.1))
                        .collect(),
                    count: h.count - p.count,
                    sum: h.sum.zip(p.sum).map(|(c, p)| c - p),
                })
            };
            let Some(d) = d else { continue };
            if d.buckets.windows(2).any(|w| w[1].1 < w[0].1) {
                problems.push(format!(
                    "{stage} histogram (model {model:?}): the buckets grew inconsistently \
                     since the previous scrape; no percentiles this interval"
                ));
                continue;
            }
            hists.insert(stage, d);
        }
        let requests = hists
            .get("e2e")
            .map(|d| d.count)
            .or_else(|| counter("success"));
        if let Some(r) = requests {
            push(&mut f, "requests".into(), r);
        }
        for stage in ["ttft", "itl", "e2e", "queue"] {
            let Some(d) = hists.get(stage) else { continue };
            for (q, suffix) in QUANTILES {
                if let Some(v) = histogram_quantile(q, &d.buckets) {
                    push(&mut f, format!("{stage}_{suffix}_ms"), v * 1000.0);
                }
            }
        }
        for stage in ["ttft", "e2e"] {
            let Some(d) = hists.get(stage) else { continue };
            if let Some(sum) = d.sum.filter(|s| *s >= 0.0 && d.count > 0.0) {
                push(&mut f, format!("{stage}_mean_ms"), sum / d.count * 1000.0);
            }
        }
        for k in ["prompt_tokens", "output_tokens"] {
            let Some(d) = counter(k) else { continue };
            push(&mut f, k.into(), d);
            if secs > 0.0 {
                push(&mut f, format!("{k}_per_s"), d / secs);
            }
        }
        if preset == Preset::Llamacpp {
            if let (Some(tokens), Some(s)) =
                (counter("output_tokens"), counter("predicted_seconds"))
            {
                if s > 0.0 {
                    push(&mut f, "decode_tokens_per_s".into(), tokens / s);
                }
            }
        }
    }
    for (k, v) in &cur.gauges {
        push(&mut f, (*k).into(), *v);
    }
    f
}

#[cfg(test)]
mod tests {
    use super::super::parse::{parse, Format};
    use super::*;

    const S: i64 = 1_000_000_000;

    /// A vLLM histogram family: cumulative `counts` for `le` 0.01, 0.1, 1 and +Inf s.
    fn hist(name: &str, model: &str, counts: [u64; 4], sum: f64) -> String {
        let [a, b, c, d] = counts;
        let m = format!("model_name=\"{model}\"");
        format!(
            "# TYPE {name} histogram\n\
             {name}_bucket{{{m},le=\"0.01\"}} {a}\n\
             {name}_bucket{{{m},le=\"0.1\"}} {b}\n\
             {name}_bucket{{{m},le=\"1.0\"}} {c}\n\
             {name}_bucket{{{m},le=\"+Inf\"}} {d}\n\
             {name}_sum{{{m}}} {sum}\n\
             {name}_count{{{m}}} {d}\n"
        )
    }

    fn vllm_page(ttft: [u64; 4], e2e: [u64; 4], gen: u64, prompt: u64) -> String {
        let m = "model_name=\"llama\"";
        hist(
            "vllm:time_to_first_token_seconds",
            "llama",
            ttft,
            0.5 * ttft[3] as f64,
        ) + &hist(
            "vllm:e2e_request_latency_seconds",
            "llama",
            e2e,
            2.0 * e2e[3] as f64,
        ) + &format!(
            "# TYPE vllm:generation_tokens_total counter\n\
                 vllm:generation_tokens_total{{{m}}} {gen}\n\
                 # TYPE vllm:prompt_tokens_total counter\n\
                 vllm:prompt_tokens_total{{{m}}} {prompt}\n\
                 # TYPE vllm:num_requests_running gauge\n\
                 vllm:num_requests_running{{{m}}} 3\n\
                 # TYPE vllm:gpu_cache_usage_perc gauge\n\
                 vllm:gpu_cache_usage_perc{{{m}}} 0.25\n"
        )
    }

    fn run(l: &mut Llm, text: &str, at: i64) -> Update {
        let p = parse(text, Format::Prometheus);
        assert_eq!(p.bad_lines, 0, "{:?}", p.first_error);
        l.update(&p, at, "v", &[("role", "server"), ("server", "x")])
    }

    fn fields(l: &Line) -> Vec<(String, f64)> {
        l.fields
            .iter()
            .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
            .collect()
    }

    fn field(l: &Line, name: &str) -> Option<f64> {
        l.fields
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_f64())
    }

    fn close(got: Option<f64>, want: f64) {
        let got = got.unwrap_or_else(|| panic!("missing, want {want}"));
        assert!(
            (got - want).abs() <= 1e-9 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }

    #[test]
    fn the_first_scrape_gives_gauges_then_intervals_give_the_bucket_math() {
        let mut l = Llm::new(Preset::Vllm, "fallback");
        let u = run(
            &mut l,
            &vllm_page([1, 2, 3, 3], [0, 0, 2, 3], 100, 40),
            10 * S,
        );
        assert!(u.problems.is_empty(), "{:?}", u.problems);
        assert_eq!(u.lines.len(), 1);
        assert_eq!(
            u.lines[0].key,
            "llm,model=llama,role=server,scrape=v,server=vllm"
        );
        assert_eq!(
            fields(&u.lines[0]),
            [
                ("kv_cache_usage".to_string(), 0.25),
                ("requests_running".to_string(), 3.0)
            ]
        );
        // 2 s later. TTFT deltas per bucket: 10, 20, 9, 1 (40 observations); e2e: 0, 0, 4, 0.
        let u = run(
            &mut l,
            &vllm_page([11, 32, 42, 43], [0, 0, 6, 7], 500, 140),
            12 * S,
        );
        let p = &u.lines[0];
        assert_eq!(p.ts, 12 * S);
        close(field(p, "requests"), 4.0);
        // Rank 20 of 40: in (0.01, 0.1], 10 below: 0.01 + 0.09 * (20 - 10) / 20.
        close(
            field(p, "ttft_p50_ms"),
            (0.01 + 0.09 * 10.0 / 20.0) * 1000.0,
        );
        // Rank 36: in (0.1, 1], 30 below, 9 in it: 0.1 + 0.9 * 6 / 9.
        close(field(p, "ttft_p90_ms"), (0.1 + 0.9 * 6.0 / 9.0) * 1000.0);
        // Rank 39.6: in +Inf (39 below): the highest finite bound.
        close(field(p, "ttft_p99_ms"), 1000.0);
        // e2e: all 4 in (0.1, 1]: rank 2 -> 0.1 + 0.9 * 2 / 4.
        close(field(p, "e2e_p50_ms"), 550.0);
        // Means: delta sum / delta count (the page's sums are 0.5 s and 2 s per request).
        close(field(p, "ttft_mean_ms"), 500.0);
        close(field(p, "e2e_mean_ms"), 2000.0);
        close(field(p, "output_tokens"), 400.0);
        close(field(p, "output_tokens_per_s"), 200.0);
        close(field(p, "prompt_tokens"), 100.0);
        close(field(p, "prompt_tokens_per_s"), 50.0);
        close(field(p, "kv_cache_usage"), 0.25);
        // No inter-token or queue histogram on the page: no field, nothing invented.
        for missing in ["itl_p50_ms", "queue_p99_ms", "requests_waiting"] {
            assert_eq!(field(p, missing), None, "{missing}");
        }
        // An idle interval: zero counts, no percentiles, no means.
        let u = run(
            &mut l,
            &vllm_page([11, 32, 42, 43], [0, 0, 6, 7], 500, 140),
            13 * S,
        );
        let p = &u.lines[0];
        close(field(p, "requests"), 0.0);
        close(field(p, "output_tokens_per_s"), 0.0);
        assert_eq!(field(p, "ttft_p50_ms"), None);
        assert_eq!(field(p, "ttft_mean_ms"), None);
    }

    #[test]
    fn a_restart_counts_the_new_values_as_the_interval() {
        let mut l = Llm::new(Preset::Vllm, "m");
        run(
            &mut l,
            &vllm_page([5, 10, 10, 10], [0, 5, 10, 10], 1000, 500),
            0,
        );
        // The server restarted: every counter is lower; its new values are the interval.
        let u = run(
            &mut l,
            &vllm_page([0, 2, 4, 4], [0, 0, 1, 1], 30, 600),
            5 * S,
        );
        let p = &u.lines[0];
        close(field(p, "requests"), 1.0);
        close(field(p, "output_tokens"), 30.0);
        // The prompt counter is already past its old value; still the restart's value, not
        // 600 - 500.
        close(field(p, "prompt_tokens"), 600.0);
        close(field(p, "output_tokens_per_s"), 6.0);
        // Rank 2 of 4 in (0.01, 0.1]: 0.01 + 0.09 * 2 / 2.
        close(field(p, "ttft_p50_ms"), 100.0);
        assert!(fields(p).iter().all(|(_, v)| *v >= 0.0));
        // And counting goes on from the new base.
        let u = run(
            &mut l,
            &vllm_page([0, 2, 8, 8], [0, 0, 3, 3], 50, 610),
            6 * S,
        );
        close(field(&u.lines[0], "output_tokens"), 20.0);
        close(field(&u.lines[0], "prompt_tokens"), 10.0);
        close(field(&u.lines[0], "ttft_p50_ms"), 100.0 + 900.0 * 2.0 / 4.0);
    }

    #[test]
    fn changed_bounds_count_as_a_restart() {
        let a = ModelState {
            hists: BTreeMap::from([(
                "ttft",
                Hist {
                    buckets: vec![(0.1, 1.0), (f64::INFINITY, 1.0)],
                    sum: None,
                    count: 1.0,
                },
            )]),
            ..ModelState::default()
        };
        let mut b = a.clone();
        assert!(!restarted(&a, &b));
        b.hists.get_mut("ttft").unwrap().buckets[0].0 = 0.2;
        assert!(restarted(&a, &b));
    }

    #[test]
    fn older_vllm_names_are_read_and_newer_ones_win() {
        let older = hist("vllm:time_per_output_token_seconds", "m", [2, 2, 2, 2], 0.0);
        let newer = hist("vllm:inter_token_latency_seconds", "m", [0, 0, 2, 2], 0.0);
        let mut l = Llm::new(Preset::Vllm, "m");
        run(
            &mut l,
            &hist("vllm:time_per_output_token_seconds", "m", [0; 4], 0.0),
            0,
        );
        let u = run(&mut l, &older, S);
        close(field(&u.lines[0], "itl_p50_ms"), 5.0);
        let mut l = Llm::new(Preset::Vllm, "m");
        let zero = hist("vllm:time_per_output_token_seconds", "m", [0; 4], 0.0)
            + &hist("vllm:inter_token_latency_seconds", "m", [0; 4], 0.0);
        run(&mut l, &zero, 0);
        let u = run(&mut l, &(older + &newer), S);
        // Both families on the page: the newer name's buckets (2 in (0.1, 1]).
        close(field(&u.lines[0], "itl_p50_ms"), 550.0);
        // The newer KV gauge wins over the older.
        let both = "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n\
                    vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.9\n";
        let u = run(&mut Llm::new(Preset::Vllm, "m"), both, 0);
        assert_eq!(fields(&u.lines[0]), [("kv_cache_usage".to_string(), 0.5)]);
    }

    #[test]
    fn label_sets_of_a_model_are_summed_and_ratios_averaged() {
        let page = |n: u64| {
            format!(
                "vllm:generation_tokens_total{{engine=\"0\",model_name=\"a\"}} {n}\n\
                 vllm:generation_tokens_total{{engine=\"1\",model_name=\"a\"}} {n}\n\
                 vllm:request_success_total{{finished_reason=\"stop\",model_name=\"a\"}} {n}\n\
                 vllm:request_success_total{{finished_reason=\"length\",model_name=\"a\"}} 1\n\
                 vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"a\"}} 0.2\n\
                 vllm:kv_cache_usage_perc{{engine=\"1\",model_name=\"a\"}} 0.4\n\
                 vllm:num_requests_waiting{{engine=\"0\",model_name=\"a\"}} 2\n\
                 vllm:num_requests_waiting{{engine=\"1\",model_name=\"a\"}} 5\n\
                 vllm:num_requests_waiting{{model_name=\"b\"}} 1\n"
            )
        };
        let mut l = Llm::new(Preset::Vllm, "m");
        run(&mut l, &page(10), 0);
        let u = run(&mut l, &page(15), S);
        assert_eq!(u.lines.len(), 2);
        let a = &u.lines[0];
        assert!(a.key.contains("model=a"));
        // No e2e histogram: `requests` is the success counter's delta.
        close(field(a, "requests"), 5.0);
        close(field(a, "output_tokens"), 10.0);
        close(field(a, "kv_cache_usage"), 0.3);
        close(field(a, "requests_waiting"), 7.0);
        assert_eq!(fields(&u.lines[1]), [("requests_waiting".to_string(), 1.0)]);
    }

    fn llamacpp_page(prompt: u64, predicted: u64, predicted_s: f64) -> String {
        format!(
            "# TYPE llamacpp:prompt_tokens_total counter\n\
             llamacpp:prompt_tokens_total {prompt}\n\
             # TYPE llamacpp:prompt_seconds_total counter\n\
             llamacpp:prompt_seconds_total 3.5\n\
             # TYPE llamacpp:tokens_predicted_total counter\n\
             llamacpp:tokens_predicted_total {predicted}\n\
             # TYPE llamacpp:tokens_predicted_seconds_total counter\n\
             llamacpp:tokens_predicted_seconds_total {predicted_s}\n\
             # TYPE llamacpp:kv_cache_usage_ratio gauge\n\
             llamacpp:kv_cache_usage_ratio 0.125\n\
             # TYPE llamacpp:kv_cache_tokens gauge\n\
             llamacpp:kv_cache_tokens 512\n\
             # TYPE llamacpp:requests_processing gauge\n\
             llamacpp:requests_processing 2\n\
             # TYPE llamacpp:requests_deferred gauge\n\
             llamacpp:requests_deferred 1\n"
        )
    }

    #[test]
    fn llamacpp_counters_become_rates_and_its_decode_speed() {
        let mut l = Llm::new(Preset::Llamacpp, "qwen");
        let u = run(&mut l, &llamacpp_page(100, 50, 1.0), 0);
        assert_eq!(
            u.lines[0].key,
            "llm,model=qwen,role=server,scrape=v,server=llamacpp"
        );
        assert_eq!(u.lines[0].fields.len(), 4, "gauges only");
        let u = run(&mut l, &llamacpp_page(300, 250, 5.0), 4 * S);
        let want: Vec<(String, f64)> = [
            ("prompt_tokens", 200.0),
            ("prompt_tokens_per_s", 50.0),
            ("output_tokens", 200.0),
            ("output_tokens_per_s", 50.0),
            ("decode_tokens_per_s", 50.0),
            ("kv_cache_usage", 0.125),
            ("kv_cache_tokens", 512.0),
            ("requests_processing", 2.0),
            ("requests_deferred", 1.0),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
        assert_eq!(fields(&u.lines[0]), want);
        // No decode time in the interval: no decode speed.
        let u = run(&mut l, &llamacpp_page(300, 250, 5.0), 5 * S);
        assert_eq!(field(&u.lines[0], "decode_tokens_per_s"), None);
        // A restart: the new values are the interval.
        let u = run(&mut l, &llamacpp_page(40, 20, 0.5), 7 * S);
        close(field(&u.lines[0], "output_tokens"), 20.0);
        close(field(&u.lines[0], "prompt_tokens_per_s"), 20.0);
        close(field(&u.lines[0], "decode_tokens_per_s"), 40.0);
    }

    #[test]
    fn malformed_families_are_left_out_and_reported_the_rest_kept() {
        let no_inf = "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.1\"} 4\n";
        let not_cumulative = "vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"0.1\"} 4\n\
                              vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 2\n";
        let no_buckets = "vllm:request_queue_time_seconds_count{model_name=\"m\"} 2\n";
        let typed = "# TYPE vllm:num_requests_running histogram\n\
                     vllm:num_requests_running{model_name=\"m\"} 1\n";
        let bad_le = "vllm:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"x\"} 1\n\
                      vllm:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 1\n";
        let percent = "vllm:kv_cache_usage_perc{model_name=\"m\"} 42\n";
        let good = "vllm:num_requests_waiting{model_name=\"m\"} 4\n";
        let page = [
            no_inf,
            not_cumulative,
            no_buckets,
            typed,
            bad_le,
            percent,
            good,
        ]
        .concat();
        let mut l = Llm::new(Preset::Vllm, "m");
        let u = run(&mut l, &page, 0);
        assert_eq!(fields(&u.lines[0]), [("requests_waiting".to_string(), 4.0)]);
        let want = [
            "vllm:time_to_first_token_seconds (model \"m\"): no +Inf bucket",
            "vllm:inter_token_latency_seconds (model \"m\"): a bucket without a valid `le` (\"x\")",
            "vllm:e2e_request_latency_seconds (model \"m\"): the buckets are not cumulative",
            "vllm:request_queue_time_seconds (model \"m\"): no buckets",
            "vllm:kv_cache_usage_perc (model \"m\"): 42 is above 1",
            "vllm:num_requests_running (model \"m\"): declared Histogram, expected Gauge",
        ];
        assert_eq!(u.problems.len(), want.len(), "{:?}", u.problems);
        for (got, want) in u.problems.iter().zip(want) {
            assert!(got.starts_with(want), "{got} vs {want}");
            assert!(got.ends_with("left out of this interval"), "{got}");
        }
        // A page without any of the preset's families says so.
        let u = run(&mut l, "node_load1 0.5\n", S);
        assert!(u.lines.is_empty());
        assert!(
            u.problems[0].contains("none of the vllm metrics"),
            "{:?}",
            u.problems
        );
    }

    #[test]
    fn a_malformed_family_has_no_base_for_the_next_interval() {
        let mut l = Llm::new(Preset::Vllm, "m");
        run(&mut l, &vllm_page([1, 2, 3, 3], [0, 0, 2, 3], 100, 40), 0);
        let broken = vllm_page([1, 2, 3, 3], [0, 0, 2, 3], 150, 40).replace(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"llama\",le=\"+Inf\"} 3\n",
            "",
        );
        let u = run(&mut l, &broken, S);
        assert_eq!(u.problems.len(), 1, "{:?}", u.problems);
        let p = &u.lines[0];
        close(field(p, "output_tokens"), 50.0);
        assert_eq!(field(p, "ttft_p50_ms"), None);
        assert_eq!(field(p, "ttft_mean_ms"), None);
        // The next good page: no TTFT base yet, the rest goes on.
        let u = run(
            &mut l,
            &vllm_page([2, 4, 5, 5], [0, 0, 2, 4], 170, 40),
            2 * S,
        );
        assert_eq!(field(&u.lines[0], "ttft_p50_ms"), None);
        close(field(&u.lines[0], "output_tokens"), 20.0);
        close(field(&u.lines[0], "requests"), 1.0);
    }

    #[test]
    fn llamacpp_without_a_model_label_uses_the_configured_model_or_the_name() {
        let mut cfg = super::super::ScrapeConfig::new("edge-llm", "http://127.0.0.1:1/m");
        assert!(Llm::for_target(&cfg).is_none());
        cfg.preset = Some("llamacpp".into());
        let p = parse(&llamacpp_page(1, 1, 1.0), Format::Prometheus);
        let u = Llm::for_target(&cfg)
            .unwrap()
            .update(&p, 0, "edge-llm", &[]);
        assert!(
            u.lines[0].key.contains("model=edge-llm"),
            "{}",
            u.lines[0].key
        );
        cfg.model = Some("phi-3-mini".into());
        let u = Llm::for_target(&cfg)
            .unwrap()
            .update(&p, 0, "edge-llm", &[]);
        assert!(
            u.lines[0].key.contains("model=phi-3-mini"),
            "{}",
            u.lines[0].key
        );
    }
}
