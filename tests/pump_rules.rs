//! The pump step against real MariaDB + PostgreSQL with the injected clock: FIFO blocking by a
//! FAILED head, poison escalation, compat rows beyond W, outcome classes, INFRA on a cut
//! inbox connection (an outage never poisons a good head), and an injected half-way failure of the business transaction.
//! `batch.rs`: a group's outcome statement against the one-by-one path (same-flight order,
//! the savepoint fallback, identical events).

use msgx_testkit as common;

use std::time::Duration;

use common::drive::Stepper;
use common::msgs::{fdel, flop, unknown_type};
use common::proxied::{ProxiedInbox, QUICK_INBOX};
use common::proxy::Proxy;
use common::seed::Proc;
use common::TestEnv;
use msgx_core::clock::Clock as _;
use msgx_core::codec::Codec as _;
use msgx_core::pump::{ErrorClass, Outcome, StepOutcome};
use msgx_core::store::{Store, PIPELINE_LOCK_KEY};

#[path = "pump_rules/batch.rs"]
mod batch;

fn outcome(step: StepOutcome) -> (i64, Outcome) {
    match step {
        StepOutcome::Processed {
            msg_id, outcome, ..
        } => (msg_id, outcome),
        other => panic!("expected a processed head, got {other:?}"),
    }
}

/// The GATE flight `flid` holds as stored.
async fn stored_gate(env: &TestEnv, flid: &str) -> String {
    env.scalar_for(
        "SELECT fields->>'GATE' FROM flight_state WHERE flid = $1",
        flid.to_string(),
    )
    .await
}

/// An outcome's kind and its error class (or skip reason): what most checks here compare.
fn kind(o: &Outcome) -> (&'static str, Option<ErrorClass>) {
    match o {
        Outcome::Skipped { reason, .. } => ("skipped", Some(*reason)),
        Outcome::Dead { class, .. } => ("dead", Some(*class)),
        Outcome::Failed { class, .. } => ("failed", Some(*class)),
        other => (other.label(), None),
    }
}

#[tokio::test]
async fn failed_head_blocks_everything_until_due_then_poison_by_deadline() {
    let env = TestEnv::new("pump_block").await;
    let bad = env.insert_message(&unknown_type(1)).await;
    let good = env.insert_message(&flop(2, "F1", &[("GATE", "A1")])).await;
    env.poll(env.poll_cfg(100)).await;
    let mut pump = env.stepper(&[]);

    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!(id, bad);
    assert_eq!(kind(&o), ("failed", Some(ErrorClass::Unsupported)), "{o:?}");
    // Not due: the head waits and the good message behind it waits too.
    for _ in 0..3 {
        assert!(
            matches!(pump.step().await.expect("step"), StepOutcome::Waiting { msg_id, .. } if msg_id == bad)
        );
    }
    assert_eq!(env.state_of(good).await.0, "PENDING");

    env.clock.advance(Duration::from_secs(5)); // retry_initial
    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!(id, bad, "retried when due, still first");
    assert!(matches!(o, Outcome::Failed { .. }));
    assert_eq!(env.state_of(good).await.0, "PENDING");

    // 10 minutes after the first attempt the FAILED head is poison.
    env.clock.advance(Duration::from_secs(600));
    assert!(
        matches!(pump.step().await.expect("step"), StepOutcome::Poisoned { msg_id, .. } if msg_id == bad)
    );
    assert_eq!(
        env.state_of(bad).await,
        ("DEAD".into(), Some("EXHAUSTED".into()))
    );
    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!((id, o.label()), (good, "succeeded"));
    assert_eq!(env.processing_order().await, vec![bad, good]);
    // The poison statement wrote the backfill intent with the terminal state.
    let intent: Option<chrono::DateTime<chrono::Utc>> = env
        .scalar_for(
            "SELECT backfill_next_at FROM proc_state WHERE msg_id = $1",
            bad,
        )
        .await;
    assert!(intent.is_some());
    env.cleanup().await;
}

#[tokio::test]
async fn poison_by_attempts() {
    let env = TestEnv::new("pump_attempts").await;
    let bad = env.insert_message(&unknown_type(1)).await;
    env.poll(env.poll_cfg(100)).await;
    let mut pump = env.stepper(&[("MSGX_PROCESSING__MAX_ATTEMPTS", "3")]);
    for _ in 0..3 {
        let (_, o) = outcome(pump.step().await.expect("step"));
        assert!(matches!(o, Outcome::Failed { .. }));
        env.clock.advance(Duration::from_secs(60));
    }
    env.step_poisons(&mut pump, bad).await;
    env.cleanup().await;
}

#[tokio::test]
async fn compat_row_beyond_w_waits_until_w_catches_up() {
    let env = TestEnv::new("pump_compat").await;
    let a = env.insert_message(&flop(1, "F1", &[("GATE", "A1")])).await;
    let b = env.insert_message(&flop(2, "F1", &[("GATE", "A2")])).await;
    let c = env.insert_message(&flop(3, "F1", &[("GATE", "A3")])).await;
    // The compat entry registers c directly, before the poller has seen anything.
    let compat = Proc {
        source: "COMPAT",
        ..Proc::pending(c, chrono::Utc::now())
    };
    compat.insert(&env).await;
    let mut pump = env.stepper(&[]);
    assert_eq!(
        pump.step().await.expect("step"),
        StepOutcome::Idle,
        "c > W = 0 waits"
    );
    let r = env.poll(env.poll_cfg(100)).await;
    assert_eq!(
        (r.advance.w, r.enqueued_new),
        (c, 2),
        "c was already enqueued"
    );
    for _ in 0..3 {
        outcome(pump.step().await.expect("step"));
    }
    assert_eq!(env.processing_order().await, vec![a, b, c]);
    assert_eq!(stored_gate(&env, "F1").await, "A3", "applied in id order");
    env.cleanup().await;
}

