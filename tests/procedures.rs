//! The seed's procedures (§5.3, §6) on the real PostgreSQL and MariaDB: the backlog survey
//! counts a known inbox exactly; an approved skip refuses without approval or beyond W, waits
//! for the pipeline lock, audits every batch and leaves rows the normal sweep marks; purge
//! readiness names every unmarked row's reason and the boundary, and judges marked rows from
//! both stores (`procedures/purge_rule.rs`); the raw copy keeps the replay window after a purge
//! (`procedures/raw_copy.rs`).

use msgx_testkit as common;
#[path = "procedures/purge_ids.rs"]
mod purge_ids;
#[path = "procedures/purge_rule.rs"]
mod purge_rule;
#[path = "procedures/raw_copy.rs"]
mod raw_copy;

use std::time::Duration;

use actix_web::{test, App};
use chrono::{DateTime, TimeZone, Utc};
use common::msgs::{fdel, flop, unknown_type};
use common::TestEnv;
use msgx_actors::admin::{configure, AdminState, Scope, Tokens};
use msgx_core::clock::Clock;
use msgx_core::ops::{
    OpsError, PurgeRequest, SkipRequest, SurveyRequest, APPROVED_SKIP, SKIP_BATCH,
};
use msgx_core::pump::StepOutcome;
use serde_json::{json, Value};

const READ: &str = "test-read-token-0123456789";
const OPERATE: &str = "test-operate-token-0123456789";

/// Airport local receive time of row `i` of a test: 2026-11-30 09:00 + i minutes.
fn local(i: usize) -> String {
    (utc(i) + chrono::Duration::hours(8))
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// The same in UTC (Asia/Shanghai is UTC+8).
fn utc(i: usize) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 1, 0, 0)
        .single()
        .expect("time")
        + chrono::Duration::minutes(i as i64)
}

/// Inserts these messages in one statement, row `k` received at `local(start + k)`.
/// Plain FLOP/UPDTs of flights `{flight}1`..=`{flight}{n}` (no fields), sequence numbers 1..=n,
/// inserted from minute 0; their ids.
async fn insert_flops(env: &TestEnv, flight: &str, n: i64) -> Vec<i64> {
    let texts: Vec<String> = (1..=n)
        .map(|s| flop(s, &format!("{flight}{s}"), &[]))
        .collect();
    insert(env, 0, &texts).await
}

async fn insert(env: &TestEnv, start: usize, texts: &[String]) -> Vec<i64> {
    let values: Vec<String> = texts
        .iter()
        .enumerate()
        .map(|(k, t)| format!("('{}', '{}')", local(start + k), t.replace('\'', "''")))
        .collect();
    let r = sqlx::query(&format!(
        "INSERT INTO CMINMSGS (CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES {}",
        values.join(",")
    ))
    .execute(&env.owner)
    .await
    .expect("insert");
    let first = r.last_insert_id() as i64;
    (first..first + texts.len() as i64).collect()
}

async fn audit_count(env: &TestEnv) -> i64 {
    env.count("SELECT count(*) FROM audit_log").await
}

/// `(state, terminal_reason)` of every row, by id.
async fn states(env: &TestEnv) -> Vec<(i64, String, Option<String>)> {
    env.rows("SELECT msg_id, state, terminal_reason FROM proc_state ORDER BY msg_id")
        .await
}

async fn unmarked_inbox(env: &TestEnv) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT CMINMSGS_ID FROM CMINMSGS \
         WHERE CMINMSGS_STATUS IS NULL OR TRIM(CMINMSGS_STATUS) = '' ORDER BY CMINMSGS_ID",
    )
    .fetch_all(&env.owner)
    .await
    .expect("marks")
}

