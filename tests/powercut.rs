//! Crash consistency beyond fsync order: the outcome of power cuts, not only the order of
//! system calls (tests/durability.rs reads that under strace).
//!
//! The agent runs with its data directory on a test file system
//! (tests/support/powercut_fs.py, a FUSE passthrough with Debian's `python3-fusepy` and
//! `fuse3`) that keeps written-but-unsynced data only until a simulated power cut: each file
//! then reverts to its content as of its last fsync/fdatasync and each directory to its
//! entries as of its last fsync (`drop`), or keeps a random part of the unsynced pages
//! (`torn`: a disk that wrote some of its cache, in any order). Writers post points through
//! `/write` and record every 204, an MQTT sink forwards them to a real mosquitto, the rollup
//! job runs every second; at a random moment (seeded, the seed is printed) the agent is
//! killed with SIGKILL and the power is cut. Then on what survived: SQLite's
//! `PRAGMA integrity_check` (on a copy) is `ok`, a restarted agent holds every acknowledged
//! point, and in the end the subscriber holds every stored point, with at most one
//! duplicated batch per cut (docs/forwarding.md's bound with the default `inflight = 1`) and
//! nothing lost to a consumer that drops duplicates by sequence number and part; the rollup
//! tiers count every stored point exactly once.
//!
//! The model is checked to bite: with `[storage] synchronous = "normal"` (no sync before
//! the 204) the same cuts lose acknowledged points.
//!
//! Knobs: `POWERCUT_SEED` (replay a run), `POWERCUT_CUTS` (default 30); not `EDGEWATCH_*`,
//! which the agent reads as configuration.
//! Needs root (mounting), `/dev/fuse`, Debian `fuse3` and `python3-fusepy`, and mosquitto.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::peers::*;
use crate::support::*;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/powercut_fs.py");
/// Points per `/write` request.
const PER_REQUEST: u64 = 5;
/// Pause between a writer's requests (keeps the whole run under the query API's 200,000
/// points).
const PAUSE: Duration = Duration::from_millis(4);
/// Concurrent writers (group commit shares one sync between them).
const WRITERS: u64 = 2;

/// splitmix64: the test's seeded randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The python interpreter that imports fusepy (Debian's `/usr/bin/python3` first: the
/// package installs there, not in a pyenv or venv `python3` that may come first on PATH).
/// Fails naming the packages when none does, or when `/dev/fuse` is missing. `None`: the
/// `fuse` peer is skipped on purpose (`EDGEWATCH_TEST_SKIP_PEERS=fuse`).
fn require_fuse() -> Option<String> {
    if !require(Peer::Fuse) {
        return None;
    }
    assert!(
        Path::new("/dev/fuse").exists(),
        "this test mounts a FUSE file system: /dev/fuse is missing (load the `fuse` module; \
         in a container pass --device /dev/fuse and CAP_SYS_ADMIN) and `apt-get install fuse3`"
    );
    let probe = "try:\n import fusepy\nexcept ImportError:\n import fuse; fuse.FUSE\n";
    for python in ["/usr/bin/python3", "python3"] {
        let ok = Command::new(python)
            .args(["-c", probe])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(python.to_string());
        }
    }
    panic!(
        "this test needs Python's fusepy: `apt-get install python3-fusepy fuse3` \
         (or set {SKIP_PEERS_VAR}=fuse to skip it, on purpose)"
    );
}

/// The power-cut file system mounted on `mnt`, serving `backing`; unmounted and stopped by
/// PID when dropped.
struct PowercutFs {
    child: Option<Child>,
    mnt: PathBuf,
    ctl: PathBuf,
    log: PathBuf,
}

