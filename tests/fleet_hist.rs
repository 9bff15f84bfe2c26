//! Fleet-true percentiles: ten real agents with different latency distributions (long tails,
//! one with very few inferences) send their 1-minute sketches as histograms (`histograms =
//! true`) to a real Prometheus (native histograms) and a real VictoriaMetrics (`vmrange`),
//! live and, through a second pair of stores that only comes up after every minute is
//! final, as a backlog drain. The fleet p50 and p99 over ten minutes from each store's
//! `histogram_quantile` are within 2 % of the exact value computed here from every raw
//! point sent. A Prometheus without `--enable-feature=native-histograms` pauses the
//! histogram sink with the fix in its status, keeps the data, and takes it once restarted
//! with the flag.

use std::time::Duration;

use crate::support::peers::{
    influx_create_db, require, sink_status, Peer, Prometheus, VictoriaMetrics,
};
use crate::support::{bin, free_port, post, wait_for, Agent, Influxd};

const MIN: i64 = 60_000_000_000;
/// Minutes of data each device holds.
const MINUTES: i64 = 10;

/// Collectors off; the rollup job every second, a minute final 5 s after its end.
const ROLLING: &str =
    "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n\
     [rollup]\nenabled = true\ninterval = \"1s\"\nlateness = \"5s\"\n";

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// A small deterministic generator (xorshift), uniform in [0, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Device `i`'s latencies (ms) for one minute: devices 0-3 a narrow body around 12-30 ms,
/// 4-7 the same with a 5 % tail from 80 to 600 ms, 8 a wide uniform 5-60 ms, 9 only three
/// inferences a minute.
fn minute_values(i: usize, rng: &mut Rng) -> Vec<f64> {
    let n = if i == 9 { 3 } else { 300 };
    (0..n)
        .map(|_| {
            let u = rng.next();
            match i {
                0..=3 => 12.0 + 3.0 * i as f64 + 15.0 * u * u,
                4..=7 if rng.next() < 0.05 => 80.0 + 520.0 * u,
                4..=7 => 14.0 + 10.0 * u,
                8 => 5.0 + 55.0 * u,
                _ => 40.0 + 20.0 * u,
            }
        })
        .collect()
}

/// Writes device `i`'s ten minutes from `m0` through the agent's `/write`, and a later point
/// that makes every one of them final; returns the latencies written.
fn write_minutes(a: &Agent, i: usize, m0: i64) -> Vec<f64> {
    let mut all = Vec::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((i as u64 + 1) * 0x1000_0001));
    let mut body = String::new();
    for m in 0..MINUTES {
        let vals = minute_values(i, &mut rng);
        let step = MIN / vals.len() as i64;
        for (j, v) in vals.iter().enumerate() {
            let t = m0 + m * MIN + j as i64 * step;
            body.push_str(&format!("inference,model=yolov8n wall_ms={v} {t}\n"));
        }
        all.extend(vals);
    }
    // A later point moves the 1-minute tier's watermark past the window's lateness.
    body.push_str(&format!(
        "tick v=1i {}\n",
        m0 + MINUTES * MIN + 30_000_000_000
    ));
    let (code, resp) = post(&a.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
    assert_eq!(code, 204, "{resp}");
    all
}

/// The exact `q`-quantile of `v` (sorted): the nearest-rank order statistic.
fn exact(v: &[f64], q: f64) -> f64 {
    let r = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[r - 1]
}

/// An instant query's single value (`None` while empty).
fn instant(base: &str, q: &str, at_s: i64) -> Option<f64> {
    let r = ureq::get(&format!("{base}/api/v1/query"))
        .query("query", q)
        .query("time", &at_s.to_string())
        .call()
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&r.into_string().ok()?).ok()?;
    assert_eq!(v["status"], "success", "{q}: {v}");
    v["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
}

fn sink(name: &str, url: &str, format: &str) -> String {
    format!(
        "[[sink]]\ntype = \"prometheus_remote_write\"\nname = \"{name}\"\nurl = \"{url}\"\n\
         forward = \"rollup:1m\"\nmax_backoff = \"1s\"\nreconnect_jitter = \"0s\"\n\
         histograms = true\nhistogram_format = \"{format}\"\n"
    )
}

