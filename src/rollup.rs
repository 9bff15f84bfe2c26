//! The rollup, retention and disk-budget job: folds raw chunks into downsampled tiers
//! (1 min, 1 h, ... : count, sum, min, max, first, last and a DDSketch per series and
//! bucket), evicts data past each tier's retention, and keeps the store under `max_bytes`.
//!
//! Design:
//! - **Second writer, small transactions.** The job has its own read-write connection, beside
//!   the ingest writer. Each step is one `BEGIN IMMEDIATE` transaction bounded by
//!   `[rollup] batch_points` raw points (or 1,000 evicted chunks / 5,000 evicted rows), so the
//!   ingest writer (busy_timeout 5 s) waits at most one short step. Ingest never waits for a
//!   whole run.
//! - **Exactly once, by chunk id.** Each tier has a cursor: the id of the last chunk folded
//!   into it (`rollup_state`). A step reads the next chunks by id, merges their points into
//!   the existing bucket rows (read-modify-merge-write) and moves the cursor in the *same*
//!   transaction. A kill -9 loses either the whole step or nothing, so a rerun neither
//!   double-counts nor skips. Steps are a deterministic function of the cursor and the
//!   stored chunks, so an interrupted and rerun job ends bit-identical to an uninterrupted
//!   one (tested). Chunk ids never repeat (`AUTOINCREMENT`, migration 0002).
//! - **Late points.** A point is always merged into its bucket, however late it arrives
//!   (the bucket row is read and merged, not overwritten). `lateness` defines when a bucket
//!   is *final*: once the tier's watermark (newest point time seen, capped at the wall clock)
//!   is more than `lateness` past the bucket's end. Points that land in a final bucket are
//!   still merged and are counted in `late_points`, so a consumer that copied final buckets
//!   (the forwarder) knows to resend. Nothing is dropped, so backfilling old data works.
//! - **Eviction** never deletes a raw chunk that some tier has not rolled up (id above the
//!   lowest cursor). Retention deletes raw chunks whose newest point is older than `raw`, and
//!   tier rows whose bucket ended before the tier's retention. The budget evicts the oldest
//!   raw chunks (by id, i.e. write order) first, then the oldest rows of the finest tier, then
//!   the next tier, until `page_count * page_size + WAL` fits `max_bytes`, running
//!   `PRAGMA incremental_vacuum` and `wal_checkpoint(TRUNCATE)` so the files really shrink.
//!   Raw chunks a sink had not forwarded yet are counted per sink (`sinks`).
//!
//! It never reads the ingest queue and never serves HTTP; `/api/v1/status` reads its tables.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::config::Interval;
use crate::store::rollup::{bucket_start, numeric, Acc};
use crate::store::sketch::Sketch;
use crate::store::{codec, db_path, latest_version, Reader, StoreError};

const NS: i64 = 1_000_000_000;

/// `[rollup]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RollupConfig {
    /// Whether the agent runs the job.
    pub enabled: bool,
    /// How often it runs.
    pub interval: Interval,
    /// How long after a bucket's end points still count as on time.
    pub lateness: Interval,
    /// Tier resolutions, e.g. `["1m", "1h"]`.
    pub tiers: Vec<String>,
    /// Most raw points folded per transaction.
    pub batch_points: usize,
}

impl Default for RollupConfig {
    fn default() -> Self {
        RollupConfig {
            enabled: true,
            interval: Interval(Duration::from_secs(30)),
            lateness: Interval(Duration::from_secs(600)),
            tiers: vec!["1m".into(), "1h".into()],
            batch_points: 100_000,
        }
    }
}

/// `[retention]`: `raw`, one key per tier name (`1m = "30d"`) and `max_bytes`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionConfig {
    /// Raw chunk retention.
    pub raw: Interval,
    /// Tier name -> retention. A tier without an entry keeps its rows (budget aside).
    pub tiers: BTreeMap<String, Interval>,
    /// Disk budget for the whole store (database + WAL); 0 = none.
    pub max_bytes: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        let day = 86_400;
        RetentionConfig {
            raw: Interval(Duration::from_secs(48 * 3600)),
            tiers: BTreeMap::from([
                ("1m".to_string(), Interval(Duration::from_secs(30 * day))),
                ("1h".to_string(), Interval(Duration::from_secs(365 * day))),
            ]),
            max_bytes: 1 << 30,
        }
    }
}

fn parse_interval(key: &str, s: &str) -> Result<Interval, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("invalid duration {s:?} for `{key}`: {e} (write e.g. \"30d\")"))?;
    if d.is_zero() {
        return Err(format!("`{key}` must be greater than zero"));
    }
    Ok(Interval(d))
}

impl<'de> Deserialize<'de> for RetentionConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let map = BTreeMap::<String, toml::Value>::deserialize(d)?;
        // Per key over the defaults: `1m = "7d"` alone keeps `1h`'s default.
        let mut out = RetentionConfig::default();
        for (k, v) in map {
            match (k.as_str(), v) {
                ("max_bytes", toml::Value::Integer(n)) => {
                    out.max_bytes = u64::try_from(n)
                        .map_err(|_| D::Error::custom("`max_bytes` must be >= 0"))?
                }
                ("max_bytes", other) => {
                    return Err(D::Error::custom(format!(
                        "`max_bytes` must be an integer number of bytes, not {other}"
                    )))
                }
                (key, toml::Value::String(s)) => {
                    let iv = parse_interval(key, &s).map_err(D::Error::custom)?;
                    if key == "raw" {
                        out.raw = iv;
                    } else if humantime::parse_duration(key).is_ok() {
                        out.tiers.insert(key.to_string(), iv);
                    } else {
                        return Err(D::Error::custom(format!(
                            "unknown key `{key}` in [retention]: expected raw, max_bytes or a tier name from [rollup] tiers"
                        )));
                    }
                }
                (key, other) => {
                    return Err(D::Error::custom(format!(
                        "`{key}` in [retention] must be a duration string like \"30d\", not {other}"
                    )))
                }
            }
        }
        Ok(out)
    }
}

