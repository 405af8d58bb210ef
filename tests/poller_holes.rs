//! Discovery against a real MariaDB inbox and a real PostgreSQL store: gaps from transactions
//! still open, holes from rollbacks, the one-hole-per-round rule, idempotent rounds, and rows
//! whose content must not stop discovery.

use msgx_testkit as common;

use std::time::Duration;

use common::TestEnv;
use msgx_core::clock::Clock;
use msgx_core::poller::{poll_once, PollReport};

/// The spans a round released, in order.
fn released_spans(r: &PollReport) -> Vec<(i64, i64)> {
    r.advance
        .released
        .iter()
        .map(|h| (h.first, h.last))
        .collect()
}

#[tokio::test]
async fn open_transaction_gap_waits_then_enqueues_both_in_order() {
    let (env, cfg) = TestEnv::polling("gap", 100).await;
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
    assert_eq!(
        r.advance.fills.first().copied(),
        Some(Duration::from_secs(61))
    );
    assert_eq!(env.enqueued_ids().await, vec![late_id, after]);
    assert_eq!(env.cursor().await, (after, None));
    env.cleanup().await;
}

#[tokio::test]
async fn rolled_back_insert_is_released_only_after_max_commit_delay_and_only_the_hole() {
    let (env, cfg) = TestEnv::polling("rollback", 100).await;
    let first = env.insert_rows(2).await;
    let (tx, hole) = env.open_insert().await;
    tx.rollback().await.expect("rollback");
    let rest = env.insert_rows(3).await;

    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, first[1]);
    assert_eq!(env.enqueued_ids().await, first);

    env.clock.advance(Duration::from_secs(299));
    let r = env.poll(cfg).await;
    assert!(r.advance.released.is_empty(), "4m59s: still young");
    assert_eq!(r.advance.w, first[1]);

    env.clock.advance(Duration::from_secs(1));
    let r = env.poll(cfg).await;
    let released = r.advance.first_released().expect("released at 5m");
    assert_eq!(
        (released.first, released.last),
        (hole, hole),
        "only the hole"
    );
    assert_eq!(
        r.advance.w,
        *rest.last().expect("rows"),
        "W walks on over the rows after the hole in the same round"
    );
    assert!(r.poll_again_now(), "a release re-polls at once");
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
async fn holes_seen_together_age_side_by_side_and_are_released_in_one_round() {
    let (env, cfg) = TestEnv::polling("holes", 100).await;
    let (a, t1, h1) = env.row_then_open_insert().await;
    let (b, t2, h2) = env.row_then_open_insert().await;
    let c = env.insert_rows(1).await[0];
    t1.rollback().await.expect("rb");
    t2.rollback().await.expect("rb");

    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, a);
    assert_eq!(r.advance.holes.len(), 2, "both holes are sighted now");
    env.clock.advance(Duration::from_secs(299));
    assert!(env.poll(cfg).await.advance.released.is_empty());
    env.clock.advance(Duration::from_secs(1));
    let r = env.poll(cfg).await;
    assert_eq!(
        released_spans(&r),
        vec![(h1, h1), (h2, h2)],
        "one delay for both"
    );
    assert_eq!(r.advance.w, c);
    assert_eq!(env.enqueued_ids().await, vec![a, b, c]);
    assert_eq!(env.cursor().await, (c, None));
    for id in [h1, h2] {
        assert!(env.late_watch_entry(id).await.expect("watch").is_some());
    }
    env.cleanup().await;
}

#[tokio::test]
async fn a_hole_first_seen_later_keeps_its_own_timer_and_a_partial_fill_keeps_first_seen() {
    let (env, cfg) = TestEnv::polling("holes2", 100).await;
    let (a, t1, h1) = env.row_then_open_insert().await;
    let (t1b, h1b) = env.open_insert().await; // hole h1..=h1b, two ids
    let b = env.insert_rows(1).await[0];
    env.poll(cfg).await;
    let (_, since) = env.cursor().await;
    let t0 = env.clock.now();
    assert_eq!(since, Some(t0));

    // A second hole appears 2 min later.
    env.clock.advance(Duration::from_secs(120));
    let (t2, h2) = env.open_insert().await;
    let c = env.insert_rows(1).await[0];
    env.poll(cfg).await;
    let stored = env.store.read_cursor().await.expect("cursor").holes;
    let spans: Vec<(i64, i64)> = stored.iter().map(|h| (h.first, h.last)).collect();
    assert_eq!(spans, vec![(h1, h1b), (h2, h2)]);
    assert_eq!(stored[1].first_seen, env.clock.now(), "its own sighting");

    // The first hole fills in part; the rest keeps the original first sighting.
    t1.commit().await.expect("commit");
    env.clock.advance(Duration::from_secs(60));
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, h1, "the committed id is enqueued");
    assert_eq!(
        r.advance.fills.first().copied(),
        Some(Duration::from_secs(180))
    );
    let stored = env.store.read_cursor().await.expect("cursor").holes;
    assert_eq!((stored[0].first, stored[0].first_seen), (h1b, t0));

    t1b.rollback().await.expect("rb");
    t2.rollback().await.expect("rb");
    // At t0 + 5 min the rest of the first hole is due, the second is not (seen at t0 + 2 min).
    env.clock.advance(Duration::from_secs(120));
    let r = env.poll(cfg).await;
    assert_eq!(released_spans(&r), vec![(h1b, h1b)]);
    assert_eq!(r.advance.w, b, "W waits before the younger hole");
    env.clock.advance(Duration::from_secs(119));
    assert!(env.poll(cfg).await.advance.released.is_empty());
    env.clock.advance(Duration::from_secs(1));
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.first_released().map(|h| h.first), Some(h2));
    assert_eq!(r.advance.w, c);
    assert_eq!(env.enqueued_ids().await, vec![a, h1, b, c]);
    env.cleanup().await;
}

