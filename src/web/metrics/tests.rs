//! The exposition's names, escaping and every `edgewatch_*` family, from values in hand.

use std::borrow::Cow;

use super::text::key_tags;
use super::*;
use crate::status::{self, Status};

fn l(m: &str, tags: &[(&str, &str)], f: &str, v: f64) -> Latest {
    Latest {
        measurement: m.into(),
        tags: tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        field: f.into(),
        ts: 1,
        value: v,
    }
}

#[test]
fn key_tags_borrow_plain_keys_and_unescape_others() {
    let plain = key_tags("m,a=1,b=x y");
    assert!(matches!(plain[0].0, Cow::Borrowed(_)));
    let got: Vec<(String, String)> = plain
        .into_iter()
        .chain(key_tags("m\\,x,a\\=b=c\\ d,e=\\,"))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let want = [("a", "1"), ("b", "x y"), ("a=b", "c d"), ("e", ",")];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(got, want);
    assert!(key_tags("m").is_empty());
}

#[test]
fn names_and_labels_are_sanitized() {
    assert_eq!(
        metric_name("jetson_power_current-mw"),
        "jetson_power_current_mw"
    );
    assert_eq!(metric_name("1m.load"), "_1m_load");
    assert_eq!(label_name("__name__"), "tag__name__");
    assert_eq!(label_name("gpu.index"), "gpu_index");
    assert_eq!(label_name("modelVersion"), "model_version");
    assert_eq!(
        base_unit("inference_wall_ms"),
        ("inference_wall_seconds".into(), 1e-3)
    );
    assert_eq!(
        base_unit("gpu_mem_used_mb"),
        ("gpu_mem_used_bytes".into(), 1048576.0)
    );
    assert_eq!(
        base_unit("gpu_clock_sm_mhz"),
        ("gpu_clock_sm_mhz".into(), 1.0)
    );
    assert_eq!(
        base_unit("x_ms_total"),
        ("x_milliseconds_total".into(), 1.0)
    );
}

