//! `[tegrastats] replay = "FILE"`: a recorded tegrastats log read one sample per interval,
//! looping, stamped with the agent's clock as if live. File reads run on the blocking pool;
//! it never starts tegrastats.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tegrastats_parser::{ReadError, Sample};
use tokio_util::sync::CancellationToken;

use super::error::TegrastatsError;
use super::mapper::sample_to_lines;
use super::status::TegrastatsStatus;
use super::MAX_LINE_LEN;
use crate::model::Batch;
use crate::queue::IngestHandle;
use crate::stats::Stats;

/// A recorded tegrastats log read one sample at a time, starting over at its end. Blocking
/// (plain file reads): call it from the blocking pool.
pub struct Replay {
    path: PathBuf,
    reader: Option<tegrastats_parser::Reader<std::io::BufReader<std::fs::File>>>,
    samples_this_pass: u64,
    passes: u64,
    bad_lines: u64,
}

impl Replay {
    /// Opens `path` (the open is repeated at each pass).
    pub fn open(path: &Path) -> Result<Replay, TegrastatsError> {
        let mut r = Replay {
            path: path.to_path_buf(),
            reader: None,
            samples_this_pass: 0,
            passes: 0,
            bad_lines: 0,
        };
        r.reopen()?;
        Ok(r)
    }

    fn reopen(&mut self) -> Result<(), TegrastatsError> {
        let file = std::fs::File::open(&self.path).map_err(|source| TegrastatsError::ReplayIo {
            path: self.path.clone(),
            source,
        })?;
        self.reader = Some(
            tegrastats_parser::Reader::new(std::io::BufReader::new(file))
                .max_line_len(MAX_LINE_LEN),
        );
        self.samples_this_pass = 0;
        Ok(())
    }

    /// The next sample, going back to the start of the file at its end. Fails when the file
    /// cannot be read or a whole pass over it found no sample.
    pub fn next_sample(&mut self) -> Result<Sample, TegrastatsError> {
        loop {
            let Some(reader) = self.reader.as_mut() else {
                self.reopen()?;
                continue;
            };
            match reader.next() {
                Some((_, Ok(sample))) => {
                    self.samples_this_pass += 1;
                    return Ok(sample);
                }
                Some((_, Err(ReadError::Io(source)))) => {
                    self.reader = None;
                    return Err(TegrastatsError::ReplayIo {
                        path: self.path.clone(),
                        source,
                    });
                }
                Some((n, Err(e))) => {
                    // Counted once, not at every pass: a recorded log does not get worse.
                    if self.passes == 0 {
                        self.bad_lines += 1;
                        tracing::debug!(line = n, error = %e, file = %self.path.display(), "replay: line skipped");
                    }
                }
                None => {
                    if self.samples_this_pass == 0 {
                        return Err(TegrastatsError::ReplayEmpty {
                            path: self.path.clone(),
                        });
                    }
                    self.passes += 1;
                    self.reader = None;
                }
            }
        }
    }

    /// Lines that did not parse on the first pass, since the last call.
    pub fn take_bad_lines(&mut self) -> u64 {
        std::mem::take(&mut self.bad_lines)
    }

    /// Completed passes over the file.
    pub fn passes(&self) -> u64 {
        self.passes
    }
}

pub(super) async fn run_replay(
    path: PathBuf,
    interval: Duration,
    handle: IngestHandle,
    stats: Arc<Stats>,
    status: &TegrastatsStatus,
    jetson: &crate::collect::jetson::JetsonStatus,
    shutdown: CancellationToken,
) {
    let opened = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || Replay::open(&path)).await
    };
    let mut replay = match opened {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "Jetson collector off");
            status.set("off", e.to_string());
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "tegrastats replay task failed; Jetson collector off");
            status.set("off", format!("replay task failed: {e}"));
            return;
        }
    };
    tracing::info!(file = %path.display(), ?interval, "tegrastats collector replaying a log");
    let mut tick = crate::periodic::Ticker::new(interval);
    loop {
        if tick.next(&shutdown).await.is_none() {
            status.set("stopped", "agent shutdown");
            break;
        }
        let next = tokio::task::spawn_blocking(move || {
            let r = replay.next_sample();
            (replay, r)
        })
        .await;
        let sample = match next {
            Ok((r, res)) => {
                replay = r;
                let bad = replay.take_bad_lines();
                Stats::add(&stats.collector_errors, bad);
                status.bad_lines(bad);
                res
            }
            Err(e) => {
                tracing::error!(error = %e, "tegrastats replay task failed; Jetson collector off");
                status.set("off", format!("replay task failed: {e}"));
                return;
            }
        };
        match sample {
            Ok(s) => {
                let ts = crate::now_ns();
                status.sample(ts);
                let mut batch = Batch {
                    lines: sample_to_lines(&s, ts),
                };
                jetson.tag_batch(&mut batch);
                crate::collect::submit(&handle, &stats, batch, "tegrastats");
            }
            Err(e) => {
                tracing::error!(error = %e, "Jetson collector off");
                status.set("off", e.to_string());
                return;
            }
        }
    }
}
