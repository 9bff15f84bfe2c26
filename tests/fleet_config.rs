//! Signed remote config on the real binary: `edgewatch fleet keygen/sign/publish` against a
//! real mosquitto, agents that pick the `all` and group layers up (retained, published
//! before they start), keep them across a restart with the broker down, resubscribe after a
//! broker restart, poll a real HTTP server (Python's `http.server` with ETag/304), refuse
//! every kind of bad document with its reason while the running config stays, and ten
//! agents that all report the same layers. Live application of a change needs the
//! reloader: here a change is validated, stored and reported `applied`, and runs from the
//! next start (which these tests check through `/api/v1/alerts`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::peers::{require, Mosquitto, Peer, Sub};
use crate::support::{bin, free_port, get, post, wait_for, Agent};

/// A rule only the fleet's `all` layer defines.
const RULE: &str = "[[alert]]\nname = \"FleetHot\"\nmeasurement = \"fleet_m\"\nfield = \"v\"\nagg = \"max\"\nwindow = \"1m\"\nop = \">\"\nthreshold = 5\nfor = \"0s\"\n";

fn edgewatch(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The fleet's key pair in `dir/keys`; returns the public key line.
fn keygen(dir: &Path) -> String {
    let keys = dir.join("keys");
    let (code, _, err) = edgewatch(&["fleet", "keygen", "--out", keys.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(keys.join("fleet.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    std::fs::read_to_string(keys.join("fleet.pub"))
        .unwrap()
        .trim()
        .to_string()
}

/// `fleet sign` of `fragment` as `version` with the key in `keys`; the signed file.
fn sign(dir: &Path, keys: &Path, version: u64, fragment: &str) -> PathBuf {
    let frag = dir.join(format!("frag-{version}-{}.toml", fragment.len()));
    std::fs::write(&frag, fragment).unwrap();
    let key = keys.join("keys/fleet.key");
    let (code, out, err) = edgewatch(&[
        "fleet",
        "sign",
        "--key",
        key.to_str().unwrap(),
        "--version",
        &version.to_string(),
        frag.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("# edgewatch-fleet-config v1\n# version = "),
        "{out}"
    );
    let signed = dir.join(format!("signed-{version}-{}.txt", fragment.len()));
    std::fs::write(&signed, out).unwrap();
    signed
}

fn publish(port: u16, target: &str, signed: &Path) {
    let url = format!("mqtt://127.0.0.1:{port}");
    let (code, out, err) = edgewatch(&[
        "fleet",
        "publish",
        "--mqtt",
        &url,
        "--target",
        target,
        signed.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("retained"), "{out}");
}

fn fleet_section(public_key: &str, groups: &str, transport: &str) -> String {
    format!("[fleet]\npublic_key = \"{public_key}\"\ngroups = {groups}\n{transport}\n")
}

/// `<data_dir>/fleet/status.json` of `agent`.
fn fleet_status(data: &Path) -> serde_json::Value {
    std::fs::read(data.join("fleet/status.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn layer(status: &serde_json::Value, source: &str) -> serde_json::Value {
    status["layers"]
        .as_array()
        .and_then(|l| l.iter().find(|x| x["source"] == source).cloned())
        .unwrap_or(serde_json::Value::Null)
}

/// Waits until layer `source` is in `state` at `version`; returns the status.
fn wait_layer(data: &Path, source: &str, state: &str, version: u64) -> serde_json::Value {
    wait_for(Duration::from_secs(20), || {
        let s = fleet_status(data);
        let l = layer(&s, source);
        (l["state"] == state && l["version"].as_u64() == Some(version)).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "layer {source} never {state} at version {version}: {}",
            fleet_status(data)
        )
    })
}

/// The real agent in `dir` (created if missing).
fn start_agent(dir: &Path, cfg: &str, env: &[(&str, &str)]) -> Agent {
    std::fs::create_dir_all(dir).unwrap();
    Agent::start_with_env(dir, cfg, env)
}

/// Whether the agent runs rule `name` (a point above its threshold makes it fire).
fn runs_rule(agent: &Agent, name: &str) -> bool {
    let (code, _) = post(&agent.url("/write"), b"fleet_m v=9", &[]).unwrap();
    assert_eq!(code, 204);
    wait_for(Duration::from_secs(8), || {
        let (_, body) = get(&agent.url("/api/v1/alerts")).ok()?;
        body.contains(&format!("\"name\":\"{name}\"")).then_some(())
    })
    .is_some()
}

#[test]
fn published_layers_reach_an_agent_started_later_and_survive_a_restart_with_the_broker_down() {
    if !require(Peer::Mosquitto) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let broker = Mosquitto::start(&d.path().join("mq"), port, None);
    let public = keygen(d.path());
    // Published before any agent runs: retained.
    publish(port, "all", &sign(d.path(), d.path(), 1, RULE));
    let group = "[host]\ninterval = \"3s\"\n";
    publish(port, "group:lab", &sign(d.path(), d.path(), 4, group));
    let status = Sub::start_subscribed(
        port,
        "edgewatch/dev-1/config/status",
        "t-status",
        &d.path().join("status.txt"),
        None,
    );
    let agent_dir = d.path().join("a");
    let cfg = fleet_section(
        &public,
        "[\"lab\"]",
        &format!("mqtt = \"mqtt://127.0.0.1:{port}\""),
    );
    let env = [("EDGEWATCH_DEVICE_ID", "dev-1")];
    let agent = start_agent(&agent_dir, &cfg, &env);
    let data = agent.dir.clone();
    wait_layer(&data, "all", "applied", 1);
    let s = wait_layer(&data, "group:lab", "applied", 4);
    assert_eq!(s["device_id"], "dev-1");
    // The status topic says the same.
    wait_for(Duration::from_secs(10), || {
        let t = status.text();
        (t.contains("\"source\":\"group:lab\"") && t.contains("\"state\":\"applied\""))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("status topic: {}", status.text()));
    // Stored as received, mode 0600.
    let stored = std::fs::read_to_string(data.join("fleet/all.signed")).unwrap();
    assert!(stored.contains("FleetHot") && stored.contains("# signature = "));
    // Applied in place: the layers arrived after start and the rule runs without a restart.
    assert!(runs_rule(&agent, "FleetHot"), "{}", agent.log_text());
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));

    // Broker down: the agent starts at once and runs its last fleet config from disk.
    broker.stop();
    let t = Instant::now();
    let agent = start_agent(&agent_dir, &cfg, &env);
    let up = t.elapsed();
    assert!(up < Duration::from_secs(5), "start-up took {up:?}");
    assert!(runs_rule(&agent, "FleetHot"), "{}", agent.log_text());
    let s = fleet_status(&data);
    assert_eq!(layer(&s, "all")["state"], "applied", "{s}");
    assert_eq!(layer(&s, "group:lab")["version"], 4, "{s}");
    // The broker's absence is shown (and logged), not waited for.
    wait_for(Duration::from_secs(10), || {
        let link = fleet_status(&data)["transport"]["link"].clone();
        link.as_str()
            .is_some_and(|l| l != "connected" && !l.is_empty())
            .then_some(())
    })
    .unwrap_or_else(|| panic!("no broker error shown: {}", fleet_status(&data)));
    assert!(agent.log_text().contains("fleet broker unreachable"));

    // The broker comes back (same port, its retained messages persisted): the agent
    // resubscribes and takes a new version.
    let broker = Mosquitto::start(&d.path().join("mq"), port, None);
    let v2 = format!("{RULE}\n[tags]\nfleet = \"v2\"\n");
    publish(port, "all", &sign(d.path(), d.path(), 2, &v2));
    wait_layer(&data, "all", "applied", 2);
    assert!(wait_layer(&data, "group:lab", "applied", 4)["transport"]["link"] == "connected");
    drop(agent);
    drop(broker);
}

#[test]
fn every_bad_document_is_refused_with_its_reason_and_the_running_config_stays() {
    if !require(Peer::Mosquitto) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let _broker = Mosquitto::start(&d.path().join("mq"), port, None);
    let public = keygen(d.path());
    let other = d.path().join("other");
    keygen(&other);
    publish(port, "all", &sign(d.path(), d.path(), 5, RULE));
    let cfg = fleet_section(
        &public,
        "[]",
        &format!("mqtt = \"mqtt://127.0.0.1:{port}\""),
    );
    let env = [("EDGEWATCH_DEVICE_ID", "dev-bad")];
    let agent_dir = d.path().join("a");
    let agent = start_agent(&agent_dir, &cfg, &env);
    let data = agent.dir.clone();
    wait_layer(&data, "all", "applied", 5);
    let applied = std::fs::read(data.join("fleet/all.signed")).unwrap();

    let good = String::from_utf8(applied.clone()).unwrap();
    let tampered = d.path().join("tampered.txt");
    std::fs::write(&tampered, good.replace("threshold = 5", "threshold = 500")).unwrap();
    // `fleet sign` refuses a fragment that is not TOML; a document signed anyway (with the
    // same key, through the library) is refused by the device.
    let frag = d.path().join("broken.toml");
    std::fs::write(&frag, "[host\n").unwrap();
    let key_file = d.path().join("keys/fleet.key");
    let (code, _, err) = edgewatch(&[
        "fleet",
        "sign",
        "--key",
        key_file.to_str().unwrap(),
        "--version",
        "6",
        frag.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("not valid TOML"), "{err}");
    let key =
        edgewatch::fleet::doc::private_key(&std::fs::read_to_string(&key_file).unwrap()).unwrap();
    let malformed = d.path().join("malformed.txt");
    std::fs::write(&malformed, edgewatch::fleet::doc::sign(&key, 6, "[host\n")).unwrap();
    let big = format!("# {}\n{RULE}", "x".repeat(70 * 1024));
    let cases: Vec<(&str, PathBuf, &str, &str)> = vec![
        ("malformed TOML", malformed, "refused", "not valid TOML"),
        ("unknown key", sign(d.path(), d.path(), 6, "[host]\nintervall = \"1s\"\n"), "failed", "intervall"),
        ("wrong type", sign(d.path(), d.path(), 6, "[host]\nenabled = \"yes\"\n"), "failed", "enabled"),
        ("invalid rule", sign(d.path(), d.path(), 6, "[[alert]]\nname = \"Bad\"\nmeasurement = \"m\"\nfield = \"v\"\nagg = \"p999x\"\nwindow = \"1m\"\nop = \">\"\nthreshold = 1\n"), "failed", "p999x"),
        ("bad signature", tampered, "refused", "bad signature"),
        ("wrong key", sign(d.path(), &other, 6, "[host]\n"), "refused", "bad signature"),
        ("old version", sign(d.path(), d.path(), 4, "[host]\n"), "refused", "older than version 5"),
        ("oversized", sign(d.path(), d.path(), 6, &big), "refused", "max_document_bytes"),
        ("[storage]", sign(d.path(), d.path(), 6, "[storage]\ndata_dir = \"/tmp/x\"\n"), "refused", "[storage]"),
        ("[http]", sign(d.path(), d.path(), 6, "[http]\nmetrics_open = true\n"), "refused", "[http]"),
    ];
    for (what, signed, state, says) in cases {
        publish(port, "all", &signed);
        let s = wait_for(Duration::from_secs(20), || {
            let s = fleet_status(&data);
            let l = layer(&s, "all");
            (l["state"] == state && l["error"].as_str().is_some_and(|e| e.contains(says)))
                .then_some(s)
        })
        .unwrap_or_else(|| panic!("{what}: not {state} with {says:?}: {}", fleet_status(&data)));
        // The applied layer stays: its version, and its stored document.
        assert_eq!(layer(&s, "all")["version"], 5, "{what}: {s}");
        assert_eq!(
            std::fs::read(data.join("fleet/all.signed")).unwrap(),
            applied,
            "{what}"
        );
        // Published again for the next case: make the state change visible.
        publish(port, "all", &sign(d.path(), d.path(), 5, RULE));
        wait_layer(&data, "all", "applied", 5);
    }
    assert!(agent.log_text().contains("fleet document refused"));
    // The agent still runs the version-5 layer after a restart.
    drop(agent);
    let agent = start_agent(&agent_dir, &cfg, &env);
    assert!(runs_rule(&agent, "FleetHot"), "{}", agent.log_text());
}

/// `tests/support/etag_server.py` on a free port, killed when dropped.
struct EtagServer {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
}

impl EtagServer {
    fn start(root: &Path, log: &Path) -> EtagServer {
        let port = free_port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/etag_server.py");
        let child = Command::new("python3")
            .arg(script)
            .arg(root)
            .arg(port.to_string())
            .arg(log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 (Debian python3) for the HTTP server");
        wait_for(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .expect("the HTTP server did not start");
        EtagServer {
            child,
            port,
            log: log.to_path_buf(),
        }
    }

    fn answers(&self, code: u16) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.ends_with(&format!(" {code}")))
            .count()
    }
}

impl Drop for EtagServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn http_pull_applies_each_layer_once_and_304_costs_nothing() {
    let d = tempfile::tempdir().unwrap();
    let public = keygen(d.path());
    let root = d.path().join("www");
    std::fs::create_dir_all(root.join("device")).unwrap();
    std::fs::copy(sign(d.path(), d.path(), 1, RULE), root.join("all")).unwrap();
    let device = "[tags]\nsite = \"pulled\"\n";
    std::fs::copy(
        sign(d.path(), d.path(), 1, device),
        root.join("device/dev-h"),
    )
    .unwrap();
    let server = EtagServer::start(&root, &d.path().join("http.log"));
    let cfg = fleet_section(
        &public,
        "[\"lab\"]",
        &format!("url = \"http://127.0.0.1:{}\"\npoll = \"1s\"", server.port),
    );
    let env = [("EDGEWATCH_DEVICE_ID", "dev-h")];
    let agent_dir = d.path().join("a");
    let agent = start_agent(&agent_dir, &cfg, &env);
    let data = agent.dir.clone();
    wait_layer(&data, "all", "applied", 1);
    wait_layer(&data, "device", "applied", 1);
    // Later polls: 304 for both layers, 404 for the unpublished group; nothing re-applied.
    let s = wait_for(Duration::from_secs(20), || {
        let s = fleet_status(&data);
        (s["transport"]["not_modified"].as_u64() >= Some(4)).then_some(s)
    })
    .unwrap_or_else(|| panic!("no 304s counted: {}", fleet_status(&data)));
    assert_eq!(s["transport"]["received"], 2, "{s}");
    assert!(server.answers(304) >= 4, "server saw no 304s");
    assert_eq!(server.answers(200), 2);
    assert!(server.answers(404) >= 2, "the group's URL");
    assert_eq!(s["transport"]["link"], "ok");
    // A new version on the server is taken at the next poll.
    std::fs::copy(
        sign(d.path(), d.path(), 2, "[tags]\nsite = \"pulled-2\"\n"),
        root.join("device/dev-h"),
    )
    .unwrap();
    let s = wait_layer(&data, "device", "applied", 2);
    assert_eq!(s["transport"]["received"], 3, "{s}");
    // And runs from the stored layers at the next start (the server gone).
    drop(server);
    drop(agent);
    let agent = start_agent(&agent_dir, &cfg, &env);
    assert!(runs_rule(&agent, "FleetHot"), "{}", agent.log_text());
    let s = wait_for(Duration::from_secs(10), || {
        let s = fleet_status(&agent.dir);
        s["transport"]["link"]
            .as_str()
            .is_some_and(|l| l.contains("127.0.0.1"))
            .then_some(s)
    })
    .unwrap_or_else(|| panic!("no server error shown: {}", fleet_status(&agent.dir)));
    assert_eq!(layer(&s, "device")["version"], 2, "{s}");
}

#[test]
fn ten_agents_take_one_all_change_and_one_group_change() {
    if !require(Peer::Mosquitto) {
        return;
    }
    const AGENTS: usize = 10;
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let _broker = Mosquitto::start(&d.path().join("mq"), port, None);
    let public = keygen(d.path());
    // Retained: each device's last status reaches this subscriber whenever it subscribes.
    let statuses = Sub::start(
        port,
        "edgewatch/+/config/status",
        "t-fleet-status",
        &d.path().join("status.txt"),
        None,
    );
    let cfg = format!(
        "{}{}",
        crate::support::peers::QUIET,
        fleet_section(
            &public,
            "[\"edge\"]",
            &format!("mqtt = \"mqtt://127.0.0.1:{port}\"")
        )
    );
    let agents: Vec<Agent> = (0..AGENTS)
        .map(|i| {
            let id = format!("fleet-{i}");
            start_agent(
                &d.path().join(&id),
                &cfg,
                &[("EDGEWATCH_DEVICE_ID", id.as_str())],
            )
        })
        .collect();
    // Every agent connected (its status published) before the change.
    wait_for(Duration::from_secs(30), || {
        agents
            .iter()
            .all(|a| fleet_status(&a.dir)["transport"]["link"] == "connected")
            .then_some(())
    })
    .expect("every agent connects to the broker");
    let all = sign(d.path(), d.path(), 1, RULE);
    let group = sign(d.path(), d.path(), 1, "[host]\ninterval = \"7s\"\n");
    let t = Instant::now();
    publish(port, "all", &all);
    publish(port, "group:edge", &group);
    let done = wait_for(Duration::from_secs(60), || {
        agents
            .iter()
            .all(|a| {
                let s = fleet_status(&a.dir);
                layer(&s, "all")["state"] == "applied"
                    && layer(&s, "group:edge")["state"] == "applied"
            })
            .then_some(())
    });
    let took = t.elapsed();
    assert!(
        done.is_some(),
        "not every agent applied both layers in 60 s"
    );
    eprintln!("fleet: {AGENTS} agents applied an `all` and a group change in {took:?}");
    let shas: Vec<String> = agents
        .iter()
        .map(|a| {
            fleet_status(&a.dir)["fleet_sha256"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(shas.iter().all(|s| s == &shas[0]), "{shas:?}");
    // Applied in place on every agent: the fleet's rule runs without a restart, and the
    // agent's own status lists both layers as applied.
    for a in &agents {
        assert!(runs_rule(a, "FleetHot"), "{}", a.log_text());
        let (_, body) = get(&a.url("/api/v1/status")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let layers = v["config"]["layers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for src in ["all", "group:edge"] {
            assert!(
                layers
                    .iter()
                    .any(|l| l["source"] == src && l["state"] == "applied"),
                "{src} not applied in the status: {layers:?}"
            );
        }
    }
    // Each device's status topic says so (its last message).
    for i in 0..AGENTS {
        let id = format!("fleet-{i}");
        let last = wait_for(Duration::from_secs(10), || {
            let text = statuses.text();
            let last = text
                .lines()
                .rfind(|l| l.contains(&format!("\"device_id\":\"{id}\"")))?
                .to_string();
            let v: serde_json::Value = serde_json::from_str(&last).ok()?;
            (layer(&v, "group:edge")["state"] == "applied"
                && layer(&v, "all")["state"] == "applied")
                .then_some(v)
        })
        .unwrap_or_else(|| panic!("{id}: no `applied` status on its topic"));
        assert_eq!(last["fleet_sha256"].as_str(), Some(shas[0].as_str()));
        assert_eq!(last["sha256"].as_str().map(str::len), Some(64));
    }
}

#[test]
fn fleet_commands_and_keys_fail_clearly() {
    let d = tempfile::tempdir().unwrap();
    let public = keygen(d.path());
    // The key is kept unless replaced on purpose.
    let keys = d.path().join("keys");
    let (code, _, err) = edgewatch(&["fleet", "keygen", "--out", keys.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("--force"), "{err}");
    assert_eq!(
        std::fs::read_to_string(keys.join("fleet.pub"))
            .unwrap()
            .trim(),
        public
    );
    // Nothing listens on this port: publish says so and fails.
    let signed = sign(d.path(), d.path(), 1, "[host]\n");
    let url = format!("mqtt://127.0.0.1:{}", free_port());
    let (code, _, err) = edgewatch(&[
        "fleet",
        "publish",
        "--mqtt",
        &url,
        "--target",
        "all",
        "--timeout",
        "3",
        signed.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("127.0.0.1"), "{err}");
    let (code, _, err) = edgewatch(&[
        "fleet",
        "publish",
        "--mqtt",
        &url,
        "--target",
        "everyone",
        signed.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("group:NAME"), "{err}");
    // check-config names a bad [fleet] key.
    let (code, out) = crate::support::check_config(
        &d.path().join("bad.toml"),
        "[fleet]\nmqtt = \"mqtt://127.0.0.1:1883\"\n",
    );
    assert_eq!(code, Some(1));
    assert!(out.contains("public_key"), "{out}");
    let (code, out) = crate::support::check_config(
        &d.path().join("bad2.toml"),
        &format!("[fleet]\npublic_key = \"{public}\"\nallow = [\"tags\"]\n"),
    );
    assert_eq!(code, Some(1));
    assert!(out.contains("allow"), "{out}");
    // The broker's TLS files are read by check-config, as a sink's are.
    let (code, out) = crate::support::check_config(
        &d.path().join("bad3.toml"),
        &format!(
            "[fleet]\npublic_key = \"{public}\"\nmqtt = \"mqtts://127.0.0.1:8883\"\nca_file = \"/nonexistent/ca.pem\"\n"
        ),
    );
    assert_eq!(code, Some(1));
    assert!(
        out.contains("[fleet] mqtt") && out.contains("/nonexistent/ca.pem"),
        "{out}"
    );
}