#[tokio::test]
async fn duplicate_malformed_unsupported_and_missing_rows() {
    let env = TestEnv::new("pump_classes").await;
    let first = env.insert_message(&flop(7, "F1", &[("GATE", "A1")])).await;
    let dup = env.insert_message(&flop(7, "F1", &[("GATE", "B9")])).await; // same SNDR|TYPE|STYP|SEQN
    let malformed = env
        .insert_message("<MSG><META><SNDR>AODB</SNDR></META>")
        .await;
    let empty = env.insert_message("   ").await;
    let unsupported = env.insert_message(&unknown_type(8)).await;
    env.poll(env.poll_cfg(100)).await;
    // A row enqueued and then purged by the DB owner before processing.
    let purged = env.insert_message(&flop(9, "F2", &[])).await;
    env.poll(env.poll_cfg(100)).await;
    env.delete_as_owner(&[purged]).await;

    let mut pump = env.stepper(&[]);
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(outcome(pump.step().await.expect("step")));
    }
    let kinds: Vec<_> = seen.iter().map(|(_, o)| kind(o)).collect();
    assert_eq!(
        kinds,
        [
            ("succeeded", None),
            ("skipped", Some(ErrorClass::Duplicate)),
            ("dead", Some(ErrorClass::Malformed)),
            ("dead", Some(ErrorClass::Malformed)),
            ("failed", Some(ErrorClass::Unsupported)),
        ]
    );
    assert_eq!(env.state_of(first).await.0, "SUCCEEDED");
    let mut states = Vec::new();
    for id in [dup, malformed, empty, unsupported] {
        states.push(env.state_of(id).await);
    }
    let class = |state: &str, class: &str| (state.to_string(), Some(class.to_string()));
    assert_eq!(
        states,
        [
            class("SKIPPED", "DUPLICATE"),
            class("DEAD", "MALFORMED"),
            class("DEAD", "MALFORMED"),
            class("FAILED", "UNSUPPORTED"),
        ]
    );
    // The duplicate changed nothing.
    assert_eq!(stored_gate(&env, "F1").await, "A1");

    // Past the unsupported head (poison), the purged row is read again for
    // `processing.missing_row_grace` (1m) from its first attempt, then DEAD MALFORMED.
    env.clock.advance(Duration::from_secs(3600));
    assert!(matches!(
        pump.step().await.expect("step"),
        StepOutcome::Poisoned { .. }
    ));
    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!(id, purged);
    assert!(
        matches!(o, Outcome::Failed { class: ErrorClass::Malformed, ref detail, .. } if detail.contains("missing")),
        "{o:?}"
    );
    env.clock.advance(Duration::from_secs(61));
    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!(id, purged);
    assert!(
        matches!(o, Outcome::Dead { class: ErrorClass::Malformed, ref detail } if detail.contains("missing")),
        "{o:?}"
    );
    env.cleanup().await;
}

/// A row the pump finds missing may be gone only for a moment: a plan B rotation done in
/// steps (copy the rows above the boundary, `RENAME`, then copy the rows written to the old
/// table meanwhile) leaves a discovered row absent between the `RENAME` and the catch-up copy.
/// Read in that window, it is FAILED and read again with the backoff, and ends as its text
/// says once the copy lands — never DEAD(MALFORMED), which is not replayable.
#[tokio::test]
async fn a_row_missing_for_a_moment_is_read_again_not_dead() {
    let env = TestEnv::new("pump_missing_moment").await;
    let before = env.insert_message(&flop(1, "M1", &[("GATE", "A1")])).await;
    let caught = env.insert_message(&flop(2, "M2", &[("GATE", "B2")])).await;
    let behind = env.insert_message(&flop(3, "M3", &[("GATE", "C3")])).await;
    env.poll(env.poll_cfg(100)).await;
    // The rotation's first steps, as the DB owner: the new table holds the rows copied before
    // `caught` and `behind` were written; the rename makes it the inbox.
    env.owner_exec("CREATE TABLE CMINMSGS_NEW LIKE CMINMSGS")
        .await;
    env.owner_exec(&format!(
        "INSERT INTO CMINMSGS_NEW SELECT * FROM CMINMSGS WHERE CMINMSGS_ID <= {before}"
    ))
    .await;
    env.owner_exec("RENAME TABLE CMINMSGS TO CMINMSGS_OLD, CMINMSGS_NEW TO CMINMSGS")
        .await;
    let mut pump = env.stepper(&[]);
    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!((id, o.label()), (before, "succeeded"));
    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!(id, caught);
    assert!(
        matches!(o, Outcome::Failed { class: ErrorClass::Malformed, ref detail, .. } if detail.contains("missing")),
        "{o:?}"
    );
    assert_eq!(env.state_of(caught).await.0, "FAILED");
    // FIFO: the row behind waits for it.
    assert!(matches!(
        pump.step().await.expect("step"),
        StepOutcome::Waiting { msg_id, .. } if msg_id == caught
    ));
    // The catch-up copy; the retry is due after `processing.retry_initial` (5s).
    env.owner_exec(
        "INSERT INTO CMINMSGS SELECT o.* FROM CMINMSGS_OLD o \
         LEFT JOIN CMINMSGS n ON n.CMINMSGS_ID = o.CMINMSGS_ID WHERE n.CMINMSGS_ID IS NULL",
    )
    .await;
    env.owner_exec("DROP TABLE CMINMSGS_OLD").await;
    env.clock.advance(Duration::from_secs(5));
    let mut ends = Vec::new();
    for _ in 0..2 {
        let (id, o) = outcome(pump.step().await.expect("step"));
        ends.push((id, o.label()));
    }
    assert_eq!(ends, [(caught, "succeeded"), (behind, "succeeded")]);
    assert_eq!(stored_gate(&env, "M2").await, "B2");
    env.cleanup().await;
}

