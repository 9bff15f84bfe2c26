//! The state machine of one alert instance: inactive -> pending -> firing -> resolved
//! (inactive again), driven by one observation per evaluation. `for` holds a true condition
//! in pending before it fires (zero fires at once), `keep_firing_for` keeps a firing
//! instance firing after its condition cleared, and `no_data` says what an empty window
//! means. Pure: the time is an argument; it never reads or writes the store.

use serde::{Deserialize, Serialize};

use super::config::{NoData, Op};

/// An instance's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// The condition does not hold.
    #[default]
    Inactive,
    /// The condition holds, for less than `for`.
    Pending,
    /// The condition held for `for` (or within `keep_firing_for` of that).
    Firing,
}

impl State {
    /// As stored and answered.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Inactive => "inactive",
            State::Pending => "pending",
            State::Firing => "firing",
        }
    }

    /// Parses [`State::as_str`]'s words.
    pub fn parse(s: &str) -> Option<State> {
        Some(match s {
            "inactive" => State::Inactive,
            "pending" => State::Pending,
            "firing" => State::Firing,
            _ => return None,
        })
    }
}

/// A change of state, as the history records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transition {
    /// inactive -> pending.
    Pending,
    /// pending (or inactive, with `for = "0s"`) -> firing.
    Firing,
    /// firing -> inactive.
    Resolved,
    /// pending -> inactive, without having fired.
    Cancelled,
}

impl Transition {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Transition::Pending => "pending",
            Transition::Firing => "firing",
            Transition::Resolved => "resolved",
            Transition::Cancelled => "cancelled",
        }
    }
}

/// One instance's remembered state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Instance {
    /// State.
    pub state: State,
    /// When the condition started to hold (pending or firing), ns.
    pub active_since_ns: Option<i64>,
    /// When it fired, ns.
    pub fired_ns: Option<i64>,
    /// The last evaluation at which the condition held, ns.
    pub last_true_ns: Option<i64>,
    /// The last value observed (`None`: no data).
    pub value: Option<f64>,
    /// The incident opened when it fired.
    pub incident_id: Option<i64>,
}

/// What one evaluation saw for an instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Observation {
    /// A value.
    Value(f64),
    /// An empty window.
    NoData,
}

/// The condition and timing of a rule, as the state machine needs them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Condition {
    /// Comparison.
    pub op: Op,
    /// Threshold.
    pub threshold: f64,
    /// `for`, ns.
    pub for_ns: i64,
    /// `keep_firing_for`, ns.
    pub keep_firing_for_ns: i64,
    /// `no_data`.
    pub no_data: NoData,
}

