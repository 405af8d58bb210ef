//! The single-instance lease with a fencing token (SPEC §8): an instance whose lock session
//! died keeps its other connections, but once a newer instance has taken the lock, every write
//! it attempts fails (SQLSTATE MXFEN) and changes nothing; the newer one writes; tools without
//! a lease are not fenced.

mod common;

use common::TestEnv;
use msgx_core::clock::Clock;
use msgx_core::store::{InstanceLock, Store};

async fn fenced_store(env: &TestEnv, lock: &InstanceLock) -> Store {
    Store::connect(&env.settings(&[]).store)
        .await
        .expect("store")
        .fenced(lock.epoch())
        .await
        .expect("fenced")
}

async fn attempts(env: &TestEnv, msg_id: i64) -> i32 {
    sqlx::query_scalar("SELECT attempts FROM proc_state WHERE msg_id = $1")
        .bind(msg_id)
        .fetch_one(env.store.pool())
        .await
        .expect("attempts")
}

#[tokio::test]
async fn a_stale_instance_cannot_write_after_a_newer_one_took_the_lock() {
    let env = TestEnv::new("lease_fence").await;
    let now = env.clock.now();
    sqlx::query("INSERT INTO proc_state (msg_id, enqueued_at) VALUES (1, $1), (2, $1)")
        .bind(now)
        .execute(env.store.pool())
        .await
        .expect("rows");

    let lock_a = InstanceLock::acquire(&env.store).await.expect("lock a");
    let store_a = fenced_store(&env, &lock_a).await;
    assert_eq!(
        store_a.stamp_attempt(1, now).await.expect("a writes"),
        Some(1)
    );

    // A's lock session dies (network cut, pg_terminate_backend); its pools live on.
    sqlx::query(
        "SELECT pg_terminate_backend(l.pid) FROM pg_locks l JOIN pg_database d \
           ON d.oid = l.database \
         WHERE l.locktype = 'advisory' AND l.granted AND d.datname = $1",
    )
    .bind(&env.db)
    .execute(env.store.pool())
    .await
    .expect("terminate");
    let lock_b = InstanceLock::acquire(&env.store).await.expect("lock b");
    assert_eq!(lock_b.epoch(), lock_a.epoch() + 1);
    let store_b = fenced_store(&env, &lock_b).await;

    // Every kind of write of A fails as fenced and changes nothing.
    let stamp = store_a.stamp_attempt(1, now).await.expect_err("fenced");
    assert!(stamp.is_fenced(), "{stamp}");
    let bind = store_a
        .bind_identity(1, "AODB|FLOP|UPDT|1")
        .await
        .expect_err("fenced");
    assert!(bind.is_fenced(), "{bind}");
    let seed = store_a.seed_cursor(5, now).await.expect_err("fenced");
    assert!(seed.is_fenced(), "{seed}");
    assert_eq!(
        attempts(&env, 1).await,
        1,
        "the stale stamp changed nothing"
    );
    assert!(lock_a.check().await.is_err(), "A sees it lost the lock");

    // B writes; a tool without a lease is not fenced.
    assert_eq!(
        store_b.stamp_attempt(1, now).await.expect("b writes"),
        Some(2)
    );
    assert_eq!(
        env.store.stamp_attempt(2, now).await.expect("tool"),
        Some(1)
    );
    assert!(lock_b.check().await.is_ok());

    // An epoch moved behind B's back (a newer instance whose lock B still sees) also fails
    // B's check and fences its writes.
    sqlx::query("UPDATE instance_lease SET epoch = epoch + 1")
        .execute(env.store.pool())
        .await
        .expect("bump");
    assert!(lock_b.check().await.is_err());
    assert!(store_b
        .stamp_attempt(1, now)
        .await
        .expect_err("fenced")
        .is_fenced());
    store_a.pool().close().await;
    store_b.pool().close().await;
    env.cleanup().await;
}
