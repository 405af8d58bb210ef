//! The drain phase of `msgx-bench e2e`: the service works through the backlog while the bench
//! samples the service's own counters every half second; the store is counted once, at the
//! end, to check the drain.
//!
//! Progress is read from the Prometheus recorder the binary installs (so its cost is in the
//! figures too), not from the store: five `count(*)` over a million-row PROC_STATE and
//! MSG_EVENT every half second would take a core of their own on this 2-core machine and slow
//! the run down more the longer it goes.

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use msgx_core::store::Store;
use msgx_core::telemetry;

use super::cpu::CpuTimes;
use super::rendered;
use super::Service;
use crate::rss_mib;

/// The four stages, as counted in the store.
const STAGES: [&str; 4] = ["enqueued", "processed", "marked", "sent"];

/// What the drain saw: (when, [enqueued, processed, marked, sent]) every half second.
struct Sampled {
    samples: Vec<(Duration, [i64; 4])>,
    /// Events in the store at the end (all SENT).
    events: i64,
    /// `(when, RSS MiB)` at every sample.
    rss: Vec<(Duration, f64)>,
    /// Time spent reading the counters.
    sampling: Duration,
}

/// Waits until the service has enqueued, processed, marked and delivered all `total` messages
/// (or `timeout`), then prints the total, the peak RSS and the rate of every tenth per stage.
/// Returns the end-to-end rate (messages a second).
pub(super) async fn drain(service: &Service, total: u64, timeout: Duration) -> anyhow::Result<f64> {
    let rss_start = rss_mib();
    let cpu_start = CpuTimes::now();
    let started = Instant::now();
    let sampled = sample_until_drained(service, total, timeout, started).await?;
    let elapsed = started.elapsed();
    let cpu_end = CpuTimes::now();
    let peak_rss = sampled
        .rss
        .iter()
        .map(|(_, m)| *m)
        .fold(rss_start.unwrap_or(0.0), f64::max);
    println!(
        "  total                 : {total} messages and {} events enqueued, processed, marked and delivered in {:.1}s ({:.0} msg/s); peak RSS {:.1} MiB (start {:.1})",
        sampled.events,
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64().max(1e-9),
        peak_rss,
        rss_start.unwrap_or(0.0)
    );
    println!(
        "  sampling              : {} samples from the counters, {:.1} ms in all",
        sampled.samples.len(),
        sampled.sampling.as_secs_f64() * 1e3
    );
    print_tenths(&sampled, total, elapsed);
    let rss: Vec<String> = tenths_peak(&sampled.rss, elapsed)
        .iter()
        .map(|m| format!("{m:.1}"))
        .collect();
    println!(
        "    RSS MiB   : {}  (peak within each tenth of the drain's wall time)",
        rss.join(" ")
    );
    super::cpu::print(cpu_start, cpu_end, elapsed);
    super::pump_stages::print(&service.metrics, total, elapsed);
    Ok(total as f64 / elapsed.as_secs_f64().max(1e-9))
}

/// Samples the counters every half second until they say drained and the store agrees.
async fn sample_until_drained(
    service: &Service,
    total: u64,
    timeout: Duration,
    started: Instant,
) -> anyhow::Result<Sampled> {
    let mut s = Sampled {
        samples: Vec::new(),
        events: 0,
        rss: Vec::new(),
        sampling: Duration::ZERO,
    };
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = started.elapsed();
        let t0 = Instant::now();
        let c = Progress::read(&service.metrics);
        s.sampling += t0.elapsed();
        s.rss.push((now, rss_mib().unwrap_or(0.0)));
        s.samples
            .push((now, [c.enqueued, c.processed, c.marked, c.sent]));
        let counted = [c.enqueued, c.processed, c.marked];
        if counted.iter().all(|n| *n as u64 >= total) {
            // The counters say drained: confirm in the store (index-backed: no event left
            // PENDING), then count once.
            if !pending_events(&service.store).await? {
                s.events = check_store(&service.store, total).await?;
                return Ok(s);
            }
        }
        anyhow::ensure!(
            now < timeout,
            "not drained after {timeout:?}: enqueued {}, processed {}, marked {}, sent {} events",
            c.enqueued,
            c.processed,
            c.marked,
            c.sent
        );
    }
}

/// The highest of `(when, value)` samples within each tenth of `wall`.
fn tenths_peak(samples: &[(Duration, f64)], wall: Duration) -> [f64; 10] {
    let mut peak = [0.0_f64; 10];
    let wall = wall.as_secs_f64().max(1e-9);
    for (t, v) in samples {
        let tenth = ((t.as_secs_f64() / wall * 10.0) as usize).min(9);
        peak[tenth] = peak[tenth].max(*v);
    }
    peak
}

/// Counts the store once: every message enqueued, processed and marked, every event SENT.
/// Returns the number of events.
async fn check_store(store: &Store, total: u64) -> anyhow::Result<i64> {
    let (enq, done, marked, sent, events) = counts(store).await?;
    anyhow::ensure!(
        enq as u64 == total && done as u64 == total && marked as u64 == total,
        "counters and store disagree: store has enqueued {enq}, processed {done}, \
         marked {marked} of {total}"
    );
    anyhow::ensure!(sent == events, "{sent} of {events} events SENT");
    Ok(events)
}

/// Per stage, the rate of every tenth of its count, from the first sample at which the stage
/// reached each tenth.
fn print_tenths(sampled: &Sampled, total: u64, elapsed: Duration) {
    println!("  per stage, per tenth of its count (units per second in that tenth; sampled every 0.5 s):");
    for (stage, name) in STAGES.iter().enumerate() {
        let of = if stage == 3 {
            sampled.events.max(0) as u64
        } else {
            total
        };
        let crossed: Vec<Duration> = (0..10u64)
            .map(|tenth| {
                sampled
                    .samples
                    .iter()
                    .find(|(_, c)| (c[stage] as u64) * 10 >= (tenth + 1) * of)
                    .map_or(elapsed, |(t, _)| *t)
            })
            .collect();
        let mut prev = Duration::ZERO;
        let rates: Vec<String> = crossed
            .iter()
            .map(|t| {
                let dt = t.saturating_sub(prev).as_secs_f64().max(0.5);
                prev = *t;
                format!("{:.0}", of as f64 / 10.0 / dt)
            })
            .collect();
        println!(
            "    {name:<10}: {}  (first tenth at {:.1}s, all at {:.1}s)",
            rates.join(" "),
            crossed[0].as_secs_f64(),
            crossed[9].as_secs_f64()
        );
    }
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
        let mut p = Progress::default();
        for (series, v) in rendered::samples(metrics) {
            let v = v as i64;
            match rendered::name(&series) {
                telemetry::INBOX_ENQUEUED_TOTAL => p.enqueued += v,
                telemetry::PIPELINE_PROCESSED_TOTAL
                    if rendered::label(&series, "outcome") != Some("failed") =>
                {
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
