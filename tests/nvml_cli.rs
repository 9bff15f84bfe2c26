//! The NVML collector and `edgewatch gpus` two ways. In process, against whatever this
//! machine has, found the way the agent finds it: whether a driver is expected is decided
//! independently of edgewatch (the NVIDIA kernel driver's control node `/dev/nvidiactl`
//! exists; override with `TEST_NVIDIA_DRIVER=1` or `=0` where the node misleads, e.g. a
//! container that hides it). Without a driver (the usual CI machine, a Jetson without NVML)
//! `gpus` must fail with one plain line and the collector must switch itself off; with one,
//! the report and the collector must show the GPUs `nvidia-smi` lists. And the real binary
//! against the stand-in library (`nvml_stub`), whose output must be exact on any machine:
//! a driver that is not loaded, and two GPUs sampled.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use edgewatch::collect::nvml::{self, GpuSource, Metric, NvmlConfig, NvmlSource, NvmlStatus};
use edgewatch::model::split_series_key;
use edgewatch::stats::Stats;
use tokio_util::sync::CancellationToken;

/// Whether this machine has a running NVIDIA kernel driver (see the module doc).
fn driver_expected() -> bool {
    match std::env::var("TEST_NVIDIA_DRIVER").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => std::path::Path::new("/dev/nvidiactl").exists(),
    }
}

/// NVML's own view, read directly: (driver, GPUs as (name, uuid)).
fn nvml_view() -> (String, Vec<(String, String)>) {
    let mut src = NvmlSource::init().expect("a driver is expected: NVML must initialise");
    let driver = src.system().driver;
    let n = src.device_count().expect("device count");
    let gpus = (0..n)
        .map(|i| {
            let id = src.identity(i).expect("identity");
            (id.name, id.uuid)
        })
        .collect();
    (driver, gpus)
}

/// `nvidia-smi`'s view, where it is installed: (driver, GPUs as (name, uuid)).
fn smi_view() -> Option<(String, Vec<(String, String)>)> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=driver_version,name,uuid",
            "--format=csv,noheader",
        ])
        .output()
        .ok()?;
    assert!(out.status.success(), "nvidia-smi failed: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut driver = String::new();
    let gpus = text
        .lines()
        .map(|l| {
            let cols: Vec<&str> = l.split(", ").collect();
            assert_eq!(cols.len(), 3, "{l}");
            driver = cols[0].to_string();
            (cols[1].to_string(), cols[2].to_string())
        })
        .collect();
    Some((driver, gpus))
}

/// The one-line message `gpus` must give on this driver-less machine.
fn assert_no_driver_message(msg: &str) {
    assert!(!msg.contains('\n'), "one line: {msg}");
    let missing = msg.starts_with("no NVIDIA driver found: NVML (libnvidia-ml.so.1) could not be loaded (")
        && msg.ends_with(
            "); install the NVIDIA driver to monitor discrete GPUs; on a Jetson use the tegrastats collector",
        );
    let not_loaded = msg.starts_with("the NVIDIA kernel driver is not loaded (NVML: ")
        && msg.ends_with("); check `nvidia-smi` and `lsmod | grep nvidia`");
    assert!(missing || not_loaded, "unexpected message: {msg}");
}

