//! Phase 5 of `msgx-bench mark`: terminal rows appear at `--steady-rate` while the real
//! `BackfillSweeper` actor runs in its own arbiter (on its period alone, or woken per row); the
//! oldest unmarked age is sampled and the per-row lag read back. The steady stage, apart from
//! the backlog.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use anyhow::Context as _;
use chrono::Utc;
use msgx_actors::backfill_sweeper::{BackfillSweeper, DEFAULT_WAKE_GAP};
use msgx_actors::messages::TerminalCommitted;
use msgx_core::clock::{SharedClock, SystemClock};
use msgx_core::store::Store;

use super::{insert_terminal, Ctx};

/// One steady run.
pub(super) struct Steady {
    pub(super) woken: bool,
    pub(super) wake_gap: Duration,
    pub(super) period: Duration,
    pub(super) rows: u64,
    pub(super) duration: Duration,
    /// Oldest unmarked age, sampled every 250 ms, ascending.
    pub(super) oldest: Vec<Duration>,
    pub(super) oldest_max: Duration,
    /// `BACKFILL_AT − TERMINAL_AT` of the rows marked, ascending.
    pub(super) lag: Vec<Duration>,
    /// Rows still unmarked when the run ended.
    pub(super) unmarked_at_end: i64,
}

impl Steady {
    pub(super) fn label(&self) -> String {
        if self.woken {
            format!(
                "woken per row, gap {}",
                humantime::format_duration(self.wake_gap)
            )
        } else {
            format!("period {} only", humantime::format_duration(self.period))
        }
    }
}

/// Phase 5: terminal rows `first..` appear at `steady_rate`/s for `steady` while the real
/// actor sweeps (in its own arbiter).
pub(super) async fn steady_phase(
    ctx: &Ctx<'_>,
    first: i64,
    rows: u64,
    woken: bool,
) -> anyhow::Result<Steady> {
    let clock: SharedClock = Arc::new(SystemClock);
    let arbiter = actix::Arbiter::new();
    let sweeper = BackfillSweeper::new(
        ctx.inbox.clone(),
        ctx.store.clone(),
        clock.clone(),
        ctx.cfg.clone(),
        ctx.period,
    )
    .with_wake_gap(DEFAULT_WAKE_GAP);
    let addr = BackfillSweeper::start_in_arbiter(&arbiter.handle(), |_| sweeper);
    // Let the first sweep (at start, nothing due) pass.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_oldest_sampler(ctx.store.clone(), stop.clone());
    let end = first + i64::try_from(rows)?;
    let duration = offer_terminal(ctx, &addr, first, end, woken).await?;
    stop.store(true, Ordering::SeqCst);
    let mut oldest = sampler.await.context("sampler")?;
    arbiter.stop();
    drop(addr);
    oldest.sort_unstable();
    let oldest_max = oldest.last().copied().unwrap_or_default();
    let (lag, unmarked_at_end) = marked_lag(ctx, first, end).await?;
    Ok(Steady {
        woken,
        wake_gap: DEFAULT_WAKE_GAP,
        period: ctx.period,
        rows,
        duration,
        oldest,
        oldest_max,
        lag,
        unmarked_at_end,
    })
}

/// The oldest unmarked age every 250 ms until `stop`.
pub(super) fn spawn_oldest_sampler(
    store: Store,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Duration>> {
    actix_rt::spawn(async move {
        let mut samples = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if let Ok(b) = store.backfill_backlog().await {
                let age = b
                    .oldest
                    .and_then(|t| (Utc::now() - t).to_std().ok())
                    .unwrap_or_default();
                samples.push(age);
            }
        }
        samples
    })
}

/// Rows `first..end` become terminal at `steady_rate`/s (waking the sweeper per row when
/// `woken`); returns how long that took.
pub(super) async fn offer_terminal(
    ctx: &Ctx<'_>,
    addr: &actix::Addr<BackfillSweeper>,
    first: i64,
    end: i64,
    woken: bool,
) -> anyhow::Result<Duration> {
    // 100 ms ticks of rate/10 rows each, on the wall clock (no drift).
    let per_tick = (ctx.args.steady_rate / 10).max(1);
    let started = Instant::now();
    let mut next = first;
    let mut tick = 0u32;
    while next < end {
        let due = started + Duration::from_millis(100) * tick;
        tokio::time::sleep_until(due.into()).await;
        let last = (next + i64::try_from(per_tick)? - 1).min(end - 1);
        insert_terminal(ctx.store, (next, last), Utc::now(), false).await?;
        if woken {
            for id in next..=last {
                addr.do_send(TerminalCommitted { msg_id: id });
            }
        }
        next = last + 1;
        tick += 1;
    }
    Ok(started.elapsed())
}

/// `BACKFILL_AT − TERMINAL_AT` of the rows `first..end` marked (ascending), and how many are
/// still unmarked.
pub(super) async fn marked_lag(
    ctx: &Ctx<'_>,
    first: i64,
    end: i64,
) -> anyhow::Result<(Vec<Duration>, i64)> {
    let lag_ms: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (backfill_at - terminal_at))::float8 * 1000 \
         FROM proc_state WHERE msg_id >= $1 AND msg_id < $2 AND backfill_at IS NOT NULL",
    )
    .bind(first)
    .bind(end)
    .fetch_all(ctx.store.pool())
    .await
    .context("reading the per-row lag")?;
    let mut lag: Vec<Duration> = lag_ms
        .into_iter()
        .map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0))
        .collect();
    lag.sort_unstable();
    let unmarked_at_end: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM proc_state WHERE msg_id >= $1 AND msg_id < $2 AND backfill_at IS NULL",
    )
    .bind(first)
    .bind(end)
    .fetch_one(ctx.store.pool())
    .await
    .context("counting unmarked rows")?;
    Ok((lag, unmarked_at_end))
}
