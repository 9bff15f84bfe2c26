//! `cargo +nightly fuzz run parse_line -- -dict=fuzz/tegrastats.dict`
//!
//! Feeds arbitrary bytes to `parse_line` (as lossy UTF-8) and to `Reader`,
//! and checks the parser's contract on whatever comes back.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tegrastats_parser::{parse_line, ParseError, Reader};

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    match parse_line(&line) {
        Ok(sample) => {
            let tokens: Vec<&str> = line.split_ascii_whitespace().collect();
            for unknown in &sample.unknown {
                assert!(tokens.contains(&unknown.as_str()));
            }
        }
        Err(ParseError::Empty) => assert!(line.split_ascii_whitespace().next().is_none()),
        Err(_) => {}
    }
    for (number, _) in Reader::new(data).max_line_len(256) {
        assert!(number >= 1);
    }
});
