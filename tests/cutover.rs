//! Cutover seeding (seed §5.1): explicit, one-time, fresh store only, SEEDED_AT with W.

mod common;

use common::TestEnv;
use msgx_actors::app::apply_cutover;
use msgx_core::clock::Clock;
use msgx_core::cutover::CutoverMode;
use msgx_core::store::SeedOutcome;

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
        let out = apply_cutover(&env.store, &env.inbox, Some(mode), &env.clock)
            .await
            .expect("seeded");
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

#[tokio::test]
async fn seeding_is_refused_on_an_upgraded_store_and_skipped_when_already_seeded() {
    let env = TestEnv::new("cutover_refuse").await;
    purged_inbox(&env).await;
    // Without seeding, W = 0: the purged prefix is a hole; the store now has a hole timer.
    env.poll(env.poll_cfg(100)).await;
    let err = apply_cutover(&env.store, &env.inbox, Some(CutoverMode::Max), &env.clock)
        .await
        .expect_err("refused");
    assert!(format!("{err:#}").contains("refused"), "{err:#}");

    // An instance that already has processing records.
    let env2 = TestEnv::new("cutover_refuse2").await;
    sqlx::query("INSERT INTO proc_state (msg_id, enqueued_at, source) VALUES (7, now(), 'COMPAT')")
        .execute(env2.store.pool())
        .await
        .expect("compat row");
    let err = apply_cutover(
        &env2.store,
        &env2.inbox,
        Some(CutoverMode::Zero),
        &env2.clock,
    )
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
    apply_cutover(
        &env3.store,
        &env3.inbox,
        Some(CutoverMode::Max),
        &env3.clock,
    )
    .await
    .expect("first");
    env3.insert_rows(1).await;
    env3.poll(env3.poll_cfg(100)).await;
    let again = apply_cutover(
        &env3.store,
        &env3.inbox,
        Some(CutoverMode::Max),
        &env3.clock,
    )
    .await
    .expect("second start");
    assert!(matches!(again, Some(SeedOutcome::AlreadySeeded { w, .. }) if w == max + 1));
    assert_eq!(env3.cursor().await.0, max + 1, "W untouched");

    env.cleanup().await;
    env2.cleanup().await;
    env3.cleanup().await;
}
