//! The `prometheus_remote_write` sink against Debian's real `victoria-metrics` and
//! `prometheus` (remote write receiver on): the samples queried back equal the points sent
//! after an offline period and a kill -9 mid-drain; strings skipped and counted, booleans
//! 0/1, labels with `device_id` and `[tags]`; a sample the receiver refuses (400) is
//! dead-lettered and the sink moves on. Also InfluxDB line protocol to VictoriaMetrics through
//! the unchanged `influxdb` sink.

use std::time::Duration;

use crate::support::peers::*;
use crate::support::*;

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn rw_sink(url: &str, extra: &str) -> String {
    format!(
        "device_id = \"jet-7\"\n[tags]\nsite = \"lab\"\n[[sink]]\ntype = \"prometheus_remote_write\"\nname = \"rw\"\nurl = \"{url}\"\n\
         max_delay = \"50ms\"\nmin_backoff = \"50ms\"\nmax_backoff = \"300ms\"\n{extra}"
    )
}

/// Writes `n` inference points 1 ms apart from `t0` (ns): a float, a boolean, an integer and
/// a string field each; returns the samples a receiver must hold for them.
fn write_inferences(agent: &Agent, from: usize, n: usize, t0: i64) -> Samples {
    let mut want = Samples::new();
    let mut i = from;
    while i < from + n {
        let end = (i + 5_000).min(from + n);
        let mut body = String::new();
        for j in i..end {
            let t = t0 + j as i64 * 1_000_000;
            let model = format!("m{}", j % 2);
            let wall = 10.0 + (j % 97) as f64 * 0.25;
            let ok = j % 3 != 0;
            body.push_str(&format!(
                "inference,model={model} wall_ms={wall},ok={ok},batch={}i,note=\"n{j}\" {t}\n",
                j % 8
            ));
            let labels = |name: &str| {
                let mut m = serde_json::Map::new();
                for (k, v) in [
                    ("__name__", name),
                    ("device_id", "jet-7"),
                    ("site", "lab"),
                    ("model", model.as_str()),
                ] {
                    m.insert(k.into(), v.into());
                }
                m
            };
            let ms = t / 1_000_000;
            add_series(&mut want, &labels("inference_wall_ms"), [(ms, wall)]);
            add_series(
                &mut want,
                &labels("inference_ok"),
                [(ms, if ok { 1.0 } else { 0.0 })],
            );
            add_series(
                &mut want,
                &labels("inference_batch"),
                [(ms, (j % 8) as f64)],
            );
        }
        let (code, resp) = post(&agent.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{resp}");
        i = end;
    }
    want
}

/// Every sample VictoriaMetrics stored for `selector`, in time order, duplicates included.
/// With no `-dedup.minScrapeInterval` it keeps a sample written twice twice (same time, same
/// value), and `/api/v1/export` returns both (as `count_over_time` counts both), so a batch
/// sent twice shows here; [`VictoriaMetrics::export`] keeps distinct samples only.
fn stored(vm: &VictoriaMetrics, selector: &str) -> Samples {
    vm.flush();
    let mut r = ureq::get(&vm.url("/api/v1/export"))
        .query("match[]", selector)
        .query("start", "0");
    if let Some(a) = &vm.auth {
        r = r.set("Authorization", a);
    }
    let body = r
        .call()
        .expect("victoria-metrics export")
        .into_string()
        .unwrap();
    let mut out = Samples::new();
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        // The series' name as `add_series` writes it.
        let mut named = Samples::new();
        add_series(&mut named, v["metric"].as_object().unwrap(), []);
        let key = named.into_keys().next().unwrap();
        let ts = v["timestamps"].as_array().unwrap().iter();
        let vals = v["values"].as_array().unwrap().iter();
        let s = out.entry(key).or_default();
        s.extend(
            ts.zip(vals)
                .map(|(t, x)| (t.as_i64().unwrap(), x.as_f64().unwrap_or(f64::NAN))),
        );
        s.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    }
    out
}

