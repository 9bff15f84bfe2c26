//! The Prometheus remote write sink (remote write 1.0): each batch becomes one protobuf
//! `WriteRequest`, snappy-compressed in the block format, posted to the receiver's write URL
//! (Prometheus with `--web.enable-remote-write-receiver`, VictoriaMetrics, Mimir, ...).
//! Everything around the request — durable cursor, batching, retry, dead letters, status —
//! is the InfluxDB sink's loop ([`super::influx::run_http`]); this file is the encoder and
//! the request.
//!
//! Mapping: every numeric field of a point is one sample of the series
//! `<measurement>_<field>` (sanitised to `[a-zA-Z_:][a-zA-Z0-9_:]*`) whose labels are the
//! point's tags plus `device_id` and the static `[tags]` (names sanitised to
//! `[a-zA-Z_][a-zA-Z0-9_]*`, empty values left out, sorted by name as the protocol asks:
//! `__name__` first for lower-case tag names). Booleans are 0/1, integers become floats,
//! times are milliseconds; a series' samples are in time order within a request, and two
//! points of one series in the same millisecond leave the later one. Strings cannot be
//! carried: they are skipped and counted (`skipped_string_values`). It never sends metadata,
//! exemplars or histograms (those are [`super::histogram`]'s), and never reorders or drops numeric values otherwise.
//!
//! Collisions: sanitising and joining are not one-to-one (`cpu_usage`/`x` and `cpu`/`usage_x`
//! are both `cpu_usage_x`; tags `a.b` and `a_b` are both `a_b`), and two sources sent as one
//! series lose values (Prometheus keeps one of two samples at one time, or refuses a later
//! batch as "duplicate sample for timestamp"). So no two sources ever share a label set:
//! - within a tag set, tags whose names sanitise to one name are all kept: a name that
//!   sanitising left unchanged keeps it, the others (in tag order) take `<name>_2`,
//!   `<name>_3`, ... (the first that is free);
//! - across sources (tag set and field), a label set belongs to the source that has it
//!   first ([`Names`]): in the store's dictionary order (series ids, which never change and
//!   never get reused), so the choice is the same in every batch and after a restart; any
//!   other source with that label set is sent with one more label, [`SOURCE_LABEL`] = its
//!   line-protocol series key and field (`cpu,device_id=jet-7 usage_x`), which no other
//!   source has. Sources the dictionary does not hold (rollup rows) go first come, first
//!   served, for the sink's lifetime.
//!
//! Sources sent apart are counted in the sink's status (`name_collisions`) and logged (the
//! first, then at every power of two).

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use prost::Message as _;
use tokio_util::sync::CancellationToken;

use super::encode::{series, Point, Series};
use super::influx::{run_http, Encoded, Wire};
use super::{SinkConfig, SinkCtx, SinkStatus};
use crate::deliver::{Auth, HttpPeer, Outcome, Peer};
use crate::model::{escape_into, Kind, Value};
use crate::store::{dict, Reader, StoreError};

