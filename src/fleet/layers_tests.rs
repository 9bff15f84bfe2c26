//! Unit tests of the layers: offer, commit, replay, locked sections, durability, and the
//! live path through a [`ReloadSender`] whose requests the test answers.

use super::*;
use crate::config::layers::{ReloadRequest, ReloadSender};
use crate::fleet::config::FleetConfig;
use crate::fleet::{receive, settle_at_start};
use crate::reload::Source as LocalSource;

struct Fleet {
    dir: tempfile::TempDir,
    key: ring::signature::Ed25519KeyPair,
    cfg: FleetConfig,
}

fn fleet(groups: &[&str], allow: &[&str]) -> Fleet {
    let (private, public) = doc::generate().unwrap();
    Fleet {
        dir: tempfile::tempdir().unwrap(),
        key: doc::private_key(&private).unwrap(),
        cfg: FleetConfig {
            public_key: public,
            groups: groups.iter().map(|s| s.to_string()).collect(),
            allow: allow.iter().map(|s| s.to_string()).collect(),
            ..FleetConfig::default()
        },
    }
}

impl Fleet {
    fn open(&self) -> FleetLayers {
        FleetLayers::open(&self.cfg, self.dir.path(), "dev-1").unwrap()
    }
    fn doc(&self, version: u64, body: &str) -> Vec<u8> {
        doc::sign(&self.key, version, body).into_bytes()
    }
}

fn ok_report() -> ReloadReport {
    ReloadReport {
        ok: true,
        error: None,
        sha256: "e".repeat(64),
        applied: Vec::new(),
        restart_required: Vec::new(),
    }
}

fn t(s: &str) -> toml::Table {
    toml::from_str(s).unwrap()
}

fn state_of(l: &FleetLayers, source: &str) -> LayerStatus {
    l.status().into_iter().find(|s| s.source == source).unwrap()
}

#[test]
fn layers_merge_lowest_first_and_name_who_set_each_key() {
    let f = fleet(&["lab", "orin"], &[]);
    let l = f.open();
    for (source, body, v) in [
        ("device", "[host]\ninterval = \"2s\"\n", 1),
        (
            "group:orin",
            "[host]\ninterval = \"3s\"\nenabled = false\n",
            1,
        ),
        ("group:lab", "[tags]\nsite = \"lab\"\n", 1),
        (
            "all",
            "[host]\ninterval = \"4s\"\n[tags]\nsite = \"all\"\nrack = \"1\"\n",
            1,
        ),
    ] {
        assert_eq!(
            l.offer(source, &f.doc(v, body)),
            Offer::Candidate { version: v }
        );
        l.commit(source, &ok_report());
    }
    let e = l.effective(t("[log]\nlevel = \"debug\"\n")).unwrap();
    assert_eq!(e.table["host"]["interval"].as_str(), Some("2s"));
    assert_eq!(e.table["host"]["enabled"].as_bool(), Some(false));
    assert_eq!(e.table["tags"]["site"].as_str(), Some("lab"));
    assert_eq!(e.table["tags"]["rack"].as_str(), Some("1"));
    assert_eq!(e.set_by["host.interval"], "device");
    assert_eq!(e.set_by["host.enabled"], "group:orin");
    assert_eq!(e.set_by["tags.site"], "group:lab");
    assert_eq!(e.set_by["tags.rack"], "all");
    assert_eq!(e.set_by["log.level"], "file");
    let s = l.status();
    assert_eq!(s[0].source, "file");
    assert!(s[1..]
        .iter()
        .all(|x| x.state == LayerState::Applied && x.version == Some(1)));
}

