//! [`Staged`]: lines the writer has checked and resolved to series ids but not yet stored,
//! in the shape both the journal ([`super::journal`]) records and the next commit
//! ([`super::Writer::commit`]) packs into chunks. Kept apart from both so neither depends on
//! the other's module.

use crate::model::Value;

/// One held line: `(tag set, time, its (series id, value)s)`.
pub(super) type Line<'a> = (i64, i64, &'a [(i64, Value)]);

/// Lines the writer has checked and resolved to series ids ([`super::Writer::stage`]) but not yet
/// stored: what the journal holds and the next commit packs into chunks.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Staged {
    /// `(tag set, time, end of the line's values in `values`)`, in arrival order.
    pub(super) lines: Vec<(i64, i64, u32)>,
    /// `(series id, value)` of every line, one after the other.
    pub(super) values: Vec<(i64, Value)>,
}

impl Staged {
    /// Lines (points) held.
    pub fn points(&self) -> usize {
        self.lines.len()
    }

    /// Values held.
    pub fn values(&self) -> usize {
        self.values.len()
    }

    /// True when no line is held.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Distinct tag sets among the lines.
    pub fn tagsets(&self) -> usize {
        self.lines
            .iter()
            .map(|l| l.0)
            .collect::<foldhash::HashSet<i64>>()
            .len()
    }

    /// Each line in arrival order: `(tag set, time, its (series id, value)s)`.
    pub(super) fn lines(&self) -> impl Iterator<Item = Line<'_>> + '_ {
        (0..self.lines.len()).filter_map(move |i| self.line(i))
    }

    /// Line `i`: `(tag set, time, its (series id, value)s)`.
    pub(super) fn line(&self, i: usize) -> Option<Line<'_>> {
        let &(tagset, ts, end) = self.lines.get(i)?;
        let start = match i {
            0 => 0,
            _ => self.lines.get(i - 1).map_or(0, |l| l.2 as usize),
        };
        Some((tagset, ts, self.values.get(start..end as usize)?))
    }

    /// Adds a value to the line being built.
    pub(super) fn push_value(&mut self, sid: i64, v: Value) {
        self.values.push((sid, v));
    }

    /// Ends the line being built: its values are those pushed since the last line.
    pub(super) fn end_line(&mut self, tagset: i64, ts: i64) {
        self.lines.push((tagset, ts, self.values.len() as u32));
    }

    /// Appends every line of `other`.
    #[cfg(test)]
    pub(super) fn extend(&mut self, other: &Staged) {
        let base = self.values.len() as u32;
        self.values.extend(other.values.iter().cloned());
        self.lines.extend(
            other
                .lines
                .iter()
                .map(|&(tagset, ts, end)| (tagset, ts, base + end)),
        );
    }
}
