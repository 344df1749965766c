-- The policy version: a counter that every change to rules or grants moves, in the transaction
-- that makes the change (issue 19). A submit on any replica reads this one row instead of every
-- rule and its agent's grants: while the version it reads is the one its replica's in-memory copy
-- was read at, the copy is what the tables hold (see src/store/policy_cache.rs). Triggers, not
-- the broker's statements, move it, so no writer of these tables (on any replica, of any
-- version) can forget to.
--
-- The triggers are deferred to commit: the row is locked only while a transaction that changed
-- rules or grants commits, after every other lock it takes, so it adds no step to the lock order
-- (session, policy, batches, calls) and cannot close a cycle. The function names the table by the
-- trigger's schema, so replicas of any schema move their own counter.
CREATE TABLE policy_version (
    id      BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    version BIGINT NOT NULL
);
INSERT INTO policy_version (id, version) VALUES (TRUE, 1);

CREATE FUNCTION policy_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('UPDATE %I.policy_version SET version = version + 1', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER rules_policy_version AFTER INSERT OR UPDATE OR DELETE ON rules
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION policy_changed();
CREATE CONSTRAINT TRIGGER grants_policy_version AFTER INSERT OR UPDATE OR DELETE ON grants
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION policy_changed();
