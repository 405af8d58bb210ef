//! The pipeline's rules: `[pipeline]` (discovery), `[processing]` (the pump), `[backfill]`
//! (marking the inbox) and `[late]` (late commits and the compensation scan).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{check_nonzero, check_retries, duration, invalid, SettingsError};

/// Pipeline rules.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSettings {
    /// Pause between poll rounds when the inbox is idle: empty rounds back off to it.
    #[serde(with = "duration")]
    pub poll_interval: Duration,
    /// Shortest gap between two round starts while rounds find rows (adaptive discovery):
    /// under traffic a row waits about this long for its round; ≤ `poll_interval`.
    #[serde(with = "duration")]
    pub min_poll_gap: Duration,
    /// Rows read per poll round (`LIMIT`).
    pub claim_batch: u32,
    /// While the rows read are not contiguous from W+1 (a hole), read up to this many pages of
    /// `claim_batch` rows per round, so holes further on are sighted — and age — side by side
    /// instead of one page at a time.
    pub hole_sight_ahead: u32,
    /// How long a hole may stay open before it is released as permanent (G7: a placeholder
    /// until the DB owner states the id-allocation → visibility bound).
    #[serde(with = "duration")]
    pub max_commit_delay: Duration,
    /// Explicit one-time cutover seeding: `min`, `zero`, `max` or an id; empty = none.
    /// Checked by [`Settings::cutover`](super::Settings::cutover).
    pub cutover_watermark: String,
    /// The approved plan the seeding must find: `"<W>:<token>"` as `cutover plan` prints it;
    /// empty = no check. Checked by [`Settings::cutover_expect`](super::Settings::cutover_expect).
    pub cutover_expect: String,
    /// Who approved the cutover, and the change ticket: written to the seeding's audit record.
    pub cutover_by: String,
    /// See `cutover_by`.
    pub cutover_ticket: String,
    /// Let the enqueue transaction commit without waiting for the WAL flush: a lost enqueue
    /// (and its W) is simply re-read, so it is safe; processing never does this.
    pub async_enqueue_commit: bool,
}

impl PipelineSettings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        check_nonzero(self.poll_interval, "pipeline.poll_interval")?;
        // Above zero (never a busy loop) and at most poll_interval.
        check_nonzero(self.min_poll_gap, "pipeline.min_poll_gap")?;
        if self.min_poll_gap > self.poll_interval {
            return Err(invalid(
                "pipeline.min_poll_gap",
                format!(
                    "{} is longer than pipeline.poll_interval {}",
                    humantime::format_duration(self.min_poll_gap),
                    humantime::format_duration(self.poll_interval)
                ),
            ));
        }
        check_nonzero(self.max_commit_delay, "pipeline.max_commit_delay")?;
        if self.claim_batch == 0 || self.claim_batch > 50_000 {
            return Err(invalid(
                "pipeline.claim_batch",
                format!("{} is outside 1..=50000", self.claim_batch),
            ));
        }
        if self.hole_sight_ahead == 0 || self.hole_sight_ahead > 1000 {
            return Err(invalid("pipeline.hole_sight_ahead", "outside 1..=1000"));
        }
        Ok(())
    }
}

/// Processing rules (SPEC §4).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessingSettings {
    /// A FAILED head older than this (from its first attempt) is poison → DEAD(EXHAUSTED).
    #[serde(with = "duration")]
    pub head_deadline: Duration,
    /// A head with this many attempts is poison.
    pub max_attempts: i32,
    /// First retry delay after a failure (doubles per attempt).
    #[serde(with = "duration")]
    pub retry_initial: Duration,
    /// Longest retry delay.
    #[serde(with = "duration")]
    pub retry_max: Duration,
    /// An unfinished message whose inbox row is missing is read again (FAILED, the retry
    /// backoff) until this long after its first attempt, before it is DEAD(MALFORMED): a row
    /// can be gone for a moment (a table rotation between its rename and its catch-up copy).
    /// Its last attempt, or one whose retry would fall past `head_deadline`, is DEAD(MALFORMED)
    /// too. `0s`: DEAD at the first missing read.
    #[serde(with = "duration")]
    pub missing_row_grace: Duration,
    /// A message larger than this is MALFORMED (and never transferred).
    pub max_message_bytes: u64,
    /// Add the send date to the business identity (Q11: SEQN may reset).
    pub identity_with_date: bool,
    /// FLOP subtypes the codec knows, comma-separated; others are UNSUPPORTED.
    pub flop_subtypes: String,
    /// Raw messages read from the inbox per round trip, ahead of the head (reads have no
    /// side effects).
    pub read_ahead: u32,
    /// How often the pump looks for work when nobody woke it (a safety net).
    #[serde(with = "duration")]
    pub idle_poll: Duration,
    /// Window of the processing rate behind `msgx_pipeline_estimated_drain_seconds` (G6).
    #[serde(with = "duration")]
    pub drain_rate_window: Duration,
    /// Most consecutive ready heads applied in one business transaction (group commit, one
    /// WAL flush per group); 1 turns grouping off.
    pub group_max: u32,
    /// A group takes no further member once it has run this long.
    #[serde(with = "duration")]
    pub group_max_wait: Duration,
}

