//! The idle and steady phases of `msgx-bench e2e`, after the drain.
//!
//! Idle: nothing arrives for `--idle`; the statements the service sends the inbox in that
//! time, per second and per `poll_interval` (`inbox_stats`: counted by MariaDB for the
//! service's own inbox user).
//!
//! Steady: well-formed messages committed into the inbox at a fixed rate (one autocommit INSERT
//! each, timed on this host's clock after the commit), then, per message, where its time went,
//! from the stamps the service writes with its own clock (same host):
//!
//! | stage | from | to |
//! |---|---|---|
//! | discovery | inbox commit (bench) | `proc_state.enqueued_at` (the poll round's time) |
//! | queue + processing | `enqueued_at` | `proc_state.terminal_at` (the member's time inside its group; the group commits up to `group_max_wait` later) |
//! | delivery | `terminal_at` | the message's last `msg_event.sent_at` (stamped after the broker's ack) |
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

/// The idle phase: inbox statements while nothing arrives.
pub(super) async fn idle(
    stats: &InboxStats,
    length: Duration,
    poll_interval: Duration,
) -> anyhow::Result<()> {
    let before = stats.read().await?;
    let began = Instant::now();
    tokio::time::sleep(length).await;
    let ran = stats.read().await?.since(&before);
    let secs = began.elapsed().as_secs_f64();
    println!(
        "  idle {:.0}s              : inbox statements {:.2}/s = {:.2} per poll_interval {poll_interval:?} ({})",
        secs,
        ran.total() as f64 / secs,
        ran.total() as f64 / secs * poll_interval.as_secs_f64(),
        split(&ran, secs)
    );
    Ok(())
}

/// Statements per second by kind.
fn split(ran: &Commands, secs: f64) -> String {
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
    let committed = offer_messages(offer, rate).await?;
    let ran = stats.read().await?.since(&before);
    let offered_for = began.elapsed().as_secs_f64();
    let ids: Vec<i64> = committed.keys().copied().collect();
    wait_done(store, &ids, rate).await?;
    let b = Breakdown::fetch(store, &ids, &committed).await?;
    println!(
        "  steady {rate:>4} msg/s {:.0}s : {} messages; inbox statements while offered {:.1}/s ({})",
        offer.length.as_secs_f64(),
        ids.len(),
        ran.total() as f64 / offered_for,
        split(&ran, offered_for)
    );
    b.print(settings);
    Ok(())
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
            }
        }
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
        let aim = format!(
            "; aim p99 ≤ poll_interval {:?} + 250 ms",
            settings.pipeline.poll_interval
        );
        line("total inbox commit → Kafka ack", &self.to_ack, &aim);
        line("total inbox commit → inbox mark", &self.to_mark, "");
        line("per event: pump → SENT", &self.pump_to_sent, "");
    }
}
