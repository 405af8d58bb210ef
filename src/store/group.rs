//! Group commit (issue 10): the pump applies consecutive heads inside ONE business transaction,
//! each under its own `SAVEPOINT`, and commits once per group — one WAL flush for many
//! messages, FIFO intact. A message that fails rolls back to its savepoint; the messages before
//! it still commit with the group. Nothing leaves PostgreSQL before the commit: the dispatcher
//! and the sweeper only see committed rows.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};

use super::batch::{write_rows, BatchRows};
use super::business::{load_flights, write_plan, PIPELINE_LOCK_KEY};
use super::queue::{HeadTuple, UNFINISHED};
use super::{HeadRow, Store, StoreError};
use crate::flight::{Flight, FlightChange, Plan, Refused};
use crate::rows::{Head, ProcState};

/// One member's attempt stamp: its head row as read before the stamp, the attempt number the
/// stamp gave it and the stamp's time — what [`Store::give_back_stamps`] needs to undo it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The row before the stamp.
    pub before: Head,
    /// `attempts` after the stamp.
    pub attempts: i32,
    /// The stamp's `now` (its `processing_started_at` when the row had none).
    pub at: DateTime<Utc>,
}

/// One open group transaction (pipeline lock held). Dropping it rolls everything back. Its
/// business work is in `business.rs`, its one-statement outcomes in `queue.rs`.
pub struct GroupTx {
    pub(super) tx: Transaction<'static, Postgres>,
}

/// What a group's members need from the store, loaded for all of them at once under the
/// group's locks (the rows locked, then the flights, as a single message's load does) and
/// kept equal to the store as each member writes ([`GroupLoad::apply`]): each member then costs
/// its savepoint and its write, not a load of its own.
#[derive(Debug, Default)]
pub struct GroupLoad {
    /// State of each member's row.
    pub states: HashMap<i64, ProcState>,
    /// Which message holds each of the members' identities.
    pub holders: HashMap<String, i64>,
    /// Every flight any member names, and their code-shares.
    flights: BTreeMap<String, Flight>,
    /// The code-shares of each master flight in `flights` (by `MFID`): a member's view is then
    /// a few lookups, not a walk over every flight of the group (which made the rules cost
    /// grow with the group: 0.034 ms per message at 256 members against 0.014 at 64).
    shares: HashMap<String, BTreeSet<String>>,
}

impl GroupLoad {
    /// The flights one member's rules see: those it names and their code-shares, exactly what
    /// its own load would read.
    pub fn current(&self, load: &[String]) -> BTreeMap<String, Flight> {
        let mut out = BTreeMap::new();
        for l in load {
            if let Some(f) = self.flights.get(l) {
                out.insert(l.clone(), f.clone());
            }
            for share in self.shares.get(l).into_iter().flatten() {
                if let Some(f) = self.flights.get(share) {
                    out.insert(share.clone(), f.clone());
                }
            }
        }
        out
    }

    /// A load over `flights` (the code-share index built from them).
    fn new(
        states: HashMap<i64, ProcState>,
        holders: HashMap<String, i64>,
        flights: BTreeMap<String, Flight>,
    ) -> Self {
        let mut shares: HashMap<String, BTreeSet<String>> = HashMap::new();
        for f in flights.values() {
            if let Some(m) = f.master() {
                shares
                    .entry(m.to_string())
                    .or_default()
                    .insert(f.flid.clone());
            }
        }
        Self {
            states,
            holders,
            flights,
            shares,
        }
    }

    /// Inserts or replaces a flight, keeping the code-share index equal to `flights`.
    fn put(&mut self, f: Flight) {
        self.unlink(&f.flid);
        if let Some(m) = f.master() {
            self.shares
                .entry(m.to_string())
                .or_default()
                .insert(f.flid.clone());
        }
        self.flights.insert(f.flid.clone(), f);
    }

    /// Removes a flight and its code-share link.
    fn remove(&mut self, flid: &str) {
        self.unlink(flid);
        self.flights.remove(flid);
    }

    fn unlink(&mut self, flid: &str) {
        let Some(m) = self.flights.get(flid).and_then(|f| f.master()) else {
            return;
        };
        if let Some(set) = self.shares.get_mut(m) {
            set.remove(flid);
            if set.is_empty() {
                self.shares.remove(m);
            }
        }
    }

