//! Our own copy of each message's raw text (`raw_copy`, migration 0013; issue 13 item 4, seed
//! §9 / §12 G10): zlib-compressed, written by the pump in the business transaction that records
//! the message's outcome ([`GroupTx::write_raw_copies`]), read back when the inbox row is gone
//! ([`Store::raw_copies`]), deleted once older than `retention.replay_window`
//! ([`purge_expired_raw_copies`], one bounded batch per call).
//!
//! Why the pump's transaction and not the enqueue: the pump has the text in memory already
//! (the poller never reads it — discovery reads ids only), so a copy costs one compression and
//! one `INSERT … SELECT FROM UNNEST` per group instead of a text read per discovered row. A row
//! the owner purges before it is processed (never marked: a breach of §6, "marks before purge")
//! has no copy; the pump records it DEAD(MALFORMED) as before.

use std::io::{Read as _, Write as _};

use chrono::{DateTime, Utc};
use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;
use flate2::Compression;
use sqlx::PgPool;

use super::{GroupTx, Store, StoreError};
use crate::inbox::RawMessage;

/// `raw_copy.encoding` of what [`compress`] writes.
pub const ENCODING: &str = "zlib";

/// A copy ready to be written: the message, its text's length, the compressed text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCopy {
    /// The message.
    pub msg_id: i64,
    /// UTF-8 length of the raw text.
    pub raw_bytes: i32,
    /// The text, compressed.
    pub body: Vec<u8>,
}

impl PendingCopy {
    /// Compresses `text` (zlib, fast level: messages are small XML, CPU is on the pump's
    /// path). None for a text over 2 GiB (a copy cannot hold it; the inbox limit
    /// `processing.max_message_bytes` keeps texts far below).
    pub fn of(msg_id: i64, text: &str) -> Result<Option<Self>, StoreError> {
        let Ok(raw_bytes) = i32::try_from(text.len()) else {
            return Ok(None);
        };
        if raw_bytes == 0 {
            return Ok(None);
        }
        Ok(Some(Self {
            msg_id,
            raw_bytes,
            body: compress(text)?,
        }))
    }
}

/// zlib at the fast level.
pub fn compress(text: &str) -> Result<Vec<u8>, StoreError> {
    let mut enc = ZlibEncoder::new(Vec::with_capacity(text.len() / 3 + 64), Compression::fast());
    enc.write_all(text.as_bytes())
        .and_then(|()| enc.finish())
        .map_err(|e| StoreError::Corrupt(format!("compressing a raw copy: {e}")))
}

/// The text back from a zlib `body` whose text was `raw_bytes` long; reads at most
/// `raw_bytes + 1` bytes, so a damaged body cannot inflate without bound.
pub fn decompress(body: &[u8], raw_bytes: i32) -> Result<String, StoreError> {
    let want = u64::try_from(raw_bytes)
        .map_err(|_| StoreError::Corrupt(format!("raw copy length {raw_bytes}")))?;
    let mut out = Vec::with_capacity(want as usize);
    ZlibDecoder::new(body)
        .take(want + 1)
        .read_to_end(&mut out)
        .map_err(|e| StoreError::Corrupt(format!("raw copy is not zlib: {e}")))?;
    if out.len() as u64 != want {
        return Err(StoreError::Corrupt(format!(
            "raw copy inflates to {} bytes, recorded {want}",
            out.len()
        )));
    }
    String::from_utf8(out).map_err(|e| StoreError::Corrupt(format!("raw copy is not UTF-8: {e}")))
}

/// One raw copy read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredCopy {
    /// The text (or `TooLarge` when it exceeds the limit asked with).
    Found(RawMessage),
    /// The copy exists but does not read back (reported, treated as no text).
    Corrupt(String),
}

impl GroupTx {
    /// Writes the copies of a group's members in the group's transaction: ONE statement.
    /// A message processed again (a replay) keeps its stored copy; only `copied_at` moves, so
    /// its replay window starts again.
    pub async fn write_raw_copies(
        &mut self,
        copies: &[PendingCopy],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if copies.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = copies.iter().map(|c| c.msg_id).collect();
        let lens: Vec<i32> = copies.iter().map(|c| c.raw_bytes).collect();
        let bodies: Vec<&[u8]> = copies.iter().map(|c| c.body.as_slice()).collect();
        sqlx::query(
            "INSERT INTO raw_copy (msg_id, copied_at, raw_bytes, encoding, body) \
             SELECT u.id, $4, u.len, $5, u.body \
             FROM UNNEST($1::bigint[], $2::int[], $3::bytea[]) AS u(id, len, body) \
             ON CONFLICT (msg_id) DO UPDATE SET copied_at = EXCLUDED.copied_at",
        )
        .bind(&ids)
        .bind(&lens)
        .bind(&bodies)
        .bind(now)
        .bind(ENCODING)
        .execute(self.conn())
        .await?;
        Ok(())
    }
}

