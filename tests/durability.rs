//! "Acknowledged means durable", checked on the real agent. The order "sync, then answer" is
//! read from the agent's own system calls under `strace -f` (Debian `strace`): every HTTP 204
//! is preceded by an `fdatasync`/`fsync` of the WAL or of the ingest journal (a small write
//! is answered once its journal append is synced), and every forwarder cursor move after a
//! remote's answer syncs the WAL before the next request; with `synchronous = "normal"` the
//! ingest check is shown to fail. The other side: a commit that fails (a full or read-only
//! disk, a small tmpfs mounted here; needs root, as CI runs) is answered 503 naming the
//! cause, never 204; everything acknowledged survives kill -9; ingest, rollup and the
//! forwarders carry on by themselves once space returns.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::peers::*;
use crate::support::*;

/// Fails naming the Debian package when `strace` is missing.
fn require_strace() {
    let ok = Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        ok,
        "this test needs strace on PATH: `apt-get install strace`"
    );
}

/// The agent started under `strace -f`, writing the trace to `trace`.
struct Traced {
    strace: Child,
    http: SocketAddr,
    trace: PathBuf,
    log: PathBuf,
}

impl Traced {
    /// `sinks`: `[[sink]]` tables, last in the file.
    fn start(dir: &Path, synchronous: &str, sinks: &str) -> Traced {
        require_strace();
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let cfg = dir.join("edgewatch.toml");
        std::fs::write(
            &cfg,
            format!(
                "[http]\nlisten = \"{http}\"\n[udp]\nenabled = false\n[storage]\n\
                 data_dir = \"{}\"\nsynchronous = \"{synchronous}\"\n{QUIET}{sinks}",
                dir.join("data").display()
            ),
        )
        .unwrap();
        let trace = dir.join("trace.txt");
        let log = dir.join("agent.log");
        let strace = Command::new("strace")
            .args(["-f", "-y", "-s", "40", "-qq", "-o"])
            .arg(&trace)
            .args([
                "-e",
                "trace=fsync,fdatasync,write,writev,sendto,sendmsg,read,recvfrom,recvmsg",
            ])
            .arg(bin())
            .arg("run")
            .arg("--config")
            .arg(&cfg)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn strace");
        let t = Traced {
            strace,
            http,
            trace,
            log,
        };
        let ok = wait_for(Duration::from_secs(30), || {
            get(&format!("http://{http}/health"))
                .ok()
                .filter(|r| r.0 == 200)
        });
        assert!(
            ok.is_some(),
            "agent under strace did not become ready:\n{}",
            std::fs::read_to_string(&t.log).unwrap_or_default()
        );
        t
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// Stops the agent (SIGTERM to strace's child, strace exits after it) and returns the
    /// trace.
    fn stop(mut self) -> String {
        let pid = self.strace.id();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for child in children.split_whitespace() {
            if let Ok(c) = child.parse::<i32>() {
                signal(c, "TERM");
            }
        }
        let done = wait_for(Duration::from_secs(15), || {
            self.strace.try_wait().ok().flatten()
        });
        if done.is_none() {
            let _ = self.strace.kill();
            let _ = self.strace.wait();
        }
        std::fs::read_to_string(&self.trace).unwrap_or_default()
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        let pid = self.strace.id();
        if let Ok(children) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
            for child in children.split_whitespace() {
                if let Ok(c) = child.parse::<i32>() {
                    signal(c, "KILL");
                }
            }
        }
        let _ = self.strace.kill();
        let _ = self.strace.wait();
    }
}

/// One system call of the trace, whole (an `<unfinished ...>` line joined with its
/// `<... resumed>` line), in the order the calls completed (a sync counts once it returned)
/// or started (a socket write counts from its start).
#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// `fsync`/`fdatasync` of the WAL or the ingest journal that returned 0.
    WalSync,
    /// The agent wrote an HTTP 204 on a socket (an ingest acknowledgement).
    Sent204,
    /// The agent read a remote's 2xx answer (a forwarder's batch acknowledged).
    Read2xx,
    /// The agent wrote an HTTP request (a forwarder's batch).
    SentPost,
}