    /// Records what a member wrote (its plan and its identity).
    pub fn apply(&mut self, msg_id: i64, identity: &str, plan: &Plan) {
        for change in &plan.changes {
            match change {
                FlightChange::Created { after } | FlightChange::Updated { after, .. } => {
                    self.put(after.clone());
                }
                FlightChange::Deleted { before, .. } => {
                    self.remove(&before.flid);
                }
            }
        }
        self.holders.insert(identity.to_string(), msg_id);
        self.states.insert(msg_id, ProcState::Succeeded);
    }
}

impl std::fmt::Debug for GroupTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupTx")
    }
}

impl Store {
    /// Up to `limit` unfinished rows ≤ W in MSG_ID order: the head first, then the heads it
    /// would have after each one finishes (partial index `proc_state_head_idx`).
    pub async fn heads(&self, limit: i64) -> Result<Vec<HeadRow>, StoreError> {
        let rows: Vec<HeadTuple> = sqlx::query_as(&format!(
            "SELECT msg_id, state, attempts, next_attempt_at, processing_started_at, \
                    COALESCE(received_at, enqueued_at), source \
             FROM proc_state \
             WHERE {UNFINISHED} AND msg_id <= (SELECT w FROM inbox_cursor WHERE id = 1) \
             ORDER BY msg_id LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(super::queue::head_row).collect()
    }

    /// Starts an attempt of every message of a group in ONE autocommit statement on the
    /// relaxed pool, before any of them is decoded (their texts are read beside it): a message
    /// that kills the process still counts its attempt. Relaxed commit: the group's synchronous commit flushes the WAL up to and
    /// including this record, so the stamp is durable whenever its outcome is; a crash before
    /// that may lose it, and the attempt is simply stamped again. Returns `(msg_id, attempts)`
    /// of the rows still unfinished, in MSG_ID order.
    pub async fn stamp_attempts(
        &self,
        ids: &[i64],
        now: DateTime<Utc>,
    ) -> Result<Vec<(i64, i32)>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "WITH s AS (UPDATE proc_state SET attempts = attempts + 1, \
                    processing_started_at = COALESCE(processing_started_at, $2), updated_at = $2 \
             WHERE msg_id = ANY($1) AND {UNFINISHED} RETURNING msg_id, attempts) \
             SELECT msg_id, attempts FROM s ORDER BY msg_id"
        ))
        .bind(ids)
        .bind(now)
        .fetch_all(self.relaxed())
        .await?)
    }

    /// Gives back the attempt stamps of a group that failed before its commit: each member's
    /// `attempts` and `processing_started_at` as they were before [`Store::stamp_attempts`],
    /// in ONE statement — so a member's `processing.head_deadline` never runs from an attempt
    /// that did not happen. Only rows still exactly as the stamp left them are restored: a row
    /// whose outcome did commit (a COMMIT that failed on the way back), or that anything else
    /// changed since, keeps what it has. Returns the rows restored.
    pub async fn give_back_stamps(&self, stamps: &[Stamp]) -> Result<u64, StoreError> {
        if stamps.is_empty() {
            return Ok(0);
        }
        let ids: Vec<i64> = stamps.iter().map(|s| s.before.msg_id).collect();
        let stamped: Vec<i32> = stamps.iter().map(|s| s.attempts).collect();
        let attempts: Vec<i32> = stamps.iter().map(|s| s.before.attempts).collect();
        let started: Vec<Option<DateTime<Utc>>> = stamps
            .iter()
            .map(|s| s.before.processing_started_at)
            .collect();
        let stamped_started: Vec<DateTime<Utc>> = stamps
            .iter()
            .map(|s| s.before.processing_started_at.unwrap_or(s.at))
            .collect();
        let states: Vec<ProcState> = stamps
            .iter()
            .map(|s| {
                if s.before.failed {
                    ProcState::Failed
                } else {
                    ProcState::Pending
                }
            })
            .collect();
        let next: Vec<Option<DateTime<Utc>>> =
            stamps.iter().map(|s| s.before.next_attempt_at).collect();
        let done = sqlx::query(
            "UPDATE proc_state p SET attempts = u.attempts, processing_started_at = u.started \
             FROM UNNEST($1::bigint[], $2::int[], $3::int[], $4::timestamptz[], \
                         $5::timestamptz[], $6::text[], $7::timestamptz[]) \
                  AS u(id, stamped, attempts, started, stamped_started, state, next_at) \
             WHERE p.msg_id = u.id AND p.attempts = u.stamped AND p.state = u.state \
               AND p.processing_started_at = u.stamped_started \
               AND p.next_attempt_at IS NOT DISTINCT FROM u.next_at",
        )
        .bind(&ids)
        .bind(&stamped)
        .bind(&attempts)
        .bind(&started)
        .bind(&stamped_started)
        .bind(&states)
        .bind(&next)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }

    /// BEGIN and the pipeline lock (first, as replay, backfill recovery and approved skip take it).
    pub async fn begin_group(&self) -> Result<GroupTx, StoreError> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(PIPELINE_LOCK_KEY)
            .execute(&mut *tx)
            .await?;
        Ok(GroupTx { tx })
    }
}

