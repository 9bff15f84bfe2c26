//! [`StatusCell`]: the one holder of a live status part that a task updates and readers copy
//! (the forwarders' sinks, the NVML and tegrastats collectors). A mutex around plain data,
//! held only for the length of a closure; it never blocks on IO and never panics on a lock
//! that an earlier panic poisoned (the data is plain counters and strings: it stays usable).
//! A sink's or notifier's cell records delivery failures through [`FailureFields`], one
//! way for both.

use std::sync::{Mutex, MutexGuard};

/// A status value shared between the task that updates it and the readers that copy it.
#[derive(Debug, Default)]
pub struct StatusCell<T>(Mutex<T>);

impl<T> StatusCell<T> {
    /// A cell holding `value`.
    pub fn new(value: T) -> StatusCell<T> {
        StatusCell(Mutex::new(value))
    }

    fn lock(&self) -> MutexGuard<'_, T> {
        // A panic elsewhere while holding the lock leaves plain data behind: keep using it.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `f` to the value under the lock and returns what `f` returns.
    pub fn update<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.lock())
    }

    /// Reads part of the value under the lock (no copy of the rest).
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.lock())
    }
}

impl<T: Clone> StatusCell<T> {
    /// A copy of the value.
    pub fn snapshot(&self) -> T {
        self.lock().clone()
    }
}

/// `(last_error, last_error_ns, failures, paused, next_retry_ns)` of a peer's status.
pub type FailureRefs<'a> = (
    &'a mut Option<String>,
    &'a mut Option<i64>,
    &'a mut u64,
    &'a mut bool,
    &'a mut Option<i64>,
);

/// The failure fields of a peer's status document (a sink's, a notifier's): last error,
/// when, the failure count, paused, next retry. Lets [`record_failure`] fill both.
pub trait FailureFields {
    /// The fields, borrowed.
    fn failure_fields(&mut self) -> FailureRefs<'_>;
}

/// Every status cell of a peer reports failures the same way.
impl<T: FailureFields> crate::deliver::Report for StatusCell<T> {
    fn failed(&self, reason: &str, retry_in: Option<std::time::Duration>, paused: bool) {
        self.update(|s| record_failure(s, reason, retry_in, paused));
    }
}

/// Records a failure in a peer's status: its reason now, one more failure, paused or not,
/// and when the next attempt is due.
pub fn record_failure(
    s: &mut impl FailureFields,
    reason: &str,
    retry_in: Option<std::time::Duration>,
    paused: bool,
) {
    let now = crate::now_ns();
    let (error, at, failures, paused_now, next) = s.failure_fields();
    *error = Some(reason.to_string());
    *at = Some(now);
    *failures += 1;
    *paused_now = paused;
    *next = retry_in.map(|d| now.saturating_add(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_are_seen_by_snapshots() {
        let c = StatusCell::new((0u64, String::new()));
        let n = c.update(|s| {
            s.0 += 2;
            s.1 = "running".into();
            s.0
        });
        assert_eq!(n, 2);
        assert_eq!(c.snapshot(), (2, "running".to_string()));
        assert_eq!(c.read(|s| s.1.len()), 7);
    }

    #[test]
    fn a_panic_inside_an_update_leaves_the_value_usable() {
        let c = std::sync::Arc::new(StatusCell::new(1u64));
        let c2 = c.clone();
        let r = std::thread::spawn(move || {
            c2.update(|v| {
                *v = 5;
                panic!("poison the lock");
            })
        })
        .join();
        assert!(r.is_err());
        assert_eq!(c.snapshot(), 5);
        c.update(|v| *v += 1);
        assert_eq!(c.snapshot(), 6);
    }
}
