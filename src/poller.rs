//! One discovery round (SPEC §3): read the cursor and the open holes, read `id > W`, decide,
//! commit. The actor only decides when to call it again.
//!
//! With `late.hole_evidence` ([`PollConfig::hole_evidence`]) holes seen in an earlier round
//! are decided on the MySQL transaction list as well (docs/hole-evidence.md):
//! 1. at a hole's first sighting the server's time is read *after* the rows
//!    ([`Inbox::server_now`]) and stored with the hole (`inbox_hole.seen_db_at`);
//! 2. in later rounds the oldest open transaction is read ([`Inbox::trx_snapshot`], a list
//!    proven newer than the sightings); one that started at or before a hole's sighting means
//!    [`Evidence::OlderTransactionOpen`] for that hole (hold, up to the cap);
//! 3. a hole for which none is open has lost its transaction: the rows are read again *after*
//!    the list and decided with [`Evidence::NoOlderTransaction`] — a commit that landed in
//!    between is in that read and fills the hole; otherwise it is released early (a rollback).
//!
//! Without the privilege, or when a read fails, the round follows the timer rule.
//!
//! Every round also checks the inbox head against W: a head below W (or an empty table) whose
//! next `AUTO_INCREMENT` id is at or below W is an **id regression** — the inbox went backwards
//! (a table rotation without the `AUTO_INCREMENT` seed, a restore): counted, logged at ERROR,
//! never reported as "lag 0". Newest rows purged by the DB owner (the next id still above W)
//! are not.
//!
//! Files: this one runs the round (read, decide, commit, head); `poller/evidence.rs` the
//! evidence rule, `poller/report.rs` what a round reports, `poller/pace.rs` the actor's pace.

mod evidence;
mod pace;
mod report;
pub use pace::Pace;
pub use report::{PollReport, PollStages};

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::clock::Clock;
use crate::inbox::{Inbox, InboxError, InboxRow};
use crate::settings::{LateSettings, PipelineSettings};
use crate::store::{EnqueueRow, RoundWrite, Store, StoreError, StoredCursor};
use crate::telemetry;
use crate::watermark::{
    advance, check_holes, Advance, Cursor, Evidence, Hole, HoleSetError, Round, TrxEvidence,
};
use evidence::{decide_with_evidence, report_evidence, stamp_sightings};

/// Evidence-based hole release (`late.hole_evidence`); None = the plain timer rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoleEvidenceConfig {
    /// A hole held because an older transaction is still open is released (with an alert)
    /// once it is this old (`late.hole_evidence_cap`, ≥ `max_commit_delay`).
    pub cap: Duration,
}

/// Knobs of a round.
#[derive(Debug, Clone, Copy)]
pub struct PollConfig {
    /// Rows read per page.
    pub claim_batch: u32,
    /// Pages read per round at most while the rows are not contiguous from W+1
    /// (`pipeline.hole_sight_ahead`): holes further on are sighted now.
    pub sight_ahead: u32,
    /// Hole aging threshold.
    pub max_commit_delay: Duration,
    /// Enqueue commit without WAL flush wait.
    pub async_commit: bool,
    /// How long released hole ids stay watched for a late commit.
    pub watch_window: Duration,
    /// Decide holes on the inbox's transaction list too; None (the default) = timer rule.
    pub hole_evidence: Option<HoleEvidenceConfig>,
    /// `late.compensation_window`: how far below W the compensation scan re-reads. Only told
    /// in the id-regression log line (what a regressed inbox's reused ids can count on).
    pub compensation_window: u64,
    /// `pipeline.min_poll_gap`: the shortest gap between two round starts while rounds find
    /// rows (the actor's [`Pace`]; a round itself does not read it).
    pub min_gap: Duration,
    /// Read the inbox head (`MAX(id)`, one indexed statement) before the rows, and the rows
    /// only when the head is above W: a visible row above W exists exactly when it is. The
    /// poller asks for it after an empty round, so an idle inbox costs one statement a round.
    pub probe_head: bool,
}

