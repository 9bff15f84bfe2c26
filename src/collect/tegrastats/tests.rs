//! Unit tests of the Jetson collector: the mapper over real lines of every SoC and
//! release, the CLI, replay, status, the stderr limit and the line reader.

use std::time::Instant;

use super::cli::parse_stream;
use super::*;
use crate::config::values::Interval;
use crate::model::{Line, Value};

const ORIN_JP6: &str = "05-09-2026 18:42:07 RAM 18202/62841MB (lfb 466x4MB) SWAP 86/31420MB (cached 0MB) CPU [16%@1949,6%@1761,4%@1222,4%@2201,4%@1036,33%@1036,0%@1036,40%@1036,3%@1190,46%@1190,6%@1190,2%@1190] EMC_FREQ 3%@2133 GR3D_FREQ 0%@[0,0] NVENC 78%@166 NVDEC off NVJPG off NVJPG1 off VIC 32%@115 OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off APE 174 cpu@52.343C soc2@48.343C soc0@49.062C tj@52.343C soc1@49.531C VDD_GPU_SOC 2412mW/2412mW VDD_CPU_CV 1607mW/1607mW VIN_SYS_5V0 4607mW/4657mW";
const XAVIER_JP4: &str = "RAM 1736/15827MB (lfb 3283x4MB) CPU [1%@1160,2%@1161,0%@1189,0%@1189,off,off,off,off] EMC_FREQ 0%@665 GR3D_FREQ 0%@114 APE 150 MTS fg 0% bg 0% AO@29C GPU@30C iwlwifi@34C Tboard@30C Tdiode@33C AUX@29C CPU@30C thermal@29.45C PMIC@100C GPU 466/466 CPU 466/466 SOC 932/932 CV 0/0 VDDRQ 0/0 SYS5V 1854/1854";
const TX1_LEGACY: &str = "RAM 1104/3995MB (lfb 425x4MB) cpu [2%,5%,8%,11%]@1734 EMC 0%@1600 AVP 1%@115 NVDEC 192 MSENC 192 GR3D 0%@998 EDP limit 1734";
const THOR: &str = "05-17-2026 10:00:33 RAM 4280/125773MB (lfb 29x4MB) SWAP 0/2048MB (cached 0MB) CPU [0%@972,0%@972,0%@972,0%@972,1%@972,0%@972,1%@972,0%@972,0%@2601,17%@2601,1%@972,9%@972,0%@972,1%@972] EMC_FREQ 0%@665 GR3D_FREQ @[0,0,0] NVENC0_FREQ @0 NVENC1_FREQ @0 NVDEC0_FREQ @0 NVDEC1_FREQ @0 NVJPG0_FREQ @0 VIC off OFA_FREQ @0 PVA0_FREQ off APE 300 cpu@35.25C tj@36.031C soc012@36.062C soc345@34.5C VDD_GPU 0mW/0mW VDD_CPU_SOC_MSS 4923mW/4544mW VIN_SYS_5V0 4327mW/4227mW";
const ORIN_JP5: &str = "10-16-2023 10:59:22 RAM 1205/30623MB (lfb 6429x4MB) SWAP 0/15311MB (cached 0MB) CPU [0%@729,0%@729,1%@729,0%@729,0%@729,0%@730,0%@730,0%@729,0%@729,0%@729,0%@729,0%@729] EMC_FREQ 0%@204 GR3D_FREQ 0%@114 GR3D2_FREQ 0%@114 NVJPG1 729 VIC_FREQ 729 APE 233 CV0@-256C CPU@43.5C Tdiode@32.5C SOC2@40.062C SOC0@40.5C CV1@-256C GPU@38.156C SOC1@39.125C CV2@-256C VDD_GPU_SOC 4788mW/4788mW VDD_CPU_CV 798mW/798mW VIN_SYS_5V0 3842mW/3842mW NC 0mW/0mW VDDQ_VDD2_1V8AO 707mW/707mW NC 0mW/0mW";
const ORIN_JP72: &str = "07-25-2026 09:08:28 RAM 20642/62817MB (lfb 1x2MB) CPU [23%@2201,10%@2201,4%@2201,14%@2201,30%@2201,18%@2201,10%@2201,10%@2201,33%@2201,7%@2201,5%@2201,27%@2201] EMC_FREQ 3%@3199 GR3D_FREQ 12%@[1300,1300] NVENC0 off NVDEC0 off NVJPG0 off NVJPG1 off VIC off OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off APE 174 cpu@52.968C/52.968C soc2@48.406C/48.406C soc0@49.531C/49.531C gpu@47.625C/47.625C VDD_GPU_SOC 5139mW/5139mW/5139mW VDD_CPU_CV 3268mW/3268mW/3268mW VIN_SYS_5V0 5500mW/5500mW/5500mW";
const NANO_JP4: &str = "RAM 1180/3965MB (lfb 1x2MB) SWAP 149/1024MB (cached 7MB) IRAM 0/252kB(lfb 252kB) CPU [30%@1036,33%@1036,28%@1036,26%@1036] EMC_FREQ 10%@1600 GR3D_FREQ 0%@76 NVENC 716 NVDEC 716 APE 25 PLL@57C CPU@60.5C PMIC@100C GPU@59C AO@65C thermal@59.75C POM_5V_IN 4520/4680 POM_5V_GPU 0/0 POM_5V_CPU 1078/1205";
const DRIVE: &str = "06-07-2023 14:39:03 RAM 18220/24402MB (lfb 872x4MB) CPU [48%@2009,29%@2009] EMC_FREQ @3199 GR3D_FREQ 99%@1274 GR3D2_FREQ 99%@1274 NVENC_LOAD 7% NVDEC_LOAD 0% VIC_LOAD 0% NVDLA0_LOAD 0% APE 81 CPU@74.343C";

