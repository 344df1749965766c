-- Webhook endpoints and their delivery state. The cursor is the sequence number of the last
-- event delivered (or passed over by the endpoint's filter): delivery resumes after it, after a
-- restart too. Codes: format 1 CloudEvents, 2 Slack; event_kinds a bit per event kind code
-- (1 << 1 requested, 1 << 2 resolved), 0 for every kind. Empty tool/workspace/agent match all.
-- The lease names the broker process delivering to the endpoint, until `lease_until` (micros).

CREATE TABLE webhooks (
    id                   TEXT PRIMARY KEY,
    url                  TEXT NOT NULL,
    secret               TEXT NOT NULL,
    event_kinds          INTEGER NOT NULL,
    tool                 TEXT NOT NULL,
    workspace            TEXT NOT NULL,
    agent                TEXT NOT NULL,
    format               INTEGER NOT NULL,
    max_in_flight        INTEGER NOT NULL,
    paused_reason        TEXT,
    last_error           TEXT NOT NULL,
    consecutive_failures INTEGER NOT NULL,
    cursor               INTEGER NOT NULL,
    from_file            INTEGER NOT NULL,
    created_at           INTEGER NOT NULL,
    lease_owner          TEXT,
    lease_until          INTEGER
);
