//! Transactions: the ports every operation is written over, the rules that keep operations
//! correct when several transactions (or replicas) run at once, and how the API's writes run in
//! them (the [`Writes`] port the broker writes through, and the group commit behind it).
//! [`WriteTx`] and [`PolicyTx`] are implemented once over any backend's transaction
//! (`store::primitives`), and each backend implements [`Transactions`] to begin one; the
//! operations never see SQL, and the backends never decide anything. Nothing here names a backend: the group commit is generic over [`Transactions`], so
//! SQLite's writer thread and a Postgres replica's writer task are one piece of code.
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
//!
//! ## How the API's writes run
//!
//! The three writes the API makes (submit, decide, cancel) go through one port, [`Writes`]. Each
//! is one transaction in which its operation runs, acknowledged only after it commits. SQLite's
//! writes all take the group commit below; Postgres's take it under `--postgres-group-commit`,
//! else each runs in a transaction of its own (`store::PostgresStore`'s [`Writes`]).
//!
//! Group commit: the writes queued while a commit is on its way to disk share the next
//! transaction, and so one commit.
//!
//! One writer owns the write path: SQLite's writer thread ([`GroupCommit::start`]), or one task
//! per Postgres replica ([`GroupCommit::spawn`]). It takes every write waiting in its queue (up to
//! [`MAX_GROUP`]), runs them in one transaction, commits, and only then answers each caller. A
//! write that fails fails alone, and none of its changes are kept (see [`write_group`]); a
//! commit that fails fails every write of the group, and none of them was acknowledged. Writes
//! run in queue order, one after the other, exactly as if each had its own transaction: a later
//! write of the group sees the earlier ones.
//!
//! No write waits for company: the first write of an idle broker is committed at once, and a
//! group forms only from the writes that arrived while the previous commit was in flight. Under
//! load that turns one commit per write into one per group, which is what lets a single SQLite
//! file serve many agents, and what saves Postgres a transaction per write.
//!
//! SQLite's writer is a thread of its own, not a task: its backend runs statements synchronously
//! (SQLite in-process), so a group runs start to commit without yielding, and the runtime's
//! workers never wait on a disk. Work that needs a transaction of its own (expiry, rule and grant
//! changes, Explain) is queued to the same thread with [`GroupCommit::alone`], so there is one
//! write connection and writes never contend for SQLite's lock. Postgres's writer is a task (its
//! statements are network round trips), and the rest of its writes keep their own transactions.
//!
//! Where writers run concurrently (Postgres replicas), a group takes the locks of its writes in
//! queue order, not in the one order above, so two groups can deadlock; the
//! database aborts one, and that group is run again, whole, up to [`CONFLICT_ATTEMPTS`] times
//! (see [`Error::is_transaction_conflict`]). Nothing of an attempt that rolled back is answered.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use super::{cancel, decide, submit};
use crate::domain::escalation::Escalation;
use crate::domain::policy::{
    Approval, Grant, GrantScope, GrantSpec, Requirement, RevokeTarget, Rule, RuleId, RuleMode,
    ShadowVerdict,
};
use crate::domain::{
    AgentId, BatchId, Call, CallId, CallKey, CancelReport, CancelTarget, DecideReport, Decision,
    EventKind, NewBatch, NewCall, OnDeny, Outcome, SessionId, SubmitReport, Timestamp, ToolName,
    ToolResultTexts,
};
use crate::error::{Error, Result};
use crate::observe::meters;

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

// How the API's writes run: the port the broker holds, and the group commit behind it.

/// The writes of the API, each one transaction acknowledged only after it commits: what the
/// broker writes through (`Calls::writes` gives it). On SQLite (and Postgres under
/// `--postgres-group-commit`) the [`GroupCommit`] below; on Postgres otherwise `PostgresStore`.
#[async_trait]
pub trait Writes: Send + Sync {
    /// Stores a batch's new calls, recognising duplicates and refusing conflicting reuse of a
    /// call id, and supersedes what the batch supersedes (`operations::submit`).
    async fn submit(&self, batch: NewBatch) -> Result<SubmitReport>;

    /// Writes an approver's decision if the call is pending (first decision wins), and skips the
    /// rest of its batch on a denial when the batch says so. A decision to remember creates its
    /// grant and decides the pending calls the grant matches (`operations::decide`).
    async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport>;

