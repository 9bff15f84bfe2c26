//! The pure half of the kernel log collector: one `/dev/kmsg` record (`prio,seq,ts_usec,
//! flags[,...];message` plus ` KEY=value` continuation lines, non-printable bytes escaped as
//! `\xNN`) into a [`Record`], and the records that matter into [`Event`]s through a small
//! state machine ([`Classifier`]): an OOM kill's `oom-kill:` line (with the cgroup) is joined
//! with the `Killed process` line that follows it, and the many lines of one Jetson nvgpu MMU
//! fault dump become one event. No IO and no clock: times are the record's own.
//!
//! Line formats, as the drivers and the kernel print them (the tests quote real lines):
//! - NVIDIA Xid: `NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, <detail>`; older
//!   drivers print no `pid`/`name` (`32, Channel ID 00000000 intr 00004000`), newer ones
//!   `pid='<unknown>', name=<unknown>` when no process is to blame.
//! - GPU off the bus without an Xid: `NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.`
//!   and the multi-line `NVRM: The NVIDIA GPU 0000:b3:00.0 ... fallen off the bus and is not
//!   responding to commands.`
//! - Jetson nvgpu: `nvgpu: 17000000.gpu <function>:<line> [ERR] ... mmu fault ...`.
//! - Tegra soctherm over-current: `soctherm: OC ALARM 0x00000001`.
//! - Thermal: `thermal thermal_zone0: critical temperature reached (105 C), shutting down`
//!   (newer kernels: `thermal thermal_zone0: acpitz: critical temperature reached`), `...:
//!   hot temperature reached`, x86 `CPU0: Core temperature above threshold, cpu clock
//!   throttled (total events = 1)`, and `thermal_zone... tripped` lines.
//! - OOM killer: `oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/test,task_memcg=/test,
//!   task=stress,pid=1234,uid=0` then `Memory cgroup out of memory: Killed process 1234
//!   (stress) total-vm:...kB, anon-rss:...kB, ...` (`Out of memory: ...` for the system).

use crate::collect::event::{Event, Severity};
use crate::model::Value;

/// The `source` tag of every kernel event.
pub const SOURCE: &str = "kernel";

/// Nvgpu MMU fault lines this close (µs) to the last one are part of the same dump.
const MMU_FAULT_DUMP_US: u64 = 2_000_000;

/// One `/dev/kmsg` record.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Syslog priority (facility * 8 + level).
    pub prio: u32,
    /// The kernel's sequence number of the record (consecutive; a gap is records lost).
    pub seq: u64,
    /// When it was logged, µs since boot (the printk clock).
    pub ts_usec: u64,
    /// The message, `\xNN` escapes undone (it may hold newlines).
    pub message: String,
}

/// Why a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// No `;` between the header and the message.
    #[error("no ';' after the record header")]
    NoHeader,
    /// A header field is missing or not a number.
    #[error("bad record header field {0:?}")]
    BadField(&'static str),
}

/// Parses one record as one `read(2)` of `/dev/kmsg` returns it.
pub fn parse_record(buf: &[u8]) -> Result<Record, ParseError> {
    let semi = buf
        .iter()
        .position(|&b| b == b';')
        .ok_or(ParseError::NoHeader)?;
    let header = std::str::from_utf8(&buf[..semi]).map_err(|_| ParseError::NoHeader)?;
    let mut f = header.split(',');
    let mut num = |name: &'static str| -> Result<u64, ParseError> {
        f.next()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or(ParseError::BadField(name))
    };
    let prio = u32::try_from(num("prio")?).map_err(|_| ParseError::BadField("prio"))?;
    let seq = num("seq")?;
    let ts_usec = num("ts_usec")?;
    let body = &buf[semi + 1..];
    // The message ends at the first newline; continuation lines (` KEY=value`) follow.
    let end = body.iter().position(|&b| b == b'\n').unwrap_or(body.len());
    Ok(Record {
        prio,
        seq,
        ts_usec,
        message: unescape(&body[..end]),
    })
}

/// Undoes the kernel's `\xNN` escaping (a `\` not followed by `xNN` stays as it is).
pub fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\' && i + 3 < raw.len() && raw.get(i + 1) == Some(&b'x') {
            let hex = raw
                .get(i + 2..i + 4)
                .and_then(|h| std::str::from_utf8(h).ok());
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An event found in a record, with the record's time.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// The event.
    pub event: Event,
    /// The record's time, µs since boot.
    pub ts_usec: u64,
    /// Whether it is an OOM kill the log named (counted against `/proc/vmstat`).
    pub oom_kill: bool,
}

/// The `oom-kill:` line of a kill whose `Killed process` line has not come yet.
#[derive(Debug, Clone, Default, PartialEq)]
struct PendingOom {
    pid: Option<i64>,
    task: Option<String>,
    cgroup: Option<String>,
    constraint: Option<String>,
}