impl PowercutFs {
    fn mount(python: &str, backing: &Path, mnt: &Path, ctl: &Path, log: PathBuf) -> PowercutFs {
        std::fs::create_dir_all(mnt).unwrap();
        std::fs::create_dir_all(ctl).unwrap();
        let _ = std::fs::remove_file(ctl.join("ready"));
        let child = Command::new(python)
            .arg(SCRIPT)
            .arg(backing)
            .arg(mnt)
            .arg(ctl)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn powercut_fs.py");
        let mut fs = PowercutFs {
            child: Some(child),
            mnt: mnt.to_path_buf(),
            ctl: ctl.to_path_buf(),
            log,
        };
        let up = wait_for(Duration::from_secs(30), || {
            if let Some(Ok(Some(st))) = fs.child.as_mut().map(|c| c.try_wait()) {
                panic!("powercut_fs.py exited ({st}):\n{}", fs.log_text());
            }
            (fs.ctl.join("ready").exists() && fs.mounted()).then_some(())
        });
        assert!(
            up.is_some(),
            "the FUSE mount never came up:\n{}",
            fs.log_text()
        );
        fs
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn mounted(&self) -> bool {
        let me = self.mnt.to_string_lossy().to_string();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.get(4) == Some(&me.as_str()) && l.contains(" - fuse")
            })
    }

    /// Cuts the power (`drop` or `torn SEED`); the file system's report.
    fn cut(&self, request: &str) -> serde_json::Value {
        let report = self.ctl.join("report.json");
        let _ = std::fs::remove_file(&report);
        let tmp = self.ctl.join("request.tmp");
        std::fs::write(&tmp, request).unwrap();
        std::fs::rename(&tmp, self.ctl.join("request")).unwrap();
        let text = wait_for(Duration::from_secs(60), || {
            std::fs::read_to_string(&report).ok()
        })
        .unwrap_or_else(|| panic!("no answer to the cut:\n{}", self.log_text()));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(v.get("error").is_none(), "the cut failed: {}", v["error"]);
        v
    }

    /// `fusermount3 -u` (lazy `umount -l` if that fails), then waits for the process.
    fn unmount(mut self) {
        let ok = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let mut child = self.child.take().unwrap();
        let exited = wait_for(Duration::from_secs(20), || child.try_wait().ok().flatten());
        if exited.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(!self.mounted(), "{} is still mounted", self.mnt.display());
    }
}

impl Drop for PowercutFs {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `PRAGMA integrity_check` of the store in `data`, on a copy of the database and its WAL
/// (opening the originals would recover them: the restarted agent must find them as the cut
/// left them).
fn integrity(data: &Path, scratch: &Path) -> String {
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).unwrap();
    for name in ["edgewatch.db", "edgewatch.db-wal"] {
        if data.join(name).exists() {
            std::fs::copy(data.join(name), scratch.join(name)).unwrap();
        }
    }
    let conn = rusqlite::Connection::open(scratch.join("edgewatch.db")).unwrap();
    let mut st = conn.prepare("PRAGMA integrity_check").unwrap();
    let rows: Vec<String> = st
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    rows.join("; ")
}

/// The ids (field `v` of measurement `pc`) the agent holds.
fn stored_ids(agent: &Agent) -> BTreeSet<u64> {
    let (code, body) = get(&agent
        .url("/api/v1/query?measurement=pc&field=v&from=0&to=4000000000000000000&limit=200000"))
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_ne!(v["truncated"], true, "the answer was cut; lower the rates");
    let mut out = BTreeSet::new();
    for s in v["series"].as_array().unwrap() {
        for p in s["points"].as_array().unwrap() {
            let id = p[1].as_u64().unwrap();
            assert!(out.insert(id), "point {id} stored twice");
        }
    }
    out
}

/// One MQTT message: its batch number, part, and the ids it carried.
struct Msg {
    seq: i64,
    part: String,
    /// The header's `chunks=FIRST-LAST`.
    chunks: String,
    ids: Vec<u64>,
}

