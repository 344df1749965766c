-- A call pruned by retention frees its (agent, session_id, call_id) for a new call
-- (docs/data-lifecycle.md), but receipts are never pruned: the chain must stay whole. So the key
-- of a receipt is not unique: a reused call id has one receipt per call decided under it, and
-- GetReceipt serves the one of the call stored now (docs/receipts.md). Before this, the new
-- call's receipt could not be stored and every decision of it failed.
--
-- SQLite cannot drop a table's UNIQUE constraint, so the table is built again, rows unchanged.
CREATE TABLE receipts_keyed_by_seq (
    seq        INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    session_id TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    digest     TEXT NOT NULL,
    envelope   TEXT NOT NULL
);
INSERT INTO receipts_keyed_by_seq (seq, agent, session_id, call_id, digest, envelope)
    SELECT seq, agent, session_id, call_id, digest, envelope FROM receipts;
DROP TABLE receipts;
ALTER TABLE receipts_keyed_by_seq RENAME TO receipts;
CREATE INDEX receipts_of_call ON receipts (agent, session_id, call_id, seq);
