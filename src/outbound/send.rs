//! The outbound procedure (seed §7): register in `REQ_TRACK` → insert into `COUTMSGS` → SENT
//! with the outbound row id; the reconciler for requests a crash or a failure left REGISTERED;
//! and the daily schedule request step. Library functions: the CLI and the schedule requester
//! actor only decide *when* to call them.
//!
//! Never twice: a request is completed (inserted + SENT) only by whoever holds its row lock,
//! and the reconciler first looks the request's `RQID` up in `COUTMSGS` **above the floor**
//! (`MAX(COUTMSGS_ID)` read before registering), adopting the row it finds. Assumptions
//! (docs/operations.md, "Outbound requests"): nobody else writes our RQID into the table, and
//! the DB owner does not purge rows younger than a reconcile.

use chrono::{DateTime, NaiveDate, Utc};

use super::coutmsgs::CoutError;
use super::request::{self, ScheduleRequest, KIND_SCHEDULE};
use super::track::{NewTrack, Origin, RegisterError, ReqTrack, SentVia, TrackRow, TrackState};
use super::Outbound;
use crate::{failpoint, telemetry};

/// Why an outbound call failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    /// Reading the outbound table failed (before anything was registered, or in a reconcile).
    #[error(transparent)]
    Coutmsgs(#[from] CoutError),
    /// Our PostgreSQL failed.
    #[error("REQ_TRACK statement failed: {0}")]
    Track(#[from] sqlx::Error),
    /// The daily request for this day was made already.
    #[error("the daily {kind} request for {date} exists already: {rqid} ({state})")]
    DailyExists {
        /// `SCHD`.
        kind: String,
        /// The day.
        date: NaiveDate,
        /// Its request id.
        rqid: String,
        /// REGISTERED or SENT.
        state: TrackState,
    },
    /// The insert failed or its outcome is unknown: the request stays REGISTERED and the
    /// reconciler completes it later (after `OutboundConfig::failure_grace`).
    #[error(
        "request {rqid} is registered but its COUTMSGS insert failed ({source}); \
         it stays REGISTERED and is reconciled later"
    )]
    NotDelivered {
        /// The request id.
        rqid: String,
        /// The insert error.
        #[source]
        source: CoutError,
    },
    /// A registered row disappeared (a manual edit).
    #[error("request {0} is no longer in REQ_TRACK")]
    Vanished(i64),
}

/// A registered (not yet sent) request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// `REQ_TRACK` id (= `META/SEQN`).
    pub id: i64,
    /// `META/RQID`.
    pub rqid: String,
    /// `MAX(COUTMSGS_ID)` before registration.
    pub floor_id: i64,
    /// The day asked about.
    pub target_date: NaiveDate,
}

/// A request that landed in `COUTMSGS` (SENT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// `REQ_TRACK` id.
    pub id: i64,
    /// `META/RQID`.
    pub rqid: String,
    /// `COUTMSGS_ID` of its row.
    pub out_id: i64,
    /// The day asked about.
    pub target_date: NaiveDate,
    /// How SENT was reached.
    pub via: SentVia,
}

impl Sent {
    fn from_row(row: &TrackRow) -> Option<Self> {
        Some(Self {
            id: row.id,
            rqid: row.rqid.clone(),
            out_id: row.out_id?,
            target_date: row.target_date,
            via: row.via()?,
        })
    }
}

/// Registers a `SCHD` request for `date`, then writes it and confirms it.
pub async fn request_schedule(
    ob: &Outbound,
    origin: Origin,
    date: NaiveDate,
    now: DateTime<Utc>,
) -> Result<Sent, OutboundError> {
    let registered = register_schedule(ob, origin, date, now).await?;
    failpoint::hit("outbound_after_register");
    deliver(ob, registered.id, now).await
}

