//! The group's outcome statement against the one-by-one path, on the real store (issue 43
//! item 1): members of one group that touch the same flight apply in MSG_ID order, a member
//! whose write fails falls back under its savepoint without losing or reordering the others,
//! and a mixed group raises exactly the events (type, subject, payload, order) that
//! one-at-a-time processing raises.

use super::*;
use msgx_core::pump::stages::Stage;

/// The events of `flid` in a run, in event order: `(msg_id, event_type, payload)`.
fn events_of<'a>(snap: &'a Snapshot, flid: &str) -> Vec<(i64, &'a str, &'a str)> {
    snap.events
        .iter()
        .filter(|(_, key, _, _)| key == flid)
        .map(|(msg, _, kind, payload)| (*msg, kind.as_str(), payload.as_str()))
        .collect()
}

/// A flight's `(created_by_msg, updated_by_msg)` and stored GATE in a run.
fn flight_of(snap: &Snapshot, flid: &str) -> (i64, i64, serde_json::Value) {
    let f = snap
        .flights
        .iter()
        .find(|f| f.0 == flid)
        .unwrap_or_else(|| panic!("flight {flid} stored: {:?}", snap.flights));
    let fields: serde_json::Value = serde_json::from_str(&f.2).expect("fields");
    (f.4, f.5, fields["GATE"].clone())
}

/// Three updates of F1 (and one of F2 between them) and a flight created then updated, all in
/// one group: the batch writes F1 once with the LAST member's gate, names the first member as
/// the creator and the last as the updater, and raises F1's events in member order — the same
/// rows and events as `group_max = 1`.
#[tokio::test]
async fn same_flight_members_of_one_group_apply_in_order() {
    let spec = vec![
        Gen::Flop(1, 1),
        Gen::Flop(2, 5),
        Gen::Flop(1, 2),
        Gen::Adft(3, false),
        Gen::Flop(3, 7),
        Gen::Flop(1, 3),
    ];
    let (one, _) = run_inbox(&spec, "1").await;
    let (grouped, groups) = run_inbox(&spec, "64").await;
    assert_eq!(groups, 1, "one group: {:?}", grouped.outcomes);
    assert_eq!(one, grouped, "group_max 1 vs 64");
    let ids: Vec<i64> = grouped.outcomes.iter().map(|o| o.0).collect();
    assert!(grouped.outcomes.iter().all(|o| o.1 == "succeeded"));
    assert_eq!(grouped.order, ids, "processed_seq in MSG_ID order");

    let (created, updated, gate) = flight_of(&grouped, "F1");
    assert_eq!((created, updated), (ids[0], ids[5]));
    assert_eq!(gate, "G3", "the last member's gate");
    let f1 = events_of(&grouped, "F1");
    assert_eq!(
        f1.iter().map(|e| e.0).collect::<Vec<_>>(),
        [ids[0], ids[2], ids[5]],
        "{f1:?}"
    );
    for (i, (_, _, payload)) in f1.iter().enumerate() {
        let (this, next) = (format!("\"G{}\"", i + 1), format!("\"G{}\"", i + 2));
        assert!(
            payload.contains(&this) && !payload.contains(&next),
            "event {i} of F1 carries its own member's gate and no later one: {payload}"
        );
    }
    let f3 = events_of(&grouped, "F3");
    assert_eq!(
        f3.iter().map(|e| (e.0, e.1)).collect::<Vec<_>>(),
        [(ids[3], "FLIGHT_CREATED"), (ids[4], "FLIGHT_UPDATED")]
    );
    assert_eq!(flight_of(&grouped, "F3").0, ids[3], "created by the ADFT");
}

