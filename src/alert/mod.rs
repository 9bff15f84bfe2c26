//! Alerts: rules evaluated on the device over the store, incidents with a spike-triage
//! snapshot, and notifications delivered through a durable outbox. The evaluator reads the
//! store only through the query engine (rollup tiers plus the raw tail, as a dashboard does);
//! its writes are its own rows: alert instance state and history, incidents, and outbox
//! entries, each in a short transaction of its own connection. It never writes points and
//! never reads the ingest queue.
//!
//! Layout: [`config`] (`[alerts]`, `[[alert]]`), [`event`] (the notification every notifier
//! sends, as the outbox stores it), [`incident`] (the triage snapshot taken when an instance
//! fires), [`notify`] (`[[notify]]`: Alertmanager, MQTT, webhook; delivery from the outbox).
//! The evaluator: [`rules`] (user rules and built-ins as one `Rule`), [`eval`] (the instance
//! state machine; pure), [`observe`] (a rule's value per instance, through the engine or the
//! agent's own status), [`task`] (the periodic evaluation and its transaction), [`view`]
//! (the last evaluation for the API, `/metrics` and the status).

pub mod config;
pub mod eval;
pub mod event;
pub mod incident;
pub mod notify;
pub mod observe;
pub mod rules;
pub mod task;
pub mod view;
