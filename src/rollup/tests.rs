//! Tests of the job against real stores in temp dirs: percentile accuracy, resumable
//! steps, retention, the budget, row counts.

use super::plan::NS;
use super::*;
use crate::config::Synchronous;
use crate::model::{Batch, Line, Value};
use std::path::Path;

use crate::store::{db_path, Reader, Writer};

const MIN: i64 = 60 * NS;
const HOUR: i64 = 3600 * NS;

/// Writes `pts` as field `v` of the series `key`, in batches of 50,000 lines.
pub(crate) fn write(w: &mut Writer, key: &str, pts: &[(i64, f64)]) {
    for part in pts.chunks(50_000) {
        let batch = Batch {
            lines: part
                .iter()
                .map(|(ts, v)| Line {
                    key: key.to_string(),
                    fields: vec![("v".to_string(), Value::F64(*v))],
                    ts: *ts,
                    line_no: 0,
                })
                .collect(),
        };
        w.write(&[&batch]).unwrap();
    }
}

fn rng(seed: u64) -> impl FnMut() -> f64 {
    let mut s = seed.max(1);
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
}

/// One point of each of `series` series (`m,s=sNNN`, field `v`) at the start of minute `m`
/// (plus a second), in one batch.
fn write_minute(w: &mut Writer, r: &mut dyn FnMut() -> f64, series: usize, m: i64) {
    let batch = Batch {
        lines: (0..series)
            .map(|s| Line {
                key: format!("m,s=s{s:03}"),
                fields: vec![("v".to_string(), Value::F64(r()))],
                ts: m * MIN + NS,
                line_no: 0,
            })
            .collect(),
    };
    w.write(&[&batch]).unwrap();
}

/// `plan` with every tier settling (`settle_from_ns = 0`), the 1m tier too.
fn settling_every_tier(mut plan: Plan) -> Plan {
    plan.settle_from_ns = 0;
    plan
}

fn plan_with(tiers: &[&str], batch_points: usize, max_bytes: u64) -> Plan {
    Plan::new(
        &RollupConfig {
            tiers: tiers.iter().map(|t| t.to_string()).collect(),
            batch_points,
            ..Default::default()
        },
        &RetentionConfig {
            max_bytes,
            ..Default::default()
        },
    )
    .unwrap()
}

fn exact(sorted: &[f64], q: f64) -> f64 {
    sorted[(q * (sorted.len() - 1) as f64).floor() as usize]
}

/// The accuracy requirement: 1,000,000 points each of uniform, log-normal and
/// Pareto data; every quantile read from the 1 min and the 1 h tier, over the whole range
/// and over every hour, is within 1% of the exact quantile of the raw points.
#[test]
fn percentiles_from_1m_and_1h_rollups_are_within_1_percent_for_a_million_points() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
    let n = 1_000_000i64;
    let dt = 100_000_000; // 10 points per second: ~27.8 h of data.
    let t0 = 1_700_000_000 * NS - (1_700_000_000 * NS) % HOUR;
    let mut r = rng(42);
    let mut dists: Vec<(&str, Vec<f64>)> = vec![
        ("uniform", (0..n).map(|_| 1.0 + 99.0 * r()).collect()),
        (
            "lognormal",
            (0..n)
                .map(|_| {
                    let z = (-2.0 * r().ln()).sqrt() * (std::f64::consts::TAU * r()).cos();
                    (3.0 + 0.8 * z).exp()
                })
                .collect(),
        ),
        (
            "pareto",
            (0..n).map(|_| 5.0 / r().powf(1.0 / 1.5)).collect(),
        ),
    ];
    for (name, vals) in &dists {
        let pts: Vec<(i64, f64)> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| (t0 + i as i64 * dt, *v))
            .collect();
        write(&mut w, &format!("lat,dist={name}"), &pts);
    }
    let end = t0 + n * dt;
    let mut job = Job::open(dir.path(), plan_with(&["1m", "1h"], 200_000, 0)).unwrap();
    let mut rep = Report::default();
    job.rollup(end, false, &|| false, &mut rep).unwrap();
    assert_eq!(rep.points, 3 * n as u64);
    let reader = Reader::open(dir.path()).unwrap();
    let qs = [0.5, 0.9, 0.95, 0.99, 0.999];
    for (name, vals) in &mut dists {
        let tags = vec![("dist".to_string(), name.to_string())];
        // Exact per-hour and whole-range quantiles.
        let hours: Vec<Vec<f64>> = vals
            .chunks((HOUR / dt) as usize)
            .map(|c| {
                let mut c = c.to_vec();
                c.sort_by(f64::total_cmp);
                c
            })
            .collect();
        vals.sort_by(f64::total_cmp);
        for tier in ["1m", "1h"] {
            let plan = plan_with(&[tier], 1, 0);
            let c = crate::engine::collect(
                &reader,
                &plan,
                "lat",
                "v",
                &tags,
                t0,
                end - 1,
                HOUR,
                crate::engine::Need::All,
                end,
            )
            .unwrap();
            assert_eq!(c.tier, tier);
            let mut steps: Vec<crate::engine::StepAcc> = c.sets[0].1.values().cloned().collect();
            assert_eq!(steps.len(), hours.len());
            // The whole range: every hour's buckets merged.
            let mut all = crate::engine::StepAcc::default();
            for s in &steps {
                all.acc.merge(&s.acc);
            }
            steps.push(all);
            let windows: Vec<&[f64]> = hours
                .iter()
                .map(|h| &h[..])
                .chain(std::iter::once(&vals[..]))
                .collect();
            {
                for (s, exact_vals) in steps.iter().zip(windows) {
                    assert_eq!(s.acc.count as usize, exact_vals.len());
                    for q in qs {
                        let got = s.quantile(q).unwrap();
                        let want = exact(exact_vals, q);
                        let err = ((got - want) / want).abs();
                        assert!(err <= 0.01, "{name} {tier} q={q}: {got} vs {want} ({err})");
                    }
                }
            }
        }
    }
}

fn dump(dir: &Path) -> Vec<crate::store::testing::RollupRow> {
    crate::store::testing::rollup_rows(dir)
}

fn copy_store(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in ["edgewatch.db", "edgewatch.db-wal"] {
        if from.join(f).exists() {
            std::fs::copy(from.join(f), to.join(f)).unwrap();
        }
    }
}

#[test]
fn an_interrupted_rollup_resumes_to_identical_rows_and_late_points_merge() {
    let base = tempfile::tempdir().unwrap();
    let src = base.path().join("src");
    {
        let mut w = Writer::open(&src, 100, Synchronous::Normal).unwrap();
        let mut r = rng(5);
        for block in 0..30 {
            for s in 0..4 {
                let pts: Vec<(i64, f64)> = (block * 1000..(block + 1) * 1000)
                    .map(|i| (i * NS / 3, r() * 100.0 + 0.1 * f64::from(s)))
                    .collect();
                write(&mut w, &format!("m,s={s}"), &pts);
            }
        }
        // Late points: an hour after the data, back into the first minutes.
        write(
            &mut w,
            "m,s=0",
            &[(3 * HOUR, 1.0), (5 * NS, 7.0), (6 * NS, 8.0)],
        );
    }
    let (a, b) = (base.path().join("a"), base.path().join("b"));
    copy_store(&src, &a);
    copy_store(&src, &b);
    let plan = plan_with(&["1m", "1h"], 7_000, 0);
    let now = 4 * HOUR;
    let mut rep = Report::default();
    Job::open(&a, plan.clone())
        .unwrap()
        .rollup(now, false, &|| false, &mut rep)
        .unwrap();
    assert!(rep.steps > 5, "{rep:?}");
    // Stop after 3 steps (as a crash between transactions would), reopen, finish.
    let steps = std::cell::Cell::new(0);
    let stop = || {
        steps.set(steps.get() + 1);
        steps.get() > 3
    };
    let mut rep_b = Report::default();
    Job::open(&b, plan.clone())
        .unwrap()
        .rollup(now, false, &stop, &mut rep_b)
        .unwrap();
    assert!(rep_b.interrupted);
    let mut rest = Report::default();
    Job::open(&b, plan.clone())
        .unwrap()
        .rollup(now, false, &|| false, &mut rest)
        .unwrap();
    assert_eq!(rep_b.points + rest.points, rep.points);
    // A rerun on a finished store changes nothing.
    let mut again = Report::default();
    Job::open(&b, plan)
        .unwrap()
        .rollup(now, false, &|| false, &mut again)
        .unwrap();
    assert_eq!(again.points, 0);
    assert_eq!(dump(&a), dump(&b));
    // Merged buckets (late points, resumed steps) are not counted twice.
    assert_rows_counted(&a, &plan_with(&["1m", "1h"], 7_000, 0));
    assert_rows_counted(&b, &plan_with(&["1m", "1h"], 7_000, 0));
    // The late points were merged into their minute and counted.
    let reader = Reader::open(&a).unwrap();
    let (conn, path) = (reader.conn(), reader.path());
    let set = crate::store::dict::tagsets(conn, path, Some("m"))
        .unwrap()
        .into_iter()
        .find(|t| t.key == "m,s=0")
        .unwrap();
    let sid = crate::store::dict::numeric_series(conn, path, set.id, "v")
        .unwrap()
        .unwrap();
    let mut count = 0;
    crate::store::tiers::read_range(
        conn,
        path,
        60,
        sid,
        0,
        0,
        crate::store::tiers::Need::Sum,
        |_, acc| {
            count = acc.unwrap().count;
            Ok::<_, StoreError>(())
        },
    )
    .unwrap();
    let late = crate::store::tiers::state(conn, path, 60).unwrap().late;
    assert_eq!(count, 180 + 2);
    assert_eq!(late, 2);
}

