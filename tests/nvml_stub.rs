//! The NVML collector end to end without a GPU: the real `edgewatch` binary loads a
//! stand-in `libnvidia-ml.so.1` (`tests/nvml_stub/stub.c`, compiled here with the system
//! `cc`, found through `LD_LIBRARY_PATH` as the driver's library would be) whose answers
//! come from a scenario file the test writes. So the FFI path (`NvmlSource` over
//! `nvml-wrapper`) runs for real: the `gpus` report, the stored `gpu`, `gpu_mig` and
//! `gpu_process` points with their unit conversions, NOT_SUPPORTED metrics, a GPU lost and
//! recovered, an older driver's library without the `_v2`/`_v3` entry points, and the
//! per-sample cost. What a real driver does beyond the scenario is not tested here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value as J;

use crate::support::{wait_for, Agent};

const GPU0_UUID: &str = "GPU-0a1b2c3d-0000-4000-8000-000000000001";
const GPU1_UUID: &str = "GPU-0a1b2c3d-0000-4000-8000-000000000002";

/// GPU 0 answers every metric; GPU 1 a few, and NOT_SUPPORTED (said or implied) for the rest.
const SCENARIO: &str = include_str!("nvml_stub/two_gpus.txt");

/// Metrics GPU 1 answers (in `Metric::ALL` order).
const GPU1_SUPPORTED: [&str; 3] = ["utilization", "memory", "power"];

/// The stand-in library, compiled once per variant into the test's target temp dir:
/// `extra` adds `cc` flags (`-DOLD_DRIVER`). Returns the directory to put on
/// `LD_LIBRARY_PATH`.
fn stub_dir(variant: &'static str, extra: &[&str]) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<BTreeMap<&'static str, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = built.get(variant) {
        return d.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("nvml-stub")
        .join(variant);
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nvml_stub/stub.c");
    // Built under a name of its own, then renamed over the old one: a library another
    // process has loaded is replaced, never rewritten.
    let tmp = dir.join(format!("libnvidia-ml.so.1.{}", std::process::id()));
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&tmp)
        .arg(&src)
        .args(extra)
        .status()
        .expect("the system C compiler `cc` is needed for the NVML stand-in");
    assert!(status.success(), "cc failed on {}", src.display());
    std::fs::rename(&tmp, dir.join("libnvidia-ml.so.1")).unwrap();
    built.insert(variant, dir.clone());
    dir
}

pub(crate) fn new_lib() -> PathBuf {
    stub_dir("current", &[])
}

fn old_lib() -> PathBuf {
    stub_dir("old", &["-DOLD_DRIVER"])
}

/// A library exporting only init, shutdown, the device count and handles, UUID and
/// utilization (a linker version script hides every other symbol).
fn bare_lib() -> PathBuf {
    let map = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nvml-stub-bare.map");
    std::fs::write(
        &map,
        "{ global: nvmlInit_v2; nvmlShutdown; nvmlDeviceGetCount_v2; \
         nvmlDeviceGetHandleByIndex_v2; nvmlDeviceGetUUID; nvmlDeviceGetUtilizationRates; \
         local: *; };\n",
    )
    .unwrap();
    let flag = format!("-Wl,--version-script={}", map.display());
    stub_dir("bare", &[&flag])
}

/// Writes (or atomically replaces, so the stand-in reloads it) the scenario file.
fn write_scenario(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn env<'a>(lib: &'a Path, scenario: &'a Path) -> [(&'static str, &'a str); 2] {
    [
        ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
        ("NVML_STUB_SCENARIO", scenario.to_str().unwrap()),
    ]
}

/// `edgewatch gpus` against the stand-in: (exit code, stdout, stderr).
fn gpus(lib: &Path, scenario: &Path) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(crate::support::bin())
        .arg("gpus")
        .envs(env(lib, scenario))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const RUN: &str = "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[rollup]\nenabled = false\n[nvml]\ninterval = \"200ms\"\nprocesses = true\n";

fn start(dir: &Path, lib: &Path, scenario_text: &str) -> (Agent, PathBuf) {
    let scenario = dir.join("scenario.txt");
    write_scenario(&scenario, scenario_text);
    let agent = Agent::start_with_env(dir, RUN, &env(lib, &scenario));
    (agent, scenario)
}

fn nvml_status(agent: &Agent) -> J {
    agent.status()["collectors"]["nvml"].clone()
}

