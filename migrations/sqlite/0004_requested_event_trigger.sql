-- The Requested event of a call is written by the INSERT of the call itself, with the call's
-- `requested_seq`: one statement where the writer used to issue three, each a round trip to the
-- SQLite worker thread on the single write path (issue 5: fewer statements per write is what
-- lets a group commit carry more writes per second).
CREATE TRIGGER calls_requested_event AFTER INSERT ON calls
BEGIN
    INSERT INTO events (kind, call_rowid, created_at) VALUES (1, NEW.id, NEW.created_at);
    UPDATE calls SET requested_seq = last_insert_rowid() WHERE id = NEW.id;
END;
