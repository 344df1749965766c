//! The broker's state changes (submit, decide, cancel, expire), written once for every backend.
//!
//! Each runs inside one write transaction of a backend, through the primitives of [`WriteTx`].
//! The rules that keep them correct when several transactions (or replicas) run at once:
//! - an outcome is written only by a conditional update of a pending call (`resolve`), so the
//!   first decision wins; a transaction that loses reads the winner back;
//! - a call is inserted only if its identity is free (`insert_call`), so a concurrent duplicate
//!   submit is recognised, not doubled;
//! - a submit first locks its session (`lock_session`), so supersede-by-key and
//!   supersede-pending see every earlier submit of the session;
//! - before it touches any call, a transaction locks the rows of the batches it will resolve
//!   calls in, all at once and in one order (`lock_batches`): every writer takes its locks in
//!   the order session, batches, calls, so two writers can never wait for each other in a cycle;
//! - batch completion is decided under the batch's lock (`complete_batch_if_done`), so exactly
//!   one transaction flags the event that completes a batch;
//! - grants and submits of the same (agent, tool) are serialised by `lock_policy` (exclusive for
//!   creating or revoking a grant, shared for submits), taken after the session lock and before
//!   any batch lock: a grant being created sees every call submitted before it (and decides the
//!   pending ones it matches), and every submit after it sees the grant. The full lock order is
//!   session, policy (sorted), batches (sorted), calls.
//!
//! Rules and grants are read inside the submit's transaction and judged by the one pure
//! function, [`evaluate`], that Explain calls too. The costly part, matching their conditions
//! against large inputs, was done before the submit was queued (see [`Prejudged`]): the
//! transaction looks the results up, so it does not hold the writer while globs run.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use async_trait::async_trait;

use super::{
    CancelReport, CancelScope, CancelTarget, DecideReport, RevokeReport, RevokeTarget, SubmitItem,
    SubmitReport, SubmitResult,
};
use crate::domain::policy::{
    Effect, Grant, GrantScope, GrantSpec, Prejudged, Remember, Rule, RuleId, RuleSource, Scope,
    Subject, evaluate,
};
use crate::domain::{
    AgentId, BatchId, Call, CallId, CallKey, DecidedBy, Decision, NewBatch, NewCall, OnDeny,
    Outcome, OutcomeKind, SessionId, Timestamp, ToolName, ToolResultTexts, Verdict,
};
use crate::error::{Error, Result};
use crate::meters;

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
}

/// One open write transaction of a backend.
#[async_trait]
pub trait WriteTx: Send {
    /// Serialises writers of one session until this transaction ends (a no-op where all writers
    /// are serialised anyway).
    async fn lock_session(&mut self, agent: &AgentId, session: &SessionId) -> Result<()>;
    /// Locks these batches until this transaction ends, in one statement and in sorted order.
    /// Called once, before any call of them is resolved.
    async fn lock_batches(&mut self, batches: &[&str]) -> Result<()>;
    async fn find_call(&mut self, key: &CallKey) -> Result<Option<Stored>>;
    async fn load_call(&mut self, rowid: i64) -> Result<Call>;
    async fn insert_batch(
        &mut self,
        batch_id: &BatchId,
        batch: &NewBatch,
        size: usize,
        now: Timestamp,
    ) -> Result<()>;
    /// Corrects a batch's size when fewer calls than planned were inserted (0: removes it).
    async fn resize_batch(&mut self, batch_id: &BatchId, size: usize) -> Result<()>;
    /// Stores a pending call with its Requested event. `None` if its identity is taken
    /// (a concurrent submit stored it first).
    async fn insert_call(
        &mut self,
        batch: &NewBatch,
        batch_id: &BatchId,
        position: usize,
        call: &NewCall,
        now: Timestamp,
    ) -> Result<Option<i64>>;
    /// Writes `outcome` if the call is still pending, with its Resolved event.
    async fn resolve(&mut self, rowid: i64, outcome: &Outcome) -> Result<Option<Resolved>>;
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
    /// Under the batch's lock: if no call of it is pending, flags `event` as completing it.
    async fn complete_batch_if_done(&mut self, batch_id: &str, event: i64) -> Result<()>;
    /// How many writing statements this transaction has issued so far, if the backend counts
    /// them. Without a count, every failed write of a group is taken to have changed something.
    fn writes(&self) -> Option<u64> {
        None
    }
    /// Commits the transaction: only then may its changes be acknowledged.
    async fn commit(self) -> Result<()>;
}

