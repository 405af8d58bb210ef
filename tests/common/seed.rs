//! Typed seeding of PROC_STATE and MSG_EVENT rows, for tests that need records in chosen
//! states without driving the pump. A row goes in as JSON (`jsonb_populate_record`), its
//! fields named as the columns; the columns a struct leaves out keep their defaults.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Serialize, Serializer};

use super::TestEnv;

/// Inserts `row` into `table` (its fields are the columns); the `returning` column's value.
async fn insert_row(env: &TestEnv, table: &str, row: &impl Serialize, returning: &str) -> i64 {
    let json = serde_json::to_value(row).expect("row as JSON");
    let columns: Vec<&str> = json
        .as_object()
        .expect("a struct")
        .keys()
        .map(String::as_str)
        .collect();
    let columns = columns.join(", ");
    let sql = format!(
        "INSERT INTO {table} ({columns}) SELECT {columns} \
         FROM jsonb_populate_record(NULL::{table}, $1::jsonb) RETURNING {returning}"
    );
    sqlx::query_scalar(&sql)
        .bind(json.to_string())
        .fetch_one(env.store.pool())
        .await
        .unwrap_or_else(|e| panic!("{table} {json}: {e}"))
}

/// A time as PostgreSQL keeps it: microseconds, truncated like a bound parameter.
fn micros<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Micros, true))
}

/// [`micros`], or null.
fn micros_opt<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => micros(t, s),
        None => s.serialize_none(),
    }
}

/// JSON text as the JSON value it is (a JSONB column).
fn as_json<S: Serializer>(text: &&str, s: S) -> Result<S::Ok, S::Error> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(serde::ser::Error::custom)?;
    value.serialize(s)
}

/// One PROC_STATE record to insert.
#[derive(Debug, Clone, Serialize)]
pub struct Proc {
    /// MSG_ID.
    pub msg_id: i64,
    /// `PENDING` (the table's default), `FAILED`, `SUCCEEDED`, `SKIPPED` or `DEAD`.
    pub state: &'static str,
    /// `POLL` (default), `COMPAT` or `LATE`.
    pub source: &'static str,
    /// Inbox receive time.
    #[serde(serialize_with = "micros_opt")]
    pub received_at: Option<DateTime<Utc>>,
    /// Enqueue time.
    #[serde(serialize_with = "micros")]
    pub enqueued_at: DateTime<Utc>,
    /// Processing attempts.
    pub attempts: i32,
    /// Error class of a FAILED/DEAD record.
    pub error_class: Option<&'static str>,
    /// Why it is terminal.
    pub terminal_reason: Option<&'static str>,
    /// When it became terminal.
    #[serde(serialize_with = "micros_opt")]
    pub terminal_at: Option<DateTime<Utc>>,
    /// Position in the processing order.
    pub processed_seq: Option<i64>,
    /// The bound identity.
    pub identity_key: Option<&'static str>,
    /// Backfill intent.
    #[serde(serialize_with = "micros_opt")]
    pub backfill_next_at: Option<DateTime<Utc>>,
    /// Backfill confirmation (the inbox row is marked).
    #[serde(serialize_with = "micros_opt")]
    pub backfill_at: Option<DateTime<Utc>>,
}

impl Proc {
    /// A PENDING record enqueued at `at`, everything else at the table's defaults.
    pub fn pending(msg_id: i64, at: DateTime<Utc>) -> Self {
        Self {
            msg_id,
            state: "PENDING",
            source: "POLL",
            received_at: None,
            enqueued_at: at,
            attempts: 0,
            error_class: None,
            terminal_reason: None,
            terminal_at: None,
            processed_seq: None,
            identity_key: None,
            backfill_next_at: None,
            backfill_at: None,
        }
    }

    /// A record enqueued and made terminal (`state`) at `at`.
    pub fn terminal(msg_id: i64, state: &'static str, at: DateTime<Utc>) -> Self {
        Self {
            state,
            terminal_at: Some(at),
            ..Self::pending(msg_id, at)
        }
    }

    /// The same record, its inbox mark confirmed at `at`.
    pub fn marked(self, at: DateTime<Utc>) -> Self {
        Self {
            backfill_at: Some(at),
            ..self
        }
    }

    /// The same record at this place in the processing order.
    pub fn seq(self, processed_seq: i64) -> Self {
        Self {
            processed_seq: Some(processed_seq),
            ..self
        }
    }

    /// The same record holding this identity.
    pub fn identity(self, key: &'static str) -> Self {
        Self {
            identity_key: Some(key),
            ..self
        }
    }

    /// Inserts the record.
    pub async fn insert(&self, env: &TestEnv) {
        insert_row(env, "proc_state", self, "msg_id").await;
    }
}

/// Inserts these records in order.
pub async fn procs(env: &TestEnv, rows: impl IntoIterator<Item = Proc>) {
    for r in rows {
        r.insert(env).await;
    }
}

/// One MSG_EVENT row to insert.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// The message that produced it.
    pub msg_id: i64,
    /// Creation time.
    #[serde(serialize_with = "micros")]
    pub created_at: DateTime<Utc>,
    /// Delivery time.
    #[serde(serialize_with = "micros_opt")]
    pub sent_at: Option<DateTime<Utc>>,
    /// `PENDING` (the table's default), `SENT` or `DEAD`.
    pub state: &'static str,
    /// The Kafka key.
    pub flight_key: &'static str,
    /// `FLIGHT_CREATED`, `FLIGHT_UPDATED`, …
    pub event_type: &'static str,
    /// The JSON payload, as text.
    #[serde(serialize_with = "as_json")]
    pub payload: &'static str,
}

impl Event {
    /// A PENDING `FLIGHT_UPDATED` event with an empty payload, created at `at`.
    pub fn pending(msg_id: i64, flight_key: &'static str, at: DateTime<Utc>) -> Self {
        Self {
            msg_id,
            flight_key,
            event_type: "FLIGHT_UPDATED",
            payload: "{}",
            state: "PENDING",
            created_at: at,
            sent_at: None,
        }
    }

    /// Inserts the event; its id.
    pub async fn insert(&self, env: &TestEnv) -> i64 {
        insert_row(env, "msg_event", self, "event_id").await
    }
}

/// A cutover record that skips nothing: W alone (`min`, `zero`, or an `<id>` with no stock
/// below), as `cutover::seed::seed` stores it when no stock row is visible.
pub fn watermark_only(
    mode: msgx_core::cutover::CutoverMode,
    w: i64,
    seeded_at: DateTime<Utc>,
) -> msgx_core::cutover::CutoverStock {
    msgx_core::cutover::CutoverStock {
        mode: mode.to_string(),
        w,
        span: None,
        seeded_at,
    }
}

/// The `audit_log` row a test's cutover seeding records (`Store::seed_cutover`: the service's
/// seeding is always audited, and so is a test's).
pub const TEST_SEEDING: msgx_core::store::SeedAudit<'static> = msgx_core::store::SeedAudit {
    by: "test",
    ticket: "",
    token: "",
    expected: false,
};
