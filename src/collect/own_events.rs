//! The agent's own events: transitions of its state, turned into `edgewatch_event` points by
//! the health collector at each of its ticks ([`Watch::tick`], pure given its inputs). A
//! sink losing its link (`sink_down`, warning, with the error) and getting it back
//! (`sink_up`, info, with how long it was down; only after a `sink_down`, so a sink's first
//! connection at start is not an event), a sink paused by its receiver (`sink_paused`,
//! warning: credentials or a wrong path, data kept), a collector restarted (`collector_restart`,
//! warning: tegrastats exited, failed or stalled) and the wall clock stepped (`clock_step`,
//! warning: realtime moved against `CLOCK_BOOTTIME` by more than [`CLOCK_STEP_NS`], so
//! timestamps around it jumped). Every event has `source=agent`; the sink and collector
//! events carry the `sink` / `collector` tag. The first tick only records the state.

use std::collections::BTreeMap;

use super::event::{Event, Severity};
use crate::model::Value;
use crate::status::{Sink, Tegrastats};

/// The least clock step reported, ns (NTP slews smaller offsets anyway).
pub const CLOCK_STEP_NS: i64 = 1_000_000_000;

/// What one tick sees.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Every sink's status.
    pub sinks: Vec<Sink>,
    /// The tegrastats collector's status (`None`: not running here).
    pub tegrastats: Option<Tegrastats>,
    /// Realtime minus `CLOCK_BOOTTIME`, ns, and the boot it belongs to.
    pub clock: Option<(String, i64)>,
}

/// A sink's last seen state.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SinkWas {
    connected: bool,
    paused: bool,
    /// When a `sink_down` was reported (ns), until it comes back.
    down_since: Option<i64>,
}

/// The state between ticks.
#[derive(Debug, Default)]
pub struct Watch {
    first: bool,
    sinks: BTreeMap<String, SinkWas>,
    tegrastats_restarts: Option<u64>,
    clock: Option<(String, i64)>,
}

impl Watch {
    /// A watcher whose first tick records the state only.
    pub fn new() -> Watch {
        Watch {
            first: true,
            ..Watch::default()
        }
    }

