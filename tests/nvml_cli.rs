//! The NVML collector against whatever this machine has: without an NVIDIA driver (the
//! usual CI machine, a Jetson without NVML) `edgewatch gpus` must fail with a plain message
//! and the collector must switch itself off; with one, the report must list every metric.

use std::sync::Arc;
use std::time::Duration;

use edgewatch::collect::nvml::{self, Metric, NvmlConfig, NvmlStatus};
use edgewatch::stats::Stats;
use tokio_util::sync::CancellationToken;

#[test]
fn gpus_report_is_plain_with_or_without_a_driver() {
    let mut out = Vec::new();
    match nvml::gpus_report(&mut out) {
        Ok(()) => {
            let text = String::from_utf8(out).unwrap();
            assert!(text.starts_with("NVIDIA driver "), "{text}");
            for m in Metric::ALL {
                assert!(text.contains(m.name()), "{m:?} missing from\n{text}");
            }
        }
        Err(e) => {
            let msg = e.to_string();
            eprintln!("edgewatch gpus would print: {msg}");
            assert!(msg.contains("NVIDIA") || msg.contains("NVML"), "{msg}");
            assert!(!msg.contains('\n'), "one line: {msg}");
        }
    }
}

#[tokio::test]
async fn collector_switches_itself_off_without_a_driver() {
    let (handle, _rx) = edgewatch::queue::channel(1_000);
    let status = Arc::new(NvmlStatus::new());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(nvml::run(
        NvmlConfig::default(),
        handle,
        Arc::new(Stats::default()),
        status.clone(),
        shutdown.clone(),
    ));
    // Without a driver the task ends by itself; with one it runs until shutdown.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while !task.is_finished() && status.state() != "running" {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(ended.is_ok(), "state stuck at {}", status.state());
    shutdown.cancel();
    task.await.unwrap();
    let state = status.state();
    assert!(
        state.starts_with("off: ") || state == "stopped",
        "unexpected state {state}"
    );
    let snap = status.snapshot();
    assert_eq!(snap["state"], serde_json::Value::String(state));
}

/// The real binary on a machine without an NVIDIA driver: `gpus` fails plainly and
/// non-zero; `run` logs one line, reports the collector off in its status, and runs on.
#[test]
fn without_a_driver_gpus_fails_plainly_and_run_goes_on() {
    if nvml::gpus_report(&mut Vec::new()).is_ok() {
        eprintln!("an NVIDIA driver is present: the no-driver path cannot be checked here");
        return;
    }
    let out = std::process::Command::new(crate::support::bin())
        .arg("gpus")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no NVIDIA driver found"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let dir = tempfile::tempdir().unwrap();
    let agent = crate::support::Agent::start(
        dir.path(),
        "[host]\nenabled = false\n[tegrastats]\nenabled = false\n",
    );
    let st = crate::support::wait_for(Duration::from_secs(10), || {
        let st = agent.status();
        let off = st["collectors"]["nvml"]["state"]
            .as_str()
            .is_some_and(|s| s.starts_with("off"));
        off.then_some(st)
    })
    .expect("nvml reported off");
    assert!(
        st["collectors"]["nvml"]["state"]
            .as_str()
            .unwrap()
            .contains("NVIDIA"),
        "{st}"
    );
    let (code, _) = crate::support::post(&agent.url("/write"), b"m v=1", &[]).unwrap();
    assert_eq!(code, 204);
    let log = agent.log_text();
    assert_eq!(log.matches("NVML").count().min(1), 1, "{log}");
    let nvml_lines = log.lines().filter(|l| l.contains("nvml")).count();
    assert!(nvml_lines <= 2, "NVML off should be one log line:\n{log}");
}
