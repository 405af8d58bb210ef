//! One pump step: find the head, decide, and process it — raw read outside any transaction,
//! decode, bind identity (own statement), then the business transaction or a one-statement
//! terminal state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::outcome::{ErrorClass, Outcome, SingleTerminal};
use super::rules::{backoff, decide, HeadDecision, HeadRules, PoisonReason};
use crate::clock::SharedClock;
use crate::codec::{Codec, CodecError, DecodedMessage};
use crate::flight;
use crate::inbox::{Inbox, RawMessage};
use crate::late::Source;
use crate::store::{Binding, BusinessResult, HeadRow, Store, StoreError};
use crate::telemetry;

/// Knobs of the pump.
#[derive(Debug, Clone, Copy)]
pub struct PumpConfig {
    /// Poison and backoff rules.
    pub rules: HeadRules,
    /// Larger messages are MALFORMED.
    pub max_message_bytes: u64,
    /// Identity with the send date (Q11).
    pub identity_with_date: bool,
    /// Airport zone (identity date).
    pub tz: Tz,
    /// Raw reads per inbox round trip.
    pub read_ahead: u32,
}

/// What a step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// No unfinished row ≤ W.
    Idle,
    /// The head is FAILED and not due: everything waits until `until`.
    Waiting {
        /// The head.
        msg_id: i64,
        /// When it is due.
        until: DateTime<Utc>,
    },
    /// The head was poison and is now DEAD(EXHAUSTED).
    Poisoned {
        /// The head.
        msg_id: i64,
        /// Why.
        reason: String,
    },
    /// The head was processed.
    Processed {
        /// The head.
        msg_id: i64,
        /// How it ended.
        outcome: Outcome,
        /// Wall time of the attempt.
        took: Duration,
        /// The head's age (receive or enqueue time → now) when taken.
        head_age: Duration,
    },
}

/// The pump's state between steps: only a read-ahead buffer of raw texts (reads have no side
/// effects, so losing it is harmless).
#[derive(Debug)]
pub struct PumpCore {
    inbox: Inbox,
    store: Store,
    codec: Arc<dyn Codec>,
    clock: SharedClock,
    cfg: PumpConfig,
    /// Raw texts read ahead, by MSG_ID.
    ahead: BTreeMap<i64, RawMessage>,
}

impl PumpCore {
    /// A pump over these adapters.
    pub fn new(
        inbox: Inbox,
        store: Store,
        codec: Arc<dyn Codec>,
        clock: SharedClock,
        cfg: PumpConfig,
    ) -> Self {
        Self {
            inbox,
            store,
            codec,
            clock,
            cfg,
            ahead: BTreeMap::new(),
        }
    }

    /// The store (metrics, tests).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// One step. A store failure is returned (the actor retries later); everything else is
    /// recorded on the row.
    pub async fn step(&mut self) -> Result<StepOutcome, StoreError> {
        let Some(HeadRow {
            head,
            since,
            source,
        }) = self.store.head().await?
        else {
            self.ahead.clear();
            return Ok(StepOutcome::Idle);
        };
        let now = self.clock.now();
        match decide(&head, now, &self.cfg.rules) {
            HeadDecision::WaitUntil(until) => Ok(StepOutcome::Waiting {
                msg_id: head.msg_id,
                until,
            }),
            HeadDecision::Poison(reason) => {
                if !self.poison(head.msg_id, reason, now).await? {
                    return Ok(StepOutcome::Idle); // the row changed meanwhile (a replay): look again
                }
                Ok(StepOutcome::Poisoned {
                    msg_id: head.msg_id,
                    reason: reason.to_string(),
                })
            }
            HeadDecision::Process => {
                let started = Instant::now();
                let head_age = (now - since).to_std().unwrap_or(Duration::ZERO);
                let Some(attempts) = self.store.stamp_attempt(head.msg_id, now).await? else {
                    return Ok(StepOutcome::Idle); // finished elsewhere meanwhile
                };
                let outcome = self.process(head.msg_id, attempts, source).await?;
                Ok(StepOutcome::Processed {
                    msg_id: head.msg_id,
                    outcome,
                    took: started.elapsed(),
                    head_age,
                })
            }
        }
    }

    async fn poison(
        &self,
        msg_id: i64,
        reason: PoisonReason,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let started_before = crate::clock::minus(now, self.cfg.rules.head_deadline);
        self.store
            .poison(
                msg_id,
                self.cfg.rules.max_attempts,
                started_before,
                &reason.to_string(),
                now,
            )
            .await
    }

