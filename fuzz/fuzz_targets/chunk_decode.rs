//! Fuzzes the chunk decoder: any bytes, as a chunk of either format, must decode to points
//! or to an error, never panic; what decodes must re-encode to the same points.
#![no_main]

use edgewatch::store::codec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ts_min = 1_760_000_000_000_000_000i64;
    let mut points = Vec::new();
    if codec::decode_points(data, ts_min, |t, vals| {
        points.push((t, std::mem::take(vals)))
    })
    .is_ok()
    {
        let mut enc = codec::ChunkEncoder::new();
        for (t, vals) in &points {
            enc.push(*t, vals.iter().map(|(s, v)| (*s, v)));
        }
        if let Some(e) = enc.finish() {
            let mut again = Vec::new();
            codec::decode_points(&e.data, e.ts_min, |t, vals| {
                again.push((t, std::mem::take(vals)))
            })
            .expect("a chunk the encoder wrote decodes");
            assert_eq!(again.len(), points.len());
        }
    }
    let _ = codec::retime_chunk(data, ts_min, |t| t.wrapping_add(3_600_000_000_000));
});