/// Why the job failed. Store errors say whether a retry can help.
#[derive(Debug, thiserror::Error)]
pub enum RollupError {
    /// SQLite or the data directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored sketch does not decode.
    #[error("corrupt rollup row (tier {tier_s}s, series {series_id}, bucket {bucket}) in {path}")]
    Corrupt {
        /// Database.
        path: PathBuf,
        /// Tier resolution, seconds.
        tier_s: i64,
        /// Series.
        series_id: i64,
        /// Bucket start, ns.
        bucket: i64,
    },
    /// The tier configuration is invalid.
    #[error("invalid rollup configuration: {0}")]
    Config(String),
    /// The database is not at this binary's schema version.
    #[error("store {path} is at schema version {found}, expected {expected}: start the agent (or `edgewatch maintain`) of this version once to migrate it")]
    Schema {
        /// Database.
        path: PathBuf,
        /// Found.
        found: u32,
        /// Expected.
        expected: u32,
    },
}

/// One downsampling tier.
#[derive(Debug, Clone, PartialEq)]
pub struct Tier {
    /// Name as configured (`1m`).
    pub name: String,
    /// Resolution, ns (a whole number of seconds).
    pub res_ns: i64,
    /// Retention, ns; `None` keeps rows until the budget needs the space.
    pub retention_ns: Option<i64>,
}

impl Tier {
    /// The `rollups.tier` key: resolution in seconds.
    pub fn key(&self) -> i64 {
        self.res_ns / NS
    }
}

/// Everything the job and the query engine need from the config, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Tiers, finest first.
    pub tiers: Vec<Tier>,
    /// Raw retention, ns.
    pub raw_retention_ns: i64,
    /// Lateness, ns.
    pub lateness_ns: i64,
    /// Most raw points per transaction.
    pub batch_points: usize,
    /// Budget, bytes (0 = none).
    pub max_bytes: u64,
    /// Run interval.
    pub interval: Duration,
    /// Whether the agent runs the job.
    pub enabled: bool,
    /// The earliest time a set clock can read (`[clock] min_valid`), ns.
    pub clock_floor_ns: i64,
}

fn dur_ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl Plan {
    /// Validates `[rollup]` and `[retention]`.
    pub fn new(rollup: &RollupConfig, retention: &RetentionConfig) -> Result<Plan, RollupError> {
        let mut tiers = Vec::new();
        for name in &rollup.tiers {
            let d = humantime::parse_duration(name).map_err(|e| {
                RollupError::Config(format!("tier {name:?} is not a duration: {e}"))
            })?;
            if d.as_secs() == 0 || d.subsec_nanos() != 0 {
                return Err(RollupError::Config(format!(
                    "tier {name:?} must be a whole number of seconds, at least 1s"
                )));
            }
            tiers.push(Tier {
                name: name.clone(),
                res_ns: dur_ns(d),
                retention_ns: retention.tiers.get(name).map(|i| dur_ns(i.0)),
            });
        }
        let defaults = RetentionConfig::default();
        for key in retention.tiers.keys() {
            // The built-in tiers' default retentions stay harmless when those tiers are
            // not configured; any other key must name a tier (catches typos).
            if !rollup.tiers.contains(key) && !defaults.tiers.contains_key(key) {
                return Err(RollupError::Config(format!(
                    "[retention] {key} names no tier in [rollup] tiers {:?}",
                    rollup.tiers
                )));
            }
        }
        tiers.sort_by_key(|t| t.res_ns);
        if tiers.windows(2).any(|w| w[0].res_ns == w[1].res_ns) {
            return Err(RollupError::Config(
                "two tiers have the same resolution".into(),
            ));
        }
        Ok(Plan {
            tiers,
            raw_retention_ns: dur_ns(retention.raw.0),
            lateness_ns: dur_ns(rollup.lateness.0),
            batch_points: rollup.batch_points.max(1),
            max_bytes: retention.max_bytes,
            interval: rollup.interval.0,
            enabled: rollup.enabled,
            clock_floor_ns: crate::clock::ClockConfig::default().floor_ns(),
        })
    }

    /// From the whole config.
    pub fn from_config(cfg: &crate::config::Config) -> Result<Plan, RollupError> {
        let mut plan = Plan::new(&cfg.rollup, &cfg.retention)?;
        plan.clock_floor_ns = cfg.clock.floor_ns();
        Ok(plan)
    }
}

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    /// Chunks folded (counted once per chunk, whichever tiers needed it).
    pub chunks: u64,
    /// Raw points read.
    pub points: u64,
    /// Transactions committed by the rollup.
    pub steps: u64,
    /// Raw chunks evicted (retention + budget).
    pub evicted_chunks: u64,
    /// Raw points evicted.
    pub evicted_points: u64,
    /// Tier rows evicted.
    pub evicted_rows: u64,
    /// Store size after the run (bytes, database + WAL).
    pub db_bytes: u64,
    /// True when stopped early by the stop flag.
    pub interrupted: bool,
    /// Rollup and retention waited for the device's clock to be set (see [`crate::clock`]).
    pub clock_held: bool,
    /// Points whose times were corrected after the clock was set.
    pub clock_fixed_points: u64,
}

#[derive(Debug, Clone, Copy)]
struct TierState {
    cursor: i64,
    watermark: i64,
    late: i64,
}

/// The job: its own read-write connection and the plan.
pub struct Job {
    conn: Connection,
    path: PathBuf,
    plan: Plan,
    /// Test aid for the crash test (`edgewatch maintain --debug-pause-ms`): sleep this long
    /// after each committed rollup step. Zero in production.
    pub pause_between_steps: Duration,
}

/// Opens a read-write connection to the migrated store in `dir` (it must exist).
pub fn open_conn(dir: &Path) -> Result<(Connection, PathBuf), RollupError> {
    let path = db_path(dir);
    if !path.exists() {
        return Err(StoreError::Missing(path).into());
    }
    let sq = |source| StoreError::Sqlite {
        path: path.clone(),
        source,
    };
    let conn = Connection::open(&path).map_err(sq)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(sq)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sq)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sq)?;
    conn.pragma_update(None, "cache_size", -4096).map_err(sq)?;
    let found: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sq)?;
    if found != latest_version() {
        return Err(RollupError::Schema {
            path,
            found,
            expected: latest_version(),
        });
    }
    Ok((conn, path))
}

