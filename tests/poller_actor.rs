//! The InboxPoller actor under the supervisor, fed by the upstream simulator (concurrent
//! connections, held transactions, rollbacks): every committed row is enqueued, exactly the
//! rolled-back ids are released and reported to the late detector's receiver, W moves are
//! announced; a crashed child is rebuilt and resumes from PostgreSQL.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Context, Handler};
use common::TestEnv;
use msgx_actors::messages::{HolesReleased, PollNow, WatermarkMoved};
use msgx_actors::wiring::Wiring;
use msgx_core::devtools::simulator::{simulate, SimConfig};

/// Records what the poller announces.
#[derive(Default, Clone)]
struct Seen {
    watermarks: Arc<Mutex<Vec<i64>>>,
    released: Arc<Mutex<Vec<(i64, i64)>>>,
}

struct Probe(Seen);

impl Actor for Probe {
    type Context = Context<Self>;
}

impl Handler<WatermarkMoved> for Probe {
    type Result = ();
    fn handle(&mut self, m: WatermarkMoved, _: &mut Context<Self>) {
        self.0.watermarks.lock().expect("lock").push(m.w);
    }
}

impl Handler<HolesReleased> for Probe {
    type Result = ();
    fn handle(&mut self, m: HolesReleased, _: &mut Context<Self>) {
        self.0
            .released
            .lock()
            .expect("lock")
            .push((m.first, m.last));
    }
}

#[actix_rt::test]
async fn simulator_and_poller_concurrently_lose_nothing() {
    let env = TestEnv::new("actor_sim").await;
    let settings = env.settings(&[
        ("MSGX_PIPELINE__POLL_INTERVAL", "20ms"),
        ("MSGX_PIPELINE__CLAIM_BATCH", "64"),
    ]);
    let seen = Seen::default();
    let probe = Probe(seen.clone()).start();
    let pipeline = common::pipeline::start(&env, &settings, common::shared(&env.clock), |_| {});
    let wiring = &pipeline.wiring;
    // The probe listens next to the late detector.
    tokio::time::sleep(Duration::from_millis(100)).await;
    wiring.update(|r| {
        r.watermark.push(probe.clone().recipient());
        r.holes.push(probe.clone().recipient());
    });

    let cfg = SimConfig {
        rate_per_sec: 400.0,
        connections: 4,
        total: Some(1500),
        hold_fraction: 0.05,
        hold_max: Duration::from_millis(300),
        rollback_fraction: 0.03,
        seed: 7,
        ..SimConfig::default()
    };
    let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let report = simulate(&env.owner, &env.names, env.tz, &cfg, stop_rx)
        .await
        .expect("simulation");
    assert!(
        !report.rolled_back_ids.is_empty(),
        "the simulator made holes"
    );
    let last_committed = *report.committed_ids.last().expect("committed rows");

    // Let rounds see the holes, then age them past max-commit-delay (injected clock).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        env.clock.advance(Duration::from_secs(301));
        if let Some(poller) = wiring.poller() {
            let _ = poller.send(PollNow).await;
        }
        if env.cursor().await.0 >= last_committed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "W stuck at {:?}",
            env.cursor().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    assert_eq!(
        env.enqueued_ids().await,
        report.committed_ids,
        "every committed row, once"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut released: Vec<i64> = seen
        .released
        .lock()
        .expect("lock")
        .iter()
        .flat_map(|(a, b)| *a..=*b)
        .collect();
    released.sort_unstable();
    let expected: Vec<i64> = report
        .rolled_back_ids
        .iter()
        .copied()
        .filter(|id| *id < last_committed)
        .collect();
    assert_eq!(
        released, expected,
        "exactly the rolled-back ids were released"
    );
    let marks = seen.watermarks.lock().expect("lock").clone();
    assert!(
        marks.windows(2).all(|p| p[0] < p[1]),
        "W only grows: {marks:?}"
    );
    assert_eq!(marks.last(), Some(&last_committed));
    env.cleanup().await;
}

/// A child that panics on demand, to prove the supervisor rebuilds it.
struct Fragile(Arc<Mutex<u32>>);

impl Actor for Fragile {
    type Context = Context<Self>;
    fn started(&mut self, _: &mut Context<Self>) {
        *self.0.lock().expect("lock") += 1;
    }
}

#[derive(actix::Message)]
#[rtype(result = "()")]
struct Boom;

impl Handler<Boom> for Fragile {
    type Result = ();
    fn handle(&mut self, _: Boom, _: &mut Context<Self>) {
        panic!("injected crash");
    }
}

#[actix_rt::test]
async fn supervisor_rebuilds_a_child_whose_mailbox_closed() {
    let starts = Arc::new(Mutex::new(0u32));
    let current: Arc<Mutex<Option<actix::Addr<Fragile>>>> = Arc::default();
    let factory = {
        let (starts, current) = (starts.clone(), current.clone());
        msgx_actors::supervisor::ChildFactory {
            name: "fragile",
            start: Box::new(move |_| {
                let addr = Fragile(starts.clone()).start();
                *current.lock().expect("lock") = Some(addr.clone());
                Box::new(move || addr.connected())
            }),
        }
    };
    let (fatal, _rx) = tokio::sync::mpsc::unbounded_channel();
    let _sup =
        msgx_actors::supervisor::Supervisor::new(Wiring::default(), vec![factory], None, fatal)
            .start();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(*starts.lock().expect("lock"), 1);
    let first = current.lock().expect("lock").clone().expect("started");
    first.do_send(Boom);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while *starts.lock().expect("lock") < 2 {
        assert!(std::time::Instant::now() < deadline, "child not rebuilt");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!first.connected());
    let second = current.lock().expect("lock").clone().expect("rebuilt");
    assert!(second.connected());
}

/// Restart intensity: a child that crashes at once every time is rebuilt up to the limit, then
/// the supervisor gives up with a fatal condition (the binary exits non-zero) instead of
/// crash-looping; `/readyz` sees the child down meanwhile.
#[actix_rt::test]
async fn a_crash_loop_exceeds_the_restart_intensity_and_is_fatal() {
    let starts = Arc::new(Mutex::new(0u32));
    let factory = {
        let starts = starts.clone();
        msgx_actors::supervisor::ChildFactory {
            name: "crashy",
            start: Box::new(move |_| {
                let addr = Fragile(starts.clone()).start();
                addr.do_send(Boom);
                Box::new(move || addr.connected())
            }),
        }
    };
    let (fatal, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let health = msgx_actors::health::Health::default();
    let _sup =
        msgx_actors::supervisor::Supervisor::new(Wiring::default(), vec![factory], None, fatal)
            .with_health(health.clone())
            .with_intensity(msgx_actors::supervisor::Intensity {
                max_restarts: 2,
                window: Duration::from_secs(60),
            })
            .start();
    let got = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("gave up in time")
        .expect("fatal");
    assert!(
        matches!(
            got,
            msgx_actors::supervisor::Fatal::RestartIntensity {
                child: "crashy",
                restarts: 3,
                ..
            }
        ),
        "{got:?}"
    );
    assert!(
        got.to_string().contains("restart intensity exceeded"),
        "{got}"
    );
    // Started once, rebuilt twice, then no more.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(*starts.lock().expect("lock"), 3);
    assert_eq!(health.readiness().children_down, vec!["crashy"]);
}
