//! One outcome statement for many group members (issue 10): the planned flight rows, events
//! and SUCCEEDED states of consecutive members written by ONE statement, so a group costs
//! O(1) round trips instead of a savepoint and a write per message. The rows are exactly what
//! the members' one-by-one writes would leave ([`super::business::write_plan`]): a flight that
//! several members change is written once with the last member's state, events keep their
//! order (event ids in member order, then plan order), and `processed_seq` ascends with
//! `MSG_ID`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};

use super::StoreError;
use crate::flight::{Flight, FlightChange, Plan};

/// A member's planned outcome, waiting for the batch statement.
#[derive(Debug, Clone)]
pub struct PlannedWrite {
    /// The member.
    pub msg_id: i64,
    /// `TYPE` or `TYPE-STYP` for its row.
    pub msg_type: String,
    /// The identity it binds.
    pub identity: String,
    /// What the rules planned (no schedule snapshot: those are written alone).
    pub plan: Plan,
    /// Its processing time (terminal, event and flight times).
    pub now: DateTime<Utc>,
}

/// What the batch does to one flight: its state after the last member that changed it.
#[derive(Debug)]
enum Final<'a> {
    /// Written with this state; `created_by` is the member that created it in this batch
    /// (None: it existed before and keeps its creator).
    Up {
        after: &'a Flight,
        created_by: Option<i64>,
        updated_by: i64,
        at: DateTime<Utc>,
    },
    /// Deleted (a no-op when a member of this batch had created it).
    Deleted,
}

/// True when `plan` can join a batch already holding `batch`: one statement cannot delete a
/// flight and write it again, so a member that re-creates a flight a batch member deleted
/// starts a new batch (rare: a delete and a re-create within one group).
pub fn joins(batch: &[PlannedWrite], plan: &Plan) -> bool {
    if plan.snapshot.is_some() {
        return false;
    }
    plan.changes.iter().all(|c| match c {
        FlightChange::Created { after } | FlightChange::Updated { after, .. } => {
            !batch.iter().any(|w| {
                w.plan.changes.iter().any(|d| {
                    matches!(d, FlightChange::Deleted { before, .. } if before.flid == after.flid)
                })
            })
        }
        FlightChange::Deleted { .. } => true,
    })
}

