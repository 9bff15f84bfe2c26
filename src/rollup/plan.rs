//! The validated plan the job and the query engine share: tiers (resolution and retention,
//! finest first), raw retention, lateness, batch size, budget and the clock floor, from
//! `[rollup]`, `[retention]` and `[clock]`. Pure: no store, no clock reads.

use std::time::Duration;

use super::config::{RetentionConfig, RollupConfig};
use super::RollupError;

pub(crate) const NS: i64 = 1_000_000_000;

/// One downsampling tier.
#[derive(Debug, Clone, PartialEq)]
pub struct Tier {
    /// Name as configured (`1m`).
    pub name: String,
    /// Resolution, ns (a whole number of seconds).
    pub res_ns: i64,
    /// Retention, ns; `None` keeps rows until the budget needs the space.
    pub retention_ns: Option<i64>,
    /// Whether a sink reads this tier's rows as they become final (`forward =
    /// "rollup:1m"`, or `histograms = true` for the 1-minute sketches): such a tier is
    /// folded promptly ([`Tier::prompt_fold_every_ns`]), the others every `[rollup]
    /// fold_every` ([`Plan::fold_every_ns`]).
    pub forwarded: bool,
}

impl Tier {
    /// The `rollups.tier` key: resolution in seconds.
    pub fn key(&self) -> i64 {
        self.res_ns / NS
    }