fn lines(text: &str) -> Vec<Line> {
    let s = tegrastats_parser::parse_line(text).expect("fixture parses");
    sample_to_lines(&s, 42)
}

fn find<'a>(lines: &'a [Line], key: &str) -> &'a Line {
    lines
        .iter()
        .find(|l| l.key == key)
        .unwrap_or_else(|| panic!("no line {key}"))
}

fn f(fields: &[(&str, f64)]) -> Vec<(String, Value)> {
    fields
        .iter()
        .map(|(k, v)| (k.to_string(), Value::F64(*v)))
        .collect()
}

fn keys(lines: &[Line]) -> Vec<&str> {
    lines.iter().map(|l| l.key.as_str()).collect()
}

#[test]
fn orin_jetpack6_maps_to_every_measurement() {
    let l = lines(ORIN_JP6);
    assert!(l.iter().all(|l| l.ts == 42 && l.line_no == 0));
    assert_eq!(
        find(&l, "jetson_mem").fields,
        f(&[
            ("ram_used_mb", 18202.0),
            ("ram_total_mb", 62841.0),
            ("ram_used_pct", 18202.0 * 100.0 / 62841.0),
            ("lfb_blocks", 466.0),
            ("lfb_block_mb", 4.0),
            ("swap_used_mb", 86.0),
            ("swap_total_mb", 31420.0),
            ("swap_cached_mb", 0.0),
        ])
    );
    assert_eq!(
        find(&l, "jetson_cpu").fields,
        f(&[
            ("cores", 12.0),
            ("cores_online", 12.0),
            ("load_pct", 164.0 / 12.0)
        ])
    );
    let mut core3 = vec![("online".to_string(), Value::Bool(true))];
    core3.extend(f(&[("load_pct", 4.0), ("freq_mhz", 2201.0)]));
    assert_eq!(find(&l, "jetson_cpu,core=3").fields, core3);
    assert_eq!(
        find(&l, "jetson_emc").fields,
        f(&[("load_pct", 3.0), ("freq_mhz", 2133.0)])
    );
    assert_eq!(
        find(&l, "jetson_gpu").fields,
        f(&[("load_pct", 0.0), ("freq_mhz", 0.0)])
    );
    assert_eq!(find(&l, "jetson_gpu,gpc=1").fields, f(&[("freq_mhz", 0.0)]));
    let mut nvenc = vec![("on".to_string(), Value::Bool(true))];
    nvenc.extend(f(&[("load_pct", 78.0), ("freq_mhz", 166.0)]));
    assert_eq!(find(&l, "jetson_engine,engine=NVENC").fields, nvenc);
    assert_eq!(
        find(&l, "jetson_engine,engine=NVDEC").fields,
        vec![("on".to_string(), Value::Bool(false))]
    );
    // PVA0_FREQ off -> engine PVA0
    assert_eq!(
        find(&l, "jetson_engine,engine=PVA0").fields,
        vec![("on".to_string(), Value::Bool(false))]
    );
    assert_eq!(
        find(&l, "jetson_temp,zone=tj").fields,
        f(&[("temp_c", 52.343)])
    );
    assert_eq!(
        find(&l, "jetson_power,rail=VIN_SYS_5V0").fields,
        f(&[("current_mw", 4607.0), ("average_mw", 4657.0)])
    );
    assert_eq!(
        keys(&l)
            .iter()
            .filter(|k| k.starts_with("jetson_cpu,"))
            .count(),
        12
    );
    assert_eq!(
        keys(&l)
            .iter()
            .filter(|k| k.starts_with("jetson_temp,"))
            .count(),
        5
    );
    assert_eq!(
        keys(&l)
            .iter()
            .filter(|k| k.starts_with("jetson_engine,"))
            .count(),
        10
    );
}

