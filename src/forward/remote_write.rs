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
//! exemplars or histograms, and never reorders or drops numeric values otherwise.

use std::collections::HashMap;

use prost::Message as _;
use tokio_util::sync::CancellationToken;

use super::encode::{Point, Series};
use super::influx::{run_http, Encoded, Wire};
use super::{SinkConfig, SinkCtx};
use crate::deliver::{Auth, HttpPeer, Outcome, Peer};
use crate::model::Value;

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

/// A point's tags as labels (without `__name__`): sanitised names, empty values left out, the
/// first of two tags that sanitise to one name kept; sorted by name.
fn tag_labels(series: &Series) -> Vec<Label> {
    let mut out: Vec<Label> = Vec::with_capacity(series.tags.len() + 1);
    for (k, v) in &series.tags {
        if v.is_empty() {
            continue;
        }
        let name = label_name(k);
        if out.iter().any(|l| l.name == name) {
            continue;
        }
        out.push(Label {
            name,
            value: v.clone(),
        });
    }
    out
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

/// The `WriteRequest` of `points`, stopping after the point that takes the (uncompressed)
/// request to `max_bytes` or more (at least one point): the request, how many points it
/// holds, and the string values skipped in them.
pub fn request(points: &[Point], max_bytes: usize) -> (WriteRequest, usize, i64) {
    // Series by (tag set, field); a tag set is named by its line-protocol prefix.
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    let mut labels_of: HashMap<&str, Vec<Label>> = HashMap::new();
    let mut series: Vec<TimeSeries> = Vec::new();
    let mut size = 0usize;
    let mut skipped = 0i64;
    let mut used = 0usize;
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
                    let tags = labels_of
                        .entry(key)
                        .or_insert_with(|| tag_labels(&p.series));
                    let mut labels = Vec::with_capacity(tags.len() + 1);
                    labels.push(Label {
                        name: "__name__".into(),
                        value: metric_name(&format!("{}_{field}", p.series.measurement)),
                    });
                    labels.extend(tags.iter().cloned());
                    labels.sort_by(|a, b| a.name.cmp(&b.name));
                    size += labels
                        .iter()
                        .map(|l| field_len(l.encoded_len()))
                        .sum::<usize>()
                        + 4;
                    series.push(TimeSeries {
                        labels,
                        samples: Vec::new(),
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
    (WriteRequest { timeseries: series }, used, skipped)
}

/// Remote write to one receiver.
struct RemoteWrite {
    name: String,
    peer: HttpPeer,
}

impl RemoteWrite {
    fn new(cfg: &SinkConfig) -> RemoteWrite {
        let auth = Auth::basic_or_bearer(
            cfg.username.as_ref(),
            cfg.password.as_ref(),
            cfg.token.as_ref(),
        );
        let headers = cfg
            .headers
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.expose()));
        RemoteWrite {
            name: cfg.name.clone(),
            peer: HttpPeer::new(
                Peer::Sink,
                cfg.url.clone(),
                cfg.retry.timeout.0,
                &auth,
                headers,
            ),
        }
    }
}

impl Wire for RemoteWrite {
    fn kind(&self) -> &'static str {
        "prometheus_remote_write"
    }

    fn body(&self, points: &[Point], max_bytes: usize) -> Encoded {
        let (req, used, skipped_strings) = request(points, max_bytes);
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
    let wire = RemoteWrite::new(&ctx.cfg);
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
        let (req, used, skipped) = request(&points, usize::MAX);
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
        let (_, used, _) = request(&points, 1);
        assert_eq!(used, 1);
        let (req, used, _) = request(&points, 400);
        assert!(used > 1 && used < 100, "{used}");
        // The estimate is an upper bound: the request is under the limit plus one point.
        let len = req.encoded_len();
        assert!((300..400 + 22).contains(&len), "{len}");
        let (req, used, _) = request(&points, usize::MAX);
        assert_eq!((used, req.timeseries[0].samples.len()), (100, 100));
    }

    #[test]
    fn the_body_is_snappy_protobuf_that_decodes_back() {
        let cfg: SinkConfig = toml::from_str(
            "type = \"prometheus_remote_write\"\nname = \"p\"\nurl = \"http://h:1/api/v1/write\"\nusername = \"edge\"\npassword = \"secret\"\n",
        )
        .unwrap();
        let w = RemoteWrite::new(&cfg);
        let auth = |c: &SinkConfig| {
            Auth::basic_or_bearer(c.username.as_ref(), c.password.as_ref(), c.token.as_ref())
                .header()
        };
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
        let raw = request(&pts, usize::MAX).0.encode_to_vec();
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
