//! Samples -> points in the shape of Telegraf's `prometheus` input with `metric_version = 2`,
//! so fleet queries written for Telegraf keep working: measurement `prometheus`, one field
//! per sample named as written (`x_bucket` with tag `le`, `x_sum`, `x_count`; a summary's
//! `x` with tag `quantile`), tags = the labels plus `scrape` and the target's `tags`.
//! Samples sharing tags and timestamp become one point with several fields. Pure.
//!
//! Left out (and counted): samples `include`/`exclude` drop, OpenMetrics `_created`
//! samples (a creation time, not a measurement), and NaN or infinite values (line protocol,
//! and so the store and every sink, cannot carry them).

use std::collections::HashMap;

use super::config::ScrapeConfig;
use super::parse::Page;
use crate::model::{series_key, Line, Value};

/// The measurement every scraped sample is stored in.
pub const MEASUREMENT: &str = "prometheus";

/// What [`to_lines`] made of a page.
#[derive(Debug, Default)]
pub struct Shaped {
    /// The points.
    pub lines: Vec<Line>,
    /// Samples stored (fields).
    pub samples: u64,
    /// Samples dropped by include/exclude or as `_created`.
    pub filtered: u64,
    /// Samples whose value was NaN or infinite.
    pub non_finite: u64,
}

/// The page's kept samples as points; `now` stamps samples without a timestamp.
pub fn to_lines(page: &Page, cfg: &ScrapeConfig, now: i64) -> Shaped {
    let mut out = Shaped::default();
    let mut at: HashMap<(String, i64), usize> = HashMap::new();
    for s in &page.samples {
        if !cfg.keeps(&s.name) || page.kind_of(&s.name).1 {
            out.filtered += 1;
            continue;
        }
        if !s.value.is_finite() {
            out.non_finite += 1;
            continue;
        }
        let mut tags: Vec<(&str, &str)> = Vec::with_capacity(s.labels.len() + cfg.tags.len() + 1);
        for (k, v) in &cfg.tags {
            tags.push((k, v));
        }
        for (k, v) in &s.labels {
            // A label wins over a configured tag of the same name; `scrape` is ours.
            if k == "scrape" {
                continue;
            }
            tags.retain(|(tk, _)| *tk != k);
            tags.push((k, v));
        }
        tags.push(("scrape", &cfg.name));
        let key = series_key(MEASUREMENT, &tags);
        let ts = s.ts_ns.unwrap_or(now);
        out.samples += 1;
        match at.get(&(key.clone(), ts)) {
            Some(&i) => {
                let fields = &mut out.lines[i].fields;
                if let Some(f) = fields.iter_mut().find(|(n, _)| *n == s.name) {
                    f.1 = Value::F64(s.value);
                } else {
                    fields.push((s.name.clone(), Value::F64(s.value)));
                }
            }
            None => {
                at.insert((key.clone(), ts), out.lines.len());
                out.lines.push(Line {
                    key,
                    fields: vec![(s.name.clone(), Value::F64(s.value))],
                    ts,
                    line_no: 0,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::parse::{parse, Format};
    use super::*;

    #[test]
    fn histograms_summaries_and_counters_take_telegrafs_v2_shape() {
        let text = "# TYPE rq histogram\nrq_bucket{le=\"0.1\"} 1\nrq_bucket{le=\"+Inf\"} 3\n\
            rq_sum 0.7\nrq_count 3\n# TYPE lat summary\nlat{quantile=\"0.5\"} 2\nlat_sum 9\n\
            lat_count 4\n# TYPE c counter\nc_total{code=\"200\"} 5 1700000000\nc_created 1\n\
            bad NaN\nskip_me 1\n";
        let mut cfg = ScrapeConfig::new("node", "http://127.0.0.1:1/");
        cfg.exclude = vec!["skip_*".into()];
        cfg.tags = [("role".to_string(), "edge".to_string())].into();
        let page = parse(text, Format::OpenMetrics);
        let s = to_lines(&page, &cfg, 42);
        let got: Vec<String> = s
            .lines
            .iter()
            .map(|l| {
                let f: Vec<String> = l
                    .fields
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_f64().unwrap()))
                    .collect();
                format!("{} {} {}", l.key, f.join(","), l.ts)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                "prometheus,le=0.1,role=edge,scrape=node rq_bucket=1 42",
                "prometheus,le=+Inf,role=edge,scrape=node rq_bucket=3 42",
                "prometheus,role=edge,scrape=node rq_sum=0.7,rq_count=3,lat_sum=9,lat_count=4 42",
                "prometheus,quantile=0.5,role=edge,scrape=node lat=2 42",
                "prometheus,code=200,role=edge,scrape=node c_total=5 1700000000000000000",
            ]
        );
        assert_eq!((s.samples, s.filtered, s.non_finite), (8, 2, 1));
    }
}
