//! Slack messages as stored (`slack_messages`, migrations 0023 SQLite / 0027 Postgres): which
//! message each call was posted as, and which broker process posted it. The SQL is written once
//! for both backends (parameters in the order they appear, as SQLite numbers them).

/// A call's Slack message, as `crate::surface::slack` claimed and recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSlackMessage {
    /// The broker process that claimed the posting.
    pub owner: String,
    /// Empty until Slack answered the post.
    pub channel: String,
    pub ts: String,
}

/// Claims a call's posting: one row per call, the first claim wins; a claim whose post never
/// got an answer (`ts` still empty) and that is older than `$6` may be taken over.
pub const CLAIM: &str = "INSERT INTO slack_messages \
     (agent, session_id, call_id, owner, channel, ts, claimed_at) \
     VALUES ($1, $2, $3, $4, '', '', $5) \
     ON CONFLICT (agent, session_id, call_id) DO UPDATE \
     SET owner = excluded.owner, claimed_at = excluded.claimed_at \
     WHERE slack_messages.ts = '' AND slack_messages.claimed_at < $6";

/// Records where the claimed message was posted.
pub const RECORD: &str = "UPDATE slack_messages SET channel = $1, ts = $2 \
     WHERE agent = $3 AND session_id = $4 AND call_id = $5";

/// A call's message.
pub const SELECT: &str = "SELECT owner, channel, ts FROM slack_messages \
     WHERE agent = $1 AND session_id = $2 AND call_id = $3";
