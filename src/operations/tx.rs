//! The transaction primitives every operation is written with, and the rules that keep
//! operations correct when several transactions (or replicas) run at once. Each backend
//! implements [`WriteTx`] and [`PolicyTx`] over one of its transactions; the operations never see
//! SQL, and the backends never decide anything.
//!
//! The rules, stated once here and kept by every operation:
//! - an outcome is written only by a conditional update of a pending call (`resolve`), so the
//!   first decision wins; a transaction that loses reads the winner back. The one exception
//!   cannot race: a call a rule or grant decides as it arrives is inserted decided
//!   (`insert_call` with its outcome), and nobody can decide a call before it is stored;
//! - a call is inserted only if its identity is free (`insert_call`), so a concurrent duplicate
//!   submit is recognised, not doubled;
//! - a submit first locks its session (`lock_submit`), so supersede-by-key and
//!   supersede-pending see every earlier submit of the session;
//! - before it touches any call, a transaction locks the rows of the batches it will resolve
//!   calls in, all at once and in one order (`lock_batches`, fed by [`batches_of`]; or, for
//!   one call's batch alone, `find_call_locking_batch` as it reads the call);
//! - batch completion is decided under the batch's lock (`complete_batch_if_done`), so exactly
//!   one transaction flags the event that completes a batch;
//! - grants and submits of the same (agent, tool) are serialised by `lock_policy` (exclusive for
//!   creating or revoking a grant, shared for submits), taken after the session lock and before
//!   any batch lock: a grant being created sees every call submitted before it (and decides the
//!   pending ones it matches), and every submit after it sees the grant.
//!
//! The full lock order is session, policy (sorted), batches (sorted), calls: two writers can
//! never wait for each other in a cycle.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::domain::escalation::Escalation;
use crate::domain::policy::{
    Approval, Grant, GrantScope, GrantSpec, Requirement, RevokeTarget, Rule, RuleId, RuleMode,
    ShadowVerdict,
};
use crate::domain::{
    AgentId, BatchId, Call, CallId, CallKey, EventKind, NewBatch, NewCall, OnDeny, Outcome,
    SessionId, Timestamp, ToolName,
};
use crate::error::Result;

/// Where [`WriteTx::insert_call`] stores a call: its batch and its position in it.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    pub batch_id: &'a BatchId,
    pub position: usize,
    /// `Some(size)`: the batch is new, planned with `size` calls, and this is the first call a
    /// submit stores in it: the batch's row is stored with it (in the same statement where the
    /// backend can, Postgres: a round trip fewer).
    pub new_batch: Option<usize>,
}

/// What [`PolicyTx::lock_submit`] read with the locks, where it read anything.
#[derive(Debug, Default)]
pub struct SubmitLocks {
    /// How many calls the agent has pending, counted up to the count asked for; `None`: not
    /// counted (ask [`WriteTx::pending_of_agent`] when it matters).
    pub pending: Option<u64>,
    /// Which of the batch's call ids its session holds already; `None`: not read, so any may be.
    pub stored: Option<Vec<String>>,
}

impl SubmitLocks {
    /// Whether the batch's call `id` may be stored already, and so must be read.
    pub fn may_be_stored(&self, id: &CallId) -> bool {
        self.stored
            .as_ref()
            .is_none_or(|stored| stored.iter().any(|s| s == id.as_str()))
    }
}

/// A stored call and its row id in the backend.
pub struct Stored {
    pub rowid: i64,
    pub call: Call,
}

/// A call resolved in the current transaction: its batch, and the id of its Resolved event.
pub struct Resolved {
    pub rowid: i64,
    pub batch_id: String,
    pub event: i64,
    /// The event's sequence number, where the backend numbers events as they are written
    /// (SQLite); `None` where they are numbered after they commit (Postgres). Either way what a
    /// read of the call in this transaction gives as its outcome's `seq`.
    pub seq: Option<u64>,
    /// Whether its write already flagged its event as completing its batch if it did (see
    /// [`WriteTx::resolve_read`]): [`complete_batches`] has nothing left to do for the batch if
    /// this is its last resolution.
    pub batch_checked: bool,
}