/// `got` as distinct samples, with the number of copies beyond the first and the most
/// copies of one sample.
fn distinct(got: &Samples) -> (Samples, usize, usize) {
    let mut out = Samples::new();
    let (mut extra, mut most) = (0, 0);
    for (k, v) in got {
        let mut d: Vec<(i64, f64)> = Vec::with_capacity(v.len());
        let mut run = 0;
        for x in v {
            if d.last() == Some(x) {
                extra += 1;
                run += 1;
            } else {
                d.push(*x);
                run = 1;
            }
            most = most.max(run);
        }
        out.insert(k.clone(), d);
    }
    (out, extra, most)
}

/// Samples one batch holds at most here: a whole chunk (or `max_points` points) of points
/// with three numeric fields.
const BATCH_SAMPLES: usize = 3 * edgewatch::store::MAX_CHUNK_POINTS;

/// `raw` (as [`stored`] reads it) with each sample once, after checking that only what the
/// sink `s` (its status) counts as replayed was stored twice: at least once, no more.
fn once(raw: &Samples, s: &serde_json::Value) -> Samples {
    let (got, extra, most) = distinct(raw);
    let replayed = s["replayed_batches"].as_u64().unwrap_or(0) as usize;
    assert!(
        extra <= replayed * BATCH_SAMPLES && most <= 1 + replayed,
        "{extra} samples stored more than once (at most {most} copies), {replayed} batches replayed: {s}"
    );
    got
}

/// Compares per series: counts first (a readable failure), then every sample.
fn assert_same(got: &Samples, want: &Samples) {
    let count = |s: &Samples| -> Vec<(String, usize)> {
        s.iter().map(|(k, v)| (k.clone(), v.len())).collect()
    };
    assert_eq!(count(got), count(want));
    assert!(got == want, "same counts, different samples");
}

