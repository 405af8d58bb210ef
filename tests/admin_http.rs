//! The admin HTTP surface against a real PostgreSQL: authentication before anything else, bad
//! requests answered with a clear 4xx and changing nothing, audited actions that apply or
//! refuse per row, and the real server surviving garbage on the wire.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use actix_web::{test, App};
use common::service::free_port;
use common::TestEnv;
use msgx_actors::admin::{configure, AdminState, Scope, Tokens};
use msgx_core::clock::Clock;
use serde_json::{json, Value};

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

#[actix_rt::test]
async fn no_token_no_action_and_bad_requests_change_nothing() {
    let env = TestEnv::new("admin_bad").await;
    seed(&env).await;
    let app = test::init_service(App::new().configure(configure(state(&env)))).await;
    let body = json!({"msg_ids": [1], "actor": "ops", "reason": "fixed codec"});
    let before = fingerprint(&env).await;

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
            json!({"msg_ids": [1], "actor": "a", "reason": "r"}).to_string(),
            "expect_state is required",
        ),
        (
            "/admin/replay",
            json!({"msg_ids": [1], "expect_state": "SUCCEEDED", "actor": "a", "reason": "r"})
                .to_string(),
            "not replayable",
        ),
        (
            "/admin/replay",
            json!({"error_class": "MALFORMED", "from_id": 1, "to_id": 9, "actor": "a", "reason": "r"})
                .to_string(),
            "not a replayable class",
        ),
        (
            "/admin/replay",
            json!({"msg_ids": [1], "expect_state": "DEAD", "state": "DEAD", "actor": "a",
                   "reason": "r"})
            .to_string(),
            "state goes with error_class",
        ),
        (
            "/admin/replay",
            json!({"error_class": "UNSUPPORTED", "actor": "a", "reason": "r"}).to_string(),
            "from_id and to_id",
        ),
        (
            "/admin/replay",
            json!({"msg_ids": [1], "expect_state": "DEAD", "error_class": "UNSUPPORTED",
                   "from_id": 1, "to_id": 2, "actor": "a", "reason": "r"})
            .to_string(),
            "not both",
        ),
        (
            "/admin/recover-backfill",
            json!({"msg_ids": [2], "actor": "a"}).to_string(),
            "missing field",
        ),
        (
            "/admin/events/requeue",
            json!({"event_ids": [10], "actor": "a", "reason": ""}).to_string(),
            "reason",
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
    // Well formed and selecting nothing: 200 with an empty answer, nothing audited. The
    // document cannot compare two fields, so a reversed range is empty rather than refused.
    let req = test::TestRequest::post()
        .uri("/admin/replay")
        .insert_header(bearer.clone())
        .set_json(
            json!({"error_class": "UNSUPPORTED", "from_id": 9, "to_id": 1,
                         "actor": "a", "reason": "r"}),
        )
        .to_request();
    let resp = test::call_service(&app, req).await;
    assert_eq!(resp.status(), 200);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(
        (v["applied"].clone(), v["audit_id"].clone()),
        (json!(0), Value::Null),
        "{v}"
    );
    for (uri, count) in [
        ("/admin/survey?from_id=9&to_id=1", Some(0)),
        (
            "/admin/survey?received_from=2030-01-01T00:00:00Z&received_to=2020-01-01T00:00:00Z",
            Some(0),
        ),
        (
            "/admin/survey?from_id=1&received_from=2020-01-01T00:00:00Z",
            None,
        ),
        (
            "/admin/purge-readiness?to_id=1&received_before=2020-01-01T00:00:00Z",
            None,
        ),
    ] {
        let req = test::TestRequest::get()
            .uri(uri)
            .insert_header(bearer.clone())
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), 200, "{uri}");
        let v: Value = test::read_body_json(resp).await;
        if let Some(n) = count {
            assert_eq!(v["count"], n, "{uri}: {v}");
        }
    }
    // Bad path, unknown path, wrong method.
    for uri in [
        "/admin/messages/abc",
        "/admin/messages/99999999999999999999",
        "/admin/events/dead?limit=0",
        "/admin/events/dead?limit=abc",
        "/admin/events/dead?after=1&bogus=2",
    ] {
        let req = test::TestRequest::get()
            .uri(uri)
            .insert_header(bearer.clone())
            .to_request();
        assert_eq!(test::call_service(&app, req).await.status(), 400, "{uri}");
    }
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
    let state: String = env
        .scalar("SELECT state FROM proc_state WHERE msg_id = 1")
        .await;
    assert_eq!(state, "DEAD", "nothing changed");
    assert_eq!(fingerprint(&env).await, before, "nothing changed at all");
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
            json!({"msg_ids": [1, 2, 99], "expect_state": "DEAD", "actor": "ops",
                   "reason": "codec fixed", "ticket": "OPS-17"}),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(v["applied"], 1, "{v}");
    assert_eq!(v["refused"], 2, "{v}");
    assert_eq!(v["rows"][0]["result"], "applied");
    assert_eq!(v["rows"][0]["previous_state"], "DEAD");
    assert_eq!(
        v["rows"][0]["source"], "raw_copy",
        "the inbox row is gone: {v}"
    );
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
    let audits: Vec<(String, String, String)> = env
        .rows("SELECT action, actor, reason FROM audit_log ORDER BY id")
        .await;
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