    /// What [`decide`](Writes::decide) would report now, written in a transaction that is rolled
    /// back: nothing is kept (`operations::decide::preview`).
    async fn preview_decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport>;

    /// Cancels what `target` names; reports calls already decided as they stand
    /// (`operations::cancel`).
    async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport>;
}

/// The most writes one transaction takes. Bounds how long the first of them waits for the last.
pub const MAX_GROUP: usize = 256;

/// How many times a group is run when the database keeps aborting it for a deadlock or a
/// serialization failure; after that its writes fail (none was acknowledged).
pub const CONFLICT_ATTEMPTS: usize = 5;

/// How many writes may wait for the writer before callers wait to enqueue (backpressure).
const QUEUE: usize = 4 * MAX_GROUP;

/// The handle callers write through: `M` is what the writer takes from its queue ([`Queued`] on
/// SQLite's thread, a bare [`Job`] on Postgres's task). Cheap to share; the writer ends when the
/// last handle is dropped, after finishing what was queued.
pub struct GroupCommit<M> {
    queue: mpsc::Sender<M>,
    /// The texts tool results carry, for a preview run beside the groups.
    texts: ToolResultTexts,
}

/// What SQLite's writer thread takes from its queue.
pub enum Queued<W> {
    /// A write that joins the current group.
    Write(Job),
    /// Work that runs its own transactions (given the writer), between groups.
    Alone(Work<W>),
}

impl<W> From<Job> for Queued<W> {
    fn from(job: Job) -> Self {
        Queued::Write(job)
    }
}

/// Work given the writer; it answers its caller itself.
type Work<W> = Box<dyn FnOnce(W) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// One queued write: its request, its result once it ran, and where to send that result once
/// the group committed.
pub enum Job {
    /// Boxed, as a decision: a batch and a decision (with their reports) are several times
    /// larger than a cancel, and a queued write should not cost the largest one's size.
    Submit(Box<Errand<NewBatch, SubmitReport>>),
    Decide(Box<Errand<(CallKey, Decision), DecideReport>>),
    Cancel(Errand<CancelTarget, CancelReport>),
}

pub struct Errand<Q, A> {
    request: Q,
    result: Option<Result<A>>,
    reply: oneshot::Sender<Result<A>>,
}

impl<Q, A> Errand<Q, A> {
    fn new(request: Q) -> (Self, oneshot::Receiver<Result<A>>) {
        let (reply, answer) = oneshot::channel();
        let slot = Self {
            request,
            result: None,
            reply,
        };
        (slot, answer)
    }

    fn succeeded(&self) -> bool {
        matches!(self.result, Some(Ok(_)))
    }

    /// Sends the result if the group committed, or the commit's failure if it did not (or this
    /// write never ran). A caller that went away is not an error: what it wrote stands, and a
    /// retry is answered idempotently.
    fn answer(self, committed: std::result::Result<(), &Error>) {
        let result = match (committed, self.result) {
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(Error::Internal("a write of the group did not run".into())),
            (Err(cause), _) => Err(Error::not_committed(cause)),
        };
        let _ = self.reply.send(result);
    }
}

impl<W> GroupCommit<Queued<W>>
where
    W: Transactions + Clone + Send + 'static,
{
    /// Starts the writer thread over `writer`, whose transactions must not need an async
    /// runtime (the thread has none).
    pub fn start(writer: W, texts: ToolResultTexts) -> Result<Self> {
        let (queue, jobs) = mpsc::channel(QUEUE);
        let written = texts.clone();
        thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || run_here(write_groups(writer, written, jobs)))
            .map_err(|e| Error::Internal(format!("cannot start the store's writer thread: {e}")))?;
        Ok(Self { queue, texts })
    }

    /// Runs `work` on the writer thread, between groups, and returns its result. It opens (and
    /// commits) its own transactions from the writer it is given.
    pub async fn alone<T, F, Fut>(&self, work: F) -> Result<T>
    where
        F: FnOnce(W) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let work = move |writer: W| -> Pin<Box<dyn Future<Output = ()>>> {
            Box::pin(async move {
                let _ = reply.send(work(writer).await);
            })
        };
        self.queue
            .send(Queued::Alone(Box::new(work)))
            .await
            .map_err(writer_gone)?;
        answer.await.map_err(writer_gone)?
    }
}

