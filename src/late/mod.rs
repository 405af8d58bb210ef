//! Late arrivals (SPEC §6, seed §5.1, G1): inbox ids the poller released as permanent holes
//! that commit after all.
//!
//! - The poller writes every released hole as one range into the durable watch
//!   (`late_watch_range`) in the same transaction that moves W past it, and wakes the late
//!   detector.
//! - [`detect_once`] is one detection round: the watched ranges, in pages, against the inbox
//!   ([`Inbox::ids_in_ranges`](crate::inbox::Inbox::ids_in_ranges), `id BETWEEN` range
//!   queries, bounded). A hit is recorded as detected **and** enqueued as a `LATE`
//!   `PROC_STATE` row in one PostgreSQL transaction that splits its range (G1: never silently
//!   lost), counted and alerted. An absent range whose watch window has passed is closed
//!   (deleted) — only after that final, successful check.
//! - [`compensation_scan`] (seed §5.1 "补偿扫描"): a bounded walk over a window behind W for
//!   inbox rows that are neither enqueued nor inside a watched range (id reuse after a table
//!   rotation, a restored inbox); each is enqueued as `LATE` the same way.
//! - The pump processes a `LATE` row at once (it is below W, so it is the head): out of id
//!   order by design, and with the ordering guard ([`crate::flight::plan_guarded`]) so it never
//!   overwrites what a newer message wrote.
//!
//! What this guarantees and what it does not: `docs/late-arrivals.md`.

mod compensation;
mod detect;
mod inbox_check;

pub use compensation::{compensation_scan, ScanConfig, ScanReport};
pub use detect::{detect_once, DetectConfig, DetectError, DetectReport, LateHit};
