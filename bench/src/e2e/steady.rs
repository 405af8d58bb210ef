//! The steady phases of `msgx-bench e2e`, after the drain and the idle phase (`e2e/idle.rs`):
//! well-formed messages committed into the inbox at a fixed rate (one autocommit INSERT
//! each, timed on this host's clock after the commit), then, per message, where its time went,
//! from the stamps the service writes with its own clock (same host):
//!
//! | stage | from | to |
//! |---|---|---|
//! | discovery | inbox commit (bench) | `proc_state.enqueued_at` (the poll round's time) |
//! | queue + processing | `enqueued_at` | `proc_state.terminal_at` (the member's time inside its group; the group commits up to `group_max_wait` later) |
//! | delivery | `terminal_at` | the message's last `msg_event.sent_at` (its ack's time on the dispatcher's clock) |
//! | marking | `terminal_at` | `proc_state.backfill_at` (the sweep's start; its inbox UPDATE and commit follow within the sweep) |
//!
//! and the totals inbox commit → Kafka ack and inbox commit → inbox mark; per event, pump →
//! SENT (`sent_at − created_at`); and the inbox statements per second while the rate was
//! offered.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use msgx_core::devtools::messages::{Generator, Mix};
use msgx_core::inbox::names::InboxNames;
use msgx_core::settings::Settings;
use msgx_core::store::Store;

use crate::inbox_stats::{Commands, InboxStats};
use crate::percentile;
use crate::report::Pacer;

/// Where and how long the steady phases offer their messages.
pub(super) struct Offer<'a> {
    /// The DB owner's (upstream's) pool on the bench inbox.
    pub(super) owner: &'a sqlx::MySqlPool,
    pub(super) names: &'a InboxNames,
    pub(super) tz: chrono_tz::Tz,
    /// Length of each phase.
    pub(super) length: Duration,
}

/// Statements per second by kind.
pub(super) fn split(ran: &Commands, secs: f64) -> String {
    format!(
        "SELECT {:.2}/s, UPDATE {:.2}/s, other {:.2}/s",
        ran.select as f64 / secs,
        ran.update as f64 / secs,
        ran.other as f64 / secs
    )
}

/// One steady phase at `rate` messages per second: offers them, waits until every one is
/// processed, marked and delivered, and prints where the time went.
pub(super) async fn steady(
    offer: &Offer<'_>,
    store: &Store,
    stats: &InboxStats,
    rate: u64,
    settings: &Settings,
) -> anyhow::Result<()> {
    let before = stats.read().await?;
    let began = Instant::now();
    let lag = LoopLag::start();
    let committed = offer_messages(offer, rate).await?;
    let ran = stats.read().await?.since(&before);
    let offered_for = began.elapsed().as_secs_f64();
    let ids: Vec<i64> = committed.keys().copied().collect();
    wait_done(store, &ids, rate).await?;
    let lag = lag.stop().await;
    let b = Breakdown::fetch(store, &ids, &committed).await?;
    println!(
        "  steady {rate:>4} msg/s {:.0}s : {} messages; inbox statements while offered {:.1}/s ({})",
        offer.length.as_secs_f64(),
        ids.len(),
        ran.total() as f64 / offered_for,
        split(&ran, offered_for)
    );
    b.print(settings);
    println!(
        "      actor thread lag (5 ms timer late by) p50 {:>7.1} ms  p99 {:>7.1} ms  max {:.1} ms",
        percentile(&lag, 0.5).as_secs_f64() * 1e3,
        percentile(&lag, 0.99).as_secs_f64() * 1e3,
        lag.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    Ok(())
}

/// How late a 5 ms timer fires on the thread the service's actors run on (the bench runs the
/// pipeline in its own actix system): a busy handler delays every other actor's timers and
/// mailbox by as much, so this is the latency the single thread itself adds.
struct LoopLag {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Duration>>,
}

impl LoopLag {
    const TICK: Duration = Duration::from_millis(5);

    fn start() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut lags = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                tokio::time::sleep(Self::TICK).await;
                lags.push(t.elapsed().saturating_sub(Self::TICK));
            }
            lags
        });
        Self { stop, task }
    }

    /// The lags seen, sorted.
    async fn stop(self) -> Vec<Duration> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut lags = self.task.await.unwrap_or_default();
        lags.sort();
        lags
    }
}

