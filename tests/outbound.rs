//! The outbound path against real MariaDB + PostgreSQL (seed §7, SPEC §7/§12): a request is
//! REGISTERED in REQ_TRACK, written into COUTMSGS and SENT with the row id — exactly one row
//! per request across a crash at each step (the real binary, aborted at a failpoint, then run
//! again); the reconciler never looks below the floor; a sender and a reconciler racing on the
//! same request write it once; the daily requester asks once per day across restarts and not
//! at all when off, reconciling leftovers at start; a SCHD/RESP with our RQID is recorded on
//! the request; bad outbound config stops the binary with one line naming the key.

use msgx_testkit as common;

use std::process::{Output, Stdio};
use std::time::Duration;

use actix::Actor;
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use common::TestEnv;
use msgx_actors::messages::RequestTick;
use msgx_actors::schedule_requester::ScheduleRequester;
use msgx_core::clock::Clock;
use msgx_core::outbound::track::TrackRow;
use msgx_core::outbound::{self, daily_step, DailyOutcome, Origin, Outbound, SentVia, TrackState};

/// `DATE_CREATED, CLOB_MSG` (ours) and `DATE_SENT, ACK_DATE_RECV, ACK_RESEND_TIMES, ERROR`
/// (the downstream adapter's) of one COUTMSGS row.
type OutRow = (
    Option<NaiveDateTime>,
    String,
    Option<NaiveDateTime>,
    Option<NaiveDateTime>,
    Option<i32>,
    Option<String>,
);

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .expect("time")
        .with_timezone(&Utc)
}

fn day(y: i32, m: u32, d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, d).expect("date")
}

/// The outbound functions over this env, daily time as configured (`""` = off).
fn outbound_with(env: &TestEnv, daily_at: &str) -> Outbound {
    let settings = env.settings(&[("MSGX_OUTBOUND__SCHEDULE_REQUEST_AT", daily_at)]);
    let ob = Outbound::from_settings(&settings, &env.store, &env.inbox).expect("outbound");
    assert_eq!(ob.cfg.sender, "MSGX");
    ob
}

/// A new env (tagged `tag`) and the outbound functions over it, daily time `daily_at`.
async fn outbound_env(tag: &str, daily_at: &str) -> (TestEnv, Outbound) {
    let env = TestEnv::new(tag).await;
    let ob = outbound_with(&env, daily_at);
    (env, ob)
}

/// `n` rows someone else wrote to COUTMSGS before us (ids 1..=n in a fresh env).
async fn fill_coutmsgs(env: &TestEnv, n: usize) {
    for _ in 0..n {
        sqlx::query(
            "INSERT INTO COUTMSGS (COUTMSGS_DATE_CREATED, COUTMSGS_CLOB_MSG) VALUES (NOW(), '<MSG/>')",
        )
        .execute(&env.owner)
        .await
        .expect("filler");
    }
}

/// A daily requester actor over `ob`, checking every `every`.
fn requester(
    ob: &Outbound,
    clock: msgx_core::clock::SharedClock,
    every: Duration,
) -> actix::Addr<ScheduleRequester> {
    ScheduleRequester::new(ob.clone(), clock, every).start()
}

/// Registers a manual schedule request for `date` (not yet written).
async fn register(ob: &Outbound, date: NaiveDate, now: DateTime<Utc>) -> outbound::Registered {
    outbound::register_schedule(ob, Origin::Manual, date, now)
        .await
        .expect("register")
}