/// The buckets one rollup step is building for one tier, in first-seen order, with an index
/// by `(series_id, bucket)` and the last one used: points of a chunk come series by series in
/// time order, so most land in the bucket of the point before and skip the hash lookup.
#[derive(Default)]
struct Fresh {
    accs: Vec<((i64, i64), Acc)>,
    index: HashMap<(i64, i64), usize>,
    last: Option<((i64, i64), usize)>,
}

impl Fresh {
    fn at(&mut self, key: (i64, i64)) -> &mut Acc {
        let i = match self.last {
            Some((k, i)) if k == key => i,
            _ => {
                let accs = &mut self.accs;
                let i = *self.index.entry(key).or_insert_with(|| {
                    accs.push((key, Acc::default()));
                    accs.len() - 1
                });
                self.last = Some((key, i));
                i
            }
        };
        &mut self.accs[i].1
    }

    /// The buckets sorted by key (sorting indices, not the large accumulators).
    fn into_sorted(mut self) -> Vec<((i64, i64), Acc)> {
        let mut order: Vec<usize> = (0..self.accs.len()).collect();
        order.sort_unstable_by_key(|&i| self.accs[i].0);
        order
            .into_iter()
            .map(|i| (self.accs[i].0, std::mem::take(&mut self.accs[i].1)))
            .collect()
    }
}

impl Job {
    /// Opens the job on the store in `dir`.
    pub fn open(dir: &Path, plan: Plan) -> Result<Job, RollupError> {
        let (conn, path) = open_conn(dir)?;
        Ok(Job {
            conn,
            path,
            plan,
            pause_between_steps: Duration::ZERO,
        })
    }

