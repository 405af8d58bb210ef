//! `MSG_EVENT` for the dispatcher: the next deliverable events, and recording what Kafka said
//! (SENT with partition/offset, a failed send with its backoff, DEAD after the DLQ copy).

use chrono::{DateTime, Utc};

use super::{Store, StoreError};
use crate::rows::EventState;

/// A PENDING event the dispatcher may send now.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PendingEvent {
    /// Delivery order; travels in the `ce_msgxevent` header.
    pub event_id: i64,
    /// The CloudEvents `ce_id`: a UUID made with the row (migration 0018), unique across
    /// stores and deployments, so no other store's event is ever taken for this one.
    pub ce_id: String,
    /// The inbox message that raised it.
    pub msg_id: i64,
    /// Kafka key: the flight identity (or `SCHD:<date>`).
    pub flight_key: String,
    /// `FLIGHT_CREATED`, …
    pub event_type: String,
    /// The JSON body as stored.
    pub payload: String,
    /// Failed sends so far.
    pub attempts: i32,
    /// When the pump committed it.
    pub created_at: DateTime<Utc>,
    /// The last send error, if any (copied into the DLQ record).
    pub last_error: Option<String>,
    /// The `ce_id` of its dead-letter copy (migration 0022): its own, so a consumer keeping
    /// one de-duplication store across both topics never drops the event when a requeue
    /// delivers it; made anew by each requeue.
    pub dead_ce_id: String,
    /// The caller's W3C `traceparent` of its message (compat entry, migration 0023); read only
    /// while tracing is on ([`crate::traces`]), else `None`.
    pub trace_parent: Option<String>,
    /// Its `tracestate`.
    pub trace_state: Option<String>,
}

/// A PENDING row as read: an identity may be missing on a row the previous release requeued
/// (it knows neither column), and is made (and kept) before the row is sent.
#[derive(sqlx::FromRow)]
struct PendingRow {
    event_id: i64,
    ce_id: Option<String>,
    msg_id: i64,
    flight_key: String,
    event_type: String,
    payload: String,
    attempts: i32,
    created_at: DateTime<Utc>,
    last_error: Option<String>,
    dead_ce_id: Option<String>,
    trace_parent: Option<String>,
    trace_state: Option<String>,
}

impl PendingRow {
    fn identified(self) -> Option<PendingEvent> {
        Some(PendingEvent {
            event_id: self.event_id,
            ce_id: self.ce_id?,
            msg_id: self.msg_id,
            flight_key: self.flight_key,
            event_type: self.event_type,
            payload: self.payload,
            attempts: self.attempts,
            created_at: self.created_at,
            last_error: self.last_error,
            dead_ce_id: self.dead_ce_id?,
            trace_parent: self.trace_parent,
            trace_state: self.trace_state,
        })
    }
}

/// A broker ack for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// The event.
    pub event_id: i64,
    /// Where it landed.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// When the ack arrived (the dispatcher's clock): written as `sent_at` / `dead_at`, so the
    /// stamp is the ack's time, not the time the outcome got written.
    pub at: DateTime<Utc>,
}

/// A failed send to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    /// The event.
    pub event_id: i64,
    /// When it may be tried again (`now` once attempts are exhausted: the DLQ copy is next).
    pub next_attempt_at: DateTime<Utc>,
    /// What Kafka (or librdkafka) said.
    pub error: String,
}

/// The dispatch backlog, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventBacklog {
    /// PENDING events: exact up to 10,000, above that the id span of the pending events.
    pub pending: i64,
    /// Creation time of the oldest PENDING event.
    pub oldest: Option<DateTime<Utc>>,
}

