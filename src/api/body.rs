//! Streamed response bodies: [`BodyWriter`] is an `io::Write` on the blocking pool whose
//! bytes go out as the body of a response already sent, in pieces, so a large answer
//! (`/metrics`, a query's JSON) is never held whole; [`json`] serializes a typed value
//! through it. It never decides what is written, and never buffers more than a few pieces.
//!
//! Two rules for its users. An answer is complete only once [`BodyWriter::finish`] is
//! called: a writer dropped before (the store failed halfway, the serializer failed, the
//! client timed out) makes the body end in an error, so the server aborts the connection
//! without the last (zero-length) chunk and the client sees an incomplete answer, never a
//! short one that looks whole. And a write may wait on the client for up to
//! [`SEND_TIMEOUT`]: never write while holding a lock that other requests share (read a
//! piece under the lock, let go, then write it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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
/// Call [`finish`](BodyWriter::finish) at the end of a complete answer; dropped without
/// it, the answer is abandoned (see the module documentation).
pub struct BodyWriter {
    buf: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
    rt: tokio::runtime::Handle,
    complete: Arc<AtomicBool>,
}

impl BodyWriter {
    /// A writer and the response body it feeds. Call from the runtime.
    pub fn channel() -> (BodyWriter, warp::hyper::Body) {
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(2);
        let complete = Arc::new(AtomicBool::new(false));
        let done = complete.clone();
        let body =
            warp::hyper::Body::wrap_stream(futures_util::stream::unfold(Some(rx), move |rx| {
                let done = done.clone();
                async move {
                    let mut rx = rx?;
                    match rx.recv().await {
                        Some(b) => Some((Ok(b), Some(rx))),
                        // Every piece is out and the writer is gone: the end of the answer
                        // if it said so, else an error, which makes hyper abort the
                        // connection instead of writing the last chunk.
                        None if done.load(Ordering::Acquire) => None,
                        None => {
                            // Hyper drops what it has buffered but not yet written when
                            // the body fails: one turn of `Pending` first lets it flush the
                            // pieces already taken, so the client gets everything sent
                            // before the failure, then the abort.
                            tokio::task::yield_now().await;
                            Some((
                                Err(std::io::Error::other("the answer was abandoned halfway")),
                                None,
                            ))
                        }
                    }
                }
            }));
        let w = BodyWriter {
            buf: Vec::with_capacity(PIECE_BYTES),
            tx,
            rt: tokio::runtime::Handle::current(),
            complete,
        };
        (w, body)
    }

    /// Sends what is buffered and marks the answer complete: the body ends cleanly once the
    /// client has it all. Without this call the body ends in an error.
    pub fn finish(mut self) -> std::io::Result<()> {
        self.send()?;
        self.complete.store(true, Ordering::Release);
        Ok(())
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
/// into the body as it is sent (no JSON tree, no whole-answer string). If serializing fails
/// halfway the connection is aborted (no last chunk).
pub fn json<T: serde::Serialize + Send + 'static>(value: T) -> Response {
    let (mut out, body) = BodyWriter::channel();
    tokio::task::spawn_blocking(move || {
        let res = serde_json::to_writer(&mut out, &value)
            .map_err(std::io::Error::from)
            .and_then(|()| out.finish());
        if let Err(e) = res {
            tracing::debug!(error = %e, "JSON answer abandoned");
        }
    });
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use warp::Filter;

    /// Serializes `n` strings of a sequence, then fails (as a store read can halfway).
    struct FailsAfter(usize);

    impl serde::Serialize for FailsAfter {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::{Error, SerializeSeq};
            let mut seq = s.serialize_seq(None)?;
            for i in 0..self.0 {
                seq.serialize_element(&format!("element {i:08} of a long answer"))?;
            }
            Err(S::Error::custom("the source failed halfway"))
        }
    }

    /// An HTTP/1.1 response read to the end: (headers, body, whether the chunked body had
    /// its last chunk).
    pub(crate) fn chunked(raw: &[u8]) -> (String, Vec<u8>, bool) {
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        let (mut rest, mut body) = (&raw[split + 4..], Vec::new());
        loop {
            let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
                return (head, body, false);
            };
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap(), 16)
                .expect("a chunk size");
            rest = &rest[eol + 2..];
            if size == 0 {
                return (head, body, rest.starts_with(b"\r\n"));
            }
            if rest.len() < size + 2 {
                body.extend_from_slice(rest);
                return (head, body, false);
            }
            body.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
    }

    fn get_raw(addr: std::net::SocketAddr) -> Vec<u8> {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut raw = Vec::new();
        // An aborted connection may end in a reset: what came before it is the answer.
        let _ = s.read_to_end(&mut raw);
        raw
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_that_fails_halfway_ends_without_its_last_chunk() {
        let route = warp::path::end()
            .and(warp::query::<std::collections::HashMap<String, usize>>())
            .map(
                |q: std::collections::HashMap<String, usize>| match q.get("ok") {
                    Some(&n) => super::json((0..n).collect::<Vec<usize>>()),
                    None => super::json(FailsAfter(20_000)),
                },
            );
        let (addr, server) = warp::serve(route).bind_ephemeral(([127, 0, 0, 1], 0));
        tokio::spawn(server);
        let raw = tokio::task::spawn_blocking(move || get_raw(addr))
            .await
            .unwrap();
        let (head, body, complete) = chunked(&raw);
        assert!(head.starts_with("http/1.1 200"), "{head}");
        // Part of the answer went out (more than a piece), then no last chunk.
        assert!(body.len() > super::PIECE_BYTES, "{} bytes", body.len());
        assert!(body.starts_with(b"[\"element 00000000"));
        assert!(!complete, "a failed answer ended like a complete one");
        // The same server ends a whole answer cleanly.
        let route_ok = move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /?ok=50000 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).unwrap();
            raw
        };
        let raw = tokio::task::spawn_blocking(route_ok).await.unwrap();
        let (_, body, complete) = chunked(&raw);
        assert!(complete);
        let v: Vec<usize> = serde_json::from_slice(&body).unwrap();
        assert_eq!(v.len(), 50_000);
    }
}