/// Waits until the collector has taken at least `n` samples and they are stored: collector
/// batches wait up to `[ingest] flush_interval` for the writer's next commit, so two more
/// commits after the count is reached mean every one of them is in the store.
fn wait_samples(agent: &Agent, n: u64) -> J {
    let s = wait_for(Duration::from_secs(20), || {
        let s = nvml_status(agent);
        (s["samples"].as_u64().unwrap_or(0) >= n).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "fewer than {n} NVML samples: {}\n{}",
            nvml_status(agent),
            agent.log_text()
        )
    });
    let commits = || agent.status()["ingest"]["commits"].as_u64().unwrap_or(0);
    let c0 = commits();
    wait_for(Duration::from_secs(20), || {
        (commits() >= c0 + 2).then_some(())
    })
    .unwrap_or_else(|| panic!("the writer stopped committing\n{}", agent.log_text()));
    s
}

/// Every stored point of `measurement`: (tags as `k=v,...`, field) -> [(ts, value)].
fn points(agent: &Agent, measurement: &str) -> BTreeMap<(String, String), Vec<(i64, J)>> {
    let mut out: BTreeMap<(String, String), Vec<(i64, J)>> = BTreeMap::new();
    for (tags, field, ts, v) in
        crate::support::stored_points(agent, &format!("measurement={measurement}&limit=100000000"))
    {
        out.entry((tags, field)).or_default().push((ts, v));
    }
    out
}

/// The newest value of each (tags, field).
fn latest(agent: &Agent, measurement: &str) -> BTreeMap<(String, String), J> {
    points(agent, measurement)
        .into_iter()
        .filter_map(|(k, pts)| pts.into_iter().max_by_key(|p| p.0).map(|p| (k, p.1)))
        .collect()
}

fn tags_gpu(index: u32, uuid: &str, name: &str, arch: &str, cc: &str, cuda: &str) -> String {
    let mut t = vec![];
    if !arch.is_empty() {
        t.push(format!("arch={arch}"));
    }
    if !cc.is_empty() {
        t.push(format!("cc={cc}"));
    }
    if !cuda.is_empty() {
        t.push(format!("cuda={cuda}"));
    }
    t.push("driver=550.54.15".into());
    t.push(format!("gpu={index}"));
    t.push(format!("name={name}"));
    t.push(format!("uuid={uuid}"));
    t.join(",")
}

fn f(v: f64) -> J {
    J::from(v)
}

fn i(v: i64) -> J {
    J::from(v)
}

/// GPU 0's `gpu` fields as the scenario gives them, in the documented units: MiB from
/// bytes, W from mW, the fans' mean, the throttle bitmask raw (unknown bit kept) and split.
fn gpu0_fields() -> Vec<(&'static str, J)> {
    vec![
        ("util_gpu_pct", f(42.0)),
        ("util_mem_pct", f(17.0)),
        ("mem_total_mb", f(15360.0)),
        ("mem_used_mb", f(1024.0)),
        ("mem_free_mb", f(14336.0)),
        ("bar1_total_mb", f(256.0)),
        ("bar1_used_mb", f(2.0)),
        ("bar1_free_mb", f(254.0)),
        ("temp_c", f(55.0)),
        ("temp_slowdown_c", f(90.0)),
        ("temp_shutdown_c", f(95.0)),
        ("temp_max_operating_c", f(87.0)),
        ("power_w", f(60.5)),
        ("power_limit_w", f(60.0)),
        ("energy_mj", i(123_456_789)),
        ("clock_graphics_mhz", f(1410.0)),
        ("clock_sm_mhz", f(1395.0)),
        ("clock_mem_mhz", f(6251.0)),
        ("clock_video_mhz", f(1275.0)),
        ("clock_graphics_max_mhz", f(1770.0)),
        ("clock_sm_max_mhz", f(1770.0)),
        ("clock_mem_max_mhz", f(6251.0)),
        ("clock_video_max_mhz", f(1650.0)),
        ("throttle_reasons", i(0x1005)),
        ("throttle_idle", i(1)),
        ("throttle_app_clocks", i(0)),
        ("throttle_power_cap", i(1)),
        ("throttle_hw_slowdown", i(0)),
        ("throttle_sync_boost", i(0)),
        ("throttle_sw_thermal", i(0)),
        ("throttle_hw_thermal", i(0)),
        ("throttle_power_brake", i(0)),
        ("throttle_display_clocks", i(0)),
        ("pcie_tx_kib_s", f(1200.0)),
        ("pcie_rx_kib_s", f(3400.0)),
        ("pcie_link_gen", i(4)),
        ("pcie_link_width", i(16)),
        ("fan_pct", f(40.0)),
        ("ecc_enabled", i(1)),
        ("ecc_corrected", i(3)),
        ("ecc_uncorrected", i(0)),
        ("mig_mode", i(1)),
        ("mig_mode_pending", i(0)),
    ]
}

