//! The outcome statement (issue 10): the planned flight rows, events and SUCCEEDED states of
//! one member, or of consecutive group members, written by ONE statement, so a group costs
//! O(1) round trips instead of a savepoint and a write per message. The rows of a batch are
//! exactly what the members' one-by-one writes would leave: a flight that several members
//! change is written once with the last member's state, events keep their order (event ids in
//! member order, then plan order), and `processed_seq` ascends with `MSG_ID`. Members that end
//! without business work (DEAD, a duplicate SKIPPED) ride in the same statement as terminal
//! rows, so a malformed message in the middle of a group does not split its batch in two.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};

use super::queue::ERROR_TEXT_MAX;
use super::{truncate, StoreError};
use crate::flight::{Flight, FlightChange, Plan};
use crate::rows::{ErrorClass, ProcState, SingleTerminal};

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

/// One member's outcome as the outcome statement writes it.
#[derive(Debug, Clone)]
pub(super) struct MemberWrite<'a> {
    /// The member.
    pub msg_id: i64,
    /// `TYPE` or `TYPE-STYP` for its row.
    pub msg_type: &'a str,
    /// The identity it binds.
    pub identity: &'a str,
    /// What the rules planned (its schedule snapshot, if any, is written before).
    pub plan: &'a Plan,
    /// What the late guard refused (`proc_state.stale_fields`); None: nothing.
    pub stale: Option<serde_json::Value>,
    /// Its processing time (terminal, event and flight times).
    pub now: DateTime<Utc>,
}

/// A member that ends without business work, waiting for the batch statement: the row
/// `GroupTx::finish_single` would write (state, class, detail, processing order, backfill
/// intent), written beside the planned members in `MSG_ID` order.
#[derive(Debug, Clone)]
pub struct TerminalWrite {
    /// The member.
    pub msg_id: i64,
    /// DEAD or SKIPPED.
    pub state: SingleTerminal,
    /// Why (also its `terminal_reason`).
    pub class: ErrorClass,
    /// The error text (cut to the stored length).
    pub detail: String,
    /// `TYPE` or `TYPE-STYP` when known (a duplicate); None keeps the row's.
    pub msg_type: Option<String>,
    /// Its processing time.
    pub now: DateTime<Utc>,
}

impl PlannedWrite {
    fn member(&self) -> MemberWrite<'_> {
        MemberWrite {
            msg_id: self.msg_id,
            msg_type: &self.msg_type,
            identity: &self.identity,
            plan: &self.plan,
            stale: None,
            now: self.now,
        }
    }
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

/// The outcome statement's columns for a run of members, built in Rust before the statement
/// (the pump times this CPU work apart from the statement's round trip): every flight once with
/// its last state, the events in member then plan order, the members' terminal rows in
/// `MSG_ID` order (the planned ones SUCCEEDED, the others as their [`TerminalWrite`] says).
pub struct BatchRows<'a> {
    flights: FlightRows<'a>,
    events: EventRows<'a>,
    members: MemberRows<'a>,
}

/// The members' rows of the batch statement, one entry per member in `MSG_ID` order.
#[derive(Default)]
struct MemberRows<'a> {
    ids: Vec<i64>,
    states: Vec<&'static str>,
    classes: Vec<Option<&'static str>>,
    texts: Vec<Option<&'a str>>,
    types: Vec<Option<&'a str>>,
    idents: Vec<Option<&'a str>>,
    ats: Vec<DateTime<Utc>>,
    stale: Vec<Option<serde_json::Value>>,
}

impl<'a> MemberRows<'a> {
    fn succeeded(&mut self, w: &MemberWrite<'a>) {
        self.ids.push(w.msg_id);
        self.states.push(ProcState::Succeeded.as_str());
        self.classes.push(None);
        self.texts.push(None);
        self.types.push(Some(w.msg_type));
        self.idents.push(Some(w.identity));
        self.ats.push(w.now);
        self.stale.push(w.stale.clone());
    }

    fn terminal(&mut self, t: &'a TerminalWrite) {
        self.ids.push(t.msg_id);
        self.states.push(t.state.as_str());
        self.classes.push(Some(t.class.as_str()));
        self.texts.push(Some(truncate(&t.detail, ERROR_TEXT_MAX)));
        self.types.push(t.msg_type.as_deref());
        self.idents.push(None);
        self.ats.push(t.now);
        self.stale.push(None);
    }
}

impl<'a> BatchRows<'a> {
    /// The columns of a batch: planned members and members ending without business work, each
    /// list in `MSG_ID` order (a group's members are), merged into that order.
    pub fn of(
        batch: &'a [PlannedWrite],
        terminals: &'a [TerminalWrite],
    ) -> Result<Self, StoreError> {
        let planned: Vec<MemberWrite<'a>> = batch.iter().map(PlannedWrite::member).collect();
        Self::of_members(&planned, terminals)
    }

