//! The Postgres backend: any number of broker replicas on one database behave as one broker.
//!
//! Writers run concurrently, so the primitives lock what the rules in `operations::tx` need: the
//! session (an advisory lock) for submits, the batch rows for batch completion; outcomes are
//! written by conditional updates, so the first decision wins across replicas. A statement costs
//! a round trip and a backend's wake-up whatever it does, so where several always follow each
//! other they are one: a submit's locks and first reads (`lock_submit`), a call with its new
//! batch and its event, and a plain approval, whole (`approve_at_once`).
//!
//! Event order: an event's `id` is taken when its transaction writes it, but transactions can
//! commit out of `id` order, so `id` cannot be the sequence subscribers resume from (a reader
//! that passed id 8 would skip id 7 committing later). Instead, the *sequencer* assigns `seq`
//! to committed events, under an advisory lock so one sequencer runs at a time, each numbering
//! after the last: `seq` follows commit order, and a reader that has seen `seq` N has seen every
//! event numbered below N. A run is one statement, a function (migration 0011), so one round
//! trip. Any replica may run it; after numbering it sends a NOTIFY, which the other replicas
//! treat as a hint to read (a lost notification only delays an event: each replica also polls).
//!
//! Under `--postgres-group-commit`, submits, decisions and cancels are group-committed
//! (`operations::tx`, as on SQLite): one task per replica runs the writes queued meanwhile in one
//! transaction, and that transaction numbers its events itself, last, under the sequencer's lock
//! held through its commit, so it needs no sequencing transaction after it. Numbers are still
//! taken in commit order: the lock is held until the numbers are visible, and the next holder
//! numbers after them. Numbering inside every write's own transaction was measured and rejected
//! (every commit of every replica queued behind one lock; docs/benchmarks-notes.md), and so were
//! several group writers per replica (their groups queue at that lock the same way). Without
//! the switch, and for the other writes (expiry, escalation, policy changes), each write has a
//! transaction of its own and the sequencer runs after it.

mod lifecycle;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgArguments;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres, Row};
use tokio::task::JoinHandle;

use super::health::Watch;
use super::policy_cache::{PolicyCache, PolicyView};
use super::primitives::{Decode, Param, Resolution, Run, SqlTx, Transact};
use super::reads::{BackendReads, Reads};
use super::receipt_rows;
use super::rows::call_from_row;
use super::statements as sql;
use super::{Backend, Calls, Deadlines, EventLog, RemoteCommits};
use crate::domain::policy::Gate;
use crate::domain::{
    AgentId, Call, CallKey, CancelReport, CancelTarget, DecideReport, DecidedBy, Decision, Event,
    NewBatch, SubmitReport, Timestamp, ToolInput, ToolName, ToolResultTexts, Verdict,
};
use crate::error::{Error, Result};
use crate::observe::meters;
use crate::operations::Writes;
use crate::operations::tx::{GroupCommit, Job};
use crate::operations::{SubmitLocks, Transactions, cancel, decide, escalate, expire, submit};
use crate::receipts::Notary;

/// How many connections read the event log, beside the pool. They keep one plan per statement
/// (`plan_cache_mode = force_generic_plan`): the log's read (`events after seq N`, a join of
/// three tables and a subquery) is read by every replica after every commit it learns of, and
/// Postgres, left to choose, plans it anew for every N, since a plan made for an N near the end
/// of the log looks cheaper than one made for any N. That planning was a tenth of Postgres's CPU
/// at 8 agents; the one plan (the `seq` index, then each row's call, batch and outcome by key)
/// is the one made for every N anyway, whatever the statistics when it is made (the outcome is a
/// subquery for that: `statements::call_columns`).
const LOG_CONNECTIONS: u32 = 2;

/// How many events one transaction of [`Store::sequence_events`] numbers at most.
const SEQUENCER_CHUNK: i64 = 10_000;

