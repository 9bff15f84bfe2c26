//! The agent's own events through the real binary: a real mosquitto stopped under an MQTT
//! sink and started again gives `sink_down` then `sink_up` (with how long it was down); a
//! tegrastats that keeps crashing gives `collector_restart` events; all stored as
//! `edgewatch_event` points with `source=agent` beside the data they explain; a configuration
//! changed between two runs is one `config_change` event naming its sections.

use std::time::Duration;

use serde_json::Value as J;

use crate::support::peers::*;
use crate::support::*;

const BASE: &str = "[host]\nenabled = false\n[nvml]\nenabled = false\n[rollup]\nenabled = false\n[alerts]\nbuiltin = false\n[health]\nenabled = true\ninterval = \"300ms\"\n";

/// The stored events of `kind`: (tags, field, value) of each point's fields.
fn events(agent: &Agent, kind: &str) -> Vec<(String, String, J)> {
    stored_points(
        agent,
        &format!("measurement=edgewatch_event&tag.kind={kind}"),
    )
    .into_iter()
    .map(|(tags, field, _, v)| (tags, field, v))
    .collect()
}

fn field<'a>(ev: &'a [(String, String, J)], name: &str) -> Option<&'a J> {
    ev.iter().find(|e| e.1 == name).map(|e| &e.2)
}

#[test]
fn a_sink_that_loses_its_broker_and_gets_it_back_is_two_events() {
    if !require(Peer::Mosquitto) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let broker = Mosquitto::start(&dir.path().join("mq"), port, None);
    let cfg = format!(
        "{BASE}[tegrastats]\nenabled = false\n[[sink]]\ntype = \"mqtt\"\nname = \"mq\"\n\
         url = \"mqtt://127.0.0.1:{port}\"\ntopic = \"ew/own-events\"\nmax_delay = \"50ms\"\n\
         min_backoff = \"50ms\"\nmax_backoff = \"300ms\"\n"
    );
    let agent = Agent::start(dir.path(), &cfg);
    let sink = |agent: &Agent| agent.status()["forward"]["sinks"][0].clone();
    wait_for(Duration::from_secs(15), || {
        (sink(&agent)["connected"] == true).then_some(())
    })
    .expect("connected");
    // Up at start is no event.
    std::thread::sleep(Duration::from_millis(700));
    assert!(events(&agent, "sink_up").is_empty());
    broker.stop();
    let down = wait_for(Duration::from_secs(15), || {
        let e = events(&agent, "sink_down");
        (!e.is_empty()).then_some(e)
    })
    .unwrap_or_else(|| panic!("no sink_down: {}", agent.log_text()));
    assert!(
        down[0].0.contains("sink=mq")
            && down[0].0.contains("source=agent")
            && down[0].0.contains("severity=warning"),
        "{down:?}"
    );
    let msg = field(&down, "message").and_then(J::as_str).unwrap_or("");
    assert!(msg.starts_with("sink mq (mqtt) lost its link"), "{msg}");
    std::thread::sleep(Duration::from_millis(1500));
    let _broker = Mosquitto::start(&dir.path().join("mq2"), port, None);
    let up = wait_for(Duration::from_secs(20), || {
        let e = events(&agent, "sink_up");
        (!e.is_empty()).then_some(e)
    })
    .unwrap_or_else(|| panic!("no sink_up: {}", agent.log_text()));
    let down_s = field(&up, "down_s").and_then(J::as_f64).unwrap();
    assert!(down_s >= 1.0, "{up:?}");
    // One of each: the sink went down once.
    assert_eq!(
        events(&agent, "sink_down")
            .iter()
            .filter(|e| e.1 == "message")
            .count(),
        1
    );
}

#[test]
fn a_crashing_tegrastats_is_a_collector_restart_event() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("crashing-tegrastats");
    std::fs::write(&script, "#!/bin/sh\necho 'not a tegrastats line'\nexit 3\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let cfg = format!(
        "{BASE}[tegrastats]\npath = \"{}\"\ninterval = \"100ms\"\n",
        script.display()
    );
    let agent = Agent::start(dir.path(), &cfg);
    let ev = wait_for(Duration::from_secs(20), || {
        let e = events(&agent, "collector_restart");
        (!e.is_empty()).then_some(e)
    })
    .unwrap_or_else(|| panic!("no collector_restart: {}", agent.log_text()));
    assert!(ev[0].0.contains("collector=tegrastats"), "{ev:?}");
    let msg = field(&ev, "message").and_then(J::as_str).unwrap_or("");
    assert!(msg.starts_with("tegrastats restarted"), "{msg}");
    assert!(msg.contains("exit status: 3"), "{msg}");
    // The incident snapshot and the UI read them like any event; the agent is healthy.
    assert_eq!(agent.status()["ingest"]["points_dropped"], 0);
}

#[test]
fn a_configuration_changed_between_runs_is_one_event_naming_its_sections() {
    let dir = tempfile::tempdir().unwrap();
    let with_ratio = |r: f64| format!("{BASE}[alerts]\nlatency_ratio = {r}\n");
    Agent::start(dir.path(), &with_ratio(3.0)).terminate();
    // Same alerts, new ports (the harness picks free ones): only [http] and [udp] changed.
    let agent = Agent::start(dir.path(), &with_ratio(3.0));
    let sections = |agent: &Agent| -> Vec<String> {
        events(agent, "config_change")
            .into_iter()
            .filter(|e| e.1 == "sections")
            .filter_map(|e| e.2.as_str().map(str::to_string))
            .collect()
    };
    let first = wait_for(Duration::from_secs(10), || {
        let s = sections(&agent);
        (!s.is_empty()).then_some(s)
    })
    .unwrap_or_else(|| panic!("no config_change: {}", agent.log_text()));
    assert_eq!(first, vec!["http,udp".to_string()], "{first:?}");
    agent.terminate();
    // A changed threshold names [alerts]; the message says how it was applied.
    let agent = Agent::start(dir.path(), &with_ratio(5.0));
    let all = wait_for(Duration::from_secs(10), || {
        let s = sections(&agent);
        (s.len() == 2).then_some(s)
    })
    .unwrap_or_else(|| panic!("no second config_change: {}", agent.log_text()));
    assert!(all.iter().any(|s| s == "alerts,http,udp"), "{all:?}");
    let ev = events(&agent, "config_change");
    let msg = ev
        .iter()
        .filter(|e| e.1 == "message")
        .filter_map(|e| e.2.as_str())
        .find(|m| m.contains("alerts"))
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.starts_with("configuration changed since the last run (restart): alerts"),
        "{msg}"
    );
    assert!(ev.iter().any(|e| e.0.contains("source=agent")), "{ev:?}");
}
