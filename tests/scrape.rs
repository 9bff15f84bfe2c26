//! `[[scrape]]` end to end: Debian's `prometheus-node-exporter` on a free loopback port
//! scraped for real, a local HTTP server serving Triton expositions (the `triton` fields
//! checked against values computed by hand), and targets that are down, slow, huge,
//! failing or malformed, with their per-target status and `/metrics`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// What the local server answers on one path.
#[derive(Clone)]
pub(crate) enum Reply {
    /// These pages in turn, the last one repeated.
    Pages(Vec<String>, &'static str),
    /// A page after a delay.
    Slow(Duration),
    /// A raw status code.
    Status(u16),
    /// A body of this many bytes.
    Bytes(Vec<u8>),
}

/// A tiny HTTP/1.1 server on 127.0.0.1 (one thread per connection) serving [`Reply`]s by
/// path and counting requests per path.
pub(crate) struct Server {
    port: u16,
    hits: Arc<Mutex<HashMap<String, usize>>>,
}

impl Server {
    pub(crate) fn start(routes: Vec<(&'static str, Reply)>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let routes: Arc<HashMap<String, Reply>> = Arc::new(
            routes
                .into_iter()
                .map(|(p, r)| (p.to_string(), r))
                .collect(),
        );
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let h = hits.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let (routes, hits) = (routes.clone(), h.clone());
                std::thread::spawn(move || {
                    let mut req = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&req).to_string();
                    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let n = {
                        let mut g = hits.lock().unwrap();
                        let e = g.entry(path.clone()).or_insert(0);
                        *e += 1;
                        *e - 1
                    };
                    let (code, ctype, body): (u16, &str, Vec<u8>) = match routes.get(&path) {
                        Some(Reply::Pages(pages, ct)) => {
                            (200, ct, pages[n.min(pages.len() - 1)].clone().into_bytes())
                        }
                        Some(Reply::Slow(d)) => {
                            std::thread::sleep(*d);
                            (200, "text/plain", b"late 1\n".to_vec())
                        }
                        Some(Reply::Status(c)) => (*c, "text/plain", b"no\n".to_vec()),
                        Some(Reply::Bytes(b)) => (200, "text/plain", b.clone()),
                        None => (404, "text/plain", b"not found\n".to_vec()),
                    };
                    let head = format!(
                        "HTTP/1.1 {code} X\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes());
                    let _ = conn.write_all(&body);
                });
            }
        });
        Server { port, hits }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub(crate) fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

pub(crate) fn target(name: &str, url: &str, extra: &str) -> String {
    format!("\n[[scrape]]\nname = \"{name}\"\nurl = \"{url}\"\n{extra}\n")
}

