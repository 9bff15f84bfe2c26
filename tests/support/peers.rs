//! Peers for the forwarding tests: a real `mosquitto` (plain or TLS with a CA made here by
//! the `openssl` CLI), an InfluxDB 1.x on a chosen port, a fault-injecting HTTP proxy, and
//! an agent started with top-level config keys (`device_id`, `[tags]`, `[[sink]]`).
//!
//! A test that needs a peer calls [`require`] first: a missing peer fails the test, naming
//! the Debian package to install. Only an explicit opt-out skips it, loudly:
//! `EDGEWATCH_TEST_SKIP_PEERS=influxdb,mosquitto` (comma-separated [`Peer`] names).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// A program a test starts as its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// `influxd` (Debian `influxdb`).
    Influxdb,
    /// `mosquitto`, `mosquitto_sub` and `mosquitto_pub` (Debian `mosquitto`,
    /// `mosquitto-clients`).
    Mosquitto,
    /// `prometheus-alertmanager` (Debian `prometheus-alertmanager`).
    Alertmanager,

    /// `victoria-metrics` (Debian `victoria-metrics`).
    VictoriaMetrics,
    /// `prometheus` (Debian `prometheus`).
    Prometheus,
    /// `fusermount3` (Debian `fuse3`) and `/dev/fuse`; tests/powercut.rs also checks for
    /// Debian's `python3-fusepy`.
    Fuse,
}

/// The variable that lists the peers whose tests are skipped on purpose.
pub const SKIP_PEERS_VAR: &str = "EDGEWATCH_TEST_SKIP_PEERS";

impl Peer {
    /// The name used in [`SKIP_PEERS_VAR`].
    pub fn name(self) -> &'static str {
        match self {
            Peer::Influxdb => "influxdb",
            Peer::Mosquitto => "mosquitto",
            Peer::Alertmanager => "alertmanager",

            Peer::VictoriaMetrics => "victoria-metrics",
            Peer::Prometheus => "prometheus",
            Peer::Fuse => "fuse",
        }
    }

    /// (program, arguments that make it print and exit, Debian package).
    fn programs(self) -> &'static [(&'static str, &'static [&'static str], &'static str)] {
        match self {
            Peer::Influxdb => &[("influxd", &["version"], "influxdb")],
            Peer::Mosquitto => &[
                ("mosquitto", &["-h"], "mosquitto"),
                ("mosquitto_sub", &["--help"], "mosquitto-clients"),
                ("mosquitto_pub", &["--help"], "mosquitto-clients"),
            ],
            Peer::Alertmanager => &[(
                "prometheus-alertmanager",
                &["--version"],
                "prometheus-alertmanager",
            )],

            Peer::VictoriaMetrics => &[("victoria-metrics", &["-version"], "victoria-metrics")],
            Peer::Prometheus => &[("prometheus", &["--version"], "prometheus")],
            Peer::Fuse => &[("fusermount3", &["-V"], "fuse3")],
        }
    }
}

/// Whether `var` (the value of [`SKIP_PEERS_VAR`]) names `peer`.
pub fn skip_listed(var: Option<&str>, peer: Peer) -> bool {
    var.unwrap_or("")
        .split(',')
        .any(|n| n.trim().eq_ignore_ascii_case(peer.name()))
}

