-- `approve_call` no longer judges who approves (issue 43). Migration 0013's function refused
-- an approval by the call's agent or by the person it was requested by, comparing identities
-- as typed: a second copy, in SQL, of the rule the one gate (`domain::policy::gate`) keeps, and
-- a copy that `Carol` and `carol` passed. The broker now reads the call first and asks the gate
-- (who submitted it and what it requires never change after submit), and calls this function
-- only for a decision the gate admits; the function checks only the call's state: still
-- pending, no requirement or ladder (votes and steps need the whole transaction), before its
-- deadline. Its arguments lose `approver`.
--
-- Going back past it: drop this function, restore 0013's (and 0015's plan setting), and delete
-- this migration's record (docs/data-lifecycle.md).
DROP FUNCTION approve_call(TEXT, TEXT, TEXT, TEXT, BIGINT, TEXT, TEXT, TEXT, BOOLEAN);

CREATE FUNCTION approve_call(
    agent TEXT,
    session TEXT,
    call_id TEXT,
    decided_at BIGINT,
    decided_by TEXT,
    reason TEXT,
    run_input TEXT,
    input_edited BOOLEAN,
    OUT call_row BIGINT,
    OUT resolved_event BIGINT
) LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    stored calls%ROWTYPE;
BEGIN
    SELECT c.* INTO stored FROM calls AS c JOIN batches AS b ON b.batch_id = c.batch_id
        WHERE c.agent = approve_call.agent AND c.session_id = approve_call.session
          AND c.call_id = approve_call.call_id
        FOR NO KEY UPDATE OF b;
    IF stored.id IS NULL THEN
        RETURN;
    END IF;
    call_row := stored.id;
    -- A NULL deadline makes its comparison NULL, which IF takes as false.
    IF stored.status <> 1  -- pending (src/domain/codes.rs)
       OR stored.requirement IS NOT NULL OR stored.escalation IS NOT NULL
       OR stored.deadline <= approve_call.decided_at THEN
        RETURN;
    END IF;
    -- The batch lock does not lock the call's row: its status is checked again by the update.
    UPDATE calls AS c SET status = 2,  -- approved
        decided_at = approve_call.decided_at, decided_by = approve_call.decided_by,
        reason = approve_call.reason, tool_result = '',
        run_input = COALESCE(approve_call.run_input, c.input),
        input_edited = approve_call.input_edited
        WHERE c.id = call_row AND c.status = 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO events (kind, call_rowid, created_at, batch_completed)
        SELECT 2, call_row, approve_call.decided_at,  -- Resolved
               NOT EXISTS (SELECT 1 FROM calls AS o WHERE o.batch_id = stored.batch_id
                           AND o.id <> call_row AND o.status = 1)
        RETURNING id INTO resolved_event;
END
$$;

ALTER FUNCTION approve_call(TEXT, TEXT, TEXT, BIGINT, TEXT, TEXT, TEXT, BOOLEAN)
    SET plan_cache_mode = force_generic_plan;
