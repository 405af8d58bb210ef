//! Purge boundary metrics (seed §6, issue 13): what the DB owner's purge job reads.

use chrono::{DateTime, Utc};
use metrics::{describe_gauge, gauge};

/// The highest inbox id at or below which every row is marked (the purge boundary).
pub const PURGE_BOUNDARY_ID: &str = "msgx_purge_boundary_id";
/// DATE_RECEIVED of the boundary row, as Unix seconds (0 when unknown).
pub const PURGE_BOUNDARY_RECEIVED_TIMESTAMP: &str =
    "msgx_purge_boundary_received_timestamp_seconds";

/// HELP lines.
pub fn describe() {
    describe_gauge!(
        PURGE_BOUNDARY_ID,
        "Highest inbox id at or below which every inbox row is marked (purge boundary)"
    );
    describe_gauge!(
        PURGE_BOUNDARY_RECEIVED_TIMESTAMP,
        "DATE_RECEIVED of the purge boundary row, Unix seconds (0 when unknown)"
    );
}

/// Publishes the boundary.
pub fn purge_boundary(id: i64, received_at: Option<DateTime<Utc>>) {
    gauge!(PURGE_BOUNDARY_ID).set(id as f64);
    gauge!(PURGE_BOUNDARY_RECEIVED_TIMESTAMP)
        .set(received_at.map_or(0.0, |t| t.timestamp() as f64));
}
