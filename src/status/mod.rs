//! The status document: what `/api/v1/status` answers, what `/metrics` exports the agent's
//! own health from, what `edgewatch status` prints and what the UI shows. One typed struct
//! per part, each filled by the part that owns the data (`rollup::status`, `clock::status`,
//! `forward::ForwardStatus::snapshot`, the collectors' `snapshot`s) and assembled in one
//! place (`api::status_document`). Readers deserialize it, never look keys up by string.
//!
//! This module only declares the shape (and [`StatusCell`], the holder of a live part); it
//! reads nothing and decides nothing. Renaming a field here renames a JSON key (users' scripts
//! read them), not a Prometheus metric: metric names are written out in `web::metrics`.
//! Values that can be unknown are `Option` (JSON `null`), never a sentinel.

mod cell;
pub mod config;
mod live;
pub mod notify;
pub mod rate;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use cell::StatusCell;
pub use live::Live;
pub use rate::WriteRate;

/// The whole `/api/v1/status` document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Version and uptime (top-level keys of the document).
    #[serde(flatten)]
    pub agent: Agent,
    /// The ingest path: counters, queue, writer.
    pub ingest: Ingest,
    /// The database.
    pub store: Store,
    /// Rollup tiers, eviction, the budget (`null`: the store could not be read).
    pub rollup: Option<Rollup>,
    /// The device clock (`null`: the store could not be read).
    pub clock: Option<Clock>,
    /// The forwarders.
    pub forward: Forward,
    /// The collectors.
    pub collectors: Collectors,
    /// The alert notifiers (`[[notify]]`).
    #[serde(default)]
    pub notify: notify::Notify,

    /// The alert evaluator: rules, instances pending and firing, the last evaluation
    /// (`null`: not evaluated yet). Declared beside its owner, `alert::view`.
    #[serde(default)]
    pub alerts: Option<crate::alert::view::AlertsStatus>,
    /// The effective config and its reloads (`null`: not known, as from an older agent).
    #[serde(default)]
    pub config: Option<config::ConfigInfo>,
}

/// The agent itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Agent {
    /// `CARGO_PKG_VERSION` of the running binary.
    pub version: String,
    /// Seconds since the agent started.
    pub uptime_s: u64,
    /// Bytes the agent has caused to be written to storage since it started
    /// (`/proc/self/io` `write_bytes`: each page of the page cache it dirtied, again each time
    /// it dirties a page a sync had cleaned): what its store, WAL, journal and logs cost the
    /// device's flash. `null` where the kernel does not account task IO.
    #[serde(default)]
    pub disk_written_bytes: Option<u64>,
}

/// Ingest counters (all time since start), the queue and the writer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ingest {
    /// Points (lines) committed to the store.
    pub points_written: u64,
    /// Field values committed to the store.
    pub values_written: u64,
    /// Points refused: parse errors, type conflicts, the series cap.
    pub points_rejected: u64,
    /// Points dropped: queue full or their commit failed.
    pub points_dropped: u64,
    /// HTTP writes answered 503 (queue full).
    pub writes_throttled: u64,
    /// HTTP writes answered 413.
    pub writes_too_large: u64,
    /// UDP datagrams received.
    pub udp_datagrams: u64,
    /// Points waiting between ingest and the writer.
    pub queue_points: u64,
    /// The queue's capacity in points.
    pub queue_capacity: u64,
    /// Transactions the writer committed.
    pub commits: u64,
    /// Transactions that failed (and journal appends that did).
    pub commit_errors: u64,
    /// Journal appends: small acknowledged writes made durable before their commit (one
    /// append per group of writes that arrived together).
    #[serde(default)]
    pub journal_appends: u64,
    /// What the journal appends cost the storage, bytes: each padded record written directly
    /// (512 bytes for a few lines on an eMMC), or each page an append through the page cache
    /// touched. What `full` durability of small writes costs the card.
    #[serde(default)]
    pub journal_bytes: u64,
    /// Duration of the last commit, ms.
    pub last_commit_ms: f64,
    /// The longest the writer holds points before their commit (`[ingest]
    /// flush_interval`), ms: how far behind a read with `X-Edgewatch-Read: stored` may be.
    #[serde(default)]
    pub hold_ms: u64,
}

