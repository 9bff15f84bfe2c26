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

/// The newest modules through the binary: identity, status line, points and the GPU
/// source on Jetson AGX Thor (JetPack 7, `gpu-gpc-0`, no load file) and AGX Orin on JetPack
/// 7.2 (`17000000.gpu` with its load).
#[test]
fn thor_and_orin_on_jetpack_7_trees() {
    // (tree, module, l4t, jetpack, power mode, GPU source, clock, load)
    let cases = [
        (
            "thor-jp7",
            "NVIDIA Jetson AGX Thor Developer Kit",
            "38.2.1",
            "7.0",
            "MAXN",
            "devfreq:gpu-gpc-0",
            314.0,
            None,
        ),
        (
            "agx-orin-jp72",
            "NVIDIA Jetson AGX Orin Developer Kit",
            "39.2.0",
            "7.2",
            "MODE_50W",
            "devfreq:17000000.gpu",
            918.0,
            Some(12.0),
        ),
    ];
    for (tree, module, l4t, jetpack, mode, source, clock, load) in cases {
        let dir = tempfile::tempdir().unwrap();
        let root = jetson_fixture(dir.path(), tree);
        let agent = Agent::start(dir.path(), &config(&root, None));
        let st = wait_for(Duration::from_secs(15), || {
            let j = jetson_status(&agent);
            (j["samples"].as_u64() >= Some(2)).then_some(j)
        })
        .unwrap_or_else(|| panic!("{tree}: no jetson samples:\n{}", agent.log_text()));
        assert_eq!(st["state"], "running", "{tree} {st}");
        assert_eq!(st["module"], module, "{tree}");
        assert_eq!(
            (st["l4t"].as_str(), st["jetpack"].as_str()),
            (Some(l4t), Some(jetpack))
        );
        assert_eq!(st["power_mode"], mode, "{tree}");
        assert_eq!(st["gpu_source"], source, "{tree} {st}");
        assert!(st["gpu_source_reason"].as_str().is_some(), "{st}");
        assert_eq!(st["gpu_source_switches"], 0);
        let pts = wait_for(Duration::from_secs(10), || {
            let p = stored_points(&agent, "measurement=jetson_throttle");
            p.iter().any(|p| p.1 == "gpu_freq_mhz").then_some(p)
        })
        .unwrap_or_else(|| panic!("{tree}: no jetson_throttle points"));
        let get = |f: &str| pts.iter().find(|p| p.1 == f).map(|p| p.3.clone());
        assert_eq!(get("gpu_freq_mhz"), Some(J::from(clock)), "{tree}");
        assert_eq!(get("gpu_load_pct"), load.map(J::from), "{tree}");
        assert_eq!(get("thermal_trips"), Some(J::from(0)), "{tree}");
        assert_eq!(get("oc_events"), Some(J::from(0)), "{tree}");
        assert_eq!(get("current_alarms"), Some(J::from(0)), "{tree}");
        let t = tags_of(&pts[0].0);
        assert_eq!(
            t.get("jetpack").map(String::as_str),
            Some(jetpack),
            "{tree}"
        );
        assert_eq!(t.get("module").map(String::as_str), Some(module), "{tree}");
        let out = std::process::Command::new(bin())
            .args(["status", "--url", &agent.url("")])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let want =
            format!("jetson:     {module}, L4T {l4t} (JetPack {jetpack}), power mode {mode}");
        assert!(text.contains(&want), "{text}");
        assert!(text.contains(&format!("GPU source {source}")), "{text}");
        agent.terminate();
    }
}

/// An agent started before the GPU devfreq node exists (as when the driver loads after
/// the agent) switches to it at the next re-probe: logged once, counted, one
/// `edgewatch_event` (`kind=gpu_source`), points with the clock from then on.
#[test]
fn a_devfreq_node_appearing_after_start_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let root = jetson_fixture(dir.path(), "agx-orin-jp72");
    let node = root.join("sys/class/devfreq/17000000.gpu");
    let parked = dir.path().join("parked-gpu");
    std::fs::rename(&node, &parked).unwrap();
    let cfg = config(&root, None).replace("[jetson]\n", "[jetson]\ngpu_reprobe = \"300ms\"\n");
    let agent = Agent::start(dir.path(), &cfg);
    let st = wait_for(Duration::from_secs(15), || {
        let j = jetson_status(&agent);
        (j["samples"].as_u64() >= Some(5)).then_some(j)
    })
    .unwrap_or_else(|| panic!("no jetson samples:\n{}", agent.log_text()));
    assert_eq!(st["gpu_source"], "none", "{st}");
    let reason = st["gpu_source_reason"].as_str().unwrap();
    assert!(reason.starts_with("no GPU devfreq node"), "{reason}");
    assert!(reason.contains("NVML is not running"), "{reason}");
    assert!(stored_points(&agent, "measurement=jetson_throttle&field=gpu_freq_mhz").is_empty());
    std::fs::rename(&parked, &node).unwrap();
    let moved = std::time::Instant::now();
    let st = wait_for(Duration::from_secs(10), || {
        let j = jetson_status(&agent);
        (j["gpu_source"] == "devfreq:17000000.gpu").then_some(j)
    })
    .unwrap_or_else(|| panic!("not switched:\n{}", agent.log_text()));
    // The re-probe interval (300 ms) plus a sample (100 ms), with slack for a busy machine.
    assert!(
        moved.elapsed() < Duration::from_secs(3),
        "{:?}",
        moved.elapsed()
    );
    assert_eq!(st["gpu_source_switches"], 1, "{st}");
    let ev = wait_for(Duration::from_secs(10), || {
        let e = stored_points(&agent, "measurement=edgewatch_event&tag.kind=gpu_source");
        (!e.is_empty()).then_some(e)
    })
    .expect("gpu_source event");
    let msg = ev.iter().find(|e| e.1 == "message").map(|e| e.3.clone());
    assert_eq!(
        msg,
        Some(J::from("gpu_source changed: none → devfreq:17000000.gpu"))
    );
    let load = wait_for(Duration::from_secs(10), || {
        let p = stored_points(&agent, "measurement=jetson_throttle&field=gpu_load_pct");
        (!p.is_empty()).then_some(p)
    })
    .expect("GPU load after the switch");
    assert_eq!(load[0].3, J::from(12.0));
    // Settled on the node: more samples, no more switches, one log line.
    let n = jetson_status(&agent)["samples"].as_u64().unwrap();
    let st = wait_for(Duration::from_secs(10), || {
        let j = jetson_status(&agent);
        (j["samples"].as_u64() >= Some(n + 10)).then_some(j)
    })
    .expect("samples");
    assert_eq!(st["gpu_source_switches"], 1);
    let log = agent.log_text();
    assert_eq!(log.matches("jetson GPU source changed").count(), 1, "{log}");
    agent.terminate();
}
