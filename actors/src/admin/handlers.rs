//! The handlers: each names its scope and input as extractors ([`super::extract`]), calls the
//! same [`msgx_core::ops`] operation as the CLI and answers its serde output as JSON; a
//! refusal is an [`AdminError`].

use actix_web::{web, HttpRequest, HttpResponse};
use msgx_core::cutover::CutoverMode;
use msgx_core::ops::{
    CallerTrace, CompatRequest, PurgeRequest, RecoverRequest, ReplayRequest, RequeueRequest,
    SkipRequest, SurveyRequest,
};
use msgx_core::verify::{verify as run_verify, VerifyInput};
use serde::Deserialize;
use serde_json::json;

use super::error::AdminError;
use super::extract::{Authorized, Body, Compat, CompatBody, Operate, Query, Read};
use super::AdminState;

type Answer = Result<HttpResponse, AdminError>;

fn ok<T: serde::Serialize>(value: T) -> Answer {
    Ok(HttpResponse::Ok().json(value))
}

/// `GET /admin/status` → `Ops::status`.
pub async fn status(_: Authorized<Read>, state: web::Data<AdminState>) -> Answer {
    ok(state.ops.status(state.clock.now()).await?)
}

/// `GET /admin/messages/{msg_id}` → `Ops::inspect`.
pub async fn message(
    _: Authorized<Read>,
    state: web::Data<AdminState>,
    raw: web::Path<String>,
) -> Answer {
    let msg_id = raw
        .parse::<i64>()
        .map_err(|_| AdminError::BadRequest(format!("`{raw}` is not a message id")))?;
    ok(state.ops.inspect(msg_id).await?)
}

/// `?after=&limit=` of the dead-event listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadQuery {
    #[serde(default)]
    after: Option<i64>,
    #[serde(default)]
    limit: Option<i64>,
}

/// `GET /admin/events/dead` → `Ops::list_dead_events`.
pub async fn dead_events(
    _: Authorized<Read>,
    state: web::Data<AdminState>,
    Query(q): Query<DeadQuery>,
) -> Answer {
    let (after, limit) = (q.after.unwrap_or(0), q.limit.unwrap_or(100));
    ok(state.ops.list_dead_events(after, limit).await?)
}

/// `POST /admin/replay` → `Ops::replay`.
pub async fn replay(
    Authorized(caller, _): Authorized<Operate>,
    state: web::Data<AdminState>,
    Body(body, _): Body<ReplayRequest>,
) -> Answer {
    ok(state
        .ops
        .called_by(&caller.0)
        .replay(&body, state.clock.now())
        .await?)
}

/// `POST /admin/recover-backfill` → `Ops::recover_backfill`.
pub async fn recover_backfill(
    Authorized(caller, _): Authorized<Operate>,
    state: web::Data<AdminState>,
    Body(body, _): Body<RecoverRequest>,
) -> Answer {
    ok(state
        .ops
        .called_by(&caller.0)
        .recover_backfill(&body, state.clock.now())
        .await?)
}

/// `POST /admin/events/requeue` → `Ops::requeue_events`.
pub async fn requeue_events(
    Authorized(caller, _): Authorized<Operate>,
    state: web::Data<AdminState>,
    Body(body, _): Body<RequeueRequest>,
) -> Answer {
    ok(state
        .ops
        .called_by(&caller.0)
        .requeue_events(&body, state.clock.now())
        .await?)
}

