//! Readings -> line-protocol [`Line`]s: the `gpu`, `gpu_mig` and `gpu_process`
//! measurements with their tags. Pure functions of the readings and the timestamp; they
//! never call NVML and never submit anything.

use crate::model::{series_key, Line, Value};

use super::catalogue::{GpuIdentity, Metric, ProcessUtil, Reading, SystemInfo, THROTTLE_REASONS};

fn mib(bytes: u64) -> Value {
    Value::F64(bytes as f64 / 1_048_576.0)
}

fn f(k: &str, v: f64) -> (String, Value) {
    (k.to_string(), Value::F64(v))
}

fn i(k: &str, v: i64) -> (String, Value) {
    (k.to_string(), Value::I64(v))
}

/// The `gpu` fields one reading gives (none for the per-process and MIG readings, which
/// have their own measurements, or for a reading of the wrong shape).
pub fn gpu_fields(metric: Metric, reading: &Reading, out: &mut Vec<(String, Value)>) {
    let one = |out: &mut Vec<(String, Value)>, v: f64| {
        if let Some(name) = metric.fields().first() {
            out.push(f(name, v));
        }
    };
    match (metric, reading) {
        (Metric::Utilization, Reading::Utilization { gpu_pct, mem_pct }) => {
            out.push(f("util_gpu_pct", f64::from(*gpu_pct)));
            out.push(f("util_mem_pct", f64::from(*mem_pct)));
        }
        (Metric::Memory | Metric::Bar1, Reading::Memory { total, used, free }) => {
            if let [t, u, fr] = metric.fields() {
                out.push((t.to_string(), mib(*total)));
                out.push((u.to_string(), mib(*used)));
                out.push((fr.to_string(), mib(*free)));
            }
        }
        (
            Metric::Temperature
            | Metric::TempSlowdown
            | Metric::TempShutdown
            | Metric::TempMaxOperating,
            Reading::Celsius(c),
        ) => one(out, f64::from(*c)),
        (Metric::Power | Metric::PowerLimit, Reading::Milliwatts(mw)) => {
            one(out, f64::from(*mw) / 1000.0)
        }
        (Metric::Energy, Reading::Millijoules(mj)) => {
            out.push(i("energy_mj", i64::try_from(*mj).unwrap_or(i64::MAX)))
        }
        (
            Metric::ClockGraphics
            | Metric::ClockSm
            | Metric::ClockMem
            | Metric::ClockVideo
            | Metric::ClockGraphicsMax
            | Metric::ClockSmMax
            | Metric::ClockMemMax
            | Metric::ClockVideoMax,
            Reading::Mhz(mhz),
        ) => one(out, f64::from(*mhz)),
        (Metric::ThrottleReasons, Reading::Bitmask(bits)) => {
            // A bitmask: keep the bit pattern even if the top bit were ever set.
            out.push(i("throttle_reasons", *bits as i64));
            for (bit, name) in THROTTLE_REASONS {
                out.push(i(name, i64::from(bits & bit != 0)));
            }
        }
        (Metric::PcieTx | Metric::PcieRx, Reading::KBytesPerSec(kb)) => one(out, f64::from(*kb)),
        (Metric::PcieLinkGen | Metric::PcieLinkWidth, Reading::Count(n)) => {
            if let Some(name) = metric.fields().first() {
                out.push(i(name, i64::from(*n)));
            }
        }
        (Metric::Fan, Reading::Fans(speeds)) if !speeds.is_empty() => {
            let sum: f64 = speeds.iter().map(|s| f64::from(*s)).sum();
            out.push(f("fan_pct", sum / speeds.len() as f64));
        }
        (
            Metric::Ecc,
            Reading::Ecc {
                enabled,
                corrected,
                uncorrected,
            },
        ) => {
            out.push(i("ecc_enabled", i64::from(*enabled)));
            if *enabled {
                let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                if let Some(c) = corrected {
                    out.push(i("ecc_corrected", clamp(*c)));
                }
                if let Some(u) = uncorrected {
                    out.push(i("ecc_uncorrected", clamp(*u)));
                }
            }
        }
        (Metric::MigMode, Reading::MigMode { current, pending }) => {
            out.push(i("mig_mode", i64::from(*current)));
            out.push(i("mig_mode_pending", i64::from(*pending)));
        }
        _ => {}
    }
}

/// Turns one GPU's readings into lines stamped `ts`: one `gpu` line (if any field), one
/// `gpu_mig` line per MIG instance and one `gpu_process` line per process.
pub fn readings_to_lines(
    system: &SystemInfo,
    gpu: &GpuIdentity,
    readings: &[(Metric, Reading)],
    ts: i64,
) -> Vec<Line> {
    let index = gpu.index.to_string();
    let mut lines = Vec::new();
    let mut fields = Vec::with_capacity(48);
    for (metric, reading) in readings {
        gpu_fields(*metric, reading, &mut fields);
    }
    if !fields.is_empty() {
        let key = series_key(
            "gpu",
            &[
                ("gpu", &index),
                ("uuid", &gpu.uuid),
                ("name", &gpu.name),
                ("arch", &gpu.arch),
                ("cc", &gpu.cc),
                ("driver", &system.driver),
                ("cuda", &system.cuda),
            ],
        );
        lines.push(Line {
            key,
            fields,
            ts,
            line_no: 0,
        });
    }
    for (metric, reading) in readings {
        if let (Metric::MigInstances, Reading::MigInstances(migs)) = (metric, reading) {
            for m in migs {
                let slot = m.index.to_string();
                lines.push(Line {
                    key: series_key(
                        "gpu_mig",
                        &[
                            ("gpu", &index),
                            ("uuid", &gpu.uuid),
                            ("mig", &slot),
                            ("mig_uuid", &m.uuid),
                        ],
                    ),
                    fields: vec![
                        ("mem_total_mb".into(), mib(m.total)),
                        ("mem_used_mb".into(), mib(m.used)),
                        ("mem_free_mb".into(), mib(m.free)),
                    ],
                    ts,
                    line_no: 0,
                });
            }
        }
    }
    let util: Option<&Vec<ProcessUtil>> = readings.iter().find_map(|(_, r)| match r {
        Reading::ProcessUtilization(u) => Some(u),
        _ => None,
    });
    let procs = readings.iter().find_map(|(_, r)| match r {
        Reading::Processes(p) => Some(p),
        _ => None,
    });
    for p in procs.into_iter().flatten() {
        let mut pf = Vec::with_capacity(3);
        if let Some(b) = p.used_bytes {
            pf.push(("mem_used_mb".to_string(), mib(b)));
        }
        if let Some(util) = util {
            // NVML lists only processes that were busy since the last poll: absent means idle.
            let (sm, mem) = util
                .iter()
                .find(|u| u.pid == p.pid)
                .map(|u| (u.sm_pct, u.mem_pct))
                .unwrap_or((0, 0));
            pf.push(f("sm_util_pct", f64::from(sm)));
            pf.push(f("mem_util_pct", f64::from(mem)));
        }
        if pf.is_empty() {
            continue;
        }
        let pid = p.pid.to_string();
        lines.push(Line {
            key: series_key(
                "gpu_process",
                &[
                    ("gpu", &index),
                    ("uuid", &gpu.uuid),
                    ("pid", &pid),
                    ("process", &p.name),
                ],
            ),
            fields: pf,
            ts,
            line_no: 0,
        });
    }
    lines
}