/// Every route with no token, a wrong token and a token lacking the scope: 401/403 and nothing
/// changed; the open paths need no token.
#[actix_rt::test]
async fn scopes_are_enforced_and_refusals_change_nothing() {
    let env = TestEnv::new("admin_scope").await;
    seed(&env).await;
    let inbox_id = env.insert_rows(1).await[0];
    let app = test::init_service(App::new().configure(configure(state(&env)))).await;
    let before = fingerprint(&env).await;
    let replay = json!({"msg_ids": [1], "expect_state": "DEAD", "actor": "a", "reason": "r"});
    let recover = json!({"msg_ids": [2], "actor": "a", "reason": "r"});
    let requeue = json!({"event_ids": [10], "actor": "a", "reason": "r"});
    let compat = json!({ "msg_id": inbox_id });
    let routes: Vec<(&str, &str, Option<Value>, Scope)> = vec![
        ("GET", "/admin/status", None, Scope::Read),
        ("GET", "/admin/messages/1", None, Scope::Read),
        ("GET", "/admin/events/dead", None, Scope::Read),
        ("POST", "/admin/replay", Some(replay), Scope::Operate),
        (
            "POST",
            "/admin/recover-backfill",
            Some(recover),
            Scope::Operate,
        ),
        (
            "POST",
            "/admin/events/requeue",
            Some(requeue),
            Scope::Operate,
        ),
        ("POST", "/cminmsgs/send", Some(compat), Scope::Compat),
    ];
    let call = |method: &str, uri: &str, body: &Option<Value>, token: Option<&str>| {
        let mut req = match method {
            "GET" => test::TestRequest::get(),
            _ => test::TestRequest::post(),
        }
        .uri(uri);
        if let Some(b) = body {
            req = req.set_json(b);
        }
        if let Some(t) = token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        req.to_request()
    };
    for (method, uri, body, scope) in &routes {
        for token in [None, Some("not-a-configured-token-000")] {
            let resp = test::call_service(&app, call(method, uri, body, token)).await;
            assert_eq!(resp.status(), 401, "{method} {uri} {token:?}");
            let v: Value = test::read_body_json(resp).await;
            assert!(v["error"].is_string(), "{v}");
        }
        let lacking: &[&str] = match scope {
            Scope::Read => &[COMPAT],
            Scope::Operate => &[READ, COMPAT],
            Scope::Compat => &[READ, OPERATE],
        };
        for token in lacking {
            let resp = test::call_service(&app, call(method, uri, body, Some(token))).await;
            assert_eq!(resp.status(), 403, "{method} {uri} with {token}");
            let v: Value = test::read_body_json(resp).await;
            assert!(
                v["error"].as_str().unwrap_or_default().contains("scope"),
                "{v}"
            );
        }
    }
    assert_eq!(
        fingerprint(&env).await,
        before,
        "no refusal changed anything"
    );
    // The read scope reads; operate reads too.
    for token in [READ, OPERATE, TOKEN] {
        let resp = test::call_service(&app, call("GET", "/admin/status", &None, Some(token))).await;
        assert_eq!(resp.status(), 200, "{token}");
    }
    env.cleanup().await;
}

