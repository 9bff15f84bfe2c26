//! The newest value of every numeric series, kept as it is received: the [`Writer`] records
//! the numbers of each batch here as it accepts them (held points included), so `/metrics` reads one map
//! instead of decoding the newest chunks of every tag set on each scrape. One entry per
//! series id, so it never holds more than `[storage] max_series` entries (16 bytes of value
//! plus the map's own overhead each).
//!
//! Values committed before the map existed (an earlier run of the agent) are folded in once
//! by [`LatestValues::seed`], from the chunks of the last window; a later point always wins
//! over an older one whichever path brought it. It never reads the ingest queue, never
//! writes SQL and never drops an entry: the caller applies its freshness window on read.
//!
//! [`Writer`]: super::Writer

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::bucket::numeric;
use super::chunks::{self, Scan};
use super::staged::Staged;
use super::{Reader, StoreError};
use crate::model::Value;

/// Series id -> newest `(ts, value)`; foldhash: every committed number passes here.
type HashMap<K, V> = foldhash::HashMap<K, V>;

/// The newest `(timestamp ns, value)` of each numeric series, by series id.
#[derive(Debug, Default)]
pub struct LatestValues {
    map: Mutex<HashMap<i64, (i64, f64)>>,
    seeded: AtomicBool,
}

/// `(ts, v)` for `sid` unless the map holds a newer value.
fn keep_newer(map: &mut HashMap<i64, (i64, f64)>, sid: i64, ts: i64, v: f64) {
    let slot = map.entry(sid).or_insert((i64::MIN, 0.0));
    if ts >= slot.0 {
        *slot = (ts, v);
    }
}

impl LatestValues {
    /// An empty map.
    pub fn new() -> LatestValues {
        LatestValues::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, (i64, f64)>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records values: `(series id, ts, value)`; a value older than the one held is ignored.
    pub fn record(&self, values: &[(i64, i64, f64)]) {
        if values.is_empty() {
            return;
        }
        let mut map = self.lock();
        for &(sid, ts, v) in values {
            keep_newer(&mut map, sid, ts, v);
        }
    }

    /// Records the numbers of `staged` as [`LatestValues::record`] does, under one lock and
    /// without a copy.
    pub(super) fn record_staged<'a>(&self, staged: impl IntoIterator<Item = &'a Staged>) {
        let mut map = self.lock();
        for s in staged {
            for (_, ts, values) in s.lines() {
                for (sid, v) in values {
                    if let Some(x) = numeric(v) {
                        keep_newer(&mut map, *sid, ts, x);
                    }
                }
            }
        }
    }

    /// The newest value of `sid` if it is at or after `since`.
    pub fn get(&self, sid: i64, since: i64) -> Option<(i64, f64)> {
        self.lock().get(&sid).copied().filter(|(t, _)| *t >= since)
    }

    /// Calls `f(sid, ts, value)` for every series whose newest value is at or after
    /// `since`, under the lock (keep `f` short).
    pub fn for_each_since(&self, since: i64, mut f: impl FnMut(i64, i64, f64)) {
        for (&sid, &(ts, v)) in self.lock().iter() {
            if ts >= since {
                f(sid, ts, v);
            }
        }
    }

    /// Number of series held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Once per map: folds in the values of every chunk whose newest point is at or after
    /// `since` (what an earlier run wrote). Later calls return at once. The chunks are read
    /// one at a time and only numbers are kept, so memory stays one entry per series.
    pub fn seed(&self, reader: &Reader, since: i64) -> Result<(), StoreError> {
        if self.seeded.load(Ordering::Acquire) {
            return Ok(());
        }
        let (conn, path) = (reader.conn(), reader.path());
        let scan = Scan {
            ts_from: Some(since),
            ..Scan::default()
        };
        let mut buf: Vec<(i64, i64, f64)> = Vec::with_capacity(4096);
        chunks::scan(conn, path, &scan, |c| {
            c.decode(path, |t, sid, v: Value| {
                if let (true, Some(x)) = (t >= since, numeric(&v)) {
                    buf.push((sid, t, x));
                }
            })?;
            if buf.len() >= 4096 {
                self.record(&buf);
                buf.clear();
            }
            Ok(ControlFlow::Continue(()))
        })?;
        self.record(&buf);
        self.seeded.store(true, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_point_wins_whatever_order_it_comes_in() {
        let l = LatestValues::new();
        l.record(&[(1, 10, 1.0), (1, 5, 2.0), (2, 7, 3.0)]);
        l.record(&[(1, 10, 4.0), (2, 6, 9.0)]);
        assert_eq!(l.get(1, 0), Some((10, 4.0)));
        assert_eq!(l.get(2, 0), Some((7, 3.0)));
        assert_eq!(l.get(2, 8), None);
        let mut seen = Vec::new();
        l.for_each_since(8, |s, t, v| seen.push((s, t, v)));
        assert_eq!(seen, vec![(1, 10, 4.0)]);
        assert_eq!(l.len(), 2);
    }
}
