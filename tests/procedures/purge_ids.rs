//! Purge day (issue 29 items 1–3): readiness judges ids, not only rows — an upstream commit
//! held on id 4 while 5–7 are processed and marked keeps the boundary at 3 until id 4 is
//! processed; the runbook's purge statement deletes only rows that carry our mark; a row
//! purged before its mark is a `verify` violation; a NULL DATE_RECEIVED is judged by id.

use std::time::Duration;

use msgx_core::ops::{BoundaryWatch, PurgeReadiness, PurgeRequest};

use super::common::service::{free_port, kill9, spawn_service, wait_for};
use super::common::TestEnv;

async fn readiness_to(env: &TestEnv, to: i64) -> PurgeReadiness {
    env.ops()
        .purge_readiness(&PurgeRequest {
            to_id: Some(to),
            ..Default::default()
        })
        .await
        .expect("purge readiness")
}

/// `(reason, count, ranges)` of the ids held without a row.
fn held_ids(r: &PurgeReadiness) -> Vec<(String, u64, Vec<[i64; 2]>)> {
    r.ids_without_row
        .iter()
        .map(|h| (h.reason.clone(), h.count, h.ranges.clone()))
        .collect()
}

/// Terminal and confirmed (the sweep saw our mark): what the purge rule needs of a record.
async fn confirmed(env: &TestEnv, ids: &[i64]) -> bool {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM proc_state WHERE msg_id = ANY($1) \
           AND state IN ('SUCCEEDED', 'SKIPPED', 'DEAD') AND backfill_at IS NOT NULL",
    )
    .bind(ids)
    .fetch_one(env.store.pool())
    .await
    .unwrap_or(0);
    n == ids.len() as i64
}

async fn confirmed_or_terminal(env: &TestEnv, ids: &[i64]) -> bool {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM proc_state WHERE msg_id = ANY($1) \
           AND state IN ('SUCCEEDED', 'SKIPPED', 'DEAD')",
    )
    .bind(ids)
    .fetch_one(env.store.pool())
    .await
    .expect("count");
    n == ids.len() as i64
}

async fn watched(env: &TestEnv, id: i64) -> bool {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM late_watch_range WHERE first_id <= $1 AND last_id >= $1",
    )
    .bind(id)
    .fetch_one(env.store.pool())
    .await
    .unwrap_or(0);
    n == 1
}

async fn inbox_has(env: &TestEnv, id: i64) -> bool {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM CMINMSGS WHERE CMINMSGS_ID = ?")
        .bind(id)
        .fetch_one(&env.owner)
        .await
        .expect("count");
    n == 1
}

/// The runbook's purge statement (docs/operations.md, "Check before a purge"): our mark AND
/// the boundary.
const OWNER_PURGE: &str = "DELETE FROM CMINMSGS WHERE CMINMSGS_ID <= ? AND CMINMSGS_STATUS = ?";

