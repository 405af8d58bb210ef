//! The outbound path (seed §7, SPEC §7): our requests to upstream go into the shared outbound
//! table (`COUTMSGS`), tracked in `REQ_TRACK` so that a crash at any point neither loses a
//! request nor writes its row twice.
//!
//! - [`request`]: the `SCHD`/`RQST` text, its `RQID`, the look-up pattern, the daily timing
//!   (pure).
//! - [`track`]: `REQ_TRACK` in our PostgreSQL.
//! - [`coutmsgs`]: the outbound table (max id, insert, find by RQID above a floor).
//! - [`send`]: register → insert → SENT, the reconciler, and the daily step.
//!
//! The delivery promise ends at "landed in COUTMSGS": who reads the row downstream, and the
//! adapter's columns (`*_DATE_SENT`, `*_ACK_*`, `*_ERROR`), are not ours (seed §7, Q10).

pub mod coutmsgs;
pub mod request;
pub mod send;
pub mod track;

use std::time::Duration;

use chrono::NaiveTime;
use chrono_tz::Tz;

use crate::inbox::names::OutboxNames;
use crate::inbox::Inbox;
use crate::settings::{Settings, SettingsError};
use crate::store::Store;
use coutmsgs::Coutmsgs;
use track::ReqTrack;

pub use send::{
    daily_step, deliver, reconcile, register_schedule, request_schedule, DailyOutcome, DailyReport,
    OutboundError, Registered, Sent,
};
pub use track::{Origin, SentVia, TrackState};

/// A failed insert may still land (a lost `COMMIT` acknowledgement): the reconciler leaves
/// such a request alone this long after the failure before it looks and writes.
pub const DEFAULT_FAILURE_GRACE: Duration = Duration::from_secs(300);

/// Who we are and when the daily request runs.
#[derive(Debug, Clone)]
pub struct OutboundConfig {
    /// `META/SNDR` and the `RQID` prefix.
    pub sender: String,
    /// `META/RCVR`.
    pub receiver: String,
    /// Airport zone (`inbox.timezone`): `DDTM`, the creation time, "today" and the daily time.
    pub tz: Tz,
    /// Local time of the daily schedule request; `None` = off.
    pub daily_at: Option<NaiveTime>,
    /// See [`DEFAULT_FAILURE_GRACE`].
    pub failure_grace: Duration,
}

impl OutboundConfig {
    /// From the validated settings.
    pub fn from_settings(settings: &Settings) -> Result<Self, SettingsError> {
        Ok(Self {
            sender: settings.outbound.sender.clone(),
            receiver: settings.outbound.receiver.clone(),
            tz: settings.inbox_timezone(),
            daily_at: settings.outbound.schedule_time()?,
            failure_grace: DEFAULT_FAILURE_GRACE,
        })
    }
}

/// Everything the outbound functions need.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// `REQ_TRACK`.
    pub track: ReqTrack,
    /// `COUTMSGS`.
    pub out: Coutmsgs,
    /// Sender, zone, daily time.
    pub cfg: OutboundConfig,
}

impl Outbound {
    /// Over our store and the inbox's MySQL pool.
    pub fn new(
        store: &Store,
        inbox: &Inbox,
        names: &OutboxNames,
        query_timeout: Duration,
        cfg: OutboundConfig,
    ) -> Self {
        Self {
            track: ReqTrack::new(store.pool().clone()),
            out: Coutmsgs::new(inbox.pool().clone(), names, query_timeout),
            cfg,
        }
    }

    /// From the validated settings.
    pub fn from_settings(
        settings: &Settings,
        store: &Store,
        inbox: &Inbox,
    ) -> Result<Self, SettingsError> {
        Ok(Self::new(
            store,
            inbox,
            settings.outbox_names(),
            settings.inbox.query_timeout,
            OutboundConfig::from_settings(settings)?,
        ))
    }
}
