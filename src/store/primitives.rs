//! The transaction primitives (`WriteTx`, `PolicyTx`) written once for both backends, over what
//! a backend's transaction must offer ([`SqlTx`]): run one of the shared statements with its
//! parameters and decode the rows, plus the few steps that really differ: the locks Postgres
//! needs and SQLite's one writer does not, and how a resolved call's event is written.
//!
//! No SQL text here (it is in `statements`, and a receipt's in `receipt_rows`), and nothing a backend would do differently: a
//! difference belongs in [`SqlTx`], where both backends show what they do.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use super::policy_cache::{self, PolicyCache, PolicyView};
use super::receipt_rows::{self, NewReceipt, ReceiptForm};
use super::rows::{Columns, call_from_row, grant_from_row, rule_from_row, stored};
use super::statements::{self as sql, GrantsNamed};
use crate::domain::escalation::Escalation;
use crate::domain::policy::{
    Approval, Grant, GrantScope, GrantSpec, Person, Requirement, RevokeTarget, Rule, RuleId,
    RuleMode, RuleSource, ShadowVerdict,
};
use crate::domain::receipt::ChainLink;
use crate::domain::{
    AgentId, BatchId, Call, CallKey, EventKind, Host, Kind, NewBatch, NewCall, OnDeny, Outcome,
    SessionId, Timestamp, ToolInput, ToolName,
};
use crate::error::{Error, Result};
use crate::operations::{Placement, PolicyTx, Resolved, Stored, SubmitLocks, WriteTx};
use crate::receipts::Notary;

/// A parameter of a shared statement, typed as both databases need (Postgres types a NULL).
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    Int(i64),
    OptInt(Option<i64>),
    Text(&'a str),
    OptText(Option<&'a str>),
    Flag(bool),
}

/// A statement to run: its text and parameters, and whether it changes rows.
#[derive(Clone, Copy)]
pub struct Run<'a> {
    pub sql: &'a str,
    pub params: &'a [Param<'a>],
    pub writes: bool,
}

impl<'a> Run<'a> {
    pub fn read(sql: &'a str, params: &'a [Param<'a>]) -> Self {
        Self {
            sql,
            params,
            writes: false,
        }
    }

    pub fn write(sql: &'a str, params: &'a [Param<'a>]) -> Self {
        Self {
            sql,
            params,
            writes: true,
        }
    }
}

/// A call's outcome to write: [`sql::RESOLVE_CALL`]'s parameters, and its Resolved event's
/// (kind, call row id, time), for a backend that writes the event with a statement of its own.
pub struct Resolution<'a> {
    pub outcome: &'a [Param<'a>],
    pub event: [Param<'a>; 3],
    /// The last call the transaction resolves in its batch: flag the event as completing the
    /// batch if no call of it is left pending (see [`WriteTx::resolve_read`]).
    pub completing: bool,
}

/// Decodes one row.
pub type Decode<T> = fn(&dyn Columns) -> Result<T>;

/// A backend's transaction, as the primitives use it.
#[async_trait]
pub trait SqlTx: Send {
    /// [`sql::INSERT_CALL`]'s parameters, in a statement that also writes the Requested event.
    const INSERT_CALL: &'static str;
    /// [`sql::INSERT_DECIDED_CALL`]'s parameters, in a statement that also writes the Requested
    /// event.
    const INSERT_DECIDED_CALL: &'static str;
    /// [`Self::INSERT_CALL`] and [`Self::INSERT_DECIDED_CALL`] storing the call's new batch too
    /// (its `on_deny` and `size` as their last two parameters), where one statement can
    /// (Postgres: [`sql::INSERT_BATCH_CALL_AND_EVENT`], [`sql::INSERT_BATCH_DECIDED_CALL_AND_EVENT`]);
    /// `None`: the batch is inserted first, by [`sql::INSERT_BATCH`].
    const INSERT_CALL_WITH_BATCH: Option<[&'static str; 2]> = None;
    /// [`sql::APPEND_EVENT`] or [`sql::APPEND_EVENT_AT_ID`]: appends an event and returns what
    /// [`Resolved::event`] holds, as `event`.
    const APPEND_EVENT: &'static str;
    /// [`sql::COMPLETE_BATCH_AT_SEQ`] or [`sql::COMPLETE_BATCH_AT_ID`]: what [`Resolved::event`]
    /// holds.
    const COMPLETE_BATCH: &'static str;
    /// Whether [`Resolved::event`] is the event's sequence number (events numbered as they are
    /// written), not an id numbered after commit.
    const EVENT_IS_SEQ: bool;
    /// [`receipt_rows::CHAIN_HEAD`], or [`receipt_rows::CHAIN_HEAD_LOCKED`] where writers run
    /// concurrently.
    const CHAIN_HEAD: &'static str;
    /// [`sql::FIND_CALL`], or [`sql::FIND_CALL_LOCKING_BATCH`] where writers run concurrently
    /// (see [`WriteTx::find_call_locking_batch`]).
    const FIND_CALL_LOCKING_BATCH: &'static str;
    /// Whether an approval stores its input to run when it is the call's own (see
    /// [`outcome_params`]): where binaries of an older version may read the rows.
    const STORES_UNEDITED_INPUT_TO_RUN: bool;
    /// Whether other broker processes write the database at the same time (Postgres's
    /// replicas): then a row read to be changed is locked until the change is written, a lease
    /// is taken only once its holder's has run out, and work done once per event is claimed.
    /// A SQLite file serves one broker process (its lock file), whose writer is alone.
    const REPLICAS: bool;

    /// Every row `run` returns, decoded.
    async fn rows<T: Send + 'static>(&mut self, run: Run<'_>, decode: Decode<T>) -> Result<Vec<T>>;

