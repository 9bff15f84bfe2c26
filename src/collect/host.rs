//! The host collector: CPU (total and per core), memory, swap, load and uptime from
//! `/proc`, and every temperature under `/sys/class/thermal` and `/sys/class/hwmon`. Works on
//! any Linux, so a plain `edgewatch run` stores real data everywhere.
//!
//! Measurements (a contract once released; see docs/collectors.md):
//! - `host`: `cpu_pct`, `mem_total_mb`, `mem_used_mb`, `mem_available_mb`, `mem_used_pct`,
//!   `swap_total_mb`, `swap_used_mb`, `load1`, `load5`, `load15`, `uptime_s`, `procs_running`
//! - `host_cpu,core=N`: `usage_pct`
//! - `thermal,zone=NAME,sensor=PATH`: `temp_c`
//!
//! Parsing is pure (functions of file contents); only [`HostCollector::sample`] reads files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::model::{series_key, Batch, Line, Value};
use crate::queue::IngestHandle;
use crate::stats::Stats;

/// Jiffies of one CPU line of /proc/stat: (busy, total).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    /// Non-idle jiffies.
    pub busy: u64,
    /// All jiffies.
    pub total: u64,
}

/// Parses `/proc/stat`: the aggregate `cpu` line first, then `cpuN` lines by N.
pub fn parse_proc_stat(text: &str) -> (Option<CpuTimes>, Vec<(u32, CpuTimes)>, Option<u64>) {
    let mut total = None;
    let mut cores = Vec::new();
    let mut running = None;
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let Some(name) = it.next() else { continue };
        if name == "procs_running" {
            running = it.next().and_then(|v| v.parse().ok());
            continue;
        }
        let Some(rest) = name.strip_prefix("cpu") else {
            continue;
        };
        let vals: Vec<u64> = it.map_while(|v| v.parse().ok()).collect();
        if vals.len() < 4 {
            continue;
        }
        // user nice system idle iowait irq softirq steal (guest is already in user)
        let idle = vals[3] + vals.get(4).copied().unwrap_or(0);
        let all: u64 = vals.iter().take(8).sum();
        let t = CpuTimes {
            busy: all.saturating_sub(idle),
            total: all,
        };
        if rest.is_empty() {
            total = Some(t);
        } else if let Ok(n) = rest.parse() {
            cores.push((n, t));
        }
    }
    (total, cores, running)
}

/// Percent busy between two readings; `None` if no time passed.
pub fn cpu_pct(prev: CpuTimes, now: CpuTimes) -> Option<f64> {
    let dt = now.total.checked_sub(prev.total)?;
    if dt == 0 {
        return None;
    }
    let db = now.busy.saturating_sub(prev.busy);
    Some((db as f64 * 100.0 / dt as f64).clamp(0.0, 100.0))
}

/// `/proc/meminfo` values in kB, by key.
pub fn parse_meminfo(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let n = v.split_ascii_whitespace().next()?.parse().ok()?;
            Some((k.trim(), n))
        })
        .collect()
}

/// `/proc/loadavg`: load1, load5, load15.
pub fn parse_loadavg(text: &str) -> Option<(f64, f64, f64)> {
    let mut it = text.split_ascii_whitespace().map(|v| v.parse::<f64>().ok());
    Some((it.next()??, it.next()??, it.next()??))
}

/// A temperature file holds millidegrees Celsius. Values outside a physical range
/// (disconnected sensors report e.g. -273 °C or 255 °C+) are not temperatures.
pub fn parse_millideg(text: &str) -> Option<f64> {
    let v: f64 = text.trim().parse::<i64>().ok()? as f64 / 1000.0;
    (-60.0..=200.0).contains(&v).then_some(v)
}

