//! The kernel log parser on real lines (each quoted with where it was published), the
//! resume cursor, the flood bucket and the OOM cross-check.

use super::config::DEFAULT_FATAL_XIDS;
use super::parse::*;
use super::state::*;
use crate::collect::event::Severity;
use crate::model::Value;

fn rec(seq: u64, msg: &str) -> Record {
    Record {
        prio: 3,
        seq,
        ts_usec: 1_000_000 * seq,
        message: msg.to_string(),
    }
}

fn classify(msg: &str) -> Option<Found> {
    Classifier::new(DEFAULT_FATAL_XIDS).classify(&rec(1, msg))
}

fn field<'a>(f: &'a Found, key: &str) -> Option<&'a Value> {
    f.event
        .fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

#[test]
fn records_parse_with_their_header_and_escapes() {
    let r = parse_record(b"12,408,14631447615,-;edgewatch-probe hello 30254\n").unwrap();
    assert_eq!((r.prio, r.seq, r.ts_usec), (12, 408, 14_631_447_615));
    assert_eq!(r.message, "edgewatch-probe hello 30254");
    // Continuation lines (dictionary) are not part of the message; \xNN is undone.
    let r = parse_record(
        b"3,1,5,c,caller=T1;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: fallen off the bus\n SUBSYSTEM=pci\n DEVICE=+pci:0000:b3:00.0\n",
    )
    .unwrap();
    assert_eq!(
        r.message,
        "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: fallen off the bus"
    );
    assert_eq!(parse_record(b"no header"), Err(ParseError::NoHeader));
    assert_eq!(parse_record(b"6,x,1,-;m"), Err(ParseError::BadField("seq")));
    assert_eq!(unescape(br"a\x5cb\xZZ\"), "a\\b\\xZZ\\");
}

/// github.com/madMAx43v3r/chia-gigahorse/issues/301 (driver 550) and
/// github.com/leptonai/gpud/pull/46: `pid='<unknown>', name=<unknown>` and numeric pids.
#[test]
fn xid_lines_of_every_driver_generation() {
    let f = classify("NVRM: Xid (PCI:0000:0a:00): 31, pid=13332, name=cuda_plot_k32_v, Ch 00000010, intr 00000000. MMU Fault: ENGINE CE2 HUBCLIENT_CE0 faulted @ 0x7f29_5b8c9000. Fault is of type FAULT_PRIV_VIOLATION ACCESS_TYPE_VIRT_READ").unwrap();
    assert_eq!(f.event.kind, "xid");
    assert_eq!(f.event.severity, Severity::Warning);
    assert_eq!(field(&f, "code"), Some(&Value::I64(31)));
    assert_eq!(field(&f, "pid"), Some(&Value::I64(13332)));
    assert_eq!(
        field(&f, "name"),
        Some(&Value::Str("cuda_plot_k32_v".into()))
    );
    assert_eq!(field(&f, "pci"), Some(&Value::Str("0000:0a:00".into())));
    assert!(
        matches!(field(&f, "detail"), Some(Value::Str(d)) if d.starts_with("Ch 00000010, intr"))
    );
    assert_eq!(field(&f, "count"), Some(&Value::I64(1)));

    let f = classify("NVRM: Xid (PCI:0000:0a:00): 62, pid='<unknown>', name=<unknown>, 2023b230 20238a3a 2023e8b6 2023eac4 2023ec3c 2023ea86 00000000 00000000").unwrap();
    assert_eq!(f.event.severity, Severity::Critical, "62 is fatal");
    assert_eq!(field(&f, "pid"), None);
    assert_eq!(field(&f, "name"), None);
    assert_eq!(field(&f, "fatal"), Some(&Value::Bool(true)));

    // gpud/pull/46: a 6-digit pid and a thread name.
    let f = classify("NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005").unwrap();
    assert_eq!(field(&f, "pid"), Some(&Value::I64(1797828)));
    assert_eq!(field(&f, "code"), Some(&Value::I64(109)));

    // Bumblebee-Project/Bumblebee/issues/677: an old driver, no pid or name at all.
    let f = classify("NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000000 intr 00004000").unwrap();
    assert_eq!(field(&f, "code"), Some(&Value::I64(32)));
    assert_eq!(field(&f, "pid"), None);
    assert_eq!(
        field(&f, "detail"),
        Some(&Value::Str("Channel ID 00000000 intr 00004000".into()))
    );

    // NVIDIA/NVSentinel/issues/155: Xid 79 without process; fatal.
    let f = classify("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.").unwrap();
    assert_eq!(f.event.kind, "xid", "an Xid line is one xid event, not two");
    assert_eq!(f.event.severity, Severity::Critical);
    assert!(
        f.event.message.contains("Xid 79 (fatal)"),
        "{}",
        f.event.message
    );

    // leptonai/gpud/pull/1174: NVLink Xid without pid.
    let f = classify("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)").unwrap();
    assert_eq!(field(&f, "code"), Some(&Value::I64(149)));
    assert_eq!(f.event.severity, Severity::Warning);

    // The user's own fatal list wins.
    let f = Classifier::new(&[13])
        .classify(&rec(
            1,
            "NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=x, Graphics Exception",
        ))
        .unwrap();
    assert_eq!(f.event.severity, Severity::Critical);
    assert!(parse_xid("NVRM: Xid (PCI:0000:01:00): x, pid=1").is_none());
}

/// NVIDIA/NVSentinel/issues/155: the multi-line form (one record, `\x0a` inside) and the
/// one-line form.
#[test]
fn fallen_off_the_bus_without_an_xid() {
    let f = classify("NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands.").unwrap();
    assert_eq!(f.event.kind, "gpu_fell_off_bus");
    assert_eq!(f.event.severity, Severity::Critical);
    assert_eq!(field(&f, "pci"), Some(&Value::Str("0000:b3:00.0".into())));
    let f = classify("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.").unwrap();
    assert_eq!(field(&f, "pci"), Some(&Value::Str("0000:01:00.0".into())));
}

/// OE4T/tegra-demo-distro/issues/342 (Orin, JetPack 5): one fault's dump is one event.
#[test]
fn nvgpu_mmu_fault_dump_is_one_event() {
    let dump = [
        "nvgpu: 17000000.gpu gv11b_mm_mmu_fault_handle_buf_valid_entry:532  [ERR]  page fault error: err_type = 0x8, fault_status = 0x200",
        "nvgpu: 17000000.gpu      gv11b_fb_mmu_fault_info_dump:294  [ERR]  [MMU FAULT] mmu engine id:  18, ch id:  479, fault addr: 0x0, fault addr aperture: 0, fault type: invalid pde, access type: virt read,",
        "nvgpu: 17000000.gpu      gv11b_fb_mmu_fault_info_dump:307  [ERR]  [MMU FAULT] protected mode: 0, client type: hub, client id:  ce1, gpc id if client type is gpc: 0,",
        "nvgpu: 17000000.gpu                     nvgpu_get_pte:1486 [ERR]  Failed!",
        "nvgpu: 17000000.gpu       nvgpu_rc_mmu_fault_recovery:399  [ERR]  mmu fault id=8 id_type=1 act_eng_bitmask=00000020",
        "nvgpu: 17000000.gpu       nvgpu_tsg_set_ctx_mmu_error:1069 [ERR]  TSG 8 generated a mmu fault",
    ];
    let mut c = Classifier::new(DEFAULT_FATAL_XIDS);
    let mut events = Vec::new();
    for (i, l) in dump.iter().enumerate() {
        let r = Record {
            prio: 3,
            seq: i as u64,
            ts_usec: 5_000_000 + i as u64 * 100,
            message: l.to_string(),
        };
        events.extend(c.classify(&r));
    }
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].event.kind, "nvgpu_mmu_fault");
    assert_eq!(events[0].event.severity, Severity::Critical);
    assert_eq!(
        field(&events[0], "device"),
        Some(&Value::Str("17000000.gpu".into()))
    );
    // A fault later is a new event; the brief's ga10b form too.
    let r = Record {
        prio: 3,
        seq: 99,
        ts_usec: 60_000_000,
        message: "nvgpu: 17000000.ga10b  gk20a_fifo_handle_mmu_fault:1720 [ERR]  mmu fault on engine 0, engine subid 0 (gpc), client 1 (t1 0)".into(),
    };
    assert_eq!(
        c.classify(&r).map(|f| f.event.kind),
        Some("nvgpu_mmu_fault".into())
    );
}

