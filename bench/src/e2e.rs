//! `msgx-bench e2e`: the whole service drains an inbox backlog end to end — enqueue (poller),
//! process (pump, group commit), mark (backfill sweeper) and deliver (dispatcher, to the
//! configured Kafka: the embedded mock cluster by default) — started exactly as `run_service`
//! starts the pipeline. Prints, per stage, the throughput of every tenth of the backlog (is it
//! flat?), the total time and the peak RSS of this process (the service and the bench share it);
//! then, per steady offered rate (100, 300, 1,000 msg/s for `--steady` each), inbox commit →
//! Kafka ack and pump commit → SENT p50/p99. Not a timed test: it prints numbers.
//!
//! The backlog is the simulator's message mix (`Mix::default()`) without unknown types: an
//! UNSUPPORTED head blocks FIFO for its whole retry schedule (minutes, by design), which would
//! measure the retry policy, not the pipeline. Malformed messages stay in (DEAD at once).
//!
//! Progress is sampled every half second from the service's own counters (the Prometheus
//! recorder the binary installs, so their cost is in the figures too), not from the store: five
//! `count(*)` over a million-row PROC_STATE and MSG_EVENT every half second would take a core
//! of their own on this 2-core machine and slow the run down more the longer it goes. The store
//! is counted exactly once, at the end, to check the drain.
//!
//! Fresh databases `msgx_bench_<pid>`, dropped at the end unless `--keep`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use metrics_exporter_prometheus::PrometheusHandle;
use msgx_actors::app::{
    install_metrics, kafka_bootstrap, start_pipeline, DispatchDeps, HousekeepingDeps, PipelineDeps,
};
use msgx_core::clock::{SharedClock, SystemClock};
use msgx_core::devtools::messages::Mix;
use msgx_core::settings::{redact_url, Settings};
use msgx_core::store::Store;
use msgx_core::telemetry;

use super::databases::BenchDbs;
use super::pump::pump_load::load_messages;
use super::rss_mib;

/// End-to-end benchmark knobs.
#[derive(Debug, Args)]
pub struct E2eBenchArgs {
    /// Backlog size: messages in the inbox before the service starts.
    #[arg(long, default_value_t = 1_000_000)]
    pub messages: u64,
    /// Message generator seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Give up after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30m")]
    pub timeout: Duration,
    /// Length of each steady phase after the drain (100, 300 and 1,000 msg/s offered); 0s
    /// skips them.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub steady: Duration,
    /// Keep the bench databases afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// The four stages, as counted in the store.
const STAGES: [&str; 4] = ["enqueued", "processed", "marked", "sent"];

/// Runs the end-to-end benchmark.
pub async fn e2e(settings: &Settings, args: &E2eBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.messages > 0, "--messages must be at least 1");
    let dbs = BenchDbs::fresh(settings).await?;
    let result = run(settings, args, &dbs).await;
    dbs.finish(result, args.keep).await
}