impl ProcessingSettings {
    /// The FLOP subtypes as a list.
    pub fn flop_subtype_list(&self) -> Vec<String> {
        self.flop_subtypes
            .split(',')
            .map(|s| s.trim().to_ascii_uppercase())
            .filter(|s| !s.is_empty())
            .collect()
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        check_nonzero(self.head_deadline, "processing.head_deadline")?;
        check_retries(
            [
                "processing.retry_initial",
                "processing.retry_max",
                "processing.max_attempts",
            ],
            self.retry_initial,
            self.retry_max,
            self.max_attempts,
        )?;
        check_nonzero(self.idle_poll, "processing.idle_poll")?;
        if self.drain_rate_window < Duration::from_secs(10) {
            return Err(invalid(
                "processing.drain_rate_window",
                "shorter than 10s (the backlog is sampled every 5s)",
            ));
        }
        if self.max_message_bytes < 1024 {
            return Err(invalid("processing.max_message_bytes", "below 1024 bytes"));
        }
        if self.read_ahead == 0 || self.read_ahead > 1000 {
            return Err(invalid("processing.read_ahead", "outside 1..=1000"));
        }
        if self.flop_subtype_list().is_empty() {
            return Err(invalid("processing.flop_subtypes", "lists no subtype"));
        }
        if self.group_max == 0 || self.group_max > 1000 {
            return Err(invalid("processing.group_max", "outside 1..=1000"));
        }
        check_nonzero(self.group_max_wait, "processing.group_max_wait")
    }
}

/// How much shorter than `store.idle_in_transaction_timeout` the backfill's
/// `backfill.mark_budget` must be: time for the inbox COMMIT of the last marks and the
/// sweep's write-back after the budget is spent, before PostgreSQL could end the sweep's
/// transaction — and its row locks (G5) — for idleness.
pub const MARK_MARGIN: Duration = Duration::from_secs(2);

/// Backfill (SPEC §5, seed §5.2).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillSettings {
    /// Sweep schedule (a period, not a completion deadline).
    #[serde(with = "duration")]
    pub period: Duration,
    /// Rows per sweep batch (one UPDATE + one existence check per batch).
    pub batch: u32,
    /// The DB owner's "processed" status value written into the status mark column.
    pub mark_value: String,
    /// First retry delay after a transient failure (doubles).
    #[serde(with = "duration")]
    pub retry_initial: Duration,
    /// Longest retry delay.
    #[serde(with = "duration")]
    pub retry_max: Duration,
    /// Transient failures before the row is abandoned (MAX_ATTEMPTS) with an alert.
    pub max_attempts: i32,
    /// R: rows received longer ago than this are retried every sweep (overrides backoff).
    #[serde(with = "duration")]
    pub overdue_after: Duration,
    /// Wall time the inbox part of one sweep (existence check, marks) may take while the sweep
    /// holds its PostgreSQL row locks; at least [`MARK_MARGIN`] below
    /// `store.idle_in_transaction_timeout`.
    #[serde(with = "duration")]
    pub mark_budget: Duration,
    /// Mark with `FOR UPDATE SKIP LOCKED` where the server supports it (probed once), so a row
    /// another session holds is skipped, not waited for; off, or on a server without it,
    /// marks wait at most `lock_wait` per row lock and isolate the held rows by splitting.
    pub skip_locked: bool,
    /// The mark session's `innodb_lock_wait_timeout`: whole seconds, at least 1 s, at most a
    /// quarter of `mark_budget` (a held row costs one row, not the sweep's budget).
    #[serde(with = "duration")]
    pub lock_wait: Duration,
    /// A row held by another session longer than this is logged at ERROR with `alert = true`
    /// at each try (it is never abandoned for it).
    #[serde(with = "duration")]
    pub locked_alert_after: Duration,
}