/// The drain scenario: the receiver down while `N` points are written, then up; the agent
/// killed with SIGKILL mid-drain and started again; `read` must then give back exactly the
/// points sent. Returns the second run's sink status.
fn offline_then_kill9_mid_drain<R>(
    dir: &std::path::Path,
    url_of: impl Fn(u16) -> String,
    start: impl FnOnce(u16) -> R,
    read: impl Fn(&R) -> Samples,
) -> serde_json::Value {
    const N: usize = 6_000;
    let port = free_port();
    let top = rw_sink(&url_of(port), "max_points = 200\nmax_rate = 1500\n");
    let agent = agent_with(dir, &top);
    let t0 = now_ns() - 20 * 60 * 1_000_000_000;
    let want = write_inferences(&agent, 0, N, t0);
    let s = wait_for(Duration::from_secs(10), || {
        let s = sink_status(&agent, "rw");
        (s["backlog_points"] == N && s["last_error"].is_string()).then_some(s)
    })
    .expect("the backlog shows while the receiver is down");
    assert_eq!(s["connected"], false, "{s}");
    assert_eq!(s["type"], "prometheus_remote_write", "{s}");
    let receiver = start(port);
    let mid = wait_for(Duration::from_secs(20), || {
        let f = sink_status(&agent, "rw")["forwarded_points"]
            .as_i64()
            .unwrap_or(0);
        (f >= 600).then_some(f)
    })
    .unwrap_or_else(|| panic!("no drain: {}", agent.log_text()));
    assert!(mid < N as i64 / 2, "killed too late: {mid}");
    let db = agent.dir.join("edgewatch.db");
    agent.kill9();
    // What the store says was in flight at the kill: the only batch that may arrive twice.
    let (in_flight, replayed_before) = {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let (cursor, inflight, replayed): (i64, i64, i64) = conn
            .query_row(
                "SELECT cursor_chunk_id, inflight_through_chunk_id, replayed_batches \
                 FROM sinks WHERE name = 'rw'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        let points: i64 = conn
            .query_row(
                "SELECT COALESCE(SUM(n), 0) FROM chunks WHERE id > ?1 AND id <= ?2",
                [cursor, inflight],
                |r| r.get(0),
            )
            .unwrap();
        (points as usize, replayed as usize)
    };
    let agent = agent_with(dir, &top);
    let s = wait_for(Duration::from_secs(30), || {
        let s = sink_status(&agent, "rw");
        (s["backlog_points"] == 0 && s["forwarded_points"].as_i64() > Some(0)).then_some(s)
    })
    .unwrap_or_else(|| panic!("backlog left: {}", agent.log_text()));
    // At least once, no more: the batch in flight at the kill (three samples a point) may
    // be stored twice, and a batch this run sent again after an error (counted as replayed
    // beyond the one in flight); nothing else.
    let raw = read(&receiver);
    let (got, extra, most) = distinct(&raw);
    assert_same(&got, &want);
    let replayed = s["replayed_batches"].as_u64().unwrap_or(0) as usize;
    let resent = replayed.saturating_sub(replayed_before + usize::from(in_flight > 0));
    assert!(
        extra <= 3 * in_flight + resent * BATCH_SAMPLES && most <= 2 + resent,
        "{extra} samples stored more than once (at most {most} copies); {in_flight} points \
         in flight at the kill, {resent} batches sent again after it: {s}"
    );
    eprintln!(
        "kill -9 mid-drain: {in_flight} points in flight at the kill, {extra} samples stored twice"
    );
    // One string field a point: the points this run sent skipped one each, counted (the
    // exact count is checked where nothing is killed).
    let skipped = s["skipped_string_values"].as_i64().unwrap_or(0);
    assert!(skipped > 0 && skipped <= N as i64, "{s}");
    s
}

#[test]
fn victoriametrics_gets_every_point_after_an_offline_period_and_a_kill9_mid_drain() {
    if !require(Peer::VictoriaMetrics) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let vm_dir = dir.path().join("vm");
    let s = offline_then_kill9_mid_drain(
        &dir.path().join("agent"),
        |port| format!("http://127.0.0.1:{port}/api/v1/write"),
        |port| VictoriaMetrics::start_on(&vm_dir, port),
        |vm| stored(vm, "{__name__=~\"inference_.+\"}"),
    );
    assert_eq!(s["dead_letter_batches"], 0, "{s}");
}

#[test]
fn prometheus_gets_every_point_after_an_offline_period_and_a_kill9_mid_drain() {
    if !require(Peer::Prometheus) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p_dir = dir.path().join("prom");
    offline_then_kill9_mid_drain(
        &dir.path().join("agent"),
        |port| format!("http://127.0.0.1:{port}/api/v1/write"),
        |port| Prometheus::start_on(&p_dir, port, None),
        |p| p.samples("{__name__=~\"inference_.+\"}", "1h", now_ns() as f64 / 1e9),
    );
}

#[test]
fn a_sample_prometheus_refuses_as_too_old_is_dead_lettered_and_the_sink_moves_on() {
    if !require(Peer::Prometheus) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let prom = Prometheus::start_on(&dir.path().join("prom"), port, None);
    let agent = agent_with(
        &dir.path().join("agent"),
        &rw_sink(&format!("http://127.0.0.1:{port}/api/v1/write"), ""),
    );
    let now = now_ns();
    let forwarded = |n: i64| {
        wait_for(Duration::from_secs(10), || {
            let s = sink_status(&agent, "rw");
            (s["forwarded_points"] == n && s["backlog_points"] == 0).then_some(s)
        })
        .unwrap_or_else(|| panic!("{}\n{}", sink_status(&agent, "rw"), agent.log_text()))
    };
    write_inferences(&agent, 0, 1, now);
    forwarded(1);
    // Three hours older than the newest sample: outside the head, "out of bounds".
    write_inferences(&agent, 0, 1, now - 3 * 3600 * 1_000_000_000);
    let s = wait_for(Duration::from_secs(10), || {
        let s = sink_status(&agent, "rw");
        (s["dead_letter_batches"] == 1).then_some(s)
    })
    .unwrap_or_else(|| panic!("{}\n{}", sink_status(&agent, "rw"), agent.log_text()));
    assert_eq!(s["dead_letter_points"], 1, "{s}");
    let err = s["last_error"].as_str().unwrap_or("");
    assert!(
        err.contains("HTTP 400") && err.contains("out of bounds"),
        "{s}"
    );
    assert!(
        agent.log_text().contains("dead_letters"),
        "{}",
        agent.log_text()
    );
    // The sink moved past it: the next point goes.
    write_inferences(&agent, 1, 1, now);
    let s = forwarded(2);
    assert_eq!(s["skipped_string_values"], 3, "{s}");
    let got = prom.samples("inference_wall_ms", "1h", now as f64 / 1e9 + 1.0);
    assert_eq!(got.values().map(Vec::len).sum::<usize>(), 2, "{got:?}");
}

#[test]
fn influx_line_protocol_reaches_victoriametrics_through_the_influxdb_sink() {
    if !require(Peer::VictoriaMetrics) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let vm = VictoriaMetrics::start_on(&dir.path().join("vm"), port);
    let top = format!(
        "device_id = \"jet-7\"\n[tags]\nsite = \"lab\"\n[[sink]]\ntype = \"influxdb\"\nname = \"rw\"\nurl = \"http://127.0.0.1:{port}\"\n\
         version = 1\ndatabase = \"edge\"\nmax_delay = \"50ms\"\nmin_backoff = \"50ms\"\nmax_backoff = \"300ms\"\n"
    );
    let agent = agent_with(&dir.path().join("agent"), &top);
    let mut want = write_inferences(&agent, 0, 3_000, now_ns() - 600 * 1_000_000_000);
    let s = wait_for(Duration::from_secs(20), || {
        let s = sink_status(&agent, "rw");
        (s["forwarded_points"] == 3_000).then_some(s)
    })
    .unwrap_or_else(|| panic!("{}\n{}", sink_status(&agent, "rw"), agent.log_text()));
    // VictoriaMetrics names them <measurement>_<field> too and adds the 1.x `db` as a
    // label; it keeps string fields as series of its own (not compared).
    let mut got = once(&stored(&vm, "{__name__=~\"inference_.+\"}"), &s);
    got.retain(|k, _| !k.starts_with("inference_note{"));
    want = want
        .into_iter()
        .map(|(k, v)| (k.replacen('{', "{db=\"edge\",", 1), v))
        .collect();
    assert_same(&got, &want);
}

/// Every PromQL target of `dashboards/victoriametrics-fleet.json` (rows included), with the
/// template variables as "All" and the default window: (panel title, query).
fn dashboard_queries() -> Vec<(String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("dashboards/victoriametrics-fleet.json");
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "device", "model", "window"]);
    assert_eq!(d["templating"]["list"][0]["query"], "prometheus");
    let mut out = Vec::new();
    let mut panels: Vec<serde_json::Value> = d["panels"].as_array().unwrap().clone();
    while let Some(p) = panels.pop() {
        panels.extend(p["panels"].as_array().cloned().unwrap_or_default());
        for t in p["targets"].as_array().into_iter().flatten() {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{p}");
            let q = t["expr"]
                .as_str()
                .unwrap()
                .replace("$device", ".*")
                .replace("$model", ".*")
                .replace("$window", "5m");
            assert!(!q.contains('$'), "unsubstituted variable in {q}");
            out.push((p["title"].as_str().unwrap().to_string(), q));
        }
    }
    out
}