/// The database.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Store {
    /// The database file.
    pub path: PathBuf,
    /// Database plus WAL on disk, bytes.
    pub db_bytes: u64,
    /// Series in the store (`null`: could not be counted).
    pub series: Option<i64>,
    /// Most series the store creates (`[store] max_series`).
    pub max_series: u64,
    /// Durability of acknowledged writes (`[storage] synchronous`): `full` survives a power
    /// cut, `normal` only a crash of the agent.
    pub synchronous: crate::config::Synchronous,
    /// The raw write rate and the offline runway (`null`: nothing written yet, or the
    /// store could not be read).
    #[serde(default)]
    pub write: Option<WriteRate>,
}

/// The rollup job's view: tiers, eviction, the budget.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rollup {
    /// One per configured tier, finest first.
    pub tiers: Vec<Tier>,
    /// Newest raw chunk id (0: none yet).
    pub newest_chunk_id: i64,
    /// How long raw points are kept, seconds.
    pub raw_retention_s: i64,
    /// How late a point may arrive and still be folded into an open bucket, seconds.
    pub lateness_s: i64,
    /// Raw data evicted by retention or the budget, all time.
    pub evicted: Evicted,
    /// Per sink: raw data evicted before the sink forwarded it.
    pub sinks: Vec<SinkEvictions>,
    /// The disk budget.
    pub budget: Budget,
}

/// One rollup tier.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tier {
    /// `1m`, `1h`, ...
    pub name: String,
    /// Bucket width, seconds.
    pub resolution_s: i64,
    /// How long its rows are kept, seconds (`null`: forever).
    pub retention_s: Option<i64>,
    /// Last raw chunk folded into it.
    pub cursor_chunk_id: i64,
    /// Raw chunks not yet folded into it.
    pub pending_chunks: i64,
    /// Seconds since the job last advanced it while work is pending (0: caught up; `null`:
    /// not run yet). Up to `fold_every_s` in normal running.
    pub lag_s: Option<f64>,
    /// How often the agent's rollup job folds it, seconds (a tier a sink forwards folds
    /// promptly, the others in longer strides: `rollup::Plan::fold_every_ns`).
    #[serde(default)]
    pub fold_every_s: i64,
    /// Buckets before this are final, ns (`null`: nothing folded yet).
    pub watermark_ns: Option<i64>,
    /// Points that landed in a final bucket.
    pub late_points: i64,
    /// Rows of the tier now.
    pub rows: i64,
    /// Rows evicted by its retention or the budget, all time.
    pub evicted_rows: i64,
    /// Late points left out of a stored row whose sketch does not decode, all time.
    #[serde(default)]
    pub corrupt_skipped_points: i64,
}

/// Raw data evicted by retention or the budget, all time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evicted {
    /// Raw chunks.
    pub raw_chunks: i64,
    /// Their points.
    pub raw_points: i64,
}

/// Raw data evicted before one sink forwarded it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SinkEvictions {
    /// Sink name.
    pub name: String,
    /// Last chunk id the sink's remote end acknowledged.
    pub cursor_chunk_id: i64,
    /// Raw chunks evicted before the sink forwarded them.
    pub evicted_unforwarded_chunks: i64,
    /// Their points.
    pub evicted_unforwarded_points: i64,
    /// Newest chunk id among them.
    pub evicted_through_chunk_id: i64,
}

/// The disk budget.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// `[retention] max_disk`, bytes (0: none).
    pub max_bytes: u64,
    /// Database plus WAL on disk, bytes.
    pub db_bytes: u64,
}

/// The device clock (`clock.rs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Clock {
    /// The clock reads later than `[clock] min_valid`.
    pub set: bool,
    /// `[clock] min_valid`, ns.
    pub min_valid_ns: i64,
    /// Rollup and forwarding wait from this chunk on (`null`: nothing held).
    pub held_from_chunk_id: Option<i64>,
    /// Points whose times were corrected once the clock was set, all time.
    pub fixed_points: i64,
    /// Points an earlier boot stamped on an unset clock, which could not be corrected.
    pub unfixable_points: i64,
}

/// The forwarders.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Forward {
    /// Device identity added to forwarded points.
    pub device_id: String,
    /// One per enabled `[[sink]]`, in config order.
    pub sinks: Vec<Sink>,
}

