-- Discovery cursor and per-message processing state (seed §3, §5.1, §5.2; SPEC §2-§5).
-- Names are unquoted: INBOX_CURSOR / PROC_STATE in the docs are these tables.

-- The single-row discovery cursor. W: every inbox id <= W is enqueued or was released as a
-- permanent hole. HOLE_SINCE: when the hole right after W was first seen (survives restarts).
-- SEEDED_AT: when an explicit cutover seeding set W (NULL does not mean "never consumed").
CREATE TABLE inbox_cursor (
    id          SMALLINT    PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    w           BIGINT      NOT NULL DEFAULT 0 CHECK (w >= 0),
    hole_since  TIMESTAMPTZ,
    seeded_at   TIMESTAMPTZ,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO inbox_cursor (id) VALUES (1);

-- One row per inbox row (MSG_ID = CMINMSGS_ID); the table is the queue.
CREATE TABLE proc_state (
    msg_id                   BIGINT      PRIMARY KEY,
    state                    TEXT        NOT NULL DEFAULT 'PENDING'
        CHECK (state IN ('PENDING', 'FAILED', 'SUCCEEDED', 'SKIPPED', 'DEAD')),
    -- POLL: discovered by the poller; COMPAT: the compat HTTP entry; LATE: a late arrival.
    source                   TEXT        NOT NULL DEFAULT 'POLL'
        CHECK (source IN ('POLL', 'COMPAT', 'LATE')),
    -- Inbox DATE_RECEIVED (airport local time converted); NULL when upstream left it empty.
    received_at              TIMESTAMPTZ,
    -- When we enqueued it; the R fallback when received_at is NULL (G4).
    enqueued_at              TIMESTAMPTZ NOT NULL,
    attempts                 INTEGER     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at          TIMESTAMPTZ,
    error_class              TEXT,
    error_text               TEXT,
    -- Stamped once, on the first processing attempt: the head-deadline's stable start.
    processing_started_at    TIMESTAMPTZ,
    terminal_reason          TEXT,
    terminal_at              TIMESTAMPTZ,
    -- SNDR|TYPE|STYP|SEQN once bound; one live record per identity.
    identity_key             TEXT,
    -- Backfill intent (set with the terminal state), confirmation, attempts, abandon.
    backfill_next_at         TIMESTAMPTZ,
    backfill_at              TIMESTAMPTZ,
    backfill_attempts        INTEGER     NOT NULL DEFAULT 0 CHECK (backfill_attempts >= 0),
    backfill_abandon_reason  TEXT
        CHECK (backfill_abandon_reason IN ('MISSING_ROW', 'MAX_ATTEMPTS')),
    backfill_abandoned_at    TIMESTAMPTZ,
    updated_at               TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Head query: smallest PENDING/FAILED msg_id <= W, O(log n) at any backlog.
CREATE INDEX proc_state_head_idx ON proc_state (msg_id)
    WHERE state IN ('PENDING', 'FAILED');

-- Backfill sweep: terminal, unmarked, not abandoned, fair rotation order.
CREATE INDEX proc_state_backfill_idx ON proc_state (backfill_attempts, msg_id)
    WHERE state IN ('SUCCEEDED', 'SKIPPED', 'DEAD')
      AND backfill_at IS NULL
      AND backfill_abandon_reason IS NULL;

-- Identity binding: first binding wins.
CREATE UNIQUE INDEX proc_state_identity_idx ON proc_state (identity_key)
    WHERE identity_key IS NOT NULL;
