//! What the exactly-once recovery keeps in the store besides `MSG_EVENT` (migration 0018): the
//! scan floors (per topic and partition, an offset below which no record of ours is unknown to
//! the store), the deployment's one `transactional.id`, and the identities (`ce_id`) that tell
//! our records from anybody else's on a shared topic.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::{Store, StoreError};
use crate::rows::EventState;

/// One event's identity and state, for matching a record read back from Kafka.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EventIdentity {
    /// `MSG_EVENT.EVENT_ID` (the record's `ce_msgxevent` header).
    pub event_id: i64,
    /// The event's `ce_id` (a UUID; NULL on an event of an older release never sent since).
    pub ce_id: Option<String>,
    /// Its dead-letter copy's `ce_id` (migration 0022; NULL before it).
    pub dead_ce_id: Option<String>,
    /// The inbox message it came from.
    pub msg_id: i64,
    /// Its Kafka key.
    pub flight_key: String,
    /// When the pump made it.
    pub created_at: DateTime<Utc>,
    /// Its state now.
    pub state: EventState,
}

/// How [`Store::upsert_floors`] treats a partition that has a floor already.
#[derive(Debug, Clone, Copy)]
enum FloorWrite {
    /// To the higher of the two (floors never go down).
    Raise,
    /// Left alone.
    IfAbsent,
    /// Replaced (a recreated partition only).
    Set,
}

/// The `transactional.id` recorded for this store differs from the one configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "kafka.transactional_id is `{configured}` but this store's deployment uses `{recorded}` \
     (recorded at its first exactly-once start): two ids would fence nothing; set \
     kafka.transactional_id = \"{recorded}\" or leave it empty"
)]
pub struct TransactionalIdMismatch {
    /// The one in the store.
    pub recorded: String,
    /// The one this instance was given.
    pub configured: String,
}