/// `request schedule` through the real binary.
fn request_schedule_bin(env: &TestEnv, args: &[&str], extra: &[(&str, &str)]) -> Output {
    let mut cmd = common::instance::msgexchange();
    cmd.args(["request", "schedule"])
        .args(args)
        .envs(env.binary_env())
        .env("MSGX_LOG__LEVEL", "warn")
        .env_remove("MSGEXCHANGE_FAILPOINT")
        .stdin(Stdio::null());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().expect("run msgexchange")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `key=value` from the binary's output line that starts with `prefix`.
fn field(stdout: &str, prefix: &str, key: &str) -> Option<String> {
    let line = stdout.lines().find(|l| l.starts_with(prefix))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
}

/// The RQID and the COUTMSGS id of the request the binary printed as its own (`requested`).
fn requested(stdout: &str) -> (String, i64) {
    let rqid = field(stdout, "requested", "rqid").expect("rqid");
    let out_id = field(stdout, "requested", "out_id")
        .expect("out_id")
        .parse()
        .expect("number");
    (rqid, out_id)
}

/// COUTMSGS ids whose message carries `<RQID>rqid</RQID>`.
async fn rows_with(env: &TestEnv, rqid: &str) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT COUTMSGS_ID FROM COUTMSGS WHERE INSTR(COUTMSGS_CLOB_MSG, ?) > 0 ORDER BY COUTMSGS_ID",
    )
    .bind(format!("<RQID>{rqid}</RQID>"))
    .fetch_all(&env.owner)
    .await
    .expect("coutmsgs")
}

async fn coutmsgs_count(env: &TestEnv) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM COUTMSGS")
        .fetch_one(&env.owner)
        .await
        .expect("count")
}

async fn tracks(ob: &Outbound) -> Vec<TrackRow> {
    ob.track.all().await.expect("req_track")
}

/// A crash at `failpoint` aborts the binary with the request REGISTERED (and, after the
/// insert, its row in COUTMSGS); the next run reconciles it (`expect_via`) and then sends its
/// own request. Exactly one COUTMSGS row per RQID, each REQ_TRACK row SENT with that row id.
async fn crash_then_rerun(tag: &str, failpoint: &str, rows_after_crash: usize, expect_via: &str) {
    let (env, ob) = outbound_env(tag, "").await;
    // Rows someone wrote before (the floor is above them).
    fill_coutmsgs(&env, 3).await;

    let crashed = request_schedule_bin(
        &env,
        &["--date", "20261130"],
        &[("MSGEXCHANGE_FAILPOINT", failpoint)],
    );
    assert!(!crashed.status.success(), "the failpoint aborts the run");
    assert!(
        text(&crashed.stderr).contains(&format!("MSGEXCHANGE_FAILPOINT {failpoint}")),
        "{}",
        text(&crashed.stderr)
    );
    let left = tracks(&ob).await;
    assert_eq!(left.len(), 1);
    let leftover = &left[0];
    assert_eq!(leftover.state, TrackState::Registered);
    assert_eq!(
        leftover.floor_id, 3,
        "MAX(COUTMSGS_ID) read before registering"
    );
    assert_eq!(leftover.target_date, day(2026, 11, 30));
    assert_eq!(
        rows_with(&env, &leftover.rqid).await.len(),
        rows_after_crash,
        "after the crash at {failpoint}"
    );

    let rerun = request_schedule_bin(&env, &["--date", "20261201"], &[]);
    assert!(rerun.status.success(), "{}", text(&rerun.stderr));
    let stdout = text(&rerun.stdout);
    assert_eq!(
        field(&stdout, "reconciled", "rqid").as_deref(),
        Some(leftover.rqid.as_str()),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("({expect_via})")), "{stdout}");
    let (new_rqid, new_out) = requested(&stdout);

    let rows = tracks(&ob).await;
    assert_eq!(rows.len(), 2);
    for row in &rows {
        let ids = rows_with(&env, &row.rqid).await;
        assert_eq!(ids.len(), 1, "exactly one COUTMSGS row for {}", row.rqid);
        assert_eq!(row.state, TrackState::Sent);
        assert_eq!(row.out_id, Some(ids[0]), "SENT with its outbound row id");
        assert!(ids[0] > row.floor_id);
    }
    let reconciled = rows.iter().find(|r| r.rqid == leftover.rqid).expect("row");
    let via = if expect_via == "found" {
        SentVia::ReconcileFound
    } else {
        SentVia::ReconcileWritten
    };
    assert_eq!(reconciled.via(), Some(via));
    let fresh = rows.iter().find(|r| r.rqid == new_rqid).expect("new row");
    assert_eq!(fresh.via(), Some(SentVia::Send));
    assert_eq!(fresh.out_id, Some(new_out));
    assert_eq!(fresh.target_date, day(2026, 12, 1));
    assert_eq!(coutmsgs_count(&env).await, 3 + 2);

    // A third run has nothing to reconcile.
    let third = request_schedule_bin(&env, &[], &[]);
    assert!(third.status.success(), "{}", text(&third.stderr));
    assert!(!text(&third.stdout).contains("reconciled"));
    assert_eq!(coutmsgs_count(&env).await, 3 + 3);
    env.cleanup().await;
}

