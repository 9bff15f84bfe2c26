//! The one retry loop of every peer: its settings ([`Retry`], the `timeout`, `min_backoff`
//! and `max_backoff` keys of `[[sink]]` and `[[notify]]`), and [`Retrier`], which turns an
//! answer that is not an acknowledgement into a wait, a status line and a rate-limited log
//! line. Waiting itself is [`nap`], which wakes on the stop token.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::answer::Outcome;
use crate::backoff::{Backoff, Jitter, Spread};
use crate::config::values::{Delay, Interval};

/// The retry keys every peer table takes (flattened into `[[sink]]` and `[[notify]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub struct Retry {
    /// Request / connection timeout (default 10 s).
    #[serde(default = "d_timeout", deserialize_with = "timeout")]
    pub timeout: Delay,
    /// First retry delay after a failure; doubles, with jitter (default 1 s).
    #[serde(default = "d_min_backoff", deserialize_with = "min_backoff")]
    pub min_backoff: Delay,
    /// Longest retry delay; also how often a paused peer (credentials, wrong path) is tried
    /// again (default 60 s).
    #[serde(default = "d_max_backoff", deserialize_with = "max_backoff")]
    pub max_backoff: Delay,
}

// A flattened table's errors carry no key: each value names its own.
fn keyed<'de, D: serde::Deserializer<'de>>(d: D, key: &str) -> Result<Delay, D::Error> {
    Delay::deserialize(d).map_err(|e| serde::de::Error::custom(format!("`{key}`: {e}")))
}
fn timeout<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Delay, D::Error> {
    keyed(d, "timeout")
}
fn min_backoff<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Delay, D::Error> {
    keyed(d, "min_backoff")
}
fn max_backoff<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Delay, D::Error> {
    keyed(d, "max_backoff")
}

fn d_timeout() -> Delay {
    Interval(Duration::from_secs(10))
}
fn d_min_backoff() -> Delay {
    Interval(Duration::from_secs(1))
}
fn d_max_backoff() -> Delay {
    Interval(Duration::from_secs(60))
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            timeout: d_timeout(),
            min_backoff: d_min_backoff(),
            max_backoff: d_max_backoff(),
        }
    }
}

impl Retry {
    /// Checks the keys together: a positive timeout, `min_backoff <= max_backoff`.
    pub fn validate(&self) -> Result<(), String> {
        if self.timeout.0.is_zero() {
            return Err("`timeout` must be greater than zero".into());
        }
        if self.min_backoff.0 > self.max_backoff.0 {
            return Err(format!(
                "`min_backoff` ({}) must not exceed `max_backoff` ({})",
                humantime::format_duration(self.min_backoff.0),
                humantime::format_duration(self.max_backoff.0)
            ));
        }
        Ok(())
    }

    /// `min_backoff` doubling to `max_backoff`, "equal jitter" (a point in the upper half of
    /// each delay, so peers failing together spread out).
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.min_backoff.0, self.max_backoff.0).with_spread(Spread::Equal)
    }

    /// The wait before retry number `failures` (1 = after the first failure), `jitter` in
    /// `[0, 1)`.
    pub fn delay(&self, failures: u32, jitter: f64) -> Duration {
        self.backoff().delay(failures.saturating_sub(1), jitter)
    }
}

/// How a peer's status shows its delivery; implemented by the sinks' and the notifiers'
/// status cells.
pub trait Report {
    /// A failure: its reason, the wait before the next attempt, and whether the peer is
    /// paused (refused for a reason that does not go away by itself).
    fn failed(&self, reason: &str, retry_in: Option<Duration>, paused: bool);
}

