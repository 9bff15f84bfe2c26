//! The single writer of a database: commits batches of lines in one transaction each,
//! growing the series dictionary (with the series cap and type checks) and packing each tag
//! set's points into chunk rows. Its connection is the only one that writes ingested points.
//!
//! A commit that stores chunks right after the place a caught-up sink offered also carries
//! that sink's acknowledgement and the in-flight mark of those chunks ([`super::ride`]).
//!
//! Never reads the ingest queue (the writer task hands it batches) and never deletes.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection};

use super::held::HeldView;
use super::journal::Journal;
use super::open::{open, Ctx, Mode};
use super::ride::{Carried, Riders};
use super::staged::Staged;
use super::{chunks, clockfix, codec, dict, LatestValues, StoreError};
use crate::config::Synchronous;
use crate::model::{split_series_key, Batch, Kind, Rejection};

/// Maps keyed on every point's path: foldhash, several times cheaper per lookup than
/// `std`'s SipHash (the keys are the writer's own, no one picks them to collide).
type HashMap<K, V> = foldhash::HashMap<K, V>;

/// Everything the writer caches about the series dictionary.
#[derive(Default)]
struct Dictionary {
    tagsets: HashMap<String, i64>,
    /// (tagset id, field) -> (series id, kind)
    series: HashMap<i64, HashMap<String, (i64, Kind)>>,
    series_count: usize,
}

/// The single writer of a database.
pub struct Writer {
    conn: Connection,
    path: PathBuf,
    dict: Dictionary,
    max_series: usize,
    /// Where the newest number of each series goes (`/metrics`) as soon as it is staged.
    latest: Option<std::sync::Arc<LatestValues>>,
    /// The lines held for the next commit, as readers see them ([`super::held`]): emptied
    /// by each commit under its lock.
    held: Option<std::sync::Arc<HeldView>>,
    /// The current line's series ids, one per field.
    sids: Vec<i64>,
    /// The unindexed tail: every chunk above `through` is unindexed (see
    /// `migrations/0012_chunk_tail.sql`).
    tail: Tail,
    /// The ingest journal (see [`super::journal`]); `None` for [`Writer::open_unjournaled`].
    journal: Option<Journal>,
    /// Journal records replayed at open that could not be stored then.
    unstored: Option<Staged>,
    /// The wall clock a commit splits its chunks by ([`CHUNK_SPLIT_NS`]); tests set their own.
    clock: fn() -> i64,
    /// The sinks whose bookkeeping a commit may carry ([`super::ride`]); `None` unless
    /// commits are synced (`full`), as a sink's own commits always are.
    riders: Option<std::sync::Arc<Riders>>,
}

/// The writer's view of the unindexed tail of `chunks`.
struct Tail {
    /// Chunks inserted since (an estimate after open: the newest id minus `through`).
    rows: i64,
    /// The tag sets of the chunks this writer inserted since (empty after open).
    tagsets: foldhash::HashSet<i64>,
    /// When the tail was last indexed (or the writer opened).
    since: std::time::Instant,
}

impl Tail {
    /// Whether a commit that brings the tail to `rows` chunks (of the tag sets in
    /// `self.tagsets`) should index it too: after [`chunks::TAIL_SECONDS`], once it holds
    /// [`chunks::TAIL_ROWS`] chunks and [`chunks::TAIL_ROWS_PER_TAGSET`] per tag set, or
    /// at [`chunks::TAIL_MAX_ROWS`]. Indexing writes about one index leaf per tag set in
    /// the tail, so with hundreds of tag sets a commit (a scrape, many models) a row count
    /// alone would index every commit or two.
    fn due(&self, rows: i64) -> bool {
        let per_tagset = chunks::TAIL_ROWS_PER_TAGSET.saturating_mul(self.tagsets.len() as i64);
        rows > 0
            && (rows >= chunks::TAIL_ROWS.max(per_tagset).min(chunks::TAIL_MAX_ROWS)
                || self.since.elapsed() >= std::time::Duration::from_secs(chunks::TAIL_SECONDS))
    }
}

/// What one committed batch did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WriteSummary {
    /// Points (lines) stored.
    pub points: usize,
    /// Field values stored.
    pub values: usize,
    /// Points refused, with reasons.
    pub rejected: Vec<Rejection>,
}