/// The compat entry: registers beyond W (201, then 200 "already registered"), never moves W,
/// refuses every bad input with a 4xx JSON reason and changes nothing.
#[actix_rt::test]
async fn compat_entry_registers_beyond_w_and_refuses_bad_input() {
    let env = TestEnv::new("admin_compat").await;
    let ids = env.insert_rows(3).await;
    env.poll(env.poll_cfg(2)).await; // W = ids[1]
    let w = env.cursor().await.0;
    assert_eq!(w, ids[1]);
    let beyond = ids[2];
    // A released hole below W: an id the inbox has but that has no record (the DB owner
    // inserts it under W, as a late commit would).
    env.exec_for("DELETE FROM proc_state WHERE msg_id = $1", ids[0])
        .await;
    let app = test::init_service(App::new().configure(configure(state(&env)))).await;
    let send = |payload: Vec<u8>, content_type: Option<&str>| {
        let mut req = test::TestRequest::post()
            .uri("/cminmsgs/send")
            .insert_header(("Authorization", format!("Bearer {COMPAT}")))
            .set_payload(payload);
        if let Some(ct) = content_type {
            req = req.insert_header(("Content-Type", ct));
        }
        req.to_request()
    };
    let before = fingerprint(&env).await;
    let json_ct = Some("application/json");
    let cases: Vec<(Vec<u8>, Option<&str>, u16, &str)> = vec![
        (b"{}".to_vec(), json_ct, 400, "missing field"),
        (br#"{"msg_id": -5}"#.to_vec(), json_ct, 400, "positive"),
        (br#"{"msg_id": 0}"#.to_vec(), json_ct, 400, "positive"),
        (
            br#"{"msg_id": 9007199254740993}"#.to_vec(),
            json_ct,
            400,
            "absurd",
        ),
        (br#"{"msg_id": 1e30}"#.to_vec(), json_ct, 400, "bad JSON"),
        (br#"{"msg_id": "12"}"#.to_vec(), json_ct, 400, "bad JSON"),
        (br#"{"msg_id": 1.5}"#.to_vec(), json_ct, 400, "bad JSON"),
        (
            br#"{"msg_id": 1, "x": 2}"#.to_vec(),
            json_ct,
            400,
            "unknown field",
        ),
        (b"not json".to_vec(), json_ct, 400, "bad JSON"),
        (br#"{"msg_id": 987654321}"#.to_vec(), json_ct, 404, "no row"),
        (
            format!(r#"{{"msg_id": {}}}"#, ids[0]).into_bytes(),
            json_ct,
            409,
            "released as a hole",
        ),
        (
            format!(r#"{{"msg_id": {beyond}}}"#).into_bytes(),
            Some("text/plain"),
            415,
            "application/json",
        ),
        (
            format!(r#"{{"msg_id": {beyond}}}"#).into_bytes(),
            None,
            415,
            "application/json",
        ),
        (vec![b' '; 8 * 1024], json_ct, 413, "larger than"),
    ];
    for (payload, ct, status, expect) in cases {
        let resp = test::call_service(&app, send(payload.clone(), ct)).await;
        assert_eq!(
            resp.status(),
            status,
            "{}",
            String::from_utf8_lossy(&payload[..payload.len().min(60)])
        );
        let v: Value = test::read_body_json(resp).await;
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(msg.contains(expect), "{status}: {msg}");
    }
    assert_eq!(
        fingerprint(&env).await,
        before,
        "no bad input changed anything"
    );

    let body = format!(r#"{{"msg_id": {beyond}}}"#).into_bytes();
    let resp = test::call_service(&app, send(body.clone(), json_ct)).await;
    assert_eq!(resp.status(), 201);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(
        (v["registered"].clone(), v["source"].clone()),
        (json!(true), json!("COMPAT"))
    );
    assert_eq!(v["watermark"], w, "W not moved");
    let resp = test::call_service(&app, send(body, Some("application/json; charset=utf-8"))).await;
    assert_eq!(resp.status(), 200, "idempotent");
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(v["registered"], false);
    assert_eq!(env.cursor().await.0, w, "W never moved");
    // The pump takes only ids ≤ W: the compat row waits, the poller's insert is a no-op.
    assert!(env
        .store
        .heads(1)
        .await
        .expect("head")
        .first()
        .is_none_or(|h| h.head.msg_id <= w));
    let r = env.poll(env.poll_cfg(100)).await;
    assert_eq!(r.advance.w, beyond);
    let source: String = env
        .scalar_for("SELECT source FROM proc_state WHERE msg_id = $1", beyond)
        .await;
    assert_eq!(source, "COMPAT");
    env.cleanup().await;
}

/// Replay carries the state the operator saw: a FAILED row the pump escalated to DEAD and the
/// sweeper marked since is refused (G5); a dry run changes nothing and audits nothing; replay
/// by class and id range takes only that class in that range.
#[actix_rt::test]
async fn replay_refuses_a_row_that_moved_and_dry_runs_change_nothing() {
    let env = TestEnv::new("admin_moved").await;
    let now = env.clock.now();
    env.exec_for(
        "INSERT INTO proc_state (msg_id, state, error_class, enqueued_at, attempts) VALUES \
         (5, 'FAILED', 'INFRA', $1, 3), (6, 'DEAD', 'UNSUPPORTED', $1, 1), \
         (7, 'DEAD', 'UNSUPPORTED', $1, 1), (8, 'DEAD', 'CODEC_ERROR', $1, 1), \
         (30, 'DEAD', 'UNSUPPORTED', $1, 1)",
        now,
    )
    .await;
    raw_copies(&env, &[5, 6, 7, 8, 30]).await;
    let app = test::init_service(App::new().configure(configure(state(&env)))).await;
    let post = |body: Value| {
        test::TestRequest::post()
            .uri("/admin/replay")
            .insert_header(("Authorization", format!("Bearer {OPERATE}")))
            .set_json(body)
            .to_request()
    };
    // The operator saw 5 FAILED; meanwhile it was escalated and marked.
    env.exec_for(
        "UPDATE proc_state SET state = 'DEAD', error_class = 'EXHAUSTED', \
         terminal_reason = 'EXHAUSTED', terminal_at = $1, backfill_at = $1 WHERE msg_id = 5",
        now,
    )
    .await;
    let v: Value = test::read_body_json(
        test::call_service(
            &app,
            post(json!({"msg_ids": [5], "expect_state": "FAILED", "actor": "ops", "reason": "r"})),
        )
        .await,
    )
    .await;
    assert_eq!(v["applied"], 0, "{v}");
    let why = v["rows"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("moved since") && why.contains("DEAD(EXHAUSTED)"),
        "{why}"
    );
    assert_eq!(
        env.state_of(5).await,
        ("DEAD".into(), Some("EXHAUSTED".into()))
    );

    // Dry run by class and range: 6 and 7 would apply (8 is another class, 30 out of range).
    let before_dry = fingerprint(&env).await;
    let v: Value = test::read_body_json(
        test::call_service(
            &app,
            post(
                json!({"error_class": "UNSUPPORTED", "from_id": 1, "to_id": 20, "dry_run": true,
                        "actor": "ops", "reason": "codec 1.4"}),
            ),
        )
        .await,
    )
    .await;
    assert_eq!(
        (v["dry_run"].clone(), v["applied"].clone()),
        (json!(true), json!(2)),
        "{v}"
    );
    assert_eq!(v["audit_id"], Value::Null);
    assert_eq!(
        fingerprint(&env).await,
        before_dry,
        "a dry run changes nothing"
    );

    let v: Value = test::read_body_json(
        test::call_service(
            &app,
            post(
                json!({"error_class": "UNSUPPORTED", "from_id": 1, "to_id": 20,
                        "actor": "ops", "reason": "codec 1.4", "ticket": "CHG-9"}),
            ),
        )
        .await,
    )
    .await;
    assert_eq!(v["applied"], 2, "{v}");
    assert_eq!(env.state_of(6).await.0, "PENDING");
    assert_eq!(env.state_of(7).await.0, "PENDING");
    assert_eq!(env.state_of(8).await.0, "DEAD");
    assert_eq!(env.state_of(30).await.0, "DEAD");
    let audits = env.audit_entries().await.expect("audit");
    let last = audits.last().expect("audited");
    assert_eq!(
        (
            last.actor.as_str(),
            last.ticket.as_deref(),
            last.msg_ids.clone()
        ),
        ("ops", Some("CHG-9"), vec![6, 7])
    );
    env.cleanup().await;
}

fn strip_clock(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|k, _| k != "as_of" && !k.ends_with("_age_seconds"));
            map.values_mut().for_each(strip_clock);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_clock),
        _ => {}
    }
}

/// `msgexchange status --json` and `inspect --json` (the CLI, straight on the stores) answer
/// what the API answers; a CLI replay logs JSON lines with `msg_id` under `log.format = json`.
#[actix_rt::test]
async fn cli_and_api_give_the_same_answers() {
    let env = TestEnv::new("admin_cli").await;
    seed(&env).await;
    let app = test::init_service(App::new().configure(configure(state_with_clock(
        &env,
        std::sync::Arc::new(msgx_core::clock::SystemClock),
    ))))
    .await;
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_msgexchange"))
            .args(args)
            .envs(env.binary_env())
            .env("MSGX_LOG__LEVEL", "warn")
            .env("MSGX_LOG__FORMAT", "json")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run cli");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let get = |uri: &str| {
        test::TestRequest::get()
            .uri(uri)
            .insert_header(("Authorization", format!("Bearer {READ}")))
            .to_request()
    };
    let mut api: Value =
        test::read_body_json(test::call_service(&app, get("/admin/status")).await).await;
    let mut from_cli: Value =
        serde_json::from_slice(&cli(&["status", "--json"]).stdout).expect("json");
    strip_clock(&mut api);
    strip_clock(&mut from_cli);
    assert_eq!(api, from_cli);
    assert_eq!(api["dispatch"]["dead"], 1);
    assert_eq!(api["backfill"]["abandoned_missing_row"], 1);

    let out = cli(&[
        "replay",
        "--ids",
        "1",
        "--expect-state",
        "DEAD",
        "--actor",
        "alice",
        "--reason",
        "codec fixed",
        "--ticket",
        "OPS-3",
    ]);
    let logged = String::from_utf8_lossy(&out.stderr);
    let line = logged
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["fields"]["message"] == "operator replay")
        .unwrap_or_else(|| panic!("a JSON log line for the replay: {logged}"));
    assert_eq!(line["fields"]["msg_id"], 1, "{line}");
    assert_eq!(line["fields"]["source"], "raw_copy", "{line}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 applied"), "{stdout}");
    assert!(stdout.contains("raw text from raw_copy"), "{stdout}");

    let api: Value =
        test::read_body_json(test::call_service(&app, get("/admin/messages/1")).await).await;
    let from_cli: Value =
        serde_json::from_slice(&cli(&["inspect", "1", "--json"]).stdout).expect("json");
    assert_eq!(api, from_cli);
    assert_eq!(api["state"], "PENDING");
    assert_eq!(api["audit"][0]["ticket"], "OPS-3");
    assert_eq!(api["inbox"]["found"], "absent");
    let human = String::from_utf8_lossy(&cli(&["status"]).stdout).to_string();
    assert!(
        human.contains("watermark") && human.contains("lease"),
        "{human}"
    );

    let api: Value =
        test::read_body_json(test::call_service(&app, get("/admin/events/dead")).await).await;
    let from_cli: Value =
        serde_json::from_slice(&cli(&["events", "list-dead", "--json"]).stdout).expect("json");
    assert_eq!(api, from_cli);
    assert_eq!(api["events"][0]["event_id"], 10);
    let before = fingerprint(&env).await;
    let out = cli(&[
        "recover-backfill",
        "--ids",
        "2",
        "--dry-run",
        "--actor",
        "bob",
        "--reason",
        "restored",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("would apply"));
    assert_eq!(fingerprint(&env).await, before, "dry run");
    let out = cli(&[
        "events",
        "requeue",
        "--ids",
        "10",
        "--actor",
        "bob",
        "--reason",
        "acl fixed",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("#10 requeued"));
    // Refused before anything runs: no reason.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_msgexchange"))
        .args([
            "events", "requeue", "--ids", "11", "--actor", "bob", "--reason", " ",
        ])
        .envs(env.binary_env())
        .output()
        .expect("run");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("reason"));

    // `status --watch` refreshes until stopped.
    let mut watch = std::process::Command::new(env!("CARGO_BIN_EXE_msgexchange"))
        .args(["status", "--watch", "--interval", "100ms"])
        .envs(env.binary_env())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("watch");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    watch.kill().expect("stop");
    let out = watch.wait_with_output().expect("output");
    let blocks = String::from_utf8_lossy(&out.stdout)
        .matches("msgexchange status as of")
        .count();
    assert!(blocks >= 2, "refreshed {blocks} times");
    env.cleanup().await;
}

/// One HTTP/1.1 request on a fresh connection: (status, body).
async fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
        payload.len()
    );
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .expect("answer in time")
        .expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn openapi() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("docs/openapi.json"))
        .expect("valid JSON")
}

/// A small JSON-schema check of what the document uses: `$ref`, `oneOf`, `type` (or a list of
/// types), `required`, `properties`, `additionalProperties: false`, `items`, `enum`, `minimum`,
/// `maximum`, `minItems`, `maxItems`, `minLength`, `maxLength` (`pattern` is not checked).
/// Returns the first violation.
fn violation(doc: &Value, schema: &Value, v: &Value, at: &str) -> Option<String> {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return violation(doc, &doc["components"]["schemas"][name], v, at);
    }
    if let Some(options) = schema["oneOf"].as_array() {
        let matched = options
            .iter()
            .filter(|o| violation(doc, o, v, at).is_none())
            .count();
        if matched != 1 {
            return Some(format!("{at}: {v} matches {matched} of the oneOf shapes"));
        }
    }
    if let Some(n) = v.as_str().map(|s| s.chars().count() as u64) {
        let (min, max) = (schema["minLength"].as_u64(), schema["maxLength"].as_u64());
        if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
            return Some(format!("{at}: length {n} outside {min:?}..={max:?}"));
        }
    }
    let type_ok = |t: &str| match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    };
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !types.is_empty() && !types.iter().any(|t| type_ok(t)) {
        return Some(format!("{at}: {v} is not {types:?}"));
    }
    if let Some(options) = schema["enum"].as_array() {
        if !v.is_null() && !options.contains(v) {
            return Some(format!("{at}: {v} not in {options:?}"));
        }
    }
    if let (Some(min), Some(n)) = (schema["minimum"].as_i64(), v.as_i64()) {
        if n < min {
            return Some(format!("{at}: {n} < {min}"));
        }
    }
    if let (Some(max), Some(n)) = (schema["maximum"].as_i64(), v.as_i64()) {
        if n > max {
            return Some(format!("{at}: {n} > {max}"));
        }
    }
    if let Some(obj) = v.as_object() {
        for key in schema["required"].as_array().into_iter().flatten() {
            let key = key.as_str().unwrap_or_default();
            if !obj.contains_key(key) {
                return Some(format!("{at}: missing `{key}`"));
            }
        }
        for (key, value) in obj {
            match schema["properties"].get(key) {
                Some(s) => {
                    if let Some(e) = violation(doc, s, value, &format!("{at}.{key}")) {
                        return Some(e);
                    }
                }
                None if schema["additionalProperties"] == false => {
                    return Some(format!("{at}: `{key}` is not documented"))
                }
                None => {}
            }
        }
    }
    if let Some(items) = v.as_array() {
        if let Some(max) = schema["maxItems"].as_u64() {
            if items.len() as u64 > max {
                return Some(format!("{at}: more than {max} items"));
            }
        }
        if let Some(min) = schema["minItems"].as_u64() {
            if (items.len() as u64) < min {
                return Some(format!("{at}: fewer than {min} items"));
            }
        }
        for (i, item) in items.iter().enumerate() {
            if let Some(e) = violation(doc, &schema["items"], item, &format!("{at}[{i}]")) {
                return Some(e);
            }
        }
    }
    None
}

