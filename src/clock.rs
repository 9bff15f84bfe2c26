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

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::rollup::{bump, counter};
use serde::{Deserialize, Deserializer};

const NS: i64 = 1_000_000_000;

/// How long after the clock is set the job keeps correcting newly committed chunks (points
/// stamped just before the step may still sit in the ingest queue) before lifting the hold.
pub const GRACE_NS: i64 = 10 * NS;

/// When this binary was built, Unix seconds (`SOURCE_DATE_EPOCH` if the build set it).
pub fn build_unix_s() -> i64 {
    env!("EW_BUILD_UNIX_S").parse().unwrap_or(0)
}

/// `[clock]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClockConfig {
    /// The earliest time the clock can truly read (RFC 3339); unset: the build time.
    pub min_valid: Option<Rfc3339>,
}

impl ClockConfig {
    /// The floor, ns since the epoch.
    pub fn floor_ns(&self) -> i64 {
        self.min_valid
            .as_ref()
            .map_or(build_unix_s().saturating_mul(NS), |t| t.ns)
    }
}

/// An RFC 3339 time in the config (`"2026-01-01T00:00:00Z"`).
#[derive(Debug, Clone, PartialEq)]
pub struct Rfc3339 {
    /// As written.
    pub text: String,
    /// Ns since the epoch.
    pub ns: i64,
}

impl<'de> Deserialize<'de> for Rfc3339 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let ns = crate::timeparse::parse_rfc3339(&text).map_err(|_| {
            serde::de::Error::custom(format!(
                "invalid time {text:?}: write an RFC 3339 time such as \"2026-01-01T00:00:00Z\""
            ))
        })?;
        Ok(Rfc3339 { text, ns })
    }
}

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
    conn.prepare_cached("SELECT MIN(first_chunk_id) FROM clock_fix")?
        .query_row([], |r| r.get(0))
}

