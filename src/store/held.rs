//! [`HeldView`]: the points the writer holds for its next commit, readable without that
//! commit, as a time-series database reads its head block. The writer puts each request's
//! checked lines here as it holds them and empties the view in the same instant its commit
//! becomes visible ([`super::Writer::commit`] takes the view's lock around `COMMIT`), so a
//! reader that takes a [`HeldSnapshot`] together with its read transaction
//! ([`HeldView::snapshot_with`]) sees every point received exactly once: in the store or
//! here, never both and never neither. The alert cycle reads this way, and so do the API's
//! reads ([`super::Reader::read_with_held`]: the query engine and raw queries add the
//! snapshot's points), so rules and queries see the points received before them without a
//! commit of their own. Lines are shared with the writer (`Arc`), not copied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::staged::Staged;
use crate::model::Value;

/// The lines held for the next commit, shared between the writer and its readers.
#[derive(Debug, Default)]
pub struct HeldView(Mutex<Vec<Arc<Staged>>>);

impl HeldView {
    /// An empty view.
    pub fn new() -> HeldView {
        HeldView::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Staged>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds lines the writer now holds.
    pub fn hold(&self, staged: Arc<Staged>) {
        if !staged.is_empty() {
            self.lock().push(staged);
        }
    }

    /// Replaces what is held by `staged` (what the writer keeps after a commit failed).
    pub fn reset(&self, staged: impl IntoIterator<Item = Arc<Staged>>) {
        let mut held = self.lock();
        held.clear();
        held.extend(staged.into_iter().filter(|s| !s.is_empty()));
    }

    /// Runs `commit`; when it succeeds, empties the view before any reader can look, since
    /// what it held is now in the store. The writer's `COMMIT` goes through here.
    pub(super) fn commit_with<T, E>(&self, commit: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let mut held = self.lock();
        let out = commit()?;
        held.clear();
        Ok(out)
    }

    /// Points held now.
    pub fn points(&self) -> usize {
        self.lock().iter().map(|s| s.points()).sum()
    }

    /// Runs `begin` (which must start the caller's read transaction: its snapshot of the
    /// store) and takes what is held at the same instant: no commit can fall between the two.
    pub fn snapshot_with<T, E>(
        &self,
        begin: impl FnOnce() -> Result<T, E>,
    ) -> Result<(T, HeldSnapshot), E> {
        let held = self.lock();
        let t = begin()?;
        let batches = held.clone();
        drop(held);
        Ok((t, HeldSnapshot::new(batches)))
    }
}

/// What was held at one instant, found by tag set.
#[derive(Debug, Default, Clone)]
pub struct HeldSnapshot {
    batches: Vec<Arc<Staged>>,
    /// Tag set -> (batch, line) of its lines, in arrival order.
    by_tagset: HashMap<i64, Vec<(u32, u32)>>,
}

impl HeldSnapshot {
    fn new(batches: Vec<Arc<Staged>>) -> HeldSnapshot {
        let mut by_tagset: HashMap<i64, Vec<(u32, u32)>> = HashMap::new();
        for (b, s) in batches.iter().enumerate() {
            for (l, (tagset, _, _)) in s.lines().enumerate() {
                by_tagset
                    .entry(tagset)
                    .or_default()
                    .push((b as u32, l as u32));
            }
        }
        HeldSnapshot { batches, by_tagset }
    }

    /// Points (lines) in the snapshot.
    pub fn points(&self) -> usize {
        self.batches.iter().map(|s| s.points()).sum()
    }

    /// True when nothing was held.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Each held line of `tagset`, in arrival order: `(time, its (series id, value)s)`.
    pub fn lines_of(&self, tagset: i64) -> impl Iterator<Item = (i64, &[(i64, Value)])> + '_ {
        self.by_tagset
            .get(&tagset)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .filter_map(|&(b, l)| {
                let (_, ts, values) = self.batches.get(b as usize)?.line(l as usize)?;
                Some((ts, values))
            })
    }