    /// Runs a statement that returns no rows; how many rows it changed.
    async fn execute(&mut self, run: Run<'_>) -> Result<u64>;

    /// Writes `resolution`: the batch id and the Resolved event, or `None` if the call was no
    /// longer pending. Two statements (three `completing`); Postgres makes them one (a round
    /// trip each there).
    async fn resolve_call(&mut self, resolution: Resolution<'_>) -> Result<Option<(String, i64)>> {
        let run = Run::write(sql::RESOLVE_CALL, resolution.outcome);
        let Some(batch_id) = first(self.rows(run, |row| row.text("batch_id")).await?) else {
            return Ok(None);
        };
        let event = self.append_event(&resolution.event).await?;
        if resolution.completing {
            self.complete_batch(&batch_id, event).await?;
        }
        Ok(Some((batch_id, event)))
    }

    /// See [`WriteTx::complete_batch_if_done`]: [`Self::COMPLETE_BATCH`]. Postgres: the batch
    /// row is locked (`lock_batches` or `find_call_locking_batch`; a batch this transaction
    /// stored is its own), which orders the transactions resolving calls of this batch; this
    /// statement's snapshot, taken after the lock, sees every one that committed before.
    async fn complete_batch(&mut self, batch_id: &str, event: i64) -> Result<()> {
        let params = [Param::Int(event), Param::Text(batch_id)];
        self.execute(Run::write(Self::COMPLETE_BATCH, &params))
            .await?;
        Ok(())
    }

    /// Appends the event (kind, call row id, time) with [`Self::APPEND_EVENT`]; what
    /// [`Resolved::event`] holds.
    async fn append_event(&mut self, event: &[Param<'_>; 3]) -> Result<i64> {
        let run = Run::write(Self::APPEND_EVENT, event);
        first(self.rows(run, |row| row.int("event")).await?)
            .ok_or_else(|| Error::Internal("an event insert returned no event".into()))
    }

    /// See [`PolicyTx::lock_submit`]; nothing to lock where writers are serialised.
    async fn lock_submit(
        &mut self,
        _batch: &NewBatch,
        _tools: &[&ToolName],
        _count_pending_to: Option<u64>,
    ) -> Result<SubmitLocks> {
        Ok(SubmitLocks::default())
    }

    /// See [`WriteTx::lock_batches`].
    async fn lock_batches(&mut self, _batches: &[&str]) -> Result<()> {
        Ok(())
    }

    /// See [`PolicyTx::lock_policy`].
    async fn lock_policy(
        &mut self,
        _agent: &AgentId,
        _tools: &[&ToolName],
        _exclusive: bool,
    ) -> Result<()> {
        Ok(())
    }

    /// Before the rules loaded from a file are replaced: keeps other writers from changing rules
    /// until this transaction ends.
    async fn lock_rules(&mut self) -> Result<()> {
        Ok(())
    }

    /// The process's copy of rules and grants as this transaction may use it (see
    /// `policy_cache`), for a backend that keeps one; `None` reads the tables every time.
    fn policy_view(&mut self) -> Option<&mut PolicyView> {
        None
    }

    /// See [`WriteTx::statements_written`].
    fn statements_written(&self) -> Option<u64> {
        None
    }

    /// See [`WriteTx::next_write`], for what the backend itself keeps per write (the policy view
    /// is told by the caller). Nothing by default.
    fn next_write(&mut self, _alone: bool) {}

    /// The key every outcome's receipt is signed with; `None` when receipts are off.
    fn notary(&self) -> Option<Arc<Notary>> {
        None
    }

    /// Appends the receipt of `call` (row `rowid`), just decided, to the chain, sealed by
    /// `notary`, in this transaction: the chain's head is read (and, on Postgres, locked until
    /// commit, so concurrent transactions of every replica take turns and the chain cannot
    /// fork), the receipt links to it, and becomes it. Taken after every other lock of the
    /// transaction (see `operations::tx`), so it adds no cycle. Stored whole (the envelope):
    /// replicas of the version before read nothing else (`receipt_rows`). SQLite's writer keeps
    /// the head between the receipts of a transaction and writes it at commit, and stores each
    /// receipt in parts, signed on another thread, its signature written just before the commit
    /// (see `receipts::signer`).
    async fn append_receipt(&mut self, notary: &Notary, rowid: i64, call: &Call) -> Result<()> {
        let link = ChainLink::after(read_chain_head(self).await?);
        let receipt = NewReceipt::of(call, rowid, &link)?;
        let params = [Param::Int(receipt.sequence), Param::Text(&receipt.digest)];
        self.execute(Run::write(receipt_rows::ADVANCE_CHAIN, &params))
            .await?;
        let envelope = notary.seal(&receipt.payload);
        let params = receipt.params(ReceiptForm::Whole(&envelope));
        self.execute(Run::write(receipt_rows::INSERT_RECEIPT, &params))
            .await?;
        Ok(())
    }

    /// See [`WriteTx::commit`].
    async fn commit(self) -> Result<()>;
}

/// An outcome's columns, as [`sql::RESOLVE_CALL`] and [`sql::INSERT_DECIDED_CALL`] take them
/// (status, decided at, by, reason, tool result, input to run, edited).
///
/// The input to run is stored only when an approver edited it, unless `unedited_too`: a NULL
/// reads back as the call's own input (`rows::call_from_row`). Stored again, a 1 KiB input made
/// a row of over half a page, so every approved call took a page of its own (measured in
/// docs/benchmarks-notes.md). Builds before `f2daf96` read
/// a NULL as "nothing to run", so a backend where they may read the rows stores it anyway:
/// Postgres, whose replicas of two versions share the database during a rolling update. A
/// SQLite file has one broker at a time (its lock file), and migration 0014 makes an older one
/// refuse to start on the file, so it never meets such a row.
/// When this can go: at the first release (`unedited_too` then always false), since no release
/// predates `f2daf96`; until then a rolling update from an older build of `main` may meet it.
fn outcome_params<'a>(
    outcome: &'a Outcome,
    decided_by: &'a str,
    unedited_too: bool,
) -> [Param<'a>; 7] {
    let run_input = outcome
        .run_input
        .as_ref()
        .filter(|_| outcome.input_edited || unedited_too);
    [
        Param::Int(outcome.kind.code()),
        Param::Int(outcome.decided_at.as_micros()),
        Param::Text(decided_by),
        Param::Text(&outcome.reason),
        Param::Text(&outcome.tool_result),
        Param::OptText(run_input.map(ToolInput::as_str)),
        Param::Flag(outcome.input_edited),
    ]
}

/// The Resolved event of call row `rowid`'s `outcome`: (kind, call row id, time).
fn resolved_event(rowid: i64, outcome: &Outcome) -> [Param<'static>; 3] {
    [
        Param::Int(EventKind::Resolved.code()),
        Param::Int(rowid),
        Param::Int(outcome.decided_at.as_micros()),
    ]
}

/// Writes `outcome` on call row `rowid` if it is still pending, with its Resolved event and
/// receipt; `stored`: the call with that outcome, where the caller has it (see
/// [`WriteTx::resolve_read`]).
async fn resolve_as<T: SqlTx>(
    tx: &mut T,
    rowid: i64,
    outcome: &Outcome,
    stored: Option<&Call>,
    completing: bool,
) -> Result<Option<Resolved>> {
    let decided_by = outcome.decided_by.to_string();
    let [kind, at, by, reason, result, run_input, edited] =
        outcome_params(outcome, &decided_by, T::STORES_UNEDITED_INPUT_TO_RUN);
    let params = [
        kind,
        at,
        by,
        reason,
        result,
        run_input,
        edited,
        Param::Int(rowid),
    ];
    let resolution = Resolution {
        outcome: &params,
        event: resolved_event(rowid, outcome),
        completing,
    };
    let Some((batch_id, event)) = tx.resolve_call(resolution).await? else {
        return Ok(None);
    };
    let mut resolved = outcome_written(tx, rowid, (batch_id, event), stored).await?;
    resolved.batch_checked = completing;
    Ok(Some(resolved))
}

/// After an outcome and its Resolved event are written, however: its receipt. Every outcome
/// passes here, so every outcome gets its receipt, in its transaction.
/// `stored`: the call as now stored, where the caller has it (else it is read back).
async fn outcome_written<T: SqlTx>(
    tx: &mut T,
    rowid: i64,
    (batch_id, event): (String, i64),
    stored: Option<&Call>,
) -> Result<Resolved> {
    if let Some(notary) = tx.notary() {
        match stored {
            Some(call) => tx.append_receipt(&notary, rowid, call).await?,
            None => {
                let call = tx.load_call(rowid).await?;
                tx.append_receipt(&notary, rowid, &call).await?;
            }
        }
    }
    Ok(Resolved {
        rowid,
        batch_id,
        event,
        seq: T::EVENT_IS_SEQ.then_some(event as u64),
        batch_checked: false,
    })
}

/// The first row of `rows`, if any.
fn first<T>(rows: Vec<T>) -> Option<T> {
    rows.into_iter().next()
}

/// The call `key` names, read with `statement` ([`sql::FIND_CALL`]'s parameters).
async fn find(tx: &mut impl SqlTx, statement: &str, key: &CallKey) -> Result<Option<Stored>> {
    let params = [
        Param::Text(key.agent.as_str()),
        Param::Text(key.session.as_str()),
        Param::Text(key.call_id.as_str()),
    ];
    Ok(first(
        tx.rows(Run::read(statement, &params), |row| stored(row))
            .await?,
    ))
}

fn id(row: &dyn Columns) -> Result<i64> {
    row.int("id")
}

#[async_trait]
impl<T: SqlTx> WriteTx for T {
    async fn lock_batches(&mut self, batches: &[&str]) -> Result<()> {
        SqlTx::lock_batches(self, batches).await
    }