/// Commits `rate × length` well-formed messages into the inbox at `rate` per second, one
/// autocommit INSERT each; returns each id with the time its commit returned.
async fn offer_messages(
    offer: &Offer<'_>,
    rate: u64,
) -> anyhow::Result<HashMap<i64, DateTime<Utc>>> {
    let sql = format!(
        "INSERT INTO {} ({}, {}) VALUES (?, ?)",
        offer.names.table, offer.names.received, offer.names.message
    );
    // A sender of its own: sequence numbers restart, identities must not collide.
    let mut generator = Generator::with_sender(rate, format!("ST{rate}"));
    let mix = Mix::well_formed();
    let mut pacer = Pacer::new(rate as f64, offer.length, 0.0);
    let mut inserts = Vec::with_capacity(pacer.total() as usize);
    while let Some((_, n)) = pacer.next().await {
        for _ in 0..n {
            let local = msgx_core::inbox::time::utc_to_local(Utc::now(), offer.tz);
            let (_, text) = generator.next_message(&mix, local);
            let (owner, sql) = (offer.owner.clone(), sql.clone());
            inserts.push(tokio::spawn(async move {
                let r = sqlx::query(&sql)
                    .bind(local)
                    .bind(text)
                    .execute(&owner)
                    .await;
                r.map(|r| (r.last_insert_id() as i64, Utc::now()))
            }));
        }
    }
    let mut committed = HashMap::with_capacity(inserts.len());
    for i in inserts {
        let (id, at) = i.await??;
        committed.insert(id, at);
    }
    Ok(committed)
}

/// Waits (up to two minutes) until every message is processed and marked and none of its
/// events is still to deliver.
async fn wait_done(store: &Store, ids: &[i64], rate: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (done, marked, pending): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM proc_state WHERE msg_id = ANY($1) \
                      AND processed_seq IS NOT NULL), \
                    (SELECT count(*) FROM proc_state WHERE msg_id = ANY($1) \
                      AND backfill_at IS NOT NULL), \
                    (SELECT count(*) FROM msg_event WHERE msg_id = ANY($1) AND state <> 'SENT')",
        )
        .bind(ids)
        .fetch_one(store.pool())
        .await?;
        if done as usize == ids.len() && marked as usize == ids.len() && pending == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "steady {rate}/s did not drain: {done} processed, {marked} marked of {}, {pending} \
             events to deliver",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Per-message stage durations of one steady phase, each sorted.
struct Breakdown {
    discovery: Vec<Duration>,
    processing: Vec<Duration>,
    delivery: Vec<Duration>,
    marking: Vec<Duration>,
    to_ack: Vec<Duration>,
    to_mark: Vec<Duration>,
    /// Per event: `sent_at − created_at`.
    pump_to_sent: Vec<Duration>,
    /// Per delivered message, slowest first: where the worst 1 % lost their time.
    tail: Vec<TailSample>,
    /// The phase's first inbox commit: the tail's commit times are read from it.
    first_commit: DateTime<Utc>,
}

/// One delivered message's total and stages, kept to say where the worst 1 % lost their time.
#[derive(Clone, Copy)]
struct TailSample {
    total: Duration,
    /// When its inbox commit returned (the wall clock finds the moment in the service's log).
    committed: DateTime<Utc>,
    discovery: Duration,
    processing: Duration,
    delivery: Duration,
}

/// One message's stamps: id, enqueued, processed, marked, last event SENT (none without events).
type Stamps = (
    i64,
    DateTime<Utc>,
    DateTime<Utc>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
);

