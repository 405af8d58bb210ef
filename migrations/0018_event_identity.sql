-- One identity per event, for all time (issue 40). Expand only: the previous release keeps
-- inserting events (the defaults fill the new columns) and sending them with its own ids.

-- The event's CloudEvents id: a random UUID made with the row, never reused. A store rebuilt
-- from nothing, restored from a backup or sharing a topic with another deployment makes new
-- ones, so consumers that de-duplicate on (ce_source, ce_id) and our own recovery scan never
-- take one event for another (the BIGSERIAL event_id repeats across stores). Nullable so the
-- column is added without rewriting the table; only PENDING rows are ever sent, and they all
-- get one here (a requeued DEAD row of an older release gets one when requeued).
ALTER TABLE msg_event ADD COLUMN ce_id UUID;
ALTER TABLE msg_event ALTER COLUMN ce_id SET DEFAULT gen_random_uuid();
UPDATE msg_event SET ce_id = gen_random_uuid() WHERE ce_id IS NULL AND state = 'PENDING';

-- The topic of kafka_partition/kafka_offset: an offset means nothing without it (a renamed or
-- recreated topic). NULL on rows written before this migration: the events topic for SENT,
-- the dead-letter topic for DEAD, as configured then.
ALTER TABLE msg_event ADD COLUMN kafka_topic TEXT;

-- The exactly-once recovery's durable cursor: per topic and partition, an offset below which
-- no record of ours can be unknown to the store. Recorded (the partition's end) only while no
-- transaction of ours is open and every committed one is written SENT/DEAD, and raised by an
-- operator's requeue past the event's dead-letter copy, so the scan after a crash reads only
-- what came after, never from 0, and never finds a copy the operator already took back.
CREATE TABLE dispatch_scan_floor (
    topic           TEXT        NOT NULL,
    kafka_partition INTEGER     NOT NULL,
    next_offset     BIGINT      NOT NULL CHECK (next_offset >= 0),
    recorded_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (topic, kafka_partition)
);

-- The deployment's one transactional.id (exactly-once), recorded at first use: a holder whose
-- configured id differs is refused, so fencing never rests on every host's configuration
-- agreeing (two ids would fence nothing).
CREATE TABLE dispatch_producer (
    id               SMALLINT    PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    transactional_id TEXT        NOT NULL,
    recorded_at      TIMESTAMPTZ NOT NULL
);

CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON dispatch_scan_floor
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON dispatch_producer
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
