//! Test support: free loopback ports, the real `edgewatch` binary started on them, and real
//! peers (InfluxDB 1.x) started on them and stopped by PID when dropped.
#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Ports handed out by [`free_port`] and [`free_udp_port`] come from below the kernel's
/// ephemeral range (32768-60999 by default): a port bound and released there can be taken
/// by any outgoing connection or `bind(0)` before the peer that was given it starts (a test
/// that reserves a sink's port and starts the peer minutes later lost it that way). Each
/// port is handed out once per test process, from an offset of the process id, and is
/// checked to be free (TCP and UDP) before it is returned.
const PORT_LOW: u32 = 12_000;
const PORT_SPAN: u32 = 20_000;

/// The next candidate, counted from an offset of the process id.
static NEXT_PORT: std::sync::LazyLock<std::sync::atomic::AtomicU32> =
    std::sync::LazyLock::new(|| {
        std::sync::atomic::AtomicU32::new(std::process::id().wrapping_mul(7919) % PORT_SPAN)
    });

fn next_port() -> u16 {
    use std::sync::atomic::Ordering;
    for _ in 0..PORT_SPAN {
        let n = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
        let port = (PORT_LOW + n % PORT_SPAN) as u16;
        let tcp = TcpListener::bind(("127.0.0.1", port)).is_ok();
        if tcp && UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {PORT_LOW}..{}", PORT_LOW + PORT_SPAN)
}

/// A free TCP port on 127.0.0.1, outside the ephemeral range (see [`next_port`]).
pub fn free_port() -> u16 {
    next_port()
}

/// A free UDP port on 127.0.0.1, outside the ephemeral range.
pub fn free_udp_port() -> u16 {
    next_port()
}

/// Path of the edgewatch binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_edgewatch"))
}

