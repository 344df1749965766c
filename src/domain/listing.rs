//! Listings: the filters and keyset pages in which calls and grants are read back (ListCalls,
//! ListPending, ListGrants, a session's replay). A page never holds a whole table, and a cursor
//! is a position in the listing, opaque to clients.

use super::policy::{Grant, Scope};
use super::{AgentId, Call, SessionId, Status, Timestamp, ToolName};

/// A filtered, keyset-paged listing of calls.
#[derive(Debug, Clone, Default)]
pub struct CallQuery {
    pub agent: Option<AgentId>,
    pub session: Option<String>,
    pub workspace: Option<String>,
    pub tool: Option<String>,
    /// Any of these; empty means any status.
    pub statuses: Vec<Status>,
    pub created_after: Option<Timestamp>,
    pub created_before: Option<Timestamp>,
    /// Only calls whose Requested event is at or before this sequence number (snapshots).
    pub requested_at_or_before: Option<u64>,
    /// Only calls decided by this.
    pub decided_by: Option<DecidedByFilter>,
    /// Continue after this cursor.
    pub after: Option<Cursor>,
    pub limit: u32,
    /// Newest first (descending row ids; a history view), instead of oldest first.
    pub newest_first: bool,
}

/// Who or what decided the calls a listing wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecidedByFilter {
    /// Exactly this stored `decided_by` (`grant:7`).
    Exact(String),
    /// Any stored `decided_by` starting with this (`grant:`).
    Prefix(String),
}

/// A position in a listing; opaque to clients (clients see it as a page token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor(pub i64);

#[derive(Debug, Default)]
pub struct CallPage {
    pub calls: Vec<Call>,
    /// The cursor after each call, in order: a reply cut short continues after its last call.
    pub cursors: Vec<Cursor>,
    /// Set when more calls may follow.
    pub next: Option<Cursor>,
}

/// A filtered, keyset-paged listing of grants.
#[derive(Debug, Clone, Default)]
pub struct GrantQuery {
    pub agent: Option<AgentId>,
    pub scope: Option<Scope>,
    pub session: Option<SessionId>,
    pub workspace: Option<String>,
    pub tool: Option<ToolName>,
    /// Revoked and expired grants too.
    pub include_inactive: bool,
    /// When "expired" is judged.
    pub now: Option<Timestamp>,
    pub after: Option<Cursor>,
    pub limit: u32,
}

#[derive(Debug, Default)]
pub struct GrantPage {
    pub grants: Vec<Grant>,
    /// The cursor after each grant, in order: a reply cut short continues after its last grant.
    pub cursors: Vec<Cursor>,
    pub next: Option<Cursor>,
}

impl CallQuery {
    /// Whether `call` passes this query's filter fields (agent, session, workspace, tool).
    pub fn matches(&self, call: &Call) -> bool {
        self.agent.as_ref().is_none_or(|a| a == &call.key.agent)
            && self
                .session
                .as_deref()
                .is_none_or(|s| s == call.key.session.as_str())
            && self
                .workspace
                .as_deref()
                .is_none_or(|w| w == call.workspace)
            && self.tool.as_deref().is_none_or(|t| t == call.tool.as_str())
    }
}