#[tokio::test]
async fn survey_counts_a_known_inbox() {
    let env = TestEnv::new("proc_survey").await;
    let texts = vec![
        flop(1, "F1", &[("GATE", "A1")]),
        flop(2, "F2", &[("GATE", "A2")]),
        flop(3, "F3", &[("GATE", "A3")]),
        fdel(4, "F9"),
        fdel(5, "F8"),
        unknown_type(6),
        "<MSG/>".to_string(),
    ];
    let ids = insert(&env, 0, &texts).await;
    env.discover(ids[6]).await;
    // Two processed (one message per step): the backlog is the other five plus what comes
    // above W.
    let mut core = env.stepper(&[("MSGX_PROCESSING__GROUP_MAX", "1")]);
    for _ in 0..2 {
        assert!(matches!(
            core.step().await.expect("step"),
            StepOutcome::Processed { .. }
        ));
    }
    assert_eq!(env.state_of(ids[1]).await.0, "SUCCEEDED");
    let above = insert(&env, 7, &[flop(7, "F7", &[]), unknown_type(8)]).await;

    let mut reports = 0;
    let s = env
        .ops()
        .survey_with_progress(&SurveyRequest::default(), &mut |_| reports += 1)
        .await
        .expect("survey");
    assert!(reports >= 2, "progress after every batch");
    assert_eq!(s.scope, "backlog");
    assert_eq!(s.w, ids[6]);
    assert_eq!((s.first_id, s.last_id), (Some(ids[2]), Some(above[1])));
    assert_eq!((s.count, s.at_or_below_w, s.above_w), (7, 5, 2));
    assert_eq!(s.missing_rows, 0);
    assert_eq!(
        (s.received_first, s.received_last),
        (Some(utc(2)), Some(utc(8)))
    );
    let dist: Vec<(String, String, u64)> = s
        .by_type
        .iter()
        .map(|b| (b.msg_type.clone(), b.subtype.clone(), b.count))
        .collect();
    assert_eq!(
        dist,
        vec![
            ("FDEL".into(), "".into(), 2),
            ("FLOP".into(), "UPDT".into(), 2),
            ("XXXX".into(), "".into(), 2),
            ("(none)".into(), "".into(), 1),
        ]
    );

    survey_ranges(&env, &ids).await;
    // A purged unfinished row is counted as missing, not surveyed.
    env.delete_as_owner(&[ids[2]]).await;
    let s = env
        .ops()
        .survey(&SurveyRequest::default())
        .await
        .expect("survey");
    assert_eq!((s.count, s.missing_rows), (6, 1));
    // Every well-formed request has a meaning: ids and a receive window together survey the
    // rows of the range received in the window; a reversed range or an empty window, nothing.
    let s = env
        .ops()
        .survey(&SurveyRequest {
            from_id: Some(ids[1]),
            to_id: Some(ids[6]),
            received_from: Some(utc(3)),
            received_to: Some(utc(6)),
        })
        .await
        .expect("survey");
    assert_eq!(
        (s.count, s.first_id, s.last_id),
        (3, Some(ids[3]), Some(ids[5]))
    );
    for nothing in [
        SurveyRequest {
            from_id: Some(5),
            to_id: Some(3),
            ..Default::default()
        },
        SurveyRequest {
            received_from: Some(utc(6)),
            received_to: Some(utc(3)),
            ..Default::default()
        },
    ] {
        let s = env.ops().survey(&nothing).await.expect("survey");
        assert_eq!(s.count, 0, "{nothing:?}");
    }
    env.cleanup().await;
}

/// An id range surveys every inbox row in it, whatever its state; a receive-time range
/// `[utc(3), utc(6))` rows 3, 4, 5.
async fn survey_ranges(env: &TestEnv, ids: &[i64]) {
    // An id range: every inbox row in it, whatever its state.
    let s = env
        .ops()
        .survey(&SurveyRequest {
            from_id: Some(ids[0]),
            to_id: Some(ids[3]),
            ..Default::default()
        })
        .await
        .expect("survey");
    assert_eq!((s.scope.as_str(), s.count), ("ids", 4));
    assert_eq!(s.by_type[0].msg_type, "FLOP");
    assert_eq!(s.by_type[0].count, 3);
    // A receive-time range [utc(3), utc(6)): rows 3, 4, 5.
    let s = env
        .ops()
        .survey(&SurveyRequest {
            received_from: Some(utc(3)),
            received_to: Some(utc(6)),
            ..Default::default()
        })
        .await
        .expect("survey");
    assert_eq!(
        (s.count, s.first_id, s.last_id),
        (3, Some(ids[3]), Some(ids[5]))
    );
}

fn skip_req(from: i64, to: i64) -> SkipRequest {
    SkipRequest {
        from_id: from,
        to_id: to,
        approver: "owner-wang".into(),
        reason: "test traffic, agreed with the owner".into(),
        ticket: "CHG-42".into(),
        dry_run: false,
    }
}

