//! A replay window that survives purging (issue 13 item 4, seed §9 / G10): with
//! `retention.raw_copy` the pump keeps our own compressed copy of each message's raw text; a
//! replay reads the inbox first, falls back to the copy and says which it used; without a
//! copy and without the inbox row it refuses. Expired copies go in bounded batches.

use chrono::{Duration as Days, Utc};
use msgx_core::ops::ReplayRequest;
use msgx_core::pump::{Outcome, StepOutcome};
use msgx_core::store::raw_copy::{compress, purge_expired_raw_copies};
use msgx_core::store::replay;
use msgx_core::store::StoredCopy;

use super::common::msgs::flop;
use super::common::TestEnv;
use super::insert;

fn on(raw_copy: bool) -> &'static str {
    if raw_copy {
        "true"
    } else {
        "false"
    }
}

/// A FLOP/UPDT the first pump cannot decode yet (UPDT not configured): FAILED(UNSUPPORTED),
/// then poison DEAD(EXHAUSTED) at once (`max_attempts` 1), then marked by the sweep — a
/// replayable row the DB owner may purge.
pub(super) async fn dead_and_marked(env: &TestEnv, raw_copy: bool, gate: &str) -> i64 {
    let id = insert(env, 0, &[flop(1, "RC1", &[("GATE", gate)])]).await[0];
    env.discover(id).await;
    let mut pump = env.stepper(&[
        ("MSGX_PROCESSING__FLOP_SUBTYPES", "ARRE"),
        ("MSGX_PROCESSING__MAX_ATTEMPTS", "1"),
        ("MSGX_RETENTION__RAW_COPY", on(raw_copy)),
    ]);
    match pump.step().await.expect("step") {
        StepOutcome::Processed {
            outcome: Outcome::Failed { .. },
            ..
        } => {}
        other => panic!("expected FAILED(UNSUPPORTED), got {other:?}"),
    }
    env.step_poisons(&mut pump, id).await;
    env.sweep_all().await;
    id
}

/// [`dead_and_marked`] (with or without raw copies), then the DB owner purges its inbox row:
/// the text is left only in our copy, if the FAILED attempt wrote one.
async fn dead_marked_and_purged(env: &TestEnv, raw_copy: bool, gate: &str) -> i64 {
    let id = dead_and_marked(env, raw_copy, gate).await;
    if raw_copy {
        assert_eq!(copies(env).await, 1, "the FAILED attempt wrote the copy");
    } else {
        assert_eq!(copies(env).await, 0, "raw_copy off writes nothing");
    }
    purge_inbox_row(env, id).await;
    id
}

/// The DB owner purges a marked row.
async fn purge_inbox_row(env: &TestEnv, id: i64) {
    assert_eq!(env.delete_as_owner(&[id]).await, 1);
}

fn replay_req(id: i64) -> ReplayRequest {
    super::common::replay_of_dead(id, "UPDT supported since 1.5", Some("CHG-13"))
}

async fn copies(env: &TestEnv) -> i64 {
    env.scalar("SELECT count(*) FROM raw_copy").await
}

async fn gate_of(env: &TestEnv, flid: &str) -> Option<String> {
    sqlx::query_scalar("SELECT fields->>'GATE' FROM flight_state WHERE flid = $1")
        .bind(flid)
        .fetch_optional(env.store.pool())
        .await
        .expect("flight")
        .flatten()
}