/// The row count of every tier in the status equals the table's.
fn assert_rows_counted(dir: &Path, plan: &Plan) {
    let reader = Reader::open(dir).unwrap();
    let st = status(&reader, plan, 0).unwrap();
    for (i, t) in plan.tiers.iter().enumerate() {
        let n = crate::store::testing::count_tier_rows(dir, t.key());
        assert_eq!(st.tiers[i].rows, n, "tier {}", t.name);
    }
}

/// The cursor of each tier of `keys` (resolution in seconds) in the store in `dir`.
fn tier_cursors<const N: usize>(dir: &Path, keys: [i64; N]) -> [i64; N] {
    let reader = Reader::open(dir).unwrap();
    keys.map(|k| {
        crate::store::tiers::state(reader.conn(), reader.path(), k)
            .unwrap()
            .cursor
    })
}

fn chunk_ids(dir: &Path) -> Vec<i64> {
    let reader = Reader::open(dir).unwrap();
    crate::store::chunks::sizes(reader.conn(), reader.path(), &Default::default())
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect()
}

#[test]
fn retention_never_deletes_raw_data_that_is_not_rolled_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
    write(&mut w, "m", &[(0, 1.0), (NS, 2.0)]);
    let now = 100 * HOUR;
    let mut job = Job::open(dir.path(), plan_with(&["1m", "1h"], 1000, 0)).unwrap();
    let mut rep = Report::default();
    job.enforce_retention(now, &mut rep).unwrap();
    assert_eq!(chunk_ids(dir.path()).len(), 1);
    let rep = job.run_once(now, &|| false).unwrap();
    assert_eq!(rep.evicted_chunks, 1);
    assert!(chunk_ids(dir.path()).is_empty());
    // A chunk id is never reused after the newest chunk was evicted.
    write(&mut w, "m", &[(now, 3.0)]);
    assert_eq!(chunk_ids(dir.path()), vec![2]);
    // The 1 min and 1 h rows are within their retention and stay.
    let reader = Reader::open(dir.path()).unwrap();
    let c = crate::engine::collect(
        &reader,
        &job.plan,
        "m",
        "v",
        &[],
        0,
        now,
        HOUR,
        crate::engine::Need::Sum,
        now,
    )
    .unwrap();
    assert_eq!(c.tier, "1h");
    let counts: Vec<u64> = c.sets[0].1.values().map(|s| s.acc.count).collect();
    assert_eq!(counts, vec![2, 1]);
}

/// Write wear: in `full` a run that frees next to nothing leaves the WAL to the writer's
/// own checkpoints (a checkpoint per run rewrites the same hot pages into the database
/// file every interval); in `normal` every run checkpoints, which is what syncs the
/// acknowledged writes within a run interval.
#[test]
fn a_run_checkpoints_the_wal_only_in_normal_mode_or_when_it_gives_space_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Full).unwrap();
    let wal = |d: &Path| crate::store::open::space::wal_bytes(&db_path(d));
    let now = 100 * MIN;
    let mut job = Job::open(dir.path(), plan_with(&["1m", "1h"], 100_000, 0)).unwrap();
    let mut t = 0;
    for each_run in [false, true, false] {
        job.plan.checkpoint_each_run = each_run;
        let pts: Vec<(i64, f64)> = (0..600).map(|i| (t + i * NS / 10, i as f64)).collect();
        t += 60 * NS;
        write(&mut w, "m,s=a", &pts);
        let before = wal(dir.path());
        assert!(before > 0);
        job.run_once(now, &|| false).unwrap();
        if each_run {
            assert_eq!(wal(dir.path()), 0, "normal mode: the run truncates the WAL");
        } else {
            assert!(
                wal(dir.path()) >= before,
                "full mode: the WAL is left to the writer"
            );
        }
    }
    // Space worth giving back is still given back: retention evicts every raw chunk.
    let mut r = rng(3);
    for s in 0..40 {
        let pts: Vec<(i64, f64)> = (0..20_000).map(|i| (i * NS, r() * 1e6)).collect();
        write(&mut w, &format!("m,s={s}"), &pts);
    }
    let later = 10 * HOUR;
    let rep = job.run_once(later, &|| false).unwrap();
    assert_eq!(rep.evicted_chunks, 0);
    let file = |d: &Path| crate::store::disk_bytes(&db_path(d));
    let grown = file(dir.path());
    job.plan.raw_retention_ns = 1;
    let rep = job.run_once(later + MIN, &|| false).unwrap();
    assert!(rep.evicted_chunks > 0, "{rep:?}");
    assert!(
        file(dir.path()) + (4 << 20) < grown,
        "{} -> {}: the freed pages went back to the file system",
        grown,
        file(dir.path())
    );
}

/// Free pages stay in the file for the next writes up to a sixteenth of the disk budget:
/// what retention (or a merge) frees under a 1 GiB budget is kept, and the same under a
/// budget whose sixteenth it exceeds goes back to the file system.
#[test]
fn free_pages_stay_for_reuse_up_to_a_sixteenth_of_the_budget() {
    for (budget, shrinks) in [(1u64 << 30, false), (48 << 20, true)] {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Full).unwrap();
        let mut r = rng(5);
        for s in 0..40 {
            let pts: Vec<(i64, f64)> = (0..20_000).map(|i| (i * NS, r() * 1e6)).collect();
            write(&mut w, &format!("m,s={s}"), &pts);
        }
        let mut job = Job::open(dir.path(), plan_with(&["1m", "1h"], 100_000, budget)).unwrap();
        let later = 10 * HOUR;
        job.run_once(later, &|| false).unwrap();
        let file = |d: &Path| crate::store::disk_bytes(&db_path(d));
        let grown = file(dir.path());
        job.plan.raw_retention_ns = 1;
        let rep = job.run_once(later + MIN, &|| false).unwrap();
        assert!(rep.evicted_chunks > 0, "{rep:?}");
        let free = crate::store::open::space::free_bytes(&job.conn, &job.path).unwrap();
        if shrinks {
            assert!(
                file(dir.path()) + (4 << 20) < grown,
                "budget {budget}: {grown} -> {}: given back",
                file(dir.path())
            );
            assert!(free < 1 << 20, "{free}");
        } else {
            assert!(free > 4 << 20, "budget {budget}: freed {free}");
            assert!(
                file(dir.path()) >= grown,
                "budget {budget}: {grown} -> {}: kept for the next writes",
                file(dir.path())
            );
        }
    }
}

