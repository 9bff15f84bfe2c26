//! The watched-process tracker, pure over what a [`ProcSource`] answers: which pids exist,
//! and one pid's `/proc/PID/stat` and command line. It keeps a pid → start-time map (a pid
//! whose start time changed is a new process), reads `stat` and `cmdline` only for pids it
//! has not seen (and once more on their second scan, in case they were caught between
//! `fork` and `exec`), and `stat` every scan only for the watched ones. From two scans it
//! derives the `process_start`, `process_exit` and `process_restart` events and one
//! `process` point per label (count, CPU over the scan interval, RSS, threads, GPU memory
//! where a map is given). It never touches `/proc` itself and never reads a clock.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::config::ProcessConfig;
use crate::collect::event::{Event, Severity};
use crate::model::{series_key, Line, Value};

const NS: i64 = 1_000_000_000;
/// The longest command line kept in an event's `cmdline` field, characters.
pub const CMDLINE_MAX: usize = 256;

/// The fields of `/proc/PID/stat` the tracker uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stat {
    /// `comm` (field 2, up to 15 characters).
    pub comm: String,
    /// State (field 3): `R`, `S`, `Z` (a zombie: exited, not yet reaped), ...
    pub state: char,
    /// `utime + stime` (fields 14 and 15), clock ticks.
    pub cpu_ticks: u64,
    /// `num_threads` (field 20).
    pub threads: u64,
    /// `starttime` (field 22), clock ticks after boot.
    pub start_ticks: u64,
    /// `rss` (field 24), pages.
    pub rss_pages: u64,
    /// `exit_code` (field 52, Linux 3.5 and later; a `waitpid` status, readable while a
    /// zombie), `None` where the line is shorter.
    pub exit_code: Option<i32>,
}

impl Stat {
    /// Whether the process has exited (a zombie, or dead).
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses one `/proc/PID/stat` line; `None` when malformed. `comm` may hold spaces and
/// parentheses: it ends at the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_ascii_whitespace().collect();
    // rest[0] is field 3: field n is rest[n - 3].
    let num = |n: usize| rest.get(n - 3).and_then(|s| s.parse::<u64>().ok());
    let state = rest.first()?.chars().next()?;
    Some(Stat {
        comm,
        state,
        cpu_ticks: num(14)?.saturating_add(num(15)?),
        threads: num(20)?,
        start_ticks: num(22)?,
        // rss is signed in the kernel's format; a negative one reads as 0.
        rss_pages: num(24).unwrap_or(0),
        exit_code: rest.get(52 - 3).and_then(|s| s.parse::<i32>().ok()),
    })
}

/// `/proc/PID/cmdline` (NUL-separated arguments) as one line, arguments joined by spaces.
pub fn join_cmdline(raw: &[u8]) -> String {
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    args.join(" ")
}

/// Whether a process with `comm` and command line `cmdline` (arguments joined by spaces,
/// `argv0` its first argument) matches `rule`.
pub fn matches(rule: &ProcessConfig, comm: &str, argv0: &str, cmdline: &str) -> bool {
    if let Some(name) = &rule.name {
        let base = argv0.rsplit('/').next().unwrap_or(argv0);
        return comm == name || base == name;
    }
    match &rule.cmdline {
        Some(p) if p.contains(['*', '?']) => crate::collect::scrape::glob_match(p, cmdline),
        Some(p) => cmdline.contains(p.as_str()),
        None => false,
    }
}

/// How an exit ended, from a zombie's `exit_code` (a `waitpid` status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// `exit(n)`.
    Code(i32),
    /// Killed by a signal.
    Signal {
        /// The signal number.
        signal: i32,
        /// A core was dumped.
        core: bool,
    },
    /// Not visible: the process was reaped before a scan saw it as a zombie.
    Unknown,
}

impl ExitStatus {
    /// Decodes a `waitpid` status.
    pub fn from_wait(status: i32) -> ExitStatus {
        let sig = status & 0x7f;
        if sig == 0 {
            ExitStatus::Code((status >> 8) & 0xff)
        } else {
            ExitStatus::Signal {
                signal: sig,
                core: status & 0x80 != 0,
            }
        }
    }

