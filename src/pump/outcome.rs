//! What processing one message ended in.

use chrono::{DateTime, Utc};

pub use crate::rows::{ErrorClass, SingleTerminal};

/// How one processing attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// SUCCEEDED: flight changes and events committed.
    Succeeded {
        /// Flights created, updated or deleted.
        changes: usize,
        /// Events written.
        events: usize,
    },
    /// SKIPPED with a reason.
    Skipped {
        /// Why.
        reason: ErrorClass,
        /// Detail for operators.
        detail: String,
    },
    /// DEAD with a class.
    Dead {
        /// Why.
        class: ErrorClass,
        /// Detail.
        detail: String,
    },
    /// The row was no longer unfinished when the business transaction locked it (an operator
    /// action finished it meanwhile): nothing written.
    FinishedElsewhere,
    /// FAILED: retried at `next_attempt_at`.
    Failed {
        /// Why.
        class: ErrorClass,
        /// Detail.
        detail: String,
        /// When it is due again.
        next_attempt_at: DateTime<Utc>,
    },
}

impl Outcome {
    /// Metric label: `succeeded`, `skipped`, `finished_elsewhere`, `dead`, `failed`.
    pub fn label(&self) -> &'static str {
        self.event().outcome()
    }

    /// The error class, `none` on success, for metrics.
    pub fn class(&self) -> &'static str {
        self.event().class()
    }

    /// The telemetry view of this outcome.
    pub fn event(&self) -> crate::telemetry::Processed<'_> {
        use crate::telemetry::Processed;
        match self {
            Self::Succeeded { changes, events } => Processed::Succeeded {
                changes: *changes,
                events: *events,
            },
            Self::FinishedElsewhere => Processed::FinishedElsewhere,
            Self::Skipped { reason, detail } => Processed::Skipped {
                reason: reason.as_str(),
                detail,
            },
            Self::Dead { class, detail } => Processed::Dead {
                class: class.as_str(),
                detail,
            },
            Self::Failed {
                class,
                detail,
                next_attempt_at,
            } => Processed::Failed {
                class: class.as_str(),
                detail,
                retry_at: *next_attempt_at,
            },
        }
    }

    /// The head is released (terminal state).
    pub fn is_terminal(&self) -> bool {
        !matches!(self, Self::Failed { .. })
    }
}
