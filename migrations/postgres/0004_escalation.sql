-- Escalation ladders (reminders and escalations for calls nobody answers). A call left to a
-- human with a ladder stores it (`escalation`, JSON), how many steps fired (`next_step`, the
-- index of the next one) and when the next falls due (`next_step_at`, micros; NULL when none is
-- left before the deadline), so a step survives restarts and fires once. A fired step is an
-- event (kind 3 reminded, 4 escalated) carrying the step's index. An ask rule may carry a ladder.

ALTER TABLE calls ADD COLUMN escalation TEXT;
ALTER TABLE calls ADD COLUMN next_step BIGINT NOT NULL DEFAULT 0;
ALTER TABLE calls ADD COLUMN next_step_at BIGINT;
CREATE INDEX calls_step_due ON calls (next_step_at) WHERE status = 1 AND next_step_at IS NOT NULL;

ALTER TABLE events ADD COLUMN step BIGINT;

-- Empty: no ladder.
ALTER TABLE rules ADD COLUMN escalation TEXT NOT NULL DEFAULT '';
