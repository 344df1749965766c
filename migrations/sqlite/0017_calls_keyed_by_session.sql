-- no-transaction
-- The calls' key is (session_id, agent, call_id), no longer (agent, session_id, call_id), and the
-- index `calls_session (session_id, id)` goes: the key serves a session's calls, with or without
-- its agent.
--
-- Why: when many sessions write at once, every call takes a page of each index that orders calls
-- by session, and a commit writes each such page to the log (docs/benchmarks.md, "Which pages a
-- commit writes"). The key and `calls_session` were two such indexes, over half the pages of an
-- auto-approved commit at 64 agents; now there is one.
--
-- SQLite cannot change a table's UNIQUE constraint, so `calls` is built again with its rows, ids,
-- indexes and trigger unchanged. Three tables reference `calls (id)` (events, shadow verdicts
-- with ON DELETE CASCADE, receipts with ON DELETE SET NULL): dropping the old table with foreign
-- keys on would delete or unlink their rows, so foreign keys are off for the rebuild (the pragma
-- has no effect inside a transaction, hence `no-transaction` above and the explicit one below).
-- Every row keeps its id, so every reference stays whole.
PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

CREATE TABLE calls_keyed_by_session (
    id            INTEGER PRIMARY KEY,
    agent         TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    call_id       TEXT NOT NULL,
    batch_id      TEXT NOT NULL REFERENCES batches (batch_id),
    position      INTEGER NOT NULL,
    tool          TEXT NOT NULL,
    input         TEXT NOT NULL,
    title         TEXT NOT NULL,
    message       TEXT NOT NULL,
    workspace     TEXT NOT NULL,
    supersede_key TEXT,
    deadline      INTEGER,
    created_at    INTEGER NOT NULL,
    -- The sequence number of the call's Requested event (snapshots stop at a sequence number).
    requested_seq INTEGER NOT NULL DEFAULT 0,
    status        INTEGER NOT NULL DEFAULT 1,
    decided_at    INTEGER,
    decided_by    TEXT,
    reason        TEXT,
    tool_result   TEXT,
    -- NULL when the approver did not edit the input: the call's own input runs (0014).
    run_input     TEXT,
    input_edited  INTEGER NOT NULL DEFAULT 0,
    -- Escalation ladder (JSON), the index of its next step, and when that step falls due (0007).
    escalation    TEXT,
    next_step     INTEGER NOT NULL DEFAULT 0,
    next_step_at  INTEGER,
    -- Approver routing (0009): who asked, what the call needs (JSON), the votes so far (JSON).
    requested_by  TEXT,
    requirement   TEXT,
    votes         TEXT,
    UNIQUE (session_id, agent, call_id)
);

INSERT INTO calls_keyed_by_session
    SELECT id, agent, session_id, call_id, batch_id, position, tool, input, title, message,
           workspace, supersede_key, deadline, created_at, requested_seq, status, decided_at,
           decided_by, reason, tool_result, run_input, input_edited, escalation, next_step,
           next_step_at, requested_by, requirement, votes
    FROM calls;

DROP TABLE calls;
ALTER TABLE calls_keyed_by_session RENAME TO calls;

CREATE INDEX calls_pending ON calls (id) WHERE status = 1;
CREATE INDEX calls_pending_session ON calls (agent, session_id, id) WHERE status = 1;
CREATE INDEX calls_due ON calls (deadline) WHERE status = 1 AND deadline IS NOT NULL;
CREATE INDEX calls_supersede ON calls (agent, session_id, supersede_key)
    WHERE status = 1 AND supersede_key IS NOT NULL;
CREATE INDEX calls_batch ON calls (batch_id, position);
CREATE INDEX calls_status ON calls (status, id);
CREATE INDEX calls_pending_tool ON calls (agent, tool, id) WHERE status = 1;
CREATE INDEX calls_decided_by ON calls (decided_by, id) WHERE decided_by IS NOT NULL;
CREATE INDEX calls_pending_batch ON calls (batch_id, position) WHERE status = 1;
CREATE INDEX calls_step_due ON calls (next_step_at) WHERE status = 1 AND next_step_at IS NOT NULL;
CREATE INDEX calls_decided_at ON calls (decided_at, id) WHERE status <> 1;

CREATE TRIGGER calls_requested_event AFTER INSERT ON calls
BEGIN
    INSERT INTO events (kind, call_rowid, created_at) VALUES (1, NEW.id, NEW.created_at);
    UPDATE calls SET requested_seq = last_insert_rowid() WHERE id = NEW.id;
END;

COMMIT;

PRAGMA foreign_keys = ON;
