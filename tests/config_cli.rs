//! The binary's edges: bad configuration fails at start with one clear line naming the key;
//! `check-config` never prints a password; the dev fixture creates the inbox tables; the HTTP
//! surface answers /metrics with the poller's metrics and refuses what it does not serve.
//! `supply_chain`: the container image's dependency layer, base image digests, the SBOM and
//! the cargo-deny policy (issue 42). `start_paths`: what the image, `docker compose up` and
//! the template unit run, started for real (issue 55); `vendored`: the patched sqlx-core is
//! upstream plus its patches, in the SBOM with its pedigree (issue 55).

use msgx_testkit as common;

#[path = "config_cli/supply_chain.rs"]
mod supply_chain;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::http::{exchange as http_raw, get as http_get, ANSWER_LIMIT};
use common::TestEnv;

#[path = "config_cli/least_privilege.rs"]
mod least_privilege;

#[path = "config_cli/migration_locks.rs"]
mod migration_locks;

#[path = "config_cli/start_paths.rs"]
mod start_paths;

#[path = "config_cli/vendored.rs"]
mod vendored;

fn msgx(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = common::instance::msgexchange();
    cmd.args(args)
        .env("MSGEXCHANGE_CONFIG", common::default_toml())
        .env("MSGX_KAFKA__BROKERS", "embedded")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run msgexchange")
}

/// `msgexchange ARGS` with these overrides exits 2 with one line on stderr; that line.
fn one_line_refusal(args: &[&str], extra: &[(&str, &str)]) -> String {
    let out = msgx(args, extra);
    assert_eq!(out.status.code(), Some(2), "{args:?} {extra:?}");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    stderr
}

/// Two settings that do not fit together: `run` and `check-config` with `bad` alone both
/// refuse, in one line naming both keys; with `fix` as well `check-config` passes (its output).
fn refused_until_fixed(
    bad: (&str, &str),
    names: [&str; 2],
    fix: (&str, &str),
) -> std::process::Output {
    for args in [&["run"][..], &["check-config"][..]] {
        let stderr = one_line_refusal(args, &[bad]);
        assert!(names.iter().all(|n| stderr.contains(n)), "{stderr}");
    }
    let out = msgx(&["check-config"], &[bad, fix]);
    assert_eq!(out.status.code(), Some(0));
    out
}

/// `msgexchange run` with `key=value` exits 2 at start, one line on stderr naming `expect`.
fn refused_at_start(key: &str, value: &str, expect: &str) {
    let stderr = one_line_refusal(&["run"], &[(key, value)]);
    assert!(stderr.contains(expect), "{key}: {stderr}");
}

