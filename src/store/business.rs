//! The business work of one message (seed §3 flow ③) inside the group transaction
//! ([`super::GroupTx`]): under the pipeline lock, load the flights the message touches, let the
//! pure rules plan, write flight changes + events + snapshot + the terminal state with its
//! backfill intent — committed with the group.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};

use super::batch::{write_outcomes, MemberWrite};
use super::{GroupTx, StoreError};
use crate::flight::{FieldVersion, Flight, GuardedPlan, Plan, Refused, Tombstones};
use crate::rows::ProcState;

/// Advisory lock key of the pipeline lock ("msgp"): the pump's group transactions and the
/// operator's replay, backfill recovery (`store::replay`) and approved skip (`ops::skip`)
/// serialise on it.
pub const PIPELINE_LOCK_KEY: i64 = 0x6d73_6770;

/// What the business transaction committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusinessResult {
    /// SUCCEEDED with these counts.
    Committed {
        /// Flight rows written.
        changes: usize,
        /// Events written.
        events: usize,
    },
    /// The row was no longer unfinished (someone else finished it): nothing written.
    NotUnfinished,
    /// The identity to bind is held by another message (a business duplicate): nothing
    /// written (group commit binds the identity in the outcome statement).
    Duplicate {
        /// The message that holds it.
        holder: i64,
    },
}

impl GroupTx {
    /// The business work of one message with a load of its own, inside the group transaction
    /// (not committed: the group commits, or rolls back to the message's savepoint): lock and
    /// load, plan, write. The identity is checked in the load (held by another message →
    /// `Duplicate`; the unique index still guards a race: the statement then fails) and bound
    /// in the outcome statement: one row version and one round trip fewer than a binding of
    /// its own. On `NotUnfinished` and `Duplicate` nothing was written. `guarded`: a late
    /// message (`source = 'LATE'`, SPEC §6 G1) — the tombstones of its flights are loaded
    /// under the same lock for `plan`, and what the guard refused is recorded on the row
    /// (`proc_state.stale_fields`).
    #[allow(clippy::too_many_arguments)]
    pub async fn business(
        &mut self,
        msg_id: i64,
        msg_type: &str,
        load: &[String],
        identity: &str,
        guarded: bool,
        plan: impl FnOnce(&BTreeMap<String, Flight>, &Tombstones) -> GuardedPlan,
        now: DateTime<Utc>,
    ) -> Result<(BusinessResult, Refused), StoreError> {
        let tx = &mut self.tx;
        let (state, holder, current) = lock_and_load(tx, msg_id, load, identity).await?;
        if !state.is_some_and(ProcState::is_unfinished) {
            return Ok((BusinessResult::NotUnfinished, Refused::default()));
        }
        if let Some(holder) = holder {
            return Ok((BusinessResult::Duplicate { holder }, Refused::default()));
        }
        let tombstones = if guarded {
            let mut keys: Vec<String> = load.to_vec();
            keys.extend(current.keys().cloned());
            load_tombstones(tx, &keys).await?
        } else {
            Tombstones::new()
        };
        let GuardedPlan { plan, refused } = plan(&current, &tombstones);
        write_plan(tx, msg_id, msg_type, &plan, &refused, identity, now).await?;
        Ok((
            BusinessResult::Committed {
                changes: plan.changes.len(),
                events: plan.events.len(),
            },
            refused,
        ))
    }
}

/// Writes a planned outcome: the schedule snapshot (and the answered request), then the flight
/// rows, events and SUCCEEDED state in one statement ([`write_outcomes`], a batch of one).
pub(super) async fn write_plan(
    tx: &mut Transaction<'_, Postgres>,
    msg_id: i64,
    msg_type: &str,
    plan: &Plan,
    refused: &Refused,
    identity: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    if let Some(s) = &plan.snapshot {
        sqlx::query(
            "INSERT INTO schd_snap_log (msg_id, schedule_date, kind, request_id, flights, \
             created, updated, unchanged, applied_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)",
        )
        .bind(msg_id)
        .bind(s.date)
        .bind(&s.kind)
        .bind(&s.request_id)
        .bind(serde_json::json!(s.flights))
        .bind(s.created as i32)
        .bind(s.updated as i32)
        .bind(s.unchanged as i32)
        .bind(now)
        .execute(&mut **tx)
        .await?;
        // The answer to one of our outbound requests (SCHD/RESP carrying its RQID): record
        // the first answering message on the request (REQ_TRACK, migration 0005).
        if let (true, Some(rqid)) = (s.kind == "RESP", &s.request_id) {
            sqlx::query(
                "UPDATE req_track SET answered_by_msg = $1, answered_at = $2 \
                 WHERE rqid = $3 AND answered_by_msg IS NULL",
            )
            .bind(msg_id)
            .bind(now)
            .bind(rqid)
            .execute(&mut **tx)
            .await?;
        }
    }
    let member = MemberWrite {
        msg_id,
        msg_type,
        identity,
        plan,
        stale: (!refused.is_empty()).then(|| refused.to_json()),
        now,
    };
    write_outcomes(tx, &[member]).await
}

