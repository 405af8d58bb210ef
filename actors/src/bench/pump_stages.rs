//! Phase 5 of `bench pump`, where the time goes. After the real run, the flight state and the
//! events are emptied and the first `sample` proc_state rows reset to PENDING, so those
//! messages meet the same state as in the run; then they are processed again with the same
//! public store/inbox/codec/flight calls `PumpCore::step` makes, in the same order, each stage
//! timed apart (core code is not instrumented). The raw texts are read ahead exactly as the
//! pump does (`next_unfinished` + one `raw_messages` per `read_ahead` messages), so those two
//! stages come out amortised per message.
//!
//! Statements are counted from the store code the calls run (each one round trip): the stamp
//! and the identity binding are single autocommit statements on the relaxed pool
//! (`synchronous_commit = off`, no wait for the WAL flush), the business transaction is the
//! one synchronous commit. Pool acquires are counted apart: the store pool does not ping before
//! a checkout (`test_before_acquire(false)`), so an acquire is no round trip of its own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use msgx_core::clock::{Clock, SystemClock};
use msgx_core::codec::DecodedMessage;
use msgx_core::flight;
use msgx_core::inbox::{Inbox, RawMessage};
use msgx_core::pump::rules::decide;
use msgx_core::pump::HeadDecision;
use msgx_core::settings::Settings;
use msgx_core::store::{Binding, BusinessResult, HeadRow, Store};

use super::super::checkpoint;
use super::pump_bare::{BareRun, BareShape, RELAXED_TX_STATEMENTS};
use super::pump_load::Loaded;
use super::pump_run::Probe;

/// Summed wall time per stage over the replayed messages.
#[derive(Debug, Default)]
pub(super) struct Stages {
    /// Messages replayed.
    pub(super) messages: u64,
    /// Wall time of the whole replay.
    pub(super) elapsed: Duration,
    /// `Store::head` and the head decision.
    pub(super) head: Duration,
    /// `Store::stamp_attempt` (one autocommit UPDATE on the relaxed pool).
    pub(super) stamp: Duration,
    /// `Store::next_unfinished` (the read-ahead window), once per refill.
    pub(super) ahead_ids: Duration,
    /// `Inbox::raw_messages` once per refill, plus the buffer look-ups.
    pub(super) raw_read: Duration,
    /// Read-ahead refills.
    pub(super) refills: u64,
    /// `Codec::decode`.
    pub(super) decode: Duration,
    /// `identity_key` + `Store::bind_identity` (a relaxed transaction, as the stamp).
    pub(super) identity: Duration,
    /// `flights_to_load` + `Store::commit_business` (the one business transaction), with…
    pub(super) business: Duration,
    /// …the pure `flight::plan` it runs inside.
    pub(super) plan: Duration,
    /// PostgreSQL statements sent (BEGIN and COMMIT count): one round trip each.
    pub(super) pg_statements: u64,
    /// PostgreSQL pool acquires (no ping before checkout in the store pool).
    pub(super) pg_acquires: u64,
    /// Statements of the relaxed transactions (stamp, bind) alone.
    pub(super) relaxed_statements: u64,
    /// Statements of the business transactions alone.
    pub(super) business_statements: u64,
    /// Flight rows written.
    pub(super) changes: u64,
    /// Events queued.
    pub(super) events: u64,
    /// Raw text bytes read.
    pub(super) bytes: u64,
    /// Bare probes right before the replay: relaxed tx, pump-shaped tx.
    pub(super) probes: Vec<BareRun>,
}

impl Stages {
    /// Sum of the timed stages.
    pub(super) fn staged(&self) -> Duration {
        self.head
            + self.stamp
            + self.ahead_ids
            + self.raw_read
            + self.decode
            + self.identity
            + self.business
    }
}

