//! Small file helpers of the Jetson collector: a file read as text or as a number, the
//! sorted entries of a directory, and which devfreq device is the GPU. A file that is
//! missing or unreadable reads as `None` (the callers say what that means); nothing here
//! writes or spawns.

use std::path::{Path, PathBuf};

/// The file as text; `None` when missing or unreadable.
pub fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// The file as one number.
pub fn read_num(p: &Path) -> Option<f64> {
    read(p)?.trim().parse().ok()
}

/// The entries of a directory, sorted; empty when it cannot be listed.
pub fn dirs(p: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(p)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The last component of a path.
pub fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The Jetson GPU's devfreq device names: `17000000.ga10b` (Orin, JetPack 5),
/// `17000000.gpu` (Orin, JetPack 6), `17000000.gv11b` (Xavier), `17000000.gp10b` (TX2),
/// `57000000.gpu` (Nano, TX1; `gm20b` on older kernels).
pub fn is_gpu_devfreq(name: &str) -> bool {
    ["ga10b", "gv11b", "gp10b", "gm20b", "gpu"]
        .iter()
        .any(|n| name.ends_with(n))
}