/// Turns records into events; holds what spans records (an OOM kill's two lines, an
/// nvgpu fault dump).
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    fatal: Vec<u32>,
    pending_oom: Option<PendingOom>,
    last_mmu_fault_us: Option<u64>,
}

impl Classifier {
    /// A classifier that reports the Xid codes in `fatal` as critical.
    pub fn new(fatal: &[u32]) -> Classifier {
        Classifier {
            fatal: fatal.to_vec(),
            ..Classifier::default()
        }
    }

    /// The event of `rec`, if it is one of the kinds watched.
    pub fn classify(&mut self, rec: &Record) -> Option<Found> {
        let msg = rec.message.as_str();
        let found = |event: Event| Found {
            event: event.field("count", Value::I64(1)),
            ts_usec: rec.ts_usec,
            oom_kill: false,
        };
        if let Some(e) = self.xid(msg) {
            return Some(found(e));
        }
        if msg.contains("fallen off the bus") && msg.contains("NVRM") {
            return Some(found(fell_off_bus(msg)));
        }
        if let Some(rest) = msg.strip_prefix("oom-kill:") {
            self.pending_oom = Some(parse_oom_kill_line(rest));
            return None;
        }
        if let Some(at) = msg.find("Killed process ") {
            let pending = self.pending_oom.take();
            let mut f = found(oom_killed(msg, at, pending)?);
            f.oom_kill = true;
            return Some(f);
        }
        if let Some(e) = self.nvgpu(msg, rec.ts_usec) {
            return Some(found(e));
        }
        if let Some(e) = overcurrent(msg) {
            return Some(found(e));
        }
        thermal(msg).map(found)
    }

    fn xid(&self, msg: &str) -> Option<Event> {
        let x = parse_xid(msg)?;
        let fatal = self.fatal.contains(&x.code);
        let severity = if fatal {
            Severity::Critical
        } else {
            Severity::Warning
        };
        let mut text = format!(
            "GPU {} Xid {}{}",
            x.pci,
            x.code,
            if fatal { " (fatal)" } else { "" }
        );
        if !x.detail.is_empty() {
            text.push_str(": ");
            text.push_str(&x.detail);
        }
        match (&x.pid, &x.name) {
            (Some(p), Some(n)) => text.push_str(&format!(" (pid {p}, {n})")),
            (Some(p), None) => text.push_str(&format!(" (pid {p})")),
            (None, Some(n)) => text.push_str(&format!(" ({n})")),
            (None, None) => {}
        }
        let mut e = Event::new("xid", severity, SOURCE, text)
            .field("code", Value::I64(i64::from(x.code)))
            .field("fatal", Value::Bool(fatal))
            .field("pci", Value::Str(x.pci));
        if let Some(p) = x.pid {
            e = e.field("pid", Value::I64(p));
        }
        if let Some(n) = x.name {
            e = e.field("name", Value::Str(n));
        }
        Some(e.field("detail", Value::Str(x.detail)))
    }

    fn nvgpu(&mut self, msg: &str, ts: u64) -> Option<Event> {
        let at = msg.find("nvgpu:")?;
        let lower = msg.to_ascii_lowercase();
        if !(lower.contains("mmu fault") || lower.contains("mmu_fault")) {
            return None;
        }
        // One fault prints a dump of several lines: the first one stands for them all.
        let same_dump = self
            .last_mmu_fault_us
            .is_some_and(|last| ts >= last && ts - last < MMU_FAULT_DUMP_US);
        self.last_mmu_fault_us = Some(ts);
        if same_dump {
            return None;
        }
        let rest = msg[at + "nvgpu:".len()..].trim_start();
        let device = rest.split_whitespace().next().unwrap_or("").to_string();
        let detail = rest[device.len()..].trim().to_string();
        Some(
            Event::new(
                "nvgpu_mmu_fault",
                Severity::Critical,
                SOURCE,
                format!("GPU MMU fault on {device}: {detail}"),
            )
            .field("device", Value::Str(device))
            .field("detail", Value::Str(detail)),
        )
    }
}

/// An Xid line's parts.
#[derive(Debug, Clone, PartialEq)]
pub struct Xid {
    /// The GPU's PCI address as printed (`PCI:0000:01:00` without the `PCI:`).
    pub pci: String,
    /// The Xid code.
    pub code: u32,
    /// The process, when the driver names one.
    pub pid: Option<i64>,
    /// Its name, when named.
    pub name: Option<String>,
    /// The rest of the line.
    pub detail: String,
}

