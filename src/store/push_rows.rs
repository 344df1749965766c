//! Web Push subscriptions as stored (`push_subscriptions`, migrations 0022 SQLite / 0026
//! Postgres): plain text columns both backends read and write alike; `crate::background::push` validates
//! them before they are written and turns them into what it sends. Also the sender's position
//! in the event log (`event_cursors`, migrations 0025 SQLite / 0029 Postgres), and the Slack
//! poster's beside it.

/// One browser's subscription, kept for the approver who added it.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredPushSubscription {
    /// The push service's URL for this browser (a capability: never logged whole).
    pub endpoint: String,
    /// Who added it (their token's identity; `anonymous` while auth is off).
    pub approver: String,
    /// Sees every call (an admin or auditor token, or auth off); else `groups` decide.
    pub sees_all: bool,
    /// The approver groups the token had when the subscription was added.
    pub groups: Vec<String>,
    /// base64url, as the browser gave them.
    pub p256dh: String,
    pub auth: String,
    /// Microseconds since the epoch.
    pub created_at: i64,
}

impl std::fmt::Debug for StoredPushSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredPushSubscription")
            .field("approver", &self.approver)
            .field("sees_all", &self.sees_all)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

/// Groups as one text column: a JSON array.
pub fn groups_text(groups: &[String]) -> String {
    serde_json::to_string(groups).expect("strings serialize")
}

pub fn groups_of(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_default()
}

pub const UPSERT: &str = "INSERT INTO push_subscriptions \
     (endpoint, approver, sees_all, groups, p256dh, auth, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) \
     ON CONFLICT (endpoint) DO UPDATE SET approver = excluded.approver, \
     sees_all = excluded.sees_all, groups = excluded.groups, p256dh = excluded.p256dh, \
     auth = excluded.auth, created_at = excluded.created_at";
pub const DELETE_OF_APPROVER: &str =
    "DELETE FROM push_subscriptions WHERE endpoint = $1 AND approver = $2";
pub const DELETE: &str = "DELETE FROM push_subscriptions WHERE endpoint = $1";
pub const SELECT_ALL: &str = "SELECT endpoint, approver, sees_all, groups, p256dh, auth, \
     created_at FROM push_subscriptions ORDER BY created_at, endpoint";

/// The first replica to insert an event's sequence number pushes it.
pub const CLAIM_EVENT: &str =
    "INSERT INTO push_claims (seq, claimed_at) VALUES ($1, $2) ON CONFLICT (seq) DO NOTHING";
pub const PRUNE_CLAIMS: &str = "DELETE FROM push_claims WHERE seq < $1";
/// Claims kept behind the newest: far more than any replica lags.
pub const KEEP_CLAIMS: i64 = 100_000;
/// Every how many events the claims are pruned.
pub const PRUNE_EVERY: i64 = 1_000;

/// The Web Push sender's row in `event_cursors`.
pub const PUSH_CURSOR: &str = "push";
/// The Slack poster's row in `event_cursors`.
pub const SLACK_CURSOR: &str = "slack";
pub const SELECT_CURSOR: &str = "SELECT seq FROM event_cursors WHERE consumer = $1";
/// Moves a consumer's position forward, never back (replicas each record theirs).
pub const ADVANCE_CURSOR: &str = "INSERT INTO event_cursors (consumer, seq, updated_at) \
     VALUES ($1, $2, $3) ON CONFLICT (consumer) DO UPDATE SET seq = excluded.seq, \
     updated_at = excluded.updated_at WHERE event_cursors.seq < excluded.seq";