#[tokio::test]
async fn skip_refuses_without_approval_or_beyond_w() {
    let env = TestEnv::new("proc_skip_refuse").await;
    let ids = insert(&env, 0, &[flop(1, "F1", &[]), flop(2, "F2", &[])]).await;
    env.discover(ids[1]).await;
    let above = insert(&env, 2, &[flop(3, "F3", &[])]).await;
    let before = states(&env).await;
    let now = env.clock.now();
    for (field, bad) in [
        (
            "approver",
            SkipRequest {
                approver: " ".into(),
                ..skip_req(ids[0], ids[1])
            },
        ),
        (
            "reason",
            SkipRequest {
                reason: "".into(),
                ..skip_req(ids[0], ids[1])
            },
        ),
        (
            "ticket",
            SkipRequest {
                ticket: "".into(),
                ..skip_req(ids[0], ids[1])
            },
        ),
    ] {
        match env.ops().skip(&bad, now).await {
            Err(OpsError::Invalid(why)) => assert!(why.contains(field), "{why}"),
            other => panic!("{field}: {other:?}"),
        }
    }
    // A reversed range is empty: nothing skipped (and, below, nothing audited).
    let reversed = env
        .ops()
        .skip(&skip_req(ids[1], ids[0]), now)
        .await
        .expect("a reversed range is well formed");
    assert_eq!((reversed.skipped, reversed.batches.len()), (0, 0));
    assert!(matches!(
        env.ops().skip(&skip_req(0, ids[0]), now).await,
        Err(OpsError::Invalid(_))
    ));
    match env.ops().skip(&skip_req(ids[0], above[0]), now).await {
        Err(OpsError::Conflict(why)) => assert!(why.contains("above W"), "{why}"),
        other => panic!("beyond W: {other:?}"),
    }
    assert_eq!(states(&env).await, before, "nothing changed");
    assert_eq!(audit_count(&env).await, 0, "nothing audited");
    env.cleanup().await;
}