/// The protobuf messages of remote write 1.0 (`prometheus/prompb`), the fields it uses.
pub mod proto {
    /// A request: the series and their samples.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WriteRequest {
        /// One entry per series.
        #[prost(message, repeated, tag = "1")]
        pub timeseries: Vec<TimeSeries>,
    }

    /// One series: its labels (`__name__` included) and samples.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TimeSeries {
        /// Sorted by name.
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<Label>,
        /// In time order.
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<Sample>,
        /// Native histograms, in time order (`types.proto` field 4; 3 is exemplars).
        #[prost(message, repeated, tag = "4")]
        pub histograms: Vec<Histogram>,
    }

    /// A native histogram (integer counts), numbered as `prompb/types.proto`'s `Histogram`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Histogram {
        /// Observations (`count_int` = 1 or `count_float` = 2).
        #[prost(oneof = "histogram::Count", tags = "1, 2")]
        pub count: Option<histogram::Count>,
        /// Their sum.
        #[prost(double, tag = "3")]
        pub sum: f64,
        /// Bucket bounds `2^(i / 2^schema)`; -4..=8.
        #[prost(sint32, tag = "4")]
        pub schema: i32,
        /// Breadth of the zero bucket.
        #[prost(double, tag = "5")]
        pub zero_threshold: f64,
        /// Count in the zero bucket (`zero_count_int` = 6 or `zero_count_float` = 7).
        #[prost(oneof = "histogram::ZeroCount", tags = "6, 7")]
        pub zero_count: Option<histogram::ZeroCount>,
        /// Negative buckets' spans.
        #[prost(message, repeated, tag = "8")]
        pub negative_spans: Vec<BucketSpan>,
        /// Count deltas bucket to bucket (the first against zero).
        #[prost(sint64, repeated, tag = "9")]
        pub negative_deltas: Vec<i64>,
        /// Float counts (float histograms only).
        #[prost(double, repeated, tag = "10")]
        pub negative_counts: Vec<f64>,
        /// Positive buckets' spans.
        #[prost(message, repeated, tag = "11")]
        pub positive_spans: Vec<BucketSpan>,
        /// Count deltas bucket to bucket (the first against zero).
        #[prost(sint64, repeated, tag = "12")]
        pub positive_deltas: Vec<i64>,
        /// Float counts (float histograms only).
        #[prost(double, repeated, tag = "13")]
        pub positive_counts: Vec<f64>,
        /// [`histogram::ResetHint`].
        #[prost(enumeration = "histogram::ResetHint", tag = "14")]
        pub reset_hint: i32,
        /// Milliseconds since the epoch.
        #[prost(int64, tag = "15")]
        pub timestamp: i64,
    }

    /// [`Histogram`]'s nested types.
    pub mod histogram {
        /// The count.
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Count {
            /// Integer count.
            #[prost(uint64, tag = "1")]
            CountInt(u64),
            /// Float count.
            #[prost(double, tag = "2")]
            CountFloat(f64),
        }

        /// The zero bucket's count.
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum ZeroCount {
            /// Integer count.
            #[prost(uint64, tag = "6")]
            ZeroCountInt(u64),
            /// Float count.
            #[prost(double, tag = "7")]
            ZeroCountFloat(f64),
        }

        /// Whether a counter reset happened before this histogram.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum ResetHint {
            /// Test for a reset.
            Unknown = 0,
            /// The first histogram after a reset.
            Yes = 1,
            /// No reset since the previous histogram.
            No = 2,
            /// A gauge histogram.
            Gauge = 3,
        }
    }

    /// Consecutive buckets: `offset` from the previous span's end (the first: the index).
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct BucketSpan {
        /// Gap.
        #[prost(sint32, tag = "1")]
        pub offset: i32,
        /// Buckets.
        #[prost(uint32, tag = "2")]
        pub length: u32,
    }

    /// A label pair.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct Label {
        /// Name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Value.
        #[prost(string, tag = "2")]
        pub value: String,
    }

    /// A sample.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Value.
        #[prost(double, tag = "1")]
        pub value: f64,
        /// Milliseconds since the epoch.
        #[prost(int64, tag = "2")]
        pub timestamp: i64,
    }
}

use proto::{Label, Sample, TimeSeries, WriteRequest};

/// The label that sets a source apart from another whose labels sanitise to the same set:
/// its line-protocol series key and field. No tag takes this name (see [`tag_labels`]).
pub const SOURCE_LABEL: &str = "edgewatch_source";

/// `s` as a metric name: characters outside `[a-zA-Z0-9_:]` become `_`, and a leading
/// digit gets a `_` in front.
pub fn metric_name(s: &str) -> String {
    sanitise(s, true)
}

/// `s` as a label name: characters outside `[a-zA-Z0-9_]` become `_`, a leading digit gets
/// a `_` in front, and a name starting with `__` (reserved for Prometheus) gets `tag`.
pub fn label_name(s: &str) -> String {
    let n = sanitise(s, false);
    if n.starts_with("__") {
        format!("tag{n}")
    } else {
        n
    }
}

fn sanitise(s: &str, colon: bool) -> String {
    let mut out = String::with_capacity(s.len() + 1);
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    for c in s.chars() {
        let ok = c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':');
        out.push(if ok { c } else { '_' });
    }
    out
}

/// A tag set's tags as labels (without `__name__`), in tag order, empty values left out, and
/// whether a name had to be changed to keep two tags apart. Names are sanitised; when two
/// sanitise to one name, a name sanitising left as it is keeps it and the others (in tag
/// order) take the first free `<name>_2`, `<name>_3`, ...; [`SOURCE_LABEL`] is never free.
pub(crate) fn tag_labels(series: &Series) -> (Vec<Label>, bool) {
    let tags: Vec<(&str, &str, String)> = series
        .tags
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.as_str(), v.as_str(), label_name(k)))
        .collect();
    let mut taken: HashSet<&str> = HashSet::with_capacity(tags.len() + 1);
    taken.insert(SOURCE_LABEL);
    let mut names: Vec<Option<String>> = vec![None; tags.len()];
    for (i, (k, _, n)) in tags.iter().enumerate() {
        if k == n && taken.insert(n.as_str()) {
            names[i] = Some(n.clone());
        }
    }
    let mut renamed = false;
    let mut extra: HashSet<String> = HashSet::new();
    for (i, (_, _, n)) in tags.iter().enumerate() {
        if names[i].is_some() {
            continue;
        }
        let mut name = n.clone();
        let mut k = 2;
        while taken.contains(name.as_str()) || extra.contains(&name) {
            name = format!("{n}_{k}");
            k += 1;
            renamed = true;
        }
        extra.insert(name.clone());
        names[i] = Some(name);
    }
    let labels = tags
        .iter()
        .zip(names)
        .map(|((_, v, _), n)| Label {
            name: n.unwrap_or_default(),
            value: (*v).to_string(),
        })
        .collect();
    (labels, renamed)
}