/// The named flights and every code-share of them, locked for the transaction.
pub(super) async fn load_flights(
    tx: &mut Transaction<'_, Postgres>,
    flids: &[String],
) -> Result<BTreeMap<String, Flight>, StoreError> {
    if flids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let rows: Vec<(String, serde_json::Value, serde_json::Value)> = sqlx::query_as(
        "SELECT flid, fields, versions FROM flight_state \
         WHERE flid = ANY($1) OR master_flid = ANY($1) ORDER BY flid FOR UPDATE",
    )
    .bind(flids)
    .fetch_all(&mut **tx)
    .await?;
    rows.into_iter()
        .map(|(flid, fields, versions)| decode_flight(flid, fields, versions))
        .collect()
}

/// A `flight_state` row as a [`Flight`]; a row that does not decode is corrupt.
pub(super) fn decode_flight(
    flid: String,
    fields: serde_json::Value,
    versions: serde_json::Value,
) -> Result<(String, Flight), StoreError> {
    let flight: Flight = serde_json::from_value(serde_json::json!({
        "flid": flid, "fields": fields, "versions": versions
    }))
    .map_err(|e| StoreError::Corrupt(format!("flight_state {flid}: {e}")))?;
    Ok((flid, flight))
}

/// In ONE statement, in this order: the pipeline lock, the message's row (locked), and the
/// named flights with their code-shares (locked, in FLID order). The identity's holder may be
/// live or archived (PROC_STATE_HST, migration 0014): one statement, one snapshot, so a holder
/// moving between the two tables is seen in exactly one. The lock is an InitPlan
/// evaluated before the row is scanned, so the lock order is the same as replay's and the
/// backfill confirmation's (pipeline lock first). Returns the row's state (None when the row
/// does not exist; the flights are then not loaded) and the flights.
async fn lock_and_load(
    tx: &mut Transaction<'_, Postgres>,
    msg_id: i64,
    flids: &[String],
    identity: &str,
) -> Result<(Option<ProcState>, Option<i64>, BTreeMap<String, Flight>), StoreError> {
    type Row = (
        ProcState,
        Option<i64>,
        Option<String>,
        Option<serde_json::Value>,
        Option<serde_json::Value>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "WITH p AS (SELECT state, \
                           COALESCE((SELECT h.msg_id FROM proc_state h \
                                      WHERE h.identity_key = $4 AND h.msg_id <> $2 \
                                        AND h.state <> 'DEAD' LIMIT 1), \
                                    (SELECT a.msg_id FROM proc_state_hst a \
                                      WHERE a.identity_key = $4 AND a.msg_id <> $2 \
                                        AND a.state <> 'DEAD' LIMIT 1)) AS holder \
                    FROM proc_state \
                    WHERE msg_id = $2 AND (SELECT 1 FROM pg_advisory_xact_lock($1)) = 1 \
                    FOR UPDATE) \
         SELECT p.state, p.holder, f.flid, f.fields, f.versions FROM p \
         LEFT JOIN LATERAL (SELECT flid, fields, versions FROM flight_state \
                            WHERE flid = ANY($3) OR master_flid = ANY($3) \
                            ORDER BY flid FOR UPDATE) f ON true",
    )
    .bind(PIPELINE_LOCK_KEY)
    .bind(msg_id)
    .bind(flids)
    .bind(identity)
    .fetch_all(&mut **tx)
    .await?;
    let state = rows.first().map(|r| r.0);
    let holder = rows.first().and_then(|r| r.1);
    let mut flights = BTreeMap::new();
    for (_, _, flid, fields, versions) in rows {
        let (Some(flid), Some(fields), Some(versions)) = (flid, fields, versions) else {
            continue;
        };
        let (flid, flight) = decode_flight(flid, fields, versions)?;
        flights.insert(flid, flight);
    }
    Ok((state, holder, flights))
}

/// The newest delete of each of `flids` (a flight deleted by name or as a code-share), from
/// the `FLIGHT_DELETED` events: `payload.sent_at` (the deleting message's send time) and its
/// `msg_id`. Only late messages need it (a rare path; no index on `flight_key`).
async fn load_tombstones(
    tx: &mut Transaction<'_, Postgres>,
    flids: &[String],
) -> Result<Tombstones, StoreError> {
    if flids.is_empty() {
        return Ok(Tombstones::new());
    }
    let rows: Vec<(String, DateTime<Utc>, i64)> = sqlx::query_as(
        "SELECT DISTINCT ON (flight_key) flight_key, (payload->>'sent_at')::timestamptz, msg_id \
         FROM msg_event WHERE event_type = 'FLIGHT_DELETED' AND flight_key = ANY($1) \
         ORDER BY flight_key, (payload->>'sent_at')::timestamptz DESC, msg_id DESC",
    )
    .bind(flids)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(flid, at, msg_id)| (flid, FieldVersion { at, msg_id }))
        .collect())
}
