//! HTTP (InfluxDB 1.x and 2.x APIs) and UDP ingest, partial writes, limits, backpressure,
//! and real Influx client libraries pointed at the agent.

use std::time::Duration;

use serde_json::Value as J;

use crate::support::stored_points as points;
use crate::support::*;

// Rollup off: these tests write points with old timestamps, which retention would rightly
// evict once rolled up.
const QUIET: &str = "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n[rollup]\nenabled = false\n";

#[test]
fn v1_write_with_precision_db_and_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let (code, body) = post(
        &agent.url("/write?db=telemetry&rp=autogen&precision=ms&u=edge&p=secret"),
        b"inference,model=yolo wall_ms=12.5,gpu_ms=8,batch_size=4i,ok=true 1764000000123\n",
        &[],
    )
    .unwrap();
    assert_eq!(code, 204, "{body}");
    let got = points(&agent, "measurement=inference");
    let ts = 1_764_000_000_123_000_000;
    assert_eq!(
        got,
        vec![
            ("model=yolo".into(), "batch_size".into(), ts, J::from(4)),
            ("model=yolo".into(), "gpu_ms".into(), ts, J::from(8.0)),
            ("model=yolo".into(), "ok".into(), ts, J::from(true)),
            ("model=yolo".into(), "wall_ms".into(), ts, J::from(12.5)),
        ]
    );
    // InfluxDB clients probe /ping first.
    let r = ureq::get(&agent.url("/ping")).call().unwrap();
    assert_eq!(r.status(), 204);
    assert!(r.header("X-Influxdb-Version").is_some());
}

#[test]
fn v2_write_with_token_and_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let body =
        gzip(b"inference,model=a wall_ms=1 1764000000\ninference,model=b wall_ms=2 1764000001\n");
    let (code, resp) = post(
        &agent.url("/api/v2/write?org=fleet&bucket=edge&precision=s"),
        &body,
        &[("Authorization", "Token abc"), ("Content-Encoding", "gzip")],
    )
    .unwrap();
    assert_eq!(code, 204, "{resp}");
    let got = points(&agent, "measurement=inference&field=wall_ms");
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[1],
        (
            "model=b".into(),
            "wall_ms".into(),
            1_764_000_001_000_000_000,
            J::from(2.0)
        )
    );
    // gzip on the 1.x API too, and a corrupt gzip body is a clear 400.
    let (code, _) = post(
        &agent.url("/write"),
        &gzip(b"g v=1 5"),
        &[("Content-Encoding", "gzip")],
    )
    .unwrap();
    assert_eq!(code, 204);
    let (code, resp) = post(
        &agent.url("/write"),
        b"not gzip",
        &[("Content-Encoding", "gzip")],
    )
    .unwrap();
    assert_eq!(code, 400);
    assert!(resp.contains("gzip"), "{resp}");
    let (code, _) = post(&agent.url("/write?precision=weeks"), b"g v=1", &[]).unwrap();
    assert_eq!(code, 400);
}

/// An agent that holds points for 30 s (`[ingest] flush_interval`, longer than the alert
/// cycles' 15 s, so a test cannot race the writer's own commit), past its first alert cycle
/// (each commits what is held once the next commit is over 5 s away: the next cycle is
/// 15 s off).
fn agent_past_its_first_cycle(dir: &std::path::Path) -> Agent {
    let agent = Agent::start(dir, &format!("{QUIET}[ingest]\nflush_interval = \"30s\"\n"));
    let first_cycle = wait_for(Duration::from_secs(10), || {
        (agent.status()["alerts"]["evaluations"].as_u64() >= Some(1)).then_some(())
    });
    assert!(first_cycle.is_some(), "no alert evaluation at start");
    agent
}

/// [`agent_past_its_first_cycle`], with two UDP points of `held_m` just sent.
fn agent_holding_two_udp_points(dir: &std::path::Path) -> Agent {
    let agent = agent_past_its_first_cycle(dir);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.send_to(b"held_m,app=x v=1 1000\nheld_m,app=x v=2 2000\n", agent.udp)
        .unwrap();
    agent
}

