//! `dashboards/influxdb-fleet.json` against a real InfluxDB fed by real agents: a Jetson
//! (the Orin Nano fixture tree and a tegrastats replay), a GPU server (NVML through the
//! stand-in library), both with `[health]` on and inference points written through
//! `/write`. Grafana cannot run here, so the test does what Grafana would: it takes every
//! template variable's and every panel's InfluxQL from the JSON, substitutes the macros
//! (`$timeFilter`, `$__interval`, `$__interval_ms`) and the variables as Grafana formats a
//! multi-value selection (`(a|b)`; "All" is `.*`), runs each against the InfluxDB, and
//! requires that it parses and returns rows.

use std::path::Path;
use std::time::Duration;

use serde_json::Value as J;

use crate::support::peers::{influx_create_db, require, Peer};
use crate::support::{free_port, jetson_fixture, post, wait_for, Agent, Influxd};

/// A rule the GPU server's inferences fire at once: its incident is the `Incidents`
/// annotation's data (an `edgewatch_incident` point).
const SLOW_INFERENCE: &str = "[alerts]\ninterval = \"1s\"\nbuiltin = false\n[[alert]]\n\
     name = \"SlowInference\"\nmeasurement = \"inference\"\nfield = \"wall_ms\"\nagg = \"max\"\n\
     window = \"1m\"\nop = \">\"\nthreshold = 5.0\nfor = \"0s\"\n";

fn dashboard() -> J {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/influxdb-fleet.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Every panel (rows' nested panels too), in order.
fn panels(d: &J) -> Vec<J> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().into_iter().flatten().cloned());
        } else {
            out.push(p.clone());
        }
    }
    out
}

/// A value as Grafana writes it into an InfluxQL regex.
fn regex_escape(v: &str) -> String {
    let mut s = String::new();
    for c in v.chars() {
        if "\\^$.|?*+()[]{}/".contains(c) {
            s.push('\\');
        }
        s.push(c);
    }
    s
}

