//! Reading our own topics back: a `read_committed` consumer with `[kafka]`'s connection and
//! security settings that assigns its partitions itself (no group commits), and the identity a
//! record carries (`ce_id`, `ce_msgxevent`). The exactly-once start-up recovery (`recover`) and
//! `verify --kafka` read with it.

use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{ClientConfig, Message};

use super::context::TracingContext;
use super::producer::{security, ProducerError};
use crate::settings::KafkaSettings;

/// Why the consumer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// librdkafka refused the configuration or could not create the client.
    #[error("kafka consumer: {0}")]
    Kafka(#[from] KafkaError),
    /// `kafka.extra` could not be read.
    #[error(transparent)]
    Config(#[from] ProducerError),
}

/// A `read_committed` consumer named `<client_id>-<purpose>` (group
/// `<transactional_id>-<purpose>`, never committed: the ACLs of docs/operations.md), reporting
/// each partition's end (`PartitionEOF`) and reading from the start of a partition whose start
/// offset retention deleted. Only what a transaction committed is read: an aborted round's
/// records are never taken for delivered ones.
pub fn read_committed(
    k: &KafkaSettings,
    bootstrap: &str,
    purpose: &str,
) -> Result<BaseConsumer<TracingContext>, ConsumerError> {
    reader(k, bootstrap, purpose, "read_committed")
}

/// The same consumer `read_uncommitted`: only for the partitions' true ends (a `ListOffsets`
/// of a `read_committed` client answers the last stable offset, which another producer's open
/// transaction holds back below records already committed after it).
pub fn read_uncommitted(
    k: &KafkaSettings,
    bootstrap: &str,
    purpose: &str,
) -> Result<BaseConsumer<TracingContext>, ConsumerError> {
    reader(k, bootstrap, purpose, "read_uncommitted")
}

fn reader(
    k: &KafkaSettings,
    bootstrap: &str,
    purpose: &str,
    isolation: &str,
) -> Result<BaseConsumer<TracingContext>, ConsumerError> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("client.id", format!("{}-{purpose}", k.client_id))
        .set("group.id", format!("{}-{purpose}", k.transactional_id()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", isolation);
    security(&mut c, k);
    for (key, value) in k
        .extra_pairs()
        .map_err(|e| ProducerError::Config(e.to_string()))?
    {
        c.set(key, value);
    }
    Ok(c.create_with_context(TracingContext)?)
}

/// The extension header carrying `MSG_EVENT.EVENT_ID` (a number, unique only in one store).
/// Written by the dispatcher's CloudEvents headers (`dispatch::cloudevents`), read back here:
/// the record's identity belongs to the broker adapter, so the adapter owns its name.
pub const EVENT_HEADER: &str = "ce_msgxevent";

/// What a record says of its event: `ce_id` and the `ce_msgxevent` event id (either absent
/// on a record that is not an event of this service), and what tells a record of the previous
/// release (no `ce_msgxevent`, its number as `ce_id`) for one of ours: its inbox message,
/// time and key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordIdentity {
    /// The `ce_id` header.
    pub ce_id: Option<String>,
    /// The `ce_msgxevent` header, as a number.
    pub event_id: Option<i64>,
    /// The `ce_msgxmsgid` header, as a number.
    pub msg_id: Option<i64>,
    /// The `ce_time` header.
    pub time: Option<String>,
    /// The `ce_subject` header (the record's flight key).
    pub subject: Option<String>,
}

impl RecordIdentity {
    /// Read from a record's headers.
    pub fn of(m: &BorrowedMessage<'_>) -> Self {
        let header = |name: &str| {
            m.headers()?
                .iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value)
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(str::to_string)
        };
        Self {
            ce_id: header("ce_id"),
            event_id: header(EVENT_HEADER).and_then(|v| v.parse().ok()),
            msg_id: header("ce_msgxmsgid").and_then(|v| v.parse().ok()),
            time: header("ce_time"),
            subject: header("ce_subject"),
        }
    }

    /// The event number the record names: its `ce_msgxevent`, or on a record of the
    /// previous release (none) its numeric `ce_id`.
    pub fn number(&self) -> Option<i64> {
        match self.event_id {
            Some(n) => Some(n),
            None => self.ce_id.as_deref()?.parse().ok(),
        }
    }

    /// True when this record is `event_id` of ours with `ce_id` (the event's UUID; NULL on
    /// an event an older release sent with its number as `ce_id`).
    pub fn is(&self, event_id: i64, ce_id: Option<&str>) -> bool {
        match ce_id {
            Some(uuid) => {
                self.event_id == Some(event_id)
                    && self
                        .ce_id
                        .as_deref()
                        .is_some_and(|c| c.eq_ignore_ascii_case(uuid))
            }
            None => self.is_older_release_of(event_id),
        }
    }

    /// True when this record is how an older release sent `event_id`: its number as `ce_id`
    /// and no `ce_msgxevent`. During a rolling upgrade the previous release still sends events
    /// the new schema gave a UUID; `verify --kafka` accepts that copy at its recorded offset
    /// (the store wrote the offset from our own ack). The number alone never makes it ours
    /// for the recovery: another store's older release numbers its events the same way
    /// ([`Self::is_previous_release_copy`]).
    pub fn is_older_release_of(&self, event_id: i64) -> bool {
        self.event_id.is_none() && self.ce_id.as_deref() == Some(event_id.to_string().as_str())
    }

    /// True when this record is the previous release's copy of our event `event`: its number
    /// as `ce_id`, no `ce_msgxevent`, and the event's inbox message, key and creation time
    /// (to the millisecond): another store's event with the same number has another message
    /// and time. What the exactly-once recovery takes as ours after a rolling upgrade.
    pub fn is_previous_release_copy(&self, event: &EventFacts<'_>) -> bool {
        let same_time = self
            .time
            .as_deref()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .is_some_and(|t| t.timestamp_millis() == event.created_at.timestamp_millis());
        self.is_older_release_of(event.event_id)
            && self.msg_id == Some(event.msg_id)
            && self.subject.as_deref() == Some(event.flight_key)
            && same_time
    }
}

