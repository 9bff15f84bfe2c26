//! Commands, config files and errors: `--version`, `--help`, `check-config`, `query`,
//! `status` (rendering of the typed status document).

use std::process::Command;

use crate::support::*;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .output()
        .expect("run edgewatch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_and_help_on_every_command() {
    let (code, out, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("edgewatch "), "{out}");
    for cmd in [
        vec!["--help"],
        vec!["run", "--help"],
        vec!["check-config", "--help"],
        vec!["query", "--help"],
        vec!["tegrastats", "parse", "--help"],
    ] {
        let (code, out, _) = run(&cmd);
        assert_eq!(code, 0, "{cmd:?}");
        assert!(out.contains("Usage:"), "{cmd:?}: {out}");
    }
}

#[test]
fn check_config_accepts_the_shipped_default_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/edgewatch.toml");
    let (code, out, err) = run(&["check-config", path]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok"), "{out}");
}

#[test]
fn check_config_names_unknown_keys_and_bad_values_with_lines() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.toml");
    std::fs::write(
        &f,
        "[http]\nlisten = \"127.0.0.1:1\"\n\n[storage]\nmax_seris = 5\n",
    )
    .unwrap();
    let (code, _, err) = run(&["check-config", f.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("line 5") && err.contains("max_seris"), "{err}");

    std::fs::write(&f, "[udp]\nprecision = \"fortnights\"\n").unwrap();
    let (code, _, err) = run(&["check-config", f.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(
        err.contains("line 2") && err.contains("fortnights"),
        "{err}"
    );

    std::fs::write(&f, "[http\nlisten = 1\n").unwrap();
    let (code, _, err) = run(&["check-config", f.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("line 1"), "{err}");

    let (code, _, err) = run(&["check-config", "/nonexistent/edgewatch.toml"]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot read config file"), "{err}");
}

#[test]
fn environment_overrides_are_checked_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("ok.toml");
    std::fs::write(&f, "").unwrap();
    let out = Command::new(bin())
        .args(["check-config", f.to_str().unwrap()])
        .env("EDGEWATCH_STORAGE__MAX_SERIES", "77")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("max_series: 77"));
    let out = Command::new(bin())
        .args(["check-config", f.to_str().unwrap()])
        .env("EDGEWATCH_DEVICE_ID", "jetson-0042")
        .env("EDGEWATCH_TAGS__SITE", "plant-7")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("jetson-0042") && text.contains("plant-7"),
        "{text}"
    );
    let out = Command::new(bin())
        .args(["check-config", f.to_str().unwrap()])
        .env("EDGEWATCH_HTTP__LISTEN", "not-an-address")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("EDGEWATCH_HTTP__LISTEN"), "{err}");
}