impl GroupTx {
    /// The transaction's connection, for the statements other store files add to a group
    /// (`raw_copy`).
    pub(super) fn conn(&mut self) -> &mut sqlx::PgConnection {
        &mut self.tx
    }

    /// The savepoint of the next message.
    pub async fn savepoint(&mut self) -> Result<(), StoreError> {
        sqlx::query("SAVEPOINT m").execute(&mut *self.tx).await?;
        Ok(())
    }

    /// Undoes everything of the current message (back to its savepoint).
    pub async fn rollback_message(&mut self) -> Result<(), StoreError> {
        sqlx::query("ROLLBACK TO SAVEPOINT m")
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    /// Takes back the attempt stamped on group members that did not run (the group stopped
    /// before them): members other than the head are always fresh, so this restores
    /// `attempts = 0` and no start time — as if they had never been part of the group.
    pub async fn unstamp(&mut self, ids: &[i64]) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "UPDATE proc_state SET attempts = attempts - 1, \
                    processing_started_at = CASE WHEN attempts = 1 THEN NULL \
                                                 ELSE processing_started_at END \
             WHERE msg_id = ANY($1) AND state = 'PENDING' AND attempts > 0 AND {UNFINISHED}"
        ))
        .bind(ids)
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Locks the members' rows and loads their states, the holders of their identities and
    /// every flight they name (with code-shares, locked), in three statements for the group.
    pub async fn load_group(
        &mut self,
        ids: &[i64],
        keys: &[String],
        flids: &[String],
    ) -> Result<GroupLoad, StoreError> {
        let states: Vec<(i64, ProcState)> = sqlx::query_as(
            "SELECT msg_id, state FROM proc_state WHERE msg_id = ANY($1) ORDER BY msg_id FOR UPDATE",
        )
        .bind(ids)
        .fetch_all(&mut *self.tx)
        .await?;
        let holders: Vec<(String, i64)> = sqlx::query_as(
            // A DEAD record does not hold its identity (migration 0012); an archived one
            // does (migration 0014). One statement: a holder being archived meanwhile is
            // seen in exactly one of the tables.
            "SELECT identity_key, msg_id FROM proc_state \
             WHERE identity_key = ANY($1) AND state <> 'DEAD' \
             UNION ALL SELECT identity_key, msg_id FROM proc_state_hst \
             WHERE identity_key = ANY($1) AND state <> 'DEAD'",
        )
        .bind(keys)
        .fetch_all(&mut *self.tx)
        .await?;
        let flights = load_flights(&mut self.tx, flids).await?;
        Ok(GroupLoad::new(
            states.into_iter().collect(),
            holders.into_iter().collect(),
            flights,
        ))
    }

    /// Writes a member's planned outcome (snapshot, flights, events, SUCCEEDED with its
    /// identity), not committed.
    pub async fn write_planned(
        &mut self,
        msg_id: i64,
        msg_type: &str,
        identity: &str,
        plan: &Plan,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        write_plan(
            &mut self.tx,
            msg_id,
            msg_type,
            plan,
            &Refused::default(),
            identity,
            now,
        )
        .await
    }

    /// The planned outcomes of consecutive members (their [`BatchRows`]) in ONE statement (see
    /// [`super::batch`]), under a savepoint of their own. `Ok(Err(e))`: the statement failed
    /// and everything of the batch was rolled back to that savepoint (the caller writes the
    /// members one by one to find the one that fails); `Err`: the store failed around it (the
    /// group fails).
    pub async fn write_batch(
        &mut self,
        rows: &BatchRows<'_>,
    ) -> Result<Result<(), StoreError>, StoreError> {
        sqlx::query("SAVEPOINT b").execute(&mut *self.tx).await?;
        match write_rows(&mut self.tx, rows).await {
            Ok(()) => Ok(Ok(())),
            Err(e) => {
                sqlx::query("ROLLBACK TO SAVEPOINT b")
                    .execute(&mut *self.tx)
                    .await?;
                Ok(Err(e))
            }
        }
    }

    /// One synchronous commit for the whole group.
    pub async fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().await?;
        Ok(())
    }
}
