-- The pump's throughput (issue 43 item 1): `msg_event.msg_id` no longer references
-- `proc_state`. The foreign key was checked row by row (one index probe and a KEY SHARE lock on
-- the message's row per event): about a third of the group's outcome statement, whose other
-- work is set-based. The invariant it guarded holds by construction: every event is written by
-- the outcome statement (`store::batch`) that also sets its message SUCCEEDED, which fails —
-- and is rolled back with its events — unless it updated every member's row; and a row leaves
-- `proc_state` only through the archive, which takes none with an event left. `msgexchange
-- verify` (invariant `events_delivered`) still reports an event without its SUCCEEDED message.
-- `schd_snap_log` keeps its foreign key (one row per schedule, written on its own).
ALTER TABLE msg_event DROP CONSTRAINT IF EXISTS msg_event_msg_id_fkey;
