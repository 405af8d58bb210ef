//! The single-instance lease with a fencing token (SPEC §8): an instance whose lock session
//! died keeps its other connections, but once a newer instance has taken the lock, every write
//! it attempts fails (SQLSTATE MXFEN) and changes nothing; the newer one writes; tools without
//! a lease are not fenced.

use msgx_testkit as common;

use msgx_core::cutover::CutoverMode;

use chrono::{DateTime, Utc};
use common::seed::{self, Proc};
use common::TestEnv;
use msgx_core::clock::Clock;
use msgx_core::pump::ErrorClass;
use msgx_core::store::{InstanceLock, LeaseConfig, Store, StoreError};

async fn fenced_store(env: &TestEnv, lock: &InstanceLock) -> Store {
    Store::connect(&env.settings(&[]).store)
        .await
        .expect("store")
        .fenced(lock.epoch())
        .await
        .expect("fenced")
}

/// One message's attempt stamp as the pump stamps a group: the attempt number it got.
async fn stamp(store: &Store, msg_id: i64, now: DateTime<Utc>) -> Result<Option<i32>, StoreError> {
    let stamped = store.stamp_attempts(&[msg_id], now).await?;
    Ok(stamped.first().map(|s| s.1))
}

async fn attempts(env: &TestEnv, msg_id: i64) -> i32 {
    env.scalar_for("SELECT attempts FROM proc_state WHERE msg_id = $1", msg_id)
        .await
}

#[tokio::test]
async fn a_stale_instance_cannot_write_after_a_newer_one_took_the_lock() {
    let env = TestEnv::new("lease_fence").await;
    let now = env.clock.now();
    seed::procs(&env, [Proc::pending(1, now), Proc::pending(2, now)]).await;

    let lock_a = acquire(&env).await.expect("lock a");
    let store_a = fenced_store(&env, &lock_a).await;
    assert_eq!(stamp(&store_a, 1, now).await.expect("a writes"), Some(1));

    // A's lock session dies (network cut, pg_terminate_backend); its pools live on.
    env.exec("SELECT pg_terminate_backend(backend_pid) FROM instance_lease")
        .await;
    // Half a ttl without a renewal from a session that is gone: taken over before expiry.
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    let lock_b = acquire(&env).await.expect("lock b");
    assert_eq!(lock_b.epoch(), lock_a.epoch() + 1);
    let store_b = fenced_store(&env, &lock_b).await;

    // The takeover ended A's sessions (their open transactions roll back); A's pools
    // reconnect with the old epoch, and every kind of write of A fails as fenced and changes
    // nothing.
    for _ in 0..3 {
        let _ = stamp(&store_a, 1, now).await;
        let _ = store_a
            .seed_cutover(
                &seed::watermark_only(CutoverMode::Id(5), 5, now),
                now,
                &seed::TEST_SEEDING,
            )
            .await;
    }
    let stamped = stamp(&store_a, 1, now).await.expect_err("fenced");
    assert!(stamped.is_fenced(), "{stamped}");
    // A group's write (the pump's outcome path) too.
    let mut group = store_a.begin_group().await.expect("begin");
    let failed = group
        .mark_failed(1, ErrorClass::Infra, "stale instance", now, now)
        .await
        .expect_err("fenced");
    assert!(failed.is_fenced(), "{failed}");
    drop(group);
    let seed = store_a
        .seed_cutover(
            &seed::watermark_only(CutoverMode::Id(5), 5, now),
            now,
            &seed::TEST_SEEDING,
        )
        .await
        .expect_err("fenced");
    assert!(seed.is_fenced(), "{seed}");
    assert_eq!(
        attempts(&env, 1).await,
        1,
        "the stale stamp changed nothing"
    );
    assert!(lock_a.check().await.is_err(), "A sees it lost the lock");

    // B writes; a tool without a lease is not fenced.
    assert_eq!(stamp(&store_b, 1, now).await.expect("b writes"), Some(2));
    assert_eq!(stamp(&env.store, 2, now).await.expect("tool"), Some(1));
    assert!(lock_b.check().await.is_ok());

    // An epoch moved behind B's back (a newer instance whose lock B still sees) also fails
    // B's check and fences its writes.
    env.exec("UPDATE instance_lease SET epoch = epoch + 1")
        .await;
    assert!(lock_b.check().await.is_err());
    assert!(stamp(&store_b, 1, now)
        .await
        .expect_err("fenced")
        .is_fenced());
    store_a.pool().close().await;
    store_b.pool().close().await;
    env.cleanup().await;
}

/// A lease on this env's store with the quick settings.
async fn acquire(env: &TestEnv) -> Result<InstanceLock, StoreError> {
    InstanceLock::acquire_with(&env.store, quick()).await
}