/// What the store knows of one event, to recognise the previous release's copy of it.
#[derive(Debug, Clone, Copy)]
pub struct EventFacts<'a> {
    /// `MSG_EVENT.EVENT_ID`.
    pub event_id: i64,
    /// The inbox message it came from.
    pub msg_id: i64,
    /// Its Kafka key.
    pub flight_key: &'a str,
    /// When the pump made it (the record's `ce_time`).
    pub created_at: chrono::DateTime<chrono::Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_ours_only_with_both_the_uuid_and_the_event_id() {
        let uuid = "0192a7b0-7c1e-4f6a-9d2b-3e4f5a6b7c8d";
        let r = RecordIdentity {
            ce_id: Some(uuid.into()),
            event_id: Some(7),
            ..RecordIdentity::default()
        };
        assert!(r.is(7, Some(uuid)));
        assert!(!r.is(8, Some(uuid)), "another event of ours");
        assert!(
            !r.is(7, Some("0192a7b0-7c1e-4f6a-9d2b-000000000000")),
            "event 7 of another store"
        );
        let legacy = RecordIdentity {
            ce_id: Some("7".into()),
            event_id: None,
            ..RecordIdentity::default()
        };
        assert!(
            legacy.is(7, None),
            "an older release's record of a row without a uuid"
        );
        assert!(
            !legacy.is(7, Some(uuid)),
            "never taken for a row with a uuid"
        );
        assert!(legacy.is_older_release_of(7));
        assert!(
            !r.is_older_release_of(7),
            "a record with ce_msgxevent is this release's"
        );
        assert!(!RecordIdentity::default().is(7, None));
    }

    #[test]
    fn a_previous_release_copy_is_ours_only_with_its_message_key_and_time() {
        use chrono::TimeZone;
        let created_at = chrono::Utc.with_ymd_and_hms(2026, 11, 30, 1, 2, 3).unwrap();
        let facts = EventFacts {
            event_id: 7,
            msg_id: 1007,
            flight_key: "CA1234-20261130-D",
            created_at,
        };
        let copy = RecordIdentity {
            ce_id: Some("7".into()),
            event_id: None,
            msg_id: Some(1007),
            time: Some("2026-11-30T01:02:03.000Z".into()),
            subject: Some("CA1234-20261130-D".into()),
        };
        assert_eq!(copy.number(), Some(7));
        assert!(copy.is_previous_release_copy(&facts));
        let other_store = RecordIdentity {
            msg_id: Some(99),
            ..copy.clone()
        };
        assert!(!other_store.is_previous_release_copy(&facts));
        let later = RecordIdentity {
            time: Some("2026-11-30T01:02:04.000Z".into()),
            ..copy.clone()
        };
        assert!(!later.is_previous_release_copy(&facts));
        let ours_now = RecordIdentity {
            event_id: Some(7),
            ..copy
        };
        assert!(!ours_now.is_previous_release_copy(&facts));
    }
}