    /// `exit code 3`, `killed by SIGKILL (9)`, `exit status not visible`.
    pub fn describe(self) -> String {
        match self {
            ExitStatus::Code(c) => format!("exit code {c}"),
            ExitStatus::Signal { signal, core } => format!(
                "killed by {} ({signal}){}",
                signal_name(signal),
                if core { ", core dumped" } else { "" }
            ),
            ExitStatus::Unknown => "exit status not visible".into(),
        }
    }
}

/// The usual name of a Linux signal (`SIG?` for others).
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => "SIG?",
    }
}

/// Where the tracker reads processes: `/proc` on a device, a table in unit tests.
pub trait ProcSource {
    /// Every pid now.
    fn pids(&mut self) -> Vec<u32>;
    /// One pid's stat; `None` when it is gone or unreadable.
    fn stat(&mut self, pid: u32) -> Option<Stat>;
    /// One pid's raw command line; `None` when it is gone or unreadable.
    fn cmdline(&mut self, pid: u32) -> Option<Vec<u8>>;
}

/// The machine constants the arithmetic needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clock {
    /// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 nearly everywhere).
    pub hz: u64,
    /// Page size, bytes.
    pub page: u64,
    /// Boot time, ns since the epoch (`btime` of `/proc/stat`).
    pub boot_ns: i64,
}

impl Clock {
    /// When a process with `start_ticks` started, ns since the epoch.
    pub fn start_ns(&self, start_ticks: u64) -> i64 {
        let hz = self.hz.max(1);
        let ns = (i128::from(start_ticks) * i128::from(NS) / i128::from(hz)) as i64;
        self.boot_ns.saturating_add(ns)
    }
}

/// CPU use over a wall interval, % of one core. Pure.
pub fn cpu_pct(ticks: u64, hz: u64, wall_ns: i64) -> Option<f64> {
    if wall_ns <= 0 || hz == 0 {
        return None;
    }
    Some(ticks as f64 / hz as f64 / (wall_ns as f64 / NS as f64) * 100.0)
}

/// A pid the tracker knows.
#[derive(Debug, Clone)]
struct Known {
    start_ticks: u64,
    /// Seen in one scan only: re-read once more on the next (fork before exec).
    young: bool,
    watched: Option<Watched>,
}

#[derive(Debug, Clone)]
struct Watched {
    rule: usize,
    start_ns: i64,
    cmdline: String,
    stat: Stat,
    /// `cpu_ticks` at the previous scan (`None`: started since).
    prev_ticks: Option<u64>,
    last_alive_ns: i64,
    /// A scan saw it exited (a zombie): its exit is reported, it is no longer counted.
    exited: bool,
}

/// One label's counters and last event, for the status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelState {
    /// The `process` tag value.
    pub label: String,
    /// The rule as written.
    pub rule: String,
    /// Pids now running (not exited).
    pub pids: Vec<u32>,
    /// `process_start` events.
    pub starts: u64,
    /// `process_exit` events.
    pub exits: u64,
    /// `process_restart` events.
    pub restarts: u64,
    /// The last event: kind, time (ns), message.
    pub last_event: Option<(String, i64, String)>,
}

/// What one scan found.
#[derive(Debug, Default)]
pub struct ScanOut {
    /// The events and the `process` points.
    pub lines: Vec<Line>,
    /// The events alone (kind, label, message), for logs.
    pub events: Vec<(String, String, String)>,
}

/// The tracker.
#[derive(Debug)]
pub struct Tracker {
    rules: Vec<ProcessConfig>,
    labels: Vec<String>,
    clock: Clock,
    restart_window_ns: i64,
    own_pid: u32,
    known: HashMap<u32, Known>,
    /// Per rule: exits not yet paired with a start, (pid, last alive ns).
    pending: Vec<VecDeque<(u32, i64)>>,
    prev_scan_ns: Option<i64>,
    state: Vec<LabelState>,
}