fn expect(tags: &str, fields: &[(&str, J)]) -> BTreeMap<(String, String), J> {
    fields
        .iter()
        .map(|(k, v)| ((tags.to_string(), k.to_string()), v.clone()))
        .collect()
}

/// The report's lines for one GPU: every metric's row, then the two summaries.
fn report_block(
    index: u32,
    name: &str,
    tags: &str,
    supported: &[&str],
    mig_on: bool,
) -> Vec<String> {
    use edgewatch::collect::nvml::Metric;
    let mut out = vec![
        String::new(),
        format!("GPU {index}: {name}"),
        format!("  tags: {tags}"),
        format!("  {:<20} {:<16} fields", "metric", "support"),
    ];
    let (mut yes, mut no) = (vec![], vec![]);
    for m in Metric::ALL {
        let support = if m == Metric::MigInstances && !mig_on {
            "n/a (MIG off)"
        } else if supported.contains(&m.name()) {
            yes.push(m.name());
            "supported"
        } else {
            no.push(m.name());
            "not supported"
        };
        let mut fields = format!("{}: {}", m.measurement(), m.fields().join(", "));
        if m.is_per_process() {
            fields.push_str(" (with [nvml] processes = true)");
        }
        out.push(format!("  {:<20} {:<16} {fields}", m.name(), support));
    }
    let list = |v: &[&str]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    out.push(format!("  supported: {}", list(&yes)));
    out.push(format!("  not supported: {}", list(&no)));
    out
}

#[test]
fn gpus_report_is_exact_for_the_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.txt");
    write_scenario(&scenario, SCENARIO);
    let (code, stdout, stderr) = gpus(&new_lib(), &scenario);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stderr, "");
    let all: Vec<&str> = edgewatch::collect::nvml::Metric::ALL
        .iter()
        .map(|m| m.name())
        .collect();
    let mut want = vec![
        "NVIDIA driver 550.54.15, CUDA driver 12.4".to_string(),
        "2 GPU(s)".to_string(),
    ];
    want.extend(report_block(
        0,
        "NVIDIA A2",
        &format!("gpu=0 uuid={GPU0_UUID} name=\"NVIDIA A2\" arch=Ampere cc=8.6 driver=550.54.15 cuda=12.4"),
        &all,
        true,
    ));
    want.extend(report_block(
        1,
        "NVIDIA RTX A2000",
        &format!("gpu=1 uuid={GPU1_UUID} name=\"NVIDIA RTX A2000\" arch=Turing cc=7.5 driver=550.54.15 cuda=12.4"),
        &GPU1_SUPPORTED,
        false,
    ));
    let want = want.join("\n") + "\n";
    assert_eq!(stdout, want, "got:\n{stdout}");
}

