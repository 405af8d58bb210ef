//! What a topic already holds, read `read_committed` from given offsets to its end: the
//! exactly-once dispatcher's start-up question "which of my events did a committed transaction
//! deliver without the store knowing?" (`kafka.delivery = "exactly-once"`).
//!
//! Run after `init_transactions`: that call aborts the previous holder's open transaction, so
//! nothing of ours still open can commit later. Another producer's transaction (a neighbour
//! on a shared topic) may still be open and hold a partition's last stable offset below
//! records of ours committed after it: the scan waits for it (see [`scan`]). Where each
//! partition's read starts is the caller's durable cursor (the scan floor and the highest
//! offset written SENT): never the partition's beginning, except where the caller asks for
//! partitions without a cursor (the at-least-once read-back after an upgrade).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::consumer::{read_committed, read_uncommitted, ConsumerError, RecordIdentity};
use super::context::TracingContext;
use super::watermarks::watermarks;
use crate::settings::KafkaSettings;
use crate::telemetry;

/// One committed record read, whoever wrote it, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// What it says of its event.
    pub identity: RecordIdentity,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// What one scan of a topic read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Every committed record read.
    pub found: Vec<Found>,
    /// Each partition's end when the scan began: the floors to record once what was found is
    /// written.
    pub ends: Vec<(i32, i64)>,
    /// Partitions whose end lay below where the scan was to start: the topic was recreated or
    /// truncated, so they were read from their first offset.
    pub recreated: Vec<i32>,
}

/// Why the topic could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// The consumer could not be assigned or read.
    #[error("kafka recovery consumer: {0}")]
    Consumer(#[from] KafkaError),
    /// The consumer could not be built.
    #[error("kafka recovery: {0}")]
    Build(#[from] ConsumerError),
    /// The end was not reached in time.
    #[error("kafka recovery: {topic} not read to its end within {limit:?}")]
    Timeout {
        /// The topic.
        topic: String,
        /// The limit.
        limit: Duration,
    },
    /// Another producer's transaction held a partition's last stable offset below the end
    /// seen at start for longer than `kafka.open_transaction_wait`: what committed past it
    /// cannot be read yet, so the start is retried.
    #[error(
        "kafka recovery: {topic} partition {partition}: another producer's open transaction \
         holds the last stable offset at {stable}, below the end {end} seen at start, after \
         {waited:?} (kafka.open_transaction_wait): retried"
    )]
    HeldBack {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// Its last stable offset.
        stable: i64,
        /// Its end (high watermark) when the scan began.
        end: i64,
        /// How long the scan waited.
        waited: Duration,
    },
    /// Records the scan must read are gone (retention deleted them first): events of ours
    /// committed there cannot be told from undelivered ones, so delivery stops here.
    #[error(
        "kafka recovery: {topic} partition {partition} starts at offset {log_start}, but \
         records from offset {from} had to be read (retention deleted them first): events \
         committed there cannot be told from undelivered ones, so delivery stops; to re-send \
         them (consumers drop duplicates by ce_id) set that partition's floor to {log_start} \
         (docs/operations.md, \"How a start knows what Kafka holds\")"
    )]
    Gap {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// Where the scan had to start.
        from: i64,
        /// The partition's first offset now.
        log_start: i64,
    },
}

/// How long a scan may take: reading (`read`), and, while another producer's open transaction
/// holds a partition's last stable offset below the end seen at start, as long again as that
/// producer's transaction may stay open (`open_wait`: the broker's
/// `transaction.max.timeout.ms`, `kafka.open_transaction_wait`); and what it does with a
/// partition that has no cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanLimits {
    /// Reading what is readable.
    pub read: Duration,
    /// Waiting out a held-back last stable offset, besides.
    pub open_wait: Duration,
    /// A partition with neither a floor nor a recorded offset is read from its first offset
    /// (true) or not at all (false: the exactly-once start, where every partition a commit of
    /// ours can land on has a cursor first). The at-least-once read-back after an upgrade
    /// reads it: the previous release recorded no cursor before its sends.
    pub uncursored_from_start: bool,
}

