//! The kernel log collector (`[kmsg]`): reads `/dev/kmsg` (one record per `read(2)`, woken by
//! the kernel through epoll, never by polling `dmesg`) and turns the records that matter into
//! `edgewatch_event` points with `source=kernel` (`parse.rs`): NVIDIA Xid errors (critical
//! for the codes in `fatal_xids`), a GPU fallen off the bus, Jetson nvgpu MMU faults, soctherm
//! over-current alarms, thermal trips and throttling, and OOM kills (victim pid, name and
//! cgroup), each stamped with the time the kernel logged it. `/proc/vmstat` `oom_kill` is
//! compared with the kills the log named, so a kill whose line was lost is still an event.
//!
//! It resumes where it stopped: the boot id and the last sequence number handled are kept in
//! `<data_dir>/kmsg.cursor` (written atomically at most once a second and at shutdown), so a
//! restart skips what an earlier run handled, while after a reboot the whole ring is read
//! once. A flood is bounded by a token bucket (`max_events_per_s`, `burst`); what it drops
//! is counted in `collectors.kmsg` and summed in at most one `kmsg_dropped` event and one log
//! line a second. Records the kernel overwrote before they were read (`EPIPE`, gaps in the
//! sequence numbers) are counted as `lost`. It needs only read access to `/dev/kmsg` (root,
//! or `CAP_SYSLOG` where `kernel.dmesg_restrict = 1`); when it cannot open it, it says so in
//! one log line and in the status and stays off.

pub mod config;
pub mod parse;
pub mod state;
#[cfg(test)]
mod tests;

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio_util::sync::CancellationToken;

use crate::collect::event::{Event, Severity};
use crate::model::{Batch, Value};
use crate::queue::IngestHandle;
use crate::stats::Stats;
use crate::status::StatusCell;

pub use config::KmsgConfig;
use parse::{Classifier, Found};
use state::{Bucket, Cursor, OomCheck};

/// Records read before the task yields (and submits what it found).
const MAX_RECORDS_PER_WAKE: usize = 4096;
/// The resume cursor's file in the data directory.
pub const CURSOR_FILE: &str = "kmsg.cursor";

/// The collector's live `collectors.kmsg` status.
#[derive(Debug)]
pub struct KmsgStatus(StatusCell<crate::status::Kmsg>);

impl Default for KmsgStatus {
    fn default() -> Self {
        KmsgStatus(StatusCell::new(crate::status::Kmsg {
            state: "not started".into(),
            ..Default::default()
        }))
    }
}

impl KmsgStatus {
    /// A copy of the status part.
    pub fn snapshot(&self) -> crate::status::Kmsg {
        self.0.snapshot()
    }

    /// Records a state (`off: <why>`, `running`, `stopped`).
    pub fn set_state(&self, state: impl Into<String>) {
        let state = state.into();
        self.0.update(|s| s.state = state);
    }

    fn update(&self, f: impl FnOnce(&mut crate::status::Kmsg)) {
        self.0.update(f);
    }
}

// `time_t` and `c_long` are i64 here but i32 on 32-bit targets: the casts are not useless.
#[allow(clippy::unnecessary_cast)]
/// `CLOCK_REALTIME - CLOCK_MONOTONIC`, ns: the wall time of the boot, to stamp a record
/// logged `ts_usec` after it (the printk clock counts from boot like `CLOCK_MONOTONIC`).
fn boot_wall_ns() -> i64 {
    let mono = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
        let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
        if rc == 0 {
            ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64
        } else {
            0
        }
    };
    mono(libc::CLOCK_REALTIME) - mono(libc::CLOCK_MONOTONIC)
}

/// The wall time of a record, ns (never later than `now`).
pub fn record_time_ns(boot_wall_ns: i64, ts_usec: u64, now: i64) -> i64 {
    let since_boot = i64::try_from(ts_usec)
        .unwrap_or(i64::MAX / 1000)
        .saturating_mul(1000);
    boot_wall_ns.saturating_add(since_boot).min(now)
}

#[allow(clippy::unnecessary_cast)]
fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: as in `boot_wall_ns`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc == 0 {
        ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
    } else {
        0
    }
}

fn read_boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn read_oom_counter() -> Option<u64> {
    state::vmstat_oom_kills(&std::fs::read_to_string("/proc/vmstat").ok()?)
}

/// Reads the stored cursor (`None` when missing or unreadable: start over).
pub fn load_cursor(data_dir: &Path) -> Option<Cursor> {
    Cursor::parse(&std::fs::read_to_string(data_dir.join(CURSOR_FILE)).ok()?)
}