    fn of_members(
        planned: &[MemberWrite<'a>],
        terminals: &'a [TerminalWrite],
    ) -> Result<Self, StoreError> {
        let mut members = MemberRows::default();
        let mut ts = terminals.iter().peekable();
        for w in planned {
            while let Some(t) = ts.next_if(|t| t.msg_id < w.msg_id) {
                members.terminal(t);
            }
            members.succeeded(w);
        }
        ts.for_each(|t| members.terminal(t));
        Ok(Self {
            flights: FlightRows::of(planned)?,
            events: EventRows::of(planned),
            members,
        })
    }

    /// How many members the rows are of.
    pub fn members(&self) -> usize {
        self.members.ids.len()
    }
}

/// Every row the members' plans change, every event they raise and their SUCCEEDED terminal
/// states with the backfill intent and the identity, in ONE statement (data-modifying CTEs):
/// one round trip however many flights and members. A plan has at most one change per flight
/// and a batch never deletes and re-creates one ([`joins`]), so the upsert and the delete never
/// meet the same row.
pub(super) async fn write_outcomes(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[MemberWrite<'_>],
) -> Result<(), StoreError> {
    if batch.is_empty() {
        return Ok(());
    }
    write_rows(tx, &BatchRows::of_members(batch, &[])?).await
}

/// Runs the outcome statement on built rows inside the group transaction (the caller of a
/// batch holds a savepoint before it and falls back to member-by-member writes when it fails).
pub(super) async fn write_rows(
    tx: &mut Transaction<'_, Postgres>,
    rows: &BatchRows<'_>,
) -> Result<(), StoreError> {
    let (flights, events) = (&rows.flights, &rows.events);
    let done = sqlx::query(BATCH_SQL)
        .bind(&flights.flid)
        .bind(&flights.master)
        .bind(&flights.fields)
        .bind(&flights.versions)
        .bind(&flights.created)
        .bind(&flights.updated)
        .bind(&flights.at)
        .bind(&flights.deleted)
        .bind(&events.msg)
        .bind(&events.key)
        .bind(&events.kind)
        .bind(&events.payload)
        .bind(&events.at)
        .bind(&rows.members.ids)
        .bind(&rows.members.types)
        .bind(&rows.members.idents)
        .bind(&rows.members.ats)
        .bind(&rows.members.stale)
        .bind(&rows.members.states)
        .bind(&rows.members.classes)
        .bind(&rows.members.texts)
        .execute(&mut **tx)
        .await?;
    if done.rows_affected() != rows.members() as u64 {
        // Every member was locked and unfinished in the group's load: a shortfall means the
        // load and the store disagree; the caller falls back to member-by-member writes.
        // Failing here also rolls back the events of the batch: no event is ever kept
        // without its message SUCCEEDED (migration 0020 dropped the foreign key).
        return Err(StoreError::Corrupt(format!(
            "batch outcome updated {} of {} rows",
            done.rows_affected(),
            rows.members()
        )));
    }
    Ok(())
}

/// The batch statement: flight upserts (`$1`–`$7`, `fields` and `versions` as JSON text) and
/// deletes (`$8`), events (`$9`–`$13`) and the members' terminal states (`$14`–`$21`: SUCCEEDED
/// with its type, identity and refusals, or DEAD/SKIPPED with its class and text, which keep the
/// row's identity, refusals and — when None — type, as `finish_single` does). `m`: the
/// processing order. A volatile function in the select list is evaluated after the ORDER BY, so
/// `processed_seq` follows the members' MSG_ID order. Only unfinished rows are written (the
/// planned members are locked so by the group's load; a terminal one is not loaded): a
/// shortfall fails the statement's count check.
const BATCH_SQL: &str = "WITH up AS ( \
         INSERT INTO flight_state (flid, master_flid, fields, versions, created_by_msg, \
                                   updated_by_msg, updated_at) \
         SELECT r.f, r.m, r.fi::jsonb, r.v::jsonb, r.c, r.u, r.a \
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], \
                     $5::bigint[], $6::bigint[], $7::timestamptz[]) AS r(f, m, fi, v, c, u, a) \
         ON CONFLICT (flid) DO UPDATE SET master_flid = EXCLUDED.master_flid, \
              fields = EXCLUDED.fields, versions = EXCLUDED.versions, \
              updated_by_msg = EXCLUDED.updated_by_msg, updated_at = EXCLUDED.updated_at \
         RETURNING 1), \
     del AS (DELETE FROM flight_state WHERE flid = ANY($8::text[]) RETURNING 1), \
     ev AS ( \
         INSERT INTO msg_event (msg_id, flight_key, event_type, payload, created_at, \
                                made_by_uuid_release) \
         SELECT e.m, e.k, e.t, e.p, e.a, true \
         FROM UNNEST($9::bigint[], $10::text[], $11::text[], $12::jsonb[], \
                     $13::timestamptz[]) WITH ORDINALITY AS e(m, k, t, p, a, o) \
         ORDER BY e.o \
         RETURNING 1), \
     m AS ( \
         SELECT u.id, u.ty, u.ident, u.at, u.stale, u.st, u.cls, u.txt, \
                nextval('proc_order_seq') AS seq \
         FROM UNNEST($14::bigint[], $15::text[], $16::text[], $17::timestamptz[], \
                     $18::jsonb[], $19::text[], $20::text[], $21::text[]) \
              WITH ORDINALITY AS u(id, ty, ident, at, stale, st, cls, txt, o) \
         ORDER BY u.o) \
     UPDATE proc_state p SET state = m.st, error_class = m.cls, error_text = m.txt, \
            terminal_reason = m.cls, terminal_at = m.at, next_attempt_at = NULL, \
            processed_seq = m.seq, backfill_next_at = m.at, \
            msg_type = COALESCE(m.ty, p.msg_type), \
            stale_fields = CASE WHEN m.st = 'SUCCEEDED' THEN m.stale ELSE p.stale_fields END, \
            updated_at = m.at, identity_key = COALESCE(m.ident, p.identity_key) \
     FROM m WHERE p.msg_id = m.id AND p.state IN ('PENDING', 'FAILED')";

/// Each flight the batch changes once, with its final state, in first-touched order.
fn finals<'a>(batch: &[MemberWrite<'a>]) -> Vec<(&'a str, Final<'a>)> {
    let mut order: Vec<&'a str> = Vec::new();
    let mut finals: HashMap<&'a str, Final<'a>> = HashMap::new();
    for w in batch {
        for change in &w.plan.changes {
            let (flid, last) = match change {
                FlightChange::Created { after } | FlightChange::Updated { after, .. } => {
                    let flid = after.flid.as_str();
                    let created_by = match (finals.get(flid), change) {
                        (Some(Final::Up { created_by, .. }), _) => *created_by,
                        (None, FlightChange::Created { .. }) => Some(w.msg_id),
                        _ => None,
                    };
                    let up = Final::Up {
                        after,
                        created_by,
                        updated_by: w.msg_id,
                        at: w.now,
                    };
                    (flid, up)
                }
                FlightChange::Deleted { before, .. } => (before.flid.as_str(), Final::Deleted),
            };
            if finals.insert(flid, last).is_none() {
                order.push(flid);
            }
        }
    }
    order
        .into_iter()
        .filter_map(|flid| finals.remove(flid).map(|last| (flid, last)))
        .collect()
}

