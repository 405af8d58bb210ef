//! The admin HTTP surface against a real PostgreSQL: authentication before anything else, bad
//! requests answered with a clear 4xx and changing nothing (`admin_http/refusals.rs`), audited
//! actions that apply or refuse per row and the compat entry (`admin_http/actions.rs`), the
//! CLI and the API answering alike and `verify` over HTTP (`admin_http/reads.rs`),
//! `docs/openapi.json` against the real router (`admin_http/openapi.rs`), and the real server
//! on a socket surviving garbage and fuzzing (`admin_http/wire.rs`).

#[path = "admin_http/actions.rs"]
mod actions;
use msgx_testkit as common;
#[path = "admin_http/openapi.rs"]
mod openapi;
#[path = "admin_http/reads.rs"]
mod reads;
#[path = "admin_http/refusals.rs"]
mod refusals;
#[path = "admin_http/wire.rs"]
mod wire;

use std::time::Duration;

use common::TestEnv;
use msgx_actors::admin::{AdminState, Scope, Tokens};
use msgx_core::clock::Clock;
use serde_json::Value;

/// A token with every scope (like `http.admin_token`).
const TOKEN: &str = "test-admin-token-0123456789";

const READ: &str = "test-read-token-0123456789";

const OPERATE: &str = "test-operate-token-0123456789";

const COMPAT: &str = "test-compat-token-0123456789";

fn state_with_clock(env: &TestEnv, clock: msgx_core::clock::SharedClock) -> AdminState {
    AdminState {
        store: env.store.clone(),
        clock,
        tokens: std::sync::Arc::new(Tokens::with(&[
            (TOKEN, Scope::Read),
            (TOKEN, Scope::Operate),
            (TOKEN, Scope::Compat),
            (READ, Scope::Read),
            (OPERATE, Scope::Operate),
            (COMPAT, Scope::Compat),
        ])),
        ops: env.ops(),
    }
}

fn state(env: &TestEnv) -> AdminState {
    state_with_clock(env, common::shared(&env.clock))
}

/// Everything an admin request could change, as one string: `proc_state`, `msg_event`,
/// `audit_log`, the cursor.
async fn fingerprint(env: &TestEnv) -> String {
    env.scalar(
        "SELECT concat_ws(' / ', \
            (SELECT string_agg(p::text, '|' ORDER BY msg_id) FROM proc_state p), \
            (SELECT string_agg(e::text, '|' ORDER BY event_id) FROM msg_event e), \
            (SELECT string_agg(a::text, '|' ORDER BY id) FROM audit_log a), \
            (SELECT c::text FROM inbox_cursor c))",
    )
    .await
}

/// A DEAD(UNSUPPORTED) message (replayable), a SUCCEEDED one with an abandoned backfill, and
/// a DEAD event and a SENT event of the first.
async fn seed(env: &TestEnv) {
    seed_rows(env, env.clock.now(), false).await;
    raw_copies(env, &[1]).await;
}

/// The rows of [`seed`] at `now` (no raw copies). `settled`: as a running service leaves them
/// alone — the DEAD message marked, the SENT event delivered once — instead of the DEAD
/// message's backfill due and the SENT event without a delivery time.
async fn seed_rows(env: &TestEnv, now: chrono::DateTime<chrono::Utc>, settled: bool) {
    let (due, done) = if settled {
        (None, Some(now))
    } else {
        (Some(now), None)
    };
    env.exec_with(
        "INSERT INTO proc_state (msg_id, state, error_class, terminal_reason, terminal_at, \
                                 enqueued_at, backfill_next_at, backfill_at) \
         VALUES (1, 'DEAD', 'UNSUPPORTED', 'UNSUPPORTED', $1, $1, $2, $3)",
        |q| q.bind(now).bind(due).bind(done),
    )
    .await;
    env.exec_for(
        "INSERT INTO proc_state (msg_id, state, terminal_at, enqueued_at, \
                                 backfill_abandon_reason, backfill_abandoned_at) \
         VALUES (2, 'SUCCEEDED', $1, $1, 'MISSING_ROW', $1)",
        now,
    )
    .await;
    env.exec_with(
        "INSERT INTO msg_event (event_id, msg_id, flight_key, event_type, payload, state, \
                                attempts, last_error, created_at, dead_at, sent_at) \
         VALUES (10, 2, 'CA1', 'FLIGHT_UPDATED', '{}', 'DEAD', 10, 'refused', $1, $1, NULL), \
                (11, 2, 'CA1', 'FLIGHT_UPDATED', '{}', 'SENT', $2, NULL, $1, NULL, $3)",
        |q| q.bind(now).bind(i32::from(settled)).bind(done),
    )
    .await;
}

/// Our raw copies of these messages (their inbox rows do not exist: the DB owner purged them),
/// so a replay has raw text to read (issue 13 item 4).
async fn raw_copies(env: &TestEnv, ids: &[i64]) {
    let text = "<MSG/>";
    env.exec_with(
        "INSERT INTO raw_copy (msg_id, copied_at, raw_bytes, body) \
         SELECT id, now(), $2, $3 FROM UNNEST($1::bigint[]) AS id",
        |q| {
            q.bind(ids)
                .bind(text.len() as i32)
                .bind(msgx_core::store::raw_copy::compress(text).expect("compress"))
        },
    )
    .await;
}

async fn audit_rows(env: &TestEnv) -> i64 {
    env.scalar("SELECT count(*) FROM audit_log").await
}

/// The real server (`msgx_actors::http::serve`, the admin routes on `env`) on a free port:
/// its port and its handle (the caller stops it).
async fn serve(env: &TestEnv) -> (u16, actix_web::dev::ServerHandle) {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let port = common::service::free_port();
    let server = msgx_actors::http::serve(
        format!("127.0.0.1:{port}").parse().expect("addr"),
        handle,
        msgx_actors::health::Health::default(),
        Some(state(env)),
    )
    .expect("bind");
    let stop = server.handle();
    actix_rt::spawn(server);
    tokio::time::sleep(Duration::from_millis(200)).await;
    (port, stop)
}

/// One request to the real server on `port` through the tests' HTTP client: (status, body).
async fn call(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, String) {
    let json = body.map(Value::to_string);
    let response = common::http::request(port, method, path, token, json.as_deref())
        .await
        .expect("an answer in time");
    (
        common::http::status(&response),
        common::http::body(&response).to_string(),
    )
}
