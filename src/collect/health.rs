//! `[health]`: the agent's own health as data. Emits the `edgewatch_agent` and
//! `edgewatch_event` measurements: every `[health] interval` one `edgewatch_agent` point
//! (uptime, memory, CPU, bytes written to storage, ingest counters, queue, last commit,
//! database size, forwarding backlog), one `edgewatch_event,kind=start` point when the agent
//! starts, and the agent's other own events as they are seen at each tick (`own_events.rs`:
//! sink down/up/paused, collector restarts, clock steps). They go
//! through the queue like any sample, so they are stored, rolled up and forwarded with the
//! rest: the fleet sees in InfluxDB/Grafana when an agent restarted, fell behind or dropped
//! data, next to the latency it explains. (`/metrics` exposes the same health natively and
//! leaves these series out.) It reads the agent's counters, /proc/self and the database's
//! size; it never writes to the store itself.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::collect::event::{Event, Severity};
use crate::model::{series_key, Batch, Line, Value};
use crate::queue::IngestHandle;
use crate::stats::Stats;

/// What the collector reads besides the shared counters.
pub struct Sources {
    /// The ingest queue (where samples go, and its depth).
    pub handle: IngestHandle,
    /// The database file (its size, with the WAL).
    pub db_path: PathBuf,
    /// The forwarders (their backlog, and their link for `sink_down`/`sink_up` events).
    pub forward: crate::status::Live<crate::forward::ForwardStatus>,
    /// The tegrastats collector (its restarts become `collector_restart` events).
    pub tegrastats: Option<Arc<crate::collect::tegrastats::TegrastatsStatus>>,
}

/// What the agent's own-events watcher sees now (see [`super::own_events`]).
fn seen(src: &Sources, now: i64) -> super::own_events::Seen {
    let m = crate::clock::Machine::read(now);
    super::own_events::Seen {
        sinks: src.forward.get().sinks.iter().map(|s| s.get()).collect(),
        tegrastats: src.tegrastats.as_ref().map(|t| t.snapshot(now)),
        clock: Some((m.boot_id, m.offset_ns)),
    }
}

