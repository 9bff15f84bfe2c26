//! The scrape input's cost: parse rate (samples/s) of edgewatch's exposition parser against
//! the `openmetrics-parser` crate on a synthetic 100k-sample page and on node_exporter's
//! full page, whether each keeps a page with one malformed line, and the CPU share of
//! scraping node_exporter plus one Triton page every 10 s (fetch, parse, shape, Triton
//! deltas), measured as process CPU time per round. node_exporter is Debian's
//! `prometheus-node-exporter`, started on a free loopback port with its default collectors
//! (the node_exporter parts are skipped, said on stdout, when it is not installed).
//! Run: `cargo bench --bench scrape`.

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use edgewatch::collect::scrape::{fetch, parse, shape, triton, ScrapeConfig};

fn synthetic(samples: usize) -> String {
    let mut s = String::from("# HELP req_seconds Request latency.\n# TYPE req_seconds histogram\n");
    let mut i = 0;
    while i < samples {
        let svc = format!("svc-{}", i / 12);
        for le in [
            "0.005", "0.01", "0.05", "0.1", "0.5", "1", "5", "10", "+Inf",
        ] {
            s.push_str(&format!(
                "req_seconds_bucket{{service=\"{svc}\",path=\"/api/v1/x\\\"y\",le=\"{le}\"}} {}\n",
                i * 3
            ));
        }
        s.push_str(&format!(
            "req_seconds_sum{{service=\"{svc}\",path=\"/api/v1/x\\\"y\"}} {}.25\n",
            i
        ));
        s.push_str(&format!(
            "req_seconds_count{{service=\"{svc}\",path=\"/api/v1/x\\\"y\"}} {}\n",
            i * 3
        ));
        s.push_str(&format!("up_gauge{{service=\"{svc}\"}} 1 1764000000000\n"));
        i += 12;
    }
    s
}

fn rate(name: &str, page: &str, rounds: usize) {
    let n = parse::parse(page, parse::Format::Prometheus).samples.len();
    let t = Instant::now();
    for _ in 0..rounds {
        black_box(parse::parse(black_box(page), parse::Format::Prometheus));
    }
    let ours = (n * rounds) as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut ok = true;
    for _ in 0..rounds {
        ok &= black_box(openmetrics_parser::prometheus::parse_prometheus(black_box(
            page,
        )))
        .is_ok();
    }
    let theirs = (n * rounds) as f64 / t.elapsed().as_secs_f64();
    println!("{name} ({n} samples, {} KiB):", page.len() / 1024);
    println!("  edgewatch parser:          {ours:>12.0} samples/s");
    println!(
        "  openmetrics-parser crate:  {theirs:>12.0} samples/s{}",
        if ok { "" } else { " (refused the page)" }
    );
    println!("  ratio: x{:.2}", ours / theirs);
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(19100)
}

/// Serves `page` forever on a loopback port; returns the URL.
fn serve(page: String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/metrics", l.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    url
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (100 Hz on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

fn triton_page(k: u64) -> String {
    let mut s = String::new();
    for m in ["densenet_onnx", "yolov8n", "whisper_tiny"] {
        let l = format!("model=\"{m}\",version=\"1\"");
        s.push_str(&format!(
            "nv_inference_request_success{{{l}}} {}\nnv_inference_request_failure{{{l},reason=\"REJECTED\"}} 0\n\
             nv_inference_count{{{l}}} {}\nnv_inference_exec_count{{{l}}} {}\n\
             nv_inference_request_duration_us{{{l}}} {}\nnv_inference_queue_duration_us{{{l}}} {}\n\
             nv_inference_compute_infer_duration_us{{{l}}} {}\nnv_inference_pending_request_count{{{l}}} 1\n",
            k * 100, k * 400, k * 50, k * 1_200_000, k * 50_000, k * 900_000
        ));
    }
    for g in 0..2 {
        s.push_str(&format!(
            "nv_gpu_utilization{{gpu_uuid=\"GPU-{g}\"}} 0.5\nnv_gpu_memory_used_bytes{{gpu_uuid=\"GPU-{g}\"}} 1e9\n\
             nv_gpu_power_usage{{gpu_uuid=\"GPU-{g}\"}} 120\nnv_energy_consumption{{gpu_uuid=\"GPU-{g}\"}} 1e6\n"
        ));
    }
    s
}

fn main() {
    rate("synthetic page", &synthetic(100_000), 5);

    let port = free_port();
    let ne = Command::new("prometheus-node-exporter")
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
        .map(Kill);
    let node_url = format!("http://127.0.0.1:{port}/metrics");
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .build();
    let node_cfg = ScrapeConfig::new("node", &node_url);
    let mut node_page = None;
    if ne.is_some() {
        for _ in 0..50 {
            if let Ok(p) = fetch(&agent, &node_cfg) {
                node_page = Some(p);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let Some(node_page) = node_page else {
        println!("node_exporter parts skipped: prometheus-node-exporter is not installed");
        return;
    };
    rate("node_exporter full page", &node_page.body, 50);

    // CPU share: one round = scrape node_exporter + a Triton page, as the agent does every
    // 10 s (the store's share is not included: see the ingest benchmark for that).
    let triton_url = serve(triton_page(1));
    let triton_cfg = ScrapeConfig::new("triton", &triton_url);
    let mut tr = triton::Triton::default();
    let rounds = 200;
    let (c0, t0) = (cpu_seconds(), Instant::now());
    let mut points = 0;
    for _ in 0..rounds {
        for cfg in [&node_cfg, &triton_cfg] {
            let p = fetch(&agent, cfg).expect("fetch");
            let page = parse::parse(&p.body, p.format);
            let s = shape::to_lines(&page, cfg, 0);
            points += s.lines.len() + tr.update(&page.samples, 0, &cfg.name, &[]).len();
        }
    }
    let cpu = cpu_seconds() - c0;
    let wall = t0.elapsed().as_secs_f64();
    let per_round = cpu / rounds as f64;
    println!(
        "scrape round (node_exporter + Triton): {:.2} ms CPU ({:.2} ms wall, {} points), \
         = {:.4} % of a core at a 10 s interval (includes this process's share of \
         node_exporter's HTTP client side only)",
        per_round * 1000.0,
        wall / rounds as f64 * 1000.0,
        points / rounds,
        per_round / 10.0 * 100.0
    );
    let mut bad = node_page.body.clone();
    bad.insert_str(0, "broken{a=1} 2\n");
    println!(
        "one malformed line: edgewatch keeps {} samples; openmetrics-parser: {}",
        parse::parse(&bad, parse::Format::Prometheus).samples.len(),
        match openmetrics_parser::prometheus::parse_prometheus(&bad) {
            Ok(_) => "kept the page".to_string(),
            Err(e) => format!("refused the whole page ({e:?})"),
        }
    );
}