    async fn find_call(&mut self, key: &CallKey) -> Result<Option<Stored>> {
        find(self, sql::FIND_CALL, key).await
    }

    async fn find_call_locking_batch(&mut self, key: &CallKey) -> Result<Option<Stored>> {
        find(self, Self::FIND_CALL_LOCKING_BATCH, key).await
    }

    async fn load_call(&mut self, rowid: i64) -> Result<Call> {
        let params = [Param::Int(rowid)];
        first(
            self.rows(Run::read(sql::LOAD_CALL, &params), |row| call_from_row(row))
                .await?,
        )
        .ok_or_else(|| Error::Internal(format!("call row {rowid} vanished")))
    }

    async fn resize_batch(&mut self, batch_id: &BatchId, size: usize) -> Result<()> {
        if size == 0 {
            let params = [Param::Text(batch_id.as_str())];
            self.execute(Run::write(sql::DELETE_BATCH, &params)).await?;
        } else {
            let params = [Param::Int(size as i64), Param::Text(batch_id.as_str())];
            self.execute(Run::write(sql::RESIZE_BATCH, &params)).await?;
        }
        Ok(())
    }

    async fn insert_call(
        &mut self,
        batch: &NewBatch,
        at: Placement<'_>,
        call: &NewCall,
        now: Timestamp,
        decided: Option<&Outcome>,
    ) -> Result<Option<i64>> {
        let Placement {
            batch_id,
            position,
            new_batch,
        } = at;
        // A new batch's row goes in the call's statement where the backend has one that takes
        // it (its `on_deny` and `size` last); elsewhere it is inserted first, alone.
        let with_batch = Self::INSERT_CALL_WITH_BATCH.zip(new_batch);
        let on_deny = Param::Int(batch.on_deny.as_i64());
        if with_batch.is_none()
            && let Some(size) = new_batch
        {
            let params = [
                Param::Text(batch_id.as_str()),
                Param::Text(batch.agent.as_str()),
                Param::Text(batch.session.as_str()),
                on_deny,
                Param::Int(size as i64),
                Param::Int(now.as_micros()),
            ];
            self.execute(Run::write(sql::INSERT_BATCH, &params)).await?;
        }
        let call = [
            Param::Text(batch.agent.as_str()),
            Param::Text(batch.session.as_str()),
            Param::Text(call.call_id.as_str()),
            Param::Text(batch_id.as_str()),
            Param::Int(position as i64),
            Param::Text(call.tool.as_str()),
            Param::Text(call.input.as_str()),
            Param::Text(&call.title),
            Param::Text(&call.message),
            Param::Text(&call.workspace),
            Param::OptText(call.supersede_key.as_deref()),
            Param::OptInt(call.deadline.map(Timestamp::as_micros)),
            Param::Int(now.as_micros()),
            Param::OptText((!call.requested_by.is_empty()).then_some(&call.requested_by)),
            Param::OptText(call.host.map(Host::as_str)),
        ];
        let statement = match (with_batch, decided) {
            (None, None) => Self::INSERT_CALL,
            (None, Some(_)) => Self::INSERT_DECIDED_CALL,
            (Some(([pending, _], _)), None) => pending,
            (Some(([_, decided], _)), Some(_)) => decided,
        };
        let decided_by = decided.map(|outcome| outcome.decided_by.to_string());
        let outcome = decided
            .zip(decided_by.as_deref())
            .map(|(outcome, by)| outcome_params(outcome, by, Self::STORES_UNEDITED_INPUT_TO_RUN));
        let batch_row = with_batch.map(|(_, size)| [on_deny, Param::Int(size as i64)]);
        let params: Vec<Param<'_>> = call
            .into_iter()
            .chain(outcome.into_iter().flatten())
            .chain(batch_row.into_iter().flatten())
            .collect();
        Ok(first(self.rows(Run::write(statement, &params), id).await?))
    }