pub(crate) fn query(agent: &Agent, q: &str) -> Value {
    let (code, body) =
        get(&agent.url(&format!("/api/v1/query?from=0&to=4000000000000000000&{q}"))).unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

pub(crate) fn scrape_status(agent: &Agent, name: &str) -> Value {
    agent.status()["collectors"]["scrape"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no scrape target {name} in the status"))
}

/// A Triton page as the server prints it (documented names: `nv_inference_*` per model and
/// version), for one model with traffic and one idle model.
fn triton_page(
    [ok, fail, count, exec, req_us, queue_us, infer_us]: [u64; 7],
    summary: Option<(f64, f64)>,
) -> String {
    let m = "model=\"densenet_onnx\",version=\"1\"";
    let idle = "model=\"yolo v8\",version=\"2\"";
    let mut s = format!(
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes\n\
         # TYPE nv_inference_request_success counter\n\
         nv_inference_request_success{{{m}}} {ok}\n\
         nv_inference_request_success{{{idle}}} 4\n\
         # HELP nv_inference_request_failure Number of failed inference requests, all batch sizes\n\
         # TYPE nv_inference_request_failure counter\n\
         nv_inference_request_failure{{model=\"densenet_onnx\",reason=\"REJECTED\",version=\"1\"}} {fail}\n\
         nv_inference_request_failure{{model=\"densenet_onnx\",reason=\"BACKEND\",version=\"1\"}} 0\n\
         # TYPE nv_inference_count counter\n\
         nv_inference_count{{{m}}} {count}\n\
         # TYPE nv_inference_exec_count counter\n\
         nv_inference_exec_count{{{m}}} {exec}\n\
         # TYPE nv_inference_request_duration_us counter\n\
         nv_inference_request_duration_us{{{m}}} {req_us}\n\
         # TYPE nv_inference_queue_duration_us counter\n\
         nv_inference_queue_duration_us{{{m}}} {queue_us}\n\
         # TYPE nv_inference_compute_input_duration_us counter\n\
         nv_inference_compute_input_duration_us{{{m}}} 0\n\
         # TYPE nv_inference_compute_infer_duration_us counter\n\
         nv_inference_compute_infer_duration_us{{{m}}} {infer_us}\n\
         # TYPE nv_inference_compute_output_duration_us counter\n\
         nv_inference_compute_output_duration_us{{{m}}} 0\n\
         # TYPE nv_inference_pending_request_count gauge\n\
         nv_inference_pending_request_count{{{m}}} 2\n\
         # TYPE nv_gpu_utilization gauge\n\
         nv_gpu_utilization{{gpu_uuid=\"GPU-6f0c1e2a\"}} 0.42\n"
    );
    if let Some((p50, p99)) = summary {
        s.push_str(&format!(
            "# TYPE nv_inference_request_summary_us summary\n\
             nv_inference_request_summary_us{{{m},quantile=\"0.5\"}} {p50}\n\
             nv_inference_request_summary_us{{{m},quantile=\"0.99\"}} {p99}\n\
             nv_inference_request_summary_us_sum{{{m}}} {req_us}\n\
             nv_inference_request_summary_us_count{{{m}}} {ok}\n"
        ));
    }
    s
}

/// Triton's first-response latency histogram (`--metrics-config histogram_latencies=true`),
/// cumulative counts for `le` 10, 50, 100 and +Inf ms.
fn triton_histogram([a, b, c, d]: [u64; 4]) -> String {
    let m = "model=\"densenet_onnx\",version=\"1\"";
    let h = "nv_inference_first_response_histogram_ms";
    format!(
        "# HELP {h} Duration from request to first response in milliseconds\n\
         # TYPE {h} histogram\n\
         {h}_bucket{{{m},le=\"10\"}} {a}\n\
         {h}_bucket{{{m},le=\"50\"}} {b}\n\
         {h}_bucket{{{m},le=\"100\"}} {c}\n\
         {h}_bucket{{{m},le=\"+Inf\"}} {d}\n\
         {h}_sum{{{m}}} 1234\n\
         {h}_count{{{m}}} {d}\n"
    )
}

fn points(v: &Value) -> Vec<f64> {
    v["series"][0]["points"]
        .as_array()
        .map(|a| a.iter().map(|p| p[1].as_f64().unwrap()).collect())
        .unwrap_or_default()
}

#[test]
fn triton_counters_become_per_interval_latency_with_restarts_skipped() {
    let pages = vec![
        // First scrape: only the base.
        triton_page([100, 1, 400, 100, 2_000_000, 100_000, 1_500_000], None),
        // +50 requests, 2 failures, 200 inferences in 25 executions, 1.2 s of requests.
        triton_page([150, 3, 600, 125, 3_200_000, 150_000, 2_400_000], None),
        // Server restart, already past the old success count: the other counters went
        // down, so the interval is skipped (never a negative latency).
        triton_page([160, 0, 20, 10, 100_000, 5_000, 80_000], None),
        // +30 requests, 90 inferences in 30 executions, 0.3 s (the histogram's base).
        triton_page([190, 0, 110, 40, 400_000, 35_000, 200_000], None)
            + &triton_histogram([3, 7, 8, 8]),
        // The summary and histogram variant: +10 requests, 0.25 s; p50 4 ms, p99 20 ms;
        // first responses: 0 <= 10 ms, 4 in (10, 50], 5 in (50, 100], 1 above.
        triton_page(
            [200, 1, 120, 50, 650_000, 45_000, 400_000],
            Some((4000.0, 20000.0)),
        ) + &triton_histogram([3, 11, 17, 18]),
    ];
    let server = Server::start(vec![(
        "/metrics",
        Reply::Pages(pages, "text/plain; version=0.0.4"),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &target(
            "triton",
            &server.url("/metrics"),
            "interval = \"300ms\"\ntimeout = \"300ms\"\ntags = { role = \"server\" }",
        ),
    );
    // Five pages, then the last repeated (no new successes: no point).
    assert!(
        wait_for(Duration::from_secs(15), || (server.hits("/metrics") >= 7)
            .then_some(()))
        .is_some(),
        "the target was not scraped"
    );
    let got = wait_for(Duration::from_secs(5), || {
        let v = query(&agent, "measurement=triton&field=requests");
        (points(&v).len() == 3).then_some(v)
    })
    .unwrap_or_else(|| {
        panic!(
            "expected 3 triton points: {}",
            query(&agent, "measurement=triton&field=requests")
        )
    });
    let tags = &got["series"][0]["tags"];
    assert_eq!(tags["model"], "densenet_onnx");
    assert_eq!(tags["version"], "1");
    assert_eq!(tags["scrape"], "triton");
    assert_eq!(tags["role"], "server");
    assert_eq!(
        got["series"].as_array().unwrap().len(),
        1,
        "the idle model has no point"
    );
    let field = |f: &str| points(&query(&agent, &format!("measurement=triton&field={f}")));
    assert_eq!(field("requests"), [50.0, 30.0, 10.0]);
    assert_eq!(field("failures"), [2.0, 0.0, 1.0]);
    // 1.2e6 us / 50 / 1000 = 24 ms; 3e5 / 30 / 1000 = 10 ms; 2.5e5 / 10 / 1000 = 25 ms.
    assert_eq!(field("request_ms"), [24.0, 10.0, 25.0]);
    assert_eq!(field("queue_ms"), [1.0, 1.0, 1.0]);
    assert_eq!(field("compute_infer_ms"), [18.0, 4.0, 20.0]);
    assert_eq!(field("compute_input_ms"), [0.0, 0.0, 0.0]);
    assert_eq!(field("batch_size"), [8.0, 3.0, 1.0]);
    assert_eq!(field("pending"), [2.0, 2.0, 2.0]);
    assert_eq!(field("request_p50_ms"), [4.0]);
    assert_eq!(field("request_p99_ms"), [20.0]);
    // Rank 5 of 10 in (50, 100]: 50 + 50 * (5 - 4) / (9 - 4); ranks 9.5 and 9.9 in +Inf give
    // the highest finite bound.
    assert_eq!(field("first_response_p50_ms"), [60.0]);
    assert_eq!(field("first_response_p95_ms"), [100.0]);
    assert_eq!(field("first_response_p99_ms"), [100.0]);
    // The raw samples are stored too, Telegraf's way.
    let raw = query(&agent, "measurement=prometheus&field=nv_gpu_utilization");
    assert_eq!(raw["series"][0]["tags"]["gpu_uuid"], "GPU-6f0c1e2a");
    let s = scrape_status(&agent, "triton");
    assert_eq!(s["up"], true);
    assert!(s["triton_points"].as_u64().unwrap() == 3, "{s}");
}

/// Starts Debian's node_exporter on a free loopback port with a few collectors.
struct NodeExporter(Child, u16);

impl Drop for NodeExporter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn node_exporter() -> NodeExporter {
    let port = free_port();
    let child = Command::new("prometheus-node-exporter")
        .args([
            &format!("--web.listen-address=127.0.0.1:{port}"),
            "--collector.disable-defaults",
            "--collector.cpu",
            "--collector.meminfo",
            "--collector.loadavg",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start prometheus-node-exporter ({e}): install the Debian package prometheus-node-exporter")
        });
    let ne = NodeExporter(child, port);
    assert!(
        wait_for(Duration::from_secs(10), || get(&format!(
            "http://127.0.0.1:{port}/metrics"
        ))
        .ok()
        .filter(|r| r.0 == 200))
        .is_some(),
        "node_exporter did not answer"
    );
    ne
}

#[test]
fn node_exporter_is_scraped_in_telegrafs_v2_shape() {
    let ne = node_exporter();
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &target(
            "node",
            &format!("http://127.0.0.1:{}/metrics", ne.1),
            "interval = \"500ms\"\ntimeout = \"500ms\"\nexclude = [\"go_memstats_*\"]",
        ),
    );
    let cpu = wait_for(Duration::from_secs(10), || {
        let v = query(
            &agent,
            "measurement=prometheus&field=node_cpu_seconds_total&tag.scrape=node",
        );
        (!points(&v).is_empty()).then_some(v)
    })
    .unwrap_or_else(|| panic!("no node_cpu_seconds_total:\n{}", agent.log_text()));
    let tags = &cpu["series"][0]["tags"];
    assert!(
        tags["cpu"].is_string() && tags["mode"].is_string(),
        "{tags}"
    );
    // A summary: one field per sample name, `quantile` a tag, `_sum`/`_count` without it.
    let q = query(
        &agent,
        "measurement=prometheus&field=go_gc_duration_seconds&tag.quantile=0.5",
    );
    assert_eq!(q["series"].as_array().unwrap().len(), 1, "{q}");
    let c = query(
        &agent,
        "measurement=prometheus&field=go_gc_duration_seconds_count&tag.scrape=node",
    );
    let series = c["series"].as_array().unwrap();
    assert_eq!(series.len(), 1, "{c}");
    assert!(series[0]["tags"].get("quantile").is_none());
    let m = query(
        &agent,
        "measurement=prometheus&field=go_memstats_alloc_bytes",
    );
    assert!(points(&m).is_empty(), "exclude applies: {m}");
    let s = scrape_status(&agent, "node");
    assert_eq!(s["up"], true, "{s}");
    assert_eq!(s["bad_lines"], 0, "{s}");
    assert!(s["samples"].as_u64().unwrap() > 20, "{s}");
}

#[test]
fn bad_targets_are_reported_and_never_stall_a_good_one() {
    let mut huge = b"# a page over the limit\n".to_vec();
    huge.resize(50_000, b'x');
    let server = Server::start(vec![
        ("/ok", Reply::Pages(vec!["good 1\n".into()], "text/plain")),
        ("/slow", Reply::Slow(Duration::from_secs(5))),
        ("/fail", Reply::Status(500)),
        ("/huge", Reply::Bytes(huge)),
        ("/binary", Reply::Bytes(vec![0xff, 0xfe, 0x00, 0x41])),
        (
            "/garbage",
            Reply::Pages(
                vec![
                    "kept{a=\"1\"} 1\nbroken{a=1} 2\n}}} 3\nalso_kept 4 5000\nnan_one NaN\n".into(),
                ],
                "text/plain",
            ),
        ),
    ]);
    let down = free_port();
    let fast = "interval = \"200ms\"\ntimeout = \"200ms\"";
    let mut cfg = String::new();
    cfg.push_str(&target("ok", &server.url("/ok"), fast));
    cfg.push_str(&target(
        "slow",
        &server.url("/slow"),
        "interval = \"1s\"\ntimeout = \"500ms\"",
    ));
    cfg.push_str(&target("fail", &server.url("/fail"), fast));
    cfg.push_str(&target(
        "huge",
        &server.url("/huge"),
        &format!("{fast}\nmax_body_bytes = 10000"),
    ));
    cfg.push_str(&target("binary", &server.url("/binary"), fast));
    cfg.push_str(&target("garbage", &server.url("/garbage"), fast));
    cfg.push_str(&target(
        "down",
        &format!("http://127.0.0.1:{down}/metrics"),
        fast,
    ));
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), &cfg);
    // While the slow target hangs, the good one keeps its pace.
    assert!(
        wait_for(Duration::from_secs(10), || (server.hits("/slow") >= 2
            && server.hits("/ok") >= 10)
            .then_some(()))
        .is_some(),
        "ok: {} scrapes, slow: {}",
        server.hits("/ok"),
        server.hits("/slow")
    );
    let expect = [
        ("slow", "request failed"),
        ("fail", "HTTP status 500"),
        ("huge", "body larger than max_body_bytes (10000 bytes)"),
        ("binary", "not UTF-8"),
        ("down", "request failed"),
    ];
    for (name, err) in expect {
        let s = scrape_status(&agent, name);
        assert_eq!(s["up"], false, "{s}");
        assert!(s["failures"].as_u64().unwrap() >= 1, "{s}");
        assert!(
            s["last_error"].as_str().unwrap().contains(err),
            "{name}: {s}"
        );
        assert!(s["last_duration_ms"].as_f64().is_some(), "{s}");
    }
    let s = scrape_status(&agent, "slow");
    assert!(
        s["last_duration_ms"].as_f64().unwrap() < 2000.0,
        "bounded by timeout: {s}"
    );
    let g = scrape_status(&agent, "garbage");
    assert_eq!(g["up"], true, "{g}");
    assert_eq!(g["samples"], 2, "{g}");
    let scrapes = g["scrapes"].as_u64().unwrap();
    assert_eq!(g["bad_lines"].as_u64().unwrap(), 2 * scrapes, "{g}");
    assert_eq!(g["non_finite"].as_u64().unwrap(), scrapes, "{g}");
    assert!(
        g["last_bad_line"].as_str().unwrap().starts_with("line 2:"),
        "{g}"
    );
    let kept = query(
        &agent,
        "measurement=prometheus&field=also_kept&tag.scrape=garbage",
    );
    assert_eq!(
        kept["series"][0]["points"][0][0], 5_000_000_000i64,
        "the page's timestamp: {kept}"
    );
    let (code, metrics) = get(&agent.url("/metrics")).unwrap();
    assert_eq!(code, 200);
    for want in [
        "edgewatch_scrape_up{name=\"ok\"} 1",
        "edgewatch_scrape_up{name=\"down\"} 0",
        "edgewatch_scrape_bad_lines_total{name=\"garbage\"}",
        "edgewatch_scrape_last_duration_seconds{name=\"slow\"}",
    ] {
        assert!(metrics.contains(want), "{want} missing");
    }
    // Shutdown is not held up by the hanging target.
    let (code, took) = agent.terminate();
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn check_config_names_a_bad_target() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(
        &f,
        "[[scrape]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/m\"\n[[scrape]]\nname = \"a\"\nurl = \"http://127.0.0.1:2/m\"\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["check-config", f.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("[[scrape]] \"a\": the name is used twice"),
        "{err}"
    );
}

/// A target scraped every second needs no `timeout` (unset, it is the smaller of 3 s and the
/// interval, as in Prometheus); one set above the interval is still refused.
#[test]
fn check_config_takes_a_fast_target_without_a_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    let check = |body: &str| check_config(&f, body);
    let fast = "[[scrape]]\nname = \"fast\"\nurl = \"http://127.0.0.1:1/m\"\ninterval = \"1s\"\n";
    let (code, err) = check(fast);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = check(&format!("{fast}timeout = \"2s\"\n"));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "[[scrape]] \"fast\": timeout must be above zero and at most the interval (1s)"
        ),
        "{err}"
    );
}

