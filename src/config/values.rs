//! The small value types every config section shares: [`Interval`], a duration written the
//! humantime way (`"10s"`, `"1m 30s"`, `"30d"`), and [`Secret`], a token or password whose
//! `Debug` never shows it. Both read and write themselves with serde, so a section derives
//! `Deserialize` and `Serialize` and the effective config prints back as TOML that loads to
//! the same values. A leaf: it imports nothing else from the crate, so any module may use it
//! without closing an import cycle; it never reads files or the environment.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written the humantime way. Zero is refused when read unless `ALLOW_ZERO`
/// (spelled [`Delay`]): the one place that rule lives. `Interval` alone, the default, is the
/// non-zero kind every periodic task's `interval` needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Interval<const ALLOW_ZERO: bool = false>(pub Duration);

/// A duration where zero means something ("send at once"): a sink's `max_delay`,
/// `timeout`, backoff bounds and `keepalive`.
pub type Delay = Interval<true>;

/// Why a duration text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a humantime duration.
    #[error("invalid duration {text:?}: {reason}")]
    Invalid {
        /// As written.
        text: String,
        /// humantime's reason.
        reason: String,
    },
    /// Zero where a positive duration is needed.
    #[error("duration must be greater than zero")]
    Zero,
}

impl<const ALLOW_ZERO: bool> Interval<ALLOW_ZERO> {
    /// Parses `"10s"`-style text, refusing zero unless `ALLOW_ZERO`.
    pub fn parse(text: &str) -> Result<Self, DurationError> {
        let d = humantime::parse_duration(text).map_err(|e| DurationError::Invalid {
            text: text.to_string(),
            reason: e.to_string(),
        })?;
        if d.is_zero() && !ALLOW_ZERO {
            return Err(DurationError::Zero);
        }
        Ok(Interval(d))
    }
}

impl<'de, const ALLOW_ZERO: bool> Deserialize<'de> for Interval<ALLOW_ZERO> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(|e| match e {
            DurationError::Invalid { .. } => {
                serde::de::Error::custom(format!("{e} (write e.g. \"10s\")"))
            }
            DurationError::Zero => serde::de::Error::custom(e),
        })
    }
}

impl<const ALLOW_ZERO: bool> Serialize for Interval<ALLOW_ZERO> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

/// A secret string (a token, a password): its `Debug` prints `"<redacted>"` (or `""` when
/// unset), never the value. It serializes as itself, so the effective config reloads with
/// it; print a config with `Debug`, never serialized, where a person may read it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

thread_local! {
    /// Set while [`redacted`] serializes: every non-empty [`Secret`] writes `<redacted>`.
    static REDACTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` (a serialization) with every non-empty [`Secret`] written as `"<redacted>"`:
/// what `GET /api/v1/config` shows. Outside it a secret serializes as itself (the env layer
/// and the reload compare reload it).
pub fn redacted<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            REDACTING.with(|r| r.set(self.0));
        }
    }
    let _reset = Reset(REDACTING.with(|r| r.replace(true)));
    f()
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !self.0.is_empty() && REDACTING.with(|r| r.get()) {
            s.serialize_str("<redacted>")
        } else {
            s.serialize_str(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A string; an all-digit token from the environment arrives as an integer.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            I(i64),
        }
        Ok(Secret(match Raw::deserialize(d)? {
            Raw::S(s) => s,
            Raw::I(i) => i.to_string(),
        }))
    }
}

impl Secret {
    /// Wraps a value.
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The value itself, for comparing and sending; never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when unset.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "\"<redacted>\""
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    struct T {
        i: Option<Interval>,
        d: Option<Delay>,
        s: Option<Secret>,
    }

    fn parse(text: &str) -> Result<T, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn secrets_are_redacted_only_inside_redacted() {
        let t = T {
            i: None,
            d: None,
            s: Some(Secret::new("pw")),
        };
        let plain = toml::to_string(&t).unwrap();
        let hidden = redacted(|| toml::to_string(&t).unwrap());
        assert!(plain.contains("\"pw\""), "{plain}");
        assert!(
            hidden.contains("<redacted>") && !hidden.contains("\"pw\""),
            "{hidden}"
        );
        assert!(toml::to_string(&t).unwrap().contains("\"pw\""));
    }

    #[test]
    fn zero_is_refused_only_where_it_means_nothing() {
        let e = parse("i = \"0s\"").unwrap_err();
        assert!(e.contains("duration must be greater than zero"), "{e}");
        assert_eq!(
            parse("d = \"0s\"").unwrap().d,
            Some(Interval(Duration::ZERO))
        );
        assert_eq!(
            parse("i = \"1m 30s\"").unwrap().i,
            Some(Interval(Duration::from_secs(90)))
        );
        for text in ["i = \"soon\"", "d = \"soon\""] {
            let e = parse(text).unwrap_err();
            assert!(
                e.contains("invalid duration \"soon\"") && e.contains("write e.g. \"10s\""),
                "{e}"
            );
        }
        assert_eq!(Interval::<false>::parse("0ms"), Err(DurationError::Zero));
    }

    #[test]
    fn durations_and_secrets_print_back_to_the_same_values() {
        let t = T {
            i: Some(Interval(Duration::from_secs(365 * 86_400 + 1))),
            d: Some(Interval(Duration::from_millis(250))),
            s: Some(Secret::new("pw")),
        };
        let text = toml::to_string(&t).unwrap();
        assert_eq!(parse(&text).unwrap(), t, "{text}");
    }

    #[test]
    fn secrets_are_redacted_and_integers_become_strings() {
        let t = parse("s = 123456").unwrap();
        assert_eq!(t.s.as_ref().map(Secret::expose), Some("123456"));
        let t = parse("s = \"s3cret\"").unwrap();
        let dbg = format!("{t:?}");
        assert!(
            !dbg.contains("s3cret") && dbg.contains("<redacted>"),
            "{dbg}"
        );
        assert_eq!(format!("{:?}", Secret::default()), "\"\"");
    }
}
