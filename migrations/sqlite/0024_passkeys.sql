-- Passkeys (issue 46): WebAuthn credentials approvers register, and the challenges the broker
-- issues for them. A credential is kept with its owner's canonical identity, its COSE public key
-- (base64url) and the authenticator's last sign count; revoking it keeps the row (the receipts of
-- what it approved name it) and marks it. A challenge is single use: the registration or vote that
-- answers it deletes it in its own transaction; expired ones are deleted as new ones are issued.
CREATE TABLE passkeys (
    credential_id TEXT PRIMARY KEY,
    approver      TEXT NOT NULL,
    name          TEXT NOT NULL,
    public_key    TEXT NOT NULL,
    algorithm     INTEGER NOT NULL,
    sign_count    INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    last_used_at  INTEGER,
    revoked_at    INTEGER,
    revoked_by    TEXT
);
CREATE INDEX passkeys_by_approver ON passkeys (approver);

CREATE TABLE passkey_challenges (
    challenge        TEXT PRIMARY KEY,
    purpose          TEXT NOT NULL,
    approver         TEXT NOT NULL,
    agent            TEXT,
    session_id       TEXT,
    call_id          TEXT,
    nonce            TEXT NOT NULL,
    statement_digest TEXT NOT NULL,
    expires_at       INTEGER NOT NULL
);
CREATE INDEX passkey_challenges_by_expiry ON passkey_challenges (expires_at);
