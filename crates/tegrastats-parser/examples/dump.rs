//! Reads tegrastats output on stdin and prints each parsed sample.
//!
//! ```sh
//! tegrastats | cargo run --example dump
//! cargo run --example dump < tegrastats.log
//! ```

use std::io::{self, Write};

use tegrastats_parser::Reader;

fn main() -> io::Result<()> {
    let stdin = io::stdin();
    let mut out = io::stdout().lock();
    for (line, result) in Reader::new(stdin.lock()) {
        match result {
            Ok(sample) => writeln!(out, "{line}: {sample:#?}")?,
            Err(err) => eprintln!("line {line}: {err}"),
        }
    }
    Ok(())
}
