//! Bandwidth-aware forwarding: what a sink forwards (`forward = "raw"`, the default, or
//! `forward = "rollup:1m"` / `"rollup:1h"`: the rows of that rollup tier instead of raw
//! points), the point one rollup row becomes (shared by rollup-mode sinks and the eviction
//! fallback, so any sink type's encoder gets the same points), and the pure rules of a
//! rollup-mode read: which buckets are final, and cutting a read on a bucket boundary.
//!
//! A rollup-mode sink's cursor is the start of the last bucket its remote end acknowledged
//! (`sinks.rollup_cursor_bucket`); it reads whole buckets after it, oldest first, only
//! buckets the rollup job has made final (the tier's watermark more than `[rollup] lateness`
//! past the bucket's end, the rule the job itself uses for `late_points`), so a minute that
//! can still change is never sent. Batching, acknowledgement, retries, dead letters and the
//! status are the raw loop's, unchanged: only the source of the points differs.
//!
//! The histogram feed ([`super::store::Feed::Sketches`]) reads the same final 1-minute
//! buckets with each row's sketch; [`sketch_point`] carries the bins to
//! [`super::histogram`], and [`sketch_row`] reads them back.
//!
//! It never encodes a payload (that is [`super::encode`], per sink type) and never issues
//! SQL (the rows come through [`crate::store::tiers`]).

use std::sync::Arc;

use super::encode::{Point, Series};
use crate::model::Value;
use crate::store::sketch::Sketch;
use crate::store::tiers::NamedRow;

pub use super::config::{ForwardMode, TIERS};

/// The point a rollup row becomes: measurement and tags of its series (`series`, which
/// carries the `edgewatch_rollup=<tier>s` tag), the bucket start as its time, and the
/// fields `<field>_mean`, `_min`, `_max`, `_count` and, when the row has a sketch,
/// `_p50`, `_p90`, `_p99`.
pub fn row_point(r: &NamedRow, series: Arc<Series>) -> Point {
    let field = &r.field;
    let mut fields: Vec<(Arc<str>, Value)> = vec![
        (
            format!("{field}_mean").into(),
            Value::F64(r.sum / r.count.max(1) as f64),
        ),
        (format!("{field}_min").into(), Value::F64(r.min)),
        (format!("{field}_max").into(), Value::F64(r.max)),
        (format!("{field}_count").into(), Value::I64(r.count)),
    ];
    if let Some([p50, p90, p99]) = r.quantiles {
        fields.push((format!("{field}_p50").into(), Value::F64(p50)));
        fields.push((format!("{field}_p90").into(), Value::F64(p90)));
        fields.push((format!("{field}_p99").into(), Value::F64(p99)));
    }
    Point {
        series,
        ts: r.bucket,
        fields,
    }
}

/// The tier whose sketches become histograms (`histograms = true`): one minute.
pub const SKETCH_TIER_S: i64 = 60;

/// The point a row's sketch becomes in the histogram feed ([`super::store::Feed::Sketches`]):
/// the series' own tags, the bucket start as its time, and the fields: the row's field name
/// with the sum of its values, then `#count` and `#zero` (values counted as zero), then one
/// `+<key>` (positive) or `-<key>` (negative) per non-empty bin with its count. Only
/// [`sketch_row`] reads it back.
pub fn sketch_point(r: &NamedRow, sketch: &Sketch, series: Arc<Series>) -> Point {
    let (pos, neg, zero) = sketch.bins();
    let mut fields: Vec<(Arc<str>, Value)> = Vec::with_capacity(3 + pos.len() + neg.len());
    fields.push((r.field.as_str().into(), Value::F64(r.sum)));
    fields.push(("#count".into(), Value::U64(sketch.count())));
    fields.push(("#zero".into(), Value::U64(zero)));
    for (k, c) in pos {
        fields.push((format!("+{k}").into(), Value::U64(c)));
    }
    for (k, c) in neg {
        fields.push((format!("-{k}").into(), Value::U64(c)));
    }
    Point {
        series,
        ts: r.bucket,
        fields,
    }
}

/// A sketch row read back from a [`sketch_point`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SketchRow {
    /// The field.
    pub field: Arc<str>,
    /// Bucket start, ns.
    pub bucket: i64,
    /// Values in the bucket.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
    /// Values counted as zero.
    pub zero: u64,
    /// Positive bins `(key, count)`.
    pub pos: Vec<(i32, u64)>,
    /// Negative bins `(key, count)` (keys of the magnitudes).
    pub neg: Vec<(i32, u64)>,
}

/// Reads a [`sketch_point`] back; `None` for any other point.
pub fn sketch_row(p: &Point) -> Option<SketchRow> {
    let mut it = p.fields.iter();
    let (field, sum) = match it.next()? {
        (f, Value::F64(s)) => (f.clone(), *s),
        _ => return None,
    };
    let mut row = SketchRow {
        field,
        bucket: p.ts,
        sum,
        ..SketchRow::default()
    };
    for (name, v) in it {
        let Value::U64(c) = v else {
            return None;
        };
        match &**name {
            "#count" => row.count = *c,
            "#zero" => row.zero = *c,
            n => {
                let key: i32 = n.get(1..)?.parse().ok()?;
                match n.as_bytes().first() {
                    Some(b'+') => row.pos.push((key, *c)),
                    Some(b'-') => row.neg.push((key, *c)),
                    _ => return None,
                }
            }
        }
    }
    Some(row)
}