#[test]
fn replay_same_version_and_locked_sections_are_refused_and_the_applied_layer_stays() {
    let f = fleet(&[], &["http"]);
    let l = f.open();
    let v2 = f.doc(2, "[host]\ninterval = \"5s\"\n");
    assert!(matches!(l.offer("all", &v2), Offer::Candidate { .. }));
    l.commit("all", &ok_report());
    assert_eq!(l.offer("all", &v2), Offer::Unchanged);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            f.doc(1, "[host]\ninterval = \"9s\"\n"),
            "older than version 2",
        ),
        (f.doc(2, "[host]\ninterval = \"9s\"\n"), "higher version"),
        (
            f.doc(3, "[storage]\ndata_dir = \"/tmp/elsewhere\"\n"),
            "[storage]",
        ),
        (f.doc(3, "[host\ninterval = 1\n"), "not valid TOML"),
        (
            String::from_utf8(f.doc(3, "[host]\ninterval = \"9s\"\n"))
                .unwrap()
                .replace("9s", "1s")
                .into_bytes(),
            "bad signature",
        ),
        (fleet(&[], &[]).doc(3, "[host]\n"), "bad signature"),
        (
            f.doc(3, &format!("# {}\n[host]\n", "x".repeat(70_000))),
            "max_document_bytes",
        ),
    ];
    for (text, says) in cases {
        match l.offer("all", &text) {
            Offer::Refused(why) => assert!(why.contains(says), "{says}: {why}"),
            other => panic!("{says}: {other:?}"),
        }
        let s = state_of(&l, "all");
        assert_eq!(s.state, LayerState::Refused);
        assert_eq!(s.version, Some(2), "the applied version stays");
        let e = l.effective(toml::Table::new()).unwrap();
        assert_eq!(e.table["host"]["interval"].as_str(), Some("5s"));
    }
    // `allow = ["http"]` unlocks [http] only.
    assert!(matches!(
        l.offer("all", &f.doc(4, "[http]\nmetrics_open = true\n")),
        Offer::Candidate { .. }
    ));
}

