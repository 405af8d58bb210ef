-- Discovery that keeps up with a gap-heavy inbox (issue 9).
--
-- 1. Every open hole is kept as a range with its OWN first sighting, so holes age side by side:
--    k holes seen together cost one max_commit_delay, not k. Written in the same transaction as
--    the cursor and the enqueue; always strictly above W, sorted and disjoint (the poller refuses
--    to run on a table that breaks this and alerts). `inbox_cursor.hole_since` stays as the
--    oldest open hole's first sighting (derived, for operators); `hole_seen_db_at` moves here.
CREATE TABLE inbox_hole (
    first_id    BIGINT      PRIMARY KEY,
    last_id     BIGINT      NOT NULL CHECK (last_id >= first_id),
    -- When the poller first saw these ids missing with a later row present (injected clock).
    first_seen  TIMESTAMPTZ NOT NULL,
    -- MySQL server time of that sighting (late.hole_evidence), its own clock and zone.
    seen_db_at  TIMESTAMP
);

-- The hole at W+1 of an instance upgraded mid-hole keeps its timer (conservatively one id).
INSERT INTO inbox_hole (first_id, last_id, first_seen, seen_db_at)
SELECT w + 1, w + 1, hole_since, hole_seen_db_at FROM inbox_cursor WHERE hole_since IS NOT NULL;
UPDATE inbox_cursor SET hole_seen_db_at = NULL;

-- 2. Released holes are watched as ranges (a purged prefix of 80M ids is one row, not 80M).
--    An id found in the inbox splits its range and is recorded in `late_watch` (now the audit
--    of detected late arrivals only).
CREATE TABLE late_watch_range (
    first_id     BIGINT      PRIMARY KEY,
    last_id      BIGINT      NOT NULL CHECK (last_id >= first_id),
    released_at  TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL,
    checked_at   TIMESTAMPTZ
);

-- Open per-id watch rows become ranges (gaps and islands over consecutive ids of one release).
INSERT INTO late_watch_range (first_id, last_id, released_at, expires_at, checked_at)
SELECT min(msg_id), max(msg_id), released_at, expires_at, max(checked_at)
FROM (
    SELECT msg_id, released_at, expires_at, checked_at,
           msg_id - row_number() OVER (PARTITION BY released_at, expires_at ORDER BY msg_id) AS island
    FROM late_watch WHERE detected_at IS NULL
) s
GROUP BY released_at, expires_at, island;
DELETE FROM late_watch WHERE detected_at IS NULL;
DROP INDEX late_watch_open_idx;

-- 3. Rows found below W that discovery never saw (id reuse after a table rotation, a restored
--    inbox; seed §5.1 compensation scan): each is enqueued as LATE and recorded here.
CREATE TABLE inbox_unseen (
    msg_id    BIGINT      PRIMARY KEY,
    found_at  TIMESTAMPTZ NOT NULL,
    w_at      BIGINT      NOT NULL
);

CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON inbox_hole
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON late_watch_range
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON inbox_unseen
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