#[tokio::test]
async fn inbox_cut_during_raw_read_is_infra_never_dead() {
    let env = TestEnv::new("pump_infra").await;
    let id = env.insert_message(&flop(1, "F1", &[("GATE", "A1")])).await;
    env.poll(env.poll_cfg(100)).await;
    let ProxiedInbox {
        proxy,
        inbox: via_proxy,
        ..
    } = env.inbox_via_proxy(QUICK_INBOX).await;
    let mut pump = Stepper::new(env.pump_with_inbox(via_proxy, &[]));

    proxy.cut();
    let (_, o) = outcome(pump.step().await.expect("step"));
    assert_eq!(kind(&o), ("failed", Some(ErrorClass::Infra)), "{o:?}");
    assert_eq!(
        env.state_of(id).await,
        ("FAILED".into(), Some("INFRA".into()))
    );

    proxy.restore();
    env.clock.advance(Duration::from_secs(5));
    let (_, o) = outcome(pump.step().await.expect("step"));
    assert_eq!(o.label(), "succeeded", "{o:?}");
    env.cleanup().await;
}

/// Issue 29 (soak plan `issue29-soak-infra-poison-366283449`): an inbox outage longer than
/// `max_attempts` retries and than `head_deadline` leaves a good head FAILED(INFRA), its
/// attempts not charged and its deadline not aging (SPEC §4: a store outage is INFRA with
/// backoff), the backoff doubling; once the inbox is back it succeeds. A head that had run
/// before (a crash charged it one attempt) keeps that attempt; its deadline starts again at
/// the next attempt.
#[tokio::test]
async fn inbox_outage_never_poisons_a_good_head() {
    let env = TestEnv::new("pump_outage").await;
    let a = env.insert_message(&flop(1, "F1", &[("GATE", "A1")])).await;
    let b = env.insert_message(&flop(2, "F2", &[("GATE", "B1")])).await;
    env.poll(env.poll_cfg(100)).await;
    let ProxiedInbox {
        proxy,
        inbox: via_proxy,
        ..
    } = env.inbox_via_proxy(QUICK_INBOX).await;
    let rules = [
        ("MSGX_PROCESSING__MAX_ATTEMPTS", "3"),
        ("MSGX_PROCESSING__HEAD_DEADLINE", "30s"),
        ("MSGX_PROCESSING__RETRY_INITIAL", "5s"),
        ("MSGX_PROCESSING__RETRY_MAX", "5m"),
    ];
    let mut pump = Stepper::new(env.pump_with_inbox(via_proxy.clone(), &rules));

    proxy.cut();
    let delays = outage_failures(&env, &mut pump, a, 5).await;
    assert_eq!(
        delays,
        [5, 10, 20, 40, 80],
        "the backoff doubles per outage failure"
    );
    assert_eq!(
        stamp_of(&env, a).await,
        (0, None),
        "no attempt charged, no deadline started"
    );
    proxy.restore();
    back_after_outage(&env, &mut pump, a).await;

    // b ran once before (a crash after its stamp): that attempt stays, the deadline restarts.
    let long_ago = env.clock.now() - chrono::Duration::hours(1);
    sqlx::query("UPDATE proc_state SET attempts = 1, processing_started_at = $2 WHERE msg_id = $1")
        .bind(b)
        .bind(long_ago)
        .execute(env.store.pool())
        .await
        .expect("crashed attempt");
    // A fresh pump: the first one read b's text ahead with a's.
    let mut pump = Stepper::new(env.pump_with_inbox(via_proxy, &rules));
    proxy.cut();
    outage_failures(&env, &mut pump, b, 4).await;
    assert_eq!(
        stamp_of(&env, b).await,
        (1, None),
        "only the crashed attempt counts; the deadline starts again at the next attempt"
    );
    proxy.restore();
    back_after_outage(&env, &mut pump, b).await;
    env.cleanup().await;
}

/// The inbox is back: `head` succeeds (a pooled connection the cut left broken may fail it
/// INFRA once more first).
async fn back_after_outage(env: &TestEnv, pump: &mut Stepper, head: i64) {
    for _ in 0..3 {
        env.clock.advance(Duration::from_secs(600));
        let (id, o) = outcome(step_ok(pump).await);
        assert_eq!(id, head, "{o:?}");
        if o.label() == "succeeded" {
            return;
        }
        assert_eq!(kind(&o), ("failed", Some(ErrorClass::Infra)), "{o:?}");
    }
    panic!("{head} did not succeed once the inbox was back");
}

/// `n` pump steps during an inbox outage, each once the head is due (10 min later: past the
/// backoff and `head_deadline`): every one FAILED(INFRA) on `head`, none poisons. The delays
/// of the backoff, in seconds.
async fn outage_failures(env: &TestEnv, pump: &mut Stepper, head: i64, n: usize) -> Vec<i64> {
    let mut delays = Vec::new();
    for _ in 0..n {
        env.clock.advance(Duration::from_secs(600));
        let now = env.clock.now();
        let step = step_ok(pump).await;
        let StepOutcome::Processed {
            msg_id,
            outcome:
                Outcome::Failed {
                    class: ErrorClass::Infra,
                    next_attempt_at,
                    ..
                },
            ..
        } = step
        else {
            panic!("an outage fails the head INFRA, it never poisons it: {step:?}");
        };
        assert_eq!(msg_id, head);
        assert_eq!(
            env.state_of(head).await,
            ("FAILED".into(), Some("INFRA".into()))
        );
        delays.push((next_attempt_at - now).num_seconds());
    }
    delays
}

#[tokio::test]
async fn business_transaction_failing_half_way_leaves_nothing_and_is_retried() {
    let env = TestEnv::new("pump_rollback").await;
    boom_trigger(&env).await;
    let id = env
        .insert_message(&common::msgs::schedule(
            1,
            &[("OK1", &[("GATE", "A1")]), ("BOOM", &[("GATE", "B1")])],
        ))
        .await;
    env.poll(env.poll_cfg(100)).await;
    let mut pump = env.stepper(&[]);
    let (_, o) = outcome(pump.step().await.expect("step"));
    assert!(
        matches!(o, Outcome::Failed { class: ErrorClass::Infra, ref detail, .. } if detail.contains("injected")),
        "{o:?}"
    );
    let flights: i64 = env.scalar("SELECT count(*) FROM flight_state").await;
    let events: i64 = env.scalar("SELECT count(*) FROM msg_event").await;
    let snaps: i64 = env.scalar("SELECT count(*) FROM schd_snap_log").await;
    assert_eq!(
        (flights, events, snaps),
        (0, 0, 0),
        "no partial change survives"
    );

    env.exec("DROP TRIGGER boom ON msg_event").await;
    env.clock.advance(Duration::from_secs(5));
    let (_, o) = outcome(pump.step().await.expect("step"));
    assert!(matches!(o, Outcome::Succeeded { changes: 2, .. }), "{o:?}");
    let events: Vec<String> = env
        .column_for(
            "SELECT event_type FROM msg_event WHERE msg_id = $1 ORDER BY event_id",
            id,
        )
        .await;
    assert_eq!(
        events,
        vec!["FLIGHT_CREATED", "FLIGHT_CREATED", "SCHEDULE_APPLIED"]
    );
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}

