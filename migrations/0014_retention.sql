-- Retention of our own records (seed §8, SPEC §10, issue 13 item 5).
--
-- 1. Terminal PROC_STATE rows that are marked (or abandoned past a grace) and older than
--    `retention.proc_state` move here, in bounded batches, each one transaction (copy, then
--    delete the same locked rows). Same columns as proc_state, in the same order, plus
--    `archived_at` LAST: the archiver copies `proc_state.*`, so a migration that adds a column
--    to proc_state must add it here too (before archived_at) — the copy fails loudly otherwise.
CREATE TABLE proc_state_hst (LIKE proc_state INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE proc_state_hst ADD COLUMN archived_at TIMESTAMPTZ NOT NULL;
ALTER TABLE proc_state_hst ADD PRIMARY KEY (msg_id);
-- Identity de-duplication holds across the archive: a re-sent message whose identity is
-- archived still finds its holder here (the pump's holder lookups read both tables in one
-- statement, so a row moving between them is seen in exactly one). Same predicate as
-- proc_state_identity_idx (migration 0012): a DEAD record holds no identity.
CREATE UNIQUE INDEX proc_state_hst_identity_idx ON proc_state_hst (identity_key)
    WHERE identity_key IS NOT NULL AND state <> 'DEAD';
CREATE INDEX proc_state_hst_archived_idx ON proc_state_hst (archived_at);

-- Every record ever enqueued, live or archived: what "enqueued" means for the compensation
-- scan, the compat entry, verify and purge readiness once rows move.
CREATE VIEW proc_state_all AS
    SELECT p.*, false AS archived FROM proc_state p
    UNION ALL
    SELECT h.msg_id, h.state, h.source, h.received_at, h.enqueued_at, h.attempts,
           h.next_attempt_at, h.error_class, h.error_text, h.processing_started_at,
           h.terminal_reason, h.terminal_at, h.identity_key, h.backfill_next_at, h.backfill_at,
           h.backfill_attempts, h.backfill_abandon_reason, h.backfill_abandoned_at, h.updated_at,
           h.processed_seq, h.msg_type, h.stale_fields, h.backfill_error, true AS archived
    FROM proc_state_hst h;

-- The archive skips rows that still have events or schedule snapshots (both reference
-- proc_state); the snapshot check and the foreign-key check on delete need this index.
CREATE INDEX schd_snap_log_msg_idx ON schd_snap_log (msg_id);
-- msg_event retention deletes SENT events by age.
CREATE INDEX msg_event_sent_idx ON msg_event (sent_at) WHERE state = 'SENT';
CREATE INDEX audit_log_at_idx ON audit_log (at);

CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON proc_state_hst
    FOR EACH STATEMENT EXECUTE FUNCTION msgx_fence_check();
