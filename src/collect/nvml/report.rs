//! `edgewatch gpus`: a plain-text report of what NVML says about each GPU and which
//! metrics it supports. It reads, prints and returns; it never changes a GPU setting.

use std::io::Write;

use super::catalogue::{Metric, Reading};
use super::error::{NvmlInitError, ReadError};
use super::source::{GpuSource, NvmlSource};

/// Writes the `edgewatch gpus` report for `source`: versions, then each GPU with its tags
/// and, for every metric, whether it is supported, with the fields it gives.
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
        for metric in Metric::ALL {
            let support = if metric == Metric::MigInstances && !mig_on {
                "n/a (MIG off)".to_string()
            } else {
                match source.read(index, metric) {
                    Ok(r) => {
                        if let Reading::MigMode { current, .. } = r {
                            mig_on = current;
                        }
                        "supported".to_string()
                    }
                    Err(ReadError::NotSupported) => "not supported".to_string(),
                    Err(e) => format!("error: {e}"),
                }
            };
            let mut fields = format!("{}: {}", metric.measurement(), metric.fields().join(", "));
            if metric.is_per_process() {
                fields.push_str(" (with [nvml] processes = true)");
            }
            writeln!(out, "  {:<20} {:<16} {fields}", metric.name(), support)?;
        }
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
