//! Unit tests of the Jetson collector on the fixture trees of `tests/data/jetson/` (Orin
//! Nano on JetPack 6, AGX Orin and Xavier NX on JetPack 5, AGX Thor on JetPack 7, AGX Orin
//! on JetPack 7.2), copied to a temp dir so a test
//! can stage changes.

use std::path::Path;

use super::*;

fn put(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// A temp copy of the fixture tree `name`.
fn fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/jetson")
        .join(name);
    copy_tree(&src, dir.path());
    dir
}

fn collector(root: &Path) -> JetsonCollector {
    let cfg = JetsonConfig {
        root: root.to_path_buf(),
        nvpmodel: root.join("no-nvpmodel"),
        ..JetsonConfig::default()
    };
    JetsonCollector::new(&cfg, Arc::new(JetsonStatus::default()))
}

fn field<'a>(l: &'a Line, k: &str) -> Option<&'a Value> {
    l.fields.iter().find(|f| f.0 == k).map(|f| &f.1)
}

#[test]
fn identity_of_each_fixture_module() {
    let cases = [
        (
            "orin-nano-jp6",
            "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
            "36.4.3",
            Some("6.2"),
            (2, "MAXN_SUPER"),
            Some(false),
        ),
        (
            "agx-orin-jp5",
            "Jetson AGX Orin Developer Kit",
            "35.4.1",
            Some("5.1.2"),
            (0, "MAXN"),
            Some(true),
        ),
        (
            "xavier-nx-jp5",
            "NVIDIA Jetson Xavier NX Developer Kit",
            "35.4.1",
            Some("5.1.2"),
            (8, "MODE_20W_6CORE"),
            Some(false),
        ),
        (
            "thor-jp7",
            "NVIDIA Jetson AGX Thor Developer Kit",
            "38.2.1",
            Some("7.0"),
            (0, "MAXN"),
            Some(false),
        ),
        (
            "agx-orin-jp72",
            "NVIDIA Jetson AGX Orin Developer Kit",
            "39.2.0",
            Some("7.2"),
            (3, "MODE_50W"),
            Some(false),
        ),
    ];
    for (name, module, l4t, jp, (mode, mode_name), clocks) in cases {
        let dir = fixture(name);
        let id = read_identity(dir.path());
        assert_eq!(id.module.as_deref(), Some(module), "{name}");
        assert_eq!(id.l4t.as_deref(), Some(l4t), "{name}");
        assert_eq!(id.jetpack.as_deref(), jp, "{name}");
        assert_eq!(
            (id.power_mode_id, id.power_mode.as_deref()),
            (Some(mode), Some(mode_name)),
            "{name}"
        );
        assert_eq!(id.jetson_clocks, clocks, "{name}");
        assert!(id.is_jetson());
    }
    // An empty tree is not a Jetson, and knows nothing.
    let empty = tempfile::tempdir().unwrap();
    let id = read_identity(empty.path());
    assert!(!id.is_jetson());
    assert_eq!(id.jetson_clocks, None);
    assert!(id.tags().is_empty());
}

#[test]
fn parsers() {
    assert_eq!(
        parse_l4t("# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref\n").as_deref(),
        Some("35.4.1")
    );
    assert_eq!(parse_l4t("garbage"), None);
    assert_eq!(
        parse_nvpmodel_query("NV Power Mode: MAXN\n0\n"),
        (Some("MAXN".into()), Some(0))
    );
    assert_eq!(parse_nvpmodel_status("pmode:0003 fmode:cool"), Some(3));
    assert_eq!(jetpack_of("99.0.0"), None);
    assert_eq!(identity::pinned(&[]), None);
    assert_eq!(identity::pinned(&[(1.0, 1.0), (2.0, 2.0)]), Some(true));
    assert_eq!(identity::pinned(&[(1.0, 1.0), (1.0, 2.0)]), Some(false));
}