/// The writer's commit count and the number of `measurement`'s points in the database
/// file, read without a commit (the status as stored, the file directly).
fn commits_and_in_file(agent: &Agent, measurement: &str) -> (u64, i64) {
    let (code, body) = get_with(
        &agent.url("/api/v1/status"),
        &[("X-Edgewatch-Read", "stored")],
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let st: J = serde_json::from_str(&body).unwrap();
    (
        st["ingest"]["commits"].as_u64().unwrap(),
        points_in_file(&agent.dir.join("edgewatch.db"), measurement),
    )
}

/// The sum of every step's value of an engine answer (`/api/v1/query` with `step`).
fn engine_sum(agent: &Agent, query: &str, read: &str) -> f64 {
    let (code, body) = get_with(
        &agent.url(&format!("/api/v1/query?{query}")),
        &[("X-Edgewatch-Read", read)],
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let v: J = serde_json::from_str(&body).unwrap();
    v["series"]
        .as_array()
        .unwrap_or(&vec![])
        .iter()
        .flat_map(|s| s["points"].as_array().cloned().unwrap_or_default())
        .map(|p| p[1].as_f64().unwrap_or(0.0))
        .sum()
}

/// UDP points are held for a shared commit (`[ingest] flush_interval`, here 30 s so the
/// test cannot race it): not in the database file yet, yet a query through the API sees
/// them at once, raw and through the query engine, and commits nothing: a read adds what
/// the writer holds to what is stored. The status, whose counters are of committed points,
/// commits them when it is read for the latest; every read then counts each point once.
#[test]
fn a_query_sees_held_udp_points_at_once_without_committing_them() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_holding_two_udp_points(dir.path());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.send_to(
        format!(
            "held_now,app=x v=3 {}\nheld_now,app=x v=4 {now}\n",
            now - 1_000_000_000
        )
        .as_bytes(),
        agent.udp,
    )
    .unwrap();
    let (commits, in_file) = commits_and_in_file(&agent, "held_m");
    assert_eq!(in_file, 0, "held points are not committed before 30 s");
    let got = points(&agent, "measurement=held_m");
    assert_eq!(got.len(), 2, "{got:?}");
    let engine = "measurement=held_now&field=v&from=-5m&step=1m&agg=sum";
    assert_eq!(engine_sum(&agent, engine, "latest"), 7.0);
    assert_eq!(engine_sum(&agent, engine, "stored"), 7.0);
    assert_eq!(
        commits_and_in_file(&agent, "held_m"),
        (commits, 0),
        "a read committed the held points"
    );
    assert_eq!(
        points_in_file(&agent.dir.join("edgewatch.db"), "held_now"),
        0
    );
    // The status read for the latest commits them; the reads count each once.
    assert!(agent.status()["ingest"]["points_written"].as_u64() >= Some(4));
    let (after, in_file) = commits_and_in_file(&agent, "held_m");
    assert!(after > commits);
    assert_eq!(in_file, 2);
    assert_eq!(points(&agent, "measurement=held_m").len(), 2);
    assert_eq!(engine_sum(&agent, engine, "latest"), 7.0);
}

/// A reader that polls (the UI's live refresh) asks for what the writer has taken without
/// waiting for what is queued (`X-Edgewatch-Read: stored`): its answers include the held
/// points and cost no commit, nor does the status read so. A header that names neither
/// mode is refused with 400, and the held points are neither lost nor committed by it.
#[test]
fn a_read_of_what_is_stored_commits_nothing_and_a_bad_read_mode_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_holding_two_udp_points(dir.path());
    let in_file = || points_in_file(&agent.dir.join("edgewatch.db"), "held_m");
    let query = agent.url("/api/v1/query?measurement=held_m&from=0&to=4000000000000000000");
    let stored = [("X-Edgewatch-Read", "stored")];
    let status = |h: &[(&str, &str)]| -> J {
        let (code, body) = get_with(&agent.url("/api/v1/status"), h).unwrap();
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    // Received and queued: the status read with `stored` says so without committing them.
    let queued = wait_for(Duration::from_secs(5), || {
        let st = status(&stored);
        (st["ingest"]["queue_points"].as_u64() >= Some(2)).then_some(st)
    })
    .expect("the datagram is queued");
    assert_eq!(queued["ingest"]["hold_ms"], 30_000);
    let commits = queued["ingest"]["commits"].as_u64().unwrap();
    let held = wait_for(Duration::from_secs(5), || {
        let (code, body) = get_with(&query, &stored).unwrap();
        assert_eq!(code, 200, "{body}");
        let v: J = serde_json::from_str(&body).unwrap();
        (v["series"][0]["points"].as_array().map(Vec::len) == Some(2)).then_some(())
    });
    assert!(
        held.is_some(),
        "a read of what is stored misses held points"
    );
    for _ in 0..3 {
        let (code, body) = get_with(&agent.url("/api/v1/series"), &stored).unwrap();
        assert_eq!(code, 200, "{body}");
    }
    let st = status(&stored);
    assert_eq!(st["ingest"]["commits"].as_u64(), Some(commits), "{st}");
    assert_eq!(
        in_file(),
        0,
        "a read of what is stored committed the held points"
    );
    // A mode the agent does not know: 400 naming the two it does; nothing read, nothing lost.
    for bad in ["fresh", "", "stored,latest"] {
        let (code, body) = get_with(&query, &[("X-Edgewatch-Read", bad)]).unwrap();
        assert_eq!(code, 400, "{bad:?}: {body}");
        assert!(
            body.contains("`latest`") && body.contains("`stored`"),
            "{bad:?}: {body}"
        );
    }
    assert_eq!(in_file(), 0);
    // Asking for the latest (as a read without the header does) sees both, committing
    // nothing; the status read so commits them.
    let (code, body) = get_with(&query, &[("X-Edgewatch-Read", "Latest")]).unwrap();
    assert_eq!(code, 200, "{body}");
    let v: J = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["series"][0]["points"].as_array().map(Vec::len),
        Some(2),
        "{body}"
    );
    assert_eq!(in_file(), 0);
    status(&[]);
    assert_eq!(in_file(), 2);
    assert_eq!(points(&agent, "measurement=held_m").len(), 2);
}