pub struct PostgresStore {
    pool: PgPool,
    /// Reads outside write transactions, on the same pool.
    reads: BackendReads,
    /// The event log's reads, on connections of their own (see [`LOG_CONNECTIONS`]).
    log: BackendReads,
    /// The sequencer, as this replica runs it (alone, and at the end of its groups).
    numbering: Arc<Numbering>,
    texts: ToolResultTexts,
    remote_commits: Arc<RemoteCommits>,
    listener: JoinHandle<()>,
    /// This replica's copy of rules and grants (see `policy_cache`).
    policy: Arc<PolicyCache>,
    /// What every outcome's receipt is signed with; `None` when receipts are off.
    notary: Option<Arc<Notary>>,
    /// Submits, decisions and cancels, group-committed by this replica's writer task, under
    /// `--postgres-group-commit`; `None`: each in a transaction of its own.
    group: Option<GroupCommit<Job>>,
    /// Storage health, told by the reads and every `PgTx`, and here by the statements this
    /// store runs outside both (the probe, the sequencer, the one-statement approval).
    health: Watch,
}

/// Where a group's transactions come from: the pool, with the replica's policy copy and receipt
/// key, each transaction numbering its own events before it commits.
struct GroupWriter {
    pool: PgPool,
    policy: Arc<PolicyCache>,
    notary: Option<Arc<Notary>>,
    numbering: Arc<Numbering>,
    health: Watch,
}

/// The sequencer, one statement (migrations 0011 and 0016's function `number_events`), with
/// what it tells the other replicas when it numbered something.
struct Numbering {
    /// The NOTIFY channel of this database schema.
    channel: String,
    /// This replica's (this store's) name, which the NOTIFY its sequencer sends begins with (then
    /// a space and the last number it gave), so its listener can tell its own notifications from
    /// the other replicas'.
    replica: String,
}

impl Numbering {
    /// Takes the sequencer's lock, then, in a statement whose snapshot sees the previous
    /// holder's commit, numbers up to `at_most` events without a number (`None`: all) after the
    /// last number, and notifies the other replicas if it numbered any; returns how many. On
    /// the pool it is a transaction of its own; run last in a group's transaction, the lock is
    /// held through that commit.
    async fn run<'e>(&self, on: impl sqlx::PgExecutor<'e>, at_most: Option<i64>) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT number_events($1, $2, $3) AS numbered")
                .bind(at_most)
                .bind(&self.channel)
                .bind(&self.replica)
                .fetch_one(on)
                .await?,
        )
    }
}

#[async_trait]
impl Transactions for GroupWriter {
    type Tx = PgTx;

    async fn begin_write(&self) -> Result<PgTx> {
        let begun = self.pool.begin().await.map_err(Error::from);
        let begun = Conn::Tx(self.health.seen(begun)?);
        let mut tx = PgTx::new(begun, &self.policy, self.notary.clone(), &self.health);
        tx.numbering = Some(Arc::clone(&self.numbering));
        Ok(tx)
    }
}