#[test]
fn jetson_clocks_is_every_minimum_pinned_to_its_maximum() {
    let dir = fixture("orin-nano-jp6");
    let root = dir.path();
    assert_eq!(read_jetson_clocks(root), Some(false));
    // What jetson_clocks writes: each CPU policy's and the GPU's floor at the ceiling.
    for p in [0, 4] {
        put(
            root,
            &format!("sys/devices/system/cpu/cpufreq/policy{p}/scaling_min_freq"),
            "1728000\n",
        );
    }
    assert_eq!(
        read_jetson_clocks(root),
        Some(false),
        "the GPU is not pinned yet"
    );
    put(
        root,
        "sys/class/devfreq/17000000.gpu/min_freq",
        "1020000000\n",
    );
    assert_eq!(read_jetson_clocks(root), Some(true));
}

#[test]
fn identity_tags_go_on_every_jetson_point_and_nowhere_else() {
    let dir = fixture("agx-orin-jp5");
    let id = read_identity(dir.path());
    let tags = id.tags();
    let mut l = Line {
        key: "jetson_power,rail=VDD_GPU_SOC".into(),
        fields: vec![],
        ts: 0,
        line_no: 0,
    };
    tag_line(&mut l, &tags);
    assert_eq!(
        l.key,
        "jetson_power,jetpack=5.1.2,jetson_clocks=on,l4t=35.4.1,module=Jetson\\ AGX\\ Orin\\ Developer\\ Kit,power_mode=MAXN,power_mode_id=0,rail=VDD_GPU_SOC"
    );
    // A tag the line has is kept; other measurements are left alone.
    let mut own = Line {
        key: "jetson_cpu,power_mode=x".into(),
        ..l.clone()
    };
    tag_line(&mut own, &tags);
    assert!(
        own.key.contains("power_mode=x,power_mode_id=0"),
        "{}",
        own.key
    );
    let mut other = Line {
        key: "gpu,gpu=0".into(),
        ..l.clone()
    };
    tag_line(&mut other, &tags);
    assert_eq!(other.key, "gpu,gpu=0");
    // Through the shared status, as the tegrastats collector does.
    let status = JetsonStatus::default();
    let mut b = Batch {
        lines: vec![Line {
            key: "jetson_mem".into(),
            ..l.clone()
        }],
    };
    status.tag_batch(&mut b);
    assert_eq!(b.lines[0].key, "jetson_mem", "no identity read yet");
    status.set_identity(&id);
    status.tag_batch(&mut b);
    assert!(b.lines[0].key.starts_with("jetson_mem,jetpack=5.1.2,"));
}