#[tokio::test]
async fn flight_rules_through_the_store_merge_cascade_and_redelete() {
    let env = TestEnv::new("pump_flights").await;
    use common::msgs::{adft, schedule};
    let ids = [
        env.insert_message(&schedule(
            1,
            &[
                ("A", &[("GATE", "G1"), ("STAT", "SCH")]),
                ("B", &[("GATE", "G2")]),
            ],
        ))
        .await,
        env.insert_message(&flop(2, "A", &[("GATE", "-"), ("ETOT", "20261130101500")]))
            .await,
        env.insert_message(&schedule(3, &[("A", &[("STND", "S7")])]))
            .await,
        env.insert_message(&adft(4, "M", &[("AWCD", "CA"), ("FLNO", "CA1234")]))
            .await,
        env.insert_message(&adft(5, "S1", &[("AWCD", "KE"), ("MFID", "M")]))
            .await,
        env.insert_message(&adft(6, "S2", &[("AWCD", "SQ"), ("MFID", "M")]))
            .await,
        env.insert_message(&fdel(7, "M")).await,
        env.insert_message(&fdel(8, "M")).await,
    ];
    env.poll(env.poll_cfg(100)).await;
    let mut pump = env.stepper(&[]);
    for _ in ids {
        let (_, o) = outcome(pump.step().await.expect("step"));
        assert_eq!(o.label(), "succeeded", "{o:?}");
    }
    let flights: Vec<(String, serde_json::Value)> = env
        .rows("SELECT flid, fields FROM flight_state ORDER BY flid")
        .await;
    let by: std::collections::BTreeMap<_, _> = flights.into_iter().collect();
    assert_eq!(
        by.keys().cloned().collect::<Vec<_>>(),
        vec!["A", "B"],
        "M and its shares deleted; B kept"
    );
    let a = &by["A"];
    assert_eq!(a.get("GATE"), None, "cleared by FLOP");
    assert_eq!(a["STAT"], "SCH", "not carried by the 2nd schedule: kept");
    assert_eq!(a["STND"], "S7");
    assert_eq!(a["ETOT"], "20261130101500");
    let deleted: Vec<String> = env.column("SELECT flight_key FROM msg_event WHERE event_type = 'FLIGHT_DELETED' ORDER BY event_id").await;
    assert_eq!(
        deleted,
        vec!["M", "S1", "S2"],
        "cascade after the master, once"
    );
    let redelete_events: i64 = env
        .scalar_for("SELECT count(*) FROM msg_event WHERE msg_id = $1", ids[7])
        .await;
    assert_eq!(redelete_events, 0, "re-delete is a no-op");
    let snaps: i64 = env.scalar("SELECT count(*) FROM schd_snap_log").await;
    assert_eq!(snaps, 2);
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
}

/// A message that binds its identity, fails INFRA on every business attempt (an injected
/// trigger) and is escalated to DEAD(EXHAUSTED): a DEAD record that held an identity.
async fn dead_holder(env: &TestEnv, pump: &mut Stepper) -> i64 {
    boom_trigger(env).await;
    let a = env
        .insert_message(&flop(42, "BOOM", &[("GATE", "A1")]))
        .await;
    env.poll(env.poll_cfg(100)).await;
    let (_, o) = outcome(pump.step().await.expect("step"));
    assert_eq!(kind(&o), ("failed", Some(ErrorClass::Infra)), "{o:?}");
    env.clock.advance(Duration::from_secs(3600));
    env.step_poisons(pump, a).await;
    // The group-commit pump binds an identity inside the business write, so a message whose
    // business write never succeeded holds none. A DEAD record with an identity is what an
    // earlier version (which bound it in a statement of its own) left behind: make one.
    let key = msgx_core::codec::xml::XmlCodec::new(
        chrono_tz::Asia::Shanghai,
        1 << 20,
        vec!["UPDT".into()],
    )
    .decode(&flop(42, "BOOM", &[("GATE", "A1")]))
    .expect("decodes")
    .identity_key(false, chrono_tz::Asia::Shanghai);
    env.exec_with(
        "UPDATE proc_state SET identity_key = $2 WHERE msg_id = $1 AND identity_key IS NULL",
        |q| q.bind(a).bind(&key),
    )
    .await;
    let bound: Option<String> = env
        .scalar_for("SELECT identity_key FROM proc_state WHERE msg_id = $1", a)
        .await;
    assert_eq!(bound, Some(key), "the DEAD record holds its identity");
    env.exec("DROP TRIGGER boom ON msg_event").await;
    a
}

async fn replay_dead(env: &TestEnv, id: i64) {
    let req = common::replay_of_dead(id, "infra fixed", None);
    let r = env.ops_replay(&req).await;
    assert_eq!(r.applied, 1, "{r:?}");
}

