//! The seed's procedures over HTTP (thin handlers over [`msgx_core::ops`], the same calls as
//! `msgexchange survey`, `skip`, `purge-readiness`):
//!
//! - `GET /admin/survey?from_id=&to_id=&received_from=&received_to=` (read) → `Ops::survey`;
//! - `POST /admin/skip` (operate) → `Ops::skip` (approver, reason, ticket required; audited);
//! - `GET /admin/purge-readiness?to_id=&received_before=` (read) → `Ops::purge_readiness`;
//! - `GET /admin/cutover-plan?mode=` (read) → `Ops::cutover_plan` (`msgexchange cutover plan`).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use msgx_core::ops::{PurgeRequest, SkipRequest, SurveyRequest};

use crate::admin::{error, ops_error, read_body_pub, unauthorized, AdminState, Scope, MAX_BODY};

fn query<T: serde::de::DeserializeOwned>(req: &HttpRequest) -> Result<T, Box<HttpResponse>> {
    web::Query::<T>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, format!("bad query: {e}"))))
}

async fn survey(req: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    if let Some(denied) = unauthorized(&req, &state) {
        return denied;
    }
    let q: SurveyRequest = match query(&req) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    match state.ops.survey(&q).await {
        Ok(s) => HttpResponse::Ok().json(s),
        Err(e) => ops_error(e),
    }
}

async fn purge_readiness(req: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    if let Some(denied) = unauthorized(&req, &state) {
        return denied;
    }
    let q: PurgeRequest = match query(&req) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    match state.ops.purge_readiness(&q).await {
        Ok(s) => HttpResponse::Ok().json(s),
        Err(e) => ops_error(e),
    }
}

/// `?mode=min|zero|max|<id>`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanQuery {
    mode: String,
}

async fn cutover_plan(req: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    if let Some(denied) = unauthorized(&req, &state) {
        return denied;
    }
    let q: PlanQuery = match query(&req) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    let mode = match msgx_core::cutover::CutoverMode::parse(&q.mode) {
        Ok(Some(mode)) => mode,
        Ok(None) => return error(StatusCode::BAD_REQUEST, "mode is empty"),
        Err(why) => return error(StatusCode::BAD_REQUEST, format!("mode: {why}")),
    };
    match state.ops.cutover_plan(mode).await {
        Ok(p) => HttpResponse::Ok().json(p),
        Err(e) => ops_error(e),
    }
}

async fn skip(
    req: HttpRequest,
    state: web::Data<AdminState>,
    payload: web::Payload,
) -> HttpResponse {
    if let Some(denied) = state.tokens.denied(&req, Scope::Operate) {
        return denied;
    }
    let body = match read_body_pub(&req, payload, MAX_BODY).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let parsed: SkipRequest = match crate::admin::parse_json(&body) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad JSON body: {e}")),
    };
    match state.ops.skip(&parsed, state.clock.now()).await {
        Ok(r) => HttpResponse::Ok().json(r),
        Err(e) => ops_error(e),
    }
}

/// `/survey`, `/skip`, `/purge-readiness`, `/cutover-plan` (inside the `/admin` scope).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/survey").route(web::get().to(survey)))
        .service(web::resource("/cutover-plan").route(web::get().to(cutover_plan)))
        .service(web::resource("/skip").route(web::post().to(skip)))
        .service(web::resource("/purge-readiness").route(web::get().to(purge_readiness)));
}