/// Sleeps `d`, waking early (returning false) when `stop` is cancelled. For the blocking
/// delivery threads: the wait is one timer on a runtime of the calling thread's own, woken
/// by the cancellation itself, so an idle sink or notifier costs no wakeups while it waits
/// (a sleep in slices to look at `stop` cost 40 a second per thread).
pub fn nap(stop: &CancellationToken, d: Duration) -> bool {
    thread_local! {
        static TIMER: Option<tokio::runtime::Runtime> =
            tokio::runtime::Builder::new_current_thread().enable_time().build().ok();
    }
    if stop.is_cancelled() {
        return false;
    }
    // Never inside a runtime (`block_on` would panic there): the delivery threads are plain
    // threads; anything else falls back to sleeping in slices.
    let inside = tokio::runtime::Handle::try_current().is_ok();
    let waited = TIMER.with(|rt| match rt {
        Some(rt) if !inside => Some(rt.block_on(async {
            tokio::select! {
                _ = stop.cancelled() => false,
                _ = tokio::time::sleep(d) => true,
            }
        })),
        _ => None,
    });
    if let Some(slept) = waited {
        return slept;
    }
    let end = Instant::now() + d;
    loop {
        if stop.is_cancelled() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(25)));
    }
}

/// One peer's retry state: failures in a row, its jitter, and its log throttle (a failure
/// that repeats is logged at the 1st, 2nd, 4th, 8th... time, with the count).
pub struct Retrier {
    /// `sink` or `notifier`, for logs.
    role: &'static str,
    name: String,
    retry: Retry,
    jitter: Jitter,
    failures: u32,
    logged: u64,
}

impl Retrier {
    /// A retrier for the peer `name` (`role`: `sink` or `notifier`).
    pub fn new(role: &'static str, name: &str, retry: Retry) -> Retrier {
        Retrier {
            role,
            name: name.to_string(),
            retry,
            jitter: Jitter::from_clock(name),
            failures: 0,
            logged: 0,
        }
    }

    /// A jitter sample in `[0, 1)` from this peer's generator.
    pub fn jitter(&mut self) -> f64 {
        self.jitter.sample()
    }

