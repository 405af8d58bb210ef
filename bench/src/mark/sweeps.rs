//! Phases 3 and 4 of `msgx-bench mark`: `sweep_once` until nothing is due (every sweep timed),
//! then a sample unmarked again and swept with the same public calls `sweep_once` makes, each
//! stage timed apart (where the time goes). The backlog stage, apart from the bare limits and
//! the steady stream.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::Utc;
use msgx_core::backfill::rules::{classify, overdue_before};
use msgx_core::backfill::sweep_once;
use msgx_core::clock::{Clock, SystemClock};
use msgx_core::store::backfill::SweepWrite;

use super::Ctx;
use crate::checkpoint;

/// The real sweeps.
pub(super) struct SweepRun {
    pub(super) sweeps: u64,
    pub(super) marked: u64,
    pub(super) elapsed: Duration,
    /// Per sweep, ascending.
    pub(super) took: Vec<Duration>,
    /// Inbox rows carrying the mark value afterwards.
    pub(super) inbox_marked: i64,
    /// `PROC_STATE` rows confirmed afterwards.
    pub(super) confirmed: i64,
}

/// Phase 3: `sweep_once` until nothing is due.
pub(super) async fn sweep_phase(ctx: &Ctx<'_>) -> anyhow::Result<SweepRun> {
    let clock = SystemClock;
    let mut took = Vec::new();
    let mut marked = 0;
    let started = Instant::now();
    loop {
        let r = sweep_once(ctx.inbox, ctx.store, &clock, ctx.cfg)
            .await
            .context("sweep")?;
        anyhow::ensure!(
            r.transient() == 0 && r.missing.is_empty(),
            "unexpected sweep outcome: {} transient ({:?}), {} missing",
            r.transient(),
            r.transient_error,
            r.missing.len()
        );
        if r.selected == 0 {
            break;
        }
        marked += r.marked + r.already_marked;
        took.push(r.took);
    }
    let elapsed = started.elapsed();
    took.sort_unstable();
    let n = ctx.names;
    let inbox_marked: i64 = sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM {t} WHERE {s} = ?",
        t = n.table,
        s = n.status
    ))
    .bind(&ctx.cfg.mark_value)
    .fetch_one(ctx.inbox.pool())
    .await
    .context("counting marks")?;
    let confirmed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM proc_state WHERE backfill_at IS NOT NULL")
            .fetch_one(ctx.store.pool())
            .await
            .context("counting confirmations")?;
    anyhow::ensure!(
        u64::try_from(inbox_marked).ok() == Some(ctx.args.rows)
            && u64::try_from(confirmed).ok() == Some(ctx.args.rows),
        "after the sweeps: {inbox_marked} inbox rows marked, {confirmed} confirmed, expected {}",
        ctx.args.rows
    );
    Ok(SweepRun {
        sweeps: took.len() as u64,
        marked,
        elapsed,
        took,
        inbox_marked,
        confirmed,
    })
}

/// Phase 4 totals.
#[derive(Default)]
pub(super) struct Stages {
    pub(super) rows: u64,
    pub(super) sweeps: u32,
    pub(super) elapsed: Duration,
    pub(super) select_lock: Duration,
    pub(super) check: Duration,
    pub(super) update: Duration,
    pub(super) write_back: Duration,
    pub(super) backlog: Duration,
}

/// Phase 4: the first `--sample` rows unmarked again in both stores, then swept with the same
/// calls `sweep_once` makes, each stage timed.
pub(super) async fn stage_phase(ctx: &Ctx<'_>, first: i64) -> anyhow::Result<Stages> {
    let sample = ctx.args.sample.min(ctx.args.rows);
    if sample == 0 {
        return Ok(Stages::default());
    }
    let last = first + i64::try_from(sample)? - 1;
    unmark_sample(ctx, first, last).await?;
    checkpoint(ctx.store.pool()).await;
    let mut s = Stages::default();
    let started = Instant::now();
    while sweep_timed(ctx, &mut s).await? {}
    s.elapsed = started.elapsed();
    Ok(s)
}

/// `first..=last` unconfirmed in the store and unmarked in the inbox again.
pub(super) async fn unmark_sample(ctx: &Ctx<'_>, first: i64, last: i64) -> anyhow::Result<()> {
    let now = Utc::now();
    sqlx::query(
        "UPDATE proc_state SET backfill_at = NULL, backfill_next_at = $3 \
         WHERE msg_id BETWEEN $1 AND $2",
    )
    .bind(first)
    .bind(last)
    .bind(now)
    .execute(ctx.store.pool())
    .await
    .context("unconfirming the sample")?;
    let n = ctx.names;
    sqlx::query(&format!(
        "UPDATE {t} SET {s} = NULL, {p} = NULL WHERE {id} BETWEEN ? AND ?",
        t = n.table,
        s = n.status,
        p = n.processed,
        id = n.id
    ))
    .bind(first)
    .bind(last)
    .execute(ctx.inbox.pool())
    .await
    .context("unmarking the sample (bench database, as the DB owner)")?;
    Ok(())
}

/// One sweep with the calls `sweep_once` makes, each stage timed into `s`; false when nothing
/// was due.
pub(super) async fn sweep_timed(ctx: &Ctx<'_>, s: &mut Stages) -> anyhow::Result<bool> {
    let now = SystemClock.now();
    let t = Instant::now();
    let mut tx = ctx
        .store
        .begin_sweep(
            now,
            overdue_before(now, ctx.cfg.rules.overdue_after),
            ctx.cfg.batch,
        )
        .await?;
    s.select_lock += t.elapsed();
    let ids: Vec<i64> = tx.rows().iter().map(|r| r.msg_id).collect();
    if ids.is_empty() {
        tx.finish(&SweepWrite::default(), now).await?;
        return Ok(false);
    }
    let t = Instant::now();
    let found = ctx.inbox.mark_states(&ctx.cfg.marks, &ids).await?;
    s.check += t.elapsed();
    let checked = classify(&ids, found);
    let t = Instant::now();
    // As the sweep does: the UPDATE in an inbox transaction, the lock re-checked in
    // PostgreSQL, then the inbox COMMIT.
    let staged = ctx
        .inbox
        .stage_marks(
            &ctx.cfg.marks,
            &checked.to_mark,
            &ctx.cfg.mark_value,
            now,
            ctx.cfg.budget,
            ctx.cfg.avoid,
        )
        .await?;
    tx.held(&checked.to_mark).await?;
    let written = staged
        .commit(msgx_core::backfill::sweep::MARK_COMMIT_LIMIT)
        .await?;
    s.update += t.elapsed();
    anyhow::ensure!(
        written as usize == checked.to_mark.len(),
        "stage replay wrote {written} of {} marks",
        checked.to_mark.len()
    );
    let t = Instant::now();
    let write = SweepWrite {
        confirmed: ids.clone(),
        ..SweepWrite::default()
    };
    tx.finish(&write, now).await?;
    s.write_back += t.elapsed();
    let t = Instant::now();
    ctx.store.backfill_backlog().await?;
    s.backlog += t.elapsed();
    s.rows += ids.len() as u64;
    s.sweeps += 1;
    Ok(true)
}
