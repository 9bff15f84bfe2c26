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
//! covers `seq` and the payload). In `full` mode each record is padded with zeros to the
//! next boundary of the file system's direct-IO block (512 bytes on an eMMC or SD card) and
//! written with `O_DIRECT`, so a synced append writes one or two such blocks to the device
//! instead of the whole 4 KiB page of the page cache it would dirty (8x fewer bytes for a
//! write of a few lines), and never rewrites a block that holds an acknowledged record. A
//! padded record has the top bit of `len` set, and its `len` counts the padding; a file
//! system that refuses direct IO (tmpfs, some FUSE) gets the same records through the page
//! cache. Replay reads records from the start, skips those already
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

/// The top bit of a record's `len`: the record is padded with zeros after its lines (and
/// `len` counts the padding), so that the next one starts on a direct-IO block.
const PADDED: u32 = 1 << 31;

/// The largest direct-IO block the journal pads to; a file system asking for more gets the
/// page cache. The aligned buffer is allocated to this alignment.
const MAX_DIRECT_ALIGN: usize = 4096;

/// What a synced append through the page cache costs the storage: each page it touches.
const PAGE: u64 = 4096;

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
    /// The same file opened with `O_DIRECT` (in `full` mode, where the file system takes
    /// it), and the block its writes align to.
    direct: Option<Direct>,
    /// Bytes the appends have cost the storage so far (see [`Journal::written`]).
    written: u64,
    buf: Vec<u8>,
}

/// The journal opened for direct IO.
struct Direct {
    file: File,
    /// Offset and length alignment of a direct write, bytes (a power of two).
    align: usize,
    /// Room for one padded record at a [`MAX_DIRECT_ALIGN`]-aligned address (over-allocated;
    /// see [`aligned`]).
    mem: Vec<u8>,
}

impl Direct {
    /// Opens `path` for direct IO, or `None` where the file system does not take it.
    fn open(path: &Path) -> Option<Direct> {
        use std::os::unix::fs::OpenOptionsExt;
        let align = match dio_align(path) {
            Some(0) => return None,
            Some(a) if a > MAX_DIRECT_ALIGN || !a.is_power_of_two() => return None,
            Some(a) => a,
            // A kernel before 6.1 does not say: start at the smallest logical block and
            // widen on EINVAL (see [`Journal::append`]).
            None => 512,
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(file) => Some(Direct {
                file,
                align,
                mem: Vec::new(),
            }),
            Err(e) => {
                tracing::debug!(journal = %path.display(), error = %e, "journal: no direct IO; appends go through the page cache");
                None
            }
        }
    }
}

/// `bytes` (a whole padded record) copied to the start of an aligned region of `mem`
/// (grown as needed).
fn aligned<'m>(mem: &'m mut Vec<u8>, bytes: &[u8]) -> &'m [u8] {
    let len = bytes.len();
    if mem.len() < len + MAX_DIRECT_ALIGN {
        *mem = vec![0; len + MAX_DIRECT_ALIGN];
    }
    let off = mem.as_ptr().align_offset(MAX_DIRECT_ALIGN);
    let out = &mut mem[off..off + len];
    out.copy_from_slice(bytes);
    out
}

