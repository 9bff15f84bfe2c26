//! The agent's inventory as data: at start and every `[health] inventory_interval` one
//! `edgewatch_agent_info` point, so the fleet sees which agents run where. Tags: `version`,
//! `device_id`, the Jetson identity the `[jetson]` collector read (`module`, `jetpack`, `l4t`,
//! `power_mode`), the GPUs the NVML collector sees (`gpu_names`, `gpu_archs`:
//! comma-separated, in index order) and `config_sha256` (`crate::config::config_sha256`);
//! a value not known on this device is left out. Fields: `backlog_points` (unsent points of
//! every sink), `uptime_s`, `reported_s` (the report's Unix time: "last seen" where a query
//! language has no time of a sample). No `groups` yet (no `[fleet] groups` key exists).
//! The point goes through the ingest queue like any sample (stored, forwarded; MQTT sinks
//! also publish it retained on `edgewatch/{device_id}/info`, `forward/topics.rs`). It reads
//! the collectors' and sinks' status; it never reads the store or touches a device itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::model::{series_key, Batch, Line, Value};
use crate::queue::IngestHandle;
use crate::stats::Stats;

/// The measurement.
pub const MEASUREMENT: &str = "edgewatch_agent_info";

/// What the inventory is read from.
pub struct Sources {
    /// Where the point goes.
    pub handle: IngestHandle,
    /// `device_id`.
    pub device_id: String,
    /// The running config (its sha256 changes with each reload).
    pub config: Arc<crate::status::config::ConfigState>,
    /// `[fleet] groups`, comma-separated (empty: none).
    pub groups: String,
    /// The Jetson identity (`None`: `[jetson]` off).
    pub jetson: Option<Arc<crate::collect::jetson::JetsonStatus>>,
    /// The GPUs NVML sees (`None`: `[nvml]` off).
    pub nvml: Option<Arc<crate::collect::nvml::NvmlStatus>>,
    /// The sinks' backlog.
    pub forward: crate::status::Live<crate::forward::ForwardStatus>,
}

/// What one report says (read from the status parts; pure to turn into a point).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Info {
    /// The agent's version.
    pub version: String,
    /// `device_id`.
    pub device_id: String,
    /// Jetson module, JetPack, L4T, power mode.
    pub jetson: Option<crate::status::Jetson>,
    /// NVML GPUs (index order).
    pub gpus: Vec<crate::status::Gpu>,
    /// The config's hash.
    pub config_sha256: String,
    /// The device's fleet groups, comma-separated.
    pub groups: String,
    /// Unsent points of every sink.
    pub backlog_points: i64,
    /// Seconds since start.
    pub uptime_s: f64,
}

impl Info {
    /// The `edgewatch_agent_info` point at `ts` (ns).
    pub fn line(&self, ts: i64) -> Line {
        let j = self.jetson.clone().unwrap_or_default();
        let join = |f: fn(&crate::status::Gpu) -> &str| {
            self.gpus.iter().map(f).collect::<Vec<_>>().join(",")
        };
        let (names, archs) = (join(|g| &g.name), join(|g| &g.arch));
        let opt = |v: &Option<String>| v.clone().unwrap_or_default();
        let (module, jetpack, l4t, mode) = (
            opt(&j.module),
            opt(&j.jetpack),
            opt(&j.l4t),
            opt(&j.power_mode),
        );
        // Empty values are left out by `series_key`.
        let tags: [(&str, &str); 10] = [
            ("version", &self.version),
            ("device_id", &self.device_id),
            ("module", &module),
            ("jetpack", &jetpack),
            ("l4t", &l4t),
            ("power_mode", &mode),
            ("gpu_names", &names),
            ("gpu_archs", &archs),
            ("config_sha256", &self.config_sha256),
            ("groups", &self.groups),
        ];
        Line {
            key: series_key(MEASUREMENT, &tags),
            fields: vec![
                ("backlog_points".into(), Value::I64(self.backlog_points)),
                ("uptime_s".into(), Value::F64(self.uptime_s)),
                ("reported_s".into(), Value::F64(ts as f64 / 1e9)),
            ],
            ts,
            line_no: 0,
        }
    }
}

fn read(src: &Sources, started: Instant) -> Info {
    Info {
        version: env!("CARGO_PKG_VERSION").to_string(),
        device_id: src.device_id.clone(),
        jetson: src.jetson.as_ref().map(|j| j.snapshot()),
        gpus: src
            .nvml
            .as_ref()
            .map(|n| n.snapshot().gpus)
            .unwrap_or_default(),
        config_sha256: src.config.info.read(|i| i.sha256.clone()),
        groups: src.groups.clone(),
        backlog_points: src
            .forward
            .get()
            .sinks
            .iter()
            .map(|s| s.get().backlog_points.max(0))
            .sum(),
        uptime_s: started.elapsed().as_secs_f64(),
    }
}

/// Runs until `stop`: once the Jetson identity is read (at most 5 s) and the NVML collector
/// had a moment to list its GPUs, then every `interval`.
pub async fn run(interval: Duration, stats: Arc<Stats>, src: Sources, stop: CancellationToken) {
    let started = Instant::now();
    if let Some(j) = &src.jetson {
        j.settled(Duration::from_secs(5)).await;
    }
    if src.nvml.is_some() {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
    let mut ticker = crate::periodic::Ticker::new(interval);
    while ticker.next(&stop).await.is_some() {
        let line = read(&src, started).line(crate::now_ns());
        super::submit(
            &src.handle,
            &stats,
            Batch { lines: vec![line] },
            "inventory",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jetson_with_a_gpu_reports_every_identity_tag_and_leaves_out_the_unknown() {
        let info = Info {
            version: "1.2.3".into(),
            device_id: "jet-1".into(),
            jetson: Some(crate::status::Jetson {
                module: Some("NVIDIA Jetson Orin Nano".into()),
                jetpack: Some("6.0".into()),
                l4t: Some("36.3.0".into()),
                power_mode: Some("15W".into()),
                ..Default::default()
            }),
            gpus: vec![
                crate::status::Gpu {
                    name: "NVIDIA A2".into(),
                    arch: "Ampere".into(),
                    ..Default::default()
                },
                crate::status::Gpu {
                    name: "NVIDIA T4".into(),
                    arch: "Turing".into(),
                    ..Default::default()
                },
            ],
            config_sha256: "ab12".into(),
            groups: "orin,lab".into(),
            backlog_points: 42,
            uptime_s: 1.5,
        };
        let l = info.line(3_000_000_000);
        assert_eq!(
            l.key,
            "edgewatch_agent_info,config_sha256=ab12,device_id=jet-1,gpu_archs=Ampere\\,Turing,\
             gpu_names=NVIDIA\\ A2\\,NVIDIA\\ T4,groups=orin\\,lab,jetpack=6.0,l4t=36.3.0,\
             module=NVIDIA\\ Jetson\\ Orin\\ Nano,power_mode=15W,version=1.2.3"
        );
        assert_eq!(l.fields[0], ("backlog_points".into(), Value::I64(42)));
        assert_eq!(l.fields[2], ("reported_s".into(), Value::F64(3.0)));
        // A server without [jetson] and no GPU: only what is known.
        let bare = Info {
            jetson: None,
            gpus: vec![],
            groups: String::new(),
            ..info
        };
        assert_eq!(
            bare.line(1).key,
            "edgewatch_agent_info,config_sha256=ab12,device_id=jet-1,version=1.2.3"
        );
    }
}
