//! `msgx-bench dispatch`: events per second from a PENDING backlog to Kafka, printed
//! next to the two bare ceilings measured in the same run — a bare rdkafka produce loop (same
//! record size and headers, all in flight at once) and a bare batched
//! `UPDATE … WHERE event_id = ANY($1)` on PostgreSQL — and commit → SENT latency under a
//! steady event rate with the real `Dispatcher` actor woken by `EventsQueued`. Not a timed
//! test: it prints numbers (issue 5: aim ≥ 50 % of the lower ceiling; p99 ≤ 50 ms at 500/s).
//!
//! Kafka is the configured `kafka.brokers`; `embedded` (the bench's default when unset) starts librdkafka's mock
//! cluster in this process, which then shares the machine's cores with the bench.
//!
//! Phases (fresh database `msgx_bench_<pid>`, dropped at the end unless `--keep`):
//! 1. store: `Store::connect`, then `--events` PENDING events over `--keys` flight keys (and
//!    one terminal `PROC_STATE` row per event) by SQL, then `ANALYZE` (as autovacuum would);
//! 2. bare produce: the same number of records of the same size with the same headers,
//!    queued without waiting, then every ack awaited;
//! 3. bare UPDATE: a scratch copy of `msg_event` (same columns and indexes), marked SENT
//!    `dispatch.batch` ids per statement with `WHERE event_id = ANY($1)` (autocommit);
//! 4. the real thing: rounds as the `Dispatcher` actor runs them (`send_round` beside the
//!    `write_outcome` of the rounds before, [`dispatch_round`]) until nothing is PENDING, each
//!    round timed;
//! 5. steady: the `Dispatcher` actor, events committed at `--steady-rate` per second in small
//!    transactions, each followed by `EventsQueued`; commit → SENT read back from the rows
//!    (`sent_at` is stamped after the ack, so it bounds commit → ack from above).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use anyhow::Context as _;
use clap::Args;
use futures::future::join_all;
use msgx_core::clock::{SharedClock, SystemClock};
use msgx_core::dispatch::{cloudevents, txn, DispatchState};
use msgx_core::kafka::producer::Outgoing;
use msgx_core::kafka::EventProducer;
use msgx_core::settings::{Delivery, Settings};
use msgx_core::store::events::PendingEvent;
use msgx_core::store::Store;

use super::databases::BenchDbs;
use super::dispatch_round;
use super::percentile;
use super::report::{rate, Pacer};
use msgx_actors::app::{kafka_bootstrap, DispatchDeps};
use msgx_actors::dispatcher::Dispatcher;
use msgx_actors::messages::EventsQueued;

/// Dispatch benchmark knobs.
#[derive(Debug, Args)]
pub struct DispatchBenchArgs {
    /// Backlog: PENDING events before the dispatcher starts.
    #[arg(long, default_value_t = 200_000)]
    pub events: u64,
    /// Distinct flight keys the backlog spreads over (an airport day has ~1,500 flights).
    #[arg(long, default_value_t = 2_000)]
    pub keys: u64,
    /// Events per round (default: `dispatch.batch`).
    #[arg(long)]
    pub batch: Option<u32>,
    /// JSON payload size in bytes.
    #[arg(long, default_value_t = 400)]
    pub payload_bytes: usize,
    /// Events per second in the steady phase.
    #[arg(long, default_value_t = 500)]
    pub steady_rate: u64,
    /// Length of the steady phase; 0s skips it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub steady: Duration,
    /// Keep the bench databases afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// Runs the dispatch benchmark.
pub async fn dispatch(settings: &Settings, args: &DispatchBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.events > 0, "--events must be at least 1");
    anyhow::ensure!(args.keys > 0, "--keys must be at least 1");
    // `--batch` overrides `dispatch.batch` in the settings the bench runs with.
    let mut settings = settings.clone();
    settings.dispatch.batch = args.batch.unwrap_or(settings.dispatch.batch);
    let batch = settings.dispatch.batch;
    anyhow::ensure!(
        (1..=10_000).contains(&batch),
        "--batch {batch} is outside 1..=10000"
    );
    BenchDbs::run_fresh(&settings, args.keep, async |dbs| {
        run(&settings, args, dbs).await
    })
    .await
}