    async fn resolve(&mut self, rowid: i64, outcome: &Outcome) -> Result<Option<Resolved>> {
        resolve_as(self, rowid, outcome, None, false).await
    }

    async fn resolve_read(
        &mut self,
        rowid: i64,
        call: &Call,
        outcome: &Outcome,
        last_in_batch: bool,
    ) -> Result<Option<Resolved>> {
        let stored = call.clone().with_outcome(outcome.clone());
        resolve_as(self, rowid, outcome, Some(&stored), last_in_batch).await
    }

    async fn record_outcome(&mut self, rowid: i64, stored: &Call) -> Result<Resolved> {
        let Some(outcome) = &stored.outcome else {
            return Err(Error::Internal(format!(
                "call row {rowid} was stored without an outcome to record"
            )));
        };
        let event = self.append_event(&resolved_event(rowid, outcome)).await?;
        let batch_id = stored.batch_id.as_str().to_owned();
        outcome_written(self, rowid, (batch_id, event), Some(stored)).await
    }

    async fn pending_in_session(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
    ) -> Result<Vec<Stored>> {
        let params = [Param::Text(agent.as_str()), Param::Text(session.as_str())];
        self.rows(Run::read(sql::PENDING_IN_SESSION, &params), |row| {
            stored(row)
        })
        .await
    }

