-- Processing (seed §3 flow ②③, SPEC §4): flight state, events, schedule snapshots, and the
-- processing order every terminal row records.

-- Order in which rows reached a terminal state: proves FIFO (processed_seq ascends with msg_id).
CREATE SEQUENCE proc_order_seq;
ALTER TABLE proc_state ADD COLUMN processed_seq BIGINT UNIQUE;
-- Decoded TYPE/STYP, for operators (what is stuck, what was skipped).
ALTER TABLE proc_state ADD COLUMN msg_type TEXT;

-- Current state per flight (identity FLID). Fields and their versions (message send time +
-- msg id) as JSON objects keyed by field tag; master_flid mirrors MFID for the code-share
-- cascade.
CREATE TABLE flight_state (
    flid            TEXT        PRIMARY KEY,
    master_flid     TEXT,
    fields          JSONB       NOT NULL,
    versions        JSONB       NOT NULL,
    created_by_msg  BIGINT      NOT NULL,
    updated_by_msg  BIGINT      NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX flight_state_master_idx ON flight_state (master_flid) WHERE master_flid IS NOT NULL;

-- Events to deliver (the dispatcher's outbox). event_id is the delivery order.
CREATE TABLE msg_event (
    event_id        BIGSERIAL   PRIMARY KEY,
    msg_id          BIGINT      NOT NULL REFERENCES proc_state (msg_id),
    flight_key      TEXT        NOT NULL,
    event_type      TEXT        NOT NULL,
    payload         JSONB       NOT NULL,
    state           TEXT        NOT NULL DEFAULT 'PENDING' CHECK (state IN ('PENDING', 'SENT', 'DEAD')),
    attempts        INTEGER     NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    sent_at         TIMESTAMPTZ
);
CREATE INDEX msg_event_pending_idx ON msg_event (event_id) WHERE state = 'PENDING';
CREATE INDEX msg_event_msg_idx ON msg_event (msg_id);

-- One row per applied daily schedule (kept 90 days, seed §8).
CREATE TABLE schd_snap_log (
    id              BIGSERIAL   PRIMARY KEY,
    msg_id          BIGINT      NOT NULL REFERENCES proc_state (msg_id),
    schedule_date   DATE        NOT NULL,
    kind            TEXT        NOT NULL,
    request_id      TEXT,
    flights         JSONB       NOT NULL,
    created         INTEGER     NOT NULL,
    updated         INTEGER     NOT NULL,
    unchanged       INTEGER     NOT NULL,
    applied_at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX schd_snap_log_applied_idx ON schd_snap_log (applied_at);
