//! `[clock]`: the floor below which the device's clock counts as not set (see
//! [`crate::clock`] for what the agent does then). Parsing only; it never reads the clock.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NS: i64 = 1_000_000_000;

/// When this binary was built, Unix seconds (`SOURCE_DATE_EPOCH` if the build set it).
pub fn build_unix_s() -> i64 {
    env!("EW_BUILD_UNIX_S").parse().unwrap_or(0)
}

/// `[clock]`
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClockConfig {
    /// The earliest time the clock can truly read (RFC 3339); unset: the build time.
    #[serde(skip_serializing_if = "Option::is_none")]
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

/// An RFC 3339 time in the config (`"2026-01-01T00:00:00Z"`); serializes as written.
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

impl Serialize for Rfc3339 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}
