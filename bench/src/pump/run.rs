//! Phase 3 of `bench pump`, the real thing: `PumpCore::step_group()` (the `Pump` actor's call)
//! with the service's codec and knobs until Idle, every group timed, RSS sampled every 10 % of progress. Every outcome must
//! be SUCCEEDED (the backlog is well-formed); anything else stops the bench loudly.
//!
//! The disk's flush time drifts on a shared machine (other builds and tests), so short bare
//! probes (`BEGIN; UPDATE; COMMIT`, the pump-shaped tx, the pump-shaped message: two relaxed
//! transactions and the pump-shaped tx, one synchronous commit) also run
//! before the first step and after every tenth, with the pump paused: each tenth is compared
//! with the bare rates measured right around it.

mod tenths;

pub(super) use tenths::Probe;
use tenths::{Tenth, Tenths, PROBE_SHAPES};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use msgx_core::clock::{SharedClock, SystemClock};
use msgx_core::inbox::Inbox;
use msgx_core::pump::stages::StageTimes;
use msgx_core::pump::{Outcome, PumpCore, StepOutcome};
use msgx_core::settings::Settings;
use msgx_core::store::Store;

use crate::pump::bare::{BareRun, BareShape};
use crate::pump::load::Loaded;
use crate::rss_mib;

/// The pump run.
#[derive(Debug)]
pub(super) struct PumpRun {
    /// `read_ahead` the pump ran with.
    pub(super) read_ahead: u32,
    /// From the first step to Idle.
    pub(super) elapsed: Duration,
    /// Messages processed (all SUCCEEDED).
    pub(super) messages: u64,
    /// `StepOutcome::Processed.took` of every message, ascending.
    pub(super) took: Vec<Duration>,
    /// Wall time per message, in MSG_ID order: a group's on its first message, zero on the
    /// others.
    pub(super) steps: Vec<Duration>,
    /// Outcome labels and counts.
    pub(super) outcomes: BTreeMap<&'static str, u64>,
    /// Flight rows written and events queued in all.
    pub(super) changes: u64,
    /// Events queued in all.
    pub(super) events: u64,
    /// Progress by tenths.
    pub(super) tenths: Vec<Tenth>,
    /// RSS before the first step.
    pub(super) rss_start: Option<f64>,
    /// The bare probe before the first step.
    pub(super) probe_start: Vec<BareRun>,
    /// Where the time went, as the real step recorded it.
    pub(super) stages: StageTimes,
    /// Whether the pump wrote our raw copy (`retention.raw_copy`).
    pub(super) raw_copy: bool,
    /// WAL the server wrote during the run, less the bare probes between the tenths
    /// (server-wide: other sessions on the same server count too).
    pub(super) wal_bytes: Option<u64>,
}

/// What the raw copies take in the store after a run.
#[derive(Debug, Clone, Copy)]
pub(super) struct CopyFacts {
    /// Copies.
    pub(super) rows: i64,
    /// Raw text bytes they hold.
    pub(super) raw_bytes: i64,
    /// Compressed bytes stored.
    pub(super) stored_bytes: i64,
    /// The table with its TOAST and indexes (`pg_total_relation_size`).
    pub(super) table_bytes: i64,
}

/// The copies' totals and the table's size.
pub(super) async fn copy_facts(store: &Store) -> anyhow::Result<CopyFacts> {
    let (rows, raw_bytes, stored_bytes) = store.raw_copy_totals().await?;
    let table_bytes: i64 = sqlx::query_scalar("SELECT pg_total_relation_size('raw_copy')")
        .fetch_one(store.pool())
        .await
        .context("raw_copy size")?;
    Ok(CopyFacts {
        rows,
        raw_bytes,
        stored_bytes,
        table_bytes,
    })
}

/// Empties the store's tables (not the schema) so the same backlog can be enqueued and pumped
/// again: W back to 0, no rows, no flights, no events, no copies.
pub(super) async fn reset_store(store: &Store) -> anyhow::Result<&'static str> {
    sqlx::raw_sql(
        "TRUNCATE proc_state, flight_state, msg_event, schd_snap_log, raw_copy, inbox_hole, \
                  late_watch_range, late_watch, inbox_unseen, audit_log CASCADE; \
         UPDATE inbox_cursor SET w = 0, hole_since = NULL, seeded_at = NULL WHERE id = 1",
    )
    .execute(store.pool())
    .await
    .context("emptying the store for the second run")?;
    Ok("TRUNCATE, W = 0")
}