    async fn pending_of_agent(&mut self, agent: &AgentId, at_most: u64) -> Result<u64> {
        let params = [Param::Text(agent.as_str()), Param::Int(at_most as i64)];
        let n = first(
            self.rows(Run::read(sql::PENDING_OF_AGENT, &params), |row| {
                row.int("n")
            })
            .await?,
        );
        Ok(n.unwrap_or(0) as u64)
    }

    async fn pending_with_key(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
        key: &str,
    ) -> Result<Vec<i64>> {
        let params = [
            Param::Text(agent.as_str()),
            Param::Text(session.as_str()),
            Param::Text(key),
        ];
        self.rows(Run::read(sql::PENDING_WITH_KEY, &params), id)
            .await
    }

    async fn pending_in_batch(&mut self, batch: &BatchId) -> Result<Vec<i64>> {
        let params = [Param::Text(batch.as_str())];
        self.rows(Run::read(sql::PENDING_IN_BATCH, &params), id)
            .await
    }

    async fn calls_of_batch(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
        batch: &BatchId,
    ) -> Result<Vec<Stored>> {
        let params = [
            Param::Text(batch.as_str()),
            Param::Text(agent.as_str()),
            Param::Text(session.as_str()),
        ];
        self.rows(Run::read(sql::CALLS_OF_BATCH, &params), |row| stored(row))
            .await
    }

    async fn on_deny(&mut self, batch: &BatchId) -> Result<OnDeny> {
        let params = [Param::Text(batch.as_str())];
        let on_deny = first(
            self.rows(Run::read(sql::ON_DENY, &params), |row| row.int("on_deny"))
                .await?,
        );
        on_deny
            .map(OnDeny::from_i64)
            .ok_or_else(|| Error::Internal(format!("batch `{}` vanished", batch.as_str())))
    }

    async fn due_calls(&mut self, now: Timestamp, limit: i64) -> Result<Vec<(i64, String)>> {
        // No row lock here: batches are locked first (see `operations::tx`), and the conditional update
        // leaves a call another writer expired first alone.
        let params = [Param::Int(now.as_micros()), Param::Int(limit)];
        self.rows(Run::read(sql::DUE_CALLS, &params), |row| {
            Ok((row.int("id")?, row.text("batch_id")?))
        })
        .await
    }

    async fn start_escalation(&mut self, rowid: i64, escalation: &Escalation) -> Result<()> {
        let ladder = escalation.ladder.to_stored();
        let params = [
            Param::Text(&ladder),
            Param::OptInt(escalation.next_at.map(Timestamp::as_micros)),
            Param::Int(rowid),
        ];
        self.execute(Run::write(sql::START_ESCALATION, &params))
            .await?;
        Ok(())
    }

    async fn due_steps(&mut self, now: Timestamp, limit: i64) -> Result<Vec<Stored>> {
        // No row lock here, as for `due_calls`: the conditional update in `fire_step` leaves a
        // step another writer fired (or a call it decided) alone.
        let params = [Param::Int(now.as_micros()), Param::Int(limit)];
        self.rows(Run::read(sql::DUE_STEPS, &params), |row| stored(row))
            .await
    }

