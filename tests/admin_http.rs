//! The admin HTTP surface against a real PostgreSQL: authentication before anything else, bad
//! requests answered with a clear 4xx and changing nothing, audited actions that apply or
//! refuse per row, and the real server surviving garbage on the wire.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use actix_web::{test, App};
use common::service::free_port;
use common::TestEnv;
use msgx_actors::admin::{configure, AdminState};
use msgx_core::clock::Clock;
use serde_json::{json, Value};

const TOKEN: &str = "test-admin-token-0123456789";

fn state(env: &TestEnv) -> AdminState {
    AdminState {
        store: env.store.clone(),
        clock: common::shared(&env.clock),
        token: TOKEN.into(),
    }
}

/// A DEAD(UNSUPPORTED) message (replayable), a SUCCEEDED one with an abandoned backfill, and
/// a DEAD event and a SENT event of the first.
async fn seed(env: &TestEnv) {
    let now = env.clock.now();
    sqlx::query(
        "INSERT INTO proc_state (msg_id, state, error_class, terminal_reason, terminal_at, \
                                 enqueued_at, backfill_next_at) \
         VALUES (1, 'DEAD', 'UNSUPPORTED', 'UNSUPPORTED', $1, $1, $1)",
    )
    .bind(now)
    .execute(env.store.pool())
    .await
    .expect("dead row");
    sqlx::query(
        "INSERT INTO proc_state (msg_id, state, terminal_at, enqueued_at, \
                                 backfill_abandon_reason, backfill_abandoned_at) \
         VALUES (2, 'SUCCEEDED', $1, $1, 'MISSING_ROW', $1)",
    )
    .bind(now)
    .execute(env.store.pool())
    .await
    .expect("abandoned row");
    sqlx::query(
        "INSERT INTO msg_event (event_id, msg_id, flight_key, event_type, payload, state, \
                                attempts, last_error, created_at, dead_at) \
         VALUES (10, 2, 'CA1', 'FLIGHT_UPDATED', '{}', 'DEAD', 10, 'refused', $1, $1), \
                (11, 2, 'CA1', 'FLIGHT_UPDATED', '{}', 'SENT', 0, NULL, $1, NULL)",
    )
    .bind(now)
    .execute(env.store.pool())
    .await
    .expect("events");
}

async fn audit_rows(env: &TestEnv) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log")
        .fetch_one(env.store.pool())
        .await
        .expect("audit")
}