/// Drops the records of other boots, counting their points as uncorrectable.
fn drop_other_boots(tx: &Connection, boot_id: &str) -> rusqlite::Result<()> {
    let others: Vec<(String, i64)> = tx
        .prepare("SELECT boot_id, MAX(first_chunk_id, fixed_through + 1) FROM clock_fix WHERE boot_id != ?1")?
        .query_map([boot_id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    for (boot, from) in others {
        let points: i64 = tx.query_row(
            "SELECT COALESCE(SUM(n), 0) FROM chunks WHERE id >= ?1",
            [from],
            |r| r.get(0),
        )?;
        tracing::warn!(
            boot = %boot,
            points,
            "points stamped before the clock was set, in an earlier boot, cannot be corrected: kept with their times"
        );
        bump(tx, "clock_unfixable_points", points)?;
        tx.execute("DELETE FROM clock_fix WHERE boot_id = ?1", [boot])?;
    }
    Ok(())
}

/// At agent start-up (before ingest): if `now` is before `floor`, records this boot so that
/// what is written from here on can be corrected once the clock is set. `Ok(true)` when the
/// clock is not set.
pub fn note_start(
    conn: &mut Connection,
    floor: i64,
    now: i64,
    m: &Machine,
) -> rusqlite::Result<bool> {
    if now >= floor {
        return Ok(false);
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    drop_other_boots(&tx, &m.boot_id)?;
    let mine: Option<i64> = tx
        .query_row(
            "SELECT first_chunk_id FROM clock_fix WHERE boot_id = ?1",
            [&m.boot_id],
            |r| r.get(0),
        )
        .optional()?;
    if mine.is_none() {
        // AUTOINCREMENT: `seq` is the largest id ever used, so the next chunk gets seq + 1.
        let next: i64 = tx.query_row(
            "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'chunks'), 0) + 1",
            [],
            |r| r.get(0),
        )?;
        tx.execute(
            "INSERT INTO clock_fix (boot_id, offset_ns, first_chunk_id, noted_ns) VALUES (?1, ?2, ?3, ?4)",
            params![m.boot_id, m.offset_ns, next, now],
        )?;
    }
    tx.commit()?;
    Ok(true)
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
) -> rusqlite::Result<(Settle, Fixed)> {
    let mut fixed = Fixed::default();
    if hold_from(conn)?.is_none() {
        return Ok((Settle::Ready, fixed));
    }
    if now < floor {
        return Ok((Settle::Unset, fixed));
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    drop_other_boots(&tx, &m.boot_id)?;
    let row: Option<(i64, i64, i64, i64)> = tx
        .query_row(
            "SELECT offset_ns, first_chunk_id, fixed_through, synced_ns FROM clock_fix WHERE boot_id = ?1",
            [&m.boot_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let Some((offset, first, through, synced)) = row else {
        tx.commit()?;
        return Ok((Settle::Ready, fixed));
    };
    let step = m.offset_ns.saturating_sub(offset);
    let from = first.max(through.saturating_add(1));
    let mut last = through;
    {
        let mut read = tx
            .prepare("SELECT id, ts_min, ts_max, n, data FROM chunks WHERE id >= ?1 ORDER BY id")?;
        let mut write =
            tx.prepare("UPDATE chunks SET ts_min = ?2, ts_max = ?3, data = ?4 WHERE id = ?1")?;
        let mut rows = read.query([from])?;
        while let Some(r) = rows.next()? {
            let (id, lo, hi): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
            last = last.max(id);
            if lo >= floor || step == 0 {
                continue;
            }
            let n: i64 = r.get(3)?;
            let data: Vec<u8> = r.get(4)?;
            let map = |t: i64| if t < floor { t.saturating_add(step) } else { t };
            if hi < floor {
                // Every point moves: the deltas stay, only the base and the bounds change.
                write.execute(params![id, map(lo), map(hi), data])?;
                fixed.chunks += 1;
                fixed.points += n.max(0) as u64;
                continue;
            }
            match crate::store::codec::retime_chunk(&data, lo, map) {
                Ok((out, nlo, nhi, moved)) => {
                    write.execute(params![id, nlo, nhi, out])?;
                    fixed.chunks += 1;
                    fixed.points += moved;
                }
                Err(e) => {
                    tracing::warn!(chunk = id, error = %e, "cannot correct the times of a corrupt chunk; left as it is");
                }
            }
        }
    }
    bump(&tx, "clock_fixed_points", fixed.points as i64)?;
    let synced = if synced == 0 { now } else { synced };
    let done = now.saturating_sub(synced) >= GRACE_NS;
    if done {
        tx.execute("DELETE FROM clock_fix WHERE boot_id = ?1", [&m.boot_id])?;
    } else {
        tx.execute(
            "UPDATE clock_fix SET fixed_through = ?2, synced_ns = ?3 WHERE boot_id = ?1",
            params![m.boot_id, last, synced],
        )?;
    }
    tx.commit()?;
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

/// The `clock` object of `/api/v1/status`.
pub fn status(conn: &Connection, floor: i64, now: i64) -> rusqlite::Result<serde_json::Value> {
    Ok(serde_json::json!({
        "set": now >= floor,
        "min_valid_ns": floor,
        "held_from_chunk_id": hold_from(conn)?,
        "fixed_points": counter(conn, "clock_fixed_points")?,
        "unfixable_points": counter(conn, "clock_unfixable_points")?,
    }))
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
        let c = conn(dir);
        let mut st = c
            .prepare("SELECT ts_min, data FROM chunks ORDER BY id")
            .unwrap();
        let rows: Vec<(i64, Vec<u8>)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        let mut out = Vec::new();
        for (lo, data) in rows {
            crate::store::codec::decode_chunk(&data, lo, |t, _, _| out.push(t)).unwrap();
        }
        out
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
        assert_eq!(st["set"], true);
        assert_eq!(st["fixed_points"], 601);
        assert!(st["held_from_chunk_id"].is_null());
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
        let (bad_id, bad_data): (i64, Vec<u8>) = c
            .query_row(
                "SELECT id, data FROM chunks ORDER BY id DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        let cut = bad_data[..bad_data.len() - 3].to_vec();
        c.execute(
            "UPDATE chunks SET data = ?2 WHERE id = ?1",
            params![bad_id, cut],
        )
        .unwrap();
        let now = floor + 10 * MIN;
        let (s, f) = settle(&mut c, floor, now, &Machine::read(now)).unwrap();
        assert_eq!(s, Settle::Fixing);
        assert_eq!((f.chunks, f.points), (1, 2), "only the good chunk moves");
        let (lo, data): (i64, Vec<u8>) = c
            .query_row(
                "SELECT ts_min, data FROM chunks WHERE id = ?1",
                [bad_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
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
        assert_eq!(st["unfixable_points"], 2);
        assert_eq!(stored_times(dir.path()), vec![100 * NS, 101 * NS]);
    }
}