    async fn fire_step(
        &mut self,
        rowid: i64,
        step: u32,
        kind: EventKind,
        next_at: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<bool> {
        let params = [
            Param::Int(i64::from(step) + 1),
            Param::OptInt(next_at.map(Timestamp::as_micros)),
            Param::Int(rowid),
            Param::Int(i64::from(step)),
        ];
        if self
            .execute(Run::write(sql::ADVANCE_ESCALATION, &params))
            .await?
            == 0
        {
            return Ok(false);
        }
        let event = [
            Param::Int(kind.code()),
            Param::Int(rowid),
            Param::Int(now.as_micros()),
            Param::Int(i64::from(step)),
        ];
        self.execute(Run::write(sql::APPEND_STEP_EVENT, &event))
            .await?;
        Ok(true)
    }

    async fn route_call(&mut self, rowid: i64, requirement: &Requirement) -> Result<()> {
        let requirement = requirement.to_stored();
        let params = [Param::Text(&requirement), Param::Int(rowid)];
        self.execute(Run::write(sql::ROUTE_CALL, &params)).await?;
        Ok(())
    }

    async fn record_votes(
        &mut self,
        rowid: i64,
        approval: &Approval,
        now: Timestamp,
        announce: bool,
    ) -> Result<bool> {
        let votes = approval.votes_to_stored();
        let params = [Param::Text(&votes), Param::Int(rowid)];
        if self.execute(Run::write(sql::RECORD_VOTES, &params)).await? == 0 {
            return Ok(false);
        }
        if !announce {
            return Ok(true);
        }
        let event = [
            Param::Int(EventKind::ApprovalRecorded.code()),
            Param::Int(rowid),
            Param::Int(now.as_micros()),
        ];
        self.execute(Run::write(sql::RECORD_EVENT, &event)).await?;
        Ok(true)
    }

    async fn complete_batch_if_done(&mut self, batch_id: &str, event: i64) -> Result<()> {
        SqlTx::complete_batch(self, batch_id, event).await
    }

    fn statements_written(&self) -> Option<u64> {
        SqlTx::statements_written(self)
    }

    /// A later write of a group reads the policy version again: on Postgres another replica may
    /// have changed rules or grants since the group's first write read it.
    fn next_write(&mut self, alone: bool) {
        if let Some(view) = self.policy_view() {
            view.next_write();
        }
        SqlTx::next_write(self, alone);
    }

    async fn commit(self) -> Result<()> {
        SqlTx::commit(self).await
    }
}

#[async_trait]
impl<T: SqlTx> PolicyTx for T {
    async fn lock_submit(
        &mut self,
        batch: &NewBatch,
        tools: &[&ToolName],
        count_pending_to: Option<u64>,
    ) -> Result<SubmitLocks> {
        SqlTx::lock_submit(self, batch, tools, count_pending_to).await
    }

    async fn lock_policy(
        &mut self,
        agent: &AgentId,
        tools: &[&ToolName],
        exclusive: bool,
    ) -> Result<()> {
        SqlTx::lock_policy(self, agent, tools, exclusive).await
    }

    async fn rules(&mut self) -> Result<Vec<Rule>> {
        let kept = kept_policy(self).await?;
        if let Some((cache, version)) = &kept
            && let Some(rules) = cache.rules(*version)
        {
            return Ok(rules);
        }
        let rules = self
            .rows(Run::read(sql::RULES, &[]), |row| rule_from_row(row))
            .await?;
        if let Some((cache, version)) = kept {
            cache.keep_rules(version, &rules);
        }
        Ok(rules)
    }

    async fn live_grants(
        &mut self,
        agent: &AgentId,
        session: Option<&SessionId>,
        tools: &[&ToolName],
        now: Timestamp,
    ) -> Result<Vec<Grant>> {
        if tools.is_empty() {
            return Ok(Vec::new());
        }
        let mut params = vec![Param::Int(now.as_micros()), Param::Text(agent.as_str())];
        if let Some((cache, version)) = kept_policy(self).await? {
            if let Some(grants) = cache.grants(version, agent, session, tools, now) {
                return Ok(grants);
            }
            // Every tool's, so the next submit of this agent and session, whatever its tools,
            // reads none.
            params.extend(session.map(|session| Param::Text(session.as_str())));
            let statement = match session {
                Some(_) => sql::AGENT_SESSION_GRANTS,
                None => sql::AGENT_GRANTS,
            };
            let grants = self
                .rows(Run::read(statement, &params), |row| grant_from_row(row))
                .await?;
            cache.keep_grants(version, agent, session, now, &grants);
            return Ok(policy_cache::of_tools(&grants, tools, now));
        }
        params.extend(tools.iter().map(|tool| Param::Text(tool.as_str())));
        params.extend(session.map(|session| Param::Text(session.as_str())));
        let statement = sql::live_grants(tools.len(), session.is_some());
        self.rows(Run::read(&statement, &params), |row| grant_from_row(row))
            .await
    }

