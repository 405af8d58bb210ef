//! Issue 42 items 3 and 7: the service runs end to end as the accounts docs/operations.md
//! ("Database accounts") documents — a MariaDB user with exactly the documented grants, a
//! PostgreSQL role that is no superuser and owns its database — and `check-config --probe`
//! reports what an account lacks or holds beyond them. An error line says its cause once.

use std::time::Duration;

use super::{common, msgx};
use common::TestEnv;

/// The documented inbox grants (docs/operations.md, "Database accounts") for `to`.
fn documented_inbox_grants(env: &TestEnv, to: &str) -> Vec<String> {
    let (n, o, db) = (&env.names, env.base.outbox_names(), &env.db);
    vec![
        format!("GRANT SELECT ON `{db}`.{} TO {to}", n.table),
        format!(
            "GRANT UPDATE ({}, {}) ON `{db}`.{} TO {to}",
            n.status, n.processed, n.table
        ),
        format!("GRANT SELECT, INSERT ON `{db}`.{} TO {to}", o.table),
    ]
}

/// The two least-privilege accounts of one test and their URLs.
struct Accounts {
    my_user: String,
    pg_role: String,
    pg_db: String,
    inbox_url: String,
    store_url: String,
}

impl Accounts {
    /// A MariaDB user with the documented grants on `env`'s inbox, and a login role (no
    /// superuser, no CREATEDB/CREATEROLE) owning a fresh database of its own.
    async fn create(env: &TestEnv) -> Self {
        let my_user = format!("{}_in", env.db);
        let pg_role = format!("{}_st", env.db);
        let pg_db = format!("{}_store", env.db);
        let to = format!("'{my_user}'@'%'");
        let admin = common::mysql_admin().await.expect("mariadb admin");
        let mut statements = vec![
            format!("DROP USER IF EXISTS {to}"),
            format!("CREATE USER {to} IDENTIFIED BY 'pw'"),
        ];
        statements.extend(documented_inbox_grants(env, &to));
        common::run_all(&admin, &statements).await;
        admin.close().await;
        let pg = common::pg_admin().await.expect("postgres admin");
        common::run_all(
            &pg,
            &[
                format!("DROP DATABASE IF EXISTS \"{pg_db}\" WITH (FORCE)"),
                format!("DROP ROLE IF EXISTS \"{pg_role}\""),
                format!("CREATE ROLE \"{pg_role}\" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE"),
            ],
        )
        .await;
        pg.close().await;
        common::fresh_pg_database(&pg_db, Some(&format!("\"{pg_role}\""))).await;
        let my_host = common::mysql_base().replace("mysql://root@", "");
        let pg_host = common::pg_base().replace("postgres://postgres@", "");
        Self {
            inbox_url: format!("mysql://{my_user}:pw@{my_host}/{}", env.db),
            store_url: format!("postgres://{pg_role}@{pg_host}/{pg_db}"),
            my_user,
            pg_role,
            pg_db,
        }
    }

    /// The store database as the admin (the test's reads).
    async fn store_admin(&self) -> sqlx::PgPool {
        sqlx::PgPool::connect(&format!("{}/{}", common::pg_base(), self.pg_db))
            .await
            .expect("store as admin")
    }

    async fn drop(self) {
        if let Ok(admin) = common::mysql_admin().await {
            common::run_all(
                &admin,
                &[format!("DROP USER IF EXISTS '{}'@'%'", self.my_user)],
            )
            .await;
        }
        if let Ok(pg) = common::pg_admin().await {
            common::run_all(
                &pg,
                &[
                    format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.pg_db),
                    format!("DROP ROLE IF EXISTS \"{}\"", self.pg_role),
                ],
            )
            .await;
        }
    }
}