#[test]
fn every_fleet_dashboard_query_parses_and_returns_rows_on_victoriametrics() {
    if !require(Peer::VictoriaMetrics) {
        return;
    }
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let vm = VictoriaMetrics::start_on(&dir.path().join("vm"), port);
    // A real agent: the [jetson] collector on the Orin Nano fixture (module tag, throttling),
    // tegrastats replayed (temperatures, rails), its own health every 200 ms, forwarding with
    // remote_write. A discrete GPU and inference requests arrive as the points the NVML
    // collector and an application would write.
    let root = jetson_fixture(dir.path(), "orin-nano-jp6");
    let log = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/jetson/tegrastats-orin-nano.log");
    let cfg = format!(
        "[host]\nenabled = false\n[nvml]\nenabled = false\n\
         [rollup]\nenabled = true\ninterval = \"1s\"\nlateness = \"5s\"\n\
         [health]\nenabled = true\ninterval = \"200ms\"\n\
         [jetson]\nroot = \"{}\"\ninterval = \"200ms\"\n\
         [tegrastats]\nreplay = \"{}\"\ninterval = \"200ms\"\n\
         [[sink]]\ntype = \"prometheus_remote_write\"\nname = \"rw\"\nurl = \"http://127.0.0.1:{port}/api/v1/write\"\nmax_delay = \"50ms\"\n\
         histograms = true\nhistogram_format = \"vmrange\"\n",
        root.display(),
        log.display()
    );
    std::fs::create_dir_all(dir.path().join("agent")).unwrap();
    let agent = Agent::start_with_env(
        &dir.path().join("agent"),
        &cfg,
        &[
            ("EDGEWATCH_DEVICE_ID", "jet-7"),
            ("EDGEWATCH_TAGS__SITE", "lab"),
        ],
    );
    let now = now_ns();
    write_inferences(&agent, 0, 4_000, now - 200 * 1_000_000_000);
    let mut gpu = String::new();
    for i in 0..60i64 {
        gpu.push_str(&format!(
            "gpu,gpu=0,uuid=GPU-1,name=NVIDIA\\ A2,arch=Ampere,cc=8.6 temp_c={},power_w=40.5,energy_mj={}i,util_gpu_pct=70,throttle_hw_slowdown=0i,throttle_sw_thermal={}i {}\n",
            50 + i % 5,
            1000 * i,
            i % 2,
            now - (60 - i) * 1_000_000_000
        ));
    }
    let (code, body) = post(&agent.url("/write?db=x"), gpu.as_bytes(), &[]).unwrap();
    assert_eq!(code, 204, "{body}");
    let end = now / 1_000_000_000 + 30;
    let mut empty: Vec<String> = Vec::new();
    let ok = wait_for(Duration::from_secs(25), || {
        vm.flush();
        empty.clear();
        for (title, q) in &queries {
            let r = vm.query_range(q, end - 900, end, "15s");
            assert_eq!(r["status"], "success", "{title}: {q}: {r}");
            if r["data"]["result"].as_array().is_none_or(|a| a.is_empty()) {
                empty.push(format!("{title}: {q}"));
            }
        }
        empty.is_empty().then_some(())
    });
    assert!(
        ok.is_some(),
        "panels without rows:\n{}\n{}",
        empty.join("\n"),
        sink_status(&agent, "rw")
    );
    // The variables' queries (Grafana's label_values) through the label API.
    let (code, body) =
        get(&vm.url("/api/v1/label/device_id/values?match[]=edgewatch_agent_uptime_s")).unwrap();
    assert!(code == 200 && body.contains("jet-7"), "{body}");
    let (code, body) =
        get(&vm.url("/api/v1/label/model/values?match[]=inference_wall_ms")).unwrap();
    assert!(
        code == 200 && body.contains("m0") && body.contains("m1"),
        "{body}"
    );
}