/// The full paths of the leaf resources in actix's `ResourceMap` debug dump (scopes nest:
/// `nodes: Some([…]) }` opens and closes a scope; a leaf ends with `nodes: None`).
fn resource_paths(dump: &str) -> Vec<String> {
    let mut marks: Vec<(usize, &str)> = Vec::new();
    for m in [
        "patterns: Single(\"",
        "nodes: None",
        "nodes: Some([",
        "]) }",
    ] {
        marks.extend(dump.match_indices(m));
    }
    marks.sort();
    let (mut stack, mut current, mut out) = (Vec::<String>::new(), String::new(), Vec::new());
    for (at, mark) in marks {
        match mark {
            "nodes: None" => out.push(format!("{}{current}", stack.concat())),
            "nodes: Some([" => stack.push(current.clone()),
            "]) }" => {
                stack.pop();
            }
            _ => {
                let rest = &dump[at + mark.len()..];
                current = rest[..rest.find('"').unwrap_or(0)].to_string();
            }
        }
    }
    out
}

/// The request examples of an operation (`example` or every `examples.*.value`).
fn request_examples(op: &Value) -> Vec<Value> {
    let media = &op["requestBody"]["content"]["application/json"];
    let mut out: Vec<Value> = media.get("example").cloned().into_iter().collect();
    if let Some(map) = media["examples"].as_object() {
        out.extend(map.values().map(|e| e["value"].clone()));
    }
    out
}