/// Every agent's histogram sink `name` has sent the window's last minute.
fn drained(agents: &[Agent], name: &str, last_bucket: i64) -> bool {
    agents.iter().all(|a| {
        let s = sink_status(a, &format!("{name}#histograms"));
        s["rollup_cursor_ns"].as_i64() == Some(last_bucket)
    })
}

/// Fleet p50/p99 of `inference_wall_ms` from a store, within 2 % of `values`' exact ones.
fn check_quantiles(what: &str, base: &str, vmrange: bool, at_s: i64, values: &[f64]) {
    for q in [0.5, 0.99] {
        let query = if vmrange {
            format!("histogram_quantile({q}, sum(increase(inference_wall_ms_hist_bucket[{MINUTES}m])) by (vmrange))")
        } else {
            format!("histogram_quantile({q}, sum(rate(inference_wall_ms_hist[{MINUTES}m])))")
        };
        let got =
            instant(base, &query, at_s).unwrap_or_else(|| panic!("{what}: {query}: no answer"));
        let want = exact(values, q);
        let err = (got - want).abs() / want;
        println!(
            "{what} q={q}: store {got:.3} exact {want:.3} error {:.3} %",
            err * 100.0
        );
        assert!(
            err <= 0.02,
            "{what} q={q}: {got} vs exact {want} ({:.2} %)",
            err * 100.0
        );
    }
    // The count merged is every inference of the window.
    let count = if vmrange {
        format!("sum(increase(inference_wall_ms_hist_count[{MINUTES}m]))")
    } else {
        format!("histogram_count(sum(increase(inference_wall_ms_hist[{MINUTES}m])))")
    };
    let n = instant(base, &count, at_s).unwrap_or_else(|| panic!("{what}: {count}"));
    assert!(
        (n - values.len() as f64).abs() < 0.5,
        "{what}: {n} merged, {} sent",
        values.len()
    );
}

#[test]
fn fleet_percentiles_from_native_and_vmrange_histograms_live_and_after_a_backlog_drain() {
    if !require(Peer::Prometheus) || !require(Peer::VictoriaMetrics) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let live_prom = Prometheus::start_with_features(
        &dir.path().join("prom-live"),
        free_port(),
        None,
        &["native-histograms"],
    );
    let live_vm = VictoriaMetrics::start_on(&dir.path().join("vm-live"), free_port());
    // The backlog pair: addresses now, processes only once every minute is final.
    let (bp_port, bv_port) = (free_port(), free_port());
    let m0 = (now_ns() / MIN - MINUTES - 2) * MIN;
    let end_s = (m0 + MINUTES * MIN) / 1_000_000_000;
    let mut agents = Vec::new();
    let mut all: Vec<f64> = Vec::new();
    for i in 0..10usize {
        let cfg = format!(
            "{ROLLING}[tags]\ndevice = \"dev-{i}\"\n{}{}{}{}",
            sink(
                "p",
                &format!("http://{}/api/v1/write", live_prom.http),
                "native"
            ),
            sink("v", &live_vm.url("/api/v1/write"), "vmrange"),
            sink(
                "pb",
                &format!("http://127.0.0.1:{bp_port}/api/v1/write"),
                "native"
            ),
            sink(
                "vb",
                &format!("http://127.0.0.1:{bv_port}/api/v1/write"),
                "vmrange"
            ),
        );
        let adir = dir.path().join(format!("a{i}"));
        std::fs::create_dir_all(&adir).unwrap();
        let a = Agent::start(&adir, &cfg);
        all.extend(write_minutes(&a, i, m0));
        agents.push(a);
    }
    all.sort_by(|a, b| a.total_cmp(b));
    let last = m0 + (MINUTES - 1) * MIN;
    let live = wait_for(Duration::from_secs(120), || {
        (drained(&agents, "p", last) && drained(&agents, "v", last)).then_some(())
    });
    assert!(
        live.is_some(),
        "live histograms not drained: {}",
        agents[0].status()["forward"]
    );
    live_vm.flush();
    check_quantiles(
        "prometheus live",
        &format!("http://{}", live_prom.http),
        false,
        end_s,
        &all,
    );
    check_quantiles("victoriametrics live", &live_vm.url(""), true, end_s, &all);

    // The backlog: every minute waited on the agents; the stores come up now.
    for a in &agents {
        let s = sink_status(a, "pb#histograms");
        assert!(s["backlog_points"].as_i64().unwrap_or(0) > 0, "{s}");
    }
    let back_prom = Prometheus::start_with_features(
        &dir.path().join("prom-back"),
        bp_port,
        None,
        &["native-histograms"],
    );
    let back_vm = VictoriaMetrics::start_on(&dir.path().join("vm-back"), bv_port);
    let back = wait_for(Duration::from_secs(120), || {
        (drained(&agents, "pb", last) && drained(&agents, "vb", last)).then_some(())
    });
    assert!(
        back.is_some(),
        "backlog not drained: {}",
        agents[0].status()["forward"]
    );
    back_vm.flush();
    check_quantiles(
        "prometheus backlog",
        &format!("http://{}", back_prom.http),
        false,
        end_s,
        &all,
    );
    check_quantiles(
        "victoriametrics backlog",
        &back_vm.url(""),
        true,
        end_s,
        &all,
    );
    // The totals are durable beside each store.
    for a in &agents {
        assert!(a.dir.join("hist-pb_histograms.json").exists());
    }
}

