-- The sequencer in one statement (issue 19). Numbering committed events takes the sequencer's
-- lock, then, in a statement whose snapshot is taken after the lock was granted (so it sees the
-- previous holder's commit), numbers the events without a number after the last one, and
-- notifies the other replicas if it numbered any. Sent from the broker, that was four round
-- trips per run (BEGIN, the lock, the numbering, COMMIT) and, inside a group's transaction, a
-- multi-statement query that Postgres planned again on every group. A VOLATILE function takes a
-- fresh snapshot for each statement it runs, so the order holds inside one call, whose plans are
-- kept for the session: `SELECT number_events(...)` alone in a transaction of its own is the
-- whole sequencer run; at the end of a group's transaction it numbers the group's events, the
-- lock held through the group's commit.
--
-- `max_events` bounds one run (NULL: every event without a number). Returns how many it numbered.
-- The lock is the one every version of the broker takes (`current_schema()` || ':sequencer'), so
-- replicas of the version before this one number in turn with these. It changes no table: going
-- back past it is `DROP FUNCTION number_events(BIGINT, TEXT, TEXT)` and deleting its migration
-- record (docs/data-lifecycle.md).
CREATE FUNCTION number_events(max_events BIGINT, channel TEXT, replica TEXT) RETURNS BIGINT
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    numbered BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(current_schema() || ':sequencer'));
    WITH base AS (SELECT COALESCE(MAX(seq), 0) AS last FROM events),
         next AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM events
                  WHERE seq IS NULL ORDER BY id LIMIT max_events),
         done AS (UPDATE events e SET seq = base.last + next.n FROM base, next
                  WHERE e.id = next.id RETURNING 1)
    SELECT count(*) INTO numbered FROM done;
    IF numbered > 0 THEN
        PERFORM pg_notify(channel, replica);
    END IF;
    RETURN numbered;
END
$$;