impl PollConfig {
    /// The knobs as configured: `[pipeline]` for the round, `[late]` for what a released hole
    /// hands the watch (and the evidence rule). The actor adjusts `sight_ahead` and
    /// `probe_head` per round.
    pub fn from_settings(p: &PipelineSettings, late: &LateSettings) -> Self {
        Self {
            claim_batch: p.claim_batch,
            sight_ahead: p.hole_sight_ahead,
            max_commit_delay: p.max_commit_delay,
            async_commit: p.async_enqueue_commit,
            watch_window: late.watch_window,
            hole_evidence: late.hole_evidence.then_some(HoleEvidenceConfig {
                cap: late.hole_evidence_cap,
            }),
            compensation_window: late.compensation_window,
            min_gap: p.min_poll_gap,
            probe_head: false,
        }
    }
}

/// Why a round failed. In every case W stays where it was.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// Reading the cursor or committing the round failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The inbox could not be read: an infrastructure failure, never "no new rows".
    #[error("inbox: {0}")]
    Inbox(#[from] InboxError),
    /// The inbox returned ids that are not ascending and above W.
    #[error("inbox returned ids out of order after W={w}: {detail}")]
    Unordered { w: i64, detail: String },
    /// The stored hole set is corrupt (edited by hand, or a bug): W stays until an operator
    /// repairs it (`DELETE FROM inbox_hole` re-ages every open hole from now, which is safe).
    #[error("inbox_hole is corrupt, W={w} stays: {source}")]
    CorruptHoles {
        w: i64,
        #[source]
        source: HoleSetError,
    },
}

impl PollError {
    /// Stage label for metrics.
    pub fn stage(&self) -> &'static str {
        match self {
            Self::Store(_) => telemetry::POLL_STAGE_STORE,
            Self::Inbox(_) | Self::Unordered { .. } => telemetry::POLL_STAGE_INBOX,
            Self::CorruptHoles { .. } => telemetry::POLL_STAGE_HOLES,
        }
    }
}

/// Runs one round: read, decide, commit, then the inbox head (each stage timed in
/// [`PollStages`]).
pub async fn poll_once(
    inbox: &Inbox,
    store: &Store,
    clock: &dyn Clock,
    cfg: PollConfig,
) -> Result<PollReport, PollError> {
    let started = Instant::now();
    let mut stages = PollStages::default();
    let (stored, rows, complete, probed) = read_stage(inbox, store, cfg, &mut stages).await?;
    let before = stored.cursor;
    let now = clock.now();
    let t = Instant::now();
    let mut decided =
        decide_stage(inbox, before.w, &stored.holes, (rows, complete), now, cfg).await?;
    stages.decide = t.elapsed();
    let t = Instant::now();
    let (after, enqueued_new) = commit_stage(store, &stored, &decided, now, cfg).await?;
    stages.commit = t.elapsed();
    let batch_full = !decided.complete;
    let t = Instant::now();
    let (inbox_head, regressed) = head_stage(inbox, &decided, before.w, probed).await;
    stages.inbox_head = t.elapsed();
    let rows = std::mem::take(&mut decided.rows);
    let decision = decided.advance;
    let lag = match rows.get(decision.enqueue) {
        Some(waiting) => waiting
            .received_at
            .map(|t| (now - t).to_std().unwrap_or(Duration::ZERO)),
        None if !batch_full && !regressed => Some(Duration::ZERO),
        None => None,
    };
    Ok(PollReport {
        before,
        read: rows.len(),
        enqueued_new,
        batch_full,
        sight: telemetry::InboxSight {
            head: inbox_head,
            lag,
            regressed,
            compensation_window: cfg.compensation_window,
            oldest_hole_age: decision_age(after.hole_since, now),
        },
        duration: started.elapsed(),
        hole_evidence: decided.evidence,
        hole_sighted: decided.sighted,
        stages,
        next_due: decision
            .open_hole
            .map(|o| cfg.max_commit_delay.saturating_sub(o.age)),
        advance: decision,
    })
}

/// The cursor and its holes (checked), then the rows above W — with `probe_head`, only when
/// the inbox head is above W (the head read is returned for [`head_stage`]).
async fn read_stage(
    inbox: &Inbox,
    store: &Store,
    cfg: PollConfig,
    stages: &mut PollStages,
) -> Result<(StoredCursor, Vec<InboxRow>, bool, Option<Option<i64>>), PollError> {
    let t = Instant::now();
    let stored = store.read_cursor().await?;
    stages.read_cursor = t.elapsed();
    let w = stored.cursor.w;
    check_holes(w, &stored.holes).map_err(|source| PollError::CorruptHoles { w, source })?;
    let t = Instant::now();
    // A failed probe is no verdict: the rows are read as without it.
    let probed = match cfg.probe_head {
        true => inbox.max_id().await.ok(),
        false => None,
    };
    let (rows, complete) = match probed {
        Some(head) if head.is_none_or(|h| h <= w) => (Vec::new(), true),
        _ => read_window(inbox, w, cfg).await?,
    };
    stages.read_rows = t.elapsed();
    Ok((stored, rows, complete, probed))
}