#[test]
fn bad_config_fails_at_start_naming_the_key() {
    // Named by the field alone.
    refused_at_start(
        "MSGX_PIPELINE__MAX_COMMIT_DELAY",
        "soon",
        "max_commit_delay",
    );
    refused_at_start("MSGX_PIPELINE__NO_SUCH_KEY", "1", "no_such_key");
    // Named by the whole settings key.
    for (key, value) in [
        ("MSGX_PIPELINE__CLAIM_BATCH", "0"),
        ("MSGX_INBOX__ID_COLUMN", "ID`; DROP"),
        ("MSGX_PIPELINE__CUTOVER_WATERMARK", "latest"),
        // Absurd durations are refused at start instead of overflowing a time computation.
        ("MSGX_LATE__WATCH_WINDOW", "300000y"),
        ("MSGX_PROCESSING__RETRY_MAX", "300000y"),
        ("MSGX_LEASE__RENEW_EVERY", "8s"),
        ("MSGX_KAFKA__EXTRA", "enable.idempotence=false"),
        ("MSGX_KAFKA__EXTRA", "acks=1"),
        ("MSGX_STORE__LOCK_TIMEOUT", "2m"),
    ] {
        refused_at_start(key, value, &common::setting_name(key));
    }
    let out = msgx(&["--config", "/nonexistent.toml", "check-config"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonexistent"));
}

/// R ≤ R_keep (seed §5.2, Q6/Q7) at start and in `check-config`: one line naming the key.
#[test]
fn r_above_the_owners_retention_is_refused() {
    let out = refused_until_fixed(
        ("MSGX_BACKFILL__OVERDUE_AFTER", "40d"),
        ["backfill.overdue_after", "retention.r_keep"],
        ("MSGX_RETENTION__R_KEEP", "60d"),
    );
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
    common::process::assert_ok(&out);
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
        common::instance::msgexchange()
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
    common::process::assert_ok(&out);
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
    common::process::assert_ok(&out);
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
    common::process::assert_ok(&out);
    let ids = env.insert_rows(3).await;

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let mut cmd = common::instance::msgexchange();
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
    let garbage = http_raw(port, b"NOT HTTP AT ALL\r\n\r\n", ANSWER_LIMIT)
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
    assert!(ready.contains("stage `inbox`"), "{ready}");
    // Issue 55: no token, so no internal text: the driver's error names the table.
    assert!(!ready.contains("CMINMSGS"), "{ready}");
    sqlx::query("RENAME TABLE CMINMSGS_AWAY TO CMINMSGS")
        .execute(&env.owner)
        .await
        .expect("rename back");

    // A second instance on the same store is refused (single active instance).
    let second = common::instance::msgexchange()
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

/// A fresh PostgreSQL database with nothing in it; dropped by the caller.
async fn empty_database(tag: &str) -> (String, sqlx::PgPool) {
    let db = format!("msgxt_{tag}_{}", std::process::id());
    common::fresh_pg_database(&db, None).await;
    let url = format!("{}/{db}", common::pg_base());
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    (url, pool)
}

/// Drops the database [`empty_database`] made for `tag`.
async fn drop_empty_database(tag: &str) {
    let db = format!("msgxt_{tag}_{}", std::process::id());
    let admin = common::pg_admin().await.expect("postgres");
    common::run_all(
        &admin,
        &[format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)")],
    )
    .await;
    admin.close().await;
}

/// Tables, and the applied migrations: what a read-only command must leave as it found it.
async fn schema_snapshot(pool: &sqlx::PgPool) -> (Vec<String>, Vec<i64>) {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("tables");
    let versions: Vec<i64> = if tables.iter().any(|t| t == "_sqlx_migrations") {
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
            .fetch_all(pool)
            .await
            .expect("versions")
    } else {
        Vec::new()
    };
    (tables, versions)
}

const READ_ONLY: &[&[&str]] = &[
    &["status"],
    &["verify"],
    &["survey"],
    &["purge-readiness"],
    &["inspect", "1"],
    &["events", "list-dead"],
    &["cutover", "plan", "--mode", "max"],
];

/// Issue 22: the operator commands never create a database or migrate a schema; a missing
/// database, a missing or older schema, or a newer one is a clear error and a non-zero exit;
/// `migrate` is explicit and idempotent; `run` refuses a schema newer than the binary, and
/// one that is behind when `store.migrate_at_start` is off.
#[tokio::test]
async fn read_only_commands_never_create_or_migrate_and_versions_are_guarded() {
    let env = TestEnv::new("schema_guard").await;
    let inbox = env.my_url.clone();
    let missing = format!("{}/msgxt_nowhere_{}", common::pg_base(), std::process::id());
    let cmd = |args: &[&str], store: &str| {
        msgx(
            args,
            &[
                ("MSGX_STORE__URL", store),
                ("MSGX_INBOX__URL", &inbox),
                ("MSGX_LOG__LEVEL", "error"),
            ],
        )
    };
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    // Every read-only command on the store at `url` (`what`) fails, saying `why`.
    let all_refuse = |url: &str, what: &str, why: &str| {
        for args in READ_ONLY {
            let out = cmd(args, url);
            assert!(!out.status.success(), "{args:?} on {what}");
            assert!(stderr(&out).contains(why), "{args:?}: {}", stderr(&out));
        }
    };

    // A mistyped store URL: refused, and the database is not created.
    all_refuse(&missing, "a missing database", "does not exist");
    let admin = sqlx::PgPool::connect(&format!("{}/postgres", common::pg_base()))
        .await
        .expect("postgres");
    let created: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(format!("msgxt_nowhere_{}", std::process::id()))
            .fetch_one(&admin)
            .await
            .expect("pg_database");
    assert!(!created, "no command created the mistyped database");

    // An empty database: refused, nothing migrated.
    let (url, pool) = empty_database("schema_empty").await;
    all_refuse(&url, "an empty database", "no msgexchange schema");
    assert_eq!(
        schema_snapshot(&pool).await,
        (vec![], vec![]),
        "nothing created"
    );
    let out = msgx(
        &["run"],
        &[
            ("MSGX_STORE__URL", &url),
            ("MSGX_INBOX__URL", &inbox),
            ("MSGX_STORE__MIGRATE_AT_START", "false"),
            ("MSGX_HTTP__LISTEN", "127.0.0.1:0"),
        ],
    );
    assert!(
        !out.status.success(),
        "run refuses a schema behind with migrate_at_start off"
    );
    assert!(
        stderr(&out).contains("msgexchange migrate"),
        "{}",
        stderr(&out)
    );

    // `migrate`: explicit, prints what it applied; idempotent.
    let out = cmd(&["migrate"], &url);
    assert!(out.status.success(), "{}", stderr(&out));
    let first = String::from_utf8_lossy(&out.stdout).into_owned();
    let binary = msgx_core::store::schema::binary_version();
    assert!(
        first.contains("applied migration 1\n")
            && first.contains(&format!("applied migration {binary}\n")),
        "{first}"
    );
    let out = cmd(&["migrate"], &url);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to apply"));

    // A migrated store: every read-only command leaves the schema exactly as it was.
    let before = schema_snapshot(&pool).await;
    for args in READ_ONLY {
        cmd(args, &url);
    }
    assert_eq!(
        schema_snapshot(&pool).await,
        before,
        "read-only commands changed nothing"
    );

    // Migrated by a newer binary: every command, `run` and `migrate` refuse, naming both.
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', true, '\\x00', 0)",
    )
    .execute(&pool)
    .await
    .expect("a newer migration");
    for args in [&["status"][..], &["migrate"][..], &["run"][..]] {
        let out = msgx(
            args,
            &[
                ("MSGX_STORE__URL", &url),
                ("MSGX_INBOX__URL", &inbox),
                ("MSGX_HTTP__LISTEN", "127.0.0.1:0"),
            ],
        );
        assert!(!out.status.success(), "{args:?} against a newer schema");
        let e = stderr(&out);
        assert!(
            e.contains("at version 9999") && e.contains(&format!("this binary's {binary}")),
            "{args:?}: {e}"
        );
    }
    pool.close().await;
    drop_empty_database("schema_empty").await;
    env.cleanup().await;
}

/// Issue 22: with tokens configured, the admin surface of an instance that is not serving yet
/// (here: standing by while another holds the lease) answers 503 with the reason, never 404.
#[tokio::test]
async fn a_standby_admin_surface_answers_503_with_the_reason() {
    let env = TestEnv::new("admin_standby").await;
    let token = [("MSGX_HTTP__READ_TOKENS", "read-token-0123456789")];
    let (pa, pb) = (common::service::free_port(), common::service::free_port());
    let mut active = common::service::spawn_service(&env, &token, pa);
    common::service::wait_for("the active instance", Duration::from_secs(30), || async {
        http_get(pa, "/readyz")
            .await
            .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
    })
    .await;
    let mut standby = common::service::spawn_service(&env, &token, pb);
    common::service::wait_for(
        "the standby to stand by",
        Duration::from_secs(30),
        || async {
            http_get(pb, "/readyz")
                .await
                .is_ok_and(|r| r.contains("standing by"))
        },
    )
    .await;
    for path in ["/admin/status", "/admin/messages/1"] {
        let r = http_get(pb, path).await.expect("standby answers");
        assert!(r.starts_with("HTTP/1.1 503"), "{path}: {r}");
        assert!(
            r.contains("not serving yet") && r.contains("standing by"),
            "{r}"
        );
    }
    let post = http_raw(
        pb,
        b"POST /cminmsgs/send HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 13\r\nConnection: close\r\n\r\n{\"msg_id\": 1}",
        ANSWER_LIMIT,
    )
    .await
    .expect("standby answers");
    assert!(post.starts_with("HTTP/1.1 503"), "{post}");
    let r = http_get(pa, "/admin/status").await.expect("active answers");
    assert!(
        r.starts_with("HTTP/1.1 401"),
        "the active one serves (and wants a token): {r}"
    );
    common::service::kill9(&mut standby);
    common::service::kill9(&mut active);
    env.cleanup().await;
}

/// The store as an earlier msgexchange left it: migrations up to `version` applied (the
/// embedded ones, so their checksums are the ones `migrate` later validates).
async fn migrate_up_to(pool: &sqlx::PgPool, version: i64) {
    let migrations = msgx_core::store::MIGRATOR
        .iter()
        .filter(|m| m.version <= version)
        .cloned()
        .collect::<Vec<_>>();
    let older = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(migrations),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    };
    older.run(pool).await.expect("older migrations");
}

/// Issue 22: an upgrade from the earliest schema in `migrations/`, with a backlog in every
/// state written at the schema of its time — PENDING, FAILED, DEAD and terminal-unmarked
/// records and an open hole at version 1, PENDING and DEAD events at the previous release's
/// version (14) — then the current binary: it migrates, finishes everything, and `verify`
/// passes. Nothing is lost.
#[tokio::test]
async fn an_upgrade_from_the_earliest_schema_finishes_a_mixed_backlog() {
    let env = TestEnv::new("upgrade").await;
    let (url, pool) = empty_database("upgrade_store").await;
    let (ids, hole) = upstream_backlog(&env).await;

    v1_records(&pool, &ids).await;
    v14_events(&pool, &ids).await;

    let top = ids[19] + 5;
    run_until_settled(&env, &url, &pool, top).await;

    let records: Vec<(i64, String)> =
        sqlx::query_as("SELECT msg_id, state FROM proc_state ORDER BY msg_id")
            .fetch_all(&pool)
            .await
            .expect("records");
    let expected: Vec<i64> = (ids[0]..=top).filter(|id| *id != hole).collect();
    assert_eq!(
        records.iter().map(|r| r.0).collect::<Vec<_>>(),
        expected,
        "every row enqueued once, the rolled-back id never"
    );
    let dead: Vec<i64> = records
        .iter()
        .filter(|r| r.1 == "DEAD")
        .map(|r| r.0)
        .collect();
    assert_eq!(
        dead,
        vec![ids[10], ids[11]],
        "malformed and the poisoned unknown type"
    );
    let out = msgx(
        &["verify"],
        &[
            ("MSGX_STORE__URL", &url),
            ("MSGX_INBOX__URL", &env.my_url),
            ("MSGX_LOG__LEVEL", "error"),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    pool.close().await;
    drop_empty_database("upgrade_store").await;
    env.cleanup().await;
}

/// The upstream inbox of the upgrade: 20 messages (one malformed, one of an unknown type), a
/// rolled-back insert (a hole) and 4 more above it; the 20 ids and the hole.
async fn upstream_backlog(env: &TestEnv) -> (Vec<i64>, i64) {
    let mut ids = Vec::new();
    for seqn in 1..=20 {
        let text = match seqn {
            11 => "<MSG><META>broken".to_string(),
            12 => common::msgs::unknown_type(seqn),
            _ => common::msgs::flop(seqn, &format!("CA{seqn:03}"), &[("GATE", "A1")]),
        };
        ids.push(env.insert_message(&text).await);
    }
    // Above W: rows after a hole (a rolled-back insert) the old version had seen.
    let (tx, hole) = env.open_insert().await;
    tx.rollback().await.expect("rollback");
    for seqn in 21..=24 {
        env.insert_message(&common::msgs::flop(seqn, "CA999", &[("STND", "12")]))
            .await;
    }
    (ids, hole)
}

/// Records written at schema version 1: 10 SUCCEEDED unmarked, one DEAD, one FAILED, the rest
/// PENDING; W at the last of the 20 with an open hole.
async fn v1_records(pool: &sqlx::PgPool, ids: &[i64]) {
    migrate_up_to(pool, 1).await;
    let now = chrono::Utc::now();
    let insert = |id: i64, state: &'static str, class: Option<&'static str>| async move {
        let terminal = matches!(state, "SUCCEEDED" | "DEAD");
        sqlx::query(
            "INSERT INTO proc_state (msg_id, state, enqueued_at, attempts, error_class, \
                 next_attempt_at, terminal_reason, terminal_at, backfill_next_at, \
                 processing_started_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $3)",
        )
        .bind(id)
        .bind(state)
        .bind(now)
        .bind(i32::from(state != "PENDING"))
        .bind(class)
        .bind((state == "FAILED").then_some(now))
        .bind(class.filter(|_| terminal))
        .bind(terminal.then_some(now))
        .bind(terminal.then_some(now))
        .execute(pool)
        .await
        .expect("a v1 record");
    };
    for (i, id) in ids.iter().enumerate() {
        match i + 1 {
            1..=10 => insert(*id, "SUCCEEDED", None).await,
            11 => insert(*id, "DEAD", Some("MALFORMED")).await,
            12 => insert(*id, "FAILED", Some("UNSUPPORTED")).await,
            _ => insert(*id, "PENDING", None).await,
        }
    }
    sqlx::query("UPDATE inbox_cursor SET w = $1, hole_since = $2")
        .bind(ids[19])
        .bind(now)
        .execute(pool)
        .await
        .expect("W and the open hole");
}

/// Events written at the previous release's schema (14): PENDING and DEAD.
async fn v14_events(pool: &sqlx::PgPool, ids: &[i64]) {
    migrate_up_to(pool, 14).await;
    let now = chrono::Utc::now();
    for (id, state) in [(ids[0], "PENDING"), (ids[1], "DEAD"), (ids[2], "PENDING")] {
        sqlx::query(
            "INSERT INTO msg_event (msg_id, flight_key, event_type, payload, state, created_at, \
             dead_at, last_error) VALUES ($1, 'CA001', 'FLIGHT_UPDATED', \
             '{\"flid\": \"CA001\"}', $2, $3, CASE WHEN $2 = 'DEAD' THEN $3 END, \
             CASE WHEN $2 = 'DEAD' THEN 'broker refused the record' END)",
        )
        .bind(id)
        .bind(state)
        .bind(now)
        .execute(pool)
        .await
        .expect("a v14 event");
    }
}

/// The current binary on the upgraded store until nothing is open: every record finished and
/// marked, no PENDING event, W at `top`. The service is killed afterwards.
async fn run_until_settled(env: &TestEnv, url: &str, pool: &sqlx::PgPool, top: i64) {
    let port = common::service::free_port();
    let mut svc = common::service::spawn_service(
        env,
        &[
            ("MSGX_STORE__URL", url),
            // An upgraded store, not a first start: no cutover seeding.
            ("MSGX_PIPELINE__CUTOVER_WATERMARK", ""),
            ("MSGX_PIPELINE__POLL_INTERVAL", "100ms"),
            ("MSGX_PIPELINE__MAX_COMMIT_DELAY", "1s"),
            ("MSGX_PROCESSING__HEAD_DEADLINE", "2s"),
            ("MSGX_PROCESSING__MAX_ATTEMPTS", "2"),
            ("MSGX_PROCESSING__RETRY_INITIAL", "200ms"),
            ("MSGX_BACKFILL__PERIOD", "300ms"),
        ],
        port,
    );
    let settled = || async {
        let open: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM proc_state WHERE state IN ('PENDING','FAILED') \
                       OR (backfill_at IS NULL AND backfill_abandon_reason IS NULL)) \
                  + (SELECT count(*) FROM msg_event WHERE state = 'PENDING') \
                  + (SELECT CASE WHEN w >= $1 THEN 0 ELSE 1 END FROM inbox_cursor)",
        )
        .bind(top)
        .fetch_one(pool)
        .await
        .unwrap_or(1);
        open == 0
    };
    common::service::wait_for(
        "the upgraded pipeline to settle",
        Duration::from_secs(60),
        settled,
    )
    .await;
    common::service::kill9(&mut svc);
}

/// Issue 30, defaults that fail closed: without `kafka.brokers` `run` refuses (exit 2, one line;
/// operator commands still work); a first start on a fresh store whose inbox holds history
/// refuses until a cutover mode is chosen, naming the `cutover plan` line, and writes nothing;
/// `zero` processes the history; once the store is not fresh, no choice is asked for again.
#[tokio::test]
async fn defaults_fail_closed_without_brokers_or_a_cutover_choice() {
    use common::instance::{cli, service_env, set_var, Instance};
    let env = TestEnv::new("fail_closed").await;
    let ids = env.insert_rows(3).await;
    let mut vars = service_env(&env, &env.pg_url, &env.my_url, "embedded");

    let mut no_kafka = vars.clone();
    set_var(&mut no_kafka, "MSGX_KAFKA__BROKERS", "");
    let mut svc = Instance::spawn(&no_kafka, "fail-closed-kafka", &[]);
    let exit = svc.exited_within(Duration::from_secs(30)).await;
    assert_eq!(exit.and_then(|e| e.code()), Some(2), "{}", svc.log());
    assert!(
        svc.log().contains("kafka.brokers is not set"),
        "{}",
        svc.log()
    );
    let status = cli(&no_kafka, &["status"]).await;
    assert_eq!(
        status.code,
        Some(0),
        "operator commands need no Kafka: {}",
        status.all()
    );
    // A real broker needs a ce_source naming the deployment (issue 40): the compiled default
    // would be shared by every deployment on the topic.
    let mut default_source = vars.clone();
    set_var(&mut default_source, "MSGX_KAFKA__BROKERS", "127.0.0.1:9");
    set_var(&mut default_source, "MSGX_KAFKA__CE_SOURCE", "/msgexchange");
    let mut svc = Instance::spawn(&default_source, "fail-closed-source", &[]);
    let exit = svc.exited_within(Duration::from_secs(30)).await;
    assert_eq!(exit.and_then(|e| e.code()), Some(2), "{}", svc.log());
    assert!(
        svc.log()
            .contains("kafka.ce_source is the compiled default"),
        "{}",
        svc.log()
    );

    set_var(&mut vars, "MSGX_PIPELINE__CUTOVER_WATERMARK", "");
    let mut svc = Instance::spawn(&vars, "fail-closed-cutover", &[]);
    let exit = svc.exited_within(Duration::from_secs(30)).await;
    assert_eq!(exit.and_then(|e| e.code()), Some(2), "{}", svc.log());
    let log = svc.log();
    assert!(
        log.contains(&format!("ids {}..{}", ids[0], ids[2]))
            && log.contains("msgexchange cutover plan --mode")
            && log.contains("pipeline.cutover_watermark"),
        "{log}"
    );
    assert!(
        env.store.is_fresh().await.expect("fresh"),
        "nothing written"
    );
    let plan = cli(&vars, &["cutover", "plan", "--mode", "zero"]).await;
    assert_eq!(plan.code, Some(0), "{}", plan.all());

    // `zero`: the history is processed.
    let svc = Instance::spawn(
        &vars,
        "fail-closed-zero",
        &[("MSGX_PIPELINE__CUTOVER_WATERMARK", "zero")],
    );
    common::service::wait_for("the history processed", Duration::from_secs(60), || async {
        env.cursor().await.0 >= ids[2]
    })
    .await;
    drop(svc);
    // Not fresh any more: a start without a cutover mode is no first start.
    let svc = Instance::spawn(&vars, "fail-closed-again", &[]);
    svc.wait_ready(Duration::from_secs(60)).await;
    drop(svc);
    env.cleanup().await;
}

/// The sweep holds its PostgreSQL row locks while it marks (G5): a mark budget the store's
/// idle timeout does not cover is refused at start, in one line naming both keys.
#[test]
fn a_mark_budget_the_idle_timeout_does_not_cover_is_refused() {
    refused_until_fixed(
        ("MSGX_STORE__IDLE_IN_TRANSACTION_TIMEOUT", "6s"),
        ["backfill.mark_budget", "store.idle_in_transaction_timeout"],
        ("MSGX_BACKFILL__MARK_BUDGET", "4s"),
    );
}

/// The Debian package `scripts/test.sh` packs (`scripts/package.sh --no-build --profile dev`:
/// the package's files around the test profile's build of the binary without `dev-tools`), if
/// any.
fn built_package() -> Option<std::path::PathBuf> {
    let dir = common::repo_root().join("target/package-build/debian");
    let mut debs: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    debs.sort();
    debs.pop()
}

fn run_ok(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 22: the package a site installs. It installs with `dpkg -i` here, puts the binary,
/// the unit, the conffiles (site keys and secrets, readable by root and the service's group)
/// and the docs where the unit expects them, creates the system user, enables nothing; the
/// installed binary's `check-config` accepts the installed configuration; `systemd-analyze
/// verify` accepts the unit. Purged afterwards.
#[test]
fn the_debian_package_installs_and_its_config_checks() {
    let Some(deb) = built_package() else {
        assert!(
            std::env::var("CI").is_err(),
            "CI: scripts/test.sh builds the package (cargo deb) before the tests"
        );
        eprintln!("SKIP: no target/package-build/debian/*.deb (scripts/test.sh builds it)");
        return;
    };
    let deb = deb.display().to_string();
    let fields = run_ok("dpkg-deb", &["--field", &deb, "Package", "Depends"]);
    assert!(
        fields.contains("Package: msgexchange") && fields.contains("adduser"),
        "{fields}"
    );
    run_ok("dpkg", &["-i", &deb]);
    let unit = ["/lib/systemd/system", "/usr/lib/systemd/system"]
        .iter()
        .map(|d| format!("{d}/msgexchange.service"))
        .find(|p| std::path::Path::new(p).exists())
        .expect("the unit is installed");
    // Issue 55: the template unit for several inboxes on one host, beside it.
    let template = unit.replace("msgexchange.service", "msgexchange@.service");
    assert!(
        std::path::Path::new(&template).exists(),
        "{template} installed"
    );
    for path in [
        "/usr/bin/msgexchange",
        "/etc/msgexchange/msgexchange.toml",
        "/etc/msgexchange/msgexchange.env",
        "/usr/share/doc/msgexchange/default.toml",
        "/usr/share/doc/msgexchange/html/index.html",
        "/usr/share/doc/msgexchange/html/alerts/msgxdown.html",
        "/usr/share/doc/msgexchange/html/img/dashboard-3-fifo-head.png",
        "/usr/share/msgexchange/prometheus/alerts.yml",
        "/usr/share/msgexchange/grafana/msgexchange.json",
        "/usr/share/doc/msgexchange/sbom.cdx.json",
    ] {
        assert!(std::path::Path::new(path).exists(), "{path} installed");
    }
    // Issue 42: the package ships the CycloneDX SBOM of this tree's binary (scripts/package.sh).
    let shipped: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("/usr/share/doc/msgexchange/sbom.cdx.json").expect("SBOM"),
    )
    .expect("the SBOM is JSON");
    supply_chain::assert_sbom_lists(&shipped, &["rdkafka-sys", "librdkafka", "sqlx"]);
    assert_eq!(
        shipped,
        supply_chain::sbom_of_this_tree(),
        "the packaged SBOM is this tree's (scripts/package.sh writes it before cargo deb)"
    );
    // Issue 30: an upgrade never restarts (nor stops) a running service before `migrate`.
    let postinst =
        std::fs::read_to_string("/var/lib/dpkg/info/msgexchange.postinst").unwrap_or_default();
    assert!(
        !postinst.contains("try-restart") && !postinst.contains("_dh_action=restart"),
        "{postinst}"
    );
    let conffiles = run_ok(
        "dpkg-query",
        &["--showformat=${Conffiles}", "--show", "msgexchange"],
    );
    assert!(
        conffiles.contains("/etc/msgexchange/msgexchange.toml"),
        "{conffiles}"
    );
    assert!(
        conffiles.contains("/etc/msgexchange/msgexchange.env"),
        "{conffiles}"
    );
    let env_mode = run_ok(
        "stat",
        &["-c", "%a %U:%G", "/etc/msgexchange/msgexchange.env"],
    );
    assert_eq!(
        env_mode.trim(),
        "640 root:msgexchange",
        "secrets readable by the group only"
    );
    run_ok("getent", &["passwd", "msgexchange"]);
    let unit_text = std::fs::read_to_string(&unit).expect("unit");
    for line in [
        "User=msgexchange",
        "Restart=on-failure",
        "TimeoutStopSec=",
        "EnvironmentFile=",
        "RestartPreventExitStatus=2 3",
    ] {
        assert!(unit_text.contains(line), "{line} in the unit");
    }
    // Issue 42: the packaged binary is built without the `dev-tools` feature: no `dev`
    // command writes into whatever inbox is configured.
    let dev = Command::new("/usr/bin/msgexchange")
        .args(["dev", "inbox-fixture"])
        .output()
        .expect("installed binary");
    assert_eq!(
        dev.status.code(),
        Some(2),
        "clap refuses an unknown command"
    );
    let dev_err = String::from_utf8_lossy(&dev.stderr);
    assert!(
        dev_err.contains("unrecognized subcommand 'dev'"),
        "{dev_err}"
    );
    let help = run_ok("/usr/bin/msgexchange", &["--help"]);
    assert!(!help.contains("\n  dev "), "{help}");
    let out = Command::new("/usr/bin/msgexchange")
        .arg("check-config")
        .env("MSGEXCHANGE_CONFIG", "/etc/msgexchange/msgexchange.toml")
        .output()
        .expect("installed binary");
    common::process::assert_ok(&out);
    let effective = String::from_utf8_lossy(&out.stdout);
    assert!(
        effective.contains("create_database = false"),
        "the site keys apply"
    );
    // Issue 42: the packaged configuration verifies every server it talks to.
    for key in [
        "ssl_mode = \"VERIFY_IDENTITY\"",
        "ssl_mode = \"verify-full\"",
        "security_protocol = \"ssl\"",
    ] {
        assert!(effective.contains(key), "{key} in the packaged config");
    }
    // Issue 55: the packaged ce_source is a placeholder `run` refuses by name (exit 2), which
    // `check-config` announces.
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(note.contains("kafka.ce_source"), "{note}");
    let run = Command::new("/usr/bin/msgexchange")
        .arg("run")
        .env("MSGEXCHANGE_CONFIG", "/etc/msgexchange/msgexchange.toml")
        .output()
        .expect("installed binary");
    let refusal = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{refusal}");
    assert!(
        refusal.contains("kafka.ce_source `//site.example/msgexchange` is a placeholder"),
        "{refusal}"
    );
    run_ok("/usr/bin/msgexchange", &["--help"]);
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        run_ok("systemd-analyze", &["verify", &unit]);
        run_ok(
            "systemd-analyze",
            &["verify", &template.replace("@.service", "@north.service")],
        );
    }
    run_ok("dpkg", &["--purge", "msgexchange"]);
    assert!(
        !std::path::Path::new("/usr/bin/msgexchange").exists(),
        "purged"
    );
}
