//! The read side of the HTTP server: `/health`, `/ping`, `/api/v1/series` (paged, filtered),
//! `/api/v1/fields` (measurement + field pairs),
//! `/api/v1/query` (raw points, or aggregates over rollup tiers with `step`/`agg`),
//! `/api/v1/inference` (derived latency signals), `/api/v1/llm` (LLM serving signals:
//! TTFT, ITL, tokens per second and per joule), `/api/v1/incidents` and
//! `/api/v1/incidents/{id}` (alert incidents with their triage snapshots), `/api/v1/status` (the one place the
//! status document, [`Status`], is assembled) and, in `reload.rs`, `/api/v1/config` and
//! `POST /api/v1/reload` (which asks the reloader: the one route that changes anything). It only reads — through its own
//! read-only SQLite connection, on the blocking pool — and never writes: writes go through
//! ingest like everything else. A read reads the points the writer holds with the store's,
//! without a commit, after the writer has taken what was queued before it (read-your-writes),
//! unless its `X-Edgewatch-Read: stored` asks it not to wait ([`Read`]: the UI's live
//! refresh); the status read for the latest commits them first, since its counters are of
//! committed points. It never holds more than an answer's bound: large answers
//! are streamed ([`body`]), and `params.rs` holds the page and answer bounds, checked before
//! a query reads.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use warp::http::StatusCode;
use warp::reply::Response;
use warp::{Filter, Reply};

use crate::queue::IngestHandle;
use crate::stats::Stats;
use crate::status::{self, Status};
use crate::store::{Reader, StoreError};

pub mod body;
mod params;
mod reload;

pub use params::{agg_query_from_params, inference_query_from_params, raw_query_from_params};
pub use params::{incidents_from_params, INCIDENTS_PAGE, MAX_INCIDENTS_PAGE};
pub use params::{
    series_filter_from_params, MAX_AGG_SERIES, MAX_AGG_VALUES, MAX_RAW_POINTS, MAX_SERIES_PAGE,
    SERIES_PAGE,
};

/// The request header through which a reader says whether its answer must include the
/// points the writer still holds ([`Read`]).
pub const READ_HEADER: &str = "x-edgewatch-read";

/// How a read treats the points the writer holds for a shared commit (UDP, collectors and
/// small acknowledged writes, up to `[ingest] flush_interval`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Read {
    /// Read-your-writes, the default: every point written before the request is in its
    /// answer. The read waits until the writer has taken what was queued before it, then
    /// reads the points the writer holds with the store, without a commit
    /// ([`crate::store::Reader::read_with_held`]). The status is the exception: its counters
    /// are of committed points, so a read of the latest commits what is held first (a
    /// commit of its own, its pages and its sync, when points are held).
    #[default]
    Latest,
    /// What the writer has taken so far, without waiting for what is still queued and
    /// without a commit: point reads include the held points, and the status counts only
    /// committed ones (up to the hold behind). For a reader that polls (the UI's live
    /// refresh, a dashboard, a scraper of `/metrics`).
    Stored,
}

impl Read {
    /// The mode a request's [`READ_HEADER`] asks for (`latest` when it has none).
    pub fn from_header(value: Option<&str>) -> Result<Read, BadRequest> {
        match value.map(str::trim) {
            None => Ok(Read::Latest),
            Some(v) if v.eq_ignore_ascii_case("latest") => Ok(Read::Latest),
            Some(v) if v.eq_ignore_ascii_case("stored") => Ok(Read::Stored),
            Some(v) => Err(BadRequest(format!(
                "X-Edgewatch-Read must be `latest` (commit held points first, the default) or `stored` (what is stored now), not {v:?}"
            ))),
        }
    }
}

/// A request the API refuses with 400 before reading anything; the message says why.
#[derive(Debug)]
pub struct BadRequest(pub String);

impl warp::reject::Reject for BadRequest {}

