//! Evidence-based hole release (`late.hole_evidence`, docs/hole-evidence.md) against a real
//! MariaDB: a really rolled-back insert is released early, a really open transaction holds its
//! hole past `max_commit_delay` (until it commits, or until the cap), evidence off is the timer
//! rule, an account without `PROCESS` falls back to the timer rule, a session time zone other
//! than the server's does not fool the time comparison, and a frozen (stale) transaction list
//! is never taken as evidence.
//!
//! The transaction list is server-wide, so these tests run one at a time (an open transaction
//! of one test would hold another test's hole). A transaction of another process on the same
//! server (the chaos binary's writers run beside these tests) holds an early release for as
//! long as it is open; the tests wait for it, and only rounds held with no such transaction
//! open count against their few rounds (the manual clock never moves meanwhile, so a release
//! can only come from the evidence).

use msgx_testkit as common;

use std::time::Duration;

use common::TestEnv;
use msgx_core::clock::Clock;
use msgx_core::inbox::evidence::EvidenceError;
use msgx_core::inbox::Inbox;
use msgx_core::poller::{poll_once, HoleEvidenceConfig, PollConfig, PollReport};
use msgx_core::watermark::{Advance, Evidence, EvidenceDecision, Released};
use sqlx::Executor;

const DELAY: Duration = Duration::from_secs(300);
const CAP: Duration = Duration::from_secs(1800);

/// One test at a time: the transaction list is shared by every database on the server.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Rounds are this far apart in real time (the default poll interval is 1 s). More than the
/// 100 ms `INNODB_TRX` stays cached after a read, so each round's list is fresh at once
/// (a stale one is retried after 150 ms anyway).
const ROUND_GAP: Duration = Duration::from_millis(300);

/// The evidence decision about the first hole a round changed.
fn front(a: &Advance) -> Option<EvidenceDecision> {
    a.evidence.first().map(|(_, d)| *d)
}

/// One test's env, the server's transaction list to itself while the guard lives.
async fn serial_env(tag: &str) -> (tokio::sync::MutexGuard<'static, ()>, TestEnv) {
    let serial = SERIAL.lock().await;
    (serial, TestEnv::new(tag).await)
}

/// [`serial_env`] with the evidence rule's poll config.
async fn evidence_env(tag: &str) -> (tokio::sync::MutexGuard<'static, ()>, TestEnv, PollConfig) {
    let (serial, env) = serial_env(tag).await;
    let cfg = evidence_cfg(&env);
    (serial, env, cfg)
}

/// This round released exactly the one id `hole`, with this evidence and this decision.
fn assert_released_alone(
    r: &PollReport,
    hole: i64,
    evidence: Evidence,
    decision: EvidenceDecision,
) {
    assert_eq!(r.hole_evidence, Some(evidence));
    assert_eq!(
        r.advance.first_released(),
        Some(Released {
            first: hole,
            last: hole
        })
    );
    assert_eq!(front(&r.advance), Some(decision));
}

fn evidence_cfg(env: &TestEnv) -> PollConfig {
    PollConfig {
        max_commit_delay: DELAY,
        hole_evidence: Some(HoleEvidenceConfig { cap: CAP }),
        ..env.poll_cfg(100)
    }
}

/// The server-clock sighting of the hole at W+1.
async fn seen_db_at(env: &TestEnv) -> Option<chrono::NaiveDateTime> {
    let stored = env.store.read_cursor().await.expect("cursor");
    stored
        .holes
        .iter()
        .find(|h| h.first == stored.cursor.w + 1)
        .and_then(|h| h.seen_db_at)
}

async fn watched(env: &TestEnv, id: i64) -> bool {
    env.late_watch_entry(id)
        .await
        .expect("late_watch")
        .is_some()
}

async fn round_with(env: &TestEnv, inbox: &Inbox, cfg: PollConfig) -> PollReport {
    poll_once(inbox, &env.store, &env.clock, cfg)
        .await
        .expect("poll round")
}

/// Moves the manual clock to one second short of `limit` and polls through `inbox`: nothing
/// is released yet (`why`); then the last second and polls again. Both rounds.
async fn across_the_limit(
    env: &TestEnv,
    inbox: &Inbox,
    cfg: PollConfig,
    limit: Duration,
    why: &str,
) -> (PollReport, PollReport) {
    env.clock.advance(limit - Duration::from_secs(1));
    let before = round_with(env, inbox, cfg).await;
    assert_eq!(before.advance.first_released(), None, "{why}");
    env.clock.advance(Duration::from_secs(1));
    (before, round_with(env, inbox, cfg).await)
}

