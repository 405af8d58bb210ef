//! Phase 1 of `bench pump`: the backlog. Realistic well-formed messages from the message
//! generator, bulk-loaded into the inbox with multi-row `INSERT`s on a few connections, then
//! enqueued with `poll_once` (not timed).
//!
//! The ids are written explicitly (1..=n, in generation order): the pump processes by id, so
//! the order the generator meant (a flight created before it is updated or deleted) holds
//! although the load runs on several connections.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{NaiveDateTime, Utc};
use chrono_tz::Tz;
use msgx_core::clock::SystemClock;
use msgx_core::devtools::messages::{Generator, MessageKind, Mix};
use msgx_core::inbox::names::InboxNames;
use msgx_core::inbox::time::utc_to_local;
use msgx_core::inbox::Inbox;
use msgx_core::poller::{poll_once, PollConfig};
use msgx_core::settings::Settings;
use msgx_core::store::Store;
use sqlx::mysql::MySqlConnection;

use super::super::inbox_load::{self, insert_sql, load_on_connections, load_options, loaded_ids};
use super::super::statement_for;

/// Rows per load statement at most.
const LOAD_ROWS_PER_STATEMENT: usize = 2_000;
/// Bytes of message text per load statement at most (default `max_allowed_packet` is 16 MiB).
const LOAD_BYTES_PER_STATEMENT: usize = 4 * 1024 * 1024;
/// Send-time step between consecutive generated messages.
const SEND_STEP_MS: i64 = 300;

/// The loaded backlog.
#[derive(Debug)]
pub(crate) struct Loaded {
    /// Generating the messages.
    pub(crate) generated_in: Duration,
    /// Loading them: wall time and ids (1..=`messages`).
    pub(crate) inbox: inbox_load::Loaded,
    /// Message text bytes in all.
    pub(crate) bytes: u64,
    /// Largest message in bytes.
    pub(crate) largest: usize,
    /// Messages per `TYPE` (`TYPE-STYP` for SCHD).
    pub(crate) kinds: BTreeMap<String, u64>,
}

/// One generated inbox row.
struct Row {
    received: NaiveDateTime,
    text: String,
}

/// Generates `messages` well-formed messages (seeded) and bulk-loads them with ids 1..=n.
/// The messages are generated a statement's worth at a time, under a lock that also hands out
/// the ids, so memory stays small and the ids follow generation order.
pub(crate) async fn load_messages(
    url: &str,
    names: &InboxNames,
    tz: Tz,
    messages: u64,
    seed: u64,
    mix: Mix,
) -> anyhow::Result<Loaded> {
    // Send times spread backwards from now, SEND_STEP_MS apart, in generation order.
    let end = utc_to_local(Utc::now(), tz);
    let span = i64::try_from(messages)
        .ok()
        .and_then(|m| m.checked_mul(SEND_STEP_MS))
        .context("--messages too large")?;
    let source = Mutex::new(Source {
        generator: Generator::new(seed),
        mix,
        start: end - chrono::Duration::milliseconds(span),
        next: 0,
        total: messages,
        generated_in: Duration::ZERO,
        bytes: 0,
        largest: 0,
        kinds: BTreeMap::new(),
    });
    let options = load_options(url)?;
    let job = LoadJob {
        names,
        source: &source,
    };
    let elapsed = load_on_connections(&options, async |conn| job.worker(conn).await).await?;
    let source = source
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);

    let (count, min_id, max_id) = loaded_ids(&options, names).await?;
    let expected = i64::try_from(messages).context("--messages too large")?;
    anyhow::ensure!(
        count == expected && min_id == Some(1) && max_id == Some(expected),
        "the inbox holds {count} rows, ids {min_id:?}..={max_id:?}; expected 1..={expected}"
    );
    Ok(Loaded {
        generated_in: source.generated_in,
        inbox: inbox_load::Loaded {
            elapsed,
            min_id: 1,
            max_id: expected,
        },
        bytes: source.bytes,
        largest: source.largest,
        kinds: source.kinds,
    })
}

/// `FLOP`, `FDEL`, `ADFT`, or `SCHD-<STYP>` (schedules differ a lot in size and work).
fn kind_label(kind: MessageKind) -> String {
    match (kind.type_code(), kind.subtype()) {
        (Some("SCHD"), Some(styp)) => format!("SCHD-{styp}"),
        (Some(t), _) => t.to_string(),
        (None, _) => format!("{kind:?}"),
    }
}

/// A statement holding `rows` rows and `bytes` bytes of text is full.
fn chunk_full(rows: usize, bytes: usize) -> bool {
    rows >= LOAD_ROWS_PER_STATEMENT || bytes >= LOAD_BYTES_PER_STATEMENT
}

/// The message source the load workers share (behind a lock).
struct Source {
    generator: Generator,
    mix: Mix,
    /// Send time of message 0.
    start: NaiveDateTime,
    /// Next message index (its id is index + 1).
    next: u64,
    total: u64,
    generated_in: Duration,
    bytes: u64,
    largest: usize,
    kinds: BTreeMap<String, u64>,
}

