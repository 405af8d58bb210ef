//! Processing metrics (the pump: the FIFO head, outcomes, groups, the drain estimate), each
//! next to its log line.

use std::time::Duration;

use chrono::{DateTime, Utc};
use metrics::{counter, gauge, histogram};

use super::Def;

/// Processing attempts by outcome (`succeeded`, `skipped`, `dead`, `failed`) and class.
pub const PIPELINE_PROCESSED_TOTAL: &str = "msgx_pipeline_processed_total";
/// Duration of one processing attempt.
pub const PIPELINE_PROCESSING_SECONDS: &str = "msgx_pipeline_processing_seconds";
/// The current head's MSG_ID (0 when idle).
pub const PIPELINE_HEAD_ID: &str = "msgx_pipeline_head_id";
/// Age of the head (receive, else enqueue time → now) when last taken.
pub const PIPELINE_HEAD_AGE_SECONDS: &str = "msgx_pipeline_head_age_seconds";
/// PENDING + FAILED rows.
pub const PIPELINE_UNFINISHED: &str = "msgx_pipeline_unfinished";
/// Age of the oldest unfinished row.
pub const PIPELINE_OLDEST_UNPROCESSED_SECONDS: &str = "msgx_pipeline_oldest_unprocessed_seconds";
/// Pump steps that failed on the store (nothing recorded; retried).
pub const PIPELINE_STEP_ERRORS_TOTAL: &str = "msgx_pipeline_step_errors_total";
/// G6: unfinished ÷ recent processing rate (+Inf when stalled with a backlog, NaN before the
/// first rate).
pub const PIPELINE_ESTIMATED_DRAIN_SECONDS: &str = "msgx_pipeline_estimated_drain_seconds";

/// Messages per committed group.
pub const PUMP_GROUP_SIZE: &str = "msgx_pump_group_size";
/// A group's wall time: first member started → commit returned.
pub const PUMP_GROUP_SECONDS: &str = "msgx_pump_group_seconds";
/// Wall time of one stage of a group, by stage: where the pump's time goes.
pub const PUMP_STAGE_SECONDS: &str = "msgx_pump_stage_seconds";

/// `stage` of [`PUMP_STAGE_SECONDS`], in the order a group runs them: the one spelling of the
/// pump's stages (`pump::stages::Stage` is indexed like this list; the benches print it too).
pub const PUMP_STAGES: &[&str] = &[
    "head",
    "stamp_and_raw_read",
    "raw_texts_in",
    "decode",
    "group_load",
    "plan",
    "savepoint",
    "outcome_rows",
    "business",
    "raw_copy",
    "commit",
];

/// `outcome` of [`PIPELINE_PROCESSED_TOTAL`] (`Outcome::label`, plus `dead` for a poisoned head).
pub const OUTCOMES_UNCLASSED: &[&str] = &["succeeded", "finished_elsewhere"];
/// Outcomes that carry an error class.
pub const OUTCOMES_CLASSED: &[&str] = &["skipped", "dead", "failed"];
/// `class` of [`PIPELINE_PROCESSED_TOTAL`] for the classed outcomes (`ErrorClass::as_str`);
/// the unclassed ones have `none`.
pub const ERROR_CLASSES: &[&str] = &[
    "MALFORMED",
    "PROTOCOL",
    "UNSUPPORTED",
    "CODEC_ERROR",
    "INFRA",
    "EXHAUSTED",
    "DUPLICATE",
];
/// `class` of an outcome without an error.
pub const CLASS_NONE: &str = "none";