/// A scraper polls `/metrics` (Prometheus every 15 s by default): a scrape commits nothing,
/// yet it shows the newest values of points the writer still holds (the writer records
/// them as it accepts them), so a scrape per interval costs the store no transaction. The
/// held points are neither lost nor committed by it: the status read for the latest
/// commits them.
#[test]
fn a_scrape_shows_held_points_without_committing_them() {
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_past_its_first_cycle(dir.path());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let lines = format!(
        "held_scrape,app=x v=1 {}\nheld_scrape,app=x v=7 {now}\n",
        now - 1_000_000_000
    );
    sock.send_to(lines.as_bytes(), agent.udp).unwrap();
    let in_file = || points_in_file(&agent.dir.join("edgewatch.db"), "held_scrape");
    let stored = [("X-Edgewatch-Read", "stored")];
    let commits = || {
        let (code, body) = get_with(&agent.url("/api/v1/status"), &stored).unwrap();
        assert_eq!(code, 200, "{body}");
        let st: J = serde_json::from_str(&body).unwrap();
        st["ingest"]["commits"].as_u64().unwrap()
    };
    let before = commits();
    let scrape = || {
        let (code, body) = get(&agent.url("/metrics")).unwrap();
        assert_eq!(code, 200, "{body}");
        body
    };
    let shown = wait_for(Duration::from_secs(5), || {
        let body = scrape();
        body.lines()
            .any(|l| l == "held_scrape_v{app=\"x\"} 7")
            .then_some(body)
    });
    assert!(
        shown.is_some(),
        "the held point's value is not in /metrics: {}",
        scrape()
    );
    for _ in 0..3 {
        assert!(scrape().contains("edgewatch_commits_total"));
    }
    assert_eq!(commits(), before, "a scrape committed the held points");
    assert_eq!(in_file(), 0, "a scrape committed the held points");
    // Held, not lost: the status read for the latest commits both.
    agent.status();
    assert_eq!(in_file(), 2);
    assert_eq!(points(&agent, "measurement=held_scrape").len(), 2);
}

#[test]
fn udp_lines_are_stored() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.send_to(
        b"udp_m,app=x v=1 1000\nudp_m,app=x v=2 2000\nbad line\n",
        agent.udp,
    )
    .unwrap();
    let got = wait_for(Duration::from_secs(10), || {
        let p = points(&agent, "measurement=udp_m");
        (p.len() == 2).then_some(p)
    })
    .expect("udp points stored");
    assert_eq!(got[0].3, J::from(1.0));
    let st = agent.status();
    assert_eq!(st["ingest"]["udp_datagrams"], 1);
    assert_eq!(st["ingest"]["points_rejected"], 1);
}

