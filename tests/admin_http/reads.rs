//! Reads: `status`, `inspect` and the dead-event list answer alike from the CLI (straight on
//! the stores) and the API; `verify` over HTTP needs the token and reports violations.

use std::time::Duration;

use actix_web::{test, App};
use msgx_actors::admin::configure;
use serde_json::Value;

use super::common::TestEnv;
use super::{fingerprint, seed, state, state_with_clock, COMPAT, READ, TOKEN};

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
    let get = |uri: &str| {
        test::TestRequest::get()
            .uri(uri)
            .insert_header(("Authorization", format!("Bearer {READ}")))
            .to_request()
    };
    let mut api: Value =
        test::read_body_json(test::call_service(&app, get("/admin/status")).await).await;
    let mut from_cli: Value =
        serde_json::from_slice(&cli(&env, &["status", "--json"]).stdout).expect("json");
    strip_clock(&mut api);
    strip_clock(&mut from_cli);
    assert_eq!(api, from_cli);
    assert_eq!(api["dispatch"]["dead"], 1);
    assert_eq!(api["backfill"]["abandoned_missing_row"], 1);

    let out = cli(
        &env,
        &[
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
        ],
    );
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
        serde_json::from_slice(&cli(&env, &["inspect", "1", "--json"]).stdout).expect("json");
    assert_eq!(api, from_cli);
    assert_eq!(api["state"], "PENDING");
    assert_eq!(api["audit"][0]["ticket"], "OPS-3");
    assert_eq!(api["inbox"]["found"], "absent");
    let human = String::from_utf8_lossy(&cli(&env, &["status"]).stdout).to_string();
    assert!(
        human.contains("watermark") && human.contains("lease"),
        "{human}"
    );

    let api: Value =
        test::read_body_json(test::call_service(&app, get("/admin/events/dead")).await).await;
    let from_cli: Value =
        serde_json::from_slice(&cli(&env, &["events", "list-dead", "--json"]).stdout)
            .expect("json");
    assert_eq!(api, from_cli);
    assert_eq!(api["events"][0]["event_id"], 10);
    let before = fingerprint(&env).await;
    let out = cli(
        &env,
        &[
            "recover-backfill",
            "--ids",
            "2",
            "--dry-run",
            "--actor",
            "bob",
            "--reason",
            "restored",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("would apply"));
    assert_eq!(fingerprint(&env).await, before, "dry run");
    let out = cli(
        &env,
        &[
            "events",
            "requeue",
            "--ids",
            "10",
            "--actor",
            "bob",
            "--reason",
            "acl fixed",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("#10 requeued"));
    a_blank_reason_is_refused_before_anything_runs(&env);
    status_watch_refreshes_until_stopped(&env).await;

    env.cleanup().await;
}

/// Runs the CLI on the env's stores (warnings only, JSON logs); it must succeed.
fn cli(env: &TestEnv, args: &[&str]) -> std::process::Output {
    let out = super::common::instance::msgexchange()
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
}

/// Refused before anything runs: no reason.
fn a_blank_reason_is_refused_before_anything_runs(env: &TestEnv) {
    let refused = super::common::instance::msgexchange()
        .args([
            "events", "requeue", "--ids", "11", "--actor", "bob", "--reason", " ",
        ])
        .envs(env.binary_env())
        .output()
        .expect("run");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("reason"));
}

/// `status --watch` refreshes until stopped.
async fn status_watch_refreshes_until_stopped(env: &TestEnv) {
    let mut watch = super::common::instance::msgexchange()
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
            .app_data(actix_web::web::Data::new(
                msgx_actors::admin::handlers::Verify::new(input),
            ))
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