fn quick() -> LeaseConfig {
    LeaseConfig {
        ttl: std::time::Duration::from_millis(1500),
        check_timeout: std::time::Duration::from_secs(1),
    }
}

/// A frozen holder (alive session, no renewals) is taken over once its lease expired; a live
/// holder is not; a released lease is free at once.
#[tokio::test]
async fn a_frozen_holder_is_taken_over_after_the_ttl_and_a_released_lease_at_once() {
    let env = TestEnv::new("lease_ttl").await;
    let a = acquire(&env).await.expect("a");
    // A renews: B stands by.
    a.check().await.expect("renew");
    let refused = acquire(&env).await.expect_err("held");
    assert!(matches!(refused, StoreError::InstanceLocked), "{refused}");
    // A freezes (stops renewing, keeps its session): after the ttl B takes over.
    tokio::time::sleep(std::time::Duration::from_millis(1700)).await;
    let b = acquire(&env).await.expect("b takes over");
    assert_eq!(b.epoch(), a.epoch() + 1);
    // A wakes up: its renewal says it was taken over (it must stop).
    let lost = a.check().await.expect_err("taken over");
    assert!(matches!(lost, StoreError::LeaseTakenOver { .. }), "{lost}");
    // B shuts down gracefully: C gets the lease at once, without waiting for the ttl.
    b.release().await.expect("release");
    // A renewal that fires after the release (the supervisor still ticking) renews nothing.
    b.check().await.expect("no-op after release");
    let c = acquire(&env).await.expect("c at once");
    assert_eq!(c.epoch(), b.epoch() + 1);
    c.release().await.expect("release c");
    env.cleanup().await;
}

/// A lease row edited by hand makes the holder refuse to act and a standby refuse to take it.
#[tokio::test]
async fn a_lease_row_edited_by_hand_is_refused() {
    let env = TestEnv::new("lease_tamper").await;
    let a = acquire(&env).await.expect("a");
    env.exec("UPDATE instance_lease SET expires_at = now() + interval '30 days'")
        .await;
    let standby = acquire(&env).await.expect_err("refused");
    assert!(matches!(standby, StoreError::LeaseTampered(_)), "{standby}");
    env.exec("UPDATE instance_lease SET holder = 'someone:1'")
        .await;
    let held = a.check().await.expect_err("refuse to act");
    assert!(matches!(held, StoreError::LeaseTampered(_)), "{held}");
    env.exec("DELETE FROM instance_lease").await;
    let gone = acquire(&env).await.expect_err("no row");
    assert!(matches!(gone, StoreError::LeaseTampered(_)), "{gone}");
    env.cleanup().await;
}

/// Our sessions carry the statement/lock/idle-in-transaction timeouts of `[store]`.
#[tokio::test]
async fn store_sessions_carry_the_configured_timeouts() {
    let env = TestEnv::new("lease_timeouts").await;
    let store = Store::connect(
        &env.settings(&[
            ("MSGX_STORE__STATEMENT_TIMEOUT", "7s"),
            ("MSGX_STORE__LOCK_TIMEOUT", "3s"),
            ("MSGX_STORE__IDLE_IN_TRANSACTION_TIMEOUT", "11s"),
        ])
        .store,
    )
    .await
    .expect("store");
    let got: (String, String, String) = sqlx::query_as(
        "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), \
         current_setting('idle_in_transaction_session_timeout')",
    )
    .fetch_one(store.pool())
    .await
    .expect("settings");
    assert_eq!(got, ("7s".into(), "3s".into(), "11s".into()));
    // A statement over the limit fails instead of hanging.
    let slow = Store::connect(
        &env.settings(&[
            ("MSGX_STORE__STATEMENT_TIMEOUT", "300ms"),
            ("MSGX_STORE__LOCK_TIMEOUT", "100ms"),
        ])
        .store,
    )
    .await
    .expect("store");
    let err = sqlx::query("SELECT pg_sleep(2)")
        .execute(slow.pool())
        .await
        .expect_err("timed out");
    assert!(err.to_string().contains("statement timeout"), "{err}");
    store.pool().close().await;
    slow.pool().close().await;
    env.cleanup().await;
}

