-- Operator surface (issue 12).
--
-- 1. A DEAD record no longer holds its business identity against a later re-send (seed §11:
--    one *valid* record per identity). The identity stays on the DEAD row for the record;
--    only rows that are not DEAD take part in the uniqueness. A replay clears the identity of
--    the row it resets, so the pump binds it again: a DEAD record whose identity another
--    record holds by then ends SKIPPED(DUPLICATE) naming the holder.
DROP INDEX proc_state_identity_idx;
CREATE UNIQUE INDEX proc_state_identity_idx ON proc_state (identity_key)
    WHERE identity_key IS NOT NULL AND state <> 'DEAD';

-- 2. Every audited action may name the operator's ticket (change/incident number).
ALTER TABLE audit_log ADD COLUMN ticket TEXT;
-- The audit trail of one message (`msgexchange inspect`).
CREATE INDEX audit_log_msg_ids_idx ON audit_log USING gin (msg_ids);

-- 3. Small partial indexes for `msgexchange status` and `events list-dead`: abandoned
--    backfills and DEAD events are rare rows, counted and listed without a table scan.
CREATE INDEX proc_state_abandoned_idx ON proc_state (msg_id)
    WHERE backfill_abandon_reason IS NOT NULL;
CREATE INDEX msg_event_dead_idx ON msg_event (event_id) WHERE state = 'DEAD';