/// One sink's forwarding state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sink {
    /// Sink name.
    pub name: String,
    /// `influxdb`, `mqtt` or `prometheus_remote_write`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Where it sends (credentials are never in a URL we print).
    pub url: String,
    /// Link up (MQTT: connected; HTTP: the last request got an answer).
    pub connected: bool,
    /// Paused: the receiver refused for a reason that does not pass by itself
    /// (credentials, a wrong path); the data is kept and tried again every `max_backoff`.
    pub paused: bool,
    /// When the next attempt is due while waiting (Unix ns); `null` when not waiting.
    #[serde(default)]
    pub next_retry_ns: Option<i64>,
    /// Last acknowledged chunk id.
    pub cursor_chunk_id: i64,
    /// Last acknowledged batch sequence number.
    pub batch_seq: i64,
    /// Points not yet acknowledged.
    pub backlog_points: i64,
    /// Chunks not yet acknowledged.
    pub backlog_chunks: i64,
    /// Age of the oldest unsent point, seconds (`null`: no backlog).
    pub oldest_unsent_age_s: Option<f64>,
    /// Last acknowledgement, ns since the epoch (`null`: never).
    pub last_success_ns: Option<i64>,
    /// Last error (cleared by the next success).
    pub last_error: Option<String>,
    /// When it happened, ns.
    pub last_error_ns: Option<i64>,
    /// Errors seen since start.
    pub errors: u64,
    /// Batches refused as bad data and kept in `dead_letters`.
    pub dead_letter_batches: i64,
    /// Their points.
    pub dead_letter_points: i64,
    /// Points acknowledged, all time.
    pub forwarded_points: i64,
    /// Batches sent again after a fault (each may have been duplicated once).
    pub replayed_batches: i64,
    /// Acknowledged points per second, last 5 s.
    pub drain_rate_pps: f64,
    /// Configured rate limit, points/s (0: none).
    pub max_rate_pps: u64,
    /// Raw points evicted before this sink forwarded them.
    pub evicted_unforwarded_points: i64,
    /// Rollup points sent in place of evicted raw data.
    pub fallback_points: i64,
    /// Values the sink's format cannot carry and skipped, since start: string fields, for
    /// `prometheus_remote_write` (counted when their batch was acknowledged or refused).
    #[serde(default)]
    pub skipped_string_values: i64,
    /// `prometheus_remote_write`: series whose names collide with another series' after
    /// sanitising (`cpu_usage`/`x` and `cpu`/`usage_x`, tags `a.b` and `a_b`) and are sent
    /// apart (an `edgewatch_source` label or a renamed tag), known since start.
    #[serde(default)]
    pub name_collisions: i64,

    /// What the sink forwards: `raw` or `rollup:1m` / `rollup:1h` (bandwidth-aware
    /// forwarding). In rollup mode the backlog counts the tier's final rows (`backlog_points`)
    /// and buckets (`backlog_chunks`) not sent yet, and `evicted_unforwarded_points` the rows
    /// retention or the budget deleted before they were sent.
    #[serde(default)]
    pub forward: String,
    /// Rollup mode: start of the last bucket acknowledged, ns (`null` in raw mode).
    #[serde(default)]
    pub rollup_cursor_ns: Option<i64>,
}

impl crate::status::cell::FailureFields for Sink {
    fn failure_fields(&mut self) -> crate::status::cell::FailureRefs<'_> {
        let s = self;
        (
            &mut s.last_error,
            &mut s.last_error_ns,
            &mut s.errors,
            &mut s.paused,
            &mut s.next_retry_ns,
        )
    }
}

/// The collectors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Collectors {
    /// Collector samples that failed, all collectors.
    pub errors: u64,
    /// The NVML collector.
    pub nvml: Nvml,
    /// The tegrastats collector.
    pub tegrastats: Tegrastats,
    /// The `[[scrape]]` targets, in config order.
    #[serde(default)]
    pub scrape: Vec<ScrapeTarget>,
    /// The `[jetson]` collector: the module's identity, power mode and throttling.
    #[serde(default)]
    pub jetson: Jetson,
    /// The `[kmsg]` kernel log collector.
    #[serde(default)]
    pub kmsg: Kmsg,
    /// The `[[process]]` watcher: each watched label, its running count and last event.
    #[serde(default)]
    pub process: ProcessWatch,
}

