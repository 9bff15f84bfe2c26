//! Recompression of committed chunks, in bounded steps: small chunks (one per tag set per
//! commit: at 1 Hz a tegrastats tag set gets a one-point chunk a second) are merged into
//! columnar chunks of up to [`TARGET_POINTS`] points, and chunks in the legacy form are
//! re-encoded in place. Each step is one short `BEGIN IMMEDIATE` transaction, like the
//! rollup job's. Merging goes through the store by ranges of ids after a cursor
//! (`merge_state.merged_through`), every tag set of a range at once, so each leaf of the
//! chunk table is rewritten once (see [`merge_step`]).
//!
//! What it never breaks: only chunks at or below every consumer's cursor are merged (each
//! tier's `rollup_state.cursor`, each raw-mode sink's `cursor_chunk_id`, and below the clock hold),
//! so a merged chunk is on the same side of every cursor as the chunks it replaces; it
//! keeps the largest of their ids (ids are never reused) and their points in id order, so
//! every reader sees the same points. A chunk carried from before a range is its tag set's
//! newest there, so the order holds across ranges too. A legacy chunk is re-encoded under
//! its own id with the same points. Never decides when to run: `edgewatch maintain
//! --recompress` and the caller's loop do.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::codec::{self, ChunkEncoder, Format};
use super::open::Ctx;
use super::StoreError;

pub use super::chunks::{SMALL_POINTS, TARGET_POINTS};

/// How much one step may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Points of small chunks in a step's range (at least one chunk's).
    pub max_points: usize,
    /// Take the range even if it holds fewer than `max_points` points, up to the horizon
    /// (a one-off pass); otherwise a step waits until the range is full.
    pub all: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_points: 100_000,
            all: false,
        }
    }
}

/// What a step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Chunk rows rewritten (merged or re-encoded).
    pub written: u64,
    /// Chunk rows deleted by merging.
    pub removed: u64,
    /// Legacy chunks re-encoded in place.
    pub converted: u64,
    /// Points in the rows it rewrote.
    pub points: u64,
    /// Bytes of the rows it read.
    pub bytes_before: u64,
    /// Bytes of the rows it wrote.
    pub bytes_after: u64,
}

impl Pass {
    /// Adds another step's figures.
    pub fn add(&mut self, o: &Pass) {
        self.written += o.written;
        self.removed += o.removed;
        self.converted += o.converted;
        self.points += o.points;
        self.bytes_before += o.bytes_before;
        self.bytes_after += o.bytes_after;
    }
}

/// The newest chunk id every consumer has passed (`i64::MAX` when nothing consumes).
fn horizon(tx: &Connection, path: &Path) -> Result<i64, StoreError> {
    tx.query_row(
        "SELECT MIN(c) FROM (SELECT cursor AS c FROM rollup_state \
         UNION ALL SELECT cursor_chunk_id FROM sinks WHERE rollup_tier = 0 \
         UNION ALL SELECT first_chunk_id - 1 FROM clock_fix)",
        [],
        |r| r.get::<_, Option<i64>>(0),
    )
    .map(|h| h.unwrap_or(i64::MAX))
    .ctx(path)
}

/// Where a small chunk is in a range and how many points it holds (its data is read when
/// its run is merged).
#[derive(Debug, Clone, Copy)]
struct Slot {
    id: i64,
    tagset: i64,
    n: i64,
}

impl Slot {
    /// From a statement selecting `id, tagset_id, n`.
    fn from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<Slot> {
        Ok(Slot {
            id: r.get(0)?,
            tagset: r.get(1)?,
            n: r.get(2)?,
        })
    }
}

struct Row {
    id: i64,
    ts_min: i64,
    n: i64,
    data: Vec<u8>,
}

impl Row {
    /// From a statement selecting `id, ts_min, n, data`.
    fn from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
        Ok(Row {
            id: r.get(0)?,
            ts_min: r.get(1)?,
            n: r.get(2)?,
            data: r.get(3)?,
        })
    }
}

