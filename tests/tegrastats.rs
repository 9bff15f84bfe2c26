//! The Jetson collector with a fake `tegrastats` (tests/data/tegrastats/fake-tegrastats.sh)
//! and with a replayed log, and `edgewatch tegrastats parse`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tegrastats")
        .join(name)
}

/// The 40 fixture lines (TK1 to Thor) of the parser crate, one per line.
fn fixtures() -> PathBuf {
    data("fixtures.log")
}

/// A name no other process on the machine has.
fn unique(prefix: &str) -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{ns}", std::process::id())
}

/// Copies the fake tegrastats into `dir` under a unique name, executable.
fn install_fake(dir: &Path) -> PathBuf {
    let path = dir.join(unique("fake-tegrastats"));
    std::fs::copy(data("fake-tegrastats.sh"), &path).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    path
}

/// PIDs of live processes whose command line contains `needle` (zombies have none).
fn processes_with(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(needle) {
            found.push(pid);
        }
    }
    found
}

/// Points of `measurement` (one field) stored in the last five minutes.
fn points(agent: &Agent, measurement: &str, field: &str) -> usize {
    let url = agent.url(&format!(
        "/api/v1/query?measurement={measurement}&field={field}&from=-5m"
    ));
    let Ok((200, body)) = get(&url) else { return 0 };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["series"]
        .as_array()
        .map(|s| {
            s.iter()
                .map(|s| s["points"].as_array().map_or(0, Vec::len))
                .sum()
        })
        .unwrap_or(0)
}

fn starts(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn parse_cmd(args: &[&str], stdin: Option<&str>) -> (Option<i32>, String, String) {
    let mut child = Command::new(bin())
        .arg("tegrastats")
        .arg("parse")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn parse_prints_one_json_object_per_fixture_line() {
    let (code, out, err) = parse_cmd(&[fixtures().to_str().unwrap()], None);
    assert_eq!(code, Some(0), "stderr: {err}");
    assert_eq!(err, "");
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 40);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["line"], i + 1);
        assert!(row.get("timestamp").is_some());
    }
    assert!(out.starts_with("{\"line\":1,"));
    // Line 1: AGX Orin, JetPack 7.2.
    let r = &rows[0];
    assert_eq!(r["timestamp"], "07-25-2026 09:08:28");
    assert_eq!(
        r["ram"],
        serde_json::json!({"used_mb": 20642.0, "total_mb": 62817.0, "lfb_blocks": 1, "lfb_block_mb": 2.0})
    );
    assert!(r.get("swap").is_none());
    assert_eq!(r["cpus"].as_array().unwrap().len(), 12);
    assert_eq!(
        r["cpus"][0],
        serde_json::json!({"load_pct": 23, "freq_mhz": 2201})
    );
    assert_eq!(
        r["emc"],
        serde_json::json!({"load_pct": 3, "freq_mhz": 3199})
    );
    assert_eq!(
        r["gr3d"],
        serde_json::json!({"load_pct": 12, "freq_mhz": [1300, 1300]})
    );
    assert_eq!(r["engines"]["APE"], serde_json::json!({"freq_mhz": 174}));
    assert_eq!(r["engines"]["NVENC0"]["off"], true);
    assert_eq!(r["temps_c"]["gpu"], 47.625);
    assert_eq!(
        r["power_mw"]["VIN_SYS_5V0"]["current"],
        serde_json::json!(5500)
    );
    assert_eq!(r["power_mw"]["VIN_SYS_5V0"]["average"], 5500);
    // An offline core is null (Xavier, JetPack 4: line 2).
    assert_eq!(rows[1]["cpus"][4], serde_json::Value::Null);
    assert_eq!(
        rows[1]["mts"],
        serde_json::json!({"fg_pct": 0, "bg_pct": 0})
    );
}

#[test]
fn parse_names_a_bad_line_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = std::fs::read_to_string(fixtures())
        .unwrap()
        .lines()
        .take(3)
        .map(str::to_string)
        .collect();
    let file = dir.path().join("mixed.log");
    std::fs::write(
        &file,
        format!(
            "{}\n{}\nthis is not tegrastats output\n{}\n",
            lines[0], lines[1], lines[2]
        ),
    )
    .unwrap();
    let (code, out, err) = parse_cmd(&[file.to_str().unwrap()], None);
    assert_ne!(code, Some(0));
    assert!(err.contains("line 3:"), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    let rows = json_lines(&out);
    let numbers: Vec<u64> = rows.iter().map(|r| r["line"].as_u64().unwrap()).collect();
    assert_eq!(numbers, vec![1, 2, 4]);
    assert_eq!(rows[2]["ram"]["used_mb"], 1180.0);
}