impl Store {
    /// Up to `limit` PENDING events that are due at `now`, in event order, leaving out every
    /// event that has an earlier PENDING event of the same key still backing off: one key's
    /// events are never delivered out of order, other keys go on.
    ///
    /// `skip_ids` / `skip_keys`: events and keys whose last outcome is not written yet (the
    /// dispatcher writes a round's outcome during the next round).
    ///
    /// Two plain index scans and the rest in Rust, on purpose: as one statement (an anti-join
    /// on the backing-off events, `NOT EXISTS … UNNEST` for the skips) the plan depended on the
    /// statistics, and PENDING is almost always a tiny share of MSG_EVENT, so after an ANALYZE
    /// the planner expected one PENDING row and chose nested loops that re-scan every pending
    /// event per pending event: 11.9 s for one round with 1,300 pending (measured during a
    /// 300,000-message drain). Here the cost is one scan of the backing-off index (tiny while
    /// Kafka is healthy) plus pages of `msg_event_pending_idx` in event order, whatever the
    /// statistics say.
    pub async fn deliverable_events(
        &self,
        now: DateTime<Utc>,
        limit: u32,
        skip_ids: &[i64],
        skip_keys: &[String],
    ) -> Result<Vec<PendingEvent>, StoreError> {
        use std::collections::{HashMap, HashSet};
        let limit = limit as usize;
        if limit == 0 {
            return Ok(Vec::new());
        }
        // key → its first event still backing off (`msg_event_backoff_idx`).
        let held: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
            "SELECT flight_key, min(event_id) FROM msg_event \
             WHERE state = 'PENDING' AND next_attempt_at IS NOT NULL AND next_attempt_at > $1 \
             GROUP BY flight_key",
        )
        .bind(now)
        .fetch_all(self.pool())
        .await?
        .into_iter()
        .collect();
        let skip_ids: HashSet<i64> = skip_ids.iter().copied().collect();
        let skip_keys: HashSet<&str> = skip_keys.iter().map(String::as_str).collect();
        // One page usually covers the batch: the skipped ids are read and dropped here.
        let page = (limit + skip_ids.len()).min(10_000) as i64;
        let mut out = Vec::with_capacity(limit);
        let mut after = i64::MIN;
        loop {
            let rows = sqlx::query_as::<_, PendingRow>(
                "SELECT e.event_id, e.ce_id::text AS ce_id, e.msg_id, e.flight_key, e.event_type, \
                        e.payload::text AS payload, e.attempts, e.created_at, e.last_error, \
                        e.dead_ce_id::text AS dead_ce_id, \
                        CASE WHEN $4 THEN (SELECT p.trace_parent FROM proc_state p \
                                            WHERE p.msg_id = e.msg_id) END AS trace_parent, \
                        CASE WHEN $4 THEN (SELECT p.trace_state FROM proc_state p \
                                            WHERE p.msg_id = e.msg_id) END AS trace_state \
                 FROM msg_event e \
                 WHERE e.state = 'PENDING' AND e.event_id > $2 \
                   AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= $1) \
                 ORDER BY e.event_id \
                 LIMIT $3",
            )
            .bind(now)
            .bind(after)
            .bind(page)
            // The caller contexts only while tracing is on: no extra reads otherwise.
            .bind(crate::traces::active().is_some())
            .fetch_all(self.pool())
            .await?;
            let exhausted = (rows.len() as i64) < page;
            for ev in self.identified(rows).await? {
                after = ev.event_id;
                let blocked = held
                    .get(&ev.flight_key)
                    .is_some_and(|first| *first < ev.event_id);
                if blocked
                    || skip_ids.contains(&ev.event_id)
                    || skip_keys.contains(ev.flight_key.as_str())
                {
                    continue;
                }
                out.push(ev);
                if out.len() == limit {
                    return Ok(out);
                }
            }
            if exhausted {
                return Ok(out);
            }
        }
    }

    /// The rows with their identities; a row missing one (the previous release requeued it,
    /// or a DEAD row older than migration 0018) gets it now, kept in the store before it is
    /// ever sent: one statement, only when such a row is read.
    async fn identified(&self, rows: Vec<PendingRow>) -> Result<Vec<PendingEvent>, StoreError> {
        let missing: Vec<i64> = rows
            .iter()
            .filter(|r| r.ce_id.is_none() || r.dead_ce_id.is_none())
            .map(|r| r.event_id)
            .collect();
        let made: std::collections::HashMap<i64, (String, String)> = if missing.is_empty() {
            Default::default()
        } else {
            sqlx::query_as::<_, (i64, String, String)>(
                "UPDATE msg_event SET ce_id = COALESCE(ce_id, gen_random_uuid()), \
                        dead_ce_id = COALESCE(dead_ce_id, gen_random_uuid()) \
                 WHERE event_id = ANY($1) \
                 RETURNING event_id, ce_id::text, dead_ce_id::text",
            )
            .bind(&missing)
            .fetch_all(self.pool())
            .await?
            .into_iter()
            .map(|(id, ce, dead)| (id, (ce, dead)))
            .collect()
        };
        Ok(rows
            .into_iter()
            .filter_map(|mut r| {
                if let Some((ce, dead)) = made.get(&r.event_id) {
                    r.ce_id = Some(ce.clone());
                    r.dead_ce_id = Some(dead.clone());
                }
                r.identified()
            })
            .collect())
    }

    /// Marks acknowledged events SENT with where they landed on `topic`, in one statement.
    /// Only PENDING rows change (a re-sent duplicate's second ack changes nothing).
    pub async fn mark_events_sent(&self, acked: &[Acked], topic: &str) -> Result<u64, StoreError> {
        self.mark_acked(acked, topic, EventState::Sent, "sent_at")
            .await
    }

    /// Records failed sends: one more attempt, the error, and when to retry.
    pub async fn record_send_failures(&self, failures: &[SendFailure]) -> Result<(), StoreError> {
        if failures.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = failures.iter().map(|f| f.event_id).collect();
        let due: Vec<DateTime<Utc>> = failures.iter().map(|f| f.next_attempt_at).collect();
        let errors: Vec<&str> = failures.iter().map(|f| f.error.as_str()).collect();
        sqlx::query(
            "UPDATE msg_event e SET attempts = e.attempts + 1, next_attempt_at = u.due, \
                    last_error = u.err \
             FROM UNNEST($1::bigint[], $2::timestamptz[], $3::text[]) AS u(id, due, err) \
             WHERE e.event_id = u.id AND e.state = 'PENDING'",
        )
        .bind(&ids)
        .bind(&due)
        .bind(&errors)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Marks events DEAD once their dead-letter copy was acknowledged (`acked` is where the
    /// copy landed on the dead-letter topic `dlq_topic`).
    pub async fn mark_events_dead(
        &self,
        acked: &[Acked],
        dlq_topic: &str,
    ) -> Result<u64, StoreError> {
        self.mark_acked(acked, dlq_topic, EventState::Dead, "dead_at")
            .await
    }

    /// PENDING → `state` with the ack's partition/offset and `at` in `time_column`, one
    /// statement for the whole batch. `time_column` is a constant of this file (a column
    /// name cannot be bound); the state is bound.
    async fn mark_acked(
        &self,
        acked: &[Acked],
        topic: &str,
        state: EventState,
        time_column: &'static str,
    ) -> Result<u64, StoreError> {
        if acked.is_empty() {
            return Ok(0);
        }
        let ids: Vec<i64> = acked.iter().map(|a| a.event_id).collect();
        let parts: Vec<i32> = acked.iter().map(|a| a.partition).collect();
        let offsets: Vec<i64> = acked.iter().map(|a| a.offset).collect();
        let at: Vec<DateTime<Utc>> = acked.iter().map(|a| a.at).collect();
        let sql = format!(
            "UPDATE msg_event e SET state = $5, {time_column} = u.at, next_attempt_at = NULL, \
                    kafka_topic = $6, kafka_partition = u.p, kafka_offset = u.o \
             FROM UNNEST($1::bigint[], $2::int[], $3::bigint[], $4::timestamptz[]) \
                  AS u(id, p, o, at) \
             WHERE e.event_id = u.id AND e.state = 'PENDING'"
        );
        let done = sqlx::query(&sql)
            .bind(&ids)
            .bind(&parts)
            .bind(&offsets)
            .bind(&at)
            .bind(state)
            .bind(topic)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }

    /// The earliest retry of a PENDING event due after `now` (the dispatcher wakes for it;
    /// read from the small backoff index).
    pub async fn next_event_retry(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let (next,): (Option<DateTime<Utc>>,) = sqlx::query_as(
            "SELECT min(next_attempt_at) FROM msg_event \
             WHERE state = 'PENDING' AND next_attempt_at IS NOT NULL AND next_attempt_at > $1",
        )
        .bind(now)
        .fetch_one(self.pool())
        .await?;
        Ok(next)
    }

    /// Pending count and oldest pending (metrics). Index-bounded at any backlog: exact up to
    /// `EXACT_BACKLOG_UP_TO` (10,000) pending events (read from the partial pending index),
    /// above that the event-id span of the pending events (an upper bound: events delivered out
    /// of id order lie inside it); the oldest is the lowest pending event's creation (event ids
    /// are assigned under the pipeline lock in processing order). The next retry is
    /// [`Store::next_event_retry`].
    pub async fn event_backlog(&self) -> Result<EventBacklog, StoreError> {
        type Row = (i64, Option<i64>, Option<i64>, Option<DateTime<Utc>>);
        let (counted, first, last, oldest): Row = sqlx::query_as(
            "SELECT (SELECT count(*) FROM (SELECT 1 FROM msg_event WHERE state = 'PENDING' \
                                            ORDER BY event_id LIMIT $1) c), \
                    (SELECT min(event_id) FROM msg_event WHERE state = 'PENDING'), \
                    (SELECT max(event_id) FROM msg_event WHERE state = 'PENDING'), \
                    (SELECT created_at FROM msg_event WHERE state = 'PENDING' \
                      ORDER BY event_id LIMIT 1)",
        )
        .bind(super::queue::EXACT_BACKLOG_UP_TO)
        .fetch_one(self.pool())
        .await?;
        Ok(EventBacklog {
            pending: super::queue::bounded_count(counted, first, last),
            oldest,
        })
    }
}

/// `audit_log.action` of a dead-event requeue.
pub const ACTION_REQUEUE_EVENTS: &str = "REQUEUE_EVENTS";

/// What a requeue did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeued {
    /// `audit_log.id`.
    pub audit_id: i64,
    /// Events back to PENDING, ascending.
    pub requeued: Vec<i64>,
    /// Events left alone, and why.
    pub refused: Vec<(i64, String)>,
}

