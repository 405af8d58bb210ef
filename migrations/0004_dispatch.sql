-- Delivery (SPEC §7): where each event landed, when it went dead, and the index the
-- dispatcher's "held back by an earlier event of its key" check uses.

-- Partition/offset of the ack (the DLQ's for a DEAD event): lets an operator find the record.
ALTER TABLE msg_event ADD COLUMN kafka_partition INTEGER;
ALTER TABLE msg_event ADD COLUMN kafka_offset BIGINT;
-- When the event was copied to the dead-letter topic and marked DEAD.
ALTER TABLE msg_event ADD COLUMN dead_at TIMESTAMPTZ;

-- Pending events that are backing off, by key: an event waits while an earlier event of its
-- key is in this set and not yet due. Only failed events carry next_attempt_at, so this stays
-- tiny while Kafka is healthy.
CREATE INDEX msg_event_backoff_idx ON msg_event (flight_key, event_id)
    WHERE state = 'PENDING' AND next_attempt_at IS NOT NULL;