/// Step 1: reads the floor, then registers the request (REGISTERED, committed) with its
/// exact text. A daily request that exists for `date` is refused with
/// [`OutboundError::DailyExists`].
pub async fn register_schedule(
    ob: &Outbound,
    origin: Origin,
    date: NaiveDate,
    now: DateTime<Utc>,
) -> Result<Registered, OutboundError> {
    if origin == Origin::Daily {
        if let Some(row) = ob.track.daily(KIND_SCHEDULE, date).await? {
            return Err(daily_exists(row));
        }
    }
    // The floor comes first: our row, written after registration, can only be above it.
    let floor_id = ob.out.max_id().await?;
    let id = ob.track.next_id().await?;
    let rqid = request::rqid(&ob.cfg.sender, id, rand::random());
    let message = ScheduleRequest {
        sender: ob.cfg.sender.clone(),
        receiver: ob.cfg.receiver.clone(),
        seqn: id,
        rqid: rqid.clone(),
        sent_local: request::local_time(now, ob.cfg.tz),
        date,
    }
    .to_xml();
    let new = NewTrack {
        id,
        kind: KIND_SCHEDULE,
        origin,
        target_date: date,
        rqid: &rqid,
        floor_id,
        message: &message,
        at: now,
    };
    match ob.track.register(&new).await {
        Ok(()) => {}
        Err(RegisterError::DailyExists) => {
            return match ob.track.daily(KIND_SCHEDULE, date).await? {
                Some(row) => Err(daily_exists(row)),
                None => Err(OutboundError::Vanished(id)),
            }
        }
        Err(RegisterError::Db(e)) => return Err(e.into()),
    }
    telemetry::outbound_registered(&rqid, KIND_SCHEDULE, origin.as_str(), date, floor_id);
    Ok(Registered {
        id,
        rqid,
        floor_id,
        target_date: date,
    })
}

/// Steps 2 and 3 for a request just registered: under its row lock, insert the stored text
/// and mark it SENT with the row id. If someone completed it meanwhile (a reconciler that got
/// the row first), that result is returned and nothing is written.
pub async fn deliver(ob: &Outbound, id: i64, now: DateTime<Utc>) -> Result<Sent, OutboundError> {
    let Some((tx, row)) = ob.track.lock(id).await? else {
        return Err(OutboundError::Vanished(id));
    };
    if row.is_sent() {
        tx.rollback().await?;
        return Sent::from_row(&row).ok_or(OutboundError::Vanished(id));
    }
    match ob
        .out
        .insert(request::local_time(now, ob.cfg.tz), &row.message)
        .await
    {
        Ok(out_id) => {
            failpoint::hit("outbound_after_insert");
            ReqTrack::mark_sent(tx, id, out_id, SentVia::Send, now).await?;
            telemetry::outbound_sent(&row.rqid, out_id);
            Ok(Sent {
                id,
                rqid: row.rqid,
                out_id,
                target_date: row.target_date,
                via: SentVia::Send,
            })
        }
        Err(source) => {
            // Release our own lock before recording the failure on the same row.
            tx.rollback().await?;
            failed(ob, &row, &source, now).await;
            Err(OutboundError::NotDelivered {
                rqid: row.rqid,
                source,
            })
        }
    }
}