#[test]
fn a_broken_config_stops_run_with_a_clear_error_and_keeps_the_store() {
    let dir = tempfile::tempdir().unwrap();
    // First a good run that stores a point.
    let agent = Agent::start(
        dir.path(),
        "[host]\nenabled = false\n[rollup]\nenabled = false\n",
    );
    let (code, _) = post(&agent.url("/write"), b"m v=1 1000", &[]).unwrap();
    assert_eq!(code, 204);
    let data = agent.dir.clone();
    assert_eq!(agent.terminate().0, Some(0));
    // Then a broken config: run refuses to start, naming the problem.
    let f = dir.path().join("broken.toml");
    std::fs::write(
        &f,
        format!("[storage]\ndata_dir = \"{}\"\nbogus = 1\n", data.display()),
    )
    .unwrap();
    let (code, _, err) = run(&["run", "--config", f.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("bogus") && err.contains("line 3"), "{err}");
    // The stored point is intact.
    let (code, out, err) = run(&[
        "query",
        "--data-dir",
        data.to_str().unwrap(),
        "--measurement",
        "m",
        "--from",
        "0",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(",m,,v,1"), "{out}");
}

#[test]
fn query_reads_a_running_agents_store_as_csv_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        "[host]\nenabled = false\n[rollup]\nenabled = false\n",
    );
    let body = "inference,model=yolo,app=cam wall_ms=12.5,ok=true 1764000000000000000\n\
                inference,model=resnet,app=cam wall_ms=30 1764000001000000000\n\
                inference,model=yolo,app=cam wall_ms=14.5,note=\"a, \\\"b\\\"\" 1764000002000000000\n";
    assert_eq!(
        post(&agent.url("/write"), body.as_bytes(), &[]).unwrap().0,
        204
    );
    // A small write is answered once in the journal and committed with the next commit:
    // any read of the API commits what is held; another process sees it from then on.
    agent.status();
    let d = agent.dir.to_str().unwrap().to_string();
    let (code, out, err) = run(&[
        "query",
        "--data-dir",
        &d,
        "--measurement",
        "inference",
        "--tag",
        "model=yolo",
        "--field",
        "wall_ms",
        "--from",
        "2025-11-24T16:00:00Z",
        "--to",
        "1764000003000000000",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "time,time_ns,measurement,tags,field,value");
    assert_eq!(
        &lines[1..],
        [
            "2025-11-24T16:00:00Z,1764000000000000000,inference,app=cam;model=yolo,wall_ms,12.5",
            "2025-11-24T16:00:02Z,1764000002000000000,inference,app=cam;model=yolo,wall_ms,14.5",
        ]
    );
    let (code, out, _) = run(&[
        "query",
        "--data-dir",
        &d,
        "--measurement",
        "inference",
        "--format",
        "json",
        "--from",
        "1764000000000000000",
        "--to",
        "1764000003000000000",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let series = v["series"].as_array().unwrap();
    let note = series.iter().find(|s| s["field"] == "note").unwrap();
    assert_eq!(note["points"][0][1], "a, \"b\"");
    assert_eq!(series.len(), 4); // resnet wall_ms; yolo note, ok, wall_ms
                                 // Default range is the last hour: these 2025 points are outside it.
    let (_, out, _) = run(&["query", "--data-dir", &d, "--measurement", "inference"]);
    assert_eq!(out.lines().count(), 1);
    // Bad arguments are explained.
    let (code, _, err) = run(&[
        "query",
        "--data-dir",
        &d,
        "--measurement",
        "x",
        "--from",
        "soon",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("RFC 3339"), "{err}");
    let (code, _, err) = run(&["query", "--data-dir", "/nonexistent", "--measurement", "x"]);
    assert_ne!(code, 0);
    assert!(err.contains("no edgewatch database"), "{err}");
}

/// A `query` command line and the same query as `/api/v1/query` parameters.
type FlagsAndParams<'a> = Vec<(Vec<&'a str>, Vec<(&'a str, &'a str)>)>;

/// `query` builds its typed queries from the flags with the same checks as `/api/v1/query`
/// does from its parameters: the same answer for raw points and aggregates (tags, group-by,
/// step, agg, limit) and the same message for each mistake.
#[test]
fn query_flags_answer_and_refuse_as_the_http_parameters_do() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        "[host]\nenabled = false\n[rollup]\nenabled = false\n",
    );
    let t0: i64 = 1_764_000_000_000_000_000;
    let mut body = String::new();
    for i in 0..6i64 {
        for (model, ms) in [("yolo", 10 + i), ("resnet", 30 + 2 * i)] {
            body.push_str(&format!(
                "inference,model={model},app=cam wall_ms={ms} {}\n",
                t0 + i * 1_000_000_000
            ));
        }
    }
    assert_eq!(
        post(&agent.url("/write"), body.as_bytes(), &[]).unwrap().0,
        204
    );
    let d = agent.dir.to_str().unwrap().to_string();
    let (from, to) = (t0.to_string(), (t0 + 10_000_000_000).to_string());
    let range: [(&str, &str); 2] = [("from", &from), ("to", &to)];
    // (flags, the same query as parameters)
    let answers: FlagsAndParams = vec![
        (
            vec!["--field", "wall_ms", "--step", "2s", "--agg", "max"],
            vec![("field", "wall_ms"), ("step", "2s"), ("agg", "max")],
        ),
        (
            vec![
                "--field=wall_ms",
                "--step=1s",
                "--tag=app=cam",
                "--group-by=app",
            ],
            vec![
                ("field", "wall_ms"),
                ("step", "1s"),
                ("tag.app", "cam"),
                ("group_by", "app"),
            ],
        ),
        // No step: one step over the whole range. A tag given twice keeps its last value.
        (
            vec![
                "--field=wall_ms",
                "--agg=p50",
                "--tag=model=resnet",
                "--tag=model=yolo",
            ],
            vec![("field", "wall_ms"), ("agg", "p50"), ("tag.model", "yolo")],
        ),
        (
            vec!["--field=wall_ms", "--agg=count", "--group-by="],
            vec![("field", "wall_ms"), ("agg", "count"), ("group_by", "")],
        ),
        (
            vec!["--tag=model=yolo", "--limit=4"],
            vec![("tag.model", "yolo"), ("limit", "4")],
        ),
    ];
    let ask = |flags: &[&str], params: &[(&str, &str)]| {
        let mut args = vec!["query", "--data-dir", &d, "--format", "json"];
        args.extend_from_slice(flags);
        // The status read for the latest first: it commits what the agent holds, which the
        // CLI (another process, reading the database) sees only once committed (the API's
        // queries see it held).
        agent.status();
        let query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let api = get(&agent.url(&format!("/api/v1/query?{}", query.join("&")))).unwrap();
        let cli = run(&args);
        (cli, api)
    };
    for (flags, params) in &answers {
        let mut flags = flags.clone();
        flags.extend(["--measurement", "inference", "--from", &from, "--to", &to]);
        let mut params = params.clone();
        params.push(("measurement", "inference"));
        params.extend(range);
        let ((code, out, err), (status, body)) = ask(&flags, &params);
        assert_eq!((code, status), (0, 200), "{flags:?}: {err} {body}");
        let cli: serde_json::Value = serde_json::from_str(&out).unwrap();
        let api: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            !cli["series"].as_array().unwrap().is_empty(),
            "{flags:?}: {out}"
        );
        assert_eq!(cli, api, "{flags:?}");
    }
    let mistakes: FlagsAndParams = vec![
        (vec!["--measurement="], vec![("measurement", "")]),
        (
            vec!["--measurement=m", "--from=soon"],
            vec![("measurement", "m"), ("from", "soon")],
        ),
        (
            vec!["--measurement=m", "--from=100", "--to=50"],
            vec![("measurement", "m"), ("from", "100"), ("to", "50")],
        ),
        (
            vec!["--measurement=m", "--step=1m"],
            vec![("measurement", "m"), ("step", "1m")],
        ),
        (
            vec!["--measurement=m", "--field=v", "--agg=median", "--step=abc"],
            vec![
                ("measurement", "m"),
                ("field", "v"),
                ("agg", "median"),
                ("step", "abc"),
            ],
        ),
        (
            vec!["--measurement=m", "--field=v", "--step=abc"],
            vec![("measurement", "m"), ("field", "v"), ("step", "abc")],
        ),
        (
            vec!["--measurement=m", "--field=v", "--step=0"],
            vec![("measurement", "m"), ("field", "v"), ("step", "0")],
        ),
    ];
    for (flags, params) in &mistakes {
        let ((code, _, err), (status, body)) = ask(flags, params);
        assert_eq!((code, status), (1, 400), "{flags:?}: {err} {body}");
        let api: serde_json::Value = serde_json::from_str(&body).unwrap();
        let message = api["error"].as_str().unwrap();
        assert_eq!(err.trim(), format!("error: {message}"), "{flags:?}");
    }
}