/// Resets the first `sample` messages and replays them stage by stage.
pub(super) async fn stage_breakdown(
    inbox: &Inbox,
    store: &Store,
    settings: &Settings,
    loaded: &Loaded,
    sample: u64,
    probe: Probe<'_>,
) -> anyhow::Result<Stages> {
    let tz = settings.inbox_timezone()?;
    let cfg = crate::app::pump_config(&settings.processing, tz);
    let codec = crate::app::codec(&settings.processing, tz);
    let clock = SystemClock;
    let sample_i = i64::try_from(sample).context("sample size")?;
    let last = loaded.min_id + sample_i - 1;
    reset(store, loaded.min_id, last).await?;
    let probes = probe
        .run(&[BareShape::RelaxedTx, BareShape::PumpTx])
        .await
        .context("bare probe before the replay")?;

    let mut s = Stages {
        messages: sample,
        probes,
        ..Stages::default()
    };
    let mut ahead: BTreeMap<i64, RawMessage> = BTreeMap::new();
    let started = Instant::now();
    for expected in loaded.min_id..=last {
        let t0 = Instant::now();
        let HeadRow { head, .. } = store
            .head()
            .await
            .context("replay: head")?
            .with_context(|| format!("replay: no head where message {expected} was next"))?;
        let msg_id = head.msg_id;
        anyhow::ensure!(
            msg_id == expected,
            "replay: head {msg_id} where {expected} was next"
        );
        let now = clock.now();
        let decision = decide(&head, now, &cfg.rules);
        anyhow::ensure!(
            decision == HeadDecision::Process,
            "replay: head {msg_id} decision {decision:?}"
        );
        let t1 = Instant::now();
        store
            .stamp_attempt(msg_id, now)
            .await
            .context("replay: stamp_attempt")?
            .with_context(|| format!("replay: message {msg_id} not unfinished when stamped"))?;
        let t2 = Instant::now();
        // The head query (1), then the stamp's relaxed transaction.
        s.pg_statements += 1 + u64::from(RELAXED_TX_STATEMENTS);
        s.relaxed_statements += u64::from(RELAXED_TX_STATEMENTS);
        s.pg_acquires += 2;

        // The raw text: the read-ahead buffer, else one window of ids and one inbox read.
        let mut refill = Duration::ZERO;
        let raw = match ahead.remove(&msg_id) {
            Some(raw) => raw,
            None => {
                ahead.clear();
                let ids = store
                    .next_unfinished(msg_id, i64::from(cfg.read_ahead))
                    .await
                    .context("replay: next_unfinished")?;
                let ids_took = t2.elapsed();
                s.ahead_ids += ids_took;
                s.pg_statements += 1;
                s.pg_acquires += 1;
                let ids = if ids.first() == Some(&msg_id) {
                    ids
                } else {
                    vec![msg_id]
                };
                let t = Instant::now();
                let texts = inbox
                    .raw_messages(&ids, cfg.max_message_bytes)
                    .await
                    .context("replay: raw_messages")?;
                let read_took = t.elapsed();
                s.raw_read += read_took;
                s.refills += 1;
                refill = ids_took + read_took;
                ahead.extend(texts);
                ahead.remove(&msg_id).unwrap_or(RawMessage::Missing)
            }
        };
        let t3 = Instant::now();
        // The buffer look-up and bookkeeping around a refill.
        s.raw_read += (t3 - t2).saturating_sub(refill);
        let RawMessage::Text(text) = raw else {
            anyhow::bail!("replay: message {msg_id} raw text {raw:?}");
        };
        s.bytes += text.len() as u64;
        let msg = codec
            .decode(&text)
            .map_err(|e| anyhow::anyhow!("replay: message {msg_id} does not decode: {e}"))?;
        let t4 = Instant::now();
        let key = msg.identity_key(cfg.identity_with_date, cfg.tz);
        let binding = store
            .bind_identity(msg_id, &key)
            .await
            .context("replay: bind_identity")?;
        anyhow::ensure!(
            binding == Binding::Bound,
            "replay: message {msg_id} identity {key}: {binding:?}"
        );
        let t5 = Instant::now();
        // The binding's relaxed transaction (a first binding: no duplicate look-up).
        s.pg_statements += u64::from(RELAXED_TX_STATEMENTS);
        s.relaxed_statements += u64::from(RELAXED_TX_STATEMENTS);
        s.pg_acquires += 1;

        let (statements, plan_took, changes, events) =
            business(store, msg_id, &msg, clock.now()).await?;
        let t6 = Instant::now();
        s.pg_statements += statements;
        s.pg_acquires += 1;
        s.business_statements += statements;
        s.plan += plan_took;
        s.changes += changes;
        s.events += events;

        s.head += t1 - t0;
        s.stamp += t2 - t1;
        s.decode += t4 - t3;
        s.identity += t5 - t4;
        s.business += t6 - t5;
    }
    s.elapsed = started.elapsed();
    Ok(s)
}

