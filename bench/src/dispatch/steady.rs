//! Phase 5 of `msgx-bench dispatch`: the real `Dispatcher` actor under a steady event rate,
//! each commit followed by `EventsQueued`; commit → SENT read back from the rows and printed
//! beside the broker's own latency. The steady stage, apart from the backlog drain.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use msgx_actors::app::DispatchDeps;
use msgx_actors::dispatcher::Dispatcher;
use msgx_actors::messages::EventsQueued;
use msgx_core::clock::{SharedClock, SystemClock};
use msgx_core::kafka::EventProducer;
use msgx_core::store::Store;

use super::{ms, seed, DispatchBenchArgs};
use crate::percentile;
use crate::report::Pacer;

/// Steady phase: commit → SENT under a constant rate with the real actor; returns the
/// latencies.
pub(super) async fn steady(
    store: &Store,
    deps: &DispatchDeps,
    args: &DispatchBenchArgs,
) -> anyhow::Result<Vec<Duration>> {
    sqlx::query("VACUUM ANALYZE msg_event")
        .execute(store.pool())
        .await?;
    let clock: SharedClock = Arc::new(SystemClock);
    let producer = EventProducer::new(&deps.kafka, &deps.bootstrap)?;
    let mut dispatcher = Dispatcher::new(
        store.clone(),
        clock,
        producer,
        deps.cfg.clone(),
        deps.idle_poll,
    );
    if deps.kafka.exactly_once() {
        let (k, b) = (deps.kafka.clone(), deps.bootstrap.clone());
        dispatcher = dispatcher.exactly_once(k, b, None);
    }
    let addr = dispatcher.start();
    let first: i64 = sqlx::query_scalar("SELECT COALESCE(max(msg_id), 0) FROM proc_state")
        .fetch_one(store.pool())
        .await?;
    let first_event: i64 = sqlx::query_scalar("SELECT COALESCE(max(event_id), 0) FROM msg_event")
        .fetch_one(store.pool())
        .await?;
    let produced_in = offer_events(store, &addr, args, first).await?;
    let drained = wait_no_pending(store).await;
    // Stop the dispatcher before the database goes (the typed shutdown every actor handles).
    let deadline = Instant::now() + Duration::from_secs(5);
    if let Err(e) = addr
        .send(msgx_actors::messages::Shutdown { deadline })
        .await
    {
        tracing::warn!(error = %e, "stopping the bench dispatcher");
    }
    drained?;
    let lat = latencies(store, first_event).await?;
    println!(
        "  steady {}/s for {:.0}s  : {} events; commit → SENT p50 {:.1}ms p99 {:.1}ms p99.9 {:.1}ms max {:.1}ms",
        args.steady_rate,
        produced_in.as_secs_f64(),
        lat.len(),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(percentile(&lat, 0.999)),
        ms(percentile(&lat, 1.0)),
    );
    Ok(lat)
}

/// Commits `--steady-rate` events per second for `--steady` in small transactions, each
/// followed by `EventsQueued`; returns how long that took.
pub(super) async fn offer_events(
    store: &Store,
    addr: &actix::Addr<Dispatcher>,
    args: &DispatchBenchArgs,
    first: i64,
) -> anyhow::Result<Duration> {
    // Small commits every tick, like a pump committing messages with an event or two each.
    let start = Instant::now();
    let mut pacer = Pacer::new(args.steady_rate as f64, args.steady, 1.0);
    while let Some((made, n)) = pacer.next().await {
        if n == 0 {
            continue;
        }
        seed(store, n, args.keys, args.payload_bytes, first + made as i64).await?;
        addr.do_send(EventsQueued {
            msg_id: first + (made + n) as i64,
        });
    }
    Ok(start.elapsed())
}

/// Waits (up to a minute) until no event is PENDING.
pub(super) async fn wait_no_pending(store: &Store) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM msg_event WHERE state = 'PENDING'")
                .fetch_one(store.pool())
                .await?;
        if pending == 0 {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "steady phase did not drain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Commit → SENT of the events after `first_event`, ascending.
pub(super) async fn latencies(store: &Store, first_event: i64) -> anyhow::Result<Vec<Duration>> {
    let lat: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (sent_at - created_at))::float8 FROM msg_event \
         WHERE event_id > $1 ORDER BY 1",
    )
    .bind(first_event)
    .fetch_all(store.pool())
    .await?;
    Ok(lat
        .into_iter()
        .map(|s| Duration::from_secs_f64(s.max(0.0)))
        .collect())
}

pub(super) fn print_latency(label: &str, args: &DispatchBenchArgs, lat: &[Duration]) {
    println!(
        "  {label}: {}/s for {:.0}s, {} records; send → ack p50 {:.1}ms p99 {:.1}ms p99.9 {:.1}ms max {:.1}ms",
        args.steady_rate,
        args.steady.as_secs_f64(),
        lat.len(),
        ms(percentile(lat, 0.5)),
        ms(percentile(lat, 0.99)),
        ms(percentile(lat, 0.999)),
        ms(percentile(lat, 1.0)),
    );
}