/// Completes every REGISTERED request nobody is completing right now (and whose last failed
/// attempt is older than the grace): if a row with its `RQID` exists **above its floor** it is
/// adopted (`found`), otherwise the stored text is written once (`written`). Each request is
/// one PostgreSQL transaction holding its row lock across the `COUTMSGS` statements. Stops at
/// the first failure (what was completed before it stays completed).
pub async fn reconcile(ob: &Outbound, now: DateTime<Utc>) -> Result<Vec<Sent>, OutboundError> {
    let failed_before = crate::clock::minus(now, ob.cfg.failure_grace);
    let mut after = 0;
    let mut done = Vec::new();
    while let Some((tx, row)) = ob.track.lock_next_registered(after, failed_before).await? {
        after = row.id;
        let found = match ob.out.find_rqid_above(row.floor_id, &row.rqid).await {
            Ok(found) => found,
            Err(e) => {
                tx.rollback().await?;
                return Err(e.into());
            }
        };
        let (out_id, via) = match found {
            Some(out_id) => (out_id, SentVia::ReconcileFound),
            None => match ob
                .out
                .insert(request::local_time(now, ob.cfg.tz), &row.message)
                .await
            {
                Ok(out_id) => (out_id, SentVia::ReconcileWritten),
                Err(source) => {
                    tx.rollback().await?;
                    failed(ob, &row, &source, now).await;
                    return Err(OutboundError::NotDelivered {
                        rqid: row.rqid,
                        source,
                    });
                }
            },
        };
        ReqTrack::mark_sent(tx, row.id, out_id, via, now).await?;
        telemetry::outbound_reconciled(
            &row.rqid,
            row.floor_id,
            out_id,
            via == SentVia::ReconcileFound,
        );
        done.push(Sent {
            id: row.id,
            rqid: row.rqid,
            out_id,
            target_date: row.target_date,
            via,
        });
    }
    Ok(done)
}

/// What one daily step decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DailyOutcome {
    /// `outbound.schedule_request_at` is "".
    Off,
    /// Today's time has not come yet.
    NotYet,
    /// Today's request exists (`REGISTERED` ones are completed by the reconciler).
    AlreadyRequested {
        /// The day.
        date: NaiveDate,
        /// Its request id.
        rqid: String,
        /// REGISTERED or SENT.
        state: TrackState,
    },
    /// Asked now.
    Requested(Sent),
}

/// One step of the schedule requester.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyReport {
    /// Leftovers completed first.
    pub reconciled: Vec<Sent>,
    /// The decision about today's request.
    pub outcome: DailyOutcome,
    /// When the daily request is next due (None when off).
    pub next_run: Option<DateTime<Utc>>,
}

/// One step: reconcile leftovers, refresh the stale gauge, then ask for today's schedule if
/// the configured local time has passed and today's daily request does not exist yet.
pub async fn daily_step(ob: &Outbound, now: DateTime<Utc>) -> Result<DailyReport, OutboundError> {
    let reconciled = reconcile(ob, now).await?;
    let stale = ob
        .track
        .registered_before(now - chrono::Duration::minutes(1))
        .await?;
    telemetry::outbound_stale(stale);
    let Some(at) = ob.cfg.daily_at else {
        return Ok(DailyReport {
            reconciled,
            outcome: DailyOutcome::Off,
            next_run: None,
        });
    };
    let next_run = Some(request::next_daily_run(now, at, ob.cfg.tz));
    let Some(date) = request::daily_due(now, at, ob.cfg.tz) else {
        return Ok(DailyReport {
            reconciled,
            outcome: DailyOutcome::NotYet,
            next_run,
        });
    };
    let outcome = match request_schedule(ob, Origin::Daily, date, now).await {
        Ok(sent) => DailyOutcome::Requested(sent),
        Err(OutboundError::DailyExists {
            date, rqid, state, ..
        }) => DailyOutcome::AlreadyRequested { date, rqid, state },
        Err(e) => return Err(e),
    };
    Ok(DailyReport {
        reconciled,
        outcome,
        next_run,
    })
}

fn daily_exists(row: TrackRow) -> OutboundError {
    OutboundError::DailyExists {
        kind: row.kind,
        date: row.target_date,
        rqid: row.rqid,
        state: row.state,
    }
}

/// Counts, logs and records a failed insert (best effort: the request is REGISTERED either
/// way; without the record the reconciler just does not wait the grace).
async fn failed(ob: &Outbound, row: &TrackRow, error: &CoutError, now: DateTime<Utc>) {
    telemetry::outbound_failed(telemetry::OUTBOUND_STAGE_INSERT, Some(&row.rqid), error);
    if let Err(e) = ob.track.mark_failed(row.id, &error.to_string(), now).await {
        tracing::warn!(rqid = %row.rqid, error = %e, "could not record the failed attempt");
    }
}
