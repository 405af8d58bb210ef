//! Members that write on their own inside the group's transaction: business work with a
//! load of its own (a `LATE` row, applied with the ordering guard), a business duplicate
//! (SKIPPED), a terminal state without business work (DEAD), or FAILED with its backoff.

use super::read_ahead::Prepared;
use super::route::type_label;
use super::{Member, PumpCore};
use crate::codec::DecodedMessage;
use crate::flight::{self, GuardedPlan, Refused};
use crate::rows::Source;
use crate::pump::outcome::{ErrorClass, Outcome, SingleTerminal};
use crate::pump::rules::backoff;
use crate::pump::stages::Stage;
use crate::store::{BusinessResult, GroupTx, StoreError};
use crate::telemetry;

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
            Prepared::Dead(class, detail) => return self.dead(tx, msg_id, class, detail).await,
            Prepared::Fail(class, detail) => {
                return self.fail(tx, msg_id, m.attempts, class, detail).await
            }
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
        let detail = format!("identity {key} already bound to message {holder}");
        let now = self.clock.now();
        tx.finish_single(
            msg_id,
            SingleTerminal::Skipped,
            ErrorClass::Duplicate,
            &detail,
            Some(msg_type),
            now,
        )
        .await?;
        Ok(Outcome::Skipped {
            reason: ErrorClass::Duplicate,
            detail,
        })
    }

    async fn dead(
        &self,
        tx: &mut GroupTx,
        msg_id: i64,
        class: ErrorClass,
        detail: String,
    ) -> Result<Outcome, StoreError> {
        let now = self.clock.now();
        tx.finish_single(msg_id, SingleTerminal::Dead, class, &detail, None, now)
            .await?;
        Ok(Outcome::Dead { class, detail })
    }

    pub(super) async fn fail(
        &mut self,
        tx: &mut GroupTx,
        msg_id: i64,
        attempts: i32,
        class: ErrorClass,
        detail: String,
    ) -> Result<Outcome, StoreError> {
        self.ahead.clear();
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
