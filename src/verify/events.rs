//! Every event belongs to a SUCCEEDED message and is SENT (with where it landed), PENDING
//! (queued or backing off with its error) or DEAD with its error; a SUCCEEDED message that
//! raised no event is fine (no real change).

use super::{Finding, VerifyError};
use crate::rows::{EventState, ProcState};
use crate::store::Store;

type EventRow = (i64, Option<ProcState>, EventState, bool, bool, bool);

/// The finding and the number of SENT events (for the Kafka read-back).
pub(super) async fn run(store: &Store, batch: i64) -> Result<(Finding, u64), VerifyError> {
    let mut f = Finding::new(
        "events_delivered",
        "every SUCCEEDED message's events exist and are SENT, or PENDING/DEAD with a reason",
    );
    let mut sent = 0u64;
    let mut after = 0i64;
    loop {
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT e.event_id, p.state, e.state, \
                    e.kafka_offset IS NOT NULL AND e.sent_at IS NOT NULL, \
                    e.last_error IS NOT NULL, e.attempts > 0 \
             FROM msg_event e LEFT JOIN proc_state p ON p.msg_id = e.msg_id \
             WHERE e.event_id > $1 ORDER BY e.event_id LIMIT $2",
        )
        .bind(after)
        .bind(batch)
        .fetch_all(store.pool())
        .await?;
        let Some(last) = rows.last() else { break };
        after = last.0;
        for (id, msg_state, state, landed, has_error, tried) in rows {
            f.checked += 1;
            if msg_state != Some(ProcState::Succeeded) {
                f.violation(id);
                continue;
            }
            match state {
                EventState::Sent if landed => sent += 1,
                EventState::Pending if !tried => f.note("pending (queued)", id),
                EventState::Pending if has_error => f.note("pending (backing off)", id),
                EventState::Dead if has_error => f.note("dead (with error)", id),
                _ => f.violation(id),
            }
        }
    }
    f.scope = format!(
        "every msg_event row ({} events, {sent} SENT), in pages of {batch}",
        f.checked
    );
    Ok((f, sent))
}
