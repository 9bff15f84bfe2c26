//! The [`Index`] `/metrics` keeps between scrapes: per measurement and field of the store,
//! the family name (base units applied) and the label names of its tag keys, read from
//! the series added to the dictionary since the last scrape.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;

use super::text::{base_unit, key_tags, label_name, metric_name};
use crate::store::{dict, Reader, StoreError};

/// One measurement + field of the store, as `/metrics` exports it.
#[derive(Debug, Clone, Default)]
pub(super) struct Pair {
    /// Family name (base units applied).
    pub(super) name: String,
    /// Factor to base units.
    pub(super) factor: f64,
    /// Label names of its tag keys, seen so far.
    pub(super) labels: BTreeSet<String>,
}

/// What `/metrics` keeps between scrapes: per measurement and field, its family name and
/// the label names of its tag keys. The dictionary only grows, so each scrape reads only
/// the series added since the last one. Size: one entry per measurement and field (a few
/// dozen on a device), never per tag set.
#[derive(Debug, Default)]
pub struct Index {
    after: i64,
    pub(super) pairs: BTreeMap<String, BTreeMap<String, Pair>>,
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
}
