//! Shared helpers for the integration tests.

#![allow(dead_code)] // each test binary uses a different subset

/// One row of `tests/data/lines.tsv`.
pub struct Fixture {
    pub id: u32,
    pub device: &'static str,
    pub release: &'static str,
    pub source: &'static str,
    pub line: &'static str,
}

const TSV: &str = include_str!("../data/lines.tsv");

/// All fixture rows, header excluded.
pub fn fixtures() -> Vec<Fixture> {
    TSV.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            assert_eq!(cols.len(), 5, "malformed fixture row: {l}");
            Fixture {
                id: cols[0].parse().expect("numeric id"),
                device: cols[1],
                release: cols[2],
                source: cols[3],
                line: cols[4],
            }
        })
        .collect()
}

/// The line of fixture `id`.
pub fn line(id: u32) -> &'static str {
    fixtures()
        .into_iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("no fixture {id}"))
        .line
}