/// Call first in every test that starts `peer`. True: run the test. A peer that is not
/// installed fails the test, naming the Debian package(s) to install; false (skip) only when
/// [`SKIP_PEERS_VAR`] names the peer, said on stderr.
pub fn require(peer: Peer) -> bool {
    let test = std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string();
    if skip_listed(std::env::var(SKIP_PEERS_VAR).ok().as_deref(), peer) {
        // Straight to stderr, past the test harness's capture: a skip is never silent.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: {SKIP_PEERS_VAR} names {} (nothing was checked)",
            peer.name()
        );
        return false;
    }
    let mut missing: Vec<&str> = Vec::new();
    let mut packages: Vec<&str> = Vec::new();
    for (program, args, package) in peer.programs() {
        let found = Command::new(program)
            .args(*args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            missing.push(program);
            if !packages.contains(package) {
                packages.push(package);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{test} needs {} on PATH: `apt-get install {}` \
         (or set {SKIP_PEERS_VAR}={} to skip the tests that need it, on purpose)",
        missing.join(", "),
        packages.join(" "),
        peer.name()
    );
    true
}

/// Collectors and rollup off.
pub const QUIET: &str = "[kmsg]\nenabled = false\n[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n[rollup]\nenabled = false\n[health]\nenabled = false\n";

/// Starts the agent with `top` (top-level keys, `[tags]`, `[[sink]]` tables) after the base
/// sections; the data dir is `dir/data`.
pub fn agent_with(dir: &Path, top_and_sinks: &str) -> Agent {
    agent_on(dir, top_and_sinks, free_port())
}

/// Like [`agent_with`] on a given HTTP port.
pub fn agent_on(dir: &Path, top_and_sinks: &str, port: u16) -> Agent {
    let http: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let data = dir.join("data");
    let cfg = dir.join("edgewatch.toml");
    std::fs::create_dir_all(dir).unwrap();
    let (top, tables) = match top_and_sinks.find('[') {
        Some(i) => top_and_sinks.split_at(i),
        None => (top_and_sinks, ""),
    };
    // Sinks here send at once when their link returns: tests time their drains, and
    // tests/forward_rollup.rs checks the spread (`reconnect_jitter`) with its own values.
    let tables = if tables.contains("reconnect_jitter") {
        tables.to_string()
    } else {
        tables.replace("[[sink]]\n", "[[sink]]\nreconnect_jitter = \"0s\"\n")
    };
    let text = format!(
        "{top}\n[http]\nlisten = \"{http}\"\n[udp]\nenabled = false\n[storage]\ndata_dir = \"{}\"\n{QUIET}{tables}\n",
        data.display()
    );
    std::fs::write(&cfg, text).unwrap();
    let log = dir.join(format!("agent-{port}.log"));
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    let child = Command::new(bin())
        .arg("run")
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(logf)
        .spawn()
        .expect("spawn edgewatch");
    let mut agent = Agent {
        child,
        http,
        udp: "127.0.0.1:9".parse().unwrap(),
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

/// Writes `n` points `m,k=v v=<i>i <t0+i*1000>` through the agent's /write, 10,000 a request.
pub fn write_points(agent: &Agent, measurement: &str, from: usize, n: usize, t0: i64) {
    let mut i = from;
    while i < from + n {
        let end = (i + 10_000).min(from + n);
        let mut body = String::with_capacity(40 * (end - i));
        for j in i..end {
            body.push_str(&format!(
                "{measurement},k=v v={j}i {}\n",
                t0 + j as i64 * 1000
            ));
        }
        let (code, resp) = post(&agent.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{resp}");
        i = end;
    }
}

/// The status object of sink `name`.
pub fn sink_status(agent: &Agent, name: &str) -> serde_json::Value {
    let s = agent.status();
    s["forward"]["sinks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no sink {name} in {s}"))
}

/// InfluxDB 1.x on `port`.
pub fn influxd_on(dir: &Path, port: u16) -> Influxd {
    Influxd::start_on(dir, port)
}

pub fn influx_count(i: &Influxd, db: &str, m: &str) -> i64 {
    let r = ureq::post(&format!("http://{}/query", i.http))
        .query("db", db)
        .query("q", &format!("SELECT count(v) FROM {m}"))
        .call();
    let Ok(r) = r else { return -1 };
    let v: serde_json::Value =
        serde_json::from_str(&r.into_string().unwrap_or_default()).unwrap_or_default();
    v["results"][0]["series"][0]["values"][0][1]
        .as_i64()
        .unwrap_or(0)
}

/// Creates database `db`.
pub fn influx_create_db(i: &Influxd, db: &str) {
    ureq::post(&format!("http://{}/query", i.http))
        .query("q", &format!("CREATE DATABASE {db}"))
        .call()
        .unwrap();
}

/// A real mosquitto on a free port (plain, or TLS when `tls` is Some), stopped when dropped.
pub struct Mosquitto {
    pub child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

/// CA, server cert for 127.0.0.1, made with the openssl CLI.
pub struct TestCa {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn make(dir: &Path) -> TestCa {
        std::fs::create_dir_all(dir).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=edgewatch test CA",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName = IP:127.0.0.1\nbasicConstraints = CA:FALSE\n",
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ]);
        TestCa {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        }
    }
}

impl Mosquitto {
    pub fn available() -> bool {
        Path::new("/usr/sbin/mosquitto").exists()
            || Command::new("mosquitto").arg("-h").output().is_ok()
    }

    pub fn start(dir: &Path, port: u16, tls: Option<&TestCa>) -> Mosquitto {
        Mosquitto::start_with(dir, port, tls, "")
    }

    /// Like [`Mosquitto::start`], logging every packet (`log_type all`) to
    /// `mosquitto.log`: [`Mosquitto::received_publishes`] counts what publishers sent.
    pub fn start_logging_packets(dir: &Path, port: u16) -> Mosquitto {
        Mosquitto::start_with(dir, port, None, "log_type all\n")
    }

    /// PUBLISH packets this broker's directory logged as received on `topic` (from every
    /// start on that directory; needs [`Mosquitto::start_logging_packets`]).
    pub fn received_publishes(dir: &Path, topic: &str) -> usize {
        let log = std::fs::read_to_string(dir.join("mosquitto.log")).unwrap_or_default();
        let quoted = format!(", '{topic}',");
        log.lines()
            .filter(|l| l.contains("Received PUBLISH from") && l.contains(&quoted))
            .count()
    }

    fn start_with(dir: &Path, port: u16, tls: Option<&TestCa>, extra: &str) -> Mosquitto {
        std::fs::create_dir_all(dir).unwrap();
        let mut conf = format!(
            "user root\nlistener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nmax_queued_messages 100000\n{extra}",
            dir.display()
        );
        if let Some(t) = tls {
            conf.push_str(&format!(
                "cafile {}\ncertfile {}\nkeyfile {}\n",
                t.ca.display(),
                t.cert.display(),
                t.key.display()
            ));
        }
        let cfg = dir.join("mosquitto.conf");
        std::fs::write(&cfg, conf).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("mosquitto.log"))
            .unwrap();
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(&cfg)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn mosquitto (apt-get install mosquitto)");
        let ok = wait_for(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
        assert!(ok.is_some(), "mosquitto did not start");
        Mosquitto {
            child,
            port,
            dir: dir.to_path_buf(),
        }
    }

    /// SIGTERM (saves persistence) and wait.
    pub fn stop(mut self) {
        signal(self.child.id() as i32, "TERM");
        let _ = self.child.wait();
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `mosquitto_sub` writing every message to `out` (persistent session `id`, QoS 1).
pub struct Sub {
    pub child: Child,
    pub out: PathBuf,
}

impl Sub {
    pub fn start(port: u16, topic: &str, id: &str, out: &Path, tls_ca: Option<&Path>) -> Sub {
        let f = std::fs::File::create(out).unwrap();
        let mut cmd = Command::new("mosquitto_sub");
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            topic,
            "-q",
            "1",
            "-c",
            "-i",
            id,
        ]);
        if let Some(ca) = tls_ca {
            cmd.arg("--cafile").arg(ca);
        }
        let child = cmd
            .stdout(f)
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto_sub");
        Sub {
            child,
            out: out.to_path_buf(),
        }
    }

    /// Like [`Sub::start`], and returns once the subscription is in place: probe messages
    /// (`# probe`, which [`parse_mqtt`] ignores) are published with `mosquitto_pub` until
    /// one arrives. From then on the broker keeps every message for this persistent session.
    pub fn start_subscribed(
        port: u16,
        topic: &str,
        id: &str,
        out: &Path,
        tls_ca: Option<&Path>,
    ) -> Sub {
        let sub = Sub::start(port, topic, id, out, tls_ca);
        let seen = wait_for(Duration::from_secs(10), || {
            let mut cmd = Command::new("mosquitto_pub");
            cmd.args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-t",
                topic,
                "-q",
                "1",
                "-m",
                "# probe",
            ]);
            if let Some(ca) = tls_ca {
                cmd.arg("--cafile").arg(ca);
            }
            let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
            wait_for(Duration::from_millis(300), || {
                sub.text().contains("# probe").then_some(())
            })
        });
        assert!(
            seen.is_some(),
            "mosquitto_sub never received a probe on {topic}"
        );
        sub
    }

    pub fn text(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for Sub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (seq numbers in order of arrival, point timestamps in order of arrival) from line-format
/// MQTT messages printed by `mosquitto_sub`.
pub fn parse_mqtt(text: &str) -> (Vec<i64>, Vec<i64>) {
    let mut seqs = Vec::new();
    let mut ts = Vec::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# edgewatch seq=") {
            seqs.push(rest.split(' ').next().unwrap().parse().unwrap());
        } else if !l.trim().is_empty() && !l.starts_with('#') {
            if let Some(t) = l.rsplit(' ').next().and_then(|t| t.parse().ok()) {
                ts.push(t);
            }
        }
    }
    (seqs, ts)
}