async fn run(settings: &Settings, args: &E2eBenchArgs, dbs: &BenchDbs) -> anyhow::Result<()> {
    let names = settings.inbox_names()?;
    let tz = settings.inbox_timezone()?;
    dbs.inbox_fixture(settings).await?;
    let mix = Mix {
        unknown_type: 0.0,
        ..Mix::default()
    };
    let loaded = load_messages(&dbs.inbox_url, &names, tz, args.messages, args.seed, mix).await?;
    let total = args.messages;
    println!(
        "bench e2e: {total} messages (seed {}, simulator mix without unknown types), {:.1} MiB, \
         loaded in {:.1}s; databases {} and {}",
        args.seed,
        loaded.bytes as f64 / (1024.0 * 1024.0),
        loaded.elapsed.as_secs_f64(),
        redact_url(&dbs.inbox_url),
        redact_url(&dbs.store_url)
    );
    let store = dbs.store(settings).await?;
    let inbox = dbs.inbox(settings)?;
    let (_embedded, bootstrap) = kafka_bootstrap(&settings.kafka)?;
    println!(
        "  kafka                 : {}; processing.group_max {}, group_max_wait {:?}; poll_interval {:?}, claim_batch {}; backfill.period {:?}, batch {}; dispatch.batch {}",
        if settings.kafka.is_embedded() {
            format!("embedded mock cluster {bootstrap}")
        } else {
            bootstrap.clone()
        },
        settings.processing.group_max,
        settings.processing.group_max_wait,
        settings.pipeline.poll_interval,
        settings.pipeline.claim_batch,
        settings.backfill.period,
        settings.backfill.batch,
        settings.dispatch.batch,
    );
    let metrics = install_metrics()?;
    let clock: SharedClock = Arc::new(SystemClock);
    let (fatal, _fatal_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut deps = PipelineDeps::from_settings(settings, inbox, store.clone(), clock, fatal)?;
    deps.dispatch = Some(DispatchDeps::new(settings, &bootstrap));
    // The housekeeper runs as in the service: it vacuums our hot tables where the server's
    // autovacuum is off (retention.vacuum).
    deps.housekeeping = HousekeepingDeps::from_settings(settings);
    let rss_start = rss_mib();
    let started = Instant::now();
    let _supervisor = start_pipeline(deps);

    // (when, [enqueued, processed, marked, sent]) every half second, from the counters.
    let mut samples: Vec<(Duration, [i64; 4])> = Vec::new();
    let mut peak_rss = rss_start.unwrap_or(0.0);
    let mut sampling = Duration::ZERO;
    let events_total = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = started.elapsed();
        let t0 = Instant::now();
        let c = Progress::read(&metrics);
        sampling += t0.elapsed();
        peak_rss = peak_rss.max(rss_mib().unwrap_or(0.0));
        samples.push((now, [c.enqueued, c.processed, c.marked, c.sent]));
        if c.enqueued as u64 >= total && c.processed as u64 >= total && c.marked as u64 >= total {
            // The counters say drained: confirm in the store (index-backed: no event left
            // PENDING), then count once.
            if !pending_events(&store).await? {
                let (enq, done, marked, sent, events) = counts(&store).await?;
                anyhow::ensure!(
                    enq as u64 == total && done as u64 == total && marked as u64 == total,
                    "counters and store disagree: store has enqueued {enq}, processed {done}, \
                     marked {marked} of {total}"
                );
                anyhow::ensure!(sent == events, "{sent} of {events} events SENT");
                break events;
            }
        }
        anyhow::ensure!(
            now < args.timeout,
            "not drained after {:?}: enqueued {}, processed {}, marked {}, sent {} events",
            args.timeout,
            c.enqueued,
            c.processed,
            c.marked,
            c.sent
        );
    };
    // crossed[stage][tenth] = the first sample at which the stage reached (tenth+1)/10.
    let mut crossed = [[None::<Duration>; 10]; 4];
    for (stage, row) in crossed.iter_mut().enumerate() {
        let of = if stage == 3 {
            events_total as u64
        } else {
            total
        };
        for (tenth, slot) in row.iter_mut().enumerate() {
            *slot = samples
                .iter()
                .find(|(_, c)| (c[stage] as u64) * 10 >= (tenth as u64 + 1) * of)
                .map(|(t, _)| *t);
        }
    }
    let elapsed = started.elapsed();
    println!(
        "  total                 : {total} messages and {events_total} events enqueued, processed, marked and delivered in {:.1}s ({:.0} msg/s); peak RSS {:.1} MiB (start {:.1})",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64().max(1e-9),
        peak_rss,
        rss_start.unwrap_or(0.0)
    );
    println!(
        "  sampling              : {} samples from the counters, {:.1} ms in all",
        samples.len(),
        sampling.as_secs_f64() * 1e3
    );
    println!("  per stage, per tenth of its count (units per second in that tenth; sampled every 0.5 s):");
    for (stage, name) in STAGES.iter().enumerate() {
        let of = if stage == 3 {
            events_total.max(0) as f64
        } else {
            total as f64
        };
        let mut prev = Duration::ZERO;
        let rates: Vec<String> = crossed[stage]
            .iter()
            .map(|t| {
                let t = t.unwrap_or(elapsed);
                let dt = t.saturating_sub(prev).as_secs_f64().max(0.5);
                prev = t;
                format!("{:.0}", of / 10.0 / dt)
            })
            .collect();
        let first = crossed[stage][0].unwrap_or(elapsed);
        let last = crossed[stage][9].unwrap_or(elapsed);
        println!(
            "    {name:<10}: {}  (first tenth at {:.1}s, all at {:.1}s)",
            rates.join(" "),
            first.as_secs_f64(),
            last.as_secs_f64()
        );
    }
    if !args.steady.is_zero() {
        let owner = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(4)
            .connect(&dbs.inbox_url)
            .await?;
        for rate in [100u64, 300, 1000] {
            steady(&owner, &store, &names, tz, rate, args.steady, settings).await?;
        }
        owner.close().await;
    }
    Ok(())
}