impl Writer {
    /// Opens (creating and migrating if needed) the database in `dir`, with its ingest
    /// journal: records a previous run appended but did not store are stored first. Fails
    /// with [`StoreError::InUse`] while another writer (a running agent) holds the store.
    pub fn open(dir: &Path, max_series: usize, sync: Synchronous) -> Result<Writer, StoreError> {
        let mut w = Self::open_unjournaled(dir, max_series, sync)?;
        let stored = w.journal_seq()?;
        let (journal, replayed, seq) = Journal::open(dir, stored, sync == Synchronous::Full)?;
        w.journal = Some(journal);
        if seq > stored {
            match w.commit([&replayed]) {
                Ok(()) => {
                    tracing::info!(
                        points = replayed.points(),
                        "journal replayed into the store"
                    )
                }
                // A full (or read-only) disk at start: the agent must still start, so that
                // its disk budget can free space and its reads work; the writer keeps the
                // records held and stores them once it can (`take_unstored`).
                Err(e) if e.retryable() || e.is_read_only() => {
                    tracing::error!(error = %e, points = replayed.points(), "the journal's records cannot be stored yet; kept, and tried again");
                    w.unstored = Some(replayed);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(w)
    }

    /// Has the writer's connection checkpoint past `bytes` of WAL (see
    /// [`super::open::space::checkpoint_every`]): the agent bounds the WAL to what a small
    /// disk budget leaves it.
    pub fn checkpoint_every(&self, bytes: u64) -> Result<(), StoreError> {
        super::open::space::checkpoint_every(&self.conn, &self.path, bytes)
    }

    /// Opens the database without its journal: for a process that writes no points beside
    /// a running agent (`edgewatch maintain` migrating the schema). [`Writer::journal`]
    /// refuses on it, and records in the journal stay for the next [`Writer::open`].
    pub fn open_unjournaled(
        dir: &Path,
        max_series: usize,
        sync: Synchronous,
    ) -> Result<Writer, StoreError> {
        let (conn, path) = open(dir, Mode::Writer(sync))?;
        let through = chunks::indexed_through(&conn, &path)?;
        let tail = Tail {
            rows: chunks::newest_id(&conn, &path)?.saturating_sub(through),
            tagsets: foldhash::HashSet::default(),
            since: std::time::Instant::now(),
        };
        // A sink's acknowledgement and mark must survive a power cut (its own commits are
        // always synced), so only a synced commit carries them.
        let riders = (sync == Synchronous::Full).then(|| Riders::of(&path));
        let mut w = Writer {
            tail,
            conn,
            path,
            dict: Dictionary::default(),
            max_series,
            latest: None,
            held: None,
            sids: Vec::with_capacity(64),
            journal: None,
            unstored: None,
            clock: crate::now_ns,
            riders,
        };
        w.load_dictionary()?;
        Ok(w)
    }

    /// The newest journal record the store holds: a row of `sqlite_sequence`, the page each
    /// commit writes anyway for the chunk ids (`migrations/0016_journal_seq_in_sequence.sql`).
    fn journal_seq(&self) -> Result<u64, StoreError> {
        self.conn
            .query_row(
                "SELECT seq FROM sqlite_sequence WHERE name = ?1",
                [JOURNAL_SEQ_ROW],
                |r| r.get::<_, i64>(0),
            )
            .ctx(&self.path)
            .map(|s| s.max(0) as u64)
    }

    /// Where a commit now splits its chunks: the start of the current minute.
    fn split(clock: fn() -> i64) -> i64 {
        clock().div_euclid(CHUNK_SPLIT_NS) * CHUNK_SPLIT_NS
    }

    /// Sets the wall clock commits split chunks by (tests writing at made-up times).
    pub fn set_clock(&mut self, clock: fn() -> i64) {
        self.clock = clock;
    }

    /// Records the newest value of every numeric series in `latest` as its line is
    /// accepted ([`Writer::stage`], [`Writer::write`], the journal's replayed records), not
    /// at its commit: `/metrics` shows what was received, held points included, so a scrape
    /// needs no commit of its own (each would be a synced transaction of ~10 pages).
    pub fn keep_latest(&mut self, latest: std::sync::Arc<LatestValues>) {
        if let Some(staged) = &self.unstored {
            latest.record_staged([staged]);
        }
        self.latest = Some(latest);
    }

    /// Lets readers see the lines held for the next commit ([`HeldView`]): each
    /// [`Writer::commit`] empties `view` in the instant its points become visible in the
    /// store. The caller puts what it holds in the view.
    pub fn keep_held(&mut self, view: std::sync::Arc<HeldView>) {
        self.held = Some(view);
    }

    /// The view given to [`Writer::keep_held`].
    pub fn held_view(&self) -> Option<&std::sync::Arc<HeldView>> {
        self.held.as_ref()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of series in the dictionary.
    pub fn series_count(&self) -> usize {
        self.dict.series_count
    }

    fn load_dictionary(&mut self) -> Result<(), StoreError> {
        let all = dict::load(&self.conn, &self.path)?;
        let mut d = Dictionary::default();
        for t in all.tagsets {
            d.tagsets.insert(t.key, t.id);
        }
        for s in all.series {
            d.series
                .entry(s.tagset_id)
                .or_default()
                .insert(s.field, (s.id, s.kind));
            d.series_count += 1;
        }
        self.dict = d;
        Ok(())
    }

    /// Commits `batches` in one transaction. On error nothing of them is stored (and the
    /// dictionary cache is reloaded so it matches the database again).
    pub fn write(&mut self, batches: &[&Batch]) -> Result<Vec<WriteSummary>, StoreError> {
        let result = self
            .write_inner(batches)
            .map_err(|e| super::open::os_cause(&self.conn, e));
        if result.is_err() {
            self.reload_dictionary();
        }
        result
    }

    fn reload_dictionary(&mut self) {
        if let Err(e) = self.load_dictionary() {
            tracing::error!(error = %e, "reloading the series dictionary failed");
        }
    }

    fn write_inner(&mut self, batches: &[&Batch]) -> Result<Vec<WriteSummary>, StoreError> {
        let path = self.path.clone();
        let tx = self.conn.transaction().ctx(&path)?;
        let staged = resolve_all(
            &mut dict::Inserts::within(&tx),
            &path,
            &mut self.dict,
            self.max_series,
            &mut self.sids,
            batches,
        )?;
        let split = Self::split(self.clock);
        let (rows, points) = Self::store_chunks(
            &tx,
            &path,
            split,
            &mut self.tail,
            staged.iter().map(|(_, s)| s),
        )?;
        let carried = Self::carry(self.riders.as_deref(), &tx, &path, rows, points)?;
        let indexed = Self::index_if_due(&tx, &path, &self.tail, rows)?;
        tx.commit().ctx(&path)?;
        carried.done(true);
        self.committed(rows, indexed);
        if let Some(latest) = &self.latest {
            latest.record_staged(staged.iter().map(|(_, s)| s));
        }
        Ok(staged.into_iter().map(|(sum, _)| sum).collect())
    }

    /// Checks each batch's lines and resolves them to series ids, without storing a point:
    /// the refusals in each summary are final, and the accepted lines come back as a
    /// [`Staged`] per batch, for [`Writer::journal`] and [`Writer::commit`]. Series the lines
    /// add are committed to the dictionary at once (in `full` mode synced), so a journal
    /// record never names a series the store does not hold. On error nothing of the batches
    /// is staged.
    pub fn stage(&mut self, batches: &[&Batch]) -> Result<Vec<(WriteSummary, Staged)>, StoreError> {
        let result = self
            .stage_inner(batches)
            .map_err(|e| super::open::os_cause(&self.conn, e));
        if result.is_err() {
            self.reload_dictionary();
        }
        result
    }

    fn stage_inner(
        &mut self,
        batches: &[&Batch],
    ) -> Result<Vec<(WriteSummary, Staged)>, StoreError> {
        let path = self.path.clone();
        let mut ins = dict::Inserts::begin_on_first(&self.conn);
        let out = resolve_all(
            &mut ins,
            &path,
            &mut self.dict,
            self.max_series,
            &mut self.sids,
            batches,
        )?;
        ins.commit().ctx(&path)?;
        if let Some(latest) = &self.latest {
            latest.record_staged(out.iter().map(|(_, s)| s));
        }
        Ok(out)
    }

    /// Appends `staged` to the journal (synced in `full` mode): once this returns, the
    /// lines survive a crash and the next [`Writer::commit`] stores them. Returns the
    /// record's sequence number. A writer opened without a journal refuses.
    pub fn journal<'a>(
        &mut self,
        staged: impl IntoIterator<Item = &'a Staged> + Clone,
    ) -> Result<u64, StoreError> {
        match &mut self.journal {
            Some(j) => j.append(staged),
            None => Err(StoreError::Journal {
                path: super::journal::journal_path(self.path.parent().unwrap_or(Path::new("."))),
                source: std::io::Error::other("this writer has no journal"),
            }),
        }
    }

    /// The journal's records [`Writer::open`] replayed but could not store (a full or
    /// read-only disk at start): the caller holds them for its next [`Writer::commit`], as
    /// journaled lines (never dropped).
    pub fn take_unstored(&mut self) -> Option<Staged> {
        self.unstored.take()
    }

    /// What the journal's appends have cost the storage since open, bytes (0 without one).
    pub fn journal_written(&self) -> u64 {
        self.journal.as_ref().map_or(0, Journal::written)
    }

    /// Whether [`Writer::journal`] can be used.
    pub fn has_journal(&self) -> bool {
        self.journal.is_some()
    }

    /// Stores `staged` (in order) in one transaction, with every journal record appended
    /// so far marked stored: the caller passes everything it staged since the last commit
    /// that went to the journal. On error nothing is stored, and the journal keeps its
    /// records.
    pub fn commit<'a>(
        &mut self,
        staged: impl IntoIterator<Item = &'a Staged>,
    ) -> Result<(), StoreError> {
        let result = self
            .commit_inner(staged)
            .map_err(|e| super::open::os_cause(&self.conn, e));
        if result.is_ok() {
            if let Some(j) = &mut self.journal {
                j.stored();
            }
        }
        result
    }

    fn commit_inner<'a>(
        &mut self,
        staged: impl IntoIterator<Item = &'a Staged>,
    ) -> Result<(), StoreError> {
        let path = self.path.clone();
        let tx = self.conn.transaction().ctx(&path)?;
        let split = Self::split(self.clock);
        let (rows, points) = Self::store_chunks(&tx, &path, split, &mut self.tail, staged)?;
        let carried = Self::carry(self.riders.as_deref(), &tx, &path, rows, points)?;
        if let Some(j) = self.journal.as_ref().filter(|j| !j.is_empty()) {
            tx.prepare_cached("UPDATE sqlite_sequence SET seq = ?1 WHERE name = ?2")
                .and_then(|mut st| st.execute(rusqlite::params![j.seq() as i64, JOURNAL_SEQ_ROW]))
                .ctx(&path)?;
        }
        let indexed = Self::index_if_due(&tx, &path, &self.tail, rows)?;
        match &self.held {
            // The held lines leave the view as they become visible in the store.
            Some(view) => view.commit_with(|| tx.commit()),
            None => tx.commit(),
        }
        .ctx(&path)?;
        carried.done(true);
        self.committed(rows, indexed);
        Ok(())
    }

    /// In a transaction that stored `rows` chunks of `points` points: the sinks' moves it
    /// carries ([`Riders::carry`]). Chunk ids are consecutive within it (AUTOINCREMENT, and
    /// no other connection writes meanwhile), so its chunks follow `newest - rows`. Nothing
    /// is carried while a clock fix holds chunks back from the sinks (`clockfix`), nor by an
    /// unsynced writer (`normal`).
    fn carry(
        riders: Option<&Riders>,
        tx: &Connection,
        path: &Path,
        rows: i64,
        points: i64,
    ) -> Result<Carried, StoreError> {
        let Some(riders) = riders.filter(|r| rows > 0 && r.any_offer()) else {
            return Ok(Carried::none());
        };
        if clockfix::hold_from(tx).ctx(path)?.is_some() {
            return Ok(Carried::none());
        }
        let through = chunks::next_id(tx, path)? - 1;
        Ok(riders.carry(tx, path, through - rows, through, points))
    }

    /// Packs the lines into chunk rows, one per tag set and side of `split` (more past
    /// [`MAX_CHUNK_POINTS`]), those before `split` first; returns the rows and points written.
    fn store_chunks<'a>(
        tx: &rusqlite::Transaction<'_>,
        path: &Path,
        split: i64,
        tail: &mut Tail,
        staged: impl IntoIterator<Item = &'a Staged>,
    ) -> Result<(i64, i64), StoreError> {
        let mut ins_chunk = tx
            .prepare_cached(
                "INSERT INTO chunks (tagset_id, ts_min, ts_max, n, data) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .ctx(path)?;
        let (mut rows, mut points) = (0i64, 0i64);
        // Points grouped by tag set and by which side of the current minute's start
        // (`split`, see CHUNK_SPLIT_NS) they are on, in arrival order per tag set.
        let mut open: Vec<ChunkBuilder> = Vec::new();
        let mut open_index: HashMap<(i64, bool), usize> = HashMap::default();
        for s in staged {
            for (tagset_id, ts, values) in s.lines() {
                let current = ts >= split;
                let slot = *open_index.entry((tagset_id, current)).or_insert_with(|| {
                    open.push(ChunkBuilder::new(tagset_id, current));
                    open.len() - 1
                });
                let chunk = &mut open[slot];
                chunk.enc.push(ts, values.iter().map(|(sid, v)| (*sid, v)));
                if chunk.enc.len() >= MAX_CHUNK_POINTS {
                    let n = chunk.flush(&mut ins_chunk).ctx(path)?;
                    rows += i64::from(n > 0);
                    points += n;
                }
            }
        }
        // The chunks of earlier minutes first, then those of the current one (each in
        // arrival order), so a fold that stops at the first chunk of the open minute leaves
        // none of a closed one behind it.
        for current in [false, true] {
            for chunk in open.iter_mut().filter(|c| c.current == current) {
                let n = chunk.flush(&mut ins_chunk).ctx(path)?;
                rows += i64::from(n > 0);
                points += n;
                // Before the commit: a failed one leaves its tag sets counted, which only
                // brings the next indexing a little closer.
                tail.tagsets.insert(chunk.tagset_id);
            }
        }
        Ok((rows, points))
    }

    /// Indexes the tail in this transaction when due (see `Tail::due`): one leaf of the
    /// index per tag set then, instead of one per tag set and commit. Returns the new
    /// `indexed_through` if it did.
    fn index_if_due(
        tx: &rusqlite::Transaction<'_>,
        path: &Path,
        tail: &Tail,
        rows: i64,
    ) -> Result<Option<i64>, StoreError> {
        if tail.due(tail.rows + rows) {
            Ok(Some(chunks::index_tail(tx, path)?))
        } else {
            Ok(None)
        }
    }

    /// After a commit that wrote `rows` chunks (and indexed the tail if `indexed`).
    fn committed(&mut self, rows: i64, indexed: Option<i64>) {
        match indexed {
            Some(_) => {
                self.tail.rows = 0;
                self.tail.tagsets.clear();
                self.tail.since = std::time::Instant::now();
            }
            None => self.tail.rows += rows,
        }
    }
}

/// Checks each batch's lines against the dictionary (types, the series cap), adds the
/// series they bring (through `ins`) and returns each batch's summary and accepted lines. A line
/// is accepted entirely or refused entirely (InfluxDB semantics).
fn resolve_all(
    ins: &mut dict::Inserts<'_>,
    path: &Path,
    dict: &mut Dictionary,
    max_series: usize,
    values: &mut Vec<i64>,
    batches: &[&Batch],
) -> Result<Vec<(WriteSummary, Staged)>, StoreError> {
    let now = crate::now_ns();
    let mut out = Vec::with_capacity(batches.len());
    for batch in batches {
        out.push(resolve(ins, path, dict, max_series, values, now, batch)?);
    }
    Ok(out)
}

/// [`resolve_all`] of one batch: its summary and accepted lines.
fn resolve(
    ins: &mut dict::Inserts<'_>,
    path: &Path,
    dict: &mut Dictionary,
    max_series: usize,
    values: &mut Vec<i64>,
    now: i64,
    batch: &Batch,
) -> Result<(WriteSummary, Staged), StoreError> {
    let mut staged = Staged::default();
    let mut sum = WriteSummary::default();
    'lines: for line in &batch.lines {
        // The known fields' series ids are collected on the way (one lookup per field when
        // the line adds no series, the common case).
        let tagset_id = dict.tagsets.get(line.key.as_str()).copied();
        let known_fields = tagset_id.and_then(|t| dict.series.get(&t));
        let mut new_series = 0usize;
        values.clear();
        for (field, value) in &line.fields {
            let known = known_fields.and_then(|m| m.get(field.as_str()));
            match known {
                Some((_, kind)) if *kind != value.kind() => {
                    sum.rejected.push(Rejection {
                        line: line.line_no,
                        error: format!(
                            "field type conflict: input field \"{field}\" on series \"{}\" is type {}, already exists as type {}",
                            line.key,
                            value.kind().name(),
                            kind.name()
                        ),
                    });
                    continue 'lines;
                }
                Some((sid, _)) => values.push(*sid),
                None => new_series += 1,
            }
        }
        if new_series > 0 && dict.series_count + new_series > max_series {
            sum.rejected.push(Rejection {
                line: line.line_no,
                error: format!(
                    "series limit reached: the store holds {} series and max_series is {max_series}; \
                     \"{}\" would add {new_series} more (check for a tag with unbounded values, \
                     or raise [storage] max_series)",
                    dict.series_count, line.key
                ),
            });
            continue 'lines;
        }
        let tagset_id = match tagset_id {
            Some(id) => id,
            None => {
                let (measurement, tags) = split_series_key(&line.key);
                let tags_json = serde_json::to_string(
                    &tags
                        .into_iter()
                        .collect::<std::collections::BTreeMap<_, _>>(),
                )
                .unwrap_or_else(|_| "{}".into());
                let id = ins.tagset(&line.key, &measurement, &tags_json).ctx(path)?;
                dict.tagsets.insert(line.key.clone(), id);
                id
            }
        };
        if new_series > 0 {
            values.clear();
            let fields = dict.series.entry(tagset_id).or_default();
            for (field, value) in &line.fields {
                let sid = match fields.get(field.as_str()) {
                    Some((sid, _)) => *sid,
                    None => {
                        let sid = ins.series(tagset_id, field, value.kind(), now).ctx(path)?;
                        fields.insert(field.clone(), (sid, value.kind()));
                        dict.series_count += 1;
                        sid
                    }
                };
                values.push(sid);
            }
        }
        for (&sid, (_, value)) in values.iter().zip(&line.fields) {
            staged.push_value(sid, value.clone());
        }
        staged.end_line(tagset_id, line.ts);
        sum.points += 1;
        sum.values += line.fields.len();
    }
    Ok((sum, staged))
}