/// The direct-IO offset alignment `statx` reports for `path` (Linux 6.1 and later; 0: the
/// file system does not take direct IO), `None` where the kernel does not report it.
fn dio_align(path: &Path) -> Option<usize> {
    use std::os::unix::ffi::OsStrExt;
    #[cfg(test)]
    if tests::OLD_KERNEL.with(std::cell::Cell::get) {
        return None;
    }
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statx` writes at most one `struct statx` into `st`, which is zeroed and owned
    // here; `c` is a NUL-terminated path that outlives the call.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_DIOALIGN, &mut st) };
    if rc != 0 || st.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some(st.stx_dio_offset_align as usize)
}

/// `n` rounded up to a multiple of `align` (a power of two).
fn align_up(n: u64, align: usize) -> u64 {
    let a = align as u64;
    n.div_ceil(a) * a
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
        let direct = if sync { Direct::open(&path) } else { None };
        let journal = Journal {
            file,
            path,
            // Until the replayed records are stored, new ones go after them.
            end: end as u64,
            seq,
            stored_seq: stored,
            sync,
            direct,
            written: 0,
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
        self.buf[8..16].copy_from_slice(&seq.to_le_bytes());
        let body = self.buf.len();
        let cost = loop {
            match self.write(body) {
                Err(e)
                    if e.raw_os_error() == Some(libc::EINVAL)
                        && self
                            .direct
                            .as_ref()
                            .is_some_and(|d| self.end % d.align as u64 == 0) =>
                {
                    // The file system wants a larger block than assumed (a kernel that does
                    // not report it): nothing was written; widen and write again.
                    self.widen();
                }
                r => {
                    break r.map_err(|source| StoreError::Journal {
                        path: self.path.clone(),
                        source,
                    })?
                }
            }
        };
        self.end += cost.0;
        self.written += cost.1;
        self.seq = seq;
        if self.buf.capacity() > 1 << 20 {
            self.buf = Vec::new();
            if let Some(d) = self.direct.as_mut() {
                d.mem = Vec::new();
            }
        }
        Ok(seq)
    }

    /// Frames the record in `buf[..body]` (header and payload, its number in place) for where it
    /// goes, writes and (in `full` mode) syncs it: (its length in the file, what it cost the
    /// storage).
    fn write(&mut self, body: usize) -> std::io::Result<(u64, u64)> {
        self.buf.truncate(body);
        let align = self.direct.as_ref().map_or(1, |d| d.align);
        // Padded so that the next record starts on a block: a direct write of whole blocks
        // from here on (from an unaligned end, left by a record of an earlier release, this
        // one goes through the page cache).
        let len = if align > 1 {
            (align_up(self.end + body as u64, align) - self.end) as usize
        } else {
            body
        };
        self.buf.resize(len, 0);
        let mut head = (len - HEADER) as u32;
        if len > body {
            head |= PADDED;
        }
        let crc = crc32fast::hash(&self.buf[8..]);
        self.buf[0..4].copy_from_slice(&head.to_le_bytes());
        self.buf[4..8].copy_from_slice(&crc.to_le_bytes());
        let end = self.end;
        let cost = match self.direct.as_mut() {
            Some(d) if end % d.align as u64 == 0 => {
                d.file.write_all_at(aligned(&mut d.mem, &self.buf), end)?;
                len as u64
            }
            _ => {
                self.file.write_all_at(&self.buf, end)?;
                if self.sync {
                    // Every page the record touched is written again by the sync.
                    align_up(end + len as u64, PAGE as usize) - end / PAGE * PAGE
                } else {
                    len as u64
                }
            }
        };
        if self.sync {
            self.file.sync_data()?;
        }
        Ok((len as u64, cost))
    }

    /// The next larger direct-IO block, or the page cache past [`MAX_DIRECT_ALIGN`].
    fn widen(&mut self) {
        if let Some(d) = self.direct.as_mut() {
            d.align *= 2;
            if d.align > MAX_DIRECT_ALIGN {
                tracing::info!(journal = %self.path.display(), "journal: the file system refuses direct writes; appends go through the page cache");
                self.direct = None;
            } else {
                tracing::debug!(journal = %self.path.display(), align = d.align, "journal: direct writes widened");
            }
        }
    }

    /// Bytes the appends have cost the storage since open: each padded record written
    /// directly, or each page a synced append through the page cache touched (its record's
    /// bytes when appends are not synced). What `full` durability costs a card per
    /// acknowledged write group.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The block appends are padded to and written directly in, bytes (`None`: through the
    /// page cache).
    pub fn direct_block(&self) -> Option<usize> {
        self.direct.as_ref().map(|d| d.align)
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
        let head = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
        let (len, padded) = ((head & !PADDED) as usize, head & PADDED != 0);
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
            let mark = (out.lines.len(), out.values.len());
            match decode(&body[8..], padded, &mut out) {
                Ok(()) => {
                    seq = rseq;
                    records += 1;
                    end = at + HEADER + len;
                }
                Err(e) => {
                    // A record that fails half-way adds none of its lines.
                    out.lines.truncate(mark.0);
                    out.values.truncate(mark.1);
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
    for (tagset, ts, values) in s.lines() {
        put_varint(buf, zigzag(tagset));
        legacy::encode_point_header(buf, *prev, ts, values.len());
        for (sid, v) in values {
            legacy::encode_value(buf, *sid, v);
        }
        *prev = ts;
    }
}

/// A record's payload: `padded`, zeros may follow its lines.
fn decode(b: &[u8], padded: bool, out: &mut Staged) -> Result<(), CodecError> {
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
    if pos == b.len() || (padded && b[pos..].iter().all(|&x| x == 0)) {
        Ok(())
    } else {
        Err(CodecError::at(pos, "trailing bytes in a journal record"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Value;

    /// [`Journal::open`], waiting out a lock held for an instant by another test: a test that
    /// starts a process (`mount`, `losetup`) forks with every descriptor of this process, a
    /// dropped journal's included, and its `flock` lasts until that child has exec'd.
    fn open(dir: &Path, stored: u64, sync: bool) -> Result<(Journal, Staged, u64), StoreError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match Journal::open(dir, stored, sync) {
                Err(StoreError::InUse(_)) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                r => return r,
            }
        }
    }

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
            let (mut j, replayed, seq) = open(dir.path(), 0, true).unwrap();
            assert_eq!((replayed, seq), (Staged::default(), 0));
            for k in 1..=3 {
                assert_eq!(j.append([&sample(k)]).unwrap(), k as u64);
            }
        }
        let (_, replayed, seq) = open(dir.path(), 1, true).unwrap();
        assert_eq!(seq, 3);
        assert_eq!(replayed, concat(&[sample(2), sample(3)]));
    }

    #[test]
    fn a_torn_or_corrupt_tail_ends_the_replay_and_keeps_what_precedes_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, _, _) = open(dir.path(), 0, false).unwrap();
            j.append([&sample(1)]).unwrap();
            j.append([&sample(2)]).unwrap();
        }
        let path = journal_path(dir.path());
        let whole = std::fs::read(&path).unwrap();
        // An append cut short (a crash before its sync, never acknowledged).
        std::fs::write(&path, &whole[..whole.len() - 3]).unwrap();
        let (_, replayed, seq) = open(dir.path(), 0, false).unwrap();
        assert_eq!((replayed, seq), (sample(1), 1));
        // A flipped bit in the second record.
        let mut bad = whole.clone();
        let last = bad.len() - 2;
        bad[last] ^= 0x10;
        std::fs::write(&path, &bad).unwrap();
        let (_, replayed, seq) = open(dir.path(), 0, false).unwrap();
        assert_eq!((replayed, seq), (sample(1), 1));
    }

    #[test]
    fn a_reused_file_replays_only_the_new_pass_and_never_the_older_records_behind_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, _, _) = open(dir.path(), 0, false).unwrap();
            for k in 1..=4 {
                j.append([&sample(k)]).unwrap();
            }
            // The commit holding records 1-4 recorded seq 4: the file is reused.
            j.stored();
            j.append([&sample(5)]).unwrap();
        }
        let (_, replayed, seq) = open(dir.path(), 4, false).unwrap();
        assert_eq!((replayed, seq), (sample(5), 5));
        // Nothing after the stored one: nothing replayed, the numbering goes on.
        let (j, replayed, seq) = open(dir.path(), 5, false).unwrap();
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

    thread_local! {
        /// Set by a test on its own thread: `dio_align` answers as a kernel before 6.1
        /// (the Jetsons' 5.10 and 5.15), which does not report the direct-IO block.
        pub(super) static OLD_KERNEL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A file system mounted on a temp dir for a test; unmounted (and its loop device
    /// detached) when dropped. Needs root (CI runs as root).
    struct Mounted {
        dir: tempfile::TempDir,
        /// The loop device under it, if any.
        dev: Option<String>,
    }

    impl Mounted {
        /// A ramfs, which refuses `O_DIRECT`.
        fn ramfs() -> Mounted {
            let fs = Mounted {
                dir: tempfile::tempdir().unwrap(),
                dev: None,
            };
            std::fs::create_dir(fs.mnt()).unwrap();
            let st = std::process::Command::new("mount")
                .args(["-t", "ramfs", "none"])
                .arg(fs.mnt())
                .status()
                .expect("mount(8)");
            assert!(
                st.success(),
                "mounting a ramfs needs root (CI runs as root): {st}"
            );
            fs
        }

        /// ext4 on a loop device with 4 KiB logical blocks (`losetup --sector-size 4096`,
        /// as on a card or NVMe drive formatted so).
        fn ext4_4k_sectors() -> Mounted {
            use std::process::Command;
            let dir = tempfile::tempdir().unwrap();
            let image = dir.path().join("fs.img");
            std::fs::File::create(&image)
                .unwrap()
                .set_len(16 << 20)
                .unwrap();
            let out = Command::new("losetup")
                .args(["--sector-size", "4096", "--find", "--show"])
                .arg(&image)
                .output()
                .expect("losetup(8) (Debian mount)");
            assert!(
                out.status.success(),
                "a loop device with 4 KiB sectors needs root (CI runs as root): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let fs = Mounted {
                dir,
                dev: Some(dev.clone()),
            };
            let st = Command::new("mkfs.ext4")
                .args(["-q", "-F", "-b", "4096", &dev])
                .status()
                .expect("mkfs.ext4 (Debian e2fsprogs)");
            assert!(st.success(), "mkfs.ext4 {dev}: {st}");
            std::fs::create_dir(fs.mnt()).unwrap();
            let st = Command::new("mount")
                .arg(&dev)
                .arg(fs.mnt())
                .status()
                .expect("mount(8)");
            assert!(st.success(), "mount {dev}: {st}");
            fs
        }

        fn mnt(&self) -> PathBuf {
            self.dir.path().join("mnt")
        }
    }

    impl Drop for Mounted {
        fn drop(&mut self) {
            use std::process::Command;
            let _ = Command::new("umount").arg(self.mnt()).status();
            if let Some(dev) = &self.dev {
                let _ = Command::new("losetup").args(["-d", dev]).status();
            }
        }
    }

    /// On a kernel that does not report the direct-IO block (before 6.1: the Jetsons' 5.10
    /// and 5.15), the journal starts at 512 bytes and widens on `EINVAL`. On a device with 4
    /// KiB logical blocks the first synced append is refused at 512, 1024 and 2048 and
    /// written at 4096, with nothing of the refused tries left in the file; every later
    /// append goes straight to 4 KiB blocks, and every record replays. A kernel that
    /// reports the block (this one) starts at 4 KiB.
    #[test]
    fn without_the_kernels_answer_appends_widen_to_the_devices_block_and_replay() {
        let fs = Mounted::ext4_4k_sectors();
        let store = fs.mnt().join("old");
        std::fs::create_dir(&store).unwrap();
        OLD_KERNEL.with(|k| k.set(true));
        {
            let (mut j, _, _) = open(&store, 0, true).unwrap();
            assert_eq!(
                j.direct_block(),
                Some(512),
                "no statx answer: the smallest block first"
            );
            j.append([&sample(1)]).unwrap();
            assert_eq!(
                j.direct_block(),
                Some(4096),
                "widened to the device's block"
            );
            assert_eq!((j.len(), j.written()), (4096, 4096));
            for k in 2..=5 {
                j.append([&sample(k)]).unwrap();
            }
            assert_eq!(j.direct_block(), Some(4096));
            assert_eq!((j.len(), j.written()), (5 * 4096, 5 * 4096));
        }
        OLD_KERNEL.with(|k| k.set(false));
        let bytes = std::fs::read(journal_path(&store)).unwrap();
        let offsets = record_offsets(&bytes);
        assert_eq!(
            offsets,
            (0..5).map(|k| (k * 4096, true)).collect::<Vec<_>>(),
            "each record on a 4 KiB block, padded"
        );
        let (j, replayed, seq) = open(&store, 0, true).unwrap();
        assert_eq!(seq, 5);
        assert_eq!(replayed, concat(&(1..=5).map(sample).collect::<Vec<_>>()));
        drop(j);
        // This kernel says so itself.
        let now = fs.mnt().join("new");
        std::fs::create_dir(&now).unwrap();
        let (j, _, _) = open(&now, 0, true).unwrap();
        assert_eq!(j.direct_block(), Some(4096));
    }

    /// A file system that refuses `O_DIRECT` (ramfs, as some FUSE and network file systems
    /// do): the journal says so (`direct_block` is `None`), its synced appends go through
    /// the page cache unpadded, each costing the pages it touched, and every record replays;
    /// the same whether or not the kernel reports the direct-IO block.
    #[test]
    fn where_direct_io_is_refused_appends_go_through_the_page_cache_and_replay() {
        let fs = Mounted::ramfs();
        for old in [false, true] {
            let store = fs.mnt().join(if old { "old" } else { "new" });
            std::fs::create_dir(&store).unwrap();
            OLD_KERNEL.with(|k| k.set(old));
            {
                let (mut j, _, _) = open(&store, 0, true).unwrap();
                assert_eq!(j.direct_block(), None, "old kernel: {old}");
                for k in 1..=3 {
                    j.append([&sample(k)]).unwrap();
                }
                assert_eq!(j.direct_block(), None);
                assert!(j.len() < 4096, "unpadded: {}", j.len());
                // Each synced append writes the page it touched.
                assert_eq!(j.written(), 3 * 4096, "old kernel: {old}");
            }
            OLD_KERNEL.with(|k| k.set(false));
            let bytes = std::fs::read(journal_path(&store)).unwrap();
            assert!(record_offsets(&bytes).iter().all(|&(_, padded)| !padded));
            let (_, replayed, seq) = open(&store, 0, true).unwrap();
            assert_eq!(seq, 3);
            assert_eq!(replayed, concat(&(1..=3).map(sample).collect::<Vec<_>>()));
        }
    }

    /// `write_bytes` of this thread (`/proc/thread-self/io`): what it caused to be written
    /// to storage, other tests' threads apart.
    fn thread_write_bytes() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        io.lines()
            .find_map(|l| l.strip_prefix("write_bytes: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// The offsets of the records in the file, read the way replay walks them.
    fn record_offsets(bytes: &[u8]) -> Vec<(usize, bool)> {
        let mut out = Vec::new();
        let mut at = 0;
        while bytes.len() - at >= HEADER {
            let head = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            if head == 0 {
                break;
            }
            out.push((at, head & PADDED != 0));
            at += HEADER + (head & !PADDED) as usize;
        }
        out
    }

    /// In `full` mode a synced append writes its record padded to the direct-IO block (512
    /// bytes on this disk, as on an eMMC), not the 4 KiB page of the page cache: the kernel's
    /// own count for this thread says so. Each record starts on a block, so no append
    /// rewrites a block holding an earlier (acknowledged) one, and every record replays.
    /// The store is on this repository's disk: a tmpfs counts no writes and takes no direct IO.
    #[test]
    fn a_synced_append_writes_its_padded_block_directly_not_a_page() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let (mut j, _, _) = open(dir.path(), 0, true).unwrap();
        let block = j.direct_block().unwrap_or_else(|| {
            panic!(
                "the file system of {} refused O_DIRECT",
                dir.path().display()
            )
        });
        assert!(block <= 4096, "{block}");
        let before = thread_write_bytes();
        for k in 1..=20 {
            j.append([&sample(k)]).unwrap();
        }
        let written = thread_write_bytes() - before;
        // A record of two lines fits one block: 20 blocks, against 20 pages (80 KiB) through
        // the page cache. The first pass over the file grows it, which may cost a little more.
        assert_eq!(j.written(), 20 * block as u64);
        assert!(
            written <= 20 * block as u64 + 16 * 1024 && written < 20 * 4096,
            "20 synced appends wrote {written} bytes, block {block}"
        );
        assert_eq!(j.len(), 20 * block as u64);
        drop(j);
        let bytes = std::fs::read(journal_path(dir.path())).unwrap();
        let offsets = record_offsets(&bytes);
        assert_eq!(offsets.len(), 20);
        assert!(
            offsets
                .iter()
                .all(|&(at, padded)| at % block == 0 && padded),
            "{offsets:?}"
        );
        let (_, replayed, seq) = open(dir.path(), 0, true).unwrap();
        assert_eq!(seq, 20);
        assert_eq!(replayed, concat(&(1..=20).map(sample).collect::<Vec<_>>()));
    }

    /// Records an earlier release left unstored (unpadded, through the page cache) replay
    /// with the padded ones appended after them, in order; the first new record goes through
    /// the page cache (its start is not on a block) and pads to one, the next go direct.
    #[test]
    fn unpadded_records_of_an_earlier_release_replay_with_padded_ones_after_them() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        {
            let (mut j, _, _) = open(dir.path(), 0, false).unwrap();
            j.append([&sample(1)]).unwrap();
            assert_eq!(j.direct_block(), None);
            assert_ne!(j.len() % 512, 0, "{}", j.len());
        }
        {
            let (mut j, replayed, seq) = open(dir.path(), 0, true).unwrap();
            assert_eq!((replayed, seq), (sample(1), 1));
            let block = j.direct_block().unwrap() as u64;
            j.append([&sample(2)]).unwrap();
            assert_eq!(j.len() % block, 0);
            let through_cache = j.written();
            assert!(through_cache >= 4096, "{through_cache}");
            j.append([&sample(3)]).unwrap();
            assert_eq!(j.written() - through_cache, block);
        }
        let bytes = std::fs::read(journal_path(dir.path())).unwrap();
        let padded: Vec<bool> = record_offsets(&bytes).iter().map(|r| r.1).collect();
        assert_eq!(padded, [false, true, true]);
        let (_, replayed, seq) = open(dir.path(), 0, true).unwrap();
        assert_eq!(seq, 3);
        assert_eq!(replayed, concat(&[sample(1), sample(2), sample(3)]));
    }

    /// A padded record whose padding is not zeros (a record of another format, a corrupt
    /// tail that happens to keep its checksum) is not replayed, and neither is what follows.
    #[test]
    fn a_padded_record_with_bytes_after_its_lines_ends_the_replay() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        {
            let (mut j, _, _) = open(dir.path(), 0, true).unwrap();
            j.append([&sample(1)]).unwrap();
            j.append([&sample(2)]).unwrap();
        }
        let path = journal_path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        let second = record_offsets(&bytes)[1].0;
        let head = u32::from_le_bytes(bytes[second..second + 4].try_into().unwrap());
        let end = second + HEADER + (head & !PADDED) as usize;
        bytes[end - 1] = 7;
        let crc = crc32fast::hash(&bytes[second + 8..end]);
        bytes[second + 4..second + 8].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let (_, replayed, seq) = open(dir.path(), 0, true).unwrap();
        assert_eq!((replayed, seq), (sample(1), 1));
    }

    #[test]
    fn a_record_is_a_few_bytes_per_value() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _, _) = open(dir.path(), 0, false).unwrap();
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
