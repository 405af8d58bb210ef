//! Members that write on their own inside the group's transaction: business work with a
//! load of its own (a `LATE` row, applied with the ordering guard), a business duplicate
//! (SKIPPED), a terminal state without business work (DEAD), or FAILED with its backoff
//! (charged, or not when a store outage kept its raw text from us).

use super::read_ahead::Prepared;
use super::route::type_label;
use super::{Member, PumpCore};
use crate::codec::DecodedMessage;
use crate::flight::{self, GuardedPlan, Refused};
use crate::pump::outcome::{ErrorClass, Outcome, SingleTerminal};
use crate::pump::rules::backoff;
use crate::pump::stages::Stage;
use crate::rows::Source;
use crate::store::batch::TerminalWrite;
use crate::store::{BusinessResult, GroupTx, StoreError};
use crate::telemetry;

/// Writes a member's terminal row on its own (one statement, `GroupTx::finish_single`).
pub(super) async fn write_terminal(
    tx: &mut GroupTx,
    row: TerminalWrite,
) -> Result<Outcome, StoreError> {
    tx.finish_single(
        row.msg_id,
        row.state,
        row.class,
        &row.detail,
        row.msg_type.as_deref(),
        row.now,
    )
    .await?;
    Ok(terminal_outcome(row))
}

/// The outcome a terminal row records.
pub(super) fn terminal_outcome(row: TerminalWrite) -> Outcome {
    match row.state {
        SingleTerminal::Dead => Outcome::Dead {
            class: row.class,
            detail: row.detail,
        },
        SingleTerminal::Skipped => Outcome::Skipped {
            reason: row.class,
            detail: row.detail,
        },
    }
}

impl PumpCore {
    /// A member that writes on its own inside the group transaction (DEAD, FAILED, or the
    /// business work with a load of its own: `LATE` rows are applied with the ordering
    /// guard); returns how it ended (written, not yet committed).
    pub(super) async fn member(
        &mut self,
        tx: &mut GroupTx,
        m: &Member,
        prepared: Prepared,
    ) -> Result<Outcome, StoreError> {
        let msg_id = m.row.head.msg_id;
        let msg = match prepared {
            Prepared::Dead(class, detail) => {
                return write_terminal(tx, self.dead_row(msg_id, class, detail)).await
            }
            Prepared::Fail(class, detail) => {
                return self.fail(tx, msg_id, m.attempts, class, detail).await
            }
            Prepared::Outage(detail) => return self.outage(tx, m, detail).await,
            Prepared::Decoded(msg) => msg,
        };
        let msg_type = type_label(&msg);
        let key = msg.identity_key(self.cfg.identity_with_date, self.cfg.tz);
        let timer = self.stages.time(Stage::Savepoint);
        tx.savepoint().await?;
        drop(timer);
        let timer = self.stages.time(Stage::Business);
        let result = self
            .business(tx, msg_id, &msg, &msg_type, &key, m.row.source)
            .await;
        drop(timer);
        match result {
            Ok(BusinessResult::Committed { changes, events }) => {
                Ok(Outcome::Succeeded { changes, events })
            }
            Ok(BusinessResult::NotUnfinished) => Ok(Outcome::FinishedElsewhere),
            Ok(BusinessResult::Duplicate { holder }) => {
                self.duplicate(tx, msg_id, holder, &msg_type, &key).await
            }
            // Back to the savepoint: retry later, nothing partial of this message remains.
            Err(e) => {
                tx.rollback_message().await?;
                self.fail(tx, msg_id, m.attempts, ErrorClass::Infra, e.to_string())
                    .await
            }
        }
    }

