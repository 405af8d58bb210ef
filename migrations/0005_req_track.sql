-- Outbound requests (seed §7, SPEC §7): a request is REGISTERED here before its row is written
-- into the shared outbound table (COUTMSGS), and SENT with that row's id once the insert is
-- confirmed. The delivery promise ends at "landed in COUTMSGS".
--
-- A crash between the steps leaves a REGISTERED row; the reconciler looks the request's RQID
-- up in COUTMSGS only above `floor_id` (MAX(COUTMSGS_ID) read before registering) and either
-- adopts the row it finds or writes the stored `message` once (docs/operations.md).
CREATE TABLE req_track (
    -- From req_track_id_seq; also the request's META/SEQN.
    id               BIGSERIAL   PRIMARY KEY,
    -- What is asked: 'SCHD' (the day's schedule).
    kind             TEXT        NOT NULL,
    -- 'DAILY' (the schedule requester) or 'MANUAL' (`msgexchange request schedule`).
    origin           TEXT        NOT NULL CHECK (origin IN ('DAILY', 'MANUAL')),
    -- The day asked about.
    target_date      DATE        NOT NULL,
    -- The request id carried in META/RQID; upstream answers with it (SCHD/RESP).
    rqid             TEXT        NOT NULL UNIQUE,
    -- MAX(COUTMSGS_ID) before registration (0 for an empty table): our row can only be above.
    floor_id         BIGINT      NOT NULL,
    -- The exact text written (a reconcile writes the same text).
    message          TEXT        NOT NULL,
    state            TEXT        NOT NULL CHECK (state IN ('REGISTERED', 'SENT')),
    registered_at    TIMESTAMPTZ NOT NULL,
    sent_at          TIMESTAMPTZ,
    -- COUTMSGS_ID of our row once SENT.
    out_id           BIGINT,
    -- How SENT was reached: 'SEND' (the normal path), 'RECONCILE_FOUND' (the row was there),
    -- 'RECONCILE_WRITTEN' (the reconciler wrote it).
    sent_via         TEXT,
    -- Last failed delivery attempt and its error: the insert may still land (a lost COMMIT
    -- acknowledgement), so the reconciler leaves the request alone for a grace period.
    failed_at        TIMESTAMPTZ,
    last_error       TEXT,
    -- The inbox message (proc_state.msg_id) of the SCHD/RESP that carried this RQID.
    answered_by_msg  BIGINT,
    answered_at      TIMESTAMPTZ,
    CHECK ((state = 'SENT') = (out_id IS NOT NULL AND sent_at IS NOT NULL AND sent_via IS NOT NULL))
);
-- The daily request is asked once per kind and day, whatever restarts happen.
CREATE UNIQUE INDEX req_track_daily_uq ON req_track (kind, target_date) WHERE origin = 'DAILY';
-- Leftovers for the reconciler and the stale gauge.
CREATE INDEX req_track_registered_idx ON req_track (registered_at) WHERE state = 'REGISTERED';