/// A config on free loopback HTTP with a token (which must not matter to UDP) and `udp`.
fn udp_config(dir: &std::path::Path, udp: &str) -> std::path::PathBuf {
    let f = dir.join("edgewatch.toml");
    std::fs::write(
        &f,
        format!(
            "[http]\nlisten = \"127.0.0.1:{}\"\ntoken = \"s3cret\"\n[udp]\n{udp}\n\
             [storage]\ndata_dir = \"{}\"\n[host]\nenabled = false\n[health]\nenabled = false\n[kmsg]\nenabled = false\n\
             [rollup]\nenabled = false\n",
            free_port(),
            dir.join("data").display()
        ),
    )
    .unwrap();
    f
}

#[test]
fn udp_off_loopback_without_the_opt_in_refuses_to_start_and_serves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let f = udp_config(dir.path(), "listen = \"0.0.0.0:0\"");
    let mut child = Command::new(bin())
        .args(["run", "--config", f.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // An agent that started anyway would run until killed: give it a deadline.
    let exited = wait_for(std::time::Duration::from_secs(20), || {
        child.try_wait().unwrap()
    });
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the agent started with [udp] listen = 0.0.0.0:0 and no opt-in");
    }
    let status = exited.unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("[udp] listen = 0.0.0.0:0 is reachable from other machines")
            && err.contains("[udp] allow_unauthenticated = true")
            && err.contains("listen on 127.0.0.1"),
        "{err}"
    );
    // Refused before anything was opened or bound.
    assert!(!dir.path().join("data").exists(), "the store was opened");
    assert!(!err.contains("listening"), "{err}");
}

