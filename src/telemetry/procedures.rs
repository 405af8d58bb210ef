//! Purge boundary metrics (seed §6, issue 13): what the DB owner's purge job reads.

use chrono::{DateTime, Utc};
use metrics::gauge;

use super::Def;

/// The highest inbox id at or below which every row is marked (the purge boundary).
pub const PURGE_BOUNDARY_ID: &str = "msgx_purge_boundary_id";
/// DATE_RECEIVED of the boundary row, as Unix seconds (0 when unknown).
pub const PURGE_BOUNDARY_RECEIVED_TIMESTAMP: &str =
    "msgx_purge_boundary_received_timestamp_seconds";

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::gauge(PURGE_BOUNDARY_ID, "id", "Highest inbox id at or below which every inbox row is marked (purge boundary); NaN before the first computation"),
        Def::gauge(PURGE_BOUNDARY_RECEIVED_TIMESTAMP, "Unix seconds", "DATE_RECEIVED of the purge boundary row (0 when unknown); NaN before the first computation"),
    ]
}

/// Publishes the boundary.
pub fn purge_boundary(id: i64, received_at: Option<DateTime<Utc>>) {
    let _whole = super::whole::event();
    gauge!(PURGE_BOUNDARY_ID).set(id as f64);
    gauge!(PURGE_BOUNDARY_RECEIVED_TIMESTAMP)
        .set(received_at.map_or(0.0, |t| t.timestamp() as f64));
}
