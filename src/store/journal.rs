//! The ingest journal: `edgewatch.journal` beside the database, an append-only file that
//! makes a small acknowledged write durable with one synced append instead of a synced
//! SQLite commit of its own. A commit writes 9-17 pages (chunk leaves, the chunk index,
//! `sqlite_sequence`, page 1, pointer maps), each written again by the checkpoint; an append
//! of a few lines dirties one or two pages. The writer ([`super::Writer`]) checks and
//! resolves the lines first (so the answer's refusals are final), appends them here as one
//! record, answers, and stores them in its next commit with everything else it holds; that
//! commit records the newest record's sequence number in the same transaction (the
//! `edgewatch.journal` row of `sqlite_sequence`, a page the commit writes anyway), and the
//! file is then reused from its start. At open, the records after that
//! number are replayed into the store before anything else is written.
//!
//! A record is `len: u32 | crc32: u32 | seq: u64 | payload` (little-endian; the checksum
//! covers `seq` and the payload). Replay reads records from the start, skips those already
//! stored, and stops at the first one that is short, fails its checksum or breaks the
//! sequence: the rest is an append that never completed (never acknowledged) or an older
//! pass over the file (already stored). The open file holds an exclusive `flock`, so a
//! second writer on the same store (two agents) is refused instead of replaying records
//! the first one still holds.
//!
//! Never decides when to append or to commit: the writer task does.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::codec::bits::{get_varint, put_varint, unzigzag, zigzag};
use super::codec::{legacy, CodecError};
use super::staged::Staged;
use super::StoreError;

/// File name of the journal inside the data directory.
pub const JOURNAL_FILE: &str = "edgewatch.journal";

/// Header bytes of a record: length, checksum, sequence number.
const HEADER: usize = 16;

/// A record larger than this is not one the writer wrote (its batches are bounded by the
/// ingest queue): replay stops there.
const MAX_RECORD: usize = 1 << 30;

/// Past this size the file is cut back to empty when it is reused (a long outage, or a
/// burst, grew it), so it does not keep the space.
const SHRINK_BYTES: u64 = 4 << 20;

/// The journal file, open and locked by the writer.
pub struct Journal {
    file: File,
    path: PathBuf,
    /// Where the next record goes.
    end: u64,
    /// The newest sequence number appended or stored.
    seq: u64,
    /// The newest sequence number the store holds (the `edgewatch.journal` row of
    /// `sqlite_sequence`).
    stored_seq: u64,
    /// Sync each append (`synchronous = "full"`).
    sync: bool,
    buf: Vec<u8>,
}

/// Path of the journal in `dir`.
pub fn journal_path(dir: &Path) -> PathBuf {
    dir.join(JOURNAL_FILE)
}