async fn run(settings: &Settings, args: &DispatchBenchArgs, dbs: &BenchDbs) -> anyhow::Result<()> {
    let batch = settings.dispatch.batch;
    let store = dbs.store(settings).await?;
    let (_embedded, bootstrap) = kafka_bootstrap(&settings.kafka)?;
    let deps = DispatchDeps::new(settings, &bootstrap);
    println!(
        "bench dispatch: {} events over {} keys, batch {batch}, payload {} B, brokers {}",
        args.events,
        args.keys,
        args.payload_bytes,
        if settings.kafka.is_embedded() {
            format!("embedded mock cluster {bootstrap}")
        } else {
            bootstrap.clone()
        }
    );

    seed_backlog(&store, args).await?;
    let bare_produce = bare_produce(&deps, &store, args.events).await?;
    let bare_update = bare_update(&store, batch).await?;
    let drained = drain_backlog(&store, &deps).await?;
    anyhow::ensure!(
        drained.sent == args.events,
        "sent {} of {}",
        drained.sent,
        args.events
    );
    print_backlog(&drained, bare_produce, bare_update, batch);
    if !args.steady.is_zero() {
        let lat = steady(&store, &deps, args).await?;
        let pace = (args.steady_rate, args.steady);
        let probe = bare_latency_probe(&deps, pace, args.payload_bytes, args.keys).await?;
        print_latency("bare produce probe    ", args, &probe);
        println!(
            "  dispatcher adds       : p50 {:+.1}ms p99 {:+.1}ms over the bare probe at the same rate \
             (commit → SENT also counts the commit, the round's SELECT and the SENT write)",
            ms(percentile(&lat, 0.5)) - ms(percentile(&probe, 0.5)),
            ms(percentile(&lat, 0.99)) - ms(percentile(&probe, 0.99)),
        );
    }
    store.pool().close().await;
    Ok(())
}

