//! Reads tegrastats output on stdin and prints one JSON object per sample,
//! with the line number added as `line`.
//!
//! ```sh
//! tegrastats | cargo run --features serde --example json
//! ```

use std::io::{self, Write};

use tegrastats_parser::Reader;

fn main() -> io::Result<()> {
    let stdin = io::stdin();
    let mut out = io::stdout().lock();
    for (line, result) in Reader::new(stdin.lock()) {
        match result {
            Ok(sample) => {
                // `timestamp` is always present, so the object is never empty.
                let json = serde_json::to_string(&sample)?;
                let fields = json.strip_prefix('{').unwrap_or(&json);
                writeln!(out, "{{\"line\":{line},{fields}")?;
            }
            Err(err) => eprintln!("line {line}: {err}"),
        }
    }
    Ok(())
}