#[test]
fn victoriametrics_gets_an_evicted_span_from_the_rollup_tier_as_tagged_series() {
    if !require(Peer::VictoriaMetrics) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let top = rw_sink(
        &format!("http://127.0.0.1:{port}/api/v1/write"),
        "max_points = 4\n",
    );
    let agent = agent_with(dir.path(), &top);
    crate::forward::evict_unsent_old_span(&agent, dir.path());
    wait_for(Duration::from_secs(10), || {
        (sink_status(&agent, "rw")["evicted_unforwarded_points"] == 600).then_some(())
    })
    .expect("eviction counted for the sink");
    let vm = VictoriaMetrics::start_on(&dir.path().join("vm"), port);
    let s = wait_for(Duration::from_secs(30), || {
        let s = sink_status(&agent, "rw");
        (s["backlog_points"] == 0 && s["fallback_points"] == 10 && s["forwarded_points"] == 600)
            .then_some(s)
    })
    .unwrap_or_else(|| panic!("{}\n{}", sink_status(&agent, "rw"), agent.log_text()));
    let got = once(&stored(&vm, "{__name__=~\"m_v.*\"}"), &s);
    let series = |name: &str, rollup: bool| {
        let key = if rollup {
            format!("{name}{{device_id=\"jet-7\",edgewatch_rollup=\"60s\",k=\"v\",site=\"lab\"}}")
        } else {
            format!("{name}{{device_id=\"jet-7\",k=\"v\",site=\"lab\"}}")
        };
        got.get(&key)
            .cloned()
            .unwrap_or_else(|| panic!("no {key} in {:?}", got.keys()))
    };
    // The rest came raw; the evicted 10 minutes as one sample per minute and statistic.
    let raw = series("m_v", false);
    assert_eq!(raw.len(), 600);
    assert_eq!(raw[0].1, 600.0);
    let count = series("m_v_count", true);
    assert_eq!(count.len(), 10);
    assert_eq!(count.iter().map(|x| x.1).sum::<f64>(), 600.0);
    assert_eq!(series("m_v_mean", true)[0].1, 29.5);
    assert_eq!(series("m_v_min", true)[0].1, 0.0);
    assert_eq!(series("m_v_max", true)[9].1, 599.0);
}