/// OE4T/meta-tegra/issues/538 (Nano 2GB on a weak supply).
#[test]
fn soctherm_over_current() {
    let f = classify("soctherm: OC ALARM 0x00000001").unwrap();
    assert_eq!(f.event.kind, "overcurrent");
    assert_eq!(f.event.severity, Severity::Warning);
    assert_eq!(field(&f, "alarm"), Some(&Value::Str("0x00000001".into())));
    let f = classify("soctherm: oc3 throttle activated").unwrap();
    assert_eq!(f.event.kind, "overcurrent");
    // The boot-time trip configuration is no event (RobertCNelson/netinstall/issues/65).
    assert!(classify(
        "tegra_soctherm 700e2000.thermal-sensor: thermtrip: will shut down when cpu reaches 101000 mC"
    )
    .is_none());
    assert!(classify(
        "tegra_soctherm 700e2000.thermal-sensor: throttrip: will throttle when gpu reaches 99000 mC"
    )
    .is_none());
}

/// The kernel's thermal core (`critical temperature reached (%d C), shutting down`, newer
/// `<type>: critical temperature reached`) and x86 therm_throt.
#[test]
fn thermal_trips_and_throttling() {
    let f = classify("thermal thermal_zone0: critical temperature reached (105 C), shutting down")
        .unwrap();
    assert_eq!(f.event.kind, "thermal_trip");
    assert_eq!(f.event.severity, Severity::Critical);
    assert_eq!(field(&f, "zone"), Some(&Value::Str("thermal_zone0".into())));
    assert_eq!(field(&f, "temp_c"), Some(&Value::F64(105.0)));
    let f = classify("thermal thermal_zone3: acpitz: critical temperature reached").unwrap();
    assert_eq!(field(&f, "zone"), Some(&Value::Str("thermal_zone3".into())));
    assert_eq!(field(&f, "temp_c"), None);
    let f = classify("thermal thermal_zone1: hot temperature reached").unwrap();
    assert_eq!(
        (f.event.kind.as_str(), f.event.severity),
        ("thermal_trip", Severity::Warning)
    );
    let f =
        classify("CPU0: Core temperature above threshold, cpu clock throttled (total events = 1)")
            .unwrap();
    assert_eq!(f.event.kind, "thermal_throttle");
    assert_eq!(field(&f, "zone"), Some(&Value::Str("CPU0 core".into())));
    let f = classify(
        "CPU2: Package temperature above threshold, cpu clock throttled (total events = 7)",
    )
    .unwrap();
    assert_eq!(field(&f, "zone"), Some(&Value::Str("CPU2 package".into())));
    let f = classify("tegra-thermal: thermal_zone5 GPU-therm tripped at 97500").unwrap();
    assert_eq!(f.event.kind, "thermal_trip");
    assert!(classify("CPU0: Core temperature/speed normal").is_none());
}

