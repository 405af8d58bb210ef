//! Read-ahead: the raw texts of a group's members, read in one inbox round trip outside any
//! transaction together with the candidates behind them, beside the group's stamp (a purged
//! row's text from our raw copy), then decoded — and compressed for our own copy when
//! `retention.raw_copy` is on. A member whose text or decode fails is prepared as DEAD or
//! FAILED here, without I/O; a missing row is read again for a while before it is DEAD.

use chrono::{DateTime, Utc};
use futures::FutureExt as _;

use super::{Member, PumpCore};
use crate::codec::{CodecError, DecodedMessage};
use crate::inbox::{InboxError, RawMessage};
use crate::pump::outcome::ErrorClass;
use crate::pump::rules::missing_row_is_final;
use crate::pump::stages::Stage;
use crate::store::{HeadRow, PendingCopy, StoreError, StoredCopy};
use crate::telemetry;

/// What one inbox read of raw texts returned.
pub(super) type TextRead = Result<Vec<(i64, RawMessage)>, InboxError>;

/// What the work outside PostgreSQL (raw read, decode) made of a member.
pub(super) enum Prepared {
    /// A terminal state without business work (DEAD).
    Dead(ErrorClass, String),
    /// FAILED with backoff; the group ends here.
    Fail(ErrorClass, String),
    /// FAILED(INFRA) by a store outage, not charged ([`PumpCore::outage`]); the group ends.
    Outage(String),
    /// Decoded: bind the identity, then the business work.
    Decoded(Box<DecodedMessage>),
}

impl PumpCore {
    /// The texts the group `ids` still needs read, or none when all are buffered: the first
    /// id not buffered and the candidates after it, up to `read_ahead` (at least the group).
    /// Resets the last read's failure; forgets the buffer when the head itself is not in it.
    pub(super) fn ahead_ids(&mut self, candidates: &[HeadRow], ids: &[i64]) -> Vec<i64> {
        self.ahead_error = None;
        self.ahead_outage = false;
        let Some(missing) = ids.iter().copied().find(|id| !self.ahead.contains_key(id)) else {
            return Vec::new();
        };
        if missing == ids[0] {
            self.ahead.clear();
        }
        let want = (self.cfg.read_ahead as usize).max(ids.len());
        candidates
            .iter()
            .map(|r| r.head.msg_id)
            .filter(|id| *id >= missing)
            .take(want)
            .collect()
    }

    /// One inbox round trip for the texts of `ids` (none when empty), outside any PostgreSQL
    /// transaction. It borrows only the inbox, so it runs beside the group's stamp.
    pub(super) async fn read_texts(&self, ids: &[i64]) -> Option<TextRead> {
        if ids.is_empty() {
            return None;
        }
        Some(
            self.inbox
                .raw_messages(ids, self.cfg.max_message_bytes)
                .await,
        )
    }

    /// On a backlog (a full page of heads), the texts of the `rows` rows after `last` (this
    /// group's last member) are read while the group runs, so the next group finds them
    /// buffered and its stamp goes alone: the inbox round trip leaves the pump's chain. The
    /// read runs as its own task (reads have no side effects); [`PumpCore::take_behind`]
    /// takes it only once it is done, never waiting for it.
    pub(super) fn read_behind(&mut self, last: i64, rows: usize) {
        self.drop_behind();
        let inbox = self.inbox.clone();
        let (limit, max_bytes) = (rows as u32, self.cfg.max_message_bytes);
        self.behind = Some(tokio::spawn(async move {
            inbox.raw_messages_after(last, limit, max_bytes).await
        }));
    }

    /// Buffers the texts [`PumpCore::read_behind`] read, if that read is done (a text already
    /// buffered stays); a read still running is dropped — the group reads its own texts, as
    /// it would without it — and so is a failed one (the group's own read meets the failure).
    pub(super) fn take_behind(&mut self) {
        let Some(read) = self.behind.take() else {
            return;
        };
        if !read.is_finished() {
            read.abort();
            return;
        }
        match read.now_or_never() {
            Some(Ok(Ok(texts))) => {
                for (id, raw) in texts {
                    self.ahead.entry(id).or_insert(raw);
                }
            }
            Some(Ok(Err(e))) => {
                tracing::debug!(error = %e, "the read behind the last group failed")
            }
            _ => {}
        }
    }

    /// Forgets every text read ahead or behind (the pump went idle, or a member failed: its
    /// retry, and the rows after it, are read anew).
    pub(super) fn forget_texts(&mut self) {
        self.ahead.clear();
        self.drop_behind();
    }

    fn drop_behind(&mut self) {
        if let Some(read) = self.behind.take() {
            read.abort();
        }
    }

    /// Buffers what [`PumpCore::read_texts`] read (a purged row's text from our raw copy); a
    /// failure is kept and fails the first member it left out.
    pub(super) async fn take_texts(&mut self, read: Option<TextRead>) {
        match read {
            None => {}
            Some(Ok(texts)) => {
                self.outages = 0;
                let gone: Vec<i64> = texts
                    .iter()
                    .filter(|(_, raw)| *raw == RawMessage::Missing)
                    .map(|(id, _)| *id)
                    .collect();
                self.ahead.extend(texts);
                if !gone.is_empty() {
                    self.read_copies(&gone).await;
                }
            }
            Some(Err(e)) => {
                self.ahead_outage = e.is_outage();
                self.ahead_error = Some(e.to_string());
            }
        }
    }

