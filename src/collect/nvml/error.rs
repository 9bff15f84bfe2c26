//! Why an NVML reading or NVML itself failed, classified from `nvml-wrapper`'s errors:
//! what the sampler skips, retries or reports. Messages a user sees say what to do. No IO.

use nvml_wrapper::error::NvmlError;

/// Why one reading failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// This GPU (or driver) does not implement the query; skip it for this GPU.
    #[error("not supported")]
    NotSupported,
    /// The GPU fell off the bus, needs a reset, or its handle is gone.
    #[error("GPU lost: {0}")]
    GpuLost(String),
    /// Anything else (permission, driver error); counted and kept as the last error.
    #[error("{0}")]
    Other(String),
}

impl From<NvmlError> for ReadError {
    fn from(e: NvmlError) -> Self {
        match e {
            // A symbol missing from an older driver's library: that driver does not support it.
            NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_) => ReadError::NotSupported,
            NvmlError::GpuLost | NvmlError::ResetRequired => ReadError::GpuLost(e.to_string()),
            other => ReadError::Other(other.to_string()),
        }
    }
}

/// Maps an error from looking a device up: anything but "not supported" means the handle is
/// unusable, which for a GPU that was there at start means it is lost.
pub(super) fn handle_error(e: NvmlError) -> ReadError {
    match ReadError::from(e) {
        ReadError::Other(m) => ReadError::GpuLost(m),
        r => r,
    }
}

/// Why NVML is unavailable; the message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum NvmlInitError {
    /// `libnvidia-ml.so.1` is not installed or could not be loaded.
    #[error(
        "no NVIDIA driver found: NVML (libnvidia-ml.so.1) could not be loaded ({0}); install \
         the NVIDIA driver to monitor discrete GPUs; on a Jetson use the tegrastats collector"
    )]
    LibraryMissing(String),
    /// The library loaded but the kernel driver is not running.
    #[error(
        "the NVIDIA kernel driver is not loaded (NVML: {0}); check `nvidia-smi` and \
         `lsmod | grep nvidia`"
    )]
    DriverNotLoaded(String),
    /// The user library and the kernel module are different versions.
    #[error(
        "NVIDIA driver/library version mismatch: libnvidia-ml.so.1 does not match the loaded \
         kernel module (usually a driver upgrade without a reboot); reboot or reload the \
         nvidia kernel module"
    )]
    VersionMismatch,
    /// The process may not open the NVIDIA device files.
    #[error(
        "no permission to talk to the NVIDIA driver ({0}); run edgewatch as a user that can \
         open /dev/nvidia*"
    )]
    NoPermission(String),
    /// NVML works but lists no GPU.
    #[error("no NVIDIA GPU found: NVML (driver {driver}) lists no device")]
    NoGpu {
        /// Driver version NVML reported.
        driver: String,
    },
    /// Any other NVML failure at start.
    #[error("NVML could not be initialised: {0}")]
    Other(String),
    /// The report could not be written.
    #[error("cannot write the GPU report: {0}")]
    Io(#[from] std::io::Error),
}

impl NvmlInitError {
    /// Classifies an error from `Nvml::init` or the first device queries.
    pub fn from_nvml(e: NvmlError) -> NvmlInitError {
        match e {
            // libloading's own text names the file and the dlopen reason.
            NvmlError::LibloadingError(inner) => NvmlInitError::LibraryMissing(inner.to_string()),
            NvmlError::LibraryNotFound
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound => NvmlInitError::LibraryMissing(e.to_string()),
            NvmlError::DriverNotLoaded => NvmlInitError::DriverNotLoaded(e.to_string()),
            NvmlError::LibRmVersionMismatch => NvmlInitError::VersionMismatch,
            NvmlError::NoPermission => NvmlInitError::NoPermission(e.to_string()),
            other => NvmlInitError::Other(other.to_string()),
        }
    }
}