/// A store at its disk budget (every device after its first days) evicts a thirty-second of
/// the budget at once and reuses the pages it freed in place: the writes that follow fill
/// them without an eviction, the file does not grow or shrink, and only when they are used
/// up does the next eviction come. (It used to evict what each run had just written, give
/// the pages back and checkpoint, at every run.)
#[test]
fn a_store_at_its_budget_evicts_a_share_at_once_and_reuses_the_pages_in_place() {
    use crate::store::open::space;
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Full).unwrap();
    let mut r = rng(11);
    let mut t = 0i64;
    let mut write_for = |w: &mut Writer, secs: i64| {
        for s in 0..10 {
            let pts: Vec<(i64, f64)> = (t..t + secs).map(|i| (i * NS, r() * 1e6)).collect();
            write(w, &format!("m,s={s}"), &pts);
        }
        t += secs;
        t * NS
    };
    let now = write_for(&mut w, 80_000);
    let max: u64 = 6 << 20;
    let lines = super::evict::Lines::of(max);
    let mut plan = plan_with(&["1m", "1h"], 100_000, max);
    plan.raw_retention_ns = i64::MAX;
    let mut job = Job::open(dir.path(), plan).unwrap();
    let pages = |job: &Job| {
        (
            space::used_bytes(&job.conn, &job.path).unwrap(),
            space::file_bytes(&job.conn, &job.path).unwrap(),
            space::free_bytes(&job.conn, &job.path).unwrap(),
        )
    };
    let rep = job.run_once(now, &|| false).unwrap();
    let (used, file, free) = pages(&job);
    assert!(rep.evicted_chunks > 0, "{rep:?}");
    assert!(rep.db_bytes <= max, "{} > {max}", rep.db_bytes);
    assert!(used <= lines.low, "{used} > {}", lines.low);
    assert!(file <= max - lines.wal_room, "{file}");
    assert!(
        free >= max / 64,
        "{free}: what was evicted stays free for the next writes"
    );
    // The next writes fill the free pages: no eviction, the file keeps its size. Only when
    // they are used up does the next eviction come, and the store stays in its budget.
    let mut runs = 0;
    loop {
        let (_, _, free_before) = pages(&job);
        let now = write_for(&mut w, 600);
        let rep = job.run_once(now, &|| false).unwrap();
        assert!(rep.db_bytes <= max, "{} > {max}", rep.db_bytes);
        if rep.evicted_chunks > 0 {
            assert!(
                free_before < free / 2,
                "{free_before} of {free} free before it"
            );
            break;
        }
        runs += 1;
        assert!(runs < 100);
        assert_eq!(
            pages(&job).1,
            file,
            "run {runs}: the freed pages were reused in place"
        );
    }
    assert!(runs >= 2, "{runs} runs reused the freed pages");
    assert!(pages(&job).1 <= max - lines.wal_room);
}

/// The WAL checkpoints every 16 MiB unless the budget's room for it is smaller, then at
/// three quarters of that room: the job's connection and the writer (which the agent sets)
/// keep the WAL's file within it.
#[test]
fn a_small_budget_bounds_the_wal_to_its_room() {
    const MIB: u64 = 1 << 20;
    assert_eq!(wal_checkpoint_bytes(0), 16 * MIB);
    assert_eq!(wal_checkpoint_bytes(1 << 30), 16 * MIB);
    assert_eq!(wal_checkpoint_bytes(64 * MIB), 6 * MIB);
    assert_eq!(wal_checkpoint_bytes(8 * MIB), 3 * MIB / 4);
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Full).unwrap();
    w.checkpoint_every(wal_checkpoint_bytes(8 * MIB)).unwrap();
    let job = Job::open(dir.path(), plan_with(&["1m"], 100_000, 8 * MIB)).unwrap();
    let pages: i64 = job
        .conn
        .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
        .unwrap();
    assert_eq!(pages, (3 * MIB / 4 / 4096) as i64);
    let mut r = rng(7);
    let mut longest = 0;
    for s in 0..40 {
        let pts: Vec<(i64, f64)> = (0..20_000).map(|i| (i * NS, r() * 1e6)).collect();
        write(&mut w, &format!("m,s={s}"), &pts);
        longest = longest.max(crate::store::open::space::wal_bytes(&db_path(dir.path())));
    }
    // About 6 MB of points went through a WAL that never grew past its bound and a commit.
    assert!(longest < 2 * MIB, "the WAL grew to {longest} bytes");
}

#[test]
fn the_budget_evicts_oldest_first_shrinks_the_file_and_counts_unforwarded_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
    let mut r = rng(9);
    for s in 0..10 {
        let pts: Vec<(i64, f64)> = (0..60_000).map(|i| (i * NS, r() * 1000.0)).collect();
        write(&mut w, &format!("m,s={s}"), &pts);
    }
    crate::store::testing::add_sink(dir.path(), "influx", 100);
    let before_ids = chunk_ids(dir.path());
    let newest = *before_ids.last().unwrap();
    let now = 60_000 * NS;
    let mut job = Job::open(dir.path(), plan_with(&["1m", "1h"], 100_000, 0)).unwrap();
    // This run truncates the WAL, so `full` is the database's pages.
    job.plan.checkpoint_each_run = true;
    let full = job.run_once(now, &|| false).unwrap().db_bytes;
    job.plan.checkpoint_each_run = false;
    // A budget that evicting part of the raw data meets (columnar raw chunks are a smaller
    // share of the file than the tiers' rows).
    let raw: u64 = {
        let reader = Reader::open(dir.path()).unwrap();
        crate::store::chunks::sizes(reader.conn(), reader.path(), &Default::default())
            .unwrap()
            .iter()
            .map(|c| c.bytes as u64)
            .sum()
    };
    let max = full - raw / 2;
    job.plan.max_bytes = max;
    let rep = job.run_once(now, &|| false).unwrap();
    assert!(rep.db_bytes <= max, "{} > {max}", rep.db_bytes);
    assert!(crate::store::disk_bytes(&db_path(dir.path())) <= max + 64 * 1024);
    let after = chunk_ids(dir.path());
    assert!(!after.is_empty() && after.len() < before_ids.len());
    // Oldest gone first, newest intact.
    assert_eq!(after[..], before_ids[before_ids.len() - after.len()..]);
    assert_eq!(*after.last().unwrap(), newest);
    assert_eq!(rep.evicted_chunks as usize, before_ids.len() - after.len());
    // Rollups of the evicted raw data still answer (the 1 min tier keeps all 1,000 min).
    let reader = Reader::open(dir.path()).unwrap();
    let c = crate::engine::collect(
        &reader,
        &job.plan,
        "m",
        "v",
        &[],
        0,
        now - 1,
        MIN,
        crate::engine::Need::Sum,
        now,
    )
    .unwrap();
    assert_eq!(c.sets.len(), 10);
    assert!(c
        .sets
        .iter()
        .all(|(_, s)| s.len() == 1000 && s.values().all(|a| a.acc.count == 60)));
    // The sink had forwarded up to chunk 100: what was evicted past it is counted.
    let sinks = crate::store::sinks::evictions(reader.conn(), reader.path()).unwrap();
    let (chunks, through) = (sinks[0].chunks, sinks[0].through);
    let lost = before_ids
        .iter()
        .filter(|id| **id > 100 && !after.contains(id))
        .count();
    assert_eq!(chunks as usize, lost);
    assert!(lost == 0 || through > 100);
    let status = status(&reader, &job.plan, now).unwrap();
    assert_eq!(status.evicted.raw_chunks, rep.evicted_chunks as i64);
    assert_eq!(status.tiers[0].rows, 10_000);
    assert_rows_counted(dir.path(), &job.plan);
}

#[test]
fn tier_row_counts_follow_inserts_merges_and_evictions() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
    for s in 0..3 {
        let pts: Vec<(i64, f64)> = (0..7_200).map(|i| (i * NS, f64::from(s))).collect();
        write(&mut w, &format!("m,s={s}"), &pts);
    }
    let plan = plan_with(&["1m", "1h"], 5_000, 0);
    let mut job = Job::open(dir.path(), plan.clone()).unwrap();
    job.run_once(2 * HOUR, &|| false).unwrap();
    assert_rows_counted(dir.path(), &plan);
    let reader = Reader::open(dir.path()).unwrap();
    assert_eq!(status(&reader, &plan, 0).unwrap().tiers[0].rows, 360);
    // Late points into existing buckets add no rows; one into a new minute adds one.
    write(&mut w, "m,s=0", &[(5 * NS, 1.0), (3 * HOUR, 2.0)]);
    job.run_once(3 * HOUR, &|| false).unwrap();
    assert_rows_counted(dir.path(), &plan);
    assert_eq!(status(&reader, &plan, 0).unwrap().tiers[0].rows, 361);
    // Tier retention deletes the old rows and the count follows.
    let mut short = plan.clone();
    short.tiers[0].retention_ns = Some(HOUR);
    let mut job = Job::open(dir.path(), short.clone()).unwrap();
    let rep = job.run_once(3 * HOUR + 30 * MIN, &|| false).unwrap();
    assert!(rep.evicted_rows > 0, "{rep:?}");
    assert_rows_counted(dir.path(), &short);
    // So does the budget, squeezing into the tiers once raw data is gone.
    let mut tight = short.clone();
    tight.max_bytes = 1;
    Job::open(dir.path(), tight.clone())
        .unwrap()
        .run_once(3 * HOUR + 30 * MIN, &|| false)
        .unwrap();
    assert_rows_counted(dir.path(), &tight);
}

