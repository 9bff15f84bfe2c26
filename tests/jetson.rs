//! The `[jetson]` collector through the real binary, on the fixture trees of
//! `tests/data/jetson/` (copied to a temp dir so a test can stage changes): identity tags on
//! every `jetson_*` point (tegrastats' included), `collectors.jetson` in `/api/v1/status`
//! and `edgewatch status`, the power-mode change event, throttle fields from a staged
//! over-current counter and a capped devfreq, nvmap per-process rows, and unreadable or
//! missing files logged once with nothing crashing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value as J;

use crate::support::*;

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/jetson")
        .join(rel)
}

fn put(root: &Path, rel: &str, text: &str) {
    std::fs::write(root.join(rel), text).unwrap();
}

fn config(root: &Path, tegrastats: Option<&Path>) -> String {
    let mut c = format!(
        "[host]\nenabled = false\n[nvml]\nenabled = false\n[rollup]\nenabled = false\n[jetson]\nroot = \"{}\"\ninterval = \"100ms\"\n",
        root.display()
    );
    match tegrastats {
        Some(log) => c.push_str(&format!(
            "[tegrastats]\nreplay = \"{}\"\ninterval = \"100ms\"\n",
            log.display()
        )),
        None => c.push_str("[tegrastats]\nenabled = false\n"),
    }
    c
}

