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

mod pace;
pub use pace::Pace;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::clock::Clock;
use crate::inbox::evidence::EvidenceError;
use crate::inbox::{Inbox, InboxError, InboxRow};
use crate::settings::{LateSettings, PipelineSettings};
use crate::store::{EnqueueRow, RoundWrite, Store, StoreError, StoredCursor};
use crate::telemetry;
use crate::watermark::{
    advance, check_holes, Advance, Cursor, Evidence, EvidenceDecision, Hole, HoleSetError, Round,
    TrxEvidence,
};

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

/// What a successful round did.
#[derive(Debug, Clone)]
pub struct PollReport {
    /// The cursor before the round.
    pub before: Cursor,
    /// The decision that was committed.
    pub advance: Advance,
    /// Rows read from the inbox.
    pub read: usize,
    /// Rows that were not yet in PROC_STATE.
    pub enqueued_new: u64,
    /// The batch was full: more rows are probably waiting, poll again at once.
    pub batch_full: bool,
    /// Head, lag, regression and the oldest hole's age, as the round's event shows them.
    pub sight: telemetry::InboxSight,
    /// Wall time the round took.
    pub duration: Duration,
    /// The transaction evidence the decision used for the hole at W+1; None when evidence is
    /// off, not needed (no hole seen before), or unavailable (the timer rule decided).
    pub hole_evidence: Option<Evidence>,
    /// With evidence on, this round took the sighting of a new hole at W+1 on the server
    /// clock: the next round can already decide it (a rollback is released at once), so it
    /// should not wait a poll interval.
    pub hole_sighted: bool,
    /// When the hole W waits at becomes due by the timer (from now), so the actor can poll
    /// right then instead of up to a poll interval later.
    pub next_due: Option<Duration>,
    /// Where the round's time went, recorded by the round itself (benches sum them).
    pub stages: PollStages,
}

/// Wall time of each stage of one round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStages {
    /// `Store::read_cursor`.
    pub read_cursor: Duration,
    /// The inbox read (ids and receive times above W; the pages read ahead included).
    pub read_rows: Duration,
    /// The decision (pure, plus the transaction evidence when on).
    pub decide: Duration,
    /// The enqueue transaction (rows + cursor), zero when nothing changed.
    pub commit: Duration,
    /// `Inbox::max_id` (after a full batch, or when nothing is above W).
    pub inbox_head: Duration,
}

impl PollStages {
    /// Adds another round's stages.
    pub fn add(&mut self, o: &PollStages) {
        self.read_cursor += o.read_cursor;
        self.read_rows += o.read_rows;
        self.decide += o.decide;
        self.commit += o.commit;
        self.inbox_head += o.inbox_head;
    }
}

impl PollReport {
    /// W moved this round.
    pub fn moved(&self) -> bool {
        self.advance.w != self.before.w
    }

    /// Poll again without waiting: more rows are there, a release made room, or a new hole
    /// can be decided on evidence (at most one such extra round per hole).
    pub fn poll_again_now(&self) -> bool {
        self.batch_full || !self.advance.released.is_empty() || self.hole_sighted
    }

