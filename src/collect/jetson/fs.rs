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

/// Where a devfreq device ranks as the Jetson GPU, `None` when it is not the GPU: `0` for
/// `gpu-gpc-0` (Thor on JetPack 7, the graphics clock of GPC 0), `1` for the names before it
/// (`17000000.ga10b` Orin on JetPack 5, `17000000.gpu` Orin on JetPack 6 and 7,
/// `17000000.gv11b` Xavier, `17000000.gp10b` TX2, `57000000.gpu` Nano and TX1, `gm20b` on
/// older kernels), `2` for another GPC (`gpu-gpc-1`, ...). Thor's `gpu-nvd-0` is not the
/// graphics clock and is not ranked.
pub fn gpu_devfreq_rank(name: &str) -> Option<u8> {
    if name == "gpu-gpc-0" {
        Some(0)
    } else if ["ga10b", "gv11b", "gp10b", "gm20b", "gpu"]
        .iter()
        .any(|n| name.ends_with(n))
    {
        Some(1)
    } else if name.starts_with("gpu-gpc-") {
        Some(2)
    } else {
        None
    }
}

/// The GPU devfreq devices under `root`, best first (rank, then name).
pub fn gpu_devfreq_nodes(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<(u8, PathBuf)> = dirs(&root.join("sys/class/devfreq"))
        .into_iter()
        .filter_map(|d| gpu_devfreq_rank(&name_of(&d)).map(|r| (r, d)))
        .collect();
    v.sort();
    v.into_iter().map(|(_, d)| d).collect()
}
