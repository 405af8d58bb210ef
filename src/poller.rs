//! One discovery round (SPEC §3): read the cursor, read `id > W`, decide, commit. The actor
//! only decides when to call it again.
//!
//! With `late.hole_evidence` ([`PollConfig::hole_evidence`]) a hole seen in an earlier round is
//! decided on the MySQL transaction list as well (docs/hole-evidence.md):
//! 1. at a hole's first sighting the server's time is read *after* the rows
//!    ([`Inbox::server_now`]) and stored as `HOLE_SEEN_DB_AT` with `HOLE_SINCE`;
//! 2. in later rounds the oldest open transaction is read ([`Inbox::trx_snapshot`], a list
//!    proven newer than the sighting); one that started at or before the sighting means
//!    [`Evidence::OlderTransactionOpen`] (hold, up to the cap);
//! 3. none means the id's transaction has ended: the rows are read again *after* the list
//!    and decided with [`Evidence::NoOlderTransaction`] — a commit that landed in between is
//!    in that read and fills the hole; otherwise the hole is released early (a rollback).
//!
//! Without the privilege, or when a read fails, the round follows the timer rule.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::NaiveDateTime;

use crate::clock::Clock;
use crate::inbox::evidence::EvidenceError;
use crate::inbox::{Inbox, InboxError, InboxRow};
use crate::store::{EnqueueRow, RoundWrite, Store, StoreError};
use crate::telemetry;
use crate::watermark::{
    advance, advance_with, Advance, Cursor, Evidence, EvidenceDecision, HoleEvidence,
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
    /// Rows read per round.
    pub claim_batch: u32,
    /// Hole aging threshold.
    pub max_commit_delay: Duration,
    /// Enqueue commit without WAL flush wait.
    pub async_commit: bool,
    /// How long released hole ids stay watched for a late commit.
    pub watch_window: Duration,
    /// Decide holes on the inbox's transaction list too; None (the default) = timer rule.
    pub hole_evidence: Option<HoleEvidenceConfig>,
}

impl Default for PollConfig {
    /// The shipped defaults (`config/default.toml`): 1000 rows, 5 min, asynchronous enqueue
    /// commit, 7 days of late watch, no transaction evidence.
    fn default() -> Self {
        Self {
            claim_batch: 1000,
            max_commit_delay: Duration::from_secs(300),
            async_commit: true,
            watch_window: Duration::from_secs(7 * 24 * 3600),
            hole_evidence: None,
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
    /// Highest inbox id known after the round (None when unknown).
    pub inbox_head: Option<i64>,
    /// Age of the oldest row left behind W (zero when caught up; None when unknown).
    pub lag: Option<Duration>,
    /// Wall time the round took.
    pub duration: Duration,
    /// The transaction evidence the decision used; None when evidence is off, not needed
    /// (no hole seen before), or unavailable (the timer rule decided).
    pub hole_evidence: Option<Evidence>,
    /// With evidence on, this round took a new hole's sighting on the server clock: the
    /// next round can already decide it (a rollback is released at once), so it should not
    /// wait a poll interval.
    pub hole_sighted: bool,
    /// Where the round's time went, recorded by the round itself (benches sum them).
    pub stages: PollStages,
}

/// Wall time of each stage of one round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStages {
    /// `Store::read_cursor`.
    pub read_cursor: Duration,
    /// The inbox read (ids and receive times above W).
    pub read_rows: Duration,
    /// The decision (pure, plus the transaction evidence when on).
    pub decide: Duration,
    /// The enqueue transaction (rows + cursor), zero when nothing changed.
    pub commit: Duration,
    /// `Inbox::max_id` after a full batch.
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
        self.batch_full || self.advance.released.is_some() || self.hole_sighted
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
}

impl PollError {
    /// Stage label for metrics.
    pub fn stage(&self) -> &'static str {
        match self {
            Self::Store(_) => "store",
            Self::Inbox(_) | Self::Unordered { .. } => "inbox",
        }
    }
}