/// The decision: the timer rule, or the evidence rule when on — then every hole not yet
/// sighted on the server clock gets its sighting, wherever it lies (a hole further on, seen
/// while W waits at an older one, is decided on its own sighting).
async fn decide_stage(
    inbox: &Inbox,
    w: i64,
    holes: &[Hole],
    (rows, complete): (Vec<InboxRow>, bool),
    now: DateTime<Utc>,
    cfg: PollConfig,
) -> Result<Decided, PollError> {
    let Some(ev) = cfg.hole_evidence else {
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        return Ok(Decided {
            advance: advance(round(w, holes, &ids, complete, now, cfg, None)),
            rows,
            complete,
            evidence: None,
            sighted: false,
        });
    };
    let mut decided = decide_with_evidence(inbox, w, holes, (rows, complete), now, cfg, ev).await?;
    stamp_sightings(inbox, &mut decided.advance.holes).await;
    Ok(decided)
}

/// The enqueue transaction (rows ≤ the new W, cursor, holes, releases); skipped when nothing
/// changed. Returns the new cursor and how many rows were new to PROC_STATE.
async fn commit_stage(
    store: &Store,
    stored: &StoredCursor,
    decided: &Decided,
    now: DateTime<Utc>,
    cfg: PollConfig,
) -> Result<(Cursor, u64), PollError> {
    let decision = &decided.advance;
    let before = stored.cursor;
    let enqueue: Vec<EnqueueRow> = decided.rows[..decision.enqueue]
        .iter()
        .map(|r| EnqueueRow {
            msg_id: r.id,
            received_at: r.received_at,
        })
        .collect();
    let after = Cursor {
        w: decision.w,
        hole_since: decision.hole_since,
    };
    let unchanged = enqueue.is_empty() && after == before && decision.holes == stored.holes;
    let traces = crate::traces::active();
    let enqueued_new = if unchanged {
        0 // nothing to write: spare the store an empty transaction every round
    } else {
        let round = RoundWrite {
            expected_w: before.w,
            cursor: after,
            rows: &enqueue,
            now,
            async_commit: cfg.async_commit,
            holes: &decision.holes,
            released: &decision.released,
            watch_until: crate::clock::plus(now, cfg.watch_window),
        };
        let (n, new) = store.commit_round_with(round, traces.is_some()).await?;
        if let Some(t) = traces {
            trace_discovery(t, &enqueue, &new, &stored.holes, after.w, now);
        }
        n
    };
    report_evidence(decision);
    if !decision.dropped.is_empty() {
        let dropped: Vec<(i64, i64)> = decision.dropped.iter().map(|h| (h.first, h.last)).collect();
        telemetry::holes_dropped(before.w, &dropped);
    }
    Ok((after, enqueued_new))
}

/// The first spans of the messages this round enqueued (the inbox commit, back-dated, and
/// their discovery), with the hole each waited behind: a hole stored before the round, below
/// the row. `new`: the ids that were new to PROC_STATE (ascending, as enqueued).
fn trace_discovery(
    t: &crate::traces::Traces,
    enqueued: &[EnqueueRow],
    new: &[i64],
    holes_before: &[crate::watermark::Hole],
    w: i64,
    now: DateTime<Utc>,
) {
    for row in enqueued
        .iter()
        .filter(|r| new.binary_search(&r.msg_id).is_ok())
    {
        let trace = t.message(row.msg_id, None, None);
        t.inbox_commit(row.msg_id, &trace, row.received_at.unwrap_or(now), "POLL");
        let hole = holes_before
            .iter()
            .filter(|h| h.last < row.msg_id)
            .min_by_key(|h| h.first_seen)
            .map(|h| crate::traces::HoleWaited {
                first: h.first,
                last: h.last,
                first_seen: h.first_seen,
            });
        t.discovered(&crate::traces::Discovered {
            msg_id: row.msg_id,
            received_at: row.received_at,
            enqueued_at: now,
            watermark: w,
            hole,
            round: None,
        });
    }
}

