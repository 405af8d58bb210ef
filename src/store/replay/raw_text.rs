//! Where a replayed row's raw text comes from (seed §9, issue 13 item 4, issue 29 item 2):
//! the inbox texts the caller carried, else our `raw_copy` share-locked in the replay's
//! transaction, else none (the row is refused with [`NO_RAW_TEXT`]); and the copy a replay
//! applied from the inbox writes of its text. Separate from the action frame (`replay.rs`)
//! because it is the one part that reads and writes `raw_copy`.

use chrono::{DateTime, Utc};

use crate::rows::RawSource;
use crate::store::raw_copy;

/// The refusal of a replayable row without raw text.
pub const NO_RAW_TEXT: &str = "no raw text to replay from: the inbox row is gone (purged) and \
    there is no raw copy (retention.raw_copy was off when it was processed, or the copy expired \
    after retention.replay_window)";

/// A replayed row's text as the inbox holds it when the replay is asked for: `Some(text)`,
/// copied into `raw_copy` when the replay applies; `None` when the row holds text the caller
/// did not carry (over the copy limit): replayed from the inbox, without a copy.
pub type InboxText = (i64, Option<String>);

/// A replay applied from the inbox: its own copy of the text, in the replay's transaction
/// (see the module doc). A copy already there is replaced (the inbox text is the one the pump
/// would read now) and its replay window starts again.
pub(super) async fn copy_inbox_text(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    msg_id: i64,
    in_inbox: &[InboxText],
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let Ok(i) = in_inbox.binary_search_by_key(&msg_id, |t| t.0) else {
        return Ok(());
    };
    let Some(text) = in_inbox[i].1.as_deref() else {
        return Ok(());
    };
    let copy = match raw_copy::PendingCopy::of(msg_id, text) {
        Ok(Some(copy)) => copy,
        Ok(None) => return Ok(()),
        Err(e) => return Err(sqlx::Error::Protocol(e.to_string())),
    };
    sqlx::query(
        "INSERT INTO raw_copy (msg_id, copied_at, raw_bytes, encoding, body) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (msg_id) DO UPDATE SET copied_at = EXCLUDED.copied_at, \
             raw_bytes = EXCLUDED.raw_bytes, encoding = EXCLUDED.encoding, body = EXCLUDED.body",
    )
    .bind(msg_id)
    .bind(now)
    .bind(copy.raw_bytes)
    .bind(raw_copy::ENCODING)
    .bind(&copy.body)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Where a replayed row's raw text is: `Some(Inbox)` when the caller found it in the inbox,
/// else `Some(RawCopy)` when our copy exists (share-locked in `tx`), else None.
pub(super) async fn raw_source(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    msg_id: i64,
    in_inbox: &[InboxText],
) -> Result<Option<RawSource>, sqlx::Error> {
    if in_inbox.binary_search_by_key(&msg_id, |t| t.0).is_ok() {
        return Ok(Some(RawSource::Inbox));
    }
    let copy: Option<i64> =
        sqlx::query_scalar("SELECT msg_id FROM raw_copy WHERE msg_id = $1 FOR KEY SHARE")
            .bind(msg_id)
            .fetch_optional(&mut **tx)
            .await?;
    Ok(copy.map(|_| RawSource::RawCopy))
}
