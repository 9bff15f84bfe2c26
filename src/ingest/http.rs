//! HTTP writes, as InfluxDB 1.x (`POST /write?db=&rp=&precision=&u=&p=`) and 2.x
//! (`POST /api/v2/write?org=&bucket=&precision=`, `Authorization: Token ...`) answer them:
//! 204 once committed; 400 with a JSON error naming each bad line (the good lines of the
//! body are stored: partial write); 413 over the body limit or with more points than the
//! whole ingest queue holds (such a body is refused, never split); 503 with `Retry-After`
//! when the queue is full; gzip bodies accepted. The database/bucket names are accepted and ignored:
//! the agent has one store.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use bytes::Buf;
use futures_util::StreamExt;
use serde_json::json;
use warp::http::{HeaderValue, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply};

use super::lineproto::{parse_body, Precision};
use crate::model::Rejection;
use crate::queue::{Ack, IngestHandle, SubmitError};
use crate::stats::Stats;

/// What the write endpoints need.
#[derive(Clone)]
pub struct WriteCtx {
    /// The queue to the writer.
    pub handle: IngestHandle,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Body limit after decompression.
    pub max_body: u64,
}

/// Which API flavour a request came through (error bodies differ slightly).
#[derive(Clone, Copy, Debug)]
enum Flavour {
    V1,
    V2,
}

/// `POST /write` and `POST /api/v2/write`.
pub fn routes(
    ctx: WriteCtx,
) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    let ctx = warp::any().map(move || ctx.clone());
    let common = warp::post()
        .and(warp::query::<HashMap<String, String>>())
        .and(warp::header::optional::<String>("content-encoding"))
        .and(warp::header::optional::<u64>("content-length"))
        .and(warp::body::stream())
        .and(ctx);
    let v1 = warp::path("write")
        .and(warp::path::end())
        .and(common.clone())
        .then(|q, enc, len, body, ctx| write(Flavour::V1, q, enc, len, body, ctx));
    let v2 = warp::path!("api" / "v2" / "write")
        .and(common)
        .then(|q, enc, len, body, ctx| write(Flavour::V2, q, enc, len, body, ctx));
    v1.or(v2).unify()
}

fn error_reply(
    status: StatusCode,
    flavour: Flavour,
    message: &str,
    lines: &[Rejection],
) -> Response {
    let code = match status {
        StatusCode::BAD_REQUEST => "invalid",
        StatusCode::PAYLOAD_TOO_LARGE => "request too large",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        _ => "internal error",
    };
    let body = match flavour {
        Flavour::V1 => json!({ "error": message, "line_errors": lines }),
        Flavour::V2 => json!({ "code": code, "message": message, "line_errors": lines }),
    };
    let mut r = warp::reply::with_status(warp::reply::json(&body), status).into_response();
    r.headers_mut()
        .insert("X-Influxdb-Error", header_value(message));
    r
}

fn header_value(s: &str) -> HeaderValue {
    let clean: String = s
        .chars()
        .take(200)
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                '?'
            }
        })
        .collect();
    HeaderValue::from_str(&clean).unwrap_or_else(|_| HeaderValue::from_static("error"))
}

fn too_large(ctx: &WriteCtx, flavour: Flavour) -> Response {
    Stats::add(&ctx.stats.writes_too_large, 1);
    error_reply(
        StatusCode::PAYLOAD_TOO_LARGE,
        flavour,
        &format!(
            "request body exceeds the limit of {} bytes ([http] max_body_bytes); send smaller batches",
            ctx.max_body
        ),
        &[],
    )
}

fn unavailable(message: &str, flavour: Flavour, retry_after_s: u32) -> Response {
    let mut r = error_reply(StatusCode::SERVICE_UNAVAILABLE, flavour, message, &[]);
    r.headers_mut()
        .insert("Retry-After", HeaderValue::from(retry_after_s));
    r
}