/// `pg_current_wal_lsn()` as bytes.
async fn wal_lsn(store: &Store) -> Option<u64> {
    let lsn: Option<i64> =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
            .fetch_one(store.pool())
            .await
            .ok();
    lsn.and_then(|v| u64::try_from(v).ok())
}

impl PumpRun {
    /// The bare rate of `shape` around tenth `i` (the probes before and after it), or over
    /// every probe when `i` is None.
    pub(super) fn probe_rate(&self, shape: BareShape, i: Option<usize>) -> f64 {
        let probes: Vec<&[BareRun]> = std::iter::once(self.probe_start.as_slice())
            .chain(self.tenths.iter().map(|t| t.probe_after.as_slice()))
            .collect();
        let chosen: &[&[BareRun]] = match i {
            Some(i) if i + 1 < probes.len() => &probes[i..=i + 1],
            Some(_) => &probes[probes.len().saturating_sub(1)..],
            None => &probes,
        };
        let runs = chosen
            .iter()
            .flat_map(|p| p.iter())
            .filter(|r| r.shape == shape);
        let (units, time) = runs.fold((0u64, Duration::ZERO), |(u, t), r| {
            (u + r.units, t + r.elapsed)
        });
        units as f64 / time.as_secs_f64().max(1e-9)
    }
}

/// What the steps recorded so far.
struct Tally {
    /// `took` of every message.
    took: Vec<Duration>,
    /// Wall time per message (a group's on its first).
    steps: Vec<Duration>,
    outcomes: BTreeMap<&'static str, u64>,
    changes: u64,
    events: u64,
    /// The id FIFO order says comes next.
    expected_id: i64,
}

impl Tally {
    /// Records one processed message: it must have SUCCEEDED and be the next in MSG_ID order.
    fn record(
        &mut self,
        msg_id: i64,
        outcome: Outcome,
        took_one: Duration,
        wall: Duration,
    ) -> anyhow::Result<()> {
        *self.outcomes.entry(outcome.label()).or_default() += 1;
        let Outcome::Succeeded {
            changes: c,
            events: e,
        } = outcome
        else {
            anyhow::bail!(
                "message {msg_id} ended {} ({}): {outcome:?}; every message of the \
                 well-formed backlog must succeed",
                outcome.label(),
                outcome.class()
            );
        };
        anyhow::ensure!(
            msg_id == self.expected_id,
            "the pump processed message {msg_id} where {} was next (FIFO)",
            self.expected_id
        );
        self.expected_id += 1;
        self.changes += c as u64;
        self.events += e as u64;
        self.took.push(took_one);
        self.steps.push(wall);
        Ok(())
    }
}

/// One `PumpCore::step_group()`: each message of the group with its outcome, its `took` and
/// its share of the group's wall time (all of it on the first message, none on the others:
/// they were done in the same call); empty when Idle.
async fn group_once(
    core: &mut PumpCore,
    expected_id: i64,
) -> anyhow::Result<Vec<(i64, Outcome, Duration, Duration)>> {
    let group_started = Instant::now();
    let group = core
        .step_group()
        .await
        .with_context(|| format!("pump group at message {expected_id}"))?;
    let mut wall = group_started.elapsed();
    let mut done = Vec::with_capacity(group.len());
    for step in group {
        match step {
            StepOutcome::Idle => break,
            StepOutcome::Processed {
                msg_id,
                outcome,
                took,
                ..
            } => done.push((msg_id, outcome, took, std::mem::take(&mut wall))),
            other => anyhow::bail!(
                "pump group at message {expected_id} did not process a message: {other:?} \
                 (every message of the well-formed backlog must succeed)"
            ),
        }
    }
    Ok(done)
}