/// The grant and rule primitives of a transaction. The reads also serve read-only transactions
/// (Explain), so what Explain reads is what a submit reads.
#[async_trait]
pub trait PolicyTx: Send {
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
    async fn pending_in_scope(
        &mut self,
        agent: &AgentId,
        tool: &ToolName,
        scope: &GrantScope,
    ) -> Result<Vec<Stored>>;
    async fn find_rule(&mut self, id: &RuleId) -> Result<Option<Rule>>;
    /// Stores `rule`; `false` if its id is taken (nothing written).
    async fn insert_rule(&mut self, rule: &Rule) -> Result<bool>;
    /// Removes a rule; `false` if there was none.
    async fn delete_rule(&mut self, id: &RuleId) -> Result<bool>;
    /// Removes every rule loaded from a policy file; until this transaction ends, no other may
    /// change rules (so concurrent loads of policy files do not interleave).
    async fn delete_file_rules(&mut self) -> Result<()>;
}

/// Stores a batch and commits. See [`super::Store::submit`].
pub async fn submit(
    mut tx: impl WriteTx + PolicyTx,
    batch: &NewBatch,
    texts: &ToolResultTexts,
) -> Result<SubmitReport> {
    let started = Instant::now();
    let report = submit_in(&mut tx, batch, texts, Timestamp::now()).await?;
    tx.commit().await?;
    meters::committed(1, started.elapsed());
    Ok(report)
}