/// The `[kmsg]` collector (`collectors.kmsg`): how far it read the kernel log and what it
/// found there.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Kmsg {
    /// `not started`, `running`, `off: <reason>`, `stopped`.
    pub state: String,
    /// Why it is off or what last went wrong (an open or read error, with the fix).
    pub detail: Option<String>,
    /// The device read (`/dev/kmsg`).
    pub device: String,
    /// This boot's id (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: Option<String>,
    /// Records of this boot up to this sequence number were handled by an earlier run and
    /// skipped (`null`: a new boot or a first start, the whole ring was read).
    pub resumed_after_seq: Option<u64>,
    /// Records read since start (the skipped ones included).
    pub records: u64,
    /// Records skipped as handled by an earlier run.
    pub skipped: u64,
    /// Events submitted since start.
    pub events: u64,
    /// Events dropped by the flood bound (`max_events_per_s`, `burst`).
    pub dropped: u64,
    /// Records the kernel overwrote before they were read (gaps in the sequence numbers).
    pub lost: u64,
    /// The last record's sequence number (`null`: none read yet).
    pub last_seq: Option<u64>,
    /// OOM kills `/proc/vmstat` counted with no log line, since start.
    pub oom_kills_unlogged: u64,
}

/// The watched-process collector (`collectors.process`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessWatch {
    /// `not started`, `running`, `off: <reason>`, `stopped`.
    pub state: String,
    /// Scans of `/proc` done.
    pub scans: u64,
    /// Wall time of the last scan, ms (`null`: none yet).
    pub last_scan_ms: Option<f64>,
    /// Processes the last scan listed (watched or not).
    pub tracked_pids: u64,
    /// Where `gpu_mem_bytes` came from in the last scan: `nvml`, `nvmap`, or `none: <why>`.
    pub gpu_mem: String,
    /// One per `[[process]]`, in config order.
    pub watched: Vec<WatchedProcess>,
}

/// One `[[process]]` (`collectors.process.watched[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WatchedProcess {
    /// The `process` tag value.
    pub label: String,
    /// The rule: `name = "..."` or `cmdline = "..."`.
    pub rule: String,
    /// Matching processes running at the last scan.
    pub running: u64,
    /// Their pids, oldest first.
    pub pids: Vec<u32>,
    /// `process_start` events since the agent started.
    pub starts: u64,
    /// `process_exit` events since the agent started.
    pub exits: u64,
    /// `process_restart` events since the agent started.
    pub restarts: u64,
    /// The last event (`null`: none since the agent started).
    pub last_event: Option<ProcessEvent>,
}

/// A watched process's last event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessEvent {
    /// `process_start`, `process_exit` or `process_restart`.
    pub kind: String,
    /// When, ns.
    pub ts_ns: i64,
    /// The event's message.
    pub message: String,
}

/// The `[jetson]` collector (`collectors.jetson`): what the Jetson is and how it is set,
/// as tagged on every `jetson_*` point.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Jetson {
    /// `not started`, `running`, `off: <reason>`, `stopped`.
    pub state: String,
    /// `/proc/device-tree/model`.
    pub module: Option<String>,
    /// L4T release, e.g. `36.3.0`.
    pub l4t: Option<String>,
    /// JetPack release, where the L4T release maps to one.
    pub jetpack: Option<String>,
    /// nvpmodel mode name.
    pub power_mode: Option<String>,
    /// nvpmodel mode id.
    pub power_mode_id: Option<u32>,
    /// `on` (CPU and GPU minimum clocks pinned to their maximum), `off`; `null`: unknown.
    pub jetson_clocks: Option<String>,
    /// Samples taken.
    pub samples: u64,
    /// The last sample saw throttling (`null`: none yet).
    pub throttled: Option<bool>,
    /// When a sample last saw throttling, ns (`null`: never since start).
    pub last_throttled_ns: Option<i64>,
    /// Power-mode changes seen since start.
    pub power_mode_changes: u64,
    /// Per-process GPU memory from nvmap: `on`, or `off: <reason>`.
    pub processes: String,
    /// Processes in the last nvmap client list (`null`: not read).
    pub process_count: Option<u64>,
    /// What the tree lacks (missing or unreadable files), left out of the points.
    pub missing: Vec<String>,
    /// Where the GPU clock and load come from: `devfreq:<node>` (e.g.
    /// `devfreq:gpu-gpc-0`), `devfreq:<node>+nvml` (clock from the node, load from NVML),
    /// `nvml`, `none`; `null` before the first sample.
    pub gpu_source: Option<String>,
    /// Why that source, in one sentence.
    pub gpu_source_reason: Option<String>,
    /// Times the GPU source changed since start (re-probed on a fallback).
    pub gpu_source_switches: u64,
}

