//! The query-string parameters of `/api/v1/query` and `/api/v1/inference` (`measurement`,
//! `field`, `tag.k=v`, `from`, `to`, `limit`, `step`, `agg`, `group_by`, `model`) turned
//! into the typed queries of the store and the engine. The words themselves are checked by
//! [`crate::engine::request`], which the command line shares; this module only reads them out
//! of the query string. It never runs a query. Also the listing's parameters (`measurement`,
//! `match`, `limit`, `cursor`) and the answer-size bound every query is held to.

use std::collections::HashMap;

use crate::engine::request::{self, DEFAULT_LIMIT};
use crate::engine::{AggQuery, InferenceQuery};
use crate::store::query::{RawQuery, SeriesFilter};

/// Series per page of `/api/v1/series` when `limit` is not given.
pub const SERIES_PAGE: usize = 1_000;
/// Most series per page of `/api/v1/series` (and entries of `/api/v1/fields`).
pub const MAX_SERIES_PAGE: usize = 10_000;
/// Most points one raw query answers: a larger `limit` is cut to this (the answer says
/// `truncated: true`); at most [`crate::store::query::MAX_RAW_SERIES`] series, likewise.
pub const MAX_RAW_POINTS: usize = 200_000;
/// Most series an aggregate query reads (tag sets matching measurement, field and tags):
/// past it the query is refused (400), before anything is read.
pub const MAX_AGG_SERIES: usize = 5_000;
/// Most series read x steps of an aggregate query: past it the query is refused (400).
pub const MAX_AGG_VALUES: usize = 50_000;

/// The opaque `cursor` of the page after `(key, field)`.
pub fn cursor(key: &str, field: &str) -> String {
    use base64::Engine;
    let raw = serde_json::json!([key, field]).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn parse_cursor(c: &str) -> Option<(String, String)> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(c)
        .ok()?;
    serde_json::from_slice(&raw).ok()
}

/// `/api/v1/series`: `measurement`, `match` (words, each of which must appear in
/// `measurement,tag=value,... field`, any case), `limit` (default [`SERIES_PAGE`], at most
/// [`MAX_SERIES_PAGE`]) and `cursor` (the previous page's `next`).
pub fn series_filter_from_params(params: &HashMap<String, String>) -> Result<SeriesFilter, String> {
    let limit = match get(params, "limit").filter(|l| !l.is_empty()) {
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_SERIES_PAGE).contains(&n) => n,
            _ => {
                return Err(format!(
                    "invalid limit {l:?}: expected 1 to {MAX_SERIES_PAGE} series per page"
                ))
            }
        },
        None => SERIES_PAGE,
    };
    let after = match get(params, "cursor").filter(|c| !c.is_empty()) {
        Some(c) => Some(parse_cursor(c).ok_or_else(|| {
            format!("invalid cursor {c:?}: pass the `next` of the previous page as it came")
        })?),
        None => None,
    };
    Ok(SeriesFilter {
        measurement: request::field(get(params, "measurement")),
        words: get(params, "match")
            .unwrap_or("")
            .split_whitespace()
            .take(16)
            .map(String::from)
            .collect(),
        after,
        limit,
    })
}

/// Checks the size of an aggregate answer before it is computed: at most
/// [`MAX_AGG_SERIES`] series read, and `series` x the steps of `[from, to]` within
/// [`MAX_AGG_VALUES`]; the error says how to narrow the query.
pub fn answer_size(series: usize, from: i64, to: i64, step_ns: i64) -> Result<(), String> {
    let steps = (to.saturating_sub(from) / step_ns.max(1))
        .saturating_add(1)
        .max(1) as u128;
    let values = steps.saturating_mul(series as u128);
    if series > MAX_AGG_SERIES || values > MAX_AGG_VALUES as u128 {
        return Err(format!(
            "this query would read {series} series x {steps} steps = {values} values, more than \
             the limit of {MAX_AGG_SERIES} series and {MAX_AGG_VALUES} values: narrow it with \
             tag.K=V, a larger `step` or a shorter range"
        ));
    }
    Ok(())
}

fn get<'a>(params: &'a HashMap<String, String>, key: &str) -> Option<&'a str> {
    params.get(key).map(String::as_str)
}