#[test]
fn basic_auth_refused_pauses_the_sink_and_the_right_password_delivers() {
    if !require(Peer::VictoriaMetrics) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let vm = VictoriaMetrics::start_with(&dir.path().join("vm"), port, Some(("edge", "s3cret")));
    let url = format!("http://127.0.0.1:{port}/api/v1/write");
    let wrong = rw_sink(&url, "username = \"edge\"\npassword = \"nope\"\n");
    let agent = agent_with(&dir.path().join("a"), &wrong);
    let want = write_inferences(&agent, 0, 50, now_ns() - 60 * 1_000_000_000);
    let s = wait_for(Duration::from_secs(10), || {
        let s = sink_status(&agent, "rw");
        (s["paused"] == true && s["backlog_points"] == 50).then_some(s)
    })
    .unwrap_or_else(|| panic!("{}", sink_status(&agent, "rw")));
    assert!(
        s["last_error"].as_str().unwrap_or("").contains("401"),
        "{s}"
    );
    assert_eq!(s["backlog_points"], 50, "{s}");
    assert!(!agent.log_text().contains("nope"), "the password is logged");
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
    // The same store, the right password: the kept backlog arrives.
    let right = rw_sink(&url, "username = \"edge\"\npassword = \"s3cret\"\n");
    let agent = agent_with(&dir.path().join("a"), &right);
    let s = wait_for(Duration::from_secs(10), || {
        let s = sink_status(&agent, "rw");
        (s["forwarded_points"] == 50 && s["backlog_points"] == 0).then_some(s)
    })
    .unwrap_or_else(|| panic!("{}", sink_status(&agent, "rw")));
    assert_same(
        &once(&stored(&vm, "{__name__=~\"inference_.+\"}"), &s),
        &want,
    );
}

