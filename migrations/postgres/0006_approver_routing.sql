-- Approver routing and two-person rules (issue 18). All nullable, so rows written before read as
-- "no requirement": anyone decides, alone, as before.
-- An ask rule's `approvers` (JSON: groups, quorum, distinct_groups, denials_to_deny).
ALTER TABLE rules ADD COLUMN approvers TEXT;
-- The human an agent acted for (CallSpec.requested_by): never an approver of the call.
ALTER TABLE calls ADD COLUMN requested_by TEXT;
-- The requirement fixed on the call at submit (JSON, with the rule that set it), so a later
-- rule edit never changes what a pending call needs.
ALTER TABLE calls ADD COLUMN requirement TEXT;
-- The votes recorded so far (JSON list); written under the call's batch lock.
ALTER TABLE calls ADD COLUMN votes TEXT;
