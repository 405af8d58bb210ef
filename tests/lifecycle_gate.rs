//! The lifecycle gate (SPEC §5 G5): backfill confirmation, operator replay and poison
//! escalation on the same message are mutually exclusive across processes. Real tasks on
//! separate connections race for a few dozen rows — the pump (processing and poison
//! escalation), a second poison escalator, the backfill sweeper (its inbox writes slowed by a
//! trigger so it holds its row locks a while), an operator replaying (200 times) and
//! recovering abandoned rows — while a monitor watches the inbox marks. Afterwards every row
//! must be consistent, and every replay accounted for in the audit log.

use msgx_testkit as common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::drive::Stepper;
use common::msgs::{flop, unknown_type};
use common::{audit, TestEnv};
use msgx_core::backfill::{sweep_once, SweepConfig};
use msgx_core::clock::SharedClock;
use msgx_core::inbox::Inbox;
use msgx_core::pump::{PumpCore, StepOutcome};
use msgx_core::settings::Settings;
use msgx_core::store::replay::{recover_abandoned, AdminReport, RowOutcome};
use msgx_core::store::Store;
use rand::{Rng, SeedableRng};
use sqlx::Executor;
use tokio::task::JoinHandle;

const REPLAYS: usize = 200;

/// A store on its own pool, connected as the service connects: every racer has its own
/// connections.
async fn own_store(env: &TestEnv, connections: u32) -> Store {
    let n = connections.to_string();
    let settings = env.settings(&[("MSGX_STORE__MAX_CONNECTIONS", n.as_str())]);
    Store::connect(&settings.store).await.expect("store")
}

/// Every inbox status, by id.
async fn inbox_marks(env: &TestEnv) -> BTreeMap<i64, Option<String>> {
    let rows: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT CMINMSGS_ID, CMINMSGS_STATUS FROM CMINMSGS")
            .fetch_all(&env.owner)
            .await
            .expect("marks");
    rows.into_iter().collect()
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    msg_id: i64,
    state: String,
    backfill_next_at: Option<DateTime<Utc>>,
    backfill_at: Option<DateTime<Utc>>,
    backfill_abandon_reason: Option<String>,
    backfill_attempts: i32,
}

async fn rows(store: &Store) -> Vec<Row> {
    sqlx::query_as(
        "SELECT msg_id, state, backfill_next_at, backfill_at, backfill_abandon_reason, \
                backfill_attempts FROM proc_state ORDER BY msg_id",
    )
    .fetch_all(store.pool())
    .await
    .expect("rows")
}

fn nonblank(s: &Option<String>) -> bool {
    s.as_deref().is_some_and(|s| !s.trim().is_empty())
}

/// Consistency of every row (SPEC §2, §5, §11).
fn check_rows(rows: &[Row]) {
    for r in rows {
        match r.state.as_str() {
            "PENDING" | "FAILED" => assert!(
                r.backfill_next_at.is_none()
                    && r.backfill_at.is_none()
                    && r.backfill_abandon_reason.is_none(),
                "unfinished row carries backfill intent/confirmation/abandon: {r:?}"
            ),
            _ => {
                let carried = [
                    r.backfill_next_at.is_some(),
                    r.backfill_at.is_some(),
                    r.backfill_abandon_reason.is_some(),
                ]
                .iter()
                .filter(|b| **b)
                .count();
                assert_eq!(
                    carried, 1,
                    "terminal row must carry exactly one of intent / confirmation / abandon: {r:?}"
                );
            }
        }
    }
}

