//! The scrape input: reads the Prometheus endpoints already on the device (Triton's
//! `:8002/metrics`, node_exporter, DeepStream, vLLM, ...) every `interval` and submits
//! their samples like any collector, in the shape Telegraf's `prometheus` input writes with
//! `metric_version = 2` (`shape`), plus a `triton` point per model and version per interval
//! when the page carries Triton's `nv_inference_*` counters (`triton`), and with `preset =
//! "vllm"` or `"llamacpp"` an `llm` point per model per interval (`llm`).
//!
//! One task per `[[scrape]]` target, so a slow or dead target never delays another; each
//! awaits its own scrape before the next tick (at most one in flight per target; missed
//! ticks are skipped). The request (blocking `ureq`, gzip accepted, whole-request
//! `timeout`), the bounded body read (`max_body_bytes`, 10 MiB by default), the parse and
//! the shaping run on tokio's blocking pool, never on the async workers. A page is
//! submitted without waiting: when the ingest queue is full it is dropped and counted, so a
//! target never stalls ingest. Every outcome (up, last error, last duration, samples,
//! malformed lines) lands in `collectors.scrape` of `/api/v1/status` and in `/metrics`.
//!
//! It never follows a target's timestamps into the future beyond what the page says, never
//! retries a failed scrape before the next tick, never logs a repeating failure more than
//! once per change of error, and never sends the bearer token anywhere but its own URL.
//!
//! Layout: `config` (`[[scrape]]`), `parse` (the text formats; pure), `shape` (samples ->
//! points; pure), `triton` (counters -> per-interval latency; pure), `llm` (vLLM and
//! llama.cpp counters and histograms -> per-interval `llm` points; pure), `status`; this file
//! holds the IO shell.

pub(crate) mod config;
pub mod llm;
pub mod parse;
pub mod shape;
mod status;
pub mod triton;

use std::io::Read as _;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::model::Batch;
use crate::queue::IngestHandle;
use crate::stats::Stats;

pub use config::{glob_match, validate_all, ScrapeConfig, DEFAULT_MAX_BODY_BYTES, DEFAULT_TIMEOUT};
pub use status::{display_url, ScrapeStatus};

/// The `Accept` header: OpenMetrics preferred, Prometheus text accepted.
pub const ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
                          text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// Points per submitted batch: a large page goes in several, each small enough for the
/// queue.
pub const BATCH_POINTS: usize = 5_000;

/// Why a scrape failed. Every one is retried at the next tick.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// Connect, DNS, TLS, timeout or a broken transfer.
    #[error("request failed: {0}")]
    Transport(String),
    /// An HTTP status other than 200.
    #[error("HTTP status {0}")]
    Status(u16),
    /// The body passed `max_body_bytes`.
    #[error("body larger than max_body_bytes ({0} bytes)")]
    TooLarge(u64),
    /// Reading the body failed (timeout mid-body, connection reset).
    #[error("reading the body failed: {0}")]
    Body(String),
    /// Not UTF-8 text.
    #[error("the body is not UTF-8 text")]
    NotText,
}

/// A fetched page.
#[derive(Debug)]
pub struct Fetched {
    /// The body.
    pub body: String,
    /// Its format (from `Content-Type`).
    pub format: parse::Format,
}

/// One GET of the target, bounded in time (the agent's timeout) and size.
pub fn fetch(agent: &ureq::Agent, cfg: &ScrapeConfig) -> Result<Fetched, ScrapeError> {
    let mut req = agent.get(&cfg.url).set("Accept", ACCEPT);
    if !cfg.bearer_token.is_empty() {
        req = req.set(
            "Authorization",
            &format!("Bearer {}", cfg.bearer_token.expose()),
        );
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(code, _)) => return Err(ScrapeError::Status(code)),
        Err(ureq::Error::Transport(t)) => return Err(ScrapeError::Transport(t.to_string())),
    };
    let format = parse::Format::from_content_type(resp.header("content-type").unwrap_or(""));
    let mut buf = Vec::new();
    resp.into_reader()
        .take(cfg.max_body_bytes.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| ScrapeError::Body(e.to_string()))?;
    if buf.len() as u64 > cfg.max_body_bytes {
        return Err(ScrapeError::TooLarge(cfg.max_body_bytes));
    }
    let body = String::from_utf8(buf).map_err(|_| ScrapeError::NotText)?;
    Ok(Fetched { body, format })
}

/// What one scrape produced, for the status.
#[derive(Debug, Default)]
struct Outcome {
    bytes: u64,
    samples: u64,
    bad_lines: u64,
    first_bad: Option<String>,
    non_finite: u64,
    triton_points: u64,
    llm_points: u64,
    preset_problems: Vec<String>,
    batches: Vec<Batch>,
}

