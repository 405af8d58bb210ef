//! Every refusal of the admin surface as one type: actix turns a handler's or an extractor's
//! `Err(AdminError)` into the JSON `{"error": …}` answer with its status ([`ResponseError`]).

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use msgx_core::ops::OpsError;
use serde_json::json;

use crate::auth::Denied;

/// Seconds a 429 asks the caller to wait (`Retry-After`): a verify of a large store runs for
/// minutes, a retry sooner only finds it still running.
pub const BUSY_RETRY_AFTER_S: u32 = 30;

/// Why an admin request was refused (or could not be served). Nothing changed in any case.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No bearer token, or one that is not configured: 401.
    #[error("missing or wrong bearer token")]
    Unauthenticated,
    /// A configured token without the route's scope: 403.
    #[error("the token lacks the `{0}` scope")]
    Forbidden(&'static str),
    /// A malformed request (query, path, body): 400.
    #[error("{0}")]
    BadRequest(String),
    /// The body exceeds the route's limit: 413.
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    /// The body did not arrive within `http.read_timeout`: 408 (the connection is closed).
    #[error("request body not received within {}", humantime::format_duration(.0.to_owned()))]
    ReadTimeout(std::time::Duration),
    /// The compat entry needs `Content-Type: application/json`: 415.
    #[error("Content-Type must be application/json")]
    NotJson,
    /// Something the route needs is not there: 404.
    #[error("{0}")]
    NotFound(String),
    /// A check that could not run (a store unreachable): 503.
    #[error("{0}")]
    Unavailable(String),
    /// One of its kind is already running (`/admin/verify`): 429 with `Retry-After`.
    #[error("{0}")]
    Busy(&'static str),
    /// The operation's own refusal, with its status ([`OpsError::http_status`]).
    #[error(transparent)]
    Ops(#[from] OpsError),
}

impl From<Denied> for AdminError {
    fn from(d: Denied) -> Self {
        match d {
            Denied::Unauthenticated => Self::Unauthenticated,
            Denied::Forbidden(scope) => Self::Forbidden(scope.name()),
        }
    }
}

impl ResponseError for AdminError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ReadTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Ops(e) => {
                StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST)
            }
        }
    }

    /// The answer; a 5xx's body is replaced by the request id (and the error logged under it)
    /// by [`crate::request_id::tag`].
    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let mut answer = HttpResponse::build(status);
        if matches!(self, Self::Unauthenticated) {
            answer.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        if matches!(self, Self::ReadTimeout(_)) {
            // The rest of the body may still come: close rather than read it.
            answer.force_close();
        }
        if matches!(self, Self::Busy(_)) {
            answer.insert_header((header::RETRY_AFTER, BUSY_RETRY_AFTER_S.to_string()));
        }
        answer.json(json!({ "error": self.to_string() }))
    }
}
