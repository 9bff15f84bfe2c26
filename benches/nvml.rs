//! Per-sample cost of the NVML collector's own work (bookkeeping, turning readings into
//! lines, status) over a fake GPU with every metric and per-process samples on. NVML's own
//! call time is excluded (it needs a GPU; on a device, `/api/v1/status` reports each real
//! sample's wall time as `collectors.nvml.last_sample_us`).
//! Run: `cargo bench --bench nvml`. The fake GPU is compiled only with the `test-fakes`
//! feature, which the crate's self dev-dependency turns on for benches and tests.

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
}