/// What `run` stores: every scenario value, converted as documented, under the right tags.
#[test]
fn run_stores_the_scenario_values_and_skips_unsupported_metrics_once() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _scenario) = start(dir.path(), &new_lib(), SCENARIO);
    wait_samples(&agent, 6);
    let t0 = tags_gpu(0, GPU0_UUID, "NVIDIA A2", "Ampere", "8.6", "12.4");
    let t1 = tags_gpu(1, GPU1_UUID, "NVIDIA RTX A2000", "Turing", "7.5", "12.4");
    let mut want = expect(&t0, &gpu0_fields());
    want.extend(expect(
        &t1,
        &[
            ("util_gpu_pct", f(5.0)),
            ("util_mem_pct", f(1.0)),
            ("mem_total_mb", f(6144.0)),
            ("mem_used_mb", f(512.0)),
            ("mem_free_mb", f(5632.0)),
            ("power_w", f(20.25)),
        ],
    ));
    let got = wait_for(Duration::from_secs(10), || {
        let got = latest(&agent, "gpu");
        (got.len() >= want.len()).then_some(got)
    })
    .unwrap_or_else(|| panic!("gpu points incomplete: {:?}", latest(&agent, "gpu")));
    assert_eq!(got, want);

    let mig = |slot: u32, uuid: &str| format!("gpu=0,mig={slot},mig_uuid={uuid},uuid={GPU0_UUID}");
    let mut want_mig = expect(
        &mig(0, "MIG-0a1b2c3d-0000-4000-8000-0000000000a0"),
        &[
            ("mem_total_mb", f(5120.0)),
            ("mem_used_mb", f(1024.0)),
            ("mem_free_mb", f(4096.0)),
        ],
    );
    want_mig.extend(expect(
        &mig(2, "MIG-0a1b2c3d-0000-4000-8000-0000000000a2"),
        &[
            ("mem_total_mb", f(2560.0)),
            ("mem_used_mb", f(0.0)),
            ("mem_free_mb", f(2560.0)),
        ],
    ));
    assert_eq!(latest(&agent, "gpu_mig"), want_mig);

    let proc_tags =
        |pid: u32, name: &str| format!("gpu=0,pid={pid},process={name},uuid={GPU0_UUID}");
    let mut want_proc = expect(
        &proc_tags(4242, "python3"),
        &[
            ("mem_used_mb", f(512.0)),
            ("sm_util_pct", f(35.0)),
            ("mem_util_pct", f(12.0)),
        ],
    );
    // Memory the driver cannot tell (NVML_VALUE_NOT_AVAILABLE) is left out; no utilization
    // sample means idle.
    want_proc.extend(expect(
        &proc_tags(4243, "trtexec"),
        &[("sm_util_pct", f(0.0)), ("mem_util_pct", f(0.0))],
    ));
    assert_eq!(latest(&agent, "gpu_process"), want_proc);

    // Unsupported: skipped, listed in the status, logged once for the GPU.
    let st = nvml_status(&agent);
    assert_eq!(st["state"], "running", "{st}");
    assert_eq!(st["driver"], "550.54.15");
    assert_eq!(st["cuda"], "12.4");
    assert_eq!(st["gpus"][0]["unsupported"], serde_json::json!([]), "{st}");
    let unsupported: Vec<&str> = edgewatch::collect::nvml::Metric::ALL
        .iter()
        .map(|m| m.name())
        .filter(|n| !GPU1_SUPPORTED.contains(n) && *n != "mig_instances")
        .collect();
    assert_eq!(st["gpus"][1]["unsupported"], serde_json::json!(unsupported));
    assert_eq!(st["gpus"][1]["lost"], false);
    let log = agent.log_text();
    let notes: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("NVML does not support"))
        .collect();
    assert_eq!(notes.len(), 1, "{log}");
    assert!(
        notes[0].contains(&format!(
            "NVML does not support {} on this GPU",
            unsupported.join(", ")
        )) && notes[0].contains(GPU1_UUID),
        "{}",
        notes[0]
    );
    assert!(!log.contains("WARN"), "{log}");
}

/// GPU 1 falls off the bus from its 4th sample: marked lost (once in the log), GPU 0 keeps
/// being sampled, and once the scenario says it answers again, the retry brings it back.
#[test]
fn a_lost_gpu_is_marked_lost_while_the_other_is_sampled_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let lost = format!("{SCENARIO}gpu 1 lost 4\n");
    let (agent, scenario) = start(dir.path(), &new_lib(), &lost);
    let st = wait_for(Duration::from_secs(20), || {
        let st = nvml_status(&agent);
        (st["gpus"][1]["lost"] == true).then_some(st)
    })
    .unwrap_or_else(|| panic!("GPU 1 never lost: {}", nvml_status(&agent)));
    assert_eq!(st["gpus"][0]["lost"], false, "{st}");
    assert_eq!(
        st["gpus"][1]["last_error"],
        "utilization: device fell off the bus or has otherwise become inacessible",
        "{st}"
    );
    // Samples stored per GPU: one `util_gpu_pct` point each.
    let count = |agent: &Agent, gpu: &str| {
        points(agent, "gpu")
            .into_iter()
            .find(|((tags, field), _)| {
                tags.contains(&format!(",gpu={gpu},")) && field == "util_gpu_pct"
            })
            .map_or(0, |(_, p)| p.len())
    };
    // GPU 1 answered 3 samples before it was lost (waiting for the store to have them).
    let gpu1_then = 3;
    wait_for(Duration::from_secs(5), || {
        (count(&agent, "1") == gpu1_then).then_some(())
    })
    .unwrap_or_else(|| panic!("GPU 1 points: {}", count(&agent, "1")));
    let gpu0_then = count(&agent, "0");
    // GPU 0 goes on while GPU 1 is lost.
    wait_samples(&agent, st["samples"].as_u64().unwrap() + 5);
    // The status counts a sample before the writer commits its points: wait for the store.
    wait_for(Duration::from_secs(5), || {
        (count(&agent, "0") >= gpu0_then + 5).then_some(())
    })
    .unwrap_or_else(|| panic!("GPU 0 points: {} (had {gpu0_then})", count(&agent, "0")));
    assert_eq!(count(&agent, "1"), gpu1_then, "no points from a lost GPU");
    assert_eq!(nvml_status(&agent)["gpus"][1]["lost"], true);

    // Back on the bus: the first retry (10 s after the loss) finds it.
    write_scenario(&scenario, SCENARIO);
    let st = wait_for(Duration::from_secs(25), || {
        let st = nvml_status(&agent);
        (st["gpus"][1]["lost"] == false).then_some(st)
    })
    .unwrap_or_else(|| panic!("GPU 1 never recovered: {}", nvml_status(&agent)));
    assert_eq!(st["gpus"][1]["last_error"], J::Null, "{st}");
    wait_samples(&agent, st["samples"].as_u64().unwrap() + 2);
    assert!(count(&agent, "1") > gpu1_then, "GPU 1 sampled again");
    let log = agent.log_text();
    assert_eq!(
        log.matches("GPU lost (fallen off the bus").count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("GPU reachable again").count(), 1, "{log}");
}

