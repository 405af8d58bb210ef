-- The dead-letter copy's own identity (issue 53). Expand only: the previous release keeps
-- inserting events (the default fills the new column) and copying dead ones with the event's
-- own ce_id, as it always did.
--
-- A dead-letter copy used to carry the event's (ce_source, ce_id): a consumer or sink keeping
-- one de-duplication store across the events and dead-letter topics then dropped the event when
-- an operator's requeue finally delivered it to the events topic. The copy now carries this id
-- as its ce_id and the event's ce_id in the `ce_msgxoriginalid` extension. A requeue makes a new
-- one, so a second death is a new dead letter, and the exactly-once recovery never takes the
-- first copy for the current one. Nullable and filled for PENDING rows only, as 0018 did for
-- ce_id (no table rewrite); a PENDING row without one (requeued by the previous release) gets
-- one when the dispatcher first selects it.
ALTER TABLE msg_event ADD COLUMN dead_ce_id UUID;
ALTER TABLE msg_event ALTER COLUMN dead_ce_id SET DEFAULT gen_random_uuid();
UPDATE msg_event SET dead_ce_id = gen_random_uuid() WHERE dead_ce_id IS NULL AND state = 'PENDING';

-- Events this release made (the pump sets it): only a release that sends every event under its
-- UUID ever saw them. NULL on rows an earlier release made (before or during a rolling upgrade):
-- the previous release may have sent one as its number and stopped before writing SENT, so
-- while any such row is PENDING an at-least-once start reads the topics back for the previous
-- release's copies (issue 53 item 3). No default and no backfill: a column only.
ALTER TABLE msg_event ADD COLUMN made_by_uuid_release BOOLEAN;
