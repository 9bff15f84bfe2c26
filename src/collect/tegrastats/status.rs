//! The collector's part of the status document (`collectors.tegrastats`, a
//! [`crate::status::Tegrastats`]): a shared holder the supervisor and the replay loop update.
//! It never reads tegrastats.

use crate::status::{StatusCell, Tegrastats};

/// The collector's live status, for `/api/v1/status` (`collectors.tegrastats`) and `/metrics`.
#[derive(Debug)]
pub struct TegrastatsStatus {
    cell: StatusCell<StatusInner>,
}

#[derive(Debug, Default)]
pub(super) struct StatusInner {
    pub(super) state: &'static str,
    pub(super) detail: String,
    pub(super) pid: Option<u32>,
    pub(super) starts: u64,
    pub(super) stalls: u64,
    pub(super) restarts: u64,
    pub(super) samples: u64,
    pub(super) bad_lines: u64,
    pub(super) last_sample_ns: Option<i64>,
}

impl Default for TegrastatsStatus {
    fn default() -> Self {
        TegrastatsStatus {
            cell: StatusCell::new(StatusInner {
                state: "not started",
                ..StatusInner::default()
            }),
        }
    }
}

impl TegrastatsStatus {
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut StatusInner) -> R) -> R {
        self.cell.update(f)
    }

    /// Sets the state (`off`, `running`, `replaying`, `restarting`, `stopped`) and its detail.
    pub(super) fn set(&self, state: &'static str, detail: impl Into<String>) {
        let detail = detail.into();
        self.with(|i| {
            i.state = state;
            i.detail = detail;
        });
    }

    /// The state word.
    pub fn state(&self) -> &'static str {
        self.cell.read(|i| i.state)
    }

    pub(super) fn sample(&self, ts: i64) {
        self.with(|i| {
            i.samples += 1;
            i.last_sample_ns = Some(ts);
        });
    }

    pub(super) fn bad_lines(&self, n: u64) {
        if n > 0 {
            self.with(|i| i.bad_lines += n);
        }
    }

    /// The `collectors.tegrastats` part of the status document; `now` (ns) dates the last
    /// sample.
    pub fn snapshot(&self, now: i64) -> Tegrastats {
        self.cell.read(|i| Tegrastats {
            state: i.state.to_string(),
            detail: i.detail.clone(),
            pid: i.pid,
            starts: i.starts,
            restarts: i.restarts,
            stalls: i.stalls,
            samples: i.samples,
            bad_lines: i.bad_lines,
            last_sample_age_s: i.last_sample_ns.map(|t| (now - t).max(0) as f64 / 1e9),
        })
    }
}
