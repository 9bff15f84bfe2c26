//! The tick of every periodic task (the collectors, the health points, the rollup job): a
//! fixed period whose missed ticks are skipped, not bunched up after a slow run or a
//! suspended process, and a wait that ends when the task is cancelled. What runs on each
//! tick, and how it backs off after an error ([`crate::backoff`]), stays with the task; this
//! module never runs work itself, never sleeps outside [`Ticker::next`] and never logs.

use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// A period whose missed ticks are skipped. The first tick is immediate.
#[derive(Debug)]
pub struct Ticker(Interval);

impl Ticker {
    /// Ticks every `period` (which must be non-zero, as a config `Interval` is).
    pub fn new(period: Duration) -> Ticker {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        Ticker(tick)
    }

    /// Waits for the next tick and returns when it was due; `None` once `stop` is cancelled
    /// (checked first, so a cancelled task never starts another round). Cancelling this wait
    /// loses nothing: no work has started.
    pub async fn next(&mut self, stop: &CancellationToken) -> Option<Instant> {
        tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            at = self.0.tick() => Some(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn skips_missed_ticks_and_stops_on_cancel() {
        let p = Duration::from_millis(20);
        let stop = CancellationToken::new();
        let mut t = Ticker::new(p);
        let t0 = t.next(&stop).await.unwrap();
        // A round that overran 3.5 periods: one late tick, then back on the grid, without
        // the burst of missed ticks tokio's default delivers.
        tokio::time::sleep(p * 7 / 2).await;
        let late = t.next(&stop).await.unwrap();
        let after = t.next(&stop).await.unwrap();
        assert_eq!(late - t0, p, "the missed tick fires once");
        assert!(
            after - t0 >= p * 4,
            "missed ticks skipped: {:?}",
            after - t0
        );
        assert_eq!(
            (after - t0).as_millis() % 20,
            0,
            "still on the original grid"
        );
        // Cancelled: no further round, even with a tick due.
        tokio::time::sleep(p * 2).await;
        stop.cancel();
        assert_eq!(t.next(&stop).await, None);
    }
}
