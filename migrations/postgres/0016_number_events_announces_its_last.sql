-- The sequencer's notification says how far it numbered (issue 19). A run that numbered events
-- notified the other replicas with its replica's name, and each of them read the log on it.
-- With two replicas, each runs the sequencer after its own commits, and a run numbers every
-- committed event, the other replica's too: that replica's own run and read had often
-- published them already when the notification arrived, and it read the log again for nothing
-- (a third of all log reads at 8 agents on two replicas). The payload is now the replica's
-- name, a space, and the last sequence number the run gave; a replica that has published that
-- far does not read. A payload without a number (the previous version's) is read on as before,
-- and a replica of the previous version, comparing whole payloads, takes its own notifications
-- for another's and reads once more: harmless during a rolling update.
--
-- The same signature, locks and numbering as 0011's, and 0015's one plan per statement.
-- Going back past it is running 0011's definition again as `CREATE OR REPLACE` (with 0015's
-- `ALTER FUNCTION`) and deleting its migration record (docs/data-lifecycle.md).
CREATE OR REPLACE FUNCTION number_events(max_events BIGINT, channel TEXT, replica TEXT)
RETURNS BIGINT
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    numbered BIGINT;
    last_given BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(current_schema() || ':sequencer'));
    WITH base AS (SELECT COALESCE(MAX(seq), 0) AS last FROM events),
         next AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM events
                  WHERE seq IS NULL ORDER BY id LIMIT max_events),
         done AS (UPDATE events e SET seq = base.last + next.n FROM base, next
                  WHERE e.id = next.id RETURNING e.seq)
    SELECT count(*), max(done.seq) INTO numbered, last_given FROM done;
    IF numbered > 0 THEN
        PERFORM pg_notify(channel, replica || ' ' || last_given);
    END IF;
    RETURN numbered;
END
$$;
