//! Streaming over a log file or a pipe from `tegrastats`.

use std::io::{self, BufRead, Read};
use std::iter::FusedIterator;

use crate::error::ReadError;
use crate::parse::parse_line;
use crate::types::Sample;

/// Default for [`Reader::max_line_len`]: 64 KiB. Real lines are below 2 KiB.
pub const DEFAULT_MAX_LINE_LEN: usize = 64 * 1024;

/// Parses tegrastats output line by line from any [`BufRead`].
///
/// The iterator yields `(line_number, result)` pairs, with 1-based line
/// numbers counted over every line of the input (blank ones included), so
/// errors can be reported against the original file.
///
/// * Blank lines are skipped by default (see [`skip_blank_lines`](Self::skip_blank_lines)).
/// * Invalid UTF-8 does not stop the stream: offending bytes become U+FFFD
///   and end up in [`Sample::unknown`] (or make the line an error).
/// * Lines longer than [`max_line_len`](Self::max_line_len) are skipped with
///   [`ReadError::LineTooLong`] without buffering them, so a stream without
///   newlines cannot exhaust memory.
/// * An I/O error is yielded once and ends the iteration.
///
/// # Example
///
/// ```
/// use tegrastats_parser::Reader;
///
/// let log = "\
/// RAM 1480/7761MB (lfb 706x4MB) CPU [16%@1190,14%@1190,off,off] EMC_FREQ 0%@1600 GR3D_FREQ 0%@114 APE 150 MTS fg 0% bg 1% AO@41C GPU@41C PMIC@100C VDD_IN 3672/3611
/// Thu Dec 17 18:16:50 UTC 2020
///
/// RAM 1481/7761MB (lfb 706x4MB) CPU [12%@1190,10%@1190,off,off] EMC_FREQ 0%@1600 GR3D_FREQ 0%@114 APE 150 MTS fg 0% bg 0% AO@41C GPU@41C PMIC@100C VDD_IN 3590/3600
/// ";
/// let mut ok = Vec::new();
/// let mut bad = Vec::new();
/// for (line, result) in Reader::new(log.as_bytes()) {
///     match result {
///         Ok(sample) => ok.push((line, sample.ram.unwrap().used_mb)),
///         Err(err) => bad.push((line, err.to_string())),
///     }
/// }
/// assert_eq!(ok, [(1, 1480.0), (4, 1481.0)]);
/// assert_eq!(bad.len(), 1);
/// assert_eq!(bad[0].0, 2);
/// ```
#[derive(Debug)]
pub struct Reader<R> {
    inner: R,
    buf: Vec<u8>,
    line: usize,
    max_line_len: usize,
    skip_blank: bool,
    done: bool,
}

impl<R: BufRead> Reader<R> {
    /// Wraps a buffered reader, e.g. `std::io::stdin().lock()` or a
    /// `BufReader<File>` or `BufReader<ChildStdout>`.
    pub fn new(inner: R) -> Self {
        Reader {
            inner,
            buf: Vec::new(),
            line: 0,
            max_line_len: DEFAULT_MAX_LINE_LEN,
            skip_blank: true,
            done: false,
        }
    }

    /// Sets the longest accepted line in bytes, excluding the line
    /// terminator (default [`DEFAULT_MAX_LINE_LEN`]).
    #[must_use]
    pub fn max_line_len(mut self, bytes: usize) -> Self {
        self.max_line_len = bytes;
        self
    }

    /// Whether whitespace-only lines are skipped silently (the default) or
    /// yielded as [`ParseError::Empty`](crate::ParseError::Empty).
    #[must_use]
    pub fn skip_blank_lines(mut self, skip: bool) -> Self {
        self.skip_blank = skip;
        self
    }

    /// Number of lines read so far, i.e. the number of the last line yielded
    /// or skipped.
    pub fn line_number(&self) -> usize {
        self.line
    }

    /// The underlying reader.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Unwraps the underlying reader. Buffered data not yet parsed is lost.
    pub fn into_inner(self) -> R {
        self.inner
    }

    fn fail(&mut self, line: usize, err: io::Error) -> Option<(usize, Result<Sample, ReadError>)> {
        self.done = true;
        Some((line, Err(ReadError::Io(err))))
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = (usize, Result<Sample, ReadError>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            self.buf.clear();
            // One byte more than the limit tells a too-long line apart.
            let limit = u64::try_from(self.max_line_len)
                .unwrap_or(u64::MAX)
                .saturating_add(1);
            let read = (&mut self.inner)
                .take(limit)
                .read_until(b'\n', &mut self.buf);
            match read {
                Ok(0) => {
                    self.done = true;
                    return None;
                }
                Ok(_) => {}
                Err(err) => return self.fail(self.line.saturating_add(1), err),
            }
            self.line = self.line.saturating_add(1);
            let newline = self.buf.last() == Some(&b'\n');
            let len = self.buf.len().saturating_sub(usize::from(newline));
            if len > self.max_line_len {
                if !newline {
                    if let Err(err) = skip_line(&mut self.inner) {
                        return self.fail(self.line, err);
                    }
                }
                let limit = self.max_line_len;
                return Some((self.line, Err(ReadError::LineTooLong { limit })));
            }
            if self.skip_blank && self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let text = String::from_utf8_lossy(&self.buf);
            return Some((self.line, parse_line(&text).map_err(ReadError::Parse)));
        }
    }
}