    /// The round's telemetry event.
    pub fn event(&self) -> telemetry::PollRound {
        let a = &self.advance;
        let released = a
            .released
            .iter()
            .map(|r| {
                let decision = a
                    .evidence
                    .iter()
                    .find(|(first, _)| *first == r.first)
                    .map(|(_, d)| *d);
                telemetry::HoleReleased {
                    first: r.first,
                    last: r.last,
                    why: match decision {
                        Some(EvidenceDecision::ReleasedEarly) => telemetry::ReleaseWhy::RolledBack,
                        Some(EvidenceDecision::CapReached) => telemetry::ReleaseWhy::EvidenceCap,
                        _ => telemetry::ReleaseWhy::Timer,
                    },
                }
            })
            .collect();
        telemetry::PollRound {
            w: a.w,
            sight: self.sight,
            enqueued: self.enqueued_new,
            took: self.duration,
            holes_open: a.holes.len(),
            missing_ids: a.missing_ids(),
            waiting: a.open_hole.map(|h| telemetry::WaitingHole {
                first_missing: h.first_missing,
                next_present: h.next_present,
                age: h.age,
            }),
            fills: a.fills.clone(),
            released,
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
    let enqueued_new = if unchanged {
        0 // nothing to write: spare the store an empty transaction every round
    } else {
        store
            .commit_round(RoundWrite {
                expected_w: before.w,
                cursor: after,
                rows: &enqueue,
                now,
                async_commit: cfg.async_commit,
                holes: &decision.holes,
                released: &decision.released,
                watch_until: crate::clock::plus(now, cfg.watch_window),
            })
            .await?
    };
    report_evidence(decision);
    if !decision.dropped.is_empty() {
        let dropped: Vec<(i64, i64)> = decision.dropped.iter().map(|h| (h.first, h.last)).collect();
        telemetry::holes_dropped(before.w, &dropped);
    }
    Ok((after, enqueued_new))
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

/// The evidence rule (module docs). Every path that cannot get evidence is the timer rule.
async fn decide_with_evidence(
    inbox: &Inbox,
    w: i64,
    stored: &[Hole],
    (rows, complete): (Vec<InboxRow>, bool),
    now: DateTime<Utc>,
    cfg: PollConfig,
    ev: HoleEvidenceConfig,
) -> Result<Decided, PollError> {
    let any_sighted = stored.iter().any(|h| h.seen_db_at.is_some());
    let trx = match any_sighted {
        true => inbox.trx_snapshot().await.ok().map(|snap| TrxEvidence {
            read_at: snap.read_at,
            oldest_started: snap.oldest_started,
            cap: ev.cap,
        }),
        false => None,
    };
    let releasable = trx.is_some_and(|t| {
        stored
            .iter()
            .any(|h| t.about(h.seen_db_at) == Some(Evidence::NoOlderTransaction))
    });
    // Read again after the list: a commit that landed meanwhile is visible now.
    let (rows, complete) = if releasable {
        read_window(inbox, w, cfg).await?
    } else {
        (rows, complete)
    };
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let decision = advance(round(w, stored, &ids, complete, now, cfg, trx));
    let front = decision
        .open_hole
        .and_then(|o| decision.holes.iter().find(|h| h.first == o.first_missing));
    let evidence = match (trx, stored.first()) {
        (Some(t), Some(h)) if h.first == w + 1 => t.about(h.seen_db_at),
        _ => None,
    };
    Ok(Decided {
        rows,
        complete,
        sighted: front.is_some_and(|h| h.seen_db_at.is_none()),
        advance: decision,
        evidence,
    })
}

/// Gives every hole not yet sighted on the server clock the server's time now, read after
/// the rows (a sighting read before them could predate the transaction). On failure the holes
/// stay unsighted and are sighted again next round — later, which only ever counts more
/// transactions as older (safe).
async fn stamp_sightings(inbox: &Inbox, holes: &mut [Hole]) {
    if holes.iter().all(|h| h.seen_db_at.is_some()) {
        return;
    }
    match inbox.server_now().await {
        Ok(at) => {
            for h in holes.iter_mut().filter(|h| h.seen_db_at.is_none()) {
                h.seen_db_at = Some(at);
            }
        }
        Err(EvidenceError::Unavailable(reason)) => {
            tracing::debug!(%reason, "no server time for the hole sighting");
        }
        Err(e) => {
            tracing::warn!(error = %e, "reading the server time failed; the holes are sighted again next round");
        }
    }
}

/// The holes last announced as held past `max_commit_delay` (first id and sighting), so the
/// "held" decision is counted and logged once per hole, not every round. Logging only: no
/// decision depends on it.
static HELD_ANNOUNCED: Mutex<Vec<(i64, DateTime<Utc>)>> = Mutex::new(Vec::new());

fn report_evidence(decision: &Advance) {
    let mut held = HELD_ANNOUNCED.lock().unwrap_or_else(|p| p.into_inner());
    for &(first, d) in &decision.evidence {
        if d == EvidenceDecision::Held {
            let since = decision
                .holes
                .iter()
                .find(|h| h.first == first)
                .map_or(DateTime::<Utc>::MIN_UTC, |h| h.first_seen);
            if held.contains(&(first, since)) {
                continue;
            }
            held.push((first, since));
            if held.len() > 64 {
                held.remove(0);
            }
        }
        telemetry::hole_evidence(d.as_str(), first);
    }
}