#[tokio::test]
async fn skip_goes_through_the_gate_is_audited_and_swept() {
    let env = TestEnv::new("proc_skip").await;
    let n = SKIP_BATCH as usize + 205;
    let mut texts = vec![flop(1, "F1", &[]), unknown_type(2)];
    texts.extend((3..=n as i64).map(|s| flop(s, &format!("F{s}"), &[])));
    let ids = insert(&env, 0, &texts).await;
    let (first, last) = (ids[0], ids[n - 1]);
    env.discover(last).await;
    let mut core = env.stepper(&[]);
    for _ in 0..2 {
        core.step().await.expect("step");
    }
    assert_eq!(env.state_of(first).await.0, "SUCCEEDED");
    assert_eq!(env.state_of(ids[1]).await.0, "FAILED", "the head holds");
    env.sweep_all().await;
    let now = env.clock.now();

    // Dry run: counts, changes and audits nothing.
    let before = states(&env).await;
    let dry = env
        .ops()
        .skip(
            &SkipRequest {
                dry_run: true,
                ..skip_req(first, last)
            },
            now,
        )
        .await
        .expect("dry run");
    assert_eq!(
        (
            dry.skipped,
            dry.was_pending,
            dry.was_failed,
            dry.already_terminal
        ),
        (n as u64 - 1, n as u64 - 2, 1, 1)
    );
    assert!(dry.batches.is_empty());
    assert_eq!(states(&env).await, before);
    assert_eq!(audit_count(&env).await, 0);

    // The gate: while a business transaction holds the pipeline lock, the skip waits.
    let mut holder = env.store.pool().begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(msgx_core::store::PIPELINE_LOCK_KEY)
        .execute(&mut *holder)
        .await
        .expect("lock");
    let o = env.ops();
    let task = tokio::spawn(async move { o.skip(&skip_req(first, last), now).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished(), "the skip waits for the pipeline lock");
    assert_eq!(env.state_of(ids[2]).await.0, "PENDING");
    holder.commit().await.expect("release");
    let report = task.await.expect("join").expect("skip");
    assert_eq!(report.skipped, n as u64 - 1);
    assert_eq!((report.was_pending, report.was_failed), (n as u64 - 2, 1));
    assert_eq!(report.batches.len(), 2, "bounded batches");
    assert_eq!(report.batches[0].rows, SKIP_BATCH as u64);
    assert_eq!(report.batches[1].rows, n as u64 - 1 - SKIP_BATCH as u64);
    assert_eq!(
        (report.batches[0].first_id, report.batches[1].last_id),
        (ids[1], last)
    );

    skipped_and_audited(&env, &ids, &report).await;

    // Again: nothing left to skip, nothing audited.
    let again = env
        .ops()
        .skip(&skip_req(first, last), now)
        .await
        .expect("again");
    assert_eq!((again.skipped, again.already_terminal), (0, n as u64));
    assert_eq!(audit_count(&env).await, 2);

    // The pump has no head any more; the normal sweep marks every skipped row.
    assert_eq!(core.step().await.expect("step"), StepOutcome::Idle);
    assert_eq!(unmarked_inbox(&env).await.len(), n - 1);
    env.sweep_all().await;
    assert_eq!(unmarked_inbox(&env).await, Vec::<i64>::new());
    let ready = env
        .ops()
        .purge_readiness(&PurgeRequest::default())
        .await
        .expect("purge");
    assert!(ready.ready);
    assert_eq!(
        (ready.rows, ready.marked, ready.boundary_id),
        (n as u64, n as u64, Some(last))
    );
    let inbox_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM CMINMSGS")
        .fetch_one(&env.owner)
        .await
        .expect("count");
    assert_eq!(inbox_rows, n as i64, "nothing deleted");
    env.cleanup().await;
}

/// Only the unfinished rows became SKIPPED(APPROVED_SKIP), the processed first one untouched;
/// one audit row per batch: approver, reason, ticket, the ids.
async fn skipped_and_audited(env: &TestEnv, ids: &[i64], report: &msgx_core::ops::SkipReport) {
    let first = ids[0];
    // Only the unfinished rows became SKIPPED(APPROVED_SKIP); the processed one is untouched.
    for (id, state, reason) in states(env).await {
        if id == first {
            assert_eq!((state.as_str(), reason), ("SUCCEEDED", None));
        } else {
            assert_eq!(
                (state.as_str(), reason.as_deref()),
                ("SKIPPED", Some(APPROVED_SKIP)),
                "{id}"
            );
        }
    }
    // One audit row per batch: approver, reason, ticket, the ids.
    let audit = env.audit_entries().await.expect("audit");
    assert_eq!(audit.len(), 2);
    let mut audited: Vec<i64> = Vec::new();
    for (a, b) in audit.iter().zip(&report.batches) {
        assert_eq!(a.id, b.audit_id);
        assert_eq!(a.action, "APPROVED_SKIP");
        assert_eq!(a.actor, "owner-wang");
        assert_eq!(a.reason, "test traffic, agreed with the owner");
        assert_eq!(a.ticket.as_deref(), Some("CHG-42"));
        assert_eq!(a.result["applied"], json!(b.rows));
        audited.extend(&a.msg_ids);
    }
    assert_eq!(audited, ids[1..].to_vec());
    assert_eq!(
        audit[0].result["rows"][0]["previous_state"],
        json!("FAILED")
    );
}

#[tokio::test]
async fn purge_readiness_names_every_reason() {
    let env = TestEnv::new("proc_purge").await;
    let (ids, beyond) = rows_for_every_reason(&env).await;

    let r = env
        .ops()
        .purge_readiness(&PurgeRequest::default())
        .await
        .expect("purge");
    assert!(!r.ready);
    assert_eq!(
        (r.to_id, r.w, r.rows, r.marked),
        (Some(beyond), ids[10], 12, 2)
    );
    assert_eq!(
        (r.boundary_id, r.boundary_received_at),
        (Some(ids[1]), Some(utc(1)))
    );
    let got: Vec<(String, u64, Vec<i64>)> = r
        .unmarked
        .iter()
        .map(|u| (u.reason.clone(), u.count, u.sample_ids.clone()))
        .collect();
    let want: Vec<(String, u64, Vec<i64>)> = vec![
        ("pending".into(), 2, vec![ids[3], ids[9]]),
        ("failed".into(), 1, vec![ids[4]]),
        ("awaiting_sweep".into(), 1, vec![ids[2]]),
        ("abandoned_missing_row".into(), 1, vec![ids[5]]),
        ("abandoned_max_attempts".into(), 1, vec![ids[6]]),
        ("confirmed_mark_gone".into(), 1, vec![ids[10]]),
        ("released_hole".into(), 1, vec![ids[7]]),
        ("never_enqueued".into(), 1, vec![ids[8]]),
        ("beyond_watermark".into(), 1, vec![beyond]),
    ];
    assert_eq!(got, want);

    ready_up_to_the_boundary(&env, &ids).await;
    env.cleanup().await;
}

/// Up to the boundary it is ready, by id and by receive time; with both bounds the range ends
/// at the lower; an id of 0 is refused.
async fn ready_up_to_the_boundary(env: &TestEnv, ids: &[i64]) {
    // Up to the boundary it is ready, by id and by receive time.
    let r = env
        .ops()
        .purge_readiness(&PurgeRequest {
            to_id: Some(ids[1]),
            ..Default::default()
        })
        .await
        .expect("purge");
    assert!(r.ready && r.unmarked.is_empty());
    assert_eq!((r.rows, r.boundary_id), (2, Some(ids[1])));
    let r = env
        .ops()
        .purge_readiness(&PurgeRequest {
            received_before: Some(utc(3)),
            ..Default::default()
        })
        .await
        .expect("purge");
    assert_eq!(
        (r.to_id, r.rows, r.marked, r.ready),
        (Some(ids[2]), 3, 2, false)
    );
    // Both bounds: the range ends at the lower of the two, whichever it is.
    for (to_id, before) in [(ids[1], utc(3)), (ids[2], utc(2))] {
        let r = env
            .ops()
            .purge_readiness(&PurgeRequest {
                to_id: Some(to_id),
                received_before: Some(before),
            })
            .await
            .expect("purge");
        assert_eq!((r.to_id, r.rows), (Some(ids[1]), 2), "{to_id} {before}");
    }
    assert!(matches!(
        env.ops()
            .purge_readiness(&PurgeRequest {
                to_id: Some(0),
                ..Default::default()
            })
            .await,
        Err(OpsError::Invalid(_))
    ));
}

/// Twelve inbox rows, each unmarked one for a different reason: PENDING, FAILED, awaiting the
/// sweep, abandoned (missing row, max attempts), confirmed with its mark gone, a late arrival
/// in a released hole, never enqueued, beyond W; the first two marked. The 11 ids below W and
/// the one beyond.
async fn rows_for_every_reason(env: &TestEnv) -> (Vec<i64>, i64) {
    let ids = insert_flops(env, "F", 11).await;
    env.discover(ids[10]).await;
    let beyond = insert(env, 11, &[flop(12, "F12", &[])]).await[0];
    let now = env.clock.now();
    let pg = env.store.pool();
    let set = |sql: &'static str, id: i64| async move {
        sqlx::query(sql)
            .bind(id)
            .bind(now)
            .execute(pg)
            .await
            .expect(sql);
    };
    let terminal = "UPDATE proc_state SET state = 'SUCCEEDED', terminal_at = $2 WHERE msg_id = $1";
    let confirmed = "UPDATE proc_state SET backfill_at = $2 WHERE msg_id = $1";
    for i in [0, 1, 10] {
        set(terminal, ids[i]).await;
        set(confirmed, ids[i]).await;
    }
    env.owner_update("CMINMSGS_STATUS = 'Y'", &[], &ids[..2])
        .await;
    set(terminal, ids[2]).await; // awaiting the sweep
                                 // ids[3] stays PENDING.
    set(
        "UPDATE proc_state SET state = 'FAILED', next_attempt_at = $2 WHERE msg_id = $1",
        ids[4],
    )
    .await;
    set(
        "UPDATE proc_state SET state = 'DEAD', terminal_at = $2, \
         backfill_abandon_reason = 'MISSING_ROW', backfill_abandoned_at = $2 WHERE msg_id = $1",
        ids[5],
    )
    .await;
    set(
        "UPDATE proc_state SET state = 'SKIPPED', terminal_at = $2, \
         backfill_abandon_reason = 'MAX_ATTEMPTS', backfill_abandoned_at = $2 WHERE msg_id = $1",
        ids[6],
    )
    .await;
    // ids[7]: a late arrival inside a released hole; ids[8]: never enqueued.
    set(
        "DELETE FROM proc_state WHERE msg_id = $1 AND $2::timestamptz IS NOT NULL",
        ids[7],
    )
    .await;
    set(
        "DELETE FROM proc_state WHERE msg_id = $1 AND $2::timestamptz IS NOT NULL",
        ids[8],
    )
    .await;
    sqlx::query(
        "INSERT INTO late_watch_range (first_id, last_id, released_at, expires_at) \
         VALUES ($1, $1, $2, $2 + interval '7 days')",
    )
    .bind(ids[7])
    .bind(now)
    .execute(pg)
    .await
    .expect("watch");
    // ids[9] stays PENDING; ids[10] confirmed but its mark is gone.
    (ids, beyond)
}