/// Checks a whole `gpus` report against NVML read directly and `nvidia-smi`.
fn assert_report_matches_the_machine(text: &str) {
    let (driver, gpus) = nvml_view();
    if let Some((smi_driver, smi_gpus)) = smi_view() {
        assert_eq!(
            driver, smi_driver,
            "NVML and nvidia-smi disagree on the driver"
        );
        assert_eq!(gpus, smi_gpus, "NVML and nvidia-smi disagree on the GPUs");
    }
    let mut lines = text.lines();
    let first = lines.next().unwrap();
    assert!(
        first.starts_with(&format!("NVIDIA driver {driver}, CUDA driver ")),
        "{text}"
    );
    assert!(!first.ends_with("unknown"), "CUDA version unknown: {text}");
    assert_eq!(
        lines.next(),
        Some(format!("{} GPU(s)", gpus.len()).as_str())
    );
    let mut src = NvmlSource::init().unwrap();
    for (i, (name, uuid)) in gpus.iter().enumerate() {
        let block = text
            .split(&format!("\nGPU {i}: "))
            .nth(1)
            .unwrap_or_else(|| panic!("no GPU {i} in\n{text}"));
        assert!(block.starts_with(&format!("{name}\n")), "{block}");
        assert!(block.contains(&format!("uuid={uuid} ")), "{block}");
        let summary = |label: &str| -> BTreeSet<String> {
            let line = block
                .lines()
                .find_map(|l| l.strip_prefix(&format!("  {label}: ")))
                .unwrap_or_else(|| panic!("no `{label}:` line in\n{block}"));
            if line == "none" {
                BTreeSet::new()
            } else {
                line.split(", ").map(str::to_string).collect()
            }
        };
        let supported = summary("supported");
        let unsupported = summary("not supported");
        // Every discrete NVIDIA GPU with a running driver answers these.
        for m in ["utilization", "memory", "temperature"] {
            assert!(
                supported.contains(m),
                "{m} not supported on GPU {i}:\n{block}"
            );
        }
        // Each row's support column agrees with the summary, and with NVML asked directly.
        for m in Metric::ALL {
            let row = block
                .lines()
                .find(|l| l.starts_with(&format!("  {:<20} ", m.name())))
                .unwrap_or_else(|| panic!("no row for {m:?} in\n{block}"));
            let col = &row[23..];
            let is_yes = col.starts_with("supported ");
            let is_no = col.starts_with("not supported ");
            assert_eq!(supported.contains(m.name()), is_yes, "{row}");
            assert_eq!(unsupported.contains(m.name()), is_no, "{row}");
            if m != Metric::MigInstances && (is_yes || is_no) {
                let direct = src.read(i as u32, m);
                assert_eq!(
                    direct.is_ok(),
                    is_yes,
                    "{m:?} on GPU {i}: NVML says {direct:?}, the report says {row}"
                );
            }
        }
    }
}

#[test]
fn gpus_report_matches_the_machine() {
    let mut out = Vec::new();
    let result = nvml::gpus_report(&mut out);
    let text = String::from_utf8(out).unwrap();
    if driver_expected() {
        assert!(result.is_ok(), "a driver is expected: {result:?}");
        assert_report_matches_the_machine(&text);
    } else {
        let e = result.expect_err("no driver here: the report must fail");
        assert!(
            matches!(
                e,
                nvml::NvmlInitError::LibraryMissing(_) | nvml::NvmlInitError::DriverNotLoaded(_)
            ),
            "{e:?}"
        );
        assert_no_driver_message(&e.to_string());
        assert_eq!(text, "", "nothing printed before the error");
    }
}

