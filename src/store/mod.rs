//! Storage behind one trait. Every state change (a call accepted, a call resolved) is written in
//! the same transaction as its event, and nothing is acknowledged before that transaction commits.
//! The trait speaks the domain's language. The SQL both backends run is written once
//! (`statements`), and so are the transaction primitives (`primitives`) and the reads (`reads`);
//! each backend adds only what it does differently.

mod explain;
pub mod health;
mod listing;
mod postgres;
mod primitives;
mod reads;
mod rows;
mod sqlite;
pub mod statements;
mod writes;

use async_trait::async_trait;

use crate::domain::policy::{Grant, Rule, RuleId, Scope};
use crate::domain::{
    AgentId, BatchId, Call, CallId, CallKey, Decision, Event, NewBatch, SessionId, Status,
    Timestamp, ToolInput, ToolName, ToolResultTexts,
};
use crate::error::{Error, Result};

pub use postgres::PostgresStore;
pub use sqlite::{ProcessLock, SqliteStore, Synchronous};

/// The broker's durable state.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Stores a batch's new calls, recognising duplicates and refusing conflicting reuse of a
    /// call id, and supersedes what the batch supersedes. One transaction.
    async fn submit(&self, batch: NewBatch) -> Result<SubmitReport>;

    /// Writes an approver's decision if the call is pending (first decision wins), and skips the
    /// rest of its batch on a denial when the batch says so. A decision to remember creates its
    /// grant and decides the pending calls the grant matches. One transaction.
    async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport>;

    /// Cancels what `target` names; reports calls already decided as they stand.
    async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport>;

    /// Expires every pending call whose deadline is at or before `now`; returns them decided.
    async fn expire_due(&self, now: Timestamp) -> Result<Vec<Call>>;

    /// How many calls are pending, in the whole store.
    async fn pending_count(&self) -> Result<u64>;

    /// The earliest deadline of a pending call, if any.
    async fn next_deadline(&self) -> Result<Option<Timestamp>>;

    /// The named calls of a session, in the order asked; `None` for unknown ids.
    async fn calls_by_id(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
    ) -> Result<Vec<Option<Call>>>;

    /// The calls of a batch in position order.
    async fn batch_calls(&self, batch: &BatchId) -> Result<Vec<Call>>;

    /// A page of calls matching `query`, oldest first, with the cursor to continue after.
    async fn list_calls(&self, query: &CallQuery) -> Result<CallPage>;

    /// Up to `limit` events after `after`, in sequence order.
    async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>>;

    /// The last sequence number in the log (0 when it is empty), covering every commit so far.
    async fn latest_seq(&self) -> Result<u64>;

    /// Numbers the committed events that have no sequence number yet, in commit order, and
    /// returns how many it numbered. Backends that number events as they commit (SQLite, whose
    /// writers are serialised) have nothing to do.
    async fn sequence_events(&self) -> Result<u64> {
        Ok(0)
    }

    /// Woken when another broker process committed events to the same database, if the backend
    /// can tell. A hint only: readers also poll.
    fn remote_commits(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }

    /// The events committed from now on, as they commit, from a backend that writes every event
    /// itself (SQLite's one writer reads them back on its own connection right after each
    /// commit), so the event pump need not read the log for them. Taken once; `None` where only
    /// reading the log can tell (Postgres).
    fn take_committed_events(&self) -> Option<CommittedEvents> {
        None
    }

    /// Revokes what `target` names, recording `by`. One transaction.
    async fn revoke_grants(&self, target: &RevokeTarget, by: &str) -> Result<RevokeReport>;

    /// A page of grants matching `query`, oldest first.
    async fn list_grants(&self, query: &GrantQuery) -> Result<GrantPage>;

    /// Adds a rule; the same rule again is returned as stored, another with its id is refused.
    async fn create_rule(&self, rule: &Rule) -> Result<Rule>;

    /// Removes a rule and returns it.
    async fn delete_rule(&self, id: &RuleId) -> Result<Rule>;

    /// Every rule.
    async fn list_rules(&self) -> Result<Vec<Rule>>;

    /// Replaces the rules an earlier policy file loaded with `rules` (by id, replacing rules made
    /// through CreateRule with the same id). One transaction.
    async fn load_file_rules(&self, rules: &[Rule]) -> Result<()>;

    /// What would decide `target` if it were submitted now, read as a submit reads it.
    async fn explain(&self, target: &ExplainTarget) -> Result<Explanation>;

    /// A small write transaction that reaches the disk as every commit does, and changes
    /// nothing the broker reads: whether writes work (see `health`).
    async fn probe(&self) -> Result<()>;
}

/// Committed events, handed over by the writer (see [`Store::take_committed_events`]). Best
/// effort: events that could not be handed over (the queue was full, or reading them failed) are
/// signalled on `missed`, and the pump reads them from the log.
pub struct CommittedEvents {
    /// The events of each group of commits, in sequence order.
    pub events: tokio::sync::mpsc::Receiver<Vec<Event>>,
    pub missed: std::sync::Arc<tokio::sync::Notify>,
}