/// Resident set size in bytes from `/proc/self/status` text.
pub fn parse_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes the process caused to be written to storage (`write_bytes`) from `/proc/self/io`
/// text.
pub fn parse_write_bytes(io: &str) -> Option<u64> {
    let line = io.lines().find(|l| l.starts_with("write_bytes:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The process's `write_bytes` when the agent started ([`mark_written_start`]).
static WRITTEN_AT_START: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();

fn process_written_bytes() -> Option<u64> {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| parse_write_bytes(&s))
}

/// Marks where the agent's own count starts: the kernel's count belongs to the process,
/// which keeps it across `exec` and adds each reaped child's, so what ran in this process
/// before the agent (the build of a `cargo run`, which execs into the binary; a wrapper
/// script and its children) would otherwise be reported as the agent's. Only the first call
/// counts.
pub fn mark_written_start() {
    WRITTEN_AT_START.get_or_init(process_written_bytes);
}

/// Bytes this agent has caused to be written to storage since it started (since
/// [`mark_written_start`]; `None` where the kernel does not account task IO: no
/// `/proc/self/io`). Its children's writes count once they are reaped.
pub fn own_written_bytes() -> Option<u64> {
    let now = process_written_bytes()?;
    let start = WRITTEN_AT_START.get().copied().flatten().unwrap_or(0);
    Some(now.saturating_sub(start))
}

/// User + system CPU time in clock ticks from `/proc/self/stat` text.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    // After ")": state is field 3, so utime (14) and stime (15) are the 12th and 13th.
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant of the running system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The sampler: keeps the previous CPU reading for a rate.
pub struct Own {
    version: &'static str,
    started: Instant,
    ticks_per_s: f64,
    last_cpu: Option<(Instant, u64)>,
}

impl Own {
    /// A sampler whose uptime counts from now.
    pub fn new() -> Own {
        Own {
            version: env!("CARGO_PKG_VERSION"),
            started: Instant::now(),
            ticks_per_s: clock_ticks_per_s(),
            last_cpu: None,
        }
    }

    /// The start event.
    pub fn start_event(&self, ts: i64) -> Line {
        let pid = std::process::id();
        Event::new(
            "start",
            Severity::Info,
            "agent",
            format!("agent {} started (pid {pid})", self.version),
        )
        .tag("version", self.version)
        .field("pid", Value::I64(i64::from(pid)))
        .line(ts)
    }

    /// One `edgewatch_agent` point.
    pub fn sample(&mut self, ts: i64, stats: &Stats, src: &Sources) -> Line {
        let g = |c: &std::sync::atomic::AtomicU64| {
            Value::I64(i64::try_from(Stats::get(c)).unwrap_or(i64::MAX))
        };
        let int = |n: u64| Value::I64(i64::try_from(n).unwrap_or(i64::MAX));
        let mut fields: Vec<(String, Value)> = vec![
            (
                "uptime_s".into(),
                Value::F64(self.started.elapsed().as_secs_f64()),
            ),
            ("points_written".into(), g(&stats.points_written)),
            ("points_rejected".into(), g(&stats.points_rejected)),
            ("points_dropped".into(), g(&stats.points_dropped)),
            ("writes_throttled".into(), g(&stats.writes_throttled)),
            ("commit_errors".into(), g(&stats.commit_errors)),
            ("collector_errors".into(), g(&stats.collector_errors)),
            ("queue_points".into(), int(src.handle.queued() as u64)),
            (
                "commit_ms".into(),
                Value::F64(Stats::get(&stats.last_commit_us) as f64 / 1000.0),
            ),
            (
                "db_bytes".into(),
                int(crate::store::disk_bytes(&src.db_path)),
            ),
        ];
        if let Some(rss) = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| parse_rss_bytes(&s))
        {
            fields.push(("rss_bytes".into(), int(rss)));
        }
        if let Some(written) = own_written_bytes() {
            fields.push(("disk_written_bytes".into(), int(written)));
        }
        if let Some(ticks) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_cpu_ticks(&s))
        {
            let now = Instant::now();
            if let Some((then, before)) = self.last_cpu {
                let wall = now.duration_since(then).as_secs_f64();
                if wall > 0.0 {
                    let cpu = ticks.saturating_sub(before) as f64 / self.ticks_per_s;
                    fields.push(("cpu_pct".into(), Value::F64(100.0 * cpu / wall)));
                }
            }
            self.last_cpu = Some((now, ticks));
        }
        let forward = src.forward.get();
        if !forward.sinks.is_empty() {
            let sinks: Vec<_> = forward.sinks.iter().map(|s| s.get()).collect();
            let backlog: i64 = sinks.iter().map(|s| s.backlog_points.max(0)).sum();
            fields.push(("forward_backlog_points".into(), Value::I64(backlog)));
            let oldest = sinks
                .iter()
                .filter_map(|s| s.oldest_unsent_age_s)
                .fold(0.0f64, f64::max);
            fields.push(("forward_oldest_unsent_s".into(), Value::F64(oldest)));
        }
        Line {
            key: series_key("edgewatch_agent", &[("version", self.version)]),
            fields,
            ts,
            line_no: 0,
        }
    }
}

impl Default for Own {
    fn default() -> Self {
        Own::new()
    }
}

