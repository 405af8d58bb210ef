//! Optional read-back (`verify --kafka`): every SENT event is at the partition/offset the
//! store recorded, and the record there is that event: its `ce_id` UUID and its
//! `ce_msgxevent` number — or, during a rolling upgrade, the previous release's copy (its
//! number as `ce_id`, no `ce_msgxevent`) — never another store's event with the same number. A merge of two ordered streams per partition —
//! SENT events by offset (pages from PostgreSQL) and the partition read from the beginning —
//! so memory stays bounded at any size. Reads with its own consumer, never the producer's path.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::{Finding, VerifyError};
use crate::kafka::consumer::{read_committed, RecordIdentity};
use crate::settings::KafkaSettings;
use crate::store::Store;

/// Where to read.
#[derive(Debug, Clone)]
pub struct KafkaCheck {
    /// `host:port[,…]`.
    pub bootstrap: String,
    /// Connection and security settings (`[kafka]`).
    pub kafka: KafkaSettings,
    /// The events topic.
    pub topic: String,
    /// Longest wait for one record.
    pub poll_timeout: Duration,
}

const RULE: &str =
    "every SENT event is in Kafka at its recorded partition/offset with its own ce_id (UUID)";

pub(super) fn skipped() -> Finding {
    let mut f = Finding::new("kafka_readback", RULE);
    f.skipped = true;
    f.scope = "not run: needs --kafka (a real kafka.brokers)".to_string();
    f
}

pub(super) async fn run(
    store: &Store,
    k: &KafkaCheck,
    batch: i64,
    _sent: u64,
) -> Result<Finding, VerifyError> {
    let mut f = Finding::new("kafka_readback", RULE);
    let kerr = |e: KafkaError| VerifyError::Kafka(e.to_string());
    // Read committed: a SENT event's record is committed (exactly-once: an aborted round's
    // copy of the same event sits at another offset and is never read).
    let consumer = read_committed(&k.kafka, &k.bootstrap, "verify")
        .map_err(|e| VerifyError::Kafka(e.to_string()))?;
    let meta = consumer
        .fetch_metadata(Some(&k.topic), Duration::from_secs(10))
        .map_err(kerr)?;
    let partitions: Vec<i32> = meta
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    for p in partitions {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&k.topic, p, Offset::Beginning)
            .map_err(kerr)?;
        consumer.assign(&tpl).map_err(kerr)?;
        let mut after = -1i64;
        // The last record read that lies beyond the event being looked for.
        let mut ahead: Option<(i64, RecordIdentity)> = None;
        loop {
            let rows: Vec<(i64, Option<String>, i64)> = sqlx::query_as(
                "SELECT event_id, ce_id::text, kafka_offset FROM msg_event \
                 WHERE state = 'SENT' AND kafka_partition = $1 AND kafka_offset > $2 \
                   AND (kafka_topic = $4 OR kafka_topic IS NULL) \
                 ORDER BY kafka_offset LIMIT $3",
            )
            .bind(p)
            .bind(after)
            .bind(batch)
            .bind(&k.topic)
            .fetch_all(store.pool())
            .await?;
            let Some(last) = rows.last() else { break };
            after = last.2;
            for (event_id, uuid, offset) in rows {
                f.checked += 1;
                let found = loop {
                    if let Some((o, id)) = &ahead {
                        if *o >= offset {
                            break (*o == offset).then(|| id.clone());
                        }
                    }
                    let started = Instant::now();
                    let next = loop {
                        match consumer.poll(Duration::from_millis(200)) {
                            Some(Ok(m)) => break Some((m.offset(), RecordIdentity::of(&m))),
                            // At the end for now: waited for up to the poll timeout.
                            Some(Err(KafkaError::PartitionEOF(_))) | None
                                if started.elapsed() > k.poll_timeout =>
                            {
                                break None
                            }
                            Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                            Some(Err(e)) => return Err(kerr(e)),
                        }
                    };
                    match next {
                        Some(rec) => ahead = Some(rec),
                        None => break None,
                    }
                };
                let ours = |r: RecordIdentity| {
                    r.is(event_id, uuid.as_deref()) || r.is_older_release_of(event_id)
                };
                if !found.is_some_and(ours) {
                    f.violation(event_id);
                }
            }
        }
    }
    f.scope = format!(
        "every SENT event ({} events) against topic {} read from the beginning of each partition",
        f.checked, k.topic
    );
    Ok(f)
}