/// Writes the cursor atomically (a temp file synced, then renamed over the old one).
pub fn store_cursor(data_dir: &Path, c: &Cursor) -> std::io::Result<()> {
    crate::fsutil::write_atomic(&data_dir.join(CURSOR_FILE), c.to_text().as_bytes(), 0o666)
}

/// What an open error means for the user.
fn open_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => {
            "reading the kernel log needs root, or CAP_SYSLOG where kernel.dmesg_restrict = 1 \
             (the systemd unit grants it; a drop-in with ProtectKernelLogs=yes takes it away)"
        }
        std::io::ErrorKind::NotFound => "no kernel log device here",
        _ => "the kernel log cannot be read",
    }
}

/// Everything the read loop carries between wake-ups.
struct Reader {
    cfg: KmsgConfig,
    data_dir: PathBuf,
    boot_id: String,
    resume_after: Option<u64>,
    classifier: Classifier,
    bucket: Bucket,
    oom: OomCheck,
    start_us: u64,
    last_seq: Option<u64>,
    stored_seq: Option<u64>,
    dropped_this_second: u64,
    status: Arc<KmsgStatus>,
}

impl Reader {
    /// Handles one record's bytes; an event kept goes into `found`.
    fn record(&mut self, buf: &[u8], found: &mut Vec<Found>) {
        let rec = match parse::parse_record(buf) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "unreadable kernel log record skipped");
                return;
            }
        };
        let expected = match self.last_seq {
            Some(l) => Some(l + 1),
            // The first record: after a resume, any gap up to it was lost while we were away.
            None => self.resume_after.map(|s| s + 1),
        };
        let lost = expected.map_or(0, |e| rec.seq.saturating_sub(e));
        self.last_seq = Some(rec.seq);
        let skip = self.resume_after.is_some_and(|s| rec.seq <= s);
        self.status.update(|s| {
            s.records += 1;
            s.lost += lost;
            s.last_seq = Some(rec.seq);
            s.skipped += u64::from(skip);
        });
        if skip {
            return;
        }
        let Some(f) = self.classifier.classify(&rec) else {
            return;
        };
        if f.oom_kill && f.ts_usec >= self.start_us {
            self.oom.logged();
        }
        // The bucket runs on the records' own clock: a live flood is bounded as it happens,
        // and the ring read at start (history) is bounded as it was logged, so an old flood
        // does not use up the budget of the events logged since.
        if self
            .bucket
            .take(i64::try_from(rec.ts_usec).unwrap_or(i64::MAX / 1000) * 1000)
        {
            found.push(f);
        } else {
            self.dropped_this_second += 1;
            self.status.update(|s| s.dropped += 1);
        }
    }

    fn submit(&self, found: Vec<Found>, handle: &IngestHandle, stats: &Arc<Stats>) {
        if found.is_empty() {
            return;
        }
        let now = crate::now_ns();
        let boot = boot_wall_ns();
        let n = found.len() as u64;
        let lines = found
            .into_iter()
            .map(|f| f.event.line(record_time_ns(boot, f.ts_usec, now)))
            .collect();
        super::submit(handle, stats, Batch { lines }, "kmsg");
        self.status.update(|s| s.events += n);
    }

    fn submit_event(&self, e: Event, handle: &IngestHandle, stats: &Arc<Stats>) {
        let lines = vec![e.line(crate::now_ns())];
        super::submit(handle, stats, Batch { lines }, "kmsg");
        self.status.update(|s| s.events += 1);
    }

    /// Once a second: the drop summary, and the cursor when it moved.
    fn tick(&mut self, handle: &IngestHandle, stats: &Arc<Stats>) {
        if self.dropped_this_second > 0 {
            let n = self.dropped_this_second;
            self.dropped_this_second = 0;
            tracing::warn!(
                dropped = n,
                max_events_per_s = self.cfg.max_events_per_s,
                "kernel log flood: events over the rate bound dropped"
            );
            let e = Event::new(
                "kmsg_dropped",
                Severity::Warning,
                parse::SOURCE,
                format!(
                    "kernel log flood: {n} events dropped in the last second (over [kmsg] \
                     max_events_per_s = {})",
                    self.cfg.max_events_per_s
                ),
            )
            .field("count", Value::I64(i64::try_from(n).unwrap_or(i64::MAX)));
            self.submit_event(e, handle, stats);
        }
        self.save_cursor();
    }

    fn save_cursor(&mut self) {
        let Some(seq) = self.last_seq else { return };
        if self.stored_seq == Some(seq) || self.boot_id.is_empty() {
            return;
        }
        let c = Cursor {
            boot_id: self.boot_id.clone(),
            seq,
        };
        match store_cursor(&self.data_dir, &c) {
            Ok(()) => self.stored_seq = Some(seq),
            Err(e) => {
                tracing::warn!(error = %e, "cannot store the kernel log cursor");
                self.status
                    .update(|s| s.detail = Some(format!("cannot store the cursor: {e}")));
            }
        }
    }

    fn check_oom(&mut self, handle: &IngestHandle, stats: &Arc<Stats>) {
        let Some(counter) = read_oom_counter() else {
            return;
        };
        let missing = self.oom.check(counter);
        if missing > 0 {
            tracing::warn!(
                kills = missing,
                "OOM kills counted in /proc/vmstat without a kernel log line"
            );
            self.status.update(|s| s.oom_kills_unlogged += missing);
            self.submit_event(parse::unlogged_oom_kills(missing), handle, stats);
        }
    }
}

