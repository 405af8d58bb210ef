//! `REQ_TRACK` (migration 0005) in our PostgreSQL: one row per outbound request, REGISTERED
//! before its `COUTMSGS` insert and SENT with the outbound row id after it.
//!
//! Whoever completes a request (the sender right after registering, or the reconciler) holds
//! the row lock (`FOR UPDATE`) across the `COUTMSGS` insert and the SENT update, so two
//! completers never write the same request; the reconciler skips locked rows.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{PgPool, Postgres, Transaction};

use crate::rows::text_enum;

/// Who asked (`req_track.origin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum Origin {
    /// The schedule requester's daily request: unique per (kind, date).
    Daily,
    /// `msgexchange request schedule`: may be repeated.
    Manual,
}

text_enum!(Origin, "req_track.origin");

/// How a request reached SENT (`req_track.sent_via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum SentVia {
    /// The normal path: registered, inserted, confirmed.
    Send,
    /// The reconciler found the row above the floor (the insert had landed).
    ReconcileFound,
    /// The reconciler found no row and wrote the stored message.
    ReconcileWritten,
}

text_enum!(SentVia, "req_track.sent_via");

/// Where a request is (`req_track.state`, migration 0005).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum TrackState {
    /// Registered before its `COUTMSGS` insert; the reconciler completes it after a crash.
    Registered,
    /// Its `COUTMSGS` row exists (`out_id`).
    Sent,
}

text_enum!(TrackState, "req_track.state");

/// One `REQ_TRACK` row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TrackRow {
    /// Id (= `META/SEQN`).
    pub id: i64,
    /// `SCHD`.
    pub kind: String,
    /// Who asked.
    pub origin: Origin,
    /// The day asked about.
    pub target_date: NaiveDate,
    /// `META/RQID`.
    pub rqid: String,
    /// `MAX(COUTMSGS_ID)` read before registering.
    pub floor_id: i64,
    /// The exact message text.
    pub message: String,
    /// REGISTERED, then SENT.
    pub state: TrackState,
    /// When registered.
    pub registered_at: DateTime<Utc>,
    /// When SENT.
    pub sent_at: Option<DateTime<Utc>>,
    /// `COUTMSGS_ID` once SENT.
    pub out_id: Option<i64>,
    /// How SENT was reached.
    pub sent_via: Option<SentVia>,
    /// Last failed delivery attempt (the insert may still land: the reconciler waits).
    pub failed_at: Option<DateTime<Utc>>,
    /// Its error.
    pub last_error: Option<String>,
    /// Inbox `msg_id` of the `SCHD`/`RESP` carrying this RQID.
    pub answered_by_msg: Option<i64>,
}

impl TrackRow {
    /// True once SENT.
    pub fn is_sent(&self) -> bool {
        self.state == TrackState::Sent
    }

    /// How it was sent, when SENT.
    pub fn via(&self) -> Option<SentVia> {
        self.sent_via
    }
}

/// A new request to register.
#[derive(Debug, Clone)]
pub struct NewTrack<'a> {
    /// From [`ReqTrack::next_id`].
    pub id: i64,
    /// `SCHD`.
    pub kind: &'a str,
    /// Who asked.
    pub origin: Origin,
    /// The day asked about.
    pub target_date: NaiveDate,
    /// The request id.
    pub rqid: &'a str,
    /// `MAX(COUTMSGS_ID)` read before this call.
    pub floor_id: i64,
    /// The message text.
    pub message: &'a str,
    /// Registration time.
    pub at: DateTime<Utc>,
}

/// Registration refused: the daily request for this (kind, date) exists.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// `req_track_daily_uq`.
    #[error("a daily request for this kind and date exists")]
    DailyExists,
    /// Anything else.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

const COLUMNS: &str = "id, kind, origin, target_date, rqid, floor_id, message, state, \
    registered_at, sent_at, out_id, sent_via, failed_at, last_error, answered_by_msg";

/// The `REQ_TRACK` store.
#[derive(Debug, Clone)]
pub struct ReqTrack {
    pool: PgPool,
}

impl ReqTrack {
    /// Over our store's pool (migrated by [`crate::store::Store::connect`]).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A fresh request id (it goes into the text, so it is taken before the insert).
    pub async fn next_id(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT nextval('req_track_id_seq')")
            .fetch_one(&self.pool)
            .await
    }