#[test]
fn parse_reads_stdin_with_a_dash() {
    let text = std::fs::read_to_string(fixtures()).unwrap();
    let (code, out, err) = parse_cmd(&["-"], Some(&text));
    assert_eq!(code, Some(0), "stderr: {err}");
    assert_eq!(json_lines(&out).len(), 40);
    let (code, out, _) = parse_cmd(&[], Some("garbage\n"));
    assert_ne!(code, Some(0));
    assert_eq!(out, "");
    let (code, _, err) = parse_cmd(&["/nonexistent/tegrastats.log"], None);
    assert_ne!(code, Some(0));
    assert!(err.contains("/nonexistent/tegrastats.log"), "stderr: {err}");
}

#[test]
fn fake_tegrastats_is_restarted_and_its_samples_stored() {
    let dir = tempfile::tempdir().unwrap();
    let fake = install_fake(dir.path());
    let started = dir.path().join("starts");
    let agent = Agent::start_with_env(
        dir.path(),
        &format!(
            "[host]\nenabled = false\n[tegrastats]\npath = \"{}\"\ninterval = \"100ms\"\n",
            fake.display()
        ),
        &[
            ("FAKE_TEGRASTATS_STARTS", started.to_str().unwrap()),
            (
                "FAKE_TEGRASTATS_LOG",
                data("agx-orin-jp6.log").to_str().unwrap(),
            ),
            ("FAKE_TEGRASTATS_MODE", "exit"),
        ],
    );
    let runs = wait_for(Duration::from_secs(15), || {
        let s = starts(&started);
        (s.len() >= 2).then_some(s)
    });
    assert!(
        runs.is_some(),
        "tegrastats was not restarted:\n{}",
        agent.log_text()
    );
    for run in runs.unwrap() {
        assert!(run.ends_with(" --interval 100"), "args: {run}");
    }
    // Two lines per run, every run.
    let stored = wait_for(Duration::from_secs(10), || {
        (points(&agent, "jetson_mem", "ram_used_mb") >= 3).then_some(())
    });
    assert!(stored.is_some(), "no samples stored:\n{}", agent.log_text());
    assert!(points(&agent, "jetson_cpu", "freq_mhz") >= 12);
    assert!(points(&agent, "jetson_power", "current_mw") >= 3);
    // Both recorded lines print `NVENC 78%@166` and `NVENC 78%@179`: each stored point of
    // the NVENC series has exactly those values, in its value column.
    let nvenc = |field: &str| -> Vec<f64> {
        let (code, body) = get(&agent.url(&format!(
            "/api/v1/query?measurement=jetson_engine&tag.engine=NVENC&field={field}&from=-5m"
        )))
        .unwrap();
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let series = v["series"].as_array().unwrap();
        assert_eq!(series.len(), 1, "{body}");
        assert_eq!(series[0]["field"], field, "{body}");
        assert_eq!(series[0]["tags"]["engine"], "NVENC", "{body}");
        series[0]["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[1].as_f64().unwrap_or_else(|| panic!("{body}")))
            .collect()
    };
    let loads = nvenc("load_pct");
    assert!(loads.len() >= 3, "{loads:?}");
    assert!(loads.iter().all(|v| *v == 78.0), "{loads:?}");
    let mut freqs = nvenc("freq_mhz");
    assert_eq!(freqs.len(), loads.len());
    freqs.dedup();
    freqs.sort_by(f64::total_cmp);
    freqs.dedup();
    assert_eq!(freqs, [166.0, 179.0]);
    let log = agent.log_text();
    assert!(log.contains("tegrastats exited; restarting"), "{log}");
    assert!(
        log.contains("fake tegrastats: started"),
        "stderr not logged:\n{log}"
    );
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
}

#[test]
fn sigterm_stops_a_hanging_tegrastats_and_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let fake = install_fake(dir.path());
    let fake_name = fake.file_name().unwrap().to_string_lossy().into_owned();
    let started = dir.path().join("starts");
    // A sleep duration nothing else uses, to find the script's child.
    let sleep = format!("3600.{}", std::process::id());
    let agent = Agent::start_with_env(
        dir.path(),
        &format!(
            "[host]\nenabled = false\n[tegrastats]\npath = \"{}\"\ninterval = \"100ms\"\n",
            fake.display()
        ),
        &[
            ("FAKE_TEGRASTATS_STARTS", started.to_str().unwrap()),
            (
                "FAKE_TEGRASTATS_LOG",
                data("agx-orin-jp6.log").to_str().unwrap(),
            ),
            ("FAKE_TEGRASTATS_MODE", "hang"),
            ("FAKE_TEGRASTATS_SLEEP", &sleep),
        ],
    );
    let hanging = wait_for(Duration::from_secs(15), || {
        let stored = points(&agent, "jetson_mem", "ram_used_mb") >= 2;
        let sleeping = !processes_with(&sleep).is_empty();
        (stored && sleeping).then_some(())
    });
    assert!(
        hanging.is_some(),
        "fake tegrastats did not reach its sleep:\n{}",
        agent.log_text()
    );
    assert_eq!(starts(&started).len(), 1);
    assert!(!processes_with(&fake_name).is_empty());
    let log = agent.log.clone();
    let (code, took) = agent.terminate();
    let log = std::fs::read_to_string(log).unwrap_or_default();
    assert_eq!(code, Some(0), "{log}");
    assert!(took < Duration::from_secs(5), "took {took:?}:\n{log}");
    let gone = wait_for(Duration::from_secs(2), || {
        (processes_with(&fake_name).is_empty() && processes_with(&sleep).is_empty()).then_some(())
    });
    assert!(
        gone.is_some(),
        "left behind: {:?} {:?}\n{log}",
        processes_with(&fake_name),
        processes_with(&sleep)
    );
    assert!(log.contains("tegrastats stopped"), "{log}");
}