    async fn insert_grant(&mut self, spec: &GrantSpec) -> Result<Grant> {
        policy_changed(self);
        let (session, workspace) = match &spec.scope {
            GrantScope::Session(s) => (Some(s.as_str()), None),
            GrantScope::Workspace(w) => (None, Some(w.as_str())),
            GrantScope::Always => (None, None),
        };
        let matcher = spec.matcher.to_json().to_string();
        let authors = Person::list_to_stored(&spec.authors);
        let params = [
            Param::Text(spec.agent.as_str()),
            Param::Int(spec.scope.scope().code()),
            Param::OptText(session),
            Param::OptText(workspace),
            Param::Text(spec.tool.as_str()),
            Param::Text(&matcher),
            Param::Int(spec.effect.code()),
            Param::Text(&spec.created_by),
            Param::Int(spec.created_at.as_micros()),
            Param::OptInt(spec.expires_at.map(Timestamp::as_micros)),
            Param::Text(spec.source.session.as_str()),
            Param::Text(spec.source.call_id.as_str()),
            Param::Text(&spec.reason),
            Param::Text(&authors),
            Param::OptText(spec.kind.map(Kind::as_str)),
        ];
        let id = first(
            self.rows(Run::write(sql::INSERT_GRANT, &params), id)
                .await?,
        )
        .ok_or_else(|| Error::Internal("a grant insert returned no id".into()))?;
        Ok(Grant {
            id,
            spec: spec.clone(),
            revoked_at: None,
            revoked_by: None,
        })
    }

    async fn grant_from_call(&mut self, key: &CallKey) -> Result<Option<Grant>> {
        let params = [
            Param::Text(key.agent.as_str()),
            Param::Text(key.session.as_str()),
            Param::Text(key.call_id.as_str()),
        ];
        let grants = self
            .rows(Run::read(sql::GRANT_FROM_CALL, &params), |row| {
                grant_from_row(row)
            })
            .await?;
        Ok(first(grants))
    }

    async fn grants_named(&mut self, target: &RevokeTarget, now: Timestamp) -> Result<Vec<Grant>> {
        match sql::grants_named(target) {
            GrantsNamed::Id(id) => {
                let params = [Param::Int(id)];
                self.rows(Run::read(sql::GRANT_BY_ID, &params), |row| {
                    grant_from_row(row)
                })
                .await
            }
            GrantsNamed::Active(statement, agent, value) => {
                let params = [
                    Param::Text(agent.as_str()),
                    Param::Text(value),
                    Param::Int(now.as_micros()),
                ];
                self.rows(Run::read(statement, &params), |row| grant_from_row(row))
                    .await
            }
        }
    }

    async fn revoke(&mut self, ids: &[i64], by: &str, now: Timestamp) -> Result<Vec<Grant>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        policy_changed(self);
        let mut params = vec![Param::Int(now.as_micros()), Param::Text(by)];
        params.extend(ids.iter().map(|id| Param::Int(*id)));
        let statement = sql::revoke(ids.len());
        let mut grants = self
            .rows(Run::write(&statement, &params), |row| grant_from_row(row))
            .await?;
        grants.sort_by_key(|g| g.id);
        Ok(grants)
    }

    async fn pending_in_scope(
        &mut self,
        agent: &AgentId,
        tool: Option<&ToolName>,
        scope: &GrantScope,
    ) -> Result<Vec<Stored>> {
        let (statement, value) = sql::pending_in_scope(scope, tool.is_none());
        let mut params = vec![Param::Text(agent.as_str())];
        params.extend(tool.map(|tool| Param::Text(tool.as_str())));
        params.extend(value.map(Param::Text));
        self.rows(Run::read(statement, &params), |row| stored(row))
            .await
    }

    async fn find_rule(&mut self, id: &RuleId) -> Result<Option<Rule>> {
        let params = [Param::Text(id.as_str())];
        Ok(first(
            self.rows(Run::read(sql::FIND_RULE, &params), |row| rule_from_row(row))
                .await?,
        ))
    }

    async fn insert_rule(&mut self, rule: &Rule) -> Result<bool> {
        policy_changed(self);
        let matcher = rule.matcher.to_json().to_string();
        let escalation = rule.escalation.to_stored();
        let params = [
            Param::Text(rule.id.as_str()),
            Param::Text(rule.tool.as_str()),
            Param::Text(&matcher),
            Param::Int(rule.effect.code()),
            Param::Int(i64::from(rule.priority)),
            Param::Text(&rule.description),
            Param::Text(rule.source.as_str()),
            Param::Int(rule.created_at.as_micros()),
            Param::Int(rule.mode.code()),
            Param::Text(&escalation),
            Param::OptText(rule.kind.map(Kind::as_str)),
        ];
        let inserted = self.execute(Run::write(sql::INSERT_RULE, &params)).await? == 1;
        if inserted && let Some(approvers) = &rule.approvers {
            let stored = approvers.to_json().to_string();
            let params = [Param::Text(&stored), Param::Text(rule.id.as_str())];
            self.execute(Run::write(sql::SET_RULE_APPROVERS, &params))
                .await?;
        }
        Ok(inserted)
    }

