//! The Jetson collector: runs NVIDIA's `tegrastats --interval <ms>`, parses each line it
//! prints with the `tegrastats-parser` crate and submits the sample as `jetson_*` lines.
//! If tegrastats exits, cannot be started, closes its stdout without exiting (it is then
//! stopped after 2 s), or stays alive but prints nothing for `stall_timeout` (default 30 s,
//! at least 5 intervals; it is then stopped), it is restarted with exponential backoff (1 s doubling to 60 s, minus
//! up to 25 % jitter, back to 1 s after a run of a minute or more). Its stderr is logged at
//! warn (at most 10 lines a minute). On shutdown it gets SIGTERM, then SIGKILL after a
//! second, and is waited for; it runs in its own process group and both signals go to the
//! whole group, so nothing it started outlives a clean shutdown (if the agent itself is
//! killed with SIGKILL, tegrastats dies of SIGPIPE at its next line). With
//! `[tegrastats] replay = "FILE"` it instead reads a recorded tegrastats log, one line per
//! interval, looping (for demos, tests and hosts that are not Jetsons). With neither a
//! replay file nor a tegrastats binary at `path` it logs one line and stays off.
//!
//! It never changes clocks or power modes (no `--start`/`--stop` or other tegrastats
//! options), runs nothing but the configured binary (and kill(1) to stop it), never blocks
//! the async runtime (files are read on the blocking pool, the pipes asynchronously), and
//! never buffers more than one line of tegrastats output (lines over 64 KiB are skipped).
//!
//! **Timestamps** are the agent's clock when the line is read, not the timestamp tegrastats
//! prints (JetPack 5+): that one is local time without a time zone, has one-second
//! resolution (several lines share it below a 1 s interval) and is absent on older
//! releases. A replayed log is stamped the same way, so it looks live.
//!
//! Measurements (a contract once released; see the README). Every number is a float;
//! `online` and `on` are booleans. A field tegrastats did not print (it depends on the SoC,
//! the release and on running as root) is left out, and a line without fields is not sent.
//!
//! | measurement | tags | fields |
//! |---|---|---|
//! | `jetson_mem` | | `ram_used_mb`, `ram_total_mb`, `ram_used_pct`, `lfb_blocks`, `lfb_block_mb` (largest free block: count and size), `swap_used_mb`, `swap_total_mb`, `swap_cached_mb`, `iram_used_mb`, `iram_total_mb`, `iram_lfb_mb` |
//! | `jetson_cpu` | | `cores` (listed), `cores_online`, `load_pct` (mean over online cores), `mts_fg_pct`, `mts_bg_pct` (Denver/Carmel), `edp_limit_mhz` (TK1/TX1) |
//! | `jetson_cpu` | `core` (0-based) | `online`; when online also `load_pct`, `freq_mhz` |
//! | `jetson_emc` | | `load_pct`, `freq_mhz` |
//! | `jetson_gpu` | | `load_pct`, `freq_mhz` (with per-GPC clocks: the highest) |
//! | `jetson_gpu` | `gpc` (0-based) | `freq_mhz`, only when printed per GPC (`GR3D_FREQ 0%@[305,1300]`) |
//! | `jetson_engine` | `engine` | `on` (`false` when printed `off`, then nothing else), `load_pct`, `freq_mhz` |
//! | `jetson_engine` | `engine`, `unit` | `load_pct` per unit (`PVA0_FREQ [10%,5%]@1152`) |
//! | `jetson_temp` | `zone` | `temp_c`, `peak_c` (JetPack 7.2 `cpu@52.9C/53.1C`) |
//! | `jetson_power` | `rail` | `current_mw`, `average_mw` (since tegrastats started), `peak_mw` (JetPack 7.2) |
//!
//! Names: `engine` is the printed name without a trailing `_FREQ`/`_LOAD`, so JetPack 5's
//! `VIC_FREQ`, JetPack 6's `VIC` and DRIVE's `VIC_LOAD` are one series (`GR3D2_FREQ`, the
//! second GPC of JetPack 5.0 Orin, is engine `GR3D2`). `zone` is the printed zone name in
//! lower case (JetPack 5 prints `CPU@`, JetPack 6 `cpu@`). `rail` is the name as printed; a
//! rail printed twice in one line (`NC` on JetPack 5 Orin) is `NC#2` the second time.
//! Sensors that report "not available" (`CV0@-256C`) and the `PMIC@100C` placeholder (a
//! constant alarm threshold, not a reading) are not stored. Unknown tokens are ignored.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tegrastats_parser::{GpuFreq, ParseError, ReadError, Sample};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};
use tokio_util::sync::CancellationToken;

use crate::config::Interval;
use crate::model::{series_key, Batch, Line, Value};
use crate::queue::IngestHandle;
use crate::stats::Stats;

/// `[tegrastats]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TegrastatsConfig {
    /// Run the collector when `path` exists (or `replay` is set).
    pub enabled: bool,
    /// The tegrastats binary.
    pub path: PathBuf,
    /// Sampling interval passed as `--interval <ms>`.
    pub interval: Interval,
    /// A recorded tegrastats log to replay (looping) instead of running tegrastats.
    pub replay: Option<PathBuf>,
    /// Restart a tegrastats that is alive but has printed nothing for this long (at least
    /// [`STALL_INTERVALS`] sampling intervals are always allowed).
    pub stall_timeout: Interval,
}

impl Default for TegrastatsConfig {
    fn default() -> Self {
        TegrastatsConfig {
            enabled: true,
            path: PathBuf::from("/usr/bin/tegrastats"),
            interval: Interval(std::time::Duration::from_secs(1)),
            replay: None,
            stall_timeout: Interval(std::time::Duration::from_secs(30)),
        }
    }
}

impl TegrastatsConfig {
    /// How long tegrastats may stay silent before it is restarted: `stall_timeout`, but
    /// never under [`STALL_INTERVALS`] intervals (a slow interval is not a stall).
    pub fn stall_after(&self) -> Duration {
        self.stall_timeout
            .0
            .max(self.interval.0.saturating_mul(STALL_INTERVALS))
    }
}

