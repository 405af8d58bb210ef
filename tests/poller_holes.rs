//! Discovery against a real MariaDB inbox and a real PostgreSQL store: gaps from transactions
//! still open, holes from rollbacks, the one-hole-per-round rule, idempotent rounds, and rows
//! whose content must not stop discovery.

mod common;

use std::time::Duration;

use common::TestEnv;
use msgx_core::clock::Clock;

#[tokio::test]
async fn open_transaction_gap_waits_then_enqueues_both_in_order() {
    let env = TestEnv::new("gap").await;
    let cfg = env.poll_cfg(100);
    let (late_tx, late_id) = env.open_insert().await; // smaller id, still open
    let after = env.insert_rows(1).await[0]; // larger id, committed
    assert!(after > late_id);

    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, late_id - 1, "W waits before the gap");
    assert_eq!(
        env.enqueued_ids().await,
        Vec::<i64>::new(),
        "nothing after a young hole"
    );
    let (_, since) = env.cursor().await;
    assert_eq!(since, Some(env.clock.now()));

    env.clock.advance(Duration::from_secs(60));
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, late_id - 1, "still waiting at 1 min");

    late_tx.commit().await.expect("late commit");
    env.clock.advance(Duration::from_secs(1));
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, after);
    assert_eq!(r.enqueued_new, 2);
    assert_eq!(r.advance.filled_after, Some(Duration::from_secs(61)));
    assert_eq!(env.enqueued_ids().await, vec![late_id, after]);
    assert_eq!(env.cursor().await, (after, None));
    env.cleanup().await;
}

#[tokio::test]
async fn rolled_back_insert_is_released_only_after_max_commit_delay_and_only_the_hole() {
    let env = TestEnv::new("rollback").await;
    let cfg = env.poll_cfg(100);
    let first = env.insert_rows(2).await;
    let (tx, hole) = env.open_insert().await;
    tx.rollback().await.expect("rollback");
    let rest = env.insert_rows(3).await;

    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, first[1]);
    assert_eq!(env.enqueued_ids().await, first);

    env.clock.advance(Duration::from_secs(299));
    let r = env.poll(cfg).await;
    assert!(r.advance.released.is_none(), "4m59s: still young");
    assert_eq!(r.advance.w, first[1]);

    env.clock.advance(Duration::from_secs(1));
    let r = env.poll(cfg).await;
    let released = r.advance.released.expect("released at 5m");
    assert_eq!(
        (released.first, released.last),
        (hole, hole),
        "only the hole"
    );
    assert_eq!(r.advance.w, hole);
    assert!(r.poll_again_now(), "a release re-polls at once");

    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, *rest.last().expect("rows"));
    let mut expected = first.clone();
    expected.extend(&rest);
    assert_eq!(
        env.enqueued_ids().await,
        expected,
        "every existing row enqueued"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn one_hole_per_round_and_each_new_hole_gets_its_own_timer() {
    let env = TestEnv::new("holes").await;
    let cfg = env.poll_cfg(100);
    let a = env.insert_rows(1).await[0];
    let (t1, h1) = env.open_insert().await;
    let b = env.insert_rows(1).await[0];
    let (t2, h2) = env.open_insert().await;
    let c = env.insert_rows(1).await[0];
    t1.rollback().await.expect("rb");
    t2.rollback().await.expect("rb");

    env.poll(cfg).await;
    env.clock.advance(Duration::from_secs(300));
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.released.map(|h| h.first), Some(h1));
    assert_eq!(r.advance.w, h1, "one hole per round: h2 untouched");
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, b, "b enqueued, W waits at h2");
    assert!(r.advance.open_hole.is_some());
    let (_, since) = env.cursor().await;
    assert_eq!(
        since,
        Some(env.clock.now()),
        "h2's timer starts when first seen"
    );
    env.clock.advance(Duration::from_secs(299));
    assert!(env.poll(cfg).await.advance.released.is_none());
    env.clock.advance(Duration::from_secs(1));
    assert_eq!(
        env.poll(cfg).await.advance.released.map(|h| h.first),
        Some(h2)
    );
    env.poll(cfg).await;
    assert_eq!(env.enqueued_ids().await, vec![a, b, c]);
    env.cleanup().await;
}

