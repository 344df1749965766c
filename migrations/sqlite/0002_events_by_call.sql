-- Finds a call's events (its Resolved event's sequence number is read with every call).
CREATE INDEX events_call ON events (call_rowid, kind);