/// What the read API needs.
#[derive(Clone)]
pub struct ApiCtx {
    /// How this request reads: [`Read::Latest`] unless its [`READ_HEADER`] says otherwise
    /// (set per request by the routes' filter).
    pub read: Read,
    /// `[ingest] flush_interval`: the longest the writer holds points, which a
    /// [`Read::Stored`] answer may be behind (in the status, for the UI's refresh period).
    pub hold: Duration,
    /// Read-only connection to the store.
    pub reader: Arc<Mutex<Reader>>,
    /// What the writer holds for its next commit, read with the store by the point reads
    /// (queries, the query engine) so that they need no commit (`None`: a read of the latest
    /// commits what is held first).
    pub held: Option<Arc<crate::store::HeldView>>,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Queue, for its depth.
    pub handle: IngestHandle,
    /// When the agent started.
    pub started: Instant,
    /// Series cap, for the status page.
    pub max_series: usize,
    /// `[storage] synchronous`, for the status page.
    pub synchronous: crate::config::Synchronous,
    /// Database file.
    pub db_path: PathBuf,
    /// Tiers, retention and budget (query engine and status).
    pub plan: crate::status::Live<crate::rollup::Plan>,
    /// `[inference]` (batch efficiency).
    pub inference: crate::status::Live<crate::engine::InferenceConfig>,
    /// NVML collector state (GPUs, lost GPUs, unsupported metrics).
    pub nvml: Arc<crate::collect::nvml::NvmlStatus>,
    /// The tegrastats collector's state.
    pub tegrastats: Arc<crate::collect::tegrastats::TegrastatsStatus>,
    /// The `[[scrape]]` targets' state.
    pub scrape: crate::status::Live<crate::collect::scrape::ScrapeStatus>,
    /// The `[jetson]` collector's state (identity, power mode, throttling).
    pub jetson: Arc<crate::collect::jetson::JetsonStatus>,
    /// The `[kmsg]` kernel log collector's state.
    pub kmsg: Arc<crate::collect::kmsg::KmsgStatus>,
    /// The `[[process]]` watcher's state.
    pub process: crate::status::Live<crate::collect::process::ProcessStatus>,
    /// Forwarder sinks (`forward` in the status).
    pub forward: crate::status::Live<crate::forward::ForwardStatus>,
    /// The newest value of every numeric series, kept by the writer (`/metrics`).
    pub latest: Arc<crate::store::LatestValues>,
    /// `[http]` (which measurements `/metrics` exports).
    pub http: Arc<crate::config::HttpConfig>,
    /// The alert notifiers (`notify` in the status).
    pub notify: crate::status::Live<crate::alert::notify::NotifyStatus>,

    /// The alert evaluator's last evaluation (`/api/v1/alerts`, `alerts` in the status).
    pub alerts: Arc<crate::alert::view::AlertsView>,
    /// The effective config, its reloads, and where reload requests go.
    pub config: Arc<crate::status::config::ConfigState>,
}

fn json_error(status: StatusCode, message: &str) -> Response {
    warp::reply::with_status(warp::reply::json(&json!({ "error": message })), status)
        .into_response()
}

fn store_error(e: &StoreError) -> Response {
    json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())
}

/// The answer of a raw `/api/v1/query`.
#[derive(serde::Serialize)]
struct RawAnswer {
    measurement: String,
    from: i64,
    to: i64,
    tier: &'static str,
    truncated: bool,
    series: Vec<crate::store::query::SeriesPoints>,
}

/// Runs `f` with the reader on the blocking pool.
async fn with_reader<T, F>(ctx: &ApiCtx, f: F) -> Result<T, Response>
where
    T: Send + 'static,
    F: FnOnce(&Reader) -> Result<T, StoreError> + Send + 'static,
{
    // Read-your-writes without a commit: once the writer has taken everything queued
    // before the request (`IngestHandle::catch_up`), every point is stored or held, and the
    // point reads add the held ones (`Reader::read_with_held`). A request that reads what is
    // stored reads the held points too, without waiting. With no view of the held points,
    // a read of the latest commits them first (`IngestHandle::settle`).
    if ctx.read == Read::Latest {
        match ctx.held {
            Some(_) => ctx.handle.catch_up().await,
            None => ctx.handle.settle().await,
        }
    }
    let (reader, held) = (ctx.reader.clone(), ctx.held.clone());
    match tokio::task::spawn_blocking(move || {
        let guard = reader.lock().unwrap_or_else(|p| p.into_inner());
        match held {
            Some(view) => guard.read_with_held(&view, f),
            None => f(&guard),
        }
    })
    .await
    {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(store_error(&e)),
        Err(e) => Err(json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("query task failed: {e}"),
        )),
    }
}

