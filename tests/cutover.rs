//! Cutover seeding (seed §5.1): explicit, one-time, fresh store only, SEEDED_AT with W.

use msgx_testkit as common;

use std::time::Duration;

use common::seed::Proc;
use common::TestEnv;
use msgx_actors::app::{apply_cutover_approved, cutover_approval};
use msgx_core::clock::Clock;
use msgx_core::cutover::seed::Approval;
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
    let approval = Approval::default();
    apply_cutover_approved(
        &env.store,
        &env.inbox,
        Some(mode),
        &approval,
        &env.clock,
        WATCH,
    )
    .await
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
        common::instance::msgexchange()
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

/// `msgexchange cutover plan --mode …` run to its end: (exit code, stdout, stderr).
fn plan_run(env: &TestEnv, mode: &str) -> (Option<i32>, String, String) {
    let out = common::instance::msgexchange()
        .args(["cutover", "plan", "--mode", mode])
        .envs(env.binary_env())
        .env("MSGX_LOG__LEVEL", "error")
        .output()
        .expect("run cutover plan");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        common::process::stderr(&out),
    )
}

/// Issue 29, third bullet: an inbox with ids 1–10; `<id>` 200010 is an id the inbox has not
/// handed out. `cutover plan` refuses it (exit 1, one line saying why and what to do), and so
/// does the service's start-up seeding — the store stays unseeded, the binary exits 2 (no
/// restart can fix it). An id at the head is fine.
#[tokio::test]
async fn an_id_above_the_inbox_head_is_refused_by_the_plan_and_the_service() {
    let env = TestEnv::new("cutover_head").await;
    let ids = env.insert_rows(10).await;
    assert_eq!((ids[0], ids[9]), (1, 10));

    let (code, stdout, stderr) = plan_run(&env, "200010");
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("REFUSED: cutover refused: 200010 is above the inbox's head (MAX(id) = 10, next AUTO_INCREMENT = 11)"), "{stdout}");
    assert!(
        stderr.contains("choose `max` or an id at or below 10"),
        "{stderr}"
    );
    let (code, stdout, _) = plan_run(&env, "10");
    assert_eq!(code, Some(0), "{stdout}");

    let err = cutover(&env, CutoverMode::Id(200_010))
        .await
        .expect_err("refused at start");
    let line = format!("{err:#}");
    assert!(line.contains("200010 is above the inbox's head"), "{line}");
    assert_eq!(line.lines().count(), 1, "one line: {line}");
    let cursor = env.store.read_cursor().await.expect("cursor");
    assert_eq!(
        (cursor.cursor.w, cursor.seeded_at),
        (0, None),
        "nothing seeded"
    );

    // The binary refuses to start with that line too.
    let port = common::service::free_port();
    let mut svc = common::service::spawn_service_logging(
        &env,
        &[("MSGX_PIPELINE__CUTOVER_WATERMARK", "200010")],
        port,
        std::process::Stdio::piped(),
    );
    let status = common::process::exit_status(
        &mut svc,
        Duration::from_secs(30),
        "the service kept running",
    )
    .await;
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut svc.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    // Issue 42 item 7: a restart cannot fix it, so it exits 2 (the unit's
    // RestartPreventExitStatus), and its line says the cause once.
    assert_eq!(status.code(), Some(2), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("msgexchange: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert_eq!(
        line.matches("200010 is above the inbox's head").count(),
        1,
        "{line}"
    );
    assert_eq!(env.store.read_cursor().await.expect("c").seeded_at, None);
    env.cleanup().await;
}

