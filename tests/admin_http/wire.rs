//! The real server on a socket: garbage on the wire is answered and the server keeps serving;
//! schemathesis fuzzes the real binary from `docs/openapi.json`.

use std::time::Duration;

use super::common::http::{self, exchange, ANSWER_LIMIT};
use super::common::instance::{service_env, Instance};
use super::common::TestEnv;
use super::{fingerprint, seed_rows, serve, COMPAT, READ, TOKEN};

#[actix_rt::test]
async fn the_real_server_answers_garbage_and_keeps_serving() {
    let env = TestEnv::new("admin_wire").await;
    let (port, stop) = serve(&env).await;
    let raw = |request: &'static [u8]| async move {
        exchange(port, request, ANSWER_LIMIT)
            .await
            .unwrap_or_default()
    };
    let garbage = raw(b"\x00\x01GARBAGE \xff\xfe HTTP/9.9\r\n\r\n").await;
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage:?}");
    let unauth = raw(b"POST /admin/replay HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}").await;
    assert!(unauth.starts_with("HTTP/1.1 401"), "{unauth:?}");
    let health = raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health:?}");
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
    let port = super::common::service::free_port();
    let mut child = super::common::service::spawn_service(
        &env,
        &[
            ("MSGX_HTTP__ADMIN_TOKEN", TOKEN),
            ("MSGX_HTTP__READ_TOKENS", READ),
            ("MSGX_HTTP__COMPAT_TOKENS", COMPAT),
            ("MSGX_PIPELINE__CUTOVER_WATERMARK", ""),
        ],
        port,
    );
    super::common::service::wait_for(
        "the service to be ready",
        Duration::from_secs(60),
        // A service still starting may refuse or reset a connection: not ready yet.
        || async {
            http::get(port, "/readyz")
                .await
                .is_ok_and(|r| http::status(&r) == 200)
        },
    )
    .await;
    // The service's own rounds settle first (nothing to do on these rows).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let doc = super::common::repo_root().join("docs/openapi.json");
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
    super::common::service::kill9(&mut child);
    env.cleanup().await;
}

/// Issue 42 item 4: `/healthz` and `/readyz` answer within a probe's timeout (1 s here; the
/// unit's and a load balancer's are longer) while the heaviest admin request runs. The real
/// binary with the `verify_stall` failpoint: `GET /admin/verify` holds its thread for 4 s, as
/// a verify over a large store would; meanwhile every probe answers within 1 s, and the verify
/// itself still answers.
#[tokio::test]
async fn probes_answer_while_a_long_verify_runs() {
    let env = TestEnv::new("admin_probe").await;
    let stall = Duration::from_secs(4);
    // The one way a test starts the binary: killed when dropped, also on a failed assertion.
    let vars = service_env(&env, &env.pg_url, &env.my_url, "embedded");
    let service = Instance::spawn(
        &vars,
        "admin-probe",
        &[
            ("MSGX_HTTP__READ_TOKENS", READ),
            ("MSGX_PIPELINE__CUTOVER_WATERMARK", ""),
            ("MSGEXCHANGE_FAILPOINT", "verify_stall"),
            ("MSGEXCHANGE_FAILPOINT_STALL", "4s"),
        ],
    );
    service.wait_ready(Duration::from_secs(60)).await;
    let port = service.port;
    let started = std::time::Instant::now();
    let verify =
        tokio::spawn(
            async move { http::request(port, "GET", "/admin/verify", Some(READ), None).await },
        );
    // Let the verify reach its stall, then probe through it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut probes = 0;
    while started.elapsed() < stall - Duration::from_millis(800) {
        for path in ["/healthz", "/readyz"] {
            let asked = std::time::Instant::now();
            let answer = exchange(
                port,
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
                Duration::from_secs(1),
            )
            .await;
            let took = asked.elapsed();
            assert!(
                answer.as_deref().is_ok_and(|r| http::status(r) == 200),
                "{path} during a verify: {answer:?} after {took:?}"
            );
            probes += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(probes >= 4, "{probes} probes");
    let answer = verify.await.expect("verify task").expect("verify answers");
    assert!(
        matches!(http::status(&answer), 200 | 409),
        "verify: {answer}"
    );
    assert!(started.elapsed() >= stall, "the verify did stall");
    drop(service);
    env.cleanup().await;
}