/// A raw-points query; `tag.k=v` parameters become its tags, sorted.
pub fn raw_query_from_params(
    params: &HashMap<String, String>,
    now: i64,
) -> Result<RawQuery, String> {
    let measurement = request::measurement(get(params, "measurement"))?;
    let (from, to) = request::time_range(get(params, "from"), get(params, "to"), now)?;
    let limit = match params.get("limit") {
        Some(l) => l
            .parse()
            .map_err(|_| format!("invalid limit {l:?}: expected a positive integer"))?,
        None => DEFAULT_LIMIT,
    };
    // Past the bound the answer is cut (`truncated: true`), never allocated.
    let limit = limit.min(MAX_RAW_POINTS);
    let mut tags: Vec<(String, String)> = params
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("tag.").map(|t| (t.to_string(), v.clone())))
        .collect();
    tags.sort();
    Ok(RawQuery {
        measurement,
        field: request::field(get(params, "field")),
        tags,
        from,
        to,
        limit,
    })
}

/// An aggregate query (raw-query parameters plus `step`, `agg`, `group_by`); `None` when
/// neither `step` nor `agg` is given (a raw query).
pub fn agg_query_from_params(
    params: &HashMap<String, String>,
    now: i64,
) -> Result<Option<AggQuery>, String> {
    let (step, agg) = (get(params, "step"), get(params, "agg"));
    if !request::is_agg(step, agg) {
        return Ok(None);
    }
    let raw = raw_query_from_params(params, now)?;
    let field = request::agg_field(raw.field.as_deref())?;
    let (agg, agg_name) = request::agg(agg)?;
    let step_ns = request::step(step, raw.from, raw.to)?;
    Ok(Some(AggQuery {
        measurement: raw.measurement,
        field,
        tags: raw.tags,
        group_by: get(params, "group_by").map(request::group_by),
        from: raw.from,
        to: raw.to,
        step_ns,
        agg,
        agg_name,
    }))
}

/// `model`, `from`, `to` (as for `/api/v1/query`) and `step` (default: one step over the
/// whole range).
pub fn inference_query_from_params(
    params: &HashMap<String, String>,
    now: i64,
) -> Result<InferenceQuery, String> {
    let mut p = params.clone();
    p.insert("measurement".into(), "inference".into());
    let raw = raw_query_from_params(&p, now)?;
    Ok(InferenceQuery {
        model: request::field(get(params, "model")),
        from: raw.from,
        to: raw.to,
        step_ns: request::step(get(params, "step"), raw.from, raw.to)?,
    })
}

// ---- incidents (`/api/v1/incidents`) ----

/// Incidents per answer of `/api/v1/incidents` when `limit` is not given.
pub const INCIDENTS_PAGE: usize = 100;
/// Most incidents one answer lists.
pub const MAX_INCIDENTS_PAGE: usize = 1_000;
/// The span `/api/v1/incidents` lists without `from`: the last 7 days.
pub const INCIDENTS_RANGE_NS: i64 = 7 * 86_400 * 1_000_000_000;