/// Longest wait for another process's transaction that holds the hole (the chaos binary runs
/// beside these tests, and its writers hold commits open on the same server).
const FOREIGN_LIMIT: Duration = Duration::from_secs(120);

/// Polls (real time between rounds, manual clock untouched) until a round releases, at most
/// `max_rounds` held with no transaction older than the hole's sighting open on the server;
/// returns the releasing round and how many rounds it took. A round held while another
/// process's older transaction is open does not count (within [`FOREIGN_LIMIT`]): the hole
/// is rightly held then.
async fn poll_until_released(
    env: &TestEnv,
    inbox: &Inbox,
    cfg: PollConfig,
    max_rounds: usize,
) -> (PollReport, usize) {
    let started = std::time::Instant::now();
    let mut counted = 0;
    for round in 1.. {
        let r = round_with(env, inbox, cfg).await;
        if !r.advance.released.is_empty() {
            return (r, round);
        }
        // Anything but a release here must be an older transaction (of another process).
        assert_eq!(
            r.hole_evidence,
            Some(Evidence::OlderTransactionOpen),
            "round {round}: not released, so something older must be open"
        );
        if !foreign_older_transaction_open(env).await {
            counted += 1;
            assert!(
                counted < max_rounds,
                "not released within {max_rounds} rounds"
            );
        }
        assert!(
            started.elapsed() < FOREIGN_LIMIT,
            "not released within {FOREIGN_LIMIT:?}: another transaction stayed open"
        );
        tokio::time::sleep(ROUND_GAP).await;
    }
    unreachable!("the rounds are unbounded")
}

/// Whether a transaction that started at or before the hole's sighting is open now: the
/// test's own one is over when this is asked, so it belongs to another process.
async fn foreign_older_transaction_open(env: &TestEnv) -> bool {
    let Some(seen) = seen_db_at(env).await else {
        return false;
    };
    let snapshot = env.inbox.trx_snapshot().await.expect("INNODB_TRX");
    snapshot.oldest_started.is_some_and(|oldest| oldest <= seen)
}

#[tokio::test]
async fn rolled_back_insert_is_released_on_the_next_round_long_before_max_commit_delay() {
    let (_serial, env, cfg) = evidence_env("ev_rollback").await;
    let first = env.insert_rows(1).await[0];
    let (tx, hole) = env.open_insert().await;
    let after = env.insert_rows(2).await;
    let t0 = env.clock.now();

    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, first, "W waits before the hole");
    assert_eq!(r.hole_evidence, None, "first sighting: no evidence yet");
    assert!(
        r.hole_sighted && r.poll_again_now(),
        "a new sighting asks for the next round at once"
    );
    let seen = seen_db_at(&env)
        .await
        .expect("sighting stored with HOLE_SINCE");
    assert_eq!(env.cursor().await, (first, Some(t0)));

    // The inserting transaction is really open: it started before the sighting.
    tokio::time::sleep(ROUND_GAP).await;
    let oldest = env
        .inbox
        .trx_snapshot()
        .await
        .expect("root may read INNODB_TRX")
        .oldest_started
        .expect("our transaction is open");
    assert!(oldest <= seen, "trx_started {oldest} after sighting {seen}");
    let r = env.poll(cfg).await;
    assert_eq!(r.hole_evidence, Some(Evidence::OlderTransactionOpen));
    assert_eq!((r.advance.w, r.advance.first_released()), (first, None));
    assert!(
        !r.poll_again_now(),
        "held: the next round waits a poll interval"
    );
    assert_eq!(front(&r.advance), None, "young: the timer holds it as well");
    assert_eq!(seen_db_at(&env).await, Some(seen), "the sighting is kept");

    tx.rollback().await.expect("rollback");
    tokio::time::sleep(ROUND_GAP).await;
    let (r, rounds) = poll_until_released(&env, &env.inbox, cfg, 20).await;
    eprintln!("released {rounds} round(s) after the rollback");
    assert_eq!(env.clock.now(), t0, "the manual clock never moved");
    assert_released_alone(
        &r,
        hole,
        Evidence::NoOlderTransaction,
        EvidenceDecision::ReleasedEarly,
    );
    assert_eq!(
        env.cursor().await,
        (after[1], None),
        "W walks on over the rows after the hole"
    );
    assert_eq!(seen_db_at(&env).await, None);
    assert!(
        watched(&env, hole).await,
        "released ids are watched as usual"
    );

    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, after[1]);
    let mut expected = vec![first];
    expected.extend(&after);
    assert_eq!(env.enqueued_ids().await, expected, "only the hole skipped");
    env.cleanup().await;
}