#[test]
fn series_become_labelled_gauges_with_escaped_values() {
    let mut status = Status::default();
    status.ingest.points_written = 5;
    status.ingest.queue_points = 2;
    let text = render(
        &status,
        &[
            l(
                "gpu",
                &[("gpu", "0"), ("name", "A \"quoted\"\\name\n")],
                "temp_c",
                71.0,
            ),
            l("inference", &[("model", "yolo")], "wall_ms", 12.5),
            l(
                "inference",
                &[("model", "bert"), ("app", "x")],
                "wall_ms",
                30.0,
            ),
        ],
        None,
    );
    assert!(text.contains("# TYPE gpu_temp_c gauge"), "{text}");
    assert!(
        text.contains(r#"gpu_temp_c{gpu="0",name="A \"quoted\"\\name\n"} 71"#),
        "{text}"
    );
    assert!(
        text.contains(r#"inference_wall_seconds{app="",model="yolo"} 0.0125"#),
        "{text}"
    );
    assert!(
        text.contains(r#"inference_wall_seconds{app="x",model="bert"} 0.03"#),
        "{text}"
    );
    assert!(text.contains("edgewatch_points_written_total 5"), "{text}");
    assert!(text.contains("edgewatch_queue_points 2"), "{text}");
}

/// A status document with a known, distinct value in every exported field.
fn known_status() -> Status {
    Status {
        notify: status::notify::Notify::default(),
        agent: status::Agent {
            version: "9.8.7".into(),
            uptime_s: 61,
            disk_written_bytes: Some(109_000),
        },
        ingest: status::Ingest {
            points_written: 101,
            values_written: 102,
            points_rejected: 103,
            points_dropped: 104,
            writes_throttled: 105,
            writes_too_large: 106,
            udp_datagrams: 107,
            queue_points: 108,
            queue_capacity: 109,
            commits: 110,
            commit_errors: 111,
            journal_appends: 113,
            journal_bytes: 114,
            hold_ms: 15_000,
            last_commit_ms: 12.5,
        },
        store: status::Store {
            path: "/var/lib/edgewatch/edgewatch.db".into(),
            db_bytes: 201,
            series: Some(202),
            max_series: 203,
            synchronous: crate::config::Synchronous::Full,
            write: None,
        },
        rollup: Some(status::Rollup {
            tiers: vec![
                status::Tier {
                    name: "1m".into(),
                    resolution_s: 60,
                    retention_s: Some(86_400),
                    cursor_chunk_id: 300,
                    pending_chunks: 301,
                    lag_s: Some(30.5),
                    fold_every_s: 3600,
                    watermark_ns: Some(1),
                    late_points: 302,
                    rows: 303,
                    evicted_rows: 304,
                    corrupt_skipped_points: 305,
                },
                status::Tier {
                    name: "1h".into(),
                    resolution_s: 3600,
                    retention_s: None,
                    cursor_chunk_id: 0,
                    pending_chunks: 311,
                    lag_s: None,
                    fold_every_s: 21_600,
                    watermark_ns: None,
                    late_points: 312,
                    rows: 313,
                    evicted_rows: 314,
                    corrupt_skipped_points: 315,
                },
            ],
            newest_chunk_id: 320,
            raw_retention_s: 604_800,
            lateness_s: 60,
            evicted: status::Evicted {
                raw_chunks: 321,
                raw_points: 322,
            },
            sinks: vec![status::SinkEvictions {
                name: "north".into(),
                cursor_chunk_id: 323,
                evicted_unforwarded_chunks: 324,
                evicted_unforwarded_points: 325,
                evicted_through_chunk_id: 326,
            }],
            budget: status::Budget {
                max_bytes: 327,
                db_bytes: 201,
            },
        }),
        clock: Some(status::Clock {
            set: true,
            min_valid_ns: 400,
            held_from_chunk_id: Some(401),
            fixed_points: 402,
            unfixable_points: 403,
        }),
        forward: status::Forward {
            device_id: "dev-1".into(),
            sinks: vec![
                status::Sink {
                    name: "north".into(),
                    kind: "influxdb".into(),
                    url: "http://127.0.0.1:8086".into(),
                    connected: true,
                    paused: false,
                    next_retry_ns: None,
                    cursor_chunk_id: 501,
                    batch_seq: 502,
                    backlog_points: 503,
                    backlog_chunks: 504,
                    oldest_unsent_age_s: Some(4.5),
                    last_success_ns: Some(1_500_000_000),
                    last_error: Some("x".into()),
                    last_error_ns: Some(2_500_000_000),
                    errors: 505,
                    dead_letter_batches: 506,
                    dead_letter_points: 507,
                    forwarded_points: 508,
                    replayed_batches: 509,
                    drain_rate_pps: 510.5,
                    max_rate_pps: 511,
                    evicted_unforwarded_points: 512,
                    fallback_points: 513,
                    skipped_string_values: 0,
                    name_collisions: 0,

                    forward: "raw".into(),
                    rollup_cursor_ns: None,
                },
                // Nothing sent, nothing failed, no backlog: those series are absent.
                status::Sink {
                    name: "south".into(),
                    kind: "mqtt".into(),
                    paused: true,
                    ..status::Sink::default()
                },
            ],
        },
        collectors: status::Collectors {
            errors: 601,
            nvml: status::Nvml {
                state: "running".into(),
                driver: "550.54.15".into(),
                cuda: "12.4".into(),
                samples: 602,
                last_sample_us: Some(603),
                gpus: vec![status::Gpu::default(), status::Gpu::default()],
            },
            tegrastats: status::Tegrastats {
                state: "replaying".into(),
                detail: "x.log".into(),
                pid: None,
                starts: 701,
                restarts: 702,
                stalls: 703,
                samples: 704,
                bad_lines: 705,
                last_sample_age_s: Some(0.25),
            },
            scrape: vec![],
            jetson: status::Jetson::default(),
            kmsg: status::Kmsg {
                state: "running".into(),
                records: 801,
                events: 802,
                dropped: 803,
                lost: 804,
                ..Default::default()
            },
            process: status::ProcessWatch::default(),
        },
        alerts: None,
        config: None,
    }
}

#[test]
fn the_config_hash_and_reload_counts_are_exported() {
    let mut st = known_status();
    st.config = Some(status::config::ConfigInfo {
        sha256: "ab12".into(),
        reloads_applied: 3,
        reloads_failed: 2,
        ..Default::default()
    });
    let text = render(&st, &[], None);
    for want in [
        "edgewatch_config_info{sha256=\"ab12\"} 1\n",
        "edgewatch_config_reloads_total{result=\"applied\"} 3\n",
        "edgewatch_config_reloads_total{result=\"failed\"} 2\n",
    ] {
        assert!(text.contains(want), "{want} missing in:\n{text}");
    }
}

#[test]
fn scrape_targets_are_labelled_by_name() {
    let mut st = known_status();
    st.collectors.scrape = vec![status::ScrapeTarget {
        name: "triton".into(),
        up: true,
        scrapes: 3,
        failures: 1,
        samples: 40,
        samples_total: 120,
        bad_lines: 2,
        last_duration_ms: Some(12.5),
        ..status::ScrapeTarget::default()
    }];
    let text = render(&st, &[], None);
    for want in [
        "edgewatch_scrape_up{name=\"triton\"} 1\n",
        "edgewatch_scrape_failures_total{name=\"triton\"} 1\n",
        "edgewatch_scrape_samples_total{name=\"triton\"} 120\n",
        "edgewatch_scrape_bad_lines_total{name=\"triton\"} 2\n",
        "edgewatch_scrape_last_samples{name=\"triton\"} 40\n",
        "edgewatch_scrape_last_duration_seconds{name=\"triton\"} 0.0125\n",
    ] {
        assert!(text.contains(want), "{want} missing in:\n{text}");
    }
}

#[test]
fn watched_processes_are_labelled_by_process() {
    let mut st = known_status();
    st.collectors.process.watched = vec![status::WatchedProcess {
        label: "triton".into(),
        running: 2,
        starts: 3,
        exits: 1,
        restarts: 1,
        ..status::WatchedProcess::default()
    }];
    let text = render(&st, &[], None);
    for want in [
        "edgewatch_process_running{process=\"triton\"} 2\n",
        "edgewatch_process_starts_total{process=\"triton\"} 3\n",
        "edgewatch_process_exits_total{process=\"triton\"} 1\n",
        "edgewatch_process_restarts_total{process=\"triton\"} 1\n",
    ] {
        assert!(text.contains(want), "{want} missing in:\n{text}");
    }
}

#[test]
fn notifiers_are_labelled_by_name_and_type() {
    let mut st = known_status();
    st.notify.notifiers = vec![status::notify::Notifier {
        kind: "alertmanager".into(),
        name: "am".into(),
        position: 12,
        pending_events: 3,
        delivered: 9,
        failures: 4,
        dead_letters: 1,
        last_success_ns: Some(2_000_000_000),
        ..Default::default()
    }];
    let text = render(&st, &[], None);
    for want in [
        "edgewatch_notify_pending_events{notifier=\"am\",type=\"alertmanager\"} 3\n",
        "edgewatch_notify_position{notifier=\"am\",type=\"alertmanager\"} 12\n",
        "edgewatch_notify_delivered_total{notifier=\"am\",type=\"alertmanager\"} 9\n",
        "edgewatch_notify_failures_total{notifier=\"am\",type=\"alertmanager\"} 4\n",
        "edgewatch_notify_dead_letters_total{notifier=\"am\",type=\"alertmanager\"} 1\n",
        "edgewatch_notify_last_success_seconds{notifier=\"am\",type=\"alertmanager\"} 2\n",
    ] {
        assert!(text.contains(want), "{want} missing in:\n{text}");
    }
}

/// The `edgewatch_*` lines of an exposition (help, type and samples).
fn own_lines(text: &str) -> String {
    text.lines()
        .filter(|l| l.contains("edgewatch_"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Every `edgewatch_*` family, exactly: a renamed field must not rename a metric, and
/// a metric must follow the field it exports.
#[test]
fn the_agents_own_families_are_exactly_these() {
    let text = render(&known_status(), &[], None);
    let got = own_lines(&text);
    assert_eq!(got, OWN_FAMILIES, "got:\n{got}");
}

/// What [`known_status`] exports, every value traceable to one field.
const OWN_FAMILIES: &str = r#"# HELP edgewatch_build_info The agent's version.
# TYPE edgewatch_build_info gauge
edgewatch_build_info{version="9.8.7"} 1
# HELP edgewatch_clock_fixed_points_total Points whose times were corrected once the clock was set.
# TYPE edgewatch_clock_fixed_points_total counter
edgewatch_clock_fixed_points_total 402
# HELP edgewatch_clock_holding 1 while points stamped before the clock was set are held back from rollup and forwarding.
# TYPE edgewatch_clock_holding gauge
edgewatch_clock_holding 1
# HELP edgewatch_clock_set 1 when the clock reads later than [clock] min_valid (0: not set; rollup and forwarding wait).
# TYPE edgewatch_clock_set gauge
edgewatch_clock_set 1
# HELP edgewatch_clock_unfixable_points_total Points an earlier boot stamped on an unset clock, which could not be corrected.
# TYPE edgewatch_clock_unfixable_points_total counter
edgewatch_clock_unfixable_points_total 403
# HELP edgewatch_collector_errors_total Collector samples that failed.
# TYPE edgewatch_collector_errors_total counter
edgewatch_collector_errors_total 601
# HELP edgewatch_commit_errors_total Transactions that failed (disk full, IO error).
# TYPE edgewatch_commit_errors_total counter
edgewatch_commit_errors_total 111
# HELP edgewatch_commits_total Transactions committed by the writer.
# TYPE edgewatch_commits_total counter
edgewatch_commits_total 110
# HELP edgewatch_db_budget_bytes Disk budget of the store (0: none).
# TYPE edgewatch_db_budget_bytes gauge
edgewatch_db_budget_bytes 327
# HELP edgewatch_db_bytes Database plus WAL on disk.
# TYPE edgewatch_db_bytes gauge
edgewatch_db_bytes 201
# HELP edgewatch_disk_written_bytes_total Bytes the agent caused to be written to storage since it started (/proc/self/io write_bytes): its wear on the device's flash.
# TYPE edgewatch_disk_written_bytes_total counter
edgewatch_disk_written_bytes_total 109000
# HELP edgewatch_evicted_raw_chunks_total Raw chunks evicted by retention or the disk budget.
# TYPE edgewatch_evicted_raw_chunks_total counter
edgewatch_evicted_raw_chunks_total 321
# HELP edgewatch_evicted_raw_points_total Raw points evicted by retention or the disk budget.
# TYPE edgewatch_evicted_raw_points_total counter
edgewatch_evicted_raw_points_total 322
# HELP edgewatch_evicted_rows_total Tier rows evicted by retention or the disk budget.
# TYPE edgewatch_evicted_rows_total counter
edgewatch_evicted_rows_total{tier="1h"} 314
edgewatch_evicted_rows_total{tier="1m"} 304
# HELP edgewatch_http_writes_throttled_total HTTP writes answered 503 (queue full).
# TYPE edgewatch_http_writes_throttled_total counter
edgewatch_http_writes_throttled_total 105
# HELP edgewatch_http_writes_too_large_total HTTP writes answered 413.
# TYPE edgewatch_http_writes_too_large_total counter
edgewatch_http_writes_too_large_total 106
# HELP edgewatch_journal_appends_total Acknowledged writes made durable by a journal append before their commit (one append per group).
# TYPE edgewatch_journal_appends_total counter
edgewatch_journal_appends_total 113
# HELP edgewatch_journal_written_bytes_total Bytes the journal appends cost the storage (padded records written directly, or the pages a synced append dirtied).
# TYPE edgewatch_journal_written_bytes_total counter
edgewatch_journal_written_bytes_total 114
# HELP edgewatch_kmsg_dropped_total Kernel events dropped by the flood bound ([kmsg] max_events_per_s).
# TYPE edgewatch_kmsg_dropped_total counter
edgewatch_kmsg_dropped_total 803
# HELP edgewatch_kmsg_events_total Kernel events (Xid, OOM kill, thermal, ...) submitted.
# TYPE edgewatch_kmsg_events_total counter
edgewatch_kmsg_events_total 802
# HELP edgewatch_kmsg_lost_total Kernel log records overwritten before they were read.
# TYPE edgewatch_kmsg_lost_total counter
edgewatch_kmsg_lost_total 804
# HELP edgewatch_kmsg_records_total Kernel log records read.
# TYPE edgewatch_kmsg_records_total counter
edgewatch_kmsg_records_total 801
# HELP edgewatch_kmsg_state Kernel log collector state (1 for the current one).
# TYPE edgewatch_kmsg_state gauge
edgewatch_kmsg_state{state="running"} 1
# HELP edgewatch_nvml_gpus GPUs the NVML collector samples.
# TYPE edgewatch_nvml_gpus gauge
edgewatch_nvml_gpus 2
# HELP edgewatch_nvml_state NVML collector state (1 for the current one).
# TYPE edgewatch_nvml_state gauge
edgewatch_nvml_state{state="running"} 1
# HELP edgewatch_points_dropped_total Points dropped because the queue was full or their commit failed.
# TYPE edgewatch_points_dropped_total counter
edgewatch_points_dropped_total 104
# HELP edgewatch_points_rejected_total Points refused: parse errors, type conflicts, series cap.
# TYPE edgewatch_points_rejected_total counter
edgewatch_points_rejected_total 103
# HELP edgewatch_points_written_total Points (lines) committed to the store.
# TYPE edgewatch_points_written_total counter
edgewatch_points_written_total 101
# HELP edgewatch_queue_capacity_points Queue capacity in points.
# TYPE edgewatch_queue_capacity_points gauge
edgewatch_queue_capacity_points 109
# HELP edgewatch_queue_points Points waiting between ingest and the writer.
# TYPE edgewatch_queue_points gauge
edgewatch_queue_points 108
# HELP edgewatch_rollup_corrupt_skipped_points_total Late points left out of a stored tier row whose sketch does not decode.
# TYPE edgewatch_rollup_corrupt_skipped_points_total counter
edgewatch_rollup_corrupt_skipped_points_total{tier="1h"} 315
edgewatch_rollup_corrupt_skipped_points_total{tier="1m"} 305
# HELP edgewatch_rollup_fold_interval_seconds How often the rollup job folds the tier (the lag stays below it in normal running).
# TYPE edgewatch_rollup_fold_interval_seconds gauge
edgewatch_rollup_fold_interval_seconds{tier="1h"} 21600
edgewatch_rollup_fold_interval_seconds{tier="1m"} 3600
# HELP edgewatch_rollup_lag_seconds How far the tier's rollup is behind (0: caught up; NaN: not run yet).
# TYPE edgewatch_rollup_lag_seconds gauge
edgewatch_rollup_lag_seconds{tier="1h"} NaN
edgewatch_rollup_lag_seconds{tier="1m"} 30.5
# HELP edgewatch_rollup_late_points_total Points that landed in a final bucket.
# TYPE edgewatch_rollup_late_points_total counter
edgewatch_rollup_late_points_total{tier="1h"} 312
edgewatch_rollup_late_points_total{tier="1m"} 302
# HELP edgewatch_rollup_pending_chunks Raw chunks not yet folded into the tier.
# TYPE edgewatch_rollup_pending_chunks gauge
edgewatch_rollup_pending_chunks{tier="1h"} 311
edgewatch_rollup_pending_chunks{tier="1m"} 301
# HELP edgewatch_rollup_rows Rows of the tier.
# TYPE edgewatch_rollup_rows gauge
edgewatch_rollup_rows{tier="1h"} 313
edgewatch_rollup_rows{tier="1m"} 303
# HELP edgewatch_series Series in the store.
# TYPE edgewatch_series gauge
edgewatch_series 202
# HELP edgewatch_series_limit Most series the store creates.
# TYPE edgewatch_series_limit gauge
edgewatch_series_limit 203
# HELP edgewatch_sink_backlog_chunks Chunks the sink's remote end has not acknowledged yet.
# TYPE edgewatch_sink_backlog_chunks gauge
edgewatch_sink_backlog_chunks{sink="north"} 504
edgewatch_sink_backlog_chunks{sink="south"} 0
# HELP edgewatch_sink_backlog_points Points the sink's remote end has not acknowledged yet.
# TYPE edgewatch_sink_backlog_points gauge
edgewatch_sink_backlog_points{sink="north"} 503
edgewatch_sink_backlog_points{sink="south"} 0
# HELP edgewatch_sink_batch_seq Sequence number of the sink's last acknowledged batch.
# TYPE edgewatch_sink_batch_seq gauge
edgewatch_sink_batch_seq{sink="north"} 502
edgewatch_sink_batch_seq{sink="south"} 0
# HELP edgewatch_sink_connected 1 while the sink's link is up (MQTT: connected; HTTP: the last request got an answer).
# TYPE edgewatch_sink_connected gauge
edgewatch_sink_connected{sink="north"} 1
edgewatch_sink_connected{sink="south"} 0
# HELP edgewatch_sink_cursor_chunk_id Last chunk id the sink's remote end acknowledged.
# TYPE edgewatch_sink_cursor_chunk_id gauge
edgewatch_sink_cursor_chunk_id{sink="north"} 501
edgewatch_sink_cursor_chunk_id{sink="south"} 0
# HELP edgewatch_sink_dead_letter_batches Batches the sink's remote end refused as bad data (kept in dead_letters).
# TYPE edgewatch_sink_dead_letter_batches gauge
edgewatch_sink_dead_letter_batches{sink="north"} 506
edgewatch_sink_dead_letter_batches{sink="south"} 0
# HELP edgewatch_sink_dead_letter_points Points of the batches kept in dead_letters.
# TYPE edgewatch_sink_dead_letter_points gauge
edgewatch_sink_dead_letter_points{sink="north"} 507
edgewatch_sink_dead_letter_points{sink="south"} 0
# HELP edgewatch_sink_drain_rate_pps Points per second the sink's remote end acknowledged, last 5 s.
# TYPE edgewatch_sink_drain_rate_pps gauge
edgewatch_sink_drain_rate_pps{sink="north"} 510.5
edgewatch_sink_drain_rate_pps{sink="south"} 0
# HELP edgewatch_sink_errors Errors the sink has seen since the agent started.
# TYPE edgewatch_sink_errors gauge
edgewatch_sink_errors{sink="north"} 505
edgewatch_sink_errors{sink="south"} 0
# HELP edgewatch_sink_evicted_unforwarded_points Raw points evicted before the sink forwarded them.
# TYPE edgewatch_sink_evicted_unforwarded_points gauge
edgewatch_sink_evicted_unforwarded_points{sink="north"} 512
edgewatch_sink_evicted_unforwarded_points{sink="south"} 0
# HELP edgewatch_sink_evicted_unforwarded_points_total Points evicted before the sink forwarded them.
# TYPE edgewatch_sink_evicted_unforwarded_points_total counter
edgewatch_sink_evicted_unforwarded_points_total{sink="north"} 325
# HELP edgewatch_sink_fallback_points Rollup points sent in place of raw points evicted before the sink sent them.
# TYPE edgewatch_sink_fallback_points gauge
edgewatch_sink_fallback_points{sink="north"} 513
edgewatch_sink_fallback_points{sink="south"} 0
# HELP edgewatch_sink_forwarded_points Points the sink's remote end acknowledged, all time.
# TYPE edgewatch_sink_forwarded_points gauge
edgewatch_sink_forwarded_points{sink="north"} 508
edgewatch_sink_forwarded_points{sink="south"} 0
# HELP edgewatch_sink_last_error_seconds When the sink last failed, Unix time (absent: no error).
# TYPE edgewatch_sink_last_error_seconds gauge
edgewatch_sink_last_error_seconds{sink="north"} 2.5
# HELP edgewatch_sink_last_success_seconds When the sink's remote end last acknowledged a batch, Unix time (absent: never).
# TYPE edgewatch_sink_last_success_seconds gauge
edgewatch_sink_last_success_seconds{sink="north"} 1.5
# HELP edgewatch_sink_max_rate_pps The sink's configured rate limit, points per second (0: none).
# TYPE edgewatch_sink_max_rate_pps gauge
edgewatch_sink_max_rate_pps{sink="north"} 511
edgewatch_sink_max_rate_pps{sink="south"} 0
# HELP edgewatch_sink_oldest_unsent_age_seconds Age of the oldest point the sink has not sent (absent: no backlog).
# TYPE edgewatch_sink_oldest_unsent_age_seconds gauge
edgewatch_sink_oldest_unsent_age_seconds{sink="north"} 4.5
# HELP edgewatch_sink_paused 1 while the sink is paused after its remote end answered 401/403.
# TYPE edgewatch_sink_paused gauge
edgewatch_sink_paused{sink="north"} 0
edgewatch_sink_paused{sink="south"} 1
# HELP edgewatch_sink_replayed_batches Batches sent again after a fault (each may have been duplicated once).
# TYPE edgewatch_sink_replayed_batches gauge
edgewatch_sink_replayed_batches{sink="north"} 509
edgewatch_sink_replayed_batches{sink="south"} 0
# HELP edgewatch_store_synchronous_full 1: every acknowledged write is fsynced first (synchronous = full); 0: normal.
# TYPE edgewatch_store_synchronous_full gauge
edgewatch_store_synchronous_full 1
# HELP edgewatch_tegrastats_bad_lines_total tegrastats lines that could not be parsed.
# TYPE edgewatch_tegrastats_bad_lines_total counter
edgewatch_tegrastats_bad_lines_total 705
# HELP edgewatch_tegrastats_last_sample_age_seconds Seconds since the last tegrastats sample.
# TYPE edgewatch_tegrastats_last_sample_age_seconds gauge
edgewatch_tegrastats_last_sample_age_seconds 0.25
# HELP edgewatch_tegrastats_restarts_total Times tegrastats exited, failed or stalled and was restarted.
# TYPE edgewatch_tegrastats_restarts_total counter
edgewatch_tegrastats_restarts_total 702
# HELP edgewatch_tegrastats_samples_total tegrastats lines parsed and submitted.
# TYPE edgewatch_tegrastats_samples_total counter
edgewatch_tegrastats_samples_total 704
# HELP edgewatch_tegrastats_stalls_total Times tegrastats printed nothing for stall_timeout and was stopped.
# TYPE edgewatch_tegrastats_stalls_total counter
edgewatch_tegrastats_stalls_total 703
# HELP edgewatch_tegrastats_state tegrastats collector state (1 for the current one).
# TYPE edgewatch_tegrastats_state gauge
edgewatch_tegrastats_state{state="replaying"} 1
# HELP edgewatch_udp_datagrams_total UDP datagrams received.
# TYPE edgewatch_udp_datagrams_total counter
edgewatch_udp_datagrams_total 107
# HELP edgewatch_uptime_seconds Seconds since the agent started.
# TYPE edgewatch_uptime_seconds gauge
edgewatch_uptime_seconds 61
# HELP edgewatch_values_written_total Field values committed to the store.
# TYPE edgewatch_values_written_total counter
edgewatch_values_written_total 102
# HELP edgewatch_write_latency_seconds Duration of the writer's last commit.
# TYPE edgewatch_write_latency_seconds gauge
edgewatch_write_latency_seconds 0.0125
"#;

#[test]
fn own_names_are_not_shadowed_by_data() {
    let mut status = Status::default();
    status.ingest.queue_points = 2;
    let text = render(&status, &[l("edgewatch_queue", &[], "points", 9.0)], None);
    assert!(text.contains("edgewatch_queue_points 2"), "{text}");
    assert!(!text.contains(" 9"), "{text}");
}

#[test]
fn commit_durations_are_a_histogram() {
    let h = crate::stats::CommitHistogram::default();
    for secs in [0.0002, 0.003, 0.003, 0.2, 4.0] {
        h.0.observe(secs);
    }
    let text = render(&Status::default(), &[], Some(&h.0));
    for want in [
        "# TYPE edgewatch_commit_duration_seconds histogram",
        r#"edgewatch_commit_duration_seconds_bucket{le="0.0005"} 1"#,
        r#"edgewatch_commit_duration_seconds_bucket{le="0.005"} 3"#,
        r#"edgewatch_commit_duration_seconds_bucket{le="0.25"} 4"#,
        r#"edgewatch_commit_duration_seconds_bucket{le="+Inf"} 5"#,
        "edgewatch_commit_duration_seconds_count 5",
    ] {
        assert!(text.contains(want), "{want}:\n{text}");
    }
}