/// The head: the last row read, or — when nothing is above W, or the batch was full — the
/// inbox's own MAX(id), so an inbox that went backwards is seen (never "lag 0" with the head
/// below W; `probed`: the head [`read_stage`] read already). Also whether it regressed.
async fn head_stage(
    inbox: &Inbox,
    decided: &Decided,
    w_before: i64,
    probed: Option<Option<i64>>,
) -> (Option<i64>, bool) {
    let w = decided.advance.w;
    let inbox_head = match (decided.rows.last(), decided.complete) {
        // The probe read the head just before the rows: the later of the two is as fresh as a
        // second read (rows committed in between are above the probe, so take the max).
        (last, false) if matches!(probed, Some(Some(_))) => {
            probed.flatten().max(last.map(|r| r.id))
        }
        (_, false) => inbox.max_id().await.ok().flatten(),
        (Some(last), true) => Some(last.id),
        (None, true) if probed.is_some() => probed.flatten(),
        (None, true) => match inbox.max_id().await {
            Ok(head) => head,
            Err(e) => {
                tracing::warn!(error = %e, watermark = w_before, "reading the inbox head failed");
                None
            }
        },
    };
    // A head below W (or an empty table) is a regression only when the table will hand out
    // ids W already passed: the DB owner purging the newest rows is not one.
    let regressed = match inbox_head {
        Some(head) if head >= w => false,
        head => match inbox.next_auto_increment().await {
            Ok(Some(next)) => next <= w,
            Ok(None) => head.is_some(),
            Err(e) => {
                tracing::warn!(error = %e, watermark = w, "reading the inbox AUTO_INCREMENT failed");
                head.is_some()
            }
        },
    };
    (inbox_head, regressed)
}

fn decision_age(since: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<Duration> {
    since.map(|s| (now - s).to_std().unwrap_or(Duration::ZERO))
}

fn round<'a>(
    w: i64,
    holes: &'a [Hole],
    ids: &'a [i64],
    complete: bool,
    now: DateTime<Utc>,
    cfg: PollConfig,
    evidence: Option<TrxEvidence>,
) -> Round<'a> {
    Round {
        w,
        holes,
        ids,
        complete,
        now,
        max_commit_delay: cfg.max_commit_delay,
        evidence,
    }
}

/// The rows a round decides on: one page of `claim_batch` rows above W, and — while the rows
/// read are not contiguous from W+1 (W will wait at a hole) — further pages, up to
/// `sight_ahead`, so the holes beyond are sighted now. Also whether that is every row above W.
async fn read_window(
    inbox: &Inbox,
    w: i64,
    cfg: PollConfig,
) -> Result<(Vec<InboxRow>, bool), PollError> {
    let page = cfg.claim_batch.max(1) as usize;
    let mut rows = read_rows(inbox, w, cfg.claim_batch).await?;
    let mut pages = 1;
    let gap = |rows: &[InboxRow]| rows.last().is_some_and(|r| r.id != w + rows.len() as i64);
    while rows.len() == pages * page && pages < cfg.sight_ahead as usize && gap(&rows) {
        let after = rows.last().map_or(w, |r| r.id);
        rows.extend(read_rows(inbox, after, cfg.claim_batch).await?);
        pages += 1;
    }
    let complete = rows.len() < pages * page;
    Ok((rows, complete))
}

/// `id > w`, checked to be ascending and above W.
async fn read_rows(inbox: &Inbox, w: i64, limit: u32) -> Result<Vec<InboxRow>, PollError> {
    let rows = inbox.rows_after(w, limit).await?;
    if let Some((bad, prev)) = rows
        .iter()
        .map(|r| r.id)
        .zip(std::iter::once(w).chain(rows.iter().map(|r| r.id)))
        .find(|(id, prev)| id <= prev)
    {
        return Err(PollError::Unordered {
            w,
            detail: format!("{bad} after {prev}"),
        });
    }
    Ok(rows)
}

/// A round's decision with the rows it was taken on.
struct Decided {
    /// The rows the decision is about (re-read after the transaction list, if it was read).
    rows: Vec<InboxRow>,
    advance: Advance,
    /// The evidence about the hole at W+1, if it was used.
    evidence: Option<Evidence>,
    /// A new hole at W+1 is to be sighted on the server clock this round.
    sighted: bool,
    /// `rows` are every row above W.
    complete: bool,
}