    /// Each held value of `tagset` timed within `[from, to]`: `(time, series id, value)`,
    /// what a point read adds to the points it decoded from the store's chunks.
    pub fn values_in(
        &self,
        tagset: i64,
        from: i64,
        to: i64,
    ) -> impl Iterator<Item = (i64, i64, &Value)> + '_ {
        self.lines_of(tagset)
            .filter(move |(ts, _)| (from..=to).contains(ts))
            .flat_map(|(ts, values)| values.iter().map(move |(sid, v)| (ts, *sid, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(tag set, time, (series id, value)s)`.
    type TestLine<'a> = (i64, i64, &'a [(i64, f64)]);

    fn staged(lines: &[TestLine<'_>]) -> Arc<Staged> {
        let mut s = Staged::default();
        for (tagset, ts, values) in lines {
            for (sid, v) in *values {
                s.push_value(*sid, Value::F64(*v));
            }
            s.end_line(*tagset, *ts);
        }
        Arc::new(s)
    }

    fn values_of(snap: &HeldSnapshot, tagset: i64) -> Vec<(i64, i64, f64)> {
        snap.lines_of(tagset)
            .flat_map(|(ts, vs)| {
                vs.iter().map(move |(sid, v)| match v {
                    Value::F64(f) => (ts, *sid, *f),
                    _ => (ts, *sid, f64::NAN),
                })
            })
            .collect()
    }

    #[test]
    fn a_snapshot_finds_held_lines_by_tag_set_and_a_commit_empties_the_view_at_once() {
        let view = HeldView::new();
        view.hold(staged(&[
            (1, 10, &[(100, 1.0), (101, 2.0)]),
            (2, 11, &[(200, 3.0)]),
        ]));
        view.hold(staged(&[(1, 12, &[(100, 4.0)])]));
        view.hold(Arc::new(Staged::default()));
        let ((), snap) = view.snapshot_with(|| Ok::<_, ()>(())).unwrap();
        assert_eq!(snap.points(), 3);
        assert_eq!(
            values_of(&snap, 1),
            vec![(10, 100, 1.0), (10, 101, 2.0), (12, 100, 4.0)]
        );
        assert_eq!(values_of(&snap, 2), vec![(11, 200, 3.0)]);
        assert!(values_of(&snap, 3).is_empty());

        // A failed commit keeps the view; a successful one empties it. The snapshot taken
        // before keeps its lines (a reader whose transaction predates the commit).
        assert_eq!(
            view.commit_with(|| Err::<(), _>("disk full")),
            Err("disk full")
        );
        assert_eq!(view.points(), 3);
        view.commit_with(|| Ok::<_, ()>(())).unwrap();
        assert_eq!(view.points(), 0);
        assert_eq!(snap.points(), 3);
        let ((), after) = view.snapshot_with(|| Ok::<_, ()>(())).unwrap();
        assert!(after.is_empty());

        // What the writer keeps after a failed commit replaces the view.
        view.hold(staged(&[(5, 1, &[(500, 1.0)])]));
        view.reset([staged(&[(6, 2, &[(600, 2.0)])])]);
        let ((), kept) = view.snapshot_with(|| Ok::<_, ()>(())).unwrap();
        assert!(values_of(&kept, 5).is_empty());
        assert_eq!(values_of(&kept, 6), vec![(2, 600, 2.0)]);
    }

    /// What a point read adds: the values of one tag set timed within the range, both
    /// ends included, none outside it or of another tag set.
    #[test]
    fn values_in_a_range_include_both_ends_and_nothing_outside() {
        let view = HeldView::new();
        view.hold(staged(&[
            (1, 9, &[(100, 0.9)]),
            (1, 10, &[(100, 1.0), (101, 1.5)]),
            (2, 11, &[(200, 9.9)]),
            (1, 12, &[(100, 1.2)]),
            (1, 13, &[(100, 1.3)]),
        ]));
        let ((), snap) = view.snapshot_with(|| Ok::<_, ()>(())).unwrap();
        let got: Vec<(i64, i64, f64)> = snap
            .values_in(1, 10, 12)
            .map(|(ts, sid, v)| match v {
                Value::F64(f) => (ts, sid, *f),
                _ => (ts, sid, f64::NAN),
            })
            .collect();
        assert_eq!(got, vec![(10, 100, 1.0), (10, 101, 1.5), (12, 100, 1.2)]);
        assert_eq!(snap.values_in(1, 14, 20).count(), 0);
        assert_eq!(snap.values_in(3, 0, 20).count(), 0);
    }

    #[test]
    fn a_snapshot_and_a_commit_never_interleave() {
        // The reader's `begin` runs under the view's lock: a commit started meanwhile waits
        // for it, so the reader sees the lines either held (before) or stored (after).
        let view = Arc::new(HeldView::new());
        view.hold(staged(&[(1, 10, &[(100, 1.0)])]));
        let stored = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (v2, s2) = (view.clone(), stored.clone());
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            v2.snapshot_with(|| {
                entered_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok::<_, ()>(s2.load(std::sync::atomic::Ordering::SeqCst))
            })
            .unwrap()
        });
        entered_rx.recv().unwrap();
        let (v3, s3) = (view.clone(), stored.clone());
        let writer = std::thread::spawn(move || {
            v3.commit_with(|| {
                s3.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, ()>(())
            })
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        go_tx.send(()).unwrap();
        let (saw_stored, snap) = reader.join().unwrap();
        writer.join().unwrap().unwrap();
        assert!(!saw_stored, "the commit ran inside the reader's begin");
        assert_eq!(snap.points(), 1);
        assert_eq!(view.points(), 0);
    }
}
