-- Numbering continues after the pruned horizon (issue 44). Retention kept the log's last event,
-- because `number_events` numbered new events after the highest one left: a quiet broker never
-- pruned the batch that held it, however old (`--retain-decided 2s` kept a call for as long as
-- nothing else was submitted). `number_events` now numbers after the greater of the highest
-- event and `retention.pruned_through`, which a prune raises in the transaction that deletes
-- events, so retention may delete the last event too.
--
-- The same signature, locks, notification and plan setting as 0016's. During a rolling update a
-- replica of the previous version still keeps the last event when it prunes; but one that numbers
-- after a newer replica pruned the last event would give numbers again below the horizon, so
-- prune with one version at a time (docs/data-lifecycle.md). Going back past it is running 0016's
-- definition again as `CREATE OR REPLACE` and deleting this migration's record.
CREATE OR REPLACE FUNCTION number_events(max_events BIGINT, channel TEXT, replica TEXT)
RETURNS BIGINT
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    numbered BIGINT;
    last_given BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(current_schema() || ':sequencer'));
    WITH base AS (SELECT GREATEST(COALESCE((SELECT MAX(seq) FROM events), 0),
                                  COALESCE((SELECT MAX(pruned_through) FROM retention), 0)) AS last),
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