    /// Processes the stamped head; returns how it ended (already written). A `LATE` row
    /// (a released hole that committed after all) is applied with the ordering guard.
    async fn process(
        &mut self,
        msg_id: i64,
        attempts: i32,
        source: Source,
    ) -> Result<Outcome, StoreError> {
        let raw = match self.raw(msg_id).await {
            Ok(raw) => raw,
            Err(detail) => return self.fail(msg_id, attempts, ErrorClass::Infra, detail).await,
        };
        let text = match raw {
            RawMessage::Text(text) => text,
            RawMessage::Missing => {
                return self
                    .dead(
                        msg_id,
                        ErrorClass::Malformed,
                        "inbox row missing when reading the raw message".into(),
                        None,
                    )
                    .await
            }
            RawMessage::Empty => {
                return self
                    .dead(
                        msg_id,
                        ErrorClass::Malformed,
                        "inbox row has no message text".into(),
                        None,
                    )
                    .await
            }
            RawMessage::TooLarge(len) => {
                let detail = format!(
                    "message of {len} bytes exceeds processing.max_message_bytes {}",
                    self.cfg.max_message_bytes
                );
                return self.dead(msg_id, ErrorClass::Malformed, detail, None).await;
            }
        };
        let msg = match self.codec.decode(&text) {
            Ok(msg) => msg,
            Err(CodecError::Malformed(d)) => {
                return self.dead(msg_id, ErrorClass::Malformed, d, None).await
            }
            Err(CodecError::Unsupported(d)) => {
                return self
                    .fail(msg_id, attempts, ErrorClass::Unsupported, d)
                    .await
            }
            Err(CodecError::Codec(d)) => {
                return self.fail(msg_id, attempts, ErrorClass::CodecError, d).await
            }
        };
        let msg_type = type_label(&msg);
        let key = msg.identity_key(self.cfg.identity_with_date, self.cfg.tz);
        match self.store.bind_identity(msg_id, &key).await {
            Ok(Binding::Bound) => {}
            Ok(Binding::Duplicate { holder }) => {
                let detail = format!("identity {key} already bound to message {holder:?}");
                let now = self.clock.now();
                self.store
                    .finish_single(
                        msg_id,
                        SingleTerminal::Skipped,
                        ErrorClass::Duplicate,
                        &detail,
                        Some(&msg_type),
                        now,
                    )
                    .await?;
                return Ok(Outcome::Skipped {
                    reason: ErrorClass::Duplicate,
                    detail,
                });
            }
            Err(e) => {
                return self
                    .fail(msg_id, attempts, ErrorClass::Infra, e.to_string())
                    .await
            }
        }
        let outcome = self
            .business(msg_id, attempts, &msg, &msg_type, source)
            .await;
        // Seed §4 "committed, mark not written" (and events not yet delivered).
        crate::failpoint::hit("pump_after_business_commit");
        outcome
    }

    async fn business(
        &mut self,
        msg_id: i64,
        attempts: i32,
        msg: &DecodedMessage,
        msg_type: &str,
        source: Source,
    ) -> Result<Outcome, StoreError> {
        let load = flight::flights_to_load(msg);
        let now = self.clock.now();
        let result = if source.is_late() {
            // Out of id order by design: newer messages were applied first; the guard keeps
            // what they wrote and the refusals are recorded on the row.
            self.store
                .commit_business_late(
                    msg_id,
                    msg_type,
                    &load,
                    |current, tombstones| flight::plan_guarded(msg, msg_id, current, tombstones),
                    now,
                )
                .await
                .map(|(result, refused)| {
                    if !refused.is_empty() {
                        let labels = refused.labels();
                        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
                        telemetry::late_stale_fields(msg_id, &labels);
                    }
                    result
                })
        } else {
            self.store
                .commit_business(
                    msg_id,
                    msg_type,
                    &load,
                    |current| flight::plan(msg, msg_id, current),
                    now,
                )
                .await
        };
        match result {
            Ok(BusinessResult::Committed { changes, events }) => {
                Ok(Outcome::Succeeded { changes, events })
            }
            Ok(BusinessResult::NotUnfinished) => Ok(Outcome::FinishedElsewhere),
            // The whole transaction rolled back: retry later, nothing partial remains.
            Err(e) => {
                self.fail(msg_id, attempts, ErrorClass::Infra, e.to_string())
                    .await
            }
        }
    }

    /// The raw text of the head, from the read-ahead buffer or one batched inbox read.
    async fn raw(&mut self, msg_id: i64) -> Result<RawMessage, String> {
        if let Some(raw) = self.ahead.remove(&msg_id) {
            return Ok(raw);
        }
        self.ahead.clear();
        let ids = self
            .store
            .next_unfinished(msg_id, i64::from(self.cfg.read_ahead))
            .await
            .map_err(|e| e.to_string())?;
        let ids = if ids.first() == Some(&msg_id) {
            ids
        } else {
            vec![msg_id]
        };
        let texts = self
            .inbox
            .raw_messages(&ids, self.cfg.max_message_bytes)
            .await
            .map_err(|e| e.to_string())?;
        for (id, raw) in texts {
            self.ahead.insert(id, raw);
        }
        Ok(self.ahead.remove(&msg_id).unwrap_or(RawMessage::Missing))
    }

    async fn dead(
        &self,
        msg_id: i64,
        class: ErrorClass,
        detail: String,
        msg_type: Option<&str>,
    ) -> Result<Outcome, StoreError> {
        let now = self.clock.now();
        self.store
            .finish_single(msg_id, SingleTerminal::Dead, class, &detail, msg_type, now)
            .await?;
        Ok(Outcome::Dead { class, detail })
    }

    async fn fail(
        &mut self,
        msg_id: i64,
        attempts: i32,
        class: ErrorClass,
        detail: String,
    ) -> Result<Outcome, StoreError> {
        self.ahead.clear();
        let now = self.clock.now();
        let delay = backoff(attempts, &self.cfg.rules);
        let next = crate::clock::plus(now, delay);
        self.store
            .mark_failed(msg_id, class, &detail, next, now)
            .await?;
        Ok(Outcome::Failed {
            class,
            detail,
            next_attempt_at: next,
        })
    }
}

/// `TYPE` or `TYPE-STYP`, for the row and logs.
fn type_label(msg: &DecodedMessage) -> String {
    if msg.meta.subtype.is_empty() {
        msg.meta.msg_type.clone()
    } else {
        format!("{}-{}", msg.meta.msg_type, msg.meta.subtype)
    }
}
