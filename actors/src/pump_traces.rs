//! The pump's processing spans (issue 54): one `msgx.process` span per attempt of each group
//! member, in the member's message trace. Reported after the group's commit, beside the
//! mailbox: the spans carry their own start and end times, so the pump never waits for them,
//! and the one store read they need (the caller contexts of compat-registered members) runs
//! only while tracing is on.

use chrono::{DateTime, Utc};
use msgx_core::pump::{Outcome, StepOutcome};
use msgx_core::store::Store;
use msgx_core::traces::{Processing, Traces};
use opentelemetry::trace::SpanContext;

/// One attempt to report, owned (the spans are built after the actor moved on).
struct Attempt {
    msg_id: i64,
    started: DateTime<Utc>,
    outcome: &'static str,
    class: &'static str,
    detail: String,
    retry_at: Option<DateTime<Utc>>,
}

/// Reports the spans of a committed group's members, ending `now`.
pub fn report(
    traces: &'static Traces,
    store: &Store,
    steps: &[StepOutcome],
    now: DateTime<Utc>,
    group: SpanContext,
) {
    let attempts: Vec<Attempt> = steps.iter().filter_map(|s| attempt(s, now)).collect();
    if attempts.is_empty() {
        return;
    }
    let store = store.clone();
    actix_rt::spawn(async move {
        let ids: Vec<i64> = attempts.iter().map(|a| a.msg_id).collect();
        let stored = match store.trace_contexts(&ids).await {
            Ok(s) => s,
            Err(e) => {
                // The spans still go out, in the derived trace; say why they may not join a
                // caller's.
                tracing::debug!(error = %e, "reading the caller trace contexts failed");
                Vec::new()
            }
        };
        let group_size = attempts.len();
        for a in &attempts {
            let ctx = stored.iter().find(|c| c.0 == a.msg_id);
            traces.processed(&Processing {
                msg_id: a.msg_id,
                stored: ctx.map(|c| c.1.as_str()),
                state: ctx.and_then(|c| c.2.as_deref()),
                started: a.started,
                ended: now,
                outcome: a.outcome,
                class: a.class,
                detail: &a.detail,
                retry_at: a.retry_at,
                group_size,
                group: Some(&group),
            });
        }
    });
}

fn attempt(step: &StepOutcome, now: DateTime<Utc>) -> Option<Attempt> {
    match step {
        StepOutcome::Processed {
            msg_id,
            outcome,
            took,
            ..
        } => {
            let took = chrono::Duration::from_std(*took).unwrap_or_default();
            let (detail, retry_at) = match outcome {
                Outcome::Failed {
                    detail,
                    next_attempt_at,
                    ..
                } => (detail.clone(), Some(*next_attempt_at)),
                Outcome::Dead { detail, .. } | Outcome::Skipped { detail, .. } => {
                    (detail.clone(), None)
                }
                _ => (String::new(), None),
            };
            Some(Attempt {
                msg_id: *msg_id,
                started: now - took,
                outcome: outcome.label(),
                class: outcome.class(),
                detail,
                retry_at,
            })
        }
        StepOutcome::Poisoned { msg_id, reason } => Some(Attempt {
            msg_id: *msg_id,
            started: now,
            outcome: "dead",
            class: "EXHAUSTED",
            detail: reason.clone(),
            retry_at: None,
        }),
        StepOutcome::Idle | StepOutcome::Waiting { .. } => None,
    }
}