/// The reads both backends answer alike are the shared ones (see `store::Backend`).
impl Backend for PostgresStore {
    fn reads(&self) -> &BackendReads {
        &self.reads
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://...`), applies the migrations under
    /// `migrations/postgres` (serialised across replicas by sqlx's migration lock), and starts
    /// listening for other replicas' commits.
    /// Every outcome written through it is signed by `notary`, if given. Its storage health is
    /// told nobody.
    pub async fn open(
        url: &str,
        max_connections: u32,
        group_commit: bool,
        texts: ToolResultTexts,
        notary: Option<Arc<Notary>>,
    ) -> Result<Self> {
        let health = Watch::default();
        Self::open_watched(url, max_connections, group_commit, texts, notary, health).await
    }

    /// [`Self::open`], telling `health` how the storage does (see `store::health`).
    pub async fn open_watched(
        url: &str,
        max_connections: u32,
        group_commit: bool,
        texts: ToolResultTexts,
        notary: Option<Arc<Notary>>,
        health: Watch,
    ) -> Result<Self> {
        let replica = uuid::Uuid::new_v4().simple().to_string();
        let options: PgConnectOptions = url.parse()?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(2))
            .connect_with(options.clone())
            .await?;
        let log = PgPoolOptions::new()
            .max_connections(LOG_CONNECTIONS)
            .connect_lazy_with(options.options([("plan_cache_mode", "force_generic_plan")]));
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&pool)
            .await?;
        let numbering = Arc::new(Numbering {
            channel: format!("approvals_events_{schema}"),
            replica,
        });
        let remote_commits: Arc<RemoteCommits> = Arc::default();
        let listener = tokio::spawn(listen(
            pool.clone(),
            Arc::clone(&numbering),
            Arc::clone(&remote_commits),
        ));
        let policy: Arc<PolicyCache> = Arc::default();
        let group = group_commit.then(|| {
            GroupCommit::spawn(
                GroupWriter {
                    pool: pool.clone(),
                    policy: Arc::clone(&policy),
                    notary: notary.clone(),
                    numbering: Arc::clone(&numbering),
                    health: health.clone(),
                },
                texts.clone(),
            )
        });
        Ok(Self {
            reads: BackendReads::Postgres(Reads::new(pool.clone(), health.clone())),
            log: BackendReads::Postgres(Reads::new(log, health.clone())),
            pool,
            numbering,
            texts,
            remote_commits,
            listener,
            policy,
            notary,
            group,
            health,
        })
    }

    /// A transaction on the pool, with this replica's policy copy and receipt key.
    async fn begin(&self) -> Result<PgTx> {
        let begun = self.pool.begin().await.map_err(Error::from);
        let begun = Conn::Tx(self.health.seen(begun)?);
        let notary = self.notary.clone();
        Ok(PgTx::new(begun, &self.policy, notary, &self.health))
    }

    /// A connection of the pool whose statements each commit as they run (autocommit), as a
    /// [`PgTx`] (see [`Transact::statements`]).
    async fn autocommit(&self) -> Result<PgTx> {
        let conn = self.pool.acquire().await.map_err(Error::from);
        let conn = Conn::Autocommit(self.health.seen(conn)?);
        let notary = self.notary.clone();
        Ok(PgTx::new(conn, &self.policy, notary, &self.health))
    }

    /// Runs the sequencer for a reader other than the event pump, and wakes the pump if it
    /// numbered anything: the pump ignores this replica's own notifications, and the events may
    /// be another replica's, whose sequencer then finds nothing to number or announce.
    async fn sequence_for_reader(&self) -> Result<()> {
        if self.sequence_events().await? > 0 {
            self.remote_commits.announce(None);
        }
        Ok(())
    }

    /// See [`EventLog::sequence_events`]: the sequencer's runs, outside any `PgTx`.
    async fn number_committed(&self) -> Result<u64> {
        // Groups number their own events: most often nothing is left to number, which one read
        // (of a partial index) tells without a transaction or the lock. Its snapshot is taken
        // now, so an event committed before this call and still unnumbered is seen. Without
        // groups every write leaves events to number, and the read would only add a round trip.
        if self.group.is_some() {
            let unnumbered: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM events WHERE seq IS NULL)")
                    .fetch_one(&self.pool)
                    .await?;
            if !unnumbered {
                return Ok(0);
            }
        }
        let mut total = 0;
        // A chunk per run, until a chunk is not full: every event committed before this call is
        // numbered when it returns (this replica ignores its own notification, which would
        // otherwise have brought it back for the rest). Each run is a transaction of its own,
        // one round trip; it waits for the lock rather than skipping when another holds it, so
        // it sees every event committed before it started.
        loop {
            let numbered = self
                .numbering
                .run(&self.pool, Some(SEQUENCER_CHUNK))
                .await?;
            total += numbered as u64;
            if numbered < SEQUENCER_CHUNK {
                return Ok(total);
            }
        }
    }
}