#[test]
fn migration_4_counts_the_rows_of_an_older_store() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let pts: Vec<(i64, f64)> = (0..600).map(|i| (i * NS, 1.0)).collect();
        write(&mut w, "m", &pts);
    }
    let plan = plan_with(&["1m", "1h"], 5_000, 0);
    Job::open(dir.path(), plan.clone())
        .unwrap()
        .run_once(HOUR, &|| false)
        .unwrap();
    // Back to version 3: no row counters.
    crate::store::testing::downgrade_to_v3(dir.path());
    drop(Writer::open(dir.path(), 100, Synchronous::Normal).unwrap());
    let reader = Reader::open(dir.path()).unwrap();
    let st = status(&reader, &plan, 0).unwrap();
    assert_eq!(st.tiers[0].rows, 10);
    assert_eq!(st.tiers[1].rows, 1);
    assert_rows_counted(dir.path(), &plan);
}

/// The job's retry waits are the ones it always had: `2^min(failures, 5)` intervals.
#[test]
fn failed_runs_wait_doubling_intervals_up_to_32() {
    let interval = Duration::from_secs(30);
    let policy = super::retry_policy(interval);
    for failures in 1..12u32 {
        assert_eq!(
            policy.base(failures),
            interval * 2u32.pow(failures.min(5)),
            "after {failures} failures"
        );
    }
}

/// The agent's periodic job folds a tier a sink forwards promptly (here 1m: every minute)
/// and the others every `fold_every` (10s: every 10 minutes), at most every quarter of the
/// raw retention (1h: every 15 minutes with 1 h of raw), not every 30 s run (each fold
/// rewrites a page per active series), and ends with the rows of a job that folds every tier
/// every run.
#[test]
fn the_periodic_job_folds_each_tier_at_its_cadence_to_the_same_rows() {
    use crate::config::values::Interval;
    use std::time::Duration;
    // The default plan: the 1m tier every minute, the 1h tier once an hour (each bucket once
    // it has closed); with a 10-minute stride, the same for a tier a sink reads, which folds
    // promptly (the 1h tier every 5 minutes).
    let default = Plan::new(&RollupConfig::default(), &RetentionConfig::default()).unwrap();
    let every =
        |plan: &Plan| -> Vec<i64> { plan.tiers.iter().map(|t| plan.fold_every_ns(t)).collect() };
    assert_eq!(every(&default), vec![MIN, HOUR]);
    let mut forwarded = default.clone();
    forwarded.fold_every_ns = 10 * MIN;
    assert_eq!(every(&forwarded), vec![10 * MIN, HOUR]);
    forwarded.tiers[0].forwarded = true;
    assert_eq!(every(&forwarded), vec![MIN, HOUR]);
    forwarded.tiers[1].forwarded = true;
    assert_eq!(every(&forwarded), vec![MIN, 5 * MIN]);
    // A short interval (tests, a user who wants fresh tiers) folds a forwarded tier sooner;
    // a `fold_every` under a minute folds every tier promptly, open buckets included, and
    // never more often.
    forwarded.interval = Duration::from_secs(1);
    forwarded.fold_every_ns = NS;
    forwarded.tiers[1].forwarded = false;
    assert_eq!(every(&forwarded), vec![5 * NS, 5 * MIN]);
    forwarded.tiers[0].forwarded = false;
    assert_eq!(every(&forwarded), vec![5 * NS, 5 * MIN]);
    // A tier coarser than an hour folds its open bucket hourly; a short raw retention folds
    // every tier within a quarter of it.
    let mut daily = Plan::new(
        &RollupConfig {
            tiers: vec!["1m".into(), "1h".into(), "1d".into()],
            ..Default::default()
        },
        &RetentionConfig::default(),
    )
    .unwrap();
    assert_eq!(every(&daily), vec![MIN, HOUR, HOUR]);
    daily.raw_retention_ns = 2 * HOUR;
    assert_eq!(every(&daily), vec![MIN, 30 * MIN, 30 * MIN]);

    let mut plan = Plan::new(
        &RollupConfig {
            tiers: vec!["10s".into(), "1m".into(), "1h".into()],
            fold_every: Interval(Duration::from_secs(600)),
            ..Default::default()
        },
        &RetentionConfig {
            raw: Interval(Duration::from_secs(3600)),
            max_bytes: 0,
            ..Default::default()
        },
    )
    .unwrap();
    plan.tiers[1].forwarded = true;
    assert_eq!(plan.interval, Duration::from_secs(30));
    assert_eq!(every(&plan), vec![10 * MIN, MIN, 15 * MIN]);
    plan.fold_every_ns = HOUR;
    assert_eq!(every(&plan), vec![15 * MIN, MIN, 15 * MIN]);
    let (paced, each) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut writers =
        [paced.path(), each.path()].map(|d| Writer::open(d, 100, Synchronous::Full).unwrap());
    let mut jobs = [paced.path(), each.path()].map(|d| Job::open(d, plan.clone()).unwrap());
    jobs[0].fold_cadence = true;
    let cursors = |d: &Path| tier_cursors(d, [10, 60, 3600]);
    let t0 = 100 * MIN;
    // A run with nothing to fold does not start the cadence.
    jobs[0].run_once(t0, &|| false).unwrap();
    // Runs every 30 s, each after a write.
    let mut run = |k: i64| -> i64 {
        for w in writers.iter_mut() {
            let pts: Vec<(i64, f64)> = (0..20)
                .map(|i| (t0 + k * 30 * NS + i * NS, (i % 7) as f64))
                .collect();
            write(w, "m,s=a", &pts);
        }
        for j in jobs.iter_mut() {
            j.run_once(t0 + 30 * NS + k * 30 * NS, &|| false).unwrap();
        }
        *chunk_ids(paced.path()).last().unwrap()
    };
    // The 1m tier (folded every minute, its cadence no shorter than its bucket) folds only
    // closed minutes: at each of its folds, the chunks written before the minute it runs in.
    let first = run(0);
    let initial = cursors(paced.path())[1];
    assert_eq!(
        cursors(paced.path()),
        [first, initial, first],
        "the first fold folds every tier, the 1m tier's open minute excepted"
    );
    let mut ids = vec![first];
    let (quarter, mut minute) = (first, initial);
    for k in 1..30 {
        let newest = run(k);
        ids.push(newest);
        if k % 2 == 0 {
            minute = ids[k as usize - 1];
        }
        assert_eq!(
            cursors(paced.path()),
            [quarter, minute, quarter],
            "run {k} (+{} s): 10s and 1h every 15 minutes, 1m every minute",
            k * 30
        );
        assert_eq!(cursors(each.path()), [newest, newest, newest]);
    }
    // Fifteen minutes after the first fold every tier catches up, the 1m tier to the
    // minute before; a minute later, with nothing new, to the end.
    let last = run(30);
    assert_eq!(cursors(paced.path()), [last, ids[29], last]);
    jobs[0]
        .run_once(t0 + 30 * NS + 32 * 30 * NS, &|| false)
        .unwrap();
    assert_eq!(cursors(paced.path()), [last, last, last]);
    assert_eq!(dump(paced.path()), dump(each.path()));
}

