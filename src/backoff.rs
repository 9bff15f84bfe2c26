//! Capped exponential backoff with jitter, the one used by every retry loop: a delay that
//! starts at `min`, doubles per consecutive failure and stops at `max`, optionally spread
//! by a jitter value so that many devices restarting together do not retry in step. Pure:
//! time and randomness are arguments ([`Jitter`] is a small seeded generator for callers
//! that want one); it never sleeps, never reads the clock itself and never logs.
//!
//! The attempt number counts from 0: `delay(0, ..)` is the wait after the first failure.
//! A caller that counts retries from 1 passes `failures - 1`. The shapes in use: the
//! tegrastats restarts (1 s to 60 s, [`Spread::Shorten`] by up to a quarter), a lost NVML GPU
//! (10 s to 5 min, [`Spread::None`]); a forwarder's retries fit `Backoff::new(min, max)`
//! with [`Spread::Equal`] and `delay(failures - 1, jitter)`, and a job that skips whole
//! intervals fits `Backoff::new(interval, 32 * interval).base(failures)`.

use std::time::Duration;

/// How a jitter value `j` in `[0, 1)` spreads the capped delay `d`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Spread {
    /// Exactly `d`: deterministic (a local retry where nothing can align).
    None,
    /// `d * (1 - j * fraction)`: up to `fraction` of the delay taken off, never longer.
    Shorten(f64),
    /// "Equal jitter": `d / 2 + d / 2 * j`, a point in the upper half.
    Equal,
}

/// A capped exponential backoff policy: `min * 2^attempt`, at most `max`, spread by
/// [`Spread`]. Copyable and `const`-constructible, so a policy can be a constant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first delay.
    pub min: Duration,
    /// The longest delay (before the spread).
    pub max: Duration,
    /// How jitter spreads each delay.
    pub spread: Spread,
}

impl Backoff {
    /// `min` doubling to `max`, without jitter.
    pub const fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            spread: Spread::None,
        }
    }

    /// The same policy with `spread` applied to each delay.
    pub const fn with_spread(self, spread: Spread) -> Backoff {
        Backoff { spread, ..self }
    }

    /// The delay after `attempt` earlier failures (0 = first), before jitter: `min * 2^attempt`
    /// capped at `max` (and never below `min` unless `min > max`, where it is `max`).
    pub fn base(&self, attempt: u32) -> Duration {
        let floor = self.min.min(self.max);
        self.min
            .saturating_mul(1u32 << attempt.min(31))
            .min(self.max)
            .max(floor)
    }

    /// The delay after `attempt` earlier failures with jitter value `jitter` in `[0, 1)`
    /// (clamped; see [`Spread`]).
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let d = self.base(attempt);
        let j = if jitter.is_nan() {
            0.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        match self.spread {
            Spread::None => d,
            Spread::Shorten(fraction) => d.mul_f64(1.0 - j * fraction.clamp(0.0, 1.0)),
            Spread::Equal => {
                let half = d / 2;
                half + half.mul_f64(j)
            }
        }
    }

    /// When to retry, in Unix ns, after a failure at `now_ns` with `attempt` earlier
    /// failures: `now_ns + delay(attempt, jitter)`, saturating.
    pub fn retry_at_ns(&self, now_ns: i64, attempt: u32, jitter: f64) -> i64 {
        let d = i64::try_from(self.delay(attempt, jitter).as_nanos()).unwrap_or(i64::MAX);
        now_ns.saturating_add(d)
    }
}

/// A small xorshift generator of jitter values in `[0, 1)` (no need for a CSPRNG here).
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from `seed` (for example the clock in ns) and a name, so two loops started in
    /// the same nanosecond still differ.
    pub fn new(seed: u64, name: &str) -> Jitter {
        let mut s = seed | 1;
        for b in name.bytes() {
            s = s.rotate_left(5) ^ u64::from(b);
        }
        Jitter(s | 1)
    }

    /// Seeded from the system clock and `name`.
    pub fn from_clock(name: &str) -> Jitter {
        Jitter::new(crate::now_ns().unsigned_abs(), name)
    }

    /// The next value in `[0, 1)`.
    pub fn sample(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn doubles_from_min_to_the_cap() {
        let b = Backoff::new(s(1), s(60));
        let secs: Vec<u64> = (0..9).map(|a| b.base(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b.base(u32::MAX), s(60));
        assert_eq!(b.delay(3, 0.7), s(8), "no spread: jitter ignored");
        // A large min never overflows and never exceeds the cap.
        let big = Backoff::new(Duration::MAX / 2, Duration::MAX);
        assert_eq!(big.base(40), Duration::MAX);
        // min > max: the cap wins.
        assert_eq!(Backoff::new(s(10), s(5)).base(0), s(5));
    }

    #[test]
    fn shorten_takes_off_at_most_its_fraction() {
        let b = Backoff::new(s(1), s(60)).with_spread(Spread::Shorten(0.25));
        assert_eq!(b.delay(0, 0.0), s(1));
        assert_eq!(b.delay(0, 1.0), Duration::from_millis(750));
        assert_eq!(b.delay(7, 5.0), s(45), "jitter clamped to 1");
        assert_eq!(b.delay(7, -1.0), s(60), "jitter clamped to 0");
        assert_eq!(b.delay(2, f64::NAN), s(4), "NaN is no jitter");
    }

    #[test]
    fn equal_jitter_picks_the_upper_half() {
        let b = Backoff::new(s(1), s(60)).with_spread(Spread::Equal);
        assert_eq!(b.delay(0, 0.0), Duration::from_millis(500));
        assert_eq!(b.delay(0, 0.999_999).as_millis(), 999);
        assert_eq!(b.delay(2, 0.0), s(2));
        assert_eq!(b.delay(29, 0.0), s(30));
        assert!(b.delay(29, 1.0) <= s(60));
    }

    #[test]
    fn covers_the_forwarder_and_rollup_schedules() {
        // forward::backoff(failures, 1 s, 60 s, j) for failures = 1, 3, 30 at j = 0.
        let fwd = Backoff::new(s(1), s(60)).with_spread(Spread::Equal);
        assert_eq!(fwd.delay(0, 0.0), Duration::from_millis(500));
        assert_eq!(fwd.delay(2, 0.0), s(2));
        assert_eq!(fwd.delay(29, 0.0), s(30));
        // The rollup job waits 2^min(failures, 5) intervals.
        let rollup = Backoff::new(s(1), s(32));
        for f in 0..10u32 {
            assert_eq!(rollup.base(f).as_secs(), 1 << f.min(5));
        }
    }

    #[test]
    fn retry_time_is_now_plus_the_delay_and_saturates() {
        let b = Backoff::new(s(10), s(300));
        assert_eq!(b.retry_at_ns(5, 0, 0.0), 5 + 10_000_000_000);
        assert_eq!(b.retry_at_ns(0, 1, 0.0), 20_000_000_000);
        assert_eq!(b.retry_at_ns(0, 9, 0.0), 300_000_000_000);
        assert_eq!(b.retry_at_ns(i64::MAX - 1, 0, 0.0), i64::MAX);
    }

    #[test]
    fn jitter_is_in_range_and_differs_by_name() {
        let mut a = Jitter::new(42, "a");
        let mut b = Jitter::new(42, "b");
        let xs: Vec<f64> = (0..1000).map(|_| a.sample()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((0.4..0.6).contains(&mean), "mean {mean}");
        assert_ne!(Jitter::new(42, "a").sample(), b.sample());
        let mut c = Jitter::from_clock("c");
        assert!((0.0..1.0).contains(&c.sample()));
    }
}