impl BackfillSettings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        check_nonzero(self.period, "backfill.period")?;
        check_retries(
            [
                "backfill.retry_initial",
                "backfill.retry_max",
                "backfill.max_attempts",
            ],
            self.retry_initial,
            self.retry_max,
            self.max_attempts,
        )?;
        check_nonzero(self.overdue_after, "backfill.overdue_after")?;
        check_nonzero(self.mark_budget, "backfill.mark_budget")?;
        self.check_lock_wait()?;
        check_nonzero(self.locked_alert_after, "backfill.locked_alert_after")?;
        if self.batch == 0 || self.batch > 10_000 {
            return Err(invalid("backfill.batch", "outside 1..=10000"));
        }
        let mark = self.mark_value.trim();
        if mark.is_empty() || mark.len() > 32 {
            return Err(invalid(
                "backfill.mark_value",
                "must be 1..=32 characters (the DB owner's value)",
            ));
        }
        Ok(())
    }
}

impl BackfillSettings {
    /// `lock_wait`: whole seconds (the server's unit), ≥ 1 s (MySQL's minimum) and at most a
    /// quarter of `mark_budget`, so isolating one held row by halving still leaves budget for
    /// the rest of the batch.
    fn check_lock_wait(&self) -> Result<(), SettingsError> {
        let wait = self.lock_wait;
        if wait < Duration::from_secs(1) || wait.subsec_nanos() != 0 {
            return Err(invalid(
                "backfill.lock_wait",
                format!(
                    "{} is not a whole number of seconds ≥ 1s (innodb_lock_wait_timeout)",
                    humantime::format_duration(wait)
                ),
            ));
        }
        if wait.saturating_mul(4) > self.mark_budget {
            return Err(invalid(
                "backfill.lock_wait",
                format!(
                    "{} is more than a quarter of backfill.mark_budget = {}: a row the DB owner \
                     holds would spend the sweep's budget; lower backfill.lock_wait or raise \
                     backfill.mark_budget",
                    humantime::format_duration(wait),
                    humantime::format_duration(self.mark_budget)
                ),
            ));
        }
        Ok(())
    }
}

/// Late detection (SPEC §6).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LateSettings {
    /// How often watched ids are checked against the inbox.
    #[serde(with = "duration")]
    pub detect_period: Duration,
    /// How long a released id stays watched.
    #[serde(with = "duration")]
    pub watch_window: Duration,
    /// Ids checked per inbox round trip.
    pub batch: u32,
    /// Release holes early / hold them on transaction evidence from
    /// `information_schema.INNODB_TRX` (needs PROCESS; valid on the primary only;
    /// docs/hole-evidence.md).
    pub hole_evidence: bool,
    /// With evidence: hard cap for holding a hole while an older transaction is still open.
    #[serde(with = "duration")]
    pub hole_evidence_cap: Duration,
    /// Compensation scan (seed §5.1 stage 1): how many ids behind W are re-read for rows
    /// discovery never saw (id reuse after a table rotation, a restore); 0 = off.
    pub compensation_window: u64,
    /// How often the compensation scan runs.
    #[serde(with = "duration")]
    pub compensation_period: Duration,
}

impl LateSettings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        check_nonzero(self.detect_period, "late.detect_period")?;
        check_nonzero(self.watch_window, "late.watch_window")?;
        if self.batch == 0 || self.batch > 10_000 {
            return Err(invalid("late.batch", "outside 1..=10000"));
        }
        if self.compensation_window > 100_000_000 {
            return Err(invalid("late.compensation_window", "above 100000000 ids"));
        }
        check_nonzero(self.compensation_period, "late.compensation_period")
    }
}
