//! The admin HTTP surface (`/admin/*`) and the compat entry (`/cminmsgs/send`), served when at
//! least one token is configured ([`crate::auth`]). The handlers are thin: each calls the same
//! [`msgx_core::ops`] operation as the CLI and answers its serde output as JSON. Every refusal
//! is a JSON `{"error": …}` with a 4xx status; a store failure is 503 and changes nothing.
//! Authentication comes before the body is read or parsed.
//!
//! - `GET /admin/status` (read) → `Ops::status`;
//! - `GET /admin/messages/{msg_id}` (read) → `Ops::inspect`;
//! - `GET /admin/events/dead?after=&limit=` (read) → `Ops::list_dead_events`;
//! - `POST /admin/replay` (operate) → `Ops::replay` (DEAD/FAILED rows of the replayable classes
//!   back to PENDING, with the state the operator saw);
//! - `POST /admin/recover-backfill` (operate) → `Ops::recover_backfill`;
//! - `POST /admin/events/requeue` (operate) → `Ops::requeue_events`;
//! - `GET /admin/verify` (read) → `msgx_core::verify` (the invariants of docs/operations.md; 200, 409, 503);
//! - `GET /admin/survey`, `GET /admin/purge-readiness`, `GET /admin/cutover-plan` (read),
//!   `POST /admin/skip` (operate) → [`crate::admin_procedures`];
//! - `POST /cminmsgs/send` (compat) → `Ops::compat_register`.
//!
//! The routes and their bodies are described in `docs/openapi.json` (checked by a test).

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use futures::StreamExt as _;
use msgx_core::clock::SharedClock;
use msgx_core::ops::{Ops, OpsError};
use msgx_core::settings::Settings;
use msgx_core::store::Store;
use serde_json::json;

pub use crate::auth::{Scope, Tokens};

/// Most ids one request may name (one transaction holds the pipeline lock for all of them).
pub const MAX_IDS: usize = msgx_core::ops::MAX_IDS;
/// Largest admin request body accepted.
pub const MAX_BODY: usize = 256 * 1024;
/// Largest compat request body accepted (`{"msg_id": N}` is a few bytes).
pub const MAX_COMPAT_BODY: usize = 4 * 1024;

/// What the handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// Our PostgreSQL (also inside `ops`).
    pub store: Store,
    /// "now" of the audit rows and the status.
    pub clock: SharedClock,
    /// The bearer tokens and their scopes (non-empty).
    pub tokens: Arc<Tokens>,
    /// The operations.
    pub ops: Ops,
}

impl AdminState {
    /// The state when any token is configured; None (no admin surface, 404) otherwise.
    pub fn from_settings(settings: &Settings, ops: Ops, clock: SharedClock) -> Option<Self> {
        let tokens = Tokens::from_settings(&settings.http);
        (!tokens.is_empty()).then(|| Self {
            store: ops.store.clone(),
            clock,
            tokens: Arc::new(tokens),
            ops,
        })
    }
}

/// A JSON refusal.
pub fn error(status: StatusCode, message: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status).json(json!({ "error": message.into() }))
}

/// None when the request carries a token with the `read` scope; else the 401/403 to send.
pub fn unauthorized(req: &HttpRequest, state: &AdminState) -> Option<HttpResponse> {
    state.tokens.denied(req, Scope::Read)
}

/// The operation's refusal as HTTP.
pub fn ops_error(e: OpsError) -> HttpResponse {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    if status.is_server_error() {
        tracing::error!(error = %e, "admin operation failed on a store; nothing changed");
    }
    error(status, e.to_string())
}

/// The body, at most `limit` bytes (413 with a reason beyond it, before it is read whole).
async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, Box<HttpResponse>> {
    let too_large = || {
        Box::new(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {limit} bytes"),
        ))
    };
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk
            .map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, format!("bad body: {e}"))))?;
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// [`read_body`] for the other handler files.
pub async fn read_body_pub(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, Box<HttpResponse>> {
    read_body(req, payload, limit).await
}

/// The JSON body as `T`. JSON Schema (docs/openapi.json) counts `3.0` and `1e3` as integers
/// and serde's `i64` does not, so such literals are rewritten as the integer first
/// ([`integral_literals`]); `3.5`, or a value beyond `i64`, stays as written and is refused.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(&integral_literals(body))
}