#[test]
fn xavier_offline_cores_mts_and_pmic_placeholder() {
    let l = lines(XAVIER_JP4);
    assert_eq!(find(&l, "jetson_mem").fields.len(), 5);
    assert_eq!(
        find(&l, "jetson_cpu").fields,
        f(&[
            ("cores", 8.0),
            ("cores_online", 4.0),
            ("load_pct", 0.75),
            ("mts_fg_pct", 0.0),
            ("mts_bg_pct", 0.0),
        ])
    );
    assert_eq!(
        find(&l, "jetson_cpu,core=4").fields,
        vec![("online".to_string(), Value::Bool(false))]
    );
    assert!(!keys(&l).iter().any(|k| k.contains("gpc=")));
    assert_eq!(
        find(&l, "jetson_gpu").fields,
        f(&[("load_pct", 0.0), ("freq_mhz", 114.0)])
    );
    // Upper-case zones are lower-cased; PMIC@100C is a placeholder.
    assert_eq!(
        find(&l, "jetson_temp,zone=gpu").fields,
        f(&[("temp_c", 30.0)])
    );
    assert_eq!(
        find(&l, "jetson_temp,zone=thermal").fields,
        f(&[("temp_c", 29.45)])
    );
    assert!(!keys(&l)
        .iter()
        .any(|k| k.contains("pmic") || k.contains("PMIC")));
    // Rails share names with temperature zones without clashing.
    assert_eq!(
        find(&l, "jetson_power,rail=GPU").fields,
        f(&[("current_mw", 466.0), ("average_mw", 466.0)])
    );
    assert_eq!(
        find(&l, "jetson_engine,engine=APE").fields,
        vec![
            ("on".to_string(), Value::Bool(true)),
            ("freq_mhz".to_string(), Value::F64(150.0))
        ]
    );
}

#[test]
fn tx1_legacy_format() {
    let l = lines(TX1_LEGACY);
    assert_eq!(
        keys(&l),
        vec![
            "jetson_mem",
            "jetson_cpu",
            "jetson_cpu,core=0",
            "jetson_cpu,core=1",
            "jetson_cpu,core=2",
            "jetson_cpu,core=3",
            "jetson_emc",
            "jetson_gpu",
            "jetson_engine,engine=AVP",
            "jetson_engine,engine=MSENC",
            "jetson_engine,engine=NVDEC",
        ]
    );
    assert_eq!(
        find(&l, "jetson_mem").fields,
        f(&[
            ("ram_used_mb", 1104.0),
            ("ram_total_mb", 3995.0),
            ("ram_used_pct", 1104.0 * 100.0 / 3995.0),
            ("lfb_blocks", 425.0),
            ("lfb_block_mb", 4.0),
        ])
    );
    assert_eq!(
        find(&l, "jetson_cpu").fields,
        f(&[
            ("cores", 4.0),
            ("cores_online", 4.0),
            ("load_pct", 6.5),
            ("edp_limit_mhz", 1734.0),
        ])
    );
    let mut core2 = vec![("online".to_string(), Value::Bool(true))];
    core2.extend(f(&[("load_pct", 8.0), ("freq_mhz", 1734.0)]));
    assert_eq!(find(&l, "jetson_cpu,core=2").fields, core2);
    assert_eq!(
        find(&l, "jetson_emc").fields,
        f(&[("load_pct", 0.0), ("freq_mhz", 1600.0)])
    );
    assert_eq!(
        find(&l, "jetson_gpu").fields,
        f(&[("load_pct", 0.0), ("freq_mhz", 998.0)])
    );
    let mut avp = vec![("on".to_string(), Value::Bool(true))];
    avp.extend(f(&[("load_pct", 1.0), ("freq_mhz", 115.0)]));
    assert_eq!(find(&l, "jetson_engine,engine=AVP").fields, avp);
}