/// The labels of field `field` of a tag set whose tags are `tags` (from [`tag_labels`]):
/// `__name__` added, sorted by name.
fn series_labels(tags: &[Label], measurement: &str, field: &str) -> Vec<Label> {
    let mut labels = Vec::with_capacity(tags.len() + 2);
    labels.push(Label {
        name: "__name__".into(),
        value: metric_name(&format!("{measurement}_{field}")),
    });
    labels.extend(tags.iter().cloned());
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    labels
}

/// A stable 64-bit digest (in this process) of `parts`.
fn digest<'a>(parts: impl IntoIterator<Item = &'a str>) -> u64 {
    // `DefaultHasher::new()` has fixed keys: the same digest in every sink of the process.
    // A false match of two label sets (odds about n^2 / 2^65) would only add SOURCE_LABEL
    // to a series.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

/// A source: a tag set (by its line-protocol prefix) and a field.
fn source_id(prefix: &str, field: &str) -> u64 {
    digest([prefix, field])
}

/// A label set.
fn labels_id(labels: &[Label]) -> u64 {
    digest(
        labels
            .iter()
            .flat_map(|l| [l.name.as_str(), l.value.as_str()]),
    )
}

/// [`SOURCE_LABEL`]'s value for a source: `<series key> <field>` as line protocol writes them.
fn source_value(prefix: &str, field: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + field.len() + 1);
    s.push_str(prefix);
    s.push(' ');
    escape_into(&mut s, field, &[',', '=', ' ']);
    s
}

/// The store's numeric series in id order (tag set, field), for [`Names`].
pub type Dictionary = Box<dyn FnMut() -> Result<Vec<(Arc<Series>, Arc<str>)>, StoreError> + Send>;

/// Which source owns which label set, for one sink's lifetime: a label set goes to the
/// source that has it first in the store's dictionary (when one is given), else to the first
/// one sent; every other source with it is sent with [`SOURCE_LABEL`].
pub struct Names {
    sink: String,
    /// Label set -> its owner.
    owners: HashMap<u64, u64>,
    /// Source -> whether it is sent with [`SOURCE_LABEL`].
    known: HashMap<u64, bool>,
    /// Sources sent apart (with [`SOURCE_LABEL`] or a renamed tag), since start.
    collisions: i64,
    dictionary: Option<Dictionary>,
}

impl Names {
    /// First come, first served (no dictionary); `sink` names the sink in logs.
    pub fn new(sink: &str) -> Names {
        Names {
            sink: sink.to_string(),
            owners: HashMap::new(),
            known: HashMap::new(),
            collisions: 0,
            dictionary: None,
        }
    }

    /// Owners in `dictionary`'s order: read now, and again when a source it did not hold
    /// comes (at most once per request).
    pub fn with_dictionary(sink: &str, dictionary: Dictionary) -> Names {
        let mut n = Names::new(sink);
        n.dictionary = Some(dictionary);
        n.learn();
        n
    }

    /// Sources sent apart since start.
    pub fn collisions(&self) -> i64 {
        self.collisions
    }

    /// Registers every source of the dictionary not known yet, in its order.
    fn learn(&mut self) {
        let Some(load) = self.dictionary.as_mut() else {
            return;
        };
        let list = match load() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(sink = %self.sink, error = %e, "cannot read the series dictionary: colliding names go first come, first served");
                return;
            }
        };
        let mut tags: HashMap<*const Series, (Vec<Label>, bool)> = HashMap::new();
        for (s, field) in list {
            let src = source_id(&s.prefix, &field);
            if self.known.contains_key(&src) {
                continue;
            }
            let (t, renamed) = tags
                .entry(Arc::as_ptr(&s))
                .or_insert_with(|| tag_labels(&s));
            let labels = series_labels(t, &s.measurement, &field);
            let renamed = *renamed;
            self.register(src, &labels, renamed, || source_value(&s.prefix, &field));
        }
    }

    /// Whether `src` (labels `labels`, tags renamed or not) is sent with [`SOURCE_LABEL`];
    /// registers it if new.
    fn register(
        &mut self,
        src: u64,
        labels: &[Label],
        tags_renamed: bool,
        describe: impl FnOnce() -> String,
    ) -> bool {
        if let Some(&apart) = self.known.get(&src) {
            return apart;
        }
        let owner = *self.owners.entry(labels_id(labels)).or_insert(src);
        let apart = owner != src;
        self.known.insert(src, apart);
        if apart || tags_renamed {
            self.collisions += 1;
            if (self.collisions as u64).is_power_of_two() {
                let name = labels
                    .iter()
                    .find(|l| l.name == "__name__")
                    .map(|l| l.value.as_str())
                    .unwrap_or("");
                let how = if apart {
                    "sent with an edgewatch_source label"
                } else {
                    "a tag renamed"
                };
                tracing::warn!(sink = %self.sink, source = %describe(), metric = name, how, collisions = self.collisions, "a series' name collides with another's after sanitising; kept apart");
            }
        }
        apart
    }
}