/// The flight columns of the batch statement.
#[derive(Default)]
struct FlightRows<'a> {
    flid: Vec<&'a str>,
    master: Vec<Option<String>>,
    fields: Vec<String>,
    versions: Vec<String>,
    created: Vec<i64>,
    updated: Vec<i64>,
    at: Vec<DateTime<Utc>>,
    deleted: Vec<&'a str>,
}

impl<'a> FlightRows<'a> {
    fn of(batch: &[MemberWrite<'a>]) -> Result<Self, StoreError> {
        let mut rows = Self::default();
        for (flid, last) in finals(batch) {
            let Final::Up {
                after,
                created_by,
                updated_by,
                at,
            } = last
            else {
                rows.deleted.push(flid);
                continue;
            };
            let (fields, versions) = after
                .columns_json()
                .map_err(|e| StoreError::Corrupt(format!("flight {flid}: {e}")))?;
            rows.flid.push(flid);
            rows.master.push(after.master().map(str::to_string));
            rows.fields.push(fields);
            rows.versions.push(versions);
            // On insert the creator is the batch member that created it (or, for a row that
            // exists, the conflict branch keeps the stored one).
            rows.created.push(created_by.unwrap_or(updated_by));
            rows.updated.push(updated_by);
            rows.at.push(at);
        }
        Ok(rows)
    }
}

/// The event columns of the batch statement, in member order, then plan order.
#[derive(Default)]
struct EventRows<'a> {
    msg: Vec<i64>,
    key: Vec<&'a str>,
    kind: Vec<&'a str>,
    payload: Vec<&'a serde_json::Value>,
    at: Vec<DateTime<Utc>>,
}

impl<'a> EventRows<'a> {
    fn of(batch: &[MemberWrite<'a>]) -> Self {
        let mut rows = Self::default();
        for w in batch {
            for e in &w.plan.events {
                rows.msg.push(w.msg_id);
                rows.key.push(e.flight_key.as_str());
                rows.kind.push(e.event_type.as_str());
                rows.payload.push(&e.payload);
                rows.at.push(w.now);
            }
        }
        rows
    }
}