    async fn business(
        &mut self,
        tx: &mut GroupTx,
        msg_id: i64,
        msg: &DecodedMessage,
        msg_type: &str,
        identity: &str,
        source: Source,
    ) -> Result<BusinessResult, StoreError> {
        let load = flight::flights_to_load(msg);
        let now = self.clock.now();
        if source.is_late() {
            // Out of id order by design: newer messages were applied first; the guard keeps
            // what they wrote and the refusals are recorded on the row.
            let (result, refused) = tx
                .business(
                    msg_id,
                    msg_type,
                    &load,
                    identity,
                    true,
                    |current, tombstones| flight::plan_guarded(msg, msg_id, current, tombstones),
                    now,
                )
                .await?;
            if !refused.is_empty() {
                let labels = refused.labels();
                let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
                telemetry::late_stale_fields(msg_id, &labels);
            }
            Ok(result)
        } else {
            let (result, _) = tx
                .business(
                    msg_id,
                    msg_type,
                    &load,
                    identity,
                    false,
                    |current, _| GuardedPlan {
                        plan: flight::plan(msg, msg_id, current),
                        refused: Refused::default(),
                    },
                    now,
                )
                .await?;
            Ok(result)
        }
    }

    /// A business duplicate: SKIPPED(DUPLICATE), naming the holder of its identity.
    pub(super) async fn duplicate(
        &mut self,
        tx: &mut GroupTx,
        msg_id: i64,
        holder: i64,
        msg_type: &str,
        key: &str,
    ) -> Result<Outcome, StoreError> {
        let row = self.duplicate_row(msg_id, holder, msg_type, key);
        write_terminal(tx, row).await
    }

    /// A business duplicate's row: SKIPPED(DUPLICATE), naming the holder of its identity.
    pub(super) fn duplicate_row(
        &self,
        msg_id: i64,
        holder: i64,
        msg_type: &str,
        key: &str,
    ) -> TerminalWrite {
        TerminalWrite {
            msg_id,
            state: SingleTerminal::Skipped,
            class: ErrorClass::Duplicate,
            detail: format!("identity {key} already bound to message {holder}"),
            msg_type: Some(msg_type.to_string()),
            now: self.clock.now(),
        }
    }

    /// A DEAD member's row (no business work: malformed, missing text).
    pub(super) fn dead_row(&self, msg_id: i64, class: ErrorClass, detail: String) -> TerminalWrite {
        TerminalWrite {
            msg_id,
            state: SingleTerminal::Dead,
            class,
            detail,
            msg_type: None,
            now: self.clock.now(),
        }
    }

    pub(super) async fn fail(
        &mut self,
        tx: &mut GroupTx,
        msg_id: i64,
        attempts: i32,
        class: ErrorClass,
        detail: String,
    ) -> Result<Outcome, StoreError> {
        self.forget_texts();
        let now = self.clock.now();
        let delay = backoff(attempts, &self.cfg.rules);
        let next = crate::clock::plus(now, delay);
        tx.mark_failed(msg_id, class, &detail, next, now).await?;
        Ok(Outcome::Failed {
            class,
            detail,
            next_attempt_at: next,
        })
    }
}

impl PumpCore {
    /// The head's raw text could not be read because a store is out (SPEC §4: FAILED(INFRA)
    /// with backoff). The failure is not the message's: its attempt is not charged and its
    /// head deadline does not age while the store is out (`processing_started_at` cleared:
    /// it starts again at the next attempt). Counting either would poison good heads one after
    /// another during an outage — the next head fails the same way, so nothing is unblocked —
    /// while `head_deadline` exists to unblock the FIFO from a message that fails by itself.
    /// The backoff doubles per outage failure in a row (kept here: it belongs to the outage,
    /// not to the row).
    pub(super) async fn outage(
        &mut self,
        tx: &mut GroupTx,
        m: &Member,
        detail: String,
    ) -> Result<Outcome, StoreError> {
        self.forget_texts();
        self.outages = self.outages.saturating_add(1);
        let now = self.clock.now();
        let next = crate::clock::plus(now, backoff(self.outages, &self.cfg.rules));
        let head = m.row.head;
        tx.mark_failed_uncharged(head.msg_id, &detail, next, now, head.attempts)
            .await?;
        tracing::warn!(
            msg_id = head.msg_id,
            attempts = head.attempts,
            outages = self.outages,
            error = %detail,
            "store outage reading the head's raw text: FAILED(INFRA), attempt not charged"
        );
        Ok(Outcome::Failed {
            class: ErrorClass::Infra,
            detail,
            next_attempt_at: next,
        })
    }
}