#[test]
fn throttle_from_a_capped_devfreq_and_a_staged_over_current_counter() {
    let dir = fixture("orin-nano-jp6");
    let root = dir.path();
    let mut c = collector(root);
    assert!(c.start());
    let b = c.sample(1);
    let l = b.lines.first().unwrap();
    assert!(
        l.key.starts_with("jetson_throttle,jetpack=6.2,jetson_clocks=off,l4t=36.4.3,module=NVIDIA\\ Jetson\\ Orin\\ Nano"),
        "{}",
        l.key
    );
    assert!(
        l.key.ends_with(",power_mode=MAXN_SUPER,power_mode_id=2"),
        "{}",
        l.key
    );
    assert_eq!(field(l, "gpu_freq_mhz"), Some(&Value::F64(306.0)));
    assert_eq!(field(l, "gpu_hw_max_mhz"), Some(&Value::F64(1020.0)));
    assert_eq!(field(l, "gpu_capped"), Some(&Value::Bool(false)));
    assert_eq!(field(l, "cpu_freq_mhz"), Some(&Value::F64(1344.0)));
    assert_eq!(field(l, "cpu_max_mhz"), Some(&Value::F64(1728.0)));
    assert_eq!(field(l, "cpu_capped"), Some(&Value::Bool(false)));
    assert_eq!(field(l, "oc_events"), Some(&Value::I64(0)));
    assert_eq!(field(l, "oc3_events"), Some(&Value::I64(0)));
    assert_eq!(field(l, "current_alarms"), Some(&Value::I64(0)));
    assert_eq!(field(l, "throttled"), Some(&Value::Bool(false)));
    assert!(
        !b.lines.iter().any(|l| l.key.starts_with("edgewatch_event")),
        "no event on the first sample"
    );

    // Capped devfreq, an instantaneous over-current event, a capped CPU, a mode change.
    put(
        root,
        "sys/class/devfreq/17000000.gpu/max_freq",
        "612000000\n",
    );
    put(root, "sys/class/hwmon/hwmon3/oc3_event_cnt", "2\n");
    put(
        root,
        "sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq",
        "1113600\n",
    );
    put(root, "var/lib/nvpmodel/status", "pmode:0000 fmode:quiet\n");
    let b = c.sample(2);
    let ev = &b.lines[0];
    assert_eq!(
        ev.key,
        "edgewatch_event,kind=power_mode,severity=info,source=jetson"
    );
    assert_eq!(field(ev, "from"), Some(&Value::Str("MAXN_SUPER".into())));
    assert_eq!(field(ev, "to"), Some(&Value::Str("15W".into())));
    let l = &b.lines[1];
    assert!(
        l.key.contains(",power_mode=15W,power_mode_id=0"),
        "{}",
        l.key
    );
    assert_eq!(field(l, "gpu_max_mhz"), Some(&Value::F64(612.0)));
    assert_eq!(field(l, "gpu_capped"), Some(&Value::Bool(true)));
    assert_eq!(field(l, "cpu_capped"), Some(&Value::Bool(true)));
    assert_eq!(field(l, "oc_events"), Some(&Value::I64(2)));
    assert_eq!(field(l, "oc3_events"), Some(&Value::I64(2)));
    assert_eq!(field(l, "throttled"), Some(&Value::Bool(true)));
    let st = c.status.snapshot();
    assert_eq!(st.power_mode.as_deref(), Some("15W"));
    assert_eq!((st.power_mode_changes, st.throttled), (1, Some(true)));
    assert_eq!(st.last_throttled_ns, Some(2));
    // The counter stays: no longer throttled; a passed trip point or an alarm is.
    let b = c.sample(3);
    assert_eq!(field(&b.lines[0], "throttled"), Some(&Value::Bool(false)));
    put(root, "sys/class/thermal/thermal_zone0/temp", "99500\n");
    let b = c.sample(4);
    assert_eq!(field(&b.lines[0], "thermal_trips"), Some(&Value::I64(1)));
    assert_eq!(field(&b.lines[0], "throttled"), Some(&Value::Bool(true)));
    put(root, "sys/class/thermal/thermal_zone0/temp", "50000\n");
    put(root, "sys/class/hwmon/hwmon1/curr1_crit_alarm", "1\n");
    let b = c.sample(5);
    assert_eq!(field(&b.lines[0], "current_alarms"), Some(&Value::I64(1)));
    assert_eq!(field(&b.lines[0], "throttled"), Some(&Value::Bool(true)));
}

#[test]
fn a_jetson_clocks_change_is_an_event() {
    let dir = fixture("agx-orin-jp5");
    let root = dir.path();
    let mut c = collector(root);
    assert!(c.start());
    c.sample(1);
    put(
        root,
        "sys/class/devfreq/17000000.ga10b/min_freq",
        "306000000\n",
    );
    let b = c.sample(2);
    let ev = &b.lines[0];
    assert_eq!(
        ev.key,
        "edgewatch_event,kind=jetson_clocks,severity=info,source=jetson"
    );
    assert_eq!(
        (field(ev, "from"), field(ev, "to")),
        (
            Some(&Value::Str("on".into())),
            Some(&Value::Str("off".into()))
        )
    );
    assert!(b.lines[1].key.contains("jetson_clocks=off"));
}