#[test]
fn a_prometheus_without_native_histograms_pauses_the_histogram_sink_and_loses_nothing() {
    if !require(Peer::Prometheus) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pdir = dir.path().join("prom");
    let prom = Prometheus::start_on(&pdir, port, None);
    let url = format!("http://127.0.0.1:{port}/api/v1/write");
    let cfg = format!("{ROLLING}{}", sink("p", &url, "native"));
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    let a = Agent::start(&dir.path().join("a"), &cfg);
    let m0 = (now_ns() / MIN - 4) * MIN;
    let mut body = String::new();
    let mut vals = Vec::new();
    for m in 0..2 {
        for j in 0..100i64 {
            let v = 10.0 + j as f64;
            vals.push(v);
            body.push_str(&format!(
                "inference,model=m wall_ms={v} {}\n",
                m0 + m * MIN + j * 100_000_000
            ));
        }
    }
    body.push_str(&format!("tick v=1i {}\n", m0 + 2 * MIN + 30_000_000_000));
    let (code, resp) = post(&a.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
    assert_eq!(code, 204, "{resp}");
    let paused = wait_for(Duration::from_secs(60), || {
        let s = sink_status(&a, "p#histograms");
        (s["paused"] == true).then_some(s)
    })
    .unwrap_or_else(|| panic!("not paused: {}", sink_status(&a, "p#histograms")));
    let err = paused["last_error"].as_str().unwrap_or("");
    assert!(
        err.contains("native histograms are disabled")
            && err.contains("--enable-feature=native-histograms"),
        "{paused}"
    );
    // Nothing moved: both minutes wait, no totals were written; the point sink is unaffected.
    assert_eq!(paused["forwarded_points"], 0, "{paused}");
    assert!(
        paused["backlog_points"].as_i64().unwrap_or(0) >= 2,
        "{paused}"
    );
    assert!(!a.dir.join("hist-p_histograms.json").exists());
    let main = wait_for(Duration::from_secs(30), || {
        let s = sink_status(&a, "p");
        (s["forwarded_points"].as_i64().unwrap_or(0) >= 2).then_some(s)
    });
    assert!(main.is_some(), "{}", sink_status(&a, "p"));
    // Restarted with the flag: the kept minutes arrive, exactly.
    drop(prom);
    let prom = Prometheus::start_with_features(&pdir, port, None, &["native-histograms"]);
    let sent = wait_for(Duration::from_secs(60), || {
        let s = sink_status(&a, "p#histograms");
        (s["rollup_cursor_ns"].as_i64() == Some(m0 + MIN)).then_some(s)
    });
    assert!(sent.is_some(), "{}", sink_status(&a, "p#histograms"));
    let at = (m0 + 2 * MIN) / 1_000_000_000;
    let n = instant(
        &format!("http://{}", prom.http),
        "histogram_count(sum(increase(inference_wall_ms_hist[2m])))",
        at,
    );
    assert_eq!(n, Some(200.0));
    vals.sort_by(|a, b| a.total_cmp(b));
    let p99 = instant(
        &format!("http://{}", prom.http),
        "histogram_quantile(0.99, sum(rate(inference_wall_ms_hist[2m])))",
        at,
    )
    .unwrap();
    assert!(
        (p99 - exact(&vals, 0.99)).abs() / exact(&vals, 0.99) <= 0.02,
        "{p99}"
    );
}

/// InfluxDB 1.x cannot merge histograms; agents with `histograms = true` on an `influxdb`
/// sink send each minute's sketch bins as fields of `inference_hist`, and `edgewatch
/// fleet-quantile` adds them in InfluxQL (`sum(*)`) and merges: within 2 % of the exact
/// fleet (and one device's) p50/p99. Bad arguments and a missing database are errors.
#[test]
fn influxdb_gets_sketch_bins_and_fleet_quantile_merges_them() {
    if !require(Peer::Influxdb) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let influx = Influxd::start(&dir.path().join("influx"));
    influx_create_db(&influx, "fleet");
    let m0 = (now_ns() / MIN - MINUTES - 2) * MIN;
    let mut agents = Vec::new();
    let mut all = Vec::new();
    let mut dev4 = Vec::new();
    for i in [0usize, 4, 5, 9] {
        let cfg = format!(
            "{ROLLING}[tags]\ndevice = \"dev-{i}\"\n[[sink]]\ntype = \"influxdb\"\nname = \"i\"\n\
             url = \"http://{}\"\nversion = 1\ndatabase = \"fleet\"\nforward = \"rollup:1m\"\n\
             max_backoff = \"1s\"\nreconnect_jitter = \"0s\"\nhistograms = true\n",
            influx.http
        );
        let adir = dir.path().join(format!("a{i}"));
        std::fs::create_dir_all(&adir).unwrap();
        let a = Agent::start(&adir, &cfg);
        let v = write_minutes(&a, i, m0);
        if i == 4 {
            dev4 = v.clone();
        }
        all.extend(v);
        agents.push(a);
    }
    let last = m0 + (MINUTES - 1) * MIN;
    let ok = wait_for(Duration::from_secs(120), || {
        drained(&agents, "i", last).then_some(())
    });
    assert!(ok.is_some(), "{}", sink_status(&agents[0], "i#histograms"));
    let fq = |extra: &[&str]| {
        let out = std::process::Command::new(bin())
            .args([
                "fleet-quantile",
                "--influx",
                &format!("http://{}", influx.http),
            ])
            .args([
                "--from",
                &m0.to_string(),
                "--to",
                &(m0 + MINUTES * MIN).to_string(),
            ])
            .args(["--q", "0.5,0.99"])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    for (what, values, extra) in [
        ("fleet", &mut all, vec!["--db", "fleet"]),
        (
            "dev-4",
            &mut dev4,
            vec!["--db", "fleet", "--tag", "device=dev-4"],
        ),
    ] {
        values.sort_by(|a, b| a.total_cmp(b));
        let (code, out, err) = fq(&extra);
        assert_eq!(code, Some(0), "{out}{err}");
        assert!(
            out.contains(&format!("count {}\n", values.len())),
            "{what}: {out}"
        );
        for q in [0.5, 0.99] {
            let got: f64 = out
                .lines()
                .find_map(|l| l.strip_prefix(&format!("q{q} ")))
                .and_then(|x| x.parse().ok())
                .unwrap_or_else(|| panic!("{what}: {out}"));
            let want = exact(values, q);
            let e = (got - want).abs() / want;
            println!(
                "influxdb {what} q={q}: merged {got:.3} exact {want:.3} error {:.3} %",
                e * 100.0
            );
            assert!(e <= 0.02, "{what} q={q}: {got} vs {want}");
        }
    }
    // Errors: a malformed tag, a database that does not exist.
    let (code, _, err) = fq(&["--db", "fleet", "--tag", "device"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("key=value"), "{err}");
    let (code, _, err) = fq(&["--db", "nope"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("nope"), "{err}");
}