/// A run that evicts for the disk budget folds every tier first, whatever the cadence: raw
/// chunks may be evicted only once every tier has them. A store near its budget but not
/// over it folds at its cadence (folding every tier's open bucket at every run wrote the
/// tiers of a store at its budget twice).
#[test]
fn a_run_that_evicts_for_the_budget_folds_every_tier_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Full).unwrap();
    let t0 = 100 * MIN;
    let pts = |k: i64| -> Vec<(i64, f64)> {
        (0..20)
            .map(|i| (t0 + k * 30 * NS + i * NS, i as f64))
            .collect()
    };
    let cursors = |d: &Path| tier_cursors(d, [60, 3600]);
    let size = |d: &Path| {
        let (c, p) = crate::store::open(d, crate::store::Mode::ReadOnly).unwrap();
        crate::store::open::space::db_bytes(&c, &p).unwrap()
    };
    // Old points that retention then deletes: their pages stay free in the file.
    let mut r = rng(3);
    for s in 0..20 {
        let old: Vec<(i64, f64)> = (0..10_000).map(|i| (i * NS / 5, r() * 1e6)).collect();
        write(&mut w, &format!("m,s=old{s}"), &old);
    }
    let mut plan = plan_with(&["1m", "1h"], 100_000, 1 << 40);
    plan.raw_retention_ns = 50 * MIN;
    let mut far = Job::open(dir.path(), plan).unwrap();
    far.run_once(t0, &|| false).unwrap();
    far.fold_cadence = true;
    write(&mut w, "m,s=a", &pts(0));
    far.run_once(t0 + 30 * NS, &|| false).unwrap();
    write(&mut w, "m,s=a", &pts(1));
    far.run_once(t0 + 60 * NS, &|| false).unwrap();
    let newest = *chunk_ids(dir.path()).last().unwrap();
    let [m, h] = cursors(dir.path());
    assert!(
        m < newest && h < newest,
        "far from the budget the tiers wait"
    );
    drop(far);
    crate::store::testing::checkpoint_truncate(dir.path());
    let free = {
        let (c, p) = crate::store::open(dir.path(), crate::store::Mode::ReadOnly).unwrap();
        crate::store::open::space::free_bytes(&c, &p).unwrap()
    };
    assert!(
        free * 2 > size(dir.path()),
        "{free}: the old points' pages are free"
    );
    // A budget the file is at 95 % of, but whose pages are half free: the tiers still wait.
    let mut near = Job::open(
        dir.path(),
        plan_with(&["1m", "1h"], 100_000, size(dir.path()) * 100 / 95),
    )
    .unwrap();
    near.fold_cadence = true;
    let report = near.run_once(t0 + 60 * NS, &|| false).unwrap();
    assert_eq!(cursors(dir.path()), [m, h], "{report:?}");
    assert_eq!(report.evicted_chunks, 0, "{report:?}");
    drop(near);
    // A budget under the pages the store uses: both tiers fold, then the budget evicts.
    write(&mut w, "m,s=a", &pts(2));
    let used = {
        let (c, p) = crate::store::open(dir.path(), crate::store::Mode::ReadOnly).unwrap();
        crate::store::open::space::used_bytes(&c, &p).unwrap()
    };
    let mut over = Job::open(
        dir.path(),
        plan_with(&["1m", "1h"], 100_000, used * 100 / 105),
    )
    .unwrap();
    over.fold_cadence = true;
    let newest = *chunk_ids(dir.path()).last().unwrap();
    let report = over.run_once(t0 + 90 * NS, &|| false).unwrap();
    assert_eq!(cursors(dir.path()), [newest, newest], "{report:?}");
    assert!(report.evicted_chunks > 0, "{report:?}");
}

/// Reads every row of `series` in tier `key` through the query engine's read.
fn tier_read(dir: &Path, key: i64, series: &[i64]) -> Vec<(usize, i64, crate::store::bucket::Acc)> {
    tier_read_range(dir, key, series, i64::MIN, i64::MAX)
}

/// Reads the rows of `series` in tier `key` with `lo <= bucket <= hi`.
fn tier_read_range(
    dir: &Path,
    key: i64,
    series: &[i64],
    lo: i64,
    hi: i64,
) -> Vec<(usize, i64, crate::store::bucket::Acc)> {
    let reader = Reader::open(dir).unwrap();
    let mut out = Vec::new();
    crate::store::tiers::read_ranges(
        reader.conn(),
        reader.path(),
        key,
        series,
        lo,
        hi,
        crate::store::tiers::Need::All,
        |i, b, acc| {
            out.push((i, b, acc.unwrap()));
            Ok::<_, crate::store::StoreError>(())
        },
    )
    .unwrap();
    out
}

/// Two hours of three series (`m,s=a|b|c`, a point every 10 s) folded into 1m and 1h tiers
/// at 2:00 (all rows recent): the store, its writer, plan, job and report.
fn two_hours_folded(seed: u64) -> (tempfile::TempDir, Writer, Plan, Job, Report) {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
    let mut r = rng(seed);
    for key in ["m,s=a", "m,s=b", "m,s=c"] {
        let pts: Vec<(i64, f64)> = (0..720).map(|i| (i * 10 * NS, 1.0 + 9.0 * r())).collect();
        write(&mut w, key, &pts);
    }
    // Every tier settles here (the 1m tier too), so the move is tested on two hours of data.
    let plan = settling_every_tier(plan_with(&["1m", "1h"], 100_000, 0));
    let mut job = Job::open(dir.path(), plan.clone()).unwrap();
    let mut rep = Report::default();
    job.rollup(2 * HOUR, false, &|| false, &mut rep).unwrap();
    (dir, w, plan, job, rep)
}

/// New tier rows go to `rollups_recent` and stay there until an hour of final buckets waits
/// (six for the 1h tier), then move to `rollups` in one run; reads return the same rows in
/// the same order before and after, a late point for a moved bucket merges into its row
/// there (no second row), and eviction takes the settled rows, then the recent ones.
#[test]
fn final_buckets_move_to_the_series_table_an_hour_at_a_time_and_reads_do_not_change() {
    use crate::store::testing::{rollup_rows, tier_rows_by_table};
    let (dir, mut w, _, mut job, mut rep) = two_hours_folded(5);
    let now = 2 * HOUR;
    assert_eq!(tier_rows_by_table(dir.path(), 60), (0, 360));
    assert_eq!(tier_rows_by_table(dir.path(), 3600), (0, 6));
    let (rows, read_1m, read_1h) = (
        rollup_rows(dir.path()),
        tier_read(dir.path(), 60, &[1, 2, 3]),
        tier_read(dir.path(), 3600, &[1, 2, 3]),
    );
    assert_eq!(read_1m.len(), 360);
    assert!(read_1m
        .windows(2)
        .all(|p| (p[0].0, p[0].1) < (p[1].0, p[1].1)));

    // Watermark 1:59:50, lateness 10 min: buckets through 1:48 are final, and more than an
    // hour of them waits; the 1h tier's final bucket (0:00) is one of the six it waits for.
    job.settle(&|| false, &mut rep).unwrap();
    assert_eq!(rep.settled_rows, 3 * 109);
    assert_eq!(tier_rows_by_table(dir.path(), 60), (327, 33));
    assert_eq!(tier_rows_by_table(dir.path(), 3600), (0, 6));
    let settled = |k| {
        let reader = Reader::open(dir.path()).unwrap();
        crate::store::tiers::state(reader.conn(), reader.path(), k)
            .unwrap()
            .settled
    };
    assert_eq!(settled(60), 108 * MIN);
    assert_eq!(settled(3600), i64::MIN);
    assert_eq!(rollup_rows(dir.path()), rows);
    assert_eq!(tier_read(dir.path(), 60, &[1, 2, 3]), read_1m);
    assert_eq!(tier_read(dir.path(), 3600, &[1, 2, 3]), read_1h);
    // Any range, any list of series (repeated, out of order): the rows read before.
    for (lo, hi, sids) in [
        (100 * MIN + 7, 115 * MIN, vec![3, 1]),
        (107 * MIN, 109 * MIN + 1, vec![2, 2, 1]),
        (0, 30 * MIN, vec![1]),
        (110 * MIN, i64::MAX, vec![3, 2, 1]),
    ] {
        let want: Vec<_> = sids
            .iter()
            .enumerate()
            .flat_map(|(i, &sid)| {
                read_1m
                    .iter()
                    .filter(move |r| r.0 + 1 == sid as usize && r.1 >= lo && r.1 <= hi)
                    .map(move |r| (i, r.1, r.2.clone()))
            })
            .collect();
        assert!(!want.is_empty());
        assert_eq!(
            tier_read_range(dir.path(), 60, &sids, lo, hi),
            want,
            "{lo}..{hi} {sids:?}"
        );
    }
    // A second run moves nothing: less than an hour of final buckets waits.
    let mut again = Report::default();
    job.settle(&|| false, &mut again).unwrap();
    assert_eq!(again.settled_rows, 0);

    // Late points: one for a settled bucket (0:30), one for a recent one (1:55).
    write(
        &mut w,
        "m,s=a",
        &[(30 * MIN + NS, 100.0), (115 * MIN + NS, 100.0)],
    );
    job.rollup(now, false, &|| false, &mut rep).unwrap();
    assert_eq!(tier_rows_by_table(dir.path(), 60), (327, 33));
    let after = tier_read(dir.path(), 60, &[1]);
    let count = |b: i64| after.iter().find(|r| r.1 == b).unwrap().2.count;
    assert_eq!(
        (count(30 * MIN), count(115 * MIN), count(31 * MIN)),
        (7, 7, 6)
    );

    // Eviction: the settled rows first (older), then the recent ones.
    let (mut conn, path) = open_conn(dir.path()).unwrap();
    let tx = conn.transaction().unwrap();
    let n = crate::store::tiers::delete_oldest(&tx, &path, 60, 112 * MIN, 1_000_000).unwrap();
    assert_eq!(n, 327);
    let n = crate::store::tiers::delete_oldest(&tx, &path, 60, 112 * MIN, 1_000_000).unwrap();
    assert_eq!(n, 12);
    tx.commit().unwrap();
    assert_eq!(tier_rows_by_table(dir.path(), 60), (0, 21));
}