fn open(device: &Path) -> std::io::Result<AsyncFd<std::fs::File>> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(device)?;
    // SAFETY: the AsyncFd owns the File, whose descriptor stays open and the same until the
    // AsyncFd (and the File with it) is dropped.
    unsafe { AsyncFd::register_with_interest(f, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}

/// Runs the collector until `stop`.
pub async fn run(
    cfg: KmsgConfig,
    data_dir: PathBuf,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: Arc<KmsgStatus>,
    stop: CancellationToken,
) {
    let boot_id = read_boot_id().unwrap_or_default();
    let stored = load_cursor(&data_dir);
    let resume_after = Cursor::resume_after(stored.as_ref(), &boot_id);
    status.update(|s| {
        s.device = cfg.device.display().to_string();
        s.boot_id = Some(boot_id.clone()).filter(|b| !b.is_empty());
        s.resumed_after_seq = resume_after;
    });
    let fd = match open(&cfg.device) {
        Ok(fd) => fd,
        Err(e) => {
            let why = format!(
                "cannot read {}: {e} ({})",
                cfg.device.display(),
                open_hint(&e)
            );
            tracing::warn!("kernel log collector off: {why}");
            status.update(|s| {
                s.state = "off: cannot read the kernel log".into();
                s.detail = Some(why);
            });
            return;
        }
    };
    let mut r = Reader {
        classifier: Classifier::new(&cfg.fatal_xids),
        bucket: Bucket::new(cfg.max_events_per_s, cfg.burst, 0),
        oom: OomCheck::new(read_oom_counter().unwrap_or(0)),
        start_us: monotonic_us(),
        data_dir,
        boot_id,
        resume_after,
        last_seq: None,
        stored_seq: stored.map(|c| c.seq),
        dropped_this_second: 0,
        status: status.clone(),
        cfg,
    };
    status.set_state("running");
    tracing::info!(
        device = %r.cfg.device.display(),
        resume_after_seq = ?resume_after,
        "kernel log collector started"
    );
    let mut second = tokio::time::interval(Duration::from_secs(1));
    let mut oom_tick = tokio::time::interval(r.cfg.oom_check_interval.0);
    second.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    oom_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = vec![0u8; 16 * 1024];
    let mut read_errors = 0u64;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = second.tick() => r.tick(&handle, &stats),
            _ = oom_tick.tick() => r.check_oom(&handle, &stats),
            ready = fd.readable() => {
                let mut guard = match ready {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::warn!(error = %e, "kernel log: cannot wait for records");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let mut found = Vec::new();
                let mut failed = false;
                for _ in 0..MAX_RECORDS_PER_WAKE {
                    match guard.try_io(|f| f.get_ref().read(&mut buf)) {
                        Ok(Ok(0)) => break,
                        Ok(Ok(n)) => r.record(&buf[..n], &mut found),
                        // Overwritten before we read them: the next read returns the oldest
                        // record left; the gap in sequence numbers counts them.
                        Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => continue,
                        Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Ok(Err(e)) => {
                            read_errors += 1;
                            if read_errors.is_power_of_two() {
                                tracing::warn!(error = %e, read_errors, "kernel log read failed");
                            }
                            status.update(|s| s.detail = Some(format!("read failed: {e}")));
                            failed = true;
                            break;
                        }
                        // No more records (EAGAIN): readiness cleared, wait for the next.
                        Err(_would_block) => break,
                    }
                }
                r.submit(found, &handle, &stats);
                if failed {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                } else {
                    tokio::task::yield_now().await;
                }
            }
        }
    }
    r.save_cursor();
    status.set_state("stopped");
}