/// The business stage as `PumpCore` runs it; returns the statements sent, the time of the
/// pure plan inside the transaction, and the changes and events committed.
async fn business(
    store: &Store,
    msg_id: i64,
    msg: &DecodedMessage,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<(u64, Duration, u64, u64)> {
    let load = flight::flights_to_load(msg);
    let msg_type = if msg.meta.subtype.is_empty() {
        msg.meta.msg_type.clone()
    } else {
        format!("{}-{}", msg.meta.msg_type, msg.meta.subtype)
    };
    let mut plan_took = Duration::ZERO;
    let mut snapshot = false;
    let result = store
        .commit_business(
            msg_id,
            &msg_type,
            &load,
            |current| {
                let t = Instant::now();
                let plan = flight::plan(msg, msg_id, current);
                plan_took = t.elapsed();
                snapshot = plan.snapshot.is_some();
                plan
            },
            now,
        )
        .await
        .with_context(|| format!("replay: commit_business of message {msg_id}"))?;
    let BusinessResult::Committed { changes, events } = result else {
        anyhow::bail!("replay: message {msg_id} was no longer unfinished");
    };
    // BEGIN, the lock + row + flights (one statement), [snapshot], the writes (changes, events
    // and the terminal UPDATE in one statement), COMMIT.
    let statements = 4 + u64::from(snapshot);
    Ok((statements, plan_took, changes as u64, events as u64))
}

/// Empties the flight state, the events and the snapshots, and resets `first..=last` to
/// PENDING as the enqueue left them; then vacuums so the replay starts from clean tables.
async fn reset(store: &Store, first: i64, last: i64) -> anyhow::Result<()> {
    let pool = store.pool();
    sqlx::query("TRUNCATE msg_event, schd_snap_log, flight_state")
        .execute(pool)
        .await
        .context("emptying the flight state for the replay")?;
    let reset = sqlx::query(
        "UPDATE proc_state SET state = 'PENDING', attempts = 0, next_attempt_at = NULL, \
                error_class = NULL, error_text = NULL, processing_started_at = NULL, \
                terminal_reason = NULL, terminal_at = NULL, identity_key = NULL, \
                backfill_next_at = NULL, processed_seq = NULL, msg_type = NULL, \
                updated_at = now() \
         WHERE msg_id BETWEEN $1 AND $2",
    )
    .bind(first)
    .bind(last)
    .execute(pool)
    .await
    .context("resetting the replayed rows to PENDING")?;
    anyhow::ensure!(
        i64::try_from(reset.rows_affected()).ok() == Some(last - first + 1),
        "reset {} rows for the replay, expected {}",
        reset.rows_affected(),
        last - first + 1
    );
    sqlx::raw_sql("VACUUM ANALYZE proc_state, flight_state, msg_event")
        .execute(pool)
        .await
        .context("VACUUM ANALYZE before the replay")?;
    checkpoint(pool).await;
    Ok(())
}