#[tokio::test]
async fn open_transaction_holds_its_hole_past_max_commit_delay_until_it_commits() {
    let (_serial, env, cfg) = evidence_env("ev_commit").await;
    let (tx, hole) = env.open_insert().await;
    let after = env.insert_rows(1).await[0];

    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, hole - 1);
    assert!(seen_db_at(&env).await.is_some());
    tokio::time::sleep(ROUND_GAP).await;

    env.clock.advance(DELAY);
    let r = env.poll(cfg).await;
    assert_eq!(r.hole_evidence, Some(Evidence::OlderTransactionOpen));
    assert_eq!(
        r.advance.first_released(),
        None,
        "NOT released at max_commit_delay"
    );
    assert_eq!(front(&r.advance), Some(EvidenceDecision::Held));
    assert_eq!(r.advance.open_hole.expect("hole").age, DELAY);

    env.clock.advance(Duration::from_secs(600));
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.first_released(), None, "held at 15 min");
    assert_eq!(front(&r.advance), Some(EvidenceDecision::Held));
    assert!(
        env.enqueued_ids().await.is_empty(),
        "nothing after the hole"
    );

    tx.commit().await.expect("late commit");
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, after, "a normal fill");
    assert_eq!(r.advance.first_released(), None);
    assert_eq!(
        r.advance.fills.first().copied(),
        Some(Duration::from_secs(900))
    );
    assert_eq!(env.enqueued_ids().await, vec![hole, after]);
    assert_eq!(env.cursor().await, (after, None));
    assert_eq!(seen_db_at(&env).await, None);
    assert!(!watched(&env, hole).await);
    env.cleanup().await;
}

#[tokio::test]
async fn open_transaction_that_never_ends_is_released_at_the_cap() {
    let (_serial, env, cfg) = evidence_env("ev_cap").await;
    let first = env.insert_rows(1).await[0];
    let (tx, hole) = env.open_insert().await;
    let after = env.insert_rows(1).await[0];

    env.poll(cfg).await;
    tokio::time::sleep(ROUND_GAP).await;
    let why = "held one second before the cap";
    let (before, r) = across_the_limit(&env, &env.inbox, cfg, CAP, why).await;
    assert_eq!(front(&before.advance), Some(EvidenceDecision::Held));
    assert_released_alone(
        &r,
        hole,
        Evidence::OlderTransactionOpen,
        EvidenceDecision::CapReached,
    );
    assert!(watched(&env, hole).await, "the late detector watches it");
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, after);
    assert_eq!(env.enqueued_ids().await, vec![first, after]);
    tx.rollback().await.expect("rollback");
    env.cleanup().await;
}

#[tokio::test]
async fn evidence_off_is_the_plain_timer_rule() {
    let (_serial, env) = serial_env("ev_off").await;
    let cfg = PollConfig {
        max_commit_delay: DELAY,
        ..env.poll_cfg(100)
    };
    assert_eq!(cfg.hole_evidence, None, "off by default");
    let (rolled, rolled_id) = env.open_insert().await;
    rolled.rollback().await.expect("rollback");
    let mid = env.insert_rows(1).await[0];
    let (open, open_id) = env.open_insert().await;
    let last = env.insert_rows(1).await[0];

    let r = env.poll(cfg).await;
    assert!(!r.hole_sighted && !r.poll_again_now());
    assert_eq!(seen_db_at(&env).await, None, "no sighting without evidence");
    tokio::time::sleep(ROUND_GAP).await;
    let why = "a rollback waits the full delay";
    let (before, r) = across_the_limit(&env, &env.inbox, cfg, DELAY, why).await;
    assert_eq!((before.hole_evidence, front(&before.advance)), (None, None));
    // Both holes were seen together: the rolled-back one and the still-open transaction's go
    // at max_commit_delay, in the same round (without evidence an open transaction's hole is
    // released by the timer all the same).
    let released: Vec<i64> = r.advance.released.iter().map(|h| h.first).collect();
    assert_eq!(released, vec![rolled_id, open_id]);
    assert!(r.advance.evidence.is_empty());
    assert_eq!(r.advance.w, last);
    assert_eq!(env.enqueued_ids().await, vec![mid, last]);
    open.rollback().await.expect("rollback");
    env.cleanup().await;
}

