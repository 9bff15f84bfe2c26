//! Error types.

use std::fmt;
use std::io;

/// Why a line is not a tegrastats sample.
///
/// Parsing is lenient: a line fails only when it carries no evidence of
/// being tegrastats output at all. See [`parse_line`](crate::parse_line) for
/// the exact rule.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// The line is empty or holds only ASCII whitespace.
    Empty,
    /// Nothing besides an optional timestamp and generic `NAME value`
    /// engine-like pairs was recognised (for example a `date` line that a
    /// wrapper script wrote into the same log).
    NotTegrastats {
        /// The first token of the line (at most 32 bytes, cut at a character
        /// boundary), for diagnostics.
        first_token: String,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Empty => f.write_str("empty line"),
            ParseError::NotTegrastats { first_token } => write!(
                f,
                "no tegrastats field found in line starting with {first_token:?}"
            ),
        }
    }
}

impl std::error::Error for ParseError {}

/// An error from [`Reader`](crate::Reader).
#[derive(Debug)]
#[non_exhaustive]
pub enum ReadError {
    /// Reading from the underlying reader failed. The reader yields nothing
    /// after this.
    Io(io::Error),
    /// The line was read but is not a tegrastats sample.
    Parse(ParseError),
    /// The line is longer than the reader's limit (see
    /// [`Reader::max_line_len`](crate::Reader::max_line_len)); it was
    /// skipped up to its end and reading goes on with the next line.
    LineTooLong {
        /// The limit in bytes, excluding the line terminator.
        limit: usize,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(_) => f.write_str("I/O error while reading tegrastats output"),
            ReadError::Parse(e) => e.fmt(f),
            ReadError::LineTooLong { limit } => {
                write!(f, "line longer than {limit} bytes, skipped")
            }
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io(e) => Some(e),
            // `Parse` is transparent: its Display already is the parse error.
            ReadError::Parse(_) | ReadError::LineTooLong { .. } => None,
        }
    }
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

impl From<ParseError> for ReadError {
    fn from(e: ParseError) -> Self {
        ReadError::Parse(e)
    }
}