/// Every committed record of `topic` from each partition's start to its end, the end being the
/// high watermark when the scan began (asked `read_uncommitted`: every record written, whether
/// its transaction is open, committed or aborted). A partition's start is the higher of
/// `floors` and one past `recorded` (the highest offset written SENT or DEAD); with neither,
/// nothing of ours can be there and it is not read (unless `limits.uncursored_from_start`:
/// then from its first offset). A partition whose last stable offset is
/// held below that end by an open transaction is waited for (KIP-98: a `read_committed`
/// reader decides nothing past the LSO) up to `limits.open_wait`; past it the scan fails and
/// the start is retried. Blocking: run off the async thread.
pub fn scan(
    k: &KafkaSettings,
    bootstrap: &str,
    topic: &str,
    floors: &HashMap<i32, i64>,
    recorded: &HashMap<i32, i64>,
    limits: ScanLimits,
) -> Result<Scan, RecoverError> {
    let c = read_committed(k, bootstrap, "recovery")?;
    let whole = read_uncommitted(k, bootstrap, "recovery-ends")?;
    let mut out = Scan::default();
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for (p, low, high) in watermarks(whole.client(), topic, limits.read)? {
        out.ends.push((p, high));
        let start = [floors.get(&p).copied(), recorded.get(&p).map(|o| o + 1)]
            .into_iter()
            .flatten()
            .max();
        let from = match start {
            None if limits.uncursored_from_start => low,
            None => continue,
            // Past every record ever written there (the true end, not a held-back LSO): the
            // log we recorded is gone.
            Some(s) if s > high => {
                out.recreated.push(p);
                low
            }
            Some(s) if s < low => {
                return Err(RecoverError::Gap {
                    topic: topic.to_string(),
                    partition: p,
                    from: s,
                    log_start: low,
                })
            }
            Some(s) => s,
        };
        if from < high {
            tpl.add_partition_offset(topic, p, Offset::Offset(from))?;
            ends.insert(p, high);
        }
    }
    if !ends.is_empty() {
        c.assign(&tpl)?;
        out.found = read_to_ends(&c, topic, ends, limits)?;
    }
    Ok(out)
}

/// Polls until every partition in `ends` reported its end (`read_committed`: its last stable
/// offset) at or past the high watermark seen at start. A partition reporting its end below
/// that is held back by an open transaction: logged, counted, waited for.
fn read_to_ends(
    c: &BaseConsumer<TracingContext>,
    topic: &str,
    mut ends: HashMap<i32, i64>,
    limits: ScanLimits,
) -> Result<Vec<Found>, RecoverError> {
    let start = Instant::now();
    let mut held = HeldBack::new(topic);
    let mut out = Vec::new();
    while !ends.is_empty() {
        if let Some(e) = held.timed_out(start.elapsed(), limits) {
            return Err(e);
        }
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => out.push(Found {
                identity: RecordIdentity::of(&m),
                partition: m.partition(),
                offset: m.offset(),
            }),
            Some(Err(KafkaError::PartitionEOF(p))) => {
                let pos = position(c, topic, p);
                match ends.get(&p).copied() {
                    Some(end) if pos >= end => {
                        ends.remove(&p);
                        held.released(p, start.elapsed());
                    }
                    Some(end) => held.at(p, pos, end),
                    None => {}
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    Ok(out)
}

/// The partitions of one scan whose last stable offset lies below the end seen at start.
struct HeldBack<'a> {
    topic: &'a str,
    /// Partition → (last stable offset seen, end seen at start).
    partitions: HashMap<i32, (i64, i64)>,
}

impl<'a> HeldBack<'a> {
    fn new(topic: &'a str) -> Self {
        Self {
            topic,
            partitions: HashMap::new(),
        }
    }

    /// `p`'s end is reported at `stable`, below `end`.
    fn at(&mut self, p: i32, stable: i64, end: i64) {
        if self.partitions.insert(p, (stable, end)).is_none() {
            telemetry::RecoveryHeldBack {
                topic: self.topic,
                partition: p,
                stable,
                end,
                partitions: self.partitions.len(),
            }
            .emit();
        }
    }

    /// `p` was read to its end.
    fn released(&mut self, p: i32, waited: Duration) {
        if self.partitions.remove(&p).is_some() {
            telemetry::recovery_released(self.topic, p, waited, self.partitions.len());
        }
    }

    /// The error to stop with, once the time allowed is over.
    fn timed_out(&self, elapsed: Duration, limits: ScanLimits) -> Option<RecoverError> {
        let Some((&partition, &(stable, end))) = self.partitions.iter().next() else {
            return (elapsed > limits.read).then(|| RecoverError::Timeout {
                topic: self.topic.to_string(),
                limit: limits.read,
            });
        };
        (elapsed > limits.read + limits.open_wait).then(|| RecoverError::HeldBack {
            topic: self.topic.to_string(),
            partition,
            stable,
            end,
            waited: elapsed,
        })
    }
}

impl Drop for HeldBack<'_> {
    fn drop(&mut self) {
        telemetry::recovery_held_back_partitions(0);
    }
}

fn position(c: &BaseConsumer<TracingContext>, topic: &str, p: i32) -> i64 {
    c.position()
        .ok()
        .and_then(|tpl| {
            tpl.find_partition(topic, p)
                .and_then(|e| e.offset().to_raw())
        })
        .unwrap_or(-1)
}
