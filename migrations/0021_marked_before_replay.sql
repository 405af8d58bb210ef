-- A replay reopens a row whose inbox mark we had confirmed (issue 41): the replay clears
-- `backfill_at` (the row must be confirmed again once terminal), but the mark stays on the
-- inbox row (marks are never revoked), so the DB owner may purge the row while it is being
-- processed again. The replay keeps here when the mark was first confirmed; a sweep that then
-- finds the row gone confirms it (purged after its mark) instead of abandoning it MISSING_ROW
-- with a "purged before mark" alert. NULL for a row never replayed after a confirmed mark.
-- The archive keeps the same columns (it names them: `archived_at` comes before this one there).
ALTER TABLE proc_state ADD COLUMN marked_before_replay_at TIMESTAMPTZ;
ALTER TABLE proc_state_hst ADD COLUMN marked_before_replay_at TIMESTAMPTZ;