/// Parses `NVRM: Xid (PCI:<addr>): <code>[, pid=<pid>][, name=<name>][, <detail>]`.
pub fn parse_xid(msg: &str) -> Option<Xid> {
    let at = msg.find("NVRM: Xid (")?;
    let rest = &msg[at + "NVRM: Xid (".len()..];
    let close = rest.find("):")?;
    let pci = rest[..close].trim();
    let pci = pci.strip_prefix("PCI:").unwrap_or(pci).to_string();
    let rest = rest[close + 2..].trim_start();
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let code: u32 = rest[..digits].parse().ok()?;
    let mut rest = rest[digits..].trim_start_matches(',').trim_start();
    let mut take = |key: &str| -> Option<String> {
        let v = rest.strip_prefix(key)?;
        let (value, after) = match v.find(", ") {
            Some(i) => (&v[..i], &v[i + 2..]),
            None => (v.trim_end_matches(','), ""),
        };
        rest = after.trim_start();
        Some(value.trim().trim_matches('\'').to_string())
    };
    let pid = take("pid=");
    let name = take("name=");
    let known = |v: &Option<String>| v.clone().filter(|s| !s.is_empty() && s != "<unknown>");
    Some(Xid {
        pci,
        code,
        pid: known(&pid).and_then(|p| p.parse().ok()),
        name: known(&name),
        detail: rest.trim().to_string(),
    })
}

fn fell_off_bus(msg: &str) -> Event {
    // `NVRM: GPU 0000:01:00.0: ...` / `NVRM: The NVIDIA GPU 0000:b3:00.0 ...`
    let pci = msg
        .split_whitespace()
        .skip_while(|w| *w != "GPU")
        .nth(1)
        .map(|w| w.trim_end_matches(':').to_string())
        .filter(|w| w.contains(':'));
    let one_line = msg
        .lines()
        .map(|l| l.trim().trim_start_matches("NVRM:").trim())
        .collect::<Vec<_>>()
        .join(" ");
    let mut e = Event::new(
        "gpu_fell_off_bus",
        Severity::Critical,
        SOURCE,
        format!(
            "GPU {} has fallen off the bus",
            pci.as_deref().unwrap_or("(unknown)")
        ),
    );
    if let Some(p) = pci {
        e = e.field("pci", Value::Str(p));
    }
    e.field("detail", Value::Str(one_line))
}

/// `key=value` pairs of a comma-separated list (an `oom-kill:` line).
fn pairs(s: &str) -> impl Iterator<Item = (&str, &str)> {
    s.split(',').filter_map(|kv| kv.split_once('='))
}

fn parse_oom_kill_line(rest: &str) -> PendingOom {
    let mut p = PendingOom::default();
    let mut oom_memcg = None;
    for (k, v) in pairs(rest) {
        match k.trim() {
            "pid" => p.pid = v.trim().parse().ok(),
            "task" => p.task = Some(v.trim().to_string()),
            "task_memcg" => p.cgroup = Some(v.trim().to_string()),
            "oom_memcg" => oom_memcg = Some(v.trim().to_string()),
            "constraint" => p.constraint = Some(v.trim().to_string()),
            _ => {}
        }
    }
    if p.cgroup.is_none() {
        p.cgroup = oom_memcg;
    }
    p
}

/// A `<key>:<n>kB` value of a `Killed process` line.
fn kb(msg: &str, key: &str) -> Option<i64> {
    let v = &msg[msg.find(key)? + key.len()..];
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    v[..digits].parse().ok()
}