/// Writes the batch in ONE statement inside the group transaction (the caller holds a
/// savepoint before it and falls back to member-by-member writes when it fails).
pub(super) async fn write_batch(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[PlannedWrite],
) -> Result<(), StoreError> {
    if batch.is_empty() {
        return Ok(());
    }
    // Each flight once, with its final state, in first-touched order.
    let mut order: Vec<&str> = Vec::new();
    let mut finals: HashMap<&str, Final<'_>> = HashMap::new();
    for w in batch {
        for change in &w.plan.changes {
            match change {
                FlightChange::Created { after } | FlightChange::Updated { after, .. } => {
                    let flid = after.flid.as_str();
                    let created_by = match (finals.get(flid), change) {
                        (Some(Final::Up { created_by, .. }), _) => *created_by,
                        (None, FlightChange::Created { .. }) => Some(w.msg_id),
                        _ => None,
                    };
                    if !finals.contains_key(flid) {
                        order.push(flid);
                    }
                    finals.insert(
                        flid,
                        Final::Up {
                            after,
                            created_by,
                            updated_by: w.msg_id,
                            at: w.now,
                        },
                    );
                }
                FlightChange::Deleted { before, .. } => {
                    let flid = before.flid.as_str();
                    if !finals.contains_key(flid) {
                        order.push(flid);
                    }
                    finals.insert(flid, Final::Deleted);
                }
            }
        }
    }
    let mut up_flid = Vec::new();
    let mut up_master: Vec<Option<String>> = Vec::new();
    let mut up_fields = Vec::new();
    let mut up_versions = Vec::new();
    let mut up_created: Vec<i64> = Vec::new();
    let mut up_updated: Vec<i64> = Vec::new();
    let mut up_at: Vec<DateTime<Utc>> = Vec::new();
    let mut deleted: Vec<&str> = Vec::new();
    for flid in order {
        match &finals[flid] {
            Final::Up {
                after,
                created_by,
                updated_by,
                at,
            } => {
                let json = serde_json::to_value(after)
                    .map_err(|e| StoreError::Corrupt(format!("flight {flid}: {e}")))?;
                up_flid.push(flid);
                up_master.push(after.master().map(str::to_string));
                up_fields.push(json["fields"].clone());
                up_versions.push(json["versions"].clone());
                // On insert the creator is the batch member that created it (or, for a row
                // that exists, the conflict branch keeps the stored one).
                up_created.push(created_by.unwrap_or(*updated_by));
                up_updated.push(*updated_by);
                up_at.push(*at);
            }
            Final::Deleted => deleted.push(flid),
        }
    }
    let (mut ev_msg, mut ev_key, mut ev_type, mut ev_payload, mut ev_at) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for w in batch {
        for e in &w.plan.events {
            ev_msg.push(w.msg_id);
            ev_key.push(e.flight_key.as_str());
            ev_type.push(e.event_type.as_str());
            ev_payload.push(&e.payload);
            ev_at.push(w.now);
        }
    }
    let ids: Vec<i64> = batch.iter().map(|w| w.msg_id).collect();
    let types: Vec<&str> = batch.iter().map(|w| w.msg_type.as_str()).collect();
    let idents: Vec<&str> = batch.iter().map(|w| w.identity.as_str()).collect();
    let ats: Vec<DateTime<Utc>> = batch.iter().map(|w| w.now).collect();
    // `m`: the processing order. A volatile function in the select list is evaluated after
    // the ORDER BY, so `processed_seq` follows the members' MSG_ID order.
    let done = sqlx::query(
        "WITH up AS ( \
             INSERT INTO flight_state (flid, master_flid, fields, versions, created_by_msg, \
                                       updated_by_msg, updated_at) \
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::jsonb[], $4::jsonb[], \
                                  $5::bigint[], $6::bigint[], $7::timestamptz[]) \
             ON CONFLICT (flid) DO UPDATE SET master_flid = EXCLUDED.master_flid, \
                  fields = EXCLUDED.fields, versions = EXCLUDED.versions, \
                  updated_by_msg = EXCLUDED.updated_by_msg, updated_at = EXCLUDED.updated_at \
             RETURNING 1), \
         del AS (DELETE FROM flight_state WHERE flid = ANY($8::text[]) RETURNING 1), \
         ev AS ( \
             INSERT INTO msg_event (msg_id, flight_key, event_type, payload, created_at) \
             SELECT e.m, e.k, e.t, e.p, e.a \
             FROM UNNEST($9::bigint[], $10::text[], $11::text[], $12::jsonb[], \
                         $13::timestamptz[]) WITH ORDINALITY AS e(m, k, t, p, a, o) \
             ORDER BY e.o \
             RETURNING 1), \
         m AS ( \
             SELECT u.id, u.ty, u.ident, u.at, nextval('proc_order_seq') AS seq \
             FROM UNNEST($14::bigint[], $15::text[], $16::text[], $17::timestamptz[]) \
                  WITH ORDINALITY AS u(id, ty, ident, at, o) \
             ORDER BY u.o) \
         UPDATE proc_state p SET state = 'SUCCEEDED', error_class = NULL, error_text = NULL, \
                terminal_reason = NULL, terminal_at = m.at, next_attempt_at = NULL, \
                processed_seq = m.seq, backfill_next_at = m.at, msg_type = m.ty, \
                stale_fields = NULL, updated_at = m.at, identity_key = m.ident \
         FROM m WHERE p.msg_id = m.id",
    )
    .bind(&up_flid)
    .bind(&up_master)
    .bind(&up_fields)
    .bind(&up_versions)
    .bind(&up_created)
    .bind(&up_updated)
    .bind(&up_at)
    .bind(&deleted)
    .bind(&ev_msg)
    .bind(&ev_key)
    .bind(&ev_type)
    .bind(&ev_payload)
    .bind(&ev_at)
    .bind(&ids)
    .bind(&types)
    .bind(&idents)
    .bind(&ats)
    .execute(&mut **tx)
    .await?;
    if done.rows_affected() != batch.len() as u64 {
        // Every member was locked and unfinished in the group's load: a shortfall means the
        // load and the store disagree; the caller falls back to member-by-member writes.
        return Err(StoreError::Corrupt(format!(
            "batch outcome updated {} of {} rows",
            done.rows_affected(),
            batch.len()
        )));
    }
    Ok(())
}
