//! Durability of discovery (seed §4 rows 1–2): the hole timer survives restarts, including
//! `kill -9` of the real binary; an unreadable inbox keeps W; W never passes an existing row
//! that is not enqueued, whatever instant the process dies at.

use msgx_testkit as common;

use std::time::Duration;

use common::process::exit_status;
use common::service::{free_port, kill9, spawn_service, wait_for};
use common::TestEnv;
use msgx_core::clock::Clock;
use msgx_core::inbox::Inbox;
use msgx_core::poller::{poll_once, PollError};

#[tokio::test]
async fn restart_in_the_middle_of_a_hole_keeps_hole_since() {
    let (env, cfg) = TestEnv::polling("restart", 100).await;
    env.insert_rows(1).await;
    let (tx, hole) = env.open_insert().await;
    tx.rollback().await.expect("rollback");
    env.insert_rows(1).await;
    env.poll(cfg).await;
    let (_, since) = env.cursor().await;
    let since = since.expect("hole timer started");

    // "Restart": a brand-new adapter and store handle, nothing kept in memory.
    let settings = env.settings(&[]);
    let store2 = msgx_core::store::Store::connect(&settings.store)
        .await
        .expect("store");
    let inbox2 = Inbox::new(&settings.inbox, &env.names, env.tz).expect("inbox");
    env.clock.advance(Duration::from_secs(200));
    let r = poll_once(&inbox2, &store2, &env.clock, cfg)
        .await
        .expect("round");
    assert!(r.advance.released.is_empty());
    assert_eq!(
        env.cursor().await.1,
        Some(since),
        "HOLE_SINCE kept across the restart"
    );
    env.clock.advance(Duration::from_secs(100));
    let r = poll_once(&inbox2, &store2, &env.clock, cfg)
        .await
        .expect("round");
    assert_eq!(
        r.advance.first_released().map(|h| h.first),
        Some(hole),
        "released 5m after the first sighting, not 5m after the restart"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn unreadable_inbox_keeps_w_and_is_an_error() {
    let (env, cfg) = TestEnv::polling("unreadable", 100).await;
    let ids = env.insert_rows(3).await;
    env.poll(cfg).await;
    let w = env.cursor().await.0;
    assert_eq!(w, ids[2]);
    env.insert_rows(2).await;

    // The DB owner renames the table: a failed round, never "no new messages".
    sqlx::query("RENAME TABLE CMINMSGS TO CMINMSGS_AWAY")
        .execute(&env.owner)
        .await
        .expect("rename");
    let err = poll_once(&env.inbox, &env.store, &env.clock, cfg)
        .await
        .expect_err("must fail");
    assert!(matches!(err, PollError::Inbox(_)), "{err}");
    assert_eq!(err.stage(), "inbox");
    assert_eq!(env.cursor().await.0, w);

    // The inbox server unreachable (nothing listens there): same.
    let mut settings = env.settings(&[("MSGX_INBOX__CONNECT_TIMEOUT", "300ms")]);
    settings.inbox.connect.url = "mysql://root@127.0.0.1:1/none".into();
    let dead = Inbox::new(&settings.inbox, &env.names, env.tz).expect("lazy adapter");
    let err = poll_once(&dead, &env.store, &env.clock, cfg)
        .await
        .expect_err("must fail");
    assert!(matches!(err, PollError::Inbox(_)), "{err}");
    assert_eq!(env.cursor().await.0, w);

    // Back: discovery resumes where it stood.
    sqlx::query("RENAME TABLE CMINMSGS_AWAY TO CMINMSGS")
        .execute(&env.owner)
        .await
        .expect("rename back");
    let r = env.poll(cfg).await;
    assert_eq!(r.enqueued_new, 2);
    assert_eq!(env.enqueued_ids().await.len(), 5);
    env.cleanup().await;
}

#[tokio::test]
async fn a_second_writer_moving_w_is_refused() {
    let (env, cfg) = TestEnv::polling("cas", 100).await;
    env.insert_rows(2).await;
    env.poll(cfg).await;
    env.insert_rows(2).await;
    let stale = env.store.read_cursor().await.expect("cursor").cursor;
    // Another writer moves W first; our commit with the stale expectation must fail.
    env.exec("UPDATE inbox_cursor SET w = w + 1").await;
    let err = env
        .store
        .commit_round(msgx_core::store::RoundWrite {
            expected_w: stale.w,
            cursor: msgx_core::watermark::Cursor {
                w: stale.w + 2,
                hole_since: None,
            },
            rows: &[],
            now: env.clock.now(),
            async_commit: false,
            holes: &[],
            released: &[],
            watch_until: env.clock.now(),
        })
        .await
        .expect_err("stale W refused");
    assert!(err.to_string().contains("moved concurrently"), "{err}");
    env.cleanup().await;
}

#[tokio::test]
async fn kill_9_mid_hole_keeps_the_timer_and_the_watermark() {
    let env = TestEnv::new("kill_hole").await;
    let ids = env.insert_rows(3).await;
    let (tx, _hole) = env.open_insert().await;
    env.insert_rows(2).await;

    let mut svc = spawn_service(
        &env,
        &[("MSGX_PIPELINE__MAX_COMMIT_DELAY", "1h")],
        free_port(),
    );
    wait_for("hole observed", Duration::from_secs(30), || async {
        env.cursor().await.1.is_some()
    })
    .await;
    let (w, since) = env.cursor().await;
    assert_eq!(w, ids[2]);
    kill9(&mut svc);

    let mut svc = spawn_service(
        &env,
        &[("MSGX_PIPELINE__MAX_COMMIT_DELAY", "1h")],
        free_port(),
    );
    tokio::time::sleep(Duration::from_millis(800)).await; // many 50 ms rounds
    assert_eq!(
        env.cursor().await,
        (w, since),
        "same W, same HOLE_SINCE after kill -9"
    );
    tx.commit().await.expect("late commit");
    wait_for("hole filled", Duration::from_secs(30), || async {
        env.cursor().await == (ids[2] + 3, None)
    })
    .await;
    assert_eq!(env.enqueued_ids().await.len(), 6);
    kill9(&mut svc);
    env.cleanup().await;
}

#[tokio::test]
async fn kill_9_at_random_points_never_lets_w_pass_an_unenqueued_row() {
    let env = TestEnv::new("kill_load").await;
    // A steady upstream with holds and no rollbacks: every id ≤ W must be enqueued.
    let writer = {
        let owner = env.owner.clone();
        tokio::spawn(async move {
            for i in 0..3000u32 {
                let mut tx = owner.begin().await.expect("begin");
                sqlx::query("INSERT INTO CMINMSGS (CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES (NOW(), '<MSG/>')")
                    .execute(&mut *tx)
                    .await
                    .expect("insert");
                // Paced so the writer outlasts the six kill windows (≈ 3 s of pauses plus the
                // inserts): each kill lands while discovery still has rows to catch up on.
                if i % 97 == 0 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tx.commit().await.expect("commit");
            }
        })
    };
    let mut rng_state = 0x9e37_79b9u64;
    let mut watermarks = Vec::new();
    for round in 0..6 {
        let port = free_port();
        let mut svc = spawn_service(
            &env,
            &[
                ("MSGX_PIPELINE__CLAIM_BATCH", "50"),
                ("MSGX_PIPELINE__ASYNC_ENQUEUE_COMMIT", "true"),
            ],
            port,
        );
        // The random window starts when the service is up, not at the spawn: on a loaded
        // host the start alone can outlast the window, and a kill before the first poll
        // lands nowhere (seen: W unmoved in four of six rounds while other builds ran).
        wait_for("service ready", Duration::from_secs(30), || async {
            common::http::get(port, "/readyz")
                .await
                .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
        })
        .await;
        rng_state = rng_state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let run_ms = 300 + (rng_state >> 33) % 700;
        tokio::time::sleep(Duration::from_millis(run_ms)).await;
        kill9(&mut svc);
        check_no_row_passed(&env, round).await;
        watermarks.push(env.cursor().await.0);
    }
    // The kills really landed while discovery was moving.
    assert!(
        watermarks.windows(2).filter(|p| p[1] > p[0]).count() >= 3,
        "{watermarks:?}"
    );
    writer.await.expect("writer");
    // A final run drains everything.
    let mut svc = spawn_service(&env, &[], free_port());
    let total: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM CMINMSGS")
        .fetch_one(&env.owner)
        .await
        .expect("count");
    wait_for("drain", Duration::from_secs(60), || async {
        env.enqueued_ids().await.len() as i64 == total
    })
    .await;
    kill9(&mut svc);
    check_no_row_passed(&env, 99).await;
    env.cleanup().await;
}

async fn check_no_row_passed(env: &TestEnv, round: u32) {
    let (w, _) = env.cursor().await;
    let inbox_ids: Vec<i64> = sqlx::query_scalar(
        "SELECT CMINMSGS_ID FROM CMINMSGS WHERE CMINMSGS_ID <= ? ORDER BY CMINMSGS_ID",
    )
    .bind(w)
    .fetch_all(&env.owner)
    .await
    .expect("inbox ids");
    let enqueued: std::collections::BTreeSet<i64> = env.enqueued_ids().await.into_iter().collect();
    for id in inbox_ids {
        assert!(
            enqueued.contains(&id),
            "round {round}: W={w} passed row {id} that is not enqueued"
        );
    }
}

#[tokio::test]
async fn a_lost_lease_session_is_renewed_but_a_takeover_stops_the_service() {
    let env = TestEnv::new("lock_lost").await;
    env.insert_rows(2).await;
    let mut svc = spawn_service(&env, &[], free_port());
    let lease_pid = || async {
        sqlx::query_scalar::<_, Option<i32>>("SELECT backend_pid FROM instance_lease")
            .fetch_one(env.store.pool())
            .await
            .expect("lease")
    };
    wait_for("lease taken", Duration::from_secs(30), || async {
        lease_pid().await.is_some()
    })
    .await;
    // The renewing session dies (network cut, pg_terminate_backend): a transient failure,
    // the service reconnects and renews.
    let pid = lease_pid().await.expect("holder");
    env.exec_for("SELECT pg_terminate_backend($1)", pid).await;
    wait_for(
        "renewed from a new session",
        Duration::from_secs(10),
        || async { lease_pid().await.is_some_and(|p| p != pid) },
    )
    .await;
    assert!(svc.try_wait().expect("wait").is_none(), "still running");
    // Another instance takes the lease over (as after a freeze): this one must stop.
    sqlx::query(
        "UPDATE instance_lease SET epoch = epoch + 1, holder = 'elsewhere:1#0', \
         expires_at = now() + interval '10 seconds', backend_pid = NULL",
    )
    .execute(env.store.pool())
    .await
    .expect("take over");
    let late = "service kept running without its lock";
    let status = exit_status(&mut svc, Duration::from_secs(20), late).await;
    assert!(
        !status.success(),
        "exits non-zero so the process manager restarts it"
    );
    env.cleanup().await;
}
