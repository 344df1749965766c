-- Retention (`--retain-decided`): decided calls and their events are pruned once old enough.
-- `pruned_through` is the highest sequence number ever pruned: the log is complete after it, so
-- a subscriber resuming below it is refused (it would miss pruned events), never served a gap.
-- The index is what pruning walks: decided calls, oldest decision first.

CREATE TABLE retention (
    id             BIGINT PRIMARY KEY CHECK (id = 1),
    pruned_through BIGINT NOT NULL
);
INSERT INTO retention (id, pruned_through) VALUES (1, 0);

CREATE INDEX calls_decided_at ON calls (decided_at, id) WHERE status <> 1;