/// Answers an engine result (its JSON streamed): 400 for a bad query, 500 for a store
/// failure.
fn engine_reply<T: serde::Serialize + Send + 'static>(
    res: Result<Result<T, crate::engine::EngineError>, Response>,
) -> Response {
    match res {
        Ok(Ok(v)) => body::json(v),
        Ok(Err(crate::engine::EngineError::BadQuery(e))) => json_error(StatusCode::BAD_REQUEST, &e),
        Ok(Err(e)) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        Err(resp) => resp,
    }
}

/// Every read route.
pub fn routes(ctx: ApiCtx) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // Each request's context, with the read mode its header asks for (a bad value: 400).
    let with = {
        let ctx = ctx.clone();
        warp::header::optional::<String>(READ_HEADER).and_then(move |h: Option<String>| {
            let ctx = ctx.clone();
            async move {
                let read = Read::from_header(h.as_deref()).map_err(warp::reject::custom)?;
                Ok::<ApiCtx, warp::Rejection>(ApiCtx { read, ..ctx })
            }
        })
    };
    let health = warp::path("health")
        .and(warp::path::end())
        .and(warp::get())
        .map(|| {
            warp::reply::json(&json!({ "status": "ok", "version": env!("CARGO_PKG_VERSION") }))
                .into_response()
        });
    // InfluxDB clients probe /ping before writing.
    let ping = warp::path("ping")
        .and(warp::path::end())
        .and(warp::get().or(warp::head()).unify())
        .map(|| {
            let mut r = StatusCode::NO_CONTENT.into_response();
            let h = r.headers_mut();
            h.insert(
                "X-Influxdb-Version",
                warp::http::HeaderValue::from_static("1.8.10"),
            );
            h.insert(
                "X-Influxdb-Build",
                warp::http::HeaderValue::from_static("OSS"),
            );
            h.insert(
                "X-Edgewatch-Version",
                warp::http::HeaderValue::from_static(env!("CARGO_PKG_VERSION")),
            );
            r
        });
    let series = warp::path!("api" / "v1" / "series")
        .and(warp::get())
        .and(warp::query::<HashMap<String, String>>())
        .and(with.clone())
        .then(|q: HashMap<String, String>, ctx: ApiCtx| async move {
            let filter = match series_filter_from_params(&q) {
                Ok(f) => f,
                Err(e) => return json_error(StatusCode::BAD_REQUEST, &e),
            };
            let res = with_reader(&ctx, move |r| {
                // The total only on the first page: a count reads every matching row.
                let total = match filter.after {
                    None => Some(r.series_matching(&filter)?),
                    Some(_) => None,
                };
                let mut out = Vec::with_capacity(64 * 1024);
                out.extend_from_slice(b"{\"series\":");
                let next = r.series_page_json(&filter, &mut out)?;
                let tail = json!({
                    "next": next.as_ref().map(|(k, f)| params::cursor(k, f)),
                    "total": total,
                });
                out.extend_from_slice(b",\"next\":");
                out.extend_from_slice(tail["next"].to_string().as_bytes());
                if total.is_some() {
                    out.extend_from_slice(b",\"total\":");
                    out.extend_from_slice(tail["total"].to_string().as_bytes());
                }
                out.push(b'}');
                Ok(out)
            })
            .await;
            match res {
                Ok(body) => {
                    let mut r = Response::new(body.into());
                    r.headers_mut().insert(
                        warp::http::header::CONTENT_TYPE,
                        warp::http::HeaderValue::from_static("application/json"),
                    );
                    r
                }
                Err(resp) => resp,
            }
        });
    let fields = warp::path!("api" / "v1" / "fields")
        .and(warp::get())
        .and(warp::query::<HashMap<String, String>>())
        .and(with.clone())
        .then(|q: HashMap<String, String>, ctx: ApiCtx| async move {
            let m = q.get("measurement").filter(|m| !m.is_empty()).cloned();
            match with_reader(&ctx, move |r| r.fields(m.as_deref(), MAX_SERIES_PAGE)).await {
                Ok((fields, truncated)) => {
                    warp::reply::json(&json!({ "fields": fields, "truncated": truncated }))
                        .into_response()
                }
                Err(resp) => resp,
            }
        });
    let query = warp::path!("api" / "v1" / "query")
        .and(warp::get())
        .and(warp::query::<HashMap<String, String>>())
        .and(with.clone())
        .then(|q: HashMap<String, String>, ctx: ApiCtx| async move {
            // `step` and/or `agg`: the query engine (rollup tiers); otherwise raw points.
            match agg_query_from_params(&q, crate::now_ns()) {
                Err(e) => return json_error(StatusCode::BAD_REQUEST, &e),
                Ok(Some(aq)) => {
                    let plan = ctx.plan.get();
                    let res = with_reader(&ctx, move |r| {
                        let n = r.count_numeric(&aq.measurement, &aq.field, &aq.tags)?;
                        if let Err(e) = params::answer_size(n, aq.from, aq.to, aq.step_ns) {
                            return Ok(Err(crate::engine::EngineError::BadQuery(e)));
                        }
                        Ok(crate::engine::query(r, &plan, &aq, crate::now_ns()))
                    })
                    .await;
                    return engine_reply(res);
                }
                Ok(None) => {}
            }
            let rq = match raw_query_from_params(&q, crate::now_ns()) {
                Ok(rq) => rq,
                Err(e) => return json_error(StatusCode::BAD_REQUEST, &e),
            };
            let (m, from, to) = (rq.measurement.clone(), rq.from, rq.to);
            match with_reader(&ctx, move |r| r.query_raw(&rq)).await {
                Ok(res) => body::json(RawAnswer {
                    measurement: m,
                    from,
                    to,
                    tier: "raw",
                    truncated: res.truncated,
                    series: res.series,
                }),
                Err(resp) => resp,
            }
        });
    let inference = warp::path!("api" / "v1" / "inference")
        .and(warp::get())
        .and(warp::query::<HashMap<String, String>>())
        .and(with.clone())
        .then(|q: HashMap<String, String>, ctx: ApiCtx| async move {
            let now = crate::now_ns();
            let iq = match inference_query_from_params(&q, now) {
                Ok(iq) => iq,
                Err(e) => return json_error(StatusCode::BAD_REQUEST, &e),
            };
            let (plan, inf) = (ctx.plan.get(), ctx.inference.get());
            let res = with_reader(&ctx, move |r| {
                // What the latency signals read: every `inference` tag set of the model.
                let tags: Vec<(String, String)> = iq
                    .model
                    .iter()
                    .map(|m| ("model".to_string(), m.clone()))
                    .collect();
                let n = r.count_numeric("inference", "wall_ms", &tags)?;
                if let Err(e) = params::answer_size(n, iq.from, iq.to, iq.step_ns) {
                    return Ok(Err(crate::engine::EngineError::BadQuery(e)));
                }
                Ok(crate::engine::inference(
                    r,
                    &plan,
                    &inf.optimal_batch,
                    &iq,
                    now,
                ))
            })
            .await;
            engine_reply(res)
        });
    let llm = warp::path!("api" / "v1" / "llm")
        .and(warp::get())
        .and(warp::query::<HashMap<String, String>>())
        .and(with.clone())
        .then(|q: HashMap<String, String>, ctx: ApiCtx| async move {
            let now = crate::now_ns();
            let iq = match inference_query_from_params(&q, now) {
                Ok(iq) => iq,
                Err(e) => return json_error(StatusCode::BAD_REQUEST, &e),
            };
            let plan = ctx.plan.get();
            let res = with_reader(&ctx, move |r| {
                // The largest series the signals read: the gaps between tokens.
                let tags: Vec<(String, String)> = iq
                    .model
                    .iter()
                    .map(|m| ("model".to_string(), m.clone()))
                    .collect();
                let n = r.count_numeric("llm", "itl_ms", &tags)?;
                if let Err(e) = params::answer_size(n, iq.from, iq.to, iq.step_ns) {
                    return Ok(Err(crate::engine::EngineError::BadQuery(e)));
                }
                Ok(crate::engine::llm(r, &plan, &iq, now))
            })
            .await;
            engine_reply(res)
        });
    // ---- incidents (alert::incident): the list and one incident with its snapshot ----
    let incidents = warp::path!("api" / "v1" / "incidents")
        .and(warp::get())
        .and(warp::query::<HashMap<String, String>>())
        .and(with.clone())
        .then(|q: HashMap<String, String>, ctx: ApiCtx| async move {
            let (from, to, limit) = match incidents_from_params(&q, crate::now_ns()) {
                Ok(p) => p,
                Err(e) => return json_error(StatusCode::BAD_REQUEST, &e),
            };
            match with_reader(&ctx, move |r| {
                crate::store::incidents::list(r.conn(), r.path(), from, to, limit)
            })
            .await
            {
                Ok((rows, truncated)) => {
                    let list: Vec<serde_json::Value> = rows
                        .iter()
                        .map(crate::alert::incident::view::to_json)
                        .collect();
                    warp::reply::json(&json!({
                        "from": from,
                        "to": to,
                        "truncated": truncated,
                        "incidents": list,
                    }))
                    .into_response()
                }
                Err(resp) => resp,
            }
        });
    let incident = warp::path!("api" / "v1" / "incidents" / String)
        .and(warp::get())
        .and(with.clone())
        .then(|id: String, ctx: ApiCtx| async move {
            let Ok(id) = id.parse::<i64>() else {
                return json_error(StatusCode::NOT_FOUND, "no such incident");
            };
            match with_reader(&ctx, move |r| {
                crate::store::incidents::get(r.conn(), r.path(), id)
            })
            .await
            {
                Ok(Some(row)) => body::json(crate::alert::incident::view::to_json(&row)),
                Ok(None) => json_error(StatusCode::NOT_FOUND, "no such incident"),
                Err(resp) => resp,
            }
        });
    let status = warp::path!("api" / "v1" / "status")
        .and(warp::get())
        .and(with)
        .then(|ctx: ApiCtx| async move { status(ctx).await });
    health
        .or(ping)
        .unify()
        .or(series)
        .unify()
        .or(fields)
        .unify()
        .or(query)
        .unify()
        .or(inference)
        .unify()
        .or(llm)
        .unify()
        .or(status)
        .unify()
        .or(incidents)
        .unify()
        .or(incident)
        .unify()
        .or(alert_routes(ctx.clone()))
        .unify()
        .or(reload::routes(ctx))
        .unify()
}