/// One `[[scrape]]` target (`collectors.scrape[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScrapeTarget {
    /// The configured name (the `scrape` tag).
    pub name: String,
    /// The URL, without any user:password part.
    pub url: String,
    /// The last scrape got a page (HTTP 200, within the limits).
    pub up: bool,
    /// Scrapes attempted.
    pub scrapes: u64,
    /// Scrapes that failed (down, timeout, HTTP error, too large, not text).
    pub failures: u64,
    /// The last failure (kept after a success; see `up`).
    pub last_error: Option<String>,
    /// When it happened, ns.
    pub last_error_ns: Option<i64>,
    /// When the last scrape started, ns (`null`: none yet).
    pub last_scrape_ns: Option<i64>,
    /// Wall time of the last scrape (request, parse, shaping), ms.
    pub last_duration_ms: Option<f64>,
    /// Body size of the last page, bytes.
    pub last_bytes: u64,
    /// Samples stored from the last page.
    pub samples: u64,
    /// Samples stored, all scrapes.
    pub samples_total: u64,
    /// Malformed lines skipped, all scrapes.
    pub bad_lines: u64,
    /// The last malformed line seen (number and reason).
    pub last_bad_line: Option<String>,
    /// Samples left out as NaN or infinite, all scrapes.
    pub non_finite: u64,
    /// `triton` points written, all scrapes.
    pub triton_points: u64,
    /// `llm` points written (targets with a `preset`), all scrapes.
    #[serde(default)]
    pub llm_points: u64,
    /// Preset families left out of an `llm` point as malformed (no `+Inf` bucket, buckets
    /// not cumulative, a wrong declared type, ...), all scrapes.
    #[serde(default)]
    pub preset_errors: u64,
    /// The last such problem (family, model and what is wrong).
    #[serde(default)]
    pub last_preset_error: Option<String>,
}

/// The NVML collector.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Nvml {
    /// `not started`, `starting`, `running`, `off: <reason>`, `stopped`.
    pub state: String,
    /// Driver version (empty before NVML answered).
    pub driver: String,
    /// CUDA driver version (empty before NVML answered).
    pub cuda: String,
    /// Samples taken.
    pub samples: u64,
    /// Wall time of the last sample, NVML calls included, µs (`null`: none yet).
    pub last_sample_us: Option<u64>,
    /// One per GPU.
    pub gpus: Vec<Gpu>,
}

/// One GPU the NVML collector samples.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Architecture.
    pub arch: String,
    /// Compute capability.
    pub cc: String,
    /// Unreachable: fell off the bus, needs a reset, or NVML will not hand out its handle
    /// (the reason is in `last_error`); retried with backoff (10 s doubling to 5 min).
    pub lost: bool,
    /// The last error seen on this GPU, if any.
    pub last_error: Option<String>,
    /// Metrics this GPU answered `NotSupported` for.
    pub unsupported: Vec<String>,
}

/// The tegrastats collector.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tegrastats {
    /// `not started`, `off`, `running`, `replaying`, `restarting`, `stopped`.
    pub state: String,
    /// What the state is about: the binary or replay file, or why it restarts.
    pub detail: String,
    /// The running tegrastats process (`null`: none).
    pub pid: Option<u32>,
    /// Times tegrastats was started.
    pub starts: u64,
    /// Times it exited, failed or stalled and was restarted.
    pub restarts: u64,
    /// Times it printed nothing for `stall_timeout` and was stopped.
    pub stalls: u64,
    /// Lines parsed and submitted.
    pub samples: u64,
    /// Lines that could not be parsed.
    pub bad_lines: u64,
    /// Seconds since the last sample (`null`: none yet).
    pub last_sample_age_s: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_reads_back_what_it_wrote_with_version_and_uptime_at_the_top() {
        let mut s = Status::default();
        s.agent.version = "1.2.3".into();
        s.agent.uptime_s = 7;
        s.store.series = None;
        s.rollup = Some(Rollup {
            tiers: vec![Tier {
                name: "1m".into(),
                lag_s: None,
                ..Tier::default()
            }],
            ..Rollup::default()
        });
        s.forward.sinks.push(Sink {
            name: "a".into(),
            kind: "mqtt".into(),
            ..Sink::default()
        });
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["version"], "1.2.3");
        assert_eq!(v["uptime_s"], 7);
        assert!(v.get("agent").is_none(), "{v}");
        assert!(v["store"]["series"].is_null());
        assert!(v["clock"].is_null());
        assert!(v["rollup"]["tiers"][0]["lag_s"].is_null());
        assert_eq!(v["forward"]["sinks"][0]["type"], "mqtt");
        let back: Status = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }
}