/// The messages `mosquitto_sub` printed (each starts with its `# edgewatch seq=` line).
fn parse_messages(text: &str) -> Vec<Msg> {
    let mut out: Vec<Msg> = Vec::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# edgewatch seq=") {
            let seq = rest.split(' ').next().unwrap().parse().unwrap();
            let part = rest
                .split(' ')
                .find_map(|w| w.strip_prefix("part="))
                .unwrap_or("1/1")
                .to_string();
            let chunks = rest
                .split(' ')
                .find_map(|w| w.strip_prefix("chunks="))
                .unwrap_or("")
                .to_string();
            out.push(Msg {
                seq,
                part,
                chunks,
                ids: Vec::new(),
            });
        } else if l.starts_with("pc,") {
            let v = l
                .split_once(" v=")
                .and_then(|(_, r)| r.split_once('i'))
                .and_then(|(n, _)| n.parse().ok())
                .unwrap_or_else(|| panic!("unexpected line {l:?}"));
            out.last_mut()
                .expect("a point before any header")
                .ids
                .push(v);
        }
    }
    out
}

struct Setup {
    synchronous: &'static str,
    cuts: usize,
    /// Forward to a real mosquitto (and check the receiver).
    sink: bool,
    /// Tear some cuts (random unsynced pages kept) besides plain drops.
    torn: bool,
    seed: u64,
}

#[derive(Default)]
struct Figures {
    cuts: usize,
    torn_cuts: usize,
    attempted: u64,
    acked: BTreeSet<u64>,
    /// Acknowledged points missing after each restart.
    lost: Vec<usize>,
    /// `PRAGMA integrity_check` after each cut.
    integrity: Vec<String>,
    dropped_pages: u64,
    kept_pages: u64,
    /// Unsynced pages at the cuts, per file.
    dirty_by_file: BTreeMap<String, u64>,
    /// The ids the agent held when it restarted after the last cut.
    final_stored: BTreeSet<u64>,
}

/// A running agent and its mount: `cut` it at `Instant` or keep it for the final checks.
struct Rig {
    python: String,
    dir: PathBuf,
    backing: PathBuf,
    mnt: PathBuf,
    ctl: PathBuf,
    config: String,
}

impl Rig {
    fn new(dir: &Path, python: String, synchronous: &str, mqtt: Option<u16>) -> Rig {
        std::fs::create_dir_all(dir.join("agent")).unwrap();
        let backing = dir.join("disk");
        // The data directory exists before the first mount: durable from the start.
        std::fs::create_dir_all(backing.join("data")).unwrap();
        let mnt = dir.join("mnt");
        let sink = match mqtt {
            Some(port) => format!(
                "[[sink]]\ntype = \"mqtt\"\nname = \"mq\"\nurl = \"mqtt://127.0.0.1:{port}\"\n\
                 topic = \"pc/data\"\nmax_points = 200\nmax_delay = \"20ms\"\n\
                 min_backoff = \"50ms\"\nmax_backoff = \"300ms\"\nreconnect_jitter = \"0s\"\n"
            ),
            None => String::new(),
        };
        let config = format!(
            "[udp]\nenabled = false\n[storage]\ndata_dir = \"{}\"\nsynchronous = \"{synchronous}\"\n\
             {QUIET}[rollup]\nenabled = true\ninterval = \"1s\"\nfold_every = \"1s\"\n{sink}",
            mnt.join("data").display()
        );
        Rig {
            python,
            dir: dir.to_path_buf(),
            ctl: dir.join("ctl"),
            backing,
            mnt,
            config,
        }
    }

    fn mount(&self, n: usize) -> PowercutFs {
        PowercutFs::mount(
            &self.python,
            &self.backing,
            &self.mnt,
            &self.ctl,
            self.dir.join(format!("fs-{n}.log")),
        )
    }

    fn agent(&self) -> Agent {
        Agent::start(&self.dir.join("agent"), &self.config)
    }
}

