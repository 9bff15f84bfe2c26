//! Clock sanity for devices without a real-time clock. A Jetson boots at 1970 (or at a time
//! saved at the last shutdown) and runs on that clock until NTP sets it, often much later on
//! a cellular or factory network; everything stamped meanwhile is off by the step the clock
//! takes then, and retention (by timestamp) would delete it at the first rollup. The clock is
//! *not set* while it reads earlier than a floor (`[clock] min_valid`, default: when this
//! binary was built, which no true clock can precede). Starting on such a clock, the agent
//! records the boot, the clock's offset from `CLOCK_BOOTTIME` (which counts from boot,
//! unaffected by clock steps) and the first chunk id it writes ([`note_start`]). Ingest goes
//! on as usual (every write is stored and acknowledged), but rollup and forwarding stop before
//! that chunk ([`hold_from`]). Once the clock is set, the rollup job ([`settle`]) shifts every
//! point of those chunks stamped before the floor by the step (offset now - offset then), in
//! place (chunk ids unchanged), keeps doing so for a short grace period to catch points stamped
//! just before the step, then lifts the hold. A record left by an earlier boot cannot be
//! corrected (its offset went with that boot): it is dropped and its points counted.

use std::ops::ControlFlow;
use std::path::PathBuf;

use rusqlite::{Connection, TransactionBehavior};

use crate::store::chunks::{self, Scan};
use crate::store::{clockfix, counters, Ctx, StoreError};

const NS: i64 = 1_000_000_000;

/// How long after the clock is set the job keeps correcting newly committed chunks (points
/// stamped just before the step may still sit in the ingest queue) before lifting the hold.
pub const GRACE_NS: i64 = 10 * NS;

pub use crate::config::clock::{build_unix_s, ClockConfig, Rfc3339};

/// This boot, and how the clock relates to time since boot.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// `/proc/sys/kernel/random/boot_id` ("unknown" where there is none).
    pub boot_id: String,
    /// Realtime minus `CLOCK_BOOTTIME`, ns: changes only when the clock is stepped.
    pub offset_ns: i64,
}

impl Machine {
    /// Reads both now (`now`: the realtime clock, ns).
    pub fn read(now: i64) -> Machine {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown".into());
        Machine {
            boot_id,
            offset_ns: now.saturating_sub(boottime_ns()),
        }
    }
}

/// `CLOCK_BOOTTIME` in ns (0 if unavailable).
// `time_t` and `c_long` are 32-bit on 32-bit targets: the casts are not always no-ops.
#[allow(clippy::unnecessary_cast)]
fn boottime_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass, which lives on this stack.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as i64)
        .saturating_mul(NS)
        .saturating_add(ts.tv_nsec as i64)
}

/// The chunk id from which rollup and forwarding must wait (`None`: nothing held).
pub fn hold_from(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    clockfix::hold_from(conn)
}

/// The database file of `conn`, for error messages.
fn path_of(conn: &Connection) -> PathBuf {
    PathBuf::from(conn.path().unwrap_or_default())
}

/// Drops the records of other boots, counting their points as uncorrectable. Called before
/// this boot writes anything of its own (at start-up, or by a job in a boot where the agent
/// has not started), so the points of an earlier boot are the chunks from its first id up
/// to the next id to be written, the next later boot's first id or this boot's, whichever
/// is lowest.
fn drop_other_boots(tx: &Connection, boot_id: &str) -> Result<(), StoreError> {
    let path = path_of(tx);
    let others = clockfix::others(tx, &path, boot_id)?;
    let mut next = chunks::next_id(tx, &path)?;
    if let Some(mine) = clockfix::get(tx, &path, boot_id)? {
        next = next.min(mine.first_chunk_id);
    }
    for (i, fix) in others.iter().enumerate() {
        let from = fix.first_chunk_id.max(fix.fixed_through.saturating_add(1));
        let until = others
            .get(i + 1)
            .map_or(next, |later| later.first_chunk_id.min(next))
            .max(from);
        let points = chunks::points_between(tx, &path, from, until)?;
        tracing::warn!(
            boot = %fix.boot_id,
            points,
            "points stamped before the clock was set, in an earlier boot, cannot be corrected: kept with their times"
        );
        counters::bump(tx, &path, "clock_unfixable_points", points)?;
        clockfix::delete(tx, &path, &fix.boot_id)?;
    }
    Ok(())
}

