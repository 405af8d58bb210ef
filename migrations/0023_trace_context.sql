-- Issue 54: a message registered through the compat entry (`POST /cminmsgs/send`) with a W3C
-- `traceparent` continues the caller's trace. The pump and the dispatcher run later, in other
-- actors and maybe another process, so the caller's context is kept with the row: the
-- `traceparent` and `tracestate` as received (validated), NULL for every other row (their
-- trace ids are derived from the message's identity, nothing to store). The archive keeps the
-- same columns.
ALTER TABLE proc_state ADD COLUMN trace_parent TEXT, ADD COLUMN trace_state TEXT;
ALTER TABLE proc_state_hst ADD COLUMN trace_parent TEXT, ADD COLUMN trace_state TEXT;
