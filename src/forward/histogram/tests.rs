use super::*;
use crate::forward::encode::series;
use crate::forward::rollup::sketch_point;
use crate::store::sketch::Sketch;
use crate::store::tiers::NamedRow;
use std::sync::Arc;

const MIN: i64 = 60_000_000_000;
const T0: i64 = 1_764_000_000 * 1_000_000_000;

fn row_point(key: &str, field: &str, bucket: i64, values: &[f64]) -> Point {
    let mut sk = Sketch::new();
    for v in values {
        sk.add(*v);
    }
    let r = NamedRow {
        key: key.into(),
        field: field.into(),
        bucket,
        series_id: 1,
        count: values.len() as i64,
        sum: values.iter().sum(),
        min: 0.0,
        max: 0.0,
        quantiles: None,
    };
    let id = vec![("device_id".to_string(), "jet-1".to_string())];
    sketch_point(&r, &sk, Arc::new(series(key, &id)))
}

fn fields() -> HashSet<String> {
    ["inference.wall_ms".to_string()].into_iter().collect()
}

#[test]
fn sketch_points_read_back() {
    let p = row_point("inference,model=m", "wall_ms", T0, &[0.0, 1.0, 2.0, -3.0]);
    let r = sketch_row(&p).unwrap();
    assert_eq!((r.count, r.zero, r.sum), (4, 1, 0.0));
    assert_eq!(r.pos.len(), 2);
    assert_eq!(r.neg.len(), 1);
    assert_eq!(r.field.as_ref(), "wall_ms");
}

/// Totals grow minute by minute; a first series starts with a zero sample at its first
/// bucket; rows already folded are left out; other fields are not histograms.
#[test]
fn totals_are_cumulative_and_rows_fold_once() {
    let pts = vec![
        row_point("inference,model=m", "wall_ms", T0, &[10.0, 20.0]),
        row_point("inference,model=m", "gpu_ms", T0, &[5.0]),
        row_point("inference,model=m", "wall_ms", T0 + MIN, &[10.0]),
    ];
    let f = fold(&State::default(), &pts, &fields());
    assert_eq!(f.series.len(), 1);
    assert_eq!(f.series[0].0, "inference_wall_ms");
    let counts: Vec<(i64, u64, bool)> = f
        .emits
        .iter()
        .map(|e| (e.ms, e.totals.count(), e.first))
        .collect();
    let ms = T0 / 1_000_000;
    assert_eq!(
        counts,
        vec![
            (ms, 0, true),
            (ms + 60_000, 2, false),
            (ms + 120_000, 3, false)
        ]
    );
    assert_eq!(f.emits[2].totals.sum, 40.0);
    assert!(
        f.emits[2].new_bins.is_empty(),
        "10 was seen a minute before"
    );
    // Folded onto the totals after the batch: the same rows add nothing; a later one adds.
    let mut st = State::default();
    st.series.extend(f.after);
    let again = fold(&st, &pts, &fields());
    assert!(again.emits.is_empty());
    let later = vec![row_point(
        "inference,model=m",
        "wall_ms",
        T0 + 2 * MIN,
        &[30.0],
    )];
    let f = fold(&st, &later, &fields());
    assert_eq!(f.emits.len(), 1);
    assert_eq!(f.emits[0].totals.count(), 4);
    assert!(!f.emits[0].first);
    assert_eq!(f.emits[0].new_bins.len(), 1);
}

/// The native form: schema 8, deltas and spans that give back every bin's count in the
/// bucket holding its value, count = zero + buckets.
#[test]
fn native_histograms_hold_each_bin_in_the_bucket_of_its_value() {
    let mut t = Totals::default();
    let mut sk = Sketch::new();
    for i in 0..1000 {
        let v = 1.0 + (i as f64).powf(1.5) * 0.05;
        sk.add(v);
    }
    sk.add(0.0);
    sk.add(-2.0);
    let (pos, neg, zero) = sk.bins();
    t.zero = zero;
    t.pos = pos.iter().copied().collect();
    t.neg = neg.iter().copied().collect();
    let h = native(&t, 5, ResetHint::No);
    assert_eq!(h.schema, 8);
    assert_eq!(
        h.count,
        Some(super::super::remote_write::proto::histogram::Count::CountInt(1002))
    );
    // Rebuild the buckets from spans and deltas.
    let mut idx = 0i32;
    let mut cnt = 0i64;
    let mut got: Vec<(i32, i64)> = Vec::new();
    let mut d = h.positive_deltas.iter();
    for (n, s) in h.positive_spans.iter().enumerate() {
        idx = if n == 0 { s.offset } else { idx + s.offset };
        for _ in 0..s.length {
            cnt += d.next().unwrap();
            if cnt > 0 {
                got.push((idx, cnt));
            }
            idx += 1;
        }
    }
    assert!(d.next().is_none());
    let want: Vec<(i32, i64)> = pos
        .iter()
        .map(|&(k, c)| (native_index(k), c as i64))
        .collect();
    assert_eq!(got, want);
    // Each bin's value lies in its bucket (2^((i-1)/256), 2^(i/256)].
    for &(k, _) in &pos {
        let i = native_index(k);
        let v = bin_value(k);
        assert!(v > 2f64.powf((i - 1) as f64 / 256.0) && v <= 2f64.powf(i as f64 / 256.0));
    }
    assert_eq!(h.negative_spans.iter().map(|s| s.length).sum::<u32>(), 1);
    // The encoded request decodes back.
    let f = Folded {
        series: vec![("m_f".into(), vec![])],
        emits: vec![Emit {
            series: 0,
            ms: 5,
            totals: t,
            first: false,
            new_bins: vec![],
        }],
        after: HashMap::new(),
    };
    let req = request(&f, HistFormat::Native);
    let back = WriteRequest::decode(&req.encode_to_vec()[..]).unwrap();
    assert_eq!(back, req);
    assert_eq!(back.timeseries[0].labels[0].value, "m_f_hist");
    assert_eq!(back.timeseries[0].histograms[0], h);
}