/// The query with Grafana's macros and the variables substituted (`vars`: name -> the
/// selected values; absent means "All").
fn interpolate(q: &str, vars: &[(&str, Vec<String>)]) -> String {
    let mut q = q
        .replace("$timeFilter", "time > now() - 1h")
        .replace("$__interval_ms", "1000")
        .replace("$__interval", "1s");
    for name in ["device_id", "model", "module", "arch"] {
        let value = match vars.iter().find(|(n, _)| *n == name) {
            Some((_, vals)) => format!(
                "({})",
                vals.iter()
                    .map(|v| regex_escape(v))
                    .collect::<Vec<_>>()
                    .join("|")
            ),
            None => ".*".to_string(),
        };
        q = q.replace(&format!("${name}"), &value);
    }
    let left = q
        .match_indices('$')
        .any(|(i, _)| q[i + 1..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'));
    assert!(!left, "a macro or variable left: {q}");
    q
}

/// Runs `q`: Err with InfluxDB's message when it does not parse or run; Ok(rows with at
/// least one non-null value).
fn run(influx: &Influxd, q: &str) -> Result<usize, String> {
    let r = influx.query("edge", q);
    let res = &r["results"][0];
    if let Some(e) = res["error"].as_str().or(r["error"].as_str()) {
        return Err(e.to_string());
    }
    let mut rows = 0;
    for s in res["series"].as_array().into_iter().flatten() {
        for v in s["values"].as_array().into_iter().flatten() {
            let vals = v.as_array().unwrap();
            // SHOW answers have no time column; SELECT rows need a value besides the time.
            let skip = usize::from(s["columns"][0] == "time");
            if vals.iter().skip(skip).any(|x| !x.is_null()) {
                rows += 1;
            }
        }
    }
    Ok(rows)
}

/// (what, query) for every template variable, annotation and panel target.
fn queries(d: &J) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for v in d["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            out.push((
                format!("variable {}", v["name"]),
                v["query"].as_str().unwrap().to_string(),
            ));
        }
    }
    for a in d["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = a["query"].as_str() {
            out.push((format!("annotation {}", a["name"]), q.to_string()));
        }
    }
    for p in panels(d) {
        for t in p["targets"].as_array().unwrap() {
            out.push((
                format!("panel {} {}", p["title"], t["refId"]),
                t["query"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// The tags of the values a SHOW TAG VALUES answers.
fn tag_values(influx: &Influxd, q: &str) -> Vec<String> {
    let r = influx.query("edge", q);
    let mut out: Vec<String> = r["results"][0]["series"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["values"].as_array().unwrap().clone())
        .map(|v| v[1].as_str().unwrap().to_string())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_fleet_dashboard_is_well_formed() {
    let d = dashboard();
    assert_eq!(d["uid"], "edgewatch-fleet-influxql");
    let vars: Vec<&J> = d["templating"]["list"].as_array().unwrap().iter().collect();
    assert!(
        vars.iter().any(|v| v["type"] == "datasource"
            && v["query"] == "influxdb"
            && v["name"] == "datasource"),
        "a datasource variable of type influxdb"
    );
    for name in ["device_id", "model", "module", "arch"] {
        let v = vars
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("variable {name}"));
        assert!(
            v["query"].as_str().unwrap().starts_with("SHOW TAG VALUES"),
            "{v}"
        );
        assert_eq!(v["allValue"], ".*", "{name}");
    }
    let ps = panels(&d);
    assert!(ps.len() >= 20, "{} panels", ps.len());
    let mut ids = std::collections::HashSet::new();
    for p in &ps {
        assert!(
            ids.insert(p["id"].as_i64().unwrap()),
            "duplicate id {}",
            p["id"]
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["type"], "influxdb", "{}", p["title"]);
            assert_eq!(t["rawQuery"], true, "{}", p["title"]);
            let q = t["query"].as_str().unwrap();
            assert!(
                q.contains("$timeFilter") && q.contains("/^$device_id$/"),
                "{}: every panel follows the time range and the device selection: {q}",
                p["title"]
            );
        }
    }
}

#[test]
fn every_fleet_dashboard_query_runs_and_returns_rows_on_real_agents_data() {
    if !require(Peer::Influxdb) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let influx = Influxd::start(&dir.path().join("influx"));
    influx_create_db(&influx, "edge");
    let offline = free_port();
    let sinks = format!(
        "[[sink]]\ntype = \"influxdb\"\nname = \"fleet\"\nurl = \"http://{}\"\nversion = 1\n\
         database = \"edge\"\nmax_delay = \"100ms\"\n\
         [[sink]]\ntype = \"influxdb\"\nname = \"offline\"\nurl = \"http://127.0.0.1:{offline}\"\n\
         version = 1\ndatabase = \"x\"\n",
        influx.http
    );
    let health = "[health]\nenabled = true\ninterval = \"200ms\"\n[rollup]\nenabled = false\n";

    // A Jetson: identity and throttling from the Orin Nano tree, tegrastats (rails included)
    // replayed.
    let jdir = dir.path().join("jetson");
    std::fs::create_dir_all(&jdir).unwrap();
    let root = jetson_fixture(&jdir, "orin-nano-jp6");
    let replay =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jetson/tegrastats-orin-nano.log");
    let jetson = Agent::start_with_env(
        &jdir,
        &format!(
            "{health}[host]\nenabled = false\n[nvml]\nenabled = false\n\
             [jetson]\nroot = \"{}\"\ninterval = \"100ms\"\n\
             [tegrastats]\nreplay = \"{}\"\ninterval = \"100ms\"\n{sinks}",
            root.display(),
            replay.display()
        ),
        &[("EDGEWATCH_DEVICE_ID", "jetson-a")],
    );

    // A GPU server: NVML through the stand-in library, with power, energy and throttling.
    let gdir = dir.path().join("gpu");
    std::fs::create_dir_all(&gdir).unwrap();
    let lib = crate::nvml_stub::new_lib();
    let scenario = gdir.join("scenario.txt");
    std::fs::write(
        &scenario,
        "driver 535.104.05\ncuda 12020\ngpus 1\n\
         gpu 0 name NVIDIA A2\ngpu 0 uuid GPU-a\ngpu 0 arch 7\ngpu 0 cc 8 6\n\
         gpu 0 utilization 60 20\ngpu 0 temperature 71\ngpu 0 power 48000\n\
         gpu 0 energy 123456789\ngpu 0 throttle_reasons 36\n",
    )
    .unwrap();
    let gpu = Agent::start_with_env(
        &gdir,
        &format!(
            "{health}[host]\nenabled = false\n[tegrastats]\nenabled = false\n[jetson]\nenabled = false\n\
             [nvml]\ninterval = \"200ms\"\n{SLOW_INFERENCE}{sinks}"
        ),
        &[
            ("EDGEWATCH_DEVICE_ID", "gpu-b"),
            ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
            ("NVML_STUB_SCENARIO", scenario.to_str().unwrap()),
        ],
    );

    // Inferences on both, the last 60 s, one in 50 failed.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    for (agent, models) in [
        (&jetson, ["yolov8n", "resnet50"]),
        (&gpu, ["llama3-8b", "resnet50"]),
    ] {
        let mut body = String::new();
        for k in 0..600i64 {
            let model = models[(k % 2) as usize];
            let ok = k % 50 != 7;
            body.push_str(&format!(
                "inference,model={model},app=camera wall_ms={},gpu_ms={},ok={ok} {}\n",
                10.0 + (k % 13) as f64,
                6.0 + (k % 7) as f64,
                now - 60_000_000_000 + k * 100_000_000
            ));
        }
        let (code, resp) = post(&agent.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{resp}");
    }

    let d = dashboard();
    let all = queries(&d);
    let mut oc = 0u64;
    let mut energy = 123_456_789u64;
    let missing = wait_for(Duration::from_secs(25), || {
        // Keep the Jetson throttling (an over-current counter that grows) and the GPU's
        // energy counter moving while the data comes in.
        oc += 1;
        energy += 250_000;
        std::fs::write(
            root.join("sys/class/hwmon/hwmon3/oc3_event_cnt"),
            format!("{oc}\n"),
        )
        .unwrap();
        let text = std::fs::read_to_string(&scenario).unwrap();
        let text: String = text
            .lines()
            .map(|l| {
                if l.starts_with("gpu 0 energy ") {
                    format!("gpu 0 energy {energy}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(scenario.with_extension("new"), text).unwrap();
        std::fs::rename(scenario.with_extension("new"), &scenario).unwrap();
        let empty: Vec<String> = all
            .iter()
            .filter(|(_, q)| !matches!(run(&influx, &interpolate(q, &[])), Ok(n) if n > 0))
            .map(|(w, _)| w.clone())
            .collect();
        empty.is_empty().then_some(())
    });
    if missing.is_none() {
        let report: Vec<String> = all
            .iter()
            .map(|(w, q)| {
                let q = interpolate(q, &[]);
                format!("{w}: {:?}\n    {q}", run(&influx, &q))
            })
            .filter(|l| !l.contains(": Ok(") || l.contains(": Ok(0)"))
            .collect();
        panic!(
            "queries without rows or in error:\n{}\njetson agent:\n{}\ngpu agent:\n{}",
            report.join("\n"),
            jetson.log_text(),
            gpu.log_text()
        );
    }

    // The variables chain as documented: a module narrows the devices to the Jetsons of
    // that module, an architecture to the GPU servers of that architecture, and the models
    // follow the devices.
    let var = |name: &str| -> String {
        d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap()["query"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let modules = tag_values(&influx, &interpolate(&var("module"), &[]));
    assert_eq!(
        modules,
        ["NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"]
    );
    let archs = tag_values(&influx, &interpolate(&var("arch"), &[]));
    assert_eq!(archs, ["Ampere"]);
    let devices =
        |vars: &[(&str, Vec<String>)]| tag_values(&influx, &interpolate(&var("device_id"), vars));
    assert_eq!(devices(&[]), ["gpu-b", "jetson-a"]);
    assert_eq!(devices(&[("module", modules.clone())]), ["jetson-a"]);
    assert_eq!(devices(&[("arch", archs.clone())]), ["gpu-b"]);
    let models = |dev: &str| {
        tag_values(
            &influx,
            &interpolate(&var("model"), &[("device_id", vec![dev.to_string()])]),
        )
    };
    assert_eq!(models("jetson-a"), ["resnet50", "yolov8n"]);
    assert_eq!(models("gpu-b"), ["llama3-8b", "resnet50"]);

    // Every query also runs with one device and one model selected (parses; rows where the
    // device has that kind of data).
    for dev in ["jetson-a", "gpu-b"] {
        for (w, q) in &all {
            let q = interpolate(
                q,
                &[
                    ("device_id", vec![dev.to_string()]),
                    ("model", vec!["resnet50".to_string()]),
                ],
            );
            assert!(
                run(&influx, &q).is_ok(),
                "{w} for {dev}: {:?}\n{q}",
                run(&influx, &q)
            );
        }
    }
    // The inventory: one row per device with its identity.
    let inv = interpolate(
        &all.iter().find(|(w, _)| w.contains("Inventory")).unwrap().1,
        &[],
    );
    // The GPU server reports once NVML listed its GPUs (2 s after start).
    let r = wait_for(Duration::from_secs(15), || {
        let r = influx.query("edge", &inv);
        let n = r["results"][0]["series"].as_array().map_or(0, |a| a.len());
        (n >= 2).then_some(r)
    })
    .unwrap_or_else(|| panic!("{}", influx.query("edge", &inv)));
    let rows: Vec<&J> = r["results"][0]["series"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    let tags = |dev: &str| {
        rows.iter()
            .find(|s| s["tags"]["device_id"] == dev)
            .map(|s| s["tags"].clone())
            .unwrap_or_else(|| panic!("no inventory row of {dev}: {r}"))
    };
    let j = tags("jetson-a");
    assert!(j["module"].as_str().unwrap().contains("Orin Nano"), "{j}");
    assert_eq!(j["version"], env!("CARGO_PKG_VERSION"), "{j}");
    assert_eq!(j["config_sha256"].as_str().unwrap().len(), 64, "{j}");
    assert_eq!(tags("gpu-b")["gpu_names"], "NVIDIA A2", "{r}");
    let p99 = interpolate(
        &all.iter()
            .find(|(w, _)| w.contains("p99 wall time per device"))
            .unwrap()
            .1,
        &[("device_id", vec!["gpu-b".into()])],
    );
    let r = influx.query("edge", &p99);
    let tags: Vec<&J> = r["results"][0]["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["tags"]["device_id"])
        .collect();
    assert!(
        !tags.is_empty() && tags.iter().all(|t| *t == "gpu-b"),
        "{r}"
    );
}