/// One metric of GPU 1 (`power`) answers GPU_IS_LOST from the 3rd sample on: the GPU is
/// marked lost naming that metric, no `power_w` after the 2nd sample, GPU 0 unaffected.
#[test]
fn a_metric_that_answers_gpu_lost_marks_its_gpu_lost() {
    let dir = tempfile::tempdir().unwrap();
    let text = SCENARIO.replace("gpu 1 power 20250", "gpu 1 power 20250 GPU_IS_LOST 3");
    let (agent, _) = start(dir.path(), &new_lib(), &text);
    let st = wait_for(Duration::from_secs(20), || {
        let st = nvml_status(&agent);
        (st["gpus"][1]["lost"] == true).then_some(st)
    })
    .unwrap_or_else(|| panic!("GPU 1 never lost: {}", nvml_status(&agent)));
    assert_eq!(
        st["gpus"][1]["last_error"],
        "power: device fell off the bus or has otherwise become inacessible"
    );
    wait_samples(&agent, st["samples"].as_u64().unwrap() + 3);
    let st = nvml_status(&agent);
    assert_eq!(st["gpus"][0]["lost"], false, "{st}");
    let pts = points(&agent, "gpu");
    let n = |gpu: &str, field: &str| {
        pts.iter()
            .find(|((tags, f), _)| tags.contains(&format!(",gpu={gpu},")) && f == field)
            .map_or(0, |(_, p)| p.len())
    };
    assert_eq!(n("1", "power_w"), 2, "{pts:?}");
    assert!(n("0", "power_w") >= 5, "{pts:?}");
}

/// An older driver's library (no `nvmlDeviceGetMemoryInfo_v2`, `_v2` CUDA version, `_v2`
/// fan speed, `_v3` process lists, architecture or MIG calls): the agent falls back to the
/// older entry points where NVML had one and skips the rest per metric; it never crashes.
#[test]
fn an_older_driver_falls_back_to_older_entry_points_and_degrades_per_metric() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.txt");
    write_scenario(&scenario, SCENARIO);
    let (code, stdout, stderr) = gpus(&old_lib(), &scenario);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with("NVIDIA driver 550.54.15, CUDA driver 12.4\n2 GPU(s)\n"),
        "{stdout}"
    );
    let gpu0 = stdout.split("\nGPU 1: ").next().unwrap();
    for (metric, support) in [
        ("memory", "supported"),
        ("fan", "supported"),
        ("processes", "supported"),
        ("mig_mode", "not supported"),
        ("mig_instances", "n/a (MIG off)"),
    ] {
        let row = format!("  {metric:<20} {support:<16} ");
        assert!(gpu0.contains(&row), "no `{row}` in\n{gpu0}");
    }
    assert!(gpu0.contains(" arch=unknown cc=8.6 "), "{gpu0}");

    let (agent, _) = start(dir.path(), &old_lib(), SCENARIO);
    wait_samples(&agent, 4);
    let t0 = tags_gpu(0, GPU0_UUID, "NVIDIA A2", "", "8.6", "12.4");
    let want: BTreeMap<_, _> = gpu0_fields()
        .into_iter()
        // Only the first fan through the single-fan call; no MIG calls at all.
        .map(|(k, v)| if k == "fan_pct" { (k, f(30.0)) } else { (k, v) })
        .filter(|(k, _)| !k.starts_with("mig_"))
        .map(|(k, v)| ((t0.clone(), k.to_string()), v))
        .collect();
    let got: BTreeMap<_, _> = wait_for(Duration::from_secs(10), || {
        let got: BTreeMap<_, _> = latest(&agent, "gpu")
            .into_iter()
            .filter(|((tags, _), _)| tags.contains("gpu=0,"))
            .collect();
        (got.len() >= want.len()).then_some(got)
    })
    .unwrap_or_else(|| panic!("gpu points incomplete: {:?}", latest(&agent, "gpu")));
    assert_eq!(got, want);
    let procs = latest(&agent, "gpu_process");
    assert_eq!(
        procs.get(&(
            format!("gpu=0,pid=4242,process=python3,uuid={GPU0_UUID}"),
            "mem_used_mb".to_string()
        )),
        Some(&f(512.0)),
        "{procs:?}"
    );
    assert!(latest(&agent, "gpu_mig").is_empty());
    let st = nvml_status(&agent);
    assert_eq!(st["state"], "running", "{st}");
    assert_eq!(
        st["gpus"][0]["unsupported"],
        serde_json::json!(["mig_mode"])
    );
    let log = agent.log_text();
    assert!(!log.contains("WARN"), "{log}");
}

