-- Our own copy of each message's raw text (issue 13 item 4, seed §9 / §12 G10): with
-- `retention.raw_copy = true` the pump writes it in the same business transaction that
-- records the message's outcome, so a copy is never lost (the outcome commits with it) and
-- never orphaned (a rolled-back group leaves neither). A replay after the DB owner purged the
-- inbox row reads it (inbox first, this copy second).
--
-- `body` is the text compressed by us (zlib, `encoding`); `raw_bytes` its UTF-8 length, checked
-- on reading. `copied_at` is the last time the pump wrote it (a reprocessed message refreshes
-- it): copies older than `retention.replay_window` are deleted in bounded batches
-- (`store::raw_copy::purge_expired_raw_copies`, called by housekeeping), never one of a
-- message that is PENDING or FAILED again (a replay waiting for the pump).
--
-- No foreign key to proc_state: terminal rows move to an archive later (issue 13 item 5),
-- their copies expire on their own clock.
CREATE TABLE raw_copy (
    msg_id     BIGINT      PRIMARY KEY,
    copied_at  TIMESTAMPTZ NOT NULL,
    raw_bytes  INTEGER     NOT NULL CHECK (raw_bytes > 0),
    encoding   TEXT        NOT NULL DEFAULT 'zlib',
    body       BYTEA       NOT NULL
);
-- Already compressed: store out of line without a second (pglz) compression attempt.
ALTER TABLE raw_copy ALTER COLUMN body SET STORAGE EXTERNAL;
-- The expiry scan, oldest first.
CREATE INDEX raw_copy_copied_at_idx ON raw_copy (copied_at);

CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON raw_copy
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
