//! The reference device's workload for the storage benches (`storage`, `merge_wear`): what
//! one second of a Jetson running the agent gives the writer. Tegrastats-like gauges at
//! 1 Hz with timestamp jitter (the `jetson_*` tag sets as the tegrastats mapper writes
//! them), host stats every 10 s, inferences of two models (three 2-decimal latencies,
//! batch size, input length, ok) and, optionally, scraped gauges every 15 s in many small
//! tag sets, as a node_exporter page gives them. Deterministic: the same seconds give the
//! same lines.

use edgewatch::model::{series_key, Batch, Line, Value};

pub const NS: i64 = 1_000_000_000;

/// Cheap deterministic randomness (xorshift64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A symmetric step in [-w, w].
    pub fn step(&mut self, w: f64) -> f64 {
        (self.unit() * 2.0 - 1.0) * w
    }
}

/// One random-walking gauge, rounded to `decimals`, kept in `[lo, hi]`.
pub struct Gauge {
    v: f64,
    lo: f64,
    hi: f64,
    step: f64,
    scale: f64,
}

impl Gauge {
    pub fn new(v: f64, lo: f64, hi: f64, step: f64, decimals: i32) -> Gauge {
        Gauge {
            v,
            lo,
            hi,
            step,
            scale: 10f64.powi(decimals),
        }
    }
    pub fn next(&mut self, r: &mut Rng) -> f64 {
        self.v = (self.v + r.step(self.step)).clamp(self.lo, self.hi);
        (self.v * self.scale).round() / self.scale
    }
}

/// The tegrastats-like tag sets: 40 gauges in the shapes the mapper writes.
pub struct Tegra {
    sets: Vec<(String, Vec<(&'static str, Gauge)>)>,
}

impl Tegra {
    pub fn new() -> Tegra {
        let mut sets = Vec::new();
        for core in 0..8 {
            sets.push((
                series_key("jetson_cpu", &[("core", &core.to_string())]),
                vec![
                    ("usage_pct", Gauge::new(20.0, 0.0, 100.0, 6.0, 0)),
                    ("freq_mhz", Gauge::new(1500.0, 115.0, 2200.0, 60.0, 0)),
                ],
            ));
        }
        sets.push((
            "jetson_mem".into(),
            vec![
                ("ram_used_mb", Gauge::new(3000.0, 1000.0, 7000.0, 8.0, 0)),
                ("ram_total_mb", Gauge::new(7620.0, 7620.0, 7620.0, 0.0, 0)),
                ("swap_used_mb", Gauge::new(0.0, 0.0, 100.0, 0.2, 0)),
                ("lfb_blocks", Gauge::new(40.0, 0.0, 200.0, 1.0, 0)),
            ],
        ));
        sets.push((
            "jetson_gpu".into(),
            vec![
                ("usage_pct", Gauge::new(50.0, 0.0, 99.0, 10.0, 0)),
                ("freq_mhz", Gauge::new(600.0, 300.0, 1300.0, 40.0, 0)),
            ],
        ));
        sets.push((
            "jetson_emc".into(),
            vec![
                ("usage_pct", Gauge::new(10.0, 0.0, 99.0, 3.0, 0)),
                ("freq_mhz", Gauge::new(2133.0, 2133.0, 2133.0, 0.0, 0)),
            ],
        ));
        for zone in ["cpu", "gpu", "soc0", "soc1", "soc2", "tj", "cv0", "cv1"] {
            sets.push((
                series_key("jetson_temp", &[("zone", zone)]),
                vec![("temp_c", Gauge::new(48.0, 30.0, 90.0, 0.4, 3))],
            ));
        }
        for rail in ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC", "VDDQ_VDD2_1V8AO"] {
            sets.push((
                series_key("jetson_power", &[("rail", rail)]),
                vec![
                    ("current_mw", Gauge::new(3000.0, 500.0, 9000.0, 150.0, 0)),
                    ("average_mw", Gauge::new(3000.0, 500.0, 9000.0, 5.0, 0)),
                ],
            ));
        }
        Tegra { sets }
    }

    pub fn sample(&mut self, r: &mut Rng, ts: i64, out: &mut Vec<Line>) {
        for (key, gauges) in &mut self.sets {
            let fields = gauges
                .iter_mut()
                .map(|(name, g)| (name.to_string(), Value::F64(g.next(r))))
                .collect();
            out.push(Line {
                key: key.clone(),
                fields,
                ts,
                line_no: 0,
            });
        }
    }
}

/// The device: every source's state, one [`Batch`] a second.
pub struct Device {
    r: Rng,
    tegra: Tegra,
    host: [Gauge; 5],
    wall: Gauge,
    inferences_per_s: i64,
    /// Scraped tag sets and their gauges.
    scraped: Vec<(String, Vec<Gauge>)>,
}

/// Field names of the scraped tag sets' gauges.
const SCRAPED_FIELDS: [&str; 4] = ["value", "rate", "bytes", "seconds"];

/// Start of the workload's time (October 2025).
pub const T0: i64 = 1_760_000_000 * NS;

impl Device {
    /// `inferences_per_s` inferences a second; `scraped_sets` tag sets of scraped gauges.
    pub fn new(inferences_per_s: i64, scraped_sets: usize) -> Device {
        Device {
            r: Rng(0x9E37_79B9_7F4A_7C15),
            tegra: Tegra::new(),
            host: [
                Gauge::new(20.0, 0.0, 100.0, 5.0, 2),
                Gauge::new(3000.0, 1000.0, 7000.0, 30.0, 1),
                Gauge::new(1.0, 0.0, 8.0, 0.2, 2),
                Gauge::new(1.0, 0.0, 8.0, 0.1, 2),
                Gauge::new(1.0, 0.0, 8.0, 0.05, 2),
            ],
            wall: Gauge::new(12.0, 3.0, 80.0, 2.0, 2),
            inferences_per_s,
            scraped: (0..scraped_sets)
                .map(|i| {
                    (
                        series_key("node", &[("collector", &format!("c{i}"))]),
                        (0..SCRAPED_FIELDS.len())
                            .map(|_| Gauge::new(1000.0, 0.0, 1e6, 50.0, 0))
                            .collect(),
                    )
                })
                .collect(),
        }
    }