/// Runs until `shutdown`: the start event, then every `interval` a sample and the agent's
/// own events since the previous one (sinks down/up, collector restarts, clock steps).
pub async fn run(interval: Duration, stats: Arc<Stats>, src: Sources, shutdown: CancellationToken) {
    let mut own = Own::new();
    let mut watch = super::own_events::Watch::new();
    let now = crate::now_ns();
    let start = Batch {
        lines: vec![own.start_event(now)],
    };
    super::submit(&src.handle, &stats, start, "health");
    watch.tick(&seen(&src, now), now);
    let mut ticker = crate::periodic::Ticker::new(interval);
    while ticker.next(&shutdown).await.is_some() {
        let now = crate::now_ns();
        let mut lines = vec![own.sample(now, &stats, &src)];
        for e in watch.tick(&seen(&src, now), now) {
            tracing::info!(kind = %e.kind, "{}", e.message);
            lines.push(e.line(now));
        }
        super::submit(&src.handle, &stats, Batch { lines }, "health");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_and_cpu_from_proc_text() {
        let status = "Name:\tedgewatch\nVmHWM:\t   20000 kB\nVmRSS:\t   11456 kB\nThreads:\t9\n";
        assert_eq!(parse_rss_bytes(status), Some(11456 * 1024));
        assert_eq!(parse_rss_bytes("Name: x\n"), None);
        // A command name with spaces and parentheses; utime 250, stime 50.
        let stat =
            "4242 (edge (watch) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 100 0";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
        assert_eq!(parse_cpu_ticks("4242 (x) S 1"), None);
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn write_bytes_is_read_from_its_own_line_of_proc_io() {
        let io = "rchar: 323934931\nwchar: 323929600\nsyscr: 632687\nsyscw: 632675\n\
                  read_bytes: 0\nwrite_bytes: 323932160\ncancelled_write_bytes: 4096\n";
        assert_eq!(parse_write_bytes(io), Some(323_932_160));
        // `cancelled_write_bytes` ends with the same name: only the line's own key counts.
        let reordered = "cancelled_write_bytes: 4096\nwrite_bytes: 8192\n";
        assert_eq!(parse_write_bytes(reordered), Some(8192));
        assert_eq!(parse_write_bytes("cancelled_write_bytes: 4096\n"), None);
        assert_eq!(parse_write_bytes("write_bytes: lots\n"), None);
        assert_eq!(parse_write_bytes(""), None);
    }

    #[test]
    fn samples_carry_the_counters_and_a_cpu_rate_from_the_second_on() {
        let (handle, _rx) = crate::queue::channel(100);
        let stats = Stats::default();
        Stats::add(&stats.points_written, 42);
        Stats::add(&stats.points_dropped, 3);
        let dir = tempfile::tempdir().unwrap();
        let src = Sources {
            handle,
            db_path: dir.path().join("none.db"),
            forward: Default::default(),
            tegrastats: None,
        };
        let mut own = Own::new();
        let first = own.sample(1, &stats, &src);
        assert!(
            first.key.starts_with("edgewatch_agent,version="),
            "{}",
            first.key
        );
        let field = |l: &Line, k: &str| l.fields.iter().find(|f| f.0 == k).map(|f| f.1.clone());
        assert_eq!(field(&first, "points_written"), Some(Value::I64(42)));
        assert_eq!(field(&first, "points_dropped"), Some(Value::I64(3)));
        assert_eq!(field(&first, "queue_points"), Some(Value::I64(0)));
        assert!(matches!(field(&first, "rss_bytes"), Some(Value::I64(n)) if n > 1_000_000));
        // This kernel accounts task IO (as the agent's own /proc/self/io shows).
        let written = own_written_bytes().expect("/proc/self/io write_bytes");
        assert!(
            matches!(field(&first, "disk_written_bytes"), Some(Value::I64(n)) if n >= 0 && n as u64 <= written),
            "{:?}",
            field(&first, "disk_written_bytes")
        );
        assert_eq!(field(&first, "cpu_pct"), None, "no rate from one reading");
        assert_eq!(field(&first, "forward_backlog_points"), None, "no sinks");
        std::thread::sleep(Duration::from_millis(20));
        let second = own.sample(2, &stats, &src);
        assert!(matches!(field(&second, "cpu_pct"), Some(Value::F64(p)) if p >= 0.0));
        let ev = own.start_event(5);
        assert!(
            ev.key
                .starts_with("edgewatch_event,kind=start,severity=info,source=agent,version="),
            "{}",
            ev.key
        );
    }
}