fn state(env: &TestEnv) -> AdminState {
    AdminState {
        store: env.store.clone(),
        clock: common::shared(&env.clock),
        tokens: std::sync::Arc::new(Tokens::with(&[
            (READ, Scope::Read),
            (OPERATE, Scope::Operate),
        ])),
        ops: env.ops(),
    }
}

#[actix_rt::test]
async fn procedures_over_http_respect_the_scopes() {
    let env = TestEnv::new("proc_http").await;
    let ids = insert(&env, 0, &[flop(1, "F1", &[]), fdel(2, "F1")]).await;
    env.discover(ids[1]).await;
    let app = test::init_service(App::new().configure(configure(state(&env)))).await;
    let get = |uri: &str, token: &str| {
        test::TestRequest::get()
            .uri(uri)
            .insert_header(("Authorization", format!("Bearer {token}")))
            .to_request()
    };
    let resp = test::call_service(&app, get("/admin/survey", READ)).await;
    assert_eq!(resp.status(), 200);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(v["count"], json!(2));
    // A reversed range is well formed (the document cannot compare two fields): nothing.
    let resp = test::call_service(&app, get("/admin/survey?from_id=3&to_id=1", READ)).await;
    assert_eq!(resp.status(), 200);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(v["count"], json!(0));
    let resp = test::call_service(&app, get("/admin/purge-readiness", READ)).await;
    assert_eq!(resp.status(), 200);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(
        (v["ready"].clone(), v["rows"].clone()),
        (json!(false), json!(2))
    );

    let body = json!({"from_id": ids[0], "to_id": ids[1], "approver": "owner-wang",
                      "reason": "agreed", "ticket": "CHG-1"});
    let post = |token: &str, body: &Value| {
        test::TestRequest::post()
            .uri("/admin/skip")
            .insert_header(("Authorization", format!("Bearer {token}")))
            .set_json(body)
            .to_request()
    };
    let resp = test::call_service(&app, post(READ, &body)).await;
    assert_eq!(resp.status(), 403, "skip needs the operate scope");
    assert_eq!(env.state_of(ids[0]).await.0, "PENDING");
    let mut no_approver = body.clone();
    no_approver["approver"] = json!("");
    let resp = test::call_service(&app, post(OPERATE, &no_approver)).await;
    assert_eq!(resp.status(), 400);
    let resp = test::call_service(&app, post(OPERATE, &body)).await;
    assert_eq!(resp.status(), 200);
    let v: Value = test::read_body_json(resp).await;
    assert_eq!(v["skipped"], json!(2));
    assert_eq!(env.state_of(ids[1]).await.0, "SKIPPED");
    let mut beyond = body.clone();
    beyond["to_id"] = json!(ids[1] + 5);
    let resp = test::call_service(&app, post(OPERATE, &beyond)).await;
    assert_eq!(resp.status(), 409);
    env.cleanup().await;
}