#[actix_rt::test]
async fn no_token_no_action_and_bad_requests_change_nothing() {
    let env = TestEnv::new("admin_bad").await;
    seed(&env).await;
    let app = test::init_service(App::new().configure(configure(state(&env)))).await;
    let body = json!({"msg_ids": [1], "actor": "ops", "reason": "fixed codec"});

    // No token, a wrong one, a wrong scheme: 401 before the body is even parsed.
    for auth in [None, Some("Bearer wrong-token-0000000000"), Some(TOKEN)] {
        let mut req = test::TestRequest::post()
            .uri("/admin/replay")
            .set_payload("{not json");
        if let Some(a) = auth {
            req = req.insert_header(("Authorization", a));
        }
        let resp = test::call_service(&app, req.to_request()).await;
        assert_eq!(resp.status(), 401, "{auth:?}");
    }
    let bearer = ("Authorization", format!("Bearer {TOKEN}"));
    let cases: Vec<(&str, String, &str)> = vec![
        ("/admin/replay", "{not json".into(), "bad JSON body"),
        (
            "/admin/replay",
            json!({"msg_ids": [1]}).to_string(),
            "missing field",
        ),
        (
            "/admin/replay",
            json!({"msg_ids": "1", "actor": "a", "reason": "r"}).to_string(),
            "invalid type",
        ),
        (
            "/admin/replay",
            json!({"msg_ids": [], "actor": "a", "reason": "r"}).to_string(),
            "no message ids",
        ),
        (
            "/admin/replay",
            json!({"msg_ids": [1], "actor": " ", "reason": "r"}).to_string(),
            "actor",
        ),
        (
            "/admin/replay",
            json!({"msg_ids": [1], "actor": "a", "reason": "r", "force": true}).to_string(),
            "unknown field",
        ),
        (
            "/admin/replay",
            json!({"msg_ids": vec![1; 10_001], "actor": "a", "reason": "r"}).to_string(),
            "at most 10000",
        ),
        (
            "/admin/events/requeue",
            json!({"msg_ids": [10], "actor": "a", "reason": "r"}).to_string(),
            "unknown field",
        ),
    ];
    for (uri, payload, expect) in cases {
        let req = test::TestRequest::post()
            .uri(uri)
            .insert_header(bearer.clone())
            .set_payload(payload.clone())
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), 400, "{payload}");
        let v: Value = test::read_body_json(resp).await;
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(msg.contains(expect), "{payload}: {msg}");
    }
    // Bad path, unknown path, wrong method.
    let req = test::TestRequest::get()
        .uri("/admin/messages/abc")
        .insert_header(bearer.clone())
        .to_request();
    assert_eq!(test::call_service(&app, req).await.status(), 400);
    let req = test::TestRequest::get()
        .uri("/admin/nothing")
        .insert_header(bearer.clone())
        .to_request();
    assert_eq!(test::call_service(&app, req).await.status(), 404);
    let req = test::TestRequest::get()
        .uri("/admin/replay")
        .insert_header(bearer.clone())
        .to_request();
    assert_eq!(test::call_service(&app, req).await.status(), 405);
    // A body over the limit.
    let req = test::TestRequest::post()
        .uri("/admin/replay")
        .insert_header(bearer)
        .set_payload(vec![b' '; 300 * 1024])
        .to_request();
    assert_eq!(test::call_service(&app, req).await.status(), 413);

    assert_eq!(audit_rows(&env).await, 0, "nothing was audited");
    let state: String = sqlx::query_scalar("SELECT state FROM proc_state WHERE msg_id = 1")
        .fetch_one(env.store.pool())
        .await
        .expect("state");
    assert_eq!(state, "DEAD", "nothing changed");
    let _ = body;
    env.cleanup().await;
}

