//! The tegrastats process: started in its own process group, its stdout read line by line
//! and submitted, its stderr logged (rate-limited), stopped with SIGTERM then SIGKILL, and
//! restarted after an exit, a closed output or a stall with one [`crate::backoff::Backoff`].
//! It runs nothing but the configured binary (and kill(1)); it never changes clocks or
//! power modes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::config::TegrastatsConfig;
use super::error::TegrastatsError;
use super::mapper::sample_to_lines;
use super::reader::{LineReader, RawLine};
use super::status::TegrastatsStatus;
use super::*;
use crate::backoff::{Backoff, Jitter, Spread};
use crate::model::Batch;
use crate::queue::IngestHandle;
use crate::stats::Stats;
use tegrastats_parser::ParseError;

/// Restart delays: [`BACKOFF_MIN`] doubling to [`BACKOFF_MAX`], up to a quarter taken off
/// at random, so restarts of many devices do not align.
pub const RESTART: Backoff =
    Backoff::new(BACKOFF_MIN, BACKOFF_MAX).with_spread(Spread::Shorten(0.25));

/// Restart delay after `failures` consecutive short runs: [`RESTART`] with `jitter` in 0..=1.
pub fn backoff_delay(failures: u32, jitter: f64) -> Duration {
    RESTART.delay(failures, jitter)
}

/// Keeps tegrastats' stderr from flooding the log: [`STDERR_LINES_PER_MINUTE`] lines per
/// minute pass, the rest are counted and reported when the next minute starts.
#[derive(Debug)]
pub struct StderrLimit {
    window_start: Instant,
    passed: u32,
    suppressed: u64,
}

impl StderrLimit {
    /// A limit whose first window starts at `now`.
    pub fn new(now: Instant) -> StderrLimit {
        StderrLimit {
            window_start: now,
            passed: 0,
            suppressed: 0,
        }
    }

    /// Whether a line seen at `now` may be logged, and how many lines were suppressed in
    /// the window that just ended (to report once), if one did.
    pub fn allow(&mut self, now: Instant) -> (bool, Option<u64>) {
        let mut ended = None;
        if now.saturating_duration_since(self.window_start) >= Duration::from_secs(60) {
            if self.suppressed > 0 {
                ended = Some(self.suppressed);
            }
            self.window_start = now;
            self.passed = 0;
            self.suppressed = 0;
        }
        if self.passed < STDERR_LINES_PER_MINUTE {
            self.passed += 1;
            (true, ended)
        } else {
            self.suppressed += 1;
            (false, ended)
        }
    }
}

/// How one run of tegrastats ended.
enum RunEnd {
    /// Shutdown was requested; the process is stopped.
    Shutdown,
    /// The process exited by itself.
    Exited(std::process::ExitStatus),
    /// It could not be started, or its exit could not be observed.
    Failed(TegrastatsError),
}