fn events(trace: &str) -> Vec<Event> {
    let mut out = Vec::new();
    for line in trace.lines() {
        let body = line
            .trim_start()
            .split_once(char::is_whitespace)
            .map_or(line, |(_, b)| b.trim_start());
        let unfinished = body.ends_with("<unfinished ...>");
        let resumed = body.starts_with("<...");
        let is_sync = body.starts_with("fsync(")
            || body.starts_with("fdatasync(")
            || body.starts_with("<... fsync resumed")
            || body.starts_with("<... fdatasync resumed");
        if is_sync {
            // Counted when it returns; the start line names the fd, the resumed line the
            // result: keep the start's fd per thread.
            continue_sync(&mut out, line, body, unfinished, resumed);
            continue;
        }
        if resumed || body.starts_with("---") {
            continue;
        }
        let write = ["write(", "writev(", "sendto(", "sendmsg("]
            .iter()
            .any(|w| body.starts_with(w));
        let read = ["read(", "recvfrom(", "recvmsg("]
            .iter()
            .any(|w| body.starts_with(w));
        if write && body.contains("\"HTTP/1.1 204") {
            out.push(Event::Sent204);
        } else if write && body.contains("\"POST /") {
            out.push(Event::SentPost);
        } else if read && body.contains("\"HTTP/1.1 2") {
            out.push(Event::Read2xx);
        }
    }
    out
}

thread_local! {
    static PENDING: std::cell::RefCell<std::collections::HashMap<String, bool>> =
        Default::default();
}

fn continue_sync(out: &mut Vec<Event>, line: &str, body: &str, unfinished: bool, resumed: bool) {
    let tid = line.split_whitespace().next().unwrap_or("").to_string();
    let wal = body.contains("-wal>") || body.contains("edgewatch.journal>");
    if unfinished {
        PENDING.with(|p| p.borrow_mut().insert(tid, wal));
        return;
    }
    let wal = if resumed {
        PENDING
            .with(|p| p.borrow_mut().remove(&tid))
            .unwrap_or(false)
    } else {
        wal
    };
    if wal && body.trim_end().ends_with("= 0") {
        out.push(Event::WalSync);
    }
}

/// (204s sent, 204s with no WAL or journal sync since the previous one).
fn unsynced_acks(ev: &[Event]) -> (usize, usize) {
    let (mut acks, mut bad, mut synced) = (0, 0, false);
    for e in ev {
        match e {
            Event::WalSync => synced = true,
            Event::Sent204 => {
                acks += 1;
                if !synced {
                    bad += 1;
                }
                synced = false;
            }
            _ => {}
        }
    }
    (acks, bad)
}

/// Starts the agent under strace with `synchronous`, sends single-point writes one after
/// another, and checks the trace.
fn ingest_trace(synchronous: &str) -> (usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let agent = Traced::start(dir.path(), synchronous, "");
    let url = agent.url("/write?db=x");
    for i in 0..40 {
        let (code, body) = post(&url, format!("st,k=v v={i}i\n").as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{body}");
    }
    let trace = agent.stop();
    unsynced_acks(&events(&trace))
}

#[test]
fn every_204_follows_a_wal_sync_with_full_and_not_with_normal() {
    let (acks, bad) = ingest_trace("full");
    assert!(acks >= 40, "204s seen in the trace: {acks}");
    assert_eq!(
        bad, 0,
        "{bad} of {acks} 204s were sent before the WAL was synced"
    );
    // The check can fail: with the opt-in `normal` the WAL is not synced before answering.
    let (acks, bad) = ingest_trace("normal");
    assert!(acks >= 40, "204s seen in the trace: {acks}");
    assert!(
        bad >= acks / 2,
        "normal: only {bad} of {acks} 204s unsynced; the trace check cannot tell the modes apart"
    );
}

/// SQLite's syncs of its files are `fdatasync`, not `fsync`: the bundled SQLite is built
/// with `HAVE_FDATASYNC` (`.cargo/config.toml`), without which it calls `fsync`, which also
/// writes the inode for every mtime change (an ext4 journal commit after each sync).
#[test]
fn sqlite_syncs_its_files_with_fdatasync() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Traced::start(dir.path(), "full", "");
    for i in 0..5 {
        let (code, body) = post(
            &agent.url("/write?db=x"),
            format!("st,k=v v={i}i\n").as_bytes(),
            &[],
        )
        .unwrap();
        assert_eq!(code, 204, "{body}");
    }
    // A read commits what the writer holds first: a synced WAL commit.
    let (code, body) = get(&agent.url("/api/v1/query?measurement=st&field=v")).unwrap();
    assert_eq!(code, 200, "{body}");
    let trace = agent.stop();
    let syncs_of = |call: &str| {
        trace
            .lines()
            .filter(|l| {
                l.split_once(char::is_whitespace).is_some_and(|(_, b)| {
                    b.trim_start().starts_with(&format!("{call}("))
                        && (b.contains("edgewatch.db>") || b.contains("edgewatch.db-wal>"))
                })
            })
            .count()
    };
    assert!(
        syncs_of("fdatasync") >= 1,
        "no fdatasync of the database or its WAL in the trace:\n{trace}"
    );
    assert_eq!(
        syncs_of("fsync"),
        0,
        "SQLite synced with fsync (is LIBSQLITE3_FLAGS=-DHAVE_FDATASYNC=1 set?)"
    );
}