/// `GET /admin/verify` → `msgx_core::verify`: 200 when every invariant holds, 409 with the
/// findings when one is violated, 503 when the check could not run. Kafka is not read back
/// here (`verify --kafka` does that from the command line). The heaviest request: it runs on
/// a blocking thread, driven by this worker's runtime (its connections stay this runtime's),
/// so the worker goes on answering `/healthz` and `/readyz` meanwhile.
///
/// One at a time ([`Verify`]): a second request while one runs is 429 with `Retry-After`,
/// so a read token cannot start scans of the pipeline's own pools and the shared inbox in
/// parallel. The gate is held by the scan itself, not by the request: a caller that hangs up
/// does not free it before the scan ends.
pub async fn verify(_: Authorized<Read>, verify: Option<web::Data<Verify>>) -> Answer {
    let verify = verify
        .ok_or_else(|| AdminError::NotFound("verify is not wired here".into()))?
        .into_inner();
    let held = Verify::enter(&verify).ok_or(AdminError::Busy(
        "a verify is already running; one runs at a time (retry after it ends)",
    ))?;
    let runtime = tokio::runtime::Handle::current();
    let run = actix_web::rt::task::spawn_blocking(move || {
        let report = runtime.block_on(run_verify(&held.0.input));
        drop(held);
        report
    });
    match run.await {
        Ok(Ok(report)) if report.ok() => ok(json!({ "ok": true, "report": report })),
        Ok(Ok(report)) => {
            Ok(HttpResponse::Conflict().json(json!({ "ok": false, "report": report })))
        }
        Ok(Err(e)) => Err(AdminError::Unavailable(format!(
            "verify failed to run: {e}"
        ))),
        Err(e) => Err(AdminError::Unavailable(format!("verify stopped: {e}"))),
    }
}

/// What `GET /admin/verify` reads, and whether a verify runs (one at a time per server,
/// shared by its workers).
pub struct Verify {
    input: VerifyInput,
    running: std::sync::atomic::AtomicBool,
}

/// A running verify; dropping it lets the next one start.
struct Running(std::sync::Arc<Verify>);

impl Verify {
    /// The verify of `input`, none running yet.
    pub fn new(input: VerifyInput) -> Self {
        Self {
            input,
            running: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The right to run, if no verify runs.
    fn enter(this: &std::sync::Arc<Self>) -> Option<Running> {
        use std::sync::atomic::Ordering;
        this.running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Running(this.clone()))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0
            .running
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

/// `GET /admin/survey` → `Ops::survey`.
pub async fn survey(
    _: Authorized<Read>,
    state: web::Data<AdminState>,
    Query(q): Query<SurveyRequest>,
) -> Answer {
    ok(state.ops.survey(&q).await?)
}

/// `POST /admin/skip` → `Ops::skip` (approver, reason, ticket required; audited).
pub async fn skip(
    Authorized(caller, _): Authorized<Operate>,
    state: web::Data<AdminState>,
    Body(body, _): Body<SkipRequest>,
) -> Answer {
    ok(state
        .ops
        .called_by(&caller.0)
        .skip(&body, state.clock.now())
        .await?)
}

/// `GET /admin/purge-readiness` → `Ops::purge_readiness`.
pub async fn purge_readiness(
    _: Authorized<Read>,
    state: web::Data<AdminState>,
    Query(q): Query<PurgeRequest>,
) -> Answer {
    ok(state.ops.purge_readiness(&q).await?)
}

/// `?mode=min|zero|max|<id>` of the cutover plan.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanQuery {
    mode: String,
}

/// `GET /admin/cutover-plan` → `Ops::cutover_plan` (`msgexchange cutover plan`).
pub async fn cutover_plan(
    _: Authorized<Read>,
    state: web::Data<AdminState>,
    Query(q): Query<PlanQuery>,
) -> Answer {
    let mode = match CutoverMode::parse(&q.mode) {
        Ok(Some(mode)) => mode,
        Ok(None) => return Err(AdminError::BadRequest("mode is empty".into())),
        Err(why) => return Err(AdminError::BadRequest(format!("mode: {why}"))),
    };
    ok(state.ops.cutover_plan(mode).await?)
}

/// `POST /cminmsgs/send` → `Ops::compat_register`: 201 when this call registered the id, 200
/// when it was registered before.
pub async fn compat_send(
    _: Authorized<Compat>,
    state: web::Data<AdminState>,
    req: HttpRequest,
    Body(body, _): Body<CompatRequest, CompatBody>,
) -> Answer {
    // The caller's W3C trace context: the message's trace continues it (issue 54).
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let caller = CallerTrace::from_headers(header("traceparent"), header("tracestate"));
    let r = state
        .ops
        .compat_register(&body, state.clock.now(), &caller)
        .await?;
    Ok(if r.registered {
        HttpResponse::Created().json(r)
    } else {
        HttpResponse::Ok().json(r)
    })
}
