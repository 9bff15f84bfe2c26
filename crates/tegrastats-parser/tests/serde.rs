//! The JSON shape produced with the `serde` feature.
#![cfg(feature = "serde")]

mod common;

use serde_json::{json, Value};
use tegrastats_parser::{parse_line, Sample};

fn to_json(line: &str) -> Value {
    serde_json::to_value(parse_line(line).unwrap()).unwrap()
}

#[test]
fn exact_json_for_a_tx2_line() {
    // Row 22: TX2 with offline cores, rails without a unit.
    let got = to_json(common::line(22));
    let expected = json!({
        "timestamp": null,
        "ram": {"used_mb": 1345.0, "total_mb": 7829.0, "lfb_blocks": 1290, "lfb_block_mb": 4.0},
        "swap": {"used_mb": 0.0, "total_mb": 512.0, "cached_mb": 0.0},
        "cpus": [{"load_pct": 2, "freq_mhz": 345}, null, null, null, null, null],
        "emc": {"load_pct": 13, "freq_mhz": 40},
        "gr3d": {"load_pct": 0, "freq_mhz": 114},
        "engines": {"APE": {"freq_mhz": 150}},
        "temps_c": {
            "BCPU": 35.0, "MCPU": 35.0, "GPU": 41.0, "PLL": 35.0, "AO": 35.5,
            "Tboard": 35.0, "Tdiode": 36.0, "PMIC": 100.0, "thermal": 35.5
        },
        "power_mw": {
            "VDD_IN": {"current": 2003, "average": 2658},
            "VDD_CPU": {"current": 320, "average": 518},
            "VDD_GPU": {"current": 400, "average": 735},
            "VDD_SOC": {"current": 400, "average": 415},
            "VDD_WIFI": {"current": 0, "average": 0},
            "VDD_DDR": {"current": 240, "average": 348}
        }
    });
    assert_eq!(got, expected);
}

#[test]
fn exact_json_for_jetpack_7_2() {
    // Row 1: temp/temp, three-value rails, per-GPC clocks, off engines.
    let got = to_json(common::line(1));
    assert_eq!(got["timestamp"], json!("07-25-2026 09:08:28"));
    assert_eq!(got["ram"]["lfb_block_mb"], json!(2.0));
    assert!(got.get("swap").is_none());
    assert_eq!(
        got["gr3d"],
        json!({"load_pct": 12, "freq_mhz": [1300, 1300]})
    );
    assert_eq!(got["engines"]["NVENC0"], json!({"off": true}));
    assert_eq!(got["engines"]["APE"], json!({"freq_mhz": 174}));
    assert_eq!(got["temps_c"]["cpu"], json!(52.968));
    assert_eq!(got["temps_peak_c"]["cpu"], json!(52.968));
    assert_eq!(
        got["power_mw"]["VIN_SYS_5V0"],
        json!({"current": 5500, "average": 5500, "peak": 5500})
    );
    assert_eq!(got["cpus"].as_array().map(Vec::len), Some(12));
    assert!(got.get("unknown").is_none());
}

#[test]
fn json_for_sentinels_duplicates_and_thor() {
    let orin = to_json(common::line(52));
    assert_eq!(orin["invalid_temps"], json!(["CV0", "CV1", "CV2"]));
    assert!(orin["temps_c"].get("CV0").is_none());
    assert_eq!(
        orin["power_mw"]["NC#2"],
        json!({"current": 0, "average": 0})
    );
    assert_eq!(
        orin["engines"]["GR3D2_FREQ"],
        json!({"load_pct": 0, "freq_mhz": 114})
    );

    let thor = to_json(common::line(10));
    assert_eq!(thor["gr3d"], json!({"freq_mhz": [0, 0, 0]}));
    assert_eq!(thor["engines"]["NVENC0_FREQ"], json!({"freq_mhz": 0}));

    let tx2 = to_json(common::line(5));
    assert_eq!(tx2["ram"]["lfb_block_mb"], json!(0.5));
    assert_eq!(tx2["mts"], json!({"fg_pct": 0, "bg_pct": 0}));

    let nano = to_json(common::line(4));
    assert_eq!(nano["iram"]["lfb_mb"], json!(252.0 / 1024.0));

    let tk1 = to_json(common::line(43));
    assert_eq!(tk1["edp_limit_mhz"], json!(0));
    assert_eq!(tk1["cpus"][0], json!({"load_pct": 25, "freq_mhz": 2218}));
}

#[test]
fn top_level_keys_are_from_the_documented_set() {
    const KEYS: &[&str] = &[
        "timestamp",
        "ram",
        "swap",
        "iram",
        "cpus",
        "emc",
        "gr3d",
        "mts",
        "edp_limit_mhz",
        "engines",
        "temps_c",
        "temps_peak_c",
        "invalid_temps",
        "power_mw",
        "unknown",
    ];
    for f in common::fixtures() {
        let v = to_json(f.line);
        let obj = v.as_object().unwrap();
        assert!(obj.contains_key("timestamp"), "row {}", f.id);
        for key in obj.keys() {
            assert!(
                KEYS.contains(&key.as_str()),
                "row {}: unexpected key {key}",
                f.id
            );
        }
    }
}

#[test]
fn unknown_tokens_are_serialized() {
    let v = to_json("RAM 1/2MB (lfb 1x2MB) CPU [1%@2] FOO@bar ???");
    assert_eq!(v["unknown"], json!(["FOO@bar", "???"]));
}

#[test]
fn round_trip_every_fixture() {
    for f in common::fixtures() {
        let sample = parse_line(f.line).unwrap();
        let text = serde_json::to_string(&sample).unwrap();
        let back: Sample = serde_json::from_str(&text).unwrap();
        assert_eq!(back, sample, "row {}", f.id);
    }
    // Missing keys deserialize to defaults.
    let empty: Sample = serde_json::from_str("{}").unwrap();
    assert_eq!(empty, Sample::default());
}
