//! `[rollup]` and `[retention]`: the job's configuration as written in the config file.
//! `[retention]` has a hand-written deserializer because its keys are the tier names the user
//! chose (`1m = "30d"`), layered per key over the defaults. Validation into a [`super::Plan`]
//! happens in `plan.rs`; this file never touches the store.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::values::{DurationError, Interval};

/// `[rollup]`
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
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
    /// Most raw points folded or merged per transaction.
    pub batch_points: usize,
    /// How often a tier no sink reads is folded (see [`super::Plan::fold_every_ns`]).
    pub fold_every: Interval,
}

impl Default for RollupConfig {
    fn default() -> Self {
        RollupConfig {
            enabled: true,
            interval: Interval(Duration::from_secs(30)),
            lateness: Interval(Duration::from_secs(600)),
            tiers: vec!["1m".into(), "1h".into()],
            batch_points: 100_000,
            fold_every: Interval(Duration::from_secs(60)),
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

/// `s` as a retention for `key`: the messages name the key.
fn parse_interval(key: &str, s: &str) -> Result<Interval, String> {
    Interval::parse(s).map_err(|e| match e {
        DurationError::Invalid { reason, .. } => {
            format!("invalid duration {s:?} for `{key}`: {reason} (write e.g. \"30d\")")
        }
        DurationError::Zero => format!("`{key}` must be greater than zero"),
    })
}

impl Serialize for RetentionConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.tiers.len() + 2))?;
        m.serialize_entry("raw", &self.raw)?;
        for (tier, keep) in &self.tiers {
            m.serialize_entry(tier, keep)?;
        }
        m.serialize_entry("max_bytes", &self.max_bytes)?;
        m.end()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let e = toml::from_str::<RetentionConfig>("1m = \"0s\"\n").unwrap_err();
        assert!(
            e.to_string().contains("`1m` must be greater than zero"),
            "{e}"
        );
        let e = toml::from_str::<RetentionConfig>("raw = \"soon\"\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("invalid duration \"soon\" for `raw`"),
            "{e}"
        );
        // It prints back as the table it was read from.
        let text = toml::to_string(&r).unwrap();
        assert_eq!(
            toml::from_str::<RetentionConfig>(&text).unwrap(),
            r,
            "{text}"
        );
    }
}