/// A fault-injecting HTTP proxy: answers the scripted statuses first (with the given extra
/// header), then forwards every request to `upstream`. Counts requests, and keeps the body
/// (gunzipped) of every request that `upstream` answered 2xx. From the `stall_at`-th such
/// body on, it never answers (the request reached `upstream`, its sender waits): a batch
/// stays in flight for as long as the test wants.
pub struct FaultProxy {
    pub port: u16,
    pub script: Script,
    pub requests: Arc<Mutex<Vec<(u16, usize)>>>,
    pub delivered: Delivered,
    /// 1-based; `usize::MAX` (the default): never.
    pub stall_at: Arc<std::sync::atomic::AtomicUsize>,
    /// While true, every request is answered 502 without reaching `upstream` (as a proxy
    /// whose upstream is down).
    pub down: Arc<std::sync::atomic::AtomicBool>,
}

/// Bodies `upstream` acknowledged, in order.
pub type Delivered = Arc<Mutex<Vec<String>>>;

impl FaultProxy {
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let script: Script = Default::default();
        let requests: Arc<Mutex<Vec<(u16, usize)>>> = Default::default();
        let delivered: Delivered = Default::default();
        let stall_at = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let state = Shared {
            script: script.clone(),
            log: requests.clone(),
            delivered: delivered.clone(),
            stall_at: stall_at.clone(),
            down: down.clone(),
        };
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let state = state.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, upstream, state);
                });
            }
        });
        FaultProxy {
            port,
            script,
            requests,
            delivered,
            stall_at,
            down,
        }
    }

    pub fn push(&self, status: u16, header: Option<(&'static str, &'static str)>) {
        self.script.lock().unwrap().push_back((status, header));
    }
}

