//! Ingest: the InfluxDB-compatible write endpoints (HTTP `/write` and `/api/v2/write`) and
//! the UDP line-protocol listener. Both decode and parse off the async workers, then hand a
//! batch to the bounded queue; HTTP waits for the writer's commit before answering 204.
//! Ingest never touches the store directly.

pub mod http;
pub mod lineproto;
pub mod udp;