#[test]
fn replay_stores_samples_in_a_loop() {
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let agent = Agent::start(
        dir.path(),
        &format!(
            "[host]\nenabled = false\n[tegrastats]\npath = \"/nonexistent/tegrastats\"\nreplay = \"{}\"\ninterval = \"50ms\"\n",
            data("agx-orin-jp6.log").display()
        ),
    );
    // The log has two lines: more than two samples means it looped.
    let stored = wait_for(Duration::from_secs(15), || {
        (points(&agent, "jetson_mem", "ram_used_mb") >= 4).then_some(())
    });
    assert!(
        stored.is_some(),
        "no replayed samples:\n{}",
        agent.log_text()
    );
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(points(&agent, "jetson_temp", "temp_c") >= 20);
    assert!(points(&agent, "jetson_gpu", "freq_mhz") >= 4);
    let st = &agent.status()["collectors"]["tegrastats"];
    assert_eq!(st["state"], "replaying", "{st}");
    assert!(st["samples"].as_u64().unwrap() >= 4, "{st}");
    assert!(st["last_sample_age_s"].as_f64().unwrap() < 5.0, "{st}");
    let log = agent.log_text();
    assert!(log.contains("replaying"), "{log}");
    assert!(!log.contains("Jetson collector off"), "{log}");
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
}

#[test]
fn without_tegrastats_or_replay_the_collector_stays_off() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join(unique("no-tegrastats"));
    let agent = Agent::start(
        dir.path(),
        &format!(
            "[host]\nenabled = false\n[tegrastats]\npath = \"{}\"\n",
            missing.display()
        ),
    );
    let off = wait_for(Duration::from_secs(10), || {
        let log = agent.log_text();
        log.contains("Jetson collector off").then_some(log)
    });
    let log = off.unwrap_or_else(|| panic!("no 'collector off' line:\n{}", agent.log_text()));
    assert!(log.contains(&missing.display().to_string()), "{log}");
    assert_eq!(log.matches("Jetson collector off").count(), 1, "{log}");
    assert_eq!(get(&agent.url("/health")).unwrap().0, 200);
    assert_eq!(points(&agent, "jetson_mem", "ram_used_mb"), 0);
    let st = &agent.status()["collectors"]["tegrastats"];
    assert_eq!(st["state"], "off", "{st}");
    assert!(
        st["detail"]
            .as_str()
            .unwrap()
            .contains(&missing.display().to_string()),
        "{st}"
    );
    let (_, metrics) = get(&agent.url("/metrics")).unwrap();
    assert!(
        metrics.contains("edgewatch_tegrastats_state{state=\"off\"} 1"),
        "{metrics}"
    );
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
}