/// Handles one line of tegrastats' stdout.
fn on_stdout_line(
    line: RawLine,
    handle: &IngestHandle,
    stats: &Arc<Stats>,
    status: &TegrastatsStatus,
    jetson: &crate::collect::jetson::JetsonStatus,
) {
    let bytes = match line {
        RawLine::Line(b) => b,
        RawLine::TooLong => {
            Stats::add(&stats.collector_errors, 1);
            status.bad_lines(1);
            tracing::debug!(
                limit = MAX_LINE_LEN,
                "tegrastats printed an over-long line; skipped"
            );
            return;
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    match tegrastats_parser::parse_line(&text) {
        Ok(sample) => {
            let ts = crate::now_ns();
            status.sample(ts);
            let mut batch = Batch {
                lines: sample_to_lines(&sample, ts),
            };
            jetson.tag_batch(&mut batch);
            crate::collect::submit(handle, stats, batch, "tegrastats");
        }
        Err(ParseError::Empty) => {}
        Err(e) => {
            Stats::add(&stats.collector_errors, 1);
            status.bad_lines(1);
            tracing::debug!(error = %e, "unparseable tegrastats line");
        }
    }
}

/// Sends `sig` to the process group `pgid` with kill(1) (the agent has no libc binding).
#[cfg(unix)]
async fn signal_group(pgid: u32, sig: &str) -> bool {
    let status = tokio::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status();
    matches!(
        tokio::time::timeout(Duration::from_secs(1), status).await,
        Ok(Ok(s)) if s.success()
    )
}

/// Stops tegrastats: SIGTERM to its group, SIGKILL after [`TERM_GRACE`], then waits.
async fn stop(child: &mut tokio::process::Child) {
    let Some(pid) = child.id() else {
        // Already exited and reaped.
        return;
    };
    #[cfg(unix)]
    {
        if signal_group(pid, "TERM").await {
            if let Ok(status) = tokio::time::timeout(TERM_GRACE, child.wait()).await {
                tracing::info!(pid, status = ?status.ok(), "tegrastats stopped");
                return;
            }
            // Still running (not yet reaped): the group id cannot have been reused.
            signal_group(pid, "KILL").await;
        }
    }
    let _ = child.start_kill();
    match tokio::time::timeout(Duration::from_secs(1), child.wait()).await {
        Ok(status) => tracing::info!(pid, status = ?status.ok(), "tegrastats killed"),
        Err(_) => tracing::warn!(pid, "tegrastats did not exit after SIGKILL"),
    }
}

/// Starts tegrastats once and feeds its output until it exits or shutdown.
async fn run_once(
    cfg: &TegrastatsConfig,
    handle: &IngestHandle,
    stats: &Arc<Stats>,
    status: &TegrastatsStatus,
    jetson: &crate::collect::jetson::JetsonStatus,
    shutdown: &CancellationToken,
) -> RunEnd {
    let ms = cfg.interval.0.as_millis().clamp(1, u128::from(u32::MAX));
    let mut cmd = tokio::process::Command::new(&cfg.path);
    cmd.arg("--interval")
        .arg(ms.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    // Its own process group, so that stopping it stops anything it started too.
    #[cfg(unix)]
    cmd.process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(source) => {
            return RunEnd::Failed(TegrastatsError::Spawn {
                path: cfg.path.clone(),
                source,
            })
        }
    };
    tracing::info!(pid = child.id(), path = %cfg.path.display(), interval_ms = %ms, "tegrastats started");
    status.with(|i| {
        i.state = "running";
        i.detail = cfg.path.display().to_string();
        i.pid = child.id();
        i.starts += 1;
    });
    let stall_after = cfg.stall_after();
    // Any line on stdout counts as a sign of life; stderr alone does not.
    let mut last_output = tokio::time::Instant::now();
    let mut out = child
        .stdout
        .take()
        .map(|s| LineReader::new(tokio::io::BufReader::new(s), MAX_LINE_LEN));
    let mut err = child
        .stderr
        .take()
        .map(|s| LineReader::new(tokio::io::BufReader::new(s), 1024));
    let mut limit = StderrLimit::new(Instant::now());
    // Set when stdout ends: tegrastats must exit by then or it is stopped.
    let mut closed_deadline: Option<tokio::time::Instant> = None;
    loop {
        let out_live = out.as_ref().is_some_and(|r| !r.done);
        let err_live = err.as_ref().is_some_and(|r| !r.done);
        if !out_live && closed_deadline.is_none() {
            closed_deadline = Some(tokio::time::Instant::now() + CLOSED_OUTPUT_GRACE);
        }
        let deadline = closed_deadline.unwrap_or_else(tokio::time::Instant::now);
        let stall_at = last_output + stall_after;
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                stop(&mut child).await;
                return RunEnd::Shutdown;
            }
            line = async { out.as_mut()?.next_line().await.transpose() }, if out_live => {
                match line {
                    Some(Ok(l)) => {
                        last_output = tokio::time::Instant::now();
                        on_stdout_line(l, handle, stats, status, jetson);
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "reading tegrastats output failed"),
                    None => {}
                }
            }
            line = async { err.as_mut()?.next_line().await.transpose() }, if err_live => {
                if let Some(Ok(RawLine::Line(l))) = line {
                    let (log, suppressed) = limit.allow(Instant::now());
                    if let Some(n) = suppressed {
                        tracing::warn!(lines = n, "tegrastats stderr: lines not logged in the last minute");
                    }
                    if log {
                        tracing::warn!(stderr = %String::from_utf8_lossy(&l), "tegrastats stderr");
                    }
                }
            }
            exit = child.wait() => {
                // Lines it printed just before exiting may still be in the pipe.
                if let Some(o) = out.as_mut() {
                    let end = tokio::time::Instant::now() + Duration::from_millis(200);
                    while !o.done {
                        match tokio::time::timeout_at(end, o.next_line()).await {
                            Ok(Ok(Some(l))) => on_stdout_line(l, handle, stats, status, jetson),
                            _ => break,
                        }
                    }
                }
                return match exit {
                    Ok(s) => RunEnd::Exited(s),
                    Err(source) => RunEnd::Failed(TegrastatsError::Wait { source }),
                };
            }
            _ = tokio::time::sleep_until(deadline), if closed_deadline.is_some() => {
                stop(&mut child).await;
                return RunEnd::Failed(TegrastatsError::OutputClosed);
            }
            _ = tokio::time::sleep_until(stall_at), if out_live => {
                let silent = last_output.elapsed();
                stop(&mut child).await;
                status.with(|i| i.stalls += 1);
                return RunEnd::Failed(TegrastatsError::Stalled { silent });
            }
        }
    }
}

/// Runs tegrastats until shutdown, restarting it with backoff.
pub(super) async fn run_process(
    cfg: TegrastatsConfig,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: &TegrastatsStatus,
    jetson: &crate::collect::jetson::JetsonStatus,
    shutdown: CancellationToken,
) {
    let mut failures = 0u32;
    let mut jitter = Jitter::from_clock("tegrastats");
    loop {
        let started = Instant::now();
        let end = run_once(&cfg, &handle, &stats, status, jetson, &shutdown).await;
        if started.elapsed() >= HEALTHY_RUN {
            failures = 0;
        }
        let delay = backoff_delay(failures, jitter.sample());
        failures = failures.saturating_add(1);
        let delay_s = format!("{:.1}s", delay.as_secs_f64());
        let why = match end {
            RunEnd::Shutdown => {
                status.set("stopped", "agent shutdown");
                status.with(|i| i.pid = None);
                return;
            }
            RunEnd::Exited(code) => {
                tracing::warn!(status = %code, restart_in = %delay_s, "tegrastats exited; restarting");
                format!("tegrastats exited ({code}); restart in {delay_s}")
            }
            RunEnd::Failed(e) => {
                tracing::warn!(error = %e, restart_in = %delay_s, "tegrastats failed; restarting");
                format!("{e}; restart in {delay_s}")
            }
        };
        status.with(|i| {
            i.state = "restarting";
            i.detail = why;
            i.pid = None;
            i.restarts += 1;
        });
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}