/// The runbook's purge up to `to`, started while `held` (an upstream insert) is uncommitted;
/// `held` commits 300 ms later. The rows deleted.
async fn purge_while(
    env: &TestEnv,
    to: i64,
    mark: &str,
    held: sqlx::Transaction<'static, sqlx::MySql>,
) -> u64 {
    let owner = env.owner.clone();
    let mark = mark.to_string();
    let purge = tokio::spawn(async move {
        sqlx::query(OWNER_PURGE)
            .bind(to)
            .bind(mark)
            .execute(&owner)
            .await
            .map(|r| r.rows_affected())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.commit().await.expect("upstream commit");
    purge.await.expect("task").expect("purge")
}

/// The first bullet of issue 29 against a running service: the upstream holds its commit on
/// id 4 while 5–7 commit and are processed and marked, the hole at 4 is released and watched.
/// Readiness must not pass 3 (before the fix: READY up to 7, and the owner's DELETE waited on
/// the uncommitted row and removed it once it committed). Then the upstream commits, the
/// pipeline processes 4 as LATE, and readiness passes it.
#[tokio::test]
async fn a_held_upstream_commit_holds_the_boundary_until_it_is_processed() {
    let env = TestEnv::new("purge_held").await;
    let mark = env.settings(&[]).backfill.mark_value.clone();
    let first = env.insert_rows(3).await;
    assert_eq!(first, vec![1, 2, 3]);
    let (held, held_id) = env.open_insert().await;
    assert_eq!(held_id, 4);
    let after = env.insert_rows(3).await;
    assert_eq!(after, vec![5, 6, 7]);

    let port = free_port();
    let mut svc = spawn_service(
        &env,
        &[
            ("MSGX_PIPELINE__MAX_COMMIT_DELAY", "2s"),
            ("MSGX_BACKFILL__PERIOD", "200ms"),
            ("MSGX_LATE__DETECT_PERIOD", "200ms"),
            ("MSGX_PROCESSING__IDLE_POLL", "100ms"),
        ],
        port,
    );
    let done = [1, 2, 3, 5, 6, 7];
    wait_for("1-3, 5-7 confirmed", Duration::from_secs(60), || async {
        confirmed(&env, &done).await
    })
    .await;
    wait_for("the hole at 4 watched", Duration::from_secs(30), || async {
        watched(&env, 4).await
    })
    .await;

    let r = readiness_to(&env, 7).await;
    assert!(!r.ready, "{}", r.render());
    assert_eq!(r.boundary_id, Some(3), "{}", r.render());
    assert_eq!(
        held_ids(&r),
        vec![("watched_hole".into(), 1, vec![[4, 4]])],
        "{}",
        r.render()
    );
    assert!(r.render().contains("watched_hole"), "{}", r.render());
    // The gauge says the same.
    let mut watch = BoundaryWatch::default();
    watch
        .advance(&env.inbox, &env.store, 1_000)
        .await
        .expect("gauge");
    assert_eq!(watch.boundary.map(|b| b.0), Some(3));
    // Beyond W: every id above it holds too (nothing discovered there yet).
    let r = readiness_to(&env, 9).await;
    assert_eq!(
        held_ids(&r),
        vec![
            ("watched_hole".into(), 1, vec![[4, 4]]),
            ("beyond_watermark".into(), 2, vec![[8, 9]]),
        ],
        "{}",
        r.render()
    );

    // The owner purges up to 3 with the runbook's statement — InnoDB's range scan reads on to
    // the held row 4 and waits on its lock — and the upstream commits id 4 meanwhile.
    let deleted = purge_while(&env, 3, &mark, held).await;
    assert_eq!(deleted, 3);
    assert!(inbox_has(&env, 4).await);
    wait_for(
        "4 processed and confirmed",
        Duration::from_secs(60),
        || async { confirmed(&env, &[4]).await },
    )
    .await;
    let r = readiness_to(&env, 7).await;
    assert!(r.ready, "{}", r.render());
    assert_eq!(r.boundary_id, Some(7));
    assert!(r.ids_without_row.is_empty(), "{}", r.render());

    // The second guard: an insert held below the boundary is unmarked when it commits, so the
    // runbook's DELETE (which waits on its lock) leaves it.
    let (late, late_id) = env.open_insert().await;
    let deleted = purge_while(&env, late_id, &mark, late).await;
    assert_eq!(deleted, 4, "ids 4-7 (ours, marked), not {late_id}");
    assert!(inbox_has(&env, late_id).await, "the unmarked row stays");
    kill9(&mut svc);
    env.cleanup().await;
}

/// The seed's red line: a row we read, purged before we marked it, is a `verify` violation
/// (exit non-zero), not a note.
#[tokio::test]
async fn a_row_purged_before_its_mark_is_a_verify_violation() {
    let env = TestEnv::new("purge_red_line").await;
    let ids = env.insert_rows(3).await;
    env.discover(ids[2]).await;
    let mut pump = env.stepper(&[]);
    for _ in 0..20 {
        if matches!(
            pump.step().await.expect("step"),
            msgx_core::pump::StepOutcome::Idle
        ) {
            break;
        }
    }
    assert!(
        confirmed_or_terminal(&env, &ids).await,
        "all three processed"
    );
    // The owner purges row 2 between processing and marking.
    assert_eq!(env.delete_as_owner(&[ids[1]]).await, 1);
    env.sweep_all().await;
    let (_, abandon): (String, Option<String>) =
        sqlx::query_as("SELECT state, backfill_abandon_reason FROM proc_state WHERE msg_id = $1")
            .bind(ids[1])
            .fetch_one(env.store.pool())
            .await
            .expect("record");
    assert_eq!(abandon.as_deref(), Some("MISSING_ROW"));
    let report = env.verify().await;
    assert!(!report.ok(), "{:#?}", report.lines());
    let present = super::common::finding(&report, "inbox_row_present");
    assert_eq!(present.violations, 1, "{:#?}", report.lines());
    assert_eq!(present.examples, vec![ids[1]]);

    // The binary exits non-zero on it.
    let (code, out) = super::common::instance::verify(&env.binary_env(), &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("inbox_row_present"), "{out}");
    env.cleanup().await;
}

/// Rows without a DATE_RECEIVED: judged by id like the others, counted in the report; a
/// `received_before` range takes those below its last id and not those above.
#[tokio::test]
async fn rows_without_a_receive_time_are_judged_by_id() {
    let env = TestEnv::new("purge_null_recv").await;
    let ids = env.insert_rows(4).await;
    sqlx::query("UPDATE CMINMSGS SET CMINMSGS_DATE_RECEIVED = NULL WHERE CMINMSGS_ID IN (?, ?)")
        .bind(ids[1])
        .bind(ids[3])
        .execute(&env.owner)
        .await
        .expect("null receive time");
    let before: chrono::DateTime<chrono::Utc> = chrono::Utc::now() + chrono::Duration::days(1);
    env.discover(ids[3]).await;
    let r = env
        .ops()
        .purge_readiness(&PurgeRequest {
            received_before: Some(before),
            ..Default::default()
        })
        .await
        .expect("readiness");
    // The range ends at the last row with a receive time (id 3); id 2 (NULL) lies inside it.
    assert_eq!((r.to_id, r.rows, r.received_unknown), (Some(ids[2]), 3, 1));
    assert!(!r.ready, "nothing processed yet");
    assert!(
        r.render().contains("without DATE_RECEIVED: 1"),
        "{}",
        r.render()
    );
    let all = readiness_to(&env, ids[3]).await;
    assert_eq!((all.rows, all.received_unknown), (4, 2));
    env.cleanup().await;
}
