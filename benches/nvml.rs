//! Per-sample cost of the NVML collector, two ways, each with every metric and per-process
//! samples on:
//! * over a fake GPU: the collector's own work (bookkeeping, turning readings into lines,
//!   status), NVML's call time excluded;
//! * through the real FFI path (`NvmlSource` over `nvml-wrapper`, dlopen'd library,
//!   symbol lookups, struct marshalling) against the stand-in `libnvidia-ml.so.1` of the
//!   integration tests (`tests/nvml_stub/stub.c`, compiled here with the system `cc`; skipped
//!   with a note where there is none), two GPUs as in `tests/nvml_stub/two_gpus.txt`. The
//!   stand-in answers at once, so this is the agent's side of a real sample; a real driver
//!   adds its own time (on a device, `/api/v1/status` reports each sample's wall time as
//!   `collectors.nvml.last_sample_us`).
//!
//! Run: `cargo bench --bench nvml`. The fake GPU is compiled only with the `test-fakes`
//! feature, which the crate's self dev-dependency turns on for benches and tests.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use edgewatch::collect::nvml::{NvmlSource, NvmlStatus, Sampler};

fn main() {
    let iterations = 20_000;
    // Warm-up, then measure.
    let _ = edgewatch::collect::nvml::bench_fake_sample(1_000);
    let per = edgewatch::collect::nvml::bench_fake_sample(iterations);
    let share_at_1hz = per.as_secs_f64() * 100.0;
    println!(
        "nvml collector, fake GPU (all metrics, processes on): {:.1} µs per sample = {:.4} % of one core at 1 Hz",
        per.as_secs_f64() * 1e6,
        share_at_1hz
    );
    stand_in(20_000);
}

/// The same through the stand-in library.
fn stand_in(iterations: u32) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("temp dir");
    let lib = dir.path().join("libnvidia-ml.so.1");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(root.join("tests/nvml_stub/stub.c"))
        .status();
    if !built.is_ok_and(|s| s.success()) {
        println!("nvml collector, stand-in NVML: skipped (no working `cc`)");
        return;
    }
    // Read by the stand-in at nvmlInit; set before any thread exists.
    std::env::set_var(
        "NVML_STUB_SCENARIO",
        root.join("tests/nvml_stub/two_gpus.txt"),
    );
    let source = NvmlSource::init_from(&lib).expect("the stand-in initialises");
    let mut sampler =
        Sampler::new(source, true, Arc::new(NvmlStatus::new())).expect("the stand-in lists GPUs");
    let mut ts = 1_700_000_000_000_000_000i64;
    let mut lines = 0;
    for _ in 0..1_000 {
        ts += 1_000_000_000;
        lines += sampler.sample(ts).batch.lines.len();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        ts += 1_000_000_000;
        lines += sampler.sample(ts).batch.lines.len();
    }
    let per = start.elapsed() / iterations;
    println!(
        "nvml collector, stand-in NVML through the FFI path (2 GPUs, all metrics on GPU 0, processes on): {:.1} µs per sample = {:.4} % of one core at 1 Hz ({} lines)",
        per.as_secs_f64() * 1e6,
        per.as_secs_f64() * 100.0,
        lines
    );
}
