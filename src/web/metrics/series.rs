//! The store's families: the newest value of every numeric series, written out as the
//! dictionary is read.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::ops::ControlFlow;
use std::sync::Mutex;

use super::index::{Index, Pair};
use super::text::{family_help, key_tags, FamilyWriter};
use super::ExpositionError;
use crate::config::HttpConfig;
use crate::store::{dict, LatestValues, Reader, StoreError};

/// Reads what the first scrape needs ahead of it (the newest values of the last window,
/// the index), so that scrape costs what later ones do. Called once at start-up.
pub fn warm(
    reader: &Mutex<Reader>,
    latest: &LatestValues,
    index: &Mutex<Index>,
    since: i64,
) -> Result<(), StoreError> {
    let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
    let r = reader.lock().unwrap_or_else(|p| p.into_inner());
    latest.seed(&r, since)?;
    index.refresh(&r)
}

/// Writes the store's families: every numeric series of an exported measurement whose
/// newest value (from `latest`) is at or after `since`. The reader is locked per
/// measurement and field, so other requests interleave with a long scrape.
pub fn write_store<W: Write + ?Sized>(
    reader: &Mutex<Reader>,
    latest: &LatestValues,
    http: &HttpConfig,
    index: &mut Index,
    since: i64,
    out: &mut W,
) -> Result<(), ExpositionError> {
    let lock = || reader.lock().unwrap_or_else(|p| p.into_inner());
    {
        let r = lock();
        latest.seed(&r, since)?;
        index.refresh(&r)?;
    }
    // Family name -> its (measurement, field, pair)s, in name order.
    let mut families: BTreeMap<&str, Vec<(&str, &str, &Pair)>> = BTreeMap::new();
    for (m, fields) in &index.pairs {
        if !http.metrics_exports(m) {
            continue;
        }
        for (f, p) in fields {
            if p.name.starts_with("edgewatch_") {
                continue;
            }
            families.entry(&p.name).or_default().push((m, f, p));
        }
    }
    for (name, members) in families {
        let (m0, f0, p0) = members[0];
        let labels: BTreeSet<&str> = members
            .iter()
            .filter(|x| x.2.factor == p0.factor)
            .flat_map(|x| x.2.labels.iter().map(String::as_str))
            .collect();
        let mut fam = FamilyWriter::new(
            name,
            family_help(f0, m0, p0.factor),
            labels.into_iter().collect(),
            p0.factor,
        );
        for (m, f, p) in members {
            if p.factor != p0.factor {
                tracing::debug!(metric = %name, measurement = %m, field = %f, "left out of /metrics: name clash");
                continue;
            }
            let r = lock();
            let mut failed = None;
            dict::numeric_members(r.conn(), r.path(), m, f, |sid, key| {
                let Some((_, v)) = latest.get(sid, since) else {
                    return ControlFlow::Continue(());
                };
                match fam.sample(out, &key_tags(key), v) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        failed = Some(e);
                        ControlFlow::Break(())
                    }
                }
            })?;
            if let Some(e) = failed {
                return Err(e.into());
            }
        }
    }
    Ok(())
}