/// Wakes `remote_commits` on every notification of `numbering.channel` sent by another replica,
/// with how far it numbered, and after every reconnection (notifications sent while the
/// connection was down are lost, so assume there were some). This replica's own notifications
/// are ignored: its pump reads right after numbering, and its other readers wake the pump
/// themselves (`sequence_for_reader`).
async fn listen(pool: PgPool, numbering: Arc<Numbering>, remote_commits: Arc<RemoteCommits>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(error = %err, "cannot open the LISTEN connection; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(err) = listener.listen(&numbering.channel).await {
            tracing::warn!(error = %err, "LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        remote_commits.announce(None);
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    // The sender's name, then how far it numbered (migration 0016; a replica
                    // of the version before names itself only).
                    let payload = notification.payload();
                    let (sender, through) = match payload.split_once(' ') {
                        Some((sender, through)) => (sender, through.parse().ok()),
                        None => (payload, None),
                    };
                    if sender != numbering.replica {
                        remote_commits.announce(through);
                    }
                }
                Ok(None) => {
                    tracing::info!("the LISTEN connection was lost; reconnecting");
                    remote_commits.announce(None);
                }
                Err(err) => {
                    tracing::warn!(error = %err, "the LISTEN connection failed; reconnecting");
                    remote_commits.announce(None);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}

#[async_trait]
impl Transactions for PostgresStore {
    type Tx = PgTx;

    async fn begin_write(&self) -> Result<Self::Tx> {
        self.begin().await
    }
}

#[async_trait]
impl Calls for PostgresStore {
    fn writes(self: Arc<Self>) -> Arc<dyn Writes> {
        self
    }

    async fn probe(&self) -> Result<()> {
        // Taking a transaction id makes the commit write (and flush) a commit record.
        let probed = async {
            let mut tx = self.pool.begin().await?;
            sqlx::query("SELECT txid_current()")
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, Error>(())
        };
        self.health.seen(probed.await)?;
        self.health.wrote();
        Ok(())
    }
}

/// Postgres's writes: the replica's group commit under `--postgres-group-commit`; otherwise each
/// in a transaction of its own, and a plain approval (no receipts) in one statement when the
/// gate allows it ([`PostgresStore::approve_at_once`], below).
#[async_trait]
impl Writes for PostgresStore {
    async fn submit(&self, batch: NewBatch) -> Result<SubmitReport> {
        match &self.group {
            Some(group) => group.submit_queued(batch).await,
            None => submit::submit(self.begin_write().await?, &batch, &self.texts).await,
        }
    }

    async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        if let Some(group) = &self.group {
            return group.decide_queued(key, decision).await;
        }
        if self.notary.is_none() && decide::approves_only(decision) {
            let approved = self.approve_at_once(key, decision).await;
            if let Some(report) = self.health.seen(approved)? {
                self.health.wrote();
                return Ok(report);
            }
        }
        decide::decide(self.begin_write().await?, key, decision, &self.texts).await
    }

    async fn preview_decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        decide::preview(self.begin_write().await?, key, decision, &self.texts).await
    }

    async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport> {
        match &self.group {
            Some(group) => group.cancel_queued(target).await,
            None => cancel::cancel(self.begin_write().await?, target, &self.texts).await,
        }
    }
}

impl PostgresStore {
    /// Writes `decision` (one [`decide::approves_only`] accepts) in one statement, if the call
    /// allows it: the report, or `None` when the decision needs the whole transaction.
    ///
    /// Most decisions approve a call and remember nothing: they write the call's outcome and its
    /// Resolved event, nothing else. In a transaction of their own that is four round trips
    /// (BEGIN, the call read locking its batch, the write, COMMIT), each a wake-up of a Postgres
    /// backend and of the broker whatever the statement does; migration 0022's `approve_call`
    /// runs the same statements, under the same lock, as one autocommit statement.
    ///
    /// Who may approve is judged by the one gate, in Rust, never in SQL: the call is read first
    /// (who submitted it and the requirement fixed on it never change after submit) and
    /// [`Gate::admit`] asked. The function then writes only what needs no other check of
    /// [`decide::decide_in`]: a pending call without a requirement or a ladder, before its
    /// deadline. Anything else (no such call aside) it leaves untouched, and the decision goes
    /// through the whole transaction, which answers it exactly as before (a replay, a refusal, a
    /// vote). So do all decisions while receipts are on: a receipt is signed and chained in the
    /// outcome's transaction.
    async fn approve_at_once(
        &self,
        key: &CallKey,
        decision: &Decision,
    ) -> Result<Option<DecideReport>> {
        let started = Instant::now();
        let stored = sqlx::query(sql::FIND_CALL)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(stored) = stored else {
            return Err(key.not_found());
        };
        let stored = call_from_row(&stored)?;
        let decision = &*decision.against(&stored.input);
        if stored.outcome.is_some()
            || !stored.visible_to(&decision.viewer)
            || Gate::of(&stored)
                .admit(&decision.person(), Verdict::Approve)
                .is_err()
            || stored
                .approval
                .as_ref()
                .is_some_and(|a| a.requirement.needs_passkey())
        {
            // A replay, a hidden call, a refusal, or a vote that needs its passkey checked (in
            // the transaction, with its challenge): the whole transaction answers it.
            return Ok(None);
        }
        let now = Timestamp::now();
        let decided_by = DecidedBy::Approver(decision.approver.clone()).to_string();
        let edited = decision.edited_input.as_ref().map(ToolInput::as_str);
        let row = sqlx::query(sql::APPROVE_CALL)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
            .bind(now.as_micros())
            .bind(&decided_by)
            .bind(&decision.reason)
            .bind(edited)
            .bind(edited.is_some())
            .fetch_one(&self.pool)
            .await?;
        let Some(rowid) = row.try_get::<Option<i64>, _>("call_row")? else {
            return Err(key.not_found());
        };
        if row.try_get::<Option<i64>, _>("resolved_event")?.is_none() {
            return Ok(None);
        }
        meters::committed(1, started.elapsed());
        let call = if row.try_get::<Option<i64>, _>("id")?.is_some() {
            decide::approved(call_from_row(&row)?, decision, &self.texts, now)
        } else {
            // The call committed after the statement's snapshot was taken and before the
            // function found it: what was approved is what is stored now.
            let stored = sqlx::query(sql::LOAD_CALL)
                .bind(rowid)
                .fetch_one(&self.pool)
                .await?;
            call_from_row(&stored)?
        };
        Ok(Some(DecideReport {
            call,
            replayed: false,
            skipped: Vec::new(),
            grant: None,
            decided_by_grant: Vec::new(),
            grant_note: None,
        }))
    }
}

