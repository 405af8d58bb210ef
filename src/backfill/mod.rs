//! The backfill (SPEC §5, seed §3 table 2, §5.2): marking processed rows in the shared inbox.
//!
//! A terminal `PROC_STATE` row carries a backfill *intent* (`BACKFILL_NEXT_AT`, written with
//! the terminal state). A sweep turns intents into inbox marks — the DB owner's value in the
//! status column plus the processed time — only where the mark is empty, and records exactly
//! one result on the row: a *confirmation* (`BACKFILL_AT`), a later retry (`BACKFILL_NEXT_AT`,
//! `BACKFILL_ATTEMPTS`, `BACKFILL_ERROR`) or an *abandon reason* (`MISSING_ROW`,
//! `MAX_ATTEMPTS`). The pump never writes the inbox.
//!
//! - [`rules`]: due rows, backoff, give-up, missing-row kinds (pure);
//! - [`sweep`]: one sweep over the adapters ([`sweep_once`]); the `BackfillSweeper` actor only
//!   decides when to call it again;
//! - replay and recovery of abandoned rows live in [`crate::store::replay`] (they share the
//!   lifecycle gate: PostgreSQL row locks). docs/backfill.md has the whole story.

pub mod rules;
pub mod sweep;

pub use rules::{AfterFailure, BackfillRules, MissingKind};
pub use sweep::{sweep_once, SweepConfig, SweepReport, ISOLATION_BUDGET};