/// One merge step over the next range of ids after the merge cursor
/// (`merge_state.merged_through`): the small chunks in it, up to `limits.max_points` points,
/// of every tag set at once, each tag set's in greedy runs of up to [`TARGET_POINTS`]
/// points; a tag set's newest chunk at or below the cursor, when it is not full yet, leads
/// its first run (so a slow tag set's chunks still fill up over several ranges). The cursor
/// then moves to the range's end. Without `limits.all` a step waits until the range holds
/// `max_points` points. `None` when there was no range to take.
///
/// Why by range: each writer commit adds one small chunk per tag set, so one tag set's
/// chunks lie on every leaf of the hour, and merging tag set by tag set rewrote nearly every
/// leaf at every step. A range's leaves are rewritten once; the carried chunks sit at the
/// end of the previous range, on a few leaves.
pub fn merge_step(
    conn: &mut Connection,
    path: &Path,
    limits: &Limits,
) -> Result<Option<Pass>, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(path)?;
    let h = horizon(&tx, path)?;
    if limits.all {
        // Merging everything (`maintain --recompress`): the unindexed tail too (the writer,
        // if it runs, goes on from the new `indexed_through`).
        super::chunks::index_tail(&tx, path)?;
    }
    let (after, upto): (i64, i64) = tx
        .query_row(
            "SELECT merged_through, MIN(?1, (SELECT indexed_through FROM chunk_tail)) \
             FROM merge_state WHERE id = 1",
            [h],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .ctx(path)?;
    if upto <= after {
        return Ok(None);
    }
    // The range: small chunks after the cursor, in id order, until `max_points` points.
    // Only where each one is and how many points it holds: the data is read run by run
    // below, so a step holds one run's chunks at a time, not the whole range's.
    let budget = limits.max_points.max(1) as i64;
    let mut slots: Vec<Slot> = Vec::new();
    let mut points = 0i64;
    {
        let mut st = tx
            .prepare_cached(
                "SELECT id, tagset_id, n FROM chunks \
                 WHERE id > ?1 AND id <= ?2 AND n < ?3 ORDER BY id",
            )
            .ctx(path)?;
        let mut rows = st.query(params![after, upto, SMALL_POINTS]).ctx(path)?;
        while let Some(r) = rows.next().ctx(path)? {
            let slot = Slot::from_sql(r).ctx(path)?;
            points += slot.n.max(0);
            slots.push(slot);
            if points >= budget {
                break;
            }
        }
    }
    let full = points >= budget;
    if !full && !limits.all {
        return Ok(None);
    }
    // A range that ends before `upto` ends at its last small chunk; one that takes the rest
    // covers everything through `upto` (chunks past the last small one are full already).
    let through = match slots.last() {
        Some(last) if full => last.id,
        _ => upto,
    };
    // Each tag set's chunks together, in id order within it (a stable sort).
    slots.sort_by_key(|r| r.tagset);
    let mut pass = Pass::default();
    // Each tag set's newest chunk before the range, if it is not full: first in its line.
    let mut carry = tx
        .prepare_cached(
            "SELECT id, tagset_id, n FROM chunks WHERE n < ?3 AND id = \
             (SELECT MAX(id) FROM chunk_index WHERE tagset_id = ?1 AND id <= ?2)",
        )
        .ctx(path)?;
    let mut load = tx
        .prepare_cached("SELECT id, ts_min, n, data FROM chunks WHERE id = ?1")
        .ctx(path)?;
    for group in slots.chunk_by(|a, b| a.tagset == b.tagset) {
        let carried: Option<Slot> = carry
            .query_row(
                params![group[0].tagset, after, TARGET_POINTS as i64],
                Slot::from_sql,
            )
            .optional()
            .ctx(path)?;
        let line: Vec<Slot> = carried.into_iter().chain(group.iter().copied()).collect();
        // Greedy runs in id order, each up to TARGET_POINTS points.
        let mut start = 0;
        while start < line.len() {
            let mut end = start;
            let mut sum = 0usize;
            while end < line.len() && sum + line[end].n.max(0) as usize <= TARGET_POINTS {
                sum += line[end].n.max(0) as usize;
                end += 1;
            }
            let end = end.max(start + 1);
            if end - start > 1 {
                let run: Vec<Row> = line[start..end]
                    .iter()
                    .map(|s| load.query_row([s.id], Row::from_sql))
                    .collect::<rusqlite::Result<_>>()
                    .ctx(path)?;
                merge(&tx, path, &run, &mut pass)?;
            }
            start = end;
        }
    }
    drop(load);
    drop(carry);
    tx.execute(
        "UPDATE merge_state SET merged_through = ?1 WHERE id = 1",
        [through],
    )
    .ctx(path)?;
    super::counters::bump(
        &tx,
        path,
        super::counters::MERGED_RAW_CHUNKS,
        pass.removed as i64,
    )?;
    tx.commit().ctx(path)?;
    Ok(Some(pass))
}