/// The tag rollup points carry, `edgewatch_rollup=<tier>s`, after the identity tags.
pub fn rollup_identity(identity: &[(String, String)], tier_s: i64) -> Vec<(String, String)> {
    let mut ident = identity.to_vec();
    ident.push(("edgewatch_rollup".into(), format!("{tier_s}s")));
    ident
}

/// The start of the newest bucket of a tier of `res_ns` that is final at `watermark` (the
/// tier's newest folded point time, `i64::MIN` when it has none) with `lateness_ns`: a bucket
/// is final once the watermark is more than `lateness` past its end, as the rollup job
/// counts `late_points`. `None` while no bucket is final.
pub fn final_through(watermark: i64, lateness_ns: i64, res_ns: i64) -> Option<i64> {
    if watermark == i64::MIN || res_ns <= 0 {
        return None;
    }
    // b + res <= watermark - lateness  <=>  b <= watermark - lateness - res.
    let limit = watermark.checked_sub(lateness_ns)?.checked_sub(res_ns)?;
    Some(limit - limit.rem_euclid(res_ns))
}

/// How many of `rows` (bucket starts, in read order, read with a limit of `max_points + 1`)
/// go into one batch of whole buckets, and whether the batch is full. A read that returned
/// at most `max_points` rows goes whole (it is all there is: not full). Otherwise the bucket
/// the limit cut is left for the next batch; when that is the first bucket (one bucket holds
/// more than `max_points` rows), `None`: read that bucket alone and send it whole, as a raw
/// chunk over the limit goes whole.
pub fn whole_buckets(rows: &[i64], max_points: usize) -> Option<(usize, bool)> {
    if rows.len() <= max_points {
        return Some((rows.len(), false));
    }
    let cut = rows[max_points];
    let keep = rows.iter().take_while(|&&b| b < cut).count();
    (keep > 0).then_some((keep, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000_000_000;

    #[test]
    fn forward_modes_parse_and_print_and_other_spellings_are_named() {
        let p = |v: &str| ForwardMode::try_from(v.to_string());
        assert_eq!(p("raw"), Ok(ForwardMode::Raw));
        assert_eq!(p("rollup:1m"), Ok(ForwardMode::Rollup(60)));
        assert_eq!(p("rollup:1h"), Ok(ForwardMode::Rollup(3600)));
        for bad in [
            "rollup",
            "rollup:60s",
            "rollup:5m",
            "Rollup:1m",
            "rollup:1m ",
            "",
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.contains("forward") && e.contains("rollup:1m"), "{e}");
        }
        assert_eq!(ForwardMode::Rollup(60).to_string(), "rollup:1m");
        assert_eq!(String::from(ForwardMode::Raw), "raw");
        assert_eq!(ForwardMode::default(), ForwardMode::Raw);
    }

    #[test]
    fn a_bucket_is_final_once_the_watermark_is_lateness_past_its_end() {
        let late = 2 * MIN;
        assert_eq!(final_through(i64::MIN, late, MIN), None);
        // Watermark 10:30 (in minutes), lateness 2 min: 8:30 - 1 min = 7:30 -> bucket 7.
        assert_eq!(final_through(10 * MIN + MIN / 2, late, MIN), Some(7 * MIN));
        // Exactly at the edge: bucket 7 ends at 8, 8 + 2 = 10 = watermark: final.
        assert_eq!(final_through(10 * MIN, late, MIN), Some(7 * MIN));
        assert_eq!(final_through(10 * MIN - 1, late, MIN), Some(6 * MIN));
        // Before the epoch too.
        assert_eq!(final_through(-MIN / 2, 0, MIN), Some(-2 * MIN));
        assert_eq!(final_through(i64::MIN + 1, late, MIN), None);
    }

    #[test]
    fn batches_end_on_bucket_boundaries() {
        let rows = [1, 1, 2, 2, 2, 3];
        assert_eq!(whole_buckets(&rows, 10), Some((6, false)));
        assert_eq!(whole_buckets(&rows, 6), Some((6, false)));
        // Limit 4 read 5 rows: bucket 2 is cut, the batch is bucket 1.
        assert_eq!(whole_buckets(&rows[..5], 4), Some((2, true)));
        assert_eq!(whole_buckets(&rows, 5), Some((5, true)));
        // One bucket larger than the batch: read it alone.
        assert_eq!(whole_buckets(&[1, 1, 1], 2), None);
    }

    #[test]
    fn a_row_becomes_one_point_with_its_percentiles() {
        let r = NamedRow {
            key: "m,k=v".into(),
            field: "lat".into(),
            bucket: 5 * MIN,
            series_id: 1,
            count: 4,
            sum: 10.0,
            min: 1.0,
            max: 4.0,
            quantiles: Some([2.0, 3.5, 3.9]),
        };
        let s = Arc::new(super::super::encode::series(
            "m,k=v",
            &rollup_identity(&[("device_id".into(), "d".into())], 60),
        ));
        let p = row_point(&r, s);
        let mut out = Vec::new();
        super::super::encode::line(&mut out, &p, false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "m,device_id=d,edgewatch_rollup=60s,k=v lat_mean=2.5,lat_min=1,lat_max=4,\
             lat_count=4i,lat_p50=2,lat_p90=3.5,lat_p99=3.9 300000000000\n"
        );
        let p = row_point(
            &NamedRow {
                quantiles: None,
                ..r
            },
            p.series.clone(),
        );
        assert_eq!(p.fields.len(), 4, "no sketch, no percentiles");
    }
}