/// `body` with every number literal outside strings that has an integral value within `i64`
/// but a fraction or an exponent (`3.0`, `1e+16`, `-12.50e1`) written as that integer. Exact:
/// from the literal's digits, never through a float.
fn integral_literals(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let (mut i, mut in_string, mut escaped) = (0, false, false);
    while i < body.len() {
        let b = body[i];
        if in_string {
            (in_string, escaped) = (escaped || b != b'"', !escaped && b == b'\\');
        } else if b == b'"' {
            in_string = true;
        } else if b == b'-' || b.is_ascii_digit() {
            let len = body[i..]
                .iter()
                .position(|c| !(c.is_ascii_digit() || b"+-.eE".contains(c)))
                .unwrap_or(body.len() - i);
            let literal = &body[i..i + len];
            match std::str::from_utf8(literal).ok().and_then(integral) {
                Some(int) => out.extend_from_slice(int.as_bytes()),
                None => out.extend_from_slice(literal),
            }
            i += len;
            continue;
        }
        out.push(b);
        i += 1;
    }
    out
}

/// The integer a JSON number literal with a fraction or an exponent stands for, when it is
/// integral and within `i64`.
fn integral(literal: &str) -> Option<String> {
    let unsigned = literal.strip_prefix('-').unwrap_or(literal);
    let (mantissa, exp) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], unsigned[at + 1..].parse::<i64>().ok()?),
        None => (unsigned, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    if (frac.is_empty() && exp == 0)
        || int.is_empty()
        || !digits.bytes().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    // The value is 0.<digits> × 10^point: integral when no non-zero digit follows `point`.
    let point = (int.len() as i64).checked_add(exp)?;
    let cut = usize::try_from(point.clamp(0, digits.len() as i64)).ok()?;
    if digits[cut..].bytes().any(|c| c != b'0') || point > 40 {
        return None;
    }
    let zeros = "0".repeat(
        usize::try_from(point)
            .unwrap_or(0)
            .saturating_sub(digits.len()),
    );
    let magnitude: i128 = format!("0{}{zeros}", &digits[..cut]).parse().ok()?;
    let value = if literal.starts_with('-') {
        -magnitude
    } else {
        magnitude
    };
    i64::try_from(value).ok().map(|v| v.to_string())
}

/// Authenticates for `scope`, then reads and parses the JSON body into `T`.
async fn admitted<T: serde::de::DeserializeOwned>(
    req: &HttpRequest,
    state: &AdminState,
    payload: web::Payload,
    scope: Scope,
    limit: usize,
) -> Result<T, Box<HttpResponse>> {
    if let Some(denied) = state.tokens.denied(req, scope) {
        return Err(Box::new(denied));
    }
    let body = read_body(req, payload, limit).await?;
    parse_json(&body).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            format!("bad JSON body: {e}"),
        ))
    })
}

/// Too many ids, refused before the body reaches the store.
fn too_many(n: usize, what: &str) -> Option<HttpResponse> {
    (n > MAX_IDS).then(|| {
        error(
            StatusCode::BAD_REQUEST,
            format!("{n} {what} given; at most {MAX_IDS} per request"),
        )
    })
}

async fn replay(
    req: HttpRequest,
    state: web::Data<AdminState>,
    payload: web::Payload,
) -> HttpResponse {
    let body: msgx_core::ops::ReplayRequest =
        match admitted(&req, &state, payload, Scope::Operate, MAX_BODY).await {
            Ok(b) => b,
            Err(r) => return *r,
        };
    if let Some(r) = too_many(body.msg_ids.len(), "msg_ids") {
        return r;
    }
    match state.ops.replay(&body, state.clock.now()).await {
        Ok(r) => HttpResponse::Ok().json(r),
        Err(e) => ops_error(e),
    }
}

