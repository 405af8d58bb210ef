-- Marking and late arrivals (seed §3 table 2, §5.1, §5.2, §9; SPEC §5, §6, G1/G4/G5/G7).

-- Released hole ids watched for a late commit (durable, unlike the seed's in-memory list).
-- Written in the same transaction that moves W past them.
CREATE TABLE late_watch (
    msg_id       BIGINT      PRIMARY KEY,
    released_at  TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL,
    checked_at   TIMESTAMPTZ,
    detected_at  TIMESTAMPTZ
);
CREATE INDEX late_watch_open_idx ON late_watch (msg_id) WHERE detected_at IS NULL;

-- Fields a late message could not apply because a newer message had set them (G1).
ALTER TABLE proc_state ADD COLUMN stale_fields JSONB;
-- Last backfill failure, for operators.
ALTER TABLE proc_state ADD COLUMN backfill_error TEXT;

-- Operator actions (replay, recover abandoned backfill, skip): who, why, when, which rows.
CREATE TABLE audit_log (
    id       BIGSERIAL   PRIMARY KEY,
    at       TIMESTAMPTZ NOT NULL,
    actor    TEXT        NOT NULL,
    action   TEXT        NOT NULL,
    reason   TEXT        NOT NULL,
    msg_ids  BIGINT[]    NOT NULL,
    result   JSONB       NOT NULL
);

-- MySQL server time when the current hole was first seen (transaction evidence compares on
-- the server's clock, never ours).
ALTER TABLE inbox_cursor ADD COLUMN hole_seen_db_at TIMESTAMP;