impl Store {
    /// Per partition of `topic`: the recorded floor (absent: none recorded for that partition).
    pub async fn scan_floors(&self, topic: &str) -> Result<HashMap<i32, i64>, StoreError> {
        let rows: Vec<(i32, i64)> = sqlx::query_as(
            "SELECT kafka_partition, next_offset FROM dispatch_scan_floor WHERE topic = $1",
        )
        .bind(topic)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().collect())
    }

    /// Raises the floors of `topic` to `ends` (partition → end offset); a floor never goes
    /// down here (a requeue may have raised it past a dead-letter copy). Call only while no
    /// transaction of ours is open and every committed one is written: then nothing of ours
    /// below these offsets is unknown to the store. Partitions without a floor get one.
    pub async fn record_scan_floors(
        &self,
        topic: &str,
        ends: &[(i32, i64)],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.upsert_floors(topic, ends, now, FloorWrite::Raise)
            .await
    }

    /// Gives each partition of `topic` in `first` (partition → the first offset of ours a
    /// transaction about to commit wrote there) a floor, where it has none: before the
    /// commit, so no committed record of ours ever lies on a partition the recovery would
    /// not read. An existing floor is left alone (it lies at or below every record of ours
    /// not yet written SENT/DEAD; raising it could pass one).
    pub async fn ensure_scan_floors(
        &self,
        topic: &str,
        first: &[(i32, i64)],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.upsert_floors(topic, first, now, FloorWrite::IfAbsent)
            .await
    }

    /// Sets the floors of partitions of `topic` found recreated (their end lies below the
    /// floor: the old log is gone) to the new log's end: the one write that lowers a floor.
    pub async fn reset_scan_floors(
        &self,
        topic: &str,
        ends: &[(i32, i64)],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.upsert_floors(topic, ends, now, FloorWrite::Set).await
    }

    async fn upsert_floors(
        &self,
        topic: &str,
        ends: &[(i32, i64)],
        now: DateTime<Utc>,
        how: FloorWrite,
    ) -> Result<(), StoreError> {
        if ends.is_empty() {
            return Ok(());
        }
        let parts: Vec<i32> = ends.iter().map(|e| e.0).collect();
        let offsets: Vec<i64> = ends.iter().map(|e| e.1.max(0)).collect();
        macro_rules! upsert {
            ($on_conflict:literal) => {
                concat!(
                    "INSERT INTO dispatch_scan_floor \
                     (topic, kafka_partition, next_offset, recorded_at) \
                     SELECT $1, p, min(o), $4 FROM UNNEST($2::int[], $3::bigint[]) AS u(p, o) \
                     GROUP BY p ON CONFLICT (topic, kafka_partition) ",
                    $on_conflict
                )
            };
        }
        let sql = match how {
            FloorWrite::Raise => upsert!(
                "DO UPDATE SET next_offset = GREATEST(dispatch_scan_floor.next_offset, \
                 EXCLUDED.next_offset), recorded_at = EXCLUDED.recorded_at"
            ),
            FloorWrite::IfAbsent => upsert!("DO NOTHING"),
            FloorWrite::Set => upsert!(
                "DO UPDATE SET next_offset = EXCLUDED.next_offset, \
                 recorded_at = EXCLUDED.recorded_at"
            ),
        };
        sqlx::query(sql)
            .bind(topic)
            .bind(&parts)
            .bind(&offsets)
            .bind(now)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Per partition, the highest offset recorded on `topic` for an event (rows of an older
    /// release carry no topic: theirs count for `legacy_state`'s topic, SENT → the events
    /// topic, DEAD → the dead-letter topic). Outcome writes are in order, one statement each,
    /// so nothing of ours below these offsets is unknown to the store.
    pub async fn last_offsets(
        &self,
        topic: &str,
        legacy_state: EventState,
    ) -> Result<HashMap<i32, i64>, StoreError> {
        let rows = sqlx::query_as::<_, (i32, i64)>(
            "SELECT kafka_partition, max(kafka_offset) FROM msg_event \
             WHERE kafka_partition IS NOT NULL AND kafka_offset IS NOT NULL \
               AND (kafka_topic = $1 OR (kafka_topic IS NULL AND state = $2)) \
             GROUP BY kafka_partition",
        )
        .bind(topic)
        .bind(legacy_state)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().collect())
    }

    /// A partition of `topic` was recreated (its end lies below what we recorded): the offsets
    /// recorded there point into a log that is gone, and would hold the next scans' start above
    /// the new log's records. They are kept for the record under a retired topic name
    /// (`<topic>@retired-<time>`), which no scan and no `verify --kafka` reads. Rare and whole:
    /// one statement over the partition's rows.
    pub async fn retire_offsets(
        &self,
        topic: &str,
        partition: i32,
        legacy_state: EventState,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let retired = format!("{topic}@retired-{}", now.format("%Y%m%dT%H%M%S%.3fZ"));
        let done = sqlx::query(
            "UPDATE msg_event SET kafka_topic = $4 \
             WHERE kafka_partition = $2 \
               AND (kafka_topic = $1 OR (kafka_topic IS NULL AND state = $3))",
        )
        .bind(topic)
        .bind(partition)
        .bind(legacy_state)
        .bind(&retired)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }

    /// The identities and states of `event_ids` (absent ids are not ours).
    pub async fn event_identities(
        &self,
        event_ids: &[i64],
    ) -> Result<Vec<EventIdentity>, StoreError> {
        if event_ids.is_empty() {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_as(
            "SELECT event_id, ce_id::text AS ce_id, dead_ce_id::text AS dead_ce_id, msg_id, \
                    flight_key, created_at, state FROM msg_event \
             WHERE event_id = ANY($1)",
        )
        .bind(event_ids)
        .fetch_all(self.pool())
        .await?)
    }

    /// True while a PENDING event an earlier release made is left (migration 0022's
    /// `made_by_uuid_release` NULL): the previous release may have sent it under its own
    /// identity, so an at-least-once start reads the topics back for its copies.
    pub async fn pending_made_by_earlier_release(&self) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM msg_event \
             WHERE state = 'PENDING' AND made_by_uuid_release IS NULL)",
        )
        .fetch_one(self.pool())
        .await?)
    }

    /// The deployment's `transactional.id`, if one was recorded.
    pub async fn transactional_id(&self) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT transactional_id FROM dispatch_producer WHERE id = 1")
                .fetch_optional(self.pool())
                .await?,
        )
    }

    /// The `transactional.id` this instance must use: the recorded one; at the first
    /// exactly-once start, `default` (recorded now, through the fenced store). `configured`
    /// (`kafka.transactional_id`, "" = not set) must match the recorded one when set.
    pub async fn claim_transactional_id(
        &self,
        configured: &str,
        default: &str,
        now: DateTime<Utc>,
    ) -> Result<Result<String, TransactionalIdMismatch>, StoreError> {
        let configured = configured.trim();
        let wanted = if configured.is_empty() {
            default
        } else {
            configured
        };
        sqlx::query(
            "INSERT INTO dispatch_producer (id, transactional_id, recorded_at) \
             VALUES (1, $1, $2) ON CONFLICT (id) DO NOTHING",
        )
        .bind(wanted)
        .bind(now)
        .execute(self.pool())
        .await?;
        let recorded = self.transactional_id().await?.unwrap_or_default();
        Ok(check_transactional_id(&recorded, configured))
    }

    /// Fails (fenced, [`StoreError::is_fenced`]) unless this instance's lease epoch is still
    /// the current one: a statement on a fenced table that changes nothing, so the fence
    /// trigger (migration 0006) runs and nothing else does. Right before a Kafka commit: a
    /// holder that lost the lease commits nothing more.
    pub async fn confirm_fence(&self) -> Result<(), StoreError> {
        sqlx::query("UPDATE dispatch_producer SET recorded_at = recorded_at WHERE false")
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

/// The recorded id, or why `configured` may not be used.
pub fn check_transactional_id(
    recorded: &str,
    configured: &str,
) -> Result<String, TransactionalIdMismatch> {
    let configured = configured.trim();
    if !configured.is_empty() && configured != recorded {
        return Err(TransactionalIdMismatch {
            recorded: recorded.to_string(),
            configured: configured.to_string(),
        });
    }
    Ok(recorded.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_id_must_be_the_recorded_one_and_empty_takes_it() {
        assert_eq!(
            check_transactional_id("site.t", "").as_deref(),
            Ok("site.t")
        );
        assert_eq!(
            check_transactional_id("site.t", " site.t ").as_deref(),
            Ok("site.t")
        );
        let e = check_transactional_id("site.t", "host2.t").expect_err("differs");
        assert_eq!(e.recorded, "site.t");
        assert!(e.to_string().contains("kafka.transactional_id"));
    }
}
