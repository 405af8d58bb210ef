//! The admin HTTP surface (`/admin/*`) and the compat entry (`/cminmsgs/send`), served when at
//! least one token is configured ([`crate::auth`]). One route table ([`ROUTES`], below) names
//! every route with its handler ([`handlers`]); each handler states its scope and input as
//! extractors ([`extract`]: the token before the body is read or parsed, the body's size
//! limit) and calls the same [`msgx_core::ops`] operation as the CLI. Every refusal is an
//! [`AdminError`]: a JSON `{"error": …}` with a 4xx status; a store failure is 503 and changes
//! nothing.
//!
//! The routes, their parameters and bodies are described in `docs/openapi.json`; the
//! `openapi_document_matches_the_real_router` test checks the document against this table and
//! the router in both directions.

use std::sync::Arc;

use actix_web::http::Method;
use actix_web::web;
use msgx_core::clock::SharedClock;
use msgx_core::ops::Ops;
use msgx_core::settings::Settings;
use msgx_core::store::Store;

pub use crate::auth::{Scope, Tokens};
pub use error::AdminError;

pub mod error;
pub mod extract;
pub mod handlers;
pub mod json;

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

/// The route table: `METHOD "path" => handler`, expanded into [`ROUTES`] (what the OpenAPI
/// test compares with the document) and `routes` (what the server registers), so the two
/// cannot differ.
macro_rules! route_table {
    ($($method:ident $path:literal => $handler:path),+ $(,)?) => {
        /// Every admin and compat (method, path), in the order registered.
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),+];

        /// One resource per path, so a wrong method is 405, not 404.
        fn routes(cfg: &mut web::ServiceConfig) {
            $(cfg.service(
                web::resource($path).route(web::route().method(Method::$method).to($handler)),
            );)+
        }
    };
}

route_table! {
    GET "/admin/status" => handlers::status,
    GET "/admin/messages/{msg_id}" => handlers::message,
    GET "/admin/events/dead" => handlers::dead_events,
    POST "/admin/replay" => handlers::replay,
    POST "/admin/recover-backfill" => handlers::recover_backfill,
    POST "/admin/events/requeue" => handlers::requeue_events,
    GET "/admin/verify" => handlers::verify,
    GET "/admin/survey" => handlers::survey,
    POST "/admin/skip" => handlers::skip,
    GET "/admin/purge-readiness" => handlers::purge_readiness,
    GET "/admin/cutover-plan" => handlers::cutover_plan,
    POST "/cminmsgs/send" => handlers::compat_send,
}

/// Registers [`ROUTES`] with the state they share.
pub fn configure(state: AdminState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(web::Data::new(state));
        routes(cfg);
    }
}