/// Sanitising is not one-to-one: `cpu_usage` `x` and `cpu` `usage_x` are both
/// `cpu_usage_x`, tags `a.b` and `a_b` both `a_b`. Against a real Prometheus, every value
/// arrives: written in one batch at the same time, and across batches and a restart (the
/// series created first keeps the plain labels, the other is sent with `edgewatch_source`
/// every time, so no later batch is refused as a duplicate sample); the collisions are
/// counted in the status.
#[test]
fn series_whose_names_collide_after_sanitising_all_reach_prometheus() {
    if !require(Peer::Prometheus) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let prom = Prometheus::start_on(&dir.path().join("prom"), port, None);
    let top = rw_sink(&format!("http://127.0.0.1:{port}/api/v1/write"), "");
    let agent_dir = dir.path().join("agent");
    let agent = agent_with(&agent_dir, &top);
    let t = now_ns() - 60 * 1_000_000_000;
    let write = |agent: &Agent, body: &str| {
        let (code, resp) = post(&agent.url("/write?db=x"), body.as_bytes(), &[]).unwrap();
        assert_eq!(code, 204, "{resp}");
    };
    let forwarded = |agent: &Agent, n: i64| {
        wait_for(Duration::from_secs(10), || {
            let s = sink_status(agent, "rw");
            (s["forwarded_points"] == n && s["backlog_points"] == 0).then_some(s)
        })
        .unwrap_or_else(|| panic!("{}\n{}", sink_status(agent, "rw"), agent.log_text()))
    };
    // One batch, one millisecond.
    write(
        &agent,
        &format!(
            "cpu_usage x=1 {t}\ncpu usage_x=2 {t}\nt,a.b=1 v=5 {t}\nt,a_b=1 v=6 {t}\nu,a.b=1,a_b=2 v=7 {t}\n"
        ),
    );
    let s = forwarded(&agent, 5);
    assert_eq!(s["name_collisions"], 3, "{s}");
    // A restart, then the later series alone in its batch, at a time the other one gets
    // next: it must not land in the other's series.
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
    let agent = agent_with(&agent_dir, &top);
    let t2 = t + 1_000_000_000;
    write(&agent, &format!("cpu usage_x=3 {t2}\n"));
    forwarded(&agent, 6);
    write(&agent, &format!("cpu_usage x=4 {t2}\n"));
    let s = forwarded(&agent, 7);
    assert_eq!(s["dead_letter_batches"], 0, "{s}");
    assert_eq!(
        s["name_collisions"], 3,
        "known from the store at start: {s}"
    );
    let (ms, ms2) = (t / 1_000_000, t2 / 1_000_000);
    let at = now_ns() as f64 / 1e9 + 1.0;
    let got = wait_for(Duration::from_secs(10), || {
        let g = prom.samples("{__name__=~\"cpu_usage_x|t_v|u_v\"}", "1h", at);
        (g.values().map(Vec::len).sum::<usize>() == 7).then_some(g)
    })
    .unwrap_or_else(|| {
        panic!(
            "{:?}\n{}",
            prom.samples("{__name__=~\"cpu_usage_x|t_v|u_v\"}", "1h", at),
            prom.log_text()
        )
    });
    let want: Samples = [
        (
            "cpu_usage_x{device_id=\"jet-7\",site=\"lab\"}",
            vec![(ms, 1.0), (ms2, 4.0)],
        ),
        (
            "cpu_usage_x{device_id=\"jet-7\",edgewatch_source=\"cpu,device_id=jet-7,site=lab usage_x\",site=\"lab\"}",
            vec![(ms, 2.0), (ms2, 3.0)],
        ),
        (
            "t_v{a_b=\"1\",device_id=\"jet-7\",site=\"lab\"}",
            vec![(ms, 5.0)],
        ),
        (
            "t_v{a_b=\"1\",device_id=\"jet-7\",edgewatch_source=\"t,a_b=1,device_id=jet-7,site=lab v\",site=\"lab\"}",
            vec![(ms, 6.0)],
        ),
        (
            "u_v{a_b=\"2\",a_b_2=\"1\",device_id=\"jet-7\",site=\"lab\"}",
            vec![(ms, 7.0)],
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(got, want);
}
