-- Signed receipts (docs/receipts.md): one per outcome, written in the outcome's transaction,
-- numbered `seq` 1, 2, ... in one chain per database. `digest` is the SHA-256 (hex) of the
-- receipt's payload, which the next receipt names as its `previous`; `envelope` is the DSSE
-- envelope as served (JSON text).
CREATE TABLE receipts (
    seq        INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    session_id TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    digest     TEXT NOT NULL,
    envelope   TEXT NOT NULL,
    UNIQUE (agent, session_id, call_id)
);

-- The chain's head: the last receipt's seq (0 before the first) and digest. One row, so the
-- transaction appending a receipt reads (on Postgres, locks) exactly one thing.
CREATE TABLE receipt_chain (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    seq    INTEGER NOT NULL,
    digest TEXT
);
INSERT INTO receipt_chain (id, seq, digest) VALUES (1, 0, NULL);