async fn mark(env: &TestEnv, ids: &[i64]) {
    for id in ids {
        env.owner_update("CMINMSGS_STATUS = 'PROCESSED'", &[], &[*id])
            .await;
    }
}

#[actix_rt::test]
async fn purge_boundary_watch_moves_up_incrementally_by_the_rule() {
    use actix::Actor as _;
    use msgx_actors::messages::RefreshBoundary;
    use msgx_actors::purge_watch::PurgeWatch;
    use msgx_core::ops::BoundaryWatch;

    /// `(rows read, caught up, pulled down)`: every field of one step's `Advance`.
    async fn step(watch: &mut BoundaryWatch, env: &TestEnv, cap: u64) -> (u64, bool, bool) {
        let a = watch
            .advance(&env.inbox, &env.store, cap)
            .await
            .expect("advance");
        (a.rows, a.caught_up, a.pulled_down)
    }

    let env = TestEnv::new("proc_boundary").await;
    let ids = insert_flops(&env, "F", 5).await;
    // Our records are finished and confirmed; the marks arrive one by one (the purge rule
    // needs both: tests/procedures/purge_rule.rs).
    env.discover(ids[4]).await;
    env.exec_for(
        "UPDATE proc_state SET state = 'SUCCEEDED', terminal_at = $1, backfill_at = $1",
        env.clock.now(),
    )
    .await;
    let mut watch = BoundaryWatch::default();
    // Nothing marked: no boundary; it stopped at the first row.
    assert_eq!(step(&mut watch, &env, 1_000).await, (1, true, false));
    assert_eq!(watch.boundary, None);
    mark(&env, &ids[0..2]).await;
    assert_eq!(step(&mut watch, &env, 1_000).await, (3, true, false));
    assert_eq!(watch.boundary, Some((ids[1], Some(utc(1)))));
    // It reads on from the boundary only: rows 3, 4 (marked) and 5 (not).
    mark(&env, &ids[2..4]).await;
    assert_eq!(step(&mut watch, &env, 1_000).await, (3, true, false));
    assert_eq!(watch.boundary, Some((ids[3], Some(utc(3)))));
    // The row cap: nothing read, not caught up, boundary kept.
    assert_eq!(step(&mut watch, &env, 0).await, (0, false, false));
    assert_eq!(watch.boundary.map(|b| b.0), Some(ids[3]));
    // The same report as purge readiness, and the actor runs the same step.
    let r = env
        .ops()
        .purge_readiness(&PurgeRequest::default())
        .await
        .expect("purge");
    assert_eq!(r.boundary_id, Some(ids[3]));
    mark(&env, &ids[4..]).await;
    let addr = PurgeWatch::new(
        env.inbox.clone(),
        env.store.clone(),
        Duration::from_secs(3600),
    )
    .start();
    // Its first round ran at start (or runs now): every row is marked.
    let a = common::pipeline::ask(&addr, RefreshBoundary).await;
    assert!(a.caught_up);
    assert!(a.rows <= 5, "reads on from the boundary it found: {a:?}");
    env.cleanup().await;
}

