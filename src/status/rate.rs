//! The raw write rate and the offline runway of the status document: how fast raw data
//! arrives (points, values and bytes a second) and how long the disk budget holds at that
//! rate before eviction begins. Pure: computed from what the store measured
//! ([`crate::store::chunks::RateSample`]), the file's size and the budget.
//!
//! Never reads the store or the clock itself.

use serde::{Deserialize, Serialize};

use crate::store::chunks::RateSample;

/// `store.write` of `/api/v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WriteRate {
    /// Points a second, over the newest chunks (by their points' times).
    pub points_per_s: f64,
    /// Field values a second.
    pub values_per_s: f64,
    /// Stored bytes a value once recompressed (chunk data plus row overhead), estimated
    /// from the newest full chunks, else the newest ones.
    pub bytes_per_value: f64,
    /// `values_per_s * bytes_per_value`.
    pub bytes_per_s: f64,
    /// `[retention] max_disk` minus what the store uses now, bytes (`null`: no budget).
    pub budget_left_bytes: Option<u64>,
    /// How long the budget holds at this rate before eviction begins, seconds (`null`: no
    /// budget, or nothing is being written).
    pub runway_s: Option<f64>,
}

/// The rate from a sample of the store; `None` when the sample spans no time.
pub fn write_rate(s: &RateSample, db_bytes: u64, max_bytes: u64) -> Option<WriteRate> {
    let span_s = s.span_ns as f64 / 1e9;
    if span_s < 1.0 || s.values == 0 {
        return None;
    }
    let points_per_s = s.points as f64 / span_s;
    let values_per_s = s.values as f64 / span_s;
    let bytes_per_value = if s.dense_values > 0 {
        s.dense_bytes as f64 / s.dense_values as f64
    } else {
        s.bytes as f64 / s.values as f64
    };
    let bytes_per_s = values_per_s * bytes_per_value;
    let budget_left_bytes = (max_bytes > 0).then(|| max_bytes.saturating_sub(db_bytes));
    let runway_s = budget_left_bytes
        .filter(|_| bytes_per_s > 0.0)
        .map(|left| left as f64 / bytes_per_s);
    Some(WriteRate {
        points_per_s,
        values_per_s,
        bytes_per_value,
        bytes_per_s,
        budget_left_bytes,
        runway_s,
    })
}

/// A duration in the largest fitting unit (`41.3 d`, `5.2 h`, `12 min`).
pub fn human_duration(s: f64) -> String {
    if s >= 2.0 * 86_400.0 {
        format!("{:.1} d", s / 86_400.0)
    } else if s >= 2.0 * 3_600.0 {
        format!("{:.1} h", s / 3_600.0)
    } else {
        format!("{:.0} min", s / 60.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runway_is_what_is_left_of_the_budget_over_the_byte_rate() {
        let s = RateSample {
            points: 600,
            values: 3_000,
            span_ns: 60_000_000_000,
            bytes: 30_000,
            dense_values: 10_000,
            dense_bytes: 20_000,
        };
        let r = write_rate(&s, 400_000, 1_000_000).unwrap();
        assert_eq!((r.points_per_s, r.values_per_s), (10.0, 50.0));
        assert_eq!((r.bytes_per_value, r.bytes_per_s), (2.0, 100.0));
        assert_eq!(r.budget_left_bytes, Some(600_000));
        assert_eq!(r.runway_s, Some(6_000.0));
        // No full chunk yet: the newest ones' own density. No budget: no runway.
        let r = write_rate(
            &RateSample {
                dense_values: 0,
                ..s
            },
            400_000,
            0,
        )
        .unwrap();
        assert_eq!((r.bytes_per_value, r.runway_s), (10.0, None));
        // Over the budget already: no time left.
        assert_eq!(
            write_rate(&s, 2_000_000, 1_000_000).unwrap().runway_s,
            Some(0.0)
        );
        assert_eq!(write_rate(&RateSample::default(), 0, 1), None);
        assert_eq!(human_duration(41.25 * 86_400.0), "41.2 d");
        assert_eq!(human_duration(3.0 * 3_600.0), "3.0 h");
    }
}