#[test]
fn udp_off_loopback_with_the_opt_in_starts_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    // Bound on every interface, on a free port; this test only ever sends to 127.0.0.1.
    let agent = Agent::start(
        dir.path(),
        "[http]\ntoken = \"s3cret\"\n[udp]\nlisten = \"0.0.0.0:0\"\nallow_unauthenticated = true\n\
         [host]\nenabled = false\n[rollup]\nenabled = false\n",
    );
    let log = agent.log_text();
    assert!(
        log.contains("WARN") && log.contains("[udp] allow_unauthenticated = true"),
        "{log}"
    );
    let port: u16 = log
        .split("udp listening addr=0.0.0.0:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no UDP address in the log:\n{log}"));
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.send_to(b"opt_in v=1 1000\n", ("127.0.0.1", port))
        .unwrap();
    let stored = wait_for(std::time::Duration::from_secs(10), || {
        let (code, body) =
            get(&agent.url("/api/v1/query?measurement=opt_in&from=0&to=4000000000000000000"))
                .ok()?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (code == 200 && v["series"][0]["points"] == serde_json::json!([[1000, 1.0]])).then_some(v)
    });
    assert!(stored.is_some(), "the UDP point was not stored");
}

#[test]
fn check_config_applies_the_listen_policy_of_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let f = udp_config(dir.path(), "listen = \"0.0.0.0:8089\"");
    let (code, _, err) = run(&["check-config", f.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("the agent would refuse to start")
            && err.contains("[udp] listen = 0.0.0.0:8089")
            && err.contains("[udp] allow_unauthenticated = true"),
        "{err}"
    );
    let f = udp_config(
        dir.path(),
        "listen = \"0.0.0.0:8089\"\nallow_unauthenticated = true",
    );
    let (code, out, err) = run(&["check-config", f.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(": ok"), "{out}");
    assert!(
        err.starts_with("warning: [udp] allow_unauthenticated = true: UDP on 0.0.0.0:8089"),
        "{err}"
    );
    // The opt-in from the environment, as a fleet image would set it; UDP off is quiet.
    let f = udp_config(dir.path(), "listen = \"0.0.0.0:8089\"");
    let out = Command::new(bin())
        .args(["check-config", f.to_str().unwrap()])
        .env("EDGEWATCH_UDP__ALLOW_UNAUTHENTICATED", "true")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let f = udp_config(dir.path(), "listen = \"0.0.0.0:8089\"\nenabled = false");
    let (code, _, err) = run(&["check-config", f.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "{err}");
    // HTTP off loopback without a token: the agent's refusal, reported the same way.
    std::fs::write(&f, "[http]\nlisten = \"0.0.0.0:9400\"\n").unwrap();
    let (code, _, err) = run(&["check-config", f.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no [http] token is set"), "{err}");
}

/// Answers the next `n` HTTP requests on a loopback port with `body` (JSON, 200); returns
/// the base URL.
fn serve_json(body: String, n: usize) -> (String, std::thread::JoinHandle<()>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        for _ in 0..n {
            let (mut conn, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
            }
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (base, server)
}

#[test]
fn status_renders_the_typed_document_with_unknown_parts_said_so() {
    use edgewatch::status;
    let mut st = status::Status::default();
    st.agent.version = "9.9.9".into();
    st.agent.uptime_s = 3725;
    st.agent.disk_written_bytes = Some(74_500_000);
    st.ingest = status::Ingest {
        points_written: 10,
        points_rejected: 1,
        points_dropped: 2,
        writes_throttled: 3,
        queue_points: 4,
        queue_capacity: 1000,
        last_commit_ms: 1.5,
        ..status::Ingest::default()
    };
    st.store = status::Store {
        path: "/data/edgewatch.db".into(),
        db_bytes: 2_000_000,
        series: None,
        max_series: 500,
        synchronous: edgewatch::config::Synchronous::Normal,
        write: None,
    };
    // rollup and clock: null (the agent could not read its store).
    st.collectors.errors = 6;
    st.collectors.nvml.state = "running".into();
    st.collectors.nvml.driver = "550.54.15".into();
    st.collectors.nvml.gpus.push(status::Gpu::default());
    st.forward.device_id = "jet-7".into();
    st.forward.sinks.push(status::Sink {
        name: "north".into(),
        kind: "mqtt".into(),
        paused: true,
        backlog_points: 42,
        oldest_unsent_age_s: Some(75.0),
        last_error: Some("401 unauthorized".into()),
        dead_letter_batches: 1,
        dead_letter_points: 9,
        drain_rate_pps: 12.4,
        fallback_points: 3,
        evicted_unforwarded_points: 4,
        ..status::Sink::default()
    });
    let body = serde_json::to_string(&st).unwrap();
    assert!(body.contains(r#""rollup":null"#), "{body}");
    let (base, server) = serve_json(body, 1);
    let (code, out, err) = run(&["status", "--url", &base]);
    server.join().unwrap();
    assert_eq!(code, 0, "{out}{err}");
    let want = format!(
        "edgewatch 9.9.9 at {base}, up 1h02m; 74.5 MB written to storage since start (72.0 MB/h)\n\
         ingest:     10 points written, 1 rejected, 2 dropped, 3 throttled; queue 4/1000; last commit 1.5 ms\n\
         store:      2.0 MB of no budget (? series of 500 max) in /data/edgewatch.db, synchronous = normal (a power cut may lose writes acknowledged since the last checkpoint)\n\
         rollup:     unknown (the agent could not read its store)\n\
         collectors: 6 errors; nvml running (1 GPU, driver 550.54.15)\n\
         forwarding: device_id jet-7\n\
         \x20 SINK   TYPE  STATE   BACKLOG  OLDEST  LAST OK  DEAD       RATE/S  FALLBACK  LAST ERROR\n\
         \x20 north  mqtt  paused  42       1m15s   never    1 (9 pts)  12      3/4       401 unauthorized\n\
         \x20 (FALLBACK: rollup points sent / raw points evicted before this sink sent them)\n"
    );
    assert_eq!(out, want);
}

#[test]
fn status_refuses_a_document_of_another_shape_and_json_prints_it_as_sent() {
    let body = r#"{"version":"0.0.1","uptime_s":5,"sinks":[]}"#.to_string();
    let (base, server) = serve_json(body, 2);
    let (code, out, err) = run(&["status", "--url", &base]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("did not answer a status document") && err.contains("--json"),
        "{err}"
    );
    let (code, out, err) = run(&["status", "--url", &base, "--json"]);
    server.join().unwrap();
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["sinks"], serde_json::json!([]), "{out}");
}

/// A command piped into a reader that goes away (`edgewatch check-config f | head -2`) ends
/// quietly, without a panic message.
#[test]
fn a_command_whose_reader_goes_away_ends_quietly() {
    let mut child = std::process::Command::new(bin())
        .args(["check-config", "config/edgewatch.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_bad_log_filter_is_refused_by_check_config_and_run_and_keeps_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        "[host]\nenabled = false\n[rollup]\nenabled = false\n",
    );
    let (code, _) = post(&agent.url("/write"), b"m v=1 1000", &[]).unwrap();
    assert_eq!(code, 204);
    let data = agent.dir.clone();
    assert_eq!(agent.terminate().0, Some(0));

    let f = dir.path().join("bad-log.toml");
    for (level, says) in [
        ("edgewatch=loud", "invalid log filter"),
        ("edgewatch[{peer}]=debug", "not supported"),
        (" , ", "empty log filter"),
    ] {
        std::fs::write(
            &f,
            format!(
                "[storage]\ndata_dir = \"{}\"\n[log]\nlevel = \"{level}\"\n",
                data.display()
            ),
        )
        .unwrap();
        let (code, _, err) = run(&["check-config", f.to_str().unwrap()]);
        assert_ne!(code, 0, "{level}");
        assert!(
            err.contains("line 4") && err.contains("level") && err.contains(says),
            "{level}: {err}"
        );
        let (code, _, err) = run(&["run", "--config", f.to_str().unwrap()]);
        assert_ne!(code, 0, "{level}");
        assert!(err.contains(says), "{level}: {err}");
    }
    // The point stored before is intact.
    let (code, out, err) = run(&[
        "query",
        "--data-dir",
        data.to_str().unwrap(),
        "--measurement",
        "m",
        "--from",
        "0",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(",m,,v,1"), "{out}");
}

#[test]
fn rust_log_and_the_log_level_choose_what_the_agent_logs() {
    // A fresh store logs its migrations (target edgewatch::store) before the agent logs
    // "http listening" (edgewatch::agent), both at INFO.
    const MIGRATION: &str = "applying database migration";
    const LISTENING: &str = "http listening";
    let cases: [(&str, &str, bool, bool, bool); 3] = [
        ("warn,edgewatch::agent=info", "info", true, false, false),
        ("edgewatch::store=info,warn", "info", false, true, false),
        // An invalid RUST_LOG is said, and the config's level applies.
        (
            "edgewatch=loud",
            "warn,edgewatch::agent=info",
            true,
            false,
            true,
        ),
    ];
    for (rust_log, level, listening, migration, ignored) in cases {
        let dir = tempfile::tempdir().unwrap();
        let agent = Agent::start_with_env(
            dir.path(),
            &format!("[host]\nenabled = false\n[log]\nlevel = \"{level}\"\n"),
            &[("RUST_LOG", rust_log)],
        );
        let log = agent.log_text();
        assert_eq!(agent.terminate().0, Some(0), "{rust_log}");
        assert_eq!(log.contains(LISTENING), listening, "{rust_log}: {log}");
        assert_eq!(log.contains(MIGRATION), migration, "{rust_log}: {log}");
        assert_eq!(
            log.contains("RUST_LOG ignored"),
            ignored,
            "{rust_log}: {log}"
        );
        if ignored {
            assert!(
                log.contains("edgewatch=loud") && log.contains(" WARN "),
                "{log}"
            );
        }
    }
}

/// `edgewatch query` of the config's store first has the agent running with that config
/// commit what it holds (a GET of its status), so it shows UDP points received a moment ago
/// though the agent holds points for 60 s; `--stored` reads the file as it is. With the agent
/// stopped it reads the file, silently; an agent that answers with an error gets a note on
/// stderr, and the answer is the file's.
#[test]
fn query_has_the_running_agent_commit_the_points_it_holds_first() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n\
         [rollup]\nenabled = false\n[ingest]\nflush_interval = \"60s\"\n",
    );
    // Past the alert task's first cycle, which may commit at start.
    let first_cycle = wait_for(std::time::Duration::from_secs(10), || {
        (agent.status()["alerts"]["evaluations"].as_u64() >= Some(1)).then_some(())
    });
    assert!(first_cycle.is_some(), "no alert evaluation at start");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.send_to(
        format!(
            "cli_held,app=x v=1 {}\ncli_held,app=x v=2 {}\n",
            now - 2_000_000_000,
            now - 1_000_000_000
        )
        .as_bytes(),
        agent.udp,
    )
    .unwrap();
    // Held: a read of the latest through the API sees them, without a commit.
    let held = wait_for(std::time::Duration::from_secs(10), || {
        (stored_points(&agent, "measurement=cli_held").len() == 2).then_some(())
    });
    assert!(held.is_some(), "the agent did not take the UDP points");
    let db = agent.dir.join("edgewatch.db");
    let cfg = agent.config_path();
    let cfg = cfg.to_str().unwrap().to_string();
    let ask = |extra: &[&str]| -> (i32, usize, String) {
        let mut args = vec![
            "query",
            "--config",
            &cfg,
            "--measurement",
            "cli_held",
            "--from",
            "-10m",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = run(&args);
        (code, out.lines().count().saturating_sub(1), err)
    };
    assert_eq!(ask(&["--stored"]).1, 0, "--stored reads the file as it is");
    assert_eq!(points_in_file(&db, "cli_held"), 0, "the points are held");
    let (code, n, err) = ask(&[]);
    assert_eq!((code, n), (0, 2), "{err}");
    assert!(err.is_empty(), "{err}");
    assert_eq!(points_in_file(&db, "cli_held"), 2);

    // No agent running: the file, silently.
    let data = agent.dir.clone();
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
    let (code, n, err) = ask(&[]);
    assert_eq!((code, n), (0, 2), "{err}");
    assert!(err.is_empty(), "{err}");

    // Something at the config's listen that answers with an error: a note, and the file.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
        s.write_all(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
    });
    let broken = dir.path().join("broken.toml");
    std::fs::write(
        &broken,
        format!(
            "[http]\nlisten = \"127.0.0.1:{port}\"\n[storage]\ndata_dir = \"{}\"\n",
            data.display()
        ),
    )
    .unwrap();
    let (code, out, err) = run(&[
        "query",
        "--config",
        broken.to_str().unwrap(),
        "--measurement",
        "cli_held",
        "--from",
        "-10m",
    ]);
    server.join().unwrap();
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(
        err.contains("answered 503") && err.contains("only what it has committed"),
        "{err}"
    );
}