/// `/api/v1/inference` lists Triton models beside app-reported ones: `triton` points (as
/// the scrape input writes them) with known timestamps in, each entry checked against values
/// computed by hand; percentiles only where Triton gave them, `model=` matching both.
#[test]
fn triton_models_are_listed_beside_app_models_in_the_inference_api() {
    const S: i64 = 1_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n[rollup]\nenabled = false\n",
    );
    let t0 = (edgewatch::now_ns() - 600 * S) / (10 * S) * (10 * S);
    let tr = "triton,model=densenet,version=1,scrape=tis,role=server";
    let body = format!(
        "{tr} requests=10,failures=1,request_ms=20,compute_infer_ms=12,queue_ms=3,batch_size=2,pending=1,request_p50_ms=18,request_p95_ms=30,request_p99_ms=40,compute_infer_p99_ms=15 {}\n\
         {tr} requests=30,request_ms=30,compute_infer_ms=16,queue_ms=5,batch_size=4,pending=3,request_p50_ms=19,request_p95_ms=33,request_p99_ms=57,compute_infer_p99_ms=21 {}\n\
         {tr} requests=5,request_ms=10,compute_infer_ms=8,queue_ms=1,batch_size=1,pending=0 {}\n\
         triton,model=resnet,version=2,scrape=tis requests=20,failures=4,request_ms=7,compute_infer_ms=5,queue_ms=1,batch_size=8,pending=0 {}\n\
         inference,model=densenet wall_ms=50,gpu_ms=40,batch_size=1i {}\n",
        t0 + 2 * S,
        t0 + 7 * S,
        t0 + 12 * S,
        t0 + 3 * S,
        t0 + 4 * S,
    );
    let (code, resp) = post(&agent.url("/write"), body.as_bytes(), &[]).unwrap();
    assert_eq!(code, 204, "{resp}");
    let to = t0 + 20 * S - 1;
    let inference = |extra: &str| -> Value {
        let (code, text) = get(&agent.url(&format!(
            "/api/v1/inference?from={t0}&to={to}&step=10s{extra}"
        )))
        .unwrap();
        assert_eq!(code, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    };
    let v = inference("");
    let models = v["models"].as_array().unwrap();
    let ids: Vec<(&str, &str)> = models
        .iter()
        .map(|m| (m["model"].as_str().unwrap(), m["source"].as_str().unwrap()))
        .collect();
    assert_eq!(
        ids,
        [
            ("densenet", "app"),
            ("densenet", "triton"),
            ("resnet", "triton")
        ],
        "{v}"
    );
    let close = |v: &Value, want: f64| {
        let got = v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"));
        assert!(
            (got - want).abs() <= 1e-9 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    };

    // The app-reported entry is the usual one.
    let app = &models[0];
    assert_eq!(app["summary"]["count"], 1);
    close(&app["summary"]["wall_ms"]["p50"], 50.0);
    close(&app["summary"]["gpu_share"], 0.8);

    let d = &models[1];
    assert_eq!(
        (d["version"].as_str(), d["scrape"].as_str()),
        (Some("1"), Some("tis"))
    );
    let steps = d["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{d}");
    // Step 0: two intervals, 10 + 30 requests, one failure.
    let s = &steps[0];
    assert_eq!(s["t"], t0);
    assert_eq!(s["count"], 40);
    assert_eq!(s["failures"], 1);
    close(&s["throughput_per_s"], 4.0);
    close(&s["wall_ms"]["mean"], 25.0);
    close(&s["gpu_ms"]["mean"], 14.0);
    close(&s["queue_ms"], 4.0);
    close(&s["pending"], 3.0);
    close(&s["batch_mean"], 3.0);
    close(&s["gpu_share"], 14.0 / 25.0);
    close(&s["overhead_ms"], 11.0);
    // Percentiles: Triton's newest summary in the step.
    close(&s["wall_ms"]["p50"], 19.0);
    close(&s["wall_ms"]["p95"], 33.0);
    close(&s["wall_ms"]["p99"], 57.0);
    close(&s["gpu_ms"]["p99"], 21.0);
    assert!(s["gpu_ms"]["p50"].is_null(), "{s}");
    close(&s["p99_p50"], 3.0);
    assert!(s["energy_mj_per_inference"].is_null());
    // Step 1: no summaries, so no percentiles (never made up from the mean).
    let s = &steps[1];
    assert_eq!(
        (s["t"].as_i64(), s["count"].as_i64()),
        (Some(t0 + 10 * S), Some(5))
    );
    close(&s["throughput_per_s"], 0.5);
    close(&s["wall_ms"]["mean"], 10.0);
    for p in ["p50", "p95", "p99"] {
        assert!(s["wall_ms"][p].is_null(), "{s}");
    }
    assert!(s["p99_p50"].is_null());
    // Summary over the range: 45 requests, 1 failure, the intervals' means averaged.
    let sum = &d["summary"];
    assert_eq!(
        (sum["count"].as_i64(), sum["failures"].as_i64()),
        (Some(45), Some(1))
    );
    close(
        &sum["throughput_per_s"],
        45.0 / ((to - t0) as f64 / S as f64),
    );
    close(&sum["wall_ms"]["mean"], 20.0);
    close(&sum["wall_ms"]["p99"], 57.0);

    let r = &models[2];
    assert_eq!(r["version"], "2");
    assert_eq!(
        (
            r["summary"]["count"].as_i64(),
            r["summary"]["failures"].as_i64()
        ),
        (Some(20), Some(4))
    );
    close(&r["steps"][0]["wall_ms"]["mean"], 7.0);
    close(&r["steps"][0]["batch_mean"], 8.0);
    assert!(r["summary"]["wall_ms"]["p99"].is_null());

    // `model=` matches Triton models too.
    let v = inference("&model=resnet");
    let models = v["models"].as_array().unwrap();
    assert_eq!(models.len(), 1, "{v}");
    assert_eq!(
        (models[0]["model"].as_str(), models[0]["source"].as_str()),
        (Some("resnet"), Some("triton"))
    );
    let v = inference("&model=densenet");
    assert_eq!(v["models"].as_array().unwrap().len(), 2, "{v}");
}
