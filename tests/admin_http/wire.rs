//! The real server on a socket: garbage on the wire is answered and the server keeps serving;
//! schemathesis fuzzes the real binary from `docs/openapi.json`.

use std::time::Duration;

use super::common::http::{self, exchange, ANSWER_LIMIT};
use super::common::instance::{service_env, Instance};
use super::common::TestEnv;
use super::{fingerprint, seed_rows, serve, COMPAT, OPERATE, READ, TOKEN};

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
/// a verify over a large store would; meanwhile every probe answers within 1 s, a second
/// verify is refused (429, issue 55), and the verify itself still answers.
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
    // Issue 55: one verify at a time; a second is 429 with Retry-After, and starts no scan.
    let second = http::request(port, "GET", "/admin/verify", Some(READ), None)
        .await
        .expect("second verify answers");
    assert_eq!(http::status(&second), 429, "{second}");
    assert!(
        second
            .to_ascii_lowercase()
            .contains("\r\nretry-after: 30\r\n"),
        "{second}"
    );
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
    // The first one ended: the next may run.
    let third = http::request(port, "GET", "/admin/verify", Some(READ), None)
        .await
        .expect("third verify answers");
    assert!(matches!(http::status(&third), 200 | 409), "{third}");
    drop(service);
    env.cleanup().await;
}

/// Issue 55: a client that sends its request slowly is cut off after `http.read_timeout` (1 s
/// here; 5 s by default): a body that stops coming is answered 408 and the connection closed,
/// a head that stops coming is closed as well; and refused requests are counted in
/// `msgx_http_refused_total`, not written as one WARN line each.
#[tokio::test]
async fn a_slow_client_is_cut_off_and_refusals_do_not_flood_the_log() {
    let env = TestEnv::new("admin_slow").await;
    let vars = service_env(&env, &env.pg_url, &env.my_url, "embedded");
    let operate = format!("ops:{OPERATE}");
    let service = Instance::spawn(
        &vars,
        "admin-slow",
        &[
            ("MSGX_HTTP__OPERATE_TOKENS", operate.as_str()),
            ("MSGX_HTTP__READ_TIMEOUT", "1s"),
            ("MSGX_PIPELINE__CUTOVER_WATERMARK", ""),
        ],
    );
    service.wait_ready(Duration::from_secs(60)).await;
    let port = service.port;
    let audited = super::audit_rows(&env).await;

    // The head is whole, the body stops after 10 of its 64 bytes.
    let started = std::time::Instant::now();
    let trickle = format!(
        "POST /admin/replay HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPERATE}\r\n\
         Content-Type: application/json\r\nContent-Length: 64\r\n\r\n{{\"ids\": [1"
    );
    let answer = exchange(port, trickle, Duration::from_secs(8))
        .await
        .expect("answered and closed, not held open");
    assert_eq!(http::status(&answer), 408, "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    // Half a head: closed within the same limit (the default head timeout is 5 s).
    let started = std::time::Instant::now();
    let half = exchange(
        port,
        "POST /admin/replay HTTP/1.1\r\nHost: x\r\n",
        Duration::from_secs(8),
    )
    .await
    .expect("closed, not held open");
    assert!(half.is_empty() || http::status(&half) == 408, "{half:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    // Refusals are counted; at most one WARN line says so (a scanner floods nothing).
    for _ in 0..25 {
        let r = http::request(port, "GET", "/admin/status", None, None)
            .await
            .expect("401");
        assert_eq!(http::status(&r), 401, "{r}");
    }
    let metrics = service.metrics().await;
    for series in [
        "msgx_http_refused_total{reason=\"unauthenticated\"} 25",
        "msgx_http_refused_total{reason=\"read_timeout\"} 1",
    ] {
        assert!(metrics.contains(series), "{series}:\n{metrics}");
    }
    let log = service.log();
    let warned = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("/admin/status"))
        .count();
    assert!(warned <= 1, "{warned} WARN lines:\n{log}");
    assert_eq!(super::audit_rows(&env).await, audited, "nothing was run");
    drop(service);
    env.cleanup().await;
}
