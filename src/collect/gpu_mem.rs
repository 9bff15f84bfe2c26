//! Per-process GPU memory as the GPU collectors last read it, shared with the watched-process
//! collector so that it never reads the devices itself: the NVML collector publishes its
//! `gpu_process` memory (with `[nvml] processes = true`), the Jetson collector its nvmap
//! client list. A leaf holder: pid → bytes with the time of the sample; it reads nothing.

use std::collections::HashMap;

use crate::model::{Line, Value};
use crate::status::StatusCell;

/// The latest per-process GPU memory of one collector.
#[derive(Debug, Default)]
pub struct GpuMemByPid(StatusCell<Option<(i64, HashMap<u32, u64>)>>);

impl GpuMemByPid {
    /// Replaces the map with a sample taken at `ts` (ns); a pid listed twice (several GPUs)
    /// is summed.
    pub fn publish(&self, ts: i64, rows: impl IntoIterator<Item = (u32, u64)>) {
        let mut map: HashMap<u32, u64> = HashMap::new();
        for (pid, bytes) in rows {
            let e = map.entry(pid).or_default();
            *e = e.saturating_add(bytes);
        }
        self.0.update(|m| *m = Some((ts, map)));
    }

    /// Publishes the `pid` tag and the MiB `field` of every `measurement` line of a sample.
    pub fn publish_lines(&self, ts: i64, lines: &[Line], measurement: &str, field: &str) {
        let prefix = format!("{measurement},");
        let rows = lines
            .iter()
            .filter(|l| l.key.starts_with(&prefix))
            .filter_map(|l| {
                let pid = l
                    .key
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("pid="))?
                    .parse::<u32>()
                    .ok()?;
                let mib = l
                    .fields
                    .iter()
                    .find(|(k, _)| k == field)
                    .and_then(|(_, v)| match v {
                        Value::F64(x) => Some(*x),
                        Value::I64(x) => Some(*x as f64),
                        Value::U64(x) => Some(*x as f64),
                        _ => None,
                    })?;
                (mib.is_finite() && mib >= 0.0).then_some((pid, (mib * (1u64 << 20) as f64) as u64))
            });
        self.publish(ts, rows);
    }

    /// The map when it was published at most `max_age_ns` before `now`.
    pub fn latest(&self, now: i64, max_age_ns: i64) -> Option<HashMap<u32, u64>> {
        self.0.read(|m| match m {
            Some((ts, map)) if now.saturating_sub(*ts) <= max_age_ns => Some(map.clone()),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_give_bytes_per_pid_summed_over_gpus_and_stale_maps_are_dropped() {
        let line = |key: &str, mib: f64| Line {
            key: key.into(),
            fields: vec![("mem_used_mb".into(), Value::F64(mib))],
            ts: 0,
            line_no: 0,
        };
        let g = GpuMemByPid::default();
        assert_eq!(g.latest(0, 10), None);
        g.publish_lines(
            100,
            &[
                line("gpu_process,gpu=0,pid=42,process=python3,uuid=a", 1.5),
                line("gpu_process,gpu=1,pid=42,process=python3,uuid=b", 0.5),
                line("gpu,gpu=0,uuid=a", 9.0),
            ],
            "gpu_process",
            "mem_used_mb",
        );
        let m = g.latest(105, 10).unwrap();
        assert_eq!(m.get(&42), Some(&(2u64 << 20)));
        assert_eq!(m.len(), 1);
        assert_eq!(g.latest(200, 10), None);
    }
}