    /// How often the agent's periodic job, running every `interval_ns`, folds this tier when
    /// a sink waits for its rows: a twelfth of its resolution but at least two runs, never
    /// longer than the resolution, at most 10 minutes (at the default 30 s: 10s every run,
    /// 1m every minute, 1h every 5 minutes, 1d every 10 minutes). Each fold rewrites the
    /// open bucket of every active series, about a page per series.
    pub fn prompt_fold_every_ns(&self, interval_ns: i64) -> i64 {
        (self.res_ns / 12)
            .max(interval_ns.saturating_mul(2))
            .min(self.res_ns)
            .min(600 * NS)
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
    /// `[rollup] fold_every`, ns.
    pub fold_every_ns: i64,
    /// Whether the agent runs the job.
    pub enabled: bool,
    /// The earliest time a set clock can read (`[clock] min_valid`), ns.
    pub clock_floor_ns: i64,
    /// Whether every run checkpoints and truncates the WAL. Set for `[storage] synchronous =
    /// "normal"`, where that checkpoint is what syncs acknowledged writes within a run
    /// interval (docs/storage.md). In `full` every commit is synced already, and a
    /// checkpoint each run only rewrites the same hot pages into the database file again:
    /// write wear for nothing, so the job shrinks only when it gives space back.
    pub checkpoint_each_run: bool,
    /// Tiers of at least this resolution are settled (their final buckets moved from
    /// `rollups_recent` into the series-keyed `rollups`, see `Job::settle`); finer ones
    /// keep their rows keyed by time. Default [`SETTLE_FROM_NS`].
    pub settle_from_ns: i64,
    /// How long after its end the agent's job takes a bucket for closed
    /// (`Job::open_buckets`): the writer's hold (`[ingest] flush_interval`) plus
    /// [`CLOSE_SLACK_NS`], ns.
    pub close_margin_ns: i64,
}

/// The finest resolution whose rows [`Plan::settle_from_ns`] moves into `rollups` by default:
/// an hour. Moving a tier's rows writes each of them a second time, the last page of each
/// series' range and its split, plus the checkpoint's copy: for the 1m tier, the bulk of what
/// the store grows by, 45 % of the rollup job's pages on a store ten hours old
/// (`rollup::tests::on_an_aged_store_the_minute_tier_costs_its_fold_and_no_second_write`). Its rows are read by
/// point reads per bucket and series instead (43,200 buckets for a month of one series),
/// and retention deletes its oldest buckets as whole pages. Hourly and coarser tiers still
/// settle: a year of them is read as one range per series.
pub const SETTLE_FROM_NS: i64 = 3600 * NS;

/// The longest a tier no sink reads waits between folds because its buckets are longer than
/// `[rollup] fold_every` ([`Plan::fold_every_ns`]): an hour. A tier whose buckets are at most
/// this long folds each bucket once, when it has closed (`Job::open_buckets`): the 1h tier,
/// which at the prompt cadence rewrote every active series' row of the open hour every 5
/// minutes, twelve times an hour, about 1.2 MB/h of WAL on the reference workload for rows
/// that end up the same (docs/performance.md). Reads lose nothing: past such a tier's
/// cursor, a query reads the finer tier's rows (the 1m tier's) and only the raw chunks past
/// that one's cursor (`engine::source`'s `finer_from`), not an hour of raw points. Small
/// chunks are merged once every tier's cursor has passed them (`store::compact`), so up to
/// an hour later than at the prompt cadence; the merges cost the same. A coarser tier (1d)
/// folds its open bucket hourly.
pub const COARSE_FOLD_EVERY_NS: i64 = 3600 * NS;

/// The shortest `[rollup] fold_every` at which tiers up to [`COARSE_FOLD_EVERY_NS`] fold each
/// bucket once: a minute, the default. A shorter one (tests, a demo that wants the tiers'
/// open buckets in the status at once) keeps every tier at its prompt cadence
/// ([`Tier::prompt_fold_every_ns`]: the 1m tier every 5 s at a 1 s interval, the 1h tier
/// every 5 minutes), open buckets included.
pub const ONCE_A_BUCKET_FROM_NS: i64 = 60 * NS;

/// What [`Plan::close_margin_ns`] adds to the writer's hold: clients send their points a
/// second or so after they stamp them. Points that come later still fold, into the stored
/// row (written again).
pub const CLOSE_SLACK_NS: i64 = 10 * NS;

/// [`Plan::close_margin_ns`] for a writer holding points up to `hold`.
fn close_margin_ns(hold: Duration) -> i64 {
    dur_ns(hold).saturating_add(CLOSE_SLACK_NS)
}

fn dur_ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl Plan {
    /// How often the agent's periodic job folds `tier`. A tier a sink reads: promptly
    /// ([`Tier::prompt_fold_every_ns`]). Any other: every `[rollup] fold_every`, or, from a
    /// `fold_every` of [`ONCE_A_BUCKET_FROM_NS`] (the default, 1 min), once a bucket when its
    /// buckets are longer, up to [`COARSE_FOLD_EVERY_NS`] (the 1h tier folds each hour once,
    /// when it has closed; a 1d tier its open day every hour); at most every quarter of the
    /// raw retention (so the raw points are still there), never more often than promptly. A
    /// shorter `fold_every` asks for fresh tiers: each folds its open bucket promptly. A
    /// longer stride writes each tier's leaf pages less often (rows are keyed by series: a fold writes at
    /// least a page per active series and tier whatever span it covers) but did not lower
    /// the reference workload's bytes written (docs/performance.md), raised its RSS peak,
    /// and makes queries and alert rules merge a longer raw tail (a 1 h stride cost 1.7x the
    /// alert evaluation CPU in `cargo bench --bench alerts`). Nothing is lost either way:
    /// reads take the raw chunks past a tier's cursor, and the rows end up the same.
    pub fn fold_every_ns(&self, tier: &Tier) -> i64 {
        let prompt = tier.prompt_fold_every_ns(dur_ns(self.interval));
        if tier.forwarded {
            return prompt;
        }
        let quarter = self.raw_retention_ns / 4;
        let every = self.fold_every_ns.min(quarter).max(prompt);
        if self.fold_every_ns < ONCE_A_BUCKET_FROM_NS {
            return every;
        }
        every.max(tier.res_ns.min(COARSE_FOLD_EVERY_NS).min(quarter))
    }

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
                forwarded: false,
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
            fold_every_ns: dur_ns(rollup.fold_every.0),
            enabled: rollup.enabled,
            clock_floor_ns: crate::clock::ClockConfig::default().floor_ns(),
            checkpoint_each_run: false,
            settle_from_ns: SETTLE_FROM_NS,
            close_margin_ns: close_margin_ns(
                crate::config::IngestConfig::default().flush_interval.0,
            ),
        })
    }

    /// From the whole config.
    pub fn from_config(cfg: &crate::config::Config) -> Result<Plan, RollupError> {
        let mut plan = Plan::new(&cfg.rollup, &cfg.retention)?;
        plan.clock_floor_ns = cfg.clock.floor_ns();
        plan.checkpoint_each_run = cfg.storage.synchronous == crate::config::Synchronous::Normal;
        plan.close_margin_ns = close_margin_ns(cfg.ingest.flush_interval.0);
        for s in cfg.sink.iter().filter(|s| s.enabled) {
            let tiers = [
                s.forward.tier_s(),
                s.histograms()
                    .then_some(crate::forward::rollup::SKETCH_TIER_S),
            ];
            for key in tiers.into_iter().flatten() {
                if let Some(t) = plan.tiers.iter_mut().find(|t| t.key() == key) {
                    t.forwarded = true;
                }
            }
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::values::Interval;

    /// A tier some enabled sink reads (`forward = "rollup:..."`, or the 1-minute sketches
    /// of `histograms = true`) is folded promptly; a disabled sink does not count.
    #[test]
    fn tiers_a_sink_reads_are_marked_forwarded() {
        let forwarded = |toml: &str| -> Vec<bool> {
            let cfg = crate::config::Config::from_toml_str(toml, "test").unwrap();
            let plan = Plan::from_config(&cfg).unwrap();
            plan.tiers.iter().map(|t| t.forwarded).collect()
        };
        assert_eq!(forwarded(""), vec![false, false]);
        let sink = |extra: &str| {
            format!(
                "[[sink]]\nname = \"a\"\ntype = \"prometheus_remote_write\"\n\
                 url = \"http://127.0.0.1:1/api/v1/write\"\n{extra}"
            )
        };
        assert_eq!(forwarded(&sink("")), vec![false, false]);
        assert_eq!(
            forwarded(&sink("forward = \"rollup:1h\"\n")),
            vec![false, true]
        );
        assert_eq!(forwarded(&sink("histograms = true\n")), vec![true, false]);
        assert_eq!(
            forwarded(&sink("histograms = true\nenabled = false\n")),
            vec![false, false]
        );
    }

    /// The job takes a bucket for closed once the writer's hold and the slack have passed:
    /// the hold comes from `[ingest] flush_interval`, so a longer hold never has the 1m
    /// tier fold a minute before its held points are committed (and write it again).
    #[test]
    fn a_bucket_closes_after_the_writers_hold_and_the_slack() {
        let margin = |toml: &str| {
            let cfg = crate::config::Config::from_toml_str(toml, "test").unwrap();
            Plan::from_config(&cfg).unwrap().close_margin_ns / NS
        };
        assert_eq!(margin(""), 25);
        assert_eq!(margin("[ingest]\nflush_interval = \"5s\"\n"), 15);
        assert_eq!(margin("[ingest]\nflush_interval = \"60s\"\n"), 70);
        let default = Plan::new(&RollupConfig::default(), &RetentionConfig::default()).unwrap();
        assert_eq!(default.close_margin_ns / NS, 25);
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
}