/// A steady phase: well-formed messages committed into the inbox at `rate` per second (one
/// autocommit INSERT each, timed on this host's clock after the commit), then, per message,
/// inbox commit → its last event SENT (`sent_at` is stamped after the broker's ack, so it
/// bounds the ack from above) and, per event, pump commit → SENT.
async fn steady(
    owner: &sqlx::MySqlPool,
    store: &Store,
    names: &msgx_core::inbox::names::InboxNames,
    tz: chrono_tz::Tz,
    rate: u64,
    length: Duration,
    settings: &Settings,
) -> anyhow::Result<()> {
    use msgx_core::devtools::messages::Generator;
    let sql = format!(
        "INSERT INTO {} ({}, {}) VALUES (?, ?)",
        names.table, names.received, names.message
    );
    // A sender of its own: sequence numbers restart, identities must not collide.
    let mut generator = Generator::with_sender(rate, format!("ST{rate}"));
    let mix = Mix::well_formed();
    let tick = Duration::from_millis(10);
    let per_tick = rate as f64 * tick.as_secs_f64();
    let total = (rate as f64 * length.as_secs_f64()) as u64;
    let mut interval = tokio::time::interval(tick);
    let (mut due, mut made) = (0.0f64, 0u64);
    let mut inserts = Vec::with_capacity(total as usize);
    while made < total {
        interval.tick().await;
        due += per_tick;
        let n = (due.floor() as u64).min(total - made);
        due -= n as f64;
        for _ in 0..n {
            let local = msgx_core::inbox::time::utc_to_local(chrono::Utc::now(), tz);
            let (_, text) = generator.next_message(&mix, local);
            let (owner, sql) = (owner.clone(), sql.clone());
            inserts.push(tokio::spawn(async move {
                let r = sqlx::query(&sql)
                    .bind(local)
                    .bind(text)
                    .execute(&owner)
                    .await;
                r.map(|r| (r.last_insert_id() as i64, chrono::Utc::now()))
            }));
        }
        made += n;
    }
    let mut committed = Vec::with_capacity(inserts.len());
    for i in inserts {
        committed.push(i.await??);
    }
    let ids: Vec<i64> = committed.iter().map(|(id, _)| *id).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (done, pending): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM proc_state WHERE msg_id = ANY($1) \
                      AND processed_seq IS NOT NULL), \
                    (SELECT count(*) FROM msg_event WHERE msg_id = ANY($1) AND state <> 'SENT')",
        )
        .bind(&ids)
        .fetch_one(store.pool())
        .await?;
        if done as usize == ids.len() && pending == 0 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "steady {rate}/s did not drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let per_msg: Vec<(i64, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT msg_id, max(sent_at) FROM msg_event WHERE msg_id = ANY($1) GROUP BY msg_id",
    )
    .bind(&ids)
    .fetch_all(store.pool())
    .await?;
    let at: std::collections::HashMap<i64, chrono::DateTime<chrono::Utc>> =
        committed.into_iter().collect();
    let mut inbox_to_ack: Vec<Duration> = per_msg
        .iter()
        .filter_map(|(id, sent)| {
            at.get(id)
                .map(|c| (*sent - *c).to_std().unwrap_or_default())
        })
        .collect();
    let per_event: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (sent_at - created_at))::float8 FROM msg_event \
         WHERE msg_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(store.pool())
    .await?;
    let mut commit_to_sent: Vec<Duration> = per_event
        .into_iter()
        .map(|s| Duration::from_secs_f64(s.max(0.0)))
        .collect();
    inbox_to_ack.sort();
    commit_to_sent.sort();
    let ms = |v: &[Duration], q: f64| super::percentile(v, q).as_secs_f64() * 1e3;
    println!(
        "  steady {rate:>4} msg/s {:.0}s : {} messages; inbox commit → Kafka ack (SENT) p50 {:.0}ms p99 {:.0}ms (aim ≤ poll_interval {:?} + 250 ms); pump commit → SENT p50 {:.1}ms p99 {:.1}ms ({} events)",
        length.as_secs_f64(),
        ids.len(),
        ms(&inbox_to_ack, 0.5),
        ms(&inbox_to_ack, 0.99),
        settings.pipeline.poll_interval,
        ms(&commit_to_sent, 0.5),
        ms(&commit_to_sent, 0.99),
        commit_to_sent.len(),
    );
    Ok(())
}

/// Progress from the service's counters (this process's recorder).
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    /// Rows enqueued into PROC_STATE.
    enqueued: i64,
    /// Terminal outcomes (every outcome but `failed`, which is retried).
    processed: i64,
    /// Marked (or found marked) plus abandoned.
    marked: i64,
    /// Events acknowledged (SENT or DEAD).
    sent: i64,
}

impl Progress {
    fn read(metrics: &PrometheusHandle) -> Self {
        let text = metrics.render();
        let mut p = Progress::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            let name = series.split('{').next().unwrap_or(series);
            let v = v as i64;
            match name {
                telemetry::INBOX_ENQUEUED_TOTAL => p.enqueued += v,
                telemetry::PIPELINE_PROCESSED_TOTAL if !series.contains("outcome=\"failed\"") => {
                    p.processed += v
                }
                telemetry::BACKFILL_MARKED_TOTAL | telemetry::BACKFILL_ABANDONED_TOTAL => {
                    p.marked += v
                }
                telemetry::DISPATCH_SENT_TOTAL | telemetry::DISPATCH_DEAD_TOTAL => p.sent += v,
                _ => {}
            }
        }
        p
    }
}

/// Whether any event is still PENDING (`msg_event_pending_idx`).
async fn pending_events(store: &Store) -> anyhow::Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM msg_event WHERE state = 'PENDING')")
            .fetch_one(store.pool())
            .await?,
    )
}

/// `(enqueued, terminal, marked or abandoned, events sent, events)`, counted in the store.
async fn counts(store: &Store) -> anyhow::Result<(i64, i64, i64, i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT (SELECT count(*) FROM proc_state), \
                (SELECT count(*) FROM proc_state WHERE processed_seq IS NOT NULL), \
                (SELECT count(*) FROM proc_state \
                  WHERE backfill_at IS NOT NULL OR backfill_abandon_reason IS NOT NULL), \
                (SELECT count(*) FROM msg_event WHERE state = 'SENT'), \
                (SELECT count(*) FROM msg_event)",
    )
    .fetch_one(store.pool())
    .await?)
}