    /// The peer acknowledged: the backoff starts over.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    fn log_due(&mut self) -> bool {
        self.logged += 1;
        self.logged.is_power_of_two()
    }

    /// The wait after `outcome` (an answer that is neither an acknowledgement nor a dead
    /// letter), shown in `status` and logged (rate-limited). A split (`Shrink`) waits a
    /// short fixed moment: the next attempt is smaller, never the same request again.
    pub fn after(&mut self, outcome: &Outcome, status: &dyn Report) -> Duration {
        let (role, name) = (self.role, self.name.clone());
        match outcome {
            Outcome::Ack | Outcome::DeadLetter { .. } => Duration::ZERO,
            Outcome::Shrink { reason } => {
                let d = Duration::from_millis(50);
                status.failed(reason, Some(d), false);
                d
            }
            Outcome::Pause { reason, .. } => {
                let d = self.retry.max_backoff.0;
                if self.log_due() {
                    tracing::error!(peer = %name, role, %reason, count = self.logged, retry_in_s = d.as_secs_f64(), "delivery paused (data kept)");
                }
                status.failed(reason, Some(d), true);
                d
            }
            Outcome::RetryAfter { after, reason } => {
                if self.log_due() {
                    tracing::warn!(peer = %name, role, %reason, count = self.logged, retry_in_s = after.as_secs_f64(), "peer busy; waiting its Retry-After");
                }
                status.failed(reason, Some(*after), false);
                *after
            }
            Outcome::Retry { reason, .. } => {
                self.failures += 1;
                let d = self.retry.delay(self.failures, self.jitter.sample());
                if self.log_due() {
                    tracing::warn!(peer = %name, role, %reason, count = self.logged, retry_in_s = d.as_secs_f64(), "delivery failed; backing off");
                }
                status.failed(reason, Some(d), false);
                d
            }
        }
    }

    /// The wait after a local failure (`what` failed with `error`: the store, a thread):
    /// the backoff, shown and logged like a failed delivery.
    pub fn local(
        &mut self,
        what: &str,
        error: &dyn std::fmt::Display,
        status: &dyn Report,
    ) -> Duration {
        self.after(
            &Outcome::Retry {
                reason: format!("{what}: {error}"),
                unreachable: false,
            },
            status,
        )
    }

    /// Runs `f` until it succeeds (the store is busy, a file is missing...), backing off in
    /// between; `None` when `stop` was cancelled first.
    pub fn until_ok<T, E: std::fmt::Display>(
        &mut self,
        what: &str,
        stop: &CancellationToken,
        status: &dyn Report,
        mut f: impl FnMut() -> Result<T, E>,
    ) -> Option<T> {
        loop {
            match f() {
                Ok(v) => {
                    self.failures = 0;
                    return Some(v);
                }
                Err(e) => {
                    let d = self.local(what, &e, status);
                    if !nap(stop, d) {
                        return None;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Seen(Mutex<Vec<(String, Option<Duration>, bool)>>);
    impl Report for Seen {
        fn failed(&self, reason: &str, retry_in: Option<Duration>, paused: bool) {
            self.0
                .lock()
                .unwrap()
                .push((reason.to_string(), retry_in, paused));
        }
    }

    fn retry(min: u64, max: u64) -> Retry {
        Retry {
            timeout: Interval(Duration::from_secs(1)),
            min_backoff: Interval(Duration::from_millis(min)),
            max_backoff: Interval(Duration::from_millis(max)),
        }
    }

    #[test]
    fn min_backoff_above_max_backoff_is_refused() {
        assert!(retry(100, 1000).validate().is_ok());
        assert!(retry(1000, 1000).validate().is_ok());
        let e = retry(2000, 1000).validate().unwrap_err();
        assert!(
            e.contains("min_backoff") && e.contains("max_backoff"),
            "{e}"
        );
        let mut r = retry(1, 2);
        r.timeout = Interval(Duration::ZERO);
        assert!(r.validate().unwrap_err().contains("timeout"));
    }

    #[test]
    fn each_outcome_waits_as_the_policy_says() {
        let seen = Seen::default();
        let mut r = Retrier::new("sink", "s", retry(100, 1000));
        // Backoff doubles with equal jitter, capped; a success starts it over.
        let fail = Outcome::Retry {
            reason: "HTTP 500".into(),
            unreachable: false,
        };
        let d1 = r.after(&fail, &seen);
        let d2 = r.after(&fail, &seen);
        assert!(
            d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100),
            "{d1:?}"
        );
        assert!(
            d2 >= Duration::from_millis(100) && d2 <= Duration::from_millis(200),
            "{d2:?}"
        );
        for _ in 0..10 {
            assert!(r.after(&fail, &seen) <= Duration::from_millis(1000));
        }
        r.succeeded();
        assert!(r.after(&fail, &seen) <= Duration::from_millis(100));
        // Paused: max_backoff, shown as paused.
        let p = Outcome::Pause {
            status: 404,
            reason: "HTTP 404 (no such endpoint)".into(),
        };
        assert_eq!(r.after(&p, &seen), Duration::from_millis(1000));
        assert!(seen.0.lock().unwrap().last().unwrap().2);
        // Retry-After: exactly that.
        let ra = Outcome::RetryAfter {
            after: Duration::from_secs(3),
            reason: "HTTP 503".into(),
        };
        assert_eq!(r.after(&ra, &seen), Duration::from_secs(3));
        // A split never retries at once.
        let s = Outcome::Shrink {
            reason: "HTTP 413".into(),
        };
        assert!(r.after(&s, &seen) > Duration::ZERO);
    }

    #[test]
    fn until_ok_backs_off_and_stops_on_cancel() {
        let seen = Seen::default();
        let stop = CancellationToken::new();
        let mut r = Retrier::new("notifier", "n", retry(1, 2));
        let mut tries = 0;
        let v = r.until_ok("open", &stop, &seen, || {
            tries += 1;
            if tries < 3 {
                Err("busy")
            } else {
                Ok(tries)
            }
        });
        assert_eq!(v, Some(3));
        assert_eq!(seen.0.lock().unwrap().len(), 2);
        stop.cancel();
        let v: Option<()> = r.until_ok("open", &stop, &seen, || Err("busy"));
        assert_eq!(v, None);
    }
}
