-- Remembered approvals (grants) and operators' policy rules. Both are read inside every submit's
-- transaction, so a change applies to the next submit. Codes match the protobuf enums: scope
-- 2 session, 3 workspace, 4 always; effect 1 allow, 2 deny, 3 ask (rules only). Matchers are
-- JSON text (`{"any":true}`, `{"exact":{...}}`, `{"fields":[...]}`).

CREATE TABLE grants (
    -- AUTOINCREMENT: a grant id is never reused, so `grant:<id>` in an outcome names one grant.
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    agent          TEXT NOT NULL,
    scope          INTEGER NOT NULL,
    -- Set for session grants only.
    session_id     TEXT,
    -- Set for workspace grants only.
    workspace      TEXT,
    tool           TEXT NOT NULL,
    matcher        TEXT NOT NULL,
    effect         INTEGER NOT NULL,
    created_by     TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER,
    revoked_at     INTEGER,
    revoked_by     TEXT,
    source_session TEXT NOT NULL,
    source_call    TEXT NOT NULL,
    reason         TEXT NOT NULL
);

-- What a submit reads: the unrevoked grants of its agent for its tools.
CREATE INDEX grants_live ON grants (agent, tool) WHERE revoked_at IS NULL;
CREATE INDEX grants_session ON grants (agent, session_id) WHERE session_id IS NOT NULL;
CREATE INDEX grants_workspace ON grants (agent, workspace) WHERE workspace IS NOT NULL;
CREATE INDEX grants_source ON grants (agent, source_session, source_call);

CREATE TABLE rules (
    id          TEXT PRIMARY KEY NOT NULL,
    tool        TEXT NOT NULL,
    matcher     TEXT NOT NULL,
    effect      INTEGER NOT NULL,
    priority    INTEGER NOT NULL,
    description TEXT NOT NULL,
    -- `file` (the policy file, replaced at start) or `admin` (CreateRule).
    source      TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);

-- A new grant decides the pending calls of its agent and tool.
CREATE INDEX calls_pending_tool ON calls (agent, tool, id) WHERE status = 1;
-- The audit: ListCalls by who or what decided.
CREATE INDEX calls_decided_by ON calls (decided_by, id) WHERE decided_by IS NOT NULL;