/// Scripted answers: status and an optional extra header.
pub type Script = Arc<Mutex<VecDeque<(u16, Option<(&'static str, &'static str)>)>>>;

/// What every connection of a [`FaultProxy`] shares.
#[derive(Clone)]
struct Shared {
    script: Script,
    log: Arc<Mutex<Vec<(u16, usize)>>>,
    delivered: Delivered,
    stall_at: Arc<std::sync::atomic::AtomicUsize>,
    down: Arc<std::sync::atomic::AtomicBool>,
}

fn serve(conn: TcpStream, upstream: SocketAddr, state: Shared) -> std::io::Result<()> {
    let Shared {
        script,
        log,
        delivered,
        stall_at,
        down,
    } = state;
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut start = String::new();
        if r.read_line(&mut start)? == 0 {
            return Ok(());
        }
        let mut headers = Vec::new();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            r.read_line(&mut h)?;
            let h = h.trim_end().to_string();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        let path = start.split(' ').nth(1).unwrap_or("/").to_string();
        let scripted = if down.load(std::sync::atomic::Ordering::SeqCst) {
            Some((502, None))
        } else {
            script.lock().unwrap().pop_front()
        };
        let (status, extra, resp) = match scripted {
            Some((st, h)) => (st, h, format!("{{\"error\":\"injected {st}\"}}")),
            None => {
                let mut req = ureq::post(&format!("http://{upstream}{path}"));
                for (k, v) in &headers {
                    if k.eq_ignore_ascii_case("content-encoding")
                        || k.eq_ignore_ascii_case("authorization")
                    {
                        req = req.set(k, v);
                    }
                }
                match req.send_bytes(&body) {
                    Ok(x) => (x.status(), None, x.into_string().unwrap_or_default()),
                    Err(ureq::Error::Status(c, x)) => {
                        (c, None, x.into_string().unwrap_or_default())
                    }
                    Err(_) => (502, None, String::new()),
                }
            }
        };
        log.lock().unwrap().push((status, len));
        if (200..300).contains(&status) && scripted.is_none() {
            let gzipped = headers.iter().any(|(k, v)| {
                k.eq_ignore_ascii_case("content-encoding") && v.eq_ignore_ascii_case("gzip")
            });
            let text = if gzipped {
                let mut s = String::new();
                flate2::read::GzDecoder::new(&body[..]).read_to_string(&mut s)?;
                s
            } else {
                String::from_utf8_lossy(&body).into_owned()
            };
            let n = {
                let mut d = delivered.lock().unwrap();
                d.push(text);
                d.len()
            };
            if n >= stall_at.load(std::sync::atomic::Ordering::SeqCst) {
                // Never answer: wait until the sender goes away.
                let mut rest = Vec::new();
                let _ = r.read_to_end(&mut rest);
                return Ok(());
            }
        }
        let mut out = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nContent-Type: application/json\r\n",
            resp.len()
        );
        if let Some((k, v)) = extra {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.push_str(&resp);
        w.write_all(out.as_bytes())?;
    }
}