/// `/api/v1/incidents`: `from`, `to` (as for `/api/v1/query`; `from` defaults to 7 days
/// before `to`) and `limit` (default [`INCIDENTS_PAGE`], at most [`MAX_INCIDENTS_PAGE`]).
pub fn incidents_from_params(
    params: &HashMap<String, String>,
    now: i64,
) -> Result<(i64, i64, usize), String> {
    let from_word = get(params, "from").filter(|f| !f.is_empty());
    let (from, to) = request::time_range(from_word, get(params, "to"), now)?;
    let from = if from_word.is_none() {
        to.saturating_sub(INCIDENTS_RANGE_NS)
    } else {
        from
    };
    let limit = match get(params, "limit").filter(|l| !l.is_empty()) {
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_INCIDENTS_PAGE).contains(&n) => n,
            _ => {
                return Err(format!(
                    "invalid limit {l:?}: expected 1 to {MAX_INCIDENTS_PAGE} incidents"
                ))
            }
        },
        None => INCIDENTS_PAGE,
    };
    Ok((from, to, limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Agg;

    const NS: i64 = 1_000_000_000;

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn incidents_params_default_to_a_week_and_bound_the_limit() {
        let now = 10 * INCIDENTS_RANGE_NS;
        let (from, to, limit) = incidents_from_params(&params(&[]), now).unwrap();
        assert_eq!(
            (from, to, limit),
            (now - INCIDENTS_RANGE_NS, now, INCIDENTS_PAGE)
        );
        let p = params(&[("from", "5"), ("to", "9"), ("limit", "3")]);
        assert_eq!(incidents_from_params(&p, now).unwrap(), (5, 9, 3));
        assert!(incidents_from_params(&params(&[("limit", "0")]), now).is_err());
        assert!(incidents_from_params(&params(&[("limit", "5000")]), now).is_err());
        assert!(incidents_from_params(&params(&[("from", "9"), ("to", "5")]), now).is_err());
    }

    #[test]
    fn agg_params() {
        let p = params(&[
            ("measurement", "m"),
            ("field", "v"),
            ("step", "1m"),
            ("agg", "p999"),
            ("group_by", "model"),
            ("from", "0"),
            ("to", "100"),
        ]);
        let q = agg_query_from_params(&p, 1000).unwrap().unwrap();
        assert_eq!((q.step_ns, q.agg), (60 * NS, Agg::Quantile(0.999)));
        assert_eq!(q.group_by, Some(vec!["model".to_string()]));
        let mut raw = p.clone();
        raw.remove("step");
        raw.remove("agg");
        assert!(agg_query_from_params(&raw, 1000).unwrap().is_none());
        let mut nofield = p;
        nofield.remove("field");
        assert!(agg_query_from_params(&nofield, 1000).is_err());
    }

    #[test]
    fn raw_params_sort_tags_and_check_the_limit() {
        let p = params(&[
            ("measurement", "m"),
            ("tag.b", "2"),
            ("tag.a", "1"),
            ("limit", "5"),
        ]);
        let q = raw_query_from_params(&p, 10 * NS).unwrap();
        assert_eq!(
            q.tags,
            vec![("a".into(), "1".into()), ("b".into(), "2".into())]
        );
        assert_eq!((q.limit, q.to), (5, 10 * NS));
        // Past the answer bound a limit is cut to it (the answer says `truncated`).
        let huge = params(&[("measurement", "m"), ("limit", "100000000000")]);
        assert_eq!(
            raw_query_from_params(&huge, 0).unwrap().limit,
            MAX_RAW_POINTS
        );
        let bad = params(&[("measurement", "m"), ("limit", "-1")]);
        assert!(raw_query_from_params(&bad, 0)
            .unwrap_err()
            .contains("invalid limit"));
    }

    #[test]
    fn answer_size_counts_series_times_steps() {
        assert!(answer_size(5_000, 0, 0, 1).is_ok());
        assert!(answer_size(5_001, 0, 0, 1).is_err());
        assert!(answer_size(1_000, 0, 49 * NS, NS).is_ok());
        let e = answer_size(1_000, 0, 50 * NS, NS).unwrap_err();
        assert!(e.contains("1000 series x 51 steps = 51000 values"), "{e}");
        assert!(answer_size(usize::MAX, i64::MIN, i64::MAX, 1).is_err());
    }

    #[test]
    fn series_pages_read_their_cursor_back() {
        let p = params(&[
            ("cursor", &cursor("m,a=b", "f")),
            ("match", " a  B "),
            ("limit", "5"),
        ]);
        let f = series_filter_from_params(&p).unwrap();
        assert_eq!(f.after, Some(("m,a=b".to_string(), "f".to_string())));
        assert_eq!(
            (f.words, f.limit),
            (vec!["a".to_string(), "B".to_string()], 5)
        );
        assert_eq!(
            series_filter_from_params(&params(&[])).unwrap().limit,
            SERIES_PAGE
        );
    }

    #[test]
    fn inference_params_default_to_one_step_over_the_range() {
        let p = params(&[("from", "0"), ("to", "99"), ("model", "")]);
        let q = inference_query_from_params(&p, 1000).unwrap();
        assert_eq!((q.from, q.to, q.step_ns, q.model), (0, 99, 100, None));
    }
}
