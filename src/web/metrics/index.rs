//! The [`Index`] `/metrics` keeps between scrapes: per measurement and field of the store,
//! the family name (base units applied) and the label names of its tag keys, read from
//! the series added to the dictionary since the last scrape; and the [`Family`] list a
//! scrape writes, taken from it (owned: the index is not held while a scrape writes).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;

use super::text::{base_unit, family_help, key_tags, label_name, metric_name};
use crate::config::HttpConfig;
use crate::store::{dict, Reader, StoreError};

/// One measurement + field of the store, as `/metrics` exports it.
#[derive(Debug, Clone, Default)]
struct Pair {
    /// Family name (base units applied).
    name: String,
    /// Factor to base units.
    factor: f64,
    /// Label names of its tag keys, seen so far.
    labels: BTreeSet<String>,
}

/// What `/metrics` keeps between scrapes: per measurement and field, its family name and
/// the label names of its tag keys. The dictionary only grows, so each scrape reads only
/// the series added since the last one. Size: one entry per measurement and field (a few
/// dozen on a device), never per tag set.
#[derive(Debug, Default)]
pub struct Index {
    after: i64,
    pairs: BTreeMap<String, BTreeMap<String, Pair>>,
}

impl Index {
    /// Reads the numeric series added since the last call.
    pub(super) fn refresh(&mut self, reader: &Reader) -> Result<(), StoreError> {
        let pairs = &mut self.pairs;
        let mut after = self.after;
        dict::numeric_series_after(reader.conn(), reader.path(), after, |sid, m, f, key| {
            after = sid;
            let fields = match pairs.get_mut(m) {
                Some(x) => x,
                None => pairs.entry(m.to_string()).or_default(),
            };
            let pair = match fields.get_mut(f) {
                Some(p) => p,
                None => {
                    let (name, factor) = base_unit(&metric_name(&format!("{m}_{f}")));
                    fields.entry(f.to_string()).or_insert(Pair {
                        name,
                        factor,
                        labels: BTreeSet::new(),
                    })
                }
            };
            for (k, _) in key_tags(key) {
                pair.labels.insert(label_name(&k));
            }
            ControlFlow::Continue(())
        })?;
        self.after = after;
        Ok(())
    }

    /// The store's families to export, in name order: the measurements `http` exports,
    /// names starting `edgewatch_` left out (the agent's own). Members whose unit factor
    /// differs from the first member's are a name clash: left out (logged at debug).
    pub(super) fn families(&self, http: &HttpConfig) -> Vec<Family> {
        let mut by_name: BTreeMap<&str, Vec<(&str, &str, &Pair)>> = BTreeMap::new();
        for (m, fields) in &self.pairs {
            if !http.metrics_exports(m) {
                continue;
            }
            for (f, p) in fields {
                if p.name.starts_with("edgewatch_") {
                    continue;
                }
                by_name.entry(&p.name).or_default().push((m, f, p));
            }
        }
        let mut out = Vec::with_capacity(by_name.len());
        for (name, members) in by_name {
            let (m0, f0, p0) = members[0];
            let mut labels = BTreeSet::new();
            let mut keep = Vec::with_capacity(members.len());
            for (m, f, p) in members {
                if p.factor != p0.factor {
                    tracing::debug!(metric = %name, measurement = %m, field = %f, "left out of /metrics: name clash");
                    continue;
                }
                labels.extend(p.labels.iter().cloned());
                keep.push((m.to_string(), f.to_string()));
            }
            out.push(Family {
                name: name.to_string(),
                help: family_help(f0, m0, p0.factor),
                labels: labels.into_iter().collect(),
                factor: p0.factor,
                members: keep,
            });
        }
        out
    }
}

/// One family of the store's part of a scrape: its name, help, label names (sorted), unit
/// factor and its (measurement, field) members.
#[derive(Debug, Clone)]
pub(super) struct Family {
    pub(super) name: String,
    pub(super) help: String,
    pub(super) labels: Vec<String>,
    pub(super) factor: f64,
    pub(super) members: Vec<(String, String)>,
}