/// A value as a sample value; `None` for strings.
fn sample_value(v: &Value) -> Option<f64> {
    match v {
        Value::F64(f) => Some(*f),
        Value::I64(i) => Some(*i as f64),
        Value::U64(u) => Some(*u as f64),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        Value::Str(_) => None,
    }
}

/// Bytes a sample takes in its series at most: double (9), ms timestamp (up to 11), framing.
const SAMPLE_LEN: usize = 22;

/// Bytes a length-delimited field of `len` bytes takes in its parent (one-byte tag).
fn field_len(len: usize) -> usize {
    1 + prost::length_delimiter_len(len) + len
}

/// A built request.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    /// The request.
    pub request: WriteRequest,
    /// How many points (a prefix of those given) it holds.
    pub used: usize,
    /// String values skipped in them.
    pub skipped_strings: i64,
}

/// The `WriteRequest` of `points`, stopping after the point that takes the (uncompressed)
/// request to `max_bytes` or more (at least one point). Label sets are kept apart through
/// `names` (see the module's doc).
pub fn request(points: &[Point], max_bytes: usize, names: &mut Names) -> Built {
    // Series by (tag set, field); a tag set is named by its line-protocol prefix.
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    let mut labels_of: HashMap<&str, (Vec<Label>, bool)> = HashMap::new();
    let mut series: Vec<TimeSeries> = Vec::new();
    let mut size = 0usize;
    let mut skipped = 0i64;
    let mut used = 0usize;
    let mut learnt = false;
    for p in points {
        if used > 0 && size >= max_bytes {
            break;
        }
        used += 1;
        let key = p.series.prefix.as_str();
        for (field, v) in &p.fields {
            let Some(value) = sample_value(v) else {
                skipped += 1;
                continue;
            };
            let at = match index.get(&(key, &**field)) {
                Some(&i) => i,
                None => {
                    let (tags, renamed) = labels_of
                        .entry(key)
                        .or_insert_with(|| tag_labels(&p.series));
                    let mut labels = series_labels(tags, &p.series.measurement, field);
                    let src = source_id(key, field);
                    if !learnt && !names.known.contains_key(&src) {
                        names.learn();
                        learnt = true;
                    }
                    if names.register(src, &labels, *renamed, || source_value(key, field)) {
                        labels.push(Label {
                            name: SOURCE_LABEL.into(),
                            value: source_value(key, field),
                        });
                        labels.sort_by(|a, b| a.name.cmp(&b.name));
                    }
                    size += labels
                        .iter()
                        .map(|l| field_len(l.encoded_len()))
                        .sum::<usize>()
                        + 4;
                    series.push(TimeSeries {
                        labels,
                        ..TimeSeries::default()
                    });
                    index.insert((key, &**field), series.len() - 1);
                    series.len() - 1
                }
            };
            size += SAMPLE_LEN;
            series[at].samples.push(Sample {
                value,
                timestamp: p.ts.div_euclid(1_000_000),
            });
        }
    }
    for s in &mut series {
        // Chunks of one series arrive in id order, which is nearly always time order; the
        // protocol wants time order, and one sample per millisecond (the later one wins).
        s.samples.sort_by_key(|x| x.timestamp);
        let mut out: Vec<Sample> = Vec::with_capacity(s.samples.len());
        for x in s.samples.drain(..) {
            match out.last_mut() {
                Some(last) if last.timestamp == x.timestamp => *last = x,
                _ => out.push(x),
            }
        }
        s.samples = out;
    }
    series.retain(|s| !s.samples.is_empty());
    Built {
        request: WriteRequest { timeseries: series },
        used,
        skipped_strings: skipped,
    }
}

