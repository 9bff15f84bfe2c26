//! Time arguments of the query API and CLI: RFC 3339 timestamps, integer epoch
//! nanoseconds, `now`, and durations relative to now such as `-15m` or `-2h30m`. Pure; the
//! current time is an argument.

/// A time argument that could not be understood.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid time {input:?}: use an RFC 3339 timestamp (2026-12-02T10:00:00Z), epoch nanoseconds, `now`, or a relative duration such as -15m")]
pub struct TimeError {
    /// What was given.
    pub input: String,
}

/// Parses a time argument into epoch nanoseconds.
pub fn parse_time(s: &str, now_ns: i64) -> Result<i64, TimeError> {
    let err = || TimeError {
        input: s.to_string(),
    };
    let t = s.trim();
    if t.eq_ignore_ascii_case("now") {
        return Ok(now_ns);
    }
    if let Ok(n) = t.parse::<i64>() {
        return Ok(n);
    }
    if let Some(rest) = t.strip_prefix('-').or_else(|| t.strip_prefix('+')) {
        let d = humantime::parse_duration(rest.trim()).map_err(|_| err())?;
        let d = i64::try_from(d.as_nanos()).map_err(|_| err())?;
        return if t.starts_with('-') {
            now_ns.checked_sub(d).ok_or_else(err)
        } else {
            now_ns.checked_add(d).ok_or_else(err)
        };
    }
    parse_rfc3339(t)
}

/// Parses an RFC 3339 timestamp (`2026-12-02T10:00:00Z`, any offset) into epoch nanoseconds.
pub fn parse_rfc3339(s: &str) -> Result<i64, TimeError> {
    let err = || TimeError {
        input: s.to_string(),
    };
    let dt = chrono::DateTime::parse_from_rfc3339(s.trim()).map_err(|_| err())?;
    dt.timestamp_nanos_opt().ok_or_else(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_000_000_000_000_000;

    #[test]
    fn accepts_every_documented_form() {
        assert_eq!(parse_time("now", NOW), Ok(NOW));
        assert_eq!(parse_time("123", NOW), Ok(123));
        assert_eq!(parse_time("-15m", NOW), Ok(NOW - 900_000_000_000));
        assert_eq!(parse_time("-1h 30m", NOW), Ok(NOW - 5_400_000_000_000));
        assert_eq!(
            parse_time("2026-12-02T10:00:00Z", NOW),
            Ok(1_796_205_600_000_000_000)
        );
        assert_eq!(
            parse_time("2026-12-02T12:00:00.5+02:00", NOW),
            Ok(1_796_205_600_500_000_000)
        );
    }

    #[test]
    fn rejects_garbage_with_a_helpful_message() {
        let e = parse_time("yesterday", NOW).unwrap_err();
        assert!(e.to_string().contains("RFC 3339"));
        assert!(parse_time("-", NOW).is_err());
        assert!(parse_time("-9999999999d", NOW).is_err());
    }
}