#[tokio::test]
async fn crash_after_register_is_written_once_by_the_next_run() {
    crash_then_rerun("ob_crash_reg", "outbound_after_register", 0, "written").await;
}

#[tokio::test]
async fn crash_after_insert_is_found_not_written_again() {
    crash_then_rerun("ob_crash_ins", "outbound_after_insert", 1, "found").await;
}

#[tokio::test]
async fn clean_run_writes_one_schedule_request_with_our_meta() {
    let (env, ob) = outbound_env("ob_clean", "").await;
    let out = request_schedule_bin(&env, &["--date", "20261130"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(!stdout.contains("reconciled"), "{stdout}");
    let (rqid, out_id) = requested(&stdout);

    let rows = tracks(&ob).await;
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(
        (row.state.as_str(), row.out_id, row.via()),
        ("SENT", Some(out_id), Some(SentVia::Send))
    );
    assert_eq!((row.kind.as_str(), row.origin.as_str()), ("SCHD", "MANUAL"));
    assert_eq!(row.rqid, rqid);
    assert!(rqid.starts_with(&format!("MSGX-{}-", row.id)), "{rqid}");
    assert_eq!(rows_with(&env, &rqid).await, vec![out_id]);

    // Only our two columns are written; the adapter's stay NULL.
    let (created, msg, sent, ack, resend, error): OutRow = sqlx::query_as(
        "SELECT COUTMSGS_DATE_CREATED, COUTMSGS_CLOB_MSG, COUTMSGS_DATE_SENT, \
         COUTMSGS_ACK_DATE_RECV, COUTMSGS_ACK_RESEND_TIMES, COUTMSGS_ERROR \
         FROM COUTMSGS WHERE COUTMSGS_ID = ?",
    )
    .bind(out_id)
    .fetch_one(&env.owner)
    .await
    .expect("row");
    assert!(created.is_some());
    assert_eq!((sent, ack, resend, error), (None, None, None, None));
    assert_eq!(msg, row.message, "the registered text is what landed");
    for part in [
        "<SNDR>MSGX</SNDR>".to_string(),
        "<RCVR>AODB</RCVR>".to_string(),
        format!("<SEQN>{}</SEQN>", row.id),
        "<TYPE>SCHD</TYPE><STYP>RQST</STYP>".to_string(),
        format!("<RQID>{rqid}</RQID></META>"),
        "<SCHD><DATE>20261130</DATE></SCHD>".to_string(),
    ] {
        assert!(msg.contains(&part), "{part} in {msg}");
    }
    // DDTM is airport local time (Asia/Shanghai) of the run, like the creation time.
    let ddtm = msg
        .split("<DDTM>")
        .nth(1)
        .and_then(|s| s.split("</DDTM>").next())
        .expect("ddtm");
    let local_now = Utc::now().with_timezone(&env.tz).naive_local();
    let sent_local =
        chrono::NaiveDateTime::parse_from_str(ddtm, "%Y%m%d%H%M%S").expect("DDTM format");
    assert!((local_now - sent_local).num_seconds().abs() < 120, "{ddtm}");
    let created = created.expect("created");
    assert!((local_now - created).num_seconds().abs() < 120, "{created}");

    // Without --date: today in airport time.
    let out = request_schedule_bin(&env, &[], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let today = Utc::now()
        .with_timezone(&env.tz)
        .format("%Y%m%d")
        .to_string();
    assert_eq!(field(&text(&out.stdout), "requested", "date"), Some(today));
    env.cleanup().await;
}

/// A row carrying the same RQID text below the floor (built by hand as the DB owner) is never
/// taken for ours: the reconciler writes the request above the floor. A row above the floor
/// is adopted without writing.
#[tokio::test]
async fn reconciler_never_looks_below_the_floor() {
    let (env, ob) = outbound_env("ob_floor", "").await;
    fill_coutmsgs(&env, 5).await;
    let now = env.clock.now();
    let reg = register(&ob, day(2026, 11, 30), now).await;
    assert_eq!(reg.floor_id, 5);
    // Below the floor, a row with exactly our RQID text.
    sqlx::query("UPDATE COUTMSGS SET COUTMSGS_CLOB_MSG = ? WHERE COUTMSGS_ID = 3")
        .bind(format!("<MSG><META><RQID>{}</RQID></META></MSG>", reg.rqid))
        .execute(&env.owner)
        .await
        .expect("hand-made row");
    assert_eq!(rows_with(&env, &reg.rqid).await, vec![3]);

    // A second request whose row is already above its floor (an insert whose SENT was lost).
    let reg2 = register(&ob, day(2026, 12, 1), now).await;
    assert_eq!(reg2.floor_id, 5);
    let landed = sqlx::query(
        "INSERT INTO COUTMSGS (COUTMSGS_DATE_CREATED, COUTMSGS_CLOB_MSG) VALUES (NOW(), ?)",
    )
    .bind(format!(
        "<MSG><META><RQID>{}</RQID></META></MSG>",
        reg2.rqid
    ))
    .execute(&env.owner)
    .await
    .expect("landed row")
    .last_insert_id() as i64;
    assert_eq!(landed, 6);

    let done = outbound::reconcile(&ob, now).await.expect("reconcile");
    assert_eq!(done.len(), 2);
    let first = done.iter().find(|s| s.rqid == reg.rqid).expect("first");
    assert_eq!(
        first.via,
        SentVia::ReconcileWritten,
        "row 3 is below the floor"
    );
    assert_eq!(first.out_id, 7);
    assert_eq!(rows_with(&env, &reg.rqid).await, vec![3, 7]);
    let second = done.iter().find(|s| s.rqid == reg2.rqid).expect("second");
    assert_eq!((second.via, second.out_id), (SentVia::ReconcileFound, 6));
    assert_eq!(rows_with(&env, &reg2.rqid).await, vec![6]);
    for row in tracks(&ob).await {
        assert_eq!(row.state, TrackState::Sent);
    }
    assert_eq!(coutmsgs_count(&env).await, 7);

    // Nothing left: a second reconcile does nothing.
    assert!(outbound::reconcile(&ob, now)
        .await
        .expect("again")
        .is_empty());
    assert_eq!(coutmsgs_count(&env).await, 7);
    env.cleanup().await;
}

/// The sender and a reconciler (e.g. the service next to a CLI run) racing on one registered
/// request: whoever gets the row lock completes it; the other sees SENT. One row.
#[tokio::test]
async fn sender_and_reconciler_racing_write_once() {
    let (env, ob) = outbound_env("ob_race", "").await;
    for round in 0..10 {
        let now = env.clock.now();
        let reg = register(&ob, day(2026, 11, 30), now).await;
        let (sent, reconciled) = tokio::join!(
            outbound::deliver(&ob, reg.id, now),
            outbound::reconcile(&ob, now)
        );
        let sent = sent.expect("deliver");
        let reconciled = reconciled.expect("reconcile");
        assert!(reconciled.len() <= 1, "round {round}");
        let ids = rows_with(&env, &reg.rqid).await;
        assert_eq!(ids.len(), 1, "round {round}: one row");
        assert_eq!(sent.out_id, ids[0]);
        let row = ob.track.get(reg.id).await.expect("get").expect("row");
        assert_eq!(row.out_id, Some(ids[0]));
    }
    assert_eq!(coutmsgs_count(&env).await, 10);
    env.cleanup().await;
}

/// Daily at 02:30 Asia/Shanghai: nothing before, one request after, none again on a second
/// step or a restarted actor the same day; the next day one more (a requester started after
/// the time asks at once).
#[actix_rt::test]
async fn daily_requester_asks_once_per_day() {
    let (env, ob) = outbound_env("ob_daily", "02:30").await;
    // 02:00 local on 2026-11-30.
    env.clock.set(utc("2026-11-29T18:00:00Z"));
    let clock = common::shared(&env.clock);
    let hour = Duration::from_secs(3600);
    let first = requester(&ob, clock.clone(), hour);
    let r = common::pipeline::ask(&first, RequestTick).await;
    assert_eq!(r.outcome, DailyOutcome::NotYet);
    assert_eq!(r.next_run, Some(utc("2026-11-29T18:30:00Z")));
    assert!(tracks(&ob).await.is_empty());
    assert_eq!(coutmsgs_count(&env).await, 0);

    // Across 02:30.
    env.clock.advance(Duration::from_secs(40 * 60));
    let r = common::pipeline::ask(&first, RequestTick).await;
    let DailyOutcome::Requested(sent) = r.outcome else {
        panic!("expected a request: {r:?}")
    };
    assert_eq!(sent.target_date, day(2026, 11, 30));
    assert_eq!(r.next_run, Some(utc("2026-11-30T18:30:00Z")));
    let r = common::pipeline::ask(&first, RequestTick).await;
    assert!(
        matches!(&r.outcome, DailyOutcome::AlreadyRequested { date, rqid, state }
            if *date == day(2026, 11, 30) && *rqid == sent.rqid && *state == TrackState::Sent),
        "{r:?}"
    );

    // A restart the same day (a new instance: nothing in memory) and a direct step.
    let second = requester(&ob, clock.clone(), hour);
    let r = common::pipeline::ask(&second, RequestTick).await;
    assert!(
        matches!(r.outcome, DailyOutcome::AlreadyRequested { .. }),
        "{r:?}"
    );
    env.clock.advance(hour * 10);
    let r = daily_step(&ob, env.clock.now()).await.expect("step");
    assert!(
        matches!(r.outcome, DailyOutcome::AlreadyRequested { .. }),
        "{r:?}"
    );
    let rows = tracks(&ob).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].origin, Origin::Daily);
    assert_eq!(rows_with(&env, &sent.rqid).await, vec![sent.out_id]);
    assert_eq!(coutmsgs_count(&env).await, 1);

    // Next day 09:00 local: a requester started now asks at once (its start step).
    env.clock.set(utc("2026-12-01T01:00:00Z"));
    let third = requester(&ob, clock.clone(), hour);
    let r = common::pipeline::ask(&third, RequestTick).await;
    assert!(
        matches!(&r.outcome, DailyOutcome::AlreadyRequested { date, state, .. }
            if *date == day(2026, 12, 1) && *state == TrackState::Sent),
        "the start step asked already: {r:?}"
    );
    let r = common::pipeline::ask(&first, RequestTick).await;
    assert!(
        matches!(r.outcome, DailyOutcome::AlreadyRequested { .. }),
        "{r:?}"
    );
    let rows = tracks(&ob).await;
    assert_eq!(
        rows.iter().map(|r| r.target_date).collect::<Vec<_>>(),
        vec![day(2026, 11, 30), day(2026, 12, 1)]
    );
    assert!(rows.iter().all(|r| r.state == TrackState::Sent));
    assert_eq!(coutmsgs_count(&env).await, 2);
    env.cleanup().await;
}

/// `schedule_request_at = ""`: never asks; the start step still reconciles leftovers.
#[actix_rt::test]
async fn daily_requester_off_never_asks_but_reconciles() {
    let (env, ob) = outbound_env("ob_off", "").await;
    assert!(ob.cfg.daily_at.is_none());
    // A leftover of a crash after registration.
    let reg = register(&ob, day(2026, 11, 30), env.clock.now()).await;
    let off = requester(&ob, common::shared(&env.clock), Duration::from_secs(3600));
    let r = common::pipeline::ask(&off, RequestTick).await;
    assert_eq!(r.outcome, DailyOutcome::Off);
    assert_eq!(r.next_run, None);
    let row = ob.track.get(reg.id).await.expect("get").expect("row");
    assert_eq!(
        row.via(),
        Some(SentVia::ReconcileWritten),
        "reconciled at start"
    );
    for _ in 0..3 {
        env.clock.advance(Duration::from_secs(24 * 3600));
        let r = common::pipeline::ask(&off, RequestTick).await;
        assert_eq!(r.outcome, DailyOutcome::Off);
    }
    let rows = tracks(&ob).await;
    assert_eq!(rows.len(), 1, "only the leftover");
    assert_eq!(rows[0].origin, Origin::Manual);
    assert_eq!(coutmsgs_count(&env).await, 1);
    env.cleanup().await;
}

/// Upstream answers with SCHD/RESP carrying our RQID: the pump records the answering message
/// on the request.
#[tokio::test]
async fn schedule_response_with_our_rqid_is_recorded() {
    let (env, ob) = outbound_env("ob_resp", "").await;
    let sent = outbound::request_schedule(&ob, Origin::Manual, day(2026, 11, 30), env.clock.now())
        .await
        .expect("request");
    let resp = |seqn: i64, rqid: &str| {
        format!(
            "<MSG><META><SNDR>AODB</SNDR><RCVR>MSGX</RCVR><SEQN>{seqn}</SEQN>\
             <DDTM>20261130093000</DDTM><TYPE>SCHD</TYPE><STYP>RESP</STYP></META>\
             <SCHD><RQID>{rqid}</RQID><DATE>20261130</DATE><FLIGHTS><FLIGHT><FLID>F{seqn}</FLID>\
             <GATE>A1</GATE></FLIGHT></FLIGHTS></SCHD></MSG>"
        )
    };
    let other = env.insert_message(&resp(1, "SOMEONE-ELSE-1")).await;
    let answer = env.insert_message(&resp(2, &sent.rqid)).await;
    let again = env.insert_message(&resp(3, &sent.rqid)).await;
    env.poll(env.poll_cfg(100)).await;
    let mut pump = env.stepper(&[]);
    for _ in 0..3 {
        pump.step().await.expect("step");
    }
    for id in [other, answer, again] {
        assert_eq!(env.state_of(id).await.0, "SUCCEEDED");
    }
    let row = ob.track.get(sent.id).await.expect("get").expect("row");
    assert_eq!(
        row.answered_by_msg,
        Some(answer),
        "the first answer is kept"
    );
    env.cleanup().await;
}

#[test]
fn bad_outbound_config_fails_at_start_naming_the_key() {
    for (key, value) in [
        ("MSGX_OUTBOUND__SCHEDULE_REQUEST_AT", "25:00"),
        ("MSGX_OUTBOUND__SCHEDULE_REQUEST_AT", "2:30pm"),
        ("MSGX_OUTBOUND__SENDER", "MS GX"),
        ("MSGX_OUTBOUND__MESSAGE_COLUMN", "MSG`; DROP"),
    ] {
        let expect = common::setting_name(key);
        for args in [&["run"][..], &["request", "schedule"][..]] {
            let out = common::instance::msgexchange()
                .args(args)
                .env("MSGEXCHANGE_CONFIG", common::default_toml())
                .env(key, value)
                .stdin(Stdio::null())
                .output()
                .expect("run msgexchange");
            assert_eq!(out.status.code(), Some(2), "{key}={value} {args:?}");
            let stderr = text(&out.stderr);
            assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
            assert!(stderr.contains(&expect), "{key}: {stderr}");
        }
    }
    // A bad --date is refused by the command line before anything is touched.
    let out = common::instance::msgexchange()
        .args(["request", "schedule", "--date", "2026-11-30"])
        .env("MSGEXCHANGE_CONFIG", common::default_toml())
        .stdin(Stdio::null())
        .output()
        .expect("run msgexchange");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("YYYYMMDD"),
        "{}",
        text(&out.stderr)
    );
}