#[test]
fn the_default_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    assert_eq!(agent.status()["store"]["synchronous"], "full");
    let (code, text) = get(&agent.url("/metrics")).unwrap();
    assert_eq!(code, 200);
    assert!(
        text.contains("\nedgewatch_store_synchronous_full 1\n"),
        "{text}"
    );
}

#[test]
fn a_forwarder_syncs_its_cursor_after_each_remote_answer_before_the_next_request() {
    if !require(Peer::Influxdb) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Ingest first, with the remote down: the forward phase then has no ingest syncs in it.
    // Each write committed at once (no held points): a backlog of 30 one-point chunks, which
    // the sink sends in batches of 5.
    let sink = format!(
        "[ingest]\nflush_interval = \"0s\"\n[[sink]]\ntype = \"influxdb\"\nname = \"i\"\nurl = \"http://127.0.0.1:{port}\"\n\
         version = 1\ndatabase = \"edge\"\nmax_points = 5\nmax_delay = \"20ms\"\n\
         min_backoff = \"50ms\"\nmax_backoff = \"200ms\"\ngzip = false\n"
    );
    let agent = Traced::start(dir.path(), "full", &sink);
    let url = agent.url("/write?db=x");
    let t0 = edgewatch::now_ns() - 60_000_000_000;
    for i in 0..30 {
        let line = format!("fw,k=v v={i}i {}\n", t0 + i);
        let (code, body) = post(&url, line.as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{body}");
    }
    let mark = std::fs::metadata(&agent.trace).map_or(0, |m| m.len());
    let influx = influxd_on(&dir.path().join("influx"), port);
    influx_create_db(&influx, "edge");
    let done = wait_for(Duration::from_secs(20), || {
        (influx_count(&influx, "edge", "fw") == 30).then_some(())
    });
    assert!(done.is_some(), "the backlog did not arrive");
    std::thread::sleep(Duration::from_millis(300));
    let trace = agent.stop();
    let tail = &trace[(mark as usize).min(trace.len())..];
    let ev = events(tail);
    let answers = ev.iter().filter(|e| **e == Event::Read2xx).count();
    assert!(answers >= 6, "remote answers seen: {answers}");
    // After each answer, a WAL sync (the cursor move) before the next request.
    let mut waiting = false;
    for (i, e) in ev.iter().enumerate() {
        match e {
            Event::Read2xx => waiting = true,
            Event::WalSync => waiting = false,
            Event::SentPost => assert!(
                !waiting,
                "event {i}: a request was sent before the previous answer's cursor move was synced: {ev:?}"
            ),
            Event::Sent204 => {}
        }
    }
    assert!(!waiting, "the last answer's cursor move was never synced");
}

/// A sink that has sent everything leaves its bookkeeping to the writer: each commit of new
/// points carries the sink's held acknowledgement and marks those points in flight, synced
/// with the points, so the sink's thread sends batch after batch without a WAL sync of its
/// own (its own commit, one a batch, was more than half of the store's commits), and every
/// point still arrives. The thread is found by its name (`fwd-<sink>`). Without the carrying,
/// the sink syncs once a batch (4 of 4: checked).
#[test]
fn a_caught_up_sinks_batches_are_marked_by_the_writers_synced_commit_not_its_own() {
    if !require(Peer::Influxdb) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let influx = influxd_on(&dir.path().join("influx"), port);
    influx_create_db(&influx, "edge");
    let sink = format!(
        "[ingest]\nflush_interval = \"1s\"\n[[sink]]\ntype = \"influxdb\"\nname = \"i\"\nurl = \"http://127.0.0.1:{port}\"\n\
         version = 1\ndatabase = \"edge\"\nmax_delay = \"20ms\"\ngzip = false\n"
    );
    let agent = Traced::start(dir.path(), "full", &sink);
    let url = agent.url("/write?db=x");
    let write = |i: i64| {
        let line = format!("fw,k=v v={i}i {}\n", edgewatch::now_ns());
        let (code, body) = post(&url, line.as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{body}");
    };
    write(0);
    let first = wait_for(Duration::from_secs(20), || {
        (influx_count(&influx, "edge", "fw") == 1).then_some(())
    });
    assert!(first.is_some(), "the first point did not arrive");
    let pid = agent.strace.id();
    let agent_pid = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let sink_tid = std::fs::read_dir(format!("/proc/{agent_pid}/task"))
        .unwrap()
        .flatten()
        .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "fwd-i"))
        .map(|t| t.file_name().to_string_lossy().into_owned())
        .expect("the sink's thread, fwd-i");
    std::thread::sleep(Duration::from_millis(500));
    let from = std::fs::metadata(&agent.trace).map_or(0, |m| m.len());
    for i in 1..=12 {
        write(i);
        std::thread::sleep(Duration::from_millis(400));
    }
    let all = wait_for(Duration::from_secs(20), || {
        (influx_count(&influx, "edge", "fw") == 13).then_some(())
    });
    assert!(all.is_some(), "not every point arrived");
    std::thread::sleep(Duration::from_millis(300));
    let to = std::fs::metadata(&agent.trace).map_or(0, |m| m.len());
    let trace = agent.stop();
    let window = &trace[(from as usize).min(trace.len())..(to as usize).min(trace.len())];
    let of_sink: Vec<&str> = window
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(sink_tid.as_str()))
        .collect();
    let posts = of_sink.iter().filter(|l| l.contains("POST /write")).count();
    let syncs: Vec<&&str> = of_sink
        .iter()
        .filter(|l| l.contains("fdatasync(") || l.contains("fsync("))
        .collect();
    let writer_syncs = window
        .lines()
        .filter(|l| l.contains("sync(") && l.contains("-wal>"))
        .count();
    assert!(posts >= 3, "batches sent in the window: {posts}");
    assert!(writer_syncs >= 3, "WAL syncs in the window: {writer_syncs}");
    // One miss is allowed: a commit that lands while the sink is busy with its own state
    // (reading its row, between an answer and its next offer) is not carried, and the sink
    // marks that batch itself, as it did every batch before.
    assert!(
        syncs.len() <= 1,
        "the sink synced the WAL itself ({} times for {posts} batches): {syncs:?}",
        syncs.len()
    );
}