/// A library missing nearly every symbol: each missing one is an unsupported metric (or an
/// unknown tag); the agent reports, samples what is there, and never crashes.
#[test]
fn a_library_missing_symbols_degrades_per_metric() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.txt");
    write_scenario(&scenario, SCENARIO);
    let (code, stdout, stderr) = gpus(&bare_lib(), &scenario);
    assert_eq!(code, Some(0), "{stderr}");
    let mut want = vec![
        "NVIDIA driver unknown, CUDA driver unknown".to_string(),
        "2 GPU(s)".to_string(),
    ];
    for (i, uuid) in [GPU0_UUID, GPU1_UUID].into_iter().enumerate() {
        want.extend(report_block(
            i as u32,
            "unknown",
            &format!(
                "gpu={i} uuid={uuid} name=\"\" arch=unknown cc=unknown driver=unknown cuda=unknown"
            ),
            &["utilization"],
            false,
        ));
    }
    assert_eq!(stdout, want.join("\n") + "\n", "got:\n{stdout}");

    let (agent, _) = start(dir.path(), &bare_lib(), SCENARIO);
    wait_samples(&agent, 4);
    let got = latest(&agent, "gpu");
    let tags = |i: u32, uuid: &str| format!("gpu={i},uuid={uuid}");
    let mut want = expect(
        &tags(0, GPU0_UUID),
        &[("util_gpu_pct", f(42.0)), ("util_mem_pct", f(17.0))],
    );
    want.extend(expect(
        &tags(1, GPU1_UUID),
        &[("util_gpu_pct", f(5.0)), ("util_mem_pct", f(1.0))],
    ));
    assert_eq!(got, want);
    let st = nvml_status(&agent);
    assert_eq!(st["state"], "running", "{st}");
    assert_eq!(st["gpus"][0]["lost"], false, "{st}");
    let log = agent.log_text();
    assert_eq!(log.matches("NVML does not support").count(), 2, "{log}");
    assert!(!log.contains("WARN"), "{log}");
}

/// The wall time of one sample through the real FFI path (two GPUs, every metric on one,
/// per-process metrics on), as the collector measures it: printed for the record, and
/// bounded loosely so a pathological regression fails.
#[test]
fn per_sample_cost_through_the_ffi_path() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _) = start(dir.path(), &new_lib(), SCENARIO);
    wait_samples(&agent, 3);
    let mut us = Vec::new();
    let mut last = 0;
    while us.len() < 20 {
        let st = wait_samples(&agent, last + 1);
        last = st["samples"].as_u64().unwrap();
        us.push(st["last_sample_us"].as_u64().unwrap());
    }
    us.sort_unstable();
    let (median, max) = (us[us.len() / 2], us[us.len() - 1]);
    eprintln!(
        "nvml per-sample cost through the stand-in (2 GPUs, {} build): median {median} µs, max {max} µs over {} samples",
        if cfg!(debug_assertions) { "debug" } else { "release" },
        us.len()
    );
    assert!(median < 50_000, "median {median} µs: {us:?}");
}