/// What `rollups_recent` is for: with 600 series whose settled rows already fill the series
/// table (a store that has run for a while), folding one new minute writes a few pages of
/// recent rows, not one page per series as a series-keyed insert would.
#[test]
fn folding_a_minute_of_600_series_writes_a_few_pages_not_one_per_series() {
    use crate::store::testing::{checkpoint_truncate, tier_rows_by_table, wal_frames};
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 1000, Synchronous::Normal).unwrap();
    let mut r = rng(9);
    let minute = |w: &mut Writer, r: &mut dyn FnMut() -> f64, m: i64| write_minute(w, r, 600, m);
    for m in 0..90 {
        minute(&mut w, &mut r, m);
    }
    let mut job = Job::open(
        dir.path(),
        settling_every_tier(plan_with(&["1m", "1h"], 1_000_000, 0)),
    )
    .unwrap();
    let mut rep = Report::default();
    job.rollup(90 * MIN, false, &|| false, &mut rep).unwrap();
    job.settle(&|| false, &mut rep).unwrap();
    let (settled, _) = tier_rows_by_table(dir.path(), 60);
    assert!(settled >= 600 * 60, "{settled} rows settled");
    minute(&mut w, &mut r, 90);
    drop(job);
    checkpoint_truncate(dir.path());
    let mut job = Job::open(
        dir.path(),
        settling_every_tier(plan_with(&["1m", "1h"], 1_000_000, 0)),
    )
    .unwrap();
    let mut rep = Report::default();
    job.rollup(91 * MIN, false, &|| false, &mut rep).unwrap();
    assert_eq!(rep.points, 600);
    // In bytes of WAL: the store's page size decides how many frames the same rows take.
    let page = crate::store::testing::page_size(dir.path());
    let wal_kib = || wal_frames(dir.path()) * page / 1024;
    let kib = wal_kib();
    // 600 new 1m rows and 600 rewritten 1h rows: 127 pages of 4 KiB (508 KiB) when written,
    // against 1,173 (4.7 MiB) when every row went to the series-keyed table.
    assert!(kib < 1000, "a fold of 600 series wrote {kib} KiB");

    // An hour later its final buckets move: steps of at most SETTLE_ROWS rows, each writing
    // about two 4 KiB pages per series (its last leaf and a split, the deleted recent rows):
    // 6,459 pages (25.8 MiB) in 5 steps, where folding into the series-keyed table wrote a
    // page per series every minute (~42,000 over these 71 minutes, 168 MiB).
    for m in 91..161 {
        minute(&mut w, &mut r, m);
    }
    job.rollup(161 * MIN, false, &|| false, &mut rep).unwrap();
    drop(job);
    checkpoint_truncate(dir.path());
    let mut job = Job::open(
        dir.path(),
        settling_every_tier(plan_with(&["1m", "1h"], 1_000_000, 0)),
    )
    .unwrap();
    let mut rep = Report::default();
    job.settle(&|| false, &mut rep).unwrap();
    assert_eq!(rep.settled_rows, 600 * 71);
    let per_step = crate::store::tiers::SETTLE_ROWS as u64;
    let steps = rep.settled_rows.div_ceil(per_step);
    let kib = wal_kib();
    assert!(
        kib < steps * 600 * 12,
        "moving 71 minutes of 600 series wrote {kib} KiB in {steps} steps"
    );
}

/// The default plan settles hourly and coarser tiers only: the 1m tier's rows stay keyed by
/// time (`rollups_recent`) however old, while the 1h tier's final buckets move. Reads of a
/// span far longer than a short one return every row, for one series, a few, all of them
/// (point reads or the scan, by how many of a bucket's rows are asked for), and eviction
/// takes the oldest whole buckets.
#[test]
fn the_minute_tier_stays_keyed_by_time_and_reads_of_any_span_find_its_rows() {
    use crate::store::testing::{rollup_rows, tier_rows_by_table};
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
    let mut r = rng(11);
    // 30 series, a point every 10 minutes for 75 hours: 450 minute buckets of each, over a
    // span of 4,500 (a short span is 64).
    let hours = 75;
    for s in 0..30 {
        let pts: Vec<(i64, f64)> = (0..hours * 6)
            .map(|i| (i * 10 * MIN + s * NS, 1.0 + 9.0 * r()))
            .collect();
        write(&mut w, &format!("m,s=s{s:02}"), &pts);
    }
    let plan = plan_with(&["1m", "1h"], 1_000_000, 0);
    assert_eq!(plan.settle_from_ns, HOUR);
    let mut job = Job::open(dir.path(), plan).unwrap();
    let mut rep = Report::default();
    job.rollup(hours * HOUR, false, &|| false, &mut rep)
        .unwrap();
    job.settle(&|| false, &mut rep).unwrap();
    let per_series = hours * 6;
    assert_eq!(tier_rows_by_table(dir.path(), 60), (0, 30 * per_series));
    let (settled_1h, recent_1h) = tier_rows_by_table(dir.path(), 3600);
    assert_eq!(settled_1h + recent_1h, 30 * hours);
    assert!(
        settled_1h >= 30 * (hours - 8),
        "{settled_1h} 1h rows settled"
    );

    let all = rollup_rows(dir.path());
    let want = |sids: &[i64], key: i64| -> Vec<(usize, i64, u64, f64)> {
        let mut out = Vec::new();
        for (i, &sid) in sids.iter().enumerate() {
            out.extend(
                all.iter()
                    .filter(|r| r.0 == key && r.1 == sid)
                    .map(|r| (i, r.2, r.3 as u64, r.4)),
            );
        }
        out
    };
    let got = |sids: &[i64], key: i64| -> Vec<(usize, i64, u64, f64)> {
        tier_read_range(dir.path(), key, sids, i64::MIN, i64::MAX)
            .into_iter()
            .map(|(i, b, acc)| (i, b, acc.count, acc.sum))
            .collect()
    };
    for sids in [vec![7], vec![3, 1, 3], (1..=30).collect::<Vec<i64>>()] {
        let g = got(&sids, 60);
        assert_eq!(g.len() as i64, per_series * sids.len() as i64);
        assert_eq!(g, want(&sids, 60), "{sids:?}");
        assert_eq!(got(&sids, 3600), want(&sids, 3600), "{sids:?}");
    }

    // Retention on a tier that never settled: the oldest whole buckets, in one range.
    let (mut conn, path) = open_conn(dir.path()).unwrap();
    let tx = conn.transaction().unwrap();
    let n = crate::store::tiers::delete_oldest(&tx, &path, 60, 24 * HOUR, 1_000_000).unwrap();
    tx.commit().unwrap();
    assert_eq!(n, 30 * (24 * 6 + 1));
    assert_eq!(
        got(&[7], 60).len() as i64,
        per_series - (24 * 6 + 1),
        "the rows after a day"
    );
}

