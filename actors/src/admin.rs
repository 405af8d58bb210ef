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
pub(crate) fn unauthorized(req: &HttpRequest, state: &AdminState) -> Option<HttpResponse> {
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

/// The body of an authenticated request, parsed and bounded to [`MAX_IDS`] ids — parsed only
/// after authentication, so a stranger learns nothing — or the response to send instead.
fn admitted<T: serde::de::DeserializeOwned>(
    req: &HttpRequest,
    state: &AdminState,
    body: &[u8],
    ids: fn(&T) -> &[i64],
    what: &str,
) -> Result<T, Box<HttpResponse>> {
    if let Some(denied) = unauthorized(req, state) {
        return Err(Box::new(denied));
    }
    let parsed: T = serde_json::from_slice(body).map_err(|e| {
        Box::new(error(
            actix_web::http::StatusCode::BAD_REQUEST,
            format!("bad JSON body: {e}"),
        ))
    })?;
    let n = ids(&parsed).len();
    if n > MAX_IDS {
        return Err(Box::new(error(
            actix_web::http::StatusCode::BAD_REQUEST,
            format!("{n} {what} given; at most {MAX_IDS} per request"),
        )));
    }
    Ok(parsed)
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

/// The two audited actions on messages.
#[derive(Debug, Clone, Copy)]
enum MessageAction {
    Replay,
    RecoverBackfill,
}

async fn message_action(
    action: MessageAction,
    req: HttpRequest,
    state: web::Data<AdminState>,
    body: web::Bytes,
) -> HttpResponse {
    let body = match admitted(
        &req,
        &state,
        &body,
        |b: &MessagesBody| &b.msg_ids,
        "msg_ids",
    ) {
        Ok(b) => b,
        Err(response) => return *response,
    };
    let (store, now) = (&state.store, state.clock.now());
    let (ids, actor, why) = (&body.msg_ids, &body.actor, &body.reason);
    let done = match action {
        MessageAction::Replay => replay::replay(store, ids, actor, why, now).await,
        MessageAction::RecoverBackfill => {
            replay::recover_abandoned(store, ids, actor, why, now).await
        }
    };
    match done {
        Ok(r) => HttpResponse::Ok().json(report_json(&r)),
        Err(e) => admin_error(e),
    }
}

async fn requeue_events(
    req: HttpRequest,
    state: web::Data<AdminState>,
    body: web::Bytes,
) -> HttpResponse {
    let body = match admitted(
        &req,
        &state,
        &body,
        |b: &EventsBody| &b.event_ids,
        "event_ids",
    ) {
        Ok(b) => b,
        Err(response) => return *response,
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
                .service(
                    web::resource("/replay").route(web::post().to(|req, state, body| {
                        message_action(MessageAction::Replay, req, state, body)
                    })),
                )
                .service(web::resource("/recover-backfill").route(web::post().to(
                    |req, state, body| {
                        message_action(MessageAction::RecoverBackfill, req, state, body)
                    },
                )))
                .service(web::resource("/events/requeue").route(web::post().to(requeue_events)))
                .service(web::resource("/messages/{msg_id}").route(web::get().to(message)))
                .service(
                    web::resource("/verify").route(web::get().to(crate::admin_verify::verify)),
                ),
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