#[tokio::test]
async fn a_fifty_million_id_jump_is_one_range_released_in_one_quick_round_and_watched() {
    let (env, cfg) = TestEnv::polling("jump", 100).await;
    let first = env.insert_rows(1).await[0];
    env.owner_exec("ALTER TABLE CMINMSGS AUTO_INCREMENT = 50000100")
        .await;
    let after = env.insert_rows(1).await[0];
    assert!(after - first > 50_000_000);
    env.poll(cfg).await;
    env.clock.advance(Duration::from_secs(300));
    let started = std::time::Instant::now();
    let r = env.poll(cfg).await;
    let took = started.elapsed();
    assert_eq!(
        r.advance.first_released().map(|h| (h.first, h.last)),
        Some((first + 1, after - 1))
    );
    assert_eq!(r.advance.w, after);
    assert!(
        took < Duration::from_secs(1),
        "the release round took {took:?}"
    );
    let ranges: i64 = env.scalar("SELECT count(*) FROM late_watch_range").await;
    assert_eq!(ranges, 1, "one row, not 50M");
    assert_eq!(
        env.store.late_watch_open().await.expect("open"),
        after - first - 1
    );

    // A row that commits later inside the range is detected and enqueued as LATE.
    let late = first + 25_000_000;
    sqlx::query("INSERT INTO CMINMSGS (CMINMSGS_ID, CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES (?, NOW(), '<MSG/>')")
        .bind(late)
        .execute(&env.owner)
        .await
        .expect("late row");
    let settings = env.settings(&[]);
    let dcfg = msgx_core::late::DetectConfig::from_settings(&settings);
    let started = std::time::Instant::now();
    let d = msgx_core::late::detect_once(&env.inbox, &env.store, &env.clock, &dcfg)
        .await
        .expect("detect");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        d.detected.iter().map(|h| h.msg_id).collect::<Vec<_>>(),
        vec![late]
    );
    let source: String = env
        .scalar_for("SELECT source FROM proc_state WHERE msg_id = $1", late)
        .await;
    assert_eq!(source, "LATE");
    let spans: Vec<(i64, i64)> = env
        .rows("SELECT first_id, last_id FROM late_watch_range ORDER BY first_id")
        .await;
    assert_eq!(spans, vec![(first + 1, late - 1), (late + 1, after - 1)]);
    env.cleanup().await;
}

#[tokio::test]
async fn holes_beyond_the_first_page_are_sighted_in_the_same_round() {
    let (env, cfg) = TestEnv::polling("ahead", 3).await; // pages of 3 rows
    let mut holes = Vec::new();
    let a = env.insert_rows(1).await[0];
    for _ in 0..4 {
        let (tx, h) = env.open_insert().await;
        tx.rollback().await.expect("rb");
        holes.push(h);
        env.insert_rows(2).await;
    }
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, a);
    assert_eq!(
        r.advance.holes.len(),
        4,
        "pages read ahead while W waits at a hole"
    );
    env.clock.advance(Duration::from_secs(300));
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.released.len(), 4, "all four due together");
    assert!(r.advance.open_hole.is_none());
    env.cleanup().await;
}

#[tokio::test]
async fn a_corrupt_hole_table_stops_the_poller_and_w_stays() {
    let (env, cfg) = TestEnv::polling("corrupt", 100).await;
    let ids = env.discovered_rows(3, cfg).await;
    env.exec_for(
        "INSERT INTO inbox_hole (first_id, last_id, first_seen) VALUES ($1, $1, now())",
        ids[1],
    )
    .await;
    env.insert_rows(1).await;
    let err = poll_once(&env.inbox, &env.store, &env.clock, cfg)
        .await
        .expect_err("corrupt holes refused");
    assert_eq!(err.stage(), "holes");
    assert!(err.to_string().contains("inbox_hole is corrupt"), "{err}");
    assert_eq!(env.cursor().await.0, ids[2], "W stays");
    // The documented repair: clear the table; every hole is re-aged from now (safe).
    env.exec("DELETE FROM inbox_hole").await;
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, ids[2] + 1);
    env.cleanup().await;
}

