-- Web Push subscriptions (issue 49): a browser's push endpoint and keys (base64url), kept for the
-- approver who added it, with the groups their token had then (sees_all: an admin, an auditor,
-- or anyone while auth is off) so the sender pushes only the calls that person may decide.
CREATE TABLE push_subscriptions (
    endpoint   TEXT PRIMARY KEY,
    approver   TEXT NOT NULL,
    sees_all   BOOLEAN NOT NULL,
    groups     TEXT NOT NULL,
    p256dh     TEXT NOT NULL,
    auth       TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX push_subscriptions_by_approver ON push_subscriptions (approver);

-- Which replica pushes an event: the first to insert its sequence number (the others skip it),
-- so that a fleet sends each push once. Old rows are pruned as new ones come.
CREATE TABLE push_claims (
    seq        BIGINT PRIMARY KEY,
    claimed_at BIGINT NOT NULL
);
