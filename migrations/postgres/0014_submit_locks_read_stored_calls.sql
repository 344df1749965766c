-- A submit's locks also tell which of its calls are stored already (issue 19). After taking
-- its locks (0012's `lock_submit`), a submit read each of its calls by key to tell a retry from
-- a new call: one more round trip per call, though almost every call is new. This version of
-- `lock_submit` takes the batch's call ids too, and after the locks, in a snapshot of its own,
-- returns those already stored in the session (`stored`, NULL if none); the submit reads only
-- those. The locks, their order and the other reads are 0012's.
--
-- 0012's four-argument `lock_submit` stays: replicas of the version before this one call it
-- during a rolling update. This one changes no table: going back past it is
-- `DROP FUNCTION lock_submit(TEXT, TEXT, INT4[], BIGINT, TEXT[])` and deleting its migration
-- record (docs/data-lifecycle.md).
CREATE FUNCTION lock_submit(
    agent TEXT,
    session TEXT,
    policy_keys INT4[],
    count_pending_to BIGINT,
    call_ids TEXT[],
    OUT policy_version BIGINT,
    OUT pending BIGINT,
    OUT stored TEXT[]
) LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
BEGIN
    SELECT l.policy_version, l.pending INTO policy_version, pending
        FROM lock_submit(agent, session, policy_keys, count_pending_to) AS l;
    SELECT array_agg(c.call_id) INTO stored FROM calls AS c
        WHERE c.agent = lock_submit.agent AND c.session_id = lock_submit.session
          AND c.call_id = ANY (lock_submit.call_ids);
END
$$;