/// The next state of `prev` after observing `obs` at `now`, and the transition made, if any.
pub fn step(
    prev: &Instance,
    obs: Observation,
    c: &Condition,
    now: i64,
) -> (Instance, Option<Transition>) {
    let (value, holds) = match obs {
        Observation::Value(v) => (Some(v), c.op.holds(v, c.threshold)),
        Observation::NoData => match c.no_data {
            NoData::Ok => (None, false),
            NoData::Firing => (None, true),
            // Nothing moves, timers included, until data returns.
            NoData::Keep => return (prev.clone(), None),
        },
    };
    let mut next = Instance {
        value,
        ..prev.clone()
    };
    if holds {
        next.last_true_ns = Some(now);
    }
    let fire = |mut i: Instance| {
        i.state = State::Firing;
        i.fired_ns = Some(now);
        (i, Some(Transition::Firing))
    };
    match (prev.state, holds) {
        (State::Inactive, true) => {
            next.active_since_ns = Some(now);
            next.fired_ns = None;
            next.incident_id = None;
            if c.for_ns <= 0 {
                fire(next)
            } else {
                next.state = State::Pending;
                (next, Some(Transition::Pending))
            }
        }
        (State::Inactive, false) => (next, None),
        (State::Pending, true) => {
            let since = prev.active_since_ns.unwrap_or(now);
            if now.saturating_sub(since) >= c.for_ns {
                fire(next)
            } else {
                (next, None)
            }
        }
        (State::Pending, false) => (
            Instance {
                state: State::Inactive,
                active_since_ns: None,
                fired_ns: None,
                ..next
            },
            Some(Transition::Cancelled),
        ),
        (State::Firing, true) => (next, None),
        (State::Firing, false) => {
            let last = prev.last_true_ns.unwrap_or(i64::MIN);
            if c.keep_firing_for_ns > 0 && now.saturating_sub(last) < c.keep_firing_for_ns {
                (next, None)
            } else {
                (
                    Instance {
                        state: State::Inactive,
                        ..next
                    },
                    Some(Transition::Resolved),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn cond(for_s: i64, keep_s: i64, no_data: NoData) -> Condition {
        Condition {
            op: Op::Gt,
            threshold: 10.0,
            for_ns: for_s * S,
            keep_firing_for_ns: keep_s * S,
            no_data,
        }
    }

    /// Runs `obs` at 1 s apart from t = 0; returns (state, transition) after each.
    fn run(c: &Condition, obs: &[Observation]) -> Vec<(State, Option<Transition>)> {
        let mut i = Instance::default();
        obs.iter()
            .enumerate()
            .map(|(t, o)| {
                let (n, tr) = step(&i, *o, c, t as i64 * S);
                i = n;
                (i.state, tr)
            })
            .collect()
    }

    use Observation::{NoData as Nd, Value as V};
    use State::*;

    #[test]
    fn pending_for_then_firing_then_resolved() {
        let c = cond(2, 0, NoData::Ok);
        let got = run(&c, &[V(1.0), V(11.0), V(12.0), V(13.0), V(14.0), V(5.0)]);
        assert_eq!(
            got,
            vec![
                (Inactive, None),
                (Pending, Some(Transition::Pending)),
                (Pending, None),
                (Firing, Some(Transition::Firing)),
                (Firing, None),
                (Inactive, Some(Transition::Resolved)),
            ]
        );
    }

    #[test]
    fn zero_for_fires_at_once_and_a_dip_cancels_pending() {
        assert_eq!(
            run(&cond(0, 0, NoData::Ok), &[V(11.0)]),
            vec![(Firing, Some(Transition::Firing))]
        );
        assert_eq!(
            run(&cond(5, 0, NoData::Ok), &[V(11.0), V(1.0), V(11.0)]),
            vec![
                (Pending, Some(Transition::Pending)),
                (Inactive, Some(Transition::Cancelled)),
                (Pending, Some(Transition::Pending)),
            ]
        );
    }

    #[test]
    fn active_since_is_the_pending_start_and_survives_firing() {
        let c = cond(1, 0, NoData::Ok);
        let (a, _) = step(&Instance::default(), V(11.0), &c, 7 * S);
        let (b, t) = step(&a, V(11.0), &c, 8 * S);
        assert_eq!(t, Some(Transition::Firing));
        assert_eq!(b.active_since_ns, Some(7 * S));
        assert_eq!(b.fired_ns, Some(8 * S));
    }

    #[test]
    fn keep_firing_for_holds_after_the_condition_clears() {
        let c = cond(0, 2, NoData::Ok);
        let got = run(&c, &[V(11.0), V(1.0), V(1.0), V(1.0)]);
        assert_eq!(
            got,
            vec![
                (Firing, Some(Transition::Firing)),
                (Firing, None),
                (Inactive, Some(Transition::Resolved)),
                (Inactive, None),
            ]
        );
    }

    #[test]
    fn no_data_modes() {
        // ok: an empty window resolves.
        assert_eq!(
            run(&cond(0, 0, NoData::Ok), &[V(11.0), Nd]),
            vec![
                (Firing, Some(Transition::Firing)),
                (Inactive, Some(Transition::Resolved))
            ]
        );
        // keep: nothing moves until data returns.
        assert_eq!(
            run(&cond(0, 0, NoData::Keep), &[V(11.0), Nd, Nd, V(1.0)]),
            vec![
                (Firing, Some(Transition::Firing)),
                (Firing, None),
                (Firing, None),
                (Inactive, Some(Transition::Resolved))
            ]
        );
        assert_eq!(
            run(&cond(0, 0, NoData::Keep), &[Nd]),
            vec![(Inactive, None)]
        );
        // firing: silence is the alert.
        assert_eq!(
            run(&cond(1, 0, NoData::Firing), &[Nd, Nd, V(1.0)]),
            vec![
                (Pending, Some(Transition::Pending)),
                (Firing, Some(Transition::Firing)),
                (Inactive, Some(Transition::Resolved))
            ]
        );
    }

    #[test]
    fn states_read_back() {
        for s in [Inactive, Pending, Firing] {
            assert_eq!(State::parse(s.as_str()), Some(s));
        }
        assert_eq!(State::parse("resolved"), None);
    }
}