pub(super) async fn submit_in(
    tx: &mut (impl WriteTx + PolicyTx),
    batch: &NewBatch,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<SubmitReport> {
    tx.lock_session(&batch.agent, &batch.session).await?;
    let mut report = SubmitReport::default();
    let mut resolved = Vec::new();

    let mut fresh: Vec<&NewCall> = Vec::new();
    // Stored calls this request resubmits: their row ids, and where their items are.
    let mut resubmitted: HashMap<i64, usize> = HashMap::new();
    for call in &batch.calls {
        match tx.find_call(&key_of(batch, &call.call_id)).await? {
            Some(stored) => {
                let item = existing(batch, call, stored.call);
                if matches!(item.result, SubmitResult::Duplicate(_)) {
                    resubmitted.insert(stored.rowid, report.items.len());
                }
                report.items.push(item);
            }
            None => match call.refusal_if_new(now) {
                Some(refusal) => report.items.push(SubmitItem {
                    index: call.index,
                    call_id: call.call_id.clone(),
                    result: SubmitResult::Refused(refusal),
                }),
                None => fresh.push(call),
            },
        }
    }
    let tools = tools_of(fresh.iter().map(|c| &c.tool));
    if !tools.is_empty() {
        tx.lock_policy(&batch.agent, &tools, false).await?;
    }

    // Supersede replaces what is pending with what this batch stores, so a batch that stores no
    // new call (a retry, or every call refused) supersedes nothing.
    let supersede_pending = batch.supersede_pending && !fresh.is_empty();
    let supersedes = supersede_pending || fresh.iter().any(|c| c.supersede_key.is_some());
    let pending = if supersedes {
        tx.pending_in_session(&batch.agent, &batch.session).await?
    } else {
        Vec::new()
    };
    tx.lock_batches(&batches_of(pending.iter().map(|p| &p.call)))
        .await?;

    if supersede_pending {
        // A pending call this batch resubmits (a duplicate) is one of its own and stays. One
        // whose id a refused call reuses for another request is not in the batch: it is
        // superseded like the others (left pending, it could be approved and run while the
        // model's turn holds another request under its id).
        let superseded = texts.outcome(OutcomeKind::Superseded, DecidedBy::Broker, "", now);
        for pending in pending {
            if !resubmitted.contains_key(&pending.rowid) {
                resolved.extend(tx.resolve(pending.rowid, &superseded).await?);
            }
        }
    }

    let fresh = refuse_past_pending_cap(tx, batch, fresh, &mut report).await?;

    // Calls stored now, in position order: their row ids, and where their items are in the
    // report (which holds the calls themselves).
    let mut accepted: Vec<(i64, usize)> = Vec::new();
    // What was judged of each accepted call's input before the submit was queued, by row id.
    let mut prejudged: BTreeMap<i64, &Prejudged> = BTreeMap::new();
    if !fresh.is_empty() {
        let batch_id = BatchId::generate();
        let planned = fresh.len();
        tx.insert_batch(&batch_id, batch, planned, now).await?;
        let mut position = 0;
        for call in fresh {
            if let Some(key) = &call.supersede_key {
                let superseded = texts.outcome(OutcomeKind::Superseded, DecidedBy::Broker, "", now);
                for rowid in tx
                    .pending_with_key(&batch.agent, &batch.session, key)
                    .await?
                {
                    resolved.extend(tx.resolve(rowid, &superseded).await?);
                }
            }
            let result = match tx
                .insert_call(batch, &batch_id, position, call, now)
                .await?
            {
                Some(rowid) => {
                    accepted.push((rowid, report.items.len()));
                    prejudged.insert(rowid, &call.prejudged);
                    // What was just stored, without reading it back.
                    let key = key_of(batch, &call.call_id);
                    let stored = call.pending(key, &batch_id, position as u32, planned as u32, now);
                    position += 1;
                    SubmitResult::Accepted(stored)
                }
                // A concurrent submit stored the same identity first: answer as if it had
                // been there all along.
                None => match tx.find_call(&key_of(batch, &call.call_id)).await? {
                    Some(stored) => existing(batch, call, stored.call).result,
                    None => return Err(Error::Internal("a conflicting call vanished".into())),
                },
            };
            report.items.push(SubmitItem {
                index: call.index,
                call_id: call.call_id.clone(),
                result,
            });
        }
        if position == 0 {
            tx.resize_batch(&batch_id, 0).await?;
        } else {
            if position < planned {
                tx.resize_batch(&batch_id, position).await?;
                // The calls answered so far carry the planned size.
                for &(_, item) in &accepted {
                    if let SubmitResult::Accepted(call) = &mut report.items[item].result {
                        call.batch_size = position as u32;
                    }
                }
            }
            report.batch_id = Some(batch_id);
        }
    }

    let superseded = resolved.len();
    let mut accepted_calls: Vec<(i64, &Call)> = Vec::with_capacity(accepted.len());
    for &(rowid, item) in &accepted {
        if let SubmitResult::Accepted(call) = &report.items[item].result {
            accepted_calls.push((rowid, call));
        }
    }
    let decided =
        decide_by_policy(tx, batch, &tools, &accepted_calls, &prejudged, texts, now).await?;
    resolved.extend(decided);
    complete_batches(tx, &resolved).await?;
    // A call this request carries (stored now, or resubmitted) that a later call of it
    // superseded (the same supersede key) is acknowledged with its outcome, so the reply never
    // calls it pending.
    let carried: HashMap<i64, usize> = accepted.iter().copied().chain(resubmitted).collect();
    for r in &resolved[..superseded] {
        let call = tx.load_call(r.rowid).await?;
        if let Some(&item) = carried.get(&r.rowid) {
            let result = &mut report.items[item].result;
            *result = match result {
                SubmitResult::Duplicate(_) => SubmitResult::Duplicate(call.clone()),
                _ => SubmitResult::Accepted(call.clone()),
            };
        }
        report.superseded.push(call);
    }
    // The calls rules or grants decided (or whose batch a denial skipped) are acknowledged with
    // their outcome.
    for r in &resolved[superseded..] {
        if let Some(&(_, item)) = accepted.iter().find(|(rowid, _)| *rowid == r.rowid) {
            report.items[item].result = SubmitResult::Accepted(tx.load_call(r.rowid).await?);
        }
    }
    report.items.sort_by_key(|item| item.index);
    Ok(report)
}

/// Keeps the new calls the agent has room for under its pending cap
/// ([`NewBatch::pending_cap`]), in order, and refuses the rest, each with RESOURCE_EXHAUSTED
/// naming the setting. Counted after what this submit superseded, so a submit that replaces
/// the pending calls of its session makes room for itself.
async fn refuse_past_pending_cap<'b>(
    tx: &mut impl WriteTx,
    batch: &NewBatch,
    mut fresh: Vec<&'b NewCall>,
    report: &mut SubmitReport,
) -> Result<Vec<&'b NewCall>> {
    let Some(cap) = batch.pending_cap else {
        return Ok(fresh);
    };
    if fresh.is_empty() {
        return Ok(fresh);
    }
    let pending = tx.pending_of_agent(&batch.agent, cap).await?;
    let room = cap.saturating_sub(pending) as usize;
    if fresh.len() <= room {
        return Ok(fresh);
    }
    for call in fresh.drain(room..) {
        report.items.push(SubmitItem {
            index: call.index,
            call_id: call.call_id.clone(),
            result: SubmitResult::Refused(Error::ResourceExhausted(format!(
                "agent {} has {pending} pending calls, the most --max-pending-per-agent \
                 allows ({cap}); decide or cancel some first",
                batch.agent
            ))),
        });
    }
    Ok(fresh)
}

