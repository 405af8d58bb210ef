//! Every refusal of the admin surface as one type: actix turns a handler's or an extractor's
//! `Err(AdminError)` into the JSON `{"error": …}` answer with its status ([`ResponseError`]).

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use msgx_core::ops::OpsError;
use serde_json::json;

use crate::auth::Denied;

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
    /// The compat entry needs `Content-Type: application/json`: 415.
    #[error("Content-Type must be application/json")]
    NotJson,
    /// Something the route needs is not there: 404.
    #[error("{0}")]
    NotFound(String),
    /// A check that could not run (a store unreachable): 503.
    #[error("{0}")]
    Unavailable(String),
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
            Self::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
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
        answer.json(json!({ "error": self.to_string() }))
    }
}