/// One temperature sensor found under /sys.
#[derive(Debug, Clone, PartialEq)]
pub struct Sensor {
    /// Zone name (thermal zone `type`, or hwmon `name/label`).
    pub zone: String,
    /// Where it was read, e.g. `thermal_zone0` or `hwmon1/temp2`.
    pub sensor: String,
    /// File holding millidegrees.
    pub path: PathBuf,
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Finds every thermal zone and hwmon temperature input under `sys` (normally `/sys`).
pub fn discover_sensors(sys: &Path) -> Vec<Sensor> {
    let mut out = Vec::new();
    let entries = |dir: PathBuf| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    for zone in entries(sys.join("class/thermal")) {
        let name = zone
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !name.starts_with("thermal_zone") {
            continue;
        }
        let ty = read_trim(&zone.join("type")).unwrap_or_else(|| name.clone());
        out.push(Sensor {
            zone: ty,
            sensor: name,
            path: zone.join("temp"),
        });
    }
    for hw in entries(sys.join("class/hwmon")) {
        let hwname = hw
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let chip = read_trim(&hw.join("name")).unwrap_or_else(|| hwname.clone());
        for f in entries(hw.clone()) {
            let fname = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let Some(idx) = fname
                .strip_prefix("temp")
                .and_then(|r| r.strip_suffix("_input"))
            else {
                continue;
            };
            let label = read_trim(&hw.join(format!("temp{idx}_label")))
                .unwrap_or_else(|| format!("temp{idx}"));
            out.push(Sensor {
                zone: format!("{chip}/{label}"),
                sensor: format!("{hwname}/temp{idx}"),
                path: f,
            });
        }
    }
    out
}

/// Samples the host; keeps the previous CPU readings to compute usage.
pub struct HostCollector {
    proc_dir: PathBuf,
    sensors: Vec<Sensor>,
    prev_total: Option<CpuTimes>,
    prev_cores: HashMap<u32, CpuTimes>,
}

impl HostCollector {
    /// A collector reading `proc_dir` (normally `/proc`) and `sys_dir` (normally `/sys`).
    pub fn new(proc_dir: &Path, sys_dir: &Path) -> HostCollector {
        HostCollector {
            proc_dir: proc_dir.to_path_buf(),
            sensors: discover_sensors(sys_dir),
            prev_total: None,
            prev_cores: HashMap::new(),
        }
    }

    /// Number of temperature sensors found.
    pub fn sensor_count(&self) -> usize {
        self.sensors.len()
    }