    async fn delete_rule(&mut self, id: &RuleId) -> Result<bool> {
        policy_changed(self);
        let params = [Param::Text(id.as_str())];
        let deleted = self.execute(Run::write(sql::DELETE_RULE, &params)).await?;
        Ok(deleted == 1)
    }

    async fn set_rule_mode(&mut self, id: &RuleId, mode: RuleMode) -> Result<bool> {
        policy_changed(self);
        let params = [Param::Int(mode.code()), Param::Text(id.as_str())];
        let changed = self
            .execute(Run::write(sql::SET_RULE_MODE, &params))
            .await?;
        Ok(changed == 1)
    }

    async fn record_shadow_verdicts(
        &mut self,
        rowid: i64,
        verdicts: &[ShadowVerdict],
    ) -> Result<()> {
        for verdict in verdicts {
            let params = [
                Param::Int(rowid),
                Param::Text(verdict.rule.as_str()),
                Param::Int(verdict.verdict.code()),
            ];
            self.execute(Run::write(sql::INSERT_SHADOW_VERDICT, &params))
                .await?;
        }
        Ok(())
    }

    async fn delete_file_rules(&mut self) -> Result<()> {
        policy_changed(self);
        // Replicas starting at once load their files one after the other (submits, which only
        // read rules, are not held up).
        self.lock_rules().await?;
        let params = [Param::Text(RuleSource::File.as_str())];
        self.execute(Run::write(sql::DELETE_RULES_FROM, &params))
            .await?;
        Ok(())
    }
}

/// The receipt chain's head as stored (see [`SqlTx::chain_head`]).
pub async fn read_chain_head<T: SqlTx + ?Sized>(tx: &mut T) -> Result<Option<(u64, String)>> {
    let head = first(
        tx.rows(Run::read(T::CHAIN_HEAD, &[]), |row| {
            Ok((row.int("seq")?, row.opt_text("digest")?))
        })
        .await?,
    );
    Ok(match head {
        Some((seq, Some(digest))) if seq > 0 => Some((seq as u64, digest)),
        _ => None,
    })
}

/// A receipt asked of a call that has no outcome: a bug, never the client's.
pub fn no_outcome(call: &Call) -> Error {
    Error::Internal(format!(
        "call {}/{}/{} has no outcome to sign",
        call.key.agent.as_str(),
        call.key.session.as_str(),
        call.key.call_id.as_str()
    ))
}

/// Before a transaction changes rules or grants: from then on it reads the tables, which hold its
/// own change, and keeps nothing it reads (the change might roll back).
fn policy_changed(tx: &mut impl SqlTx) {
    if let Some(view) = tx.policy_view() {
        view.changed();
    }
}

/// The process's copy of rules and grants, and the policy version this transaction reads it at
/// (read now if this is its first policy read); `None` where it reads the tables.
async fn kept_policy(tx: &mut impl SqlTx) -> Result<Option<(Arc<PolicyCache>, i64)>> {
    let Some((cache, seen)) = tx.policy_view().and_then(|view| view.usable()) else {
        return Ok(None);
    };
    if let Some(version) = seen {
        return Ok(Some((cache, version)));
    }
    let version = first(
        tx.rows(Run::read(sql::POLICY_VERSION, &[]), |row| {
            row.int("version")
        })
        .await?,
    )
    .ok_or_else(|| Error::Internal("the policy version row is missing".into()))?;
    if let Some(view) = tx.policy_view() {
        view.read(version);
    }
    Ok(Some((cache, version)))
}

/// How the parts of the store written once for both backends (rules and grants, passkeys,
/// webhook endpoints, Web Push subscriptions, Slack messages: `store::policies`, `passkeys`,
/// `webhooks`, `push`, `slack`) reach a backend: work over its [`SqlTx`], run where the backend
/// runs its writes. What the backends do differently is in [`SqlTx`] ([`SqlTx::REPLICAS`]) and
/// here.
///
/// `work` takes the transaction and commits it (dropped uncommitted, it rolls back), as the
/// operations do.
#[async_trait]
pub trait Transact: super::Backend {
    type Tx: SqlTx + 'static;

    /// Runs `work` in a transaction of its own: all of it or nothing.
    async fn transaction<T, W, F>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        W: FnOnce(Self::Tx) -> F + Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static;

    /// Runs `work`, whose statements need not be all or nothing (one statement; a write and
    /// its read back), each committed as it runs where that saves round trips: Postgres runs
    /// them on one pooled connection, in autocommit. SQLite writes in transactions only, on its
    /// one writer, so there it is [`Self::transaction`].
    async fn statements<T, W, F>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        W: FnOnce(Self::Tx) -> F + Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        self.transaction(work).await
    }

    /// Runs `work` in a transaction that reads what a submit beginning now would, and writes
    /// nothing (Explain): SQLite's on the one writer, between writes; Postgres's one snapshot.
    async fn snapshot<T, W, F>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        W: FnOnce(Self::Tx) -> F + Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static;
}