/// The last audit row's per-row result of `id`.
async fn audited_row(env: &TestEnv, id: i64) -> serde_json::Value {
    let audit = env.audit_entries().await.expect("audit");
    let last = audit.last().expect("an audit row");
    assert_eq!(last.action, "REPLAY");
    last.result["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["msg_id"] == id)
        .cloned()
        .expect("the row is audited")
}

/// The pump, now able to decode the message, processes the replayed row: SUCCEEDED (with
/// `retention.raw_copy` as given: off, the text comes from the copy the replay made).
async fn process_replayed(env: &TestEnv, id: i64, raw_copy: &str) {
    let mut pump = env.stepper(&[("MSGX_RETENTION__RAW_COPY", raw_copy)]);
    match pump.step().await.expect("step") {
        StepOutcome::Processed {
            msg_id,
            outcome: Outcome::Succeeded { .. },
            ..
        } => assert_eq!(msg_id, id),
        other => {
            panic!("expected the replayed row to succeed (raw_copy {raw_copy}), got {other:?}")
        }
    }
}

#[tokio::test]
async fn replay_reads_the_raw_copy_after_the_owner_purged_the_row() {
    let env = TestEnv::new("rc_copy").await;
    let id = dead_marked_and_purged(&env, true, "A7").await;

    let report = env.ops_replay(&replay_req(id)).await;
    assert_eq!((report.applied, report.refused), (1, 0), "{report:?}");
    assert_eq!(report.rows[0].source, Some("raw_copy"));
    assert!(
        report.render().contains("raw text from raw_copy"),
        "{}",
        report.render()
    );
    let json = serde_json::to_value(&report).expect("json");
    assert_eq!(json["rows"][0]["source"], "raw_copy", "the API says it");
    let row = audited_row(&env, id).await;
    assert_eq!(row["result"], "applied");
    assert_eq!(row["source"], "raw_copy", "the audit says it: {row}");

    // The pump finds no inbox row and reads our copy: the message is processed after all.
    process_replayed(&env, id, "true").await;
    assert_eq!(gate_of(&env, "RC1").await.as_deref(), Some("A7"));
    assert_eq!(env.state_of(id).await.0, "SUCCEEDED");
    env.cleanup().await;
}

#[tokio::test]
async fn replay_prefers_the_inbox_while_the_row_is_there() {
    let env = TestEnv::new("rc_inbox").await;
    let id = dead_and_marked(&env, true, "B1").await;
    // Make the copy say something else: whatever the pump applies shows which it read.
    let other = flop(1, "RC1", &[("GATE", "ZZ")]);
    env.exec_with(
        "UPDATE raw_copy SET body = $2, raw_bytes = $3 WHERE msg_id = $1",
        |q| {
            q.bind(id)
                .bind(compress(&other).expect("compress"))
                .bind(other.len() as i32)
        },
    )
    .await;

    let report = env.ops_replay(&replay_req(id)).await;
    assert_eq!(report.applied, 1, "{report:?}");
    assert_eq!(report.rows[0].source, Some("inbox"));
    assert_eq!(audited_row(&env, id).await["source"], "inbox");
    process_replayed(&env, id, "true").await;
    assert_eq!(
        gate_of(&env, "RC1").await.as_deref(),
        Some("B1"),
        "the inbox text, not the copy"
    );
    env.cleanup().await;
}

/// Issue 29 item 2: with `retention.raw_copy` off a replay applied from the inbox takes its
/// own copy of the text in its transaction, so the DB owner's purge after it (the row keeps
/// its old mark) cannot turn it into DEAD(MALFORMED): the pump processes it from the copy.
/// The sweep then confirms the row, whose mark was confirmed before the replay (issue 41,
/// migration 0021), and `verify` notes a purge after the mark, not a violation.
#[tokio::test]
async fn a_replay_takes_its_own_copy_so_a_purge_after_it_loses_nothing() {
    let env = TestEnv::new("rc_replay_copy").await;
    let id = dead_and_marked(&env, false, "D4").await;
    assert_eq!(copies(&env).await, 0, "raw_copy off: no copy yet");
    let dry = ReplayRequest {
        dry_run: true,
        ..replay_req(id)
    };
    assert_eq!(env.ops_replay(&dry).await.applied, 1);
    assert_eq!(copies(&env).await, 0, "a dry run writes nothing");

    let report = env.ops_replay(&replay_req(id)).await;
    assert_eq!((report.applied, report.rows[0].source), (1, Some("inbox")));
    assert_eq!(copies(&env).await, 1, "the replay copied the inbox text");
    purge_inbox_row(&env, id).await;

    process_replayed(&env, id, "false").await;
    assert_eq!(gate_of(&env, "RC1").await.as_deref(), Some("D4"));
    env.sweep_all().await;
    let verify = env.verify().await;
    let present = super::common::finding(&verify, "inbox_row_present");
    assert_eq!(present.violations, 0, "{:#?}", verify.lines());
    assert!(
        present
            .notes
            .iter()
            .any(|n| n.what == "purged after the mark was confirmed"),
        "{:#?}",
        verify.lines()
    );
    env.cleanup().await;
}

#[tokio::test]
async fn replay_without_a_copy_refuses_once_the_row_is_gone() {
    let env = TestEnv::new("rc_none").await;
    let id = dead_marked_and_purged(&env, false, "C3").await;

    let dry = ReplayRequest {
        dry_run: true,
        ..replay_req(id)
    };
    let report = env.ops_replay(&dry).await;
    assert_eq!((report.applied, report.refused), (0, 1), "{report:?}");
    let report = env.ops_replay(&replay_req(id)).await;
    assert_eq!((report.applied, report.refused), (0, 1), "{report:?}");
    let reason = report.rows[0].reason.clone().unwrap_or_default();
    // The chaos oracle knows this refusal by its prefix (`ops_steps::refused_for_no_text`).
    assert!(reason.starts_with(replay::NO_RAW_TEXT), "{reason}");
    assert!(
        reason.contains("no raw text") && reason.contains("retention.raw_copy"),
        "{reason}"
    );
    assert!(
        reason.contains("the DB owner's purge"),
        "names the purge: {reason}"
    );
    assert_eq!(report.rows[0].source, None);
    let row = audited_row(&env, id).await;
    assert_eq!(row["result"], "refused");
    assert_eq!(
        env.state_of(id).await,
        ("DEAD".into(), Some("EXHAUSTED".into())),
        "nothing changed"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn expired_copies_go_in_bounded_batches_and_only_those() {
    let env = TestEnv::new("rc_purge").await;
    let now = Utc::now();
    let pool = env.store.pool();
    // Two messages waiting for the pump (one PENDING, one FAILED), with expired copies.
    let waiting = insert(&env, 0, &[flop(1, "P1", &[]), flop(2, "P2", &[])]).await;
    env.discover(waiting[1]).await;
    sqlx::query("UPDATE proc_state SET state = 'FAILED', error_class = 'INFRA' WHERE msg_id = $1")
        .bind(waiting[1])
        .execute(pool)
        .await
        .expect("failed");
    let add = |ids: Vec<i64>, at: chrono::DateTime<Utc>| async move {
        sqlx::query(
            "INSERT INTO raw_copy (msg_id, copied_at, raw_bytes, body) \
             SELECT id, $2, 3, '\\x01'::bytea FROM UNNEST($1::bigint[]) AS id",
        )
        .bind(ids)
        .bind(at)
        .execute(pool)
        .await
        .expect("copies");
    };
    let expired: Vec<i64> = (1001..=1025).collect();
    let fresh: Vec<i64> = (1026..=1030).collect();
    add(expired.clone(), now - Days::days(40)).await;
    add(fresh.clone(), now - Days::days(1)).await;
    add(waiting.clone(), now - Days::days(40)).await;

    let before = now - Days::days(30);
    let mut batches = Vec::new();
    loop {
        let n = purge_expired_raw_copies(pool, before, 10)
            .await
            .expect("purge");
        batches.push(n);
        if n < 10 {
            break;
        }
    }
    assert_eq!(batches, vec![10, 10, 5], "bounded batches");
    let left: Vec<i64> = sqlx::query_scalar("SELECT msg_id FROM raw_copy ORDER BY msg_id")
        .fetch_all(pool)
        .await
        .expect("left");
    let mut want = waiting.clone();
    want.extend(&fresh);
    assert_eq!(
        left, want,
        "fresh copies and those of waiting messages stay"
    );
    assert_eq!(
        purge_expired_raw_copies(pool, before, 0).await.expect("0"),
        0
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_message_of_several_megabytes_round_trips() {
    let env = TestEnv::new("rc_huge").await;
    // ~6 MiB of poorly compressible filler in an element the codec ignores.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let filler: String = (0..6 * 1024 * 1024 / 16)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect();
    let text = flop(1, "BIG", &[("GATE", "H1"), ("PAD", filler.as_str())]);
    assert!(text.len() > 6_000_000);
    let id = insert(&env, 0, std::slice::from_ref(&text)).await[0];
    env.discover(id).await;
    let mut pump = env.stepper(&[
        ("MSGX_RETENTION__RAW_COPY", "true"),
        ("MSGX_PROCESSING__MAX_MESSAGE_BYTES", "16777216"),
    ]);
    match pump.step().await.expect("step") {
        StepOutcome::Processed {
            outcome: Outcome::Succeeded { .. },
            ..
        } => {}
        other => panic!("expected SUCCEEDED, got {other:?}"),
    }
    let (raw, stored): (i32, i32) =
        sqlx::query_as("SELECT raw_bytes, octet_length(body) FROM raw_copy WHERE msg_id = $1")
            .bind(id)
            .fetch_one(env.store.pool())
            .await
            .expect("copy");
    assert_eq!(raw as usize, text.len());
    assert!(stored < raw, "compressed: {stored} of {raw}");
    purge_inbox_row(&env, id).await;
    let back = env
        .store
        .raw_copies(&[id], 16 * 1024 * 1024)
        .await
        .expect("read back");
    assert_eq!(back.len(), 1);
    match &back[0].1 {
        StoredCopy::Found(msgx_core::inbox::RawMessage::Text(t)) => {
            assert!(t == &text, "byte for byte")
        }
        other => panic!("expected the text, got {other:?}"),
    }
    // Asked with a smaller limit it is refused without inflating it.
    let small = env.store.raw_copies(&[id], 1024).await.expect("read");
    assert!(matches!(
        small[0].1,
        StoredCopy::Found(msgx_core::inbox::RawMessage::TooLarge(n)) if n as usize == text.len()
    ));
    env.cleanup().await;
}
