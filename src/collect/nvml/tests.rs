//! Unit tests of the NVML collector over [`FakeGpu`].

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvml_wrapper::error::NvmlError;
use serde_json::json;

use super::error::handle_error;
use super::*;
use crate::config::values::Interval;
use crate::model::{split_series_key, Batch, Line, Value};

fn sampler(fake: FakeGpu, processes: bool) -> (Sampler<FakeGpu>, Arc<NvmlStatus>) {
    let status = Arc::new(NvmlStatus::new());
    let s = Sampler::new(fake, processes, status.clone()).unwrap();
    (s, status)
}

fn field<'a>(line: &'a Line, name: &str) -> Option<&'a Value> {
    line.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn lines_of<'a>(batch: &'a Batch, measurement: &str) -> Vec<&'a Line> {
    batch
        .lines
        .iter()
        .filter(|l| split_series_key(&l.key).0 == measurement)
        .collect()
}

#[test]
fn config_defaults_and_unknown_keys() {
    let c = NvmlConfig::default();
    assert!(c.enabled);
    assert!(!c.processes);
    assert_eq!(c.interval.0, Duration::from_secs(5));
    let c: NvmlConfig = toml::from_str("processes = true\ninterval = \"1s\"").unwrap();
    assert!(c.processes && c.enabled);
    assert_eq!(c.interval.0, Duration::from_secs(1));
    assert!(toml::from_str::<NvmlConfig>("proceses = true").is_err());
}