/// The kernel's `oom-kill:` summary (mm/oom_kill.c, 4.19 and later) joined with the
/// `Killed process` line that follows it; the system-wide form without a cgroup.
#[test]
fn oom_kills_name_the_victim_and_its_cgroup() {
    let mut c = Classifier::new(DEFAULT_FATAL_XIDS);
    assert!(c
        .classify(&rec(1, "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/test,task_memcg=/test/job,task=stress,pid=1234,uid=0"))
        .is_none());
    let f = c
        .classify(&rec(2, "Memory cgroup out of memory: Killed process 1234 (stress) total-vm:268820kB, anon-rss:262272kB, file-rss:1024kB, shmem-rss:0kB, UID:0 pgtables:568kB oom_score_adj:0"))
        .unwrap();
    assert!(f.oom_kill);
    assert_eq!(f.event.kind, "oom_kill");
    assert_eq!(f.event.severity, Severity::Critical);
    assert_eq!(field(&f, "pid"), Some(&Value::I64(1234)));
    assert_eq!(field(&f, "name"), Some(&Value::Str("stress".into())));
    assert_eq!(field(&f, "cgroup"), Some(&Value::Str("/test/job".into())));
    assert_eq!(field(&f, "anon_rss_kb"), Some(&Value::I64(262272)));
    assert_eq!(field(&f, "total_vm_kb"), Some(&Value::I64(268820)));
    assert_eq!(
        field(&f, "constraint"),
        Some(&Value::Str("CONSTRAINT_MEMCG".into()))
    );
    // System-wide, a name with spaces and parentheses, no oom-kill line before it.
    let f = c
        .classify(&rec(3, "Out of memory: Killed process 77 (Web (x) y) total-vm:10kB, anon-rss:5kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:4kB oom_score_adj:0"))
        .unwrap();
    assert_eq!(field(&f, "name"), Some(&Value::Str("Web (x) y".into())));
    assert_eq!(field(&f, "cgroup"), None);
    // The oom-kill line of another pid is not borrowed.
    c.classify(&rec(
        4,
        "oom-kill:constraint=CONSTRAINT_NONE,task_memcg=/a,task=a,pid=5,uid=0",
    ));
    let f = c
        .classify(&rec(
            5,
            "Out of memory: Killed process 6 (b) total-vm:1kB, anon-rss:1kB",
        ))
        .unwrap();
    assert_eq!(field(&f, "cgroup"), None);
    assert!(classify("oom_reaper: reaped process 1234 (stress), now anon-rss:0kB").is_none());
}