#[test]
fn an_empty_replay_file_turns_the_collector_off() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("empty.log");
    std::fs::write(&file, "no tegrastats here\n").unwrap();
    let agent = Agent::start(
        dir.path(),
        &format!(
            "[host]\nenabled = false\n[tegrastats]\nreplay = \"{}\"\ninterval = \"50ms\"\n",
            file.display()
        ),
    );
    let off = wait_for(Duration::from_secs(10), || {
        let log = agent.log_text();
        log.contains("holds no tegrastats line").then_some(log)
    });
    assert!(off.is_some(), "{}", agent.log_text());
    assert_eq!(get(&agent.url("/health")).unwrap().0, 200);
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
}

/// An agent running the fake tegrastats (AGX Orin log, 100 ms) in `mode` ("close" or
/// "hang"); `sleep` is the fake's unique sleep argument, which finds its child process.
struct FakeRun {
    agent: Agent,
    fake_name: String,
    started: PathBuf,
    sleep: String,
}

fn start_fake(dir: &Path, mode: &str, sleep: &str, extra: &str) -> FakeRun {
    let fake = install_fake(dir);
    let started = dir.join("starts");
    let agent = Agent::start_with_env(
        dir,
        &format!(
            "[host]\nenabled = false\n[tegrastats]\npath = \"{}\"\ninterval = \"100ms\"\n{extra}",
            fake.display()
        ),
        &[
            ("FAKE_TEGRASTATS_STARTS", started.to_str().unwrap()),
            (
                "FAKE_TEGRASTATS_LOG",
                data("agx-orin-jp6.log").to_str().unwrap(),
            ),
            ("FAKE_TEGRASTATS_MODE", mode),
            ("FAKE_TEGRASTATS_SLEEP", sleep),
        ],
    );
    FakeRun {
        agent,
        fake_name: fake.file_name().unwrap().to_string_lossy().into_owned(),
        started,
        sleep: sleep.to_string(),
    }
}

impl FakeRun {
    /// Waits for a restart whose reason the log names, and for the samples of both runs.
    fn assert_restarted(&self, why: &str, within: Duration) {
        let restarted = wait_for(within, || (starts(&self.started).len() >= 2).then_some(()));
        let log = self.agent.log_text();
        assert!(restarted.is_some(), "not restarted:\n{log}");
        assert!(log.contains(why), "{log}");
        let stored = wait_for(Duration::from_secs(10), || {
            (points(&self.agent, "jetson_mem", "ram_used_mb") >= 3).then_some(())
        });
        assert!(stored.is_some(), "{}", self.agent.log_text());
    }

    /// The first run's process group went with it (at most the current run's sleep is
    /// left); after SIGTERM nothing of the fake is left.
    fn stop_and_assert_nothing_left(self) {
        assert!(
            processes_with(&self.sleep).len() <= 1,
            "{:?}",
            processes_with(&self.sleep)
        );
        let (code, _) = self.agent.terminate();
        assert_eq!(code, Some(0));
        let gone = wait_for(Duration::from_secs(2), || {
            (processes_with(&self.fake_name).is_empty() && processes_with(&self.sleep).is_empty())
                .then_some(())
        });
        assert!(gone.is_some(), "processes left behind");
    }
}

#[test]
fn tegrastats_that_closes_its_output_is_stopped_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let run = start_fake(
        dir.path(),
        "close",
        &format!("3599.{}", std::process::id()),
        "",
    );
    run.assert_restarted("closed its output", Duration::from_secs(15));
    run.stop_and_assert_nothing_left();
}

#[test]
fn tegrastats_that_goes_silent_is_stopped_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    // Prints its two lines, then stays alive and silent (a wedged tegrastats).
    let run = start_fake(
        dir.path(),
        "hang",
        &format!("3598.{}", std::process::id()),
        "stall_timeout = \"1s\"\n",
    );
    run.assert_restarted("printed nothing for", Duration::from_secs(20));
    let st = run.agent.status()["collectors"]["tegrastats"].clone();
    assert!(st["stalls"].as_u64().unwrap() >= 1, "{st}");
    assert!(st["restarts"].as_u64().unwrap() >= 1, "{st}");
    assert!(st["starts"].as_u64().unwrap() >= 2, "{st}");
    assert!(st["samples"].as_u64().unwrap() >= 3, "{st}");
    let (_, metrics) = get(&run.agent.url("/metrics")).unwrap();
    assert!(
        metrics.contains("edgewatch_tegrastats_stalls_total"),
        "{metrics}"
    );
    run.stop_and_assert_nothing_left();
}