impl Store {
    /// Operator action: DEAD events back to PENDING (attempts, retry time and dead time
    /// cleared; the last error and the `ce_id` kept, a new dead-letter `ce_id` made), audited with who and why, in one
    /// transaction. The dispatcher sends them again; they arrive after later events of their
    /// key that went out while they were DEAD (docs/operations.md, "Watching delivery").
    ///
    /// The same transaction raises the dead-letter topic's scan floor past each event's
    /// dead-letter copy (`legacy_dlq_topic` names the topic of a copy an older release
    /// recorded without one), so no later exactly-once recovery finds that copy and takes the
    /// requeue back.
    pub async fn requeue_dead_events(
        &self,
        event_ids: &[i64],
        audit: crate::store::audit::Audit<'_>,
        legacy_dlq_topic: &str,
        now: DateTime<Utc>,
    ) -> Result<Requeued, crate::store::audit::AdminError> {
        use crate::store::audit::{insert_audit, validate_action, AuditRow};
        let (actor, why, ids) = validate_action(audit.actor, audit.reason, event_ids, "event")?;
        let ticket = audit.ticket.map(str::trim).filter(|t| !t.is_empty());
        let mut tx = self.pool().begin().await?;
        let before: Vec<(i64, i64, EventState)> = sqlx::query_as(
            "SELECT event_id, msg_id, state FROM msg_event WHERE event_id = ANY($1) \
             ORDER BY event_id FOR UPDATE",
        )
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO dispatch_scan_floor (topic, kafka_partition, next_offset, recorded_at) \
             SELECT COALESCE(kafka_topic, $2), kafka_partition, max(kafka_offset) + 1, $3 \
             FROM msg_event WHERE event_id = ANY($1) AND state = 'DEAD' \
               AND kafka_partition IS NOT NULL AND kafka_offset IS NOT NULL \
             GROUP BY 1, 2 \
             ON CONFLICT (topic, kafka_partition) DO UPDATE \
                SET next_offset = GREATEST(dispatch_scan_floor.next_offset, \
                                           EXCLUDED.next_offset), \
                    recorded_at = EXCLUDED.recorded_at",
        )
        .bind(&ids)
        .bind(legacy_dlq_topic)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let requeued: Vec<(i64, i64)> = sqlx::query_as(
            "UPDATE msg_event SET state = 'PENDING', attempts = 0, next_attempt_at = NULL, \
                    dead_at = NULL, kafka_topic = NULL, kafka_partition = NULL, \
                    kafka_offset = NULL, ce_id = COALESCE(ce_id, gen_random_uuid()), \
                    dead_ce_id = gen_random_uuid() \
             WHERE event_id = ANY($1) AND state = 'DEAD' RETURNING event_id, msg_id",
        )
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?;
        let mut done: Vec<i64> = requeued.iter().map(|r| r.0).collect();
        done.sort_unstable();
        let refused: Vec<(i64, String)> = ids
            .iter()
            .filter(|id| done.binary_search(id).is_err())
            .map(|id| {
                let why = match before.iter().find(|b| b.0 == *id) {
                    Some((_, _, state)) => format!("state {state} is not DEAD"),
                    None => "no such event".to_string(),
                };
                (*id, why)
            })
            .collect();
        let msg_ids: Vec<i64> = requeued.iter().map(|r| r.1).collect();
        let result = serde_json::json!({
            "requeued": done,
            "refused": refused.iter().map(|(id, r)| serde_json::json!({"event_id": id, "reason": r})).collect::<Vec<_>>(),
        });
        let row = AuditRow {
            actor,
            action: ACTION_REQUEUE_EVENTS,
            reason: why,
            ticket,
            token: audit.token,
        };
        let audit_id = insert_audit(&mut tx, now, row, &msg_ids, result).await?;
        tx.commit().await?;
        for id in &done {
            tracing::warn!(
                event_id = id,
                actor,
                reason = why,
                "operator requeued a DEAD event"
            );
        }
        Ok(Requeued {
            audit_id,
            requeued: done,
            refused,
        })
    }
}
