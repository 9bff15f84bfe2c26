//! The integration suite: one test binary (one link), one module per area. Every test
//! starts the real `edgewatch` binary on free 127.0.0.1 ports with its own temp dir, and
//! real peers where it needs them; nothing targets an address outside 127.0.0.0/8.

mod support;

/// Alert rules on the real binary: fire/resolve, restart, no_data, ratio_of, the built-ins,
/// malformed rules.
mod alerts;
/// The alert chain end to end: `/write` -> evaluator -> incident -> outbox -> a real
/// Alertmanager (up, down, agent kill -9), and a real firing alert in Chromium.
mod alerts_e2e;

/// Commands, config files and errors: `--version`, `--help`, `check-config`, `query`.
mod cli;
/// The Grafana fleet dashboard (dashboards/influxdb-fleet.json): every variable's and
/// panel's InfluxQL against a real InfluxDB fed by real agents.
mod dashboards;
/// Acknowledged means durable: sync before 204 (under strace), full and read-only disks.
mod durability;
/// Energy per inference: power rails and inferences through `/api/v1/inference`.
mod energy;
/// A fleet of real agents draining a backlog into one real InfluxDB at once: exact counts
/// per device (the full-size run is scripts/fleet.py).
mod fleet;
/// Signed remote config: keygen/sign/publish, retained layers over real mosquitto, HTTP pull
/// with ETag, every bad document refused, ten agents on the same layers.
mod fleet_config;
/// Fleet-true percentiles: ten agents' sketches as native histograms (real Prometheus) and
/// vmrange counters (real VictoriaMetrics), live and after a backlog drain.
mod fleet_hist;
/// Incidents in the fleet's tools: the explanation in Alertmanager, incident points in InfluxDB,
/// the snapshot on MQTT, `edgewatch incident show`, the retained inventory, `check-config`.
mod fleet_incidents;
/// Store-and-forward to real mosquitto and InfluxDB.
mod forward;
/// Alert incidents: each triage finding when its cause is staged (and none on a flat device),
/// the incident API of the real agent, the Alerts tab and incident page in Chromium.
mod incidents;
/// LLM serving signals (`/api/v1/llm`): true TTFT/ITL percentiles, tokens per joule, the
/// prompt-length knee, scraped intervals.
mod llm;

/// Bandwidth-aware forwarding (`forward = "rollup:1m"`, fallback percentiles) and reconnect
/// storms (reconnect jitter, five agents against one 429 receiver).
mod forward_rollup;
/// HTTP (InfluxDB 1.x and 2.x APIs) and UDP ingest, partial writes, limits, backpressure,
/// and real Influx client libraries.
mod ingest;
/// The `[jetson]` collector on fixture trees (Orin Nano, AGX Orin, Xavier NX): identity tags,
/// status, power-mode events, throttling, nvmap per-process memory, missing files.
mod jetson;
/// The kernel log collector on the real `/dev/kmsg`: each event kind injected, a real OOM
/// kill in a memory-limited cgroup, restarts without re-reporting, a 10,000-line flood, the
/// kernel built-in alerts, an unreadable device.
mod kmsg;
/// SIGTERM flush, restart persistence, kill -9 recovery, schema refusal.
mod lifecycle;
/// `[[scrape]] preset = "vllm"` / `"llamacpp"`: served LLM-server pages become `llm` points
/// equal to the bucket math done here; restarts, malformed families, `check-config`.
mod llm_scrape;
/// Memory at high cardinality: peak over steady RSS across scrapes, listings and queries;
/// the paged series listing; the query answer bound; /metrics across a restart.
mod memory;
/// Alert delivery from the outbox: Alertmanager (real, down and back, resends), webhook
/// (kill -9, dead letters, Retry-After), MQTT order, `[[notify]]` errors.
mod notify;
/// The NVML collector and `edgewatch gpus`: without a driver, and exact on a driver when present. and the binary against the
/// stand-in library.
mod nvml_cli;
/// The NVML collector end to end through a stand-in `libnvidia-ml.so.1` built from C.
mod nvml_stub;
/// The agent's own events: a sink down and up again (real mosquitto), a crashing tegrastats.
mod own_events;
/// Power cuts at random moments on a FUSE file system that drops unsynced data
/// (Debian `python3-fusepy`, `fuse3`): every acknowledged point, a clean SQLite, forwarders
/// resuming at least once, rollups exact.
mod powercut;
/// `[[process]]` watched processes: start/exit/restart events with real processes, CPU and
/// RSS points, `ProcessRestarted`, agent restarts, nvmap GPU memory, bad tables.
mod process;
/// Live reload: SIGHUP, the API, `edgewatch reload`, `[config] watch`; alerts, sinks, tags,
/// invalid files, restart-only keys, redacted config, 8 writers during 20 reloads.
mod reload;
/// The `prometheus_remote_write` sink against real VictoriaMetrics and Prometheus, line
/// protocol to VictoriaMetrics, and the PromQL fleet dashboard's queries.
mod remote_write;
/// Rollup tiers, sketches, retention, disk budget and the query engine.
mod rollup;
/// `[[scrape]]`: node_exporter for real, Triton expositions, bad targets.
mod scrape;
/// The tegrastats collector with a fake `tegrastats`, and `edgewatch tegrastats parse`.
mod tegrastats;
/// Web UI in a real browser, /metrics with promtool, access control.
mod web;