/// `mysql://root@host:port/db` → `mysql://user:password@host:port/db`.
fn url_as(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("url scheme");
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}:{password}@{rest}")
}

#[tokio::test]
async fn account_without_process_privilege_falls_back_to_the_timer_rule() {
    let (_serial, env) = serial_env("ev_noproc").await;
    let user = format!("{}_u", env.db);
    let admin = common::mysql_admin().await.expect("mariadb admin");
    common::run_all(
        &admin,
        &[
            format!("DROP USER IF EXISTS '{user}'@'%'"),
            format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"),
            format!("GRANT SELECT, UPDATE ON `{}`.* TO '{user}'@'%'", env.db),
        ],
    )
    .await;
    let inbox = env.inbox_with(&[("MSGX_INBOX__URL", &url_as(&env.my_url, &user, "pw"))]);
    assert!(
        matches!(
            inbox.trx_snapshot().await,
            Err(EvidenceError::Unavailable(_))
        ),
        "no PROCESS: no evidence"
    );
    let cfg = evidence_cfg(&env);
    let first = env.insert_rows(1).await[0];
    let (tx, hole) = env.open_insert().await;
    tx.rollback().await.expect("rollback");
    env.insert_rows(1).await;

    let r = round_with(&env, &inbox, cfg).await;
    assert_eq!(r.advance.w, first);
    assert!(
        seen_db_at(&env).await.is_some(),
        "the server time needs no privilege"
    );
    for _ in 0..2 {
        tokio::time::sleep(ROUND_GAP).await;
        let r = round_with(&env, &inbox, cfg).await;
        assert_eq!(r.hole_evidence, None, "unavailable: timer rule");
        assert_eq!(
            r.advance.first_released(),
            None,
            "a rollback is not released early"
        );
    }
    let why = "the timer rule holds the full delay";
    let (_, r) = across_the_limit(&env, &inbox, cfg, DELAY, why).await;
    assert_eq!(r.advance.first_released().map(|h| h.first), Some(hole));
    assert_eq!(front(&r.advance), None, "a plain timer release");

    inbox.pool().close().await;
    common::run_all(&admin, &[format!("DROP USER IF EXISTS '{user}'@'%'")]).await;
    admin.close().await;
    env.cleanup().await;
}

/// sqlx sets the session zone to `+00:00`; a reader could run under any zone. `trx_started` is
/// shown in the server's system zone whatever the session's, so "now" must be read in that
/// zone too: at UTC−5 a naive `NOW()` would make every open transaction look five hours
/// younger than the sighting and release its hole early.
#[tokio::test]
async fn a_session_time_zone_unlike_the_servers_does_not_release_an_open_transactions_hole() {
    let (_serial, env) = serial_env("ev_tz").await;
    let url = format!("{}?timezone=-05:00", env.my_url);
    let inbox = env.inbox_with(&[("MSGX_INBOX__URL", &url)]);
    let cfg = evidence_cfg(&env);
    let (tx, hole) = env.open_insert().await;
    let after = env.insert_rows(1).await[0];

    round_with(&env, &inbox, cfg).await;
    tokio::time::sleep(ROUND_GAP).await;
    let r = round_with(&env, &inbox, cfg).await;
    assert_eq!(r.hole_evidence, Some(Evidence::OlderTransactionOpen));
    assert_eq!(
        r.advance.first_released(),
        None,
        "an open transaction is never released early"
    );
    env.clock.advance(DELAY);
    let r = round_with(&env, &inbox, cfg).await;
    assert_eq!(front(&r.advance), Some(EvidenceDecision::Held));

    tx.commit().await.expect("commit");
    let r = round_with(&env, &inbox, cfg).await;
    assert_eq!(r.advance.w, after);
    assert_eq!(env.enqueued_ids().await, vec![hole, after]);
    inbox.pool().close().await;
    env.cleanup().await;
}

