//! What every admin handler needs before it runs, as actix extractors: the token's scope
//! ([`Authorized`]), the JSON body within its size limit ([`Body`]) and the query ([`Query`]).
//! Each refuses with an [`AdminError`]. A handler lists [`Authorized`] first: actix polls the
//! extractors in argument order and stops at the first refusal, so no body is read (or found
//! too large) for a request without the scope.

use std::marker::PhantomData;

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};
use futures::future::{ready, LocalBoxFuture, Ready};
use futures::StreamExt as _;
use serde::de::DeserializeOwned;

use msgx_core::telemetry;

use super::error::AdminError;
use super::AdminState;
use crate::auth::{Caller, Scope};

/// The scope a route needs, as a type (see [`Authorized`]).
pub trait RouteScope {
    /// The scope.
    const SCOPE: Scope;
}

/// `GET /admin/*`.
pub struct Read;
/// The audited `POST /admin/*`.
pub struct Operate;
/// `POST /cminmsgs/send`.
pub struct Compat;

impl RouteScope for Read {
    const SCOPE: Scope = Scope::Read;
}
impl RouteScope for Operate {
    const SCOPE: Scope = Scope::Operate;
}
impl RouteScope for Compat {
    const SCOPE: Scope = Scope::Compat;
}

fn admin_state(req: &HttpRequest) -> Result<&web::Data<AdminState>, AdminError> {
    req.app_data::<web::Data<AdminState>>()
        .ok_or_else(|| AdminError::Unavailable("the admin surface is not configured".into()))
}

/// The request carries a token with scope `S` (else 401, or 403 for a token without it); the
/// token's name, which an audited action records.
pub struct Authorized<S: RouteScope>(pub Caller, pub PhantomData<S>);

impl<S: RouteScope> FromRequest for Authorized<S> {
    type Error = AdminError;
    type Future = Ready<Result<Self, AdminError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(
            admin_state(req)
                .and_then(|state| Ok(state.tokens.check(req, S::SCOPE)?))
                .map(|caller| Self(caller, PhantomData)),
        )
    }
}

/// How a route's body is read.
pub trait BodyRules {
    /// Largest body accepted (413 beyond it, before it is read whole).
    const LIMIT: usize;
    /// Refuse (415) a request whose Content-Type is not `application/json`.
    const JSON_ONLY: bool;
    /// What a body should look like, for the 400's message.
    const EXPECTED: &'static str;
}

/// The admin routes: up to [`super::MAX_BODY`], any Content-Type.
pub struct AdminBody;
/// The compat entry: `{"msg_id": N}`, up to [`super::MAX_COMPAT_BODY`], JSON only.
pub struct CompatBody;

impl BodyRules for AdminBody {
    const LIMIT: usize = super::MAX_BODY;
    const JSON_ONLY: bool = false;
    const EXPECTED: &'static str = "";
}
impl BodyRules for CompatBody {
    const LIMIT: usize = super::MAX_COMPAT_BODY;
    const JSON_ONLY: bool = true;
    const EXPECTED: &'static str = " (expected {\"msg_id\": <inbox id>})";
}

/// The JSON body parsed into `T`, read under the rules `R`.
pub struct Body<T, R: BodyRules = AdminBody>(pub T, pub PhantomData<R>);

impl<T: DeserializeOwned + 'static, R: BodyRules + 'static> FromRequest for Body<T, R> {
    type Error = AdminError;
    type Future = LocalBoxFuture<'static, Result<Self, AdminError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let (req, payload) = (req.clone(), payload.take());
        Box::pin(async move {
            if R::JSON_ONLY && !is_json(&req) {
                return Err(AdminError::NotJson);
            }
            let bytes = read_body(&req, payload, R::LIMIT).await?;
            super::json::parse_json(&bytes)
                .map(|body| Self(body, PhantomData))
                .map_err(|e| AdminError::BadRequest(format!("bad JSON body{}: {e}", R::EXPECTED)))
        })
    }
}

fn is_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(actix_web::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// The body, at most `limit` bytes: a declared length beyond it is refused before reading, a
/// stream that grows beyond it as soon as it does; all of it within `http.read_timeout`
/// ([`crate::http::Limits`]), else 408.
async fn read_body(
    req: &HttpRequest,
    mut payload: Payload,
    limit: usize,
) -> Result<web::Bytes, AdminError> {
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(AdminError::TooLarge(limit));
    }
    let within = req
        .app_data::<web::Data<crate::http::Limits>>()
        .map_or_else(crate::http::Limits::default, |l| ***l)
        .read_timeout;
    let read = async {
        let mut body = web::BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|e| AdminError::BadRequest(format!("bad body: {e}")))?;
            if body.len() + chunk.len() > limit {
                return Err(AdminError::TooLarge(limit));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    };
    // A client that trickles its body (or stops sending) would hold the connection and the
    // request's memory for as long as it likes.
    match tokio::time::timeout(within, read).await {
        Ok(body) => body,
        Err(_) => {
            telemetry::http_refused("read_timeout", req.path(), req.peer_addr());
            Err(AdminError::ReadTimeout(within))
        }
    }
}

/// The query string parsed into `T` (400 with the reason otherwise).
pub struct Query<T>(pub T);

impl<T: DeserializeOwned> FromRequest for Query<T> {
    type Error = AdminError;
    type Future = Ready<Result<Self, AdminError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(
            web::Query::<T>::from_query(req.query_string())
                .map(|q| Self(q.into_inner()))
                .map_err(|e| AdminError::BadRequest(format!("bad query: {e}"))),
        )
    }
}