#[tokio::test]
async fn collector_state_matches_the_machine() {
    let (handle, mut rx) = edgewatch::queue::channel(1_000);
    let status = Arc::new(NvmlStatus::new());
    let shutdown = CancellationToken::new();
    let cfg = NvmlConfig {
        interval: edgewatch::config::Interval(Duration::from_millis(200)),
        ..NvmlConfig::default()
    };
    let task = tokio::spawn(nvml::run(
        cfg,
        handle,
        Arc::new(Stats::default()),
        status.clone(),
        shutdown.clone(),
    ));
    if !driver_expected() {
        // The task ends by itself, without a shutdown, saying why in the status.
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("without a driver the collector must end by itself")
            .unwrap();
        let why = NvmlSource::init().unwrap_err().to_string();
        assert_eq!(status.state(), format!("off: {why}"));
        assert_no_driver_message(&why);
        let snap = serde_json::to_value(status.snapshot()).unwrap();
        assert_eq!(snap["state"], format!("off: {why}").as_str());
        assert_eq!(snap["samples"], 0);
        assert_eq!(snap["gpus"], serde_json::json!([]));
        assert_eq!(snap["driver"], "");
        assert!(rx.try_recv().is_err(), "nothing submitted");
        return;
    }
    let (driver, gpus) = nvml_view();
    // Running: a sample holds one `gpu` line per GPU, tagged with its uuid and the driver.
    let req = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a sample within 10 s")
        .expect("queue open");
    assert_eq!(status.state(), "running");
    let mut seen: Vec<(String, String)> = req
        .batch
        .lines
        .iter()
        .filter_map(|l| {
            let (m, tags) = split_series_key(&l.key);
            if m != "gpu" {
                return None;
            }
            let tag = |k: &str| tags.iter().find(|(t, _)| t == k).map(|(_, v)| v.clone());
            assert_eq!(tag("driver").as_deref(), Some(driver.as_str()), "{}", l.key);
            Some((tag("name").unwrap_or_default(), tag("uuid").unwrap()))
        })
        .collect();
    seen.sort();
    let mut want = gpus.clone();
    want.sort();
    assert_eq!(seen, want);
    let snap = serde_json::to_value(status.snapshot()).unwrap();
    assert_eq!(snap["driver"], driver.as_str());
    assert_eq!(snap["gpus"].as_array().unwrap().len(), gpus.len());
    for g in snap["gpus"].as_array().unwrap() {
        assert_eq!(g["lost"], false, "{g}");
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("stops on shutdown")
        .unwrap();
    assert_eq!(status.state(), "stopped");
}

/// The real binary: without a driver `gpus` fails plainly and non-zero, and `run` logs one
/// line, reports the collector off in its status, and runs on; with one, `gpus` succeeds
/// and `run` samples every GPU.
#[test]
fn the_binary_reports_gpus_or_their_absence_and_runs_on() {
    let out = std::process::Command::new(crate::support::bin())
        .arg("gpus")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let dir = tempfile::tempdir().unwrap();
    let agent = crate::support::Agent::start(
        dir.path(),
        "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\ninterval = \"200ms\"\n",
    );
    if driver_expected() {
        assert!(out.status.success(), "{stderr}");
        assert_report_matches_the_machine(&stdout);
        let (_, gpus) = nvml_view();
        let st = crate::support::wait_for(Duration::from_secs(10), || {
            let st = agent.status();
            let n = &st["collectors"]["nvml"];
            (n["state"] == "running" && n["samples"].as_u64().unwrap_or(0) >= 1).then_some(st)
        })
        .unwrap_or_else(|| panic!("nvml not sampling: {}", agent.status()));
        let listed = st["collectors"]["nvml"]["gpus"].as_array().unwrap();
        assert_eq!(listed.len(), gpus.len(), "{st}");
        return;
    }
    assert!(!out.status.success());
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stdout, "");
    let why = NvmlSource::init().unwrap_err().to_string();
    assert_no_driver_message(&why);
    assert_eq!(stderr, format!("error: {why}\n"));

    let st = crate::support::wait_for(Duration::from_secs(10), || {
        let st = agent.status();
        let off = st["collectors"]["nvml"]["state"]
            .as_str()
            .is_some_and(|s| s.starts_with("off"));
        off.then_some(st)
    })
    .expect("nvml reported off");
    assert_eq!(
        st["collectors"]["nvml"]["state"],
        format!("off: {why}").as_str()
    );
    let (code, _) = crate::support::post(&agent.url("/write"), b"m v=1", &[]).unwrap();
    assert_eq!(code, 204);
    let log = agent.log_text();
    let off_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("nvml collector off"))
        .collect();
    assert_eq!(
        off_lines.len(),
        1,
        "NVML off should be one log line:\n{log}"
    );
    assert!(off_lines[0].contains(&why), "{}", off_lines[0]);
    let nvml_lines = log
        .lines()
        .filter(|l| l.to_lowercase().contains("nvml"))
        .count();
    assert_eq!(nvml_lines, 1, "NVML off should be one log line:\n{log}");
}