async fn write<S, B>(
    flavour: Flavour,
    query: HashMap<String, String>,
    encoding: Option<String>,
    content_length: Option<u64>,
    body: S,
    ctx: WriteCtx,
) -> Response
where
    S: futures_util::Stream<Item = Result<B, warp::Error>> + Unpin + Send,
    B: Buf,
{
    let precision = query.get("precision").map(String::as_str).unwrap_or("ns");
    let Some(precision) = Precision::parse(precision) else {
        return error_reply(
            StatusCode::BAD_REQUEST,
            flavour,
            &format!("invalid precision {precision:?}: expected one of ns, us, ms, s (1.x also n, u, m, h)"),
            &[],
        );
    };
    if content_length.is_some_and(|n| n > ctx.max_body) {
        return too_large(&ctx, flavour);
    }
    let raw = match read_limited(body, ctx.max_body, content_length).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => return too_large(&ctx, flavour),
        Err(BodyError::Io(e)) => {
            return error_reply(
                StatusCode::BAD_REQUEST,
                flavour,
                &format!("error reading request body: {e}"),
                &[],
            )
        }
    };
    let gzip = match encoding.as_deref().map(str::trim) {
        None | Some("") | Some("identity") => false,
        Some(e) if e.eq_ignore_ascii_case("gzip") => true,
        Some(other) => {
            return error_reply(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                flavour,
                &format!("unsupported Content-Encoding {other:?}: send plain text or gzip"),
                &[],
            )
        }
    };
    let max = ctx.max_body;
    let now = crate::now_ns();
    let parsed = tokio::task::spawn_blocking(move || -> Result<_, BodyError> {
        // The body is parsed where it lies: a plain body is not copied.
        let text = if gzip { gunzip(&raw, max)? } else { raw };
        let text = match String::from_utf8(text) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        Ok(parse_body(&text, precision, now))
    })
    .await;
    let parsed = match parsed {
        Ok(Ok(p)) => p,
        Ok(Err(BodyError::TooLarge)) => return too_large(&ctx, flavour),
        Ok(Err(BodyError::Io(e))) => {
            return error_reply(
                StatusCode::BAD_REQUEST,
                flavour,
                &format!("invalid gzip body: {e}"),
                &[],
            )
        }
        Err(e) => {
            return error_reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                flavour,
                &format!("parser task failed: {e}"),
                &[],
            )
        }
    };
    // A body the queue can never hold is refused whole, not split: a request is committed
    // entirely or not at all, so a client may resend it after any error.
    let points = parsed.batch.len();
    if !ctx.handle.admits(points) {
        Stats::add(&ctx.stats.writes_too_large, 1);
        let cap = ctx.handle.capacity();
        return error_reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            flavour,
            &format!(
                "request holds {points} points, more than the ingest queue can hold \
                 ([ingest] queue_points = {cap}); nothing was stored: send at most {cap} \
                 points per request"
            ),
            &[],
        );
    }
    let mut errors = parsed.errors;
    Stats::add(&ctx.stats.points_rejected, errors.len() as u64);
    if !parsed.batch.lines.is_empty() {
        let rx = match ctx.handle.submit(parsed.batch, true) {
            Ok(rx) => rx,
            Err(e @ SubmitError::Full { .. }) => {
                Stats::add(&ctx.stats.writes_throttled, 1);
                return unavailable(&format!("{e}; retry later"), flavour, 1);
            }
            Err(SubmitError::Closed) => {
                return unavailable("the agent is shutting down", flavour, 5)
            }
        };
        let ack = match rx {
            Some(rx) => rx.await.ok(),
            None => None,
        };
        match ack {
            Some(Ack::Committed { rejected }) => errors.extend(rejected),
            Some(Ack::Failed { error, retryable }) => {
                let msg = format!("write not stored: {error}");
                return if retryable {
                    unavailable(&msg, flavour, 10)
                } else {
                    error_reply(StatusCode::INTERNAL_SERVER_ERROR, flavour, &msg, &[])
                };
            }
            None => return unavailable("the agent is shutting down", flavour, 5),
        }
    }
    if errors.is_empty() {
        return StatusCode::NO_CONTENT.into_response();
    }
    errors.sort_by_key(|e| e.line);
    let first: Vec<String> = errors
        .iter()
        .take(3)
        .map(|e| format!("line {}: {}", e.line, e.error))
        .collect();
    let message = format!(
        "partial write: {} line(s) rejected, the others were stored; {}{}",
        errors.len(),
        first.join("; "),
        if errors.len() > 3 { "; ..." } else { "" }
    );
    error_reply(StatusCode::BAD_REQUEST, flavour, &message, &errors)
}

enum BodyError {
    TooLarge,
    Io(String),
}

async fn read_limited<S, B>(
    mut body: S,
    max: u64,
    content_length: Option<u64>,
) -> Result<Vec<u8>, BodyError>
where
    S: futures_util::Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    // Sized once from Content-Length (already checked against `max`): no doubling copies.
    let mut out = Vec::with_capacity(content_length.unwrap_or(0).min(max) as usize);
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk.map_err(|e| BodyError::Io(e.to_string()))?;
        if out.len() as u64 + chunk.remaining() as u64 > max {
            return Err(BodyError::TooLarge);
        }
        while chunk.has_remaining() {
            let c = chunk.chunk();
            out.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    Ok(out)
}

fn gunzip(raw: &[u8], max: u64) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(raw)
        .take(max + 1)
        .read_to_end(&mut out)
        .map_err(|e| BodyError::Io(e.to_string()))?;
    if out.len() as u64 > max {
        return Err(BodyError::TooLarge);
    }
    Ok(out)
}