    /// Registers the request (committed on return).
    pub async fn register(&self, t: &NewTrack<'_>) -> Result<(), RegisterError> {
        let r = sqlx::query(
            "INSERT INTO req_track (id, kind, origin, target_date, rqid, floor_id, message, \
             state, registered_at) VALUES ($1, $2, $3, $4, $5, $6, $7, 'REGISTERED', $8)",
        )
        .bind(t.id)
        .bind(t.kind)
        .bind(t.origin.as_str())
        .bind(t.target_date)
        .bind(t.rqid)
        .bind(t.floor_id)
        .bind(t.message)
        .bind(t.at)
        .execute(&self.pool)
        .await;
        match r {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(e))
                if e.constraint() == Some("req_track_daily_uq")
                    || (e.code().as_deref() == Some("23505")
                        && e.message().contains("req_track_daily_uq")) =>
            {
                Err(RegisterError::DailyExists)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The daily request of `kind` for `date`, if any.
    pub async fn daily(
        &self,
        kind: &str,
        date: NaiveDate,
    ) -> Result<Option<TrackRow>, sqlx::Error> {
        sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM req_track WHERE kind = $1 AND target_date = $2 \
             AND origin = 'DAILY'"
        ))
        .bind(kind)
        .bind(date)
        .fetch_optional(&self.pool)
        .await
    }

    /// One row by id.
    pub async fn get(&self, id: i64) -> Result<Option<TrackRow>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM req_track WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
    }

    /// Every row, by id (tests, tools).
    pub async fn all(&self) -> Result<Vec<TrackRow>, sqlx::Error> {
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM req_track ORDER BY id"))
            .fetch_all(&self.pool)
            .await
    }

    /// REGISTERED requests registered before `before` (the stale gauge).
    pub async fn registered_before(&self, before: DateTime<Utc>) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT count(*) FROM req_track WHERE state = 'REGISTERED' AND registered_at < $1",
        )
        .bind(before)
        .fetch_one(&self.pool)
        .await
    }

    /// Begins a transaction and locks request `id` in it (waits for another completer).
    pub async fn lock(
        &self,
        id: i64,
    ) -> Result<Option<(Transaction<'static, Postgres>, TrackRow)>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let row: Option<TrackRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM req_track WHERE id = $1 FOR UPDATE"
        ))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        Ok(row.map(|r| (tx, r)))
    }

    /// Begins a transaction and locks the oldest REGISTERED request above `after` that nobody
    /// else holds (`SKIP LOCKED`: one being completed right now is left to its completer) and
    /// whose last failed attempt, if any, is older than `failed_before`.
    pub async fn lock_next_registered(
        &self,
        after: i64,
        failed_before: DateTime<Utc>,
    ) -> Result<Option<(Transaction<'static, Postgres>, TrackRow)>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let row: Option<TrackRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM req_track WHERE state = 'REGISTERED' AND id > $1 \
             AND (failed_at IS NULL OR failed_at < $2) \
             ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
        ))
        .bind(after)
        .bind(failed_before)
        .fetch_optional(&mut *tx)
        .await?;
        match row {
            Some(r) => Ok(Some((tx, r))),
            None => {
                tx.rollback().await?;
                Ok(None)
            }
        }
    }

    /// Marks the locked request SENT with its outbound row id and commits.
    pub async fn mark_sent(
        mut tx: Transaction<'static, Postgres>,
        id: i64,
        out_id: i64,
        via: SentVia,
        at: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE req_track SET state = 'SENT', out_id = $2, sent_via = $3, sent_at = $4, \
             last_error = NULL WHERE id = $1 AND state = 'REGISTERED'",
        )
        .bind(id)
        .bind(out_id)
        .bind(via.as_str())
        .bind(at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }

    /// Records a failed delivery attempt (the request stays REGISTERED).
    pub async fn mark_failed(
        &self,
        id: i64,
        error: &str,
        at: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE req_track SET failed_at = $2, last_error = $3 \
             WHERE id = $1 AND state = 'REGISTERED'",
        )
        .bind(id)
        .bind(at)
        .bind(error)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