/// An exit found by a scan: the pid, what the tracker knew of it, how it ended.
type Exit = (u32, Watched, ExitStatus);

impl Tracker {
    /// A tracker for `rules`; `own_pid` (the agent) is never watched.
    pub fn new(
        rules: Vec<ProcessConfig>,
        clock: Clock,
        restart_window_ns: i64,
        own_pid: u32,
    ) -> Tracker {
        let state = rules
            .iter()
            .map(|r| LabelState {
                label: r.label(),
                rule: r.rule_text(),
                ..LabelState::default()
            })
            .collect();
        Tracker {
            pending: vec![VecDeque::new(); rules.len()],
            labels: rules.iter().map(|r| r.label()).collect(),
            rules,
            clock,
            restart_window_ns,
            own_pid,
            known: HashMap::new(),
            prev_scan_ns: None,
            state,
        }
    }

    /// The labels' status.
    pub fn state(&self) -> &[LabelState] {
        &self.state
    }

    /// Pids the tracker keeps (all processes seen, watched or not).
    pub fn known_pids(&self) -> usize {
        self.known.len()
    }

    /// Which rule (the first in config order) a process matches.
    fn rule_of(&self, pid: u32, stat: &Stat, raw: &[u8]) -> Option<usize> {
        if pid == self.own_pid || raw.is_empty() || stat.exited() {
            // Kernel threads have no command line; the agent never watches itself.
            return None;
        }
        let argv0 = raw
            .split(|b| *b == 0)
            .next()
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        let line = join_cmdline(raw);
        self.rules
            .iter()
            .position(|r| matches(r, &stat.comm, &argv0, &line))
    }

    /// Reads a pid not known yet (or young); `None` when it is gone. `first`: the first
    /// scan (its processes were already running: no start, CPU counted from now).
    fn discover(&self, src: &mut dyn ProcSource, pid: u32, now: i64, first: bool) -> Option<Known> {
        let stat = src.stat(pid)?;
        let raw = src.cmdline(pid)?;
        let watched = self.rule_of(pid, &stat, &raw).map(|rule| Watched {
            rule,
            start_ns: self.clock.start_ns(stat.start_ticks).min(now),
            cmdline: join_cmdline(&raw).chars().take(CMDLINE_MAX).collect(),
            prev_ticks: None,
            last_alive_ns: now,
            exited: false,
            stat: stat.clone(),
        });
        Some(Known {
            start_ticks: stat.start_ticks,
            young: !first,
            watched,
        })
    }