/// One open write transaction of a backend (passkeys' primitives included: a step-up vote takes
/// its challenge in the decision's transaction).
#[async_trait]
pub trait WriteTx: Send + super::passkeys::PasskeyTx {
    /// Locks these batches until this transaction ends, in one statement and in sorted order.
    /// Called once, before any call of them is resolved.
    async fn lock_batches(&mut self, batches: &[&str]) -> Result<()>;
    async fn find_call(&mut self, key: &CallKey) -> Result<Option<Stored>>;
    /// [`Self::find_call`], the found call's batch locked in the same statement as
    /// [`Self::lock_batches`] would lock it: for a transaction that locks no policy and no
    /// other batch, in place of that call.
    async fn find_call_locking_batch(&mut self, key: &CallKey) -> Result<Option<Stored>>;
    async fn load_call(&mut self, rowid: i64) -> Result<Call>;
    /// Corrects a batch's size when fewer calls than planned were inserted (0: removes it).
    async fn resize_batch(&mut self, batch_id: &BatchId, size: usize) -> Result<()>;
    /// Stores a call of `batch` with its Requested event, where `at` places it: pending, or
    /// already `decided` (a rule or grant decided it as it arrived;
    /// [`record_outcome`](Self::record_outcome) then writes what follows from that). `None` if
    /// its identity is taken (a concurrent submit stored it first); its new batch, if `at`
    /// brings one, is stored all the same.
    async fn insert_call(
        &mut self,
        batch: &NewBatch,
        at: Placement<'_>,
        call: &NewCall,
        now: Timestamp,
        decided: Option<&Outcome>,
    ) -> Result<Option<i64>>;
    /// Writes `outcome` if the call is still pending, with its Resolved event.
    async fn resolve(&mut self, rowid: i64, outcome: &Outcome) -> Result<Option<Resolved>>;
    /// [`Self::resolve`] for a call already read in this transaction (`call`), whose receipt is
    /// built from it rather than read back: a receipt attests the outcome and what a call
    /// never changes once stored (its identity, tool, input, texts and times), so a read made
    /// before the outcome is written serves (on Postgres too, where another replica may touch
    /// the call's escalation or votes in between). `last_in_batch`: this transaction resolves
    /// no other call of the batch after this one, so the write also flags its event as
    /// completing the batch if no call of it is left pending, as
    /// [`Self::complete_batch_if_done`] would (in the same statement where the backend can).
    async fn resolve_read(
        &mut self,
        rowid: i64,
        call: &Call,
        outcome: &Outcome,
        last_in_batch: bool,
    ) -> Result<Option<Resolved>>;
    /// For a call `insert_call` stored decided: its Resolved event (and receipt), as `resolve`
    /// writes them after its update. `stored` is the call as stored, its outcome included (the
    /// receipt attests it without reading it back).
    async fn record_outcome(&mut self, rowid: i64, stored: &Call) -> Result<Resolved>;
    /// Pending calls of a session, oldest first.
    async fn pending_in_session(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
    ) -> Result<Vec<Stored>>;
    /// How many calls of `agent` are pending, counted no further than `at_most` (so the count
    /// costs at most that many index entries, however many there are).
    async fn pending_of_agent(&mut self, agent: &AgentId, at_most: u64) -> Result<u64>;
    /// Pending calls of a session carrying `key`.
    async fn pending_with_key(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
        key: &str,
    ) -> Result<Vec<i64>>;
    /// Pending calls of a batch, in position order.
    async fn pending_in_batch(&mut self, batch: &BatchId) -> Result<Vec<i64>>;
    /// Every call of a batch of this session, in position order.
    async fn calls_of_batch(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
        batch: &BatchId,
    ) -> Result<Vec<Stored>>;
    async fn on_deny(&mut self, batch: &BatchId) -> Result<OnDeny>;
    /// Pending calls due at `now`, at most `limit`, with their batches.
    async fn due_calls(&mut self, now: Timestamp, limit: i64) -> Result<Vec<(i64, String)>>;
    /// Starts a pending call's escalation: stores its ladder and when its first step is due.
    async fn start_escalation(&mut self, rowid: i64, escalation: &Escalation) -> Result<()>;
    /// Pending calls with an escalation step due at `now`, at most `limit`, earliest first.
    async fn due_steps(&mut self, now: Timestamp, limit: i64) -> Result<Vec<Stored>>;
    /// Fires step `step` of a call's ladder if the call is still pending with that step next
    /// (conditional, so it fires once whoever else tries): records the next step as due at
    /// `next_at` and appends the step's event of `kind` at `now`. Whether it fired.
    async fn fire_step(
        &mut self,
        rowid: i64,
        step: u32,
        kind: EventKind,
        next_at: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<bool>;
    /// Records the requirement fixed on a just-inserted call (see `operations::routing`).
    async fn route_call(&mut self, rowid: i64, requirement: &Requirement) -> Result<()>;
    /// Under the call's batch lock: stores `approval`'s votes on a pending call, with an
    /// ApprovalRecorded event if `announce` (not for the vote that decides it: its Resolved
    /// event says so). `false` if the call was no longer pending (nothing written).
    async fn record_votes(
        &mut self,
        rowid: i64,
        approval: &Approval,
        now: Timestamp,
        announce: bool,
    ) -> Result<bool>;
    /// Under the batch's lock: if no call of it is pending, flags `event` as completing it.
    async fn complete_batch_if_done(&mut self, batch_id: &str, event: i64) -> Result<()>;
    /// How many writing statements this transaction has issued so far, if the backend counts
    /// them. Without a count, every failed write of a group is taken to have changed something.
    fn statements_written(&self) -> Option<u64> {
        None
    }
    /// Called before each write of a group that shares this transaction: what the transaction
    /// remembers for one write only (the policy version it read) is forgotten. `alone`: the
    /// group is this one write, so no later write of the transaction can overlap with work
    /// handed to another thread. Nothing by default.
    fn next_write(&mut self, _alone: bool) {}
    /// Commits the transaction: only then may its changes be acknowledged.
    async fn commit(self) -> Result<()>;
}

/// The grant and rule primitives of a transaction. The reads also serve read-only transactions
/// (Explain), so what Explain reads is what a submit reads.
#[async_trait]
pub trait PolicyTx: Send {
    /// `batch`'s locks, taken before it reads anything: its session's (serialising the
    /// session's writers), then those of (agent, tool) for each of `tools`, shared, as
    /// [`Self::lock_policy`] takes them. A no-op where writers are serialised anyway; one
    /// statement where they are not, which may also read, after the locks, which of the batch's
    /// calls are stored already, and count the agent's pending calls as
    /// [`WriteTx::pending_of_agent`] does, up to `count_pending_to` (see [`SubmitLocks`]).
    async fn lock_submit(
        &mut self,
        batch: &NewBatch,
        tools: &[&ToolName],
        count_pending_to: Option<u64>,
    ) -> Result<SubmitLocks>;
    /// Locks (agent, tool) for grant changes until this transaction ends: `exclusive` to create
    /// or revoke grants, shared to submit calls. All keys in one statement, in one order; a
    /// no-op where writers are serialised anyway.
    async fn lock_policy(
        &mut self,
        agent: &AgentId,
        tools: &[&ToolName],
        exclusive: bool,
    ) -> Result<()>;
    /// Every rule.
    async fn rules(&mut self) -> Result<Vec<Rule>>;
    /// The unrevoked grants of `agent` for `tools` not expired at `now`; only `session`'s among
    /// session grants when it is given.
    async fn live_grants(
        &mut self,
        agent: &AgentId,
        session: Option<&SessionId>,
        tools: &[&ToolName],
        now: Timestamp,
    ) -> Result<Vec<Grant>>;
    async fn insert_grant(&mut self, spec: &GrantSpec) -> Result<Grant>;
    /// The latest grant created by deciding this call, if any.
    async fn grant_from_call(&mut self, key: &CallKey) -> Result<Option<Grant>>;
    /// The grants `target` names: for an id that grant whatever its state; otherwise the
    /// unrevoked grants of that scope not expired at `now`.
    async fn grants_named(&mut self, target: &RevokeTarget, now: Timestamp) -> Result<Vec<Grant>>;
    /// Marks these grants revoked, unless they already are; returns those it marked.
    async fn revoke(&mut self, ids: &[i64], by: &str, now: Timestamp) -> Result<Vec<Grant>>;
    /// Pending calls of `agent` calling `tool` in the scope of a grant, oldest first.
    /// The pending calls of `agent` in `scope` a new grant may cover: of `tool`, or, for a grant
    /// of an action kind (`None`), every host call (whatever its tool).
    async fn pending_in_scope(
        &mut self,
        agent: &AgentId,
        tool: Option<&ToolName>,
        scope: &GrantScope,
    ) -> Result<Vec<Stored>>;
    async fn find_rule(&mut self, id: &RuleId) -> Result<Option<Rule>>;
    /// Stores `rule`; `false` if its id is taken (nothing written).
    async fn insert_rule(&mut self, rule: &Rule) -> Result<bool>;
    /// Removes a rule; `false` if there was none.
    async fn delete_rule(&mut self, id: &RuleId) -> Result<bool>;
    /// Sets a rule's mode; `false` if there is no such rule.
    async fn set_rule_mode(&mut self, id: &RuleId, mode: RuleMode) -> Result<bool>;
    /// Records, with call row `rowid`, what shadow rules would have done with it.
    async fn record_shadow_verdicts(
        &mut self,
        rowid: i64,
        verdicts: &[ShadowVerdict],
    ) -> Result<()>;
    /// Removes every rule loaded from a policy file; until this transaction ends, no other may
    /// change rules (so concurrent loads of policy files do not interleave).
    async fn delete_file_rules(&mut self) -> Result<()>;
}

/// Where write transactions come from: a backend (Postgres) or its one write connection (SQLite).
#[async_trait]
pub trait Transactions: Sync {
    type Tx: WriteTx + PolicyTx;
    async fn begin_write(&self) -> Result<Self::Tx>;
    /// Runs on the group-commit writer after each group and each piece of work alone (whether
    /// or not they committed), once their callers were answered: a backend may hand over what
    /// was committed. Nothing by default.
    fn after_commit(&self) {}
}

/// The distinct batches of `calls`, sorted: the order every transaction locks batches in.
pub(super) fn batches_of<'a>(calls: impl Iterator<Item = &'a Call>) -> Vec<&'a str> {
    let mut batches: Vec<&str> = calls.map(|c| c.batch_id.as_str()).collect();
    batches.sort_unstable();
    batches.dedup();
    batches
}

