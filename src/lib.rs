//! msgexchange core: *what* the service does. Pure decision rules and the store adapters; no
//! actors here (they live in `msgx-actors`: *when* things happen).
//!
//! - [`watermark`]: the contiguous-watermark and hole-aging rule (pure).
//! - [`cutover`]: one-time cutover seeding: the modes, the skipped stock (pure) and the step.
//! - [`codec`]: raw inbox text → decoded message (behind a trait).
//! - [`flight`]: flight state and the pure merge rules (state, message) → changes + events.
//! - [`poller`]: one discovery round over the adapters.
//! - [`pump`]: head rules (pure) and one pump step (raw read, decode, identity, business tx).
//! - [`dispatch`]: event delivery rules and one dispatch round (MSG_EVENT → Kafka).
//! - [`kafka`]: the idempotent producer and the embedded mock cluster.
//! - [`inbox`]: the shared MySQL inbox adapter (read + mark columns only).
//! - [`store`]: our PostgreSQL (migrations, cursor, queue).
//! - [`db_options`]: the connect keys (URL, password, TLS) applied alike to both databases.
//! - [`settings`]: configuration, validated at start.
//! - [`telemetry`]: every metric name and its log line.
//! - [`traces`]: the OpenTelemetry spans of one message's trace (issue 54).
//! - [`clock`]: the injectable clock.
//! - [`ops`]: operator operations shared by the admin API and the CLI (status, inspect,
//!   audited replay/recovery/requeue, the compat entry).
//! - [`outage`]: which store failures are an outage (not charged to the head message).
//! - [`outbound`]: requests to upstream via COUTMSGS, tracked in REQ_TRACK (never twice).
//! - [`retention`]: the housekeeping job (PROC_STATE → PROC_STATE_HST, expiring our tables).
//! - [`failpoint`]: named crash points for kill-style crash tests (`MSGEXCHANGE_FAILPOINT`).
//! - [`verify`]: the pipeline's invariants (SPEC §11) read back from the stores (`msgexchange verify`).
//! - [`devtools`]: acting as the DB owner and as upstream, for dev, tests and benchmarks.

pub mod backfill;
pub mod backlog;
pub mod backoff;
pub mod clock;
pub mod codec;
pub mod cutover;
pub mod db_options;
pub mod devtools;
pub mod dispatch;
pub mod failpoint;
pub mod flight;
pub mod inbox;
pub mod kafka;
pub mod late;
pub mod ops;
pub mod outage;
pub mod outbound;
pub mod poller;
pub mod pump;
pub mod retention;
pub mod rows;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod traces;
pub mod verify;
pub mod watermark;

#[cfg(test)]
mod layers;
#[cfg(test)]
mod telemetry_labels;