#[async_trait]
impl Deadlines for PostgresStore {
    async fn expire_due(&self, now: Timestamp) -> Result<Vec<Call>> {
        expire::expire_due(self, &self.texts, now).await
    }

    async fn escalate_due(&self, now: Timestamp) -> Result<u64> {
        escalate::escalate_due(self, now).await
    }
}

#[async_trait]
impl EventLog for PostgresStore {
    async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>> {
        self.log.events_after(after, limit).await
    }

    async fn latest_seq(&self) -> Result<u64> {
        // Number what is committed first: "the latest event" must cover every commit so far.
        self.sequence_for_reader().await?;
        self.reads.latest_seq().await
    }

    async fn sequence_events(&self) -> Result<u64> {
        self.health.seen(self.number_committed().await)
    }

    fn remote_commits(&self) -> Option<Arc<RemoteCommits>> {
        Some(Arc::clone(&self.remote_commits))
    }
}

/// The parts written once over `Transact` (rules and grants, webhooks, push, Slack) run on the
/// pool, shared by every replica: in a transaction of their own, or in autocommit.
#[async_trait]
impl Transact for PostgresStore {
    type Tx = PgTx;

    async fn transaction<T, W, F>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        W: FnOnce(PgTx) -> F + Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        work(self.begin().await?).await
    }

    async fn statements<T, W, F>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        W: FnOnce(PgTx) -> F + Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        work(self.autocommit().await?).await
    }

    /// One snapshot of the rules and grants, as a submit's statements would see them.
    async fn snapshot<T, W, F>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        W: FnOnce(PgTx) -> F + Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let mut tx = self.begin().await?;
        let snapshot = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";
        tx.execute(Run::read(snapshot, &[])).await?;
        work(tx).await
    }
}

/// Postgres's transaction (READ COMMITTED), with the locks the rules in `operations::tx` need, what it
/// may use of the replica's policy copy, and the key its outcomes' receipts are signed with.
/// Or, for work whose statements need not be together, a pooled connection in autocommit
/// ([`Transact::statements`]).
pub struct PgTx {
    tx: Conn,
    policy: PolicyView,
    notary: Option<Arc<Notary>>,
    /// How many writing statements ran; `None` once any statement failed, after which Postgres
    /// refuses every further statement of the transaction (so a group must start over).
    written: Option<u64>,
    /// A group's transaction: whom the sequencer it runs before its commit notifies.
    numbering: Option<Arc<Numbering>>,
    /// Storage health: told the failure of any statement or of the commit, and a commit that
    /// changed rows.
    health: Watch,
    /// Rows the statements changed (or returned, where they write).
    changed: u64,
}

/// What a [`PgTx`] runs its statements on.
enum Conn {
    Tx(sqlx::Transaction<'static, Postgres>),
    /// Each statement commits as it runs; the commit has nothing left to do.
    Autocommit(PoolConnection<Postgres>),
}

impl Conn {
    fn on(&mut self) -> &mut PgConnection {
        match self {
            Conn::Tx(tx) => tx,
            Conn::Autocommit(conn) => conn,
        }
    }
}

impl PgTx {
    fn new(
        tx: Conn,
        policy: &Arc<PolicyCache>,
        notary: Option<Arc<Notary>>,
        health: &Watch,
    ) -> Self {
        Self {
            tx,
            policy: PolicyView::new(policy),
            notary,
            written: Some(0),
            numbering: None,
            health: health.clone(),
            changed: 0,
        }
    }

