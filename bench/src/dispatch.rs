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

mod bare;
mod steady;

use bare::{bare_produce, bare_update};
use steady::{print_latency, steady};

pub(crate) use bare::{acked, bare_latency_probe, probe_headers};

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use msgx_core::clock::SystemClock;
use msgx_core::dispatch::{txn, DispatchState};
use msgx_core::kafka::EventProducer;
use msgx_core::settings::Settings;
use msgx_core::store::Store;

use super::databases::BenchDbs;
use super::dispatch_round;
use super::percentile;
use super::report::rate;
use msgx_actors::app::{kafka_bootstrap, DispatchDeps};

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
