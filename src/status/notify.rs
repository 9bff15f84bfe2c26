//! The `notify` part of the status document: one entry per `[[notify]]` with its durable
//! position in the alert outbox, its backlog, totals and its last success, error and dead
//! letter. Filled by `alert::notify::NotifyStatus::snapshot`; shape only, no I/O.

use serde::{Deserialize, Serialize};

/// Every notifier (`notify` in `/api/v1/status`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Notify {
    /// One per configured `[[notify]]`, in config order.
    pub notifiers: Vec<Notifier>,
}

/// One notifier's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Notifier {
    /// `alertmanager`, `mqtt` or `webhook`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The notifier's name.
    pub name: String,
    /// False: configured off (it keeps its position and sends nothing).
    pub enabled: bool,
    /// The last outbox `seq` the receiver acknowledged or that was dead-lettered.
    pub position: i64,
    /// Events in the outbox after the position (still to deliver).
    pub pending_events: i64,
    /// Events delivered, all time.
    pub delivered: i64,
    /// Send attempts that failed since the agent started (retried).
    pub failures: u64,
    /// Events the receiver refused as bad and that were set aside, all time.
    pub dead_letters: i64,
    /// The newest dead letter, if any.
    pub last_dead_letter: Option<NotifyDeadLetter>,
    /// When the receiver last acknowledged (Unix ns).
    pub last_success_ns: Option<i64>,
    /// The last failure, cleared by the next success.
    pub last_error: Option<String>,
    /// When it happened (Unix ns).
    pub last_error_ns: Option<i64>,
    /// When the next attempt is due while backing off (Unix ns); `null` when not waiting.
    pub next_retry_ns: Option<i64>,
    /// Paused: the receiver refused for a reason that does not pass by itself (credentials,
    /// a wrong path, a body limit below one event); the events are kept and the same one is
    /// tried again every `max_backoff`.
    #[serde(default)]
    pub paused: bool,
    /// Events pruned from the outbox before this notifier sent them (the outbox was over its
    /// bound while the notifier was disabled or down), all time.
    #[serde(default)]
    pub pruned_unsent: i64,
    /// Something the user should know that is not an error of the last attempt (events
    /// pruned unsent).
    #[serde(default)]
    pub warning: Option<String>,
    /// Alertmanager: instances firing as of the position (re-sent every `resend_interval`).
    pub firing: Option<u64>,
    /// Alertmanager: when the firing set was last re-sent and acknowledged (Unix ns).
    pub last_resend_ns: Option<i64>,
}

impl crate::status::cell::FailureFields for Notifier {
    fn failure_fields(&mut self) -> crate::status::cell::FailureRefs<'_> {
        let n = self;
        (
            &mut n.last_error,
            &mut n.last_error_ns,
            &mut n.failures,
            &mut n.paused,
            &mut n.next_retry_ns,
        )
    }
}

/// A dead-lettered event, as the status shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NotifyDeadLetter {
    /// Its outbox `seq`.
    pub seq: i64,
    /// The HTTP status that refused it (0: the stored event could not be read).
    pub status: u16,
    /// The receiver's reason.
    pub reason: String,
    /// When (Unix ns).
    pub at_ns: i64,
}