#[actix_rt::test]
async fn audited_actions_apply_or_refuse_per_row() {
    let env = TestEnv::new("admin_ok").await;
    seed(&env).await;
    let app = test::init_service(App::new().configure(configure(state(&env)))).await;
    let bearer = ("Authorization", format!("Bearer {TOKEN}"));
    let post = |uri: &str, body: Value| {
        test::TestRequest::post()
            .uri(uri)
            .insert_header(bearer.clone())
            .set_json(body)
            .to_request()
    };

    let resp = test::call_service(
        &app,
        post(
            "/admin/replay",
            json!({"msg_ids": [1, 2, 99], "actor": "ops", "reason": "codec fixed"}),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(v["applied"], 1, "{v}");
    assert_eq!(v["refused"], 2, "{v}");
    assert_eq!(v["rows"][0]["result"], "applied");
    assert_eq!(v["rows"][0]["previous_state"], "DEAD");
    assert!(v["rows"][1]["reason"]
        .as_str()
        .unwrap_or_default()
        .contains("not replayable"));
    assert_eq!(v["rows"][2]["reason"], "no such message");

    let resp = test::call_service(
        &app,
        post(
            "/admin/recover-backfill",
            json!({"msg_ids": [2], "actor": "ops", "reason": "row restored by the DB owner"}),
        ),
    )
    .await;
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(v["applied"], 1, "{v}");

    let resp = test::call_service(
        &app,
        post(
            "/admin/events/requeue",
            json!({"event_ids": [10, 11, 12], "actor": "ops", "reason": "topic ACL fixed"}),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(v["requeued"], json!([10]), "{v}");
    assert_eq!(v["refused"][0]["reason"], "state SENT is not DEAD");
    assert_eq!(v["refused"][1]["reason"], "no such event");

    let req = test::TestRequest::get()
        .uri("/admin/messages/2")
        .insert_header(bearer.clone())
        .to_request();
    let resp = test::call_service(&app, req).await;
    assert_eq!(resp.status(), 200);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(v["state"], "SUCCEEDED");
    assert_eq!(v["backfill_abandon_reason"], Value::Null, "recovered");
    assert_eq!(v["events"][0]["state"], "PENDING", "requeued");
    assert_eq!(v["events"][1]["state"], "SENT");
    let req = test::TestRequest::get()
        .uri("/admin/messages/99")
        .insert_header(bearer)
        .to_request();
    assert_eq!(test::call_service(&app, req).await.status(), 404);

    // Every action audited with who and why.
    let audits: Vec<(String, String, String)> =
        sqlx::query_as("SELECT action, actor, reason FROM audit_log ORDER BY id")
            .fetch_all(env.store.pool())
            .await
            .expect("audit");
    let actions: Vec<&str> = audits.iter().map(|a| a.0.as_str()).collect();
    assert_eq!(actions, ["REPLAY", "RECOVER_BACKFILL", "REQUEUE_EVENTS"]);
    assert!(audits.iter().all(|a| a.1 == "ops"));
    env.cleanup().await;
}

#[actix_rt::test]
async fn the_real_server_answers_garbage_and_keeps_serving() {
    let env = TestEnv::new("admin_wire").await;
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}").parse().expect("addr");
    let server = msgx_actors::http::serve(
        listen,
        handle,
        msgx_actors::health::Health::default(),
        Some(state(&env)),
    )
    .expect("bind");
    let stop = server.handle();
    actix_rt::spawn(server);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let raw = |request: &'static [u8]| {
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            s.write_all(request).expect("write");
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        })
    };
    let garbage = raw(b"\x00\x01GARBAGE \xff\xfe HTTP/9.9\r\n\r\n")
        .await
        .expect("join");
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage:?}");
    let unauth = raw(b"POST /admin/replay HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
        .await
        .expect("join");
    assert!(unauth.starts_with("HTTP/1.1 401"), "{unauth:?}");
    let health = raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("join");
    assert!(health.starts_with("HTTP/1.1 200"), "{health:?}");
    stop.stop(true).await;
    env.cleanup().await;
}

/// `GET /admin/verify`: the token first; 200 when every invariant holds, 409 with the
/// findings when one is violated.
#[actix_rt::test]
async fn verify_over_http_needs_the_token_and_reports_violations() {
    let env = TestEnv::new("admin_verify").await;
    let settings = env.settings(&[]);
    let input =
        msgx_actors::verify_cmd::input(&settings, env.inbox.clone(), env.store.clone(), 100, None)
            .expect("input");
    let app = test::init_service(
        App::new()
            .app_data(actix_web::web::Data::new(input))
            .configure(configure(state(&env))),
    )
    .await;
    let get = |auth: bool| {
        let mut req = test::TestRequest::get().uri("/admin/verify");
        if auth {
            req = req.insert_header(("Authorization", format!("Bearer {TOKEN}")));
        }
        req.to_request()
    };
    assert_eq!(test::call_service(&app, get(false)).await.status(), 401);
    let ok = test::call_service(&app, get(true)).await;
    assert_eq!(ok.status(), 200);
    let body: Value = test::read_body_json(ok).await;
    assert_eq!(body["ok"], true, "{body}");
    // A processing record without its inbox row.
    seed(&env).await;
    let bad = test::call_service(&app, get(true)).await;
    assert_eq!(bad.status(), 409);
    let body: Value = test::read_body_json(bad).await;
    let present = body["report"]["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["invariant"] == "inbox_row_present")
        .expect("finding");
    assert_eq!(present["examples"][0], 1, "{present}");
    env.cleanup().await;
}
