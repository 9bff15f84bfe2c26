//! Line-protocol parsing speed: edgewatch's hand-written parser against the
//! `influxdb-line-protocol` crate on the same body (the ingest benchmark's line shape).
//! Run: `cargo bench --bench lineproto`. Prints lines/s for both and their ratio.

use std::hint::black_box;
use std::time::Instant;

use edgewatch::ingest::lineproto::{parse_body, Precision};

fn body(lines: usize) -> String {
    let models = ["yolov8n", "resnet50", "whisper-tiny", "llama-3.2-1b"];
    let mut s = String::new();
    for i in 0..lines {
        s.push_str(&format!(
            "inference,app=camera-{},model={},model_version=v{},stage=detect wall_ms={:.3},gpu_ms={:.3},queue_ms=0.{},batch_size={}i {}\n",
            i % 3,
            models[i % 4],
            1 + i % 2,
            5.0 + (i % 977) as f64 / 10.0,
            3.0 + (i % 733) as f64 / 10.0,
            i % 97,
            1 << (i % 4),
            1_764_000_000_000_000_000i64 + i as i64 * 1_000_000
        ));
    }
    s
}

fn main() {
    let n = 5_000;
    let b = body(n);
    let rounds = 60;
    let t = Instant::now();
    for _ in 0..rounds {
        let p = parse_body(black_box(&b), Precision::Nanos, 0);
        assert_eq!(p.batch.len(), n);
        black_box(p);
    }
    let ours = (n * rounds) as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..rounds {
        let mut count = 0;
        for l in influxdb_line_protocol::parse_lines(black_box(&b)) {
            let l = l.expect("valid");
            // Same work as ours: the canonical key and owned field keys/values.
            let key = l.series.generate_base().map(|k| k.into_owned()).ok();
            let fields: Vec<(String, String)> = l
                .field_set
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            black_box((key, fields));
            count += 1;
        }
        assert_eq!(count, n);
    }
    let theirs = (n * rounds) as f64 / t.elapsed().as_secs_f64();
    println!("edgewatch parser:              {ours:>12.0} lines/s");
    println!("influxdb-line-protocol crate:  {theirs:>12.0} lines/s");
    println!("ratio: x{:.2}", ours / theirs);
}