/// For each batch touched, flags this transaction's last event in it if the batch is now
/// complete. Batches are visited in id order, so concurrent transactions lock them in the same
/// order.
pub(super) async fn complete_batches(tx: &mut impl WriteTx, resolved: &[Resolved]) -> Result<()> {
    let mut last_by_batch: BTreeMap<&str, &Resolved> = BTreeMap::new();
    for r in resolved {
        let last = last_by_batch.entry(&r.batch_id).or_insert(r);
        if r.event > last.event {
            *last = r;
        }
    }
    for (batch_id, last) in last_by_batch {
        if !last.batch_checked {
            tx.complete_batch_if_done(batch_id, last.event).await?;
        }
    }
    Ok(())
}

/// The key under which calls from agent hosts are locked beside their tools (see
/// [`PolicyTx::lock_policy`]): a grant of an action kind may cover a host call of any tool, so
/// creating or revoking one takes this key exclusively, and a submit holding a host call takes
/// it shared. No tool has this name: tool names hold no control characters.
pub(super) fn host_calls() -> &'static ToolName {
    static KEY: std::sync::LazyLock<ToolName> =
        std::sync::LazyLock::new(|| ToolName::from_stored("\u{1}host calls".to_owned()));
    &KEY
}

/// The distinct tools of some calls, sorted.
pub(super) fn tools_of<'a>(tools: impl Iterator<Item = &'a ToolName>) -> Vec<&'a ToolName> {
    let mut tools: Vec<&ToolName> = tools.collect();
    tools.sort_unstable();
    tools.dedup();
    tools
}