#[test]
fn nvmap_clients_become_per_process_rows() {
    let text = "CLIENT                        PROCESS      PID        SIZE\n\
                user                          python3   4121     524288K\n\
                user                          python3   4121       8192K\n\
                user                     Web Content   5230      16384K\n\
                user                   big   77      2G\n\
                user                   nounit   78      2048\n\
                garbage line\n\
                total                                            570368K\n";
    let c = nvmap::parse_clients(text);
    assert_eq!(c.len(), 3, "{c:?}");
    assert_eq!(
        (c[0].pid, c[0].name.as_str(), c[0].bytes),
        (77, "big", 2 << 30)
    );
    assert_eq!((c[1].pid, c[1].bytes), (4121, 532_480 << 10));
    assert_eq!(c[2].name, "Web Content");
    // `maps`: the client rows with their mappings below (hex base first: skipped).
    let maps = "CLIENT                        PROCESS      PID        SIZE\n\
                \x20                                   BASE        SIZE    FLAGS  SHARE       UID\n\
                user                 python3     4121     524288K\n\
                \x20      0     524288K        0      1         0\n\
                \x20fe000000       4096K        0      1 ffff0000123\n\
                \n\
                total                                  524288K\n";
    let m = nvmap::parse_clients(maps);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!((m[0].pid, m[0].bytes), (4121, 524_288 << 10));
    let lines = nvmap::process_lines(&c, 9);
    assert_eq!(lines[1].key, "jetson_process,pid=4121,process=python3");
    assert_eq!(field(&lines[1], "gpu_mem_mb"), Some(&Value::F64(520.0)));
    assert_eq!(
        lines[2].key,
        "jetson_process,pid=5230,process=Web\\ Content"
    );

    // Through the collector: tagged, one row per process.
    let dir = fixture("xavier-nx-jp5");
    let mut col = collector(dir.path());
    assert!(col.start());
    let b = col.sample(1);
    let p: Vec<&Line> = b
        .lines
        .iter()
        .filter(|l| l.key.starts_with("jetson_process"))
        .collect();
    assert_eq!(p.len(), 1);
    assert!(
        p[0].key.contains("pid=1822,power_mode=MODE_20W_6CORE"),
        "{}",
        p[0].key
    );
    assert_eq!(field(p[0], "gpu_mem_mb"), Some(&Value::F64(256.0)));
    assert_eq!(col.status.snapshot().process_count, Some(1));
}

#[test]
fn missing_files_are_named_and_nothing_breaks() {
    // Xavier NX: no over-current counters.
    let dir = fixture("xavier-nx-jp5");
    let mut c = collector(dir.path());
    assert!(c.start());
    let st = c.status.snapshot();
    assert_eq!(st.state, "running");
    assert_eq!(
        st.missing,
        vec!["over-current counters (hwmon oc*_event_cnt)".to_string()]
    );
    let b = c.sample(1);
    assert_eq!(field(&b.lines[0], "oc_events"), None);
    // The nvmap list gone (not root): off, once; the rest keeps going.
    std::fs::remove_file(dir.path().join(nvmap::CLIENTS)).unwrap();
    let b = c.sample(2);
    assert!(b.lines.iter().all(|l| !l.key.starts_with("jetson_process")));
    let st = c.status.snapshot();
    assert!(
        st.processes.starts_with("off: cannot read"),
        "{}",
        st.processes
    );
    assert_eq!(st.process_count, None);
    // Everything but the release file gone: still a Jetson, fields left out.
    let bare = tempfile::tempdir().unwrap();
    put(
        bare.path(),
        "etc/nv_tegra_release",
        "# R36 (release), REVISION: 9.9, GCID: 1\n",
    );
    let mut c = collector(bare.path());
    assert!(c.start());
    let st = c.status.snapshot();
    assert!(st.missing.iter().any(|m| m.starts_with("module")));
    assert!(st.missing.iter().any(|m| m.starts_with("JetPack")));
    assert!(st.missing.iter().any(|m| m.starts_with("GPU clock")));
    let b = c.sample(1);
    assert_eq!(b.lines.len(), 1);
    assert_eq!(b.lines[0].key, "jetson_throttle,l4t=36.9.9");
    // Not a Jetson: off.
    let empty = tempfile::tempdir().unwrap();
    let mut c = collector(empty.path());
    assert!(!c.start());
    assert!(c.status.snapshot().state.starts_with("off: not a Jetson"));
}

