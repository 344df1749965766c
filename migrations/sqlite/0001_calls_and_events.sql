-- The broker's state on SQLite: batches, calls (each with its outcome once decided) and the
-- durable event log subscribers resume from. Times are microseconds since the Unix epoch.
-- Status codes match the protobuf CallStatus: 1 pending, 2 approved, 3 denied, 4 superseded,
-- 5 skipped, 6 expired, 7 cancelled.

CREATE TABLE batches (
    batch_id   TEXT PRIMARY KEY NOT NULL,
    agent      TEXT NOT NULL,
    session_id TEXT NOT NULL,
    on_deny    INTEGER NOT NULL,
    size       INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE TABLE calls (
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
    run_input     TEXT,
    input_edited  INTEGER NOT NULL DEFAULT 0,
    UNIQUE (agent, session_id, call_id)
);

CREATE INDEX calls_pending ON calls (id) WHERE status = 1;
CREATE INDEX calls_pending_session ON calls (agent, session_id, id) WHERE status = 1;
CREATE INDEX calls_due ON calls (deadline) WHERE status = 1 AND deadline IS NOT NULL;
CREATE INDEX calls_supersede ON calls (agent, session_id, supersede_key)
    WHERE status = 1 AND supersede_key IS NOT NULL;
CREATE INDEX calls_batch ON calls (batch_id, position);
CREATE INDEX calls_status ON calls (status, id);
CREATE INDEX calls_session ON calls (session_id, id);

CREATE TABLE events (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            INTEGER NOT NULL,
    call_rowid      INTEGER NOT NULL REFERENCES calls (id),
    batch_completed INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL
);