    /// Second `s`'s lines (from [`T0`]).
    pub fn second(&mut self, s: i64) -> Batch {
        let r = &mut self.r;
        let mut lines = Vec::new();
        // tegrastats: stamped when the line was read, a few ms either side of the second.
        let jitter = (r.step(1.0) * 15_000_000.0) as i64;
        self.tegra.sample(r, T0 + s * NS + jitter, &mut lines);
        if s % 10 == 0 {
            let ts = T0 + s * NS + (r.unit() * 2_000_000.0) as i64;
            lines.push(Line {
                key: "host".into(),
                fields: ["cpu_pct", "mem_used_mb", "load1", "load5", "load15"]
                    .iter()
                    .zip(self.host.iter_mut())
                    .map(|(k, g)| (k.to_string(), Value::F64(g.next(r))))
                    .collect(),
                ts,
                line_no: 0,
            });
        }
        let models = ["yolov8n", "resnet50"];
        for i in 0..self.inferences_per_s {
            let ts = T0 + s * NS + i * NS / self.inferences_per_s + (r.unit() * 9e6) as i64;
            let lat = self.wall.next(r);
            let gpu = ((lat * 0.6 + r.step(0.5)) * 100.0).round() / 100.0;
            let queue = ((r.unit() * 3.0) * 100.0).round() / 100.0;
            let input_len = [640i64, 640, 640, 320][(r.next() % 4) as usize];
            lines.push(Line {
                key: series_key("inference", &[("model", models[(i % 2) as usize])]),
                fields: vec![
                    ("wall_ms".into(), Value::F64(lat)),
                    ("gpu_ms".into(), Value::F64(gpu)),
                    ("queue_ms".into(), Value::F64(queue)),
                    ("batch_size".into(), Value::I64(1)),
                    ("input_len".into(), Value::I64(input_len)),
                    ("ok".into(), Value::Bool(r.next() % 1000 != 0)),
                ],
                ts,
                line_no: 0,
            });
        }
        if s % 15 == 0 {
            let ts = T0 + s * NS;
            for (key, gauges) in &mut self.scraped {
                lines.push(Line {
                    key: key.clone(),
                    fields: SCRAPED_FIELDS
                        .iter()
                        .zip(gauges.iter_mut())
                        .map(|(k, g)| (k.to_string(), Value::F64(g.next(r))))
                        .collect(),
                    ts,
                    line_no: 0,
                });
            }
        }
        Batch { lines }
    }
}
