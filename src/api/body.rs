//! Streamed response bodies: [`BodyWriter`] is an `io::Write` on the blocking pool whose
//! bytes go out as the body of a response already sent, in pieces, so a large answer
//! (`/metrics`, a query's JSON) is never held whole; [`json`] serializes a typed value
//! through it. It never decides what is written, and never buffers more than a few pieces.

use std::time::Duration;

use warp::http::header::CONTENT_TYPE;
use warp::http::HeaderValue;
use warp::reply::Response;

/// How long a scrape waits for the scraper to take the next piece before giving up.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Size of the pieces a streamed answer is sent in.
pub const PIECE_BYTES: usize = 64 * 1024;

/// An `io::Write` that sends what is written as a streamed response body, in pieces of
/// [`PIECE_BYTES`], waiting (at most [`SEND_TIMEOUT`] each) while the client is behind: at
/// most a few pieces are in memory whatever the answer's size. For the blocking pool only.
pub struct BodyWriter {
    buf: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
    rt: tokio::runtime::Handle,
}

impl BodyWriter {
    /// A writer and the response body it feeds. Call from the runtime.
    pub fn channel() -> (BodyWriter, warp::hyper::Body) {
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(2);
        let body =
            warp::hyper::Body::wrap_stream(futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
            }));
        let w = BodyWriter {
            buf: Vec::with_capacity(PIECE_BYTES),
            tx,
            rt: tokio::runtime::Handle::current(),
        };
        (w, body)
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = bytes::Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(PIECE_BYTES),
        ));
        let tx = self.tx.clone();
        match self
            .rt
            .block_on(async move { tokio::time::timeout(SEND_TIMEOUT, tx.send(piece)).await })
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(std::io::Error::other("the client closed the connection")),
            Err(_) => Err(std::io::Error::other("the client took no data for 10 s")),
        }
    }
}

impl std::io::Write for BodyWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= PIECE_BYTES {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// A 200 response whose body is `value` as JSON, serialized on the blocking pool straight
/// into the body as it is sent (no JSON tree, no whole-answer string).
pub fn json<T: serde::Serialize + Send + 'static>(value: T) -> Response {
    let (mut out, body) = BodyWriter::channel();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let res = serde_json::to_writer(&mut out, &value)
            .map_err(std::io::Error::from)
            .and_then(|()| out.flush());
        if let Err(e) = res {
            tracing::debug!(error = %e, "JSON answer abandoned");
        }
    });
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
