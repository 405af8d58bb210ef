-- Cutover stock (issue 19): what an explicit cutover skipped, durably, so that no path
-- (compensation scan, late detection, verify, purge readiness) ever takes it for ours.
--
-- One row, written in the seeding transaction with W. `first_id`..`w` minus the gaps is the
-- visible stock skipped (`max` / `<id>`); `first_id` NULL: nothing skipped (`min`, `zero`, or
-- no row at or below W).
CREATE TABLE cutover_stock (
    id         SMALLINT    PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    mode       TEXT        NOT NULL,
    w          BIGINT      NOT NULL CHECK (w >= 0),
    first_id   BIGINT,
    stock_rows BIGINT      NOT NULL DEFAULT 0 CHECK (stock_rows >= 0),
    seeded_at  TIMESTAMPTZ NOT NULL
);
-- Ids in first_id..w with no committed row at the cutover (rolled back or still uncommitted):
-- holes like any other. They are also written to
-- late_watch_range in the same transaction; this table keeps them after the watch closes.
CREATE TABLE cutover_gap (
    first_id BIGINT PRIMARY KEY,
    last_id  BIGINT NOT NULL CHECK (last_id >= first_id)
);
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON cutover_stock
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON cutover_gap
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
