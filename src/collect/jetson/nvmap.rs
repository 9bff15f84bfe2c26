//! Per-process GPU memory on a Jetson, from the nvmap debugfs client list
//! (`/sys/kernel/debug/nvmap/iovmm/clients`, else `.../iovmm/maps`, which has the same
//! client rows between its per-mapping detail lines; root only): one row per client with
//! its process name, pid and size (`user  python3  4121  524288K`), and a `total` row. The
//! parser is pure; the GPU memory of a Jetson is the shared DRAM that nvmap maps for the
//! GPU (and the other engines), so this is what each process holds there. It never reads
//! `/proc/<pid>` and never writes.

use crate::model::{series_key, Line, Value};

/// Where the list is, under the collector's root.
pub const CLIENTS: &str = "sys/kernel/debug/nvmap/iovmm/clients";
/// The same client rows with each client's mappings below it (read when `CLIENTS` is not).
pub const MAPS: &str = "sys/kernel/debug/nvmap/iovmm/maps";

/// One process's nvmap memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Client {
    /// Process id.
    pub pid: u32,
    /// Process name (the kernel's `comm`: up to 15 characters, may hold spaces).
    pub name: String,
    /// Memory, bytes.
    pub bytes: u64,
}

/// `524288K` -> bytes (`K`, `M`, `G` binary units; the driver prints `K`). A number
/// without a unit is not a size (a detail line's pointer or flags).
fn size(text: &str) -> Option<u64> {
    let (num, mult) = match text.char_indices().last()? {
        (i, 'K' | 'k') => (&text[..i], 1u64 << 10),
        (i, 'M' | 'm') => (&text[..i], 1 << 20),
        (i, 'G' | 'g') => (&text[..i], 1 << 30),
        _ => return None,
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// The clients of the list, one per pid (rows of one pid summed), in pid order; the
/// header, the `total` row and anything unparseable skipped. Pure.
pub fn parse_clients(text: &str) -> Vec<Client> {
    let mut out: Vec<Client> = Vec::new();
    for line in text.lines() {
        let t: Vec<&str> = line.split_ascii_whitespace().collect();
        // CLIENT PROCESS... PID SIZE: the name may hold spaces; the client is a word
        // (`user`, `kernel`), where a detail line of `maps` starts with a hex address.
        if t.len() < 4 || !t[0].starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        let (Ok(pid), Some(bytes)) = (t[t.len() - 2].parse::<u32>(), size(t[t.len() - 1])) else {
            continue;
        };
        let name = t[1..t.len() - 2].join(" ");
        match out.iter_mut().find(|c| c.pid == pid) {
            Some(c) => c.bytes = c.bytes.saturating_add(bytes),
            None => out.push(Client { pid, name, bytes }),
        }
    }
    out.sort_by_key(|c| c.pid);
    out
}

/// One `jetson_process` line per client: tags `pid`, `process` (plus the identity tags the
/// collector adds), field `gpu_mem_mb`.
pub fn process_lines(clients: &[Client], ts: i64) -> Vec<Line> {
    clients
        .iter()
        .map(|c| Line {
            key: series_key(
                "jetson_process",
                &[("pid", &c.pid.to_string()), ("process", &c.name)],
            ),
            fields: vec![(
                "gpu_mem_mb".into(),
                Value::F64(c.bytes as f64 / (1u64 << 20) as f64),
            )],
            ts,
            line_no: 0,
        })
        .collect()
}