    /// `result` of a statement, counted: a write, or a failure (the transaction is aborted),
    /// which storage health is told.
    fn counted<T>(
        &mut self,
        writes: bool,
        result: std::result::Result<T, sqlx::Error>,
    ) -> Result<T> {
        match result {
            Ok(value) => {
                if writes && let Some(written) = &mut self.written {
                    *written += 1;
                }
                Ok(value)
            }
            Err(err) => {
                self.written = None;
                self.health.seen(Err(err.into()))
            }
        }
    }

    /// Numbers a group's events (see [`Numbering::run`]), then commits.
    async fn commit_now(mut self) -> Result<()> {
        if let Some(numbering) = &self.numbering
            && self.written.is_some_and(|written| written > 0)
        {
            numbering.run(self.tx.on(), None).await?;
        }
        match self.tx {
            Conn::Tx(tx) => Ok(tx.commit().await?),
            Conn::Autocommit(_) => Ok(()),
        }
    }
}

#[async_trait]
impl SqlTx for PgTx {
    const INSERT_CALL: &'static str = sql::INSERT_CALL_AND_EVENT;
    const INSERT_DECIDED_CALL: &'static str = sql::INSERT_DECIDED_CALL_AND_EVENT;
    const INSERT_CALL_WITH_BATCH: Option<[&'static str; 2]> = Some([
        sql::INSERT_BATCH_CALL_AND_EVENT,
        sql::INSERT_BATCH_DECIDED_CALL_AND_EVENT,
    ]);
    const APPEND_EVENT: &'static str = sql::APPEND_EVENT_AT_ID;
    const COMPLETE_BATCH: &'static str = sql::COMPLETE_BATCH_AT_ID;
    /// Events are numbered after they commit (`seq` is given by the sequencer).
    const EVENT_IS_SEQ: bool = false;
    /// Locked: the replicas append to the one chain in turn (see `receipt_rows`).
    const CHAIN_HEAD: &'static str = receipt_rows::CHAIN_HEAD_LOCKED;
    const FIND_CALL_LOCKING_BATCH: &'static str = sql::FIND_CALL_LOCKING_BATCH;
    /// During a rolling update, replicas of a version that reads a NULL as "nothing to run" may
    /// share the database.
    const STORES_UNEDITED_INPUT_TO_RUN: bool = true;
    /// Any number of replicas write the database at once.
    const REPLICAS: bool = true;

