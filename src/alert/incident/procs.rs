//! The top processes by CPU when an alert fires: two reads of every `/proc/<pid>/stat` a
//! short interval apart, CPU use as the difference of `utime + stime` over the interval.
//! Processes are not stored anywhere, so this is the only moment they can be seen. Reads
//! only the given proc directory; never signals or opens anything else. Parsing is pure.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use super::snapshot::Process;

/// One `/proc/<pid>/stat` line's useful parts.
#[derive(Debug, Clone, PartialEq)]
pub struct Stat {
    /// Process id.
    pub pid: i64,
    /// `comm`.
    pub name: String,
    /// `utime + stime`, clock ticks.
    pub ticks: u64,
    /// Resident pages.
    pub rss_pages: u64,
}

/// Parses one `/proc/<pid>/stat` line (`comm` may hold spaces and parentheses: the name
/// ends at the last `)`).
pub fn parse_stat(line: &str) -> Option<Stat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = line[..open].trim().parse().ok()?;
    let name = line.get(open + 1..close)?.to_string();
    // Fields after the name, starting at field 3 (state): utime is 14, stime 15, rss 24.
    let rest: Vec<&str> = line.get(close + 1..)?.split_ascii_whitespace().collect();
    let at = |n: usize| rest.get(n - 3).and_then(|s| s.parse::<u64>().ok());
    Some(Stat {
        pid,
        name,
        ticks: at(14)?.saturating_add(at(15)?),
        rss_pages: at(24).unwrap_or(0),
    })
}

fn read_all(proc_dir: &Path) -> BTreeMap<i64, Stat> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(proc_dir) else {
        return out;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process may exit between the listing and the read: skip it.
        if let Some(s) = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
        {
            out.insert(s.pid, s);
        }
    }
    out
}

fn clock_ticks_and_page_size() -> (f64, f64) {
    // SAFETY: sysconf only reads system constants.
    let (tck, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (
        if tck > 0 { tck as f64 } else { 100.0 },
        if page > 0 { page as f64 } else { 4096.0 },
    )
}

#[cfg(test)]
thread_local! {
    /// Samples taken on this thread (tests count them).
    pub static SAMPLES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The `n` processes using the most CPU over `interval` (percent of one core), sampled now
/// from `proc_dir`. Empty where `proc_dir` cannot be read.
pub fn top_by_cpu(proc_dir: &Path, interval: Duration, n: usize) -> Vec<Process> {
    #[cfg(test)]
    SAMPLES.with(|c| c.set(c.get() + 1));
    let (tck, page) = clock_ticks_and_page_size();
    let first = read_all(proc_dir);
    let t0 = Instant::now();
    std::thread::sleep(interval);
    let second = read_all(proc_dir);
    let secs = t0.elapsed().as_secs_f64().max(1e-3);
    let mut out: Vec<Process> = second
        .values()
        .map(|s| {
            let before = first
                .get(&s.pid)
                .filter(|f| f.name == s.name)
                .map_or(s.ticks, |f| f.ticks);
            Process {
                pid: s.pid,
                name: s.name.clone(),
                cpu_pct: Some(s.ticks.saturating_sub(before) as f64 / tck / secs * 100.0),
                rss_mb: Some(s.rss_pages as f64 * page / 1_048_576.0),
                gpu_mem_mb: None,
                source: None,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.cpu_pct
            .unwrap_or(0.0)
            .total_cmp(&a.cpu_pct.unwrap_or(0.0))
            .then(b.rss_mb.unwrap_or(0.0).total_cmp(&a.rss_mb.unwrap_or(0.0)))
            .then(a.pid.cmp(&b.pid))
    });
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_with_odd_names() {
        let line =
            "4242 (my (odd) proc) R 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 4 0 100 123456 789 0";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.name, "my (odd) proc");
        assert_eq!(s.ticks, 300);
        assert_eq!(s.rss_pages, 789);
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn a_busy_process_tops_the_list() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, name, ticks) in [(10, "idle", 5u64), (20, "busy", 100)] {
            let d = dir.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("stat"),
                format!("{pid} ({name}) S 1 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0 1 1 10 0"),
            )
            .unwrap();
        }
        std::fs::create_dir_all(dir.path().join("self")).unwrap();
        let top = top_by_cpu(dir.path(), Duration::from_millis(1), 5);
        assert_eq!(top.len(), 2);
        // Nothing moved between the two reads: 0 % each, then ordered by memory and pid.
        assert_eq!(top[0].cpu_pct, Some(0.0));
        // The real /proc: this test process itself is there.
        let me = i64::from(std::process::id());
        let real = top_by_cpu(Path::new("/proc"), Duration::from_millis(20), 10_000);
        assert!(real.iter().any(|p| p.pid == me));
    }
}
