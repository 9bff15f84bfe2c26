//! The kernel log collector's small pure state: the resume cursor (the boot and the last
//! record handled, as kept in `<data_dir>/kmsg.cursor`), the flood bound (a token bucket
//! over events), and the OOM cross-check against `/proc/vmstat` `oom_kill`. Times and
//! counters are arguments; the file IO is in the caller.

/// Where the collector stopped: the boot (`/proc/sys/kernel/random/boot_id`) and the last
/// record's sequence number handled in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The boot id.
    pub boot_id: String,
    /// The last sequence number handled.
    pub seq: u64,
}

impl Cursor {
    /// The file's text: `<boot_id> <seq>\n`.
    pub fn to_text(&self) -> String {
        format!("{} {}\n", self.boot_id, self.seq)
    }

    /// Reads [`Cursor::to_text`]'s format (`None` for anything else: start over).
    pub fn parse(text: &str) -> Option<Cursor> {
        let mut w = text.split_whitespace();
        let boot_id = w.next()?.to_string();
        let seq = w.next()?.parse().ok()?;
        w.next().is_none().then_some(Cursor { boot_id, seq })
    }

    /// The sequence number after which records are new, for a reader in `boot_id`: the
    /// stored one in the same boot, none (read the whole ring) after a reboot.
    pub fn resume_after(stored: Option<&Cursor>, boot_id: &str) -> Option<u64> {
        stored.filter(|c| c.boot_id == boot_id).map(|c| c.seq)
    }
}

/// A token bucket: `rate` events a second, `burst` at once.
#[derive(Debug, Clone)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at_ns: i64,
}

impl Bucket {
    /// A full bucket at `now_ns`.
    pub fn new(rate: u32, burst: u32, now_ns: i64) -> Bucket {
        Bucket {
            rate: f64::from(rate.max(1)),
            burst: f64::from(burst.max(1)),
            tokens: f64::from(burst.max(1)),
            at_ns: now_ns,
        }
    }

    /// Takes one token at `now_ns`; false when none is left (the event is dropped).
    pub fn take(&mut self, now_ns: i64) -> bool {
        let dt = (now_ns - self.at_ns).max(0) as f64 / 1e9;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.at_ns = self.at_ns.max(now_ns);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Compares the kernel's OOM kill counter with the kills the log named since the agent
/// started. The counter grows before the kill's line is printed, so an excess is reported
/// only when it is still there at the next check.
#[derive(Debug, Clone)]
pub struct OomCheck {
    base: u64,
    logged: u64,
    reported: u64,
    prev_excess: u64,
}

impl OomCheck {
    /// Starts from the counter's value when the agent started.
    pub fn new(base: u64) -> OomCheck {
        OomCheck {
            base,
            logged: 0,
            reported: 0,
            prev_excess: 0,
        }
    }

    /// A kill named by a log line (logged after the start).
    pub fn logged(&mut self) {
        self.logged += 1;
    }

    /// The counter's value now; returns the kills to report as having no log line.
    pub fn check(&mut self, counter: u64) -> u64 {
        let excess = counter
            .saturating_sub(self.base)
            .saturating_sub(self.logged + self.reported);
        let report = excess.min(self.prev_excess);
        self.reported += report;
        self.prev_excess = excess - report;
        report
    }
}

/// The `oom_kill` counter of a `/proc/vmstat` text.
pub fn vmstat_oom_kills(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}