async fn recover_backfill(
    req: HttpRequest,
    state: web::Data<AdminState>,
    payload: web::Payload,
) -> HttpResponse {
    let body: msgx_core::ops::RecoverRequest =
        match admitted(&req, &state, payload, Scope::Operate, MAX_BODY).await {
            Ok(b) => b,
            Err(r) => return *r,
        };
    if let Some(r) = too_many(body.msg_ids.len(), "msg_ids") {
        return r;
    }
    match state.ops.recover_backfill(&body, state.clock.now()).await {
        Ok(r) => HttpResponse::Ok().json(r),
        Err(e) => ops_error(e),
    }
}

async fn requeue_events(
    req: HttpRequest,
    state: web::Data<AdminState>,
    payload: web::Payload,
) -> HttpResponse {
    let body: msgx_core::ops::RequeueRequest =
        match admitted(&req, &state, payload, Scope::Operate, MAX_BODY).await {
            Ok(b) => b,
            Err(r) => return *r,
        };
    if let Some(r) = too_many(body.event_ids.len(), "event_ids") {
        return r;
    }
    match state.ops.requeue_events(&body, state.clock.now()).await {
        Ok(r) => HttpResponse::Ok().json(r),
        Err(e) => ops_error(e),
    }
}

async fn message(req: HttpRequest, state: web::Data<AdminState>) -> HttpResponse {
    if let Some(denied) = unauthorized(&req, &state) {
        return denied;
    }
    let raw = req.match_info().get("msg_id").unwrap_or_default();
    let Ok(msg_id) = raw.parse::<i64>() else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("`{raw}` is not a message id"),
        );
    };
    match state.ops.inspect(msg_id).await {
        Ok(v) => HttpResponse::Ok().json(v),
        Err(e) => ops_error(e),
    }
}

/// Registers `/admin/*` and `/cminmsgs/send`. Resources, so a wrong method is 405, not 404.
pub fn configure(state: AdminState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        let data = web::Data::new(state);
        cfg.service(
            web::scope("/admin")
                .app_data(data.clone())
                .service(web::resource("/replay").route(web::post().to(replay)))
                .service(web::resource("/recover-backfill").route(web::post().to(recover_backfill)))
                .service(web::resource("/events/requeue").route(web::post().to(requeue_events)))
                .service(web::resource("/messages/{msg_id}").route(web::get().to(message)))
                .service(web::resource("/verify").route(web::get().to(crate::admin_verify::verify)))
                .configure(crate::admin_api::configure_admin)
                .configure(crate::admin_procedures::configure),
        )
        .service(
            web::scope("/cminmsgs")
                .app_data(data)
                .configure(crate::admin_api::configure_compat),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::integral_literals;

    #[test]
    fn integral_literals_become_integers_exactly() {
        let cases = [
            (
                r#"{"a": [3.0, -2.50e1, 1e+16, 12, 1.5, "7.0"]}"#,
                r#"{"a": [3, -25, 10000000000000000, 12, 1.5, "7.0"]}"#,
            ),
            ("-9223372036854775808.0", "-9223372036854775808"),
            ("-9223372036854775809.0", "-9223372036854775809.0"),
            ("9223372036854775808e0", "9223372036854775808e0"),
            ("4287719443501732.0", "4287719443501732"),
            ("4503599627370495.5", "4503599627370495.5"),
            (
                r#"{"k\\": 2.0, "s": "a\"1.0"}"#,
                r#"{"k\\": 2, "s": "a\"1.0"}"#,
            ),
            ("1e999999999999999999", "1e999999999999999999"),
            ("0.0e-5", "0"),
        ];
        for (input, want) in cases {
            let got = String::from_utf8(integral_literals(input.as_bytes())).unwrap_or_default();
            assert_eq!(got, want, "{input}");
        }
    }
}