/// Phase 1: the PENDING backlog, analyzed.
async fn seed_backlog(store: &Store, args: &DispatchBenchArgs) -> anyhow::Result<()> {
    let t = Instant::now();
    seed(store, args.events, args.keys, args.payload_bytes, 0).await?;
    // A backlog built up over minutes would have been analyzed by autovacuum by now; a bulk
    // load a second old has not, and stale statistics turn the ordered head scan into a sort
    // of the whole backlog.
    sqlx::query("ANALYZE msg_event")
        .execute(store.pool())
        .await?;
    println!(
        "  backlog               : {} events in {:.1}s",
        args.events,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Phase 4 as measured: the rounds, their time and stages.
struct Drained {
    sent: u64,
    took: Duration,
    /// Every round's wall time, ascending.
    rounds: Vec<Duration>,
    /// Summed per stage: select, send → last ack, writing the previous round.
    stages: [Duration; 3],
}

/// The bare probes' producer: the dispatcher's client settings, never transactional (the
/// bare limit of the broker, whichever `kafka.delivery` the dispatcher runs).
fn bare_producer(deps: &DispatchDeps) -> anyhow::Result<EventProducer> {
    let mut k = deps.kafka.clone();
    k.delivery = Delivery::AtLeastOnce;
    Ok(EventProducer::new(&k, &deps.bootstrap)?)
}

/// Phase 4: dispatcher rounds until nothing is PENDING, each round timed.
async fn drain_backlog(store: &Store, deps: &DispatchDeps) -> anyhow::Result<Drained> {
    let mut producer = EventProducer::new(&deps.kafka, &deps.bootstrap)?;
    let clock = SystemClock;
    if producer.transactional() {
        let (k, b, cfg) = (&deps.kafka, &deps.bootstrap, &deps.cfg);
        txn::prepare(store, &mut producer, &clock, k, b, cfg).await?;
        println!("  delivery              : exactly-once (one transaction per round)");
    }
    let mut rounds = Vec::new();
    let start = Instant::now();
    let mut sent = 0u64;
    let mut stages = [Duration::ZERO; 3];
    let mut state = DispatchState::default();
    loop {
        let t = Instant::now();
        let r = dispatch_round::round(store, &mut producer, &clock, &deps.cfg, &mut state).await?;
        if r.selected == 0 && state.unwritten() == 0 {
            sent += r.sent;
            break;
        }
        anyhow::ensure!(
            r.failed == 0,
            "sends failed during the bench: {:?}",
            r.failures
        );
        sent += r.sent;
        rounds.push(t.elapsed());
        for (sum, s) in stages
            .iter_mut()
            .zip(r.stages.iter().chain([&r.write_took]))
        {
            *sum += *s;
        }
    }
    let took = start.elapsed();
    rounds.sort();
    Ok(Drained {
        sent,
        took,
        rounds,
        stages,
    })
}

/// The backlog's rate next to the two ceilings.
fn print_backlog(d: &Drained, bare_produce: f64, bare_update: f64, batch: u32) {
    let real = rate(d.sent, d.took);
    let ceiling = bare_produce.min(bare_update);
    println!(
        "  bare produce          : {bare_produce:>9.0} records/s (all queued, then every ack)"
    );
    println!("  bare UPDATE ANY($1)   : {bare_update:>9.0} rows/s ({batch} ids per statement, copy of msg_event with its indexes)");
    println!(
        "  dispatcher            : {real:>9.0} events/s ({} in {:.1}s, {} rounds; round p50 {:.1}ms p99 {:.1}ms)",
        d.sent,
        d.took.as_secs_f64(),
        d.rounds.len(),
        ms(percentile(&d.rounds, 0.5)),
        ms(percentile(&d.rounds, 0.99)),
    );
    let n = d.rounds.len().max(1) as f64;
    println!(
        "  per round (mean)      : select {:.1}ms, send→last ack {:.1}ms, writing the previous round {:.1}ms (overlapped)",
        ms(d.stages[0]) / n,
        ms(d.stages[1]) / n,
        ms(d.stages[2]) / n
    );
    println!(
        "  ratio                 : {:.1}% of the lower ceiling ({:.1}% of bare produce, {:.1}% of bare UPDATE)",
        100.0 * real / ceiling,
        100.0 * real / bare_produce,
        100.0 * real / bare_update
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `n` PENDING events (and their terminal messages), keys round-robin, created now.
async fn seed(
    store: &Store,
    n: u64,
    keys: u64,
    payload_bytes: usize,
    first_msg: i64,
) -> anyhow::Result<Vec<i64>> {
    let filler = "x".repeat(payload_bytes.saturating_sub(80));
    let mut ids = Vec::with_capacity(n as usize);
    let chunk = 10_000u64;
    let mut done = 0u64;
    while done < n {
        let m = chunk.min(n - done);
        let from = first_msg + done as i64 + 1;
        let got: Vec<i64> = sqlx::query_scalar(
            "WITH p AS (INSERT INTO proc_state (msg_id, state, enqueued_at, terminal_at) \
                        SELECT g, 'SUCCEEDED', now(), now() FROM generate_series($1::bigint, $2::bigint) g \
                        RETURNING msg_id) \
             INSERT INTO msg_event (msg_id, flight_key, event_type, payload, created_at) \
             SELECT msg_id, 'FL' || lpad((msg_id % $3)::text, 5, '0'), 'FLIGHT_UPDATED', \
                    jsonb_build_object('msg_id', msg_id, 'flid', 'FL' || (msg_id % $3), 'filler', $4::text), \
                    clock_timestamp() \
             FROM p ORDER BY msg_id RETURNING event_id",
        )
        .bind(from)
        .bind(from + m as i64 - 1)
        .bind(keys as i64)
        .bind(&filler)
        .fetch_all(store.pool())
        .await
        .context("seeding events")?;
        ids.extend(got);
        done += m;
    }
    Ok(ids)
}

/// Records per second of a bare produce loop: the backlog's own rows as records, all queued
/// (librdkafka's queue bounds what is in flight), then every ack awaited.
async fn bare_produce(deps: &DispatchDeps, store: &Store, n: u64) -> anyhow::Result<f64> {
    let rows = store
        .deliverable_events(
            chrono::Utc::now(),
            n.min(u64::from(u32::MAX)) as u32,
            &[],
            &[],
        )
        .await?;
    let producer = bare_producer(deps)?;
    // The real topic: a topic of its own might not be auto-created on a real cluster.
    let topic = deps.cfg.topic.clone();
    // Warm-up: metadata and producer id, outside the measurement.
    send_all(
        &producer,
        &topic,
        &rows[..rows.len().min(100)],
        &deps.cfg.ce_source,
    )
    .await?;
    let start = Instant::now();
    send_all(&producer, &topic, &rows, &deps.cfg.ce_source).await?;
    Ok(rate(rows.len() as u64, start.elapsed()))
}

async fn send_all(
    producer: &EventProducer,
    topic: &str,
    rows: &[PendingEvent],
    source: &str,
) -> anyhow::Result<()> {
    let mut futures = Vec::with_capacity(rows.len());
    for ev in rows {
        let rec = Outgoing {
            topic,
            key: &ev.flight_key,
            payload: ev.payload.as_bytes(),
            timestamp_ms: ev.created_at.timestamp_millis(),
        };
        let headers = cloudevents::to_headers(&cloudevents::attributes(ev, source));
        loop {
            match producer.send(rec, headers.clone()) {
                Ok(f) => {
                    futures.push(f);
                    break;
                }
                // Queue full: let deliveries drain, as the real producer would wait.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }
    for r in join_all(futures).await {
        match r {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => anyhow::bail!("bare produce failed: {e}"),
            Err(_) => anyhow::bail!("bare produce: delivery dropped"),
        }
    }
    Ok(())
}

/// Rows per second of the bare mark statement on a scratch copy of the backlog.
async fn bare_update(store: &Store, batch: u32) -> anyhow::Result<f64> {
    let pool = store.pool();
    // Same columns and indexes as msg_event (an UPDATE pays for every index it touches).
    sqlx::query("CREATE TABLE bare_event (LIKE msg_event INCLUDING ALL)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT INTO bare_event SELECT * FROM msg_event")
        .execute(pool)
        .await?;
    sqlx::query("VACUUM ANALYZE bare_event")
        .execute(pool)
        .await?;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT event_id FROM bare_event ORDER BY event_id")
        .fetch_all(pool)
        .await?;
    let start = Instant::now();
    for chunk in ids.chunks(batch as usize) {
        sqlx::query(
            "UPDATE bare_event SET state = 'SENT', sent_at = now() \
             WHERE event_id = ANY($1) AND state = 'PENDING'",
        )
        .bind(chunk)
        .execute(pool)
        .await?;
    }
    let r = rate(ids.len() as u64, start.elapsed());
    sqlx::query("DROP TABLE bare_event").execute(pool).await?;
    Ok(r)
}

/// Steady phase: commit → SENT under a constant rate with the real actor; returns the
/// latencies.
async fn steady(
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
async fn offer_events(
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
async fn wait_no_pending(store: &Store) -> anyhow::Result<()> {
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
async fn latencies(store: &Store, first_event: i64) -> anyhow::Result<Vec<Duration>> {
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

/// The broker's own latency at a steady rate: a bare producer (the dispatcher's client
/// settings: idempotent, acks, linger; same topic and headers) sends `rate` records a second for
/// `length`, of `payload_bytes`, over `keys` keys, each timed from `send` to its ack. What
/// commit → SENT shows beyond this is the dispatcher's (and the store's) share.
pub(crate) async fn bare_latency_probe(
    deps: &DispatchDeps,
    (rate, length): (u64, Duration),
    payload_bytes: usize,
    keys: u64,
) -> anyhow::Result<Vec<Duration>> {
    let producer = bare_producer(deps)?;
    let payload = vec![b'x'; payload_bytes];
    let topic = deps.cfg.topic.clone();
    let headers = || probe_headers(deps);
    // Warm up: a new idempotent producer fetches metadata and its producer id before its first
    // ack (hundreds of ms); timed from its first record, that start-up was the probe's p99.
    let warm = Outgoing {
        topic: &topic,
        key: "FL-WARMUP",
        payload: &payload,
        timestamp_ms: chrono::Utc::now().timestamp_millis(),
    };
    let fut = producer
        .send(warm, headers())
        .map_err(|e| anyhow::anyhow!("bare probe warm-up send: {e}"))?;
    acked(fut.await, "bare probe warm-up")?;
    let mut pacer = Pacer::new(rate as f64, length, 1.0);
    let mut pending = Vec::with_capacity(pacer.total() as usize);
    while let Some((made, n)) = pacer.next().await {
        for i in 0..n {
            let key = format!("FL{:05}", (made + i) % keys);
            let rec = Outgoing {
                topic: &topic,
                key: &key,
                payload: &payload,
                timestamp_ms: chrono::Utc::now().timestamp_millis(),
            };
            let sent = Instant::now();
            let fut = producer
                .send(rec, headers())
                .map_err(|e| anyhow::anyhow!("bare probe send: {e}"))?;
            pending.push(tokio::spawn(async move {
                let r = fut.await;
                (r, sent.elapsed())
            }));
        }
    }
    let mut lat = Vec::with_capacity(pending.len());
    for p in pending {
        let (r, took) = p.await.context("probe task")?;
        acked(r, "bare probe produce")?;
        lat.push(took);
    }
    lat.sort();
    Ok(lat)
}

/// The headers of a probe record (bare produce and bare transaction probes alike).
pub(crate) fn probe_headers(deps: &DispatchDeps) -> rdkafka::message::OwnedHeaders {
    cloudevents::to_headers(&[
        ("ce_type", "bench.probe".to_string()),
        ("ce_source", deps.cfg.ce_source.clone()),
    ])
}

/// A delivery future's result as acked, or the error saying which send (`what`) failed.
pub(crate) fn acked<T, E: std::fmt::Display, M, C>(
    delivery: Result<Result<T, (E, M)>, C>,
    what: &str,
) -> anyhow::Result<()> {
    match delivery {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => anyhow::bail!("{what} failed: {e}"),
        Err(_) => anyhow::bail!("{what}: delivery dropped"),
    }
}

fn print_latency(label: &str, args: &DispatchBenchArgs, lat: &[Duration]) {
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