/// Re-send first, replay later: the re-send is processed (a DEAD record holds no identity);
/// the replayed DEAD record then ends SKIPPED(DUPLICATE) naming the re-send.
#[tokio::test]
async fn dead_record_releases_its_identity_resend_then_replay() {
    let env = TestEnv::new("ident_resend").await;
    let mut pump = env.stepper(&[]);
    let a = dead_holder(&env, &mut pump).await;
    let b = env
        .insert_message(&flop(42, "BOOM", &[("GATE", "B2")]))
        .await;
    env.poll(env.poll_cfg(100)).await;
    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!((id, o.label()), (b, "succeeded"), "{o:?}");
    replay_dead(&env, a).await;
    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!(id, a);
    assert!(
        matches!(&o, Outcome::Skipped { reason: ErrorClass::Duplicate, detail } if detail.contains(&format!("bound to message {b}"))),
        "{o:?}"
    );
    let text: String = env
        .scalar_for("SELECT error_text FROM proc_state WHERE msg_id = $1", a)
        .await;
    assert!(text.contains(&b.to_string()), "names the holder: {text}");
    assert_eq!(
        stored_gate(&env, "BOOM").await,
        "B2",
        "the re-send's data stands"
    );
    env.cleanup().await;
}

/// Replay first, re-send later: the replayed record binds the identity again and succeeds;
/// the later re-send is then SKIPPED(DUPLICATE) naming it.
#[tokio::test]
async fn dead_record_releases_its_identity_replay_then_resend() {
    let env = TestEnv::new("ident_replay").await;
    let mut pump = env.stepper(&[]);
    let a = dead_holder(&env, &mut pump).await;
    replay_dead(&env, a).await;
    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!((id, o.label()), (a, "succeeded"), "{o:?}");
    let b = env
        .insert_message(&flop(42, "BOOM", &[("GATE", "B2")]))
        .await;
    env.poll(env.poll_cfg(100)).await;
    let (id, o) = outcome(pump.step().await.expect("step"));
    assert_eq!(id, b);
    assert!(
        matches!(&o, Outcome::Skipped { reason: ErrorClass::Duplicate, detail } if detail.contains(&format!("bound to message {a}"))),
        "{o:?}"
    );
    env.cleanup().await;
}

/// One kind of generated inbox message for the group-commit property.
#[derive(Debug, Clone)]
enum Gen {
    Flop(usize, u32),
    Adft(usize, bool),
    Fdel(usize),
    Schedule(Vec<(usize, u32)>),
    /// The SNDR|TYPE|STYP|SEQN of an earlier message (index): SKIPPED(DUPLICATE).
    Duplicate(usize),
    Malformed,
    Empty,
    Unknown,
    /// Flight BOOM: the business transaction fails (trigger) every time → FAILED(INFRA), poison.
    Boom,
    /// Purged from the inbox after enqueue: FAILED(MALFORMED) "missing", read again until its
    /// last attempt, then DEAD(MALFORMED).
    Purged,
}

fn generate(seed: u64, n: usize) -> Vec<Gen> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| match rng.random_range(0..100) {
            0..=39 => Gen::Flop(rng.random_range(0..8), rng.random_range(0..50)),
            40..=49 => Gen::Adft(rng.random_range(0..8), rng.random_bool(0.3)),
            50..=57 => Gen::Fdel(rng.random_range(0..8)),
            58..=67 => Gen::Schedule(
                (0..rng.random_range(1..4))
                    .map(|_| (rng.random_range(0..8), rng.random_range(0..50)))
                    .collect(),
            ),
            68..=74 if i > 0 => Gen::Duplicate(rng.random_range(0..i)),
            75..=79 => Gen::Malformed,
            80..=82 => Gen::Empty,
            83..=86 => Gen::Unknown,
            87..=90 => Gen::Boom,
            91..=93 => Gen::Purged,
            _ => Gen::Flop(rng.random_range(0..8), rng.random_range(0..50)),
        })
        .collect()
}

/// The message text of `spec[i]` (sequence number = index + 1, so duplicates reuse one).
fn text_of(spec: &[Gen], i: usize) -> String {
    let seq = i as i64 + 1;
    let flid = |f: &usize| format!("F{f}");
    match &spec[i] {
        Gen::Flop(f, g) => flop(seq, &flid(f), &[("GATE", &format!("G{g}"))]),
        Gen::Purged => flop(seq, "PURGED", &[("GATE", "P")]),
        Gen::Adft(f, shared) => {
            if *shared {
                common::msgs::adft(seq, &flid(f), &[("AWCD", "KE"), ("MFID", "F0")])
            } else {
                common::msgs::adft(seq, &flid(f), &[("AWCD", "CA"), ("FLNO", "CA1")])
            }
        }
        Gen::Fdel(f) => fdel(seq, &flid(f)),
        Gen::Schedule(fs) => {
            let fields: Vec<(String, String)> =
                fs.iter().map(|(f, g)| (flid(f), format!("S{g}"))).collect();
            let flights: Vec<(&str, [(&str, &str); 1])> = fields
                .iter()
                .map(|(f, g)| (f.as_str(), [("STND", g.as_str())]))
                .collect();
            let refs: Vec<(&str, &[(&str, &str)])> =
                flights.iter().map(|(f, a)| (*f, &a[..])).collect();
            common::msgs::schedule(seq, &refs)
        }
        Gen::Duplicate(of) => {
            let of_seq = *of as i64 + 1;
            flop(of_seq, "F1", &[("GATE", "DUP")])
        }
        Gen::Malformed => "<MSG><META><SNDR>AODB</SNDR></META>".into(),
        Gen::Empty => "   ".into(),
        Gen::Unknown => unknown_type(seq),
        Gen::Boom => flop(seq, "BOOM", &[("GATE", "B")]),
    }
}

/// `msg_id, state, error_class, attempts, identity_key, msg_type` of a row.
type RowFacts = (
    i64,
    String,
    Option<String>,
    i32,
    Option<String>,
    Option<String>,
);

/// Everything the pump decided, comparable across runs: outcomes in order, every row, the
/// flights and the events.
#[derive(Debug, PartialEq)]
struct Snapshot {
    outcomes: Vec<(i64, String, String)>,
    rows: Vec<RowFacts>,
    order: Vec<i64>,
    flights: Vec<(String, Option<String>, String, String, i64, i64)>,
    events: Vec<(i64, String, String, String)>,
    snaps: Vec<(i64, String)>,
}

