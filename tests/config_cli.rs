//! The binary's edges: bad configuration fails at start with one clear line naming the key;
//! `check-config` never prints a password; the dev fixture creates the inbox tables; the HTTP
//! surface answers /metrics with the poller's metrics and refuses what it does not serve.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::TestEnv;

fn msgx(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_msgexchange"));
    cmd.args(args)
        .env("MSGEXCHANGE_CONFIG", common::default_toml())
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run msgexchange")
}

#[test]
fn bad_config_fails_at_start_naming_the_key() {
    for (key, value, expect) in [
        (
            "MSGX_PIPELINE__MAX_COMMIT_DELAY",
            "soon",
            "max_commit_delay",
        ),
        ("MSGX_PIPELINE__CLAIM_BATCH", "0", "pipeline.claim_batch"),
        ("MSGX_INBOX__ID_COLUMN", "ID`; DROP", "inbox.id_column"),
        (
            "MSGX_PIPELINE__CUTOVER_WATERMARK",
            "latest",
            "pipeline.cutover_watermark",
        ),
        ("MSGX_PIPELINE__NO_SUCH_KEY", "1", "no_such_key"),
        // Absurd durations are refused at start instead of overflowing a time computation.
        ("MSGX_LATE__WATCH_WINDOW", "300000y", "late.watch_window"),
        (
            "MSGX_PROCESSING__RETRY_MAX",
            "300000y",
            "processing.retry_max",
        ),
        ("MSGX_LEASE__RENEW_EVERY", "8s", "lease.renew_every"),
        (
            "MSGX_KAFKA__EXTRA",
            "enable.idempotence=false",
            "kafka.extra",
        ),
        ("MSGX_KAFKA__EXTRA", "acks=1", "kafka.extra"),
        ("MSGX_STORE__LOCK_TIMEOUT", "2m", "store.lock_timeout"),
    ] {
        let out = msgx(&["run"], &[(key, value)]);
        assert_eq!(out.status.code(), Some(2), "{key}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(expect), "{key}: {stderr}");
    }
    let out = msgx(&["--config", "/nonexistent.toml", "check-config"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonexistent"));
}

/// R ≤ R_keep (seed §5.2, Q6/Q7) at start and in `check-config`: one line naming the key.
#[test]
fn r_above_the_owners_retention_is_refused() {
    let too_long = [("MSGX_BACKFILL__OVERDUE_AFTER", "40d")];
    for args in [&["run"][..], &["check-config"][..]] {
        let out = msgx(args, &too_long);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains("backfill.overdue_after") && stderr.contains("retention.r_keep"),
            "{stderr}"
        );
    }
    let out = msgx(
        &["check-config"],
        &[too_long[0], ("MSGX_RETENTION__R_KEEP", "60d")],
    );
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("r_keep = \"60d\""), "{stdout}");
    assert!(stdout.contains("raw_copy = false"), "{stdout}");
}

#[test]
fn check_config_redacts_passwords() {
    let out = msgx(
        &["check-config"],
        &[
            ("MSGX_STORE__URL", "postgres://app:hunter2@db:5432/msgx"),
            ("MSGX_INBOX__URL", "mysql://reader:s3cr3t@inbox:3306/aodb"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("configuration OK"));
    assert!(!all.contains("hunter2") && !all.contains("s3cr3t"), "{all}");
}

/// The binary carries its defaults: from a directory without `config/`, with no
/// MSGEXCHANGE_CONFIG, `check-config` works, prints valid TOML with the secrets redacted, and a
/// partial `--config` file changes only its keys.
#[test]
fn runs_from_any_directory_and_prints_the_effective_toml() {
    let dir = std::env::temp_dir().join(format!("msgx_cfg_{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let partial = dir.join("site.toml");
    std::fs::write(&partial, "[pipeline]\nclaim_batch = 17\n").expect("write");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_msgexchange"))
            .args(args)
            .current_dir(&dir)
            .env_remove("MSGEXCHANGE_CONFIG")
            .env("MSGX_HTTP__ADMIN_TOKEN", "operator-secret-0123456789")
            .env("MSGX_KAFKA__SASL_PASSWORD", "kafka-pw-42")
            .stdin(Stdio::null())
            .output()
            .expect("run")
    };
    let out = run(&["check-config"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("operator-secret") && !stdout.contains("kafka-pw-42"),
        "{stdout}"
    );
    let parsed: toml::Table = toml::from_str(&stdout).expect("check-config prints TOML");
    assert_eq!(parsed["http"]["admin_token"].as_str(), Some("***"));
    assert_eq!(parsed["pipeline"]["claim_batch"].as_integer(), Some(1000));
    assert!(String::from_utf8_lossy(&out.stderr).contains("configuration OK"));

    let out = run(&["--config", partial.to_str().expect("utf8"), "check-config"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: toml::Table = toml::from_str(&String::from_utf8_lossy(&out.stdout)).expect("toml");
    assert_eq!(parsed["pipeline"]["claim_batch"].as_integer(), Some(17));
    assert_eq!(
        parsed["inbox"]["table"].as_str(),
        Some("CMINMSGS"),
        "defaults stay"
    );

    // Help is written for operators, and every operator command has its own.
    let out = run(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("shared MySQL inbox") && !help.contains("actix"),
        "{help}"
    );
    for sub in [
        "status",
        "inspect",
        "replay",
        "recover-backfill",
        "events",
        "check-config",
    ] {
        let out = run(&[sub, "--help"]);
        assert!(out.status.success(), "{sub} --help");
        assert!(
            String::from_utf8_lossy(&out.stdout).len() > 80,
            "{sub} has help"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn dev_fixture_creates_tables_and_the_service_serves_metrics() {
    let env = TestEnv::new("cli").await;
    sqlx::query("DROP TABLE CMINMSGS, COUTMSGS")
        .execute(&env.owner)
        .await
        .expect("drop as owner");
    let mut vars: Vec<(String, String)> = env.binary_env();
    vars.push(("MSGX_LOG__LEVEL".into(), "warn".into()));
    let vars_ref: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = msgx(&["dev", "inbox-fixture"], &vars_ref);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = env.insert_rows(3).await;

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_msgexchange"));
    cmd.arg("run")
        .envs(vars.iter().cloned())
        .env("MSGX_HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("MSGX_PIPELINE__POLL_INTERVAL", "50ms")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn");

    let mut metrics = String::new();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(body) = http_get(port, "/metrics").await {
            if body.contains(&format!("msgx_inbox_watermark {}", ids[2])) {
                metrics = body;
                break;
            }
        }
    }
    assert!(metrics.contains("msgx_inbox_enqueued_total 3"), "{metrics}");
    assert!(metrics.contains("msgx_inbox_hole_open 0"), "{metrics}");
    let ready = http_get(port, "/readyz").await.expect("readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let missing = http_get(port, "/no/such/path").await.expect("404");
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    let garbage = http_raw(port, b"NOT HTTP AT ALL\r\n\r\n")
        .await
        .expect("400");
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage}");
    // Still alive after the bad requests.
    assert!(http_get(port, "/healthz")
        .await
        .expect("alive")
        .starts_with("HTTP/1.1 200"));

    // The DB owner makes the inbox unreadable: rounds fail and are counted, W stays, not ready.
    sqlx::query("RENAME TABLE CMINMSGS TO CMINMSGS_AWAY")
        .execute(&env.owner)
        .await
        .expect("rename");
    let mut failing = String::new();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let body = http_get(port, "/metrics").await.unwrap_or_default();
        // Registered at 0 from start-up: wait for the first failed round.
        let failed = body.lines().any(|l| {
            l.strip_prefix("msgx_inbox_poll_errors_total{stage=\"inbox\"} ")
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v > 0.0)
        });
        if failed {
            failing = body;
            break;
        }
    }
    assert!(
        failing.contains(&format!("msgx_inbox_watermark {}", ids[2])),
        "{failing}"
    );
    let ready = http_get(port, "/readyz").await.expect("readyz");
    assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    assert!(ready.contains("inbox"), "{ready}");
    sqlx::query("RENAME TABLE CMINMSGS_AWAY TO CMINMSGS")
        .execute(&env.owner)
        .await
        .expect("rename back");

    // A second instance on the same store is refused (single active instance).
    let second = Command::new(env!("CARGO_BIN_EXE_msgexchange"))
        .arg("run")
        .envs(vars.iter().cloned())
        .env("MSGX_HTTP__LISTEN", "127.0.0.1:0")
        .env("MSGX_STORE__INSTANCE_LOCK_WAIT", "1s")
        .env("MSGX_LEASE__STANDBY", "false")
        .stdin(Stdio::null())
        .output()
        .expect("second instance");
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("instance lock"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );

    child.kill().expect("kill");
    child.wait().expect("reap");
    env.cleanup().await;
}

async fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    http_raw(
        port,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
}

async fn http_raw(port: u16, request: &[u8]) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(request).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .map_err(|_| std::io::Error::other("timeout"))??;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The sweep holds its PostgreSQL row locks while it marks (G5): a mark budget the store's
/// idle timeout does not cover is refused at start, in one line naming both keys.
#[test]
fn a_mark_budget_the_idle_timeout_does_not_cover_is_refused() {
    let short = [("MSGX_STORE__IDLE_IN_TRANSACTION_TIMEOUT", "6s")];
    for args in [&["run"][..], &["check-config"][..]] {
        let out = msgx(args, &short);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains("backfill.mark_budget")
                && stderr.contains("store.idle_in_transaction_timeout"),
            "{stderr}"
        );
    }
    let out = msgx(
        &["check-config"],
        &[short[0], ("MSGX_BACKFILL__MARK_BUDGET", "4s")],
    );
    assert_eq!(out.status.code(), Some(0));
}