#[test]
fn thor_per_gpc_clocks_without_load_and_freq_engines() {
    let l = lines(THOR);
    assert_eq!(find(&l, "jetson_gpu").fields, f(&[("freq_mhz", 0.0)]));
    for n in 0..3 {
        assert_eq!(
            find(&l, &format!("jetson_gpu,gpc={n}")).fields,
            f(&[("freq_mhz", 0.0)])
        );
    }
    assert!(!keys(&l).contains(&"jetson_gpu,gpc=3"));
    let mut nvenc1 = vec![("on".to_string(), Value::Bool(true))];
    nvenc1.extend(f(&[("freq_mhz", 0.0)]));
    assert_eq!(find(&l, "jetson_engine,engine=NVENC1").fields, nvenc1);
    let mut ofa = vec![("on".to_string(), Value::Bool(true))];
    ofa.extend(f(&[("freq_mhz", 0.0)]));
    assert_eq!(find(&l, "jetson_engine,engine=OFA").fields, ofa);
    assert_eq!(
        find(&l, "jetson_cpu").fields,
        f(&[
            ("cores", 14.0),
            ("cores_online", 14.0),
            ("load_pct", 30.0 / 14.0)
        ])
    );
    assert_eq!(
        find(&l, "jetson_cpu,core=9").fields.get(2),
        Some(&("freq_mhz".to_string(), Value::F64(2601.0)))
    );
    assert_eq!(
        find(&l, "jetson_temp,zone=soc012").fields,
        f(&[("temp_c", 36.062)])
    );
    assert_eq!(
        find(&l, "jetson_power,rail=VDD_CPU_SOC_MSS").fields,
        f(&[("current_mw", 4923.0), ("average_mw", 4544.0)])
    );
}

#[test]
fn jetpack5_orin_skips_sentinels_and_numbers_repeated_rails() {
    let l = lines(ORIN_JP5);
    assert!(!keys(&l)
        .iter()
        .any(|k| k.to_ascii_lowercase().starts_with("jetson_temp,zone=cv")));
    assert_eq!(
        find(&l, "jetson_temp,zone=cpu").fields,
        f(&[("temp_c", 43.5)])
    );
    assert_eq!(
        find(&l, "jetson_power,rail=NC#2").fields,
        f(&[("current_mw", 0.0), ("average_mw", 0.0)])
    );
    let mut gr3d2 = vec![("on".to_string(), Value::Bool(true))];
    gr3d2.extend(f(&[("load_pct", 0.0), ("freq_mhz", 114.0)]));
    assert_eq!(find(&l, "jetson_engine,engine=GR3D2").fields, gr3d2);
    let mut vic = vec![("on".to_string(), Value::Bool(true))];
    vic.extend(f(&[("freq_mhz", 729.0)]));
    assert_eq!(find(&l, "jetson_engine,engine=VIC").fields, vic);
}

#[test]
fn jetpack72_peaks() {
    let l = lines(ORIN_JP72);
    assert_eq!(
        find(&l, "jetson_temp,zone=gpu").fields,
        f(&[("temp_c", 47.625), ("peak_c", 47.625)])
    );
    assert_eq!(
        find(&l, "jetson_power,rail=VDD_CPU_CV").fields,
        f(&[
            ("current_mw", 3268.0),
            ("average_mw", 3268.0),
            ("peak_mw", 3268.0)
        ])
    );
    assert_eq!(
        find(&l, "jetson_gpu").fields,
        f(&[("load_pct", 12.0), ("freq_mhz", 1300.0)])
    );
    assert_eq!(find(&l, "jetson_mem").fields.len(), 5);
}

#[test]
fn nano_iram_and_drive_load_engines() {
    let l = lines(NANO_JP4);
    let mem = &find(&l, "jetson_mem").fields;
    assert_eq!(
        mem.get(5..).map(<[_]>::to_vec),
        Some(f(&[
            ("swap_used_mb", 149.0),
            ("swap_total_mb", 1024.0),
            ("swap_cached_mb", 7.0),
            ("iram_used_mb", 0.0),
            ("iram_total_mb", 252.0 / 1024.0),
            ("iram_lfb_mb", 252.0 / 1024.0),
        ]))
    );
    let l = lines(DRIVE);
    let mut nvenc = vec![("on".to_string(), Value::Bool(true))];
    nvenc.extend(f(&[("load_pct", 7.0)]));
    assert_eq!(find(&l, "jetson_engine,engine=NVENC").fields, nvenc);
    assert_eq!(find(&l, "jetson_emc").fields, f(&[("freq_mhz", 3199.0)]));
}