    /// One scan at `now` (ns). `gpu` maps a pid to its GPU memory, bytes (`None`: not
    /// readable on this machine). The first scan reports no starts: what already runs is
    /// taken as is (an agent restart does not report its processes again).
    pub fn scan(
        &mut self,
        src: &mut dyn ProcSource,
        now: i64,
        gpu: Option<&HashMap<u32, u64>>,
    ) -> ScanOut {
        let first = self.prev_scan_ns.is_none();
        let mut pids = src.pids();
        pids.sort_unstable();
        pids.dedup();
        let mut exits: Vec<Exit> = Vec::new();
        let mut starts: Vec<u32> = Vec::new();
        // Gone from the listing.
        let present: std::collections::HashSet<u32> = pids.iter().copied().collect();
        let gone: Vec<u32> = self
            .known
            .keys()
            .filter(|p| !present.contains(p))
            .copied()
            .collect();
        for pid in gone {
            if let Some(Known {
                watched: Some(w), ..
            }) = self.known.remove(&pid)
            {
                if !w.exited {
                    exits.push((pid, w, ExitStatus::Unknown));
                }
            }
        }
        for pid in pids {
            let Some(mut k) = self.known.remove(&pid) else {
                if let Some(k) = self.discover(src, pid, now, first) {
                    if k.watched.is_some() && !first {
                        starts.push(pid);
                    }
                    self.known.insert(pid, k);
                }
                continue;
            };
            let Some(mut w) = k.watched.take() else {
                if !k.young {
                    self.known.insert(pid, k);
                    continue;
                }
                // Its second scan: it may have exec'd since it was first read.
                if let Some(mut n) = self.discover(src, pid, now, false) {
                    if n.start_ticks == k.start_ticks {
                        n.young = false;
                    }
                    if n.watched.is_some() {
                        starts.push(pid);
                    }
                    self.known.insert(pid, n);
                }
                continue;
            };
            match src.stat(pid) {
                // Exited between the listing and the read.
                None if !w.exited => exits.push((pid, w, ExitStatus::Unknown)),
                None => {}
                Some(st) if st.start_ticks != k.start_ticks => {
                    // The pid was reused: the old process exited, this is another one.
                    if !w.exited {
                        exits.push((pid, w, ExitStatus::Unknown));
                    }
                    if let Some(n) = self.discover(src, pid, now, false) {
                        if n.watched.is_some() {
                            starts.push(pid);
                        }
                        self.known.insert(pid, n);
                    }
                }
                Some(st) => {
                    w.prev_ticks = Some(w.stat.cpu_ticks);
                    if st.exited() && !w.exited {
                        let how = st
                            .exit_code
                            .map_or(ExitStatus::Unknown, ExitStatus::from_wait);
                        w.exited = true;
                        exits.push((pid, w.clone(), how));
                    } else if !w.exited {
                        w.last_alive_ns = now;
                    }
                    w.stat = st;
                    k.young = false;
                    k.watched = Some(w);
                    self.known.insert(pid, k);
                }
            }
        }
        let mut out = ScanOut::default();
        self.report_exits(exits, now, &mut out);
        self.report_starts(&starts, &mut out);
        self.points(now, gpu, first, &mut out);
        self.prev_scan_ns = Some(now);
        out
    }

    fn note(&mut self, rule: usize, ev: Event, ts: i64, out: &mut ScanOut) {
        out.lines.push(ev.line(ts));
        let st = &mut self.state[rule];
        match ev.kind.as_str() {
            "process_start" => st.starts += 1,
            "process_exit" => st.exits += 1,
            _ => st.restarts += 1,
        }
        st.last_event = Some((ev.kind.clone(), ts, ev.message.clone()));
        out.events
            .push((ev.kind, self.labels[rule].clone(), ev.message));
    }

    fn report_exits(&mut self, exits: Vec<Exit>, now: i64, out: &mut ScanOut) {
        for (pid, w, how) in exits {
            let label = self.labels[w.rule].clone();
            let runtime_s = (now - w.start_ns).max(0) as f64 / NS as f64;
            let mut ev = Event::new(
                "process_exit",
                Severity::Warning,
                "process",
                format!(
                    "{label} (pid {pid}) exited after {:.0} s: {}",
                    runtime_s,
                    how.describe()
                ),
            )
            .tag("process", label)
            .field("pid", Value::I64(i64::from(pid)))
            .field("runtime_s", Value::F64(runtime_s));
            match how {
                ExitStatus::Code(c) => ev = ev.field("exit_code", Value::I64(i64::from(c))),
                ExitStatus::Signal { signal, core } => {
                    ev = ev
                        .field("signal", Value::I64(i64::from(signal)))
                        .field("signal_name", Value::Str(signal_name(signal).into()))
                        .field("core_dumped", Value::Bool(core));
                }
                ExitStatus::Unknown => {}
            }
            self.note(w.rule, ev, now, out);
            self.pending[w.rule].push_back((pid, w.last_alive_ns));
        }
        let window = self.restart_window_ns;
        for p in &mut self.pending {
            p.retain(|(_, alive)| now - alive <= window);
        }
    }

