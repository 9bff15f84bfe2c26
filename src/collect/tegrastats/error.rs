//! Why the Jetson collector stopped or could not start; each message names the file or
//! binary involved. No IO.

use std::path::PathBuf;
use std::time::Duration;

/// Why the collector stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum TegrastatsError {
    /// The replay file could not be opened or read.
    #[error("cannot read tegrastats replay file {path}: {source}")]
    ReplayIo {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A whole pass over the replay file found no tegrastats line.
    #[error("tegrastats replay file {path} holds no tegrastats line")]
    ReplayEmpty {
        /// The file.
        path: PathBuf,
    },
    /// tegrastats closed its stdout but did not exit (it was stopped).
    #[error("tegrastats closed its output but kept running")]
    OutputClosed,
    /// tegrastats kept running but printed no line for too long (it was stopped).
    #[error("tegrastats printed nothing for {:.1}s (stall_timeout); stopped it", .silent.as_secs_f64())]
    Stalled {
        /// How long it had been silent.
        silent: Duration,
    },
    /// Waiting for tegrastats to exit failed.
    #[error("cannot wait for tegrastats: {source}")]
    Wait {
        /// The error.
        source: std::io::Error,
    },
    /// tegrastats could not be started.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}