/// The pump's core with the service's codec and knobs (and `raw_copy` as asked), and its
/// `read_ahead`.
fn pump_core(
    inbox: &Inbox,
    store: &Store,
    settings: &Settings,
    raw_copy: bool,
) -> anyhow::Result<(PumpCore, u32)> {
    let tz = settings.inbox_timezone();
    let mut cfg = msgx_actors::app::pump_config(&settings.processing, &settings.retention, tz);
    cfg.raw_copy = raw_copy;
    let codec = msgx_actors::app::codec(&settings.processing, tz);
    let clock: SharedClock = Arc::new(SystemClock);
    let read_ahead = cfg.read_ahead;
    Ok((
        PumpCore::new(inbox.clone(), store.clone(), codec, clock, cfg),
        read_ahead,
    ))
}

/// `PumpCore::step_group()` until Idle.
pub(super) async fn pump_phase(
    inbox: &Inbox,
    store: &Store,
    settings: &Settings,
    loaded: &Loaded,
    probe: Probe<'_>,
    raw_copy: bool,
) -> anyhow::Result<PumpRun> {
    let (mut core, read_ahead) = pump_core(inbox, store, settings, raw_copy)?;
    let total = u64::try_from(loaded.inbox.max_id - loaded.inbox.min_id + 1).context("id range")?;
    let capacity = usize::try_from(total).context("backlog size")?;
    // Allocated up front so the samples themselves do not grow the RSS.
    let mut tally = Tally {
        took: Vec::with_capacity(capacity),
        steps: Vec::with_capacity(capacity),
        outcomes: BTreeMap::new(),
        changes: 0,
        events: 0,
        expected_id: loaded.inbox.min_id,
    };
    let probe_start = probe.run(&PROBE_SHAPES).await?;
    let rss_start = rss_mib();
    let wal_start = wal_lsn(store).await;
    let started = Instant::now();
    let mut tenths = Tenths {
        done: Vec::with_capacity(10),
        current: Tenth::empty(),
        started,
        paused: Duration::ZERO,
        probe_wal: 0,
    };
    loop {
        let group = group_once(&mut core, tally.expected_id).await?;
        if group.is_empty() {
            break;
        }
        for (msg_id, outcome, took_one, wall) in group {
            tally.record(msg_id, outcome, took_one, wall)?;
            tenths.count(took_one, wall);
            let done = tally.steps.len() as u64;
            if tenths.done.len() < 9 && done * 10 >= (tenths.done.len() as u64 + 1) * total {
                tenths.close(&probe, store, msg_id, started).await?;
            }
        }
    }
    // The pump's own time: the probes between the tenths do not count.
    let elapsed = started.elapsed() - tenths.paused;
    let wal_end = wal_lsn(store).await;
    let mut last = tenths.current;
    last.elapsed = tenths.started.elapsed();
    last.rss = rss_mib();
    last.probe_after = probe.run(&PROBE_SHAPES).await?;
    tenths.done.push(last);
    let messages = tally.steps.len() as u64;
    anyhow::ensure!(
        messages == total,
        "the pump went Idle after {messages} of {total} messages"
    );
    check_store(store, total).await?;
    tally.took.sort_unstable();
    Ok(PumpRun {
        read_ahead,
        elapsed,
        messages,
        took: tally.took,
        steps: tally.steps,
        outcomes: tally.outcomes,
        changes: tally.changes,
        events: tally.events,
        tenths: tenths.done,
        rss_start,
        probe_start,
        stages: core.stages().clone(),
        raw_copy,
        wal_bytes: wal_start
            .zip(wal_end)
            .map(|(a, b)| b.saturating_sub(a).saturating_sub(tenths.probe_wal)),
    })
}

/// Every row SUCCEEDED, and `processed_seq` ascends with `msg_id` (FIFO, from the store).
async fn check_store(store: &Store, total: u64) -> anyhow::Result<()> {
    let (succeeded, out_of_order): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'SUCCEEDED'), \
                count(*) FILTER (WHERE processed_seq <= prev) \
         FROM (SELECT state, processed_seq, \
                      lag(processed_seq) OVER (ORDER BY msg_id) AS prev FROM proc_state) s",
    )
    .fetch_one(store.pool())
    .await
    .context("checking the processed rows")?;
    anyhow::ensure!(
        u64::try_from(succeeded).ok() == Some(total) && out_of_order == 0,
        "after the run {succeeded} of {total} rows are SUCCEEDED and {out_of_order} rows were \
         processed out of MSG_ID order"
    );
    Ok(())
}
