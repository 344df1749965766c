-- Signed receipts (docs/receipts.md): one per outcome, written in the outcome's transaction,
-- numbered `seq` 1, 2, ... in one chain per database, whatever the number of replicas: each
-- outcome's transaction locks the chain's head row (`receipt_chain`) until it commits, so the
-- replicas append in turn and the chain cannot fork. `digest` is the SHA-256 (hex) of the
-- receipt's payload, which the next receipt names as its `previous`; `envelope` is the DSSE
-- envelope as served (JSON text).
CREATE TABLE receipts (
    seq        BIGINT PRIMARY KEY,
    agent      TEXT NOT NULL,
    session_id TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    digest     TEXT NOT NULL,
    envelope   TEXT NOT NULL,
    UNIQUE (agent, session_id, call_id)
);

CREATE TABLE receipt_chain (
    id     BIGINT PRIMARY KEY CHECK (id = 1),
    seq    BIGINT NOT NULL,
    digest TEXT
);
INSERT INTO receipt_chain (id, seq, digest) VALUES (1, 0, NULL);