/// The binary's subcommands against this env: `--json` prints the API's document; a refused
/// skip exits non-zero and changes nothing.
async fn cli(env: &TestEnv, args: &[&str]) -> std::process::Output {
    let mut cmd = common::instance::msgexchange();
    cmd.args(args).stdin(std::process::Stdio::null());
    for (k, v) in env.binary_env() {
        cmd.env(k, v);
    }
    cmd.env("MSGX_LOG__LEVEL", "warn");
    tokio::task::spawn_blocking(move || cmd.output().expect("run msgexchange"))
        .await
        .expect("join")
}

/// `msgexchange skip --from FROM --to TO` with these further arguments.
async fn cli_skip(env: &TestEnv, from: &str, to: &str, rest: &[&str]) -> std::process::Output {
    let mut args = vec!["skip", "--from", from, "--to", to];
    args.extend_from_slice(rest);
    cli(env, &args).await
}

#[tokio::test]
async fn cli_survey_skip_and_purge_readiness() {
    let env = TestEnv::new("proc_cli").await;
    let ids = insert(
        &env,
        0,
        &[flop(1, "F1", &[]), unknown_type(2), fdel(3, "F1")],
    )
    .await;
    env.discover(ids[2]).await;
    let (from, to) = (ids[0].to_string(), ids[2].to_string());

    let out = cli(&env, &["survey", "--json"]).await;
    common::process::assert_ok(&out);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        (v["count"].clone(), v["by_type"].as_array().map(Vec::len)),
        (json!(3), Some(3))
    );

    // Beyond W: refused, exit 1, nothing changed.
    let beyond = (ids[2] + 1).to_string();
    let who = ["--approver", "a", "--reason", "r", "--ticket", "t"];
    let out = cli_skip(&env, &from, &beyond, &who).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("above W"));
    // Without an approver clap refuses (exit 2).
    let out = cli_skip(&env, &from, &to, &["--reason", "r", "--ticket", "t"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(audit_count(&env).await, 0);
    assert!(states(&env).await.iter().all(|s| s.1 == "PENDING"));

    let approved = [
        "--approver",
        "owner",
        "--reason",
        "agreed",
        "--ticket",
        "CHG-7",
        "--json",
    ];
    let out = cli_skip(&env, &from, &to, &approved).await;
    common::process::assert_ok(&out);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["skipped"], json!(3));
    assert_eq!(audit_count(&env).await, 1);

    // The binary stamps the skip with the real clock: the sweep runs after it.
    env.clock.set(Utc::now() + chrono::Duration::seconds(1));
    env.sweep_all().await;
    let out = cli(&env, &["purge-readiness"]).await;
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("READY") && !text.contains("NOT READY"),
        "{text}"
    );
    assert!(text.contains(&format!("id {}", ids[2])), "{text}");
    env.cleanup().await;
}
