//! The integration suite: one test binary (one link), one module per area. Every test
//! starts the real `edgewatch` binary on free 127.0.0.1 ports with its own temp dir, and
//! real peers where it needs them; nothing targets an address outside 127.0.0.0/8.

mod support;

/// Alert rules on the real binary: fire/resolve, restart, no_data, ratio_of, the built-ins,
/// malformed rules.
mod alerts;

/// Commands, config files and errors: `--version`, `--help`, `check-config`, `query`.
mod cli;
/// Acknowledged means durable: sync before 204 (under strace), full and read-only disks.
mod durability;
/// Energy per inference: power rails and inferences through `/api/v1/inference`.
mod energy;
/// Store-and-forward to real mosquitto and InfluxDB.
mod forward;
/// HTTP (InfluxDB 1.x and 2.x APIs) and UDP ingest, partial writes, limits, backpressure,
/// and real Influx client libraries.
mod ingest;
/// The `[jetson]` collector on fixture trees (Orin Nano, AGX Orin, Xavier NX): identity tags,
/// status, power-mode events, throttling, nvmap per-process memory, missing files.
mod jetson;
/// SIGTERM flush, restart persistence, kill -9 recovery, schema refusal.
mod lifecycle;
/// Memory at high cardinality: peak over steady RSS across scrapes, listings and queries;
/// the paged series listing; the query answer bound; /metrics across a restart.
mod memory;
/// The NVML collector and `edgewatch gpus`: without a driver, and exact on a driver when present. and the binary against the
/// stand-in library.
mod nvml_cli;
/// The NVML collector end to end through a stand-in `libnvidia-ml.so.1` built from C.
mod nvml_stub;
/// Rollup tiers, sketches, retention, disk budget and the query engine.
mod rollup;
/// `[[scrape]]`: node_exporter for real, Triton expositions, bad targets.
mod scrape;
/// The tegrastats collector with a fake `tegrastats`, and `edgewatch tegrastats parse`.
mod tegrastats;
/// Web UI in a real browser, /metrics with promtool, access control.
mod web;
