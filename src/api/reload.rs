//! `POST /api/v1/reload` (reload the config now; answers the [`ReloadReport`]: 200 when
//! applied, 422 with the reason when the new config is invalid and nothing changed) and
//! `GET /api/v1/config` (the effective config with its secrets redacted, and which layer
//! set each key). Both need the `[http] token` when one is set (`web::auth`). This module
//! only asks the reloader and reads what it published; it applies nothing itself.

use std::time::Duration;

use warp::http::StatusCode;
use warp::reply::Response;
use warp::{Filter, Reply};

use super::{json_error, ApiCtx};
use crate::config::layers::{ReloadReport, Trigger};

/// How long a reload request waits for its report.
const WAIT: Duration = Duration::from_secs(120);

/// The two routes.
pub fn routes(ctx: ApiCtx) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    let with = warp::any().map(move || ctx.clone());
    let reload = warp::path!("api" / "v1" / "reload")
        .and(warp::post())
        .and(with.clone())
        .then(|ctx: ApiCtx| async move {
            let asked = crate::reload::request(&ctx.config.reload, Trigger::Api);
            match tokio::time::timeout(WAIT, asked).await {
                Ok(Ok(report)) => answer(&report),
                Ok(Err(e)) => json_error(StatusCode::SERVICE_UNAVAILABLE, &e),
                Err(_) => json_error(
                    StatusCode::GATEWAY_TIMEOUT,
                    "the reload did not finish in time; see /api/v1/status config.last_reload",
                ),
            }
        });
    let config = warp::path!("api" / "v1" / "config")
        .and(warp::get())
        .and(with)
        .map(|ctx: ApiCtx| {
            let doc = ctx.config.effective.snapshot();
            warp::reply::json(&*doc).into_response()
        });
    reload.or(config).unify()
}

/// 200 and the report when applied; 422 and the report (its `error` says why) when not.
fn answer(r: &ReloadReport) -> Response {
    let code = if r.ok {
        StatusCode::OK
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    warp::reply::with_status(warp::reply::json(r), code).into_response()
}