/// A tmpfs of `size` mounted on a temp dir, unmounted (lazily) when dropped, even when the
/// test fails.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount(8)");
        assert!(
            st.success(),
            "mounting a tmpfs needs root (CI runs as root): {st}"
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount(&self, opts: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,{opts}")])
            .arg(self.dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "remount {opts}: {st}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// An agent config storing in `data`, rolling up every second and forwarding (quick
/// retries) to the InfluxDB on `port`, database `edge`.
fn rollup_and_influx_sink(data: &Path, port: u16) -> String {
    format!(
        "{QUIET}[rollup]\nenabled = true\ninterval = \"1s\"\nfold_every = \"1s\"\n[storage]\ndata_dir = \"{}\"\n\
         [[sink]]\ntype = \"influxdb\"\nname = \"i\"\nurl = \"http://127.0.0.1:{port}\"\n\
         version = 1\ndatabase = \"edge\"\nmax_delay = \"20ms\"\nmin_backoff = \"50ms\"\n\
         max_backoff = \"200ms\"\n",
        data.display(),
    )
}

/// Posts a request of `n` points tagged `req=<id>`; the status code and body.
fn post_req(agent: &Agent, id: usize, n: usize) -> (u16, String) {
    let base = edgewatch::now_ns() - 60_000_000_000;
    let body: String = (0..n)
        .map(|j| {
            format!(
                "df,req={id} v={j}i,pad=\"{:0>40}\" {}\n",
                j,
                base + j as i64
            )
        })
        .collect();
    post(&agent.url("/write?db=x"), body.as_bytes(), &[]).unwrap_or((0, "no answer".into()))
}

/// Points stored per request id, read from the database file.
fn stored(db: &Path) -> std::collections::HashMap<usize, i64> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let mut st = conn
        .prepare(
            "SELECT t.key, SUM(c.n) FROM chunks c JOIN tagsets t ON t.id = c.tagset_id \
             WHERE t.measurement = 'df' GROUP BY t.key",
        )
        .unwrap();
    st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .filter_map(|(k, n)| Some((k.strip_prefix("df,req=")?.parse().ok()?, n)))
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn a_full_disk_is_answered_503_never_204_and_nothing_acknowledged_is_lost() {
    if !require(Peer::Influxdb) {
        return;
    }
    let fs = Tmpfs::mount("3m");
    let dir = tempfile::tempdir().unwrap();
    // A real remote: the forwarder moves its cursor while the disk fills, and must deliver
    // every acknowledged point once space returns.
    let port = free_port();
    let influx = influxd_on(&dir.path().join("influx"), port);
    influx_create_db(&influx, "edge");
    let extra = rollup_and_influx_sink(&fs.path().join("data"), port);
    let mut agent = Agent::start(dir.path(), &extra);
    let mut acked: Vec<usize> = Vec::new();
    let mut full_answer = None;
    for id in 0..400 {
        let (code, body) = post_req(&agent, id, 500);
        match code {
            204 => acked.push(id),
            _ => {
                full_answer = Some((code, body));
                break;
            }
        }
    }
    let (code, body) = full_answer.expect("the 3 MB tmpfs never filled");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("full"),
        "the answer names the full disk: {body}"
    );
    assert!(body.contains("Retry-After"), "{body}");
    assert!(
        acked.len() >= 2,
        "acknowledged before the disk filled: {}",
        acked.len()
    );
    // Still full: still refused, the agent (writer, rollup, forwarder) still up.
    std::thread::sleep(Duration::from_millis(1500));
    let (code, body) = post_req(&agent, 10_000, 500);
    assert_eq!(code, 503, "{body}");
    let s = agent.status();
    assert!(s["ingest"]["commit_errors"].as_u64().unwrap() >= 2, "{s}");
    // Space returns: ingest recovers by itself.
    fs.remount("size=64m");
    let ok = wait_for(Duration::from_secs(10), || {
        let (code, _) = post_req(&agent, 20_000, 500);
        (code == 204).then_some(())
    });
    assert!(ok.is_some(), "ingest did not recover once space returned");
    acked.push(20_000);
    for id in 20_001..20_004 {
        let (code, body) = post_req(&agent, id, 500);
        assert_eq!(code, 204, "{body}");
        acked.push(id);
    }
    // The rollup job goes on (its cursor moves past the new chunks).
    let rolled = wait_for(Duration::from_secs(10), || {
        let s = agent.status();
        let t = &s["rollup"]["tiers"][0];
        (t["pending_chunks"].as_u64() == Some(0)).then_some(())
    });
    assert!(
        rolled.is_some(),
        "rollup did not resume: {}",
        agent.status()
    );
    assert!(
        agent.child.try_wait().ok().flatten().is_none(),
        "the agent died"
    );
    let log = agent.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("rollup run failed") && l.contains("full")),
        "the rollup job met the full disk: {log}"
    );
    // The forwarder delivers every acknowledged point (and nothing refused).
    let want = acked.len() as i64 * 500;
    let delivered = wait_for(Duration::from_secs(15), || {
        (influx_count(&influx, "edge", "df") == want).then_some(())
    });
    assert!(
        delivered.is_some(),
        "influx holds {} of {want} acknowledged points",
        influx_count(&influx, "edge", "df")
    );
    // kill -9, then the store, copied off the tmpfs, holds every acknowledged point.
    agent.kill9();
    let copy = dir.path().join("copy");
    copy_dir(&fs.path().join("data"), &copy);
    replay_journal(&copy);
    let got = stored(&copy.join("edgewatch.db"));
    for id in &acked {
        assert_eq!(got.get(id), Some(&500), "acknowledged request {id}");
    }
    // Refused requests were not stored (answered 503 = nothing of them).
    assert_eq!(got.get(&10_000), None);
}