/// The distinct tools of some calls, sorted.
fn tools_of<'a>(tools: impl Iterator<Item = &'a ToolName>) -> Vec<&'a ToolName> {
    let mut tools: Vec<&ToolName> = tools.collect();
    tools.sort_unstable();
    tools.dedup();
    tools
}

/// Decides the calls just stored that a rule or a grant decides, in position order, with what a
/// human decision would bring along (a denial skips the rest of a SKIP_REST batch).
async fn decide_by_policy(
    tx: &mut (impl WriteTx + PolicyTx),
    batch: &NewBatch,
    tools: &[&ToolName],
    accepted: &[(i64, &Call)],
    prejudged: &BTreeMap<i64, &Prejudged>,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<Vec<Resolved>> {
    let mut resolved = Vec::new();
    if accepted.is_empty() {
        return Ok(resolved);
    }
    let rules = tx.rules().await?;
    let grants = tx
        .live_grants(&batch.agent, Some(&batch.session), tools, now)
        .await?;
    if rules.is_empty() && grants.is_empty() {
        return Ok(resolved);
    }
    for &(rowid, call) in accepted {
        if let Some((own, skipped)) = decide_by_ruling(
            tx,
            (rowid, call, prejudged.get(&rowid).copied()),
            &rules,
            &grants,
            texts,
            now,
        )
        .await?
        {
            resolved.push(own);
            resolved.extend(skipped);
        }
    }
    Ok(resolved)
}

/// Decides a pending call if a rule or grant does, with what a human decision would bring
/// along (a denial skips the rest of a SKIP_REST batch). Returns its resolution and the
/// siblings skipped; `None` if nothing decides it, or it is decided already (an earlier denial
/// of the same pass may have skipped it: `resolve` is conditional). `prejudged`: what was
/// judged of the call's input before the write was queued.
async fn decide_by_ruling(
    tx: &mut (impl WriteTx + PolicyTx),
    (rowid, call, prejudged): (i64, &Call, Option<&Prejudged>),
    rules: &[Rule],
    grants: &[Grant],
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<Option<(Resolved, Vec<Resolved>)>> {
    let subject = Subject::of_call(call).with_prejudged(prejudged);
    let ruling = evaluate(&subject, rules, grants, now);
    let Some(outcome) = ruling.outcome(&call.input, texts, now) else {
        return Ok(None);
    };
    let Some(own) = tx.resolve(rowid, &outcome).await? else {
        return Ok(None);
    };
    let skipped = if outcome.kind == OutcomeKind::Denied
        && tx.on_deny(&call.batch_id).await? == OnDeny::SkipRest
    {
        skip_rest_of_batch(tx, &call.batch_id, texts, now).await?
    } else {
        Vec::new()
    };
    Ok(Some((own, skipped)))
}

/// Skips every still-pending call of a batch (one of its calls was denied).
async fn skip_rest_of_batch(
    tx: &mut impl WriteTx,
    batch: &BatchId,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<Vec<Resolved>> {
    let skip = texts.outcome(OutcomeKind::Skipped, DecidedBy::Broker, "", now);
    let mut skipped = Vec::new();
    for sibling in tx.pending_in_batch(batch).await? {
        skipped.extend(tx.resolve(sibling, &skip).await?);
    }
    Ok(skipped)
}

fn key_of(batch: &NewBatch, call_id: &CallId) -> CallKey {
    CallKey {
        agent: batch.agent.clone(),
        session: batch.session.clone(),
        call_id: call_id.clone(),
    }
}

/// The answer for a submitted call whose identity is already stored.
fn existing(batch: &NewBatch, call: &NewCall, stored: Call) -> SubmitItem {
    let result = if call.is_same_request_as(&stored) {
        SubmitResult::Duplicate(stored)
    } else {
        SubmitResult::Refused(Error::AlreadyExists(format!(
            "call_id: call `{}` already exists in session `{}` with a different tool or input",
            call.call_id, batch.session
        )))
    };
    SubmitItem {
        index: call.index,
        call_id: call.call_id.clone(),
        result,
    }
}

/// Writes an approver's decision and commits. See [`super::Store::decide`].
pub async fn decide(
    mut tx: impl WriteTx + PolicyTx,
    key: &CallKey,
    decision: &Decision,
    texts: &ToolResultTexts,
) -> Result<DecideReport> {
    let started = Instant::now();
    let report = decide_in(&mut tx, key, decision, texts, Timestamp::now()).await?;
    tx.commit().await?;
    meters::committed(1, started.elapsed());
    Ok(report)
}

pub(super) async fn decide_in(
    tx: &mut (impl WriteTx + PolicyTx),
    key: &CallKey,
    decision: &Decision,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<DecideReport> {
    let Some(Stored { rowid, call }) = tx.find_call(key).await? else {
        return Err(Error::NotFound(format!(
            "no call `{}` in session `{}` of agent `{}`",
            key.call_id, key.session, key.agent
        )));
    };
    let grant = decision
        .remember
        .as_ref()
        .map(|remember| grant_spec(&call, decision, remember, now))
        .transpose()?;
    if grant.is_some() {
        tx.lock_policy(&call.key.agent, &[&call.tool], true).await?;
    }
    let outcome = approver_outcome(&call, decision, texts, now);
    if call.outcome.is_none()
        && let Some(deadline) = call.deadline
        && deadline <= now
    {
        // Too late: the call expires (the sweeper writes that within a second), and no
        // decision may win the race against its deadline.
        return Err(Error::FailedPrecondition(
            "the call's deadline has passed; it is EXPIRED (decided by deadline)".into(),
        ));
    }
    let won = match &call.outcome {
        Some(_) => None,
        None => {
            // The pending calls the new grant covers are decided in this transaction too: lock
            // their batches with the call's own, all at once.
            let covered = match &grant {
                Some(spec) => pending_covered_by(tx, spec, &decision.prejudged, rowid, now).await?,
                None => Vec::new(),
            };
            tx.lock_batches(&batches_of(
                std::iter::once(&call).chain(covered.iter().map(|c| &c.call)),
            ))
            .await?;
            tx.resolve(rowid, &outcome).await?.map(|won| (won, covered))
        }
    };
    let Some((won, covered)) = won else {
        // Decided before (or by a transaction that committed while this one waited).
        let standing = tx.load_call(rowid).await?;
        if let Some(outcome) = &standing.outcome {
            decision.check_against(outcome, &standing.input)?;
        }
        return Ok(DecideReport {
            call: standing,
            replayed: true,
            skipped: Vec::new(),
            grant: tx.grant_from_call(key).await?,
            decided_by_grant: Vec::new(),
        });
    };

    let mut resolved = vec![won];
    let mut skipped = Vec::new();
    if decision.verdict == Verdict::Deny && tx.on_deny(&call.batch_id).await? == OnDeny::SkipRest {
        let siblings = skip_rest_of_batch(tx, &call.batch_id, texts, now).await?;
        skipped.extend(siblings.iter().map(|r| r.rowid));
        resolved.extend(siblings);
    }
    let mut created = None;
    let mut decided_by_grant = Vec::new();
    if let Some(spec) = grant {
        let grant = tx.insert_grant(&spec).await?;
        let (decided, also_skipped) = decide_covered(
            tx,
            &grant,
            covered,
            &decision.prejudged,
            texts,
            now,
            &mut resolved,
        )
        .await?;
        decided_by_grant = decided;
        skipped.extend(also_skipped);
        created = Some(grant);
    }
    complete_batches(tx, &resolved).await?;
    let mut report = DecideReport {
        call: tx.load_call(rowid).await?,
        replayed: false,
        skipped: Vec::with_capacity(skipped.len()),
        grant: created,
        decided_by_grant: Vec::with_capacity(decided_by_grant.len()),
    };
    for rowid in skipped {
        report.skipped.push(tx.load_call(rowid).await?);
    }
    for rowid in decided_by_grant {
        report.decided_by_grant.push(tx.load_call(rowid).await?);
    }
    Ok(report)
}

/// The outcome an approver's decision writes.
fn approver_outcome(
    call: &Call,
    decision: &Decision,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Outcome {
    let by = DecidedBy::Approver(decision.approver.clone());
    match decision.verdict {
        Verdict::Approve => Outcome {
            kind: OutcomeKind::Approved,
            decided_at: now,
            decided_by: by,
            reason: decision.reason.clone(),
            tool_result: String::new(),
            run_input: Some(
                decision
                    .edited_input
                    .clone()
                    .unwrap_or_else(|| call.input.clone()),
            ),
            input_edited: decision.edited_input.is_some(),
            seq: None,
        },
        Verdict::Deny => texts.outcome(OutcomeKind::Denied, by, &decision.reason, now),
    }
}

/// The grant a decision asks to remember, for the call it decides.
fn grant_spec(
    call: &Call,
    decision: &Decision,
    remember: &Remember,
    now: Timestamp,
) -> Result<GrantSpec> {
    let scope = match remember.scope {
        Scope::Session => GrantScope::Session(call.key.session.clone()),
        Scope::Workspace if call.workspace.is_empty() => {
            return Err(Error::invalid(
                "scope",
                format!(
                    "SCOPE_WORKSPACE needs a call with a workspace; call `{}` has none",
                    call.key.call_id
                ),
            ));
        }
        Scope::Workspace => GrantScope::Workspace(call.workspace.clone()),
        Scope::Always => GrantScope::Always,
        Scope::Once => return Err(Error::Internal("a ONCE decision has no grant".into())),
    };
    Ok(GrantSpec {
        agent: call.key.agent.clone(),
        scope,
        tool: call.tool.clone(),
        matcher: remember
            .matcher
            .clone()
            .unwrap_or_else(|| crate::domain::policy::Matcher::Exact(call.input.clone())),
        effect: match decision.verdict {
            Verdict::Approve => Effect::Allow,
            Verdict::Deny => Effect::Deny,
        },
        created_by: DecidedBy::Approver(decision.approver.clone()).to_string(),
        created_at: now,
        expires_at: remember.expires_in.map(|d| now.saturating_add(d)),
        source: call.key.clone(),
        reason: decision.reason.clone(),
    })
}

/// The pending calls (other than `except`) a grant about to be created covers, still before
/// their deadline.
async fn pending_covered_by(
    tx: &mut (impl WriteTx + PolicyTx),
    spec: &GrantSpec,
    prejudged: &HashMap<CallKey, Prejudged>,
    except: i64,
    now: Timestamp,
) -> Result<Vec<Stored>> {
    let pending = tx
        .pending_in_scope(&spec.agent, &spec.tool, &spec.scope)
        .await?;
    Ok(pending
        .into_iter()
        .filter(|p| p.rowid != except)
        .filter(|p| p.call.deadline.is_none_or(|d| d > now))
        .filter(|p| {
            spec.covers(&Subject::of_call(&p.call).with_prejudged(prejudged.get(&p.call.key)))
        })
        .collect())
}

/// Decides, by the one `evaluate` (so a rule that outranks the new grant still wins), the
/// pending calls `grant` covers, oldest first; a denial skips the rest of a SKIP_REST batch.
/// Returns the row ids decided, and those skipped.
async fn decide_covered(
    tx: &mut (impl WriteTx + PolicyTx),
    grant: &Grant,
    covered: Vec<Stored>,
    prejudged: &HashMap<CallKey, Prejudged>,
    texts: &ToolResultTexts,
    now: Timestamp,
    resolved: &mut Vec<Resolved>,
) -> Result<(Vec<i64>, Vec<i64>)> {
    let (mut decided, mut skipped) = (Vec::new(), Vec::new());
    if covered.is_empty() {
        return Ok((decided, skipped));
    }
    let rules = tx.rules().await?;
    let grants = tx
        .live_grants(&grant.spec.agent, None, &[&grant.spec.tool], now)
        .await?;
    for Stored { rowid, call } in covered {
        if let Some((own, siblings)) = decide_by_ruling(
            tx,
            (rowid, &call, prejudged.get(&call.key)),
            &rules,
            &grants,
            texts,
            now,
        )
        .await?
        {
            resolved.push(own);
            decided.push(rowid);
            skipped.extend(siblings.iter().map(|r| r.rowid));
            resolved.extend(siblings);
        }
    }
    Ok((decided, skipped))
}

/// Revokes what `target` names and commits. See [`super::Store::revoke_grants`].
pub async fn revoke_grants(
    mut tx: impl WriteTx + PolicyTx,
    target: &RevokeTarget,
    by: &str,
) -> Result<RevokeReport> {
    let now = Timestamp::now();
    let named = tx.grants_named(target, now).await?;
    if let RevokeTarget::Id(id) = target
        && named.is_empty()
    {
        return Err(Error::NotFound(format!("no grant with id {id}")));
    }
    let report = match named.first() {
        None => RevokeReport::default(),
        Some(first) => {
            // A submit reading these grants finishes first; every later one sees them revoked.
            let agent = first.spec.agent.clone();
            let tools = tools_of(named.iter().map(|g| &g.spec.tool));
            tx.lock_policy(&agent, &tools, true).await?;
            let ids: Vec<i64> = named.iter().map(|g| g.id).collect();
            let revoked = tx.revoke(&ids, by, now).await?;
            let count = revoked.len();
            let grants = match target {
                // The grant as it stands, revoked now or before.
                RevokeTarget::Id(_) if revoked.is_empty() => named,
                _ => revoked,
            };
            RevokeReport {
                revoked: count,
                grants,
            }
        }
    };
    tx.commit().await?;
    Ok(report)
}

/// Adds a rule and commits; the same rule again is answered with the stored one.
pub async fn create_rule(mut tx: impl WriteTx + PolicyTx, rule: &Rule) -> Result<Rule> {
    let stored = if tx.insert_rule(rule).await? {
        rule.clone()
    } else {
        match tx.find_rule(&rule.id).await? {
            Some(existing) if existing.same_terms_as(rule) => existing,
            Some(_) => {
                return Err(Error::AlreadyExists(format!(
                    "rule.id: a different rule `{}` exists; delete it first",
                    rule.id
                )));
            }
            None => return Err(Error::Internal("a conflicting rule vanished".into())),
        }
    };
    tx.commit().await?;
    Ok(stored)
}

/// Removes a rule and commits.
pub async fn delete_rule(mut tx: impl WriteTx + PolicyTx, id: &RuleId) -> Result<Rule> {
    let Some(rule) = tx.find_rule(id).await? else {
        return Err(Error::NotFound(format!("no rule `{id}`")));
    };
    tx.delete_rule(id).await?;
    tx.commit().await?;
    Ok(rule)
}

/// Replaces the rules of the previous policy file with `rules` and commits.
pub async fn load_file_rules(mut tx: impl WriteTx + PolicyTx, rules: &[Rule]) -> Result<()> {
    tx.delete_file_rules().await?;
    for rule in rules {
        // A rule made through CreateRule with the same id gives way to the file's.
        tx.delete_rule(&rule.id).await?;
        let rule = Rule {
            source: RuleSource::File,
            ..rule.clone()
        };
        tx.insert_rule(&rule).await?;
    }
    tx.commit().await
}

/// Cancels what `target` names and commits. See [`super::Store::cancel`].
pub async fn cancel(
    mut tx: impl WriteTx,
    target: &CancelTarget,
    texts: &ToolResultTexts,
) -> Result<CancelReport> {
    let started = Instant::now();
    let report = cancel_in(&mut tx, target, texts, Timestamp::now()).await?;
    tx.commit().await?;
    meters::committed(1, started.elapsed());
    Ok(report)
}

pub(super) async fn cancel_in(
    tx: &mut impl WriteTx,
    target: &CancelTarget,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<CancelReport> {
    let outcome = texts.outcome(
        OutcomeKind::Cancelled,
        DecidedBy::Agent,
        &target.reason,
        now,
    );
    let mut report = CancelReport::default();
    let candidates = match &target.scope {
        CancelScope::Calls(ids) => {
            let mut found = Vec::new();
            for call_id in ids {
                let key = CallKey {
                    agent: target.agent.clone(),
                    session: target.session.clone(),
                    call_id: call_id.clone(),
                };
                match tx.find_call(&key).await? {
                    Some(stored) => found.push(stored),
                    None => report.unknown.push(call_id.clone()),
                }
            }
            found
        }
        CancelScope::Batch(batch_id) => {
            let calls = tx
                .calls_of_batch(&target.agent, &target.session, batch_id)
                .await?;
            if calls.is_empty() {
                return Err(Error::NotFound(format!(
                    "no batch `{}` in session `{}`",
                    batch_id.as_str(),
                    target.session
                )));
            }
            calls
        }
        CancelScope::Session => {
            tx.pending_in_session(&target.agent, &target.session)
                .await?
        }
    };

    tx.lock_batches(&batches_of(
        candidates
            .iter()
            .map(|c| &c.call)
            .filter(|c| c.outcome.is_none()),
    ))
    .await?;
    let mut resolved = Vec::new();
    for Stored { rowid, call } in candidates {
        let won = match call.outcome {
            Some(_) => None,
            None => tx.resolve(rowid, &outcome).await?,
        };
        match won {
            Some(r) => resolved.push(r),
            // Decided before, or meanwhile by another transaction.
            None => report.already_decided.push(tx.load_call(rowid).await?),
        }
    }
    complete_batches(tx, &resolved).await?;
    for r in &resolved {
        report.cancelled.push(tx.load_call(r.rowid).await?);
    }
    Ok(report)
}

/// A backend that opens write transactions.
#[async_trait]
pub trait Writer: Sync {
    type Tx: WriteTx + PolicyTx;
    async fn begin_write(&self) -> Result<Self::Tx>;
    /// Runs on the group-commit writer after each group and each piece of work alone (whether
    /// or not they committed), once their callers were answered: a backend may hand over what
    /// was committed. Nothing by default.
    fn after_commit(&self) {}
}

/// Expires every call due at `now`, a chunk per transaction. Returns them, decided.
pub async fn expire_due(
    writer: &impl Writer,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<Vec<Call>> {
    expire_in_chunks(|| expire_chunk(writer, texts, now)).await
}

/// Runs `chunk` (an [`expire_chunk`]) until it reports the last one; returns every call expired.
pub async fn expire_in_chunks<F, Fut>(mut chunk: F) -> Result<Vec<Call>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<Call>, bool)>>,
{
    let mut expired = Vec::new();
    loop {
        let (calls, last) = chunk().await?;
        expired.extend(calls);
        if last {
            return Ok(expired);
        }
    }
}

/// Expires a chunk of the calls due at `now` in one transaction. Returns them, decided, and
/// whether it was the last chunk.
pub async fn expire_chunk(
    writer: &impl Writer,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<(Vec<Call>, bool)> {
    const CHUNK: i64 = 256;
    let started = Instant::now();
    let mut tx = writer.begin_write().await?;
    let chunk = expire_some(&mut tx, texts, now, CHUNK).await?;
    tx.commit().await?;
    meters::committed(1, started.elapsed());
    let last = (chunk.len() as i64) < CHUNK;
    Ok((chunk, last))
}

/// Expires up to `limit` due calls. Returns them, decided.
async fn expire_some(
    tx: &mut impl WriteTx,
    texts: &ToolResultTexts,
    now: Timestamp,
    limit: i64,
) -> Result<Vec<Call>> {
    let outcome = texts.outcome(OutcomeKind::Expired, DecidedBy::Deadline, "", now);
    let due = tx.due_calls(now, limit).await?;
    let mut batches: Vec<&str> = due.iter().map(|(_, batch)| batch.as_str()).collect();
    batches.sort_unstable();
    batches.dedup();
    tx.lock_batches(&batches).await?;
    let mut resolved = Vec::new();
    for (rowid, _) in &due {
        // Conditional: a call decided meanwhile (by another replica) keeps its outcome.
        resolved.extend(tx.resolve(*rowid, &outcome).await?);
    }
    complete_batches(tx, &resolved).await?;
    let mut expired = Vec::with_capacity(resolved.len());
    for r in &resolved {
        expired.push(tx.load_call(r.rowid).await?);
    }
    Ok(expired)
}

/// The distinct batches of `calls`, sorted: the order every writer locks batches in.
fn batches_of<'a>(calls: impl Iterator<Item = &'a Call>) -> Vec<&'a str> {
    let mut batches: Vec<&str> = calls.map(|c| c.batch_id.as_str()).collect();
    batches.sort_unstable();
    batches.dedup();
    batches
}

/// For each batch touched, flags this transaction's last event in it if the batch is now
/// complete. Batches are visited in id order, so concurrent transactions lock them in the same
/// order.
async fn complete_batches(tx: &mut impl WriteTx, resolved: &[Resolved]) -> Result<()> {
    let mut last_by_batch: BTreeMap<&str, i64> = BTreeMap::new();
    for r in resolved {
        let last = last_by_batch.entry(&r.batch_id).or_insert(r.event);
        *last = (*last).max(r.event);
    }
    for (batch_id, event) in last_by_batch {
        tx.complete_batch_if_done(batch_id, event).await?;
    }
    Ok(())
}