/// GPU clock, load and throttle inputs read on each tree, from the source chosen for it.
#[test]
fn gpu_source_clock_load_and_throttle_inputs_on_each_tree() {
    // (tree, source, clock MHz, cap MHz, hw max MHz, load %, trips, oc counters, alarms)
    let cases = [
        (
            "thor-jp7",
            "devfreq:gpu-gpc-0",
            314.0,
            1575.0,
            1575.0,
            None,
            0,
            3,
            Some(0),
        ),
        (
            "agx-orin-jp72",
            "devfreq:17000000.gpu",
            918.0,
            1020.0,
            1300.5,
            Some(12.0),
            0,
            3,
            Some(0),
        ),
        (
            "agx-orin-jp5",
            "devfreq:17000000.ga10b",
            1300.5,
            1300.5,
            1300.5,
            None,
            0,
            3,
            Some(0),
        ),
        (
            "xavier-nx-jp5",
            "devfreq:17000000.gv11b",
            114.75,
            1109.25,
            1109.25,
            None,
            0,
            0,
            Some(0),
        ),
    ];
    for (tree, source, freq, max, hw, load, trips, ocs, alarms) in cases {
        let dir = fixture(tree);
        let mut c = collector(dir.path());
        assert!(c.start(), "{tree}");
        let b = c.sample(1);
        let choice = c.gpu_choice().unwrap().clone();
        assert_eq!(choice.label(), source, "{tree}");
        let t = b
            .lines
            .iter()
            .find(|l| l.key.starts_with("jetson_throttle"))
            .unwrap();
        assert_eq!(field(t, "gpu_freq_mhz"), Some(&Value::F64(freq)), "{tree}");
        assert_eq!(field(t, "gpu_max_mhz"), Some(&Value::F64(max)), "{tree}");
        assert_eq!(field(t, "gpu_hw_max_mhz"), Some(&Value::F64(hw)), "{tree}");
        assert_eq!(
            field(t, "gpu_load_pct"),
            load.map(Value::F64).as_ref(),
            "{tree}"
        );
        assert_eq!(
            field(t, "thermal_trips"),
            Some(&Value::I64(trips)),
            "{tree}"
        );
        let n = (1..=3)
            .filter(|i| field(t, &format!("oc{i}_events")).is_some())
            .count();
        assert_eq!(n, ocs, "{tree}");
        assert_eq!(
            field(t, "current_alarms"),
            alarms.map(Value::I64).as_ref(),
            "{tree}"
        );
        let st = c.status.snapshot();
        assert_eq!(st.gpu_source.as_deref(), Some(source), "{tree}");
        assert_eq!(st.gpu_source_switches, 0);
        assert!(
            st.missing.is_empty() || tree == "xavier-nx-jp5",
            "{tree}: {:?}",
            st.missing
        );
    }
    // Thor: no load file, NVML not running in a bare collector: said so.
    let dir = fixture("thor-jp7");
    let mut c = collector(dir.path());
    c.start();
    c.sample(1);
    let r = &c.gpu_choice().unwrap().reason;
    assert!(
        r.contains("gpu-gpc-0 answers the clock but has no load file"),
        "{r}"
    );
    assert!(r.contains("NVML is not running"), "{r}");
}

/// Thor's over-current counters and INA238/INA3221 alarms are read like Orin's.
#[test]
fn thor_alarms_and_over_current_counters_throttle() {
    let dir = fixture("thor-jp7");
    let mut c = collector(dir.path());
    c.start();
    let b = c.sample(1);
    let thr = |b: &Batch| {
        b.lines
            .iter()
            .find(|l| l.key.starts_with("jetson_throttle"))
            .cloned()
            .unwrap()
    };
    assert_eq!(field(&thr(&b), "throttled"), Some(&Value::Bool(false)));
    put(dir.path(), "sys/class/hwmon/hwmon0/power1_max_alarm", "1\n");
    put(dir.path(), "sys/class/hwmon/hwmon2/oc2_event_cnt", "4\n");
    put(
        dir.path(),
        "sys/class/thermal/thermal_zone3/temp",
        "99500\n",
    );
    let t = thr(&c.sample(2));
    assert_eq!(field(&t, "current_alarms"), Some(&Value::I64(1)));
    assert_eq!(field(&t, "oc2_events"), Some(&Value::I64(4)));
    assert_eq!(field(&t, "thermal_trips"), Some(&Value::I64(1)));
    assert_eq!(field(&t, "throttled"), Some(&Value::Bool(true)));
}

