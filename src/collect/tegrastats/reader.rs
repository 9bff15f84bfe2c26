//! A cancel-safe reader of bounded lines from an async pipe: a line over the limit is
//! skipped without being buffered. Generic over the reader; it knows nothing of tegrastats.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One line from a pipe.
#[derive(Debug, PartialEq, Eq)]
pub enum RawLine {
    /// A line, without its terminator (`\n` or `\r\n`).
    Line(Vec<u8>),
    /// A line longer than the limit; skipped without buffering it.
    TooLong,
}

/// Reads lines of at most `max` bytes from an async reader. Cancel-safe: progress is kept
/// in the struct, so `next_line` can be a `select!` branch.
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    max: usize,
    skipping: bool,
    /// End of input (or a read error) was seen.
    pub done: bool,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    /// Wraps a buffered reader.
    pub fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::new(),
            max,
            skipping: false,
            done: false,
        }
    }

    /// The next line; `None` at the end of input.
    pub async fn next_line(&mut self) -> std::io::Result<Option<RawLine>> {
        loop {
            let chunk = match self.inner.fill_buf().await {
                Ok(c) => c,
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            };
            if chunk.is_empty() {
                self.done = true;
                if std::mem::take(&mut self.skipping) {
                    self.buf.clear();
                    return Ok(Some(RawLine::TooLong));
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(self.finish()));
            }
            let (take, newline) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (i, true),
                None => (chunk.len(), false),
            };
            if !self.skipping {
                if self.buf.len() + take > self.max {
                    self.skipping = true;
                    self.buf.clear();
                } else {
                    self.buf
                        .extend_from_slice(chunk.get(..take).unwrap_or_default());
                }
            }
            self.inner.consume(take + usize::from(newline));
            if newline {
                if std::mem::take(&mut self.skipping) {
                    return Ok(Some(RawLine::TooLong));
                }
                return Ok(Some(self.finish()));
            }
        }
    }

    fn finish(&mut self) -> RawLine {
        let mut line = std::mem::take(&mut self.buf);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        RawLine::Line(line)
    }
}
