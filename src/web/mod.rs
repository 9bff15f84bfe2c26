//! The device's own window: the web UI at `/` (hand-written HTML, CSS and JavaScript with SVG
//! charts, embedded in the binary: no CDN, no fonts, nothing fetched from outside), the
//! Prometheus exposition at `/metrics`, and access control for the whole server ([`auth`]).
//! The UI reads only the JSON API (`/api/v1/...`); this module never writes to the store.

pub mod auth;
pub mod metrics;

use std::sync::{Arc, Mutex};

use warp::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use warp::http::HeaderValue;
use warp::reply::Response;
use warp::Filter;

use crate::api::ApiCtx;

/// The embedded UI: (URL path, content type, bytes).
pub const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_bytes!("assets/index.html"),
    ),
    (
        "/assets/app.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/app.css"),
    ),
    (
        "/assets/app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/app.js"),
    ),
    (
        "/assets/alerts.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/alerts.js"),
    ),
    (
        "/assets/llm.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/llm.js"),
    ),
];

/// The UI's Content-Security-Policy: scripts, styles, data and images from the agent only;
/// no inline script or style attribute, no plugins, not framable.
pub const CSP: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Total size of the embedded UI in bytes.
pub fn ui_bytes() -> usize {
    ASSETS.iter().map(|a| a.2.len()).sum()
}

fn asset(path: &str) -> Option<Response> {
    let (_, ctype, body) = ASSETS.iter().find(|a| a.0 == path)?;
    let mut r = Response::new(body.to_vec().into());
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    // Small and embedded: revalidate every load so an upgraded agent never serves stale JS.
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        "X-Content-Type-Options",
        HeaderValue::from_static("nosniff"),
    );
    // Everything the UI loads is this agent's own: no inline code, no other origin, no frames.
    h.insert("Content-Security-Policy", HeaderValue::from_static(CSP));
    h.insert("X-Frame-Options", HeaderValue::from_static("DENY"));
    h.insert("Referrer-Policy", HeaderValue::from_static("no-referrer"));
    Some(r)
}

/// `/`, `/assets/*` and `/metrics`.
pub fn routes(ctx: ApiCtx) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // The path first: an unknown path is a 404 whatever the method, as elsewhere.
    let ui = warp::path::full()
        .and_then(|p: warp::path::FullPath| async move {
            asset(p.as_str()).ok_or_else(warp::reject::not_found)
        })
        .and(warp::get());
    // Kept between scrapes: per measurement and field, the family name and label names.
    let index = Arc::new(Mutex::new(metrics::Index::default()));
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let (reader, latest, index) = (ctx.reader.clone(), ctx.latest.clone(), index.clone());
        let since = crate::now_ns().saturating_sub(metrics::LATEST_WINDOW_NS);
        rt.spawn_blocking(move || {
            if let Err(e) = metrics::warm(&reader, &latest, &index, since) {
                tracing::warn!(error = %e, "/metrics: cannot read the newest values ahead");
            }
        });
    }
    let metrics =
        warp::path("metrics")
            .and(warp::path::end())
            .and(warp::get())
            .and(warp::any().map(move || (ctx.clone(), index.clone())))
            .then(
                |(ctx, index): (ApiCtx, Arc<Mutex<metrics::Index>>)| async move {
                    scrape(ctx, index).await
                },
            );
    metrics.or(ui).unify()
}

async fn scrape(ctx: ApiCtx, index: Arc<Mutex<metrics::Index>>) -> Response {
    // What is stored, without a commit: a scraper polls (Prometheus every 15 s by default),
    // and a commit per scrape would be a synced transaction of ~10 pages each time. The
    // newest values include the points the writer holds (it records them as it accepts
    // them: `Writer::keep_latest`), and the series they name are in the dictionary.
    let ctx = ApiCtx {
        read: crate::api::Read::Stored,
        ..ctx
    };
    let status = crate::api::status_document(&ctx).await;
    let health = metrics::render_health(&status, Some(&ctx.stats.commit_seconds.0));
    let since = crate::now_ns().saturating_sub(metrics::LATEST_WINDOW_NS);
    let (mut out, body) = crate::api::body::BodyWriter::channel();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        // No lock is held while writing (see `write_store`): a scraper that stops reading
        // holds up only its own scrape. Any error drops `out` unfinished, which aborts
        // the answer: a scraper never takes half an exposition for a whole one.
        let res = out
            .write_all(health.as_bytes())
            .map_err(metrics::ExpositionError::from)
            .and_then(|()| {
                metrics::write_store(&ctx.reader, &ctx.latest, &ctx.http, &index, since, &mut out)
            })
            .and_then(|()| out.finish().map_err(Into::into));
        match res {
            Ok(()) => {}
            Err(metrics::ExpositionError::Client(e)) => {
                tracing::debug!(error = %e, "/metrics: scrape abandoned");
            }
            Err(e) => tracing::warn!(error = %e, "/metrics: cannot read the store; answer aborted"),
        }
    });
    let mut r = Response::new(body);
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    r
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_whole_ui_stays_under_150_kb() {
        let n = super::ui_bytes();
        assert!(n < 150 * 1024, "UI is {n} bytes");
    }
}