/// Runs the inbox to the end; returns what it decided and how many groups it committed.
async fn run_inbox(spec: &[Gen], group_max: &str) -> (Snapshot, u64) {
    let env = TestEnv::new("pump_group_prop").await;
    boom_trigger(&env).await;
    let mut purge = Vec::new();
    for i in 0..spec.len() {
        let id = env.insert_message(&text_of(spec, i)).await;
        if matches!(spec[i], Gen::Purged) {
            purge.push(id);
        }
    }
    env.poll(env.poll_cfg(1000)).await;
    for id in purge {
        env.delete_as_owner(&[id]).await;
    }
    let mut pump = env.stepper(&[
        ("MSGX_PROCESSING__GROUP_MAX", group_max),
        ("MSGX_PROCESSING__MAX_ATTEMPTS", "3"),
        ("MSGX_PROCESSING__READ_AHEAD", "16"),
    ]);
    let mut outcomes = Vec::new();
    for step in steps_until_idle(&env, &mut pump, 100_000).await {
        match step {
            StepOutcome::Poisoned { msg_id, .. } => {
                outcomes.push((msg_id, "poisoned".into(), "EXHAUSTED".into()))
            }
            StepOutcome::Processed {
                msg_id, outcome, ..
            } => outcomes.push((msg_id, outcome.label().into(), outcome.class().into())),
            StepOutcome::Idle | StepOutcome::Waiting { .. } => {}
        }
    }
    let pool = env.store.pool();
    let snap = Snapshot {
        outcomes,
        rows: sqlx::query_as(
            "SELECT msg_id, state, error_class, attempts, identity_key, msg_type \
             FROM proc_state ORDER BY msg_id",
        )
        .fetch_all(pool)
        .await
        .expect("rows"),
        order: env.processing_order().await,
        flights: sqlx::query_as(
            "SELECT flid, master_flid, fields::text, versions::text, created_by_msg, \
                    updated_by_msg FROM flight_state ORDER BY flid",
        )
        .fetch_all(pool)
        .await
        .expect("flights"),
        events: sqlx::query_as(
            "SELECT msg_id, flight_key, event_type, payload::text FROM msg_event ORDER BY event_id",
        )
        .fetch_all(pool)
        .await
        .expect("events"),
        snaps: sqlx::query_as("SELECT msg_id, flights::text FROM schd_snap_log ORDER BY msg_id")
            .fetch_all(pool)
            .await
            .expect("snaps"),
    };
    common::contract::check_stored_events(&env.store).await;
    env.cleanup().await;
    (snap, pump.core().stages().groups)
}

/// Group commit changes nothing but the number of commits: on the same random inbox (with
/// duplicates, malformed, empty, unsupported, purged rows and a business failure that always
/// fails), `group_max = 1` and `group_max = 64` give the same outcomes in the same order, the
/// same rows (states, classes, attempts, identities), flights (with who created and last
/// updated them), events and snapshots. The failure sits in batches of planned members, so the
/// batch statement's fallback (members one by one) is part of every run.
#[tokio::test]
async fn group_commit_outcomes_equal_one_at_a_time_on_random_inboxes() {
    for seed in [1_u64, 2, 3] {
        let spec = generate(seed, 160);
        let (one, one_groups) = run_inbox(&spec, "1").await;
        let (grouped, groups) = run_inbox(&spec, "64").await;
        eprintln!("seed {seed}: {groups} groups vs {one_groups} one at a time");
        assert!(
            groups * 2 < one_groups,
            "seed {seed}: messages were grouped ({groups} groups vs {one_groups})"
        );
        assert!(
            one.outcomes.iter().any(|o| o.1 == "poisoned")
                && one.outcomes.iter().any(|o| o.1 == "failed")
                && one.outcomes.iter().any(|o| o.1 == "skipped")
                && one.outcomes.iter().any(|o| o.1 == "dead"),
            "seed {seed}: the inbox has failures, poison, duplicates and dead rows: {:?}",
            one.outcomes
        );
        assert_eq!(one.order.len(), spec.len(), "seed {seed}: all finished");
        assert_eq!(one, grouped, "seed {seed}: group_max 1 vs 64");
    }
}

/// The backlog gauges read the partial head index only: exact up to 10,000 unfinished rows,
/// above that the id span of the unfinished rows; the oldest is the head's time.
#[tokio::test]
async fn backlog_gauges_are_exact_when_small_and_the_id_span_when_large() {
    let env = TestEnv::new("pump_gauges").await;
    for i in 0..3 {
        env.insert_message(&flop(i + 1, "F1", &[("GATE", "A1")]))
            .await;
    }
    env.poll(env.poll_cfg(100)).await;
    let small = env.store.backlog_gauges().await.expect("gauges");
    assert_eq!(small.unfinished, 3);
    assert!(small.oldest.is_some());
    let mut pump = env.stepper(&[]);
    while pump.step().await.expect("step") != StepOutcome::Idle {}
    let none = env.store.backlog_gauges().await.expect("gauges");
    assert_eq!((none.unfinished, none.oldest), (0, None));

    // 12,000 unfinished rows with ids 1001..=13000, every third already finished: the gauge
    // gives the span (an upper bound), a plain count the truth.
    sqlx::query(
        "INSERT INTO proc_state (msg_id, enqueued_at, source, state) \
         SELECT g, now(), 'POLL', CASE WHEN g % 3 = 0 THEN 'DEAD' ELSE 'PENDING' END \
         FROM generate_series(1001, 13000) g",
    )
    .execute(env.store.pool())
    .await
    .expect("rows");
    let large = env.store.backlog_gauges().await.expect("gauges");
    let exact: i64 = env
        .scalar("SELECT count(*) FROM proc_state WHERE state IN ('PENDING', 'FAILED')")
        .await;
    assert_eq!(exact, 8000);
    assert!(
        large.unfinished >= exact && large.unfinished <= 12_000,
        "{} vs {exact}",
        large.unfinished
    );
    env.cleanup().await;
}

