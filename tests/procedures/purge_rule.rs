//! Purge readiness from both stores (issue 19 item 2, seed §6): a marked inbox row counts as
//! purgeable only when our record is terminal and confirmed, or it is skipped cutover stock.
//! A replayed row that keeps its old mark, a row someone else marked before we finished it, and
//! stock the previous system left unmarked all hold the purge, by reason; the boundary gauge
//! follows the same rule and moves down after a replay.

use std::time::Duration;

use msgx_core::cutover::seed::Approval;
use msgx_core::cutover::CutoverMode;
use msgx_core::ops::{Advance, BoundaryWatch, PurgeReadiness, PurgeRequest, ReplayRequest};
use msgx_core::pump::StepOutcome;

use super::common::msgs::{flop, unknown_type};
use super::common::TestEnv;
use super::raw_copy::dead_and_marked;
use super::{insert, insert_flops, mark};

async fn readiness(env: &TestEnv) -> PurgeReadiness {
    env.ops()
        .purge_readiness(&PurgeRequest::default())
        .await
        .expect("purge readiness")
}

/// `(reason, count, sample ids)` of a list.
fn reasons(list: &[msgx_core::ops::Unmarked]) -> Vec<(String, u64, Vec<i64>)> {
    list.iter()
        .map(|u| (u.reason.clone(), u.count, u.sample_ids.clone()))
        .collect()
}

/// One round of the boundary gauge over at most 1 000 inbox rows.
async fn gauge_round(env: &TestEnv, watch: &mut BoundaryWatch) -> Advance {
    watch
        .advance(&env.inbox, &env.store, 1_000)
        .await
        .expect("advance")
}

fn replay_dead(id: i64) -> ReplayRequest {
    super::common::replay_of_dead(id, "decoder fixed", Some("CHG-19"))
}

async fn inbox_marked(env: &TestEnv, id: i64) -> bool {
    let status: Option<String> =
        sqlx::query_scalar("SELECT CMINMSGS_STATUS FROM CMINMSGS WHERE CMINMSGS_ID = ?")
            .bind(id)
            .fetch_one(&env.owner)
            .await
            .expect("row");
    status.is_some_and(|s| !s.trim().is_empty())
}

