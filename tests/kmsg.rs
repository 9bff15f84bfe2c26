//! The `[kmsg]` collector against the real kernel log. Lines are injected by writing to
//! `/dev/kmsg` (root only; the kernel records them with the user facility, and rate-limits
//! each open file to 10 lines per 5 s, so a writer opens it again every 10 lines). Every
//! agent reads the whole ring, lines of earlier runs included, so each test marks its lines
//! with a unique tag and looks only at those. The tests here run one at a time (a lock):
//! the alert tests need to know which kernel events are in their window. Agents of other
//! modules keep `[kmsg]` off (tests/support), so these lines never reach them.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{get, stored_points, wait_for, Agent};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// A tag no other run has used.
fn marker() -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("ewt{}x{ns}", std::process::id())
}

/// Writes each line to the kernel log (a new open every 10 lines: the kernel's per-open
/// rate limit).
fn inject(lines: &[String]) {
    for chunk in lines.chunks(10) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .expect("open /dev/kmsg for writing (the tests run as root)");
        for l in chunk {
            f.write_all(format!("{l}\n").as_bytes()).expect("write");
        }
    }
}

const KMSG_ON: &str = "[kmsg]\nenabled = true\noom_check_interval = \"1s\"\n";

/// The stored kernel events of `kind`: one map per point (fields, plus `ts` and the tags).
fn events(agent: &Agent, kind: &str) -> Vec<BTreeMap<String, Value>> {
    let pts = stored_points(
        agent,
        &format!("measurement=edgewatch_event&tag.kind={kind}&tag.source=kernel"),
    );
    let mut by: BTreeMap<(String, i64), BTreeMap<String, Value>> = BTreeMap::new();
    for (tags, field, ts, v) in pts {
        let e = by.entry((tags.clone(), ts)).or_default();
        e.insert(field, v);
        e.insert("ts".into(), Value::from(ts));
        for t in tags.split(',') {
            if let Some((k, v)) = t.split_once('=') {
                e.insert(format!("tag.{k}"), Value::from(v));
            }
        }
    }
    by.into_values().collect()
}

/// The events of `kind` whose message, detail or name holds `mark`.
fn marked(agent: &Agent, kind: &str, mark: &str) -> Vec<BTreeMap<String, Value>> {
    events(agent, kind)
        .into_iter()
        .filter(|e| {
            ["message", "detail", "name", "zone"].iter().any(|k| {
                e.get(*k)
                    .and_then(Value::as_str)
                    .is_some_and(|s| s.contains(mark))
            })
        })
        .collect()
}

fn wait_marked(agent: &Agent, kind: &str, mark: &str, n: usize) -> Vec<BTreeMap<String, Value>> {
    wait_for(Duration::from_secs(15), || {
        let e = marked(agent, kind, mark);
        (e.len() >= n).then_some(e)
    })
    .unwrap_or_else(|| {
        panic!(
            "no {kind} event marked {mark}: {:?}\n{}\n{}",
            events(agent, kind),
            agent.status()["collectors"]["kmsg"],
            agent.log_text()
        )
    })
}

fn kmsg_status(agent: &Agent) -> Value {
    agent.status()["collectors"]["kmsg"].clone()
}

fn alerts(agent: &Agent) -> Vec<Value> {
    let (code, body) = get(&agent.url("/api/v1/alerts")).expect("alerts");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["alerts"]
        .as_array()
        .unwrap()
        .clone()
}

fn firing(agent: &Agent, rule: &str, labels: &[(&str, &str)]) -> Option<Value> {
    alerts(agent).into_iter().find(|a| {
        a["name"] == rule
            && a["state"] == "firing"
            && labels.iter().all(|(k, v)| a["labels"][*k] == *v)
    })
}

const KERNEL_RULES: [&str; 4] = [
    "GpuXidError",
    "OomKill",
    "KernelThermalTrip",
    "KernelOverCurrent",
];

use edgewatch::now_ns;