#[test]
fn a_read_only_store_is_refused_naming_it_and_used_again_once_writable() {
    // A running agent holds its files open for writing, so a mount cannot be made read-only
    // under it (EBUSY); the kernel does so after IO errors, and the agent then restarts on
    // it. Its start names the cause; once writable again everything acknowledged is there.
    let fs = Tmpfs::mount("16m");
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "{QUIET}[storage]\ndata_dir = \"{}\"\n",
        fs.path().join("data").display()
    );
    let agent = Agent::start(dir.path(), &extra);
    let (code, body) = post_req(&agent, 1, 10);
    assert_eq!(code, 204, "{body}");
    agent.kill9();
    fs.remount("ro");
    let cfg = dir.path().join("edgewatch.toml");
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("Read-only file system"), "{err}");
    fs.remount("rw");
    let agent = Agent::start(dir.path(), &extra);
    let (code, body) = post_req(&agent, 2, 10);
    assert_eq!(code, 204, "{body}");
    agent.kill9();
    // The journal's records are stored by the next writer: here `edgewatch maintain`.
    replay_journal(&fs.path().join("data"));
    let got = stored(&fs.path().join("data/edgewatch.db"));
    assert_eq!((got.get(&1), got.get(&2)), (Some(&10), Some(&10)));
}