/// The tags of a stored point as a map.
fn tags_of(s: &str) -> std::collections::BTreeMap<String, String> {
    s.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn jetson_status(agent: &Agent) -> J {
    agent.status()["collectors"]["jetson"].clone()
}

#[test]
fn identity_tags_status_power_mode_event_throttle_and_processes() {
    let dir = tempfile::tempdir().unwrap();
    let root = jetson_fixture(dir.path(), "orin-nano-jp6");
    let agent = Agent::start(
        dir.path(),
        &config(&root, Some(&data("tegrastats-orin-nano.log"))),
    );
    let st = wait_for(Duration::from_secs(15), || {
        let j = jetson_status(&agent);
        (j["samples"].as_u64() >= Some(2)).then_some(j)
    })
    .unwrap_or_else(|| panic!("no jetson samples:\n{}", agent.log_text()));
    assert_eq!(st["state"], "running", "{st}");
    assert_eq!(
        st["module"],
        "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"
    );
    assert_eq!(
        (st["l4t"].as_str(), st["jetpack"].as_str()),
        (Some("36.4.3"), Some("6.2"))
    );
    assert_eq!(st["power_mode"], "MAXN_SUPER");
    assert_eq!(st["power_mode_id"], 2);
    assert_eq!(st["jetson_clocks"], "off");
    assert_eq!(st["processes"], "on");
    assert_eq!(st["process_count"], 3);
    assert_eq!(st["missing"], serde_json::json!([]), "{st}");
    assert_eq!(st["throttled"], false);

    // Every jetson_* point carries the identity: the collector's and tegrastats'.
    let want = [
        (
            "module",
            "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
        ),
        ("l4t", "36.4.3"),
        ("jetpack", "6.2"),
        ("power_mode", "MAXN_SUPER"),
        ("power_mode_id", "2"),
        ("jetson_clocks", "off"),
    ];
    let power = wait_for(Duration::from_secs(10), || {
        let p = stored_points(
            &agent,
            "measurement=jetson_power&field=current_mw&tag.rail=VDD_IN",
        );
        (!p.is_empty()).then_some(p)
    })
    .expect("tegrastats points");
    for m in [
        "jetson_throttle",
        "jetson_power",
        "jetson_mem",
        "jetson_process",
    ] {
        let pts = wait_for(Duration::from_secs(10), || {
            let p = stored_points(&agent, &format!("measurement={m}"));
            (!p.is_empty()).then_some(p)
        })
        .unwrap_or_else(|| panic!("no {m} points"));
        for (tags, ..) in pts.iter().take(20) {
            let t = tags_of(tags);
            for (k, v) in want {
                assert_eq!(t.get(k).map(String::as_str), Some(v), "{m} {tags}");
            }
        }
    }
    assert!(tags_of(&power[0].0).contains_key("rail"));
    // nvmap rows: python3 (two rows summed), nvargus-daemon, "Web Content".
    let procs = stored_points(
        &agent,
        "measurement=jetson_process&field=gpu_mem_mb&tag.pid=4121",
    );
    assert_eq!(procs[0].3, J::from(520.0), "{procs:?}");
    assert_eq!(tags_of(&procs[0].0)["process"], "python3");
    let web = stored_points(
        &agent,
        "measurement=jetson_process&tag.process=Web%20Content",
    );
    assert!(!web.is_empty());

    // `edgewatch status` prints it.
    let out = std::process::Command::new(bin())
        .args(["status", "--url", &agent.url("")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("jetson:     NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super, L4T 36.4.3 (JetPack 6.2), power mode MAXN_SUPER (id 2), jetson_clocks off; not throttled; processes on"),
        "{text}"
    );

    // Stage: the 15W mode caps the GPU, an instantaneous over-current event is counted.
    put(
        &root,
        "sys/class/devfreq/17000000.gpu/max_freq",
        "612000000\n",
    );
    put(&root, "sys/class/hwmon/hwmon3/oc3_event_cnt", "3\n");
    put(&root, "var/lib/nvpmodel/status", "pmode:0000 fmode:quiet\n");
    let ev = wait_for(Duration::from_secs(10), || {
        let e = stored_points(&agent, "measurement=edgewatch_event&tag.kind=power_mode");
        (e.len() >= 3).then_some(e)
    })
    .unwrap_or_else(|| panic!("no power_mode event:\n{}", agent.log_text()));
    let fields: Vec<(&str, &J)> = ev.iter().map(|e| (e.1.as_str(), &e.3)).collect();
    assert_eq!(
        fields,
        vec![
            ("from", &J::from("MAXN_SUPER")),
            ("message", &J::from("power_mode changed: MAXN_SUPER → 15W")),
            ("to", &J::from("15W"))
        ]
    );
    let capped = wait_for(Duration::from_secs(10), || {
        let p = stored_points(
            &agent,
            "measurement=jetson_throttle&tag.power_mode=15W&tag.power_mode_id=0",
        );
        p.iter().any(|p| p.1 == "throttled").then_some(p)
    })
    .expect("throttle points in 15W");
    let get = |f: &str| capped.iter().find(|p| p.1 == f).map(|p| p.3.clone());
    assert_eq!(get("gpu_max_mhz"), Some(J::from(612.0)));
    assert_eq!(get("gpu_hw_max_mhz"), Some(J::from(1020.0)));
    assert_eq!(get("gpu_capped"), Some(J::from(true)));
    assert_eq!(get("oc_events"), Some(J::from(3)));
    assert_eq!(get("oc3_events"), Some(J::from(3)));
    // The sample that saw the counter grow says throttled (whichever mode it was tagged
    // with: the files change one by one).
    let throttled = stored_points(&agent, "measurement=jetson_throttle&field=throttled");
    assert!(throttled.iter().any(|p| p.3 == true), "{throttled:?}");
    let st = jetson_status(&agent);
    assert_eq!(
        (st["power_mode"].as_str(), st["power_mode_id"].as_u64()),
        (Some("15W"), Some(0))
    );
    assert_eq!(st["power_mode_changes"], 1);
    assert!(st["last_throttled_ns"].as_i64().is_some(), "{st}");
    // tegrastats points follow the new mode.
    let p15 = wait_for(Duration::from_secs(10), || {
        let p = stored_points(
            &agent,
            "measurement=jetson_power&tag.rail=VDD_IN&tag.power_mode=15W",
        );
        (!p.is_empty()).then_some(p)
    });
    assert!(p15.is_some(), "no jetson_power in 15W");
    let text = agent.log_text();
    assert!(text.contains("power mode changed"), "{text}");
    agent.terminate();
}

#[test]
fn unreadable_nvmap_and_missing_files_are_logged_once_and_nothing_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let root = jetson_fixture(dir.path(), "xavier-nx-jp5");
    // Not readable as a file (as without root: debugfs is root-only).
    let clients = root.join("sys/kernel/debug/nvmap/iovmm/clients");
    std::fs::remove_file(&clients).unwrap();
    std::fs::create_dir(&clients).unwrap();
    let agent = Agent::start(dir.path(), &config(&root, None));
    let st = wait_for(Duration::from_secs(15), || {
        let j = jetson_status(&agent);
        (j["samples"].as_u64() >= Some(5)).then_some(j)
    })
    .unwrap_or_else(|| panic!("no jetson samples:\n{}", agent.log_text()));
    assert_eq!(st["state"], "running");
    assert!(
        st["processes"]
            .as_str()
            .unwrap()
            .starts_with("off: cannot read"),
        "{st}"
    );
    assert_eq!(
        st["missing"],
        serde_json::json!(["over-current counters (hwmon oc*_event_cnt)"])
    );
    let log = agent.log_text();
    assert_eq!(
        log.matches("jetson per-process GPU memory off: cannot read")
            .count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("not found or unreadable, left out: over-current counters")
            .count(),
        1,
        "{log}"
    );
    assert!(stored_points(&agent, "measurement=jetson_process").is_empty());
    // Points reach the store a commit after the status counts them.
    let t = wait_for(Duration::from_secs(10), || {
        let t = stored_points(&agent, "measurement=jetson_throttle&field=gpu_freq_mhz");
        (t.len() >= 5).then_some(t)
    })
    .expect("throttle points");
    assert!(tags_of(&t[0].0)["module"].contains("Xavier NX"));
    // Files vanishing under a running agent: fields left out, the agent keeps sampling.
    std::fs::remove_dir_all(root.join("sys/class/devfreq")).unwrap();
    std::fs::remove_file(root.join("var/lib/nvpmodel/status")).unwrap();
    let n = jetson_status(&agent)["samples"].as_u64().unwrap();
    let later = wait_for(Duration::from_secs(10), || {
        let j = jetson_status(&agent);
        (j["samples"].as_u64() >= Some(n + 3)).then_some(j)
    });
    assert!(later.is_some(), "sampling stopped:\n{}", agent.log_text());
    assert_eq!(later.unwrap()["power_mode"], J::Null);
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
}

#[test]
fn on_a_machine_that_is_not_a_jetson_it_stays_off() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let agent = Agent::start(dir.path(), &config(&empty, None));
    let st = wait_for(Duration::from_secs(10), || {
        let j = jetson_status(&agent);
        (j["state"] != "not started").then_some(j)
    })
    .unwrap();
    assert!(
        st["state"]
            .as_str()
            .unwrap()
            .starts_with("off: not a Jetson"),
        "{st}"
    );
    assert!(agent
        .log_text()
        .contains("jetson collector off: not a Jetson"));
    agent.terminate();
}