/// `check-config --probe` with these URLs: (exit code, stdout).
fn probe(inbox_url: &str, store_url: &str) -> (Option<i32>, String) {
    let out = msgx(
        &["check-config", "--probe"],
        &[
            ("MSGX_INBOX__URL", inbox_url),
            ("MSGX_STORE__URL", store_url),
            ("MSGX_LOG__LEVEL", "error"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (out.status.code(), format!("{stdout}{stderr}"))
}

/// Rows of the inbox not marked yet (the owner's view).
async fn unmarked(env: &TestEnv) -> i64 {
    let sql = env
        .names
        .sql("SELECT COUNT(*) FROM {table} WHERE {status} IS NULL OR TRIM({status}) = ''");
    sqlx::query_scalar(&sql)
        .fetch_one(&env.owner)
        .await
        .expect("count unmarked")
}

#[tokio::test]
async fn the_documented_accounts_run_the_service_and_the_probe_reports_the_rest() {
    let env = TestEnv::new("lpriv").await;
    let acc = Accounts::create(&env).await;
    for seqn in 1..=12 {
        let text = common::msgs::flop(seqn, &format!("LP{seqn:03}"), &[("GATE", "B2")]);
        env.insert_message(&text).await;
    }

    // The documented accounts: the probe finds nothing missing and nothing more.
    let (code, out) = probe(&acc.inbox_url, &acc.store_url);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("inbox: privileges as documented"), "{out}");
    assert!(out.contains("store: privileges as documented"), "{out}");

    // The service as those accounts: migrates its own database, drains, marks, delivers.
    let port = common::service::free_port();
    let mut svc = common::service::spawn_service(
        &env,
        &[
            ("MSGX_INBOX__URL", &acc.inbox_url),
            ("MSGX_STORE__URL", &acc.store_url),
            ("MSGX_PIPELINE__MAX_COMMIT_DELAY", "1s"),
            ("MSGX_BACKFILL__PERIOD", "300ms"),
        ],
        port,
    );
    let store = acc.store_admin().await;
    let drained = || async {
        let events: (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE state = 'PENDING') FROM msg_event",
        )
        .fetch_one(&store)
        .await
        .unwrap_or((0, 1));
        unmarked(&env).await == 0 && events.0 > 0 && events.1 == 0
    };
    common::service::wait_for(
        "the drain as the least accounts",
        Duration::from_secs(60),
        drained,
    )
    .await;
    common::service::kill9(&mut svc);
    let foreign: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tableowner <> $1",
    )
    .bind(&acc.pg_role)
    .fetch_one(&store)
    .await
    .expect("owners");
    assert_eq!(foreign, 0, "the store role migrated and owns every table");
    store.close().await;

    // Under-privileged: no UPDATE of the mark columns, and a store role owning nothing.
    let admin = common::mysql_admin().await.expect("mariadb admin");
    let to = format!("'{}'@'%'", acc.my_user);
    let (n, db) = (&env.names, &env.db);
    common::run_all(
        &admin,
        &[format!(
            "REVOKE UPDATE ({}, {}) ON `{db}`.{} FROM {to}",
            n.status, n.processed, n.table
        )],
    )
    .await;
    let stranger = format!("{}_x", env.db);
    let pg = common::pg_admin().await.expect("postgres admin");
    common::run_all(
        &pg,
        &[
            format!("DROP ROLE IF EXISTS \"{stranger}\""),
            format!("CREATE ROLE \"{stranger}\" LOGIN"),
        ],
    )
    .await;
    let stranger_url = acc.store_url.replacen(&acc.pg_role, &stranger, 1);
    let (code, out) = probe(&acc.inbox_url, &stranger_url);
    assert_eq!(code, Some(2), "{out}");
    let status_col = n.status.as_str();
    assert!(
        out.lines()
            .any(|l| l.starts_with("inbox: missing: UPDATE") && l.contains(status_col)),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("store: missing: ownership of")),
        "{out}"
    );
    assert!(!out.contains("more than needed"), "{out}");

    // Over-privileged: DELETE on the inbox table, DDL on the whole database, a superuser.
    common::run_all(
        &admin,
        &[
            format!(
                "GRANT UPDATE ({}, {}) ON `{db}`.{} TO {to}",
                n.status, n.processed, n.table
            ),
            format!("GRANT DELETE ON `{db}`.{} TO {to}", n.table),
            format!("GRANT ALTER, DROP ON `{db}`.* TO {to}"),
        ],
    )
    .await;
    let superuser_url = format!("{}/{}", common::pg_base(), acc.pg_db);
    let (code, out) = probe(&acc.inbox_url, &superuser_url);
    assert_eq!(code, Some(0), "nothing missing: {out}");
    let table = n.table.as_str();
    assert!(
        out.lines()
            .any(|l| l.starts_with("inbox: more than needed: DELETE ON") && l.contains(table)),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("inbox: more than needed:")
                && l.contains("ALTER")
                && l.contains("the whole database")),
        "{out}"
    );
    assert!(
        out.contains("store: more than needed: SUPERUSER (role attribute)"),
        "{out}"
    );
    assert!(!out.contains("missing"), "{out}");

    admin.close().await;
    common::run_all(&pg, &[format!("DROP ROLE IF EXISTS \"{stranger}\"")]).await;
    pg.close().await;
    acc.drop().await;
    env.cleanup().await;
}