/// Replaces `run` (one tag set, id order) by one chunk under the largest id. A chunk that
/// does not decode stays as it is (logged; readers report it by id).
fn merge(tx: &Connection, path: &Path, run: &[Row], pass: &mut Pass) -> Result<(), StoreError> {
    let mut enc = ChunkEncoder::new();
    let mut merged: Vec<&Row> = Vec::with_capacity(run.len());
    for r in run {
        let mut points: Vec<(i64, Vec<(i64, crate::model::Value)>)> = Vec::new();
        match codec::decode_points(&r.data, r.ts_min, |ts, vals| {
            points.push((ts, std::mem::take(vals)))
        }) {
            Ok(()) => {
                for (ts, vals) in &points {
                    enc.push(*ts, vals.iter().map(|(s, v)| (*s, v)));
                }
                merged.push(r);
            }
            Err(e) => {
                tracing::warn!(chunk = r.id, error = %e.in_chunk(r.id), "cannot recompress a corrupt chunk; left as it is");
            }
        }
    }
    let (Some(last), true) = (merged.last(), merged.len() > 1) else {
        return Ok(());
    };
    let Some(e) = enc.finish() else {
        return Ok(());
    };
    tx.prepare_cached(
        "UPDATE chunks SET ts_min = ?2, ts_max = ?3, n = ?4, data = ?5 WHERE id = ?1",
    )
    .and_then(|mut st| st.execute(params![last.id, e.ts_min, e.ts_max, e.n as i64, e.data]))
    .ctx(path)?;
    super::chunks::delete(tx, path, merged[..merged.len() - 1].iter().map(|r| r.id))?;
    pass.written += 1;
    pass.removed += merged.len() as u64 - 1;
    pass.points += e.n as u64;
    pass.bytes_before += merged.iter().map(|r| r.data.len() as u64).sum::<u64>();
    pass.bytes_after += e.data.len() as u64;
    Ok(())
}

