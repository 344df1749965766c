-- Webhook endpoints and their delivery state. The cursor is the sequence number of the last
-- event delivered (or passed over by the endpoint's filter): delivery resumes after it, after a
-- restart and on any replica. Codes: format 1 CloudEvents, 2 Slack; event_kinds a bit per event
-- kind code (1 << 1 requested, 1 << 2 resolved), 0 for every kind. Empty tool/workspace/agent
-- match all. The lease names the one replica delivering to the endpoint, until `lease_until`
-- (micros); another replica takes it over only once it has run out.

CREATE TABLE webhooks (
    id                   TEXT PRIMARY KEY,
    url                  TEXT NOT NULL,
    secret               TEXT NOT NULL,
    event_kinds          BIGINT NOT NULL,
    tool                 TEXT NOT NULL,
    workspace            TEXT NOT NULL,
    agent                TEXT NOT NULL,
    format               BIGINT NOT NULL,
    max_in_flight        BIGINT NOT NULL,
    paused_reason        TEXT,
    last_error           TEXT NOT NULL,
    consecutive_failures BIGINT NOT NULL,
    cursor               BIGINT NOT NULL,
    from_file            BOOLEAN NOT NULL,
    created_at           BIGINT NOT NULL,
    lease_owner          TEXT,
    lease_until          BIGINT
);