impl Source {
    /// The next statement's worth of rows and the id of the first, or None when done. A
    /// statement may pass LOAD_BYTES_PER_STATEMENT by its last message (tens of KiB at most,
    /// well under `max_allowed_packet`).
    fn next_chunk(&mut self) -> anyhow::Result<Option<(i64, Vec<Row>)>> {
        if self.next >= self.total {
            return Ok(None);
        }
        let t = Instant::now();
        let first = i64::try_from(self.next + 1).context("inbox id overflow")?;
        let mut rows = Vec::with_capacity(LOAD_ROWS_PER_STATEMENT);
        let mut bytes = 0;
        while self.next < self.total && !chunk_full(rows.len(), bytes) {
            let i = i64::try_from(self.next).context("inbox id overflow")?;
            let at = self.start + chrono::Duration::milliseconds(SEND_STEP_MS * (i + 1));
            let (kind, text) = self.generator.next_message(&self.mix, at);
            *self.kinds.entry(kind_label(kind)).or_default() += 1;
            bytes += text.len() + 64;
            self.bytes += text.len() as u64;
            self.largest = self.largest.max(text.len());
            rows.push(Row { received: at, text });
            self.next += 1;
        }
        self.generated_in += t.elapsed();
        Ok(Some((first, rows)))
    }
}

/// What every load worker shares.
struct LoadJob<'a> {
    names: &'a InboxNames,
    source: &'a Mutex<Source>,
}

impl LoadJob<'_> {
    /// `INSERT … VALUES` of `rows` `(id, received, message)` rows into the inbox table.
    fn insert_sql(&self, rows: usize) -> String {
        let n = &self.names;
        insert_sql(&n.table, &[&n.id, &n.received, &n.message], rows as u64)
    }

    /// One connection: one chunk (one autocommit statement) at a time until none are left.
    async fn worker(&self, conn: &mut MySqlConnection) -> anyhow::Result<()> {
        let full_sql = self.insert_sql(LOAD_ROWS_PER_STATEMENT);
        loop {
            let chunk = self
                .source
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .next_chunk()?;
            let Some((first, rows)) = chunk else {
                break;
            };
            let sql = statement_for(rows.len(), LOAD_ROWS_PER_STATEMENT, &full_sql, |n| {
                self.insert_sql(n)
            });
            let mut query = sqlx::query(&sql);
            for (id, row) in (first..).zip(&rows) {
                query = query.bind(id).bind(row.received).bind(row.text.as_str());
            }
            query.execute(&mut *conn).await.with_context(|| {
                format!(
                    "inserting inbox rows {first}..{}",
                    first + rows.len() as i64
                )
            })?;
        }
        Ok(())
    }
}

/// The enqueue before the pump (not timed).
#[derive(Debug)]
pub(crate) struct Enqueued {
    /// proc_state rows afterwards.
    pub(crate) rows: i64,
    /// `poll_once` rounds.
    pub(crate) rounds: u32,
    /// Wall time.
    pub(crate) elapsed: Duration,
}

/// `poll_once` (configured as the service configures it) until W reaches the inbox head;
/// every row must be in proc_state.
pub(crate) async fn enqueue_all(
    inbox: &Inbox,
    store: &Store,
    settings: &Settings,
    loaded: &Loaded,
) -> anyhow::Result<Enqueued> {
    let cfg = PollConfig::from_settings(&settings.pipeline, &settings.late);
    let clock = SystemClock;
    let started = Instant::now();
    let mut rounds = 0u32;
    let mut w = store.read_cursor().await.context("read_cursor")?.cursor.w;
    while w < loaded.inbox.max_id {
        let report = poll_once(inbox, store, &clock, cfg)
            .await
            .with_context(|| format!("poll round {} at W={w}", rounds + 1))?;
        rounds += 1;
        anyhow::ensure!(
            report.moved(),
            "W did not move from {w} (read {} rows, inbox head {})",
            report.read,
            loaded.inbox.max_id
        );
        w = report.advance.w;
    }
    let rows = store
        .proc_state_count()
        .await
        .context("counting proc_state")?;
    anyhow::ensure!(
        rows == loaded.inbox.max_id - loaded.inbox.min_id + 1,
        "proc_state holds {rows} rows after the enqueue, expected {}",
        loaded.inbox.max_id - loaded.inbox.min_id + 1
    );
    Ok(Enqueued {
        rows,
        rounds,
        elapsed: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_close_on_rows_or_bytes() {
        assert!(!chunk_full(0, 0));
        assert!(!chunk_full(
            LOAD_ROWS_PER_STATEMENT - 1,
            LOAD_BYTES_PER_STATEMENT - 1
        ));
        assert!(chunk_full(LOAD_ROWS_PER_STATEMENT, 0));
        assert!(chunk_full(1, LOAD_BYTES_PER_STATEMENT));
    }

    #[test]
    fn source_hands_out_every_message_once_in_order() {
        let mut source = Source {
            generator: Generator::new(7),
            mix: Mix::well_formed(),
            start: NaiveDateTime::default(),
            next: 0,
            total: 4_100,
            generated_in: Duration::ZERO,
            bytes: 0,
            largest: 0,
            kinds: BTreeMap::new(),
        };
        let mut firsts = Vec::new();
        let mut rows = 0;
        while let Some((first, chunk)) = source.next_chunk().expect("chunk") {
            assert_eq!(first, rows + 1);
            rows += chunk.len() as i64;
            firsts.push(first);
        }
        assert_eq!(rows, 4_100);
        assert_eq!(firsts, vec![1, 2_001, 4_001]);
        assert_eq!(source.kinds.values().sum::<u64>(), 4_100);
    }
}