/// A real Prometheus Alertmanager (Debian `prometheus-alertmanager`) on a loopback port,
/// clustering off, with `resolve_timeout` as given and one receiver that sends nowhere.
pub struct Alertmanager {
    pub child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl Alertmanager {
    /// Starts it (data in `dir`) and waits until `/-/ready` answers.
    pub fn start(dir: &Path, port: u16, resolve_timeout: &str) -> Alertmanager {
        std::fs::create_dir_all(dir).unwrap();
        let cfg = dir.join("alertmanager.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  resolve_timeout: {resolve_timeout}\nroute:\n  receiver: none\nreceivers:\n  - name: none\n"
            ),
        )
        .unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("alertmanager.log"))
            .unwrap();
        let child = Command::new("prometheus-alertmanager")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus-alertmanager (apt-get install prometheus-alertmanager)");
        let am = Alertmanager {
            child,
            port,
            dir: dir.to_path_buf(),
        };
        let ok = wait_for(Duration::from_secs(15), || {
            get(&am.url("/-/ready")).ok().filter(|r| r.0 == 200)
        });
        assert!(
            ok.is_some(),
            "alertmanager did not start:\n{}",
            std::fs::read_to_string(dir.join("alertmanager.log")).unwrap_or_default()
        );
        am
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// `GET /api/v2/alerts`: the active alerts.
    pub fn alerts(&self) -> Vec<serde_json::Value> {
        let (code, body) = get(&self.url("/api/v2/alerts")).expect("alertmanager alerts");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// `alertmanager_alerts_received_total{status}` summed over API versions.
    pub fn received(&self, status: &str) -> u64 {
        let (_, text) = get(&self.url("/metrics")).expect("alertmanager metrics");
        let want = format!("status=\"{status}\"");
        text.lines()
            .filter(|l| l.starts_with("alertmanager_alerts_received_total{") && l.contains(&want))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Stops it (SIGTERM) and waits.
    pub fn stop(mut self) {
        signal(self.child.id() as i32, "TERM");
        let _ = self.child.wait();
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Samples read back from a TSDB: series (`name{k="v",...}`, labels sorted) to distinct
/// (ms, value) pairs in time order.
pub type Samples = std::collections::BTreeMap<String, Vec<(i64, f64)>>;

/// Adds one series' samples to `out`, keeping distinct (time, value) pairs in time order.
pub fn add_series(
    out: &mut Samples,
    labels: &serde_json::Map<String, serde_json::Value>,
    pts: impl IntoIterator<Item = (i64, f64)>,
) {
    let name = labels
        .get("__name__")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    let mut rest: Vec<String> = labels
        .iter()
        .filter(|(k, _)| *k != "__name__")
        .map(|(k, v)| format!("{k}={:?}", v.as_str().unwrap_or("")))
        .collect();
    rest.sort();
    let v = out
        .entry(format!("{name}{{{}}}", rest.join(",")))
        .or_default();
    v.extend(pts);
    v.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    v.dedup();
}

/// A real VictoriaMetrics single node (`victoria-metrics` from Debian) on `port`, its data in
/// `dir`; killed when dropped. Queries see the newest samples at once
/// (`-search.latencyOffset=0s`, no result cache).
pub struct VictoriaMetrics {
    pub child: Child,
    pub http: SocketAddr,
    pub dir: PathBuf,
    /// `Authorization` the helper's own requests send (with `-httpAuth.*`).
    pub auth: Option<String>,
}

impl VictoriaMetrics {
    pub fn start_on(dir: &Path, port: u16) -> VictoriaMetrics {
        Self::start_with(dir, port, None)
    }

    /// With `basic = Some((user, password))`, every endpoint but `/health` wants basic auth
    /// (`-httpAuth.username`, `-httpAuth.password`).
    pub fn start_with(dir: &Path, port: u16, basic: Option<(&str, &str)>) -> VictoriaMetrics {
        let http: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let log = std::fs::File::create(dir.join("victoria-metrics.log")).unwrap();
        let child = Command::new("victoria-metrics")
            .arg(format!("-httpListenAddr={http}"))
            .arg(format!("-storageDataPath={}", dir.join("data").display()))
            .args([
                "-retentionPeriod=100y",
                "-search.latencyOffset=0s",
                "-search.disableCache",
                "-loggerLevel=WARN",
            ])
            .args(basic.iter().flat_map(|(u, p)| {
                [
                    format!("-httpAuth.username={u}"),
                    format!("-httpAuth.password={p}"),
                ]
            }))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn victoria-metrics (apt-get install victoria-metrics)");
        let auth = basic.map(|(u, p)| {
            use base64::Engine as _;
            let b = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
            format!("Basic {b}")
        });
        let vm = VictoriaMetrics {
            child,
            http,
            dir: dir.to_path_buf(),
            auth,
        };
        let ok = wait_for(Duration::from_secs(30), || {
            get(&format!("http://{http}/health"))
                .ok()
                .filter(|r| r.0 == 200)
        });
        assert!(
            ok.is_some(),
            "victoria-metrics did not start: {}",
            std::fs::read_to_string(dir.join("victoria-metrics.log")).unwrap_or_default()
        );
        vm
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// A GET of `path` with the helper's credentials.
    fn get(&self, path: &str) -> ureq::Request {
        let r = ureq::get(&self.url(path));
        match &self.auth {
            Some(a) => r.set("Authorization", a),
            None => r,
        }
    }

    /// Makes every ingested sample searchable.
    pub fn flush(&self) {
        self.get("/internal/force_flush")
            .call()
            .expect("victoria-metrics force_flush");
    }

    /// Every sample of the series matching `selector`, through `/api/v1/export`.
    pub fn export(&self, selector: &str) -> Samples {
        self.flush();
        let r = self
            .get("/api/v1/export")
            .query("match[]", selector)
            .query("start", "0")
            .call()
            .expect("victoria-metrics export");
        let mut out = Samples::new();
        for line in r
            .into_string()
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
        {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let ts = v["timestamps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_i64().unwrap());
            let vals = v["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap_or(f64::NAN));
            add_series(&mut out, v["metric"].as_object().unwrap(), ts.zip(vals));
        }
        out
    }

    /// A PromQL query over `[start, end]` (seconds) at `step`: the JSON answer.
    pub fn query_range(&self, q: &str, start: i64, end: i64, step: &str) -> serde_json::Value {
        let r = self
            .get("/api/v1/query_range")
            .query("query", q)
            .query("start", &start.to_string())
            .query("end", &end.to_string())
            .query("step", step)
            .call();
        let body = match r {
            Ok(r) => r.into_string().unwrap(),
            Err(ureq::Error::Status(_, r)) => r.into_string().unwrap(),
            Err(e) => panic!("victoria-metrics query: {e}"),
        };
        serde_json::from_str(&body).unwrap()
    }
}

impl Drop for VictoriaMetrics {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real Prometheus (Debian `prometheus`) with `--web.enable-remote-write-receiver` on
/// `port`, its TSDB in `dir`, scraping nothing; killed when dropped. `ooo_window` sets
/// `storage.tsdb.out_of_order_time_window` (a backlog older than the newest sample needs it).
pub struct Prometheus {
    pub child: Child,
    pub http: SocketAddr,
    pub dir: PathBuf,
}

impl Prometheus {
    pub fn start_on(dir: &Path, port: u16, ooo_window: Option<&str>) -> Prometheus {
        Self::start_with_features(dir, port, ooo_window, &[])
    }

    /// [`Prometheus::start_on`] with `--enable-feature=<f>` for each of `features`
    /// (e.g. `native-histograms`).
    pub fn start_with_features(
        dir: &Path,
        port: u16,
        ooo_window: Option<&str>,
        features: &[&str],
    ) -> Prometheus {
        let http: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let cfg = dir.join("prometheus.yml");
        let mut text = String::from("global:\n  evaluation_interval: 1h\nscrape_configs: []\n");
        if let Some(w) = ooo_window {
            text.push_str(&format!(
                "storage:\n  tsdb:\n    out_of_order_time_window: {w}\n"
            ));
        }
        std::fs::write(&cfg, text).unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={http}"))
            .args(["--web.enable-remote-write-receiver", "--log.level=warn"])
            .args(features.iter().map(|f| format!("--enable-feature={f}")))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus (apt-get install prometheus)");
        let p = Prometheus {
            child,
            http,
            dir: dir.to_path_buf(),
        };
        let ok = wait_for(Duration::from_secs(30), || {
            get(&format!("http://{http}/-/ready"))
                .ok()
                .filter(|r| r.0 == 200)
        });
        assert!(ok.is_some(), "prometheus did not start: {}", p.log_text());
        p
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// Every sample of the series matching `selector` in the `range` before `at_s` (seconds),
    /// through `/api/v1/query` with a range selector.
    pub fn samples(&self, selector: &str, range: &str, at_s: f64) -> Samples {
        let r = ureq::get(&format!("http://{}/api/v1/query", self.http))
            .query("query", &format!("{selector}[{range}]"))
            .query("time", &format!("{at_s:.3}"))
            .call()
            .expect("prometheus query");
        let v: serde_json::Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
        assert_eq!(v["status"], "success", "{v}");
        let mut out = Samples::new();
        for s in v["data"]["result"].as_array().unwrap() {
            let pts = s["values"].as_array().unwrap().iter().map(|p| {
                let t = (p[0].as_f64().unwrap() * 1000.0).round() as i64;
                (t, p[1].as_str().unwrap().parse::<f64>().unwrap())
            });
            add_series(&mut out, s["metric"].as_object().unwrap(), pts);
        }
        out
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