    /// The events between the previous tick and this one, seen at `now` (ns).
    pub fn tick(&mut self, seen: &Seen, now: i64) -> Vec<Event> {
        let mut out = Vec::new();
        let first = std::mem::replace(&mut self.first, false);
        for s in &seen.sinks {
            let was = self.sinks.get(&s.name).copied();
            let mut now_was = SinkWas {
                connected: s.connected,
                paused: s.paused,
                down_since: was.and_then(|w| w.down_since),
            };
            if let (Some(w), false) = (was, first) {
                let err = s.last_error.as_deref().unwrap_or("no answer");
                if w.connected && !s.connected {
                    out.push(
                        Event::new(
                            "sink_down",
                            Severity::Warning,
                            "agent",
                            format!("sink {} ({}) lost its link: {err}", s.name, s.kind),
                        )
                        .tag("sink", s.name.as_str())
                        .field("error", Value::Str(err.to_string()))
                        .field("backlog_points", Value::I64(s.backlog_points)),
                    );
                    now_was.down_since = Some(now);
                }
                if !w.paused && s.paused {
                    out.push(
                        Event::new(
                            "sink_paused",
                            Severity::Warning,
                            "agent",
                            format!(
                                "sink {} ({}) paused: the receiver refused ({err}); data is kept",
                                s.name, s.kind
                            ),
                        )
                        .tag("sink", s.name.as_str())
                        .field("error", Value::Str(err.to_string())),
                    );
                    now_was.down_since = now_was.down_since.or(Some(now));
                }
                if s.connected && !s.paused {
                    if let Some(since) = now_was.down_since.take() {
                        let down_s = (now - since).max(0) as f64 / 1e9;
                        out.push(
                            Event::new(
                                "sink_up",
                                Severity::Info,
                                "agent",
                                format!(
                                    "sink {} ({}) is up again after {down_s:.0} s",
                                    s.name, s.kind
                                ),
                            )
                            .tag("sink", s.name.as_str())
                            .field("down_s", Value::F64(down_s))
                            .field("backlog_points", Value::I64(s.backlog_points)),
                        );
                    }
                }
            }
            self.sinks.insert(s.name.clone(), now_was);
        }
        if let Some(t) = &seen.tegrastats {
            if let Some(before) = self.tegrastats_restarts {
                if t.restarts > before && !first {
                    let n = t.restarts - before;
                    out.push(
                        Event::new(
                            "collector_restart",
                            Severity::Warning,
                            "agent",
                            format!(
                                "tegrastats restarted{}: {}",
                                if n > 1 {
                                    format!(" {n} times")
                                } else {
                                    String::new()
                                },
                                t.detail
                            ),
                        )
                        .tag("collector", "tegrastats")
                        .field("restarts", Value::I64(i64::try_from(n).unwrap_or(i64::MAX)))
                        .field("detail", Value::Str(t.detail.clone())),
                    );
                }
            }
            self.tegrastats_restarts = Some(t.restarts);
        }
        if let Some((boot, offset)) = &seen.clock {
            if let Some((was_boot, was_offset)) = &self.clock {
                let step = offset - was_offset;
                if boot == was_boot && step.abs() >= CLOCK_STEP_NS && !first {
                    let s = step as f64 / 1e9;
                    out.push(
                        Event::new(
                            "clock_step",
                            Severity::Warning,
                            "agent",
                            format!("the wall clock was stepped by {s:+.1} s"),
                        )
                        .field("step_s", Value::F64(s)),
                    );
                }
            }
            self.clock = Some((boot.clone(), *offset));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(connected: bool, paused: bool) -> Sink {
        Sink {
            name: "fleet".into(),
            kind: "influxdb".into(),
            connected,
            paused,
            last_error: (!connected).then(|| "connection refused".to_string()),
            ..Sink::default()
        }
    }

    fn kinds(ev: &[Event]) -> Vec<&str> {
        ev.iter().map(|e| e.kind.as_str()).collect()
    }

    #[test]
    fn a_sink_going_down_and_back_is_two_events_and_its_first_connection_none() {
        let mut w = Watch::new();
        let at = |s: Sink| Seen {
            sinks: vec![s],
            ..Seen::default()
        };
        // Start: not connected yet, then connected: no event.
        assert!(w.tick(&at(sink(false, false)), 0).is_empty());
        assert!(w.tick(&at(sink(true, false)), 10).is_empty());
        let down = w.tick(&at(sink(false, false)), 20);
        assert_eq!(kinds(&down), ["sink_down"]);
        assert!(down[0].message.contains("connection refused"), "{down:?}");
        assert!(w.tick(&at(sink(false, false)), 30).is_empty());
        let up = w.tick(&at(sink(true, false)), 20 + 90_000_000_000);
        assert_eq!(kinds(&up), ["sink_up"]);
        assert_eq!(up[0].fields[0], ("down_s".into(), Value::F64(90.0)));
        assert_eq!(
            up[0].line(1).key,
            "edgewatch_event,kind=sink_up,severity=info,sink=fleet,source=agent"
        );
        // Paused by the receiver, then accepted again.
        assert_eq!(kinds(&w.tick(&at(sink(true, true)), 40)), ["sink_paused"]);
        assert_eq!(kinds(&w.tick(&at(sink(true, false)), 50)), ["sink_up"]);
    }

    #[test]
    fn collector_restarts_and_clock_steps() {
        let mut w = Watch::new();
        let at = |restarts: u64, offset: i64| Seen {
            tegrastats: Some(Tegrastats {
                restarts,
                detail: "tegrastats exited (exit status: 1); restart in 1s".into(),
                ..Tegrastats::default()
            }),
            clock: Some(("boot-a".into(), offset)),
            ..Seen::default()
        };
        // A restart before the agent's first tick is history, not news.
        assert!(w.tick(&at(2, 0), 0).is_empty());
        let ev = w.tick(&at(4, 500_000_000), 1);
        assert_eq!(kinds(&ev), ["collector_restart"]);
        assert!(ev[0]
            .message
            .starts_with("tegrastats restarted 2 times: tegrastats exited"));
        // NTP steps the clock back 90 s.
        let ev = w.tick(&at(4, -89_500_000_000), 2);
        assert_eq!(kinds(&ev), ["clock_step"]);
        assert_eq!(ev[0].message, "the wall clock was stepped by -90.0 s");
        // A new boot is not a step.
        let mut other = at(4, 5_000_000_000_000);
        other.clock = Some(("boot-b".into(), 5_000_000_000_000));
        assert!(w.tick(&other, 3).is_empty());
    }
}
