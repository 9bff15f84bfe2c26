//! edgewatch: a telemetry agent for edge-AI devices. See `ARCHITECTURE.md` for the map;
//! data flows one way: collectors/ingest -> [`queue`] -> [`writer`] -> [`store`] ->
//! ([`rollup`], [`forward`], [`engine`]) -> [`api`] and [`web`]. [`clock`] holds rollup and
//! forwarding back while the device's clock is not set.

pub mod agent;
pub mod alert;
pub mod api;
pub mod backoff;
pub mod clock;
pub mod collect;
pub mod config;
pub mod deliver;
pub mod engine;
pub mod fleet;
pub mod forward;
pub mod fsutil;
pub mod hash;
pub mod ingest;
pub mod model;
pub mod periodic;
pub mod queue;
pub mod reload;
pub mod rollup;
pub mod stats;
pub mod status;
pub mod store;
pub mod timeparse;
pub mod web;
pub mod writer;

/// The current time in Unix epoch nanoseconds (0 if the clock is before 1970).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