impl Breakdown {
    /// Reads the stamps of `ids` and computes the stages (negative spans, from clock reads a
    /// few microseconds apart, count as zero).
    async fn fetch(
        store: &Store,
        ids: &[i64],
        committed: &HashMap<i64, DateTime<Utc>>,
    ) -> anyhow::Result<Self> {
        let rows: Vec<Stamps> = sqlx::query_as(
            "SELECT p.msg_id, p.enqueued_at, p.terminal_at, p.backfill_at, \
                    (SELECT max(e.sent_at) FROM msg_event e WHERE e.msg_id = p.msg_id) \
             FROM proc_state p WHERE p.msg_id = ANY($1)",
        )
        .bind(ids)
        .fetch_all(store.pool())
        .await?;
        let per_event: Vec<f64> = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM (sent_at - created_at))::float8 FROM msg_event \
             WHERE msg_id = ANY($1)",
        )
        .bind(ids)
        .fetch_all(store.pool())
        .await?;
        let span = |a: DateTime<Utc>, b: DateTime<Utc>| (b - a).to_std().unwrap_or_default();
        let mut b = Breakdown {
            discovery: Vec::new(),
            processing: Vec::new(),
            delivery: Vec::new(),
            marking: Vec::new(),
            to_ack: Vec::new(),
            to_mark: Vec::new(),
            pump_to_sent: per_event
                .into_iter()
                .map(|s| Duration::from_secs_f64(s.max(0.0)))
                .collect(),
            tail: Vec::new(),
            first_commit: committed.values().min().copied().unwrap_or_else(Utc::now),
        };
        for (id, enqueued, processed, marked, sent) in rows {
            let Some(&inbox) = committed.get(&id) else {
                continue;
            };
            b.discovery.push(span(inbox, enqueued));
            b.processing.push(span(enqueued, processed));
            b.marking.push(span(processed, marked));
            b.to_mark.push(span(inbox, marked));
            if let Some(sent) = sent {
                b.delivery.push(span(processed, sent));
                b.to_ack.push(span(inbox, sent));
                b.tail.push(TailSample {
                    total: span(inbox, sent),
                    committed: inbox,
                    discovery: span(inbox, enqueued),
                    processing: span(enqueued, processed),
                    delivery: span(processed, sent),
                });
            }
        }
        b.tail.sort_by_key(|t| std::cmp::Reverse(t.total));
        for v in [
            &mut b.discovery,
            &mut b.processing,
            &mut b.delivery,
            &mut b.marking,
            &mut b.to_ack,
            &mut b.to_mark,
            &mut b.pump_to_sent,
        ] {
            v.sort();
        }
        Ok(b)
    }

    /// One line per stage, p50 / p99 in milliseconds.
    fn print(&self, settings: &Settings) {
        let line = |name: &str, v: &[Duration], note: &str| {
            println!(
                "      {name:<38} p50 {:>7.1} ms  p99 {:>7.1} ms  ({} samples){note}",
                percentile(v, 0.5).as_secs_f64() * 1e3,
                percentile(v, 0.99).as_secs_f64() * 1e3,
                v.len()
            );
        };
        line("inbox commit → enqueued", &self.discovery, "");
        line("enqueued → processed (pump)", &self.processing, "");
        line("processed → Kafka ack (SENT)", &self.delivery, "");
        line("processed → inbox mark", &self.marking, "");
        line(
            "total inbox commit → Kafka ack",
            &self.to_ack,
            "; target p99 ≤ 250 ms",
        );
        line("total inbox commit → inbox mark", &self.to_mark, "");
        line("per event: pump → SENT", &self.pump_to_sent, "");
        self.print_tail(settings.pipeline.poll_interval);
    }

    /// Where the worst 1 % of commit → ack lost their time: how many were committed in the
    /// phase's first `poll_interval` (they waited out the idle poller's timer), the median of
    /// each stage among them, and when in the phase they were committed.
    fn print_tail(&self, poll_interval: Duration) {
        let worst = &self.tail[..self.tail.len().div_ceil(100)];
        if worst.is_empty() {
            return;
        }
        let median = |f: fn(&TailSample) -> Duration| {
            let mut v: Vec<Duration> = worst.iter().map(f).collect();
            v.sort();
            percentile(&v, 0.5).as_secs_f64() * 1e3
        };
        let offset = |t: &TailSample| {
            (t.committed - self.first_commit)
                .to_std()
                .unwrap_or_default()
        };
        let early = worst.iter().filter(|t| offset(t) < poll_interval).count();
        let mut offsets: Vec<f64> = worst.iter().map(|t| offset(t).as_secs_f64()).collect();
        offsets.sort_by(f64::total_cmp);
        // Counted per tenth of a second: a stall shows as one moment with many samples.
        let mut at: Vec<(String, usize)> = Vec::new();
        for o in &offsets {
            let tenth = format!("{o:.1}");
            match at.last_mut() {
                Some((t, n)) if *t == tenth => *n += 1,
                _ => at.push((tenth, 1)),
            }
        }
        let at: Vec<String> = at.iter().map(|(t, n)| format!("{t}×{n}")).collect();
        let wall = worst.iter().map(|t| t.committed).min().unwrap_or_default();
        println!(
            "      worst 1 % ({} samples, ≥ {:.1} ms): {early} committed in the phase's first \
             poll_interval; median discovery {:.1} / processing {:.1} / delivery {:.1} ms; \
             committed at +s {} (first at {})",
            worst.len(),
            worst[worst.len() - 1].total.as_secs_f64() * 1e3,
            median(|t| t.discovery),
            median(|t| t.processing),
            median(|t| t.delivery),
            at.join(" "),
            wall.format("%H:%M:%S%.3f")
        );
    }
}
