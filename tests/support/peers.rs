//! Peers for the forwarding tests: a real `mosquitto` (plain or TLS with a CA made here by
//! the `openssl` CLI), an InfluxDB 1.x on a chosen port, a fault-injecting HTTP proxy, and
//! an agent started with top-level config keys (`device_id`, `[tags]`, `[[sink]]`).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// Collectors and rollup off.
pub const QUIET: &str = "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n[rollup]\nenabled = false\n[health]\nenabled = false\n";

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
        std::fs::create_dir_all(dir).unwrap();
        let mut conf = format!(
            "user root\nlistener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nmax_queued_messages 100000\n",
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
/// header), then forwards every request to `upstream`. Counts requests.
pub struct FaultProxy {
    pub port: u16,
    pub script: Script,
    pub requests: Arc<Mutex<Vec<(u16, usize)>>>,
}

impl FaultProxy {
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let script: Script = Default::default();
        let requests: Arc<Mutex<Vec<(u16, usize)>>> = Default::default();
        let (s2, r2) = (script.clone(), requests.clone());
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let (s3, r3) = (s2.clone(), r2.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, upstream, s3, r3);
                });
            }
        });
        FaultProxy {
            port,
            script,
            requests,
        }
    }

    pub fn push(&self, status: u16, header: Option<(&'static str, &'static str)>) {
        self.script.lock().unwrap().push_back((status, header));
    }
}

/// Scripted answers: status and an optional extra header.
pub type Script = Arc<Mutex<VecDeque<(u16, Option<(&'static str, &'static str)>)>>>;

fn serve(
    conn: TcpStream,
    upstream: SocketAddr,
    script: Script,
    log: Arc<Mutex<Vec<(u16, usize)>>>,
) -> std::io::Result<()> {
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
        let scripted = script.lock().unwrap().pop_front();
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
