-- Issue 43 item 2, the design question behind the block: what the SPEC's per-row delivery and
-- mark confirmations cost PostgreSQL as the service writes them (a non-HOT UPDATE of the wide
-- `msg_event` and `proc_state` rows), against a narrow-table shape (a row inserted with the
-- event or message, deleted when it is sent or marked). Per row: execution time and WAL, in
-- batches of 256 rows with a commit each (the dispatcher's and the sweep's shape), on events
-- sized like the generator's (541 B per row here, 535 B measured in a `msgx-bench pump` store).
--
-- Run on a scratch store migrated by the service (it TRUNCATEs msg_event and proc_state):
--   psql -c 'CREATE DATABASE msgx_probe'
--   MSGX_STORE__URL=postgres://postgres@127.0.0.1:5432/msgx_probe msgexchange migrate
--   psql -d msgx_probe -v n=200000 -f bench/sql/narrow_delivery.sql
--   psql -c 'DROP DATABASE msgx_probe'
-- Figures and what they mean: docs/performance.md, "Issue 43 ends blocked on item 2".
\set ON_ERROR_STOP 1
\timing off
DROP TABLE IF EXISTS probe_out; CREATE TABLE probe_out (what text, rows bigint, ms numeric, wal bigint);
TRUNCATE msg_event, proc_state CASCADE;
INSERT INTO proc_state (msg_id, state, enqueued_at, terminal_at, terminal_reason, identity_key, msg_type, processed_seq)
SELECT i, 'SUCCEEDED', now(), now(), NULL, 'SNDR|FLOP||' || i, 'FLOP', i FROM generate_series(1, :n) i;
INSERT INTO msg_event (msg_id, flight_key, event_type, payload, created_at)
SELECT i, 'F' || (i % 5000), 'FLIGHT_UPDATED',
  jsonb_build_object('flid', 'F' || (i % 5000), 'fields', jsonb_build_object('GATE','G' || i, 'STND','S1','ETOT','2026-12-07T10:00:00+08:00','EIBT','2026-12-07T11:00:00+08:00','REMARK', repeat('x', 190)), 'msg_id', i, 'seq', i),
  now() FROM generate_series(1, :n) i;
CREATE TABLE IF NOT EXISTS event_unsent (event_id bigint PRIMARY KEY);
CREATE TABLE IF NOT EXISTS unmarked (msg_id bigint PRIMARY KEY);
TRUNCATE event_unsent, unmarked;
VACUUM ANALYZE proc_state; VACUUM ANALYZE msg_event;
SELECT min(event_id) AS e0 FROM msg_event \gset

-- One phase: `sql` over ids base..base+n-1, 256 at a time, a commit after each batch, from a
-- checkpoint (so every phase pays its own full-page images).
CREATE OR REPLACE PROCEDURE probe(what text, sql text, n bigint, base bigint) LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; l0 pg_lsn; b bigint := 0;
BEGIN
  CHECKPOINT;
  t0 := clock_timestamp(); l0 := pg_current_wal_insert_lsn();
  WHILE b < n LOOP
    EXECUTE sql USING base + b, base + least(b + 256, n) - 1;
    COMMIT;
    b := b + 256;
  END LOOP;
  INSERT INTO probe_out VALUES (what, n, extract(epoch FROM clock_timestamp() - t0) * 1000,
                                pg_current_wal_insert_lsn() - l0);
  COMMIT;
END $$;
CREATE TABLE IF NOT EXISTS event_sent (event_id bigint PRIMARY KEY, kafka_partition int, kafka_offset bigint, sent_at timestamptz);
TRUNCATE event_sent;
CALL probe('A msg_event PENDING->SENT (the service)', 'UPDATE msg_event e SET state = ''SENT'', sent_at = now(), next_attempt_at = NULL, kafka_topic = ''events'', kafka_partition = 0, kafka_offset = e.event_id WHERE e.event_id BETWEEN $1 AND $2 AND e.state = ''PENDING''', :n, :e0);
CALL probe('B proc_state backfill_at (the service)', 'UPDATE proc_state SET backfill_at = now(), backfill_next_at = NULL, backfill_error = NULL, updated_at = now() WHERE msg_id BETWEEN $1 AND $2 AND state IN (''SUCCEEDED'', ''SKIPPED'', ''DEAD'') AND backfill_at IS NULL AND backfill_abandon_reason IS NULL', :n, 1);
CALL probe('N1 narrow: event_unsent insert (pump side)', 'INSERT INTO event_unsent SELECT generate_series($1, $2)', :n, :e0);
CALL probe('N2 narrow: event_unsent delete + event_sent insert', 'WITH d AS (DELETE FROM event_unsent WHERE event_id BETWEEN $1 AND $2 RETURNING event_id) INSERT INTO event_sent SELECT event_id, 0, event_id, now() FROM d', :n, :e0);
CALL probe('N3 narrow: unmarked insert (pump side)', 'INSERT INTO unmarked SELECT generate_series($1, $2)', :n, 1);
CALL probe('N4 narrow: unmarked delete', 'DELETE FROM unmarked WHERE msg_id BETWEEN $1 AND $2', :n, 1);
SELECT what, rows, round(ms / rows * 1000, 1) AS us_per_row, round(wal::numeric / rows) AS wal_bytes_per_row FROM probe_out;
