-- Slack app mode (issue 49): the message each pending call was posted as (`channel`, `ts`), so
-- that the broker updates it when the call is decided, threads reminders under it, and does so
-- after a restart too. `owner` is the broker process that claimed the posting (one process of a
-- fleet posts a call, and it alone updates its message); `channel` and `ts` stay empty until
-- Slack answered the post.
CREATE TABLE slack_messages (
    agent      TEXT NOT NULL,
    session_id TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    owner      TEXT NOT NULL,
    channel    TEXT NOT NULL,
    ts         TEXT NOT NULL,
    claimed_at BIGINT NOT NULL,
    PRIMARY KEY (agent, session_id, call_id)
);
