//! Cutover seeding (seed §5.1): explicit, one-time, fresh store only, SEEDED_AT with W.

mod common;

use std::time::Duration;

use common::seed::Proc;
use common::TestEnv;
use msgx_actors::app::apply_cutover;
use msgx_core::clock::Clock;
use msgx_core::cutover::CutoverMode;
use msgx_core::store::SeedOutcome;

/// `late.watch_window` for the stock's gaps.
const WATCH: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// An inbox whose oldest partitions were purged: ids start high.
async fn purged_inbox(env: &TestEnv) -> (i64, i64) {
    sqlx::query("ALTER TABLE CMINMSGS AUTO_INCREMENT = 1000")
        .execute(&env.owner)
        .await
        .expect("as the DB owner");
    let ids = env.insert_rows(5).await;
    (ids[0], ids[4])
}

#[tokio::test]
async fn each_mode_seeds_a_fresh_store() {
    // The purged inbox holds ids 1000..=1004.
    for (mode, seeded) in [
        (CutoverMode::Min, 999),
        (CutoverMode::Max, 1004),
        (CutoverMode::Zero, 0),
        (CutoverMode::Id(1002), 1002),
    ] {
        let env = TestEnv::new("cutover").await;
        assert_eq!(purged_inbox(&env).await, (1000, 1004));
        let out = cutover(&env, mode).await.expect("seeded");
        assert_eq!(out, Some(SeedOutcome::Seeded { w: seeded }), "{mode}");
        let stored = env.store.read_cursor().await.expect("cursor");
        assert_eq!(stored.cursor.w, seeded);
        assert_eq!(
            stored.seeded_at,
            Some(env.clock.now()),
            "SEEDED_AT written with W"
        );

        // What discovery does next follows from the mode.
        let r = env.poll(env.poll_cfg(100)).await;
        match mode {
            CutoverMode::Min => assert_eq!(r.enqueued_new, 5, "min reads all existing rows"),
            CutoverMode::Max => assert_eq!(r.enqueued_new, 0, "max skips the visible stock"),
            CutoverMode::Zero => {
                assert!(
                    r.advance.open_hole.is_some(),
                    "zero: ids 1..999 are a hole to age"
                )
            }
            CutoverMode::Id(_) => assert_eq!(r.enqueued_new, 2),
        }
        env.cleanup().await;
    }
}

/// The service's start-up cutover step on this env.
async fn cutover(env: &TestEnv, mode: CutoverMode) -> anyhow::Result<Option<SeedOutcome>> {
    apply_cutover(&env.store, &env.inbox, Some(mode), &env.clock, WATCH).await
}

#[tokio::test]
async fn seeding_is_refused_on_an_upgraded_store_and_skipped_when_already_seeded() {
    let env = TestEnv::new("cutover_refuse").await;
    purged_inbox(&env).await;
    // Without seeding, W = 0: the purged prefix is a hole; the store now has a hole timer.
    env.poll(env.poll_cfg(100)).await;
    let err = cutover(&env, CutoverMode::Max).await.expect_err("refused");
    assert!(format!("{err:#}").contains("refused"), "{err:#}");

    // An instance that already has processing records.
    let env2 = TestEnv::new("cutover_refuse2").await;
    let compat = Proc {
        source: "COMPAT",
        ..Proc::pending(7, chrono::Utc::now())
    };
    compat.insert(&env2).await;
    let err = cutover(&env2, CutoverMode::Zero)
        .await
        .expect_err("refused");
    assert!(
        format!("{err:#}").contains("1 processing records"),
        "{err:#}"
    );
    assert_eq!(env2.store.read_cursor().await.expect("c").seeded_at, None);

    // Seeded once; the same setting on the next start is a no-op, not a failure.
    let env3 = TestEnv::new("cutover_again").await;
    let (_, max) = purged_inbox(&env3).await;
    cutover(&env3, CutoverMode::Max).await.expect("first");
    env3.insert_rows(1).await;
    env3.poll(env3.poll_cfg(100)).await;
    let again = cutover(&env3, CutoverMode::Max)
        .await
        .expect("second start");
    assert!(matches!(again, Some(SeedOutcome::AlreadySeeded { w, .. }) if w == max + 1));
    assert_eq!(env3.cursor().await.0, max + 1, "W untouched");

    env.cleanup().await;
    env2.cleanup().await;
    env3.cleanup().await;
}

/// A stock the previous system left: 10 rows, an insert still uncommitted at the cutover
/// (`held`, id 11), 190 rows, two rolled-back inserts (a gap that never fills), 296 rows; the
/// 99 stock rows up to id 100 carry the previous system's mark. Returns (held transaction, its
/// id, the stock ids, the gap ids).
async fn stock_with_gaps(
    env: &TestEnv,
) -> (
    sqlx::Transaction<'static, sqlx::MySql>,
    i64,
    Vec<i64>,
    Vec<i64>,
) {
    let mut stock = env.insert_rows(10).await;
    let (held, held_id) = env.open_insert().await;
    stock.extend(env.insert_rows(190).await);
    let mut rolled_back = Vec::new();
    for _ in 0..2 {
        let (tx, id) = env.open_insert().await;
        tx.rollback().await.expect("rollback");
        rolled_back.push(id);
    }
    stock.extend(env.insert_rows(296).await);
    // Row by row: a range UPDATE would wait for the held insert's lock.
    for id in stock.iter().filter(|id| **id <= 100) {
        env.mark_as_owner(&[*id], "PROCESSED").await;
    }
    let mut gaps = vec![held_id];
    gaps.extend(rolled_back);
    (held, held_id, stock, gaps)
}