/// A renewal that hangs (the lease row locked by someone else) fails after
/// `lease.check_timeout` instead of blocking the supervisor; once the lock is gone the lease
/// renews again from a fresh session.
#[tokio::test]
async fn a_hanging_renewal_times_out_and_the_next_one_succeeds() {
    let env = TestEnv::new("lease_hang").await;
    let a = acquire(&env).await.expect("a");
    let mut tx = env.store.pool().begin().await.expect("begin");
    sqlx::query("LOCK TABLE instance_lease IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .expect("lock");
    let started = std::time::Instant::now();
    let err = a.check().await.expect_err("times out");
    assert!(matches!(err, StoreError::LeaseTimeout(_)), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(3));
    tx.rollback().await.expect("unlock");
    a.check().await.expect("renews again");
    env.cleanup().await;
}

/// The inbox sessions carry the MySQL read/write timeouts and the InnoDB lock wait.
#[tokio::test]
async fn inbox_sessions_carry_the_configured_timeouts() {
    let env = TestEnv::new("inbox_timeouts").await;
    let s = env.settings(&[
        ("MSGX_INBOX__READ_TIMEOUT", "17s"),
        ("MSGX_INBOX__WRITE_TIMEOUT", "19s"),
        ("MSGX_INBOX__QUERY_TIMEOUT", "4500ms"),
    ]);
    let inbox =
        msgx_core::inbox::Inbox::new(&s.inbox, s.inbox_names(), s.inbox_timezone()).expect("inbox");
    let got: (u64, u64, u64) = sqlx::query_as(
        "SELECT @@SESSION.net_read_timeout, @@SESSION.net_write_timeout, \
         @@SESSION.innodb_lock_wait_timeout",
    )
    .fetch_one(inbox.pool())
    .await
    .expect("variables");
    assert_eq!(got, (17, 19, 5));
    inbox.pool().close().await;
    env.cleanup().await;
}

/// A frozen holder is taken over; thawed, it sees the newer epoch and stops with exit 1 —
/// and nothing panics on the way out, even with a statement in flight: its inbox poller is
/// blocked on a table lock the DB owner holds, so a pooled connection is still checked out
/// when the process ends (sqlx hands such a connection back by spawning a task, which
/// panicked outside the runtime: "this functionality requires a Tokio context").
#[tokio::test]
async fn a_thawed_old_holder_exits_1_without_a_panic() {
    use common::service::{free_port, spawn_service_logging, wait_for};
    use sqlx::Connection as _;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    let env = TestEnv::new("lease_exit").await;
    env.insert_rows(3).await;
    let log = std::env::temp_dir().join(format!("msgx-lease-exit-{}.log", std::process::id()));
    let spawn = |stderr: Stdio| {
        let lease = [
            ("MSGX_INBOX__QUERY_TIMEOUT", "30s"),
            ("MSGX_LEASE__TTL", "3s"),
            ("MSGX_LEASE__RENEW_EVERY", "500ms"),
            ("MSGX_LEASE__CHECK_TIMEOUT", "1s"),
            ("MSGX_LEASE__STANDBY", "true"),
            ("MSGX_OUTBOUND__SCHEDULE_REQUEST_AT", ""),
        ];
        spawn_service_logging(&env, &lease, free_port(), stderr)
    };
    let epoch = || async {
        sqlx::query_scalar::<_, i64>("SELECT epoch FROM instance_lease WHERE id = 1")
            .fetch_optional(env.store.pool())
            .await
            .expect("lease")
    };
    let mut a = spawn(std::fs::File::create(&log).expect("log").into());
    wait_for(
        "A to finish the inbox rows",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM proc_state WHERE terminal_at IS NOT NULL",
            )
            .fetch_one(env.store.pool())
            .await
            .is_ok_and(|n| n == 3)
        },
    )
    .await;
    let a_epoch = epoch().await.expect("A holds the lease");

    // The DB owner locks the inbox table: A's next poll round waits on it, connection held.
    let mut owner = sqlx::MySqlConnection::connect(&env.my_url)
        .await
        .expect("owner connection");
    sqlx::raw_sql("LOCK TABLES CMINMSGS WRITE")
        .execute(&mut owner)
        .await
        .expect("lock tables");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let kill = |sig: &str, pid: u32| {
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill {sig}");
    };
    kill("-STOP", a.id());
    let mut b = spawn(Stdio::null());
    wait_for("B to take the lease", Duration::from_secs(20), || async {
        epoch().await.is_some_and(|e| e > a_epoch)
    })
    .await;
    kill("-CONT", a.id());
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = a.try_wait().expect("a") {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the thawed holder did not stop (log: {})",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stderr = std::fs::read_to_string(&log).expect("A's log");
    assert_eq!(
        status.code(),
        Some(1),
        "exit 1 on lease loss; log:\n{stderr}"
    );
    assert!(stderr.contains("single-instance lock lost"), "{stderr}");
    assert!(
        !stderr.contains("panicked"),
        "A panicked on the way out:\n{stderr}"
    );

    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut owner)
        .await
        .expect("unlock");
    let _ = owner.close().await;
    let _ = b.kill();
    let _ = b.wait();
    let _ = std::fs::remove_file(&log);
    env.cleanup().await;
}