#[test]
fn partial_write_stores_good_lines_and_names_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    assert_eq!(post(&agent.url("/write"), b"m v=0 1", &[]).unwrap().0, 204);
    let body = "m v=1 10\nm v=oops 11\n\nm,t= v=2 12\nm v=3i 13\nm v=4 14\n";
    let (code, resp) = post(&agent.url("/write"), body.as_bytes(), &[]).unwrap();
    assert_eq!(code, 400);
    let v: J = serde_json::from_str(&resp).unwrap();
    assert!(
        v["error"].as_str().unwrap().starts_with("partial write"),
        "{resp}"
    );
    let lines: Vec<i64> = v["line_errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["line"].as_i64().unwrap())
        .collect();
    assert_eq!(lines, vec![2, 4, 5]);
    let errs = v["line_errors"].to_string();
    assert!(
        errs.contains("oops") && errs.contains("type conflict"),
        "{errs}"
    );
    let got: Vec<i64> = points(&agent, "measurement=m")
        .iter()
        .map(|p| p.2)
        .collect();
    assert_eq!(got, vec![1, 10, 14]);
    // The 2.x API reports the same in its own error shape.
    let (code, resp) = post(&agent.url("/api/v2/write?bucket=b&org=o"), b"m v=", &[]).unwrap();
    assert_eq!(code, 400);
    let v: J = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["code"], "invalid");
    assert!(v["message"].as_str().unwrap().contains("line 1"));
}

#[test]
fn oversized_bodies_get_413_and_lose_nothing_stored() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &format!("{QUIET}[http]\nmax_body_bytes = 4096\n"),
    );
    assert_eq!(
        post(&agent.url("/write"), b"keep v=1 1", &[]).unwrap().0,
        204
    );
    let big = "m v=1 1\n".repeat(1000);
    let (code, resp) = post(&agent.url("/write"), big.as_bytes(), &[]).unwrap();
    assert_eq!(code, 413, "{resp}");
    assert!(resp.contains("max_body_bytes"), "{resp}");
    // A small gzip body that inflates past the limit is refused too.
    let bomb = gzip(&vec![b'#'; 1_000_000]);
    assert!(bomb.len() < 4096);
    let (code, _) = post(&agent.url("/write"), &bomb, &[("Content-Encoding", "gzip")]).unwrap();
    assert_eq!(code, 413);
    assert_eq!(points(&agent, "measurement=keep").len(), 1);
    assert!(points(&agent, "measurement=m").is_empty());
    assert_eq!(agent.status()["ingest"]["writes_too_large"], 2);
}

#[test]
fn unknown_paths_are_404_and_wrong_methods_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let (code, body) = post(&agent.url("/nope"), b"m v=1", &[]).unwrap();
    assert_eq!(code, 404, "{body}");
    assert_eq!(get(&agent.url("/api/v1/nothing")).unwrap().0, 404);
    assert_ne!(get(&agent.url("/write")).unwrap().0, 204);
    let (code, body) = get(&agent.url("/api/v1/query?from=0")).unwrap();
    assert_eq!(code, 400);
    assert!(body.contains("measurement"), "{body}");
}

#[test]
fn series_cap_rejects_new_series_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), &format!("{QUIET}[storage]\nmax_series = 3\n"));
    let (code, _) = post(
        &agent.url("/write"),
        b"m,req=1 a=1,b=2 1\nm,req=2 a=1 2",
        &[],
    )
    .unwrap();
    assert_eq!(code, 204);
    let (code, resp) = post(&agent.url("/write"), b"m,req=3 a=1 3\nm,req=1 a=5 4", &[]).unwrap();
    assert_eq!(code, 400);
    assert!(
        resp.contains("series limit") && resp.contains("max_series"),
        "{resp}"
    );
    assert_eq!(points(&agent, "measurement=m").len(), 4);
}

