//! Property tests: no input makes the parser panic, and what it reports is
//! consistent with its input.

mod common;

use proptest::prelude::*;
use tegrastats_parser::{parse_line, ParseError, Reader};

/// Every whitespace-separated token of every fixture line, plus fragments
/// that exercise edge cases.
fn fixture_tokens() -> Vec<String> {
    let mut tokens: Vec<String> = common::fixtures()
        .iter()
        .flat_map(|f| f.line.split_ascii_whitespace())
        .map(str::to_owned)
        .collect();
    tokens.sort();
    tokens.dedup();
    tokens.extend(
        [
            "[",
            "]",
            "[,",
            ",]",
            "@",
            "@[",
            "%",
            "%@",
            "(",
            ")",
            "(lfb",
            "(cached",
            "x",
            "/",
            "mW",
            "C",
            "off",
            "fg",
            "bg",
            "limit",
            "-256C",
            "99999999999",
            "é",
            "\u{fffd}",
        ]
        .iter()
        .map(|s| (*s).to_owned()),
    );
    tokens
}

/// Checks the parser's contract on one input.
fn check(line: &str) {
    match parse_line(line) {
        Ok(s) => {
            // Unknown entries are verbatim tokens of the input.
            let tokens: Vec<&str> = line.split_ascii_whitespace().collect();
            for u in &s.unknown {
                assert!(
                    tokens.contains(&u.as_str()),
                    "{u:?} not a token of {line:?}"
                );
            }
            if let Some(ts) = &s.timestamp {
                assert!(line.trim_start().starts_with(ts.as_str()));
            }
            // Parsing is deterministic.
            assert_eq!(parse_line(line).as_ref(), Ok(&s));
        }
        Err(ParseError::Empty) => assert!(line.trim_ascii().is_empty()),
        Err(ParseError::NotTegrastats { first_token }) => {
            assert!(first_token.len() <= 32);
            assert!(line
                .split_ascii_whitespace()
                .next()
                .unwrap()
                .starts_with(&first_token));
        }
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

/// A random edit of a string.
#[derive(Debug, Clone)]
enum Edit {
    Delete(usize, usize),
    Insert(usize, char),
    Duplicate(usize, usize),
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 0usize..8).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<usize>(), any::<char>()).prop_map(|(i, c)| Edit::Insert(i, c)),
        (any::<usize>(), 0usize..16).prop_map(|(i, n)| Edit::Duplicate(i, n)),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(line: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = line.chars().collect();
    for e in edits {
        let len = chars.len();
        match *e {
            Edit::Delete(i, n) if len > 0 => {
                let i = i % len;
                chars.drain(i..(i + n).min(len));
            }
            Edit::Insert(i, c) => chars.insert(i % (len + 1), c),
            Edit::Duplicate(i, n) if len > 0 => {
                let i = i % len;
                let piece: Vec<char> = chars[i..(i + n).min(len)].to_vec();
                chars.splice(i..i, piece);
            }
            Edit::Truncate(i) => chars.truncate(i % (len + 1)),
            _ => {}
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings(line in any::<String>()) {
        check(&line);
    }

    #[test]
    fn arbitrary_bytes_through_the_reader(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        for (n, _) in Reader::new(&bytes[..]).max_line_len(64) {
            prop_assert!(n >= 1);
        }
    }

    #[test]
    fn fixture_token_soup(
        picks in proptest::collection::vec(any::<proptest::sample::Index>(), 0..60),
        glue in proptest::collection::vec(prop_oneof![Just(" "), Just(""), Just("  "), Just("\t"), Just(",")], 60),
    ) {
        let tokens = fixture_tokens();
        let mut line = String::new();
        for (i, p) in picks.iter().enumerate() {
            line.push_str(&tokens[p.index(tokens.len())]);
            line.push_str(glue[i]);
        }
        check(&line);
    }

    #[test]
    fn mutated_fixture_lines(
        row in any::<proptest::sample::Index>(),
        edits in proptest::collection::vec(edit(), 1..6),
    ) {
        let fixtures = common::fixtures();
        let line = fixtures[row.index(fixtures.len())].line;
        check(&apply(line, &edits));
    }

    #[test]
    fn concatenated_fixture_lines(
        a in any::<proptest::sample::Index>(),
        b in any::<proptest::sample::Index>(),
        cut in any::<proptest::sample::Index>(),
    ) {
        let fixtures = common::fixtures();
        let a = fixtures[a.index(fixtures.len())].line;
        let b = fixtures[b.index(fixtures.len())].line;
        // Glue the head of one line to another, as in an interleaved log.
        let mut end = cut.index(a.len() + 1);
        while !a.is_char_boundary(end) {
            end -= 1;
        }
        check(&format!("{}{}", &a[..end], b));
        check(&format!("{a} {b}"));
    }
}

#[test]
fn pathological_inputs() {
    let many_brackets = "CPU [".repeat(10_000);
    check(&many_brackets);
    let many_dups = "RAM 1/2MB ".to_owned() + &"NC 0mW/0mW ".repeat(10_000);
    let s = parse_line(&many_dups).unwrap();
    assert_eq!(s.power_mw.len(), 10_000);
    assert!(s.power_mw.contains_key("NC#10000"));
    check(&"@".repeat(100_000));
    check(&"[".repeat(100_000));
    check("RAM 4294967296/1MB CPU [4294967296%@1] EMC_FREQ 4294967296%");
    check("RAM 1e400/1MB x@1e400C y@99999999999999999999999999999999999999999999999.5C");
}