/// vmrange: one counter per bin with its exact bounds, a new bin starting at 0 a minute
/// earlier, `_count` and `_sum` beside.
#[test]
fn vmrange_counters_per_bin() {
    let pts = vec![
        row_point("inference,model=m", "wall_ms", T0, &[10.0]),
        row_point("inference,model=m", "wall_ms", T0 + MIN, &[10.0, 100.0]),
    ];
    let f = fold(&State::default(), &pts, &fields());
    let req = request(&f, HistFormat::Vmrange);
    let by = |name: &str, range: Option<&str>| -> Vec<(i64, f64)> {
        req.timeseries
            .iter()
            .filter(|t| {
                t.labels
                    .iter()
                    .any(|l| l.name == "__name__" && l.value == name)
                    && range.map_or(true, |r| {
                        t.labels.iter().any(|l| l.name == "vmrange" && l.value == r)
                    })
            })
            .flat_map(|t| t.samples.iter().map(|s| (s.timestamp, s.value)))
            .collect()
    };
    let ms = T0 / 1_000_000;
    assert_eq!(
        by("inference_wall_ms_hist_count", None),
        vec![(ms, 0.0), (ms + 60_000, 1.0), (ms + 120_000, 3.0)]
    );
    let (k10, k100) = (
        (10f64.ln() / crate::store::sketch::bin_bounds(1).1.ln()).ceil() as i32,
        (100f64.ln() / crate::store::sketch::bin_bounds(1).1.ln()).ceil() as i32,
    );
    let r10 = vmrange(k10, 1);
    let (lo, hi) = r10.split_once("...").unwrap();
    let (lo, hi): (f64, f64) = (lo.parse().unwrap(), hi.parse().unwrap());
    assert!(
        lo < 10.0 && 10.0 <= hi * 1.0001 && hi / lo < 1.0102,
        "{r10}"
    );
    assert_eq!(
        by("inference_wall_ms_hist_bucket", Some(&r10)),
        vec![(ms, 0.0), (ms + 60_000, 1.0), (ms + 120_000, 2.0)]
    );
    assert_eq!(
        by("inference_wall_ms_hist_bucket", Some(&vmrange(k100, 1))),
        vec![(ms + 60_000, 0.0), (ms + 120_000, 1.0)]
    );
    assert_eq!(zero_vmrange(), "0...1.000e-9");
}

/// The totals survive a restart through the state file; a corrupt file is an error.
#[test]
fn the_state_file_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let p = state_path(dir.path(), "prom#histograms");
    assert!(p.ends_with("hist-prom_histograms.json"));
    assert_eq!(load(&p).unwrap(), State::default());
    let pts = vec![row_point("inference,model=m", "wall_ms", T0, &[10.0, 0.0])];
    let f = fold(&State::default(), &pts, &fields());
    let mut st = State::default();
    st.series.extend(f.after);
    std::fs::write(&p, serde_json::to_vec(&st).unwrap()).unwrap();
    assert_eq!(load(&p).unwrap(), st);
    std::fs::write(&p, b"{not json").unwrap();
    assert!(load(&p).unwrap_err().contains("hist-prom_histograms.json"));
}

