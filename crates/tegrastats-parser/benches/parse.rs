//! Throughput of `parse_line` over the real fixture lines.
//!
//! Uses only `std` (no benchmark framework):
//!
//! ```sh
//! cargo bench --bench parse
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use tegrastats_parser::parse_line;

const TSV: &str = include_str!("../tests/data/lines.tsv");

fn main() {
    let lines: Vec<&str> = TSV
        .lines()
        .skip(1)
        .filter_map(|row| row.rsplit('\t').next())
        .collect();
    let bytes: usize = lines.iter().map(|l| l.len()).sum();

    // Warm up, and make sure every line parses.
    for line in &lines {
        parse_line(line).expect("fixture lines parse");
    }

    let mut best = Duration::MAX;
    let mut total_lines = 0usize;
    let rounds = 5;
    let passes = 2_000;
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..passes {
            for line in &lines {
                black_box(parse_line(black_box(line))).ok();
            }
        }
        best = best.min(start.elapsed());
        total_lines += passes * lines.len();
    }
    let per_round = passes * lines.len();
    let ns_per_line = best.as_nanos() as f64 / per_round as f64;
    let lines_per_sec = 1e9 / ns_per_line;
    let mb_per_sec = bytes as f64 * passes as f64 / best.as_secs_f64() / 1e6;
    println!(
        "parse_line: {} fixture lines ({} bytes), {} lines timed in total, best of {rounds} rounds",
        lines.len(),
        bytes,
        total_lines
    );
    println!("  {ns_per_line:.0} ns/line, {lines_per_sec:.0} lines/s, {mb_per_sec:.1} MB/s");
}
