//! Refusals change nothing: no token or a wrong one is 401 before the body is read, a token
//! lacking the scope 403, a bad body, path or method a clear 4xx; nothing is audited.

use actix_web::{test, App};
use msgx_actors::admin::{configure, Scope};
use serde_json::{json, Value};

use super::common::TestEnv;
use super::{audit_rows, fingerprint, seed, state, COMPAT, OPERATE, READ, TOKEN};

#[actix_rt::test]
async fn no_token_no_action_and_bad_requests_change_nothing() {
    let env = TestEnv::new("admin_bad").await;
    seed(&env).await;
    let before = fingerprint(&env).await;
    no_token_is_401_before_the_body(&env).await;
    bad_bodies_are_400_with_a_reason(&env).await;
    empty_selections_are_200_and_audit_nothing(&env).await;
    bad_paths_methods_and_sizes_are_refused(&env).await;

    assert_eq!(audit_rows(&env).await, 0, "nothing was audited");
    let state: String = env
        .scalar("SELECT state FROM proc_state WHERE msg_id = 1")
        .await;
    assert_eq!(state, "DEAD", "nothing changed");
    assert_eq!(fingerprint(&env).await, before, "nothing changed at all");
    env.cleanup().await;
}

/// No token, a wrong one, a wrong scheme: 401 before the body is even parsed.
async fn no_token_is_401_before_the_body(env: &TestEnv) {
    let app = test::init_service(App::new().configure(configure(state(env)))).await;
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
}

/// Each bad body (400) names what is wrong.
async fn bad_bodies_are_400_with_a_reason(env: &TestEnv) {
    let app = test::init_service(App::new().configure(configure(state(env)))).await;
    let bearer = ("Authorization", format!("Bearer {TOKEN}"));
    for (uri, payload, expect) in bad_bodies() {
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
}

/// Bodies the admin API refuses with 400: (route, body, what the reason says).
fn bad_bodies() -> Vec<(&'static str, String, &'static str)> {
    vec![
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
    ]
}

/// Well formed and selecting nothing: 200 with an empty answer, nothing audited. The
/// document cannot compare two fields, so a reversed range is empty rather than refused.
async fn empty_selections_are_200_and_audit_nothing(env: &TestEnv) {
    let app = test::init_service(App::new().configure(configure(state(env)))).await;
    let bearer = ("Authorization", format!("Bearer {TOKEN}"));
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
}

/// Bad path, unknown path, wrong method, a body over the limit.
async fn bad_paths_methods_and_sizes_are_refused(env: &TestEnv) {
    let app = test::init_service(App::new().configure(configure(state(env)))).await;
    let bearer = ("Authorization", format!("Bearer {TOKEN}"));
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
    let req = test::TestRequest::post()
        .uri("/admin/replay")
        .insert_header(bearer)
        .set_payload(vec![b' '; 300 * 1024])
        .to_request();
    assert_eq!(test::call_service(&app, req).await.status(), 413);
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

/// A log sink for one test thread: what `tracing` wrote while the guard lives.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log sink").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log sink")).into_owned()
    }
}

/// Issue 42 item 4: a 5xx answer carries a request id, never the internal error text (a
/// caller learns nothing of the store); the log line has the id, the route and the whole
/// error, and every answer names its id in `X-Request-Id`.
#[actix_rt::test]
async fn a_5xx_answer_carries_a_request_id_and_the_log_has_the_error() {
    let env = TestEnv::new("admin_5xx").await;
    // A store whose pool is closed: every statement fails inside the server.
    let broken = msgx_core::store::Store::connect(&env.settings(&[]).store)
        .await
        .expect("store");
    broken.pool().close().await;
    let mut state = state(&env);
    state.store = broken.clone();
    state.ops.store = broken;
    let log = Captured::default();
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let app = test::init_service(
        App::new()
            .wrap(actix_web::middleware::from_fn(msgx_actors::request_id::tag))
            .configure(configure(state)),
    )
    .await;
    let get = |uri: &str, token: &str| {
        test::TestRequest::get()
            .uri(uri)
            .insert_header(("Authorization", format!("Bearer {token}")))
            .to_request()
    };
    let resp = test::call_service(&app, get("/admin/status", READ)).await;
    assert_eq!(resp.status(), 503);
    let header = resp
        .headers()
        .get(msgx_actors::request_id::HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .expect("X-Request-Id");
    let body = String::from_utf8_lossy(&test::read_body(resp).await).into_owned();
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["request_id"], header.as_str(), "{body}");
    assert!(
        header.len() == 16 && header.bytes().all(|b| b.is_ascii_hexdigit()),
        "{header}"
    );
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.contains(&header), "{body}");
    // The internal text (sqlx's "pool closed", the store's words) stays in the log.
    for internal in ["pool", "closed", "store", "statement"] {
        assert!(
            !body.to_lowercase().contains(internal),
            "{internal}: {body}"
        );
    }
    let text = log.text();
    let line = text
        .lines()
        .find(|l| l.contains(&header))
        .unwrap_or_else(|| panic!("no log line with {header}: {text}"));
    assert!(
        line.contains("/admin/status") && line.contains("closed"),
        "{line}"
    );
    // A 4xx keeps its reason, and every answer has its own id.
    let resp = test::call_service(&app, get("/admin/messages/x", READ)).await;
    assert_eq!(resp.status(), 400);
    let other = resp.headers().get(msgx_actors::request_id::HEADER).cloned();
    assert!(other.is_some_and(|o| o != header.as_str()));
    let v: Value = test::read_body_json(resp).await;
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not a message id"),
        "{v}"
    );
    env.cleanup().await;
}
