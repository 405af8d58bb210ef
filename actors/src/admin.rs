//! The admin HTTP surface (`/admin/*`, only when `http.admin_token` is set): the audited
//! operator actions of the core library, over JSON. Every request needs
//! `Authorization: Bearer <http.admin_token>`; every refusal is a JSON `{"error": …}` with a
//! 4xx status; a store failure is 503 and changes nothing.
//!
//! - `POST /admin/replay` `{"msg_ids": [...], "actor": "...", "reason": "..."}`
//!   → `store::replay::replay` (DEAD/FAILED rows of the replayable classes back to PENDING);
//! - `POST /admin/recover-backfill` (same body) → `store::replay::recover_abandoned`;
//! - `POST /admin/events/requeue` `{"event_ids": [...], "actor": "...", "reason": "..."}`
//!   → DEAD events back to PENDING;
//! - `GET /admin/messages/{msg_id}` → the processing record and its events.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use msgx_core::clock::SharedClock;
use msgx_core::store::replay::{self, AdminError, AdminReport, RowOutcome};
use msgx_core::store::Store;
use serde::Deserialize;
use serde_json::json;

/// Most ids one request may name (one transaction holds the pipeline lock for all of them).
pub const MAX_IDS: usize = 10_000;
/// Largest request body accepted.
pub const MAX_BODY: usize = 256 * 1024;

/// What the admin handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// Our PostgreSQL.
    pub store: Store,
    /// "now" of the audit rows.
    pub clock: SharedClock,
    /// The bearer token (`http.admin_token`, non-empty).
    pub token: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MessagesBody {
    msg_ids: Vec<i64>,
    actor: String,
    reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsBody {
    event_ids: Vec<i64>,
    actor: String,
    reason: String,
}

fn error(status: actix_web::http::StatusCode, message: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status).json(json!({ "error": message.into() }))
}

/// Constant-time comparison: the time to refuse a token says nothing about its prefix.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// None when the request carries the token; else the 401 to send.
fn unauthorized(req: &HttpRequest, state: &AdminState) -> Option<HttpResponse> {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(t) if same(t.as_bytes(), state.token.as_bytes()) => None,
        _ => {
            tracing::warn!(path = %req.path(), peer = ?req.peer_addr(), "admin request without a valid token");
            Some(
                HttpResponse::Unauthorized()
                    .insert_header((header::WWW_AUTHENTICATE, "Bearer"))
                    .json(json!({ "error": "missing or wrong bearer token" })),
            )
        }
    }
}

/// The JSON body (parsed after authentication, so a stranger learns nothing), or why not.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| format!("bad JSON body: {e}"))
}

/// At most [`MAX_IDS`] ids, or why not.
fn check_ids(ids: &[i64], what: &str) -> Result<(), String> {
    if ids.len() > MAX_IDS {
        return Err(format!(
            "{} {what} given; at most {MAX_IDS} per request",
            ids.len()
        ));
    }
    Ok(())
}

fn bad_request(why: String) -> HttpResponse {
    error(actix_web::http::StatusCode::BAD_REQUEST, why)
}

fn admin_error(e: AdminError) -> HttpResponse {
    match e {
        AdminError::Invalid(why) => error(actix_web::http::StatusCode::BAD_REQUEST, why),
        AdminError::Store(e) => {
            tracing::error!(error = %e, "admin action failed on the store; nothing changed");
            error(
                actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("store unavailable, nothing changed: {e}"),
            )
        }
    }
}

fn report_json(r: &AdminReport) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = r
        .rows
        .iter()
        .map(|row| match &row.outcome {
            RowOutcome::Applied {
                previous_state,
                previous_class,
                ..
            } => json!({"msg_id": row.msg_id, "result": "applied",
                        "previous_state": previous_state, "previous_class": previous_class}),
            RowOutcome::Refused { reason } => {
                json!({"msg_id": row.msg_id, "result": "refused", "reason": reason})
            }
        })
        .collect();
    json!({"audit_id": r.audit_id, "applied": r.applied(), "refused": r.refused(), "rows": rows})
}

