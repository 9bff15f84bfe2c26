//! Streamed answers of the real agent against clients that misbehave: a scraper that stops
//! reading holds up only its own scrape (no lock is held across a socket write), and an
//! answer the store fails halfway ends without its last chunk, so no client takes it for
//! a whole one.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

use crate::memory::{now_ms, write_series};
use crate::support::*;

const QUIET: &str = "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n[udp]\nenabled = false\n";

/// The agent gives up on a scraper that takes no data for this long (`api::body`).
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits until the store holds `n` series.
pub(crate) fn wait_series(agent: &Agent, n: u64) {
    let got = wait_for(Duration::from_secs(60), || {
        let s = agent.status();
        (s["store"]["series"].as_u64() == Some(n)).then_some(())
    });
    assert!(got.is_some(), "the store never held {n} series");
}

/// A `GET` whose client never reads the answer: its receive buffer is set to 4 KiB before
/// it connects, so the agent's writes back up at once, as behind a scraper that hangs.
pub(crate) struct Stalled {
    _stream: TcpStream,
    port: u16,
    agent_port: u16,
}

impl Stalled {
    pub(crate) fn open(agent: &Agent, path: &str) -> Stalled {
        let agent_port = agent.http.port();
        // SAFETY: plain socket calls on a descriptor this function owns; it is handed to a
        // TcpStream (which closes it) as soon as it is connected.
        let mut stream = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let size: libc::c_int = 4096;
            let rc = libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                &size as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
            assert_eq!(rc, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
            let addr = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: agent_port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(Ipv4Addr::LOCALHOST).to_be(),
                },
                sin_zero: [0; 8],
            };
            let rc = libc::connect(
                fd,
                &addr as *const libc::sockaddr_in as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            );
            let err = std::io::Error::last_os_error();
            let stream = TcpStream::from_raw_fd(fd);
            assert_eq!(rc, 0, "connect: {err}");
            stream
        };
        let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(req.as_bytes()).unwrap();
        let port = stream.local_addr().unwrap().port();
        Stalled {
            _stream: stream,
            port,
            agent_port,
        }
    }

    /// (bytes the agent has sent or queued that the client has not acknowledged, bytes
    /// the client holds unread), from `/proc/net/tcp`.
    pub(crate) fn queues(&self) -> (u64, u64) {
        let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        let port = |addr: &str| {
            addr.rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
        };
        let (mut agent_tx, mut client_rx) = (0, 0);
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 5 {
                continue;
            }
            let (local, remote) = (port(f[1]), port(f[2]));
            let Some((tx, rx)) = f[4].split_once(':') else {
                continue;
            };
            let hex = |s: &str| u64::from_str_radix(s, 16).unwrap_or(0);
            if local == Some(self.agent_port) && remote == Some(self.port) {
                agent_tx = hex(tx);
            } else if local == Some(self.port) && remote == Some(self.agent_port) {
                client_rx = hex(rx);
            }
        }
        (agent_tx, client_rx)
    }

    /// Waits until the answer has stopped moving (the queues unchanged for 500 ms with
    /// something received); returns the queues.
    pub(crate) fn wait_stuck(&self) -> (u64, u64) {
        let mut last = (u64::MAX, u64::MAX);
        let mut since = Instant::now();
        let got = wait_for(Duration::from_secs(60), || {
            let q = self.queues();
            if q != last {
                (last, since) = (q, Instant::now());
                return None;
            }
            (q.1 > 0 && since.elapsed() >= Duration::from_millis(500)).then_some(q)
        });
        got.unwrap_or_else(|| panic!("the answer never stopped moving: {:?}", self.queues()))
    }
}

