//! Alert evaluation benchmark: the cost of evaluating 100 rules plus the 8 built-ins over a
//! store of 1,000 series, as the agent's evaluator does it every `[alerts] interval`.
//!
//! The store is built like the query bench's (the Writer directly, `inference` latencies
//! from the same deterministic log-normal generator), widened to 1,000 series (50 models x
//! 20 hosts, field `wall_ms`): the last 2 h at one point per 5 s per series (1.44 M points),
//! rolled up once by the rollup job (as `edgewatch maintain` runs it), so a window reads the
//! 1-minute tier plus the raw tail as in the agent. The 100 rules follow the shape:
//! each watches one model (`tags = { model = .. }`, 20 series) grouped by `host`, a quarter
//! each `p99 > x over 5m` (raw points: exact percentiles), `p99 / p50 over 5m`, `mean over
//! 15m` (1-minute tier + raw tail) and `max over 1h`, thresholds set so some fire. Each
//! cycle runs `alert::task::Evaluator::evaluate` (queries, state machine, the state
//! transaction with its outbox entries) exactly as the agent's task does.
//!
//! Prints the median and max wall time of one cycle, its CPU time (this thread's) and its
//! heap allocations (a counting global allocator), and the CPU share of one core at a 15 s
//! interval. Target: under 0.5 % of a core.
//!
//! Between cycles (untimed), 15 s of new points arrive (3 per series) and every second cycle
//! the rollup job runs, as in the agent, folding each tier at the agent's cadence (`[rollup]
//! fold_every`, 1 min by default; `BENCH_FOLD_EVERY=S` seconds sets it; between folds the
//! windows read a growing raw tail, so run at least a cadence's worth of cycles:
//! `BENCH_RUNS=81` covers two strides of 10 min, `BENCH_RUNS=241` one of 1 h).
//! `BENCH_LIVE=0`: a static store. `BENCH_CACHE=0` turns the evaluator's cross-cycle row
//! cache off, to compare in the same build.
//!
//! Run: `cargo bench --bench alerts` (`BENCH_RUNS=N` cycles, default 20). `BENCH_SCALE=K`
//! multiplies the models (so the series) and the rules by K: `BENCH_SCALE=10` is 1,000 rules
//! over 10,000 series (500 models x 20 hosts), to show how a cycle grows.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgewatch::alert::config::{AggName, AlertRuleConfig, NoData, Op, RuleName};
use edgewatch::alert::task::{Evaluator, Setup};
use edgewatch::config::values::Interval;
use edgewatch::config::{Config, Synchronous};
use edgewatch::model::{series_key, Batch, Line, Value};
use edgewatch::rollup::{Job, Plan};
use edgewatch::store::Writer;

const NS: i64 = 1_000_000_000;
const MODELS: usize = 50;
const HOSTS: usize = 20;
const SPAN_S: i64 = 2 * 3600;
const EVERY_S: i64 = 5;
const RULES: usize = 100;
const INTERVAL_S: f64 = 15.0;
const TARGET_PCT: f64 = 0.5;

/// The system allocator, counting allocations (the cycle's allocations are the difference
/// of two readings: the bench runs the evaluator on its own thread, nothing else allocates).
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

/// The live run's clock, for the writer (it splits a commit's chunks at the current minute,
/// as the agent's does at the real one).
static CLOCK: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

fn bench_clock() -> i64 {
    CLOCK.load(Ordering::Relaxed)
}

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The query bench's generator: xorshift uniforms, Box-Muller normal, log-normal latency.
struct Gen {
    x: u64,
}

