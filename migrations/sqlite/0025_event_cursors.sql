-- Where a consumer of the event log stopped (issue 49): the Web Push sender ('push') resumes
-- here when a broker starts, so the calls committed while no broker pushed (or while the sender
-- was behind) are still pushed. `seq` only moves forward: each replica records the position it
-- reached, and the furthest stands (every event up to it was claimed by some replica).
CREATE TABLE event_cursors (
    consumer   TEXT PRIMARY KEY,
    seq        INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
