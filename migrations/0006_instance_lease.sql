-- Fencing (SPEC §8): the single-instance lock is a session advisory lock; if that session dies
-- (network cut, pg_terminate_backend) the instance may still hold other connections and write
-- until its next lock check. Each instance that takes the lock bumps `epoch`; its connections
-- carry the epoch it got (session setting `msgx.epoch`), and every write to our tables checks
-- it: a stale instance's writes fail at once instead of racing the new owner.
--
-- Sessions without `msgx.epoch` (migrations, tools, tests, `msgexchange request schedule`) are
-- not fenced: only the service runs with a lease.
CREATE TABLE instance_lease (
    id           SMALLINT    PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    epoch        BIGINT      NOT NULL DEFAULT 0,
    holder       TEXT,
    acquired_at  TIMESTAMPTZ
);
INSERT INTO instance_lease (id) VALUES (1);

CREATE FUNCTION msgx_fence_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    mine TEXT := current_setting('msgx.epoch', true);
    current_epoch BIGINT;
BEGIN
    IF mine IS NULL OR mine = '' THEN
        RETURN NULL;
    END IF;
    SELECT epoch INTO current_epoch FROM instance_lease WHERE id = 1;
    IF mine::bigint <> current_epoch THEN
        RAISE EXCEPTION 'msgexchange instance fenced: lease epoch % is stale (current %)',
            mine, current_epoch
            USING ERRCODE = 'MXFEN';
    END IF;
    RETURN NULL;
END
$$;

-- One check per statement (not per row): a batch write costs one lookup.
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON inbox_cursor
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON proc_state
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON flight_state
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON msg_event
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON schd_snap_log
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON late_watch
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON req_track
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