/// A member whose write fails (an event insert the database refuses) sits in the middle of a
/// batch: the batch statement fails, its members are written one by one under savepoints, the
/// ones before it commit in order with their events, it is FAILED, and the ones after it do not
/// run — unstamped, still PENDING — and run in order once it is out of the way (as with
/// `group_max = 1`, a FAILED head holds everything behind it).
#[tokio::test]
async fn a_failing_member_falls_back_without_losing_or_reordering_the_others() {
    let env = TestEnv::new("pump_batch_boom").await;
    boom_trigger(&env).await;
    let texts = [
        flop(1, "F1", &[("GATE", "A1")]),
        flop(2, "F2", &[("GATE", "B1")]),
        flop(3, "F1", &[("GATE", "A2")]),
        flop(4, "BOOM", &[("GATE", "X")]),
        flop(5, "F1", &[("GATE", "A3")]),
        flop(6, "F2", &[("GATE", "B2")]),
    ];
    let ids = enqueued(&env, &texts).await;
    let mut pump = fallback_stepper(&env);

    let group = pump.step_group().await.expect("group");
    assert_eq!(
        labels(&group),
        [
            (ids[0], "succeeded"),
            (ids[1], "succeeded"),
            (ids[2], "succeeded"),
            (ids[3], "failed")
        ]
    );
    let stages = pump.core().stages();
    assert_eq!(
        stages.get(Stage::Rows).1,
        6,
        "the six were built into one batch"
    );
    assert_eq!(stages.get(Stage::Savepoint).1, 4, "then written one by one");
    assert_eq!(env.processing_order().await, ids[..3]);
    assert_eq!(stored_gate(&env, "F1").await, "A2");
    assert_eq!(
        env.state_of(ids[3]).await,
        ("FAILED".into(), Some("INFRA".into()))
    );
    for id in &ids[4..] {
        assert_eq!(env.state_of(*id).await, ("PENDING".into(), None));
        assert_eq!(stamp_of(&env, *id).await, (0, None), "{id} never ran");
    }
    let events: Vec<(i64, String)> =
        sqlx::query_as("SELECT msg_id, flight_key FROM msg_event ORDER BY event_id")
            .fetch_all(env.store.pool())
            .await
            .expect("events");
    assert_eq!(
        events,
        [
            (ids[0], "F1".to_string()),
            (ids[1], "F2".to_string()),
            (ids[2], "F1".to_string())
        ],
        "the committed members' events, nothing of the failed one"
    );

    // The failed head retries, is poisoned, and the members after it run in order.
    let after: Vec<i64> = steps_until_idle(&env, &mut pump, 20)
        .await
        .into_iter()
        .filter_map(|step| match step {
            StepOutcome::Processed {
                msg_id, outcome, ..
            } if outcome.is_terminal() => Some(msg_id),
            _ => None,
        })
        .collect();
    assert_eq!(after, ids[4..], "the rest, in order");
    assert_eq!(stored_gate(&env, "F1").await, "A3");
    assert_eq!(stored_gate(&env, "F2").await, "B2");
    let order = env.processing_order().await;
    assert_eq!(order.len(), ids.len(), "every message finished: {order:?}");
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    env.cleanup().await;
}

/// A mixed group — creations, repeated updates of one flight, a code-share and its master, a
/// delete and a re-creation after it (a second batch), a schedule (written alone between
/// batches), a duplicate, a malformed and a missing row (read again: it ends the group) — raises exactly the events of one-at-a-time processing:
/// same type, subject, payload and order, for the same rows.
#[tokio::test]
async fn events_of_a_set_applied_mixed_group_equal_one_by_one() {
    let spec = vec![
        Gen::Adft(0, false),
        Gen::Adft(1, true),
        Gen::Flop(1, 4),
        Gen::Flop(0, 2),
        Gen::Fdel(0),
        Gen::Adft(0, false),
        Gen::Schedule(vec![(2, 3), (1, 9)]),
        Gen::Flop(2, 8),
        Gen::Duplicate(2),
        Gen::Malformed,
        Gen::Purged,
        Gen::Flop(1, 5),
    ];
    let (one, _) = run_inbox(&spec, "1").await;
    let (grouped, groups) = run_inbox(&spec, "64").await;
    // The missing row ends the first group (FAILED, read again); attempted before, it then
    // runs alone: FAILED again, DEAD at its last attempt (`max_attempts` 3); then the last row.
    assert_eq!(groups, 4, "four groups: {:?}", grouped.outcomes);
    assert!(
        one.events.len() >= 8,
        "the group raises events: {:?}",
        one.events
    );
    assert_eq!(one.events, grouped.events, "type, subject, payload, order");
    assert_eq!(one, grouped, "and every row");
}

/// Inserts the texts into the inbox and enqueues them; their ids, in order.
async fn enqueued(env: &TestEnv, texts: &[String]) -> Vec<i64> {
    let mut ids = Vec::new();
    for text in texts {
        ids.push(env.insert_message(text).await);
    }
    env.poll(env.poll_cfg(100)).await;
    ids
}

/// A pump for the fallback tests: groups of up to 64 fresh heads (`max_attempts` 2, so the
/// group is not cut to one member).
fn fallback_stepper(env: &TestEnv) -> Stepper {
    env.stepper(&[
        ("MSGX_PROCESSING__GROUP_MAX", "64"),
        ("MSGX_PROCESSING__MAX_ATTEMPTS", "2"),
    ])
}

