//! A stand-in for a throttling InfluxDB receiver (InfluxDB itself cannot be made to answer
//! 429): an HTTP/1.1 server on a free loopback port that answers every write `429` with
//! `Retry-After` while `throttle` is set and `204` otherwise, recording each request's
//! arrival time and status, and the lines (gunzipped) of every write it accepted. Used to
//! check reconnect storms in aggregate: several real agents against one receiver.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Request {
    /// When it arrived (its headers were read).
    pub at: Instant,
    /// The status answered.
    pub status: u16,
    /// Lines of an accepted write (empty when refused).
    pub lines: Vec<String>,
}

/// The running receiver; its threads end with the test process.
pub struct Throttle {
    pub port: u16,
    /// While true, writes are answered 429 with `Retry-After: <retry_after_s>`.
    pub throttle: Arc<AtomicBool>,
    pub requests: Arc<Mutex<Vec<Request>>>,
}

impl Throttle {
    /// Starts it on `port` (0: any free port), throttling from the start when `throttle`.
    pub fn start(port: u16, throttle: bool, retry_after_s: u64) -> Throttle {
        let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let port = l.local_addr().unwrap().port();
        let flag = Arc::new(AtomicBool::new(throttle));
        let requests: Arc<Mutex<Vec<Request>>> = Default::default();
        let (f, r) = (flag.clone(), requests.clone());
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let (f, r) = (f.clone(), r.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &f, &r, retry_after_s);
                });
            }
        });
        Throttle {
            port,
            throttle: flag,
            requests,
        }
    }

    /// A copy of the requests so far.
    pub fn seen(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(
    conn: TcpStream,
    throttle: &AtomicBool,
    requests: &Mutex<Vec<Request>>,
    retry_after_s: u64,
) -> std::io::Result<()> {
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut start = String::new();
        if r.read_line(&mut start)? == 0 {
            return Ok(());
        }
        let mut len = 0usize;
        let mut gzipped = false;
        loop {
            let mut h = String::new();
            r.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
                if k.eq_ignore_ascii_case("content-encoding") && v.trim() == "gzip" {
                    gzipped = true;
                }
            }
        }
        let at = Instant::now();
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        let refuse = throttle.load(Ordering::SeqCst);
        let lines = if refuse {
            Vec::new()
        } else {
            let mut text = String::new();
            if gzipped {
                flate2::read::GzDecoder::new(&body[..]).read_to_string(&mut text)?;
            } else {
                text = String::from_utf8_lossy(&body).into_owned();
            }
            text.lines().map(str::to_string).collect()
        };
        let status = if refuse { 429 } else { 204 };
        requests.lock().unwrap().push(Request { at, status, lines });
        let head = if refuse {
            format!(
                "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {retry_after_s}\r\n\
                 Content-Length: 0\r\n\r\n"
            )
        } else {
            "HTTP/1.1 204 No Content\r\n\r\n".to_string()
        };
        w.write_all(head.as_bytes())?;
    }
}