fn oom_killed(msg: &str, at: usize, pending: Option<PendingOom>) -> Option<Event> {
    let rest = &msg[at + "Killed process ".len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let pid: i64 = rest[..digits].parse().ok()?;
    let rest = &rest[digits..];
    // The name is in parentheses and may itself hold spaces or parentheses.
    let open = rest.find('(')?;
    let stop = rest.find(" total-vm:").unwrap_or(rest.len());
    let close = rest[..stop].rfind(')')?;
    let name = rest.get(open + 1..close)?.to_string();
    let pending = pending.filter(|p| p.pid.is_none() || p.pid == Some(pid));
    let cgroup = pending.as_ref().and_then(|p| p.cgroup.clone());
    let constraint = pending
        .as_ref()
        .and_then(|p| p.constraint.clone())
        .or_else(|| {
            msg.starts_with("Memory cgroup")
                .then(|| "CONSTRAINT_MEMCG".into())
        });
    let anon = kb(msg, "anon-rss:");
    let mut text = format!("OOM killer killed {name} (pid {pid})");
    if let Some(c) = &cgroup {
        text.push_str(&format!(" in cgroup {c}"));
    }
    if let Some(a) = anon {
        text.push_str(&format!(", anon-rss {a} kB"));
    }
    let mut e = Event::new("oom_kill", Severity::Critical, SOURCE, text)
        .field("pid", Value::I64(pid))
        .field("name", Value::Str(name));
    if let Some(c) = cgroup {
        e = e.field("cgroup", Value::Str(c));
    }
    if let Some(c) = constraint {
        e = e.field("constraint", Value::Str(c));
    }
    for (key, field) in [
        ("anon-rss:", "anon_rss_kb"),
        ("total-vm:", "total_vm_kb"),
        ("file-rss:", "file_rss_kb"),
        ("shmem-rss:", "shmem_rss_kb"),
    ] {
        if let Some(v) = kb(msg, key) {
            e = e.field(field, Value::I64(v));
        }
    }
    Some(e)
}

/// The OOM kills `/proc/vmstat` counted that no log line named.
pub fn unlogged_oom_kills(count: u64) -> Event {
    Event::new(
        "oom_kill",
        Severity::Critical,
        SOURCE,
        format!(
            "{count} OOM kill(s) counted by the kernel (/proc/vmstat oom_kill) with no log line \
             seen (lost or rate-limited): victim unknown"
        ),
    )
    .field(
        "count",
        Value::I64(i64::try_from(count).unwrap_or(i64::MAX)),
    )
    .field("unlogged", Value::Bool(true))
}

fn overcurrent(msg: &str) -> Option<Event> {
    let at = msg.find("soctherm")?;
    let rest = &msg[at..];
    let lower = rest.to_ascii_lowercase();
    let alarm = lower.find("oc alarm").map(|i| {
        rest[i + "oc alarm".len()..]
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string()
    });
    // `soctherm: oc3 throttle ...`-style lines: an over-current throttle, no alarm mask.
    let oc_throttle = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w.len() > 2 && w.starts_with("oc") && w[2..].bytes().all(|b| b.is_ascii_digit()))
        && lower.contains("throttl");
    if alarm.is_none() && !oc_throttle {
        return None;
    }
    let mut e = Event::new(
        "overcurrent",
        Severity::Warning,
        SOURCE,
        format!(
            "over-current alarm ({}): the supply may be under-sized",
            rest.trim()
        ),
    );
    if let Some(a) = alarm.filter(|a| !a.is_empty()) {
        e = e.field("alarm", Value::Str(a));
    }
    Some(e.field("detail", Value::Str(rest.trim().to_string())))
}

/// `thermal_zoneN` (or the first word naming a zone) in a thermal line.
fn zone_of(msg: &str) -> Option<String> {
    msg.split(|c: char| c.is_whitespace() || c == ':')
        .find(|w| w.starts_with("thermal_zone") || w.starts_with("thermal-zone"))
        .map(str::to_string)
}

/// The `(<n> C)` of a trip line, °C.
fn temp_of(msg: &str) -> Option<f64> {
    let open = msg.find('(')?;
    let inner = &msg[open + 1..];
    let v = inner.split_whitespace().next()?;
    let unit = inner.split_whitespace().nth(1)?;
    unit.starts_with('C').then(|| v.parse().ok()).flatten()
}

fn thermal(msg: &str) -> Option<Event> {
    let lower = msg.to_ascii_lowercase();
    let (kind, severity, what) = if lower.contains("critical temperature reached") {
        ("thermal_trip", Severity::Critical, "critical trip")
    } else if lower.contains("hot temperature reached") {
        ("thermal_trip", Severity::Warning, "hot trip")
    } else if lower.contains("temperature above threshold") && lower.contains("throttled") {
        ("thermal_throttle", Severity::Warning, "clock throttled")
    } else if (lower.contains("thermal_zone") || lower.contains("thermal-zone"))
        && lower.contains("tripped")
    {
        ("thermal_trip", Severity::Critical, "trip")
    } else {
        return None;
    };
    // x86 `CPU3: Package temperature above threshold`: the CPU and which sensor.
    let zone = zone_of(msg).or_else(|| {
        let cpu = msg.split(':').next().filter(|c| c.starts_with("CPU"))?;
        let which = if lower.contains("package") {
            "package"
        } else {
            "core"
        };
        Some(format!("{cpu} {which}"))
    });
    let temp = temp_of(msg);
    let mut text = format!(
        "thermal {what} in {}",
        zone.as_deref().unwrap_or("an unnamed zone")
    );
    if let Some(t) = temp {
        text.push_str(&format!(" at {t} °C"));
    }
    text.push_str(": ");
    text.push_str(msg.trim());
    let mut e = Event::new(kind, severity, SOURCE, text);
    if let Some(z) = zone {
        e = e.field("zone", Value::Str(z));
    }
    if let Some(t) = temp {
        e = e.field("temp_c", Value::F64(t));
    }
    Some(e.field("detail", Value::Str(msg.trim().to_string())))
}