/// `docs/openapi.json` against the real server: every served route is documented and every
/// documented route is served (other methods 405, unknown paths 404); every example validates
/// against its schema and parses into the real request type; each request example sent to the
/// server gets a documented status, and the real 2xx bodies validate against their schemas.
#[actix_rt::test]
async fn openapi_document_matches_the_real_router() {
    let env = TestEnv::new("admin_openapi").await;
    seed(&env).await;
    let doc = openapi();
    assert!(doc["openapi"]
        .as_str()
        .unwrap_or_default()
        .starts_with("3."));
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for method in ops.as_object().expect("ops").keys() {
            documented.push((method.to_uppercase(), path.clone()));
        }
    }
    documented.sort();
    let mut served: Vec<(String, String)> = msgx_actors::http::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    served.sort();
    assert_eq!(
        documented, served,
        "every route documented, every documented route listed"
    );
    // The router's own resource tree (the same configuration `serve` uses): every path it
    // serves is documented.
    let tree = test::init_service(
        App::new()
            .configure(msgx_actors::http::open_routes)
            .configure(configure(state(&env)))
            .default_service(actix_web::web::to(
                |req: actix_web::HttpRequest| async move {
                    actix_web::HttpResponse::Ok().body(format!("{:?}", req.resource_map()))
                },
            )),
    )
    .await;
    let dump = test::read_body(
        test::call_service(
            &tree,
            test::TestRequest::get().uri("/no-such-route").to_request(),
        )
        .await,
    )
    .await;
    let mut router_paths = resource_paths(&String::from_utf8_lossy(&dump));
    router_paths.sort();
    let mut doc_paths: Vec<String> = doc["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .cloned()
        .collect();
    doc_paths.sort();
    assert_eq!(
        router_paths, doc_paths,
        "the router's paths are the documented ones"
    );

    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let port = free_port();
    let health = msgx_actors::health::Health::default();
    let server = msgx_actors::http::serve(
        format!("127.0.0.1:{port}").parse().expect("addr"),
        handle,
        health,
        Some(state(&env)),
    )
    .expect("bind");
    let stop = server.handle();
    actix_rt::spawn(server);
    tokio::time::sleep(Duration::from_millis(200)).await;

    for (path, ops) in doc["paths"].as_object().expect("paths") {
        let concrete = path.replace("{msg_id}", "1");
        for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            let (status, _) = http(port, method, &concrete, None, None).await;
            if ops.get(method.to_lowercase()).is_some() {
                assert!(
                    ![404, 405].contains(&status),
                    "{method} {path} is served: {status}"
                );
            } else {
                assert_eq!(status, 405, "{method} {path} is not a route");
            }
        }
    }
    for unknown in [
        "/admin",
        "/admin/nothing",
        "/cminmsgs/receive",
        "/metrics/x",
    ] {
        assert_eq!(
            http(port, "GET", unknown, Some(TOKEN), None).await.0,
            404,
            "{unknown}"
        );
    }

    // Examples: every one valid against its schema.
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("ops") {
            let schema = &op["requestBody"]["content"]["application/json"]["schema"];
            for ex in request_examples(op) {
                assert_eq!(
                    violation(&doc, schema, &ex, "request"),
                    None,
                    "{method} {path}: {ex}"
                );
            }
            for (code, resp) in op["responses"].as_object().expect("responses") {
                for (_, media) in resp["content"].as_object().into_iter().flatten() {
                    if let Some(ex) = media.get("example") {
                        let v = violation(&doc, &media["schema"], ex, "response");
                        assert_eq!(v, None, "{method} {path} {code}: {ex}");
                    }
                }
            }
        }
    }
    // The request examples parse into the real request types…
    let op = |path: &str, method: &str| doc["paths"][path][method].clone();
    for ex in request_examples(&op("/admin/replay", "post")) {
        serde_json::from_value::<msgx_core::ops::ReplayRequest>(ex).expect("ReplayRequest");
    }
    for ex in request_examples(&op("/admin/recover-backfill", "post")) {
        serde_json::from_value::<msgx_core::ops::RecoverRequest>(ex).expect("RecoverRequest");
    }
    for ex in request_examples(&op("/admin/events/requeue", "post")) {
        serde_json::from_value::<msgx_core::ops::RequeueRequest>(ex).expect("RequeueRequest");
    }
    for ex in request_examples(&op("/cminmsgs/send", "post")) {
        serde_json::from_value::<msgx_core::ops::CompatRequest>(ex).expect("CompatRequest");
    }
    // …and sent to the server get a documented status; 2xx bodies validate.
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("ops") {
            let mut bodies: Vec<Option<Value>> =
                request_examples(op).into_iter().map(Some).collect();
            if bodies.is_empty() {
                bodies.push(None);
            }
            for body in bodies {
                let concrete = path.replace("{msg_id}", "1");
                let (status, text) = http(
                    port,
                    &method.to_uppercase(),
                    &concrete,
                    Some(TOKEN),
                    body.as_ref(),
                )
                .await;
                let resp = &op["responses"][status.to_string()];
                assert!(
                    resp.is_object(),
                    "{method} {path} answered undocumented {status}: {text}"
                );
                if (200..300).contains(&status) {
                    if let Some(schema) = resp["content"]["application/json"].get("schema") {
                        let v: Value = serde_json::from_str(&text).expect("JSON body");
                        assert_eq!(
                            violation(&doc, schema, &v, "body"),
                            None,
                            "{method} {path}: {v}"
                        );
                    }
                }
            }
        }
    }
    stop.stop(true).await;
    env.cleanup().await;
}