#[test]
fn a_full_queue_answers_503_with_retry_after_and_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        dir.path(),
        &format!("{QUIET}[ingest]\nqueue_points = 2000\nmax_batch_points = 2000\n[storage]\nsynchronous = \"full\"\n"),
    );
    let url = agent.url("/write");
    let results: Vec<(usize, u16, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let url = url.clone();
                s.spawn(move || {
                    let mut out = Vec::new();
                    for i in 0..15 {
                        let id = t * 100 + i;
                        let body: String = (0..1500)
                            .map(|j| format!("flood,req={id} v={j} {}\n", j + 1))
                            .collect();
                        let (code, resp) = post(&url, body.as_bytes(), &[]).unwrap();
                        out.push((id, code, resp));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let ok: Vec<usize> = results.iter().filter(|r| r.1 == 204).map(|r| r.0).collect();
    let busy: Vec<&(usize, u16, String)> = results.iter().filter(|r| r.1 == 503).collect();
    assert_eq!(
        ok.len() + busy.len(),
        results.len(),
        "only 204 or 503 expected"
    );
    assert!(
        !busy.is_empty(),
        "8 concurrent writers of 1500 points against a 2000-point queue never saw 503"
    );
    assert!(busy[0].2.starts_with("Retry-After: "), "{}", busy[0].2);
    assert!(busy[0].2.contains("queue full"), "{}", busy[0].2);
    // Every acknowledged request is stored entirely; refused ones not at all.
    for (id, code, _) in &results {
        let n = points(
            &agent,
            &format!("measurement=flood&tag.req={id}&limit=10000"),
        )
        .len();
        assert_eq!(
            n,
            if *code == 204 { 1500 } else { 0 },
            "req {id} answered {code}"
        );
    }
    assert_eq!(agent.status()["ingest"]["writes_throttled"], busy.len());
}

#[test]
fn a_udp_flood_is_counted_not_buffered_without_bound() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), &format!("{QUIET}[ingest]\nqueue_points = 5\n"));
    assert_eq!(
        post(&agent.url("/write"), b"before v=1 1", &[]).unwrap().0,
        204
    );
    // Held points keep their queue capacity until their commit; a read commits them, so
    // the flood meets an empty queue.
    assert_eq!(agent.status()["ingest"]["queue_points"], 0);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sent = 3000u64;
    for i in 0..sent {
        // Distinct timestamps: every stored point can be counted back from the store.
        let dgram: String = (0..5)
            .map(|j| format!("udpflood v={j} {}\n", i * 5 + j + 1))
            .collect();
        let _ = sock.send_to(dgram.as_bytes(), agent.udp);
    }
    // Wait until the agent has handled every datagram it received: the queue is empty,
    // every received point is written or dropped, and no datagram arrives meanwhile.
    let mut last = u64::MAX;
    let st = wait_for(Duration::from_secs(20), || {
        let st = agent.status();
        let i = &st["ingest"];
        let received = i["udp_datagrams"].as_u64()?;
        let settled = received > 0
            && received == last
            && i["queue_points"] == 0
            && i["points_written"].as_u64()? - 1 + i["points_dropped"].as_u64()? == received * 5;
        last = received;
        settled.then_some(st)
    })
    .unwrap_or_else(|| panic!("UDP ingest did not settle: {}", agent.status()));
    let written = st["ingest"]["points_written"].as_u64().unwrap() - 1;
    let dropped = st["ingest"]["points_dropped"].as_u64().unwrap();
    assert!(
        dropped > 0,
        "3000 datagrams of 5 points against a 5-point queue dropped nothing: {st}"
    );
    assert!(written > 0, "{st}");
    assert_eq!(st["ingest"]["queue_capacity"], 5);
    // Everything counted as written is in the store, exactly once.
    let stored = points(&agent, "measurement=udpflood&limit=100000");
    assert_eq!(stored.len() as u64, written, "{st}");
    // The agent still answers and earlier data is intact.
    assert_eq!(points(&agent, "measurement=before").len(), 1);
}