/// Every kind, in the exact formats of the drivers and the kernel, with its details; each
/// kernel built-in fires on its event (the Xid one at the event's severity) and resolves
/// once the event has left the window.
#[test]
fn each_kind_becomes_an_event_and_fires_its_alert() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &format!("{KMSG_ON}[alerts]\ninterval = \"1s\"\nkernel_event_window = \"6s\"\n"),
    );
    let m = marker();
    let zone = format!("thermal_zone{}", &m[3..].replace('x', ""));
    let before = now_ns();
    inject(&[
        format!("NVRM: Xid (PCI:0000:01:00): 79, pid=4242, name={m}, GPU has fallen off the bus."),
        format!("NVRM: Xid (PCI:0000:01:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception {m}"),
        format!("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus. {m}"),
        format!("nvgpu: 17000000.ga10b  gk20a_fifo_handle_mmu_fault:1720 [ERR]  mmu fault {m}"),
        format!("soctherm: OC ALARM 0x00000001 {m}"),
        format!("{zone}: critical temperature reached (105 C), shutting down"),
        format!("CPU0: Core temperature above threshold, cpu clock throttled (total events = 1) {m}"),
        format!("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/{m},task_memcg=/{m},task={m},pid=31337,uid=0"),
        format!("Memory cgroup out of memory: Killed process 31337 ({m}) total-vm:268820kB, anon-rss:262272kB, file-rss:1024kB, shmem-rss:0kB, UID:0 pgtables:568kB oom_score_adj:0"),
    ]);
    let xid = wait_marked(&agent, "xid", &m, 2);
    let fatal = xid.iter().find(|e| e["code"] == 79).expect("xid 79");
    assert_eq!(fatal["tag.severity"], "critical");
    assert_eq!(fatal["pid"], 4242);
    assert_eq!(fatal["pci"], "0000:01:00");
    assert_eq!(fatal["fatal"], true);
    let ts = fatal["ts"].as_i64().unwrap();
    assert!(
        ts > before - 2_000_000_000 && ts <= now_ns(),
        "stamped when logged: {ts} vs {before}"
    );
    let app = xid.iter().find(|e| e["code"] == 13).expect("xid 13");
    assert_eq!(app["tag.severity"], "warning");
    assert!(app.get("pid").is_none(), "{app:?}");

    let bus = wait_marked(&agent, "gpu_fell_off_bus", &m, 1);
    assert_eq!(bus[0]["pci"], "0000:01:00.0");
    assert_eq!(bus[0]["tag.severity"], "critical");
    let mmu = wait_marked(&agent, "nvgpu_mmu_fault", &m, 1);
    assert_eq!(mmu[0]["device"], "17000000.ga10b");
    let oc = wait_marked(&agent, "overcurrent", &m, 1);
    assert_eq!(oc[0]["alarm"], "0x00000001");
    assert_eq!(oc[0]["tag.severity"], "warning");
    let trip = wait_marked(&agent, "thermal_trip", &zone, 1);
    assert_eq!(trip[0]["temp_c"], 105.0);
    assert_eq!(trip[0]["tag.severity"], "critical");
    let thr = wait_marked(&agent, "thermal_throttle", &m, 1);
    assert_eq!(thr[0]["zone"], "CPU0 core");
    let oom = wait_marked(&agent, "oom_kill", &m, 1);
    assert_eq!(oom[0]["pid"], 31337);
    assert_eq!(oom[0]["cgroup"], format!("/{m}"));
    assert_eq!(oom[0]["anon_rss_kb"], 262272);

    let st = kmsg_status(&agent);
    assert_eq!(st["state"], "running", "{st}");
    assert!(st["events"].as_u64().unwrap() >= 9, "{st}");
    assert!(st["last_seq"].as_u64().is_some(), "{st}");

    // The alerts: each fires, the Xid one once per severity.
    let wait_firing = |rule: &str, labels: &[(&str, &str)]| {
        wait_for(Duration::from_secs(15), || firing(&agent, rule, labels))
            .unwrap_or_else(|| panic!("{rule} {labels:?} not firing: {:?}", alerts(&agent)))
    };
    wait_firing("GpuXidError", &[("severity", "critical")]);
    wait_firing("GpuXidError", &[("severity", "warning")]);
    wait_firing("OomKill", &[("severity", "critical")]);
    wait_firing("KernelThermalTrip", &[]);
    wait_firing("KernelOverCurrent", &[]);
    // ... and resolves once the events are older than the 6 s window.
    let quiet = wait_for(Duration::from_secs(30), || {
        KERNEL_RULES
            .iter()
            .all(|r| firing(&agent, r, &[]).is_none())
            .then_some(())
    });
    assert!(quiet.is_some(), "still firing: {:?}", alerts(&agent));
}

/// A machine whose kernel log holds nothing of the kinds watched in the window: the kernel
/// built-ins stay quiet, though the collector read the ring.
#[test]
fn kernel_builtins_stay_quiet_on_an_ordinary_machine() {
    let _one = serial();
    // Lines injected by the tests before this one are older than the window after this.
    std::thread::sleep(Duration::from_secs(4));
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &format!("{KMSG_ON}[alerts]\ninterval = \"1s\"\nkernel_event_window = \"3s\"\n"),
    );
    agent.wait_evaluations(3, "evaluations");
    let st = kmsg_status(&agent);
    assert!(st["records"].as_u64().unwrap() > 0, "{st}");
    for r in KERNEL_RULES {
        assert!(
            firing(&agent, r, &[]).is_none(),
            "{r}: {:?}",
            alerts(&agent)
        );
    }
}