/// The documented step that makes the audit trail append-only (docs/operations.md, "Database
/// accounts"): the database, its schema and `audit_log` belong to `owner`, a role nobody logs
/// in as (a schema's owner may drop any table in it); `runtime` may create its tables in the
/// schema, and only insert into and read `audit_log`.
fn documented_audit_owner(owner: &str, runtime: &str, db: &str) -> Vec<String> {
    vec![
        format!("DROP ROLE IF EXISTS \"{owner}\""),
        format!("CREATE ROLE \"{owner}\" NOLOGIN"),
        format!("ALTER DATABASE \"{db}\" OWNER TO \"{owner}\""),
        format!("ALTER SCHEMA public OWNER TO \"{owner}\""),
        format!("GRANT USAGE, CREATE ON SCHEMA public TO \"{runtime}\""),
        format!("ALTER TABLE audit_log OWNER TO \"{owner}\""),
        format!("GRANT SELECT, INSERT ON audit_log TO \"{runtime}\""),
        format!("GRANT USAGE ON SEQUENCE audit_log_id_seq TO \"{runtime}\""),
    ]
}

/// Issue 55: the runtime role may add to the audit trail but not rewrite it. Migrated by the
/// runtime role itself (it owns every table, `audit_log` included: the probe says so), then the
/// documented step: the probe finds the account as documented, an audited action of the
/// service's own CLI (as that role) writes its row, and the same role — connected as itself,
/// checked by `current_user` — is refused UPDATE, DELETE, TRUNCATE and taking the table back.
#[tokio::test]
async fn the_audit_trail_is_append_only_for_the_runtime_role() {
    let env = TestEnv::new("lpaudit").await;
    let acc = Accounts::create(&env).await;
    let vars = [
        ("MSGX_INBOX__URL", acc.inbox_url.as_str()),
        ("MSGX_STORE__URL", acc.store_url.as_str()),
        ("MSGX_LOG__LEVEL", "warn"),
    ];
    common::process::assert_ok(&msgx(&["migrate"], &vars));
    let (code, out) = probe(&acc.inbox_url, &acc.store_url);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("store: more than needed: ownership of audit_log"),
        "{out}"
    );

    let owner = format!("{}_audit", env.db);
    let store = acc.store_admin().await;
    common::run_all(
        &store,
        &documented_audit_owner(&owner, &acc.pg_role, &acc.pg_db),
    )
    .await;
    let (code, out) = probe(&acc.inbox_url, &acc.store_url);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("store: privileges as documented"), "{out}");

    // An audited action through the service's own code, as the runtime role.
    let replay = msgx(
        &[
            "replay",
            "--ids",
            "424242",
            "--expect-state",
            "DEAD",
            "--actor",
            "lp-audit",
            "--reason",
            "append-only check",
        ],
        &vars,
    );
    common::process::assert_ok(&replay);
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE actor = 'lp-audit'")
            .fetch_one(&store)
            .await
            .expect("audit rows");
    assert_eq!(audited, 1, "{}", String::from_utf8_lossy(&replay.stdout));

    // The runtime role itself may not rewrite it.
    let runtime = sqlx::PgPool::connect(&acc.store_url)
        .await
        .expect("the runtime role");
    let who: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&runtime)
        .await
        .expect("current_user");
    assert_eq!(who, acc.pg_role, "connected as the runtime role");
    for sql in [
        "UPDATE audit_log SET reason = 'rewritten'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
        "ALTER TABLE audit_log DISABLE TRIGGER ALL",
        "DROP TABLE audit_log",
    ] {
        let e = sqlx::query(sql)
            .execute(&runtime)
            .await
            .expect_err(sql)
            .to_string();
        assert!(
            e.contains("permission denied") || e.contains("must be owner"),
            "{sql}: {e}"
        );
    }
    let owner_role = format!("ALTER TABLE audit_log OWNER TO \"{}\"", acc.pg_role);
    assert!(sqlx::query(&owner_role).execute(&runtime).await.is_err());
    let kept: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE reason = 'append-only check'")
            .fetch_one(&store)
            .await
            .expect("audit rows");
    assert_eq!(kept, 1, "the row is as written");
    runtime.close().await;

    // The table back to the runtime role (so its database drops), and the owner role gone.
    common::run_all(
        &store,
        &[format!(
            "ALTER TABLE audit_log OWNER TO \"{}\"",
            acc.pg_role
        )],
    )
    .await;
    store.close().await;
    acc.drop().await;
    if let Ok(pg) = common::pg_admin().await {
        common::run_all(&pg, &[format!("DROP ROLE IF EXISTS \"{owner}\"")]).await;
        pg.close().await;
    }
    env.cleanup().await;
}

/// Issue 42 item 7: an error line says its cause once (anyhow's `{:#}` said sqlx's
/// "Connection refused" three times: each wrapper embeds its source and exposes it too).
#[test]
fn an_error_line_says_its_cause_once() {
    let out = msgx(
        &["migrate"],
        &[
            ("MSGX_STORE__URL", "postgres://nobody@127.0.0.1:1/none"),
            ("MSGX_LOG__LEVEL", "off"),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "an outage: worth a restart");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("msgexchange: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
    assert!(line.contains("migrating the store at"), "{line}");
}