#[test]
fn choose_prefers_devfreq_with_load_and_never_a_source_that_answers_not_supported() {
    let with_load = GpuReading {
        freq_mhz: Some(918.0),
        load_pct: Some(12.0),
        ..GpuReading::default()
    };
    let no_load = GpuReading {
        freq_mhz: Some(314.0),
        ..GpuReading::default()
    };
    let n = |name: &str, r: Option<&GpuReading>| (name.to_string(), r.cloned());
    // Orin: devfreq with its load, NVML NotSupported: devfreq, settled.
    let c = choose(
        &[n("17000000.gpu", Some(&with_load))],
        &NvmlAnswer::NotSupported,
    );
    assert_eq!(
        (c.label(), c.settled()),
        ("devfreq:17000000.gpu".into(), true)
    );
    // Thor: clock from gpu-gpc-0, load from NVML where it answers.
    let thor = [n("gpu-gpc-0", Some(&no_load))];
    let c = choose(&thor, &NvmlAnswer::Answers);
    assert_eq!(
        (c.label(), c.settled()),
        ("devfreq:gpu-gpc-0+nvml".into(), false)
    );
    let c = choose(&thor, &NvmlAnswer::Waiting);
    assert_eq!(c.label(), "devfreq:gpu-gpc-0");
    assert!(
        c.reason.contains("NVML has not sampled yet"),
        "{}",
        c.reason
    );
    // No devfreq: NVML only when it answers; NotSupported or lost is no source.
    assert_eq!(choose(&[], &NvmlAnswer::Answers).label(), "nvml");
    for a in [
        NvmlAnswer::NotSupported,
        NvmlAnswer::Lost,
        NvmlAnswer::Off("off: disabled".into()),
    ] {
        let c = choose(&[], &a);
        assert_eq!(c.source, Source::None, "{a:?}");
        assert!(c.reason.starts_with("no GPU devfreq node"), "{}", c.reason);
    }
    assert!(choose(&[], &NvmlAnswer::NotSupported)
        .reason
        .contains("NotSupported"));
    // A node that does not answer is passed over for the next one, and named when none does.
    let c = choose(
        &[n("gpu-gpc-0", None), n("17000000.gpu", Some(&with_load))],
        &NvmlAnswer::NotSupported,
    );
    assert_eq!(c.label(), "devfreq:17000000.gpu");
    let c = choose(&[n("gpu-gpc-0", None)], &NvmlAnswer::NotSupported);
    assert_eq!(c.source, Source::None);
    assert!(
        c.reason.contains("gpu-gpc-0 does not answer"),
        "{}",
        c.reason
    );
}

#[test]
fn nvml_answer_from_its_status() {
    use crate::status::{Gpu, Nvml};
    let running = |gpus: Vec<Gpu>, samples: u64| Nvml {
        state: "running".into(),
        samples,
        gpus,
        ..Nvml::default()
    };
    let gpu = |unsupported: &[&str], lost: bool| Gpu {
        unsupported: unsupported.iter().map(|s| s.to_string()).collect(),
        lost,
        ..Gpu::default()
    };
    let off = Nvml {
        state: "off: no NVIDIA driver".into(),
        ..Nvml::default()
    };
    assert_eq!(
        nvml_answer(&off),
        NvmlAnswer::Off("off: no NVIDIA driver".into())
    );
    assert_eq!(
        nvml_answer(&running(vec![gpu(&[], false)], 0)),
        NvmlAnswer::Waiting
    );
    assert_eq!(
        nvml_answer(&running(vec![gpu(&["utilization", "power"], false)], 3)),
        NvmlAnswer::NotSupported
    );
    assert_eq!(
        nvml_answer(&running(vec![gpu(&[], true)], 3)),
        NvmlAnswer::Lost
    );
    assert_eq!(
        nvml_answer(&running(vec![gpu(&["power"], false)], 3)),
        NvmlAnswer::Answers
    );
    let starting = Nvml {
        state: "starting".into(),
        ..Nvml::default()
    };
    assert_eq!(nvml_answer(&starting), NvmlAnswer::Waiting);
    assert!(matches!(
        nvml_answer(&running(vec![], 3)),
        NvmlAnswer::Off(_)
    ));
}