/// Most history rows one `/api/v1/alerts/history` answer holds (the oldest first; ask again
/// from the last one's time for more).
pub const MAX_ALERT_HISTORY: usize = 10_000;

/// `GET /api/v1/alerts` (the instances of the last evaluation, from memory) and
/// `GET /api/v1/alerts/history?from=&to=` (transitions, from the store; default the last
/// 24 h).
fn alert_routes(
    ctx: ApiCtx,
) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    let with = warp::any().map(move || ctx.clone());
    let list = warp::path!("api" / "v1" / "alerts")
        .and(warp::get())
        .and(with.clone())
        .map(|ctx: ApiCtx| {
            warp::reply::json(&json!({ "alerts": ctx.alerts.alerts() })).into_response()
        });
    let history = warp::path!("api" / "v1" / "alerts" / "history")
        .and(warp::get())
        .and(warp::query::<HashMap<String, String>>())
        .and(with)
        .then(|q: HashMap<String, String>, ctx: ApiCtx| async move {
            let now = crate::now_ns();
            let get = |k: &str| q.get(k).map(String::as_str).filter(|v| !v.is_empty());
            let (from, to) = match get("from") {
                None if get("to").is_none() => (now - 86_400 * 1_000_000_000, now),
                _ => match crate::engine::request::time_range(get("from"), get("to"), now) {
                    Ok(r) => r,
                    Err(e) => return json_error(StatusCode::BAD_REQUEST, &e),
                },
            };
            match with_reader(&ctx, move |r| {
                crate::store::alerts::history(r.conn(), r.path(), from, to, MAX_ALERT_HISTORY)
            })
            .await
            {
                Ok(rows) => {
                    let truncated = rows.len() >= MAX_ALERT_HISTORY;
                    let rows: Vec<serde_json::Value> = rows
                        .into_iter()
                        .map(|h| {
                            json!({
                                "time": crate::alert::view::rfc3339(h.ts_ns),
                                "ts_ns": h.ts_ns,
                                "name": h.rule,
                                "fingerprint": h.fingerprint,
                                "labels": h.labels,
                                "transition": h.transition,
                                "state": h.state,
                                "value": h.value,
                                "incident_id": h.incident_id,
                            })
                        })
                        .collect();
                    body::json(
                        json!({ "from": from, "to": to, "truncated": truncated, "history": rows }),
                    )
                }
                Err(resp) => resp,
            }
        });
    history.or(list).unify()
}

