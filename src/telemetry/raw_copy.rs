//! Our raw-text copy (`retention.raw_copy`, issue 13 item 4, seed §12 G10): copies written,
//! read back after the inbox row was purged, expired copies deleted, and which source each
//! replay found — each next to its log line.

use metrics::counter;

use super::Def;
use crate::rows::RawSource;

/// Copies written (committed with the message's outcome).
pub const RAW_COPY_WRITTEN_TOTAL: &str = "msgx_raw_copy_written_total";
/// Raw text bytes copied (before compression).
pub const RAW_COPY_RAW_BYTES_TOTAL: &str = "msgx_raw_copy_raw_bytes_total";
/// Compressed bytes stored for them.
pub const RAW_COPY_STORED_BYTES_TOTAL: &str = "msgx_raw_copy_stored_bytes_total";
/// Raw texts the pump read from the copy because the inbox row was gone.
pub const RAW_COPY_READS_TOTAL: &str = "msgx_raw_copy_reads_total";
/// Copies that could not be read back (corrupt: wrong length, not zlib, not UTF-8).
pub const RAW_COPY_CORRUPT_TOTAL: &str = "msgx_raw_copy_corrupt_total";
/// Expired copies deleted (older than `retention.replay_window`).
pub const RAW_COPY_PURGED_TOTAL: &str = "msgx_raw_copy_purged_total";
/// Replayed messages by the raw-text source found for them (`inbox`, `raw_copy`).
pub const REPLAY_SOURCE_TOTAL: &str = "msgx_replay_source_total";

/// The series of this file.
pub(super) fn defs() -> Vec<Def> {
    vec![
        Def::counter(
            RAW_COPY_WRITTEN_TOTAL,
            "copies",
            "Raw-text copies written with the message's outcome (retention.raw_copy)",
        ),
        Def::counter(
            RAW_COPY_RAW_BYTES_TOTAL,
            "bytes",
            "Raw text bytes copied, before compression",
        ),
        Def::counter(
            RAW_COPY_STORED_BYTES_TOTAL,
            "bytes",
            "Compressed bytes stored for the raw-text copies",
        ),
        Def::counter(
            RAW_COPY_READS_TOTAL,
            "messages",
            "Raw texts read from our copy because the inbox row was gone",
        ),
        Def::counter(
            RAW_COPY_CORRUPT_TOTAL,
            "copies",
            "Raw-text copies that could not be read back",
        ),
        Def::counter(
            RAW_COPY_PURGED_TOTAL,
            "copies",
            "Expired raw-text copies deleted (older than retention.replay_window)",
        ),
        Def::counter(
            REPLAY_SOURCE_TOTAL,
            "messages",
            "Replayed messages by the raw-text source found for them",
        )
        .label("source", &RawSource::names()),
    ]
}

/// A group's copies were committed.
pub fn raw_copies_written(copies: usize, raw_bytes: u64, stored_bytes: u64) {
    counter!(RAW_COPY_WRITTEN_TOTAL).increment(copies as u64);
    counter!(RAW_COPY_RAW_BYTES_TOTAL).increment(raw_bytes);
    counter!(RAW_COPY_STORED_BYTES_TOTAL).increment(stored_bytes);
    tracing::trace!(copies, raw_bytes, stored_bytes, "raw copies written");
}

/// The pump took a message's raw text from our copy: the inbox row is gone.
pub fn raw_copy_read(msg_id: i64, raw_bytes: u64) {
    counter!(RAW_COPY_READS_TOTAL).increment(1);
    tracing::info!(
        msg_id,
        raw_bytes,
        source = "raw_copy",
        "inbox row gone; raw text read from our raw copy"
    );
}

/// A copy could not be read back; the message is treated as having no raw text.
pub fn raw_copy_corrupt(msg_id: i64, error: &str) {
    counter!(RAW_COPY_CORRUPT_TOTAL).increment(1);
    tracing::error!(msg_id, error, alert = true, "raw copy unreadable");
}

/// One purge batch deleted `rows` copies last written before `before_unix` (Unix seconds).
pub fn raw_copies_purged(rows: u64, before_unix: i64) {
    counter!(RAW_COPY_PURGED_TOTAL).increment(rows);
    if rows > 0 {
        tracing::info!(rows, before_unix, "expired raw copies deleted");
    }
}

/// A replay was applied with the raw text found in `source` (`inbox` or `raw_copy`).
pub fn replay_source(msg_id: i64, source: &'static str) {
    counter!(REPLAY_SOURCE_TOTAL, "source" => source).increment(1);
    tracing::debug!(msg_id, source, "replay raw-text source");
}
