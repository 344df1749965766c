-- A receipt names the row of its call while the call is stored (`call_row`), and GetReceipt
-- finds it through the call; deleting the call (retention prunes it) sets it to NULL, and a
-- receipt without a call row is found by its call's key. Receipts written before this have
-- none, and are found by key as before (docs/receipts.md).
--
-- Why: the index on (agent, session_id, call_id) took every receipt at its key's place in the
-- index, so when many sessions were decided at once each receipt dirtied an index page of its
-- own (docs/benchmarks.md). Call rows are numbered in the order calls arrive, so the receipts a
-- commit writes go to the last page or two of an index on `call_row`, and the key index keeps
-- only the receipts of pruned calls.
--
-- During a rolling update, a replica of the version before still writes receipts without a
-- call row (found by key, like the older ones), its pruning unlinks receipts like any delete,
-- and it still reads receipts by key alone, which this index serves only for receipts without
-- a call row: its GetReceipt scans the table until it is replaced. Its answers stay right.
ALTER TABLE receipts ADD COLUMN call_row BIGINT REFERENCES calls (id) ON DELETE SET NULL;
DROP INDEX receipts_of_call;
CREATE INDEX receipts_of_call_row ON receipts (call_row);
CREATE INDEX receipts_of_unlinked_call ON receipts (agent, session_id, call_id, seq)
    WHERE call_row IS NULL;