/// `INNODB_TRX` is a cache refreshed only after 100 ms without readers: a client reading it
/// every 20 ms freezes it. Frozen before the inserting transaction began, it does not show
/// that transaction — read naively, "no older transaction is open" and the hole would go
/// although the transaction may still commit. The reading transaction must be in the list,
/// else the list is stale and proves nothing.
#[tokio::test]
async fn a_frozen_transaction_list_is_never_taken_as_evidence() {
    let (_serial, env, cfg) = evidence_env("ev_frozen").await;
    let first = env.insert_rows(1).await[0];

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let freezer = {
        let stop = stop.clone();
        let pool = common::mysql_admin().await.expect("freezer connection");
        tokio::spawn(async move {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.INNODB_TRX")
                        .fetch_one(&pool)
                        .await
                        .expect("freezer read");
                reads += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            pool.close().await;
            reads
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // frozen without the transaction
    let (tx, hole) = env.open_insert().await;
    let after = env.insert_rows(1).await[0];

    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, first);
    for _ in 0..3 {
        tokio::time::sleep(ROUND_GAP).await;
        let r = env.poll(cfg).await;
        eprintln!("frozen list: evidence {:?}", r.hole_evidence);
        assert_ne!(
            r.hole_evidence,
            Some(Evidence::NoOlderTransaction),
            "a stale list must not say the open transaction is gone"
        );
        assert_eq!(
            r.advance.first_released(),
            None,
            "an open transaction's hole stays"
        );
    }
    tx.rollback().await.expect("rollback");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = freezer.await.expect("freezer");
    assert!(reads > 10, "the freezer kept reading ({reads} reads)");
    tokio::time::sleep(ROUND_GAP).await;

    // Thawed: the rollback is seen and the hole goes early, as usual.
    let (r, _) = poll_until_released(&env, &env.inbox, cfg, 20).await;
    assert_eq!(r.advance.first_released().map(|h| h.first), Some(hole));
    assert_eq!(front(&r.advance), Some(EvidenceDecision::ReleasedEarly));
    let r = env.poll(cfg).await;
    assert_eq!(r.advance.w, after);
    env.cleanup().await;
}

#[tokio::test]
async fn evidence_is_refused_against_a_read_only_server() {
    let (_serial, env) = serial_env("ev_primary").await;
    let role = env
        .inbox
        .check_primary()
        .await
        .expect("the test server is a primary");
    assert_eq!(role.replica, Some(false));
    assert!(!role.read_only);

    // Briefly read-only (root keeps writing: READ ONLY ADMIN); restored right after the one
    // check, before anything can panic.
    env.owner
        .execute("SET GLOBAL read_only = 1")
        .await
        .expect("read_only on");
    let refused = env.inbox.check_primary().await;
    env.owner
        .execute("SET GLOBAL read_only = 0")
        .await
        .expect("read_only off");
    let e = refused.expect_err("refused").to_string();
    assert!(e.contains("read-only (@@read_only = 1)"), "{e}");
    assert!(e.contains("late.hole_evidence"), "{e}");
    assert!(
        !env.inbox.server_role().await.expect("role").read_only,
        "restored"
    );
    env.cleanup().await;
}

/// Issue 55: start-up with evidence on against a read-only server (what a failover's new
/// primary looks like for a moment) waits and retries, saying so in `/readyz` in fixed words,
/// instead of exiting 2 (which the unit never restarts); once the server is writable, start-up
/// goes on. Read-only only for as long as the first check takes (the server is shared).
#[tokio::test]
async fn a_read_only_inbox_at_start_up_is_waited_for_not_fatal() {
    let (_serial, env) = serial_env("ev_wait").await;
    let health = msgx_actors::health::Health::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    env.owner
        .execute("SET GLOBAL read_only = 1")
        .await
        .expect("read_only on");
    let (inbox, h) = (env.inbox.clone(), health.clone());
    let waiter = tokio::spawn(async move {
        let mut stop = Box::pin(async {
            let _ = stop_rx.await;
        });
        msgx_actors::lifecycle::wait_for_primary(&inbox, &h, &mut stop).await
    });
    let mut said = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        said = health.readiness().waiting;
        if said.is_some() {
            break;
        }
    }
    env.owner
        .execute("SET GLOBAL read_only = 0")
        .await
        .expect("read_only off");
    let said = said.expect("the wait is visible on /readyz");
    assert!(said.contains("not a writable primary"), "{said}");
    assert!(!said.contains("@@read_only"), "no internals: {said}");
    assert!(!waiter.is_finished(), "still waiting, not refused");
    let found = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("goes on once writable")
        .expect("task");
    assert!(found, "the primary is found, start-up goes on");
    drop(stop_tx);
    env.cleanup().await;
}
