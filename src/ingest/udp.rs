//! UDP line protocol: each datagram holds one or more lines. There is nobody to answer,
//! so bad lines are counted as rejected and datagrams that find the queue full (or hold more
//! points than the whole queue) are dropped and counted; the socket never waits on the
//! writer. UDP carries no credential: off loopback it needs `[udp] allow_unauthenticated`
//! (checked by `web::auth::check_listeners` before the socket is bound).

use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::lineproto::{parse_body, Precision};
use crate::queue::{IngestHandle, SubmitError};
use crate::stats::Stats;

/// Receives datagrams until `shutdown` is cancelled.
pub async fn serve(
    socket: UdpSocket,
    precision: Precision,
    handle: IngestHandle,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) {
    let mut buf = vec![0u8; 65_536];
    let mut warned_full = false;
    loop {
        let n = tokio::select! {
            // Cancel-safe: a datagram not yet received stays in the kernel buffer and is
            // lost with the socket either way.
            _ = shutdown.cancelled() => break,
            r = socket.recv_from(&mut buf) => match r {
                Ok((n, _)) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "udp receive failed");
                    continue;
                }
            },
        };
        Stats::add(&stats.udp_datagrams, 1);
        let text = String::from_utf8_lossy(&buf[..n]);
        let parsed = parse_body(&text, precision, crate::now_ns());
        if !parsed.errors.is_empty() {
            Stats::add(&stats.points_rejected, parsed.errors.len() as u64);
            tracing::debug!(first = %parsed.errors[0].error, count = parsed.errors.len(), "udp lines rejected");
        }
        if parsed.batch.lines.is_empty() {
            continue;
        }
        let points = parsed.batch.len() as u64;
        match handle.submit(parsed.batch, false) {
            Ok(_) => warned_full = false,
            Err(SubmitError::Full { .. }) => {
                Stats::add(&stats.points_dropped, points);
                // A datagram larger than the whole queue is logged once by the queue.
                if !warned_full && handle.admits(points as usize) {
                    tracing::warn!(
                        "ingest queue full: dropping UDP datagrams (counted in points_dropped)"
                    );
                    warned_full = true;
                }
            }
            Err(SubmitError::Closed) => break,
        }
    }
}