impl Store {
    /// The copies of these messages that exist (one statement), decompressed; a text longer
    /// than `max_bytes` comes back `TooLarge` without being inflated.
    pub async fn raw_copies(
        &self,
        ids: &[i64],
        max_bytes: u64,
    ) -> Result<Vec<(i64, StoredCopy)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(i64, i32, String, Vec<u8>)> = sqlx::query_as(
            "SELECT msg_id, raw_bytes, encoding, body FROM raw_copy WHERE msg_id = ANY($1) \
             ORDER BY msg_id",
        )
        .bind(ids)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, len, encoding, body)| {
                let copy = if encoding != ENCODING {
                    StoredCopy::Corrupt(format!("unknown raw copy encoding `{encoding}`"))
                } else if u64::try_from(len).unwrap_or(0) > max_bytes {
                    StoredCopy::Found(RawMessage::TooLarge(u64::try_from(len).unwrap_or(0)))
                } else {
                    match decompress(&body, len) {
                        Ok(text) => StoredCopy::Found(RawMessage::Text(text)),
                        Err(e) => StoredCopy::Corrupt(e.to_string()),
                    }
                };
                (id, copy)
            })
            .collect())
    }

    /// Copies and their sizes: `(rows, raw bytes, stored bytes)` (benches, status).
    pub async fn raw_copy_totals(&self) -> Result<(i64, i64, i64), StoreError> {
        Ok(sqlx::query_as(
            "SELECT count(*), COALESCE(sum(raw_bytes), 0)::bigint, \
                    COALESCE(sum(octet_length(body)), 0)::bigint FROM raw_copy",
        )
        .fetch_one(self.pool())
        .await?)
    }
}

/// Deletes ONE batch of at most `batch_limit` expired copies — written (last) before
/// `before`, i.e. `now − retention.replay_window` — oldest first, and returns how many it
/// deleted; the caller (housekeeping) repeats while a batch comes back full. One short
/// autocommit statement per batch: it never holds the pipeline lock, and rows another
/// statement holds are skipped (`SKIP LOCKED`), not waited for. A copy whose message is
/// PENDING or FAILED (replayed, waiting for the pump) is kept, however old: the pump refreshes
/// it when it processes the message.
pub async fn purge_expired_raw_copies(
    pool: &PgPool,
    before: DateTime<Utc>,
    batch_limit: i64,
) -> Result<u64, StoreError> {
    if batch_limit <= 0 {
        return Ok(0);
    }
    let done = sqlx::query(
        "WITH doomed AS ( \
             SELECT r.msg_id FROM raw_copy r \
             WHERE r.copied_at < $1 \
               AND NOT EXISTS (SELECT 1 FROM proc_state p \
                               WHERE p.msg_id = r.msg_id AND p.state IN ('PENDING', 'FAILED')) \
             ORDER BY r.copied_at LIMIT $2 \
             FOR UPDATE OF r SKIP LOCKED \
         ) \
         DELETE FROM raw_copy r USING doomed d WHERE r.msg_id = d.msg_id",
    )
    .bind(before)
    .bind(batch_limit)
    .execute(pool)
    .await?;
    let rows = done.rows_affected();
    crate::telemetry::raw_copies_purged(rows, before.timestamp());
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_shrinks_xml() {
        let text = "<MSG><META><SNDR>AODB</SNDR></META><FLOP>".to_string()
            + &"<FLIGHT><FLID>1</FLID><GATE>A1</GATE></FLIGHT>".repeat(50)
            + "</FLOP></MSG>";
        let copy = PendingCopy::of(7, &text)
            .expect("compress")
            .expect("a copy");
        assert_eq!(copy.raw_bytes as usize, text.len());
        assert!(copy.body.len() * 4 < text.len(), "{}", copy.body.len());
        assert_eq!(
            decompress(&copy.body, copy.raw_bytes).expect("inflate"),
            text
        );
    }

    #[test]
    fn unicode_survives() {
        let text = "<MSG>航班 ✈ 延误</MSG>";
        let body = compress(text).expect("compress");
        assert_eq!(decompress(&body, text.len() as i32).expect("inflate"), text);
    }

    #[test]
    fn damage_is_reported_not_inflated() {
        let body = compress("<MSG>hello</MSG>").expect("compress");
        assert!(matches!(decompress(&body, 5), Err(StoreError::Corrupt(_))));
        assert!(matches!(decompress(&body, 99), Err(StoreError::Corrupt(_))));
        assert!(matches!(
            decompress(b"not zlib", 8),
            Err(StoreError::Corrupt(_))
        ));
        assert!(PendingCopy::of(1, "").expect("empty").is_none());
    }
}