/// Why the 1m tier no longer settles: on a store that has run for hours (each series' range
/// in `rollups` spans many pages), moving each hour of 1m rows writes every row a second
/// time, the last page of each series' range and a split, where the fold alone appends
/// them to adjacent pages once. Pages the job writes over two hours of 300 series at 1/min
/// (its fold every minute, then its settle), both policies on the same data.
#[test]
fn on_an_aged_store_the_minute_tier_costs_its_fold_and_no_second_write() {
    use crate::store::testing::{checkpoint_truncate, wal_frames};
    let job_pages = |settle_every_tier: bool| -> (u64, u64) {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 1000, Synchronous::Normal).unwrap();
        let mut r = rng(3);
        let mut minute = |w: &mut Writer, m: i64| write_minute(w, &mut r, 300, m);
        let mut plan = plan_with(&["1m", "1h"], 1_000_000, 0);
        if settle_every_tier {
            plan = settling_every_tier(plan);
        }
        let mut job = Job::open(dir.path(), plan).unwrap();
        let mut rep = Report::default();
        // Ten hours of history, folded and settled as the agent would have.
        for m in 0..600 {
            minute(&mut w, m);
            if m % 60 == 59 {
                job.rollup((m + 1) * MIN, false, &|| false, &mut rep)
                    .unwrap();
                job.settle(&|| false, &mut rep).unwrap();
            }
        }
        // Two hours measured: each minute's fold and settle, the job's pages only.
        let (mut pages, settled_before) = (0, rep.settled_rows);
        for m in 600..720 {
            minute(&mut w, m);
            checkpoint_truncate(dir.path());
            job.rollup((m + 1) * MIN, false, &|| false, &mut rep)
                .unwrap();
            job.settle(&|| false, &mut rep).unwrap();
            pages += wal_frames(dir.path());
        }
        (pages, rep.settled_rows - settled_before)
    };
    let (all, moved_all) = job_pages(true);
    let (default, moved_default) = job_pages(false);
    eprintln!(
        "two hours of 300 series: the job wrote {all} pages settling every tier ({moved_all} rows \
         moved), {default} with the default plan ({moved_default} rows moved)"
    );
    assert!(moved_all >= 300 * 60, "the 1m tier settled: {moved_all}");
    assert!(
        moved_default < 300 * 3,
        "only 1h rows move: {moved_default}"
    );
    assert!(
        default * 4 < all * 3,
        "settling the 1m tier costs more than a quarter of the job's pages: {default} vs {all}"
    );
}

/// A tier row whose sketch does not decode, in either table (settled or recent): reads of
/// its percentiles are an error naming the store, reads that do not need a sketch and the
/// other rows still work, and late points for it are left out of it and counted (status
/// and `/metrics`) instead of failing every fold from then on.
#[test]
fn a_corrupt_sketch_in_either_tier_table_is_reported_and_does_not_stop_the_fold() {
    use crate::engine::{collect_window, need_of, Agg, EngineError, SeriesRef};
    use crate::store::tiers::{read_ranges, Need};
    let (dir, mut w, plan, mut job, mut rep) = two_hours_folded(7);
    let now = 2 * HOUR;
    job.settle(&|| false, &mut rep).unwrap();
    assert_eq!(
        crate::store::testing::tier_rows_by_table(dir.path(), 60),
        (327, 33)
    );
    let (conn, _) = open_conn(dir.path()).unwrap();
    for (table, sid, bucket) in [("rollups", 1, 30 * MIN), ("rollups_recent", 2, 115 * MIN)] {
        let n = conn
            .execute(
                &format!(
                    "UPDATE {table} SET sketch = x'ff01' WHERE tier = 60 AND series_id = ?1 \
                     AND bucket = ?2"
                ),
                [sid, bucket],
            )
            .unwrap();
        assert_eq!(n, 1, "{table}");
    }
    drop(conn);
    let rows = |need: Need| {
        let reader = Reader::open(dir.path()).unwrap();
        let mut out = Vec::new();
        read_ranges(
            reader.conn(),
            reader.path(),
            60,
            &[1, 2, 3],
            0,
            now,
            need,
            |i, b, acc| {
                out.push((i, b, acc.map(|a| a.count)));
                Ok::<_, crate::store::StoreError>(())
            },
        )
        .unwrap();
        out
    };
    let sketches = rows(Need::Sketch);
    assert_eq!(sketches.len(), 360);
    let bad: Vec<(usize, i64)> = sketches
        .iter()
        .filter(|r| r.2.is_err())
        .map(|r| (r.0, r.1))
        .collect();
    assert_eq!(bad, vec![(0, 30 * MIN), (1, 115 * MIN)]);
    assert!(rows(Need::Sum).iter().all(|r| r.2 == Ok(6)));

    // Through the engine: a percentile over the corrupt rows names the store; a mean works.
    let reader = Reader::open(dir.path()).unwrap();
    let refs = [
        SeriesRef { tagset: 1, sid: 1 },
        SeriesRef { tagset: 2, sid: 2 },
        SeriesRef { tagset: 3, sid: 3 },
    ];
    let window = |agg| collect_window(&reader, &plan, &refs, 0, now, 60 * NS, need_of(agg), now);
    match window(Agg::Quantile(0.99)) {
        Err(EngineError::Corrupt(p)) => assert_eq!(p, db_path(dir.path())),
        other => panic!(
            "expected a corrupt-row error, got {:?}",
            other.map(|v| v.len())
        ),
    }
    let means = window(Agg::Mean).unwrap();
    assert!(means
        .iter()
        .all(|m| m.as_ref().is_some_and(|m| m.acc.count == 720)));
    drop(reader);

    // Late points for both corrupt rows and for a sound one: the fold goes on, the corrupt
    // rows stay as they were, the two points are counted, the sound row takes its point.
    write(
        &mut w,
        "m,s=a",
        &[(30 * MIN + 2 * NS, 50.0), (31 * MIN + 2 * NS, 50.0)],
    );
    write(&mut w, "m,s=b", &[(115 * MIN + 2 * NS, 50.0)]);
    job.rollup(now, false, &|| false, &mut rep).unwrap();
    let after = rows(Need::Sum);
    let count = |i: usize, b: i64| after.iter().find(|r| r.0 == i && r.1 == b).unwrap().2;
    assert_eq!(
        (count(0, 30 * MIN), count(1, 115 * MIN), count(0, 31 * MIN)),
        (Ok(6), Ok(6), Ok(7))
    );
    let reader = Reader::open(dir.path()).unwrap();
    let st = super::status::status(&reader, &plan, now).unwrap();
    assert_eq!(st.tiers[0].corrupt_skipped_points, 2);
    assert_eq!(st.tiers[1].corrupt_skipped_points, 0);
}

/// The agent's job (`fold_cadence`) looks for small chunks to merge on its first run and then
/// every `MERGE_EVERY_NS`, not every run; a job without the cadence (`edgewatch maintain`,
/// tests) merges at every run as before. A step's range holds `batch_points` points.
#[test]
fn the_agents_job_merges_small_chunks_every_five_minutes_not_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
    let one_point_commits = |w: &mut Writer, from: i64| {
        for i in from..from + 3000 {
            write(w, "m,s=a", &[(i * NS, i as f64)]);
        }
    };
    one_point_commits(&mut w, 0);
    let chunks = || crate::store::testing::count_chunks(dir.path());
    assert_eq!(chunks(), 3000);
    let plan = plan_with(&["1m"], 1_000, 0);
    let mut job = Job::open(dir.path(), plan).unwrap();
    job.fold_cadence = true;
    // Two hours in: every point written below is in a closed minute.
    let now = 7200 * NS;
    job.run_once(now, &|| false).unwrap();
    // Three ranges of 1,000 points, each carrying the last partial chunk into the next:
    // 2,048 + 952.
    assert_eq!(chunks(), 2, "merged on the first run");
    one_point_commits(&mut w, 3000);
    job.run_once(now + 30 * NS, &|| false).unwrap();
    assert_eq!(chunks(), 2 + 3000, "30 s later: no search");
    job.run_once(now + 5 * MIN, &|| false).unwrap();
    // 6,000 points: 2,048 + 2,048 + 1,904.
    assert_eq!(chunks(), 3, "5 minutes later: merged");
}