async fn status(ctx: ApiCtx) -> Response {
    warp::reply::json(&status_document(&ctx).await).into_response()
}

/// The status document: `/api/v1/status` answers it, `/metrics` exports the agent's health
/// from it. The one place it is assembled; each part comes from the module that owns it. A
/// part the store cannot give (a read error) is `null`.
pub async fn status_document(ctx: &ApiCtx) -> Status {
    // Its counters are of committed points: a read of the latest commits what is held
    // first, so that `points_written` counts every point received before it.
    if ctx.read == Read::Latest {
        ctx.handle.settle().await;
    }
    let ctx = &ApiCtx {
        read: Read::Stored,
        ..ctx.clone()
    };
    let series = with_reader(ctx, |r| r.series_count()).await.ok();
    let plan = ctx.plan.get();
    let rollup = with_reader(ctx, move |r| {
        crate::rollup::status(r, &plan, crate::now_ns())
    })
    .await
    .ok();
    let floor = ctx.plan.get().clock_floor_ns;
    let clock = with_reader(ctx, move |r| {
        crate::clock::status(&r.conn, floor, crate::now_ns()).map_err(|source| {
            crate::store::StoreError::Sqlite {
                path: r.path.clone(),
                source,
            }
        })
    })
    .await
    .ok();
    let db_bytes = crate::store::disk_bytes(&ctx.db_path);
    let max_bytes = ctx.plan.get().max_bytes;
    let write = with_reader(ctx, |r| r.rate_sample(2_000))
        .await
        .ok()
        .and_then(|s| crate::status::rate::write_rate(&s, db_bytes, max_bytes));
    let s = &ctx.stats;
    let g = Stats::get;
    Status {
        agent: status::Agent {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_s: ctx.started.elapsed().as_secs(),
            disk_written_bytes: crate::collect::health::own_written_bytes(),
        },
        ingest: status::Ingest {
            points_written: g(&s.points_written),
            values_written: g(&s.values_written),
            points_rejected: g(&s.points_rejected),
            points_dropped: g(&s.points_dropped),
            writes_throttled: g(&s.writes_throttled),
            writes_too_large: g(&s.writes_too_large),
            udp_datagrams: g(&s.udp_datagrams),
            queue_points: ctx.handle.queued() as u64,
            queue_capacity: ctx.handle.capacity() as u64,
            commits: g(&s.commits),
            commit_errors: g(&s.commit_errors),
            journal_appends: g(&s.journal_appends),
            journal_bytes: g(&s.journal_bytes),
            last_commit_ms: g(&s.last_commit_us) as f64 / 1000.0,
            hold_ms: ctx.hold.as_millis() as u64,
        },
        store: status::Store {
            path: ctx.db_path.clone(),
            db_bytes,
            series,
            max_series: ctx.max_series as u64,
            synchronous: ctx.synchronous,
            write,
        },
        rollup,
        clock,
        forward: ctx.forward.get().snapshot(),
        collectors: status::Collectors {
            errors: g(&s.collector_errors),
            nvml: ctx.nvml.snapshot(),
            tegrastats: ctx.tegrastats.snapshot(crate::now_ns()),
            scrape: ctx.scrape.get().snapshot(),
            jetson: ctx.jetson.snapshot(),
            kmsg: ctx.kmsg.snapshot(),
            process: ctx.process.get().snapshot(),
        },
        notify: ctx.notify.get().snapshot(),

        alerts: Some(ctx.alerts.status()).filter(|a| a.evaluations > 0 || a.rules > 0),
        config: Some(ctx.config.snapshot()),
    }
}

/// Turns warp's rejections (unknown path, wrong method, bad query string) into JSON errors.
pub async fn recover(r: warp::Rejection) -> Result<Response, Infallible> {
    Ok(if r.is_not_found() {
        json_error(StatusCode::NOT_FOUND, "not found")
    } else if r.find::<warp::reject::MethodNotAllowed>().is_some() {
        json_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
    } else if let Some(e) = r.find::<warp::reject::InvalidQuery>() {
        json_error(StatusCode::BAD_REQUEST, &e.to_string())
    } else if let Some(e) = r.find::<warp::reject::InvalidHeader>() {
        json_error(StatusCode::BAD_REQUEST, &e.to_string())
    } else if let Some(BadRequest(e)) = r.find::<BadRequest>() {
        json_error(StatusCode::BAD_REQUEST, e)
    } else {
        json_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{r:?}"))
    })
}