/// One conversion step: the legacy chunks among the `max_chunks` after id `after`,
/// re-encoded in place. Returns what it did and the id to continue after (`None`: done).
/// A chunk that does not decode is left as it is and logged (readers report it by id).
pub fn convert_step(
    conn: &mut Connection,
    path: &Path,
    after: i64,
    max_chunks: usize,
) -> Result<(Pass, Option<i64>), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(path)?;
    let rows: Vec<Row> = tx
        .prepare_cached("SELECT id, ts_min, n, data FROM chunks WHERE id > ?1 ORDER BY id LIMIT ?2")
        .and_then(|mut st| {
            st.query_map(params![after, max_chunks.max(1) as i64], Row::from_sql)
                .and_then(|rows| rows.collect())
        })
        .ctx(path)?;
    let mut pass = Pass::default();
    let next = rows.last().map(|r| r.id);
    for r in rows {
        if !matches!(codec::format(&r.data), Ok(Format::Legacy)) {
            continue;
        }
        match codec::reencode(&r.data, r.ts_min) {
            Ok(Some(e)) => {
                tx.prepare_cached(
                    "UPDATE chunks SET ts_min = ?2, ts_max = ?3, data = ?4 WHERE id = ?1",
                )
                .and_then(|mut st| st.execute(params![r.id, e.ts_min, e.ts_max, e.data]))
                .ctx(path)?;
                pass.written += 1;
                pass.converted += 1;
                pass.points += r.n.max(0) as u64;
                pass.bytes_before += r.data.len() as u64;
                pass.bytes_after += e.data.len() as u64;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(chunk = r.id, error = %e, "cannot recompress a corrupt chunk; left as it is");
            }
        }
    }
    tx.commit().ctx(path)?;
    Ok((pass, next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;
    use crate::ingest::lineproto::{parse_body, Precision};
    use crate::store::chunks::{self, Scan};
    use crate::store::query::RawQuery;
    use crate::store::{testing, Mode, Reader, Writer};
    use std::ops::ControlFlow;

    fn q(m: &str) -> RawQuery {
        RawQuery {
            measurement: m.into(),
            from: i64::MIN,
            to: i64::MAX,
            limit: usize::MAX,
            ..Default::default()
        }
    }

    fn ids(dir: &Path) -> Vec<(i64, i64)> {
        let r = Reader::open(dir).unwrap();
        let mut out = Vec::new();
        chunks::scan(r.conn(), r.path(), &Scan::default(), |c| {
            out.push((c.id, c.n));
            Ok(ControlFlow::Continue(()))
        })
        .unwrap();
        out
    }

    /// 300 one-point commits of two tag sets, as a 1 Hz collector leaves them.
    fn store() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        for i in 0..300i64 {
            let body = format!(
                "t,z=a c={}.5,s=\"x{}\" {}\nt,z=b ok={} {}\n",
                i % 7,
                i % 3,
                1_000 + i * 1_000_000_000 + i % 13,
                i % 2 == 0,
                1_000 + i * 1_000_000_000
            );
            let p = parse_body(&body, Precision::Nanos, 0);
            w.write(&[&p.batch]).unwrap();
        }
        dir
    }

    #[test]
    fn merging_keeps_every_point_and_never_crosses_a_cursor() {
        let dir = store();
        let before = Reader::open(dir.path())
            .unwrap()
            .query_raw(&q("t"))
            .unwrap();
        let all = ids(dir.path());
        assert_eq!(all.len(), 600);
        // A tier folded through chunk 400: only chunks at or below it may merge.
        testing::set_tier_cursor(dir.path(), 60, 400);
        let (mut conn, path) = crate::store::open(dir.path(), Mode::Job).unwrap();
        let limits = Limits {
            all: true,
            max_points: 150,
        };
        let mut steps = 0;
        while merge_step(&mut conn, &path, &limits).unwrap().is_some() {
            steps += 1;
            assert!(steps < 20, "does not converge");
        }
        assert!(steps >= 2, "bounded steps: {steps}");
        let after = ids(dir.path());
        let above: Vec<_> = after.iter().filter(|c| c.0 > 400).collect();
        assert_eq!(above, all.iter().filter(|c| c.0 > 400).collect::<Vec<_>>());
        assert!(
            after.iter().filter(|c| c.0 <= 400).count() < 10,
            "{after:?}"
        );
        assert!(after.iter().any(|c| c.0 == 400 || c.0 == 399));
        let got = Reader::open(dir.path())
            .unwrap()
            .query_raw(&q("t"))
            .unwrap();
        assert_eq!(format!("{got:?}"), format!("{before:?}"));
    }

    #[test]
    fn a_corrupt_chunk_is_an_error_naming_it_and_the_rest_stays_readable() {
        let dir = store();
        // Chunk 3 is tag set a's second point; break it in the columnar header.
        testing::set_chunk_data(dir.path(), 3, &[codec::columnar::MARKER, 0xff, 0xff, 0x7f]);
        let r = Reader::open(dir.path()).unwrap();
        let e = r.query_raw(&q("t")).unwrap_err().to_string();
        assert!(e.contains("chunk 3:"), "{e}");
        let mut other = q("t");
        other.tags = vec![("z".into(), "b".into())];
        let ok = r.query_raw(&other).unwrap();
        assert_eq!(ok.series[0].points.len(), 300);
        // Recompression leaves it as it is and carries on with the rest.
        drop(r);
        let (mut conn, path) = crate::store::open(dir.path(), Mode::Job).unwrap();
        let limits = Limits {
            all: true,
            ..Limits::default()
        };
        while merge_step(&mut conn, &path, &limits).unwrap().is_some() {}
        assert!(ids(dir.path()).iter().any(|c| c.0 == 3));
        assert!(ids(dir.path()).len() < 10);
        let (_, next) = convert_step(&mut conn, &path, 0, 100).unwrap();
        assert!(next.is_some());
    }

    const NS: i64 = 1_000_000_000;
    /// 2025-11-24: the clock floor of the hold tests.
    const FLOOR: i64 = 1_764_000_000 * NS;

    /// Every chunk row with id in `ids`: (id, tag set, ts_min, ts_max, n, a digest of its
    /// data).
    type RawRow = (i64, i64, i64, i64, i64, u64);
    fn rows(dir: &Path, ids: std::ops::RangeInclusive<i64>) -> Vec<RawRow> {
        let r = Reader::open(dir).unwrap();
        let mut out = Vec::new();
        let scan = Scan {
            after: Some(ids.start() - 1),
            through: Some(*ids.end()),
            ..Scan::default()
        };
        chunks::scan(r.conn(), r.path(), &scan, |c| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            c.data.hash(&mut h);
            out.push((c.id, c.tagset_id, c.ts_min, c.ts_max, c.n, h.finish()));
            Ok(ControlFlow::Continue(()))
        })
        .unwrap();
        out
    }

    /// The points stored in chunks with id in `ids`, as (tag set, time, value), sorted.
    fn stored(dir: &Path, ids: std::ops::RangeInclusive<i64>) -> Vec<(i64, i64, String)> {
        let r = Reader::open(dir).unwrap();
        let mut out = Vec::new();
        let scan = Scan {
            after: Some(ids.start() - 1),
            through: Some(*ids.end()),
            ..Scan::default()
        };
        chunks::scan(r.conn(), r.path(), &scan, |c| {
            c.decode(r.path(), |t, _, v| {
                out.push((c.tagset_id, t, format!("{v:?}")))
            })?;
            Ok(ControlFlow::Continue(()))
        })
        .unwrap();
        out.sort();
        out
    }

    /// Merges every small chunk it may; returns how many steps wrote something.
    fn compact_all(conn: &mut Connection, path: &Path) -> usize {
        let limits = Limits {
            all: true,
            max_points: 150,
        };
        let mut steps = 0;
        while merge_step(conn, path, &limits).unwrap().is_some() {
            steps += 1;
            assert!(steps < 100, "does not converge");
        }
        steps
    }

    /// One-point commits of tag sets `a` and `b` at `times` (values `i` and `-i` plus
    /// `base`): two one-point chunks each.
    fn commits(w: &mut Writer, times: impl Iterator<Item = i64>, base: f64) {
        for (i, t) in times.enumerate() {
            crate::rollup::tests::write(w, "m,s=a", &[(t, base + i as f64)]);
            crate::rollup::tests::write(w, "m,s=b", &[(t, -base - i as f64)]);
        }
    }

    /// The review's case: a raw sink whose cursor lags in the middle of small chunks, a
    /// clock hold after some chunk, compaction run at every stage. The sink reading from its
    /// cursor always gets exactly the points after it, once (a merged chunk never takes a
    /// point it had across its cursor), and held points keep their stored times until the
    /// hold lifts, then move by the clock's step exactly once.
    #[test]
    fn merging_never_resends_to_a_lagging_sink_nor_retimes_held_points() {
        use crate::clock::{self, Machine, Settle};
        use crate::forward::store::{Cursor, Source};
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        // A good clock: chunks 1..=400.
        commits(&mut w, (0..200).map(|i| FLOOR + i * NS), 0.0);
        // Rollup does not hold merging back here (it folded everything); the sink has sent
        // through chunk 151 (tag set a's 76th point; b's 76th is chunk 152).
        testing::set_tier_cursor(dir.path(), 60, i64::MAX / 2);
        testing::add_sink(dir.path(), "s", 151);
        // The device restarts on an unset clock: the hold starts at the next chunk, 401.
        let (mut conn, path) = crate::store::open(dir.path(), Mode::Job).unwrap();
        let boot = Machine {
            boot_id: "this-boot".into(),
            offset_ns: 0,
        };
        let boot_now = 3_600 * NS;
        assert!(clock::note_start(&mut conn, FLOOR, boot_now, &boot).unwrap());
        assert_eq!(clock::hold_from(&conn).unwrap(), Some(401));
        commits(&mut w, (0..100).map(|i| boot_now + i * NS), 1000.0);
        let held = rows(dir.path(), 401..=600);
        assert_eq!(held.len(), 200);

        let mut src = Source::open(dir.path(), vec![]).unwrap();
        let due = src.read(151, 100_000).unwrap();
        assert_eq!((due.first, due.last, due.points.len()), (152, 400, 249));
        let sent = stored(dir.path(), 1..=151);
        let above = rows(dir.path(), 152..=i64::MAX);

        // 1. The sink lags at 151: only chunks at or below it merge.
        assert!(compact_all(&mut conn, &path) > 0);
        assert!(
            rows(dir.path(), 1..=151).len() < 10,
            "merged below the cursor"
        );
        assert_eq!(
            stored(dir.path(), 1..=151),
            sent,
            "what it had stays behind it"
        );
        assert_eq!(
            rows(dir.path(), 152..=i64::MAX),
            above,
            "nothing after it moved"
        );
        let again = src.read(151, 100_000).unwrap();
        assert_eq!((again.first, again.last), (due.first, due.last));
        assert_eq!(
            again.points, due.points,
            "exactly the points after the cursor, once"
        );

        // 2. It sends them and catches up with the hold: the chunks before the hold merge,
        // the held ones stay as they are, unseen.
        let (mut cur, _) = Cursor::open(dir.path(), "s").unwrap();
        cur.ack(due.last, 1, due.points.len() as i64, FLOOR, FLOOR)
            .unwrap();
        cur.flush().unwrap();
        assert!(compact_all(&mut conn, &path) > 0);
        assert!(rows(dir.path(), 1..=400).len() < 10);
        assert_eq!(rows(dir.path(), 401..=i64::MAX), held);
        assert!(src.read(400, 100_000).unwrap().points.is_empty());

        // 3. The clock is set (stepped by `step`): the held chunks are corrected in place
        // and the hold stays for the grace period; what is written meanwhile waits too.
        let step = FLOOR + 30 * 86_400 * NS - boot_now;
        let set = Machine {
            boot_id: "this-boot".into(),
            offset_ns: step,
        };
        let now = boot_now + step + 100 * NS;
        let (st, fixed) = clock::settle(&mut conn, FLOOR, now, &set).unwrap();
        assert_eq!((st, fixed.points), (Settle::Fixing, 200));
        commits(&mut w, (0..5).map(|i| now + i * NS), 5000.0);
        let fixed_rows = rows(dir.path(), 401..=i64::MAX);
        assert_eq!(fixed_rows.len(), 210);
        compact_all(&mut conn, &path);
        assert_eq!(rows(dir.path(), 401..=i64::MAX), fixed_rows);
        assert!(src.read(400, 100_000).unwrap().points.is_empty());
        // A second pass in the grace period moves nothing twice.
        let (st, fixed) = clock::settle(&mut conn, FLOOR, now + NS, &set).unwrap();
        assert_eq!((st, fixed.points), (Settle::Fixing, 0));

        // 4. The hold lifts: the sink gets the held points, moved by the step once, and the
        // later ones, each once; merging (still bounded by its cursor) changes nothing of
        // that; once acknowledged, everything merges and nothing comes again.
        let (st, _) = clock::settle(&mut conn, FLOOR, now + clock::GRACE_NS, &set).unwrap();
        assert_eq!(st, Settle::Ready);
        assert_eq!(clock::hold_from(&conn).unwrap(), None);
        let rest = src.read(400, 100_000).unwrap();
        let times = |pts: &[crate::forward::encode::Point], s: &str| -> Vec<i64> {
            pts.iter()
                .filter(|p| p.series.prefix == s)
                .map(|p| p.ts)
                .collect()
        };
        let mut want: Vec<i64> = (0..100).map(|i| boot_now + i * NS + step).collect();
        want.extend((0..5).map(|i| now + i * NS));
        assert_eq!(times(&rest.points, "m,s=a"), want);
        assert_eq!(times(&rest.points, "m,s=b"), want);
        assert_eq!(rest.points.len(), 210);
        compact_all(&mut conn, &path);
        let again = src.read(400, 100_000).unwrap();
        assert_eq!((again.last, again.points), (rest.last, rest.points));
        cur.ack(rest.last, 2, 210, now, now).unwrap();
        cur.flush().unwrap();
        assert!(compact_all(&mut conn, &path) > 0);
        assert!(src.read(rest.last, 100_000).unwrap().points.is_empty());
        assert_eq!(stored(dir.path(), 1..=i64::MAX).len(), 400 + 200 + 10);
    }

    /// The merge cursor (`merge_state.merged_through`).
    fn merged_through(conn: &Connection) -> i64 {
        conn.query_row("SELECT merged_through FROM merge_state", [], |r| r.get(0))
            .unwrap()
    }

    /// A step takes the next range of ids after the cursor, every tag set in it at once:
    /// rows outside the range stay as they are but for each tag set's newest chunk before
    /// it (not full yet), which is carried into the tag set's first run, so a slow tag set
    /// still ends up in one chunk and a tag set that stopped writing is never rewritten.
    /// Without `all`, the rest waits until it fills a range. Every point stays.
    #[test]
    fn a_step_merges_one_range_of_every_tag_set_and_carries_each_partial_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        // `a` every second, `b` every 5th; `c` only in the first 20 seconds.
        let seconds = |w: &mut Writer, from: i64, to: i64| {
            for s in from..to {
                let t = FLOOR + s * NS;
                crate::rollup::tests::write(w, "m,s=a", &[(t, s as f64)]);
                if s % 5 == 0 {
                    crate::rollup::tests::write(w, "m,s=b", &[(t, -s as f64)]);
                }
                if s < 20 {
                    crate::rollup::tests::write(w, "m,s=c", &[(t, 0.5)]);
                }
            }
        };
        seconds(&mut w, 0, 100);
        let all = stored(dir.path(), 1..=i64::MAX);
        let (mut conn, path) = crate::store::open(dir.path(), Mode::Job).unwrap();
        let limits = Limits {
            max_points: 100,
            all: false,
        };
        let tagsets = |rows: &[RawRow]| {
            let mut t: Vec<i64> = rows.iter().map(|r| r.1).collect();
            t.sort();
            t
        };
        // What the writer does every 30 s: only indexed chunks are merged without `all`.
        let index = |conn: &mut Connection| {
            let tx = conn.transaction().unwrap();
            chunks::index_tail(&tx, &path).unwrap();
            tx.commit().unwrap();
        };
        index(&mut conn);

        // 1. The first 100 points: one chunk per tag set at or below the cursor.
        let before = rows(dir.path(), 1..=i64::MAX);
        assert_eq!(before.len(), 100 + 20 + 20);
        let pass = merge_step(&mut conn, &path, &limits).unwrap().unwrap();
        let through = merged_through(&conn);
        let range = before.iter().filter(|r| r.0 <= through).count() as u64;
        assert_eq!((pass.written, pass.removed), (3, range - 3), "{through}");
        let merged = rows(dir.path(), 1..=through);
        assert_eq!(tagsets(&merged).len(), 3, "{merged:?}");
        assert_eq!(
            rows(dir.path(), through + 1..=i64::MAX),
            before
                .iter()
                .filter(|r| r.0 > through)
                .cloned()
                .collect::<Vec<_>>(),
            "past the range: untouched"
        );

        // 2. What is left does not fill a range: it waits, and nothing changes.
        let waiting = rows(dir.path(), 1..=i64::MAX);
        assert!(merge_step(&mut conn, &path, &limits).unwrap().is_none());
        assert_eq!(rows(dir.path(), 1..=i64::MAX), waiting);
        assert_eq!(merged_through(&conn), through);

        // 3. More seconds fill the next range: `a`'s and `b`'s chunks before it are carried
        // into it; `c` has written nothing since, so its chunk stays as it is.
        seconds(&mut w, 100, 200);
        index(&mut conn);
        let pass = merge_step(&mut conn, &path, &limits).unwrap().unwrap();
        let through2 = merged_through(&conn);
        assert!(through2 > through);
        let now = rows(dir.path(), 1..=through2);
        let c = merged.iter().find(|r| !now.iter().any(|n| n.1 == r.1));
        assert!(c.is_none(), "every tag set keeps a chunk: {now:?}");
        let kept: Vec<&RawRow> = merged.iter().filter(|r| now.contains(r)).collect();
        assert_eq!(kept.len(), 1, "only `c`'s chunk is not carried: {now:?}");
        assert_eq!(now.len(), 3, "{now:?}");
        assert_eq!(pass.written, 2);

        // 4. `maintain --recompress` (all): the rest too; every point once.
        let everything = Limits {
            all: true,
            ..limits
        };
        while merge_step(&mut conn, &path, &everything).unwrap().is_some() {}
        assert_eq!(
            merged_through(&conn),
            chunks::newest_id(&conn, &path).unwrap()
        );
        assert_eq!(rows(dir.path(), 1..=i64::MAX).len(), 3);
        let mut want = all;
        want.extend(
            stored(dir.path(), 1..=i64::MAX)
                .into_iter()
                .filter(|p| p.1 >= FLOOR + 100 * NS),
        );
        want.sort();
        assert_eq!(stored(dir.path(), 1..=i64::MAX), want);
    }

    /// With nothing else to hold merging back (no sink, no rollup), held chunks are left as
    /// they are until the hold lifts: their points keep their chunks and times.
    #[test]
    fn held_chunks_are_not_merged_until_the_hold_lifts() {
        use crate::clock::{self, Machine, Settle};
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        commits(&mut w, (0..20).map(|i| FLOOR + i * NS), 0.0);
        let (mut conn, path) = crate::store::open(dir.path(), Mode::Job).unwrap();
        let boot = Machine {
            boot_id: "b".into(),
            offset_ns: 0,
        };
        assert!(clock::note_start(&mut conn, FLOOR, 100 * NS, &boot).unwrap());
        commits(&mut w, (0..20).map(|i| 100 * NS + i * NS), 100.0);
        let held = rows(dir.path(), 41..=i64::MAX);
        assert!(compact_all(&mut conn, &path) > 0);
        assert!(rows(dir.path(), 1..=40).len() <= 2);
        assert_eq!(rows(dir.path(), 41..=i64::MAX), held);
        // Set, then past the grace period: corrected, lifted, merged.
        let set = Machine {
            boot_id: "b".into(),
            offset_ns: FLOOR,
        };
        let now = FLOOR + 200 * NS;
        assert_eq!(
            clock::settle(&mut conn, FLOOR, now, &set).unwrap().0,
            Settle::Fixing
        );
        let fixed = rows(dir.path(), 41..=i64::MAX);
        assert_eq!(compact_all(&mut conn, &path), 0);
        assert_eq!(rows(dir.path(), 41..=i64::MAX), fixed);
        let later = now + clock::GRACE_NS;
        assert_eq!(
            clock::settle(&mut conn, FLOOR, later, &set).unwrap().0,
            Settle::Ready
        );
        assert!(compact_all(&mut conn, &path) > 0);
        // Every point once; the held ones moved by the step (FLOOR) exactly once.
        let mut times: Vec<i64> = stored(dir.path(), 1..=i64::MAX)
            .into_iter()
            .map(|p| p.1)
            .collect();
        times.sort();
        let mut want: Vec<i64> = (0..20)
            .chain(100..120)
            .flat_map(|i| [FLOOR + i * NS; 2])
            .collect();
        want.sort();
        assert_eq!(times, want);
    }
}