impl<R: BufRead> FusedIterator for Reader<R> {}

/// Discards input up to and including the next `\n` (or to the end).
fn skip_line<R: BufRead>(reader: &mut R) -> io::Result<()> {
    loop {
        let (found, used) = {
            let available = match reader.fill_buf() {
                Ok(available) => available,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
            };
            if available.is_empty() {
                return Ok(());
            }
            match available.iter().position(|&b| b == b'\n') {
                Some(i) => (true, i.saturating_add(1)),
                None => (false, available.len()),
            }
        };
        reader.consume(used);
        if found {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ParseError;

    const LINE: &str = "RAM 1/2MB (lfb 1x2MB) CPU [1%@2]";

    fn collect(reader: Reader<&[u8]>) -> Vec<(usize, String)> {
        reader
            .map(|(n, r)| {
                let what = match r {
                    Ok(s) => format!("ok {}", s.unknown.len()),
                    Err(e) => e.to_string(),
                };
                (n, what)
            })
            .collect()
    }

    #[test]
    fn line_numbers_blank_lines_and_crlf() {
        let input = format!("{LINE}\r\n\n   \r\n{LINE}\r\ngarbage\n{LINE}");
        let got = collect(Reader::new(input.as_bytes()));
        assert_eq!(
            got,
            [
                (1, "ok 0".to_owned()),
                (4, "ok 0".to_owned()),
                (
                    5,
                    "no tegrastats field found in line starting with \"garbage\"".to_owned()
                ),
                (6, "ok 0".to_owned()),
            ]
        );
        let got = collect(Reader::new(input.as_bytes()).skip_blank_lines(false));
        assert_eq!(got.len(), 6);
        assert_eq!(got[1], (2, ParseError::Empty.to_string()));
    }

    #[test]
    fn invalid_utf8_is_not_fatal() {
        let mut input = LINE.as_bytes().to_vec();
        input.extend_from_slice(b" \xff\xfe\n");
        input.extend_from_slice(LINE.as_bytes());
        let mut reader = Reader::new(&input[..]);
        let (n, first) = reader.next().unwrap();
        assert_eq!(n, 1);
        assert_eq!(first.unwrap().unknown, ["\u{fffd}\u{fffd}"]);
        assert_eq!(reader.next().map(|(n, r)| (n, r.is_ok())), Some((2, true)));
        assert!(reader.next().is_none());
    }

    #[test]
    fn long_lines_are_skipped() {
        let long = "x".repeat(100);
        for tail in ["\n", ""] {
            let input = format!("{LINE}\n{long}{tail}{LINE}\n");
            let got = collect(Reader::new(input.as_bytes()).max_line_len(LINE.len()));
            let expected_last = if tail.is_empty() {
                // Without a newline the long line runs into the next one.
                vec![
                    (1, "ok 0".to_owned()),
                    (2, "line longer than 32 bytes, skipped".to_owned()),
                ]
            } else {
                vec![
                    (1, "ok 0".to_owned()),
                    (2, "line longer than 32 bytes, skipped".to_owned()),
                    (3, "ok 0".to_owned()),
                ]
            };
            assert_eq!(got, expected_last, "tail {tail:?}");
        }
        // Exactly at the limit, with and without a newline.
        let input = format!("{LINE}\n{LINE}");
        let got = collect(Reader::new(input.as_bytes()).max_line_len(LINE.len()));
        assert_eq!(got, [(1, "ok 0".to_owned()), (2, "ok 0".to_owned())]);
    }

    struct Failing;

    impl Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::other("boom"))
        }
    }

    #[test]
    fn io_error_ends_the_stream() {
        let first = format!("{LINE}\n");
        let input = io::BufReader::new(first.as_bytes()).chain(io::BufReader::new(Failing));
        let mut reader = Reader::new(input);
        assert!(matches!(reader.next(), Some((1, Ok(_)))));
        match reader.next() {
            Some((2, Err(ReadError::Io(e)))) => assert_eq!(e.to_string(), "boom"),
            other => panic!("{other:?}"),
        }
        assert!(reader.next().is_none());
        assert!(reader.next().is_none());
        assert_eq!(reader.line_number(), 1);
    }
}
