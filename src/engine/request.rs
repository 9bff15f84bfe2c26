//! The words of a query as a user writes them — times, step, agg name, group-by list,
//! measurement and field — checked and turned into the typed values of [`AggQuery`](super::AggQuery)
//! and [`RawQuery`](crate::store::query::RawQuery), with the messages a user sees. Shared by
//! the HTTP parameters (`api::params`) and the command line, so both accept and refuse the same
//! things. It never reads a transport (a query string, flags): callers hand it the words.
//! An empty word counts as absent, except for times (an empty time is invalid).

use super::Agg;
use crate::timeparse::parse_time;

/// Default span of a query without `from`: the last hour.
pub const DEFAULT_RANGE_NS: i64 = 3_600 * 1_000_000_000;
/// Most points one raw query returns unless `limit` says otherwise.
pub const DEFAULT_LIMIT: usize = 100_000;

fn word(w: Option<&str>) -> Option<&str> {
    w.filter(|w| !w.is_empty())
}

/// The measurement, which every query needs.
pub fn measurement(m: Option<&str>) -> Result<String, String> {
    word(m)
        .map(String::from)
        .ok_or_else(|| "missing `measurement` parameter".into())
}

/// The optional field of a raw query.
pub fn field(f: Option<&str>) -> Option<String> {
    word(f).map(String::from)
}

/// The field of an aggregate query, which needs exactly one.
pub fn agg_field(f: Option<&str>) -> Result<String, String> {
    field(f).ok_or_else(|| "aggregate queries need `field` (one numeric field)".into())
}

/// Whether `step` or `agg` asks for an aggregate query (else: raw points).
pub fn is_agg(step: Option<&str>, agg: Option<&str>) -> bool {
    word(step).is_some() || word(agg).is_some()
}

/// `[from, to]` in ns from times as written (see [`crate::timeparse`]): `to` defaults to
/// `now`, `from` to [`DEFAULT_RANGE_NS`] before `to`; `from` may not be after `to`.
pub fn time_range(from: Option<&str>, to: Option<&str>, now: i64) -> Result<(i64, i64), String> {
    let to = match to {
        Some(t) => parse_time(t, now).map_err(|e| e.to_string())?,
        None => now,
    };
    let from = match from {
        Some(t) => parse_time(t, now).map_err(|e| e.to_string())?,
        None => to.saturating_sub(DEFAULT_RANGE_NS),
    };
    if from > to {
        return Err(format!("`from` ({from}) is after `to` ({to})"));
    }
    Ok((from, to))
}

/// The agg to compute and its name as asked (echoed in the answer); `mean` when absent.
pub fn agg(a: Option<&str>) -> Result<(Agg, String), String> {
    let name = word(a).unwrap_or("mean");
    Ok((Agg::parse(name)?, name.to_string()))
}

/// Parses `step` (`1m`, `30s`, `1h`, or integer nanoseconds).
pub fn parse_step(s: &str) -> Result<i64, String> {
    if let Ok(n) = s.parse::<i64>() {
        if n > 0 {
            return Ok(n);
        }
    }
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("invalid step {s:?}: {e} (write e.g. 1m, 1h)"))?;
    let ns = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    if ns <= 0 {
        return Err("`step` must be greater than zero".into());
    }
    Ok(ns)
}

/// The step in ns: as written, or one step over the whole of `[from, to]` when absent.
pub fn step(s: Option<&str>, from: i64, to: i64) -> Result<i64, String> {
    match word(s) {
        Some(s) => parse_step(s),
        None => Ok(to.saturating_sub(from).saturating_add(1).max(1)),
    }
}

/// The tag keys to group by (`a,b`; blanks dropped, so an empty list merges everything).
pub fn group_by(g: &str) -> Vec<String> {
    g.split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: i64 = 1_000_000_000;

    #[test]
    fn empty_words_are_absent_except_times() {
        assert!(measurement(Some("")).is_err());
        assert_eq!(field(Some("")), None);
        assert!(agg_field(Some("")).is_err());
        assert!(!is_agg(Some(""), Some("")));
        assert!(is_agg(None, Some("p99")));
        assert_eq!(agg(Some("")).unwrap(), (Agg::Mean, "mean".to_string()));
        assert!(time_range(Some(""), None, 0).is_err());
    }

    #[test]
    fn ranges_default_to_the_last_hour_and_keep_their_order() {
        let now = 10 * DEFAULT_RANGE_NS;
        assert_eq!(
            time_range(None, None, now),
            Ok((now - DEFAULT_RANGE_NS, now))
        );
        assert_eq!(time_range(Some("0"), Some("100"), now), Ok((0, 100)));
        assert_eq!(
            time_range(Some("100"), Some("50"), now),
            Err("`from` (100) is after `to` (50)".to_string())
        );
    }

    #[test]
    fn steps_and_groups() {
        assert_eq!(parse_step("1m"), Ok(60 * NS));
        assert_eq!(parse_step("5"), Ok(5));
        assert!(parse_step("0").is_err());
        assert!(parse_step("abc").is_err());
        assert_eq!(step(None, 10, 19), Ok(10));
        assert_eq!(step(Some(""), 10, 10), Ok(1));
        assert_eq!(group_by(" a, ,b "), vec!["a".to_string(), "b".to_string()]);
        assert!(group_by("").is_empty());
    }
}