/// A restart resumes after the last record handled: the old Xid is not reported again (the
/// new run submits only the new one). Without the cursor file, it would be (the control).
#[test]
fn a_restart_does_not_report_old_events_again() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let m1 = marker();
    let first = Agent::start(dir.path(), KMSG_ON);
    inject(&[format!(
        "NVRM: Xid (PCI:0000:01:00): 13, pid=1, name={m1}, Graphics Exception"
    )]);
    wait_marked(&first, "xid", &m1, 1);
    let (code, _) = first.terminate();
    assert_eq!(code, Some(0));
    let cursor = dir.path().join("data/kmsg.cursor");
    let text = std::fs::read_to_string(&cursor).expect("cursor stored at shutdown");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert!(text.starts_with(boot.trim()), "{text}");

    let second = Agent::start(dir.path(), KMSG_ON);
    let m2 = marker();
    inject(&[format!(
        "NVRM: Xid (PCI:0000:01:00): 13, pid=2, name={m2}, Graphics Exception"
    )]);
    wait_marked(&second, "xid", &m2, 1);
    let st = kmsg_status(&second);
    assert!(st["resumed_after_seq"].as_u64().is_some(), "{st}");
    assert!(st["skipped"].as_u64().unwrap() > 0, "{st}");
    // Only the new Xid was submitted by this run (the ring holds the old one too).
    let xid_here = marked(&second, "xid", &m1).len() + marked(&second, "xid", &m2).len();
    assert_eq!(xid_here, 2, "one point each");
    assert_eq!(st["events"], 1, "the old event was submitted again: {st}");
    second.terminate();

    // Control: without the cursor the whole ring is read and the old Xid comes again.
    std::fs::remove_file(&cursor).unwrap();
    let third = Agent::start(dir.path(), KMSG_ON);
    wait_for(Duration::from_secs(10), || {
        (kmsg_status(&third)["events"].as_u64().unwrap_or(0) >= 2).then_some(())
    })
    .unwrap_or_else(|| panic!("control: {}", kmsg_status(&third)));
    assert!(kmsg_status(&third)["resumed_after_seq"].is_null());
}

/// 10,000 kernel lines in about a second: the events kept are bounded by the rate, the rest
/// counted (status, one summary event a second at most), and the agent stays healthy.
#[test]
fn a_flood_of_10000_lines_is_bounded_and_counted() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &format!("{KMSG_ON}max_events_per_s = 50\nburst = 200\n"),
    );
    // Let it read the ring once.
    std::thread::sleep(Duration::from_millis(500));
    let base = kmsg_status(&agent);
    let m = marker();
    let lines: Vec<String> = (0..10_000)
        .map(|i| format!("NVRM: Xid (PCI:0000:01:00): 13, pid={i}, name={m}, Graphics Exception"))
        .collect();
    let t = Instant::now();
    inject(&lines);
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "injection took {took:?}");
    let (code, _) = get(&agent.url("/health")).unwrap();
    assert_eq!(code, 200);
    // Settle: everything read.
    let st = wait_for(Duration::from_secs(10), || {
        let st = kmsg_status(&agent);
        let read = st["records"].as_u64().unwrap() - base["records"].as_u64().unwrap();
        let lost = st["lost"].as_u64().unwrap() - base["lost"].as_u64().unwrap();
        (read + lost >= 10_000).then_some(st)
    })
    .unwrap_or_else(|| panic!("not all read: {}", kmsg_status(&agent)));
    std::thread::sleep(Duration::from_millis(1500));
    let st2 = kmsg_status(&agent);
    let elapsed = t.elapsed().as_secs_f64() + 1.0;
    // Kept: the events the collector kept in the window (its own count; the stored events
    // of the flood are checked below by their marker).
    let kept = (st2["events"].as_u64().unwrap() - base["events"].as_u64().unwrap()) as f64;
    let stored = marked(&agent, "xid", &m).len();
    assert!(stored > 0, "the kept flood events are stored and found");
    let dropped = (st2["dropped"].as_u64().unwrap() - base["dropped"].as_u64().unwrap()) as f64;
    let lost = (st2["lost"].as_u64().unwrap() - base["lost"].as_u64().unwrap()) as f64;
    eprintln!("flood: injected in {took:?}, kept {kept}, dropped {dropped}, lost {lost}: {st}");
    // The bucket runs on the kernel records' own times, so lines the ring held from just
    // before (earlier tests, earlier runs of this one) can have spent part of the burst:
    // seen 167-169 on a machine whose ring had ~40,000 earlier lines. The exact burst is
    // `collect::kmsg::tests`' (a bucket alone); here, most of it and never more than the rate.
    assert!(kept >= 100.0, "most of the burst at least: {kept}");
    assert!(
        kept <= 200.0 + 50.0 * elapsed,
        "bounded: {kept} in {elapsed} s"
    );
    assert!(dropped > 0.0);
    assert!(
        kept + dropped + lost >= 10_000.0,
        "every line accounted for"
    );
    let summaries = events(&agent, "kmsg_dropped");
    assert!(!summaries.is_empty(), "a drop summary event");
    assert!(
        summaries.len() as f64 <= elapsed + 5.0,
        "at most one summary a second: {}",
        summaries.len()
    );
    let (code, _) = get(&agent.url("/health")).unwrap();
    assert_eq!(code, 200);
    let (code, _) = get(&agent.url("/api/v1/status")).unwrap();
    assert_eq!(code, 200);
}