/// SQLite's writes: every one joins a group on the writer thread; a preview runs there too,
/// between groups, in a transaction that is rolled back.
#[async_trait]
impl<W> Writes for GroupCommit<Queued<W>>
where
    W: Transactions + Clone + Send + 'static,
{
    async fn submit(&self, batch: NewBatch) -> Result<SubmitReport> {
        self.submit_queued(batch).await
    }

    async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        self.decide_queued(key, decision).await
    }

    async fn preview_decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        let (key, decision, texts) = (key.clone(), decision.clone(), self.texts.clone());
        self.alone(move |writer| async move {
            decide::preview(writer.begin_write().await?, &key, &decision, &texts).await
        })
        .await
    }

    async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport> {
        self.cancel_queued(target).await
    }
}

impl GroupCommit<Job> {
    /// Starts the writer as a task on the current runtime, over `writer`.
    pub fn spawn<W>(writer: W, texts: ToolResultTexts) -> Self
    where
        W: Transactions + Send + 'static,
        W::Tx: 'static,
    {
        let (queue, mut jobs) = mpsc::channel::<Job>(QUEUE);
        let written = texts.clone();
        tokio::spawn(async move {
            let mut group = Vec::with_capacity(MAX_GROUP);
            while jobs.recv_many(&mut group, MAX_GROUP).await > 0 {
                write_group(&writer, &written, group.drain(..)).await;
                writer.after_commit();
            }
        });
        Self { queue, texts }
    }
}

impl<M: From<Job> + Send> GroupCommit<M> {
    /// Queues a submit on the group commit; its report once its group committed.
    pub async fn submit_queued(&self, batch: NewBatch) -> Result<SubmitReport> {
        let (slot, answer) = Errand::new(batch);
        self.enqueue(Job::Submit(Box::new(slot))).await?;
        answer.await.map_err(writer_gone)?
    }

    /// Queues a decision on the group commit; its report once its group committed.
    pub async fn decide_queued(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        let (slot, answer) = Errand::new((key.clone(), decision.clone()));
        self.enqueue(Job::Decide(Box::new(slot))).await?;
        answer.await.map_err(writer_gone)?
    }

    /// Queues a cancel on the group commit; its report once its group committed.
    pub async fn cancel_queued(&self, target: &CancelTarget) -> Result<CancelReport> {
        let (slot, answer) = Errand::new(target.clone());
        self.enqueue(Job::Cancel(slot)).await?;
        answer.await.map_err(writer_gone)?
    }

    async fn enqueue(&self, job: Job) -> Result<()> {
        self.queue.send(job.into()).await.map_err(writer_gone)
    }
}

fn writer_gone<E>(_: E) -> Error {
    Error::Internal("the store's writer has stopped".into())
}

/// Polls `future` to completion on this thread, parking it while the future waits (here: for
/// the queue). The writer's only executor.
fn run_here<F: Future>(future: F) -> F::Output {
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        thread::park();
    }
}

async fn write_groups<W: Transactions + Clone>(
    writer: W,
    texts: ToolResultTexts,
    mut queue: mpsc::Receiver<Queued<W>>,
) {
    let mut taken = Vec::with_capacity(MAX_GROUP);
    let mut group = Vec::with_capacity(MAX_GROUP);
    while queue.recv_many(&mut taken, MAX_GROUP).await > 0 {
        for queued in taken.drain(..) {
            match queued {
                Queued::Write(job) => group.push(job),
                Queued::Alone(work) => {
                    // In queue order: the writes taken before it commit first.
                    if !group.is_empty() {
                        write_group(&writer, &texts, group.drain(..)).await;
                        writer.after_commit();
                    }
                    work(writer.clone()).await;
                    writer.after_commit();
                }
            }
        }
        if !group.is_empty() {
            write_group(&writer, &texts, group.drain(..)).await;
            writer.after_commit();
        }
    }
}