#[test]
fn a_request_larger_than_the_whole_queue_gets_413_and_the_bound_holds() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), &format!("{QUIET}[ingest]\nqueue_points = 10\n"));
    let keep: String = (0..4).map(|j| format!("keep v={j} {}\n", j + 1)).collect();
    assert_eq!(
        post(&agent.url("/write"), keep.as_bytes(), &[]).unwrap().0,
        204
    );
    // 11 good points (and a bad line, which does not count): refused whole, on both APIs.
    let big: String = (0..11)
        .map(|j| format!("big v={j} {}\n", j + 1))
        .chain(["big v=oops 99\n".to_string()])
        .collect();
    let (code, resp) = post(&agent.url("/write"), big.as_bytes(), &[]).unwrap();
    assert_eq!(code, 413, "{resp}");
    let v: J = serde_json::from_str(&resp).unwrap();
    assert_eq!(
        v["error"],
        "request holds 11 points, more than the ingest queue can hold ([ingest] queue_points = 10); \
         nothing was stored: send at most 10 points per request",
        "{resp}"
    );
    let (code, resp) = post(
        &agent.url("/api/v2/write?bucket=b"),
        &gzip(big.as_bytes()),
        &[("Content-Encoding", "gzip")],
    )
    .unwrap();
    assert_eq!(code, 413, "{resp}");
    let v: J = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["code"], "request too large", "{resp}");
    assert!(
        v["message"].as_str().unwrap().contains("queue_points = 10"),
        "{resp}"
    );
    // Nothing of it is stored or held; what was stored before is intact.
    assert!(points(&agent, "measurement=big").is_empty());
    assert_eq!(points(&agent, "measurement=keep").len(), 4);
    let st = agent.status();
    assert_eq!(st["ingest"]["queue_points"], 0, "{st}");
    assert_eq!(st["ingest"]["queue_capacity"], 10, "{st}");
    assert_eq!(st["ingest"]["points_written"], 4, "{st}");
    assert_eq!(st["ingest"]["writes_too_large"], 2, "{st}");
    // Exactly the capacity is one request the queue holds.
    let full: String = (0..10).map(|j| format!("full v={j} {}\n", j + 1)).collect();
    assert_eq!(
        post(&agent.url("/write"), full.as_bytes(), &[]).unwrap().0,
        204
    );
    assert_eq!(points(&agent, "measurement=full").len(), 10);
    // A UDP datagram larger than the queue is dropped whole and counted.
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.send_to(big.as_bytes(), agent.udp).unwrap();
    let st = wait_for(Duration::from_secs(10), || {
        let st = agent.status();
        (st["ingest"]["points_dropped"] == 11).then_some(st)
    })
    .unwrap_or_else(|| panic!("the oversized datagram was not counted: {}", agent.status()));
    assert_eq!(st["ingest"]["udp_datagrams"], 1, "{st}");
    assert_eq!(st["ingest"]["points_written"], 14, "{st}");
    assert!(points(&agent, "measurement=big").is_empty());
    let log = agent.log_text();
    assert!(
        log.contains("a batch larger than the whole ingest queue was dropped"),
        "{log}"
    );
}

/// Runs a Python snippet; the test command installs the client libraries.
fn python(script: &str) -> (bool, String) {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
        .expect("python3");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn real_influx_client_libraries_work_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), QUIET);
    let port = agent.http.port();
    // InfluxDB 1.x client (`pip install influxdb`).
    let (ok, out) = python(&format!(
        r#"
from influxdb import InfluxDBClient
c = InfluxDBClient(host="127.0.0.1", port={port}, username="u", password="p", database="edge")
print("ping", c.ping())
ok = c.write_points([{{"measurement": "inference", "tags": {{"model": "yolo", "app": "py1"}},
    "time": 1764000000000000000, "fields": {{"wall_ms": 11.5, "batch_size": 2}}}}], time_precision="n")
assert ok
"#
    ));
    assert!(ok, "influxdb (1.x) client failed — is it installed? (the README test command installs it)\n{out}");
    // InfluxDB 2.x client (`pip install influxdb-client`), synchronous and gzip.
    let (ok, out) = python(&format!(
        r#"
from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
with InfluxDBClient(url="http://127.0.0.1:{port}", token="t", org="o", enable_gzip=True) as c:
    w = c.write_api(write_options=SYNCHRONOUS)
    w.write(bucket="edge", record=Point("inference").tag("model", "yolo").tag("app", "py2")
        .field("wall_ms", 13.25).time(1764000001000, WritePrecision.MS))
    w.write(bucket="edge", record="inference,model=yolo,app=py2 wall_ms=14.0 1764000002000000000")
"#
    ));
    assert!(ok, "influxdb-client (2.x) failed — is it installed?\n{out}");
    let got = points(&agent, "measurement=inference&field=wall_ms");
    let vals: Vec<(String, J)> = got.into_iter().map(|p| (p.0, p.3)).collect();
    assert_eq!(
        vals,
        vec![
            ("app=py1,model=yolo".into(), J::from(11.5)),
            ("app=py2,model=yolo".into(), J::from(13.25)),
            ("app=py2,model=yolo".into(), J::from(14.0)),
        ]
    );
}