impl Journal {
    /// Opens (creating) and locks the journal in `dir`; returns it with the records after
    /// `stored` (the store's `journal_seq`), in order, merged into one [`Staged`] with the
    /// newest sequence number among them (`stored` when there is none).
    pub fn open(dir: &Path, stored: u64, sync: bool) -> Result<(Journal, Staged, u64), StoreError> {
        let path = journal_path(dir);
        let err = |source| StoreError::Journal {
            path: path.clone(),
            source,
        };
        let created = !path.exists();
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(err)?;
        // SAFETY: flock on the descriptor this `File` owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                StoreError::InUse(path)
            } else {
                err(e)
            });
        }
        if created && sync {
            // The file's name must survive a power cut before a record in it counts.
            File::open(dir).and_then(|d| d.sync_all()).map_err(err)?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(err)?;
        let (staged, seq, records, end) = replay(&bytes, stored, &path);
        if records > 0 {
            tracing::info!(records, journal = %path.display(), "replaying acknowledged writes not yet in the store");
        }
        let journal = Journal {
            file,
            path,
            // Until the replayed records are stored, new ones go after them.
            end: end as u64,
            seq,
            stored_seq: stored,
            sync,
            buf: Vec::new(),
        };
        Ok((journal, staged, seq))
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The newest sequence number appended (or stored, after open).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Bytes the records not yet stored take (the position of the next record).
    pub fn len(&self) -> u64 {
        self.end
    }

    /// True when no record is waiting to be stored (appended, or replayed at open).
    pub fn is_empty(&self) -> bool {
        self.seq == self.stored_seq
    }

    /// Appends `staged` as one record and, in `full` mode, syncs it: once this returns
    /// `Ok`, the lines survive a crash or a power cut. On an error nothing counts as
    /// appended (the next record overwrites whatever part of this one reached the file).
    /// Returns the record's sequence number.
    pub fn append<'a>(
        &mut self,
        staged: impl IntoIterator<Item = &'a Staged> + Clone,
    ) -> Result<u64, StoreError> {
        let seq = self.seq + 1;
        self.buf.clear();
        self.buf.resize(HEADER, 0);
        let lines: usize = staged.clone().into_iter().map(|s| s.lines.len()).sum();
        put_varint(&mut self.buf, lines as u64);
        let mut prev = 0i64;
        for s in staged {
            encode(&mut self.buf, &mut prev, s);
        }
        let len = (self.buf.len() - HEADER) as u32;
        self.buf[8..16].copy_from_slice(&seq.to_le_bytes());
        let crc = crc32fast::hash(&self.buf[8..]);
        self.buf[0..4].copy_from_slice(&len.to_le_bytes());
        self.buf[4..8].copy_from_slice(&crc.to_le_bytes());
        let err = |source| StoreError::Journal {
            path: self.path.clone(),
            source,
        };
        self.file.write_all_at(&self.buf, self.end).map_err(err)?;
        if self.sync {
            self.file.sync_data().map_err(err)?;
        }
        self.end += self.buf.len() as u64;
        self.seq = seq;
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
        }
        Ok(seq)
    }

    /// Every record appended so far is stored (the commit holding them recorded
    /// [`Journal::seq`]): the file is reused from its start.
    pub fn stored(&mut self) {
        if self.end > SHRINK_BYTES {
            if let Err(e) = self.file.set_len(0) {
                tracing::debug!(error = %e, "journal: not shrunk");
            }
        }
        self.end = 0;
        self.stored_seq = self.seq;
    }
}

/// Reads the records after `stored`; returns their lines, the newest sequence number, how
/// many records there were and where the last of them ends (where the next one goes while
/// they are not stored).
fn replay(bytes: &[u8], stored: u64, path: &Path) -> (Staged, u64, usize, usize) {
    let mut out = Staged::default();
    let mut seq = stored;
    let mut records = 0;
    let mut at = 0usize;
    let mut end = 0usize;
    while bytes.len() - at >= HEADER {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default()) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap_or_default());
        if len > MAX_RECORD || bytes.len() - at - HEADER < len {
            break;
        }
        let body = &bytes[at + 8..at + HEADER + len];
        if crc32fast::hash(body) != crc {
            break;
        }
        let rseq = u64::from_le_bytes(body[..8].try_into().unwrap_or_default());
        if rseq > seq {
            if rseq != seq + 1 {
                tracing::warn!(journal = %path.display(), expected = seq + 1, found = rseq, "journal: a record out of sequence ends the replay");
                break;
            }
            match decode(&body[8..], &mut out) {
                Ok(()) => {
                    seq = rseq;
                    records += 1;
                    end = at + HEADER + len;
                }
                Err(e) => {
                    tracing::error!(journal = %path.display(), seq = rseq, error = %e, "journal: a record with a valid checksum does not decode; the replay stops there");
                    break;
                }
            }
        }
        at += HEADER + len;
    }
    (out, seq, records, end)
}

/// A line: its tag set (zigzag varint), then a point of the legacy chunk encoding (time
/// as a delta from the previous line's, value count, `(series id, value)`s).
fn encode(buf: &mut Vec<u8>, prev: &mut i64, s: &Staged) {
    let mut start = 0usize;
    for &(tagset, ts, end) in &s.lines {
        put_varint(buf, zigzag(tagset));
        let values = &s.values[start..end as usize];
        legacy::encode_point_header(buf, *prev, ts, values.len());
        for (sid, v) in values {
            legacy::encode_value(buf, *sid, v);
        }
        *prev = ts;
        start = end as usize;
    }
}

