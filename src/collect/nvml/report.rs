//! `edgewatch gpus`: a plain-text report of what NVML says about each GPU and which
//! metrics it supports. It reads, prints and returns; it never changes a GPU setting.

use std::io::Write;

use super::catalogue::{Metric, Reading};
use super::error::{NvmlInitError, ReadError};
use super::source::{GpuSource, NvmlSource};

/// Writes the `edgewatch gpus` report for `source`: versions, then each GPU with its tags,
/// a table giving for every metric its support (`supported`, `not supported`,
/// `n/a (MIG off)` or `error: ...`) and the fields it gives, and two summary lines naming
/// the metrics that GPU supports and those it does not (`supported: ...`,
/// `not supported: ...`; `none` when empty).
pub fn write_report<S: GpuSource>(
    source: &mut S,
    out: &mut dyn Write,
) -> Result<(), NvmlInitError> {
    let system = source.system();
    let or_unknown = |s: &str| {
        if s.is_empty() {
            "unknown".to_string()
        } else {
            s.to_string()
        }
    };
    writeln!(
        out,
        "NVIDIA driver {}, CUDA driver {}",
        or_unknown(&system.driver),
        or_unknown(&system.cuda)
    )?;
    let count = source
        .device_count()
        .map_err(|e| NvmlInitError::Other(format!("cannot count GPUs: {e}")))?;
    if count == 0 {
        return Err(NvmlInitError::NoGpu {
            driver: or_unknown(&system.driver),
        });
    }
    writeln!(out, "{count} GPU(s)")?;
    for index in 0..count {
        writeln!(out)?;
        let ident = match source.identity(index) {
            Ok(id) => id,
            Err(e) => {
                writeln!(out, "GPU {index}: error: {e}")?;
                continue;
            }
        };
        writeln!(out, "GPU {index}: {}", or_unknown(&ident.name))?;
        writeln!(
            out,
            "  tags: gpu={index} uuid={} name={:?} arch={} cc={} driver={} cuda={}",
            or_unknown(&ident.uuid),
            ident.name,
            or_unknown(&ident.arch),
            or_unknown(&ident.cc),
            or_unknown(&system.driver),
            or_unknown(&system.cuda)
        )?;
        writeln!(out, "  {:<20} {:<16} fields", "metric", "support")?;
        let mut mig_on = false;
        let (mut yes, mut no) = (Vec::new(), Vec::new());
        for metric in Metric::ALL {
            let support = if metric == Metric::MigInstances && !mig_on {
                "n/a (MIG off)".to_string()
            } else {
                match source.read(index, metric) {
                    Ok(r) => {
                        if let Reading::MigMode { current, .. } = r {
                            mig_on = current;
                        }
                        yes.push(metric.name());
                        "supported".to_string()
                    }
                    Err(ReadError::NotSupported) => {
                        no.push(metric.name());
                        "not supported".to_string()
                    }
                    Err(e) => format!("error: {e}"),
                }
            };
            let mut fields = format!("{}: {}", metric.measurement(), metric.fields().join(", "));
            if metric.is_per_process() {
                fields.push_str(" (with [nvml] processes = true)");
            }
            writeln!(out, "  {:<20} {:<16} {fields}", metric.name(), support)?;
        }
        let list = |names: &[&str]| {
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        };
        writeln!(out, "  supported: {}", list(&yes))?;
        writeln!(out, "  not supported: {}", list(&no))?;
    }
    Ok(())
}

/// `edgewatch gpus`: initialises NVML and writes [`write_report`] to `out`. Without a
/// driver (or GPU) returns an error whose message says so plainly; the caller prints it
/// and exits non-zero.
pub fn gpus_report(out: &mut dyn Write) -> Result<(), NvmlInitError> {
    let mut source = NvmlSource::init()?;
    write_report(&mut source, out)
}
