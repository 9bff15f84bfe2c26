//! The store's families: the newest value of every numeric series, written out as the
//! dictionary is read, a piece at a time, with no lock held while a piece is written.

use std::io::Write;
use std::ops::ControlFlow;
use std::sync::Mutex;

use super::index::Index;
use super::text::{key_tags, FamilyWriter};
use super::ExpositionError;
use crate::api::body::PIECE_BYTES;
use crate::config::HttpConfig;
use crate::store::{LatestValues, Reader, StoreError};

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
/// newest value (from `latest`) is at or after `since`.
///
/// No lock is held while `out` is written to: `out` may be a scraper's socket, and a
/// scraper that stops reading must not stall the rest of the API (which shares `reader`)
/// nor the next scrape (which shares `index`). The index is locked only to bring it up to
/// date and take the family list; the reader only to fill one piece of at most
/// [`PIECE_BYTES`] of output from the dictionary, row by row, after which it is released,
/// the piece written, and the next run resumes after the last tag set read. So a scrape
/// holds one piece and the family list, never the whole exposition or dictionary.
pub fn write_store<W: Write + ?Sized>(
    reader: &Mutex<Reader>,
    latest: &LatestValues,
    http: &HttpConfig,
    index: &Mutex<Index>,
    since: i64,
    out: &mut W,
) -> Result<(), ExpositionError> {
    let lock = || reader.lock().unwrap_or_else(|p| p.into_inner());
    let families = {
        let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
        let r = lock();
        latest.seed(&r, since)?;
        index.refresh(&r)?;
        index.families(http)
    };
    let mut piece: Vec<u8> = Vec::with_capacity(PIECE_BYTES + 4096);
    for fam in &families {
        let mut w = FamilyWriter::new(
            &fam.name,
            fam.help.clone(),
            fam.labels.iter().map(String::as_str).collect(),
            fam.factor,
        );
        for (m, f) in &fam.members {
            let mut after = 0;
            loop {
                let next = lock().numeric_members_after(m, f, after, |sid, key| {
                    if let Some((_, v)) = latest.get(sid, since) {
                        // Writing to a Vec cannot fail.
                        let _ = w.sample(&mut piece, &key_tags(key), v);
                    }
                    if piece.len() >= PIECE_BYTES {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                })?;
                // The reader is released: now the piece may wait on the scraper.
                if piece.len() >= PIECE_BYTES {
                    out.write_all(&piece)?;
                    piece.clear();
                }
                match next {
                    Some(tagset) => after = tagset,
                    None => break,
                }
            }
        }
    }
    out.write_all(&piece)?;
    Ok(())
}
