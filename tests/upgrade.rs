//! Upgrades with a standby (issue 30): only the lease holder or `msgexchange migrate` migrates;
//! a standby that finds an older schema waits (in `/readyz`, `status` and one log line) and
//! migrates once it holds the lease; the previous release's binary keeps working on the new
//! schema and the new binary on the previous release's data (expand/contract,
//! docs/architecture.md "Schema changes"). The rolling upgrade of docs/operations.md, step by
//! step, with traffic throughout: nothing lost.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::instance::{cli, http_get, log_dir, service_env, set_var, verify, Instance};
use common::service::{free_port, wait_for};
use common::TestEnv;
use msgx_core::store::{schema, InstanceLock, LeaseConfig, SchemaState, Store, MIGRATOR};
use sqlx::postgres::{PgPool, PgPoolOptions};

const LIMIT: Duration = Duration::from_secs(60);

/// The env's store emptied (no schema at all), and a pool of our own on it.
async fn empty_store(env: &TestEnv) -> PgPool {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&env.pg_url)
        .await
        .expect("store");
    for sql in ["DROP SCHEMA public CASCADE", "CREATE SCHEMA public"] {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    pool
}

/// The store as the release before this binary left it: every migration but the newest.
async fn migrate_to_the_previous_schema(pool: &PgPool) -> i64 {
    let mut versions: Vec<i64> = MIGRATOR.iter().map(|m| m.version).collect();
    versions.sort_unstable();
    let previous = versions[versions.len() - 2];
    let older = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            MIGRATOR
                .iter()
                .filter(|m| m.version <= previous)
                .cloned()
                .collect(),
        ),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    };
    older.run(pool).await.expect("older migrations");
    previous
}

async fn schema_version(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(pool)
        .await
        .expect("schema version")
}

async fn lease_epoch(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT epoch FROM instance_lease WHERE id = 1")
        .fetch_one(pool)
        .await
        .expect("lease epoch")
}