/// A devfreq node that appears after start is chosen at the next probe (not before: the
/// rate is bounded), a settled node is not probed again, and one that vanishes is left at
/// once.
#[test]
fn devfreq_appearing_later_is_chosen_at_the_next_probe() {
    let dir = fixture("agx-orin-jp72");
    let root = dir.path();
    let node = root.join("sys/class/devfreq/17000000.gpu");
    let parked = root.join("parked-gpu");
    std::fs::rename(&node, &parked).unwrap();
    let every = Duration::from_secs(30);
    let mut p = GpuProbe::new(every);
    let t0 = Instant::now();
    let ns = || NvmlAnswer::NotSupported;
    let (r, sw) = p.sample(root, ns, t0);
    assert_eq!(r, None);
    let (old, new) = sw.unwrap();
    assert_eq!((old, new.source), (None, Source::None));
    std::fs::rename(&parked, &node).unwrap();
    // Within the re-probe interval: still none, nothing read.
    let (r, sw) = p.sample(root, ns, t0 + Duration::from_secs(5));
    assert_eq!((r, sw), (None, None));
    assert_eq!(p.choice().unwrap().source, Source::None);
    // At the interval: the node, its clock and load, one switch.
    let (r, sw) = p.sample(root, ns, t0 + every);
    assert_eq!(r.unwrap().load_pct, Some(12.0));
    let (old, new) = sw.unwrap();
    assert_eq!(old.unwrap().label(), "none");
    assert_eq!(new.label(), "devfreq:17000000.gpu");
    assert_eq!(p.switches, 1);
    // Settled: later samples read the node and never ask NVML.
    let (r, sw) = p.sample(root, || panic!("asked NVML while settled"), t0 + every * 5);
    assert_eq!((r.unwrap().freq_mhz, sw), (Some(918.0), None));
    // The node vanishes: probed at once, back to none.
    std::fs::remove_dir_all(&node).unwrap();
    let (r, sw) = p.sample(root, ns, t0 + every * 5 + Duration::from_secs(1));
    assert_eq!(r, None);
    assert_eq!(sw.unwrap().1.source, Source::None);
    assert_eq!(p.switches, 2);
}

/// Through the collector: the switch is an `edgewatch_event` (`kind=gpu_source`), logged
/// and counted once, and the status names the source and drops "GPU clock" from missing.
#[test]
fn a_gpu_source_switch_is_one_event_and_the_status_follows() {
    let dir = fixture("thor-jp7");
    let root = dir.path();
    let node = root.join("sys/class/devfreq/gpu-gpc-0");
    let parked = root.join("parked");
    std::fs::rename(&node, &parked).unwrap();
    let cfg = JetsonConfig {
        root: root.to_path_buf(),
        nvpmodel: root.join("no-nvpmodel"),
        gpu_reprobe: crate::config::values::Interval(Duration::from_millis(0)),
        ..JetsonConfig::default()
    };
    let mut c = JetsonCollector::new(&cfg, Arc::new(JetsonStatus::default()));
    assert!(c.start());
    let events = |b: &Batch| {
        b.lines
            .iter()
            .filter(|l| l.key.contains("kind=gpu_source"))
            .count()
    };
    let b = c.sample(1);
    assert_eq!(events(&b), 0);
    let st = c.status.snapshot();
    assert_eq!(st.gpu_source.as_deref(), Some("none"));
    assert!(st.missing.iter().any(|m| m.starts_with("GPU clock")));
    std::fs::rename(&parked, &node).unwrap();
    let b = c.sample(2);
    assert_eq!(events(&b), 1);
    let b = c.sample(3);
    assert_eq!(events(&b), 0);
    let st = c.status.snapshot();
    assert_eq!(st.gpu_source.as_deref(), Some("devfreq:gpu-gpc-0"));
    assert_eq!(st.gpu_source_switches, 1);
    assert!(
        !st.missing.iter().any(|m| m.starts_with("GPU clock")),
        "{:?}",
        st.missing
    );
}