/// The real binary with a driver whose kernel module is not loaded, on any machine (GPU or
/// not): the stand-in library, given no scenario, answers `nvmlInit` with
/// `NVML_ERROR_DRIVER_NOT_LOADED`. `gpus` fails with exactly one plain line and exit code 2;
/// `run` logs one line, reports the collector off in its status, and runs on.
#[test]
fn the_binary_without_a_loaded_driver_fails_plainly_and_runs_on() {
    const WHY: &str = "the NVIDIA kernel driver is not loaded (NVML: NVIDIA driver is not \
                       loaded); check `nvidia-smi` and `lsmod | grep nvidia`";
    let lib = crate::nvml_stub::new_lib();
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-scenario.txt");
    let env = [
        ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
        ("NVML_STUB_SCENARIO", none.to_str().unwrap()),
    ];
    let out = std::process::Command::new(crate::support::bin())
        .arg("gpus")
        .envs(env)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("error: {WHY}\n")
    );

    let agent = crate::support::Agent::start_with_env(
        dir.path(),
        "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\ninterval = \"200ms\"\n",
        &env,
    );
    let st = crate::support::wait_for(Duration::from_secs(10), || {
        let st = agent.status();
        let off = st["collectors"]["nvml"]["state"]
            .as_str()
            .is_some_and(|s| s.starts_with("off"));
        off.then_some(st)
    })
    .expect("nvml reported off");
    assert_eq!(
        st["collectors"]["nvml"]["state"],
        format!("off: {WHY}").as_str()
    );
    assert_eq!(st["collectors"]["nvml"]["gpus"], serde_json::json!([]));
    let (code, _) = crate::support::post(&agent.url("/write"), b"m v=1", &[]).unwrap();
    assert_eq!(code, 204);
    let log = agent.log_text();
    let nvml_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("nvml"))
        .collect();
    assert_eq!(
        nvml_lines.len(),
        1,
        "NVML off should be one log line:\n{log}"
    );
    assert!(
        nvml_lines[0].contains(&format!("nvml collector off: {WHY}")),
        "{}",
        nvml_lines[0]
    );
}

/// The real binary with the stand-in listing two GPUs: `run` samples both, and
/// `/api/v1/status` shows each exactly as the scenario says (tags, not lost, the metrics it
/// does not support).
#[test]
fn the_binary_samples_every_gpu_the_stand_in_lists() {
    let lib = crate::nvml_stub::new_lib();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.txt");
    std::fs::write(
        &scenario,
        "driver 535.104.05\ncuda 12020\ngpus 2\n\
         gpu 0 name NVIDIA A2\ngpu 0 uuid GPU-a\ngpu 0 arch 7\ngpu 0 cc 8 6\n\
         gpu 0 utilization 10 20\ngpu 0 temperature 40\n\
         gpu 1 name Orin (nvgpu)\ngpu 1 uuid GPU-b\ngpu 1 utilization 0 0\n",
    )
    .unwrap();
    let agent = crate::support::Agent::start_with_env(
        dir.path(),
        "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\ninterval = \"200ms\"\n",
        &[
            ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
            ("NVML_STUB_SCENARIO", scenario.to_str().unwrap()),
        ],
    );
    let st = crate::support::wait_for(Duration::from_secs(10), || {
        let st = agent.status();
        let n = &st["collectors"]["nvml"];
        (n["state"] == "running" && n["samples"].as_u64().unwrap_or(0) >= 2).then_some(st)
    })
    .unwrap_or_else(|| {
        panic!(
            "nvml not sampling: {}\n{}",
            agent.status(),
            agent.log_text()
        )
    });
    let n = &st["collectors"]["nvml"];
    assert_eq!(n["driver"], "535.104.05");
    assert_eq!(n["cuda"], "12.2");
    let seen: Vec<serde_json::Value> = n["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            serde_json::json!([
                g["index"],
                g["uuid"],
                g["name"],
                g["arch"],
                g["cc"],
                g["lost"],
                g["unsupported"]
            ])
        })
        .collect();
    // Sampled without per-process metrics; MIG instances are not asked while MIG is off.
    let all_but = |yes: &[&str]| -> Vec<&'static str> {
        Metric::ALL
            .iter()
            .filter(|m| !m.is_per_process() && **m != Metric::MigInstances)
            .map(|m| m.name())
            .filter(|n| !yes.contains(n))
            .collect()
    };
    assert_eq!(
        seen,
        vec![
            serde_json::json!([
                0,
                "GPU-a",
                "NVIDIA A2",
                "Ampere",
                "8.6",
                false,
                all_but(&["utilization", "temperature"])
            ]),
            serde_json::json!([
                1,
                "GPU-b",
                "Orin (nvgpu)",
                "",
                "",
                false,
                all_but(&["utilization"])
            ]),
        ]
    );
}
