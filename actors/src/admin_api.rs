//! The admin routes added for operators (`GET /admin/status`, `GET /admin/events/dead`) and
//! the compat entry `POST /cminmsgs/send` (seed §5.1): thin handlers over [`msgx_core::ops`].

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use msgx_core::ops::CompatRequest;
use serde::Deserialize;

use crate::admin::{error, ops_error, unauthorized, AdminState, Scope, MAX_COMPAT_BODY};

async fn status(req: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    if let Some(denied) = unauthorized(&req, &state) {
        return denied;
    }
    match state.ops.status(state.clock.now()).await {
        Ok(s) => HttpResponse::Ok().json(s),
        Err(e) => ops_error(e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadQuery {
    #[serde(default)]
    after: Option<i64>,
    #[serde(default)]
    limit: Option<i64>,
}

async fn dead_events(req: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    if let Some(denied) = unauthorized(&req, &state) {
        return denied;
    }
    let q = match web::Query::<DeadQuery>::from_query(req.query_string()) {
        Ok(q) => q.into_inner(),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    match state
        .ops
        .list_dead_events(q.after.unwrap_or(0), q.limit.unwrap_or(100))
        .await
    {
        Ok(page) => HttpResponse::Ok().json(page),
        Err(e) => ops_error(e),
    }
}

async fn compat_send(
    req: HttpRequest,
    state: web::Data<AdminState>,
    payload: web::Payload,
) -> HttpResponse {
    if let Some(denied) = state.tokens.denied(&req, Scope::Compat) {
        return denied;
    }
    let json = req
        .headers()
        .get(actix_web::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
        );
    }
    let body = match crate::admin::read_body_pub(&req, payload, MAX_COMPAT_BODY).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let parsed: CompatRequest = match crate::admin::parse_json(&body) {
        Ok(p) => p,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("bad JSON body (expected {{\"msg_id\": <inbox id>}}): {e}"),
            )
        }
    };
    match state.ops.compat_register(&parsed, state.clock.now()).await {
        Ok(r) if r.registered => HttpResponse::Created().json(r),
        Ok(r) => HttpResponse::Ok().json(r),
        Err(e) => ops_error(e),
    }
}

/// `/admin/status`, `/admin/events/dead` (inside the `/admin` scope).
pub fn configure_admin(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/status").route(web::get().to(status)))
        .service(web::resource("/events/dead").route(web::get().to(dead_events)));
}

/// `/cminmsgs/send` (inside the `/cminmsgs` scope).
pub fn configure_compat(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/send").route(web::post().to(compat_send)));
}
