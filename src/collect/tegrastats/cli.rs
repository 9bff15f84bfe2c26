//! `edgewatch tegrastats parse [FILE|-]`: prints the parser's view of each line as JSON,
//! for checking a device's output by hand. It never starts tegrastats and never submits.

use std::path::Path;

use tegrastats_parser::ReadError;

use super::MAX_LINE_LEN;

/// `edgewatch tegrastats parse [FILE|-]`: one JSON object per input line on `out`, errors
/// naming the line on `err`. Returns false when any line failed.
///
/// Each object is `{"line": N, ...}` followed by the parser's JSON for the sample (see the
/// `tegrastats-parser` README: `timestamp`, `ram`, `swap`, `cpus`, `emc`, `gr3d`,
/// `engines`, `temps_c`, `power_mw`, `unknown`, and a few more keys). Blank lines are
/// skipped without output. A read error (not a parse error) ends the command with `Err`.
pub fn parse_command(
    input: Option<&Path>,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> std::io::Result<bool> {
    match input {
        Some(path) => {
            let file = std::fs::File::open(path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            parse_stream(std::io::BufReader::new(file), out, err)
        }
        None => parse_stream(std::io::stdin().lock(), out, err),
    }
}

pub(super) fn parse_stream(
    input: impl std::io::BufRead,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> std::io::Result<bool> {
    let mut ok = true;
    let mut json = Vec::with_capacity(2048);
    for (n, result) in tegrastats_parser::Reader::new(input).max_line_len(MAX_LINE_LEN) {
        match result {
            Ok(sample) => {
                json.clear();
                serde_json::to_writer(&mut json, &sample).map_err(std::io::Error::other)?;
                // `{"timestamp":...}` -> `{"line":N,"timestamp":...}`
                let rest = json.strip_prefix(b"{").unwrap_or(&json);
                write!(out, "{{\"line\":{n}")?;
                if rest.first().is_some_and(|c| *c != b'}') {
                    out.write_all(b",")?;
                }
                out.write_all(rest)?;
                out.write_all(b"\n")?;
            }
            Err(ReadError::Io(e)) => return Err(e),
            Err(e) => {
                ok = false;
                writeln!(err, "line {n}: {e}")?;
            }
        }
    }
    Ok(ok)
}