/// Bytes on the wire per series and hour (snappy-compressed requests, one a minute as the
/// sink sends them once caught up): 30 inferences/s with a long-tailed latency, for both
/// formats. Printed with `cargo test --lib histogram_wire_bytes -- --nocapture`.
#[test]
fn histogram_wire_bytes_per_series_and_hour() {
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    for format in [HistFormat::Native, HistFormat::Vmrange] {
        let mut st = State::default();
        let (mut bytes, mut series) = (0usize, 0usize);
        for m in 0..60 {
            let vals: Vec<f64> = (0..1800)
                .map(|_| {
                    let u = next();
                    if next() < 0.02 {
                        60.0 + 400.0 * u
                    } else {
                        15.0 + 10.0 * u * u
                    }
                })
                .collect();
            let pts = vec![row_point(
                "inference,model=yolov8n,app=camera",
                "wall_ms",
                T0 + m * MIN,
                &vals,
            )];
            let f = fold(&st, &pts, &fields());
            let req = request(&f, format);
            series = req.timeseries.len();
            let raw = req.encode_to_vec();
            bytes += snap::raw::Encoder::new().compress_vec(&raw).unwrap().len();
            st.series.extend(f.after);
        }
        println!(
            "{format:?}: {bytes} B/h per histogram series, {series} series in the last request"
        );
        // A native histogram is one series; vmrange one counter per non-empty bin.
        match format {
            HistFormat::Native => assert_eq!(series, 1),
            HistFormat::Vmrange => assert!(series > 100, "{series}"),
        }
        assert!(bytes > 0);
    }
}

/// InfluxDB gets each minute's own bins under `<measurement>_hist` with a `hist_field` tag;
/// other fields are left out; the merged bins answer as one sketch fed every value.
#[test]
fn influx_points_carry_one_minutes_bins_and_merge_like_one_sketch() {
    let a = [10.0, 20.0, 30.0, 0.0];
    let b = [40.0, 50.0];
    let p = row_point("inference,model=m", "wall_ms", T0, &a);
    let q = influx_point(&p, &fields()).unwrap();
    assert_eq!(q.series.measurement, "inference_hist");
    assert!(
        q.series.prefix.contains("hist_field=wall_ms"),
        "{}",
        q.series.prefix
    );
    assert_eq!(q.ts, T0);
    let mut out = Vec::new();
    crate::forward::encode::line(&mut out, &q, true);
    let line = String::from_utf8(out).unwrap();
    assert!(
        line.starts_with(
            "inference_hist,device_id=jet-1,hist_field=wall_ms,model=m count=4i,sum=60,zero=1i,p"
        ),
        "{line}"
    );
    let other = row_point("inference,model=m", "gpu_ms", T0, &a);
    assert!(influx_point(&other, &fields()).is_none());
    // Merge the two minutes' bins as InfluxQL's sum() would, and ask for quantiles.
    let mut pos = BTreeMap::new();
    let mut zero = 0;
    let mut sk = Sketch::new();
    for (vals, t) in [(&a[..], T0), (&b[..], T0 + MIN)] {
        let r = sketch_row(&row_point("inference,model=m", "wall_ms", t, vals)).unwrap();
        for (k, c) in r.pos {
            *pos.entry(k).or_insert(0) += c;
        }
        zero += r.zero;
        for v in vals {
            sk.add(*v);
        }
    }
    for q in [0.0, 0.3, 0.5, 0.9, 0.99] {
        let got = bins_quantile(&pos, &BTreeMap::new(), zero, q);
        // The sketch clamps to its exact min/max; bins answer with the bin's value.
        let want = sk.quantile(q).unwrap();
        assert!(
            got.is_some_and(|g| (g - want).abs() <= want.abs() * 0.011),
            "{q}: {got:?} {want}"
        );
    }
    assert_eq!(
        bins_quantile(&BTreeMap::new(), &BTreeMap::new(), 0, 0.5),
        None
    );
}

/// The totals cannot be written (no such directory): `acked` says so with the path, the
/// totals stay as they were, and the same batch encodes the same request again (the loop
/// keeps the cursor and resends it). Once writable, it is taken.
#[test]
fn totals_that_cannot_be_written_keep_the_batch() {
    let cfg: SinkConfig = toml::from_str(
        "type = \"prometheus_remote_write\"\nname = \"p\"\nurl = \"http://127.0.0.1:1/api/v1/write\"\nhistograms = true\n",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("gone").join("hist-p.json");
    let w = HistWire::new(&cfg, missing.clone(), State::default());
    let pts = vec![row_point("inference,model=m", "wall_ms", T0, &[10.0, 20.0])];
    let before = w.body(&pts, usize::MAX).body;
    let e = w.acked(&pts).unwrap_err();
    assert!(e.contains("gone"), "{e}");
    assert_eq!(*w.state.lock().unwrap(), State::default());
    assert_eq!(
        w.body(&pts, usize::MAX).body,
        before,
        "the same samples go again"
    );
    std::fs::create_dir_all(missing.parent().unwrap()).unwrap();
    w.acked(&pts).unwrap();
    assert_eq!(load(&missing).unwrap(), *w.state.lock().unwrap());
    assert_eq!(w.state.lock().unwrap().series.len(), 1);
    // Folded: the batch adds nothing more.
    let raw = snap::raw::Decoder::new()
        .decompress_vec(&w.body(&pts, usize::MAX).body)
        .unwrap();
    assert!(WriteRequest::decode(&raw[..])
        .unwrap()
        .timeseries
        .is_empty());
}