/// The store's numeric series in id order, read through one read-only connection opened at
/// the first call; tag sets get `identity` as the forwarded points do.
fn store_dictionary(dir: PathBuf, identity: Vec<(String, String)>) -> Dictionary {
    let mut reader: Option<Reader> = None;
    Box::new(move || {
        let r = match &reader {
            Some(r) => r,
            None => reader.insert(Reader::open(&dir)?),
        };
        let d = dict::load(r.conn(), r.path())?;
        let tagsets: HashMap<i64, Arc<Series>> = d
            .tagsets
            .iter()
            .map(|t| (t.id, Arc::new(series(&t.key, &identity))))
            .collect();
        let mut list: Vec<dict::Series> = d
            .series
            .into_iter()
            .filter(|s| s.kind != Kind::Str)
            .collect();
        list.sort_by_key(|s| s.id);
        Ok(list
            .into_iter()
            .filter_map(|s| {
                tagsets
                    .get(&s.tagset_id)
                    .map(|t| (t.clone(), Arc::<str>::from(s.field)))
            })
            .collect())
    })
}

/// Remote write to one receiver.
struct RemoteWrite {
    name: String,
    peer: HttpPeer,
    names: Mutex<Names>,
    /// Where collisions are reported (`name_collisions`).
    status: Option<Arc<SinkStatus>>,
}

impl RemoteWrite {
    /// With no dictionary and no status (tests).
    #[cfg(test)]
    fn new(cfg: &SinkConfig) -> RemoteWrite {
        let names = Mutex::new(Names::new(&cfg.name));
        RemoteWrite::with_names(cfg, names, None)
    }

    fn with_names(
        cfg: &SinkConfig,
        names: Mutex<Names>,
        status: Option<Arc<SinkStatus>>,
    ) -> RemoteWrite {
        let auth = Auth::basic_or_bearer(&cfg.credentials, cfg.token.as_ref());
        let headers = cfg
            .headers
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.expose()));
        let w = RemoteWrite {
            name: cfg.name.clone(),
            peer: HttpPeer::new(
                Peer::Sink,
                cfg.url.clone(),
                cfg.retry.timeout.0,
                &auth,
                headers,
            ),
            names,
            status,
        };
        w.report();
        w
    }

    /// Puts the collision count in the sink's status.
    fn report(&self) {
        if let Some(st) = &self.status {
            let n = self
                .names
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .collisions();
            st.update(|s| s.name_collisions = n);
        }
    }
}

impl Wire for RemoteWrite {
    fn kind(&self) -> &'static str {
        "prometheus_remote_write"
    }

    fn body(&self, points: &[Point], max_bytes: usize) -> Encoded {
        let Built {
            request: req,
            used,
            skipped_strings,
        } = {
            let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            request(points, max_bytes, &mut names)
        };
        self.report();
        let raw = req.encode_to_vec();
        let body = match snap::raw::Encoder::new().compress_vec(&raw) {
            Ok(b) => b,
            Err(e) => {
                // Only an input over snappy's ~4 GiB limit fails; max_bytes keeps it far away.
                tracing::error!(sink = %self.name, error = %e, bytes = raw.len(), "cannot snappy-compress the batch");
                Vec::new()
            }
        };
        Encoded {
            body,
            used,
            skipped_strings,
        }
    }

    fn send(&self, body: &[u8]) -> Outcome {
        self.peer.post(
            &[
                ("Content-Type", "application/x-protobuf"),
                ("Content-Encoding", "snappy"),
                ("X-Prometheus-Remote-Write-Version", "0.1.0"),
            ],
            body,
        )
    }
}

