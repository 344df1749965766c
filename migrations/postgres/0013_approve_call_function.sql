-- A plain approval in one statement (issue 19). An approver's approval that creates no grant,
-- of a call without a requirement or a ladder, on a broker without receipts, was a transaction
-- of four round trips (BEGIN, the call read locking its batch, the outcome with its Resolved
-- event, COMMIT), each costing Postgres a backend wake-up whatever it does. This function does
-- what those statements did, in the same order and under the same lock, run alone as an
-- autocommit statement: it locks the call's batch row as it finds the call (the lock every
-- resolution of a call of that batch takes), writes the approval if the call is still pending,
-- then the Resolved event flagged as completing the batch if no other call of it is pending,
-- each statement in a snapshot taken after the lock (a VOLATILE function takes a fresh one per
-- statement), as the separate statements were.
--
-- It decides only what needs none of the broker's other checks, and writes nothing otherwise:
-- a call decided already, with a requirement or a ladder, past its deadline, or submitted by
-- the approver (as its agent or the human it was requested by). For those it returns the call's
-- row id and no event, and the broker decides through its whole transaction, which answers
-- each case as before. `call_row` NULL: no such call.
--
-- `run_input` NULL runs the call's own input. It changes no table: going back past it is
-- `DROP FUNCTION approve_call(TEXT, TEXT, TEXT, TEXT, BIGINT, TEXT, TEXT, TEXT, BOOLEAN)` and
-- deleting its migration record (docs/data-lifecycle.md).
CREATE FUNCTION approve_call(
    agent TEXT,
    session TEXT,
    call_id TEXT,
    approver TEXT,
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
    -- A NULL deadline or requested_by makes its comparison NULL, which IF takes as false.
    IF stored.status <> 1  -- pending (src/domain/codes.rs)
       OR stored.requirement IS NOT NULL OR stored.escalation IS NOT NULL
       OR stored.deadline <= approve_call.decided_at
       OR stored.agent = approve_call.approver
       OR (stored.requested_by <> '' AND stored.requested_by = approve_call.approver) THEN
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