/// The dispatcher's backlog gauge reads the partial pending index only: exact up to 10,000
/// pending events, above that the event-id span; the oldest is the lowest pending event's
/// creation; the next retry (`next_event_retry`) comes from the backoff index.
#[tokio::test]
async fn event_backlog_is_exact_when_small_and_the_id_span_when_large() {
    let env = TestEnv::new("event_gauges").await;
    for i in 0..3 {
        env.insert_message(&flop(i + 1, "F1", &[("GATE", &format!("A{i}"))]))
            .await;
    }
    env.poll(env.poll_cfg(100)).await;
    let mut pump = env.stepper(&[]);
    while pump.step().await.expect("step") != StepOutcome::Idle {}
    let pool = env.store.pool();
    let now = chrono::Utc::now();
    let small = env.store.event_backlog().await.expect("backlog");
    let (count, first_created): (i64, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT count(*), min(created_at) FROM msg_event WHERE state = 'PENDING'")
            .fetch_one(pool)
            .await
            .expect("truth");
    assert_eq!(small.pending, count);
    assert!(count >= 3);
    assert_eq!(small.oldest, Some(first_created));
    assert_eq!(env.store.next_event_retry(now).await.expect("retry"), None);

    // 12,000 more, every third already SENT, one backing off until later.
    sqlx::query(
        "INSERT INTO msg_event (msg_id, flight_key, event_type, payload, created_at, state) \
         SELECT (SELECT min(msg_id) FROM proc_state), 'K' || g, 'T', '{}', now(), \
                CASE WHEN g % 3 = 0 THEN 'SENT' ELSE 'PENDING' END \
         FROM generate_series(1, 12000) g",
    )
    .execute(pool)
    .await
    .expect("events");
    let retry_at = now + chrono::Duration::seconds(30);
    sqlx::query(
        "UPDATE msg_event SET next_attempt_at = $1 \
         WHERE event_id = (SELECT max(event_id) FROM msg_event WHERE state = 'PENDING')",
    )
    .bind(retry_at)
    .execute(pool)
    .await
    .expect("backoff");
    let large = env.store.event_backlog().await.expect("backlog");
    let exact: i64 = sqlx::query_scalar("SELECT count(*) FROM msg_event WHERE state = 'PENDING'")
        .fetch_one(pool)
        .await
        .expect("count");
    assert_eq!(exact, count + 8000);
    assert!(
        large.pending >= exact && large.pending <= count + 12_000,
        "{} vs {exact}",
        large.pending
    );
    assert_eq!(large.oldest, Some(first_created));
    assert_eq!(
        env.store
            .next_event_retry(now)
            .await
            .expect("retry")
            .map(|t| t.timestamp_micros()),
        Some(retry_at.timestamp_micros())
    );
    env.cleanup().await;
}

/// A pump core over `store` (e.g. one with short session timeouts).
fn pump_on(env: &TestEnv, store: Store) -> Stepper {
    let settings = env.settings(&[]);
    Stepper::new(msgx_core::pump::PumpCore::new(
        env.inbox.clone(),
        store,
        msgx_actors::app::codec(&settings.processing, env.tz),
        common::shared(&env.clock),
        msgx_actors::app::pump_config(&settings.processing, &settings.retention, env.tz),
    ))
}

/// `(attempts, processing_started_at)` of a message.
async fn stamp_of(env: &TestEnv, msg_id: i64) -> (i32, Option<chrono::DateTime<chrono::Utc>>) {
    sqlx::query_as("SELECT attempts, processing_started_at FROM proc_state WHERE msg_id = $1")
        .bind(msg_id)
        .fetch_one(env.store.pool())
        .await
        .expect("row")
}

/// Fault injection in the real database: the event insert fails for flight BOOM (a store
/// error on that message: FAILED(INFRA) with backoff).
async fn boom_trigger(env: &TestEnv) {
    sqlx::raw_sql(
        "CREATE FUNCTION boom() RETURNS trigger AS $$ BEGIN \
           IF NEW.flight_key = 'BOOM' THEN RAISE EXCEPTION 'injected failure'; END IF; \
           RETURN NEW; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER boom BEFORE INSERT ON msg_event FOR EACH ROW EXECUTE FUNCTION boom();",
    )
    .execute(env.store.pool())
    .await
    .expect("trigger");
}

/// Steps the pump until it is idle (at most `max` steps), moving the clock over every wait;
/// the steps that did something (processed or poisoned), in order.
async fn steps_until_idle(env: &TestEnv, pump: &mut Stepper, max: usize) -> Vec<StepOutcome> {
    let mut done = Vec::new();
    for _ in 0..max {
        match pump.step().await.expect("step") {
            StepOutcome::Idle => break,
            StepOutcome::Waiting { until, .. } => {
                let now = msgx_core::clock::Clock::now(&env.clock);
                let wait = (until - now).to_std().unwrap_or(Duration::ZERO);
                env.clock.advance(wait + Duration::from_secs(1));
            }
            step => done.push(step),
        }
    }
    done
}

/// One step; a store error (a pooled connection the cut left broken) is retried.
async fn step_ok(pump: &mut Stepper) -> StepOutcome {
    for _ in 0..20 {
        match pump.step().await {
            Ok(step) => return step,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    pump.step().await.expect("step")
}

/// After a group that failed before its commit, long past `processing.head_deadline`, a
/// member fails once (transient) and is due again later. Asserts it backs off (FAILED,
/// `Waiting`), is not poisoned (DEAD EXHAUSTED) by time it never spent at the head, and that
/// its stamps count only its real attempt.
async fn after_the_failed_group(env: &TestEnv, pump: &mut Stepper, ids: &[i64]) {
    let (a, b) = (ids[0], ids[1]);
    env.clock.advance(Duration::from_secs(3600));
    let attempt_at = env.clock.now();
    let (id, o) = outcome(step_ok(pump).await);
    assert_eq!((id, o.label()), (a, "succeeded"), "{o:?}");
    let (id, o) = outcome(step_ok(pump).await);
    assert_eq!(
        (id, kind(&o)),
        (b, ("failed", Some(ErrorClass::Infra))),
        "{o:?}"
    );
    let next = step_ok(pump).await;
    assert!(
        matches!(next, StepOutcome::Waiting { msg_id, .. } if msg_id == b),
        "one transient failure backs off, it does not poison: {next:?}"
    );
    assert_eq!(
        env.state_of(b).await,
        ("FAILED".into(), Some("INFRA".into()))
    );
    let (attempts, started) = stamp_of(env, b).await;
    assert_eq!(attempts, 1, "the failed group's attempt was given back");
    assert_eq!(
        started.map(|t| t.timestamp_micros()),
        Some(attempt_at.timestamp_micros()),
        "head_deadline runs from the first real attempt"
    );
}

/// With [`boom_trigger`] set: the first `n` of a good message, one on flight BOOM (its business
/// write fails) and another good one, discovered; their ids.
async fn group_with_a_boom(env: &TestEnv, n: usize) -> Vec<i64> {
    boom_trigger(env).await;
    let texts = [
        flop(1, "F1", &[("GATE", "A1")]),
        flop(2, "BOOM", &[("GATE", "B1")]),
        flop(3, "F3", &[("GATE", "C1")]),
    ];
    let mut ids = Vec::new();
    for text in &texts[..n] {
        ids.push(env.insert_message(text).await);
    }
    env.poll(env.poll_cfg(100)).await;
    ids
}

/// A store connection holding the pipeline lock (as another pump would), until released.
async fn hold_pipeline_lock(env: &TestEnv) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
    let mut holder = env.store.pool().acquire().await.expect("connection");
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(PIPELINE_LOCK_KEY)
        .execute(&mut *holder)
        .await
        .expect("pipeline lock");
    holder
}

/// Lets go of the pipeline lock [`hold_pipeline_lock`] took, and of its connection.
async fn release_pipeline_lock(mut holder: sqlx::pool::PoolConnection<sqlx::Postgres>) {
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(PIPELINE_LOCK_KEY)
        .execute(&mut *holder)
        .await
        .expect("unlock");
    drop(holder);
}

/// A group that fails before its commit (the pipeline lock is held elsewhere past the
/// store's `lock_timeout`) gives its members' stamps back.
#[tokio::test]
async fn a_group_failing_before_its_commit_gives_its_stamps_back() {
    let env = TestEnv::new("pump_giveback").await;
    let ids = group_with_a_boom(&env, 3).await;
    let store = Store::connect(&env.settings(&[("MSGX_STORE__LOCK_TIMEOUT", "300ms")]).store)
        .await
        .expect("store");
    let mut pump = pump_on(&env, store);

    let holder = hold_pipeline_lock(&env).await;
    let err = pump
        .step()
        .await
        .expect_err("the group fails before its commit");
    assert!(err.to_string().contains("lock"), "{err}");
    release_pipeline_lock(holder).await;

    after_the_failed_group(&env, &mut pump, &ids).await;
    assert_eq!(stamp_of(&env, ids[2]).await, (0, None), "c never ran");
    env.cleanup().await;
}

/// The same when the store itself is cut mid-group: the stamps cannot be given back then,
/// so the pump keeps them and gives them back before its next group.
#[tokio::test]
async fn stamps_of_a_group_cut_off_from_the_store_are_given_back_when_it_returns() {
    let env = TestEnv::new("pump_giveback_cut").await;
    let ids = group_with_a_boom(&env, 2).await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let mut settings = env.settings(&[("MSGX_STORE__CONNECT_TIMEOUT", "1s")]);
    settings.store.connect.url = env
        .pg_url
        .replacen("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port), 1)
        .into();
    let store = Store::connect(&settings.store)
        .await
        .expect("store via proxy");
    let pump = pump_on(&env, store);

    // The group waits for the pipeline lock; the store goes away meanwhile.
    let holder = hold_pipeline_lock(&env).await;
    let step = tokio::spawn(async move {
        let mut pump = pump;
        let r = pump.step().await;
        (pump, r)
    });
    common::service::wait_for(
        "the group to wait for the lock",
        Duration::from_secs(10),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%pg_advisory_xact_lock%'",
            )
            .fetch_one(env.store.pool())
            .await
            .is_ok_and(|n| n > 0)
        },
    )
    .await;
    proxy.cut();
    let (mut pump, r) = step.await.expect("step task");
    assert!(r.is_err(), "{r:?}");
    assert_eq!(
        stamp_of(&env, ids[1]).await.0,
        1,
        "stamped, not given back yet"
    );
    release_pipeline_lock(holder).await;
    proxy.restore();

    after_the_failed_group(&env, &mut pump, &ids).await;
    env.cleanup().await;
}

/// Issue 21: a group is the ready heads there when it starts and commits as soon as they are
/// written — it never holds them waiting for members that are not coming (`group_max_wait` is
/// an hour here, `group_max` 256). The heads enqueued later make the next group.
#[tokio::test]
async fn a_group_commits_as_soon_as_its_ready_heads_are_done() {
    let env = TestEnv::new("pump_group_close").await;
    for i in 0..3 {
        env.insert_message(&flop(i + 1, &format!("CL{i}"), &[("GATE", "A1")]))
            .await;
    }
    env.poll(env.poll_cfg(1000)).await;
    let mut pump = env.stepper(&[
        ("MSGX_PROCESSING__GROUP_MAX", "256"),
        ("MSGX_PROCESSING__GROUP_MAX_WAIT", "1h"),
    ]);
    let started = std::time::Instant::now();
    let group = tokio::time::timeout(Duration::from_secs(30), pump.step_group())
        .await
        .expect("the group closed without waiting for more heads")
        .expect("group");
    assert!(started.elapsed() < Duration::from_secs(30));
    let ids: Vec<i64> = group.into_iter().map(|s| outcome(s).0).collect();
    assert_eq!(ids, vec![1, 2, 3], "one group of the three ready heads");
    assert_eq!(env.processing_order().await, vec![1, 2, 3], "committed");

    env.insert_message(&flop(4, "CL3", &[("GATE", "A2")])).await;
    env.poll(env.poll_cfg(1000)).await;
    let next = pump.step_group().await.expect("group");
    assert_eq!(
        next.into_iter().map(|s| outcome(s).0).collect::<Vec<_>>(),
        vec![4]
    );
    env.cleanup().await;
}