thread_local! {
    /// The made-up wall clock of `clock_now` (tests run on one thread each).
    static CLOCK: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

fn clock_now() -> i64 {
    CLOCK.with(|c| c.get())
}

/// The agent's job folds the 1m tier's minutes once each, when they have closed: a stream of
/// 100 series committed every 5 s (off the minute, so commits straddle minutes) and the job
/// every 30 s, for 20 minutes. The minute tier rewrites no row (the old way, folding the open
/// minute every minute, rewrites every row once) and writes fewer pages; a late point is
/// still folded into its stored row; the rows end up the same.
#[test]
fn the_agents_job_folds_each_minute_once_it_has_closed() {
    use crate::store::testing::{checkpoint_truncate, wal_frames};
    const SERIES: usize = 100;
    let t0 = 1000 * MIN;
    let end = t0 + 20 * MIN;
    // (rows rewritten, the fold's pages, the store, its job)
    let run = |closed_only: bool| -> (u64, u64, tempfile::TempDir, Job) {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 1000, Synchronous::Normal).unwrap();
        w.set_clock(clock_now);
        let mut job = Job::open(dir.path(), plan_with(&["1m"], 1_000_000, 0)).unwrap();
        job.fold_cadence = closed_only;
        let mut rep = Report::default();
        let mut pages = 0;
        let mut r = rng(9);
        // Commits at t0 + 3 s + 5k s, each with the points of the 5 s before it (the newest a
        // second old); the job at t0 + 10 s + 30k s (the old way: every minute, folding all).
        let mut t = t0 + 3 * NS;
        let mut next_job = t0 + 10 * NS;
        while t < end {
            CLOCK.with(|c| c.set(t));
            let lines = (0..SERIES)
                .flat_map(|s| (1..=5).map(move |k| (s, k)))
                .map(|(s, k)| Line {
                    key: format!("m,s=s{s:03}"),
                    fields: vec![("v".to_string(), Value::F64(r()))],
                    ts: t - (6 - k) * NS,
                    line_no: 0,
                })
                .collect();
            w.write(&[&Batch { lines }]).unwrap();
            t += 5 * NS;
            if t > next_job {
                checkpoint_truncate(dir.path());
                job.rollup(next_job, false, &|| false, &mut rep).unwrap();
                pages += wal_frames(dir.path());
                next_job += if closed_only { 30 * NS } else { MIN };
            }
        }
        (rep.rewritten_rows, pages, dir, job)
    };
    let (closed_rewritten, closed_pages, closed, mut closed_job) = run(true);
    let (open_rewritten, open_pages, open, mut open_job) = run(false);
    eprintln!(
        "20 minutes of {SERIES} series: closed minutes only {closed_rewritten} rows rewritten, \
         {closed_pages} pages; the open minute folded too {open_rewritten} rows rewritten, \
         {open_pages} pages"
    );
    assert_eq!(closed_rewritten, 0, "no minute folded twice");
    assert!(
        open_rewritten >= (SERIES * 18) as u64,
        "the old way rewrites each minute's rows: {open_rewritten}"
    );
    // Fewer pages too, though with rows this small (sparse sketches) a fold's fixed pages
    // weigh more: 296 against 326 (531 against 712 with the dense sketches of before).
    assert!(
        closed_pages < open_pages,
        "{closed_pages} pages against {open_pages}"
    );
    // The last fold, 20 s before the end, folded through the minute before the open one:
    // the tier lags by its open minute and the margin, no more.
    let newest = |d: &Path| dump(d).iter().map(|r| r.2).max().unwrap();
    assert_eq!(newest(closed.path()), end - 2 * MIN);
    // A late point (three minutes back) folds into its stored row at the next fold.
    let mut w = Writer::open(closed.path(), 1000, Synchronous::Normal).unwrap();
    CLOCK.with(|c| c.set(end + MIN));
    write(&mut w, "m,s=s007", &[(end - 3 * MIN + 30 * NS, 1.0)]);
    let rep = closed_job.run_once(end + 2 * MIN, &|| false).unwrap();
    assert_eq!(rep.rewritten_rows, 1, "{rep:?}");
    let mut w = Writer::open(open.path(), 1000, Synchronous::Normal).unwrap();
    write(&mut w, "m,s=s007", &[(end - 3 * MIN + 30 * NS, 1.0)]);
    open_job.run_once(end + 2 * MIN, &|| false).unwrap();
    assert_same_rows(closed.path(), open.path());
}

/// The two stores hold the same tier rows, sums to rounding (their points were added in
/// another order).
fn assert_same_rows(one: &Path, other: &Path) {
    let (a, b) = (dump(one), dump(other));
    assert_eq!(a.len(), b.len());
    let strip = |r: &crate::store::testing::RollupRow| {
        let mut r = r.clone();
        r.4 = 0.0;
        r
    };
    for (x, y) in a.iter().zip(&b) {
        let key = (x.0, x.1, x.2);
        assert_eq!(key, (y.0, y.1, y.2));
        assert!((x.4 - y.4).abs() <= 1e-9 * x.4.abs().max(1.0), "{key:?}");
        assert!(strip(x) == strip(y), "row {key:?} differs");
    }
}

/// With the default tiers, the agent's job folds each hour of the 1h tier once, when it has
/// closed, and the 1m tier's minutes meanwhile: 20 series committed every 15 s (the writer's
/// default hold) and the job every 30 s for two and a half hours. No minute is written
/// twice, and an hour only as often as its fold takes steps (folding the open hour every 5
/// minutes rewrote each of its rows eleven times more); the 1m tier never lags by more than its open minute, the margin and a run
/// while the 1h tier waits an hour behind it; the rows end up those of a job that folds
/// everything at every run.
#[test]
fn the_agents_job_folds_each_hour_once_it_has_closed_and_the_minutes_meanwhile() {
    const SERIES: usize = 20;
    let t0 = 1000 * HOUR + 7 * NS;
    let end = t0 + 150 * MIN;
    let plan = Plan::new(&RollupConfig::default(), &RetentionConfig::default()).unwrap();
    assert_eq!(plan.tiers.len(), 2);
    let newest_chunk = |d: &Path| -> i64 {
        let r = Reader::open(d).unwrap();
        r.conn()
            .query_row("SELECT COALESCE(MAX(id), 0) FROM chunks", [], |row| {
                row.get(0)
            })
            .unwrap()
    };
    let (paced, each) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut writers = [paced.path(), each.path()].map(|d| {
        let mut w = Writer::open(d, 1000, Synchronous::Normal).unwrap();
        w.set_clock(clock_now);
        w
    });
    let mut jobs = [paced.path(), each.path()].map(|d| Job::open(d, plan.clone()).unwrap());
    jobs[0].fold_cadence = true;
    let mut rep = Report::default();
    let mut r = rng(5);
    // (commit time, newest chunk id then) of every commit.
    let mut commits: Vec<(i64, i64)> = Vec::new();
    let (mut t, mut next_job) = (t0 + 3 * NS, t0 + 10 * NS);
    let mut hour_cursors = std::collections::BTreeSet::new();
    while t < end {
        CLOCK.with(|c| c.set(t));
        let lines: Vec<Line> = (0..SERIES)
            .flat_map(|s| (1..=15).map(move |k| (s, k)))
            .map(|(s, k)| Line {
                key: format!("m,s=s{s:03}"),
                fields: vec![("v".to_string(), Value::F64(r()))],
                ts: t - (16 - k) * NS,
                line_no: 0,
            })
            .collect();
        for w in writers.iter_mut() {
            w.write(&[&Batch {
                lines: lines.clone(),
            }])
            .unwrap();
        }
        commits.push((t, newest_chunk(paced.path())));
        t += 15 * NS;
        while next_job < t {
            let run = jobs[0].run_once(next_job, &|| false).unwrap();
            rep.rewritten_rows += run.rewritten_rows;
            jobs[1].run_once(next_job, &|| false).unwrap();
            let [minute, hour] = tier_cursors(paced.path(), [60, 3600]);
            hour_cursors.insert(hour);
            // Every chunk committed more than 2 minutes before this run is in the 1m tier.
            let due = commits
                .iter()
                .filter(|(at, _)| *at + 2 * MIN <= next_job)
                .map(|c| c.1)
                .max()
                .unwrap_or(0);
            assert!(
                minute >= due,
                "at +{} s the 1m tier is at chunk {minute}, behind {due}",
                (next_job - t0) / NS
            );
            next_job += 30 * NS;
        }
    }
    // An hour here is about 6,000 chunks, so its fold takes two steps (at most 5,000 chunks
    // each) and the second merges into the rows the first wrote: one rewrite per series
    // and hour, against eleven when the open hour was folded every 5 minutes.
    assert!(
        rep.rewritten_rows <= 2 * SERIES as u64,
        "{} rows rewritten",
        rep.rewritten_rows
    );
    // The 1h tier moved once for each hour that closed (the first fold included), not at
    // every run.
    assert!(hour_cursors.len() <= 4, "{hour_cursors:?}");
    let hours: std::collections::BTreeSet<i64> = dump(paced.path())
        .iter()
        .filter(|row| row.0 == 3600)
        .map(|row| row.2)
        .collect();
    // The first commit holds a few seconds of the hour before t0.
    let first_hour = t0 - t0 % HOUR - HOUR;
    assert_eq!(
        hours.into_iter().collect::<Vec<_>>(),
        vec![first_hour, first_hour + HOUR, first_hour + 2 * HOUR],
        "the hours closed before the end, each once"
    );
    // Everything folded at last: the same rows as the job that folded at every run.
    jobs[0].fold_cadence = false;
    jobs[0].run_once(end + MIN, &|| false).unwrap();
    jobs[1].run_once(end + MIN, &|| false).unwrap();
    assert_same_rows(paced.path(), each.path());
}