/// Records SUCCEEDED so far.
async fn succeeded(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM proc_state WHERE state = 'SUCCEEDED'")
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

/// `n` valid flight messages as upstream, numbered from `first`.
async fn traffic(env: &TestEnv, first: i64, n: i64) {
    for seqn in first..first + n {
        let flight = format!("CA{:03}", seqn % 7);
        env.insert_message(&common::msgs::flop(seqn, &flight, &[("GATE", "B2")]))
            .await;
    }
}

async fn wait_succeeded(pool: &PgPool, n: i64, what: &str) {
    wait_for(what, LIMIT, || async { succeeded(pool).await >= n }).await;
}

async fn readyz_says(port: u16, what: &str) -> bool {
    http_get(port, "/readyz")
        .await
        .is_ok_and(|r| r.starts_with("HTTP/1.1 503") && r.contains(what))
}

/// Every row processed once, marked, its events delivered; `verify` agrees.
async fn nothing_lost(env: &TestEnv, vars: &[(String, String)], rows: i64) {
    wait_for("everything settled", LIMIT, || {
        common::instance::settled(env)
    })
    .await;
    let pool = env.store.pool();
    let records: i64 = sqlx::query_scalar("SELECT count(*) FROM proc_state")
        .fetch_one(pool)
        .await
        .expect("records");
    assert_eq!(records, rows, "every row enqueued once");
    assert_eq!(succeeded(pool).await, rows, "every row processed");
    let (code, out) = verify(vars, &[]);
    assert_eq!(code, Some(0), "{out}");
}

/// Issue 30: the older release's instance holds the lease (this test process stands in for
/// it: the lease row and its live session are all a standby sees) on the older schema. The new
/// binary stands by without migrating and says why; with `migrate_at_start` off it refuses at
/// once with exit 3 (the unit does not restart it). When the lease is released it migrates,
/// then processes what arrived meanwhile.
#[tokio::test]
async fn a_standby_on_an_older_schema_waits_and_migrates_once_it_holds_the_lease() {
    let env = TestEnv::new("upg_standby").await;
    let pool = empty_store(&env).await;
    let older = migrate_to_the_previous_schema(&pool).await;
    let settings = env.settings(&[]);
    let (store, state) = Store::connect_unmigrated(&settings.store)
        .await
        .expect("the older store, not migrated");
    assert!(matches!(state, SchemaState::Behind { .. }), "{state:?}");
    let long = LeaseConfig {
        ttl: Duration::from_secs(120),
        check_timeout: Duration::from_secs(3),
    };
    let holder = InstanceLock::acquire_with(&store, long)
        .await
        .expect("the older instance's lease");
    traffic(&env, 1, 5).await;

    let vars = service_env(&env, &env.pg_url, &env.my_url, "embedded");
    let standby = Instance::spawn(&vars, "upgrade-standby", &[]);
    wait_for("the standby to say it waits to migrate", LIMIT, || {
        readyz_says(standby.port, "migrates once it holds the lease")
    })
    .await;
    // Several lease attempts later: still the older schema, nothing processed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(schema_version(&pool).await, older, "the standby migrated");
    assert_eq!(succeeded(&pool).await, 0);
    let log = standby.log();
    assert_eq!(
        log.matches("migrated only once this instance holds the lease")
            .count(),
        1,
        "one log line: {log}"
    );
    let status = cli(&vars, &["status"]).await;
    assert_eq!(status.code, Some(0), "{}", status.all());
    let binary = schema::binary_version();
    assert!(
        status
            .stdout
            .contains(&format!("at version {older}, this binary's is {binary}"))
            && status.stdout.contains("held by"),
        "{}",
        status.all()
    );

    // With migrate_at_start off, an older schema is refused at once: exit 3, no restart.
    let mut off = vars.clone();
    set_var(&mut off, "MSGX_STORE__MIGRATE_AT_START", "false");
    set_var(&mut off, "MSGX_HTTP__LISTEN", "127.0.0.1:0");
    let refused = cli(&off, &["run"]).await;
    assert_eq!(refused.code, Some(3), "{}", refused.all());
    assert!(
        refused.stderr.contains("msgexchange migrate"),
        "{}",
        refused.all()
    );

    // The older instance stops: the standby takes the lease, migrates, processes.
    traffic(&env, 6, 5).await;
    holder.release().await.expect("release");
    standby.wait_ready(LIMIT).await;
    assert_eq!(schema_version(&pool).await, binary);
    nothing_lost(&env, &vars, 10).await;
    drop(standby);
    pool.close().await;
    env.cleanup().await;
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The previous release's binary, built once by scripts/prev_release.sh and cached.
fn previous_release() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("scripts/prev_release.sh"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("scripts/prev_release.sh");
    assert!(out.status.success(), "scripts/prev_release.sh failed");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bin = PathBuf::from(path.lines().last().unwrap_or_default());
    assert!(
        bin.is_file(),
        "no previous release binary at {}",
        bin.display()
    );
    bin
}

/// The previous release as a service: its compiled-in defaults (a newer config file may hold
/// keys it does not know) under the same `MSGX_*` variables.
fn spawn_previous(bin: &Path, vars: &[(String, String)], name: &str) -> Instance {
    let port = free_port();
    let log = std::fs::File::create(log_dir().join(format!("{name}.log"))).expect("log");
    let child = Command::new(bin)
        .arg("run")
        // Keys newer than the previous release (it refuses unknown keys).
        .envs(
            vars.iter()
                .filter(|(k, _)| k != "MSGX_KAFKA__DELIVERY")
                .cloned(),
        )
        .env("MSGX_HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn the previous release");
    Instance {
        child,
        port,
        name: name.to_string(),
    }
}

/// The documented rolling upgrade with a standby, against the real previous release: it
/// creates its schema and runs active; the new binary starts as a standby and waits; `migrate`
/// (new binary) runs under the active old instance, which keeps processing on the new schema;
/// the old instance stops; the new one takes the lease and processes on the old one's data.
#[tokio::test]
async fn the_previous_release_runs_on_the_new_schema_and_the_new_binary_on_its_data() {
    let prev = previous_release();
    let env = TestEnv::new("upg_prev").await;
    let pool = empty_store(&env).await;
    let vars = service_env(&env, &env.pg_url, &env.my_url, "embedded");
    let old_vars: Vec<(String, String)> = vars
        .iter()
        // Its compiled-in defaults, and no key newer than it (it refuses unknown keys).
        .filter(|(k, _)| k != "MSGEXCHANGE_CONFIG" && k != "MSGX_KAFKA__DELIVERY")
        .cloned()
        .collect();

    let migrated = Command::new(&prev)
        .arg("migrate")
        .envs(old_vars.iter().cloned())
        .output()
        .expect("previous release: migrate");
    assert!(migrated.status.success(), "{migrated:?}");
    let mut old = spawn_previous(&prev, &old_vars, "upgrade-old");
    old.wait_ready(LIMIT).await;
    traffic(&env, 1, 5).await;
    wait_succeeded(&pool, 5, "the old release to process the first rows").await;
    let old_epoch = lease_epoch(&pool).await;

    // The new binary on the standby host: waits for the lease.
    let new = Instance::spawn(&vars, "upgrade-new", &[]);
    wait_for("the new standby", LIMIT, || {
        readyz_says(new.port, "standing by")
    })
    .await;
    // `migrate` with the new binary under the running old instance (a no-op while this
    // release adds no migration; the expand/contract rule is what keeps the old one working).
    let m = cli(&vars, &["migrate"]).await;
    assert_eq!(m.code, Some(0), "{}", m.all());
    assert_eq!(schema_version(&pool).await, schema::binary_version());
    traffic(&env, 6, 5).await;
    wait_succeeded(&pool, 10, "the old release to process on the new schema").await;
    assert!(old.ready().await, "the old release keeps running");
    assert_eq!(lease_epoch(&pool).await, old_epoch, "still the old release");

    // The old instance stops (SIGTERM); the new one takes the lease at once.
    old.signal("-TERM");
    let exit = old
        .exited_within(LIMIT)
        .await
        .expect("the old release stops");
    assert!(exit.success(), "{exit:?}: {}", old.log());
    new.wait_ready(LIMIT).await;
    assert!(
        lease_epoch(&pool).await > old_epoch,
        "the new binary holds it"
    );
    traffic(&env, 11, 5).await;
    nothing_lost(&env, &vars, 15).await;
    drop(new);
    pool.close().await;
    env.cleanup().await;
}