    fn sq(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Rollup, then retention, then the budget. `stop` is polled between transactions.
    pub fn run_once(&mut self, now: i64, stop: &dyn Fn() -> bool) -> Result<Report, RollupError> {
        let mut report = Report::default();
        // A clock that is not set (or was just set) holds rollup and retention: the times of
        // the held points are wrong until corrected. The budget still protects the disk.
        let machine = crate::clock::Machine::read(now);
        let (clock, fixed) =
            crate::clock::settle(&mut self.conn, self.plan.clock_floor_ns, now, &machine)
                .map_err(self.sq())?;
        report.clock_fixed_points = fixed.points;
        report.clock_held = clock != crate::clock::Settle::Ready;
        if report.clock_held {
            self.enforce_budget(stop, &mut report)?;
        } else {
            self.rollup(now, stop, &mut report)?;
            if !report.interrupted {
                self.enforce_retention(now, &mut report)?;
                self.enforce_budget(stop, &mut report)?;
            }
        }
        report.db_bytes = self.db_bytes()?;
        // Give the page cache back between runs (runs are seconds apart and touch pages
        // the next run mostly does not need): the agent's steady RSS stays flat instead of
        // holding this connection's cache full.
        self.conn
            .execute_batch("PRAGMA shrink_memory")
            .map_err(self.sq())?;
        Ok(report)
    }

    /// Folds every chunk not yet rolled up, step by step.
    pub fn rollup(
        &mut self,
        now: i64,
        stop: &dyn Fn() -> bool,
        report: &mut Report,
    ) -> Result<(), RollupError> {
        if self.plan.tiers.is_empty() {
            return Ok(());
        }
        loop {
            if stop() {
                report.interrupted = true;
                return Ok(());
            }
            match self.rollup_step(now)? {
                None => return Ok(()),
                Some((chunks, points)) => {
                    report.chunks += chunks;
                    report.points += points;
                    report.steps += 1;
                }
            }
            if !self.pause_between_steps.is_zero() {
                std::thread::sleep(self.pause_between_steps);
            }
        }
    }

    fn load_states(tx: &Connection, plan: &Plan) -> rusqlite::Result<Vec<TierState>> {
        let mut st = tx.prepare_cached(
            "SELECT cursor, watermark_ns, late_points FROM rollup_state WHERE tier = ?1",
        )?;
        let mut out = Vec::new();
        for t in &plan.tiers {
            let s = st
                .query_row(params![t.key()], |r| {
                    Ok(TierState {
                        cursor: r.get(0)?,
                        watermark: r.get(1)?,
                        late: r.get(2)?,
                    })
                })
                .optional()?;
            out.push(s.unwrap_or(TierState {
                cursor: 0,
                watermark: i64::MIN,
                late: 0,
            }));
        }
        Ok(out)
    }

    /// One transaction: the next chunks (up to `batch_points` points) into every tier that
    /// has not seen them. `None` when every tier is caught up.
    fn rollup_step(&mut self, now: i64) -> Result<Option<(u64, u64)>, RollupError> {
        let path = self.path.clone();
        let sq = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let plan = &self.plan;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq)?;
        let mut states = Self::load_states(&tx, plan).map_err(sq)?;
        let min_cursor = states.iter().map(|s| s.cursor).min().unwrap_or(i64::MAX);
        // Chunks stamped by a clock that is not set yet wait (see crate::clock).
        let hold = crate::clock::hold_from(&tx)
            .map_err(sq)?
            .unwrap_or(i64::MAX);
        // The batch: whole chunks by id until `batch_points` (at least one chunk).
        let mut chunks: Vec<(i64, i64, Vec<u8>)> = Vec::new();
        let mut points = 0u64;
        {
            let mut st = tx
                .prepare_cached(
                    "SELECT id, ts_min, n, data FROM chunks WHERE id > ?1 AND id < ?2 ORDER BY id LIMIT 5000",
                )
                .map_err(sq)?;
            let mut rows = st.query(params![min_cursor, hold]).map_err(sq)?;
            while let Some(r) = rows.next().map_err(sq)? {
                if points >= plan.batch_points as u64 {
                    break;
                }
                let n: i64 = r.get(2).map_err(sq)?;
                points += n.max(0) as u64;
                chunks.push((
                    r.get(0).map_err(sq)?,
                    r.get(1).map_err(sq)?,
                    r.get(3).map_err(sq)?,
                ));
            }
        }
        let Some(last_id) = chunks.last().map(|c| c.0) else {
            return Ok(None);
        };
        let mut fresh: Vec<Fresh> = (0..plan.tiers.len()).map(|_| Fresh::default()).collect();
        let mut values: Vec<(i64, i64, f64)> = Vec::new();
        for (id, ts_min, data) in &chunks {
            values.clear();
            codec::decode_chunk(data, *ts_min, |ts, sid, v| {
                if let Some(f) = numeric(&v) {
                    values.push((ts, sid, f));
                }
            })
            .map_err(|source| StoreError::Corrupt {
                path: path.clone(),
                source,
            })?;
            for (ti, tier) in plan.tiers.iter().enumerate() {
                let state = &mut states[ti];
                if *id <= state.cursor {
                    continue;
                }
                for &(ts, sid, f) in &values {
                    let b = bucket_start(ts, tier.res_ns);
                    if b.saturating_add(tier.res_ns)
                        <= state.watermark.saturating_sub(plan.lateness_ns)
                    {
                        state.late += 1;
                    }
                    state.watermark = state.watermark.max(ts.min(now));
                    fresh[ti].at((sid, b)).add(ts, f);
                }
            }
        }
        {
            let mut get = tx
                .prepare_cached(
                    "SELECT count, sum, min, max, first_ts, first, last_ts, last, sketch FROM rollups \
                     WHERE tier = ?1 AND series_id = ?2 AND bucket = ?3",
                )
                .map_err(sq)?;
            let mut get_range = tx
                .prepare_cached(
                    "SELECT bucket, count, sum, min, max, first_ts, first, last_ts, last, sketch FROM rollups \
                     WHERE tier = ?1 AND series_id = ?2 AND bucket >= ?3 AND bucket <= ?4 ORDER BY bucket",
                )
                .map_err(sq)?;
            // A new bucket is a plain insert; an existing one is replaced by its merge.
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO rollups (tier, series_id, bucket, count, sum, min, max, \
                     first_ts, first, last_ts, last, sketch) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                )
                .map_err(sq)?;
            let mut replace = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO rollups (tier, series_id, bucket, count, sum, min, max, \
                     first_ts, first, last_ts, last, sketch) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                )
                .map_err(sq)?;
            let mut put_state = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO rollup_state (tier, cursor, watermark_ns, late_points, updated_ns) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(sq)?;
            for (ti, tier) in plan.tiers.iter().enumerate() {
                let key = tier.key();
                let mut inserted = 0i64;
                // Sorted, so the write order (and the file) is the same on every run.
                let accs = std::mem::take(&mut fresh[ti]).into_sorted();
                // The existing rows of each series: one range read over its buckets (rows
                // in the range that are not being written are skipped undecoded), or point
                // reads when the buckets are sparse in a wide range (e.g. one late point).
                let mut group: Vec<(i64, Acc)> = Vec::new();
                let mut iter = accs.into_iter().peekable();
                while let Some(((sid, bucket), acc)) = iter.next() {
                    group.clear();
                    group.push((bucket, acc));
                    while let Some(((_, b), a)) = iter.next_if(|((s, _), _)| *s == sid) {
                        group.push((b, a));
                    }
                    let (lo, hi) = (group[0].0, group[group.len() - 1].0);
                    let span = (hi - lo) / tier.res_ns + 1;
                    let mut existing: Vec<Option<Result<Acc, ()>>> =
                        (0..group.len()).map(|_| None).collect();
                    if span <= 4 * group.len() as i64 + 64 {
                        let mut rows = get_range.query(params![key, sid, lo, hi]).map_err(sq)?;
                        let mut k = 0;
                        while let Some(r) = rows.next().map_err(sq)? {
                            let b: i64 = r.get(0).map_err(sq)?;
                            while k < group.len() && group[k].0 < b {
                                k += 1;
                            }
                            if k == group.len() {
                                break;
                            }
                            if group[k].0 == b {
                                existing[k] = Some(read_acc_at(r, 1).map_err(sq)?);
                            }
                        }
                    } else {
                        for (slot, (b, _)) in existing.iter_mut().zip(&group) {
                            *slot = get
                                .query_row(params![key, sid, b], read_acc)
                                .optional()
                                .map_err(sq)?;
                        }
                    }
                    for ((bucket, acc), existing) in group.drain(..).zip(existing) {
                        let put = if existing.is_some() {
                            &mut replace
                        } else {
                            inserted += 1;
                            &mut insert
                        };
                        let merged = match existing {
                            None => acc,
                            Some(Err(())) => {
                                return Err(RollupError::Corrupt {
                                    path: path.clone(),
                                    tier_s: key,
                                    series_id: sid,
                                    bucket,
                                })
                            }
                            Some(Ok(mut old)) => {
                                old.merge(&acc);
                                old
                            }
                        };
                        put.execute(params![
                            key,
                            sid,
                            bucket,
                            merged.count as i64,
                            merged.sum,
                            merged.min,
                            merged.max,
                            merged.first.0,
                            merged.first.1,
                            merged.last.0,
                            merged.last.1,
                            merged.sketch.encode(),
                        ])
                        .map_err(sq)?;
                    }
                }
                bump(&tx, &rows_counter(key), inserted).map_err(sq)?;
                let s = &states[ti];
                if s.cursor < last_id {
                    put_state
                        .execute(params![key, last_id, s.watermark, s.late, now])
                        .map_err(sq)?;
                }
            }
        }
        tx.commit().map_err(sq)?;
        tracing::debug!(
            chunks = chunks.len(),
            points,
            last_id,
            "rollup step committed"
        );
        Ok(Some((chunks.len() as u64, points)))
    }

    fn min_cursor(&self) -> Result<i64, RollupError> {
        if self.plan.tiers.is_empty() {
            return Ok(i64::MAX);
        }
        let states = Self::load_states(&self.conn, &self.plan).map_err(self.sq())?;
        Ok(states.iter().map(|s| s.cursor).min().unwrap_or(0))
    }

    /// Deletes raw chunks (rolled up by every tier) and tier rows past their retention.
    pub fn enforce_retention(&mut self, now: i64, report: &mut Report) -> Result<(), RollupError> {
        let min_cursor = self.min_cursor()?;
        let cut = now.saturating_sub(self.plan.raw_retention_ns);
        loop {
            let batch = self.select_chunks(
                "SELECT id, n FROM chunks WHERE id <= ?1 AND ts_max < ?2 ORDER BY id LIMIT 1000",
                params![min_cursor, cut],
            )?;
            if batch.is_empty() {
                break;
            }
            self.evict_chunks(&batch, report)?;
        }
        for tier in self.plan.tiers.clone() {
            let Some(ret) = tier.retention_ns else {
                continue;
            };
            // Rows whose bucket ended before now - retention.
            let last_bucket = now.saturating_sub(ret).saturating_sub(tier.res_ns);
            while self.evict_rows(&tier, last_bucket, 5000, report)? > 0 {}
        }
        self.shrink()?;
        Ok(())
    }

    fn select_chunks(
        &self,
        sql: &str,
        p: impl rusqlite::Params,
    ) -> Result<Vec<(i64, i64, i64)>, RollupError> {
        let mut st = self.conn.prepare_cached(sql).map_err(self.sq())?;
        let rows = st
            .query_map(p, |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Option<i64>>(2).unwrap_or(None).unwrap_or(0),
                ))
            })
            .map_err(self.sq())?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.sq()(e).into())
    }

    /// Deletes chunks `(id, n, _)` in one transaction, counting them and, per sink, those it
    /// had not forwarded yet.
    fn evict_chunks(
        &mut self,
        batch: &[(i64, i64, i64)],
        report: &mut Report,
    ) -> Result<(), RollupError> {
        let path = self.path.clone();
        let sq = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq)?;
        let points: i64 = batch.iter().map(|c| c.1).sum();
        {
            let mut del = tx
                .prepare_cached("DELETE FROM chunks WHERE id = ?1")
                .map_err(sq)?;
            for (id, _, _) in batch {
                del.execute(params![id]).map_err(sq)?;
            }
            let sinks: Vec<(String, i64)> = {
                let mut st = tx
                    .prepare_cached("SELECT name, cursor_chunk_id FROM sinks")
                    .map_err(sq)?;
                let rows = st
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(sq)?;
                rows.collect::<Result<_, _>>().map_err(sq)?
            };
            let mut upd = tx
                .prepare_cached(
                    "UPDATE sinks SET evicted_unforwarded_chunks = evicted_unforwarded_chunks + ?2, \
                     evicted_unforwarded_points = evicted_unforwarded_points + ?3, \
                     evicted_through_chunk_id = MAX(evicted_through_chunk_id, ?4) WHERE name = ?1",
                )
                .map_err(sq)?;
            for (name, cursor) in sinks {
                let lost: Vec<_> = batch.iter().filter(|c| c.0 > cursor).collect();
                if lost.is_empty() {
                    continue;
                }
                let n: i64 = lost.iter().map(|c| c.1).sum();
                let through = lost.iter().map(|c| c.0).max().unwrap_or(0);
                tracing::warn!(
                    sink = %name,
                    chunks = lost.len(),
                    points = n,
                    "evicting raw data the sink has not forwarded yet"
                );
                upd.execute(params![name, lost.len() as i64, n, through])
                    .map_err(sq)?;
            }
            bump(&tx, "evicted_raw_chunks", batch.len() as i64).map_err(sq)?;
            bump(&tx, "evicted_raw_points", points).map_err(sq)?;
        }
        tx.commit().map_err(sq)?;
        report.evicted_chunks += batch.len() as u64;
        report.evicted_points += points.max(0) as u64;
        Ok(())
    }

    /// Deletes up to about `limit` of the oldest rows of `tier` with `bucket <= last_bucket`,
    /// in one transaction; returns how many.
    fn evict_rows(
        &mut self,
        tier: &Tier,
        last_bucket: i64,
        limit: i64,
        report: &mut Report,
    ) -> Result<u64, RollupError> {
        let path = self.path.clone();
        let sq = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq)?;
        // Whole buckets at a time: all rows before the `limit`-th oldest one's bucket.
        let bound: Option<i64> = tx
            .query_row(
                "SELECT bucket FROM rollups WHERE tier = ?1 AND bucket <= ?2 ORDER BY bucket LIMIT 1 OFFSET ?3",
                params![tier.key(), last_bucket, limit],
                |r| r.get(0),
            )
            .optional()
            .map_err(sq)?;
        let n = match bound {
            // Always make progress, even when one bucket holds more than `limit` rows.
            Some(b) => {
                let first: i64 = tx
                    .query_row(
                        "SELECT MIN(bucket) FROM rollups WHERE tier = ?1",
                        params![tier.key()],
                        |r| r.get(0),
                    )
                    .map_err(sq)?;
                let upto = if b > first { b - 1 } else { b };
                tx.execute(
                    "DELETE FROM rollups WHERE tier = ?1 AND bucket <= ?2",
                    params![tier.key(), upto],
                )
                .map_err(sq)?
            }
            None => tx
                .execute(
                    "DELETE FROM rollups WHERE tier = ?1 AND bucket <= ?2",
                    params![tier.key(), last_bucket],
                )
                .map_err(sq)?,
        };
        bump(&tx, &format!("evicted_rows_{}", tier.key()), n as i64).map_err(sq)?;
        bump(&tx, &rows_counter(tier.key()), -(n as i64)).map_err(sq)?;
        tx.commit().map_err(sq)?;
        report.evicted_rows += n as u64;
        Ok(n as u64)
    }

    /// Bytes the store occupies: live pages plus the WAL file.
    pub fn db_bytes(&self) -> Result<u64, RollupError> {
        let pages: i64 = self
            .conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(self.sq())?;
        let size: i64 = self
            .conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(self.sq())?;
        let mut wal = self.path.as_os_str().to_owned();
        wal.push("-wal");
        let wal = std::fs::metadata(PathBuf::from(wal))
            .map(|m| m.len())
            .unwrap_or(0);
        Ok((pages.max(0) * size.max(0)) as u64 + wal)
    }

    /// Returns free pages to the file system and truncates the WAL (best effort: a reader
    /// holding an old snapshot can keep the WAL until the next run).
    fn shrink(&mut self) -> Result<(), RollupError> {
        let sq = self.sq();
        let mut st = self
            .conn
            .prepare("PRAGMA incremental_vacuum")
            .map_err(&sq)?;
        let mut rows = st.query([]).map_err(&sq)?;
        while rows.next().map_err(&sq)?.is_some() {}
        drop(rows);
        drop(st);
        let (busy, _, _): (i64, i64, i64) = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .map_err(self.sq())?;
        if busy != 0 {
            tracing::debug!("wal checkpoint could not truncate (readers busy); retried next run");
        }
        Ok(())
    }

    /// Evicts oldest-first (raw, then each tier, finest first) until the store fits
    /// `max_bytes`. Never touches raw chunks some tier has not rolled up.
    pub fn enforce_budget(
        &mut self,
        stop: &dyn Fn() -> bool,
        report: &mut Report,
    ) -> Result<(), RollupError> {
        let max = self.plan.max_bytes;
        if max == 0 {
            return Ok(());
        }
        let auto_vacuum: i64 = self
            .conn
            .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
            .map_err(self.sq())?;
        if auto_vacuum != 2 {
            tracing::warn!(
                "the store is not in incremental auto-vacuum mode: evicted space is reused but \
                 the file will not shrink until the agent of this version reopens it"
            );
        }
        self.shrink()?;
        let mut tier_idx = 0usize;
        loop {
            let size = self.db_bytes()?;
            if size <= max || stop() {
                return Ok(());
            }
            let over = (size - max) as i64;
            let min_cursor = self.min_cursor()?;
            let candidates = self.select_chunks(
                "SELECT id, n, length(data) FROM chunks WHERE id <= ?1 ORDER BY id LIMIT 1000",
                params![min_cursor],
            )?;
            if !candidates.is_empty() {
                // Just enough chunks to cover the excess (plus page slack), at least one.
                let mut take = 0;
                let mut bytes = 0i64;
                for c in &candidates {
                    take += 1;
                    bytes += c.2 + 64;
                    if bytes >= over + 8192 {
                        break;
                    }
                }
                self.evict_chunks(&candidates[..take], report)?;
            } else if let Some(tier) = self.plan.tiers.get(tier_idx).cloned() {
                let rows = (over / 256).clamp(100, 5000);
                if self.evict_rows(&tier, i64::MAX, rows, report)? == 0 {
                    tier_idx += 1;
                }
            } else {
                tracing::warn!(
                    db_bytes = size,
                    max_bytes = max,
                    "store is over its disk budget with nothing left that may be evicted \
                     (raw data not rolled up yet is kept); raise [retention] max_bytes"
                );
                return Ok(());
            }
            self.shrink()?;
        }
    }
}

