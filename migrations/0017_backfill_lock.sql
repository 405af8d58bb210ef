-- Rows the DB owner holds (issue 29 item 4): a backfill mark that finds its inbox row held by
-- another session (`SELECT … FOR UPDATE`) skips it without charging an attempt. This table
-- remembers since when each such row has been held, so a row held for very long surfaces with
-- its age (msgx_backfill_locked_oldest_seconds) instead of being retried silently forever.
--
-- A new table, not a proc_state column: the archive copies proc_state.* (migration 0014), and
-- an entry is dropped by the sweep as soon as the row has any other outcome or stops waiting
-- for a mark. No foreign key: retention must never wait on it.
CREATE TABLE backfill_lock (
    msg_id BIGINT      PRIMARY KEY,
    since  TIMESTAMPTZ NOT NULL
);
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON backfill_lock
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