#[tokio::test]
async fn rerunning_a_round_over_the_same_rows_changes_nothing() {
    let env = TestEnv::new("rerun").await;
    let cfg = env.poll_cfg(100);
    let ids = env.insert_rows(5).await;
    env.poll(cfg).await;
    let before: Vec<(i64, chrono::DateTime<chrono::Utc>, String)> =
        sqlx::query_as("SELECT msg_id, enqueued_at, state FROM proc_state ORDER BY msg_id")
            .fetch_all(env.store.pool())
            .await
            .expect("rows");
    assert_eq!(before.len(), 5);

    // Put W back (as after a lost async commit) and re-run over the same rows.
    sqlx::query("UPDATE inbox_cursor SET w = 0")
        .execute(env.store.pool())
        .await
        .expect("rewind");
    env.clock.advance(Duration::from_secs(10));
    let r = env.poll(cfg).await;
    assert_eq!(r.enqueued_new, 0, "conflicts mean already enqueued");
    assert_eq!(r.advance.w, *ids.last().expect("ids"));
    let after: Vec<(i64, chrono::DateTime<chrono::Utc>, String)> =
        sqlx::query_as("SELECT msg_id, enqueued_at, state FROM proc_state ORDER BY msg_id")
            .fetch_all(env.store.pool())
            .await
            .expect("rows");
    assert_eq!(before, after);

    // A round with nothing new writes nothing either.
    let r = env.poll(cfg).await;
    assert_eq!((r.read, r.enqueued_new), (0, 0));
    env.cleanup().await;
}

#[tokio::test]
async fn full_batches_repoll_and_w_follows_batch_by_batch() {
    let env = TestEnv::new("batch").await;
    let cfg = env.poll_cfg(3);
    let ids = env.insert_rows(7).await;
    let r = env.poll(cfg).await;
    assert!(r.batch_full && r.poll_again_now());
    assert_eq!(r.advance.w, ids[2]);
    assert_eq!(
        r.inbox_head,
        Some(ids[6]),
        "a full batch asks the inbox head for lag"
    );
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, ids[5]);
    let r = env.poll(cfg).await;
    assert!(!r.batch_full);
    assert_eq!(r.advance.w, ids[6]);
    assert_eq!(r.lag, Some(Duration::ZERO));
    env.cleanup().await;
}

#[tokio::test]
async fn row_content_never_stops_discovery() {
    let env = TestEnv::new("content").await;
    let cfg = env.poll_cfg(100);
    let huge = "X".repeat(5 * 1024 * 1024);
    sqlx::query("SET SESSION sql_mode = ''")
        .execute(&env.owner)
        .await
        .ok();
    let mut conn = env.owner.acquire().await.expect("conn");
    sqlx::query("SET SESSION sql_mode = ''")
        .execute(&mut *conn)
        .await
        .expect("mode");
    for (recv, msg) in [
        (None, Some("<MSG/>")),                                // NULL receive time
        (Some("2026-11-30 09:30:00"), None),                   // NULL message
        (Some("0000-00-00 00:00:00"), Some("not xml at all")), // zero date
        (Some("2026-11-30 09:30:01"), Some(huge.as_str())),    // 5 MiB message
    ] {
        sqlx::query(
            "INSERT INTO CMINMSGS (CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES (?, ?)",
        )
        .bind(recv)
        .bind(msg)
        .execute(&mut *conn)
        .await
        .expect("insert odd row");
    }
    drop(conn);
    let r = env.poll(cfg).await;
    assert_eq!(r.enqueued_new, 4);
    let rows: Vec<(i64, Option<chrono::DateTime<chrono::Utc>>)> =
        sqlx::query_as("SELECT msg_id, received_at FROM proc_state ORDER BY msg_id")
            .fetch_all(env.store.pool())
            .await
            .expect("rows");
    assert_eq!(rows[0].1, None);
    assert_eq!(
        rows[1].1.map(|t| t.to_rfc3339()),
        Some("2026-11-30T01:30:00+00:00".to_string()),
        "DATETIME read as Asia/Shanghai local time"
    );
    assert_eq!(
        rows[2].1, None,
        "a zero date is stored as NULL, not an error"
    );
    assert!(rows[3].1.is_some());
    env.cleanup().await;
}