/// The `counters` entry holding a tier's live row count (migration 0004).
fn rows_counter(tier_key: i64) -> String {
    format!("rows_{tier_key}")
}

/// The `counters` row `name` (0 when it does not exist yet).
pub(crate) fn counter(conn: &Connection, name: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT COALESCE((SELECT value FROM counters WHERE name = ?1), 0)")?
        .query_row([name], |r| r.get(0))
}

/// Adds `n` to the `counters` row `name` (created at `n`), inside the caller's transaction.
pub(crate) fn bump(tx: &Connection, name: &str, n: i64) -> rusqlite::Result<()> {
    if n == 0 {
        return Ok(());
    }
    tx.prepare_cached(
        "INSERT INTO counters (name, value) VALUES (?1, ?2) \
         ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
    )?
    .execute(params![name, n])?;
    Ok(())
}

/// Reads a rollup row's aggregate columns (count, sum, min, max, first_ts, first, last_ts,
/// last, sketch, in this order from column 0); `Err(())` when the sketch is corrupt.
pub fn read_acc(r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<Acc, ()>> {
    read_acc_at(r, 0)
}

/// [`read_acc`] starting at column `at`.
pub fn read_acc_at(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Result<Acc, ()>> {
    let blob = r.get_ref(at + 8)?;
    let sketch = match blob.as_blob().ok().map(Sketch::decode) {
        Some(Ok(s)) => s,
        _ => return Ok(Err(())),
    };
    Ok(Ok(Acc {
        count: r.get::<_, i64>(at)?.max(0) as u64,
        sum: r.get(at + 1)?,
        min: r.get(at + 2)?,
        max: r.get(at + 3)?,
        first: (r.get(at + 4)?, r.get(at + 5)?),
        last: (r.get(at + 6)?, r.get(at + 7)?),
        sketch,
    }))
}

/// The `rollup` object of `/api/v1/status`: tiers with cursor, lag and rows; eviction
/// counters; per-sink unforwarded evictions; the budget.
pub fn status(reader: &Reader, plan: &Plan, now: i64) -> Result<serde_json::Value, StoreError> {
    let conn = &reader.conn;
    let sq = |source| StoreError::Sqlite {
        path: reader.path.clone(),
        source,
    };
    let newest: i64 = conn
        .query_row("SELECT COALESCE(MAX(id), 0) FROM chunks", [], |r| r.get(0))
        .map_err(sq)?;
    let mut counters: HashMap<String, i64> = HashMap::new();
    {
        let mut st = conn
            .prepare_cached("SELECT name, value FROM counters")
            .map_err(sq)?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(sq)?;
        for row in rows {
            let (k, v) = row.map_err(sq)?;
            counters.insert(k, v);
        }
    }
    let c = |k: &str| counters.get(k).copied().unwrap_or(0);
    let mut tiers = Vec::new();
    for t in &plan.tiers {
        let (cursor, watermark, late, updated): (i64, i64, i64, i64) = conn
            .query_row(
                "SELECT cursor, watermark_ns, late_points, updated_ns FROM rollup_state WHERE tier = ?1",
                params![t.key()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(sq)?
            .unwrap_or((0, i64::MIN, 0, 0));
        let rows = c(&rows_counter(t.key()));
        let pending: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM chunks WHERE id > ?1",
                params![cursor],
                |r| r.get(0),
            )
            .map_err(sq)?;
        // Seconds since the job last advanced this tier while work is pending; unknown
        // (null) before its first run, rather than "since 1970".
        let lag_s = if pending == 0 {
            Some(0.0)
        } else if updated <= 0 {
            None
        } else {
            Some((now - updated).max(0) as f64 / NS as f64)
        };
        tiers.push(serde_json::json!({
            "name": t.name,
            "resolution_s": t.key(),
            "retention_s": t.retention_ns.map(|r| r / NS),
            "cursor_chunk_id": cursor,
            "pending_chunks": pending,
            "lag_s": lag_s,
            "watermark_ns": (watermark != i64::MIN).then_some(watermark),
            "late_points": late,
            "rows": rows,
        }));
    }
    let mut evicted = serde_json::Map::new();
    evicted.insert("raw_chunks".into(), c("evicted_raw_chunks").into());
    evicted.insert("raw_points".into(), c("evicted_raw_points").into());
    for t in &plan.tiers {
        evicted.insert(
            format!("rows_{}", t.name),
            c(&format!("evicted_rows_{}", t.key())).into(),
        );
    }
    let mut sinks = Vec::new();
    {
        let mut st = conn
            .prepare_cached(
                "SELECT name, cursor_chunk_id, evicted_unforwarded_chunks, evicted_unforwarded_points, \
                 evicted_through_chunk_id FROM sinks ORDER BY name",
            )
            .map_err(sq)?;
        let rows = st
            .query_map([], |r| {
                Ok(serde_json::json!({
                    "name": r.get::<_, String>(0)?,
                    "cursor_chunk_id": r.get::<_, i64>(1)?,
                    "evicted_unforwarded_chunks": r.get::<_, i64>(2)?,
                    "evicted_unforwarded_points": r.get::<_, i64>(3)?,
                    "evicted_through_chunk_id": r.get::<_, i64>(4)?,
                }))
            })
            .map_err(sq)?;
        for row in rows {
            sinks.push(row.map_err(sq)?);
        }
    }
    Ok(serde_json::json!({
        "tiers": tiers,
        "newest_chunk_id": newest,
        "raw_retention_s": plan.raw_retention_ns / NS,
        "lateness_s": plan.lateness_ns / NS,
        "evicted": evicted,
        "sinks": sinks,
        "budget": {
            "max_bytes": plan.max_bytes,
            "db_bytes": reader.disk_bytes(),
        },
    }))
}

/// Hands the heap pages a rollup run freed back to the OS. glibc keeps freed memory in its
/// arenas, and a run's short-lived buffers (chunk blobs, bucket maps, SQLite's page cache,
/// released by `PRAGMA shrink_memory`) leave holes that a later run does not always reuse:
/// without this the agent's RSS crept up by ~0.4 MB/min under load
/// (`FOOTPRINT_SECONDS=900 scripts/footprint.sh`).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory back to the OS; glibc serialises it
    // with every other allocator call.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs the job every `plan.interval` on the blocking pool until `shutdown`; missed ticks are
/// skipped, failures back off (doubling, capped at 32 intervals) and are logged once per
/// attempt with a running count.
pub async fn run(dir: PathBuf, plan: Plan, shutdown: CancellationToken) {
    let mut job = match tokio::task::spawn_blocking({
        let dir = dir.clone();
        let plan = plan.clone();
        move || Job::open(&dir, plan)
    })
    .await
    {
        Ok(Ok(j)) => Some(j),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "rollup job cannot open the store; rollups are off");
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "rollup job failed to start");
            return;
        }
    };
    let mut tick = tokio::time::interval(plan.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut failures = 0u32;
    let mut skip = 0u32;
    loop {
        tokio::select! {
            // Cancelling here loses nothing: a run in progress is awaited below, not here.
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if skip > 0 {
            skip -= 1;
            continue;
        }
        let Some(mut j) = job.take() else { return };
        let stop = shutdown.clone();
        let res = tokio::task::spawn_blocking(move || {
            let r = j.run_once(crate::now_ns(), &|| stop.is_cancelled());
            (j, r)
        })
        .await;
        match res {
            Ok((j, Ok(report))) => {
                job = Some(j);
                failures = 0;
                trim_heap();
                if report.points > 0 || report.evicted_chunks > 0 || report.evicted_rows > 0 {
                    tracing::info!(
                        points = report.points,
                        chunks = report.chunks,
                        evicted_chunks = report.evicted_chunks,
                        evicted_rows = report.evicted_rows,
                        db_bytes = report.db_bytes,
                        "rollup run"
                    );
                }
            }
            Ok((j, Err(e))) => {
                job = Some(j);
                failures += 1;
                skip = 2u32.saturating_pow(failures.min(5)) - 1;
                tracing::warn!(error = %e, failures, retry_in_intervals = skip + 1, "rollup run failed");
            }
            Err(e) => {
                tracing::error!(error = %e, "rollup run panicked; rollups are off until restart");
                return;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::Synchronous;
    use crate::model::{Batch, Line, Value};
    use crate::store::Writer;

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
        job.rollup(end, &|| false, &mut rep).unwrap();
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
                let mut steps: Vec<crate::engine::StepAcc> =
                    c.sets[0].1.values().cloned().collect();
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

    #[allow(clippy::type_complexity)]
    fn dump(
        dir: &Path,
    ) -> Vec<(
        i64,
        i64,
        i64,
        i64,
        f64,
        f64,
        f64,
        i64,
        f64,
        i64,
        f64,
        Vec<u8>,
    )> {
        let conn = Connection::open(db_path(dir)).unwrap();
        let mut st = conn
            .prepare("SELECT * FROM rollups ORDER BY tier, series_id, bucket")
            .unwrap();
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                    r.get(8)?,
                    r.get(9)?,
                    r.get(10)?,
                    r.get(11)?,
                ))
            })
            .unwrap();
        rows.map(|r| r.unwrap()).collect()
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
            .rollup(now, &|| false, &mut rep)
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
            .rollup(now, &stop, &mut rep_b)
            .unwrap();
        assert!(rep_b.interrupted);
        let mut rest = Report::default();
        Job::open(&b, plan.clone())
            .unwrap()
            .rollup(now, &|| false, &mut rest)
            .unwrap();
        assert_eq!(rep_b.points + rest.points, rep.points);
        // A rerun on a finished store changes nothing.
        let mut again = Report::default();
        Job::open(&b, plan)
            .unwrap()
            .rollup(now, &|| false, &mut again)
            .unwrap();
        assert_eq!(again.points, 0);
        assert_eq!(dump(&a), dump(&b));
        // Merged buckets (late points, resumed steps) are not counted twice.
        assert_rows_counted(&a, &plan_with(&["1m", "1h"], 7_000, 0));
        assert_rows_counted(&b, &plan_with(&["1m", "1h"], 7_000, 0));
        // The late points were merged into their minute and counted.
        let conn = Connection::open(db_path(&a)).unwrap();
        let (count, late): (i64, i64) = conn
            .query_row(
                "SELECT r.count, (SELECT late_points FROM rollup_state WHERE tier = 60) FROM rollups r \
                 JOIN series s ON s.id = r.series_id JOIN tagsets t ON t.id = s.tagset_id \
                 WHERE r.tier = 60 AND t.key = 'm,s=0' AND r.bucket = 0",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(count, 180 + 2);
        assert_eq!(late, 2);
    }

    /// The row count of every tier in the status equals the table's.
    fn assert_rows_counted(dir: &Path, plan: &Plan) {
        let conn = Connection::open(db_path(dir)).unwrap();
        let reader = Reader::open(dir).unwrap();
        let st = status(&reader, plan, 0).unwrap();
        for (i, t) in plan.tiers.iter().enumerate() {
            let n: i64 = conn
                .query_row(
                    "SELECT COUNT(*) FROM rollups WHERE tier = ?1",
                    [t.key()],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(st["tiers"][i]["rows"], n, "tier {}", t.name);
        }
    }

    fn chunk_ids(dir: &Path) -> Vec<i64> {
        let conn = Connection::open(db_path(dir)).unwrap();
        let mut st = conn.prepare("SELECT id FROM chunks ORDER BY id").unwrap();
        let ids = st.query_map([], |r| r.get(0)).unwrap();
        ids.map(|r| r.unwrap()).collect()
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

    #[test]
    fn the_budget_evicts_oldest_first_shrinks_the_file_and_counts_unforwarded_data() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), 100, Synchronous::Normal).unwrap();
        let mut r = rng(9);
        for s in 0..10 {
            let pts: Vec<(i64, f64)> = (0..60_000).map(|i| (i * NS, r() * 1000.0)).collect();
            write(&mut w, &format!("m,s={s}"), &pts);
        }
        let conn = Connection::open(db_path(dir.path())).unwrap();
        conn.execute(
            "INSERT INTO sinks (name, cursor_chunk_id) VALUES ('influx', 100)",
            [],
        )
        .unwrap();
        let before_ids = chunk_ids(dir.path());
        let newest = *before_ids.last().unwrap();
        let now = 60_000 * NS;
        let mut job = Job::open(dir.path(), plan_with(&["1m", "1h"], 100_000, 0)).unwrap();
        let full = job.run_once(now, &|| false).unwrap().db_bytes;
        let max = full / 2;
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
        let (chunks, through): (i64, i64) = conn
            .query_row(
                "SELECT evicted_unforwarded_chunks, evicted_through_chunk_id FROM sinks",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        let lost = before_ids
            .iter()
            .filter(|id| **id > 100 && !after.contains(id))
            .count();
        assert_eq!(chunks as usize, lost);
        assert!(lost == 0 || through > 100);
        let status = status(&reader, &job.plan, now).unwrap();
        assert_eq!(status["evicted"]["raw_chunks"], rep.evicted_chunks);
        assert_eq!(status["tiers"][0]["rows"], 10_000);
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
        assert_eq!(status(&reader, &plan, 0).unwrap()["tiers"][0]["rows"], 360);
        // Late points into existing buckets add no rows; one into a new minute adds one.
        write(&mut w, "m,s=0", &[(5 * NS, 1.0), (3 * HOUR, 2.0)]);
        job.run_once(3 * HOUR, &|| false).unwrap();
        assert_rows_counted(dir.path(), &plan);
        assert_eq!(status(&reader, &plan, 0).unwrap()["tiers"][0]["rows"], 361);
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
        {
            let conn = Connection::open(db_path(dir.path())).unwrap();
            conn.execute("DELETE FROM counters WHERE name LIKE 'rows_%'", [])
                .unwrap();
            conn.execute("DELETE FROM schema_migrations WHERE version >= 4", [])
                .unwrap();
            conn.execute("DROP TABLE clock_fix", []).unwrap();
            conn.pragma_update(None, "user_version", 3).unwrap();
        }
        drop(Writer::open(dir.path(), 100, Synchronous::Normal).unwrap());
        let reader = Reader::open(dir.path()).unwrap();
        let st = status(&reader, &plan, 0).unwrap();
        assert_eq!(st["tiers"][0]["rows"], 10);
        assert_eq!(st["tiers"][1]["rows"], 1);
        assert_rows_counted(dir.path(), &plan);
    }

    #[test]
    fn plan_validates_tiers_and_retention() {
        let p = Plan::new(&RollupConfig::default(), &RetentionConfig::default()).unwrap();
        assert_eq!(
            p.tiers
                .iter()
                .map(|t| (t.name.as_str(), t.key()))
                .collect::<Vec<_>>(),
            vec![("1m", 60), ("1h", 3600)]
        );
        assert_eq!(p.tiers[0].retention_ns, Some(30 * 86_400 * NS));
        let bad = RollupConfig {
            tiers: vec!["1m".into(), "60s".into()],
            ..Default::default()
        };
        assert!(Plan::new(&bad, &RetentionConfig::default()).is_err());
        let mut ret = RetentionConfig::default();
        ret.tiers
            .insert("5m".into(), Interval(Duration::from_secs(60)));
        let e = Plan::new(&RollupConfig::default(), &ret)
            .unwrap_err()
            .to_string();
        assert!(e.contains("5m"), "{e}");
    }

    #[test]
    fn retention_section_parses_tier_keys() {
        let r: RetentionConfig =
            toml::from_str("raw = \"1h\"\n1m = \"2d\"\nmax_bytes = 1000\n").unwrap();
        assert_eq!(r.raw.0, Duration::from_secs(3600));
        assert_eq!(r.tiers["1m"].0, Duration::from_secs(2 * 86_400));
        assert_eq!(r.tiers["1h"].0, Duration::from_secs(365 * 86_400));
        assert_eq!(r.max_bytes, 1000);
        assert!(toml::from_str::<RetentionConfig>("rwa = \"1h\"\n").is_err());
        assert!(toml::from_str::<RetentionConfig>("max_bytes = \"1\"\n").is_err());
    }
}