#[test]
fn a_failed_reload_drops_the_candidate_and_only_applied_layers_are_stored() {
    let f = fleet(&[], &[]);
    let l = f.open();
    let v1 = f.doc(1, "[host]\ninterval = \"5s\"\n");
    assert!(matches!(l.offer("all", &v1), Offer::Candidate { .. }));
    // While the reload runs, the candidate is what `effective` merges.
    let e = l.effective(toml::Table::new()).unwrap();
    assert_eq!(e.table["host"]["interval"].as_str(), Some("5s"));
    l.commit("all", &ok_report());
    assert!(matches!(
        l.offer("all", &f.doc(2, "[host]\nintervl = \"1s\"\n")),
        Offer::Candidate { .. }
    ));
    l.commit(
        "all",
        &ReloadReport {
            ok: false,
            error: Some("unknown field `intervl`".into()),
            ..ok_report()
        },
    );
    let s = state_of(&l, "all");
    assert_eq!(s.state, LayerState::Failed);
    assert!(s.error.as_deref().unwrap().contains("intervl"), "{s:?}");
    assert_eq!(s.version, Some(1));
    assert_eq!(
        std::fs::read(file_of(&f.dir.path().join("fleet"), "all")).unwrap(),
        v1
    );
    let e = l.effective(toml::Table::new()).unwrap();
    assert_eq!(e.table["host"]["interval"].as_str(), Some("5s"));
    // A restart reads the stored layer back, verified, and refuses its replay.
    let again = f.open();
    assert_eq!(state_of(&again, "all").version, Some(1));
    assert_eq!(again.offer("all", &v1), Offer::Unchanged);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(file_of(&f.dir.path().join("fleet"), "all"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_stored_document_that_no_longer_verifies_is_refused_at_start() {
    let f = fleet(&[], &[]);
    let l = f.open();
    assert!(matches!(
        l.offer("device", &f.doc(1, "[host]\n")),
        Offer::Candidate { .. }
    ));
    l.commit("device", &ok_report());
    let path = file_of(&f.dir.path().join("fleet"), "device");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("[host]", "[hosts]")).unwrap();
    let again = f.open();
    let s = state_of(&again, "device");
    assert_eq!(s.state, LayerState::Refused);
    assert!(s.error.unwrap().contains("bad signature"));
    assert_eq!(
        again.effective(toml::Table::new()).unwrap().table,
        toml::Table::new()
    );
}

fn local(dir: &std::path::Path, text: &str) -> LocalSource {
    let path = dir.join("local.toml");
    std::fs::write(&path, text).unwrap();
    LocalSource {
        path: Some(path),
        ..Default::default()
    }
}

#[test]
fn at_start_a_layer_that_makes_the_config_invalid_is_dropped_and_marked_failed() {
    let f = fleet(&[], &[]);
    let l = f.open();
    for (source, body) in [
        ("all", "[host]\ninterval = \"7s\"\n"),
        ("device", "[host]\ninterval = \"soon\"\n"),
    ] {
        assert!(matches!(
            l.offer(source, &f.doc(1, body)),
            Offer::Candidate { .. }
        ));
        l.commit(source, &ok_report());
    }
    let src = local(f.dir.path(), "[log]\nlevel = \"warn\"\n");
    let first = f.open();
    settle_at_start(&first, |l| src.load(l).map(|x| x.sha256)).unwrap();
    let cfg = src.load(&first).unwrap().config;
    assert_eq!(cfg.host.interval.0, std::time::Duration::from_secs(7));
    assert_eq!(cfg.log.level, "warn");
    let again = f.open();
    settle_at_start(&again, |l| src.load(l).map(|x| x.sha256)).unwrap();
    let s = state_of(&again, "device");
    assert_eq!(s.state, LayerState::Failed);
    assert!(s.error.unwrap().contains("soon"));
    // The stored document stays on disk (its replay is still refused).
    assert_eq!(
        again.offer("device", &f.doc(1, "[host]\ninterval = \"soon\"\n")),
        Offer::Unchanged
    );
}

/// The test side of the reloader: answers each request with what validating the
/// effective config says, as the reloader does before it applies anything.
async fn answer(
    mut rx: tokio::sync::mpsc::Receiver<ReloadRequest>,
    layers: Arc<FleetLayers>,
    src: LocalSource,
    seen: Arc<Mutex<Vec<String>>>,
) {
    while let Some(req) = rx.recv().await {
        if let crate::config::layers::Trigger::Fleet { source } = &req.trigger {
            seen.lock().unwrap().push(source.clone());
        }
        let report = match src.load(&*layers) {
            Ok(l) => ReloadReport {
                sha256: l.sha256,
                ..ok_report()
            },
            Err(e) => ReloadReport {
                ok: false,
                error: Some(e),
                ..ok_report()
            },
        };
        let _ = req.reply.unwrap().send(report);
    }
}

use std::sync::Arc;

#[tokio::test]
async fn receive_asks_for_a_reload_and_keeps_only_what_validates() {
    let f = fleet(&["lab"], &[]);
    let layers = Arc::new(f.open());
    let (tx, rx): (ReloadSender, _) = tokio::sync::mpsc::channel(4);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let src = local(f.dir.path(), "");
    tokio::spawn(answer(rx, layers.clone(), src, seen.clone()));
    let rule = "[[alert]]\nname = \"HotGpu\"\nmeasurement = \"gpu\"\nfield = \"temp_c\"\nagg = \"max\"\nwindow = \"1m\"\nop = \">\"\nthreshold = 80.0\n";
    let got = receive(&layers, "group:lab", &f.doc(1, rule), &tx).await;
    assert_eq!(got, Offer::Candidate { version: 1 });
    assert_eq!(state_of(&layers, "group:lab").state, LayerState::Applied);
    // Invalid as a whole (unknown key, wrong type): failed, the previous one stays.
    for bad in [
        "[host]\nintervall = \"1s\"\n",
        "[host]\nenabled = \"yes\"\n",
    ] {
        receive(&layers, "group:lab", &f.doc(2, bad), &tx).await;
        let s = state_of(&layers, "group:lab");
        assert_eq!(s.state, LayerState::Failed, "{bad}");
        assert_eq!(s.version, Some(1));
    }
    // A refused document never reaches the reloader.
    receive(&layers, "all", &f.doc(1, "[udp]\nenabled = false\n"), &tx).await;
    assert_eq!(state_of(&layers, "all").state, LayerState::Refused);
    assert_eq!(
        *seen.lock().unwrap(),
        ["group:lab", "group:lab", "group:lab"]
    );
    let report = layers.report();
    let lab = report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["source"] == "group:lab")
        .unwrap();
    assert_eq!(
        (lab["state"].as_str(), lab["version"].as_u64()),
        (Some("failed"), Some(1))
    );
    let stored: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.path().join("fleet/status.json")).unwrap())
            .unwrap();
    assert_eq!(stored["fleet_sha256"], report["fleet_sha256"]);
    // No reloader: the layer fails and says why.
    let (dead, gone) = tokio::sync::mpsc::channel(1);
    drop(gone);
    receive(&layers, "device", &f.doc(1, "[host]\n"), &dead).await;
    let s = state_of(&layers, "device");
    assert_eq!(s.state, LayerState::Failed);
    assert!(s.error.unwrap().contains("reloader"));
}