/// At agent start-up (before ingest): drops what earlier boots left (their points can no
/// longer be corrected) and, if `now` is before `floor`, records this boot so that what is
/// written from here on can be corrected once the clock is set. `Ok(true)` when the clock is
/// not set.
pub fn note_start(
    conn: &mut Connection,
    floor: i64,
    now: i64,
    m: &Machine,
) -> Result<bool, StoreError> {
    let path = path_of(conn);
    let unset = now < floor;
    if !unset && hold_from(conn).ctx(&path)?.is_none() {
        return Ok(false);
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(&path)?;
    // Dropped here, before this run writes a chunk, even on a set clock: later, this
    // boot's chunks could not be told from the earlier boot's.
    drop_other_boots(&tx, &m.boot_id)?;
    if unset && clockfix::get(&tx, &path, &m.boot_id)?.is_none() {
        // AUTOINCREMENT: the next chunk gets one past the largest id ever used.
        let next = chunks::next_id(&tx, &path)?;
        clockfix::insert(&tx, &path, &m.boot_id, m.offset_ns, next, now)?;
    }
    tx.commit().ctx(&path)?;
    Ok(unset)
}

/// What [`settle`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Nothing held: roll up and forward as usual.
    Ready,
    /// The clock is still not set: chunks from the held id on wait.
    Unset,
    /// The clock is set and held chunks were corrected; the hold lifts after [`GRACE_NS`].
    Fixing,
}

/// Counts of one [`settle`] call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fixed {
    /// Chunks rewritten.
    pub chunks: u64,
    /// Points moved.
    pub points: u64,
}