#[test]
fn engines_merge_their_spellings_and_unit_loads() {
    assert_eq!(engine_tag("VIC_FREQ"), "VIC");
    assert_eq!(engine_tag("NVDLA0_LOAD"), "NVDLA0");
    assert_eq!(engine_tag("_FREQ"), "_FREQ");
    assert_eq!(engine_tag("APE"), "APE");
    let l = lines("RAM 1/2MB VIC_FREQ 115 VIC_LOAD 9% PVA0_FREQ [10%,5%]@1152");
    let mut vic = vec![("on".to_string(), Value::Bool(true))];
    vic.extend(f(&[("load_pct", 9.0), ("freq_mhz", 115.0)]));
    assert_eq!(find(&l, "jetson_engine,engine=VIC").fields, vic);
    assert_eq!(
        find(&l, "jetson_engine,engine=PVA0,unit=1").fields,
        f(&[("load_pct", 5.0)])
    );
}

#[test]
fn zone_names_that_collide_in_lower_case_stay_apart() {
    let l = lines("RAM 1/2MB CPU@40C cpu@41C");
    let zones: Vec<&str> = keys(&l)
        .into_iter()
        .filter(|k| k.starts_with("jetson_temp"))
        .collect();
    assert_eq!(zones, vec!["jetson_temp,zone=CPU", "jetson_temp,zone=cpu"]);
}

#[test]
fn every_fixture_line_maps_without_empty_lines() {
    for text in [
        ORIN_JP6, XAVIER_JP4, TX1_LEGACY, THOR, ORIN_JP5, ORIN_JP72, NANO_JP4, DRIVE,
    ] {
        let l = lines(text);
        assert!(l.iter().all(|l| !l.fields.is_empty()), "{text}");
        let mut k = keys(&l);
        let n = k.len();
        k.sort();
        k.dedup();
        assert_eq!(k.len(), n, "duplicate series in {text}");
    }
}

#[test]
fn parse_command_prints_line_numbers_and_errors() {
    let input = format!("{TX1_LEGACY}\n\nnot tegrastats at all\n{NANO_JP4}\n");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let ok = parse_stream(input.as_bytes(), &mut out, &mut err).unwrap();
    assert!(!ok);
    let out = String::from_utf8(out).unwrap();
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    assert!(out.starts_with("{\"line\":1,\"timestamp\":null,"));
    assert_eq!(rows[0]["cpus"][3]["freq_mhz"], 1734);
    assert_eq!(rows[1]["line"], 4);
    assert_eq!(rows[1]["ram"]["used_mb"], 1180.0);
    assert_eq!(
        String::from_utf8(err).unwrap(),
        "line 3: no tegrastats field found in line starting with \"not\"\n"
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert!(parse_stream(&b""[..], &mut out, &mut err).unwrap());
    assert!(out.is_empty() && err.is_empty());
}

#[test]
fn replay_loops_and_counts_bad_lines_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    std::fs::write(
        &path,
        format!("{TX1_LEGACY}\nThu Dec 17 18:16:50 UTC 2020\n{NANO_JP4}\n"),
    )
    .unwrap();
    let mut r = Replay::open(&path).unwrap();
    let used: Vec<f64> = (0..5)
        .map(|_| r.next_sample().unwrap().ram.unwrap().used_mb)
        .collect();
    assert_eq!(used, vec![1104.0, 1180.0, 1104.0, 1180.0, 1104.0]);
    assert_eq!(r.passes(), 2);
    assert_eq!(r.take_bad_lines(), 1);
    assert_eq!(r.take_bad_lines(), 0);
}

#[test]
fn replay_of_nothing_usable_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    std::fs::write(&path, "hello\n\nworld\n").unwrap();
    let mut r = Replay::open(&path).unwrap();
    assert!(matches!(
        r.next_sample(),
        Err(TegrastatsError::ReplayEmpty { .. })
    ));
    assert_eq!(r.take_bad_lines(), 2);
    assert!(matches!(
        Replay::open(&dir.path().join("missing")),
        Err(TegrastatsError::ReplayIo { .. })
    ));
    // A file emptied between passes ends the replay instead of spinning.
    std::fs::write(&path, format!("{TX1_LEGACY}\n")).unwrap();
    let mut r = Replay::open(&path).unwrap();
    assert!(r.next_sample().is_ok());
    std::fs::write(&path, "").unwrap();
    assert!(matches!(
        r.next_sample(),
        Err(TegrastatsError::ReplayEmpty { .. })
    ));
}