/// Posts `PER_REQUEST` points a request until `stop`; ids come from `next`, each 204's ids
/// go to `acked`.
fn writer(
    agent_url: String,
    w: u64,
    t_base: i64,
    next: Arc<AtomicU64>,
    acked: Arc<Mutex<Vec<u64>>>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let ids: Vec<u64> = (0..PER_REQUEST)
            .map(|_| next.fetch_add(1, Ordering::SeqCst))
            .collect();
        let body: String = ids
            .iter()
            .map(|id| format!("pc,w={w} v={id}i {}\n", t_base + *id as i64 * 1_000_000))
            .collect();
        match post(&agent_url, body.as_bytes(), &[]) {
            Ok((204, _)) => {
                acked.lock().unwrap().extend(ids);
                std::thread::sleep(PAUSE);
            }
            Ok((503, _)) => std::thread::sleep(Duration::from_millis(20)),
            _ => break,
        }
    }
}

/// Runs `setup.cuts` cuts and restarts; returns the figures and the last agent and mount,
/// still running.
fn run_cuts(setup: &Setup, rig: &Rig) -> (Figures, Agent, PowercutFs) {
    let mut rng = Rng(setup.seed);
    let mut fig = Figures::default();
    let t_base = edgewatch::now_ns() - 20 * 60 * 1_000_000_000;
    let next = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut cycle = 0;
    loop {
        let fs = rig.mount(cycle);
        let agent = rig.agent();
        let stored = stored_ids(&agent);
        let ack: BTreeSet<u64> = acked.lock().unwrap().iter().copied().collect();
        let lost = ack.difference(&stored).count();
        let attempted = next.load(Ordering::SeqCst);
        assert!(
            stored.iter().all(|id| *id < attempted),
            "the store holds ids that were never sent"
        );
        if cycle > 0 {
            fig.lost.push(lost);
        }
        if cycle == setup.cuts {
            fig.acked = ack;
            fig.attempted = attempted;
            fig.final_stored = stored;
            return (fig, agent, fs);
        }
        // Load, then the cut at a random moment: 0 to 2.5 s after the agent answers.
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (url, next, acked, stop) = (
                    agent.url("/write?db=x"),
                    next.clone(),
                    acked.clone(),
                    stop.clone(),
                );
                std::thread::spawn(move || writer(url, w, t_base, next, acked, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.below(2_500)));
        agent.kill9();
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        let torn = setup.torn && rng.below(2) == 1;
        let request = if torn {
            fig.torn_cuts += 1;
            format!("torn {}", rng.next() >> 1)
        } else {
            "drop".to_string()
        };
        let report = fs.cut(&request);
        fig.dropped_pages += report["dropped_pages"].as_u64().unwrap();
        fig.kept_pages += report["kept_pages"].as_u64().unwrap();
        for (file, n) in report["dirty_by_file"].as_object().unwrap() {
            *fig.dirty_by_file.entry(file.clone()).or_default() += n.as_u64().unwrap();
        }
        fs.unmount();
        fig.cuts += 1;
        fig.integrity
            .push(integrity(&rig.backing.join("data"), &rig.dir.join("check")));
        cycle += 1;
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn seed() -> u64 {
    env_u64("POWERCUT_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    })
}

#[test]
fn power_cuts_lose_no_acknowledged_point_and_forwarders_resume_at_least_once() {
    if !require(Peer::Mosquitto) {
        return;
    }
    let Some(python) = require_fuse() else { return };
    let started = Instant::now();
    let setup = Setup {
        synchronous: "full",
        cuts: env_u64("POWERCUT_CUTS").map_or(30, |n| n as usize),
        sink: true,
        torn: true,
        seed: seed(),
    };
    eprintln!("powercut: seed {} (POWERCUT_SEED replays it)", setup.seed);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _broker = Mosquitto::start(&dir.path().join("mq"), port, None);
    let sub = Sub::start_subscribed(port, "pc/data", "pc-sub", &dir.path().join("sub.txt"), None);
    let rig = Rig::new(
        dir.path(),
        python,
        setup.synchronous,
        Some(port).filter(|_| setup.sink),
    );
    let (fig, agent, fs) = run_cuts(&setup, &rig);
    let seed = setup.seed;
    let bad: Vec<(usize, &String)> = fig
        .integrity
        .iter()
        .enumerate()
        .filter(|(_, r)| r.as_str() != "ok")
        .collect();
    assert!(
        bad.is_empty(),
        "seed {seed}: integrity_check after cuts: {bad:?}"
    );
    let lost: usize = fig.lost.iter().sum();
    assert_eq!(
        lost, 0,
        "seed {seed}: acknowledged points missing after each restart: {:?}",
        fig.lost
    );
    assert!(
        fig.final_stored.is_superset(&fig.acked),
        "seed {seed}: acknowledged points missing at the end"
    );

    // The receiver: everything stored arrives (at least once).
    let delivered = wait_for(Duration::from_secs(90), || {
        let msgs = parse_messages(&sub.text());
        let got: BTreeSet<u64> = msgs.iter().flat_map(|m| m.ids.iter().copied()).collect();
        let s = sink_status(&agent, "mq");
        (s["backlog_points"] == 0 && got.is_superset(&fig.final_stored)).then_some(msgs)
    });
    let msgs = delivered.unwrap_or_else(|| {
        let got: BTreeSet<u64> = parse_messages(&sub.text())
            .iter()
            .flat_map(|m| m.ids.iter().copied())
            .collect();
        panic!(
            "seed {seed}: the subscriber lacks {} of {} stored points; sink: {}\n{}",
            fig.final_stored.difference(&got).count(),
            fig.final_stored.len(),
            sink_status(&agent, "mq"),
            agent.log_text()
        )
    });
    let sink = sink_status(&agent, "mq");
    let received: Vec<u64> = msgs.iter().flat_map(|m| m.ids.iter().copied()).collect();
    let distinct: BTreeSet<u64> = received.iter().copied().collect();
    assert_eq!(
        distinct.difference(&fig.final_stored).count(),
        0,
        "seed {seed}: the subscriber got points the store does not hold (sent before they were durable)"
    );
    // Duplicates: per (seq, part), how often it came and whether every copy is the same.
    let mut copies: BTreeMap<(i64, String), Vec<&Msg>> = BTreeMap::new();
    for m in &msgs {
        copies.entry((m.seq, m.part.clone())).or_default().push(m);
    }
    let mut per_seq: BTreeMap<i64, usize> = BTreeMap::new();
    let mut differing = Vec::new();
    for ((seq, part), c) in &copies {
        let n = per_seq.entry(*seq).or_default();
        *n = (*n).max(c.len());
        if c.iter().any(|m| m.ids != c[0].ids) {
            let seen: Vec<String> = c
                .iter()
                .map(|m| format!("chunks={} {} points", m.chunks, m.ids.len()))
                .collect();
            differing.push(format!("seq={seq} part={part}: {}", seen.join(", then ")));
        }
    }
    let dup_batches: usize = per_seq.values().map(|n| n - 1).sum();
    let dup_points = received.len() - distinct.len();
    let max_seq = *per_seq.keys().last().unwrap();
    // A consumer that drops duplicates by (seq, part), as docs/forwarding.md says, keeps the first
    // copy of each.
    let deduped: BTreeSet<u64> = copies
        .values()
        .flat_map(|c| c[0].ids.iter().copied())
        .collect();
    let missed_by_dedup = fig.final_stored.difference(&deduped).count();

    // The rollup tiers count every stored point exactly once.
    let rolled = wait_for(Duration::from_secs(30), || {
        let s = agent.status();
        let tiers = s["rollup"]["tiers"].as_array()?.clone();
        tiers.iter().all(|t| t["pending_chunks"] == 0).then_some(())
    });
    assert!(
        rolled.is_some(),
        "rollup did not catch up: {}",
        agent.status()
    );
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
    fs.unmount();
    let check = rig.dir.join("check");
    assert_eq!(integrity(&rig.backing.join("data"), &check), "ok");
    let raw = points_in_file(&check.join("edgewatch.db"), "pc");
    let conn = rusqlite::Connection::open(check.join("edgewatch.db")).unwrap();
    let tier_count = |tier: i64| -> i64 {
        conn.query_row(
            "SELECT COALESCE(SUM(r.count), 0) \
             FROM (SELECT tier, series_id, count FROM rollups \
                   UNION ALL SELECT tier, series_id, count FROM rollups_recent) r \
             JOIN series s ON s.id = r.series_id \
             JOIN tagsets t ON t.id = s.tagset_id WHERE t.measurement = 'pc' AND s.field = 'v' \
             AND r.tier = ?1",
            [tier],
            |r| r.get(0),
        )
        .unwrap()
    };
    let (m1, h1) = (tier_count(60), tier_count(3600));

    let figures = format!(
        "powercut figures (seed {seed}): {} cuts ({} torn), {} points acknowledged of {} sent, \
         {lost} lost, {} stored; unsynced pages dropped {} (kept by torn cuts {}; unsynced per file {:?}); \
         integrity_check ok after every cut; receiver: {} messages, {} batches (seq 1..{max_seq}), \
         {} distinct points, {dup_batches} duplicated batches, {dup_points} duplicated points, \
         {} (seq, part) with differing copies, {missed_by_dedup} points missed by a consumer \
         dropping duplicates by (seq, part); sink replayed_batches {}; rollup 1m {m1} / 1h {h1} \
         of {raw} raw; {:.0} s",
        fig.cuts,
        fig.torn_cuts,
        fig.acked.len(),
        fig.attempted,
        fig.final_stored.len(),
        fig.dropped_pages,
        fig.kept_pages,
        fig.dirty_by_file,
        msgs.len(),
        per_seq.len(),
        distinct.len(),
        differing.len(),
        sink["replayed_batches"],
        started.elapsed().as_secs_f64()
    );
    eprintln!("{figures}");
    assert!(fig.acked.len() > 1_000, "{figures}");
    assert!(fig.dropped_pages > 0, "no cut dropped anything: {figures}");
    assert_eq!(
        per_seq.len() as i64,
        max_seq,
        "a gap in the sequence numbers: {figures}"
    );
    assert!(
        dup_batches <= fig.cuts,
        "more than one duplicated batch per cut (inflight = 1): {figures}"
    );
    assert_eq!(raw as usize, fig.final_stored.len(), "{figures}");
    assert_eq!((m1, h1), (raw, raw), "rollup counts: {figures}");
    // docs/forwarding.md: MQTT consumers "drop duplicates by seq and part". That loses nothing only
    // if a batch number always carries the same points.
    assert!(
        differing.is_empty() && missed_by_dedup == 0,
        "a batch number was reused for different points (a batch resent after a restart is \
         re-read from the cursor, not the chunk range first sent): dropping duplicates by \
         (seq, part) loses {missed_by_dedup} points: {differing:?}\n{figures}"
    );
}

#[test]
fn without_a_sync_before_the_204_power_cuts_lose_acknowledged_points() {
    // The model bites: with `synchronous = "normal"` the WAL is synced only at checkpoints,
    // so a cut drops what was acknowledged since. The store itself stays consistent.
    let Some(python) = require_fuse() else { return };
    let setup = Setup {
        synchronous: "normal",
        cuts: 4,
        sink: false,
        torn: false,
        seed: seed(),
    };
    eprintln!("powercut (normal): seed {}", setup.seed);
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::new(dir.path(), python, setup.synchronous, None);
    let (fig, agent, fs) = run_cuts(&setup, &rig);
    agent.kill9();
    fs.unmount();
    let lost: usize = fig.lost.iter().sum();
    let figures = format!(
        "powercut figures with synchronous = \"normal\" (seed {}): {} cuts, {} acknowledged, \
         lost per cut {:?} ({lost} in all), unsynced pages dropped {} ({:?}), integrity {:?}",
        setup.seed,
        fig.cuts,
        fig.acked.len(),
        fig.lost,
        fig.dropped_pages,
        fig.dirty_by_file,
        fig.integrity
    );
    eprintln!("{figures}");
    assert!(fig.integrity.iter().all(|r| r == "ok"), "{figures}");
    assert!(
        lost > 0,
        "no acknowledged point was lost without syncs: the file system does not drop unsynced data: {figures}"
    );
}