/// An ext4 file system in an image file, loop-mounted with `errors=remount-ro` on a temp dir,
/// so the kernel can turn it read-only under a running agent the way it does after an IO
/// error (`trigger_fs_error`). Needs root and a loop device (CI runs as root); unmounted
/// (lazily) when dropped.
struct Ext4 {
    /// Holds the image and the mount point; removed (after the unmount) when dropped.
    _dir: tempfile::TempDir,
    image: PathBuf,
    mnt: PathBuf,
}

impl Ext4 {
    fn mount(size_mb: u64) -> Ext4 {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size_mb << 20)
            .unwrap();
        let st = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image)
            .status()
            .expect("mkfs.ext4 (Debian e2fsprogs)");
        assert!(st.success(), "mkfs.ext4: {st}");
        let fs = Ext4 {
            _dir: dir,
            image,
            mnt,
        };
        fs.attach();
        fs
    }

    fn attach(&self) {
        let st = Command::new("mount")
            .args(["-o", "loop,errors=remount-ro"])
            .arg(&self.image)
            .arg(&self.mnt)
            .status()
            .expect("mount(8)");
        assert!(
            st.success(),
            "loop-mounting an ext4 image needs root and a loop device (CI runs as root): {st}"
        );
    }

    fn path(&self) -> &Path {
        &self.mnt
    }

    /// Makes the kernel record a file-system error: with `errors=remount-ro` the file system
    /// turns read-only at once, under every open file (as after a failing eMMC block).
    fn fail(&self) {
        let out = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(&self.mnt)
            .output()
            .unwrap();
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let name = Path::new(&dev).file_name().unwrap().to_owned();
        let knob = Path::new("/sys/fs/ext4")
            .join(name)
            .join("trigger_fs_error");
        std::fs::write(&knob, "1").unwrap_or_else(|e| panic!("{}: {e}", knob.display()));
        let opts = Command::new("findmnt")
            .args(["-n", "-o", "OPTIONS"])
            .arg(&self.mnt)
            .output()
            .unwrap();
        let opts = String::from_utf8_lossy(&opts.stdout).to_string();
        assert!(
            opts.contains("emergency_ro") || opts.starts_with("ro"),
            "{opts}"
        );
    }

    /// What an operator does after such an error: unmount, `e2fsck -fy`, mount again.
    fn repair(&self) {
        let st = Command::new("umount").arg(&self.mnt).status().unwrap();
        assert!(st.success(), "umount: {st}");
        let st = Command::new("e2fsck")
            .args(["-f", "-y"])
            .arg(&self.image)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        // 0: clean, 1: errors corrected.
        assert!(matches!(st.code(), Some(0 | 1)), "e2fsck: {st}");
        self.attach();
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

#[test]
fn a_store_turning_read_only_under_the_agent_is_answered_503_and_loses_nothing() {
    if !require(Peer::Influxdb) {
        return;
    }
    let fs = Ext4::mount(64);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let influx = influxd_on(&dir.path().join("influx"), port);
    influx_create_db(&influx, "edge");
    let extra = rollup_and_influx_sink(&fs.path().join("data"), port);
    let agent = Agent::start(dir.path(), &extra);
    let mut acked: Vec<usize> = Vec::new();
    for id in 0..20 {
        let (code, body) = post_req(&agent, id, 200);
        assert_eq!(code, 204, "{body}");
        acked.push(id);
    }
    // The file system turns read-only under the running agent.
    fs.fail();
    let (code, body) = post_req(&agent, 10_000, 200);
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("read-only"),
        "the answer names the cause: {body}"
    );
    assert!(body.contains("Retry-After"), "{body}");
    // Still read-only a while later: still refused; writer, rollup and forwarder still up.
    std::thread::sleep(Duration::from_millis(1500));
    let (code, body) = post_req(&agent, 10_001, 200);
    assert_eq!(code, 503, "{body}");
    let s = agent.status();
    assert!(s["ingest"]["commit_errors"].as_u64().unwrap() >= 2, "{s}");
    let mut agent = agent;
    assert!(
        agent.child.try_wait().ok().flatten().is_none(),
        "the agent died on a read-only store"
    );
    let log = agent.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("commit failed") && l.contains("read-only")),
        "the writer names the read-only store: {log}"
    );
    // kill -9; the operator repairs the file system; a new agent finds every acknowledged
    // point, takes writes again and forwards everything acknowledged.
    agent.kill9();
    fs.repair();
    // The new agent stores what the journal holds before it answers anything.
    let agent = Agent::start(dir.path(), &extra);
    let got = stored(&fs.path().join("data/edgewatch.db"));
    for id in &acked {
        assert_eq!(got.get(id), Some(&200), "acknowledged request {id}");
    }
    assert_eq!(got.get(&10_000), None, "a refused request was stored");
    let (code, body) = post_req(&agent, 20_000, 200);
    assert_eq!(code, 204, "{body}");
    acked.push(20_000);
    let want = acked.len() as i64 * 200;
    // The last write waits up to `flush_interval` (15 s) for its commit, then the sink's
    // next batch.
    let delivered = wait_for(Duration::from_secs(45), || {
        (influx_count(&influx, "edge", "df") == want).then_some(())
    });
    assert!(
        delivered.is_some(),
        "influx holds {} of {want} acknowledged points",
        influx_count(&influx, "edge", "df")
    );
    agent.kill9();
}