/// Stores what the ingest journal of the (stopped) agent's data directory holds, as the next
/// agent would at its start: `edgewatch maintain --data-dir`. A store is its database and
/// its journal: a small acknowledged write may be only in the journal until the next commit.
pub fn replay_journal(data_dir: &Path) {
    let out = std::process::Command::new(bin())
        .arg("maintain")
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .expect("run edgewatch maintain");
    assert!(
        out.status.success(),
        "edgewatch maintain: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls `f` every 20 ms until it returns Some or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `edgewatch run`, killed when dropped.
pub struct Agent {
    pub child: Child,
    pub http: SocketAddr,
    pub udp: SocketAddr,
    pub dir: PathBuf,
    pub log: PathBuf,
}

impl Agent {
    /// Starts the agent with `extra_config` (TOML) appended to a config that sets the data
    /// dir and free ports; waits until /health answers.
    pub fn start(dir: &Path, extra_config: &str) -> Agent {
        Self::start_with_env(dir, extra_config, &[])
    }

    pub fn start_with_env(dir: &Path, extra_config: &str, env: &[(&str, &str)]) -> Agent {
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let udp: SocketAddr = format!("127.0.0.1:{}", free_udp_port()).parse().unwrap();
        let data = dir.join("data");
        let cfg = dir.join("edgewatch.toml");
        let mut text = format!(
            "[http]\nlisten = \"{http}\"\n[udp]\nlisten = \"{udp}\"\n[storage]\ndata_dir = \"{}\"\n[health]\nenabled = false\n[kmsg]\nenabled = false\n",
            data.display()
        );
        text.push_str(extra_config);
        std::fs::write(&cfg, merge_sections(&text)).unwrap();
        let log = dir.join(format!("agent-{}.log", http.port()));
        let logf = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(bin());
        cmd.arg("run")
            .arg("--config")
            .arg(&cfg)
            .env("RUST_LOG", "info")
            // The suite's own switch, not a config key: the agent would refuse it as one.
            .env_remove(peers::SKIP_PEERS_VAR)
            .stdout(Stdio::null())
            .stderr(logf);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn edgewatch");
        let mut agent = Agent {
            child,
            http,
            udp,
            dir: data,
            log,
        };
        let ok = wait_for(Duration::from_secs(20), || {
            if let Ok(Some(status)) = agent.child.try_wait() {
                panic!("edgewatch exited early ({status}):\n{}", agent.log_text());
            }
            get(&agent.url("/health")).ok().filter(|r| r.0 == 200)
        });
        assert!(
            ok.is_some(),
            "edgewatch did not become ready:\n{}",
            agent.log_text()
        );
        agent
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// The config file [`Agent::start`] wrote.
    pub fn config_path(&self) -> PathBuf {
        self.dir
            .parent()
            .expect("data dir has a parent")
            .join("edgewatch.toml")
    }

    /// Rewrites the config file [`Agent::start`] wrote: the same base (ports, data dir)
    /// with `extra` instead of what was there (for a reload to read).
    pub fn rewrite_config(&self, extra: &str) {
        let mut text = format!(
            "[http]\nlisten = \"{}\"\n[udp]\nlisten = \"{}\"\n[storage]\ndata_dir = \"{}\"\n[health]\nenabled = false\n[kmsg]\nenabled = false\n",
            self.http,
            self.udp,
            self.dir.display()
        );
        text.push_str(extra);
        std::fs::write(self.config_path(), merge_sections(&text)).unwrap();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends SIGTERM and waits for the exit; returns the exit code and how long it took.
    pub fn terminate(mut self) -> (Option<i32>, Duration) {
        let t = Instant::now();
        signal(self.pid(), "TERM");
        let status = self.child.wait().expect("wait");
        (status.code(), t.elapsed())
    }

    /// SIGKILL, as a power cut would.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn status(&self) -> serde_json::Value {
        let (code, body) = get(&self.url("/api/v1/status")).expect("status");
        assert_eq!(code, 200);
        serde_json::from_str(&body).unwrap()
    }

    /// Waits (up to 10 s) until the alert evaluator has run at least `n` cycles.
    pub fn wait_evaluations(&self, n: u64, what: &str) {
        wait_for(Duration::from_secs(10), || {
            (self.status()["alerts"]["evaluations"].as_u64().unwrap_or(0) >= n).then_some(())
        })
        .unwrap_or_else(|| panic!("{what}: fewer than {n} alert evaluations in 10 s"));
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends a signal by name with kill(1).
pub fn signal(pid: i32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// Merges repeated `[section]` headers so extra config can override the base.
fn merge_sections(text: &str) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut sections: std::collections::HashMap<String, Vec<String>> = Default::default();
    let mut cur = String::new();
    order.push(cur.clone());
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') && !t.starts_with("[[") {
            cur = t.to_string();
            if !order.contains(&cur) {
                order.push(cur.clone());
            }
            continue;
        }
        if t.starts_with("[[") {
            cur = format!("{t}#{}", order.len());
            order.push(cur.clone());
            sections.entry(cur.clone()).or_default().push(String::new());
            continue;
        }
        let entry = sections.entry(cur.clone()).or_default();
        if let Some((k, _)) = t.split_once('=') {
            let k = k.trim().to_string();
            entry.retain(|l| {
                l.split_once('=')
                    .map(|(a, _)| a.trim() != k)
                    .unwrap_or(true)
            });
        }
        entry.push(line.to_string());
    }
    let mut out = String::new();
    for s in order {
        if let Some(h) = s.split('#').next().filter(|h| !h.is_empty()) {
            out.push_str(h);
            out.push('\n');
        }
        for l in sections.get(&s).into_iter().flatten() {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// GET; returns (status, body). Network errors are Err.
pub fn get(url: &str) -> Result<(u16, String), String> {
    get_with(url, &[])
}

/// [`get`] with request headers.
pub fn get_with(url: &str, headers: &[(&str, &str)]) -> Result<(u16, String), String> {
    let mut req = ureq::get(url).timeout(Duration::from_secs(10));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    match req.call() {
        Ok(r) => Ok((r.status(), r.into_string().unwrap_or_default())),
        Err(ureq::Error::Status(code, r)) => Ok((code, r.into_string().unwrap_or_default())),
        Err(e) => Err(e.to_string()),
    }
}

/// Raw points of `measurement` in the database file `db` (read directly, not through the
/// agent: what is committed, nothing held).
pub fn points_in_file(db: &Path, measurement: &str) -> i64 {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.query_row(
        "SELECT COALESCE(SUM(c.n), 0) FROM chunks c JOIN tagsets t ON t.id = c.tagset_id \
         WHERE t.measurement = ?1",
        [measurement],
        |r| r.get(0),
    )
    .unwrap()
}

/// Every stored point the raw query `query` (e.g. `measurement=m&tag.k=v`) returns over all
/// time, as (tags as `k=v,...`, field, ts, value), ordered by time then field.
pub fn stored_points(agent: &Agent, query: &str) -> Vec<(String, String, i64, serde_json::Value)> {
    let (code, body) = get(&agent.url(&format!(
        "/api/v1/query?from=0&to=4000000000000000000&{query}"
    )))
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut out = Vec::new();
    for s in v["series"].as_array().unwrap() {
        let tags: Vec<String> = s["tags"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
            .collect();
        for p in s["points"].as_array().unwrap() {
            out.push((
                tags.join(","),
                s["field"].as_str().unwrap().to_string(),
                p[0].as_i64().unwrap(),
                p[1].clone(),
            ));
        }
    }
    out.sort_by(|a, b| (a.2, &a.1).cmp(&(b.2, &b.1)));
    out
}

/// POST with optional headers; returns (status, headers of interest, body).
pub fn post(url: &str, body: &[u8], headers: &[(&str, &str)]) -> Result<(u16, String), String> {
    let mut req = ureq::post(url).timeout(Duration::from_secs(30));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    match req.send_bytes(body) {
        Ok(r) => Ok((r.status(), r.into_string().unwrap_or_default())),
        Err(ureq::Error::Status(code, r)) => {
            let retry = r.header("Retry-After").map(str::to_string);
            let body = r.into_string().unwrap_or_default();
            Ok((
                code,
                match retry {
                    Some(ra) => format!("Retry-After: {ra}\n{body}"),
                    None => body,
                },
            ))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Gzips bytes.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// A real InfluxDB 1.x (`influxd` from Debian's `influxdb`), on free ports in a temp dir.
pub struct Influxd {
    pub child: Child,
    pub http: SocketAddr,
    pub dir: PathBuf,
}

impl Influxd {
    pub fn available() -> bool {
        Command::new("influxd").arg("version").output().is_ok()
    }

    pub fn start(dir: &Path) -> Influxd {
        Self::start_on(dir, free_port())
    }

    /// On a given port (forwarding tests start it where a sink already points).
    pub fn start_on(dir: &Path, port: u16) -> Influxd {
        Self::start_limited(dir, port, 0)
    }

    /// On a given port, refusing request bodies over `max_body` bytes with 413 (0: no limit).
    pub fn start_limited(dir: &Path, port: u16, max_body: u64) -> Influxd {
        let http: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let rpc = free_port();
        std::fs::create_dir_all(dir).unwrap();
        let cfg = dir.join("influxdb.conf");
        std::fs::write(
            &cfg,
            format!(
                "reporting-disabled = true\nbind-address = \"127.0.0.1:{rpc}\"\n\
                 [meta]\n  dir = \"{d}/meta\"\n\
                 [data]\n  dir = \"{d}/data\"\n  wal-dir = \"{d}/wal\"\n  query-log-enabled = false\n  \
                 cache-snapshot-write-cold-duration = \"2s\"\n  compact-full-write-cold-duration = \"4s\"\n\
                 [http]\n  bind-address = \"{http}\"\n  log-enabled = false\n  max-body-size = {max_body}\n\
                 [monitor]\n  store-enabled = false\n[continuous_queries]\n  enabled = false\n",
                d = dir.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("influxd.log")).unwrap();
        let child = Command::new("influxd")
            .arg("-config")
            .arg(&cfg)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn influxd (apt-get install influxdb)");
        let i = Influxd {
            child,
            http,
            dir: dir.to_path_buf(),
        };
        let ok = wait_for(Duration::from_secs(30), || {
            ureq::get(&format!("http://{http}/ping")).call().ok()
        });
        assert!(ok.is_some(), "influxd did not start");
        i
    }

    pub fn query(&self, db: &str, q: &str) -> serde_json::Value {
        let r = ureq::post(&format!("http://{}/query", self.http))
            .query("db", db)
            .query("q", q)
            .call()
            .expect("influx query");
        serde_json::from_str(&r.into_string().unwrap()).unwrap()
    }
}

impl Drop for Influxd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time (user+system) of a process in microseconds, from /proc/PID/stat.
pub fn cpu_us(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<u64> = after
        .split_ascii_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // fields after ')' start at index 0 = state; utime = 11, stime = 12
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    ticks * 1_000_000 / 100
}

/// A field of /proc/PID/status in kB (VmRSS, VmHWM).
pub fn status_kb(pid: i32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim_start_matches(':')
                .split_ascii_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Bytes in every file under `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                total += dir_bytes(&p);
            } else if let Ok(m) = e.metadata() {
                total += m.len();
            }
        }
    }
    total
}
/// Copies the tree `from` into `to` (files and directories; `to` exists).
pub fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// A temp copy of the Jetson fixture tree `tests/data/jetson/<name>` at `dir/root`.
pub fn jetson_fixture(dir: &Path, name: &str) -> PathBuf {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    copy_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/jetson")
            .join(name),
        &root,
    );
    root
}
/// `promtool check metrics` on `text`: no error, no lint warning.
pub fn promtool_check(text: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub mod peers;
pub mod throttle;

/// Writes `text` to `file` and runs `edgewatch check-config` on it: (exit code, stderr).
pub fn check_config(file: &Path, text: &str) -> (Option<i32>, String) {
    std::fs::write(file, text).unwrap();
    let out = Command::new(bin())
        .args(["check-config", file.to_str().unwrap()])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
