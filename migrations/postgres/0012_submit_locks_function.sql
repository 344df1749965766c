-- A submit's locks in one statement (issue 19). A submit on Postgres took its session's lock,
-- then its (agent, tool) policy locks, then read the policy version and how many calls its agent
-- has pending: four round trips, each costing Postgres about as much CPU as a small write. This
-- function takes the same locks in the same order (session, then policy keys in the array's
-- order, which the broker sorts), then reads the version and, if `count_pending_to` is given,
-- counts the agent's pending calls no further than it, each read in a snapshot taken after the
-- locks were granted (a VOLATILE function takes a fresh one per statement), as the separate
-- statements were.
--
-- The lock keys are the ones every version takes, so replicas of the version before this one
-- serialise with these. It changes no table: going back past it is
-- `DROP FUNCTION lock_submit(TEXT, TEXT, INT4[], BIGINT)` and deleting its migration record
-- (docs/data-lifecycle.md).
CREATE FUNCTION lock_submit(
    agent TEXT,
    session TEXT,
    policy_keys INT4[],
    count_pending_to BIGINT,
    OUT policy_version BIGINT,
    OUT pending BIGINT
) LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(current_schema() || ':session'),
                                  hashtext(agent || chr(31) || session));
    PERFORM pg_advisory_xact_lock_shared(hashtext(current_schema() || ':policy'), k)
        FROM unnest(policy_keys) AS k;
    SELECT v.version INTO policy_version FROM policy_version AS v;
    IF count_pending_to IS NOT NULL THEN
        SELECT COUNT(*) INTO pending FROM (
            SELECT 1 FROM calls AS c WHERE c.agent = lock_submit.agent AND c.status = 1  -- pending (src/domain/codes.rs)
            LIMIT count_pending_to
        ) AS p;
    END IF;
END
$$;