/// `write_bytes` of `/proc/PID/io`: what the process caused to be written to storage.
/// Read here on its own, not with the agent's parser, so that a fault in that parser shows.
fn proc_write_bytes(pid: i32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("read /proc/PID/io");
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("write_bytes in /proc/PID/io")
}

/// The agent's reported count over `/proc/PID/io` read around it: (reported, the bounds of
/// what the process had written before the agent's count started).
fn reported_with_base(agent: &Agent) -> (u64, u64, u64) {
    let lo = proc_write_bytes(agent.pid());
    let st = agent.status();
    let hi = proc_write_bytes(agent.pid());
    let reported = st["disk_written_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no disk_written_bytes in {st}"));
    assert!(reported <= hi, "reported {reported} over the kernel's {hi}");
    (reported, lo.saturating_sub(reported), hi - reported)
}

/// The agent reports what it costs the device's flash, so an operator sees the wear of
/// their own workload: `/api/v1/status` `disk_written_bytes` and `/metrics`
/// `edgewatch_disk_written_bytes_total` follow the kernel's count for the agent's process
/// (`/proc/PID/io` `write_bytes`, read around them here) from the agent's start, and
/// acknowledged writes move them (each a journal append synced before its 204, and the new
/// series' dictionary commit). Each append is one padded record written with direct IO:
/// `ingest.journal_bytes` is a whole number of direct-IO blocks per append, under the 4 KiB
/// page an append through the page cache costs. The store is on this repository's disk
/// (`CARGO_TARGET_TMPDIR`), not a tmpfs, which counts no writes and takes no direct IO.
#[test]
fn the_agent_reports_the_bytes_it_has_caused_to_be_written() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let agent = Agent::start(
        dir.path(),
        "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n",
    );
    let (before, base_lo, base_hi) = reported_with_base(&agent);
    // Started directly, the process wrote next to nothing before the agent's count began.
    assert!(base_lo < 1 << 20, "{base_lo} bytes before the start");
    for i in 0..3 {
        let (code, body) = post(&agent.url("/write"), format!("m v={i}").as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{body}");
    }
    let (after, lo2, hi2) = reported_with_base(&agent);
    assert!(
        after >= before + 4096,
        "three acknowledged writes moved disk_written_bytes from {before} to {after}"
    );
    let ingest = &agent.status()["ingest"];
    let (appends, journal) = (
        ingest["journal_appends"].as_u64().unwrap(),
        ingest["journal_bytes"].as_u64().unwrap(),
    );
    assert_eq!(appends, 3, "{ingest}");
    assert!(
        journal % appends == 0 && (journal / appends).is_power_of_two() && journal / appends < 4096,
        "3 journal appends cost {journal} bytes: not direct writes of one block each ({ingest})"
    );
    // One base for both readings: the count is the kernel's, less a fixed start.
    assert!(
        lo2 <= base_hi && base_lo <= hi2,
        "[{base_lo}, {base_hi}] then [{lo2}, {hi2}]"
    );
    let lo = proc_write_bytes(agent.pid());
    let (code, metrics) = get(&agent.url("/metrics")).unwrap();
    let hi = proc_write_bytes(agent.pid());
    assert_eq!(code, 200);
    let exported: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("edgewatch_disk_written_bytes_total "))
        .unwrap_or_else(|| panic!("no edgewatch_disk_written_bytes_total in {metrics}"))
        .parse()
        .unwrap();
    assert!(
        exported + base_hi >= lo && exported + base_lo <= hi,
        "/metrics says {exported}, /proc said {lo} before and {hi} after, base [{base_lo}, {base_hi}]"
    );
    promtool_check(&metrics);
    assert_eq!(stored_points(&agent, "measurement=m").len(), 3);
}