/// Most points packed into one chunk row.
pub const MAX_CHUNK_POINTS: usize = 2048;

/// The `sqlite_sequence` row that holds the newest journal record a commit stored
/// (`migrations/0016_journal_seq_in_sequence.sql`).
const JOURNAL_SEQ_ROW: &str = "edgewatch.journal";

/// Accumulates the points of one tag set into chunk rows (columnar, [`codec::ChunkEncoder`]).
/// A commit splits its chunks at the start of the current minute (by the wall clock, a
/// multiple of this many nanoseconds): a tag set's points from before it and from it on go
/// in two chunks, the earlier one first. So no chunk spans the boundary between a closed
/// minute and the open one, and the rollup job's minute tier folds each minute once, when
/// it has closed, instead of folding the open minute's first seconds and rewriting those
/// rows at the next fold (`rollup::Job::open_buckets`). Points of other times (late, from a
/// clock not yet set) stay in one chunk as before.
pub const CHUNK_SPLIT_NS: i64 = 60_000_000_000;

struct ChunkBuilder {
    tagset_id: i64,
    /// Whether its points are from the current minute on (see [`CHUNK_SPLIT_NS`]).
    current: bool,
    enc: codec::ChunkEncoder,
}

impl ChunkBuilder {
    fn new(tagset_id: i64, current: bool) -> Self {
        ChunkBuilder {
            tagset_id,
            current,
            enc: codec::ChunkEncoder::new(),
        }
    }

    /// Writes the pending points as one (unindexed) row and starts a new chunk; returns
    /// the points written (0: no row).
    fn flush(&mut self, insert: &mut rusqlite::CachedStatement<'_>) -> rusqlite::Result<i64> {
        let Some(e) = self.enc.finish() else {
            return Ok(0);
        };
        insert.execute(params![
            self.tagset_id,
            e.ts_min,
            e.ts_max,
            e.n as i64,
            &e.data[..]
        ])?;
        Ok(e.n as i64)
    }
}