/// In the rollup job, before rolling up: corrects held chunks once the clock is set, and
/// says whether rollup may go past the hold.
pub fn settle(
    conn: &mut Connection,
    floor: i64,
    now: i64,
    m: &Machine,
) -> Result<(Settle, Fixed), StoreError> {
    let path = path_of(conn);
    let mut fixed = Fixed::default();
    if hold_from(conn).ctx(&path)?.is_none() {
        return Ok((Settle::Ready, fixed));
    }
    if now < floor {
        return Ok((Settle::Unset, fixed));
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(&path)?;
    drop_other_boots(&tx, &m.boot_id)?;
    let Some(fix) = clockfix::get(&tx, &path, &m.boot_id)? else {
        tx.commit().ctx(&path)?;
        return Ok((Settle::Ready, fixed));
    };
    let step = m.offset_ns.saturating_sub(fix.offset_ns);
    let from = fix.first_chunk_id.max(fix.fixed_through.saturating_add(1));
    let mut last = fix.fixed_through;
    let scan = Scan {
        after: Some(from.saturating_sub(1)),
        ..Scan::default()
    };
    chunks::scan(&tx, &path, &scan, |c| {
        let (id, lo, hi) = (c.id, c.ts_min, c.ts_max);
        last = last.max(id);
        if lo >= floor || step == 0 {
            return Ok(ControlFlow::Continue(()));
        }
        let map = |t: i64| if t < floor { t.saturating_add(step) } else { t };
        if hi < floor {
            // Every point moves: the deltas stay, only the base and the bounds change.
            chunks::retime(&tx, &path, id, map(lo), map(hi), c.data)?;
            fixed.chunks += 1;
            fixed.points += c.n.max(0) as u64;
            return Ok(ControlFlow::Continue(()));
        }
        match crate::store::codec::retime_chunk(c.data, lo, map) {
            Ok((out, nlo, nhi, moved)) => {
                chunks::retime(&tx, &path, id, nlo, nhi, &out)?;
                fixed.chunks += 1;
                fixed.points += moved;
            }
            Err(e) => {
                tracing::warn!(chunk = id, error = %e, "cannot correct the times of a corrupt chunk; left as it is");
            }
        }
        Ok(ControlFlow::Continue(()))
    })?;
    counters::bump(&tx, &path, "clock_fixed_points", fixed.points as i64)?;
    let synced = if fix.synced_ns == 0 {
        now
    } else {
        fix.synced_ns
    };
    let done = now.saturating_sub(synced) >= GRACE_NS;
    if done {
        clockfix::delete(&tx, &path, &m.boot_id)?;
    } else {
        clockfix::set_progress(&tx, &path, &m.boot_id, last, synced)?;
    }
    tx.commit().ctx(&path)?;
    if fixed.points > 0 {
        tracing::info!(
            points = fixed.points,
            chunks = fixed.chunks,
            step_s = step as f64 / NS as f64,
            "clock set: corrected the times of points stamped before"
        );
    }
    Ok((if done { Settle::Ready } else { Settle::Fixing }, fixed))
}

/// The `clock` part of the status document: `floor` is `[clock] min_valid`, `now` the clock.
pub fn status(conn: &Connection, floor: i64, now: i64) -> rusqlite::Result<crate::status::Clock> {
    Ok(crate::status::Clock {
        set: now >= floor,
        min_valid_ns: floor,
        held_from_chunk_id: hold_from(conn)?,
        fixed_points: counters::value(conn, "clock_fixed_points")?,
        unfixable_points: counters::value(conn, "clock_unfixable_points")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Synchronous};
    use crate::rollup::{tests::write, Job, Plan};
    use crate::store::{Reader, Writer};

    const MIN: i64 = 60 * NS;

    fn conn(dir: &std::path::Path) -> Connection {
        crate::rollup::open_conn(dir).unwrap().0
    }

    fn stored_times(dir: &std::path::Path) -> Vec<i64> {
        let r = Reader::open(dir).unwrap();
        let mut out = Vec::new();
        chunks::scan(r.conn(), r.path(), &Scan::default(), |c| {
            c.decode(r.path(), |t, _, _| out.push(t))?;
            Ok(ControlFlow::Continue(()))
        })
        .unwrap();
        out
    }

    /// `(ts_min, data)` of chunk `id`, or of the newest chunk when `id` is `None`.
    fn chunk(c: &Connection, id: Option<i64>) -> (i64, i64, Vec<u8>) {
        let mut got = None;
        let scan = Scan {
            after: id.map(|i| i - 1),
            before: id.map(|i| i + 1),
            newest_first: id.is_none(),
            limit: Some(1),
            ..Scan::default()
        };
        chunks::scan(c, &path_of(c), &scan, |ch| {
            got = Some((ch.id, ch.ts_min, ch.data.to_vec()));
            Ok(ControlFlow::Break(()))
        })
        .unwrap();
        got.unwrap()
    }

    #[test]
    fn config_takes_an_rfc3339_floor_and_defaults_to_the_build_time() {
        let c =
            Config::from_toml_str("[clock]\nmin_valid = \"2030-01-01T00:00:00Z\"\n", "t").unwrap();
        assert_eq!(c.clock.floor_ns(), 1_893_456_000 * NS);
        assert_eq!(
            Plan::from_config(&c).unwrap().clock_floor_ns,
            1_893_456_000 * NS
        );
        let built = Config::builtin().clock.floor_ns();
        assert!(
            built > 1_700_000_000 * NS && built <= crate::now_ns(),
            "{built}"
        );
        let e = Config::from_toml_str("[clock]\nmin_valid = \"yesterday\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("min_valid") && e.contains("2026-01-01T00:00:00Z"),
            "{e}"
        );
    }

    #[test]
    fn a_set_clock_records_nothing_and_holds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        drop(Writer::open(dir.path(), 100, Synchronous::Normal).unwrap());
        let mut c = conn(dir.path());
        let now = crate::now_ns();
        assert!(!note_start(&mut c, now - NS, now, &Machine::read(now)).unwrap());
        assert_eq!(hold_from(&c).unwrap(), None);
        let (s, f) = settle(&mut c, now - NS, now, &Machine::read(now)).unwrap();
        assert_eq!((s, f), (Settle::Ready, Fixed::default()));
    }

    /// The device boots at "1970 + 1 h", the agent starts and stores points for 10 minutes,
    /// then NTP steps the clock to 2026: nothing is rolled up or forwarded before the step;
    /// after it, the held points sit where they truly belong, and every point is still there.
    #[test]
    fn points_stamped_before_the_clock_is_set_are_held_then_moved_by_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        // 2025-11-24.
        let floor = 1_764_000_000 * NS;
        // Written in an earlier, healthy run: stays as it is.
        let before = floor + 5 * MIN;
        write(&mut w, "m,s=old", &[(before, 1.0)]);
        // Boot on a wrong clock.
        let boot_now = 3_600 * NS;
        let m0 = Machine::read(boot_now);
        let mut c = conn(dir.path());
        assert!(note_start(&mut c, floor, boot_now, &m0).unwrap());
        let held = hold_from(&c).unwrap().unwrap();
        // Restarting in the same boot keeps the first record.
        assert!(note_start(&mut c, floor, boot_now + NS, &Machine::read(boot_now + NS)).unwrap());
        assert_eq!(hold_from(&c).unwrap(), Some(held));
        let wrong: Vec<(i64, f64)> = (0..600).map(|i| (boot_now + i * NS, i as f64)).collect();
        write(&mut w, "m,s=a", &wrong);
        // One chunk mixes a point a client stamped with a good clock.
        write(
            &mut w,
            "m,s=b",
            &[(boot_now + 10 * NS, 7.0), (floor + 6 * MIN, 8.0)],
        );

        let plan = {
            let mut p = Plan::from_config(&Config::builtin()).unwrap();
            p.clock_floor_ns = floor;
            p
        };
        let mut job = Job::open(dir.path(), plan.clone()).unwrap();
        // Still 1970: rollup and retention wait (nothing rolled up, nothing deleted).
        let rep = job.run_once(boot_now + 700 * NS, &|| false).unwrap();
        assert!(rep.clock_held, "{rep:?}");
        assert_eq!(rep.points, 0);
        assert_eq!(rep.evicted_chunks, 0);
        // The forwarder sees only what was written before the hold.
        let mut src = crate::forward::store::Source::open(dir.path(), vec![]).unwrap();
        let got = src.read(0, 10_000).unwrap();
        assert_eq!(got.points.len(), 1);
        assert_eq!(got.points[0].ts, before);
        assert!(got.last < held);

        // NTP steps the clock: the same instant now reads `set_now`.
        let set_now = floor + 30 * 86_400 * NS;
        let step_expected = set_now - boot_now;
        let rep = job.run_once(set_now, &|| false).unwrap();
        assert!(rep.clock_held, "grace period: {rep:?}");
        assert_eq!(rep.clock_fixed_points, 601);
        let times = stored_times(dir.path());
        assert_eq!(times.len(), 603, "no point lost");
        assert_eq!(times[0], before);
        // The step is measured against CLOCK_BOOTTIME: the jump between the two readings
        // less the (real, short) time the test took between them.
        let step = times[1] - boot_now;
        assert!(
            step <= step_expected && step_expected - step < 60 * NS,
            "{step} vs {step_expected}"
        );
        for (i, t) in times[1..601].iter().enumerate() {
            assert_eq!(*t, boot_now + i as i64 * NS + step);
        }
        assert_eq!(times[601], boot_now + 10 * NS + step);
        assert_eq!(times[602], floor + 6 * MIN, "a good time is not moved");
        // A second pass in the grace period moves nothing twice.
        let rep = job.run_once(set_now + NS, &|| false).unwrap();
        assert_eq!(rep.clock_fixed_points, 0);
        assert_eq!(stored_times(dir.path())[1], boot_now + step);
        // After the grace period the hold lifts: everything rolls up and forwards, at the
        // corrected times.
        let rep = job.run_once(set_now + GRACE_NS + NS, &|| false).unwrap();
        assert!(!rep.clock_held);
        assert_eq!(rep.points, 603, "{rep:?}");
        assert_eq!(hold_from(&conn(dir.path())).unwrap(), None);
        // The forwarder goes on from where it stopped (the old chunk, sent before, is gone
        // with raw retention by now).
        let rest = src.read(got.last, 10_000).unwrap();
        assert_eq!(rest.points.len(), 602);
        assert!(rest.points.iter().all(|p| p.ts >= floor));
        let reader = Reader::open(dir.path()).unwrap();
        let st = status(&reader.conn, floor, set_now).unwrap();
        assert!(st.set);
        assert_eq!(st.fixed_points, 601);
        assert_eq!(st.held_from_chunk_id, None);
    }

    /// A held chunk that no longer decodes is left as it is (and said so); the others are
    /// corrected and the hold still lifts.
    #[test]
    fn a_corrupt_held_chunk_is_left_alone_and_the_rest_is_corrected() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let floor = 1_764_000_000 * NS;
        let boot_now = 100 * NS;
        let mut c = conn(dir.path());
        assert!(note_start(&mut c, floor, boot_now, &Machine::read(boot_now)).unwrap());
        write(&mut w, "m,s=a", &[(boot_now, 1.0), (boot_now + NS, 2.0)]);
        // Mixed (one good time), so it must be decoded to be corrected; then cut short.
        write(&mut w, "m,s=b", &[(boot_now, 3.0), (floor + MIN, 4.0)]);
        let (bad_id, bad_lo, bad_data) = chunk(&c, None);
        let cut = bad_data[..bad_data.len() - 3].to_vec();
        chunks::retime(&c, &path_of(&c), bad_id, bad_lo, floor + MIN, &cut).unwrap();
        let now = floor + 10 * MIN;
        let (s, f) = settle(&mut c, floor, now, &Machine::read(now)).unwrap();
        assert_eq!(s, Settle::Fixing);
        assert_eq!((f.chunks, f.points), (1, 2), "only the good chunk moves");
        let (_, lo, data) = chunk(&c, Some(bad_id));
        assert_eq!(
            (lo, data),
            (boot_now, cut),
            "the corrupt chunk is untouched"
        );
        let later = now + GRACE_NS;
        let (s, _) = settle(&mut c, floor, later, &Machine::read(later)).unwrap();
        assert_eq!(s, Settle::Ready);
        assert_eq!(hold_from(&c).unwrap(), None);
    }

    /// Regression: an earlier boot's record used to be counted from its first chunk id with
    /// no upper bound, so when this boot started on a set clock (nothing noted) and wrote
    /// before the job settled, this boot's own, correctly stamped points were counted as
    /// unfixable too.
    #[test]
    fn only_the_earlier_boots_points_count_as_unfixable() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let floor = 1_764_000_000 * NS;
        let mut c = conn(dir.path());
        let old = Machine {
            boot_id: "an-earlier-boot".into(),
            offset_ns: 0,
        };
        assert!(note_start(&mut c, floor, 100 * NS, &old).unwrap());
        write(&mut w, "m", &[(100 * NS, 1.0), (101 * NS, 2.0)]);
        // Reboot on a set clock: the agent starts (nothing to hold), then stores points
        // before the rollup job first runs.
        let now = floor + MIN;
        let this = Machine::read(now);
        assert!(!note_start(&mut c, floor, now, &this).unwrap());
        write(
            &mut w,
            "m",
            &[(now, 3.0), (now + NS, 4.0), (now + 2 * NS, 5.0)],
        );
        let (s, _) = settle(&mut c, floor, now + 3 * NS, &this).unwrap();
        assert_eq!(s, Settle::Ready);
        assert_eq!(hold_from(&c).unwrap(), None);
        let st = status(&c, floor, now).unwrap();
        assert_eq!(
            st.unfixable_points, 2,
            "this boot's points are not the earlier boot's"
        );
        // Nothing is moved either way.
        assert_eq!(stored_times(dir.path()).len(), 5);
    }

    /// An earlier boot's points end where a later record begins (this boot's, or another
    /// boot's in between), not at the newest chunk.
    #[test]
    fn an_earlier_boots_points_end_where_the_next_record_begins() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let floor = 1_764_000_000 * NS;
        let mut c = conn(dir.path());
        let path = path_of(&c);
        let boot = |id: &str| Machine {
            boot_id: id.into(),
            offset_ns: 0,
        };
        assert!(note_start(&mut c, floor, 100 * NS, &boot("a")).unwrap());
        write(&mut w, "m", &[(100 * NS, 1.0)]);
        // Records that a start-up could not drop (e.g. it failed): boot b's and this one's.
        let this = Machine::read(floor + MIN);
        clockfix::insert(&c, &path, "b", 0, 2, 1).unwrap();
        write(&mut w, "m", &[(200 * NS, 1.0), (201 * NS, 2.0)]);
        clockfix::insert(&c, &path, &this.boot_id, 0, 3, 1).unwrap();
        write(
            &mut w,
            "m",
            &[(300 * NS, 1.0), (301 * NS, 2.0), (302 * NS, 3.0)],
        );
        let (s, f) = settle(&mut c, floor, floor + MIN, &this).unwrap();
        assert_eq!(s, Settle::Fixing);
        assert_eq!(f.points, 3, "this boot's own points are corrected");
        let st = status(&c, floor, floor + MIN).unwrap();
        assert_eq!(
            st.unfixable_points,
            1 + 2,
            "a's one point and b's two, not this boot's"
        );
    }

    #[test]
    fn a_record_from_an_earlier_boot_is_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let floor = 1_764_000_000 * NS;
        let mut c = conn(dir.path());
        let old = Machine {
            boot_id: "an-earlier-boot".into(),
            offset_ns: 0,
        };
        assert!(note_start(&mut c, floor, 100 * NS, &old).unwrap());
        write(&mut w, "m", &[(100 * NS, 1.0), (101 * NS, 2.0)]);
        // This boot's clock is set: the old points cannot be placed.
        let now = floor + MIN;
        let (s, f) = settle(&mut c, floor, now, &Machine::read(now)).unwrap();
        assert_eq!(s, Settle::Ready);
        assert_eq!(f.points, 0);
        assert_eq!(hold_from(&c).unwrap(), None);
        let st = status(&c, floor, now).unwrap();
        assert_eq!(st.unfixable_points, 2);
        assert_eq!(stored_times(dir.path()), vec![100 * NS, 101 * NS]);
    }
}