    fn report_starts(&mut self, starts: &[u32], out: &mut ScanOut) {
        for pid in starts {
            let Some(w) = self.known.get(pid).and_then(|k| k.watched.clone()) else {
                continue;
            };
            let label = self.labels[w.rule].clone();
            let ev = Event::new(
                "process_start",
                Severity::Info,
                "process",
                format!("{label} started (pid {pid}): {}", w.cmdline),
            )
            .tag("process", label.clone())
            .field("pid", Value::I64(i64::from(*pid)))
            .field("cmdline", Value::Str(w.cmdline.clone()));
            self.note(w.rule, ev, w.start_ns, out);
            // The oldest exit of the label within the window before this start.
            let window = self.restart_window_ns;
            let paired = self.pending[w.rule]
                .iter()
                .position(|(_, alive)| w.start_ns - alive <= window);
            if let Some(i) = paired {
                if let Some((old, alive)) = self.pending[w.rule].remove(i) {
                    let down = (w.start_ns - alive).max(0) as f64 / NS as f64;
                    let ev = Event::new(
                        "process_restart",
                        Severity::Warning,
                        "process",
                        format!("{label} restarted: pid {old} → {pid}, down at most {down:.1} s"),
                    )
                    .tag("process", label)
                    .field("old_pid", Value::I64(i64::from(old)))
                    .field("new_pid", Value::I64(i64::from(*pid)))
                    .field("downtime_s", Value::F64(down));
                    self.note(w.rule, ev, w.start_ns, out);
                }
            }
        }
    }

    /// One `process` point per label.
    fn points(
        &mut self,
        now: i64,
        gpu: Option<&HashMap<u32, u64>>,
        first: bool,
        out: &mut ScanOut,
    ) {
        let wall = self.prev_scan_ns.map(|p| now - p);
        let mut by_rule: BTreeMap<usize, Vec<(u32, &Watched)>> = BTreeMap::new();
        for (pid, k) in &self.known {
            if let Some(w) = k.watched.as_ref().filter(|w| !w.exited) {
                by_rule.entry(w.rule).or_default().push((*pid, w));
            }
        }
        for (rule, label) in self.labels.iter().enumerate() {
            let mut ws = by_rule.remove(&rule).unwrap_or_default();
            ws.sort_by_key(|(pid, w)| (w.start_ns, *pid));
            let mut fields = vec![("count".to_string(), Value::I64(ws.len() as i64))];
            self.state[rule].pids = ws.iter().map(|(p, _)| *p).collect();
            if let Some((pid, oldest)) = ws.first() {
                fields.push(("pid".into(), Value::I64(i64::from(*pid))));
                let up = (now - oldest.start_ns).max(0) as f64 / NS as f64;
                fields.push(("uptime_s".into(), Value::F64(up)));
                // CPU since the previous scan: a pid started since counts all it used.
                let ticks: u64 = ws
                    .iter()
                    .map(|(_, w)| w.stat.cpu_ticks.saturating_sub(w.prev_ticks.unwrap_or(0)))
                    .sum();
                if let Some(pct) = wall
                    .filter(|_| !first)
                    .and_then(|ns| cpu_pct(ticks, self.clock.hz, ns))
                {
                    fields.push(("cpu_pct".into(), Value::F64(pct)));
                }
                let rss: u64 = ws.iter().map(|(_, w)| w.stat.rss_pages).sum();
                fields.push((
                    "rss_bytes".into(),
                    Value::I64(rss.saturating_mul(self.clock.page).min(i64::MAX as u64) as i64),
                ));
                let threads: u64 = ws.iter().map(|(_, w)| w.stat.threads).sum();
                fields.push(("threads".into(), Value::I64(threads as i64)));
                if let Some(map) = gpu {
                    let mem: Vec<u64> =
                        ws.iter().filter_map(|(p, _)| map.get(p).copied()).collect();
                    if !mem.is_empty() {
                        let sum: u64 = mem.iter().sum();
                        fields.push((
                            "gpu_mem_bytes".into(),
                            Value::I64(sum.min(i64::MAX as u64) as i64),
                        ));
                    }
                }
            }
            out.lines.push(Line {
                key: series_key("process", &[("process", label)]),
                fields,
                ts: now,
                line_no: 0,
            });
        }
    }
}