#[test]
fn ordinary_lines_are_no_events() {
    for l in [
        "Linux version 6.18.44 (builder@sandboxing) #1 SMP PREEMPT_DYNAMIC",
        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01",
        "nvgpu: 17000000.gpu nvgpu_pmu_load_update: busy",
        "EXT4-fs (md127p3): re-mounted. Quota mode: none.",
        "tegra_soctherm 700e2000.soctherm: soctherm: trip temperature -2147483647 forced to -127000",
    ] {
        assert!(classify(l).is_none(), "{l}");
    }
}

#[test]
fn cursor_resumes_in_the_same_boot_only() {
    let c = Cursor {
        boot_id: "cc60c49b-f50f".into(),
        seq: 408,
    };
    assert_eq!(Cursor::parse(&c.to_text()), Some(c.clone()));
    assert_eq!(Cursor::resume_after(Some(&c), "cc60c49b-f50f"), Some(408));
    assert_eq!(Cursor::resume_after(Some(&c), "another-boot"), None);
    assert_eq!(Cursor::resume_after(None, "cc60c49b-f50f"), None);
    assert_eq!(Cursor::parse("x"), None);
    assert_eq!(Cursor::parse("a 1 2"), None);
    assert_eq!(Cursor::parse("a -1"), None);
}

#[test]
fn the_bucket_bounds_a_flood() {
    let s = 1_000_000_000;
    let mut b = Bucket::new(50, 200, 0);
    let kept = (0..10_000).filter(|_| b.take(0)).count();
    assert_eq!(kept, 200, "the burst");
    let kept = (0..10_000).filter(|_| b.take(s)).count();
    assert_eq!(kept, 50, "one second's refill");
    let kept = (0..10_000).filter(|_| b.take(100 * s)).count();
    assert_eq!(kept, 200, "never more than the burst");
}

#[test]
fn oom_counter_excess_is_reported_once_it_persists() {
    assert_eq!(vmstat_oom_kills("pgfault 1\noom_kill 3\nx 2\n"), Some(3));
    assert_eq!(vmstat_oom_kills("pgfault 1\n"), None);
    let mut o = OomCheck::new(10);
    assert_eq!(o.check(10), 0);
    // Counted before its line was read: not reported while the line can still come.
    assert_eq!(o.check(11), 0);
    o.logged();
    assert_eq!(o.check(11), 0);
    // Two kills with no line: reported at the next check, once.
    assert_eq!(o.check(13), 0);
    assert_eq!(o.check(13), 2);
    assert_eq!(o.check(13), 0);
}

#[test]
fn record_times_come_from_the_boot_clock() {
    let boot = 1_700_000_000_000_000_000;
    assert_eq!(
        super::record_time_ns(boot, 2_000_000, i64::MAX),
        boot + 2_000_000_000
    );
    // Never in the future.
    assert_eq!(super::record_time_ns(boot, 2_000_000, boot), boot);
}