/// Steps the pump until it is idle; returns the ids it processed.
async fn drain(pump: &mut super::common::drive::Stepper) -> Vec<i64> {
    let mut done = Vec::new();
    for _ in 0..20 {
        match pump.step().await.expect("step") {
            StepOutcome::Processed { msg_id, .. } | StepOutcome::Poisoned { msg_id, .. } => {
                done.push(msg_id)
            }
            StepOutcome::Idle => return done,
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("the pump did not go idle")
}

/// The regression of issue 19: a DEAD row is replayed; PENDING again, its inbox row still
/// carries the mark of its earlier outcome. Before the fix purge readiness counted the mark
/// alone and reported READY with the boundary above it; the DB owner's purge would then leave
/// the replay without raw text (DEAD(MALFORMED), not replayable).
#[tokio::test]
async fn a_replayed_row_that_keeps_its_mark_holds_the_purge() {
    let env = TestEnv::new("purge_replayed").await;
    let dead = dead_and_marked(&env, false, "A1").await;
    let good = insert(&env, 1, &[flop(2, "RC2", &[])]).await[0];
    env.discover(good).await;
    drain(&mut env.stepper(&[])).await;
    env.sweep_all().await;
    let r = readiness(&env).await;
    assert!(r.ready, "{}", r.render());
    assert_eq!((r.boundary_id, r.purgeable), (Some(good), 2));

    env.ops_replay(&replay_dead(dead)).await;
    assert_eq!(env.state_of(dead).await.0, "PENDING");
    assert!(inbox_marked(&env, dead).await, "the old mark stays");
    let r = readiness(&env).await;
    assert!(!r.ready, "a replayed row is not purgeable: {}", r.render());
    assert_eq!(r.boundary_id, None, "nothing below the replayed row");
    assert_eq!((r.rows, r.marked, r.purgeable), (2, 2, 1));
    assert!(r.unmarked.is_empty());
    assert_eq!(
        reasons(&r.marked_not_purgeable),
        vec![("marked_pending".into(), 1, vec![dead])]
    );
    assert!(r.render().contains("marked_pending"), "{}", r.render());

    // The pump (UPDT supported now) processes it: terminal, but not yet confirmed.
    let done = drain(&mut env.stepper(&[])).await;
    assert_eq!(done, vec![dead]);
    assert_eq!(env.state_of(dead).await.0, "SUCCEEDED");
    let r = readiness(&env).await;
    assert_eq!(
        reasons(&r.marked_not_purgeable),
        vec![("marked_awaiting_confirmation".into(), 1, vec![dead])]
    );
    // The sweep finds the mark present and confirms it: purgeable again.
    env.sweep_all().await;
    let r = readiness(&env).await;
    assert!(r.ready, "{}", r.render());
    assert_eq!(r.boundary_id, Some(good));
    env.cleanup().await;
}

/// A mark written by someone else (the legacy system during a parallel run) on rows we have
/// not processed does not make them purgeable.
#[tokio::test]
async fn a_mark_by_someone_else_on_a_pending_row_holds_the_purge() {
    let env = TestEnv::new("purge_foreign").await;
    let ids = insert(&env, 0, &[flop(1, "F1", &[]), flop(2, "F2", &[])]).await;
    env.discover(ids[1]).await;
    mark(&env, &ids).await;
    let r = readiness(&env).await;
    assert!(!r.ready, "{}", r.render());
    assert_eq!((r.marked, r.purgeable, r.boundary_id), (2, 0, None));
    assert_eq!(
        reasons(&r.marked_not_purgeable),
        vec![("marked_pending".into(), 2, ids.clone())]
    );
    // A row marked by someone else before we even discovered it.
    let beyond = insert(&env, 2, &[flop(3, "F3", &[])]).await[0];
    mark(&env, &[beyond]).await;
    let r = readiness(&env).await;
    assert_eq!(
        reasons(&r.marked_not_purgeable),
        vec![
            ("marked_pending".into(), 2, ids.clone()),
            ("marked_beyond_watermark".into(), 1, vec![beyond])
        ]
    );
    // Once we processed them and the sweep confirmed the (foreign) marks, they are purgeable.
    env.discover(beyond).await;
    drain(&mut env.stepper(&[])).await;
    env.sweep_all().await;
    let r = readiness(&env).await;
    assert!(r.ready, "{}", r.render());
    assert_eq!((r.purgeable, r.boundary_id), (3, Some(beyond)));
    env.cleanup().await;
}

/// Cutover `max` on an inbox with stock: the stock rows the previous system marked are not
/// ours and purgeable; a stock row it left unmarked holds the purge (`stock_unmarked`: the DB
/// owner decides); our own rows above the cutover follow rule (a).
#[tokio::test]
async fn skipped_cutover_stock_is_purgeable_only_where_marked() {
    let env = TestEnv::new("purge_stock").await;
    let stock = insert_flops(&env, "S", 5).await;
    // A stock row rolled back at the cutover: a gap, a hole like any other.
    env.delete_as_owner(&[stock[3]]).await;
    mark(&env, &[stock[0], stock[1], stock[4]]).await;
    msgx_actors::app::apply_cutover_approved(
        &env.store,
        &env.inbox,
        Some(CutoverMode::Max),
        &Approval::default(),
        &env.clock,
        Duration::from_secs(3600),
    )
    .await
    .expect("cutover");
    let ours = insert(&env, 5, &[flop(6, "N6", &[])]).await[0];
    env.discover(ours).await;
    drain(&mut env.stepper(&[])).await;
    env.sweep_all().await;

    let r = readiness(&env).await;
    assert!(!r.ready, "{}", r.render());
    assert_eq!((r.rows, r.marked, r.purgeable), (5, 4, 4));
    assert_eq!(r.boundary_id, Some(stock[1]));
    assert_eq!(
        reasons(&r.unmarked),
        vec![("stock_unmarked".into(), 1, vec![stock[2]])]
    );
    assert!(r.marked_not_purgeable.is_empty());
    // The DB owner decides: it marks the row (the previous system's). The gap at the cutover
    // is watched (a transaction in flight then may still commit there): it holds the purge
    // until its watch window ends (issue 29).
    mark(&env, &[stock[2]]).await;
    let r = readiness(&env).await;
    assert!(!r.ready, "{}", r.render());
    assert_eq!(r.boundary_id, Some(stock[2]));
    let held: Vec<(String, u64, Vec<[i64; 2]>)> = r
        .ids_without_row
        .iter()
        .map(|h| (h.reason.clone(), h.count, h.ranges.clone()))
        .collect();
    assert_eq!(
        held,
        vec![("watched_hole".into(), 1, vec![[stock[3], stock[3]]])]
    );
    env.clock.advance(Duration::from_secs(3601));
    let cfg = msgx_core::late::DetectConfig::from_settings(&env.settings(&[]));
    msgx_core::late::detect_once(&env.inbox, &env.store, &env.clock, &cfg)
        .await
        .expect("detect");
    let r = readiness(&env).await;
    assert!(r.ready, "{}", r.render());
    assert_eq!(r.boundary_id, Some(ours));
    // The gauge agrees.
    let mut watch = BoundaryWatch::default();
    gauge_round(&env, &mut watch).await;
    assert_eq!(watch.boundary.map(|b| b.0), Some(ours));
    env.cleanup().await;
}

/// The gauge follows the rule: a replay of a row below the boundary pulls it down to the row
/// before it; once the replayed row is processed and confirmed it moves up again.
#[tokio::test]
async fn the_boundary_gauge_moves_down_after_a_replay() {
    let env = TestEnv::new("purge_gauge").await;
    let texts = [flop(1, "G1", &[]), unknown_type(2), flop(3, "G3", &[])];
    let ids = insert(&env, 0, &texts).await;
    let (g1, bad, g3) = (ids[0], ids[1], ids[2]);
    env.discover(g3).await;
    let mut pump = env.stepper(&[("MSGX_PROCESSING__MAX_ATTEMPTS", "1")]);
    assert_eq!(drain(&mut pump).await, vec![g1, bad, bad, g3]);
    assert_eq!(env.state_of(bad).await.0, "DEAD");
    env.sweep_all().await;
    let mut watch = BoundaryWatch::default();
    let a = gauge_round(&env, &mut watch).await;
    assert!(a.caught_up && !a.pulled_down);
    assert_eq!(watch.boundary.map(|b| b.0), Some(g3));

    env.ops_replay(&replay_dead(bad)).await;
    let a = gauge_round(&env, &mut watch).await;
    assert!(a.pulled_down && a.caught_up, "{a:?}");
    assert_eq!(
        watch.boundary.map(|b| b.0),
        Some(g1),
        "down to the row before"
    );
    assert_eq!(
        readiness(&env).await.boundary_id,
        Some(g1),
        "the same as the report"
    );
    // Nothing changed: it stays (and does not pull down again).
    let a = gauge_round(&env, &mut watch).await;
    assert!(!a.pulled_down);
    assert_eq!(watch.boundary.map(|b| b.0), Some(g1));

    // Processed again (still unsupported: DEAD once more) and confirmed: back up to the end.
    env.clock.advance(Duration::from_secs(60));
    assert_eq!(drain(&mut pump).await, vec![bad, bad]);
    let a = gauge_round(&env, &mut watch).await;
    assert_eq!(
        watch.boundary.map(|b| b.0),
        Some(g1),
        "not confirmed yet: {a:?}"
    );
    env.sweep_all().await;
    gauge_round(&env, &mut watch).await;
    assert_eq!(watch.boundary.map(|b| b.0), Some(g3));
    env.cleanup().await;
}