/// `msgexchange cutover plan --mode … --json`.
fn plan(env: &TestEnv, mode: &str) -> serde_json::Value {
    let out = common::process::succeed(
        std::process::Command::new(env!("CARGO_BIN_EXE_msgexchange"))
            .args(["cutover", "plan", "--mode", mode, "--json"])
            .envs(env.binary_env())
            .env("MSGX_LOG__LEVEL", "error"),
        "cutover plan",
    );
    serde_json::from_slice(&out.stdout).expect("plan json")
}

/// Issue 19: `max` (and `<id>`) on an inbox with stock skips the stock for good — the
/// start-up compensation scan, the late detector and the pump never take it for ours — while
/// the ids missing from the stock at the cutover are holes like any other: an insert that was
/// uncommitted then commits later and is processed as LATE. `cutover plan` shows it first and
/// changes nothing.
#[tokio::test]
async fn cutover_skips_the_visible_stock_for_good_and_watches_its_gaps() {
    for mode in ["max", "300"] {
        let env = TestEnv::new("cutover_stock").await;
        let (held, held_id, stock, gaps) = stock_with_gaps(&env).await;
        let top = *stock.last().expect("stock");
        let w = if mode == "max" { top } else { 300 };
        let skipped: Vec<i64> = stock.iter().copied().filter(|id| *id <= w).collect();

        let p = plan(&env, mode);
        assert_eq!(p["w"], w, "{p}");
        assert_eq!(p["refused"], serde_json::Value::Null, "{p}");
        assert_eq!(p["skipped"]["rows"], skipped.len(), "{p}");
        assert_eq!(p["skipped"]["marked"], 99, "{p}");
        assert_eq!(p["skipped"]["unmarked"], skipped.len() - 99, "{p}");
        assert_eq!(p["gap_ids"], 3, "held insert + two rollbacks: {p}");
        assert_eq!(p["read"]["rows"], stock.len() - skipped.len(), "{p}");
        assert_eq!(
            p["skipped_unmarked_by_type"][0]["msg_type"], "(none)",
            "{p}"
        );
        let cursor = env.store.read_cursor().await.expect("cursor");
        assert_eq!(
            (cursor.cursor.w, cursor.seeded_at),
            (0, None),
            "plan is read-only"
        );
        assert!(env.store.cutover_stock().await.expect("stock").is_none());

        let port = common::service::free_port();
        let mut svc = common::service::spawn_service(
            &env,
            &[
                ("MSGX_PIPELINE__CUTOVER_WATERMARK", mode),
                ("MSGX_LATE__DETECT_PERIOD", "200ms"),
                ("MSGX_LATE__COMPENSATION_PERIOD", "300ms"),
                ("MSGX_PROCESSING__IDLE_POLL", "100ms"),
            ],
            port,
        );
        let seeded = || async { env.store.cutover_stock().await.ok().flatten().is_some() };
        common::service::wait_for("seeding", Duration::from_secs(30), seeded).await;
        let record = env
            .store
            .cutover_stock()
            .await
            .expect("read")
            .expect("seeded");
        let span = record.span.clone().expect("stock skipped");
        assert_eq!(
            (span.first, span.last, span.rows),
            (1, w, skipped.len() as i64)
        );
        assert_eq!(span.gap_ids(), 3, "held insert + two rollbacks");
        assert!(skipped.iter().all(|id| record.skips(*id)));
        assert!(
            gaps.iter().all(|id| !record.skips(*id)),
            "gaps are not stock"
        );

        // Live traffic after the cutover, then the held insert commits: a late arrival.
        let live = env.insert_rows(5).await;
        held.commit().await.expect("late commit");
        let mut expect: Vec<i64> = vec![held_id];
        expect.extend(stock.iter().copied().filter(|id| *id > w));
        expect.extend(&live);
        expect.sort_unstable();
        let finished = || async {
            let ids: Vec<i64> = sqlx::query_scalar(
                "SELECT msg_id FROM proc_state WHERE state IN ('SUCCEEDED','SKIPPED','DEAD') \
                 ORDER BY msg_id",
            )
            .fetch_all(env.store.pool())
            .await
            .unwrap_or_default();
            ids.len() >= expect.len()
        };
        common::service::wait_for("processing", Duration::from_secs(60), finished).await;
        // Several compensation scans and detection rounds run over the stock meanwhile.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            env.enqueued_ids().await,
            expect,
            "{mode}: exactly the non-stock rows"
        );
        let late: String = env
            .scalar_for("SELECT source FROM proc_state WHERE msg_id = $1", held_id)
            .await;
        assert_eq!(late, "LATE", "the held insert was a gap: processed as LATE");
        let unseen: i64 = env.scalar("SELECT count(*) FROM inbox_unseen").await;
        assert_eq!(
            unseen, 0,
            "the compensation scan never took the stock for unseen rows"
        );
        common::service::kill9(&mut svc);
        env.cleanup().await;
    }
}
