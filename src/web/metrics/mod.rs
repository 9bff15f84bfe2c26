//! `GET /metrics`: the Prometheus text exposition (format 0.0.4) of the latest value of every
//! numeric series in the store, tags as labels, and the agent's own health (`edgewatch_*`)
//! from the typed status document that `/api/v1/status` answers: each family's name, type
//! and help are written out next to the field it exports, never derived from a field name.
//!
//! The newest values come from [`LatestValues`](crate::store::LatestValues), which the
//! writer keeps as it accepts points, held ones included (no chunk is decoded per scrape,
//! and a scrape commits nothing: the status part reads what is stored); the names and tags come from
//! the series dictionary, read row by row through SQLite and written out as they are read,
//! so a scrape holds one 64 KB piece of output and the small [`Index`] (per measurement and
//! field: the family name and its label names), never the whole exposition or the whole
//! dictionary. No lock is held while a piece is written (the scraper may be slow or gone):
//! the store's reader is taken per piece, the index only to take the family list. A scrape
//! the store fails halfway ends without its last chunk. The writer thread is never
//! touched, and nothing is written to the store.
//!
//! Names of stored series: `measurement,tags field=` becomes the gauge
//! `measurement_field{tags}` (snake_case; characters outside `[a-z0-9_]` become `_`), e.g.
//! `gpu_temp_c{gpu="0",...}`, in base units where the field names a time or size unit
//! ([`base_unit`]: `wall_ms` -> `inference_wall_seconds`, `mem_used_mb` ->
//! `gpu_mem_used_bytes`); names starting `edgewatch_` are the agent's own and are not taken
//! from the store. Strings are left out; booleans are 0/1. A series whose newest point is
//! older than [`LATEST_WINDOW_NS`] is left out, as Prometheus would mark it stale. A family's
//! label names are the union of its members' tag keys (a missing one is an empty label,
//! which Prometheus treats as absent). `[http] metrics_include` / `metrics_exclude` choose
//! the measurements exported.
//!
//! The agent's own families are encoded with the `prometheus` crate's `TextEncoder`
//! (escaping, name and label checks, duplicate detection): the classic text format is what
//! `promtool check metrics` checks and what every scraper accepts, where `prometheus-client`
//! writes OpenMetrics (`# EOF`, `_total` suffixes added for you), a second format to
//! negotiate for no gain here. The store's families, up to `max_series` samples, are written
//! by [`FamilyWriter`] in the same format: the crate's registry holds every sample (a
//! `GaugeVec` child each) before encoding, which cost 1.9 s and hundreds of MB at 100,000
//! series.
//!
//! Layout: `text.rs` (names, units, escaping and the [`FamilyWriter`] of the text format),
//! `index.rs` (the [`Index`] kept between scrapes), `series.rs` (the store's families,
//! streamed), `health.rs` (the agent's own `edgewatch_*` families and `ALERTS`).

mod health;
mod index;
mod series;
#[cfg(test)]
mod tests;
mod text;

use std::collections::{BTreeMap, BTreeSet};

use crate::status::Status;
use crate::store::StoreError;

pub use health::{alerts_exposition, render_health};
pub use index::Index;
pub use series::{warm, write_store};
use text::family_help;
pub use text::{base_unit, label_name, metric_name, FamilyWriter};

/// How far back the newest point of a series may be to be exported: 5 minutes.
pub const LATEST_WINDOW_NS: i64 = 300 * 1_000_000_000;
/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why writing the store's part of an exposition stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExpositionError {
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The scraper went away or stopped reading.
    #[error("scraper gone: {0}")]
    Client(#[from] std::io::Error),
}

/// The newest value of one numeric series (the pure [`render`]'s input).
#[derive(Debug, Clone, PartialEq)]
pub struct Latest {
    /// Measurement.
    pub measurement: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Field.
    pub field: String,
    /// Timestamp, ns.
    pub ts: i64,
    /// The value.
    pub value: f64,
}

/// The whole exposition from values in hand (pure): the agent's health, then one gauge
/// family per measurement and field, as a scrape writes them from the store.
pub fn render(
    status: &Status,
    latest: &[Latest],
    commits: Option<&prometheus::Histogram>,
) -> String {
    let mut out = render_health(status, commits).into_bytes();
    let mut families: BTreeMap<String, Vec<(&Latest, f64)>> = BTreeMap::new();
    for l in latest {
        let (name, factor) = base_unit(&metric_name(&format!("{}_{}", l.measurement, l.field)));
        families.entry(name).or_default().push((l, factor));
    }
    for (name, members) in &families {
        if name.starts_with("edgewatch_") {
            continue;
        }
        let factor = members[0].1;
        let labels: BTreeSet<String> = members
            .iter()
            .flat_map(|(l, _)| l.tags.keys().map(|k| label_name(k)))
            .collect();
        let first = members[0].0;
        let mut fam = FamilyWriter::new(
            name,
            family_help(&first.field, &first.measurement, factor),
            labels.iter().map(String::as_str).collect(),
            factor,
        );
        for (l, f) in members {
            if *f != factor {
                continue;
            }
            let tags: Vec<(&String, &String)> = l.tags.iter().collect();
            let _ = fam.sample(&mut out, &tags, l.value);
        }
    }
    String::from_utf8(out).unwrap_or_default()
}