/// Every (`outcome`, `class`) pair of [`PIPELINE_PROCESSED_TOTAL`].
pub fn processed_combos() -> Vec<Vec<&'static str>> {
    let mut all: Vec<Vec<&'static str>> = OUTCOMES_UNCLASSED
        .iter()
        .map(|o| vec![*o, CLASS_NONE])
        .collect();
    for o in OUTCOMES_CLASSED {
        all.extend(ERROR_CLASSES.iter().map(|c| vec![*o, *c]));
    }
    all
}

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::counter(PIPELINE_PROCESSED_TOTAL, "attempts", "Processing attempts by outcome and error class").combos(&["outcome", "class"], processed_combos()),
        Def::histogram(PIPELINE_PROCESSING_SECONDS, "seconds", "Duration of one processing attempt"),
        Def::gauge(PIPELINE_HEAD_ID, "id", "MSG_ID of the current FIFO head (0 when idle); NaN before the first step"),
        Def::gauge(PIPELINE_HEAD_AGE_SECONDS, "seconds", "Age of the head (receive, else enqueue time, to now) when last processed; NaN before the first"),
        Def::gauge(PIPELINE_UNFINISHED, "rows", "PENDING + FAILED rows; NaN before the first backlog refresh"),
        Def::gauge(PIPELINE_OLDEST_UNPROCESSED_SECONDS, "seconds", "Age of the oldest unfinished row (0 when none); NaN before the first backlog refresh"),
        Def::counter(PIPELINE_STEP_ERRORS_TOTAL, "steps", "Pump steps (and backlog refreshes) that failed on the store; nothing recorded, retried"),
        Def::gauge(PIPELINE_ESTIMATED_DRAIN_SECONDS, "seconds", "Unfinished messages divided by the recent processing rate (G6); +Inf when stalled with a backlog, NaN before the first rate"),
        Def::histogram(PUMP_GROUP_SIZE, "messages", "Messages per pump group (one business transaction, one commit)"),
        Def::histogram(PUMP_GROUP_SECONDS, "seconds", "Pump group wall time, first member to commit"),
        Def::histogram(PUMP_STAGE_SECONDS, "seconds", "Wall time of one stage of a pump group (its _sum by stage: where the pump's time goes; the stamp and the inbox read of the texts run at once, as one stage)").label("stage", PUMP_STAGES),
    ]
}

/// Buckets of this file's histograms.
pub(super) fn histogram_buckets() -> Vec<(&'static str, Vec<f64>)> {
    vec![
        (
            PIPELINE_PROCESSING_SECONDS,
            vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
            ],
        ),
        (
            PUMP_GROUP_SIZE,
            vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
        ),
        (
            PUMP_STAGE_SECONDS,
            vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
            ],
        ),
        (
            PUMP_GROUP_SECONDS,
            vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ],
        ),
    ]
}

/// How a processed head ended, with what its log line needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Processed<'a> {
    /// SUCCEEDED.
    Succeeded {
        /// Flights changed.
        changes: usize,
        /// Events written.
        events: usize,
    },
    /// Finished by someone else before the business transaction.
    FinishedElsewhere,
    /// SKIPPED.
    Skipped {
        /// The skip reason (an error class, one of [`ERROR_CLASSES`]).
        reason: &'static str,
        /// Detail for operators.
        detail: &'a str,
    },
    /// DEAD on arrival.
    Dead {
        /// Error class, one of [`ERROR_CLASSES`].
        class: &'static str,
        /// Detail for operators.
        detail: &'a str,
    },
    /// FAILED; the head waits for its retry.
    Failed {
        /// Error class, one of [`ERROR_CLASSES`].
        class: &'static str,
        /// Detail for operators.
        detail: &'a str,
        /// When it is retried.
        retry_at: DateTime<Utc>,
    },
}

impl Processed<'_> {
    /// `outcome` label of [`PIPELINE_PROCESSED_TOTAL`].
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } => "succeeded",
            Self::FinishedElsewhere => "finished_elsewhere",
            Self::Skipped { .. } => "skipped",
            Self::Dead { .. } => "dead",
            Self::Failed { .. } => "failed",
        }
    }

    /// `class` label of [`PIPELINE_PROCESSED_TOTAL`].
    pub fn class(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } | Self::FinishedElsewhere => CLASS_NONE,
            Self::Skipped { reason, .. } => reason,
            Self::Dead { class, .. } | Self::Failed { class, .. } => class,
        }
    }
}