/// What ran in the process before it became the agent is not the agent's: a wrapper that
/// writes 8 MiB (synced) and then `exec`s the agent, as `cargo run` does after its build,
/// leaves those bytes in the kernel's count for the process, and the agent's own count
/// starts after them.
#[test]
fn writes_made_before_the_agent_started_in_its_process_are_not_reported() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let http = free_port();
    let cfg = dir.path().join("edgewatch.toml");
    std::fs::write(
        &cfg,
        format!(
            "[http]\nlisten = \"127.0.0.1:{http}\"\n[udp]\nenabled = false\n[storage]\n\
             data_dir = \"{}\"\n[health]\nenabled = false\n[kmsg]\nenabled = false\n\
             [host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let filler = dir.path().join("filler");
    let script = format!(
        "dd if=/dev/zero of='{}' bs=1M count=8 conv=fsync status=none && exec '{}' run --config '{}'",
        filler.display(),
        bin().display(),
        cfg.display()
    );
    let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{http}");
    let up = wait_for(Duration::from_secs(30), || {
        get(&format!("{url}/health")).ok().filter(|r| r.0 == 200)
    });
    let log_text = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    assert!(up.is_some(), "the agent did not start: {}", log_text());
    let pid = child.id() as i32;
    let kernel = proc_write_bytes(pid);
    let (_, body) = get(&format!("{url}/api/v1/status")).unwrap();
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    let reported = st["disk_written_bytes"]
        .as_u64()
        .expect("disk_written_bytes");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        kernel >= 8 << 20,
        "the wrapper's 8 MiB are in the process's count: {kernel}"
    );
    assert!(
        reported < 4 << 20,
        "the agent reported {reported} bytes, the wrapper's included (kernel: {kernel})"
    );
}