#[actix_rt::test]
async fn replay_backfill_and_poison_never_interleave_on_a_row() {
    let env = TestEnv::new("gate").await;
    let (ids, purged) = seed_the_race(&env).await;
    // The knobs of the racers below: one attempt before poison, small backfill batches.
    let settings = env.settings(&[
        ("MSGX_PROCESSING__MAX_ATTEMPTS", "1"),
        ("MSGX_BACKFILL__BATCH", "8"),
        ("MSGX_BACKFILL__MAX_ATTEMPTS", "3"),
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let clock = common::shared(&env.clock);
    let pump = pump(&env, &settings, clock.clone(), stop.clone()).await;
    let poisoner = poisoner(&env, ids.clone(), clock.clone(), stop.clone()).await;
    let sweeper = sweeper(&env, &settings, clock.clone(), stop.clone()).await;
    let monitor = monitor(&env, stop.clone());
    let (replays, recoveries) = operate(&env, &ids, &purged, &clock).await;
    stop.store(true, Ordering::SeqCst);
    let steps = pump.await.expect("pump");
    let escalated = poisoner.await.expect("poisoner");
    let (marked, already, orphans) = sweeper.await.expect("sweeper");
    let (ever_marked, rounds) = monitor.await.expect("monitor");
    let applied: usize = replays.iter().map(|(_, r)| r.applied()).sum();
    eprintln!(
        "gate: {steps} pump steps, {escalated} racing escalations, {marked} marked + {already} \
         already marked, {} replays ({applied} rows applied), {recoveries} recoveries, \
         {rounds} monitor rounds",
        replays.len()
    );
    assert!(
        applied > 50,
        "replays must really race the others ({applied})"
    );
    assert!(
        already > 0,
        "replayed marked rows came back as already marked"
    );
    assert!(marked > 0);

    assert!(
        orphans.is_empty(),
        "rows found marked that no sweep had confirmed (a mark written after a replay): {orphans:?}"
    );

    // 1. Row states.
    let end = rows(&env.store).await;
    check_rows(&end);

    let confirmed_at_replay = check_audit(&env, &replays).await;
    check_marks(&env, &ever_marked, &end, &confirmed_at_replay).await;
    quiesce_and_check(&env, &settings, &purged).await;
    env.cleanup().await;
}

/// 48 rows. 38 messages of an unknown type cycle FAILED → poison DEAD(EXHAUSTED) → marked →
/// replayed; 5 good ones SUCCEED and 5 malformed ones die (both refused by replay); 2 of the
/// unknown ones are purged by the DB owner after discovery (DEAD MALFORMED, then MISSING_ROW;
/// recovered now and then). Returns every id and the purged ones.
async fn seed_the_race(env: &TestEnv) -> (Vec<i64>, Vec<i64>) {
    let mut ids = Vec::new();
    for i in 0..48 {
        let text = match i % 9 {
            3 => flop(1000 + i, &format!("F{i}"), &[("GATE", "A1")]),
            7 => "<MSG><META><SNDR>AODB</SNDR></META>".to_string(),
            _ => unknown_type(1000 + i),
        };
        ids.push(env.insert_message(&text).await);
    }
    env.poll(env.poll_cfg(1000)).await;
    let purged = vec![ids[5], ids[23]];
    for id in &purged {
        env.delete_as_owner(&[*id]).await;
    }
    // The inbox takes its time writing marks: the sweeper holds its row locks meanwhile.
    env.owner
        .execute(
            "CREATE TRIGGER slow_marks BEFORE UPDATE ON CMINMSGS FOR EACH ROW \
             BEGIN DO SLEEP(0.005); END",
        )
        .await
        .expect("trigger");

    // Instrumentation (this test's own PostgreSQL database): every committed confirmation.
    for ddl in [
        "CREATE TABLE confirm_log (id BIGSERIAL PRIMARY KEY, msg_id BIGINT NOT NULL)",
        "CREATE FUNCTION log_confirm() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         IF NEW.backfill_at IS NOT NULL AND OLD.backfill_at IS NULL THEN \
         INSERT INTO confirm_log (msg_id) VALUES (NEW.msg_id); END IF; RETURN NEW; END $$",
        "CREATE TRIGGER log_confirm AFTER UPDATE ON proc_state FOR EACH ROW \
         EXECUTE FUNCTION log_confirm()",
    ] {
        env.store
            .pool()
            .execute(ddl)
            .await
            .expect("instrumentation");
    }

    (ids, purged)
}

/// The pump: processing and poison escalation, one head at a time; its step count.
async fn pump(
    env: &TestEnv,
    settings: &Settings,
    clock: SharedClock,
    stop: Arc<AtomicBool>,
) -> JoinHandle<u64> {
    let mut core = Stepper::new(PumpCore::new(
        env.inbox.clone(),
        own_store(env, 2).await,
        msgx_actors::app::codec(&settings.processing, env.tz),
        clock,
        msgx_actors::app::pump_config(&settings.processing, &settings.retention, env.tz),
    ));
    tokio::spawn(async move {
        let mut steps = 0u64;
        while !stop.load(Ordering::SeqCst) {
            match core.step().await.expect("pump step") {
                StepOutcome::Idle => tokio::time::sleep(Duration::from_millis(1)).await,
                _ => steps += 1,
            }
        }
        steps
    })
}

/// A second escalator racing the pump and the operator with the pump's own statement; how
/// many rows it escalated.
async fn poisoner(
    env: &TestEnv,
    ids: Vec<i64>,
    clock: SharedClock,
    stop: Arc<AtomicBool>,
) -> JoinHandle<u64> {
    let store = own_store(env, 1).await;
    tokio::spawn(async move {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut escalated = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let id = ids[rng.random_range(0..ids.len())];
            let now = clock.now();
            if store
                .poison(
                    id,
                    1,
                    now - chrono::Duration::hours(1),
                    "racing escalation",
                    now,
                )
                .await
                .expect("poison")
            {
                escalated += 1;
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        escalated
    })
}

/// The backfill sweeper, with its own inbox pool: (marked, already marked, orphans).
async fn sweeper(
    env: &TestEnv,
    settings: &Settings,
    clock: SharedClock,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(u64, u64, BTreeSet<i64>)> {
    let store = own_store(env, 2).await;
    let inbox = Inbox::new(&settings.inbox, &env.names, env.tz).expect("inbox");
    let cfg = SweepConfig::new(&settings.backfill, &env.names);
    tokio::spawn(async move {
        let (mut marked, mut already) = (0u64, 0u64);
        // Marks are written only by sweeps, each confirmed in the same transaction: a row
        // found marked must have been confirmed by an earlier sweep. A mark written for a
        // row that a replay took back meanwhile would be an orphan, found here later.
        let mut marked_by_sweeps: BTreeSet<i64> = BTreeSet::new();
        let mut orphans: BTreeSet<i64> = BTreeSet::new();
        let mut last_confirm = 0i64;
        while !stop.load(Ordering::SeqCst) {
            let r = sweep_once(&inbox, &store, clock.as_ref(), &cfg)
                .await
                .expect("sweep");
            marked += r.marked;
            already += r.already_marked;
            let found: BTreeSet<i64> = r.already.iter().map(|a| a.0).collect();
            orphans.extend(found.iter().filter(|id| !marked_by_sweeps.contains(id)));
            // What the sweep really committed (not what it meant to): the confirm log.
            let committed: Vec<(i64, i64)> =
                sqlx::query_as("SELECT id, msg_id FROM confirm_log WHERE id > $1 ORDER BY id")
                    .bind(last_confirm)
                    .fetch_all(store.pool())
                    .await
                    .expect("confirm log");
            for (id, msg_id) in committed {
                last_confirm = id;
                if !found.contains(&msg_id) {
                    marked_by_sweeps.insert(msg_id);
                }
            }
            if r.selected == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        (marked, already, orphans)
    })
}

/// The monitor: marks only ever go from empty to a value, and never change; every mark it
/// saw and its rounds.
fn monitor(env: &TestEnv, stop: Arc<AtomicBool>) -> JoinHandle<(BTreeMap<i64, String>, u64)> {
    let owner = env.owner.clone();
    tokio::spawn(async move {
        let mut seen: BTreeMap<i64, String> = BTreeMap::new();
        let mut rounds = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let now: Vec<(i64, Option<String>)> =
                sqlx::query_as("SELECT CMINMSGS_ID, CMINMSGS_STATUS FROM CMINMSGS")
                    .fetch_all(&owner)
                    .await
                    .expect("marks");
            for (id, status) in now {
                match (seen.get(&id), status) {
                    (Some(before), Some(after)) => assert_eq!(before, &after, "mark changed"),
                    (Some(before), None) => panic!("mark {before} of {id} was removed"),
                    (None, Some(v)) if !v.trim().is_empty() => {
                        seen.insert(id, v);
                    }
                    _ => {}
                }
            }
            rounds += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        (seen, rounds)
    })
}

/// The operator: 200 replays of random handfuls, recovering abandoned rows now and then; each
/// replay's pick and report, and the recoveries.
async fn operate(
    env: &TestEnv,
    ids: &[i64],
    purged: &[i64],
    clock: &SharedClock,
) -> (Vec<(Vec<i64>, AdminReport)>, usize) {
    let operator_store = own_store(env, 2).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut replays: Vec<(Vec<i64>, AdminReport)> = Vec::new();
    let mut recoveries = 0;
    for i in 0..REPLAYS {
        // Half the time from a (soon stale) list of DEAD rows not yet marked: an operator
        // replaying what the console shows while the sweeper marks them — the race G5 is about.
        let console: Vec<i64> = if i % 2 == 0 {
            sqlx::query_scalar(
                "SELECT msg_id FROM proc_state WHERE state = 'DEAD' AND backfill_at IS NULL",
            )
            .fetch_all(operator_store.pool())
            .await
            .expect("console")
        } else {
            Vec::new()
        };
        let from = if console.is_empty() { ids } else { &console };
        let n = rng.random_range(1..=5);
        let pick: Vec<i64> = (0..n)
            .map(|_| from[rng.random_range(0..from.len())])
            .collect();
        let report = env
            .replay_on(
                &operator_store,
                &pick,
                "ops@airport",
                &format!("stress {i}"),
                clock.now(),
            )
            .await
            .expect("replay");
        replays.push((pick, report));
        if i % 20 == 0 {
            recover_abandoned(
                &operator_store,
                purged,
                audit("ops@airport", "recheck"),
                false,
                clock.now(),
            )
            .await
            .expect("recover");
            recoveries += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..4))).await;
    }
    (replays, recoveries)
}

/// Check 2: every replay is in the audit log, applied or refused with a reason, as reported.
/// Returns the rows a replay found confirmed (marked).
async fn check_audit(env: &TestEnv, replays: &[(Vec<i64>, AdminReport)]) -> BTreeSet<i64> {
    let audit: Vec<_> = env
        .audit_entries()
        .await
        .expect("audit")
        .into_iter()
        .filter(|a| a.action == "REPLAY")
        .collect();
    assert_eq!(audit.len(), replays.len(), "one audit row per replay");
    let mut confirmed_at_replay: BTreeSet<i64> = BTreeSet::new();
    for (a, (pick, report)) in audit.iter().zip(replays) {
        assert_eq!((a.id, a.actor.as_str()), (report.audit_id, "ops@airport"));
        let distinct: BTreeSet<i64> = pick.iter().copied().collect();
        assert_eq!(a.msg_ids, distinct.iter().copied().collect::<Vec<_>>());
        let audited = a.result["rows"].as_array().expect("rows");
        assert_eq!(audited.len(), report.rows.len());
        for (row, res) in audited.iter().zip(&report.rows) {
            assert_eq!(row["msg_id"], res.msg_id);
            match &res.outcome {
                RowOutcome::Applied {
                    previous_backfill_at,
                    ..
                } => {
                    assert_eq!(row["result"], "applied");
                    if previous_backfill_at.is_some() {
                        assert!(row["previous_backfill_at"].is_string());
                        confirmed_at_replay.insert(res.msg_id);
                    }
                }
                RowOutcome::Refused { reason } => {
                    assert_eq!(row["result"], "refused");
                    assert!(!reason.is_empty());
                    assert_eq!(row["reason"], reason.as_str());
                }
            }
        }
    }
    confirmed_at_replay
}

/// Checks 3 and 4: marks never removed and only on terminal rows (or rows a replay found marked).
async fn check_marks(
    env: &TestEnv,
    ever_marked: &BTreeMap<i64, String>,
    end: &[Row],
    confirmed_at_replay: &BTreeSet<i64>,
) {
    // 3. Marks were never removed (the monitor), and are still there.
    let marks = inbox_marks(env).await;
    for (id, v) in ever_marked {
        assert_eq!(
            marks.get(id).cloned().flatten().as_deref(),
            Some(v.as_str())
        );
    }
    // 4. A mark exists only for rows that are terminal — or that were confirmed marked when a
    // replay took them back (the audit says so): marks are written only while the row is
    // terminal and locked by the sweeper.
    for r in end {
        let marked = marks.get(&r.msg_id).is_some_and(nonblank);
        if marked && matches!(r.state.as_str(), "PENDING" | "FAILED") {
            assert!(
                confirmed_at_replay.contains(&r.msg_id),
                "row {} is {} and marked, but no replay found it marked",
                r.msg_id,
                r.state
            );
        }
        if r.backfill_at.is_some() {
            assert!(marked, "row {} confirmed but not marked", r.msg_id);
        }
    }
}

/// Check 5, quiesce: the pump and the sweeper finish the work; then every row is terminal and
/// confirmed (or abandoned for its missing inbox row), every existing inbox row marked.
async fn quiesce_and_check(env: &TestEnv, settings: &Settings, purged: &[i64]) {
    let mut core = env.stepper(&[("MSGX_PROCESSING__MAX_ATTEMPTS", "1")]);
    while core.step().await.expect("step") != StepOutcome::Idle {}
    env.sweep_until_idle(&SweepConfig::new(&settings.backfill, &env.names))
        .await;
    let end = rows(&env.store).await;
    check_rows(&end);
    let marks = inbox_marks(env).await;
    for r in &end {
        assert!(matches!(r.state.as_str(), "SUCCEEDED" | "DEAD"), "{r:?}");
        if purged.contains(&r.msg_id) {
            assert_eq!(r.backfill_abandon_reason.as_deref(), Some("MISSING_ROW"));
        } else {
            assert!(r.backfill_at.is_some(), "{r:?}");
            assert_eq!(
                marks.get(&r.msg_id).cloned().flatten().as_deref(),
                Some("PROCESSED")
            );
            assert_eq!(r.backfill_attempts, 0, "no transient failures here");
        }
    }
}