    /// Reads everything once into lines stamped `ts`. CPU usage needs two samples, so the
    /// first call has no CPU fields.
    pub fn sample(&mut self, ts: i64) -> Batch {
        let mut host: Vec<(String, Value)> = Vec::new();
        let mut lines = Vec::new();
        let f = |k: &str, v: f64| (k.to_string(), Value::F64(v));
        if let Ok(stat) = std::fs::read_to_string(self.proc_dir.join("stat")) {
            let (total, cores, running) = parse_proc_stat(&stat);
            if let (Some(prev), Some(now)) = (self.prev_total, total) {
                if let Some(p) = cpu_pct(prev, now) {
                    host.push(f("cpu_pct", p));
                }
            }
            self.prev_total = total;
            for (n, now) in cores {
                if let Some(p) = self.prev_cores.get(&n).and_then(|prev| cpu_pct(*prev, now)) {
                    lines.push(Line {
                        key: series_key("host_cpu", &[("core", &n.to_string())]),
                        fields: vec![f("usage_pct", p)],
                        ts,
                        line_no: 0,
                    });
                }
                self.prev_cores.insert(n, now);
            }
            if let Some(r) = running {
                host.push(f("procs_running", r as f64));
            }
        }
        if let Ok(mem) = std::fs::read_to_string(self.proc_dir.join("meminfo")) {
            let m = parse_meminfo(&mem);
            let mb = |k: &str| m.get(k).map(|kb| *kb as f64 / 1024.0);
            if let (Some(total), Some(avail)) = (mb("MemTotal"), mb("MemAvailable")) {
                host.push(f("mem_total_mb", total));
                host.push(f("mem_available_mb", avail));
                host.push(f("mem_used_mb", total - avail));
                if total > 0.0 {
                    host.push(f("mem_used_pct", (total - avail) * 100.0 / total));
                }
            }
            if let (Some(st), Some(sf)) = (mb("SwapTotal"), mb("SwapFree")) {
                host.push(f("swap_total_mb", st));
                host.push(f("swap_used_mb", st - sf));
            }
        }
        if let Some((l1, l5, l15)) = std::fs::read_to_string(self.proc_dir.join("loadavg"))
            .ok()
            .and_then(|t| parse_loadavg(&t))
        {
            host.push(f("load1", l1));
            host.push(f("load5", l5));
            host.push(f("load15", l15));
        }
        if let Some(up) = std::fs::read_to_string(self.proc_dir.join("uptime"))
            .ok()
            .and_then(|t| t.split_ascii_whitespace().next()?.parse::<f64>().ok())
        {
            host.push(f("uptime_s", up));
        }
        if !host.is_empty() {
            lines.push(Line {
                key: "host".into(),
                fields: host,
                ts,
                line_no: 0,
            });
        }
        for s in &self.sensors {
            if let Some(t) = read_trim(&s.path).and_then(|v| parse_millideg(&v)) {
                lines.push(Line {
                    key: series_key("thermal", &[("zone", &s.zone), ("sensor", &s.sensor)]),
                    fields: vec![f("temp_c", t)],
                    ts,
                    line_no: 0,
                });
            }
        }
        Batch { lines }
    }
}

/// Samples every `interval` until `shutdown`; missed ticks are skipped, not bunched.
pub async fn run(
    interval: Duration,
    handle: IngestHandle,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) {
    let mut collector = HostCollector::new(Path::new("/proc"), Path::new("/sys"));
    tracing::info!(
        sensors = collector.sensor_count(),
        ?interval,
        "host collector started"
    );
    let mut ticker = crate::periodic::Ticker::new(interval);
    while ticker.next(&shutdown).await.is_some() {
        // A sample reads a few dozen small files: microseconds, fine on a worker thread.
        let batch = collector.sample(crate::now_ns());
        super::submit(&handle, &stats, batch, "host");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_gives_total_cores_and_running() {
        let text = "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 50 0 50 350 50 0 0 0 0 0\ncpu1 50 0 50 350 50 0 0 0 0 0\nintr 1 2\nprocs_running 3\n";
        let (total, cores, running) = parse_proc_stat(text);
        assert_eq!(
            total,
            Some(CpuTimes {
                busy: 200,
                total: 1000
            })
        );
        assert_eq!(cores.len(), 2);
        assert_eq!(running, Some(3));
        let later = CpuTimes {
            busy: 300,
            total: 1200,
        };
        assert_eq!(cpu_pct(total.unwrap(), later), Some(50.0));
        assert_eq!(cpu_pct(later, later), None);
    }

    #[test]
    fn meminfo_and_loadavg_parse() {
        let m = parse_meminfo(
            "MemTotal:       16000 kB\nMemAvailable:    4000 kB\nHugePages_Total:       0\n",
        );
        assert_eq!(m.get("MemTotal"), Some(&16000));
        assert_eq!(m.get("HugePages_Total"), Some(&0));
        assert_eq!(
            parse_loadavg("0.50 1.00 1.50 2/300 1234\n"),
            Some((0.5, 1.0, 1.5))
        );
        assert_eq!(parse_loadavg("garbage"), None);
    }

    #[test]
    fn bogus_temperatures_are_not_stored() {
        assert_eq!(parse_millideg("45500\n"), Some(45.5));
        assert_eq!(parse_millideg("-273000"), None);
        assert_eq!(parse_millideg("x"), None);
    }

    #[test]
    fn sample_from_a_fake_proc_and_sys() {
        let dir = tempfile::tempdir().unwrap();
        let proc_dir = dir.path().join("proc");
        let sys = dir.path().join("sys");
        std::fs::create_dir_all(&proc_dir).unwrap();
        std::fs::create_dir_all(sys.join("class/thermal/thermal_zone0")).unwrap();
        std::fs::create_dir_all(sys.join("class/hwmon/hwmon0")).unwrap();
        std::fs::write(
            sys.join("class/thermal/thermal_zone0/type"),
            "cpu-thermal\n",
        )
        .unwrap();
        std::fs::write(sys.join("class/thermal/thermal_zone0/temp"), "51000\n").unwrap();
        std::fs::write(sys.join("class/hwmon/hwmon0/name"), "nvme\n").unwrap();
        std::fs::write(sys.join("class/hwmon/hwmon0/temp1_input"), "38850\n").unwrap();
        std::fs::write(sys.join("class/hwmon/hwmon0/temp1_label"), "Composite\n").unwrap();
        std::fs::write(
            proc_dir.join("stat"),
            "cpu 10 0 10 80 0 0 0 0\ncpu0 10 0 10 80 0 0 0 0\n",
        )
        .unwrap();
        std::fs::write(
            proc_dir.join("meminfo"),
            "MemTotal: 2048 kB\nMemAvailable: 1024 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n",
        )
        .unwrap();
        std::fs::write(proc_dir.join("loadavg"), "0.1 0.2 0.3 1/2 3\n").unwrap();
        let mut c = HostCollector::new(&proc_dir, &sys);
        assert_eq!(c.sensor_count(), 2);
        let first = c.sample(1);
        std::fs::write(
            proc_dir.join("stat"),
            "cpu 40 0 10 110 0 0 0 0\ncpu0 40 0 10 110 0 0 0 0\n",
        )
        .unwrap();
        let second = c.sample(2);
        let keys: Vec<&str> = second.lines.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "host_cpu,core=0",
                "host",
                "thermal,sensor=thermal_zone0,zone=cpu-thermal",
                "thermal,sensor=hwmon0/temp1,zone=nvme/Composite"
            ]
        );
        let host = &second.lines[1];
        assert!(host.fields.contains(&("cpu_pct".into(), Value::F64(50.0))));
        assert!(host
            .fields
            .contains(&("mem_used_pct".into(), Value::F64(50.0))));
        assert!(!first.lines.iter().any(|l| l.key.starts_with("host_cpu")));
        assert_eq!(second.lines[3].fields[0].1, Value::F64(38.85));
    }
    /// The collector on this machine's real /proc and /sys: every value it reports is
    /// within its physical range, and it reports every core and readable sensor there is.
    #[test]
    fn samples_this_machines_real_proc_and_sys() {
        let field = |line: &Line, k: &str| -> f64 {
            match line.fields.iter().find(|(n, _)| n == k) {
                Some((_, Value::F64(v))) => *v,
                other => panic!("{k}: {other:?} in {line:?}"),
            }
        };
        let stat = std::fs::read_to_string("/proc/stat").unwrap();
        let cores: Vec<String> = stat
            .lines()
            .filter_map(|l| l.split_ascii_whitespace().next()?.strip_prefix("cpu"))
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        assert!(!cores.is_empty(), "no cpuN line in /proc/stat");
        let mut c = HostCollector::new(Path::new("/proc"), Path::new("/sys"));
        let first = c.sample(1);
        assert!(!first.lines.iter().any(|l| l.key.starts_with("host_cpu")));
        // Some work between the samples, so that every core's clock has moved on.
        let until = std::time::Instant::now() + Duration::from_millis(300);
        let mut spin = 0u64;
        while std::time::Instant::now() < until {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let second = c.sample(2);
        for batch in [&first, &second] {
            let host = batch
                .lines
                .iter()
                .find(|l| l.key == "host")
                .expect("host line");
            let total = field(host, "mem_total_mb");
            let avail = field(host, "mem_available_mb");
            assert!(total > 0.0 && (0.0..=total).contains(&avail), "{host:?}");
            assert_eq!(field(host, "mem_used_mb"), total - avail);
            assert!((0.0..=100.0).contains(&field(host, "mem_used_pct")));
            assert!(field(host, "swap_used_mb") >= 0.0);
            assert!(field(host, "swap_used_mb") <= field(host, "swap_total_mb"));
            for k in ["load1", "load5", "load15"] {
                let v = field(host, k);
                assert!(v.is_finite() && v >= 0.0, "{k} = {v}");
            }
            assert!(field(host, "uptime_s") > 0.0);
            assert!(field(host, "procs_running") >= 1.0, "this test is running");
        }
        let host = second.lines.iter().find(|l| l.key == "host").unwrap();
        assert!((0.0..=100.0).contains(&field(host, "cpu_pct")), "{host:?}");
        let mut seen = Vec::new();
        for l in second
            .lines
            .iter()
            .filter(|l| l.key.starts_with("host_cpu,"))
        {
            let core = l.key.strip_prefix("host_cpu,core=").unwrap().to_string();
            assert!((0.0..=100.0).contains(&field(l, "usage_pct")), "{l:?}");
            seen.push(core);
        }
        assert_eq!(seen, cores, "one host_cpu line per core of /proc/stat");
        // Every thermal line is a discovered sensor with a plausible value; a discovered
        // sensor without a line is one that cannot be read (or reads implausibly) now.
        let sensors = discover_sensors(Path::new("/sys"));
        assert_eq!(c.sensor_count(), sensors.len());
        for s in &sensors {
            let key = series_key("thermal", &[("zone", &s.zone), ("sensor", &s.sensor)]);
            match second.lines.iter().find(|l| l.key == key) {
                Some(l) => assert!((-60.0..=200.0).contains(&field(l, "temp_c")), "{l:?}"),
                None => assert_eq!(
                    read_trim(&s.path).and_then(|v| parse_millideg(&v)),
                    None,
                    "{s:?} readable but not sampled"
                ),
            }
        }
        let thermal = second
            .lines
            .iter()
            .filter(|l| l.key.starts_with("thermal,"));
        assert!(thermal.count() <= sensors.len());
    }
}