/// The outcomes of one group as `(msg_id, label)`.
fn labels(group: &[StepOutcome]) -> Vec<(i64, &'static str)> {
    group
        .iter()
        .map(|s| match s {
            StepOutcome::Processed {
                msg_id, outcome, ..
            } => (*msg_id, outcome.label()),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// Members that end without business work — malformed (DEAD) and a duplicate (SKIPPED) —
/// between planned ones ride in the group's ONE outcome statement instead of splitting it
/// (a realistic feed has ~2 % malformed messages: a group of 256 was cut into ~6 statements),
/// and leave exactly the rows their own statements left: class, text, type, processing order.
#[tokio::test]
async fn dead_and_duplicate_members_ride_in_the_batch_statement() {
    let env = TestEnv::new("pump_batch_terminals").await;
    let texts = [
        flop(1, "F1", &[("GATE", "A1")]),
        "<MSG><META><SNDR>AODB</SNDR></META>".to_string(),
        flop(2, "F2", &[("GATE", "B1")]),
        flop(1, "F9", &[("GATE", "Z")]), // the identity of the first
        flop(3, "F1", &[("GATE", "A2")]),
        "   ".to_string(),
        flop(4, "F3", &[("GATE", "C1")]),
    ];
    let ids = enqueued(&env, &texts).await;
    let mut pump = env.stepper(&[("MSGX_PROCESSING__GROUP_MAX", "64")]);

    let group = pump.step_group().await.expect("group");
    let want = [
        "succeeded",
        "dead",
        "succeeded",
        "skipped",
        "succeeded",
        "dead",
        "succeeded",
    ];
    let want: Vec<(i64, &str)> = ids.iter().copied().zip(want).collect();
    assert_eq!(labels(&group), want);
    let stages = pump.core().stages();
    assert_eq!(
        (stages.groups, stages.batches),
        (1, 1),
        "one group, one outcome statement"
    );
    assert_eq!(
        env.processing_order().await,
        ids,
        "processed in MSG_ID order"
    );
    for id in [ids[1], ids[5]] {
        assert_eq!(
            env.state_of(id).await,
            ("DEAD".into(), Some("MALFORMED".into()))
        );
    }
    assert_eq!(
        env.state_of(ids[3]).await,
        ("SKIPPED".into(), Some("DUPLICATE".into()))
    );
    let (ty, text, reason, identity): (Option<String>, String, String, Option<String>) =
        sqlx::query_as(
            "SELECT msg_type, error_text, terminal_reason, identity_key FROM proc_state \
             WHERE msg_id = $1",
        )
        .bind(ids[3])
        .fetch_one(env.store.pool())
        .await
        .expect("duplicate row");
    assert_eq!(ty.as_deref(), Some("FLOP-UPDT"));
    assert!(
        text.contains(&ids[0].to_string()),
        "names the holder: {text}"
    );
    assert_eq!((reason.as_str(), identity), ("DUPLICATE", None));
    assert_eq!(stored_gate(&env, "F1").await, "A2");
    env.cleanup().await;
}

/// A batch holding a DEAD member whose statement fails (a planned member after it is refused):
/// one by one, the DEAD member keeps its place — the member before it commits, it is DEAD, the
/// refused one FAILED, and the one after it does not run.
#[tokio::test]
async fn a_dead_member_keeps_its_place_when_its_batch_falls_back() {
    let env = TestEnv::new("pump_batch_terminal_boom").await;
    boom_trigger(&env).await;
    let texts = [
        flop(1, "F1", &[("GATE", "A1")]),
        "<MSG><META><SNDR>AODB</SNDR></META>".to_string(),
        flop(2, "BOOM", &[("GATE", "X")]),
        flop(3, "F1", &[("GATE", "A2")]),
    ];
    let ids = enqueued(&env, &texts).await;
    let mut pump = fallback_stepper(&env);

    let group = pump.step_group().await.expect("group");
    assert_eq!(
        labels(&group),
        [(ids[0], "succeeded"), (ids[1], "dead"), (ids[2], "failed")]
    );
    assert_eq!(
        pump.core().stages().batches,
        1,
        "one statement, then one by one"
    );
    assert_eq!(env.processing_order().await, ids[..2]);
    assert_eq!(
        env.state_of(ids[1]).await,
        ("DEAD".into(), Some("MALFORMED".into()))
    );
    assert_eq!(env.state_of(ids[3]).await, ("PENDING".into(), None));
    assert_eq!(stamp_of(&env, ids[3]).await, (0, None), "never ran");
    assert_eq!(stored_gate(&env, "F1").await, "A1");
    env.cleanup().await;
}