#[test]
fn nvpmodel_runs_only_without_a_status_file_and_at_most_once_a_minute() {
    let dir = tempfile::tempdir().unwrap();
    let root = jetson_fixture(dir.path(), "agx-orin-jp5");
    // A stand-in nvpmodel that counts its runs.
    let runs = dir.path().join("nvpmodel-runs");
    let fake = dir.path().join("nvpmodel");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\necho 'NV Power Mode: MODE_30W'\necho 2\n",
            runs.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = config(&root, None).replace(
        "[jetson]\n",
        &format!("[jetson]\nnvpmodel = \"{}\"\n", fake.display()),
    );
    // With the status file: never run.
    let agent = Agent::start(dir.path(), &cfg);
    let st = wait_for(Duration::from_secs(10), || {
        let j = jetson_status(&agent);
        (j["samples"].as_u64() >= Some(10)).then_some(j)
    })
    .expect("samples");
    assert_eq!(st["power_mode"], "MAXN");
    assert!(!runs.exists(), "nvpmodel ran with a status file");
    // Without it: run once (`-q`), its answer used, and not again within the minute.
    std::fs::remove_file(root.join("var/lib/nvpmodel/status")).unwrap();
    let n = st["samples"].as_u64().unwrap();
    let st = wait_for(Duration::from_secs(10), || {
        let j = jetson_status(&agent);
        (j["samples"].as_u64() >= Some(n + 20)).then_some(j)
    })
    .expect("samples");
    assert_eq!(
        (st["power_mode"].as_str(), st["power_mode_id"].as_u64()),
        (Some("MODE_30W"), Some(2)),
        "{st}"
    );
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "-q\n");
    agent.terminate();
}