/// Runs `group` in one transaction and answers every caller. Returns whether it committed.
///
/// A write that fails before it changed anything (the usual client mistake: an unknown call)
/// simply fails. One that fails after changing something (a storage error half-way), or whose
/// statement failed (which aborts a Postgres transaction), leaves the transaction unusable, so it
/// is dropped (rolled back) and the group starts over without that write. No savepoints: they
/// would cost two statements on every write to save work only on a path that almost never runs.
///
/// A deadlock or serialization failure (the database aborted the transaction to break a cycle
/// of waits) is no write's fault: the whole group runs again, at most [`CONFLICT_ATTEMPTS`]
/// times, each write from scratch.
async fn write_group<W: Transactions>(
    writer: &W,
    texts: &ToolResultTexts,
    group: impl Iterator<Item = Job>,
) -> bool {
    let mut jobs: Vec<Job> = group.collect();
    let mut failed: Vec<Job> = Vec::new();
    let mut conflicts = 0;
    let started = Instant::now();
    let committed = loop {
        let attempt = async {
            let mut tx = writer.begin_write().await?;
            let alone = jobs.len() == 1;
            for (i, job) in jobs.iter_mut().enumerate() {
                let before = tx.statements_written();
                tx.next_write(alone);
                if !job.run(&mut tx, texts).await {
                    if job.conflicted() {
                        return Ok(Attempt::Conflict);
                    }
                    let wrote = match (before, tx.statements_written()) {
                        (Some(before), Some(after)) => after > before,
                        _ => true,
                    };
                    if wrote {
                        return Ok(Attempt::Without(i));
                    }
                }
            }
            tx.commit().await.map(|()| Attempt::Committed)
        }
        .await;
        match attempt {
            Ok(Attempt::Committed) => break Ok(()),
            Ok(Attempt::Without(i)) => {
                tracing::warn!("a write failed half-way; its group starts over without it");
                failed.push(jobs.remove(i));
            }
            Ok(Attempt::Conflict) if conflicts + 1 < CONFLICT_ATTEMPTS => {
                conflicts += 1;
                tracing::info!(
                    conflicts,
                    "a group was aborted by a deadlock or conflict; retrying it"
                );
            }
            Ok(Attempt::Conflict) => {
                break Err(Error::Unavailable(
                    "the write kept conflicting with concurrent writes; retry".into(),
                ));
            }
            Err(e) if e.is_transaction_conflict() && conflicts + 1 < CONFLICT_ATTEMPTS => {
                conflicts += 1;
                tracing::info!(conflicts, error = %e, "a group's commit conflicted; retrying it");
            }
            Err(e) => break Err(e),
        }
    };
    match &committed {
        Ok(()) => meters::committed(jobs.len(), started.elapsed()),
        Err(e) => {
            tracing::error!(error = %e, writes = jobs.len(), "a group of writes failed to commit");
        }
    }
    for job in jobs {
        job.answer(committed.as_ref().copied());
    }
    // Their own errors, whatever became of the group.
    for job in failed {
        job.answer(Ok(()));
    }
    committed.is_ok()
}

/// How one run of a group ended.
enum Attempt {
    Committed,
    /// The write at this index failed and left the transaction unusable.
    Without(usize),
    /// The database aborted the transaction to break a deadlock (or a serialization conflict).
    Conflict,
}

impl Job {
    /// Runs the write in `tx`, keeping its result; returns whether it succeeded.
    async fn run(&mut self, tx: &mut (impl WriteTx + PolicyTx), texts: &ToolResultTexts) -> bool {
        let now = Timestamp::now();
        match self {
            Job::Submit(slot) => {
                slot.result = Some(submit::submit_in(tx, &slot.request, texts, now).await);
                slot.succeeded()
            }
            Job::Decide(slot) => {
                let (key, decision) = &slot.request;
                slot.result = Some(decide::decide_in(tx, key, decision, texts, now).await);
                slot.succeeded()
            }
            Job::Cancel(slot) => {
                slot.result = Some(cancel::cancel_in(tx, &slot.request, texts, now).await);
                slot.succeeded()
            }
        }
    }

    /// Whether the write failed because the database aborted its transaction for a deadlock or
    /// a serialization conflict.
    fn conflicted(&self) -> bool {
        let result = match self {
            Job::Submit(slot) => slot.result.as_ref().map(|r| r.as_ref().err()),
            Job::Decide(slot) => slot.result.as_ref().map(|r| r.as_ref().err()),
            Job::Cancel(slot) => slot.result.as_ref().map(|r| r.as_ref().err()),
        };
        result.flatten().is_some_and(Error::is_transaction_conflict)
    }

    fn answer(self, committed: std::result::Result<(), &Error>) {
        match self {
            Job::Submit(slot) => (*slot).answer(committed),
            Job::Decide(slot) => (*slot).answer(committed),
            Job::Cancel(slot) => slot.answer(committed),
        }
    }
}