#[tokio::test]
async fn an_inbox_that_goes_backwards_is_an_id_regression_never_lag_zero() {
    let (env, cfg) = TestEnv::polling("regress", 100).await;
    let ids = env.discovered_rows(5, cfg).await;
    // The DB owner purges the newest (processed) rows: the head falls below W, but the next
    // id is still above it: no regression, caught up.
    sqlx::query("DELETE FROM CMINMSGS WHERE CMINMSGS_ID >= ?")
        .bind(ids[3])
        .execute(&env.owner)
        .await
        .expect("purge");
    let r = env.poll(cfg).await;
    assert!(
        !r.sight.regressed,
        "a purge is no regression: {:?}",
        r.sight.head
    );
    assert_eq!(r.sight.lag, Some(Duration::ZERO));
    env.owner_exec("DELETE FROM CMINMSGS").await;
    let r = env.poll(cfg).await;
    assert!(
        !r.sight.regressed && r.sight.head.is_none(),
        "an empty table after a purge"
    );
    // The DB owner rotates the table without seeding AUTO_INCREMENT: ids restart low.
    env.owner_exec("DELETE FROM CMINMSGS").await;
    env.owner_exec("ALTER TABLE CMINMSGS AUTO_INCREMENT = 1")
        .await;
    let reused = env.insert_rows(2).await;
    assert!(reused[1] < ids[4]);
    let r = env.poll(cfg).await;
    assert!(
        r.sight.regressed,
        "head {:?} below W {}",
        r.sight.head, r.advance.w
    );
    assert_eq!(r.sight.head, Some(reused[1]));
    assert_eq!(r.sight.lag, None, "never a reassuring lag 0");
    assert_eq!(r.advance.w, ids[4], "W never moves back");
    // The log line tells how far below W the compensation scan looks.
    assert_eq!(r.event().sight.compensation_window, cfg.compensation_window);

    // The compensation scan finds the reused ids below W. One is enqueued under the old row's
    // id but is another row (another receive time): reported as reused, never taken for the
    // old one. A truly unseen id below W is enqueued LATE.
    let received = "CMINMSGS_DATE_RECEIVED = '2020-01-01 00:00:00'";
    env.owner_update(received, &[], &reused[1..2]).await;
    env.exec_for("DELETE FROM proc_state WHERE msg_id = $1", reused[0])
        .await;
    let report = env.compensation_scan(&[]).await;
    assert_eq!(report.enqueued, vec![reused[0]]);
    assert_eq!(report.reused, vec![reused[1]]);
    assert_eq!(report.checked, 2);
    let source: String = env
        .scalar_for("SELECT source FROM proc_state WHERE msg_id = $1", reused[0])
        .await;
    assert_eq!(source, "LATE");
    // Idempotent: the next scan finds nothing new.
    let again = env.compensation_scan(&[]).await;
    assert!(again.enqueued.is_empty());
    env.cleanup().await;
}

#[tokio::test]
async fn rerunning_a_round_over_the_same_rows_changes_nothing() {
    let (env, cfg) = TestEnv::polling("rerun", 100).await;
    let ids = env.discovered_rows(5, cfg).await;
    let before: Vec<(i64, chrono::DateTime<chrono::Utc>, String)> = env
        .rows("SELECT msg_id, enqueued_at, state FROM proc_state ORDER BY msg_id")
        .await;
    assert_eq!(before.len(), 5);

    // Put W back (as after a lost async commit) and re-run over the same rows.
    env.exec("UPDATE inbox_cursor SET w = 0").await;
    env.clock.advance(Duration::from_secs(10));
    let r = env.poll(cfg).await;
    assert_eq!(r.enqueued_new, 0, "conflicts mean already enqueued");
    assert_eq!(r.advance.w, *ids.last().expect("ids"));
    let after: Vec<(i64, chrono::DateTime<chrono::Utc>, String)> = env
        .rows("SELECT msg_id, enqueued_at, state FROM proc_state ORDER BY msg_id")
        .await;
    assert_eq!(before, after);

    // A round with nothing new writes nothing either.
    let r = env.poll(cfg).await;
    assert_eq!((r.read, r.enqueued_new), (0, 0));
    env.cleanup().await;
}

#[tokio::test]
async fn full_batches_repoll_and_w_follows_batch_by_batch() {
    let (env, cfg) = TestEnv::polling("batch", 3).await;
    let ids = env.insert_rows(7).await;
    let r = env.poll(cfg).await;
    assert!(r.batch_full && r.poll_again_now());
    assert_eq!(r.advance.w, ids[2]);
    assert_eq!(
        r.sight.head,
        Some(ids[6]),
        "a full batch asks the inbox head for lag"
    );
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, ids[5]);
    let r = env.poll(cfg).await;
    assert!(!r.batch_full);
    assert_eq!(r.advance.w, ids[6]);
    assert_eq!(r.sight.lag, Some(Duration::ZERO));
    env.cleanup().await;
}

#[tokio::test]
async fn row_content_never_stops_discovery() {
    let (env, cfg) = TestEnv::polling("content", 100).await;
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
    let rows: Vec<(i64, Option<chrono::DateTime<chrono::Utc>>)> = env
        .rows("SELECT msg_id, received_at FROM proc_state ORDER BY msg_id")
        .await;
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