impl Gen {
    fn uniform(&mut self) -> f64 {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        ((self.x >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn wall_ms(&mut self, model: usize) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let mu = (4.0 + (model % 20) as f64).ln();
        (mu + 0.35 * z).exp()
    }

    /// One `wall_ms` point at `ts` for every `(model, series key)` of `keys`, into `batch`.
    fn push_step(&mut self, batch: &mut Batch, keys: &[(usize, String)], ts: i64) {
        for (m, key) in keys {
            batch.lines.push(Line {
                key: key.clone(),
                fields: vec![("wall_ms".into(), Value::F64(self.wall_ms(*m)))],
                ts,
                line_no: batch.lines.len() as u32 + 1,
            });
        }
    }
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer to a timespec on the stack.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn rule(i: usize, models: usize) -> AlertRuleConfig {
    let model = format!("m{}", i % models);
    let agg = |s: &str| AggName::try_from(s.to_string()).expect("agg");
    let (a, ratio, window, threshold) = match i % 4 {
        0 => ("p99", None, 300, 20.0),
        1 => ("p99", Some("p50"), 300, 2.0),
        2 => ("mean", None, 900, 15.0),
        _ => ("max", None, 3600, 40.0),
    };
    AlertRuleConfig {
        name: RuleName(format!("Rule{i}")),
        measurement: "inference".into(),
        field: "wall_ms".into(),
        tags: BTreeMap::from([("model".to_string(), model)]),
        group_by: vec!["host".into()],
        agg: agg(a),
        ratio_of: ratio.map(agg),
        window: Interval(Duration::from_secs(window)),
        op: Op::Gt,
        threshold,
        for_: Interval(Duration::ZERO),
        keep_firing_for: Interval(Duration::ZERO),
        no_data: NoData::Ok,
        severity: "warning".into(),
        summary: "{model} on {host}: {value}".into(),
        labels: BTreeMap::new(),
    }
}

fn main() {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(20);
    let scale: usize = std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1);
    let models = MODELS * scale;
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("edgewatch");
    let keys: Vec<(usize, String)> = (0..models)
        .flat_map(|m| {
            (0..HOSTS).map(move |h| {
                (
                    m,
                    series_key(
                        "inference",
                        &[("model", &format!("m{m}")), ("host", &format!("h{h}"))],
                    ),
                )
            })
        })
        .collect();
    let mut gen = Gen {
        x: 0x9E37_79B9_7F4A_7C15,
    };
    let now_s = edgewatch::now_ns() / NS;
    let start = (now_s - SPAN_S) * NS;
    let t = Instant::now();
    let mut w = Writer::open(&dir, 100_000, Synchronous::Normal).expect("open writer");
    let mut batch = Batch::default();
    let mut points = 0usize;
    for step in 0..SPAN_S / EVERY_S {
        gen.push_step(&mut batch, &keys, start + step * EVERY_S * NS);
        // Five steps per write: chunks of 5 points per series, whatever the series count.
        if batch.lines.len() >= 5 * keys.len() {
            points += w.write(&[&batch]).expect("write")[0].points;
            batch.lines.clear();
        }
    }
    if !batch.lines.is_empty() {
        points += w.write(&[&batch]).expect("write")[0].points;
    }
    drop(w);
    let mut plan = Plan::from_config(&Config::default()).expect("plan");
    if let Some(s) = std::env::var("BENCH_FOLD_EVERY")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
    {
        plan.fold_every_ns = s * NS;
    }
    let mut job = Job::open(&dir, plan.clone()).expect("rollup job");
    job.run_once(edgewatch::now_ns(), &|| false)
        .expect("rollup");
    drop(job);
    println!(
        "alerts benchmark: {} series, {points} points over {} h at 1/{EVERY_S}s, rolled up ({:.1} s to build)",
        keys.len(),
        SPAN_S / 3600,
        t.elapsed().as_secs_f64()
    );

    // BENCH_BUILTIN=0 leaves the built-ins out; BENCH_RULES=N sets how many user rules.
    let user: usize = std::env::var("BENCH_RULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(RULES * scale);
    let mut cfg = Config {
        alert: (0..user).map(|i| rule(i, models)).collect(),
        ..Config::default()
    };
    cfg.alerts.builtin = std::env::var("BENCH_BUILTIN").as_deref() != Ok("0");
    let rules = edgewatch::alert::rules::compile(&cfg.alerts, &cfg.alert);
    let n_rules = rules.len();
    let setup = Setup {
        rules,
        interval: Duration::from_secs(15),
        data_dir: dir.clone(),
        plan: Arc::new(plan.clone()),
        inputs: edgewatch::alert::observe::Inputs {
            stats: Arc::default(),
            forward: Default::default(),
            db_path: edgewatch::store::db_path(&dir),
            max_bytes: plan.max_bytes,
            clock_floor_ns: plan.clock_floor_ns,
        },
        identity: vec![("device_id".into(), "bench".into())],
        base_url: "http://127.0.0.1:9400".into(),
        points: None,
        held: None,
    };
    let mut ev = Evaluator::open(setup, edgewatch::now_ns()).expect("evaluator");
    // BENCH_CACHE=0 turns the cross-cycle row cache off (the same run's "before").
    let cache = std::env::var("BENCH_CACHE").as_deref() != Ok("0");
    if !cache {
        ev = ev.without_row_cache();
    }
    // BENCH_LIVE=0: no data arrives between cycles (every cycle reads the same store).
    // Default: as in the agent, 15 s of points (3 per series) arrive before each cycle and
    // the rollup job runs every second cycle (its 30 s default), untimed.
    let live = std::env::var("BENCH_LIVE").as_deref() != Ok("0");
    let mut w = Writer::open(&dir, 100_000, Synchronous::Normal).expect("open writer");
    let mut job = Job::open(&dir, plan.clone()).expect("rollup job");
    job.fold_cadence = true;
    w.set_clock(bench_clock);
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    // Cycles that opened no incident (their CPU), and incidents opened / snapshot wall ms.
    let mut cpu_quiet: Vec<f64> = Vec::new();
    let (mut opened, mut snapshot_ms) = (0u64, 0.0f64);
    let mut allocs = Vec::new();
    let mut firing = 0;
    // Live: a clock that advances one interval per cycle from now (the cycles run back to
    // back; the store, the rollup job and the evaluator all take this time).
    let t_start = edgewatch::now_ns();
    let clock = |i: usize| {
        if live {
            t_start + i as i64 * INTERVAL_S as i64 * NS
        } else {
            edgewatch::now_ns()
        }
    };
    for i in 0..runs {
        if live && i > 0 {
            let now = clock(i);
            CLOCK.store(now, Ordering::Relaxed);
            for k in 0..3 {
                gen.push_step(&mut batch, &keys, now - (2 - k) * EVERY_S * NS);
            }
            w.write(&[&batch]).expect("write");
            batch.lines.clear();
            if i % 2 == 0 {
                job.run_once(now, &|| false).expect("rollup");
            }
        }
        let (t, c, a) = (Instant::now(), thread_cpu(), ALLOCS.load(Ordering::Relaxed));
        let now = clock(i);
        let (items, status) = ev.evaluate(now);
        let (dw, dc) = (t.elapsed(), thread_cpu() - c);
        let da = ALLOCS.load(Ordering::Relaxed) - a;
        assert!(status.rule_errors.is_empty(), "{:?}", status.rule_errors);
        assert!(status.store_error.is_none(), "{:?}", status.store_error);
        if i == 0 {
            firing = items.iter().filter(|a| a.state == "firing").count();
            println!(
                "first cycle (fires {firing} instances, opens their rows and outbox entries): {:.1} ms",
                dw.as_secs_f64() * 1e3
            );
        } else {
            wall.push(dw.as_secs_f64() * 1e3);
            cpu.push(dc.as_secs_f64() * 1e3);
            allocs.push(da as f64);
            opened += status.last_incidents;
            snapshot_ms += status.last_incidents_ms;
            if status.last_incidents == 0 {
                cpu_quiet.push(dc.as_secs_f64() * 1e3);
            }
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let max = wall.iter().copied().fold(0.0, f64::max);
    let (wm, cm, am) = (med(&mut wall), med(&mut cpu), med(&mut allocs));
    let share = cm / 1e3 / INTERVAL_S * 100.0;
    println!(
        "row cache {}, data {}",
        if cache { "on" } else { "off (BENCH_CACHE=0)" },
        if live {
            format!(
                "arriving between cycles, rollup job every second cycle (tiers folded every {} s)",
                plan.tiers
                    .iter()
                    .map(|t| (plan.fold_every_ns(t) / NS).to_string())
                    .collect::<Vec<_>>()
                    .join(" / ")
            )
        } else {
            "static (BENCH_LIVE=0)".into()
        }
    );
    println!(
        "{n_rules} rules ({user} + {} built-in), {firing} instances firing: one cycle median {wm:.1} ms wall (max {max:.1}), {cm:.1} ms CPU, {am:.0} allocations over {} cycles",
        n_rules - user,
        wall.len()
    );
    let cycles = wall.len().max(1) as f64;
    let quiet = cpu_quiet.len();
    let cq = med(&mut cpu_quiet);
    println!(
        "incidents: {opened} opened over {} cycles ({:.1} a cycle), their snapshots {:.1} ms wall a cycle; \
         the {quiet} cycles that opened none: {cq:.1} ms CPU median ({:.3} % of one core at {INTERVAL_S} s)",
        wall.len(),
        opened as f64 / cycles,
        snapshot_ms / cycles,
        cq / 1e3 / INTERVAL_S * 100.0
    );
    println!(
        "CPU share at a {INTERVAL_S} s interval: {share:.3} % of one core (target < {TARGET_PCT} %): {}",
        if share < TARGET_PCT { "ok" } else { "OVER" }
    );
}
