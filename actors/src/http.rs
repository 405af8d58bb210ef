//! The HTTP surface: `/metrics` (Prometheus), `/healthz` (process alive), `/readyz` (this
//! instance holds the lease, every child's mailbox is open and the last poll round succeeded:
//! [`crate::health`]), and `/admin/*` + `/cminmsgs/send` when any token is configured
//! ([`crate::admin`], [`crate::auth`]). Every route is in `docs/openapi.json` ([`ROUTES`]).
//! Unknown paths get 404, wrong methods 405: nothing else is served.

use std::net::SocketAddr;

use actix_web::{web, App, HttpResponse, HttpServer};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::admin::AdminState;
use crate::health::Health;

async fn metrics(handle: web::Data<PrometheusHandle>) -> HttpResponse {
    handle.run_upkeep();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(msgx_core::telemetry::between_events(|| handle.render()))
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body("ok\n")
}

async fn readyz(health: web::Data<Health>) -> HttpResponse {
    // Every child, the lease and the last poll round (health::Readiness).
    let body = health.readiness();
    if body.ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// The routes served without a token.
const OPEN_ROUTES: &[(&str, &str)] =
    &[("GET", "/metrics"), ("GET", "/healthz"), ("GET", "/readyz")];

/// Every (method, path) served: the open routes and the admin route table
/// ([`crate::admin::ROUTES`]), as documented in `docs/openapi.json` (the OpenAPI test checks
/// both directions against the running router).
pub const ROUTES: [(&str, &str); OPEN_ROUTES.len() + crate::admin::ROUTES.len()] =
    concat(OPEN_ROUTES, crate::admin::ROUTES);

const fn concat<const N: usize>(
    a: &[(&'static str, &'static str)],
    b: &[(&'static str, &'static str)],
) -> [(&'static str, &'static str); N] {
    let mut out = [("", ""); N];
    let mut i = 0;
    while i < N {
        out[i] = if i < a.len() { a[i] } else { b[i - a.len()] };
        i += 1;
    }
    out
}

/// `/metrics`, `/healthz`, `/readyz` (they need the Prometheus handle and the health as app
/// data). Resources, so a wrong method is 405, not 404.
pub fn open_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/metrics").route(web::get().to(metrics)))
        .service(web::resource("/healthz").route(web::get().to(healthz)))
        .service(web::resource("/readyz").route(web::get().to(readyz)));
}

/// How long a client may take to send its request: the head (actix's
/// `client_request_timeout`: 408 and the connection closed) and then the body
/// ([`crate::admin::extract`]: 408). `http.read_timeout`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Each of the head and the body must arrive within this.
    pub read_timeout: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            read_timeout: std::time::Duration::from_secs(5),
        }
    }
}

impl Limits {
    /// From `[http]`.
    pub fn from_settings(http: &msgx_core::settings::HttpSettings) -> Self {
        Self {
            read_timeout: http.read_timeout,
        }
    }
}

/// What a configured admin surface answers before the pipeline runs (starting, waiting for the
/// store, standing by for the lease): 503 with the reason, never a 404 as if it did not exist.
async fn not_serving_yet(health: web::Data<Health>) -> HttpResponse {
    let why = health
        .readiness()
        .waiting
        .unwrap_or_else(|| "starting".into());
    HttpResponse::ServiceUnavailable()
        .insert_header(("Retry-After", "1"))
        .json(serde_json::json!({
            "error": format!("the admin surface is not serving yet: {why}")
        }))
}

/// The server until the pipeline runs: `/metrics`, `/healthz`, `/readyz`, and — when tokens
/// are configured (`admin_configured`) — 503 with the reason on `/admin/*` and
/// `/cminmsgs/send`.
pub fn serve_early(
    listen: SocketAddr,
    handle: PrometheusHandle,
    health: Health,
    admin_configured: bool,
    limits: Limits,
) -> std::io::Result<actix_web::dev::Server> {
    bind(
        listen,
        handle,
        health,
        limits,
        move |cfg: &mut web::ServiceConfig| {
            if admin_configured {
                cfg.service(web::scope("/admin").default_service(web::to(not_serving_yet)))
                    .service(web::resource("/cminmsgs/send").to(not_serving_yet));
            }
        },
    )
}

/// Binds and starts the server; the returned handle stops it.
pub fn serve(
    listen: SocketAddr,
    handle: PrometheusHandle,
    health: Health,
    admin: Option<AdminState>,
) -> std::io::Result<actix_web::dev::Server> {
    serve_with_verify(listen, handle, health, admin, None, Limits::default())
}

/// [`serve`], with what `GET /admin/verify` reads ([`crate::admin::handlers::verify`]).
pub fn serve_with_verify(
    listen: SocketAddr,
    handle: PrometheusHandle,
    health: Health,
    admin: Option<AdminState>,
    verify: Option<msgx_core::verify::VerifyInput>,
    limits: Limits,
) -> std::io::Result<actix_web::dev::Server> {
    // One for every worker: at most one verify runs per server.
    let verify = verify.map(|v| web::Data::new(crate::admin::handlers::Verify::new(v)));
    bind(
        listen,
        handle,
        health,
        limits,
        move |cfg: &mut web::ServiceConfig| {
            if let Some(v) = verify.clone() {
                cfg.app_data(v);
            }
            if let Some(state) = admin.clone() {
                crate::admin::configure(state)(cfg);
            }
        },
    )
}

/// How long a stopping server lets requests in flight finish (actix's default is 30 s): the
/// unit's `TimeoutStopSec` is `supervisor.shutdown_grace` + this + a margin.
pub const HTTP_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// HTTP workers (threads). Probes must answer while an admin request runs: `/admin/verify`
/// runs off the worker ([`crate::admin::handlers::verify`]), and a second worker keeps any other
/// slow request from holding every connection the server accepts.
pub const WORKERS: usize = 2;

/// The one server shape: the open routes with their data, plus what `extra` adds; every answer
/// tagged with a request id ([`crate::request_id`]); [`WORKERS`] workers, the [`Limits`] on
/// reading a request, and no signal handling of its own (the service owns SIGTERM).
fn bind<F>(
    listen: SocketAddr,
    handle: PrometheusHandle,
    health: Health,
    limits: Limits,
    extra: F,
) -> std::io::Result<actix_web::dev::Server>
where
    F: Fn(&mut web::ServiceConfig) + Clone + Send + 'static,
{
    let handle = web::Data::new(handle);
    let health = web::Data::new(health);
    let server = HttpServer::new(move || {
        App::new()
            .wrap(actix_web::middleware::from_fn(crate::request_id::tag))
            .app_data(handle.clone())
            .app_data(health.clone())
            .app_data(web::Data::new(limits))
            .configure(open_routes)
            .configure(extra.clone())
    })
    .workers(WORKERS)
    .client_request_timeout(limits.read_timeout)
    .disable_signals()
    .shutdown_timeout(HTTP_DRAIN.as_secs())
    .bind(listen)?
    .run();
    Ok(server)
}