    /// Inbox rows that are gone (the DB owner purged them): their text from our raw copy
    /// where one exists (a replay after the purge). A copy that does not read back leaves the
    /// row `Missing`; a store failure fails the members like an inbox failure (INFRA), never
    /// "missing".
    async fn read_copies(&mut self, gone: &[i64]) {
        match self
            .store
            .raw_copies(gone, self.cfg.max_message_bytes)
            .await
        {
            Ok(copies) => {
                for (id, copy) in copies {
                    match copy {
                        StoredCopy::Found(raw) => {
                            if let RawMessage::Text(text) = &raw {
                                telemetry::raw_copy_read(id, text.len() as u64);
                            }
                            self.ahead.insert(id, raw);
                        }
                        StoredCopy::Corrupt(error) => telemetry::raw_copy_corrupt(id, &error),
                    }
                }
            }
            Err(e) => {
                for id in gone {
                    self.ahead.remove(id);
                }
                self.ahead_outage = e.is_outage();
                self.ahead_error = Some(format!("reading raw copies: {e}"));
            }
        }
    }

    /// Raw texts and decoding first (no I/O: read ahead), up to the first member that fails
    /// there (the group ends with it); then the copies of their texts, when kept.
    pub(super) fn prepare_stage(
        &mut self,
        members: &[Member],
        now: DateTime<Utc>,
    ) -> Result<(Vec<Prepared>, Vec<PendingCopy>), StoreError> {
        let mut timer = self.stages.time(Stage::Decode);
        let mut prepared = Vec::with_capacity(members.len());
        for m in members {
            let p = self.prepare(m, now);
            let stop = matches!(p, Prepared::Fail(..) | Prepared::Outage(_));
            prepared.push(p);
            if stop {
                break;
            }
        }
        timer.calls(prepared.len() as u64);
        drop(timer);
        // The compressing counts toward the copies' one call (their write, at the finish).
        let mut timer = self.cfg.raw_copy.then(|| self.stages.time(Stage::RawCopy));
        if let Some(t) = timer.as_mut() {
            t.calls(0);
        }
        let copies = self.copies_of(&members[..prepared.len()])?;
        Ok((prepared, copies))
    }

    /// Raw text and decode of a member (no I/O: the text was read ahead).
    fn prepare(&self, m: &Member, now: DateTime<Utc>) -> Prepared {
        let raw = match self.ahead.get(&m.row.head.msg_id) {
            Some(raw) => raw,
            None => {
                let detail = self
                    .ahead_error
                    .clone()
                    .unwrap_or_else(|| "raw message not read".into());
                if self.ahead_outage {
                    return Prepared::Outage(detail);
                }
                return Prepared::Fail(ErrorClass::Infra, detail);
            }
        };
        let text = match raw {
            RawMessage::Text(text) => text,
            RawMessage::Missing => return self.missing(m, now),
            RawMessage::Empty => {
                return Prepared::Dead(
                    ErrorClass::Malformed,
                    "inbox row has no message text".into(),
                )
            }
            RawMessage::TooLarge(len) => {
                let detail = format!(
                    "message of {len} bytes exceeds processing.max_message_bytes {}",
                    self.cfg.max_message_bytes
                );
                return Prepared::Dead(ErrorClass::Malformed, detail);
            }
        };
        match self.codec.decode(text) {
            Ok(msg) => Prepared::Decoded(Box::new(msg)),
            Err(CodecError::Malformed(d)) => Prepared::Dead(ErrorClass::Malformed, d),
            Err(CodecError::Unsupported(d)) => Prepared::Fail(ErrorClass::Unsupported, d),
            Err(CodecError::Codec(d)) => Prepared::Fail(ErrorClass::CodecError, d),
        }
    }

    /// A member whose inbox row is missing (and has no raw copy): DEAD(MALFORMED) once
    /// [`missing_row_is_final`], else FAILED to be read again (the failure clears the
    /// read-ahead buffer, so its retry reads the inbox anew).
    fn missing(&self, m: &Member, now: DateTime<Utc>) -> Prepared {
        const MISSING: &str = "inbox row missing when reading the raw message";
        let head = &m.row.head;
        if missing_row_is_final(m.attempts, head.processing_started_at, now, &self.cfg.rules) {
            return Prepared::Dead(ErrorClass::Malformed, MISSING.into());
        }
        let grace = humantime::format_duration(self.cfg.rules.missing_row_grace);
        Prepared::Fail(
            ErrorClass::Malformed,
            format!("{MISSING}: read again within processing.missing_row_grace {grace}"),
        )
    }

    /// The copies of the members' raw texts (compressed here, outside the transaction), when
    /// `raw_copy` is on.
    fn copies_of(&self, members: &[Member]) -> Result<Vec<PendingCopy>, StoreError> {
        let mut copies = Vec::new();
        if !self.cfg.raw_copy {
            return Ok(copies);
        }
        for m in members {
            let id = m.row.head.msg_id;
            if let Some(RawMessage::Text(text)) = self.ahead.get(&id) {
                copies.extend(PendingCopy::of(id, text)?);
            }
        }
        Ok(copies)
    }
}
