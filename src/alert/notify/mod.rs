//! Notifiers (`[[notify]]`): deliver the outbox's events to Alertmanager, MQTT and webhooks
//! (placeholder: owned by the delivery work, which replaces this file).

pub mod config;