/// A pump step ended. Generic, so this leaf imports no pump type: the pump's own result
/// owns the poison reason and the outcome (`pump::StepOutcome`), its telemetry event borrows
/// them (`PumpStep<&str, Processed>`); one enum, so the two cannot drift apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PumpStep<R, O> {
    /// No unfinished row at or below W.
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
        reason: R,
    },
    /// The head was processed.
    Processed {
        /// The head.
        msg_id: i64,
        /// How it ended.
        outcome: O,
        /// Wall time of the attempt.
        took: Duration,
        /// The head's age (receive or enqueue time → now) when taken.
        head_age: Duration,
    },
}

impl PumpStep<&str, Processed<'_>> {
    /// Metrics and log line of the step.
    pub fn emit(&self) {
        let _whole = super::whole::event();
        match *self {
            Self::Idle => gauge!(PIPELINE_HEAD_ID).set(0.0),
            Self::Waiting { msg_id, until } => {
                gauge!(PIPELINE_HEAD_ID).set(msg_id as f64);
                tracing::debug!(msg_id, due = %until, "head FAILED and not due; the queue waits");
            }
            Self::Poisoned { msg_id, reason } => {
                gauge!(PIPELINE_HEAD_ID).set(msg_id as f64);
                counter!(PIPELINE_PROCESSED_TOTAL, "outcome" => "dead", "class" => "EXHAUSTED")
                    .increment(1);
                tracing::error!(msg_id, reason = %reason, alert = true, "poison head escalated to DEAD(EXHAUSTED)");
            }
            Self::Processed {
                msg_id,
                outcome,
                took,
                head_age,
            } => {
                gauge!(PIPELINE_HEAD_ID).set(msg_id as f64);
                gauge!(PIPELINE_HEAD_AGE_SECONDS).set(head_age.as_secs_f64());
                histogram!(PIPELINE_PROCESSING_SECONDS).record(took.as_secs_f64());
                counter!(PIPELINE_PROCESSED_TOTAL, "outcome" => outcome.outcome(), "class" => outcome.class())
                    .increment(1);
                match outcome {
                    Processed::Succeeded { changes, events } => {
                        tracing::debug!(msg_id, changes, events, "processed")
                    }
                    Processed::FinishedElsewhere => {
                        tracing::info!(msg_id, "finished elsewhere before the business transaction")
                    }
                    Processed::Skipped { reason, detail } => {
                        tracing::info!(msg_id, reason, detail = %detail, "skipped")
                    }
                    Processed::Dead { class, detail } => {
                        tracing::warn!(msg_id, class, detail = %detail, "dead on arrival")
                    }
                    Processed::Failed {
                        class,
                        detail,
                        retry_at,
                    } => tracing::warn!(
                        msg_id, class, detail = %detail, retry_at = %retry_at,
                        "processing failed; the head waits for its retry"
                    ),
                }
            }
        }
    }
}

/// A pump step failed on the store; nothing was recorded.
pub fn pump_step_failed(error: &dyn std::error::Error) {
    counter!(PIPELINE_STEP_ERRORS_TOTAL).increment(1);
    tracing::error!(error = %error, "pump step failed on the store; retrying");
}

/// One stage of a group took `took` (`stage`: one of [`PUMP_STAGES`]). No log line: eleven
/// per group; the group's own line is [`pump_group`].
pub fn pump_stage(stage: &'static str, took: Duration) {
    histogram!(PUMP_STAGE_SECONDS, "stage" => stage).record(took.as_secs_f64());
}

/// A group committed.
pub fn pump_group(messages: usize, took: Duration) {
    histogram!(PUMP_GROUP_SIZE).record(messages as f64);
    histogram!(PUMP_GROUP_SECONDS).record(took.as_secs_f64());
    tracing::trace!(
        messages,
        took_ms = took.as_secs_f64() * 1e3,
        "pump group committed"
    );
}
