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
