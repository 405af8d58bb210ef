//! Audited actions: replay, backfill recovery and event requeue apply or refuse per row and
//! are audited with who and why; a replay carries the state the operator saw and a dry run
//! changes nothing; the compat entry registers beyond W and refuses bad input.

use actix_web::{test, App};
use msgx_actors::admin::configure;
use msgx_core::clock::Clock;
use serde_json::{json, Value};

use super::common::TestEnv;
use super::{fingerprint, raw_copies, seed, state, COMPAT, OPERATE, TOKEN};

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

/// Issue 42 item 4: an audited action records the name of the token that called beside the
/// actor its body states (a stated actor is only a claim; the token is who called); the same
/// operation from the command line records no token. `inspect` shows both.
#[actix_rt::test]
async fn audit_rows_name_the_calling_token_beside_the_stated_actor() {
    use msgx_actors::admin::{AdminState, Scope, Tokens};
    let env = TestEnv::new("admin_tokname").await;
    seed(&env).await;
    let state = AdminState {
        tokens: std::sync::Arc::new(Tokens::named(&[
            ("deploy-bot", OPERATE, Scope::Operate),
            ("alice@ops", TOKEN, Scope::Operate),
        ])),
        ..state(&env)
    };
    let app = test::init_service(App::new().configure(configure(state))).await;
    let post = |token: &str, uri: &str, body: Value| {
        test::TestRequest::post()
            .uri(uri)
            .insert_header(("Authorization", format!("Bearer {token}")))
            .set_json(body)
            .to_request()
    };
    // The body claims to be someone else: the audit keeps the claim and the token's name.
    let resp = test::call_service(
        &app,
        post(
            OPERATE,
            "/admin/replay",
            json!({"msg_ids": [1], "expect_state": "DEAD", "actor": "bob", "reason": "fixed"}),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let resp = test::call_service(
        &app,
        post(
            TOKEN,
            "/admin/events/requeue",
            json!({"event_ids": [10], "actor": "alice", "reason": "ACL fixed"}),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    // The CLI's path: the same operation without a token.
    let cli = env
        .ops()
        .recover_backfill(
            &serde_json::from_value(
                json!({"msg_ids": [2], "actor": "carol", "reason": "restored"}),
            )
            .expect("request"),
            env.clock.now(),
        )
        .await
        .expect("recover");
    assert_eq!(cli.applied, 1);
    let audits: Vec<(String, String, Option<String>)> = env
        .rows("SELECT action, actor, token_name FROM audit_log ORDER BY id")
        .await;
    assert_eq!(
        audits,
        [
            ("REPLAY".into(), "bob".into(), Some("deploy-bot".into())),
            (
                "REQUEUE_EVENTS".into(),
                "alice".into(),
                Some("alice@ops".into())
            ),
            ("RECOVER_BACKFILL".into(), "carol".into(), None),
        ]
    );
    let inspection = env.ops().inspect(1).await.expect("inspect");
    assert_eq!(
        inspection.audit[0].token_name.as_deref(),
        Some("deploy-bot")
    );
    assert!(
        inspection.render().contains("by bob via token deploy-bot"),
        "{}",
        inspection.render()
    );
    env.cleanup().await;
}
