-- Rules in shadow. A rule's mode (codes as the protobuf RuleMode: 1 enforce, 2 shadow,
-- 3 disabled); every rule stored before modes existed enforces. And what shadow rules would have
-- done with each call at submit, written in the submit's transaction: verdict codes are the
-- CallStatus the call would have got (1 pending: a human decides, 2 approved, 3 denied).

ALTER TABLE rules ADD COLUMN mode INTEGER NOT NULL DEFAULT 1;

CREATE TABLE shadow_verdicts (
    -- Deleting a call (retention) takes its verdicts with it.
    call_rowid INTEGER NOT NULL REFERENCES calls (id) ON DELETE CASCADE,
    -- The rule's id when the call was submitted; the rule may since be gone.
    rule_id    TEXT NOT NULL,
    verdict    INTEGER NOT NULL,
    PRIMARY KEY (call_rowid, rule_id)
);