    async fn rows<T: Send + 'static>(&mut self, run: Run<'_>, decode: Decode<T>) -> Result<Vec<T>> {
        let rows = bound(run).fetch_all(self.tx.on()).await;
        let rows = self.counted(run.writes, rows)?;
        if run.writes {
            self.changed += rows.len() as u64;
        }
        rows.iter().map(|row| decode(row)).collect()
    }

    async fn execute(&mut self, run: Run<'_>) -> Result<u64> {
        let done = bound(run).execute(self.tx.on()).await;
        let changed = self.counted(run.writes, done)?.rows_affected();
        if run.writes {
            self.changed += changed;
        }
        Ok(changed)
    }

    async fn resolve_call(&mut self, resolution: Resolution<'_>) -> Result<Option<(String, i64)>> {
        // The outcome and its Resolved event (and the batch's completion), in one statement (one
        // round trip).
        let statement = match resolution.completing {
            true => sql::RESOLVE_CALL_COMPLETING_AND_EVENT,
            false => sql::RESOLVE_CALL_AND_EVENT,
        };
        let run = Run::write(statement, resolution.outcome);
        let resolved = self
            .rows(run, |row| Ok((row.text("batch_id")?, row.int("id")?)))
            .await?;
        Ok(resolved.into_iter().next())
    }

    /// The session's lock, the policy locks, the policy version (for this transaction's view of
    /// the policy copy), which of the batch's calls are stored and the pending count, in one call
    /// of migration 0014's `lock_submit`: each read in a snapshot taken after the locks, as
    /// separate statements would be.
    async fn lock_submit(
        &mut self,
        batch: &NewBatch,
        tools: &[&ToolName],
        count_pending_to: Option<u64>,
    ) -> Result<SubmitLocks> {
        let call_ids: Vec<&str> = batch.calls.iter().map(|c| c.call_id.as_str()).collect();
        let locked = sqlx::query(
            "SELECT policy_version, pending, stored FROM lock_submit($1, $2, $3, $4::int8, $5)",
        )
        .bind(batch.agent.as_str())
        .bind(batch.session.as_str())
        .bind(policy_lock_keys(&batch.agent, tools))
        .bind(count_pending_to.map(|n| i64::try_from(n).unwrap_or(i64::MAX)))
        .bind(call_ids)
        .fetch_one(self.tx.on())
        .await;
        let row = self.counted(false, locked)?;
        let version: i64 = row.try_get("policy_version")?;
        let pending: Option<i64> = row.try_get("pending")?;
        let stored: Option<Vec<String>> = row.try_get("stored")?;
        self.policy.read(version);
        Ok(SubmitLocks {
            pending: pending.map(|n| n.max(0) as u64),
            stored: Some(stored.unwrap_or_default()),
        })
    }

    async fn lock_batches(&mut self, batches: &[&str]) -> Result<()> {
        if batches.is_empty() {
            return Ok(());
        }
        // The sort below the lock makes rows lock in batch id order.
        let locked = sqlx::query(
            "SELECT 1 FROM batches WHERE batch_id = ANY($1) ORDER BY batch_id FOR NO KEY UPDATE",
        )
        .bind(batches)
        .execute(self.tx.on())
        .await;
        self.counted(false, locked)?;
        Ok(())
    }

    async fn lock_policy(
        &mut self,
        agent: &AgentId,
        tools: &[&ToolName],
        exclusive: bool,
    ) -> Result<()> {
        let keys = policy_lock_keys(agent, tools);
        if keys.is_empty() {
            return Ok(());
        }
        // `unnest` yields the keys in the array's (sorted) order, locking them one by one.
        let query = if exclusive {
            sqlx::query(
                "SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':policy'), k) \
                 FROM unnest($1::int4[]) AS k",
            )
        } else {
            sqlx::query(
                "SELECT pg_advisory_xact_lock_shared(hashtext(current_schema() || ':policy'), k) \
                 FROM unnest($1::int4[]) AS k",
            )
        };
        let locked = query.bind(&keys).execute(self.tx.on()).await;
        self.counted(false, locked)?;
        Ok(())
    }

    async fn lock_rules(&mut self) -> Result<()> {
        let locked = sqlx::query("LOCK TABLE rules IN EXCLUSIVE MODE")
            .execute(self.tx.on())
            .await;
        self.counted(false, locked)?;
        Ok(())
    }

    fn policy_view(&mut self) -> Option<&mut PolicyView> {
        Some(&mut self.policy)
    }

    fn notary(&self) -> Option<Arc<Notary>> {
        self.notary.clone()
    }

    fn statements_written(&self) -> Option<u64> {
        self.written
    }

    /// A group's transaction numbers its events first, if it wrote any (see [`Numbering::run`]);
    /// the lock it takes for that is released by the commit. A commit that changed rows tells
    /// storage health that writes work.
    async fn commit(self) -> Result<()> {
        let (health, changed) = (self.health.clone(), self.changed);
        health.seen(self.commit_now().await)?;
        if changed > 0 {
            health.wrote();
        }
        Ok(())
    }
}

/// `run`'s statement with its parameters bound.
fn bound<'q>(run: Run<'_>) -> Query<'q, Postgres, PgArguments> {
    let mut query = sqlx::query(sqlx::AssertSqlSafe(run.sql.to_owned()));
    for param in run.params {
        query = match *param {
            Param::Int(value) => query.bind(value),
            Param::OptInt(value) => query.bind(value),
            Param::Text(value) => query.bind(value),
            Param::OptText(value) => query.bind(value),
            Param::Flag(value) => query.bind(value),
        };
    }
    query
}