/// Runs one round.
pub async fn poll_once(
    inbox: &Inbox,
    store: &Store,
    clock: &dyn Clock,
    cfg: PollConfig,
) -> Result<PollReport, PollError> {
    let started = Instant::now();
    let mut stages = PollStages::default();
    let stored = store.read_cursor().await?;
    stages.read_cursor = started.elapsed();
    let before = stored.cursor;
    let t = Instant::now();
    let rows = read_rows(inbox, before.w, cfg.claim_batch).await?;
    stages.read_rows = t.elapsed();
    let t = Instant::now();
    let now = clock.now();
    let Decided {
        rows,
        advance: decision,
        seen_db_at,
        evidence,
        sighted,
    } = match cfg.hole_evidence {
        None => {
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            Decided {
                advance: advance(before, &ids, now, cfg.max_commit_delay),
                rows,
                seen_db_at: None,
                evidence: None,
                sighted: false,
            }
        }
        Some(ev) => {
            decide_with_evidence(inbox, before, stored.hole_seen_db_at, rows, now, cfg, ev).await?
        }
    };
    stages.decide = t.elapsed();
    let batch_full = rows.len() as u64 >= u64::from(cfg.claim_batch);

    let enqueue: Vec<EnqueueRow> = rows[..decision.enqueue]
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
    let unchanged = enqueue.is_empty() && after == before && seen_db_at == stored.hole_seen_db_at;
    let t = Instant::now();
    let enqueued_new = if unchanged {
        0 // nothing to write: spare the store an empty transaction every second
    } else {
        store
            .commit_round_seen(
                RoundWrite {
                    expected_w: before.w,
                    cursor: after,
                    rows: &enqueue,
                    now,
                    async_commit: cfg.async_commit,
                    released: decision.released.map(|r| {
                        let window = chrono::Duration::from_std(cfg.watch_window)
                            .unwrap_or(chrono::Duration::MAX);
                        (r.ids(), now + window)
                    }),
                },
                seen_db_at,
            )
            .await?
    };
    stages.commit = t.elapsed();
    report_evidence(&decision, before, seen_db_at);

    let t = Instant::now();
    let inbox_head = match (rows.last(), batch_full) {
        (_, true) => inbox.max_id().await.ok().flatten(),
        (Some(last), false) => Some(last.id),
        (None, false) => Some(before.w),
    };
    stages.inbox_head = t.elapsed();
    let lag = match rows.get(decision.enqueue) {
        Some(waiting) => waiting
            .received_at
            .map(|t| (now - t).to_std().unwrap_or(Duration::ZERO)),
        None if !batch_full => Some(Duration::ZERO),
        None => None,
    };
    Ok(PollReport {
        before,
        advance: decision,
        read: rows.len(),
        enqueued_new,
        batch_full,
        inbox_head,
        lag,
        duration: started.elapsed(),
        hole_evidence: evidence,
        hole_sighted: sighted,
        stages,
    })
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
    /// HOLE_SEEN_DB_AT to write.
    seen_db_at: Option<NaiveDateTime>,
    /// The evidence used.
    evidence: Option<Evidence>,
    /// A new sighting was taken this round.
    sighted: bool,
}

/// The evidence rule (module docs). Every path that cannot get evidence is the timer rule.
async fn decide_with_evidence(
    inbox: &Inbox,
    before: Cursor,
    stored_seen: Option<NaiveDateTime>,
    rows: Vec<InboxRow>,
    now: chrono::DateTime<chrono::Utc>,
    cfg: PollConfig,
    ev: HoleEvidenceConfig,
) -> Result<Decided, PollError> {
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    // The same hole at W+1 as in an earlier round (the only case evidence decides).
    let continuing =
        before.hole_since.is_some() && ids.first().is_some_and(|first| *first > before.w + 1);
    let seen = stored_seen.filter(|_| continuing);
    let snapshot = match seen {
        Some(_) => inbox.trx_snapshot().await.ok(),
        None => None,
    };
    let evidence = match (seen, snapshot) {
        // A server clock that stepped back since the sighting proves nothing.
        (Some(seen), Some(snap)) if snap.read_at >= seen => Some(
            if snap.oldest_started.is_some_and(|started| started <= seen) {
                Evidence::OlderTransactionOpen
            } else {
                Evidence::NoOlderTransaction
            },
        ),
        _ => None,
    };
    let (rows, ids) = if evidence == Some(Evidence::NoOlderTransaction) {
        // Read again after the list: a commit that landed meanwhile is visible now.
        let rows = read_rows(inbox, before.w, cfg.claim_batch).await?;
        let ids = rows.iter().map(|r| r.id).collect();
        (rows, ids)
    } else {
        (rows, ids)
    };
    let decision = advance_with(
        before,
        &ids,
        now,
        cfg.max_commit_delay,
        evidence.map(|seen| HoleEvidence { seen, cap: ev.cap }),
    );
    let mut sighted = false;
    let seen_db_at = match decision.hole_since {
        None => None,
        // Still the hole that was sighted: keep its sighting.
        Some(_)
            if decision.w == before.w
                && decision.hole_since == before.hole_since
                && seen.is_some() =>
        {
            seen
        }
        // A new hole, or one sighted before the evidence was on: the server's time now,
        // read after the rows (a sighting read before them could predate the transaction).
        Some(_) => match inbox.server_now().await {
            Ok(at) => {
                sighted = true;
                Some(at)
            }
            Err(EvidenceError::Unavailable(reason)) => {
                tracing::debug!(%reason, "no server time for the hole sighting");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the server time failed; the hole is sighted again next round");
                None
            }
        },
    };
    Ok(Decided {
        rows,
        advance: decision,
        seen_db_at,
        evidence,
        sighted,
    })
}

/// The last hole announced as held past `max_commit_delay` (its W+1 and sighting), so the
/// "held" decision is counted and logged once per hole, not every round. Logging only: no
/// decision depends on it.
static HELD_ANNOUNCED: Mutex<Option<(i64, Option<NaiveDateTime>)>> = Mutex::new(None);

fn report_evidence(decision: &Advance, before: Cursor, seen: Option<NaiveDateTime>) {
    let Some(d) = decision.evidence else {
        return;
    };
    let first_missing = before.w + 1;
    if d == EvidenceDecision::Held {
        let key = Some((first_missing, seen));
        let mut last = HELD_ANNOUNCED.lock().unwrap_or_else(|p| p.into_inner());
        if *last == key {
            return;
        }
        *last = key;
    }
    telemetry::hole_evidence(d.as_str(), first_missing);
}
