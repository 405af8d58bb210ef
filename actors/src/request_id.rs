//! A request id on every HTTP answer (`X-Request-Id`), and what a 5xx answer carries: the id,
//! never the internal error text. The log line of a failed request has the id, the route and
//! the whole error, so an operator finds the cause from what a caller reports.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::HttpResponse;
use serde_json::json;

/// The response header naming the request.
pub const HEADER: &str = "x-request-id";

/// A fresh id: 16 hex digits, random (unique enough to find one request in the log).
pub fn fresh() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The whole error: an admin refusal with its causes, each said once (a cause whose text the
/// message already carries is not repeated).
fn cause(e: &actix_web::Error) -> String {
    let Some(admin) = e.as_error::<crate::admin::AdminError>() else {
        return e.to_string();
    };
    let mut out = admin.to_string();
    let mut source = std::error::Error::source(admin);
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The middleware ([`actix_web::middleware::from_fn`]): tags the answer with a fresh id; an
/// answer with a server-error status that carries an error (a handler's or an extractor's)
/// is logged with the id and the error, and its body replaced by the id. A 5xx that is an
/// answer by design (`/readyz` not ready, the admin surface not serving yet) keeps its body.
pub async fn tag(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let id = fresh();
    let (method, path) = (req.method().clone(), req.path().to_owned());
    let res = next.call(req).await?.map_into_boxed_body();
    let status = res.status();
    let failed = status
        .is_server_error()
        .then(|| res.response().error().map(cause));
    let mut res = match failed.flatten() {
        Some(error) => {
            tracing::error!(
                request_id = %id,
                %method,
                path = %path,
                status = status.as_u16(),
                error = %error,
                "request failed; nothing changed"
            );
            let answer = HttpResponse::build(status).json(json!({
                "error": format!(
                    "the request could not be served; the service log has the cause under \
                     request_id {id}"
                ),
                "request_id": id,
            }));
            res.into_response(answer)
        }
        None => res,
    };
    if let Ok(value) = HeaderValue::from_str(&id) {
        res.headers_mut()
            .insert(HeaderName::from_static(HEADER), value);
    }
    Ok(res)
}