/// The policy lock keys of (agent, tool) for each of `tools`, sorted, once each: the order
/// every transaction takes them in.
fn policy_lock_keys(agent: &AgentId, tools: &[&ToolName]) -> Vec<i32> {
    let mut keys: Vec<i32> = tools.iter().map(|t| policy_lock_key(agent, t)).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The advisory-lock key of (agent, tool) for [`SqlTx::lock_policy`]: FNV-1a, fixed forever,
/// so every replica (of any version) locks the same key for the same pair.
fn policy_lock_key(agent: &AgentId, tool: &ToolName) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    let bytes = agent
        .as_str()
        .bytes()
        .chain([0x1f])
        .chain(tool.as_str().bytes());
    for byte in bytes {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash as i32
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use testkit::Schema;

    use super::*;
    use crate::domain::{AgentId, NewCall, OnDeny, OutcomeKind, SessionId, Verdict};
    use crate::operations::testing::{AGENT, batch, call, decision, key, texts};

    /// Which approvals the one statement writes, and which it leaves untouched for the whole
    /// transaction (`None`), on a fresh schema of the test database: written where the
    /// transaction would refuse, a refusal would be lost; written nowhere, every approval would
    /// pay for the transaction again, which no other test would notice.
    #[tokio::test]
    #[cfg_attr(
        not(approvals_test_postgres),
        ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
    )]
    async fn one_statement_approves_what_needs_no_other_check_and_nothing_else() {
        let schema = Schema::create(&testkit::postgres_url(), "approval")
            .await
            .unwrap();
        let store = PostgresStore::open(&schema.url(), 2, false, texts(), None)
            .await
            .unwrap();
        let acting = NewCall {
            requested_by: "Carol".into(),
            ..call("acting", "t", "{}")
        };
        let late = NewCall {
            deadline: Some(Timestamp::now().saturating_add(Duration::from_millis(100))),
            ..call("late", "t", "{}")
        };
        let ids = ["plain", "edited", "decided", "own"].map(|id| call(id, "t", r#"{"a":1}"#));
        let mut calls = batch("s", ids.into_iter().chain([acting, late]));
        calls.on_deny = OnDeny::Independent;
        store.submit(calls).await.unwrap();
        let approve = decision(Verdict::Approve, "fine");
        let at_once = async |id: &str, decision: &Decision| {
            store.approve_at_once(&key("s", id), decision).await
        };
        let stored = async |id: &str| {
            let session = SessionId::from_stored("s".into());
            let agent = AgentId::from_stored(AGENT.into());
            let ids = [key("s", id).call_id];
            let read = store.calls_by_id(&agent, &session, &ids).await.unwrap();
            read.into_iter().next().flatten().expect("stored")
        };

        let edited = Decision {
            edited_input: Some(ToolInput::from_stored(r#"{"a":2}"#.into())),
            ..approve.clone()
        };
        for (id, decision) in [("plain", &approve), ("edited", &edited)] {
            let report = at_once(id, decision).await.unwrap().expect("written");
            assert!(!report.replayed);
            let outcome = report.call.outcome.as_ref().expect("decided");
            assert_eq!(outcome.kind, OutcomeKind::Approved);
            assert_eq!(outcome.decided_by, DecidedBy::Approver("approver".into()));
            let runs = decision.edited_input.as_ref().unwrap_or(&report.call.input);
            assert_eq!(outcome.run_input.as_ref(), Some(runs), "{id}");
            assert_eq!(
                outcome.input_edited,
                decision.edited_input.is_some(),
                "{id}"
            );
            // What it answered is what a read gives, field for field (the sequence number is
            // given after commit, by the sequencer, which nothing runs here).
            let read = stored(id).await;
            assert_eq!(read.outcome.as_ref().and_then(|o| o.seq), None);
            assert_eq!(format!("{:?}", report.call), format!("{read:?}"), "{id}");
        }

        // Decided already: a replay, answered by the transaction.
        store.decide(&key("s", "decided"), &approve).await.unwrap();
        assert!(at_once("decided", &approve).await.unwrap().is_none());
        // Its agent or the human it acts for: refused by the transaction.
        let by = |approver: &str| Decision {
            approver: approver.into(),
            ..approve.clone()
        };
        assert!(at_once("own", &by(AGENT)).await.unwrap().is_none());
        assert!(at_once("acting", &by("carol")).await.unwrap().is_none());
        // The gate compares canonical identities: `CAROL` is carol (the edge canonicalises
        // every identity; a stored text from before is compared canonically too).
        assert!(at_once("acting", &by("CAROL")).await.unwrap().is_none());
        // Past its deadline: refused by the transaction.
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(at_once("late", &approve).await.unwrap().is_none());
        let err = at_once("nope", &approve).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);

        for id in ["own", "acting", "late"] {
            assert!(stored(id).await.outcome.is_none(), "{id}: nothing written");
        }
    }
}
