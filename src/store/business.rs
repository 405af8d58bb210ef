//! The business transaction (seed §3 flow ③): under the pipeline lock, load the flights the
//! message touches, let the pure rules plan, write flight changes + events + snapshot + the
//! terminal state with its backfill intent — all in ONE PostgreSQL transaction.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};

use super::{Store, StoreError};
use crate::flight::{FieldVersion, Flight, FlightChange, GuardedPlan, Plan, Refused, Tombstones};

/// Advisory lock key of the pipeline lock ("msgp"): business transactions, and later operator
/// replay and backfill confirmation, serialise on it.
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
}

impl Store {
    /// Runs the business transaction for `msg_id`. `plan` is the pure rule applied to the
    /// loaded state; `load` are the flights it needs (their code-shares are loaded too).
    pub async fn commit_business(
        &self,
        msg_id: i64,
        msg_type: &str,
        load: &[String],
        plan: impl FnOnce(&BTreeMap<String, Flight>) -> Plan,
        now: DateTime<Utc>,
    ) -> Result<BusinessResult, StoreError> {
        let (result, _) = self
            .business_tx(
                msg_id,
                msg_type,
                load,
                false,
                |current, _| GuardedPlan {
                    plan: plan(current),
                    refused: Refused::default(),
                },
                now,
            )
            .await?;
        Ok(result)
    }

    /// The business transaction of a late message (`source = 'LATE'`, SPEC §6 G1): as
    /// [`Store::commit_business`], and additionally
    /// - loads the tombstones of the loaded and named flights (their newest `FLIGHT_DELETED`
    ///   event: send time + message id) under the same lock, for the guarded `plan`;
    /// - records what the guard refused on the row (`proc_state.stale_fields`,
    ///   `{"FLID": ["GATE", …]}`; NULL when nothing was refused) in the same commit.
    ///
    /// Returns what was refused (empty unless committed).
    pub async fn commit_business_late(
        &self,
        msg_id: i64,
        msg_type: &str,
        load: &[String],
        plan: impl FnOnce(&BTreeMap<String, Flight>, &Tombstones) -> GuardedPlan,
        now: DateTime<Utc>,
    ) -> Result<(BusinessResult, Refused), StoreError> {
        self.business_tx(msg_id, msg_type, load, true, plan, now)
            .await
    }

    /// The one transaction; `guarded` loads tombstones and writes `stale_fields`.
    async fn business_tx(
        &self,
        msg_id: i64,
        msg_type: &str,
        load: &[String],
        guarded: bool,
        plan: impl FnOnce(&BTreeMap<String, Flight>, &Tombstones) -> GuardedPlan,
        now: DateTime<Utc>,
    ) -> Result<(BusinessResult, Refused), StoreError> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(PIPELINE_LOCK_KEY)
            .execute(&mut *tx)
            .await?;
        let state: Option<String> =
            sqlx::query_scalar("SELECT state FROM proc_state WHERE msg_id = $1 FOR UPDATE")
                .bind(msg_id)
                .fetch_optional(&mut *tx)
                .await?;
        if !matches!(state.as_deref(), Some("PENDING" | "FAILED")) {
            tx.rollback().await?;
            return Ok((BusinessResult::NotUnfinished, Refused::default()));
        }
        let current = load_flights(&mut tx, load).await?;
        let tombstones = if guarded {
            let mut keys: Vec<String> = load.to_vec();
            keys.extend(current.keys().cloned());
            load_tombstones(&mut tx, &keys).await?
        } else {
            Tombstones::new()
        };
        let GuardedPlan { plan, refused } = plan(&current, &tombstones);
        for change in &plan.changes {
            write_change(&mut tx, change, msg_id, now).await?;
        }
        for event in &plan.events {
            sqlx::query(
                "INSERT INTO msg_event (msg_id, flight_key, event_type, payload, created_at) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(msg_id)
            .bind(&event.flight_key)
            .bind(event.event_type.as_str())
            .bind(&event.payload)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
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
            .execute(&mut *tx)
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
                .execute(&mut *tx)
                .await?;
            }
        }
        let stale = (!refused.is_empty()).then(|| refused.to_json());
        sqlx::query(
            "UPDATE proc_state SET state = 'SUCCEEDED', error_class = NULL, error_text = NULL, \
                    terminal_reason = NULL, terminal_at = $2, next_attempt_at = NULL, \
                    processed_seq = nextval('proc_order_seq'), backfill_next_at = $2, \
                    msg_type = $3, stale_fields = $4, updated_at = $2 \
             WHERE msg_id = $1",
        )
        .bind(msg_id)
        .bind(now)
        .bind(msg_type)
        .bind(stale)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((
            BusinessResult::Committed {
                changes: plan.changes.len(),
                events: plan.events.len(),
            },
            refused,
        ))
    }

    /// Loads flights by id (tests, tools).
    pub async fn flights(&self, flids: &[String]) -> Result<BTreeMap<String, Flight>, StoreError> {
        let mut tx = self.pool().begin().await?;
        let flights = load_flights(&mut tx, flids).await?;
        tx.rollback().await?;
        Ok(flights)
    }
}

/// The named flights and every code-share of them, locked for the transaction.
async fn load_flights(
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
        .map(|(flid, fields, versions)| {
            let flight: Flight = serde_json::from_value(serde_json::json!({
                "flid": flid, "fields": fields, "versions": versions
            }))
            .map_err(|e| StoreError::Corrupt(format!("flight_state {flid}: {e}")))?;
            Ok((flid, flight))
        })
        .collect()
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

async fn write_change(
    tx: &mut Transaction<'_, Postgres>,
    change: &FlightChange,
    msg_id: i64,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    match change {
        FlightChange::Created { after } | FlightChange::Updated { after, .. } => {
            let json = serde_json::to_value(after)
                .map_err(|e| StoreError::Corrupt(format!("flight {}: {e}", after.flid)))?;
            sqlx::query(
                "INSERT INTO flight_state (flid, master_flid, fields, versions, created_by_msg, \
                 updated_by_msg, updated_at) VALUES ($1, $2, $3, $4, $5, $5, $6) \
                 ON CONFLICT (flid) DO UPDATE SET master_flid = EXCLUDED.master_flid, \
                 fields = EXCLUDED.fields, versions = EXCLUDED.versions, \
                 updated_by_msg = EXCLUDED.updated_by_msg, updated_at = EXCLUDED.updated_at",
            )
            .bind(&after.flid)
            .bind(after.master())
            .bind(&json["fields"])
            .bind(&json["versions"])
            .bind(msg_id)
            .bind(now)
            .execute(&mut **tx)
            .await?;
        }
        FlightChange::Deleted { before, .. } => {
            sqlx::query("DELETE FROM flight_state WHERE flid = $1")
                .bind(&before.flid)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}