/// Why the collector stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum TegrastatsError {
    /// The replay file could not be opened or read.
    #[error("cannot read tegrastats replay file {path}: {source}")]
    ReplayIo {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A whole pass over the replay file found no tegrastats line.
    #[error("tegrastats replay file {path} holds no tegrastats line")]
    ReplayEmpty {
        /// The file.
        path: PathBuf,
    },
    /// tegrastats closed its stdout but did not exit (it was stopped).
    #[error("tegrastats closed its output but kept running")]
    OutputClosed,
    /// tegrastats kept running but printed no line for too long (it was stopped).
    #[error("tegrastats printed nothing for {:.1}s (stall_timeout); stopped it", .silent.as_secs_f64())]
    Stalled {
        /// How long it had been silent.
        silent: Duration,
    },
    /// Waiting for tegrastats to exit failed.
    #[error("cannot wait for tegrastats: {source}")]
    Wait {
        /// The error.
        source: std::io::Error,
    },
    /// tegrastats could not be started.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The collector's state for `/api/v1/status` (`collectors.tegrastats`) and `/metrics`.
#[derive(Debug)]
pub struct TegrastatsStatus {
    inner: std::sync::Mutex<StatusInner>,
}

#[derive(Debug, Default)]
struct StatusInner {
    state: &'static str,
    detail: String,
    pid: Option<u32>,
    starts: u64,
    stalls: u64,
    restarts: u64,
    samples: u64,
    bad_lines: u64,
    last_sample_ns: Option<i64>,
}

impl Default for TegrastatsStatus {
    fn default() -> Self {
        TegrastatsStatus {
            inner: std::sync::Mutex::new(StatusInner {
                state: "not started",
                ..StatusInner::default()
            }),
        }
    }
}

impl TegrastatsStatus {
    fn with<R>(&self, f: impl FnOnce(&mut StatusInner) -> R) -> R {
        // Plain counters: a panic elsewhere while holding the lock leaves them usable.
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Sets the state (`off`, `running`, `replaying`, `restarting`, `stopped`) and its detail.
    fn set(&self, state: &'static str, detail: impl Into<String>) {
        let detail = detail.into();
        self.with(|i| {
            i.state = state;
            i.detail = detail;
        });
    }

    /// The state word.
    pub fn state(&self) -> &'static str {
        self.with(|i| i.state)
    }

    fn sample(&self, ts: i64) {
        self.with(|i| {
            i.samples += 1;
            i.last_sample_ns = Some(ts);
        });
    }

    fn bad_lines(&self, n: u64) {
        if n > 0 {
            self.with(|i| i.bad_lines += n);
        }
    }

    /// The JSON object of `/api/v1/status`; `now` (ns) dates the last sample.
    pub fn snapshot(&self, now: i64) -> serde_json::Value {
        self.with(|i| {
            serde_json::json!({
                "state": i.state,
                "detail": i.detail,
                "pid": i.pid,
                "starts": i.starts,
                "restarts": i.restarts,
                "stalls": i.stalls,
                "samples": i.samples,
                "bad_lines": i.bad_lines,
                "last_sample_age_s": i.last_sample_ns.map(|t| (now - t).max(0) as f64 / 1e9),
            })
        })
    }
}

/// A silent tegrastats is given at least this many sampling intervals before it counts as
/// stalled.
pub const STALL_INTERVALS: u32 = 5;

/// Longest line read from tegrastats or a replay file; real lines are below 2 KiB.
pub const MAX_LINE_LEN: usize = 64 * 1024;
/// First restart delay.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A run at least this long resets the restart delay to [`BACKOFF_MIN`].
pub const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// How long tegrastats gets to exit after SIGTERM before SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(1);
/// How long tegrastats may keep running after closing its stdout before it is stopped.
pub const CLOSED_OUTPUT_GRACE: Duration = Duration::from_secs(2);
/// Stderr lines logged per minute; the rest are counted and summarised.
pub const STDERR_LINES_PER_MINUTE: u32 = 10;

// ---------------------------------------------------------------------------------------
// Pure mapping: Sample -> lines.

/// Fields of one line under construction; numbers become floats.
#[derive(Default)]
struct Fields(Vec<(String, Value)>);

impl Fields {
    fn num<T: Into<f64>>(&mut self, name: &str, v: Option<T>) -> &mut Self {
        if let Some(v) = v {
            self.0.push((name.to_string(), Value::F64(v.into())));
        }
        self
    }

    fn flag(&mut self, name: &str, v: bool) -> &mut Self {
        self.0.push((name.to_string(), Value::Bool(v)));
        self
    }

    /// Appends a line with these fields to `out`, unless there are none.
    fn push_to(self, out: &mut Vec<Line>, key: String, ts: i64) {
        if !self.0.is_empty() {
            out.push(Line {
                key,
                fields: self.0,
                ts,
                line_no: 0,
            });
        }
    }
}

/// An engine merged over its printed spellings (`VIC`, `VIC_FREQ`, `VIC_LOAD`).
#[derive(Default)]
struct MergedEngine {
    on: bool,
    load_pct: Option<u32>,
    freq_mhz: Option<u32>,
    unit_loads_pct: Vec<u32>,
}

/// The `engine` tag for a printed engine name: without a trailing `_FREQ` or `_LOAD`.
pub fn engine_tag(printed: &str) -> &str {
    ["_FREQ", "_LOAD"]
        .iter()
        .find_map(|s| printed.strip_suffix(s).filter(|b| !b.is_empty()))
        .unwrap_or(printed)
}

/// Maps one parsed tegrastats sample to `jetson_*` lines stamped `ts` (Unix ns). Pure; see
/// the module documentation for the table.
pub fn sample_to_lines(sample: &Sample, ts: i64) -> Vec<Line> {
    let mut out = Vec::new();

    // jetson_mem
    let mut mem = Fields::default();
    if let Some(ram) = &sample.ram {
        mem.num("ram_used_mb", Some(ram.used_mb))
            .num("ram_total_mb", Some(ram.total_mb))
            .num(
                "ram_used_pct",
                (ram.total_mb > 0.0).then(|| ram.used_mb * 100.0 / ram.total_mb),
            )
            .num("lfb_blocks", ram.lfb_blocks)
            .num("lfb_block_mb", ram.lfb_block_mb);
    }
    if let Some(swap) = &sample.swap {
        mem.num("swap_used_mb", Some(swap.used_mb))
            .num("swap_total_mb", Some(swap.total_mb))
            .num("swap_cached_mb", swap.cached_mb);
    }
    if let Some(iram) = &sample.iram {
        mem.num("iram_used_mb", Some(iram.used_mb))
            .num("iram_total_mb", Some(iram.total_mb))
            .num("iram_lfb_mb", iram.lfb_mb);
    }
    mem.push_to(&mut out, "jetson_mem".into(), ts);

    // jetson_cpu (summary)
    let mut cpu = Fields::default();
    if !sample.cpus.is_empty() {
        let loads: Vec<f64> = sample
            .cpus
            .iter()
            .filter_map(|c| c.and_then(|c| c.load_pct))
            .map(f64::from)
            .collect();
        let mean = (!loads.is_empty()).then(|| loads.iter().sum::<f64>() / loads.len() as f64);
        cpu.num("cores", Some(sample.cpu_count() as f64))
            .num("cores_online", Some(sample.online_cpu_count() as f64))
            .num("load_pct", mean);
    }
    if let Some(mts) = &sample.mts {
        cpu.num("mts_fg_pct", Some(mts.fg_pct))
            .num("mts_bg_pct", Some(mts.bg_pct));
    }
    cpu.num("edp_limit_mhz", sample.edp_limit_mhz);
    cpu.push_to(&mut out, "jetson_cpu".into(), ts);

    // jetson_cpu,core=N
    for (n, core) in sample.cpus.iter().enumerate() {
        let mut f = Fields::default();
        match core {
            Some(c) => {
                f.flag("online", true)
                    .num("load_pct", c.load_pct)
                    .num("freq_mhz", c.freq_mhz);
            }
            None => {
                f.flag("online", false);
            }
        }
        f.push_to(
            &mut out,
            series_key("jetson_cpu", &[("core", &n.to_string())]),
            ts,
        );
    }

    // jetson_emc
    if let Some(emc) = &sample.emc {
        let mut f = Fields::default();
        f.num("load_pct", emc.load_pct)
            .num("freq_mhz", emc.freq_mhz);
        f.push_to(&mut out, "jetson_emc".into(), ts);
    }

    // jetson_gpu, jetson_gpu,gpc=N
    if let Some(gr3d) = &sample.gr3d {
        let mut f = Fields::default();
        f.num("load_pct", gr3d.load_pct)
            .num("freq_mhz", gr3d.freq_mhz.as_ref().and_then(GpuFreq::max));
        f.push_to(&mut out, "jetson_gpu".into(), ts);
        if let Some(GpuFreq::PerGpc(gpcs)) = &gr3d.freq_mhz {
            for (n, mhz) in gpcs.iter().enumerate() {
                let mut f = Fields::default();
                f.num("freq_mhz", Some(*mhz));
                f.push_to(
                    &mut out,
                    series_key("jetson_gpu", &[("gpc", &n.to_string())]),
                    ts,
                );
            }
        }
    }

    // jetson_engine,engine=NAME
    let mut engines: std::collections::BTreeMap<&str, MergedEngine> = Default::default();
    for (name, e) in &sample.engines {
        let m = engines.entry(engine_tag(name)).or_default();
        m.on |= !e.off;
        m.load_pct = m.load_pct.or(e.load_pct);
        m.freq_mhz = m.freq_mhz.or(e.freq_mhz);
        if m.unit_loads_pct.is_empty() {
            m.unit_loads_pct.clone_from(&e.unit_loads_pct);
        }
    }
    for (name, e) in &engines {
        let mut f = Fields::default();
        f.flag("on", e.on);
        if e.on {
            f.num("load_pct", e.load_pct).num("freq_mhz", e.freq_mhz);
        }
        f.push_to(
            &mut out,
            series_key("jetson_engine", &[("engine", *name)]),
            ts,
        );
        for (n, load) in e.unit_loads_pct.iter().enumerate() {
            let mut f = Fields::default();
            f.num("load_pct", Some(*load));
            f.push_to(
                &mut out,
                series_key(
                    "jetson_engine",
                    &[("engine", *name), ("unit", &n.to_string())],
                ),
                ts,
            );
        }
    }

    // jetson_temp,zone=name (lower case, unless two printed names differ only in case)
    let clashes = |name: &str| {
        sample
            .temps_c
            .keys()
            .filter(|k| k.eq_ignore_ascii_case(name))
            .count()
            > 1
    };
    for (name, temp) in sample.measured_temps() {
        let zone = if clashes(name) {
            name.to_string()
        } else {
            name.to_ascii_lowercase()
        };
        let mut f = Fields::default();
        f.num("temp_c", Some(temp))
            .num("peak_c", sample.temps_peak_c.get(name).copied());
        f.push_to(&mut out, series_key("jetson_temp", &[("zone", &zone)]), ts);
    }

    // jetson_power,rail=NAME
    for (name, rail) in &sample.power_mw {
        let mut f = Fields::default();
        f.num("current_mw", Some(rail.current))
            .num("average_mw", Some(rail.average))
            .num("peak_mw", rail.peak);
        f.push_to(
            &mut out,
            series_key("jetson_power", &[("rail", name.as_str())]),
            ts,
        );
    }
    out
}

// ---------------------------------------------------------------------------------------
// `edgewatch tegrastats parse`

/// `edgewatch tegrastats parse [FILE|-]`: one JSON object per input line on `out`, errors
/// naming the line on `err`. Returns false when any line failed.
///
/// Each object is `{"line": N, ...}` followed by the parser's JSON for the sample (see the
/// `tegrastats-parser` README: `timestamp`, `ram`, `swap`, `cpus`, `emc`, `gr3d`,
/// `engines`, `temps_c`, `power_mw`, `unknown`, and a few more keys). Blank lines are
/// skipped without output. A read error (not a parse error) ends the command with `Err`.
pub fn parse_command(
    input: Option<&Path>,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> std::io::Result<bool> {
    match input {
        Some(path) => {
            let file = std::fs::File::open(path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            parse_stream(std::io::BufReader::new(file), out, err)
        }
        None => parse_stream(std::io::stdin().lock(), out, err),
    }
}

fn parse_stream(
    input: impl std::io::BufRead,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> std::io::Result<bool> {
    let mut ok = true;
    let mut json = Vec::with_capacity(2048);
    for (n, result) in tegrastats_parser::Reader::new(input).max_line_len(MAX_LINE_LEN) {
        match result {
            Ok(sample) => {
                json.clear();
                serde_json::to_writer(&mut json, &sample).map_err(std::io::Error::other)?;
                // `{"timestamp":...}` -> `{"line":N,"timestamp":...}`
                let rest = json.strip_prefix(b"{").unwrap_or(&json);
                write!(out, "{{\"line\":{n}")?;
                if rest.first().is_some_and(|c| *c != b'}') {
                    out.write_all(b",")?;
                }
                out.write_all(rest)?;
                out.write_all(b"\n")?;
            }
            Err(ReadError::Io(e)) => return Err(e),
            Err(e) => {
                ok = false;
                writeln!(err, "line {n}: {e}")?;
            }
        }
    }
    Ok(ok)
}

// ---------------------------------------------------------------------------------------
// Replay

/// A recorded tegrastats log read one sample at a time, starting over at its end. Blocking
/// (plain file reads): call it from the blocking pool.
pub struct Replay {
    path: PathBuf,
    reader: Option<tegrastats_parser::Reader<std::io::BufReader<std::fs::File>>>,
    samples_this_pass: u64,
    passes: u64,
    bad_lines: u64,
}

impl Replay {
    /// Opens `path` (the open is repeated at each pass).
    pub fn open(path: &Path) -> Result<Replay, TegrastatsError> {
        let mut r = Replay {
            path: path.to_path_buf(),
            reader: None,
            samples_this_pass: 0,
            passes: 0,
            bad_lines: 0,
        };
        r.reopen()?;
        Ok(r)
    }

    fn reopen(&mut self) -> Result<(), TegrastatsError> {
        let file = std::fs::File::open(&self.path).map_err(|source| TegrastatsError::ReplayIo {
            path: self.path.clone(),
            source,
        })?;
        self.reader = Some(
            tegrastats_parser::Reader::new(std::io::BufReader::new(file))
                .max_line_len(MAX_LINE_LEN),
        );
        self.samples_this_pass = 0;
        Ok(())
    }

    /// The next sample, going back to the start of the file at its end. Fails when the file
    /// cannot be read or a whole pass over it found no sample.
    pub fn next_sample(&mut self) -> Result<Sample, TegrastatsError> {
        loop {
            let Some(reader) = self.reader.as_mut() else {
                self.reopen()?;
                continue;
            };
            match reader.next() {
                Some((_, Ok(sample))) => {
                    self.samples_this_pass += 1;
                    return Ok(sample);
                }
                Some((_, Err(ReadError::Io(source)))) => {
                    self.reader = None;
                    return Err(TegrastatsError::ReplayIo {
                        path: self.path.clone(),
                        source,
                    });
                }
                Some((n, Err(e))) => {
                    // Counted once, not at every pass: a recorded log does not get worse.
                    if self.passes == 0 {
                        self.bad_lines += 1;
                        tracing::debug!(line = n, error = %e, file = %self.path.display(), "replay: line skipped");
                    }
                }
                None => {
                    if self.samples_this_pass == 0 {
                        return Err(TegrastatsError::ReplayEmpty {
                            path: self.path.clone(),
                        });
                    }
                    self.passes += 1;
                    self.reader = None;
                }
            }
        }
    }

    /// Lines that did not parse on the first pass, since the last call.
    pub fn take_bad_lines(&mut self) -> u64 {
        std::mem::take(&mut self.bad_lines)
    }

    /// Completed passes over the file.
    pub fn passes(&self) -> u64 {
        self.passes
    }
}

async fn run_replay(
    path: PathBuf,
    interval: Duration,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: &TegrastatsStatus,
    shutdown: CancellationToken,
) {
    let opened = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || Replay::open(&path)).await
    };
    let mut replay = match opened {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "Jetson collector off");
            status.set("off", e.to_string());
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "tegrastats replay task failed; Jetson collector off");
            status.set("off", format!("replay task failed: {e}"));
            return;
        }
    };
    tracing::info!(file = %path.display(), ?interval, "tegrastats collector replaying a log");
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                status.set("stopped", "agent shutdown");
                break;
            }
            _ = tick.tick() => {}
        }
        let next = tokio::task::spawn_blocking(move || {
            let r = replay.next_sample();
            (replay, r)
        })
        .await;
        let sample = match next {
            Ok((r, res)) => {
                replay = r;
                let bad = replay.take_bad_lines();
                Stats::add(&stats.collector_errors, bad);
                status.bad_lines(bad);
                res
            }
            Err(e) => {
                tracing::error!(error = %e, "tegrastats replay task failed; Jetson collector off");
                status.set("off", format!("replay task failed: {e}"));
                return;
            }
        };
        match sample {
            Ok(s) => {
                let ts = crate::now_ns();
                status.sample(ts);
                let batch = Batch {
                    lines: sample_to_lines(&s, ts),
                };
                super::submit(&handle, &stats, batch, "tegrastats");
            }
            Err(e) => {
                tracing::error!(error = %e, "Jetson collector off");
                status.set("off", e.to_string());
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The tegrastats process

/// Restart delay after `failures` consecutive short runs: 1 s doubling to 60 s, times
/// `1 - jitter / 4` (`jitter` in 0..=1), so restarts of many devices do not align.
pub fn backoff_delay(failures: u32, jitter: f64) -> Duration {
    let base = BACKOFF_MIN
        .saturating_mul(1u32 << failures.min(16))
        .min(BACKOFF_MAX);
    base.mul_f64(1.0 - jitter.clamp(0.0, 1.0) / 4.0)
}

/// A pseudo-random number in 0..1 from the clock; good enough for jitter.
fn jitter() -> f64 {
    let ns = crate::now_ns().unsigned_abs();
    // Scramble so that consecutive calls differ by more than their time difference.
    let x = ns.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 11) as f64 / (1u64 << 53) as f64
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

/// One line from a pipe.
#[derive(Debug, PartialEq, Eq)]
pub enum RawLine {
    /// A line, without its terminator (`\n` or `\r\n`).
    Line(Vec<u8>),
    /// A line longer than the limit; skipped without buffering it.
    TooLong,
}

/// Reads lines of at most `max` bytes from an async reader. Cancel-safe: progress is kept
/// in the struct, so `next_line` can be a `select!` branch.
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    max: usize,
    skipping: bool,
    /// End of input (or a read error) was seen.
    pub done: bool,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    /// Wraps a buffered reader.
    pub fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::new(),
            max,
            skipping: false,
            done: false,
        }
    }

    /// The next line; `None` at the end of input.
    pub async fn next_line(&mut self) -> std::io::Result<Option<RawLine>> {
        loop {
            let chunk = match self.inner.fill_buf().await {
                Ok(c) => c,
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            };
            if chunk.is_empty() {
                self.done = true;
                if std::mem::take(&mut self.skipping) {
                    self.buf.clear();
                    return Ok(Some(RawLine::TooLong));
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(self.finish()));
            }
            let (take, newline) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (i, true),
                None => (chunk.len(), false),
            };
            if !self.skipping {
                if self.buf.len() + take > self.max {
                    self.skipping = true;
                    self.buf.clear();
                } else {
                    self.buf
                        .extend_from_slice(chunk.get(..take).unwrap_or_default());
                }
            }
            self.inner.consume(take + usize::from(newline));
            if newline {
                if std::mem::take(&mut self.skipping) {
                    return Ok(Some(RawLine::TooLong));
                }
                return Ok(Some(self.finish()));
            }
        }
    }

    fn finish(&mut self) -> RawLine {
        let mut line = std::mem::take(&mut self.buf);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        RawLine::Line(line)
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
            let batch = Batch {
                lines: sample_to_lines(&sample, ts),
            };
            super::submit(handle, stats, batch, "tegrastats");
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
                        on_stdout_line(l, handle, stats, status);
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
                            Ok(Ok(Some(l))) => on_stdout_line(l, handle, stats, status),
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
async fn run_process(
    cfg: TegrastatsConfig,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: &TegrastatsStatus,
    shutdown: CancellationToken,
) {
    let mut failures = 0u32;
    loop {
        let started = Instant::now();
        let end = run_once(&cfg, &handle, &stats, status, &shutdown).await;
        if started.elapsed() >= HEALTHY_RUN {
            failures = 0;
        }
        let delay = backoff_delay(failures, jitter());
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

/// Runs until `shutdown`, keeping `status` current.
pub async fn run(
    cfg: TegrastatsConfig,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: Arc<TegrastatsStatus>,
    shutdown: CancellationToken,
) {
    if !cfg.enabled {
        status.set("off", "disabled in the configuration");
        return;
    }
    if let Some(file) = cfg.replay.clone() {
        status.set("replaying", file.display().to_string());
        run_replay(file, cfg.interval.0, handle, stats, &status, shutdown).await;
        return;
    }
    if !tokio::fs::try_exists(&cfg.path).await.unwrap_or(false) {
        tracing::info!(
            "tegrastats not found at {}; Jetson collector off",
            cfg.path.display()
        );
        status.set(
            "off",
            format!("tegrastats not found at {}", cfg.path.display()),
        );
        return;
    }
    run_process(cfg, handle, stats, &status, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIN_JP6: &str = "05-09-2026 18:42:07 RAM 18202/62841MB (lfb 466x4MB) SWAP 86/31420MB (cached 0MB) CPU [16%@1949,6%@1761,4%@1222,4%@2201,4%@1036,33%@1036,0%@1036,40%@1036,3%@1190,46%@1190,6%@1190,2%@1190] EMC_FREQ 3%@2133 GR3D_FREQ 0%@[0,0] NVENC 78%@166 NVDEC off NVJPG off NVJPG1 off VIC 32%@115 OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off APE 174 cpu@52.343C soc2@48.343C soc0@49.062C tj@52.343C soc1@49.531C VDD_GPU_SOC 2412mW/2412mW VDD_CPU_CV 1607mW/1607mW VIN_SYS_5V0 4607mW/4657mW";
    const XAVIER_JP4: &str = "RAM 1736/15827MB (lfb 3283x4MB) CPU [1%@1160,2%@1161,0%@1189,0%@1189,off,off,off,off] EMC_FREQ 0%@665 GR3D_FREQ 0%@114 APE 150 MTS fg 0% bg 0% AO@29C GPU@30C iwlwifi@34C Tboard@30C Tdiode@33C AUX@29C CPU@30C thermal@29.45C PMIC@100C GPU 466/466 CPU 466/466 SOC 932/932 CV 0/0 VDDRQ 0/0 SYS5V 1854/1854";
    const TX1_LEGACY: &str = "RAM 1104/3995MB (lfb 425x4MB) cpu [2%,5%,8%,11%]@1734 EMC 0%@1600 AVP 1%@115 NVDEC 192 MSENC 192 GR3D 0%@998 EDP limit 1734";
    const THOR: &str = "05-17-2026 10:00:33 RAM 4280/125773MB (lfb 29x4MB) SWAP 0/2048MB (cached 0MB) CPU [0%@972,0%@972,0%@972,0%@972,1%@972,0%@972,1%@972,0%@972,0%@2601,17%@2601,1%@972,9%@972,0%@972,1%@972] EMC_FREQ 0%@665 GR3D_FREQ @[0,0,0] NVENC0_FREQ @0 NVENC1_FREQ @0 NVDEC0_FREQ @0 NVDEC1_FREQ @0 NVJPG0_FREQ @0 VIC off OFA_FREQ @0 PVA0_FREQ off APE 300 cpu@35.25C tj@36.031C soc012@36.062C soc345@34.5C VDD_GPU 0mW/0mW VDD_CPU_SOC_MSS 4923mW/4544mW VIN_SYS_5V0 4327mW/4227mW";
    const ORIN_JP5: &str = "10-16-2023 10:59:22 RAM 1205/30623MB (lfb 6429x4MB) SWAP 0/15311MB (cached 0MB) CPU [0%@729,0%@729,1%@729,0%@729,0%@729,0%@730,0%@730,0%@729,0%@729,0%@729,0%@729,0%@729] EMC_FREQ 0%@204 GR3D_FREQ 0%@114 GR3D2_FREQ 0%@114 NVJPG1 729 VIC_FREQ 729 APE 233 CV0@-256C CPU@43.5C Tdiode@32.5C SOC2@40.062C SOC0@40.5C CV1@-256C GPU@38.156C SOC1@39.125C CV2@-256C VDD_GPU_SOC 4788mW/4788mW VDD_CPU_CV 798mW/798mW VIN_SYS_5V0 3842mW/3842mW NC 0mW/0mW VDDQ_VDD2_1V8AO 707mW/707mW NC 0mW/0mW";
    const ORIN_JP72: &str = "07-25-2026 09:08:28 RAM 20642/62817MB (lfb 1x2MB) CPU [23%@2201,10%@2201,4%@2201,14%@2201,30%@2201,18%@2201,10%@2201,10%@2201,33%@2201,7%@2201,5%@2201,27%@2201] EMC_FREQ 3%@3199 GR3D_FREQ 12%@[1300,1300] NVENC0 off NVDEC0 off NVJPG0 off NVJPG1 off VIC off OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off APE 174 cpu@52.968C/52.968C soc2@48.406C/48.406C soc0@49.531C/49.531C gpu@47.625C/47.625C VDD_GPU_SOC 5139mW/5139mW/5139mW VDD_CPU_CV 3268mW/3268mW/3268mW VIN_SYS_5V0 5500mW/5500mW/5500mW";
    const NANO_JP4: &str = "RAM 1180/3965MB (lfb 1x2MB) SWAP 149/1024MB (cached 7MB) IRAM 0/252kB(lfb 252kB) CPU [30%@1036,33%@1036,28%@1036,26%@1036] EMC_FREQ 10%@1600 GR3D_FREQ 0%@76 NVENC 716 NVDEC 716 APE 25 PLL@57C CPU@60.5C PMIC@100C GPU@59C AO@65C thermal@59.75C POM_5V_IN 4520/4680 POM_5V_GPU 0/0 POM_5V_CPU 1078/1205";
    const DRIVE: &str = "06-07-2023 14:39:03 RAM 18220/24402MB (lfb 872x4MB) CPU [48%@2009,29%@2009] EMC_FREQ @3199 GR3D_FREQ 99%@1274 GR3D2_FREQ 99%@1274 NVENC_LOAD 7% NVDEC_LOAD 0% VIC_LOAD 0% NVDLA0_LOAD 0% APE 81 CPU@74.343C";

    fn lines(text: &str) -> Vec<Line> {
        let s = tegrastats_parser::parse_line(text).expect("fixture parses");
        sample_to_lines(&s, 42)
    }

    fn find<'a>(lines: &'a [Line], key: &str) -> &'a Line {
        lines
            .iter()
            .find(|l| l.key == key)
            .unwrap_or_else(|| panic!("no line {key}"))
    }

    fn f(fields: &[(&str, f64)]) -> Vec<(String, Value)> {
        fields
            .iter()
            .map(|(k, v)| (k.to_string(), Value::F64(*v)))
            .collect()
    }

    fn keys(lines: &[Line]) -> Vec<&str> {
        lines.iter().map(|l| l.key.as_str()).collect()
    }

    #[test]
    fn orin_jetpack6_maps_to_every_measurement() {
        let l = lines(ORIN_JP6);
        assert!(l.iter().all(|l| l.ts == 42 && l.line_no == 0));
        assert_eq!(
            find(&l, "jetson_mem").fields,
            f(&[
                ("ram_used_mb", 18202.0),
                ("ram_total_mb", 62841.0),
                ("ram_used_pct", 18202.0 * 100.0 / 62841.0),
                ("lfb_blocks", 466.0),
                ("lfb_block_mb", 4.0),
                ("swap_used_mb", 86.0),
                ("swap_total_mb", 31420.0),
                ("swap_cached_mb", 0.0),
            ])
        );
        assert_eq!(
            find(&l, "jetson_cpu").fields,
            f(&[
                ("cores", 12.0),
                ("cores_online", 12.0),
                ("load_pct", 164.0 / 12.0)
            ])
        );
        let mut core3 = vec![("online".to_string(), Value::Bool(true))];
        core3.extend(f(&[("load_pct", 4.0), ("freq_mhz", 2201.0)]));
        assert_eq!(find(&l, "jetson_cpu,core=3").fields, core3);
        assert_eq!(
            find(&l, "jetson_emc").fields,
            f(&[("load_pct", 3.0), ("freq_mhz", 2133.0)])
        );
        assert_eq!(
            find(&l, "jetson_gpu").fields,
            f(&[("load_pct", 0.0), ("freq_mhz", 0.0)])
        );
        assert_eq!(find(&l, "jetson_gpu,gpc=1").fields, f(&[("freq_mhz", 0.0)]));
        let mut nvenc = vec![("on".to_string(), Value::Bool(true))];
        nvenc.extend(f(&[("load_pct", 78.0), ("freq_mhz", 166.0)]));
        assert_eq!(find(&l, "jetson_engine,engine=NVENC").fields, nvenc);
        assert_eq!(
            find(&l, "jetson_engine,engine=NVDEC").fields,
            vec![("on".to_string(), Value::Bool(false))]
        );
        // PVA0_FREQ off -> engine PVA0
        assert_eq!(
            find(&l, "jetson_engine,engine=PVA0").fields,
            vec![("on".to_string(), Value::Bool(false))]
        );
        assert_eq!(
            find(&l, "jetson_temp,zone=tj").fields,
            f(&[("temp_c", 52.343)])
        );
        assert_eq!(
            find(&l, "jetson_power,rail=VIN_SYS_5V0").fields,
            f(&[("current_mw", 4607.0), ("average_mw", 4657.0)])
        );
        assert_eq!(
            keys(&l)
                .iter()
                .filter(|k| k.starts_with("jetson_cpu,"))
                .count(),
            12
        );
        assert_eq!(
            keys(&l)
                .iter()
                .filter(|k| k.starts_with("jetson_temp,"))
                .count(),
            5
        );
        assert_eq!(
            keys(&l)
                .iter()
                .filter(|k| k.starts_with("jetson_engine,"))
                .count(),
            10
        );
    }

    #[test]
    fn xavier_offline_cores_mts_and_pmic_placeholder() {
        let l = lines(XAVIER_JP4);
        assert_eq!(find(&l, "jetson_mem").fields.len(), 5);
        assert_eq!(
            find(&l, "jetson_cpu").fields,
            f(&[
                ("cores", 8.0),
                ("cores_online", 4.0),
                ("load_pct", 0.75),
                ("mts_fg_pct", 0.0),
                ("mts_bg_pct", 0.0),
            ])
        );
        assert_eq!(
            find(&l, "jetson_cpu,core=4").fields,
            vec![("online".to_string(), Value::Bool(false))]
        );
        assert!(!keys(&l).iter().any(|k| k.contains("gpc=")));
        assert_eq!(
            find(&l, "jetson_gpu").fields,
            f(&[("load_pct", 0.0), ("freq_mhz", 114.0)])
        );
        // Upper-case zones are lower-cased; PMIC@100C is a placeholder.
        assert_eq!(
            find(&l, "jetson_temp,zone=gpu").fields,
            f(&[("temp_c", 30.0)])
        );
        assert_eq!(
            find(&l, "jetson_temp,zone=thermal").fields,
            f(&[("temp_c", 29.45)])
        );
        assert!(!keys(&l)
            .iter()
            .any(|k| k.contains("pmic") || k.contains("PMIC")));
        // Rails share names with temperature zones without clashing.
        assert_eq!(
            find(&l, "jetson_power,rail=GPU").fields,
            f(&[("current_mw", 466.0), ("average_mw", 466.0)])
        );
        assert_eq!(
            find(&l, "jetson_engine,engine=APE").fields,
            vec![
                ("on".to_string(), Value::Bool(true)),
                ("freq_mhz".to_string(), Value::F64(150.0))
            ]
        );
    }

    #[test]
    fn tx1_legacy_format() {
        let l = lines(TX1_LEGACY);
        assert_eq!(
            keys(&l),
            vec![
                "jetson_mem",
                "jetson_cpu",
                "jetson_cpu,core=0",
                "jetson_cpu,core=1",
                "jetson_cpu,core=2",
                "jetson_cpu,core=3",
                "jetson_emc",
                "jetson_gpu",
                "jetson_engine,engine=AVP",
                "jetson_engine,engine=MSENC",
                "jetson_engine,engine=NVDEC",
            ]
        );
        assert_eq!(
            find(&l, "jetson_mem").fields,
            f(&[
                ("ram_used_mb", 1104.0),
                ("ram_total_mb", 3995.0),
                ("ram_used_pct", 1104.0 * 100.0 / 3995.0),
                ("lfb_blocks", 425.0),
                ("lfb_block_mb", 4.0),
            ])
        );
        assert_eq!(
            find(&l, "jetson_cpu").fields,
            f(&[
                ("cores", 4.0),
                ("cores_online", 4.0),
                ("load_pct", 6.5),
                ("edp_limit_mhz", 1734.0),
            ])
        );
        let mut core2 = vec![("online".to_string(), Value::Bool(true))];
        core2.extend(f(&[("load_pct", 8.0), ("freq_mhz", 1734.0)]));
        assert_eq!(find(&l, "jetson_cpu,core=2").fields, core2);
        assert_eq!(
            find(&l, "jetson_emc").fields,
            f(&[("load_pct", 0.0), ("freq_mhz", 1600.0)])
        );
        assert_eq!(
            find(&l, "jetson_gpu").fields,
            f(&[("load_pct", 0.0), ("freq_mhz", 998.0)])
        );
        let mut avp = vec![("on".to_string(), Value::Bool(true))];
        avp.extend(f(&[("load_pct", 1.0), ("freq_mhz", 115.0)]));
        assert_eq!(find(&l, "jetson_engine,engine=AVP").fields, avp);
    }

    #[test]
    fn thor_per_gpc_clocks_without_load_and_freq_engines() {
        let l = lines(THOR);
        assert_eq!(find(&l, "jetson_gpu").fields, f(&[("freq_mhz", 0.0)]));
        for n in 0..3 {
            assert_eq!(
                find(&l, &format!("jetson_gpu,gpc={n}")).fields,
                f(&[("freq_mhz", 0.0)])
            );
        }
        assert!(!keys(&l).contains(&"jetson_gpu,gpc=3"));
        let mut nvenc1 = vec![("on".to_string(), Value::Bool(true))];
        nvenc1.extend(f(&[("freq_mhz", 0.0)]));
        assert_eq!(find(&l, "jetson_engine,engine=NVENC1").fields, nvenc1);
        let mut ofa = vec![("on".to_string(), Value::Bool(true))];
        ofa.extend(f(&[("freq_mhz", 0.0)]));
        assert_eq!(find(&l, "jetson_engine,engine=OFA").fields, ofa);
        assert_eq!(
            find(&l, "jetson_cpu").fields,
            f(&[
                ("cores", 14.0),
                ("cores_online", 14.0),
                ("load_pct", 30.0 / 14.0)
            ])
        );
        assert_eq!(
            find(&l, "jetson_cpu,core=9").fields.get(2),
            Some(&("freq_mhz".to_string(), Value::F64(2601.0)))
        );
        assert_eq!(
            find(&l, "jetson_temp,zone=soc012").fields,
            f(&[("temp_c", 36.062)])
        );
        assert_eq!(
            find(&l, "jetson_power,rail=VDD_CPU_SOC_MSS").fields,
            f(&[("current_mw", 4923.0), ("average_mw", 4544.0)])
        );
    }

    #[test]
    fn jetpack5_orin_skips_sentinels_and_numbers_repeated_rails() {
        let l = lines(ORIN_JP5);
        assert!(!keys(&l)
            .iter()
            .any(|k| k.to_ascii_lowercase().starts_with("jetson_temp,zone=cv")));
        assert_eq!(
            find(&l, "jetson_temp,zone=cpu").fields,
            f(&[("temp_c", 43.5)])
        );
        assert_eq!(
            find(&l, "jetson_power,rail=NC#2").fields,
            f(&[("current_mw", 0.0), ("average_mw", 0.0)])
        );
        let mut gr3d2 = vec![("on".to_string(), Value::Bool(true))];
        gr3d2.extend(f(&[("load_pct", 0.0), ("freq_mhz", 114.0)]));
        assert_eq!(find(&l, "jetson_engine,engine=GR3D2").fields, gr3d2);
        let mut vic = vec![("on".to_string(), Value::Bool(true))];
        vic.extend(f(&[("freq_mhz", 729.0)]));
        assert_eq!(find(&l, "jetson_engine,engine=VIC").fields, vic);
    }

    #[test]
    fn jetpack72_peaks() {
        let l = lines(ORIN_JP72);
        assert_eq!(
            find(&l, "jetson_temp,zone=gpu").fields,
            f(&[("temp_c", 47.625), ("peak_c", 47.625)])
        );
        assert_eq!(
            find(&l, "jetson_power,rail=VDD_CPU_CV").fields,
            f(&[
                ("current_mw", 3268.0),
                ("average_mw", 3268.0),
                ("peak_mw", 3268.0)
            ])
        );
        assert_eq!(
            find(&l, "jetson_gpu").fields,
            f(&[("load_pct", 12.0), ("freq_mhz", 1300.0)])
        );
        assert_eq!(find(&l, "jetson_mem").fields.len(), 5);
    }

    #[test]
    fn nano_iram_and_drive_load_engines() {
        let l = lines(NANO_JP4);
        let mem = &find(&l, "jetson_mem").fields;
        assert_eq!(
            mem.get(5..).map(<[_]>::to_vec),
            Some(f(&[
                ("swap_used_mb", 149.0),
                ("swap_total_mb", 1024.0),
                ("swap_cached_mb", 7.0),
                ("iram_used_mb", 0.0),
                ("iram_total_mb", 252.0 / 1024.0),
                ("iram_lfb_mb", 252.0 / 1024.0),
            ]))
        );
        let l = lines(DRIVE);
        let mut nvenc = vec![("on".to_string(), Value::Bool(true))];
        nvenc.extend(f(&[("load_pct", 7.0)]));
        assert_eq!(find(&l, "jetson_engine,engine=NVENC").fields, nvenc);
        assert_eq!(find(&l, "jetson_emc").fields, f(&[("freq_mhz", 3199.0)]));
    }

    #[test]
    fn engines_merge_their_spellings_and_unit_loads() {
        assert_eq!(engine_tag("VIC_FREQ"), "VIC");
        assert_eq!(engine_tag("NVDLA0_LOAD"), "NVDLA0");
        assert_eq!(engine_tag("_FREQ"), "_FREQ");
        assert_eq!(engine_tag("APE"), "APE");
        let l = lines("RAM 1/2MB VIC_FREQ 115 VIC_LOAD 9% PVA0_FREQ [10%,5%]@1152");
        let mut vic = vec![("on".to_string(), Value::Bool(true))];
        vic.extend(f(&[("load_pct", 9.0), ("freq_mhz", 115.0)]));
        assert_eq!(find(&l, "jetson_engine,engine=VIC").fields, vic);
        assert_eq!(
            find(&l, "jetson_engine,engine=PVA0,unit=1").fields,
            f(&[("load_pct", 5.0)])
        );
    }

    #[test]
    fn zone_names_that_collide_in_lower_case_stay_apart() {
        let l = lines("RAM 1/2MB CPU@40C cpu@41C");
        let zones: Vec<&str> = keys(&l)
            .into_iter()
            .filter(|k| k.starts_with("jetson_temp"))
            .collect();
        assert_eq!(zones, vec!["jetson_temp,zone=CPU", "jetson_temp,zone=cpu"]);
    }

    #[test]
    fn every_fixture_line_maps_without_empty_lines() {
        for text in [
            ORIN_JP6, XAVIER_JP4, TX1_LEGACY, THOR, ORIN_JP5, ORIN_JP72, NANO_JP4, DRIVE,
        ] {
            let l = lines(text);
            assert!(l.iter().all(|l| !l.fields.is_empty()), "{text}");
            let mut k = keys(&l);
            let n = k.len();
            k.sort();
            k.dedup();
            assert_eq!(k.len(), n, "duplicate series in {text}");
        }
    }

    #[test]
    fn parse_command_prints_line_numbers_and_errors() {
        let input = format!("{TX1_LEGACY}\n\nnot tegrastats at all\n{NANO_JP4}\n");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let ok = parse_stream(input.as_bytes(), &mut out, &mut err).unwrap();
        assert!(!ok);
        let out = String::from_utf8(out).unwrap();
        let rows: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 2);
        assert!(out.starts_with("{\"line\":1,\"timestamp\":null,"));
        assert_eq!(rows[0]["cpus"][3]["freq_mhz"], 1734);
        assert_eq!(rows[1]["line"], 4);
        assert_eq!(rows[1]["ram"]["used_mb"], 1180.0);
        assert_eq!(
            String::from_utf8(err).unwrap(),
            "line 3: no tegrastats field found in line starting with \"not\"\n"
        );
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert!(parse_stream(&b""[..], &mut out, &mut err).unwrap());
        assert!(out.is_empty() && err.is_empty());
    }

    #[test]
    fn replay_loops_and_counts_bad_lines_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(
            &path,
            format!("{TX1_LEGACY}\nThu Dec 17 18:16:50 UTC 2020\n{NANO_JP4}\n"),
        )
        .unwrap();
        let mut r = Replay::open(&path).unwrap();
        let used: Vec<f64> = (0..5)
            .map(|_| r.next_sample().unwrap().ram.unwrap().used_mb)
            .collect();
        assert_eq!(used, vec![1104.0, 1180.0, 1104.0, 1180.0, 1104.0]);
        assert_eq!(r.passes(), 2);
        assert_eq!(r.take_bad_lines(), 1);
        assert_eq!(r.take_bad_lines(), 0);
    }

    #[test]
    fn replay_of_nothing_usable_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "hello\n\nworld\n").unwrap();
        let mut r = Replay::open(&path).unwrap();
        assert!(matches!(
            r.next_sample(),
            Err(TegrastatsError::ReplayEmpty { .. })
        ));
        assert_eq!(r.take_bad_lines(), 2);
        assert!(matches!(
            Replay::open(&dir.path().join("missing")),
            Err(TegrastatsError::ReplayIo { .. })
        ));
        // A file emptied between passes ends the replay instead of spinning.
        std::fs::write(&path, format!("{TX1_LEGACY}\n")).unwrap();
        let mut r = Replay::open(&path).unwrap();
        assert!(r.next_sample().is_ok());
        std::fs::write(&path, "").unwrap();
        assert!(matches!(
            r.next_sample(),
            Err(TegrastatsError::ReplayEmpty { .. })
        ));
    }

    #[test]
    fn stall_timeout_is_never_under_five_intervals() {
        let mut cfg = TegrastatsConfig::default();
        assert_eq!(cfg.stall_after(), Duration::from_secs(30));
        cfg.interval = Interval(Duration::from_secs(10));
        assert_eq!(cfg.stall_after(), Duration::from_secs(50));
        cfg.interval = Interval(Duration::from_millis(100));
        cfg.stall_timeout = Interval(Duration::from_secs(1));
        assert_eq!(cfg.stall_after(), Duration::from_secs(1));
        let text = "[tegrastats]\nstall_timeout = \"2m\"\n";
        let parsed = crate::config::Config::from_toml_str(text, "test").unwrap();
        assert_eq!(parsed.tegrastats.stall_timeout.0, Duration::from_secs(120));
        let zero = "[tegrastats]\nstall_timeout = \"0s\"\n";
        let err = crate::config::Config::from_toml_str(zero, "test").unwrap_err();
        assert!(err.to_string().contains("stall_timeout"), "{err}");
    }

    #[test]
    fn status_counts_samples_and_dates_the_last_one() {
        let st = TegrastatsStatus::default();
        assert_eq!(st.state(), "not started");
        let v = st.snapshot(0);
        assert_eq!(v["samples"], 0);
        assert!(v["last_sample_age_s"].is_null());
        st.set("running", "/usr/bin/tegrastats");
        st.sample(1_000_000_000);
        st.sample(2_000_000_000);
        st.bad_lines(3);
        st.bad_lines(0);
        let v = st.snapshot(4_500_000_000);
        assert_eq!(v["state"], "running");
        assert_eq!(v["detail"], "/usr/bin/tegrastats");
        assert_eq!(v["samples"], 2);
        assert_eq!(v["bad_lines"], 3);
        assert_eq!(v["last_sample_age_s"], 2.5);
    }

    #[test]
    fn backoff_doubles_to_a_cap_with_downward_jitter() {
        let secs = |n, j| backoff_delay(n, j).as_secs_f64();
        assert_eq!(secs(0, 0.0), 1.0);
        assert_eq!(secs(1, 0.0), 2.0);
        assert_eq!(secs(5, 0.0), 32.0);
        assert_eq!(secs(6, 0.0), 60.0);
        assert_eq!(secs(u32::MAX, 0.0), 60.0);
        assert_eq!(secs(0, 1.0), 0.75);
        assert_eq!(secs(7, 5.0), 45.0);
        for _ in 0..100 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j));
        }
    }

    #[test]
    fn stderr_limit_passes_ten_a_minute_and_reports_the_rest() {
        let t0 = Instant::now();
        let mut l = StderrLimit::new(t0);
        for _ in 0..STDERR_LINES_PER_MINUTE {
            assert_eq!(l.allow(t0), (true, None));
        }
        assert_eq!(l.allow(t0 + Duration::from_secs(1)), (false, None));
        assert_eq!(l.allow(t0 + Duration::from_secs(2)), (false, None));
        assert_eq!(l.allow(t0 + Duration::from_secs(61)), (true, Some(2)));
        assert_eq!(l.allow(t0 + Duration::from_secs(200)), (true, None));
    }

    #[tokio::test]
    async fn line_reader_splits_limits_and_survives_odd_input() {
        let input: Vec<u8> = [
            &b"first\r\nsecond\n"[..],
            &[b'x'; 40][..],
            b"\nthird\n\nlast",
        ]
        .concat();
        // A tiny buffer, so lines span several fill_buf calls.
        let buf = tokio::io::BufReader::with_capacity(3, &input[..]);
        let mut r = LineReader::new(buf, 16);
        let mut got = Vec::new();
        while let Some(l) = r.next_line().await.unwrap() {
            got.push(l);
        }
        assert_eq!(
            got,
            vec![
                RawLine::Line(b"first".to_vec()),
                RawLine::Line(b"second".to_vec()),
                RawLine::TooLong,
                RawLine::Line(b"third".to_vec()),
                RawLine::Line(Vec::new()),
                RawLine::Line(b"last".to_vec()),
            ]
        );
        assert!(r.done);
    }
}
