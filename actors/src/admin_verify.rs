//! `GET /admin/verify` (admin token required): the same invariant check as `msgexchange
//! verify` ([`msgx_core::verify`]), answered as JSON: 200 when every invariant holds, 409 with
//! the findings when one is violated, 503 when the check could not run. Kafka is not read
//! back here (`verify --kafka` does that from the command line).

use actix_web::{web, HttpRequest, HttpResponse};
use msgx_core::verify::{verify as run_verify, VerifyInput};
use serde_json::json;

use crate::admin::AdminState;

/// The handler.
pub async fn verify(
    req: HttpRequest,
    state: web::Data<AdminState>,
    input: Option<web::Data<VerifyInput>>,
) -> HttpResponse {
    if let Some(refused) = crate::admin::unauthorized(&req, &state) {
        return refused;
    }
    let Some(input) = input else {
        return HttpResponse::NotFound().json(json!({ "error": "verify is not wired here" }));
    };
    match run_verify(&input).await {
        Ok(report) if report.ok() => {
            HttpResponse::Ok().json(json!({ "ok": true, "report": report }))
        }
        Ok(report) => HttpResponse::Conflict().json(json!({ "ok": false, "report": report })),
        Err(e) => {
            tracing::warn!(error = %e, "verify failed to run");
            HttpResponse::ServiceUnavailable().json(json!({ "error": e.to_string() }))
        }
    }
}
