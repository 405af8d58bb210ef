//! `msgexchange migrate` under the running previous release (docs/operations.md, "Rolling
//! upgrade with a standby", migrate first): a migration that alters a table the old pump is
//! writing takes its locks in the other order than the pump's group, PostgreSQL breaks the
//! deadlock by cancelling one of them, and when that is the migration it runs again instead of
//! failing the command (the cause of a flaky rolling-upgrade test, 2026-12-07).

use std::time::Duration;

use msgx_core::store::schema;
use msgx_testkit as common;
use sqlx::Connection;

/// The migration that drops `msg_event`'s foreign key to `proc_state` (0020): it locks
/// `msg_event`, then `proc_state`.
const FK_MIGRATION: i64 = 20;

/// Sessions of this database waiting for a lock while running the FK migration's statement.
async fn migration_waits_for_a_lock(pool: &sqlx::PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND query LIKE '%DROP CONSTRAINT IF EXISTS msg_event_msg_id_fkey%'",
    )
    .fetch_one(pool)
    .await
    .unwrap_or(false)
}

#[tokio::test]
async fn a_migration_that_loses_a_deadlock_to_the_running_pump_runs_again() {
    let (url, pool) = super::empty_database("migrate_deadlock").await;
    super::migrate_up_to(&pool, FK_MIGRATION - 1).await;

    // The previous release's pump in the middle of a group: its members' `proc_state` rows
    // written, their events next. A long deadlock_timeout here makes PostgreSQL's check run in
    // the migration's session (waiting first, checked after the default 1 s), so the migration
    // is the one cancelled, every time.
    let mut pump = sqlx::PgConnection::connect(&url)
        .await
        .expect("pump session");
    sqlx::query("SET deadlock_timeout = '60s'")
        .execute(&mut pump)
        .await
        .expect("deadlock_timeout");
    let mut group = pump.begin().await.expect("begin");
    sqlx::query("LOCK TABLE proc_state IN ROW EXCLUSIVE MODE")
        .execute(&mut *group)
        .await
        .expect("the group's proc_state write");

    let store = url.clone();
    let migrate = tokio::task::spawn_blocking(move || {
        super::msgx(
            &["migrate"],
            &[("MSGX_STORE__URL", &store), ("MSGX_LOG__LEVEL", "warn")],
        )
    });
    common::service::wait_for(
        "the FK migration to wait for the group's lock on proc_state",
        Duration::from_secs(30),
        || migration_waits_for_a_lock(&pool),
    )
    .await;
    // The group's event insert: waits for the migration's lock on msg_event — a cycle, which
    // PostgreSQL breaks by cancelling the migration; then this lock is granted.
    sqlx::query("LOCK TABLE msg_event IN ROW EXCLUSIVE MODE")
        .execute(&mut *group)
        .await
        .expect("the group's msg_event write (the migration lost the deadlock)");
    // The migration's second attempt waits behind the group, as any statement would.
    common::service::wait_for(
        "the FK migration's second attempt to wait for the group",
        Duration::from_secs(30),
        || migration_waits_for_a_lock(&pool),
    )
    .await;
    group.commit().await.expect("the group commits");

    let out = migrate.await.expect("migrate ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let binary = schema::binary_version();
    for v in FK_MIGRATION..=binary {
        assert!(
            stdout.contains(&format!("applied migration {v}\n")),
            "{stdout}"
        );
    }
    assert_eq!(
        stderr.matches("lost a deadlock").count(),
        1,
        "one retry, said once: {stderr}"
    );
    let state = schema::schema_state(&pool).await.expect("schema state");
    assert_eq!(state, schema::SchemaState::Current { version: binary });
    let fk: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_constraint WHERE conname = 'msg_event_msg_id_fkey'",
    )
    .fetch_one(&pool)
    .await
    .expect("constraints");
    assert_eq!(fk, 0, "the FK migration applied");
    pool.close().await;
    pump.close().await.expect("close");
    super::drop_empty_database("migrate_deadlock").await;
}
