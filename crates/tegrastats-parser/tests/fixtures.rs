//! Every real line in `tests/data/lines.tsv` parses completely.

mod common;

use tegrastats_parser::{parse_line, Reader};

#[test]
fn fixture_file_is_complete() {
    let fixtures = common::fixtures();
    assert_eq!(fixtures.len(), 40);
    for f in &fixtures {
        assert!(!f.device.is_empty() && !f.release.is_empty() && !f.source.is_empty());
    }
}

#[test]
fn every_fixture_parses_without_unknown_tokens() {
    for f in common::fixtures() {
        let s = parse_line(f.line).unwrap_or_else(|e| panic!("row {} ({}): {e}", f.id, f.device));
        assert!(
            s.unknown.is_empty(),
            "row {} ({}, {}): unknown tokens {:?}",
            f.id,
            f.device,
            f.release,
            s.unknown
        );
        // Every tegrastats line has RAM and a CPU list.
        assert!(s.ram.is_some(), "row {}: no RAM", f.id);
        assert!(!s.cpus.is_empty(), "row {}: no CPUs", f.id);
        // Timestamps appear exactly on the JetPack 5+ lines that start with one.
        let starts_with_date = f.line.as_bytes().get(2) == Some(&b'-');
        assert_eq!(s.timestamp.is_some(), starts_with_date, "row {}", f.id);
    }
}

#[test]
fn every_token_is_accounted_for() {
    // A cheap completeness check: the number of temperatures, rails and
    // engines matches simple textual counts over the line.
    for f in common::fixtures() {
        let s = parse_line(f.line).unwrap();
        let temps = f
            .line
            .split_ascii_whitespace()
            .filter(|t| t.ends_with('C') && t.contains('@'))
            .count();
        assert_eq!(
            temps,
            s.temps_c.len() + s.invalid_temps.len(),
            "row {}: temperatures",
            f.id
        );
        let rails = f
            .line
            .split_ascii_whitespace()
            .filter(|t| t.contains('/') && !t.contains('B') && !t.contains('@'))
            .count();
        assert_eq!(rails, s.power_mw.len(), "row {}: rails", f.id);
    }
}

#[test]
fn reader_over_the_whole_file() {
    // The fixture lines, one per line, with CRLF endings and a blank line.
    let mut text = String::new();
    for f in common::fixtures() {
        text.push_str(f.line);
        text.push_str("\r\n\r\n");
    }
    let results: Vec<_> = Reader::new(text.as_bytes()).collect();
    assert_eq!(results.len(), 40);
    for (i, (line, result)) in results.into_iter().enumerate() {
        assert_eq!(line, 2 * i + 1);
        assert!(result.is_ok());
    }
}

#[test]
fn trailing_newline_does_not_change_the_result() {
    for f in common::fixtures() {
        let plain = parse_line(f.line).unwrap();
        assert_eq!(parse_line(&format!("{}\n", f.line)).unwrap(), plain);
        assert_eq!(parse_line(&format!("  {}\r\n", f.line)).unwrap(), plain);
    }
}