#[test]
fn gpu_line_is_tagged_with_index_uuid_name_arch_cc_and_versions() {
    let (mut s, _) = sampler(FakeGpu::typical(1), false);
    let out = s.sample(7);
    let gpu = lines_of(&out.batch, "gpu");
    assert_eq!(gpu.len(), 1);
    assert_eq!(gpu[0].ts, 7);
    let (_, tags) = split_series_key(&gpu[0].key);
    let tags: BTreeMap<String, String> = tags.into_iter().collect();
    let want: BTreeMap<String, String> = [
        ("gpu", "0"),
        ("uuid", "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"),
        ("name", "NVIDIA A2"),
        ("arch", "Ampere"),
        ("cc", "8.6"),
        ("driver", "550.54.15"),
        ("cuda", "12.4"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(tags, want);
    // A tag NVML cannot tell is left out, not written empty.
    let mut fake = FakeGpu::typical(1);
    fake.devices[0].identity.arch.clear();
    let (mut s, _) = sampler(fake, false);
    let out = s.sample(1);
    assert!(!out.batch.lines[0].key.contains("arch="));
}

#[test]
fn every_metric_maps_to_its_documented_fields() {
    let (mut s, _) = sampler(FakeGpu::typical(1), false);
    let out = s.sample(1);
    let gpu = lines_of(&out.batch, "gpu")[0];
    let mib = |n: f64| Value::F64(n);
    let want: Vec<(&str, Value)> = vec![
        ("util_gpu_pct", Value::F64(42.0)),
        ("util_mem_pct", Value::F64(17.0)),
        ("mem_total_mb", mib(16384.0)),
        ("mem_used_mb", mib(4096.0)),
        ("mem_free_mb", mib(12288.0)),
        ("bar1_total_mb", mib(256.0)),
        ("bar1_used_mb", mib(8.0)),
        ("bar1_free_mb", mib(248.0)),
        ("temp_c", Value::F64(55.0)),
        ("temp_slowdown_c", Value::F64(90.0)),
        ("temp_shutdown_c", Value::F64(95.0)),
        ("temp_max_operating_c", Value::F64(87.0)),
        ("power_w", Value::F64(61.5)),
        ("power_limit_w", Value::F64(70.0)),
        ("energy_mj", Value::I64(123_456_789)),
        ("clock_graphics_mhz", Value::F64(1410.0)),
        ("clock_sm_mhz", Value::F64(1410.0)),
        ("clock_mem_mhz", Value::F64(6251.0)),
        ("clock_video_mhz", Value::F64(1275.0)),
        ("clock_graphics_max_mhz", Value::F64(1770.0)),
        ("clock_sm_max_mhz", Value::F64(1770.0)),
        ("clock_mem_max_mhz", Value::F64(6251.0)),
        ("clock_video_max_mhz", Value::F64(1650.0)),
        ("throttle_reasons", Value::I64(0x44)),
        ("throttle_idle", Value::I64(0)),
        ("throttle_app_clocks", Value::I64(0)),
        ("throttle_power_cap", Value::I64(1)),
        ("throttle_hw_slowdown", Value::I64(0)),
        ("throttle_sync_boost", Value::I64(0)),
        ("throttle_sw_thermal", Value::I64(0)),
        ("throttle_hw_thermal", Value::I64(1)),
        ("throttle_power_brake", Value::I64(0)),
        ("throttle_display_clocks", Value::I64(0)),
        ("pcie_tx_kib_s", Value::F64(2048.0)),
        ("pcie_rx_kib_s", Value::F64(1024.0)),
        ("pcie_link_gen", Value::I64(4)),
        ("pcie_link_width", Value::I64(8)),
        ("fan_pct", Value::F64(35.0)),
        ("ecc_enabled", Value::I64(1)),
        ("ecc_corrected", Value::I64(3)),
        ("ecc_uncorrected", Value::I64(0)),
        ("mig_mode", Value::I64(0)),
        ("mig_mode_pending", Value::I64(0)),
    ];
    let got: Vec<(&str, Value)> = gpu
        .fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    assert_eq!(got, want);
    // The documented list (`Metric::fields`, used by the report and the README) is
    // exactly what the gpu line carries.
    let documented: Vec<&str> = Metric::ALL
        .iter()
        .filter(|m| m.measurement() == "gpu")
        .flat_map(|m| m.fields().iter().copied())
        .collect();
    let names: Vec<&str> = want.iter().map(|(k, _)| *k).collect();
    assert_eq!(documented, names);
    // No MIG and no process lines unless asked for.
    assert_eq!(out.batch.len(), 1);
    // ECC off: the mode only, no counts.
    let mut fields = Vec::new();
    gpu_fields(
        Metric::Ecc,
        &Reading::Ecc {
            enabled: false,
            corrected: Some(9),
            uncorrected: None,
        },
        &mut fields,
    );
    assert_eq!(fields, vec![("ecc_enabled".to_string(), Value::I64(0))]);
    // A reading of the wrong shape gives nothing rather than a wrong field.
    let mut fields = Vec::new();
    gpu_fields(Metric::Power, &Reading::Celsius(3), &mut fields);
    assert!(fields.is_empty());
}

#[test]
fn throttle_bitmask_becomes_one_flag_per_reason() {
    let gpu = GpuIdentity::default();
    let sys = SystemInfo::default();
    for (bit, name) in THROTTLE_REASONS {
        let lines = readings_to_lines(
            &sys,
            &gpu,
            &[(Metric::ThrottleReasons, Reading::Bitmask(bit | 0x1000))],
            0,
        );
        let l = &lines[0];
        // The raw mask keeps bits no named reason covers.
        assert_eq!(
            field(l, "throttle_reasons"),
            Some(&Value::I64((bit | 0x1000) as i64))
        );
        for (_, other) in THROTTLE_REASONS {
            let want = i64::from(other == name);
            assert_eq!(
                field(l, other),
                Some(&Value::I64(want)),
                "{name} vs {other}"
            );
        }
    }
    let lines = readings_to_lines(
        &sys,
        &gpu,
        &[(Metric::ThrottleReasons, Reading::Bitmask(0))],
        0,
    );
    assert!(lines[0].fields[1..]
        .iter()
        .all(|(_, v)| *v == Value::I64(0)));
}

#[test]
fn throttle_bits_match_nvml() {
    use nvml_wrapper::bitmasks::device::ThrottleReasons as T;
    let nvml = [
        (T::GPU_IDLE, "throttle_idle"),
        (T::APPLICATIONS_CLOCKS_SETTING, "throttle_app_clocks"),
        (T::SW_POWER_CAP, "throttle_power_cap"),
        (T::HW_SLOWDOWN, "throttle_hw_slowdown"),
        (T::SYNC_BOOST, "throttle_sync_boost"),
        (T::SW_THERMAL_SLOWDOWN, "throttle_sw_thermal"),
        (T::HW_THERMAL_SLOWDOWN, "throttle_hw_thermal"),
        (T::HW_POWER_BRAKE_SLOWDOWN, "throttle_power_brake"),
        (T::DISPLAY_CLOCK_SETTING, "throttle_display_clocks"),
    ];
    for ((bit, name), (t, n)) in THROTTLE_REASONS.iter().zip(nvml) {
        assert_eq!((*bit, *name), (t.bits(), n));
    }
}

#[test]
fn not_supported_is_skipped_recorded_once_and_not_asked_again() {
    let mut fake = FakeGpu::typical(1);
    for m in [Metric::Bar1, Metric::Fan, Metric::Ecc, Metric::TempShutdown] {
        fake.devices[0]
            .readings
            .insert(m, Err(ReadError::NotSupported));
    }
    let (mut s, status) = sampler(fake, false);
    let out = s.sample(1);
    assert_eq!(out.errors, 0);
    let gpu = lines_of(&out.batch, "gpu")[0];
    assert!(field(gpu, "bar1_used_mb").is_none());
    assert!(field(gpu, "fan_pct").is_none());
    assert!(field(gpu, "ecc_enabled").is_none());
    assert!(field(gpu, "temp_shutdown_c").is_none());
    assert_eq!(field(gpu, "temp_c"), Some(&Value::F64(55.0)));
    let st = status.gpus();
    assert_eq!(
        st[0].unsupported,
        vec!["bar1", "temp_shutdown", "fan", "ecc"]
    );
    // Second sample: the unsupported ones and the cached thresholds/max clocks are not
    // asked for again.
    let before = s.source_mut().reads;
    let out = s.sample(2);
    let asked = s.source_mut().reads - before;
    let dynamic = Metric::ALL
        .iter()
        .filter(|m| !m.is_static() && !m.is_per_process() && **m != Metric::MigInstances)
        .count() as u64;
    assert_eq!(asked, dynamic - 3);
    assert_eq!(out.errors, 0);
    assert_eq!(
        field(lines_of(&out.batch, "gpu")[0], "temp_slowdown_c"),
        Some(&Value::F64(90.0))
    );
    // After an hour they are probed once more, and still reported unsupported.
    let before = s.source_mut().reads;
    s.sample(2 + REPROBE_NS);
    // The dynamic ones, plus the unsupported threshold (never cached).
    assert_eq!(s.source_mut().reads - before, dynamic + 1);
    assert_eq!(status.gpus()[0].unsupported.len(), 4);
}

/// Log lines (debug and up) of the whole test binary, captured from the first call on.
/// A global subscriber, because a scoped one (`with_default`) misses events whose
/// callsite another test thread registered first; callers filter on their own markers.
fn captured_logs() -> Option<Arc<Mutex<Vec<u8>>>> {
    static BUF: std::sync::OnceLock<Option<Arc<Mutex<Vec<u8>>>>> = std::sync::OnceLock::new();
    BUF.get_or_init(|| {
        #[derive(Clone)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Arc::new(Mutex::new(Vec::new()));
        let w = Buf(buf.clone());
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::set_global_default(sub)
            .ok()
            .map(|_| buf)
    })
    .clone()
}

#[test]
fn not_supported_errors_and_losses_are_logged_once() {
    let Some(buf) = captured_logs() else {
        return; // another global subscriber is installed: nothing to observe
    };
    let mut fake = FakeGpu::typical(3);
    for (i, d) in fake.devices.iter_mut().enumerate() {
        d.identity.uuid = format!("GPU-logtest-{i}");
    }
    for m in [Metric::Bar1, Metric::Fan] {
        fake.devices[0].readings.remove(&m);
    }
    fake.devices[0]
        .readings
        .insert(Metric::Power, Err(ReadError::Other("boom".into())));
    // GPU 1 flaps: its handle answers, its memory read says lost, every time.
    fake.devices[1]
        .readings
        .insert(Metric::Memory, Err(ReadError::GpuLost("gone".into())));
    let (mut s, status) = sampler(fake, false);
    let mut errors = 0;
    for k in 0..6 {
        errors += s.sample(k * MAX_BACKOFF_NS * 2).errors;
    }
    // GPU 2 falls off the bus, then comes back.
    s.source_mut().devices[2].lost = true;
    s.source_mut().devices[2]
        .readings
        .insert(Metric::Temperature, Err(ReadError::GpuLost("gone".into())));
    s.sample(6 * MAX_BACKOFF_NS * 2);
    s.source_mut().devices[2].lost = false;
    s.source_mut().devices[2].readings = FakeDevice::typical(2).readings;
    s.sample(7 * MAX_BACKOFF_NS * 2);
    s.sample(8 * MAX_BACKOFF_NS * 2);
    assert_eq!(errors, 6 + 6); // each failed read counts, logged or not
    assert!(!status.gpus()[2].lost);

    let logs = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
    let count = |gpu: &str, needle: &str| {
        logs.lines()
            .filter(|l| l.contains(&format!("uuid={gpu} ")) && l.contains(needle))
            .count()
    };
    let g0 = "GPU-logtest-0";
    assert_eq!(
        count(g0, "does not support bar1, fan on this GPU"),
        1,
        "{logs}"
    );
    assert_eq!(count(g0, "INFO"), 1, "{logs}");
    assert_eq!(count(g0, "WARN"), 1, "{logs}");
    assert_eq!(count(g0, "boom"), 9, "{logs}"); // the rest at debug
    let g1 = "GPU-logtest-1";
    assert_eq!(count(g1, "WARN"), 1, "{logs}");
    assert_eq!(count(g1, "GPU lost ("), 1, "{logs}");
    assert_eq!(count(g1, "GPU lost again"), 8, "{logs}");
    assert_eq!(count(g1, "INFO"), 0, "{logs}");
    let g2 = "GPU-logtest-2";
    assert_eq!(count(g2, "WARN"), 1, "{logs}");
    assert_eq!(count(g2, "GPU reachable again"), 1, "{logs}");
}

#[test]
fn a_gpu_supporting_nothing_gives_no_line_and_no_error() {
    // Jetson Orin: NVML lists the GPU but answers NotSupported to nearly everything.
    let mut fake = FakeGpu::typical(1);
    fake.devices[0].readings.clear();
    fake.devices[0].identity.name = "Orin (nvgpu)".into();
    let (mut s, status) = sampler(fake, true);
    let out = s.sample(1);
    assert!(out.batch.is_empty());
    assert_eq!(out.errors, 0);
    let g = &status.gpus()[0];
    assert!(!g.lost && g.last_error.is_none());
    assert_eq!(g.unsupported.len(), Metric::ALL.len() - 1); // MIG instances never asked
    let before = s.source_mut().reads;
    s.sample(2);
    assert_eq!(s.source_mut().reads, before);
}

#[test]
fn a_lost_gpu_does_not_stop_the_others_and_is_retried_with_backoff() {
    let mut fake = FakeGpu::typical(2);
    fake.devices[1].readings.insert(
        Metric::Temperature,
        Err(ReadError::GpuLost("GPU has fallen off the bus".into())),
    );
    let (mut s, status) = sampler(fake, false);
    let out = s.sample(0);
    assert_eq!(out.errors, 1);
    let gpus: Vec<String> = lines_of(&out.batch, "gpu")
        .iter()
        .map(|l| l.key.clone())
        .collect();
    // GPU 1's readings before the loss are still sent; GPU 0 is complete.
    assert_eq!(gpus.len(), 2);
    assert!(gpus[0].contains("gpu=0"));
    let st = status.gpus();
    assert!(!st[0].lost);
    assert!(st[1].lost);
    assert!(st[1]
        .last_error
        .as_deref()
        .unwrap()
        .contains("fallen off the bus"));
    // Now the whole GPU is gone; it is not polled until its backoff passes.
    s.source_mut().devices[1].lost = true;
    let out = s.sample(1_000_000_000);
    assert_eq!(out.errors, 0);
    assert_eq!(lines_of(&out.batch, "gpu").len(), 1);
    assert!(lines_of(&out.batch, "gpu")[0].key.contains("gpu=0"));
    // Retry after 10 s fails: the next wait doubles, and no error is counted again.
    let out = s.sample(FIRST_BACKOFF_NS);
    assert_eq!(out.errors, 0);
    assert_eq!(out.batch.len(), 1);
    assert!(status.gpus()[1].lost);
    // Back on the bus, but before the doubled backoff: still skipped.
    s.source_mut().devices[1].lost = false;
    s.source_mut().devices[1].readings = FakeDevice::typical(1).readings;
    let out = s.sample(FIRST_BACKOFF_NS * 2);
    assert_eq!(out.batch.len(), 1);
    let out = s.sample(FIRST_BACKOFF_NS * 3);
    assert_eq!(lines_of(&out.batch, "gpu").len(), 2);
    let st = status.gpus();
    assert!(!st[1].lost);
    assert_eq!(st[1].last_error, None);
}

#[test]
fn a_gpu_unreachable_at_start_is_kept_and_retried() {
    let mut fake = FakeGpu::typical(2);
    fake.devices[0].lost = true;
    let (mut s, status) = sampler(fake, false);
    assert_eq!(s.gpu_count(), 2);
    assert!(status.gpus()[0].lost);
    s.source_mut().devices[0].lost = false;
    let out = s.sample(5);
    assert_eq!(lines_of(&out.batch, "gpu").len(), 2);
    assert_eq!(status.gpus()[0].name, "NVIDIA A2");
}

#[test]
fn other_errors_are_counted_kept_and_the_metric_still_polled() {
    let mut fake = FakeGpu::typical(1);
    fake.devices[0].readings.insert(
        Metric::Power,
        Err(ReadError::Other("an internal driver error occurred".into())),
    );
    let (mut s, status) = sampler(fake, false);
    for ts in 1..=3 {
        let out = s.sample(ts);
        assert_eq!(out.errors, 1);
        let gpu = lines_of(&out.batch, "gpu")[0];
        assert!(field(gpu, "power_w").is_none());
        assert_eq!(field(gpu, "power_limit_w"), Some(&Value::F64(70.0)));
    }
    let g = &status.gpus()[0];
    assert!(!g.lost);
    assert_eq!(
        g.last_error.as_deref(),
        Some("power: an internal driver error occurred")
    );
    assert!(g.unsupported.is_empty());
}

#[test]
fn process_samples_only_when_enabled() {
    let (mut s, _) = sampler(FakeGpu::typical(1), false);
    let before = s.source_mut().reads;
    let out = s.sample(1);
    assert!(lines_of(&out.batch, "gpu_process").is_empty());
    let asked = s.source_mut().reads - before;
    let (mut s, _) = sampler(FakeGpu::typical(1), true);
    let before = s.source_mut().reads;
    let out = s.sample(1);
    assert_eq!(s.source_mut().reads - before, asked + 2);
    let procs = lines_of(&out.batch, "gpu_process");
    assert_eq!(procs.len(), 2);
    assert_eq!(
        procs[0].key,
        "gpu_process,gpu=0,pid=4242,process=python3,uuid=GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    );
    assert_eq!(
        procs[0].fields,
        vec![
            ("mem_used_mb".to_string(), Value::F64(512.0)),
            ("sm_util_pct".to_string(), Value::F64(63.0)),
            ("mem_util_pct".to_string(), Value::F64(21.0)),
        ]
    );
    // Memory unknown (WDDM-like) and no utilization sample: idle, memory left out.
    assert!(procs[1].key.contains("pid=77"));
    assert_eq!(
        procs[1].fields,
        vec![
            ("sm_util_pct".to_string(), Value::F64(0.0)),
            ("mem_util_pct".to_string(), Value::F64(0.0)),
        ]
    );
    // Per-process utilization unsupported: memory only.
    let mut fake = FakeGpu::typical(1);
    fake.devices[0].readings.remove(&Metric::ProcessUtilization);
    let (mut s, _) = sampler(fake, true);
    let out = s.sample(1);
    let procs = lines_of(&out.batch, "gpu_process");
    assert_eq!(procs.len(), 1);
    assert_eq!(
        procs[0].fields,
        vec![("mem_used_mb".to_string(), Value::F64(512.0))]
    );
}

#[test]
fn mig_instances_are_read_only_while_mig_is_on() {
    let mut fake = FakeGpu::typical(1);
    fake.devices[0].readings.insert(
        Metric::MigInstances,
        Err(ReadError::Other("must not be asked".into())),
    );
    let (mut s, _) = sampler(fake, false);
    let out = s.sample(1);
    assert_eq!(out.errors, 0);
    assert!(lines_of(&out.batch, "gpu_mig").is_empty());

    let mut fake = FakeGpu::typical(1);
    let d = &mut fake.devices[0];
    d.readings.insert(
        Metric::MigMode,
        Ok(Reading::MigMode {
            current: true,
            pending: true,
        }),
    );
    d.readings
        .insert(Metric::Utilization, Err(ReadError::NotSupported));
    d.readings.insert(
        Metric::MigInstances,
        Ok(Reading::MigInstances(vec![
            MigInstance {
                index: 0,
                uuid: "MIG-a".into(),
                total: 5 << 30,
                used: 1 << 30,
                free: 4 << 30,
            },
            MigInstance {
                index: 3,
                uuid: "MIG-b".into(),
                total: 10 << 30,
                used: 0,
                free: 10 << 30,
            },
        ])),
    );
    let (mut s, _) = sampler(fake, false);
    let out = s.sample(1);
    let gpu = lines_of(&out.batch, "gpu")[0];
    assert_eq!(field(gpu, "mig_mode"), Some(&Value::I64(1)));
    let migs = lines_of(&out.batch, "gpu_mig");
    assert_eq!(migs.len(), 2);
    assert_eq!(
        migs[0].key,
        "gpu_mig,gpu=0,mig=0,mig_uuid=MIG-a,uuid=GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    );
    assert_eq!(
        migs[1].fields,
        vec![
            ("mem_total_mb".to_string(), Value::F64(10240.0)),
            ("mem_used_mb".to_string(), Value::F64(0.0)),
            ("mem_free_mb".to_string(), Value::F64(10240.0)),
        ]
    );
}

#[test]
fn no_gpu_is_a_clear_error() {
    let e = Sampler::new(FakeGpu::typical(0), false, Arc::new(NvmlStatus::new()))
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "no NVIDIA GPU found: NVML (driver 550.54.15) lists no device"
    );
}

#[test]
fn init_errors_say_what_to_do() {
    let missing = NvmlInitError::from_nvml(NvmlError::LibraryNotFound).to_string();
    assert!(missing.starts_with("no NVIDIA driver found: NVML (libnvidia-ml.so.1)"));
    assert!(missing.contains("tegrastats"));
    let m = NvmlInitError::from_nvml(NvmlError::LibRmVersionMismatch).to_string();
    assert!(
        m.contains("version mismatch") && m.contains("reboot"),
        "{m}"
    );
    let m = NvmlInitError::from_nvml(NvmlError::DriverNotLoaded).to_string();
    assert!(m.contains("kernel driver is not loaded"), "{m}");
    let m = NvmlInitError::from_nvml(NvmlError::NoPermission).to_string();
    assert!(m.contains("/dev/nvidia"), "{m}");
    // Errors from one read.
    assert_eq!(
        ReadError::from(NvmlError::NotSupported),
        ReadError::NotSupported
    );
    assert_eq!(
        ReadError::from(NvmlError::FunctionNotFound),
        ReadError::NotSupported
    );
    assert!(matches!(
        ReadError::from(NvmlError::GpuLost),
        ReadError::GpuLost(_)
    ));
    assert!(matches!(
        ReadError::from(NvmlError::Unknown),
        ReadError::Other(_)
    ));
    assert!(matches!(
        handle_error(NvmlError::Unknown),
        ReadError::GpuLost(_)
    ));
}

#[test]
fn the_real_library_missing_is_a_clean_error() {
    // On a machine with a driver this checks nothing; here (no libnvidia-ml) it checks
    // that loading fails cleanly with the plain message.
    if let Err(e) = NvmlSource::init() {
        let m = e.to_string();
        assert!(!m.is_empty());
        let mut out = Vec::new();
        let r = gpus_report(&mut out);
        assert_eq!(r.err().map(|e| e.to_string()), Some(m));
    }
}

#[test]
fn report_lists_every_metric_with_its_support() {
    let mut fake = FakeGpu::typical(2);
    fake.devices[0]
        .readings
        .insert(Metric::Fan, Err(ReadError::NotSupported));
    fake.devices[0]
        .readings
        .insert(Metric::Ecc, Err(ReadError::Other("no permission".into())));
    fake.devices[1].lost = true;
    let mut out = Vec::new();
    write_report(&mut fake, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("NVIDIA driver 550.54.15, CUDA driver 12.4\n2 GPU(s)\n"));
    assert!(text.contains("GPU 0: NVIDIA A2\n"));
    assert!(text.contains("arch=Ampere cc=8.6"));
    for m in Metric::ALL {
        assert!(text.contains(&format!("  {:<20} ", m.name())), "{m:?}");
    }
    let row = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap()
            .to_string()
    };
    // The support column, exactly (`supported` is also a suffix of `not supported`).
    let support = |name: &str| {
        let r = row(name);
        let rest = &r[23..];
        rest[..rest.find(" gpu").unwrap()].trim_end().to_string()
    };
    assert_eq!(support("fan"), "not supported");
    assert_eq!(support("ecc"), "error: no permission");
    assert_eq!(support("temperature"), "supported");
    assert!(row("temperature").ends_with("gpu: temp_c"));
    assert_eq!(support("mig_instances"), "n/a (MIG off)");
    // The summary names exactly the supported and the unsupported metrics, in table order.
    let expected: Vec<&str> = Metric::ALL
        .iter()
        .filter(|m| ![Metric::Fan, Metric::Ecc, Metric::MigInstances].contains(m))
        .map(|m| m.name())
        .collect();
    assert!(
        text.contains(&format!(
            "\n  supported: {}\n  not supported: fan\n\nGPU 1: error: GPU lost",
            expected.join(", ")
        )),
        "{text}"
    );
    // A GPU that supports nothing says so.
    let mut bare = FakeGpu::typical(1);
    bare.devices[0].readings.clear();
    let mut out = Vec::new();
    write_report(&mut bare, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let all: Vec<&str> = Metric::ALL
        .iter()
        .filter(|m| **m != Metric::MigInstances)
        .map(|m| m.name())
        .collect();
    assert!(
        text.ends_with(&format!(
            "\n  supported: none\n  not supported: {}\n",
            all.join(", ")
        )),
        "{text}"
    );
    let mut none = FakeGpu::typical(0);
    let e = write_report(&mut none, &mut Vec::new()).unwrap_err();
    assert!(matches!(e, NvmlInitError::NoGpu { .. }));
}

#[test]
fn snapshot_describes_state_and_gpus() {
    let status = Arc::new(NvmlStatus::new());
    assert_eq!(status.snapshot().state, "not started");
    let mut fake = FakeGpu::typical(1);
    fake.devices[0].readings.remove(&Metric::Bar1);
    let mut s = Sampler::new(fake, false, status.clone()).unwrap();
    s.sample(1);
    status.set_state("running");
    // As `/api/v1/status` shows it.
    let v = serde_json::to_value(status.snapshot()).unwrap();
    assert_eq!(v["state"], "running");
    assert_eq!(v["driver"], "550.54.15");
    assert_eq!(v["cuda"], "12.4");
    let g = &v["gpus"][0];
    assert_eq!(g["index"], 0);
    assert_eq!(g["name"], "NVIDIA A2");
    assert_eq!(g["arch"], "Ampere");
    assert_eq!(g["lost"], false);
    assert_eq!(g["last_error"], serde_json::Value::Null);
    assert_eq!(g["unsupported"], json!(["bar1"]));
}

#[test]
fn bench_fake_sample_measures_something() {
    let d = bench_fake_sample(200);
    eprintln!("fake sample (1 GPU, processes on): {d:?} per sample");
    assert!(d > Duration::ZERO);
    assert!(d < Duration::from_millis(50), "{d:?}");
}

#[tokio::test]
async fn run_samples_off_the_workers_and_submits() {
    let (handle, mut rx) = crate::queue::channel(10_000);
    let stats = Arc::new(Stats::default());
    let status = Arc::new(NvmlStatus::new());
    let shutdown = CancellationToken::new();
    let cfg = NvmlConfig {
        interval: Interval(Duration::from_millis(5)),
        processes: true,
        ..NvmlConfig::default()
    };
    let task = tokio::spawn(run_with(
        cfg,
        || Ok(FakeGpu::typical(2)),
        handle,
        stats.clone(),
        status.clone(),
        shutdown.clone(),
    ));
    let req = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    // 2 gpu lines + 2 x 2 process lines.
    assert_eq!(req.batch.len(), 6);
    assert_eq!(status.state(), "running");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state(), "stopped");
    let v = status.snapshot();
    assert!(v.samples >= 1);
    assert!(v.last_sample_us.is_some());
    assert_eq!(Stats::get(&stats.collector_errors), 0);
}

#[tokio::test]
async fn run_without_nvml_logs_and_returns() {
    let (handle, _rx) = crate::queue::channel(10);
    let status = Arc::new(NvmlStatus::new());
    run_with(
        NvmlConfig::default(),
        || -> Result<FakeGpu, NvmlInitError> {
            Err(NvmlInitError::from_nvml(NvmlError::LibraryNotFound))
        },
        handle.clone(),
        Arc::new(Stats::default()),
        status.clone(),
        CancellationToken::new(),
    )
    .await;
    assert!(status.state().starts_with("off: no NVIDIA driver found"));
    let off = NvmlConfig {
        enabled: false,
        ..NvmlConfig::default()
    };
    run_with(
        off,
        || Ok(FakeGpu::typical(1)),
        handle,
        Arc::new(Stats::default()),
        status.clone(),
        CancellationToken::new(),
    )
    .await;
    assert!(status.state().starts_with("off: disabled"));
}