async fn replay_messages(
    req: HttpRequest,
    state: web::Data<AdminState>,
    body: web::Bytes,
) -> HttpResponse {
    if let Some(denied) = unauthorized(&req, &state) {
        return denied;
    }
    let body: MessagesBody = match parse(&body).and_then(|b: MessagesBody| {
        check_ids(&b.msg_ids, "msg_ids")?;
        Ok(b)
    }) {
        Ok(b) => b,
        Err(why) => return bad_request(why),
    };
    let now = state.clock.now();
    match replay::replay(&state.store, &body.msg_ids, &body.actor, &body.reason, now).await {
        Ok(r) => HttpResponse::Ok().json(report_json(&r)),
        Err(e) => admin_error(e),
    }
}

async fn recover_backfill(
    req: HttpRequest,
    state: web::Data<AdminState>,
    body: web::Bytes,
) -> HttpResponse {
    if let Some(denied) = unauthorized(&req, &state) {
        return denied;
    }
    let body: MessagesBody = match parse(&body).and_then(|b: MessagesBody| {
        check_ids(&b.msg_ids, "msg_ids")?;
        Ok(b)
    }) {
        Ok(b) => b,
        Err(why) => return bad_request(why),
    };
    let now = state.clock.now();
    match replay::recover_abandoned(&state.store, &body.msg_ids, &body.actor, &body.reason, now)
        .await
    {
        Ok(r) => HttpResponse::Ok().json(report_json(&r)),
        Err(e) => admin_error(e),
    }
}

async fn requeue_events(
    req: HttpRequest,
    state: web::Data<AdminState>,
    body: web::Bytes,
) -> HttpResponse {
    if let Some(denied) = unauthorized(&req, &state) {
        return denied;
    }
    let body: EventsBody = match parse(&body).and_then(|b: EventsBody| {
        check_ids(&b.event_ids, "event_ids")?;
        Ok(b)
    }) {
        Ok(b) => b,
        Err(why) => return bad_request(why),
    };
    let now = state.clock.now();
    match state
        .store
        .requeue_dead_events(&body.event_ids, &body.actor, &body.reason, now)
        .await
    {
        Ok(r) => HttpResponse::Ok().json(json!({
            "audit_id": r.audit_id,
            "requeued": r.requeued,
            "refused": r.refused.iter().map(|(id, why)| json!({"event_id": id, "reason": why})).collect::<Vec<_>>(),
        })),
        Err(e) => admin_error(e),
    }
}

async fn message(req: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    if let Some(denied) = unauthorized(&req, &state) {
        return denied;
    }
    let raw = req.match_info().get("msg_id").unwrap_or_default();
    let Ok(msg_id) = raw.parse::<i64>() else {
        return error(
            actix_web::http::StatusCode::BAD_REQUEST,
            format!("`{raw}` is not a message id"),
        );
    };
    match state.store.message_view(msg_id).await {
        Ok(Some(v)) => HttpResponse::Ok().json(v),
        Ok(None) => error(
            actix_web::http::StatusCode::NOT_FOUND,
            format!("no message {msg_id}"),
        ),
        Err(e) => admin_error(AdminError::Store(e)),
    }
}

/// Registers `/admin/*`. Authentication comes before any parsing; bodies over [`MAX_BODY`]
/// are refused with 413 before they are read whole.
pub fn configure(state: AdminState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        cfg.service(
            web::scope("/admin")
                .app_data(web::Data::new(state))
                .app_data(web::PayloadConfig::new(MAX_BODY))
                // Resources, so a wrong method is 405, not 404.
                .service(web::resource("/replay").route(web::post().to(replay_messages)))
                .service(web::resource("/recover-backfill").route(web::post().to(recover_backfill)))
                .service(web::resource("/events/requeue").route(web::post().to(requeue_events)))
                .service(web::resource("/messages/{msg_id}").route(web::get().to(message))),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison_is_exact() {
        assert!(same(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcdeF"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcde"));
        assert!(!same(b"", b"x"));
    }
}
