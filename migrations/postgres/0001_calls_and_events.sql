-- The broker's state on Postgres: batches, calls (each with its outcome once decided) and the
-- durable event log subscribers resume from. Times are microseconds since the Unix epoch, and
-- integers are BIGINT, as on SQLite, so both backends decode rows the same way.
-- Status codes match the protobuf CallStatus: 1 pending, 2 approved, 3 denied, 4 superseded,
-- 5 skipped, 6 expired, 7 cancelled.

CREATE TABLE batches (
    batch_id   TEXT PRIMARY KEY,
    agent      TEXT NOT NULL,
    session_id TEXT NOT NULL,
    on_deny    BIGINT NOT NULL,
    size       BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE calls (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent         TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    call_id       TEXT NOT NULL,
    batch_id      TEXT NOT NULL REFERENCES batches (batch_id),
    position      BIGINT NOT NULL,
    tool          TEXT NOT NULL,
    -- Canonical JSON text (not JSONB, which would change the canonical form).
    input         TEXT NOT NULL,
    title         TEXT NOT NULL,
    message       TEXT NOT NULL,
    workspace     TEXT NOT NULL,
    supersede_key TEXT,
    deadline      BIGINT,
    created_at    BIGINT NOT NULL,
    status        BIGINT NOT NULL DEFAULT 1,
    decided_at    BIGINT,
    decided_by    TEXT,
    reason        TEXT,
    tool_result   TEXT,
    run_input     TEXT,
    input_edited  BOOLEAN NOT NULL DEFAULT FALSE,
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

-- `id` is taken when a transaction writes the event; `seq`, the number subscribers see, is
-- assigned after commit by the sequencer (one at a time, under an advisory lock), so sequence
-- numbers follow commit order: a transaction that commits late can never slip an event in
-- below a sequence number a reader has already passed.
CREATE TABLE events (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    seq             BIGINT UNIQUE,
    kind            BIGINT NOT NULL,
    call_rowid      BIGINT NOT NULL REFERENCES calls (id),
    batch_completed BOOLEAN NOT NULL DEFAULT FALSE,
    created_at      BIGINT NOT NULL
);

CREATE INDEX events_unsequenced ON events (id) WHERE seq IS NULL;
CREATE INDEX events_call ON events (call_rowid, kind);