/// One round of the reads a dashboard and a second scraper make: a raw query, a page of
/// the series listing, the status document and a whole `/metrics`. Returns how long it
/// took and the scrape's size.
fn round(agent: &Agent) -> (Duration, usize) {
    let t = Instant::now();
    let mut size = 0;
    for path in [
        "/api/v1/query?measurement=probe&from=-1h",
        "/api/v1/series?limit=100",
        "/api/v1/status",
        "/metrics",
    ] {
        let (code, body) = get(&agent.url(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(code, 200, "{path}: {body}");
        if path == "/metrics" {
            size = body.len();
        }
    }
    (t.elapsed(), size)
}

/// A scraper that opens `/metrics` and stops reading, on a store whose exposition is far
/// larger than the socket buffers: queries, the series listing, the status document and
/// another scrape answer as fast as they did before it came (a ratio to a baseline taken
/// in the same run). The scrape used to hold the store's reader (and the scrape index)
/// while it waited on the socket: every read waited up to the 10 s send timeout.
#[test]
fn a_scraper_that_stops_reading_slows_no_other_read() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let pad = format!(",pad={}", "p".repeat(400));
    write_series(&agent, "bench", 20_000, &pad);
    let (code, body) = post(
        &agent.url("/write?precision=ms"),
        format!("probe,host=dev v=1 {}\n", now_ms()).as_bytes(),
        &[],
    )
    .unwrap();
    assert_eq!(code, 204, "{body}");
    wait_series(&agent, 20_001);

    round(&agent); // warms the scrape index and the caches
    let mut baseline = Duration::ZERO;
    let mut size = 0;
    for _ in 0..3 {
        let (t, n) = round(&agent);
        baseline += t;
        size = n;
    }
    // Far more than the socket buffers hold (net.ipv4.tcp_wmem allows the agent's up to
    // 4 MiB).
    assert!(size > 8_000_000, "exposition of {size} bytes");

    let stalled = Stalled::open(&agent, "/metrics");
    let (unsent, unread) = stalled.wait_stuck();
    let stuck_at = Instant::now();
    // Most of the answer is not even in the sockets: the agent's writer waits on them
    // (besides them it holds at most a few 64 KiB pieces and hyper's buffer).
    assert!(
        (unsent + unread) as usize + 2_000_000 < size,
        "{unsent} bytes unsent and {unread} unread of {size}: not stalled"
    );

    let mut during = Duration::ZERO;
    for _ in 0..3 {
        during += round(&agent).0;
    }
    let held = stuck_at.elapsed();
    eprintln!("3 rounds: {baseline:?} before, {during:?} beside a stalled scraper ({unsent} bytes unsent, {unread} unread of {size})");
    let bound = baseline.max(Duration::from_millis(300)) * 4;
    assert!(
        during <= bound,
        "reads beside a stalled scraper took {during:?}, x{:.1} the {baseline:?} before",
        during.as_secs_f64() / baseline.as_secs_f64()
    );
    // And the scraper was stalled throughout (the agent gives up on it after
    // SEND_TIMEOUT).
    assert!(held < SEND_TIMEOUT, "the measurement took {held:?}");
    assert_eq!(stalled.queues().1, unread, "the stalled answer moved");
}

/// A response read to its end over a raw connection: (head, body, whether the chunked body
/// had its last chunk).
pub(crate) fn raw_get(agent: &Agent, path: &str) -> (String, Vec<u8>, bool) {
    let mut s = TcpStream::connect(agent.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    // An aborted answer may end in a reset: what came before it is what the client has.
    let _ = s.read_to_end(&mut raw);
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head: {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    let (mut rest, mut body) = (&raw[split + 4..], Vec::new());
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (head, body, false);
        };
        let size = std::str::from_utf8(&rest[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s, 16).ok())
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

fn samples(body: &[u8], family: &str) -> usize {
    String::from_utf8_lossy(body)
        .lines()
        .filter(|l| l.starts_with(family))
        .count()
}

/// The store fails in the middle of a scrape (the `test-fakes` hook fails the read of the
/// 2,000th and 8,000th dictionary row): the answer already has its head, the agent's own
/// families and thousands of samples out, and ends without its last chunk; a client sees
/// an error, not a short exposition. A scrape the store does not fail ends cleanly.
#[test]
fn a_scrape_the_store_fails_halfway_ends_without_its_last_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_with_env(
        dir.path(),
        QUIET,
        &[("EW_FAULT_STORE_READ_ROWS", "2000,8000")],
    );
    write_series(&agent, "bench", 4_000, "");
    wait_series(&agent, 4_000);

    // Rows 1-2,000: the read of the last one fails.
    let (head, body, complete) = raw_get(&agent, "/metrics");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let got = samples(&body, "bench_value{");
    assert!(
        (1_000..2_000).contains(&got),
        "{got} samples before the failure"
    );
    assert!(String::from_utf8_lossy(&body).contains("edgewatch_points_written_total"));
    assert!(
        !complete,
        "a scrape the store failed ended like a complete one"
    );

    // Rows 2,001-6,000: a whole scrape, ended cleanly.
    let (_, body, complete) = raw_get(&agent, "/metrics");
    assert!(complete, "a whole scrape lacks its last chunk");
    assert_eq!(samples(&body, "bench_value{"), 4_000);

    // Rows 6,001-8,000: an HTTP client library reports the failed one as an error.
    let r = ureq::get(&agent.url("/metrics")).call().expect("the head");
    assert_eq!(r.status(), 200);
    let mut text = String::new();
    let read = r.into_reader().read_to_string(&mut text);
    assert!(
        read.is_err(),
        "ureq read {} bytes as a whole answer",
        text.len()
    );
    let log = agent.log_text();
    assert!(
        log.contains("cannot read the store; answer aborted"),
        "{log}"
    );
}