/// Fetch, parse and shape: the blocking part of a scrape.
fn scrape_once(
    agent: &ureq::Agent,
    cfg: &ScrapeConfig,
    triton: &mut triton::Triton,
    llm: Option<&mut llm::Llm>,
    now: i64,
) -> Result<Outcome, ScrapeError> {
    let page = fetch(agent, cfg)?;
    let parsed = parse::parse(&page.body, page.format);
    let shaped = shape::to_lines(&parsed, cfg, now);
    let mut lines = shaped.lines;
    let mut triton_points = 0;
    let extra: Vec<(&str, &str)> = cfg
        .tags
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if triton::Triton::applies(&parsed.samples) {
        let t = triton.update(&parsed.samples, now, &cfg.name, &extra);
        triton_points = t.len() as u64;
        lines.extend(t);
    }
    let (mut llm_points, mut preset_problems) = (0, Vec::new());
    if let Some(llm) = llm {
        let u = llm.update(&parsed, now, &cfg.name, &extra);
        llm_points = u.lines.len() as u64;
        preset_problems = u.problems;
        lines.extend(u.lines);
    }
    let mut batches = Vec::new();
    while !lines.is_empty() {
        let rest = lines.split_off(lines.len().min(BATCH_POINTS));
        batches.push(Batch {
            lines: std::mem::replace(&mut lines, rest),
        });
    }
    Ok(Outcome {
        bytes: page.body.len() as u64,
        samples: shaped.samples,
        bad_lines: parsed.bad_lines,
        first_bad: parsed.first_error,
        non_finite: shaped.non_finite,
        triton_points,
        llm_points,
        preset_problems,
        batches,
    })
}

/// Runs every target until `shutdown`.
pub async fn run(
    targets: Vec<ScrapeConfig>,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: Arc<ScrapeStatus>,
    shutdown: CancellationToken,
) {
    let tasks: Vec<_> = targets
        .into_iter()
        .enumerate()
        .map(|(i, cfg)| {
            tokio::spawn(run_target(
                i,
                cfg,
                handle.clone(),
                stats.clone(),
                status.clone(),
                shutdown.clone(),
            ))
        })
        .collect();
    drop(handle);
    for t in tasks {
        let _ = t.await;
    }
}

async fn run_target(
    i: usize,
    cfg: ScrapeConfig,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: Arc<ScrapeStatus>,
    shutdown: CancellationToken,
) {
    let agent = ureq::AgentBuilder::new()
        .timeout(cfg.timeout())
        .redirects(2)
        .build();
    let cfg = Arc::new(cfg);
    let mut ticker = crate::periodic::Ticker::new(cfg.interval.0);
    let mut triton = triton::Triton::default();
    let mut llm = llm::Llm::for_target(&cfg);
    let mut logged: Option<String> = None;
    let mut logged_preset: Option<String> = None;
    tracing::info!(target = %cfg.name, url = %display_url(&cfg.url), "scraping");
    while ticker.next(&shutdown).await.is_some() {
        let now = crate::now_ns();
        let started = Instant::now();
        let (a, c, mut t) = (agent.clone(), cfg.clone(), std::mem::take(&mut triton));
        let mut l = llm.take();
        let job = tokio::task::spawn_blocking(move || {
            let r = scrape_once(&a, &c, &mut t, l.as_mut(), now);
            (r, t, l)
        });
        // Cancelling this wait loses nothing but the page in flight (the thread ends
        // within `timeout`); it holds no producer handle.
        let joined = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            j = job => j,
        };
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        let result = match joined {
            Ok((r, t, l)) => {
                triton = t;
                llm = l;
                r
            }
            Err(e) => Err(ScrapeError::Transport(format!("scrape task failed: {e}"))),
        };
        match result {
            Ok(out) => {
                for b in out.batches {
                    crate::collect::submit(&handle, &stats, b, "scrape");
                }
                if logged.take().is_some() {
                    tracing::info!(target = %cfg.name, "scrape target is up again");
                }
                let problem = out.preset_problems.first().cloned();
                if problem.is_some() && problem != logged_preset {
                    tracing::warn!(target = %cfg.name, problem = problem.as_deref().unwrap_or(""),
                        more = out.preset_problems.len() - 1,
                        "preset metrics left out (logged once until it changes)");
                }
                logged_preset = problem;
                status.update(i, |s| {
                    s.up = true;
                    s.scrapes += 1;
                    s.last_scrape_ns = Some(now);
                    s.last_duration_ms = Some(elapsed_ms);
                    s.last_bytes = out.bytes;
                    s.samples = out.samples;
                    s.samples_total += out.samples;
                    s.bad_lines += out.bad_lines;
                    if out.first_bad.is_some() {
                        s.last_bad_line = out.first_bad;
                    }
                    s.non_finite += out.non_finite;
                    s.triton_points += out.triton_points;
                    s.llm_points += out.llm_points;
                    s.preset_errors += out.preset_problems.len() as u64;
                    if let Some(p) = out.preset_problems.last() {
                        s.last_preset_error = Some(p.clone());
                    }
                });
            }
            Err(e) => {
                let msg = e.to_string();
                if logged.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(target = %cfg.name, error = %msg, "scrape failed (logged once until it changes)");
                    logged = Some(msg.clone());
                }
                Stats::add(&stats.collector_errors, 1);
                status.update(i, |s| {
                    s.up = false;
                    s.scrapes += 1;
                    s.failures += 1;
                    s.last_scrape_ns = Some(now);
                    s.last_duration_ms = Some(elapsed_ms);
                    s.samples = 0;
                    s.last_error = Some(msg);
                    s.last_error_ns = Some(now);
                });
            }
        }
    }
}