/// A process in a memory-limited cgroup (v2 where the memory controller is there, else
/// v1) allocates past the limit: the kernel kills it, and the event names its pid, name and
/// cgroup; the /proc/vmstat cross-check finds the kill logged (nothing unlogged).
#[test]
fn a_real_oom_kill_in_a_memory_limited_cgroup() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), KMSG_ON);
    let name = marker();
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"));
    let (cg, limit_file, procs) = if v2 {
        let cg = format!("/sys/fs/cgroup/{name}");
        (
            cg.clone(),
            format!("{cg}/memory.max"),
            format!("{cg}/cgroup.procs"),
        )
    } else {
        let cg = format!("/sys/fs/cgroup/memory/{name}");
        (
            cg.clone(),
            format!("{cg}/memory.limit_in_bytes"),
            format!("{cg}/cgroup.procs"),
        )
    };
    std::fs::create_dir(&cg).expect("create the cgroup");
    std::fs::write(&limit_file, "33554432").expect("limit 32 MiB");
    if !v2 {
        // No swap here, but a swap limit would let it page out instead of dying.
        let _ = std::fs::write(format!("{cg}/memory.memsw.limit_in_bytes"), "33554432");
    }
    // The shell moves itself into the cgroup and becomes python3 (same pid).
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {procs} && exec python3 -c 'b = bytearray(512 << 20); print(len(b))'"
        ))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let pid = child.id() as i64;
    let status = child.wait().unwrap();
    let _ = std::fs::remove_dir(&cg);
    assert!(!status.success(), "not killed: {status:?}");
    let ev = wait_for(Duration::from_secs(15), || {
        events(&agent, "oom_kill")
            .into_iter()
            .find(|e| e.get("pid") == Some(&Value::from(pid)))
    })
    .unwrap_or_else(|| {
        panic!(
            "no oom_kill event for pid {pid}: {:?}\n{}",
            events(&agent, "oom_kill"),
            kmsg_status(&agent)
        )
    });
    assert_eq!(ev["name"], "python3", "{ev:?}");
    assert!(
        ev["cgroup"].as_str().is_some_and(|c| c.contains(&name)),
        "{ev:?}"
    );
    assert_eq!(ev["tag.severity"], "critical");
    // The counter saw the kill; the log named it: nothing reported as unlogged.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(kmsg_status(&agent)["oom_kills_unlogged"], 0);
}

/// A device that cannot be opened: the collector stays off with the reason in the status
/// and one log line; the agent runs on.
#[test]
fn an_unreadable_device_is_a_status_line_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        "[kmsg]\nenabled = true\ndevice = \"/nonexistent/kmsg\"\n",
    );
    let st = wait_for(Duration::from_secs(10), || {
        let st = kmsg_status(&agent);
        (st["state"] != "not started").then_some(st)
    })
    .unwrap();
    assert_eq!(st["state"], "off: cannot read the kernel log", "{st}");
    assert!(
        st["detail"]
            .as_str()
            .is_some_and(|d| d.contains("/nonexistent/kmsg")),
        "{st}"
    );
    assert_eq!(
        agent.log_text().matches("kernel log collector off").count(),
        1
    );
    let (code, _) = get(&agent.url("/health")).unwrap();
    assert_eq!(code, 200);
    let (code, body) = get(&agent.url("/metrics")).unwrap();
    assert_eq!(code, 200);
    assert!(
        body.contains("edgewatch_kmsg_state{state=\"off: cannot read the kernel log\"} 1"),
        "{body}"
    );
}
