//! Embeds the numbered SQL files of `migrations/` into the binary, in order, and reruns
//! whenever a migration is added or changed.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    // The earliest the clock can plausibly read where this binary runs: when it was built
    // (SOURCE_DATE_EPOCH for reproducible builds). Below it, the device's clock is not set.
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let built = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0)
        });
    println!("cargo:rustc-env=EW_BUILD_UNIX_S={built}");
    let dir = Path::new("migrations");
    let mut files: Vec<(u32, String)> = Vec::new();
    for entry in std::fs::read_dir(dir).expect("migrations/ must exist") {
        let name = entry.expect("readable migrations/").file_name();
        let name = name.to_string_lossy().into_owned();
        if !name.ends_with(".sql") {
            continue;
        }
        let version: u32 = name
            .split('_')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("migration {name} must start with its number, e.g. 0001_"));
        println!("cargo:rerun-if-changed=migrations/{name}");
        files.push((version, name));
    }
    files.sort();
    for (i, (v, name)) in files.iter().enumerate() {
        assert_eq!(
            *v as usize,
            i + 1,
            "migration numbers must be 1, 2, 3, ... ({name})"
        );
    }
    let mut out = String::from("/// (version, file name, SQL) of every migration, in order.\n");
    out.push_str("pub const MIGRATIONS: &[(u32, &str, &str)] = &[\n");
    for (v, name) in &files {
        let _ = writeln!(
            out,
            "    ({v}, {name:?}, include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/migrations/{name}\"))),"
        );
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("migrations.rs");
    std::fs::write(dest, out).expect("write migrations.rs");
}