/// Finds `schemathesis` (PyPI; `scripts/test.sh` installs it). Without it the fuzz test skips
/// loudly — unless `CI` is set, where it must run.
fn schemathesis() -> Option<std::path::PathBuf> {
    let found = ["schemathesis", "st"].iter().find_map(|name| {
        std::process::Command::new(name)
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|_| std::path::PathBuf::from(name))
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "schemathesis not found and CI is set: install it (pip install schemathesis)"
        );
        eprintln!(
            "\n*** SKIPPED schemathesis_fuzz: schemathesis not found (pip install schemathesis; \
             scripts/test.sh installs it) ***\n"
        );
    }
    found
}

/// Property-based fuzzing of the real binary driven by `docs/openapi.json`, every check of
/// schemathesis (`--checks all`: among them, the server accepts every request the document
/// calls valid and refuses every one it calls invalid). Without a token, with a wrong one or
/// one lacking the scope, every answer is a documented 401/403 and nothing changes in the
/// stores; with a token of every scope no request gets a 5xx and every response conforms.
#[tokio::test]
async fn schemathesis_fuzz_finds_no_5xx_and_no_change_without_a_valid_token() {
    let Some(st) = schemathesis() else {
        return;
    };
    let env = TestEnv::new("admin_fuzz").await;
    // Stable rows the service itself leaves alone: DEAD and marked, abandoned, DEAD/SENT events.
    seed_rows(&env, chrono::Utc::now(), true).await;
    let port = free_port();
    let mut child = common::service::spawn_service(
        &env,
        &[
            ("MSGX_HTTP__ADMIN_TOKEN", TOKEN),
            ("MSGX_HTTP__READ_TOKENS", READ),
            ("MSGX_HTTP__COMPAT_TOKENS", COMPAT),
            ("MSGX_PIPELINE__CUTOVER_WATERMARK", ""),
        ],
        port,
    );
    common::service::wait_for(
        "the service to be ready",
        Duration::from_secs(60),
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
                && http(port, "GET", "/readyz", None, None).await.0 == 200
        },
    )
    .await;
    // The service's own rounds settle first (nothing to do on these rows).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let doc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    let run = |header: Option<String>, checks: &str| {
        let mut cmd = std::process::Command::new(&st);
        cmd.arg("run")
            .arg(&doc)
            .args(["--url", &format!("http://127.0.0.1:{port}")])
            .args(["--checks", checks])
            .args(["--max-examples", "25", "--workers", "1", "--seed", "12"])
            .args(["--exclude-path", "/readyz"])
            .env("SCHEMATHESIS_HOOKS", "")
            .current_dir(std::env::temp_dir())
            .stdin(std::process::Stdio::null());
        if let Some(h) = header {
            cmd.args(["--header", &h]);
        }
        let out = cmd.output().expect("run schemathesis");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let before = fingerprint(&env).await;
    for header in [
        None,
        Some("Authorization: Bearer wrong-token-0123456789".to_string()),
        Some(format!("Authorization: Bearer {READ}")),
        Some(format!("Authorization: Bearer {COMPAT}")),
    ] {
        let (ok, text) = run(header.clone(), "all");
        assert!(ok, "{header:?}: {text}");
        assert_eq!(
            fingerprint(&env).await,
            before,
            "{header:?} changed the stores"
        );
    }
    let (ok, text) = run(Some(format!("Authorization: Bearer {TOKEN}")), "all");
    assert!(ok, "{text}");
    assert!(text.contains("generated"), "{text}");
    common::service::kill9(&mut child);
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
    let with = |token: Option<&str>| {
        let mut req = test::TestRequest::get().uri("/admin/verify");
        if let Some(t) = token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        req.to_request()
    };
    let get = |auth: bool| with(auth.then_some(TOKEN));
    assert_eq!(test::call_service(&app, get(false)).await.status(), 401);
    assert_eq!(
        test::call_service(&app, with(Some(COMPAT))).await.status(),
        403,
        "verify needs the read scope"
    );
    assert_eq!(
        test::call_service(&app, with(Some(READ))).await.status(),
        200
    );
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