#[test]
fn stall_timeout_is_never_under_five_intervals() {
    let mut cfg = TegrastatsConfig::default();
    assert_eq!(cfg.stall_after(), Duration::from_secs(30));
    cfg.interval = Interval(Duration::from_secs(10));
    assert_eq!(cfg.stall_after(), Duration::from_secs(50));
    cfg.interval = Interval(Duration::from_millis(100));
    cfg.stall_timeout = Interval(Duration::from_secs(1));
    assert_eq!(cfg.stall_after(), Duration::from_secs(1));
    let text = "[tegrastats]\nstall_timeout = \"2m\"\n";
    let parsed = crate::config::Config::from_toml_str(text, "test").unwrap();
    assert_eq!(parsed.tegrastats.stall_timeout.0, Duration::from_secs(120));
    let zero = "[tegrastats]\nstall_timeout = \"0s\"\n";
    let err = crate::config::Config::from_toml_str(zero, "test").unwrap_err();
    assert!(err.to_string().contains("stall_timeout"), "{err}");
}

#[test]
fn status_counts_samples_and_dates_the_last_one() {
    let st = TegrastatsStatus::default();
    assert_eq!(st.state(), "not started");
    let v = st.snapshot(0);
    assert_eq!(v.samples, 0);
    assert_eq!(v.last_sample_age_s, None);
    st.set("running", "/usr/bin/tegrastats");
    st.sample(1_000_000_000);
    st.sample(2_000_000_000);
    st.bad_lines(3);
    st.bad_lines(0);
    let v = st.snapshot(4_500_000_000);
    assert_eq!(v.state, "running");
    assert_eq!(v.detail, "/usr/bin/tegrastats");
    assert_eq!(v.samples, 2);
    assert_eq!(v.bad_lines, 3);
    assert_eq!(v.last_sample_age_s, Some(2.5));
}

#[test]
fn backoff_doubles_to_a_cap_with_downward_jitter() {
    let secs = |n, j| backoff_delay(n, j).as_secs_f64();
    assert_eq!(secs(0, 0.0), 1.0);
    assert_eq!(secs(1, 0.0), 2.0);
    assert_eq!(secs(5, 0.0), 32.0);
    assert_eq!(secs(6, 0.0), 60.0);
    assert_eq!(secs(u32::MAX, 0.0), 60.0);
    assert_eq!(secs(0, 1.0), 0.75);
    assert_eq!(secs(7, 5.0), 45.0);
}

#[test]
fn stderr_limit_passes_ten_a_minute_and_reports_the_rest() {
    let t0 = Instant::now();
    let mut l = StderrLimit::new(t0);
    for _ in 0..STDERR_LINES_PER_MINUTE {
        assert_eq!(l.allow(t0), (true, None));
    }
    assert_eq!(l.allow(t0 + Duration::from_secs(1)), (false, None));
    assert_eq!(l.allow(t0 + Duration::from_secs(2)), (false, None));
    assert_eq!(l.allow(t0 + Duration::from_secs(61)), (true, Some(2)));
    assert_eq!(l.allow(t0 + Duration::from_secs(200)), (true, None));
}

#[tokio::test]
async fn line_reader_splits_limits_and_survives_odd_input() {
    let input: Vec<u8> = [
        &b"first\r\nsecond\n"[..],
        &[b'x'; 40][..],
        b"\nthird\n\nlast",
    ]
    .concat();
    // A tiny buffer, so lines span several fill_buf calls.
    let buf = tokio::io::BufReader::with_capacity(3, &input[..]);
    let mut r = LineReader::new(buf, 16);
    let mut got = Vec::new();
    while let Some(l) = r.next_line().await.unwrap() {
        got.push(l);
    }
    assert_eq!(
        got,
        vec![
            RawLine::Line(b"first".to_vec()),
            RawLine::Line(b"second".to_vec()),
            RawLine::TooLong,
            RawLine::Line(b"third".to_vec()),
            RawLine::Line(Vec::new()),
            RawLine::Line(b"last".to_vec()),
        ]
    );
    assert!(r.done);
}
