-- The policy version: a counter that every change to rules or grants moves, in the transaction
-- that makes the change (issue 19). A submit reads this one row instead of every rule and its
-- agent's grants: while the version it reads is the one its in-memory copy was read at, the copy
-- is what the tables hold (see src/store/policy_cache.rs). Triggers, not the broker's
-- statements, move it, so no writer of these tables can forget to.
CREATE TABLE policy_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT INTO policy_version (id, version) VALUES (1, 1);

CREATE TRIGGER rules_inserted_policy_version AFTER INSERT ON rules
BEGIN
    UPDATE policy_version SET version = version + 1;
END;
CREATE TRIGGER rules_updated_policy_version AFTER UPDATE ON rules
BEGIN
    UPDATE policy_version SET version = version + 1;
END;
CREATE TRIGGER rules_deleted_policy_version AFTER DELETE ON rules
BEGIN
    UPDATE policy_version SET version = version + 1;
END;
CREATE TRIGGER grants_inserted_policy_version AFTER INSERT ON grants
BEGIN
    UPDATE policy_version SET version = version + 1;
END;
CREATE TRIGGER grants_updated_policy_version AFTER UPDATE ON grants
BEGIN
    UPDATE policy_version SET version = version + 1;
END;
CREATE TRIGGER grants_deleted_policy_version AFTER DELETE ON grants
BEGIN
    UPDATE policy_version SET version = version + 1;
END;
