//! The `rollup` part of the status document ([`crate::status::Rollup`]): each tier's cursor,
//! pending chunks, lag, watermark, late points, live and evicted row counts; the raw eviction
//! counters; what eviction took from each sink before it forwarded it; the budget. Read-only,
//! through a [`Reader`].

use super::plan::NS;
use super::Plan;
use crate::status::{Budget, Evicted, Rollup, SinkEvictions, Tier};
use crate::store::{chunks, counters, sinks, tiers, Reader, StoreError};

/// The `rollup` part of the status document at `now` (ns).
pub fn status(reader: &Reader, plan: &Plan, now: i64) -> Result<Rollup, StoreError> {
    let (conn, path) = (reader.conn(), reader.path());
    let newest = chunks::newest_id(conn, path)?;
    let counters = counters::all(conn, path)?;
    let c = |k: &str| counters.get(k).copied().unwrap_or(0);
    let mut tiers = Vec::new();
    for t in &plan.tiers {
        let s = tiers::state(conn, path, t.key())?;
        let pending = chunks::count_after(conn, path, s.cursor)?;
        // Seconds since the job last advanced this tier while work is pending; unknown
        // (null) before its first run, rather than "since 1970".
        let lag_s = if pending == 0 {
            Some(0.0)
        } else if s.updated <= 0 {
            None
        } else {
            Some((now - s.updated).max(0) as f64 / NS as f64)
        };
        tiers.push(Tier {
            name: t.name.clone(),
            resolution_s: t.key(),
            retention_s: t.retention_ns.map(|r| r / NS),
            cursor_chunk_id: s.cursor,
            pending_chunks: pending,
            lag_s,
            fold_every_s: plan.fold_every_ns(t) / NS,
            watermark_ns: (s.watermark != i64::MIN).then_some(s.watermark),
            late_points: s.late,
            rows: c(&counters::tier_rows(t.key())),
            evicted_rows: c(&format!("evicted_rows_{}", t.key())),
            corrupt_skipped_points: c(&counters::corrupt_skipped(t.key())),
        });
    }
    let sinks = sinks::evictions(conn, path)?
        .into_iter()
        .map(|s| SinkEvictions {
            name: s.name,
            cursor_chunk_id: s.cursor,
            evicted_unforwarded_chunks: s.chunks,
            evicted_unforwarded_points: s.points,
            evicted_through_chunk_id: s.through,
        })
        .collect();
    Ok(Rollup {
        tiers,
        newest_chunk_id: newest,
        raw_retention_s: plan.raw_retention_ns / NS,
        lateness_s: plan.lateness_ns / NS,
        evicted: Evicted {
            raw_chunks: c("evicted_raw_chunks"),
            raw_points: c("evicted_raw_points"),
        },
        sinks,
        budget: Budget {
            max_bytes: plan.max_bytes,
            db_bytes: reader.disk_bytes(),
        },
    })
}