fn decode(b: &[u8], out: &mut Staged) -> Result<(), CodecError> {
    let mut pos = 0usize;
    let lines = get_varint(b, &mut pos)?;
    let mut prev = 0i64;
    let mut values = Vec::new();
    for _ in 0..lines {
        let tagset = unzigzag(get_varint(b, &mut pos)?);
        values.clear();
        prev = legacy::decode_point(b, &mut pos, prev, &mut values)?;
        for (sid, v) in values.drain(..) {
            out.push_value(sid, v);
        }
        out.end_line(tagset, prev);
    }
    if pos == b.len() {
        Ok(())
    } else {
        Err(CodecError::at(pos, "trailing bytes in a journal record"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Value;

    /// `(tag set, time, values)`.
    type Line = (i64, i64, Vec<(i64, Value)>);

    fn staged(lines: &[Line]) -> Staged {
        let mut s = Staged::default();
        for (tagset, ts, values) in lines {
            for (sid, v) in values {
                s.push_value(*sid, v.clone());
            }
            s.end_line(*tagset, *ts);
        }
        s
    }

    fn sample(k: i64) -> Staged {
        staged(&[
            (
                1,
                1_700_000_000_000_000_000 + k,
                vec![
                    (10, Value::F64(k as f64 + 0.5)),
                    (11, Value::I64(-k)),
                    (12, Value::U64(u64::MAX - k as u64)),
                ],
            ),
            (
                7,
                -5,
                vec![
                    (70, Value::Bool(k % 2 == 0)),
                    (71, Value::Str(format!("é{k}"))),
                ],
            ),
        ])
    }

    fn concat(parts: &[Staged]) -> Staged {
        let mut out = Staged::default();
        for p in parts {
            out.extend(p);
        }
        out
    }

    #[test]
    fn records_after_the_stored_one_replay_in_order_and_every_value_type_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, replayed, seq) = Journal::open(dir.path(), 0, true).unwrap();
            assert_eq!((replayed, seq), (Staged::default(), 0));
            for k in 1..=3 {
                assert_eq!(j.append([&sample(k)]).unwrap(), k as u64);
            }
        }
        let (_, replayed, seq) = Journal::open(dir.path(), 1, true).unwrap();
        assert_eq!(seq, 3);
        assert_eq!(replayed, concat(&[sample(2), sample(3)]));
    }

    #[test]
    fn a_torn_or_corrupt_tail_ends_the_replay_and_keeps_what_precedes_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, _, _) = Journal::open(dir.path(), 0, false).unwrap();
            j.append([&sample(1)]).unwrap();
            j.append([&sample(2)]).unwrap();
        }
        let path = journal_path(dir.path());
        let whole = std::fs::read(&path).unwrap();
        // An append cut short (a crash before its sync, never acknowledged).
        std::fs::write(&path, &whole[..whole.len() - 3]).unwrap();
        let (_, replayed, seq) = Journal::open(dir.path(), 0, false).unwrap();
        assert_eq!((replayed, seq), (sample(1), 1));
        // A flipped bit in the second record.
        let mut bad = whole.clone();
        let last = bad.len() - 2;
        bad[last] ^= 0x10;
        std::fs::write(&path, &bad).unwrap();
        let (_, replayed, seq) = Journal::open(dir.path(), 0, false).unwrap();
        assert_eq!((replayed, seq), (sample(1), 1));
    }

    #[test]
    fn a_reused_file_replays_only_the_new_pass_and_never_the_older_records_behind_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, _, _) = Journal::open(dir.path(), 0, false).unwrap();
            for k in 1..=4 {
                j.append([&sample(k)]).unwrap();
            }
            // The commit holding records 1-4 recorded seq 4: the file is reused.
            j.stored();
            j.append([&sample(5)]).unwrap();
        }
        let (_, replayed, seq) = Journal::open(dir.path(), 4, false).unwrap();
        assert_eq!((replayed, seq), (sample(5), 5));
        // Nothing after the stored one: nothing replayed, the numbering goes on.
        let (j, replayed, seq) = Journal::open(dir.path(), 5, false).unwrap();
        assert_eq!((replayed, seq, j.seq()), (Staged::default(), 5, 5));
    }

    #[test]
    fn a_second_writer_on_the_same_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_j, _, _) = Journal::open(dir.path(), 0, false).unwrap();
        let e = Journal::open(dir.path(), 0, false).err().unwrap();
        assert!(matches!(e, StoreError::InUse(_)), "{e}");
        assert!(e.to_string().contains("agent running"), "{e}");
    }

    #[test]
    fn a_record_is_a_few_bytes_per_value() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _, _) = Journal::open(dir.path(), 0, false).unwrap();
        let s = staged(&vec![
            (
                3,
                1_700_000_000_000_000_000,
                vec![(1, Value::F64(1.0))]
            );
            100
        ]);
        j.append([&s]).unwrap();
        // tag set 1 + time delta 1-9 + count 1 + sid and type 1 + float 8: 12-20 bytes a line.
        assert!(j.len() <= 16 + 1 + 100 * 20, "{}", j.len());
    }
}