/// The approved plan (`pipeline.cutover_expect = "<W>:<token>"`): `max` seeds the approved W
/// even though rows were added above it meanwhile (they are read, not skipped); a row that
/// commits at or below W after the plan changes the token and the seeding refuses to start.
#[tokio::test]
async fn the_seeding_requires_the_approved_stock() {
    // Rows above the approved W after the plan: seeded at the approved W; they are ours.
    let env = TestEnv::new("cutover_expect").await;
    env.insert_rows(10).await;
    let p = plan(&env, "max");
    assert_eq!(p["w"], 10, "{p}");
    let expect = p["expect"].as_str().expect("expect").to_string();
    assert!(expect.starts_with("10:"), "{expect}");
    let (_, text, _) = plan_run(&env, "max");
    assert!(
        text.contains(&format!("pipeline.cutover_expect = \"{expect}\"")),
        "{text}"
    );
    let later = env.insert_rows(2).await;
    let approved = approval(&env, "max", &expect);
    let out = apply_cutover_approved(
        &env.store,
        &env.inbox,
        Some(CutoverMode::Max),
        &approved,
        &env.clock,
        WATCH,
    )
    .await
    .expect("seeded");
    assert_eq!(
        out,
        Some(SeedOutcome::Seeded { w: 10 }),
        "the approved W, not MAX(id) = 12"
    );
    let r = env.poll(env.poll_cfg(100)).await;
    assert_eq!(r.enqueued_new, 2, "rows after the plan are read");
    assert_eq!(env.enqueued_ids().await, later);
    let audit: (String, String, Option<String>, serde_json::Value) = sqlx::query_as(
        "SELECT actor, reason, ticket, result FROM audit_log WHERE action = 'CUTOVER'",
    )
    .fetch_one(env.store.pool())
    .await
    .expect("one audit row");
    assert_eq!(audit.0, "alice");
    assert_eq!(audit.2.as_deref(), Some("CHG-29"));
    assert!(
        audit.1.contains("max") && audit.1.contains("W = 10"),
        "{}",
        audit.1
    );
    assert_eq!(audit.3["w"], 10);
    assert_eq!(audit.3["mode"], "max");
    assert_eq!(audit.3["expectation_checked"], true);
    assert_eq!(
        format!("10:{}", audit.3["stock_token"].as_str().expect("t")),
        expect
    );

    // A row committed at or below W after the plan: refused, nothing seeded.
    let env2 = TestEnv::new("cutover_expect2").await;
    env2.insert_rows(3).await;
    let (held, held_id) = env2.open_insert().await;
    env2.insert_rows(3).await;
    let p = plan(&env2, "max");
    assert_eq!(
        (p["w"].as_i64(), p["gap_ids"].as_i64()),
        (Some(7), Some(1)),
        "{p}"
    );
    let expect = p["expect"].as_str().expect("expect").to_string();
    held.commit().await.expect("commits after the plan");
    let err = apply_cutover_approved(
        &env2.store,
        &env2.inbox,
        Some(CutoverMode::Max),
        &approval(&env2, "max", &expect),
        &env2.clock,
        WATCH,
    )
    .await
    .expect_err("refused");
    let line = format!("{err:#}");
    assert!(line.contains("changed since the approved plan"), "{line}");
    assert!(line.contains("cutover plan"), "{line}");
    assert_eq!(
        env2.store.read_cursor().await.expect("c").seeded_at,
        None,
        "{held_id}"
    );
    // An expectation for another id, or without a mode, is refused by the settings.
    for (mode, why) in [
        ("7", "expects W = 10"),
        ("", "pipeline.cutover_watermark is not"),
    ] {
        let e = msgx_core::settings::Settings::load_layered_with_env(
            Some(&common::default_toml()),
            &[
                ("MSGX_PIPELINE__CUTOVER_WATERMARK", mode),
                (
                    "MSGX_PIPELINE__CUTOVER_EXPECT",
                    &expect.replacen("7:", "10:", 1),
                ),
            ],
        )
        .expect_err("refused")
        .to_string();
        assert!(
            e.contains("pipeline.cutover_expect") && e.contains(why),
            "{e}"
        );
    }
    env.cleanup().await;
    env2.cleanup().await;
}

/// `pipeline.cutover_*` of an approval by alice under CHG-29.
fn approval(env: &TestEnv, mode: &str, expect: &str) -> Approval {
    let settings = env.settings(&[
        ("MSGX_PIPELINE__CUTOVER_WATERMARK", mode),
        ("MSGX_PIPELINE__CUTOVER_EXPECT", expect),
        ("MSGX_PIPELINE__CUTOVER_BY", "alice"),
        ("MSGX_PIPELINE__CUTOVER_TICKET", "CHG-29"),
    ]);
    cutover_approval(&settings)
}

/// Ids below the first stock row are holes like any other: a row in flight there at the
/// cutover that commits later is found by the late detector (LATE), not left to the
/// compensation scan's window.
#[tokio::test]
async fn ids_below_the_first_stock_row_are_watched_like_any_hole() {
    let env = TestEnv::new("cutover_below").await;
    let (first, last) = purged_inbox(&env).await;
    cutover(&env, CutoverMode::Max).await.expect("seeded");
    let watched: Vec<(i64, i64)> =
        sqlx::query_as("SELECT first_id, last_id FROM late_watch_range ORDER BY first_id")
            .fetch_all(env.store.pool())
            .await
            .expect("watched");
    assert_eq!(watched, vec![(1, first - 1)]);
    let record = env.store.cutover_stock().await.expect("r").expect("seeded");
    assert_eq!(
        record.span.expect("span").gap_ids(),
        0,
        "not gaps of the stock"
    );
    // An upstream insert that held id 500 commits now.
    sqlx::query(
        "INSERT INTO CMINMSGS (CMINMSGS_ID, CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) \
         VALUES (500, NOW(), '<MSG/>')",
    )
    .execute(&env.owner)
    .await
    .expect("late commit");
    let cfg = msgx_core::late::DetectConfig::from_settings(&env.settings(&[]));
    let r = msgx_core::late::detect_once(&env.inbox, &env.store, &env.clock, &cfg)
        .await
        .expect("detect");
    assert_eq!(
        r.detected.iter().map(|h| h.msg_id).collect::<Vec<_>>(),
        vec![500],
        "{r:?}"
    );
    let source: String = env
        .scalar_for("SELECT source FROM proc_state WHERE msg_id = $1", 500i64)
        .await;
    assert_eq!(source, "LATE");
    assert!(env
        .enqueued_ids()
        .await
        .iter()
        .all(|id| *id < first || *id > last));
    env.cleanup().await;
}