/// The sink's thread.
pub(crate) fn run(ctx: SinkCtx, stop: CancellationToken) {
    // Raw points' label sets go to their owners in the dictionary's order; rollup rows are
    // not in it.
    let names = if ctx.feed == super::store::Feed::Raw {
        Names::with_dictionary(
            &ctx.cfg.name,
            store_dictionary(ctx.dir.clone(), ctx.identity.clone()),
        )
    } else {
        Names::new(&ctx.cfg.name)
    };
    let wire = RemoteWrite::with_names(&ctx.cfg, Mutex::new(names), Some(ctx.status.clone()));
    run_http(ctx, stop, &wire);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::encode::series;
    use std::sync::Arc;

    fn point(key: &str, ts: i64, fields: Vec<(&str, Value)>) -> Point {
        let id = vec![
            ("device_id".to_string(), "jet-1".to_string()),
            ("site".to_string(), "north".to_string()),
        ];
        Point {
            series: Arc::new(series(key, &id)),
            ts,
            fields: fields.into_iter().map(|(k, v)| (k.into(), v)).collect(),
        }
    }

    /// A request with no dictionary and nothing sent before.
    fn build(points: &[Point], max_bytes: usize) -> (WriteRequest, usize, i64) {
        let b = request(points, max_bytes, &mut Names::new("t"));
        (b.request, b.used, b.skipped_strings)
    }

    fn labels(ts: &TimeSeries) -> Vec<(&str, &str)> {
        ts.labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect()
    }

    #[test]
    fn names_are_sanitised() {
        assert_eq!(metric_name("jetson_temp_temp_c"), "jetson_temp_temp_c");
        assert_eq!(metric_name("gpu.mem-used:x"), "gpu_mem_used:x");
        assert_eq!(metric_name("9lives_é"), "_9lives__");
        assert_eq!(label_name("a:b-c"), "a_b_c");
        assert_eq!(label_name("1x"), "_1x");
        assert_eq!(label_name("__name__"), "tag__name__");
        assert_eq!(label_name(""), "_");
    }

    #[test]
    fn fields_become_series_with_sorted_labels_in_time_order() {
        let a = point("inference,model=yolo,Zone=x,ver-sion=3", 0, vec![]);
        let s = a.series.clone();
        let mk = |ts: i64, fields: Vec<(&str, Value)>| Point {
            series: s.clone(),
            ts,
            fields: fields.into_iter().map(|(k, v)| (k.into(), v)).collect(),
        };
        let points = vec![
            mk(
                3_000_000_500,
                vec![
                    ("wall_ms", Value::F64(18.5)),
                    ("ok", Value::Bool(true)),
                    ("note", Value::Str("x".into())),
                ],
            ),
            // Earlier, in a later chunk: sent first.
            mk(1_000_000_000, vec![("wall_ms", Value::F64(17.0))]),
            // Same millisecond as the first: the later one stays.
            mk(3_000_000_900, vec![("ok", Value::Bool(false))]),
            point(
                "gpu,gpu=0",
                2_000_000_000,
                vec![("util_pct", Value::U64(40))],
            ),
        ];
        let (req, used, skipped) = build(&points, usize::MAX);
        assert_eq!((used, skipped), (4, 1));
        assert_eq!(req.timeseries.len(), 3);
        let wall = &req.timeseries[0];
        assert_eq!(
            labels(wall),
            vec![
                ("Zone", "x"),
                ("__name__", "inference_wall_ms"),
                ("device_id", "jet-1"),
                ("model", "yolo"),
                ("site", "north"),
                ("ver_sion", "3"),
            ]
        );
        let samples: Vec<(i64, f64)> = wall
            .samples
            .iter()
            .map(|s| (s.timestamp, s.value))
            .collect();
        assert_eq!(samples, vec![(1000, 17.0), (3000, 18.5)]);
        let ok = &req.timeseries[1];
        assert_eq!(ok.labels[1].value, "inference_ok");
        assert_eq!(
            ok.samples,
            vec![Sample {
                value: 0.0,
                timestamp: 3000
            }]
        );
        let gpu = &req.timeseries[2];
        assert_eq!(
            labels(gpu),
            vec![
                ("__name__", "gpu_util_pct"),
                ("device_id", "jet-1"),
                ("gpu", "0"),
                ("site", "north"),
            ]
        );
        assert_eq!(gpu.samples[0].value, 40.0);
    }

    fn samples(ts: &TimeSeries) -> Vec<(i64, f64)> {
        ts.samples.iter().map(|s| (s.timestamp, s.value)).collect()
    }

    /// The series named `name` in `r` and their labels, samples.
    fn named<'a>(r: &'a WriteRequest, name: &str) -> Vec<&'a TimeSeries> {
        r.timeseries
            .iter()
            .filter(|t| {
                t.labels
                    .iter()
                    .any(|l| l.name == "__name__" && l.value == name)
            })
            .collect()
    }

    fn source_of(ts: &TimeSeries) -> Option<&str> {
        ts.labels
            .iter()
            .find(|l| l.name == SOURCE_LABEL)
            .map(|l| l.value.as_str())
    }

    const T: i64 = 1_764_000_000_000_000_000;

    /// `cpu_usage` `x` and `cpu` `usage_x` are both `cpu_usage_x`: written at the same time,
    /// both values go, as two series; the one seen later carries its source; a later request
    /// holding only that one sends it the same way.
    #[test]
    fn series_whose_names_collide_after_sanitising_are_kept_apart() {
        let a = point("cpu_usage", T, vec![("x", Value::F64(1.0))]);
        let b = point("cpu", T, vec![("usage_x", Value::F64(2.0))]);
        let plain = vec![
            ("__name__", "cpu_usage_x"),
            ("device_id", "jet-1"),
            ("site", "north"),
        ];
        let mut names = Names::new("t");
        let r = request(&[a.clone(), b.clone()], usize::MAX, &mut names).request;
        let got = named(&r, "cpu_usage_x");
        assert_eq!(got.len(), 2, "{r:?}");
        assert_eq!(labels(got[0]), plain);
        assert_eq!(samples(got[0]), vec![(T / 1_000_000, 1.0)]);
        let mut apart = plain.clone();
        apart.insert(2, (SOURCE_LABEL, "cpu,device_id=jet-1,site=north usage_x"));
        assert_eq!(labels(got[1]), apart);
        assert_eq!(samples(got[1]), vec![(T / 1_000_000, 2.0)]);
        assert_eq!(names.collisions(), 1);
        // Alone in a later request, in a later millisecond: still apart, counted once.
        let b2 = point("cpu", T + 1_000_000, vec![("usage_x", Value::F64(3.0))]);
        let r = request(&[b2], usize::MAX, &mut names).request;
        assert_eq!(labels(&r.timeseries[0]), apart);
        let a2 = point("cpu_usage", T + 1_000_000, vec![("x", Value::F64(4.0))]);
        let r = request(&[a2], usize::MAX, &mut names).request;
        assert_eq!(labels(&r.timeseries[0]), plain);
        assert_eq!(names.collisions(), 1);
        // Distinct label sets are never merged, whatever comes first: the whole mapping
        // is one-to-one on what it sends.
        let r = request(&[b, a], usize::MAX, &mut names).request;
        let sets: HashSet<Vec<(&str, &str)>> = r.timeseries.iter().map(labels).collect();
        assert_eq!(sets.len(), 2);
    }

    /// With the store's dictionary, the series created first keeps the plain labels whatever
    /// order the points come in, and a source the dictionary did not hold yet makes it read
    /// again (once per request).
    #[test]
    fn the_dictionary_decides_which_series_keeps_the_plain_labels() {
        let id = vec![("device_id".to_string(), "jet-1".to_string())];
        let s = |k: &str| Arc::new(series(k, &id));
        let (cpu, cpu_usage, cpu_dot) = (s("cpu"), s("cpu_usage"), s("cpu.usage"));
        let loads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let l = loads.clone();
        let (c1, c2, c3) = (cpu.clone(), cpu_usage.clone(), cpu_dot.clone());
        let dict: Dictionary = Box::new(move || {
            let n = l.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // `cpu usage_x` was created first; `cpu.usage x` only after the first read.
            let mut v = vec![(c1.clone(), "usage_x".into()), (c2.clone(), "x".into())];
            if n > 0 {
                v.push((c3.clone(), "x".into()));
            }
            Ok(v)
        });
        let mut names = Names::with_dictionary("t", dict);
        assert_eq!(names.collisions(), 1, "known before anything is sent");
        let mk = |s: &Arc<Series>, f: &str, v: f64| Point {
            series: s.clone(),
            ts: T,
            fields: vec![(f.into(), Value::F64(v))],
        };
        let r = request(
            &[mk(&cpu_usage, "x", 1.0), mk(&cpu, "usage_x", 2.0)],
            usize::MAX,
            &mut names,
        )
        .request;
        assert_eq!(loads.load(std::sync::atomic::Ordering::SeqCst), 1);
        let got = named(&r, "cpu_usage_x");
        assert_eq!(got.len(), 2);
        assert_eq!(
            (source_of(got[0]), samples(got[0])),
            (
                Some("cpu_usage,device_id=jet-1 x"),
                vec![(T / 1_000_000, 1.0)]
            )
        );
        assert_eq!(
            (source_of(got[1]), samples(got[1])),
            (None, vec![(T / 1_000_000, 2.0)])
        );
        // A new series: the dictionary is read again, once for the request.
        let r = request(
            &[mk(&cpu_dot, "x", 3.0), mk(&cpu_dot, "y", 4.0)],
            usize::MAX,
            &mut names,
        )
        .request;
        assert_eq!(loads.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(
            source_of(named(&r, "cpu_usage_x")[0]),
            Some("cpu.usage,device_id=jet-1 x")
        );
        assert_eq!(source_of(named(&r, "cpu_usage_y")[0]), None);
        assert_eq!(names.collisions(), 2);
    }

    /// Tags whose names sanitise to one name are all kept (within a tag set), and tag sets
    /// that differ only in such a name are kept apart (across tag sets).
    #[test]
    fn tags_whose_names_sanitise_alike_are_all_kept_apart() {
        let p = point(
            "t,a.b=1,a_b=2,a-b=3,edgewatch_source=4",
            T,
            vec![("v", Value::F64(1.0))],
        );
        let mut names = Names::new("t");
        let r = request(&[p], usize::MAX, &mut names).request;
        assert_eq!(
            labels(&r.timeseries[0]),
            vec![
                ("__name__", "t_v"),
                ("a_b", "2"),
                ("a_b_2", "3"),
                ("a_b_3", "1"),
                ("device_id", "jet-1"),
                ("edgewatch_source_2", "4"),
                ("site", "north"),
            ]
        );
        assert_eq!(names.collisions(), 1);
        let (x, y) = (
            point("t,a.b=1", T, vec![("v", Value::F64(1.0))]),
            point("t,a_b=1", T, vec![("v", Value::F64(2.0))]),
        );
        let r = request(&[x, y], usize::MAX, &mut names).request;
        assert_eq!(r.timeseries.len(), 2);
        assert_eq!(source_of(&r.timeseries[0]), None);
        assert_eq!(
            source_of(&r.timeseries[1]),
            Some("t,a_b=1,device_id=jet-1,site=north v")
        );
        assert_eq!(samples(&r.timeseries[1]), vec![(T / 1_000_000, 2.0)]);
        assert_eq!(names.collisions(), 2);
    }

    #[test]
    fn a_batch_stops_at_max_bytes_after_at_least_one_point() {
        let points: Vec<Point> = (0..100)
            .map(|i| {
                point(
                    "m,k=v",
                    1_764_000_000_000_000_000 + i * 1_000_000,
                    vec![("v", Value::I64(i))],
                )
            })
            .collect();
        let (_, used, _) = build(&points, 1);
        assert_eq!(used, 1);
        let (req, used, _) = build(&points, 400);
        assert!(used > 1 && used < 100, "{used}");
        // The estimate is an upper bound: the request is under the limit plus one point.
        let len = req.encoded_len();
        assert!((300..400 + 22).contains(&len), "{len}");
        let (req, used, _) = build(&points, usize::MAX);
        assert_eq!((used, req.timeseries[0].samples.len()), (100, 100));
    }

    #[test]
    fn the_body_is_snappy_protobuf_that_decodes_back() {
        let cfg: SinkConfig = toml::from_str(
            "type = \"prometheus_remote_write\"\nname = \"p\"\nurl = \"http://h:1/api/v1/write\"\nusername = \"edge\"\npassword = \"secret\"\n",
        )
        .unwrap();
        let w = RemoteWrite::new(&cfg);
        let auth =
            |c: &SinkConfig| Auth::basic_or_bearer(&c.credentials, c.token.as_ref()).header();
        assert_eq!(auth(&cfg).as_deref(), Some("Basic ZWRnZTpzZWNyZXQ="));
        let points = vec![point("m", 5_000_000, vec![("v", Value::F64(1.5))])];
        let e = w.body(&points, usize::MAX);
        let raw = snap::raw::Decoder::new().decompress_vec(&e.body).unwrap();
        let req = WriteRequest::decode(&raw[..]).unwrap();
        assert_eq!(
            req.timeseries[0].samples,
            vec![Sample {
                value: 1.5,
                timestamp: 5
            }]
        );
        let t: SinkConfig = toml::from_str(
            "type = \"prometheus_remote_write\"\nname = \"p\"\nurl = \"http://h:1/api/v1/write\"\ntoken = \"abc\"\n",
        )
        .unwrap();
        assert_eq!(auth(&t).as_deref(), Some("Bearer abc"));
    }

    /// Bytes on the wire per inference point (4 numeric fields, 5 tags with the identity,
    /// 30/s): remote write (protobuf + snappy) against line protocol + gzip, in batches of
    /// 5,000. Printed with `cargo test --lib wire_bytes -- --nocapture`.
    #[test]
    fn wire_bytes_per_point_against_gzip_line_protocol() {
        use crate::forward::encode::{gzip, line};
        let id = vec![
            ("device_id".to_string(), "jetson-0017".to_string()),
            ("site".to_string(), "plant-3".to_string()),
        ];
        let s = Arc::new(series(
            "inference,model=yolov8n,model_version=3,app=camera",
            &id,
        ));
        let n = 5_000i64;
        let pts: Vec<Point> = (0..n)
            .map(|i| Point {
                series: s.clone(),
                ts: 1_764_000_000_000_000_000 + i * 33_333_333,
                fields: vec![
                    ("wall_ms".into(), Value::F64(18.0 + (i % 37) as f64 * 0.13)),
                    ("gpu_ms".into(), Value::F64(11.0 + (i % 29) as f64 * 0.07)),
                    ("batch_size".into(), Value::I64(4)),
                    ("ok".into(), Value::Bool(true)),
                ],
            })
            .collect();
        let mut lp = Vec::new();
        for p in &pts {
            line(&mut lp, p, false);
        }
        let gz = gzip(&lp).len() as f64 / n as f64;
        let raw = build(&pts, usize::MAX).0.encode_to_vec();
        let sn = snap::raw::Encoder::new().compress_vec(&raw).unwrap().len() as f64 / n as f64;
        println!(
            "per point: line protocol {:.1} B, gzip {gz:.1} B; protobuf {:.1} B, snappy {sn:.1} B",
            lp.len() as f64 / n as f64,
            raw.len() as f64 / n as f64
        );
        // Samples share their series' labels: far under the line protocol text.
        assert!(sn < 40.0 && raw.len() < lp.len(), "{sn}");
    }
}
