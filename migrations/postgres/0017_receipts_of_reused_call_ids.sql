-- A call pruned by retention frees its (agent, session_id, call_id) for a new call
-- (docs/data-lifecycle.md), but receipts are never pruned: the chain must stay whole. So the key
-- of a receipt is not unique: a reused call id has one receipt per call decided under it, and
-- GetReceipt serves the one of the call stored now (docs/receipts.md). Before this, the new
-- call's receipt could not be stored and every decision of it failed.
CREATE INDEX receipts_of_call ON receipts (agent, session_id, call_id, seq);
ALTER TABLE receipts DROP CONSTRAINT receipts_agent_session_id_call_id_key;