/// What a submit did, call by call.
#[derive(Debug, Default)]
pub struct SubmitReport {
    /// The batch the new calls were stored under; `None` if nothing was new.
    pub batch_id: Option<BatchId>,
    /// One per call of the `NewBatch`, in its order.
    pub items: Vec<SubmitItem>,
    /// Pending calls this submit superseded; those it carries itself (superseded by a later
    /// call of it with the same key) are in `items` too, with their outcome.
    pub superseded: Vec<Call>,
}

#[derive(Debug)]
pub struct SubmitItem {
    pub index: u32,
    pub call_id: CallId,
    pub result: SubmitResult,
}

#[derive(Debug)]
pub enum SubmitResult {
    /// Stored now.
    Accepted(Call),
    /// The same call was already stored; nothing was written.
    Duplicate(Call),
    /// Refused for this call alone (ALREADY_EXISTS; INVALID_ARGUMENT for a new call whose
    /// deadline has passed).
    Refused(Error),
}

/// What a decide did.
#[derive(Debug)]
pub struct DecideReport {
    /// The call with the outcome that stands.
    pub call: Call,
    /// The call was already decided this way; nothing was written.
    pub replayed: bool,
    /// Calls this decision skipped: of the same batch on a denial, and of the batches the new
    /// grant's denials touched.
    pub skipped: Vec<Call>,
    /// The grant the decision created; on a replayed decision, the one the first one created.
    pub grant: Option<Grant>,
    /// Pending calls the new grant decided at once.
    pub decided_by_grant: Vec<Call>,
}

/// Which grants to revoke.
#[derive(Debug, Clone)]
pub enum RevokeTarget {
    /// This one.
    Id(i64),
    /// Every active session grant of this session.
    Session(AgentId, SessionId),
    /// Every active workspace grant of this workspace.
    Workspace(AgentId, String),
}

#[derive(Debug, Default)]
pub struct RevokeReport {
    /// How many this revocation revoked.
    pub revoked: usize,
    /// The grants revoked (for an id: the grant as it stands, revoked now or before).
    pub grants: Vec<Grant>,
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

/// The call Explain is about.
#[derive(Debug, Clone)]
pub enum ExplainTarget {
    Stored(CallKey),
    Inline {
        agent: AgentId,
        session: SessionId,
        workspace: String,
        tool: ToolName,
        input: ToolInput,
    },
}

/// What Explain found.
#[derive(Debug, Clone)]
pub struct Explanation {
    /// `None`: a human decides.
    pub effect: Option<crate::domain::policy::Effect>,
    /// Who the outcome would name as its decider, when a rule or grant decides.
    pub decided_by: Option<crate::domain::DecidedBy>,
    /// The rule that decides, or the ask rule that requires a human.
    pub rule: Option<Rule>,
    /// The grant that decides.
    pub grant: Option<Grant>,
    pub reason: String,
    /// For a stored call: the call as it stands.
    pub call: Option<Call>,
}

/// What a cancel names.
#[derive(Debug, Clone)]
pub struct CancelTarget {
    pub agent: AgentId,
    pub session: SessionId,
    pub scope: CancelScope,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub enum CancelScope {
    Calls(Vec<CallId>),
    Batch(BatchId),
    Session,
}

#[derive(Debug, Default)]
pub struct CancelReport {
    pub cancelled: Vec<Call>,
    pub already_decided: Vec<Call>,
    pub unknown: Vec<CallId>,
}

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
}

/// Who or what decided the calls a listing wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecidedByFilter {
    /// Exactly this stored `decided_by` (`grant:7`).
    Exact(String),
    /// Any stored `decided_by` starting with this (`grant:`).
    Prefix(String),
}

/// A position in a listing; opaque to clients (see `grpc::paging`).
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

/// How to open the store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// `postgres://...` selects Postgres; `sqlite://...`, `sqlite:...` or a path selects SQLite.
    pub database_url: String,
    /// SQLite only.
    pub synchronous: Synchronous,
    /// Postgres only: the connection pool's size.
    pub max_connections: u32,
    pub texts: ToolResultTexts,
}

/// Whether `database_url` names a Postgres database.
pub fn is_postgres(database_url: &str) -> bool {
    database_url.starts_with("postgres://") || database_url.starts_with("postgresql://")
}

/// Makes this process the only broker on the database the options name, for as long as the
/// returned lock is held: a SQLite file serves one broker process (a second one is refused with
/// an error saying so); any number of replicas share Postgres, so there is nothing to hold.
pub fn claim(options: &StoreOptions) -> Result<Option<ProcessLock>> {
    if is_postgres(&options.database_url) {
        return Ok(None);
    }
    ProcessLock::claim(&options.database_url).map(Some)
}

/// Opens the store the options name and applies its migrations.
pub async fn open(options: &StoreOptions) -> Result<std::sync::Arc<dyn Store>> {
    let texts = options.texts.clone();
    if is_postgres(&options.database_url) {
        let store =
            PostgresStore::open(&options.database_url, options.max_connections, texts).await?;
        Ok(std::sync::Arc::new(store))
    } else {
        let store = SqliteStore::open(&options.database_url, options.synchronous, texts).await?;
        Ok(std::sync::Arc::new(store))
    }
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
