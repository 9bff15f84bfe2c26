//! `edgewatch gpus`: the NVIDIA GPUs NVML sees, their tags and which metrics each supports.
//! Exit code 2 when NVML cannot be used (no driver, no GPU); never writes to the store.

use std::io::Write;
use std::process::ExitCode;

pub fn run() -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match edgewatch::collect::nvml::gpus_report(&mut out) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            out.flush()?;
            eprintln!("error: {e}");
            Ok(ExitCode::from(2))
        }
    }
}
