//! The Postgres backend: any number of broker replicas on one database behave as one broker.
//!
//! Writers run concurrently, so the primitives lock what the rules in `writes.rs` need: the
//! session (an advisory lock) for submits, the batch rows for batch completion; outcomes are
//! written by conditional updates, so the first decision wins across replicas.
//!
//! Event order: an event's `id` is taken when its transaction writes it, but transactions can
//! commit out of `id` order, so `id` cannot be the sequence subscribers resume from (a reader
//! that passed id 8 would skip id 7 committing later). Instead, the *sequencer* assigns `seq`
//! to committed events, under an advisory lock so one sequencer runs at a time, each numbering
//! after the last: `seq` follows commit order, and a reader that has seen `seq` N has seen every
//! event numbered below N. Any replica may run it; after numbering it sends a NOTIFY, which the
//! other replicas treat as a hint to read (a lost notification only delays an event: each replica
//! also polls).
//!
//! Numbering inside each write transaction instead (under the same lock, held through the
//! commit) was measured and rejected: it queues every commit of every replica behind one lock;
//! with 8 agents it ran 378 against 454 cycles/s, and doubled submit→ack (docs/benchmarks.md).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::listing::{Listing, call_page, grant_page};
use super::rows::{call_from_row, event_from_row, grant_from_row, rule_from_row, stored};
use super::statements as sql;
use super::{Calls, Deadlines, EventLog, Policies};
use crate::domain::policy::{
    ExplainTarget, Explanation, Grant, GrantScope, GrantSpec, RevokeReport, RevokeTarget, Rule,
    RuleId, RuleSource,
};
use crate::domain::{
    AgentId, BatchId, Call, CallId, CallKey, CallPage, CallQuery, CancelReport, CancelTarget,
    DecideReport, Decision, Event, GrantPage, GrantQuery, NewBatch, NewCall, OnDeny, Outcome,
    SessionId, SubmitReport, Timestamp, ToolInput, ToolName, ToolResultTexts,
};
use crate::error::Result;
use crate::operations::{
    PolicyTx, Resolved, Stored, Transactions, WriteTx, cancel, decide, expire, explain,
    policy_admin, submit,
};

/// How many events one transaction of [`Store::sequence_events`] numbers at most.
const SEQUENCER_CHUNK: i64 = 10_000;

pub struct PostgresStore {
    pool: PgPool,
    /// The NOTIFY channel of this database schema.
    channel: String,
    /// This replica's (this store's) name: the payload of the NOTIFY its sequencer sends, so its
    /// listener can tell its own notifications from the other replicas'.
    replica: String,
    texts: ToolResultTexts,
    remote_commits: Arc<Notify>,
    listener: JoinHandle<()>,
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
    pub async fn open(url: &str, max_connections: u32, texts: ToolResultTexts) -> Result<Self> {
        let replica = uuid::Uuid::new_v4().simple().to_string();
        let options: PgConnectOptions = url.parse()?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(2))
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&pool)
            .await?;
        let channel = format!("approvals_events_{schema}");
        let remote_commits = Arc::new(Notify::new());
        let listener = tokio::spawn(listen(
            pool.clone(),
            channel.clone(),
            replica.clone(),
            Arc::clone(&remote_commits),
        ));
        Ok(Self {
            pool,
            channel,
            replica,
            texts,
            remote_commits,
            listener,
        })
    }

    /// Runs the sequencer for a reader other than the event pump, and wakes the pump if it
    /// numbered anything: the pump ignores this replica's own notifications, and the events may
    /// be another replica's, whose sequencer then finds nothing to number or announce.
    async fn sequence_for_reader(&self) -> Result<()> {
        if self.sequence_events().await? > 0 {
            self.remote_commits.notify_one();
        }
        Ok(())
    }
}

/// Wakes `remote_commits` on every notification of `channel` sent by another replica, and after
/// every reconnection (notifications sent while the connection was down are lost, so assume
/// there were some). This replica's own notifications are ignored: its pump reads right after
/// numbering, and its other readers wake the pump themselves (`sequence_for_reader`).
async fn listen(pool: PgPool, channel: String, replica: String, remote_commits: Arc<Notify>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(error = %err, "cannot open the LISTEN connection; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(err) = listener.listen(&channel).await {
            tracing::warn!(error = %err, "LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        remote_commits.notify_one();
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    if notification.payload() != replica {
                        remote_commits.notify_one();
                    }
                }
                Ok(None) => {
                    tracing::info!("the LISTEN connection was lost; reconnecting");
                    remote_commits.notify_one();
                }
                Err(err) => {
                    tracing::warn!(error = %err, "the LISTEN connection failed; reconnecting");
                    remote_commits.notify_one();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}

#[async_trait]
impl Transactions for PostgresStore {
    type Tx = sqlx::Transaction<'static, Postgres>;

    async fn begin_write(&self) -> Result<Self::Tx> {
        Ok(self.pool.begin().await?)
    }
}

#[async_trait]
impl Calls for PostgresStore {
    async fn submit(&self, batch: NewBatch) -> Result<SubmitReport> {
        submit::submit(self.begin_write().await?, &batch, &self.texts).await
    }

    async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        decide::decide(self.begin_write().await?, key, decision, &self.texts).await
    }

    async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport> {
        cancel::cancel(self.begin_write().await?, target, &self.texts).await
    }

    async fn calls_by_id(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
    ) -> Result<Vec<Option<Call>>> {
        if call_ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows = Listing::<Postgres>::calls_by_id(agent, session, call_ids)
            .build()
            .fetch_all(&self.pool)
            .await?;
        let mut by_id = std::collections::HashMap::new();
        for row in &rows {
            let call = call_from_row(row)?;
            by_id.insert(call.key.call_id.clone(), call);
        }
        // A repeated id gets the same answer each time.
        Ok(call_ids.iter().map(|id| by_id.get(id).cloned()).collect())
    }

    async fn batch_calls(&self, batch: &BatchId) -> Result<Vec<Call>> {
        let rows = sqlx::query(sql::BATCH_CALLS)
            .bind(batch.as_str())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(call_from_row).collect()
    }

    async fn list_calls(&self, q: &CallQuery) -> Result<CallPage> {
        let mut query = Listing::<Postgres>::calls(q);
        call_page(&query.build().fetch_all(&self.pool).await?, q)
    }

    async fn probe(&self) -> Result<()> {
        // Taking a transaction id makes the commit write (and flush) a commit record.
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT txid_current()")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl Deadlines for PostgresStore {
    async fn expire_due(&self, now: Timestamp) -> Result<Vec<Call>> {
        expire::expire_due(self, &self.texts, now).await
    }

    async fn pending_count(&self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(sql::PENDING_COUNT)
            .fetch_one(&self.pool)
            .await?;
        Ok(n as u64)
    }

    async fn next_deadline(&self) -> Result<Option<Timestamp>> {
        let next: Option<i64> = sqlx::query_scalar(sql::NEXT_DEADLINE)
            .fetch_one(&self.pool)
            .await?;
        Ok(next.map(Timestamp::from_micros))
    }
}

#[async_trait]
impl EventLog for PostgresStore {
    async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>> {
        let rows = sqlx::query(sql::EVENTS_AFTER)
            .bind(after as i64)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(event_from_row).collect()
    }

    async fn latest_seq(&self) -> Result<u64> {
        // Number what is committed first: "the latest event" must cover every commit so far.
        self.sequence_for_reader().await?;
        let mut conn = self.pool.acquire().await?;
        latest_seq(&mut conn).await
    }

    async fn sequence_events(&self) -> Result<u64> {
        let mut total = 0;
        // A chunk per transaction, until a chunk is not full: every event committed before
        // this call is numbered when it returns (this replica ignores its own notification,
        // which would otherwise have brought it back for the rest).
        loop {
            let mut tx = self.pool.begin().await?;
            // One sequencer at a time, across every replica of this schema. Waiting (rather than
            // skipping when another holds it) guarantees this run sees every event committed
            // before it started.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':sequencer'))")
                .execute(&mut *tx)
                .await?;
            // In a statement of its own after the lock: in READ COMMITTED its snapshot sees the
            // previous holder's commit, so its numbers come after. If it numbered any, the other
            // replicas are notified at commit, with this replica's name. (`sent` is read only to
            // make it run.)
            let (numbered, _sent): (i64, i64) = sqlx::query_as(
                "WITH base AS (SELECT COALESCE(MAX(seq), 0) AS last FROM events), \
                 next AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM events \
                          WHERE seq IS NULL ORDER BY id LIMIT $1), \
                 numbered AS (UPDATE events e SET seq = base.last + next.n FROM base, next \
                              WHERE e.id = next.id RETURNING 1), \
                 total AS (SELECT count(*) AS n FROM numbered), \
                 sent AS (SELECT pg_notify($2, $3) FROM total WHERE n > 0) \
                 SELECT n, (SELECT count(*) FROM sent) FROM total",
            )
            .bind(SEQUENCER_CHUNK)
            .bind(&self.channel)
            .bind(&self.replica)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            total += numbered as u64;
            if numbered < SEQUENCER_CHUNK {
                return Ok(total);
            }
        }
    }

    fn remote_commits(&self) -> Option<Arc<Notify>> {
        Some(Arc::clone(&self.remote_commits))
    }
}

#[async_trait]
impl Policies for PostgresStore {
    async fn revoke_grants(&self, target: &RevokeTarget, by: &str) -> Result<RevokeReport> {
        policy_admin::revoke_grants(self.begin_write().await?, target, by).await
    }

    async fn list_grants(&self, q: &GrantQuery) -> Result<GrantPage> {
        let mut query = Listing::<Postgres>::grants(q);
        grant_page(&query.build().fetch_all(&self.pool).await?, q)
    }

    async fn create_rule(&self, rule: &Rule) -> Result<Rule> {
        policy_admin::create_rule(self.begin_write().await?, rule).await
    }

    async fn delete_rule(&self, id: &RuleId) -> Result<Rule> {
        policy_admin::delete_rule(self.begin_write().await?, id).await
    }

    async fn list_rules(&self) -> Result<Vec<Rule>> {
        let rows = sqlx::query(sql::RULES).fetch_all(&self.pool).await?;
        rows.iter().map(rule_from_row).collect()
    }

    async fn load_file_rules(&self, rules: &[Rule]) -> Result<()> {
        policy_admin::load_file_rules(self.begin_write().await?, rules).await
    }

    async fn explain(&self, target: &ExplainTarget) -> Result<Explanation> {
        // One snapshot of the rules and grants, as a submit's statements would see them.
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        explain::explain(tx, target).await
    }
}

async fn latest_seq(conn: &mut sqlx::PgConnection) -> Result<u64> {
    let seq: Option<i64> = sqlx::query_scalar(sql::LATEST_SEQ).fetch_one(conn).await?;
    Ok(seq.unwrap_or(0) as u64)
}

/// Postgres's write transaction: READ COMMITTED, with the locks the rules need.
#[async_trait]
impl WriteTx for sqlx::Transaction<'static, Postgres> {
    async fn lock_session(&mut self, agent: &AgentId, session: &SessionId) -> Result<()> {
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':session'), \
             hashtext($1 || chr(31) || $2))",
        )
        .bind(agent.as_str())
        .bind(session.as_str())
        .execute(&mut **self)
        .await?;
        Ok(())
    }

    async fn lock_batches(&mut self, batches: &[&str]) -> Result<()> {
        if batches.is_empty() {
            return Ok(());
        }
        // The sort below the lock makes rows lock in batch id order.
        sqlx::query(
            "SELECT 1 FROM batches WHERE batch_id = ANY($1) ORDER BY batch_id FOR NO KEY UPDATE",
        )
        .bind(batches)
        .execute(&mut **self)
        .await?;
        Ok(())
    }

    async fn find_call(&mut self, key: &CallKey) -> Result<Option<Stored>> {
        let row = sqlx::query(sql::FIND_CALL)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
            .fetch_optional(&mut **self)
            .await?;
        row.as_ref().map(stored).transpose()
    }

    async fn load_call(&mut self, rowid: i64) -> Result<Call> {
        let row = sqlx::query(sql::LOAD_CALL)
            .bind(rowid)
            .fetch_one(&mut **self)
            .await?;
        call_from_row(&row)
    }

    async fn insert_batch(
        &mut self,
        batch_id: &BatchId,
        batch: &NewBatch,
        size: usize,
        now: Timestamp,
    ) -> Result<()> {
        sqlx::query(sql::INSERT_BATCH)
            .bind(batch_id.as_str())
            .bind(batch.agent.as_str())
            .bind(batch.session.as_str())
            .bind(batch.on_deny.as_i64())
            .bind(size as i64)
            .bind(now.as_micros())
            .execute(&mut **self)
            .await?;
        Ok(())
    }

    async fn resize_batch(&mut self, batch_id: &BatchId, size: usize) -> Result<()> {
        let query = if size == 0 {
            sqlx::query(sql::DELETE_BATCH).bind(batch_id.as_str())
        } else {
            sqlx::query(sql::RESIZE_BATCH)
                .bind(size as i64)
                .bind(batch_id.as_str())
        };
        query.execute(&mut **self).await?;
        Ok(())
    }

    async fn insert_call(
        &mut self,
        batch: &NewBatch,
        batch_id: &BatchId,
        position: usize,
        call: &NewCall,
        now: Timestamp,
    ) -> Result<Option<i64>> {
        let rowid: Option<i64> = sqlx::query_scalar(sql::INSERT_CALL_AND_EVENT)
            .bind(batch.agent.as_str())
            .bind(batch.session.as_str())
            .bind(call.call_id.as_str())
            .bind(batch_id.as_str())
            .bind(position as i64)
            .bind(call.tool.as_str())
            .bind(call.input.as_str())
            .bind(&call.title)
            .bind(&call.message)
            .bind(&call.workspace)
            .bind(call.supersede_key.as_deref())
            .bind(call.deadline.map(Timestamp::as_micros))
            .bind(now.as_micros())
            .fetch_optional(&mut **self)
            .await?;
        Ok(rowid)
    }

    async fn resolve(&mut self, rowid: i64, outcome: &Outcome) -> Result<Option<Resolved>> {
        let resolved: Option<(String, i64)> = sqlx::query_as(sql::RESOLVE_CALL_AND_EVENT)
            .bind(outcome.kind.code())
            .bind(outcome.decided_at.as_micros())
            .bind(outcome.decided_by.to_string())
            .bind(&outcome.reason)
            .bind(&outcome.tool_result)
            .bind(outcome.run_input.as_ref().map(ToolInput::as_str))
            .bind(outcome.input_edited)
            .bind(rowid)
            .fetch_optional(&mut **self)
            .await?;
        Ok(resolved.map(|(batch_id, event)| Resolved {
            rowid,
            batch_id,
            event,
        }))
    }

    async fn pending_in_session(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
    ) -> Result<Vec<Stored>> {
        let rows = sqlx::query(sql::PENDING_IN_SESSION)
            .bind(agent.as_str())
            .bind(session.as_str())
            .fetch_all(&mut **self)
            .await?;
        rows.iter().map(stored).collect()
    }

    async fn pending_of_agent(&mut self, agent: &AgentId, at_most: u64) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(sql::PENDING_OF_AGENT)
            .bind(agent.as_str())
            .bind(at_most as i64)
            .fetch_one(&mut **self)
            .await?;
        Ok(n as u64)
    }

    async fn pending_with_key(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
        key: &str,
    ) -> Result<Vec<i64>> {
        Ok(sqlx::query_scalar(sql::PENDING_WITH_KEY)
            .bind(agent.as_str())
            .bind(session.as_str())
            .bind(key)
            .fetch_all(&mut **self)
            .await?)
    }

    async fn pending_in_batch(&mut self, batch: &BatchId) -> Result<Vec<i64>> {
        Ok(sqlx::query_scalar(sql::PENDING_IN_BATCH)
            .bind(batch.as_str())
            .fetch_all(&mut **self)
            .await?)
    }

    async fn calls_of_batch(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
        batch: &BatchId,
    ) -> Result<Vec<Stored>> {
        let rows = sqlx::query(sql::CALLS_OF_BATCH)
            .bind(batch.as_str())
            .bind(agent.as_str())
            .bind(session.as_str())
            .fetch_all(&mut **self)
            .await?;
        rows.iter().map(stored).collect()
    }

    async fn on_deny(&mut self, batch: &BatchId) -> Result<OnDeny> {
        let on_deny: i64 = sqlx::query_scalar(sql::ON_DENY)
            .bind(batch.as_str())
            .fetch_one(&mut **self)
            .await?;
        Ok(OnDeny::from_i64(on_deny))
    }

    async fn due_calls(&mut self, now: Timestamp, limit: i64) -> Result<Vec<(i64, String)>> {
        // No row lock here: batches are locked first (see `writes`), and the conditional update
        // leaves a call another replica expired first alone.
        Ok(sqlx::query_as(sql::DUE_CALLS)
            .bind(now.as_micros())
            .bind(limit)
            .fetch_all(&mut **self)
            .await?)
    }

    async fn complete_batch_if_done(&mut self, batch_id: &str, event: i64) -> Result<()> {
        // The batch row is locked (`lock_batches`; a batch this transaction stored is its own),
        // which orders the transactions resolving calls of this batch; this statement's
        // snapshot, taken after the lock, sees every one that committed before.
        sqlx::query(sql::COMPLETE_BATCH_AT_ID)
            .bind(event)
            .bind(batch_id)
            .execute(&mut **self)
            .await?;
        Ok(())
    }

    async fn commit(self) -> Result<()> {
        Ok(sqlx::Transaction::commit(self).await?)
    }
}

/// The advisory-lock key of (agent, tool) for [`PolicyTx::lock_policy`]: FNV-1a, fixed forever,
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

/// Grants and rules, with the locks `writes` relies on.
#[async_trait]
impl PolicyTx for sqlx::Transaction<'static, Postgres> {
    async fn lock_policy(
        &mut self,
        agent: &AgentId,
        tools: &[&ToolName],
        exclusive: bool,
    ) -> Result<()> {
        let mut keys: Vec<i32> = tools.iter().map(|t| policy_lock_key(agent, t)).collect();
        keys.sort_unstable();
        keys.dedup();
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
        query.bind(&keys).execute(&mut **self).await?;
        Ok(())
    }

    async fn rules(&mut self) -> Result<Vec<Rule>> {
        let rows = sqlx::query(sql::RULES).fetch_all(&mut **self).await?;
        rows.iter().map(rule_from_row).collect()
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
        let statement = sql::live_grants(tools.len(), session.is_some());
        let mut query = sqlx::query(sqlx::AssertSqlSafe(statement))
            .bind(now.as_micros())
            .bind(agent.as_str());
        for tool in tools {
            query = query.bind(tool.as_str());
        }
        if let Some(session) = session {
            query = query.bind(session.as_str());
        }
        let rows = query.fetch_all(&mut **self).await?;
        rows.iter().map(grant_from_row).collect()
    }

    async fn insert_grant(&mut self, spec: &GrantSpec) -> Result<Grant> {
        let (session, workspace) = match &spec.scope {
            GrantScope::Session(s) => (Some(s.as_str()), None),
            GrantScope::Workspace(w) => (None, Some(w.as_str())),
            GrantScope::Always => (None, None),
        };
        let id: i64 = sqlx::query_scalar(sql::INSERT_GRANT)
            .bind(spec.agent.as_str())
            .bind(spec.scope.scope().code())
            .bind(session)
            .bind(workspace)
            .bind(spec.tool.as_str())
            .bind(spec.matcher.to_json().to_string())
            .bind(spec.effect.code())
            .bind(&spec.created_by)
            .bind(spec.created_at.as_micros())
            .bind(spec.expires_at.map(Timestamp::as_micros))
            .bind(spec.source.session.as_str())
            .bind(spec.source.call_id.as_str())
            .bind(&spec.reason)
            .fetch_one(&mut **self)
            .await?;
        Ok(Grant {
            id,
            spec: spec.clone(),
            revoked_at: None,
            revoked_by: None,
        })
    }

    async fn grant_from_call(&mut self, key: &CallKey) -> Result<Option<Grant>> {
        let row = sqlx::query(sql::GRANT_FROM_CALL)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
            .fetch_optional(&mut **self)
            .await?;
        row.as_ref().map(grant_from_row).transpose()
    }

    async fn grants_named(&mut self, target: &RevokeTarget, now: Timestamp) -> Result<Vec<Grant>> {
        let query = match sql::grants_named(target) {
            sql::GrantsNamed::Id(id) => sqlx::query(sql::GRANT_BY_ID).bind(id),
            sql::GrantsNamed::Active(statement, agent, value) => sqlx::query(statement)
                .bind(agent.as_str())
                .bind(value)
                .bind(now.as_micros()),
        };
        let rows = query.fetch_all(&mut **self).await?;
        rows.iter().map(grant_from_row).collect()
    }

    async fn revoke(&mut self, ids: &[i64], by: &str, now: Timestamp) -> Result<Vec<Grant>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql::revoke(ids.len())))
            .bind(now.as_micros())
            .bind(by);
        for id in ids {
            query = query.bind(*id);
        }
        let rows = query.fetch_all(&mut **self).await?;
        let mut grants = rows
            .iter()
            .map(grant_from_row)
            .collect::<Result<Vec<_>>>()?;
        grants.sort_by_key(|g| g.id);
        Ok(grants)
    }

    async fn pending_in_scope(
        &mut self,
        agent: &AgentId,
        tool: &ToolName,
        scope: &GrantScope,
    ) -> Result<Vec<Stored>> {
        let (statement, value) = sql::pending_in_scope(scope);
        let query = sqlx::query(statement)
            .bind(agent.as_str())
            .bind(tool.as_str());
        let query = match value {
            Some(value) => query.bind(value),
            None => query,
        };
        let rows = query.fetch_all(&mut **self).await?;
        rows.iter().map(stored).collect()
    }

    async fn find_rule(&mut self, id: &RuleId) -> Result<Option<Rule>> {
        let row = sqlx::query(sql::FIND_RULE)
            .bind(id.as_str())
            .fetch_optional(&mut **self)
            .await?;
        row.as_ref().map(rule_from_row).transpose()
    }

    async fn insert_rule(&mut self, rule: &Rule) -> Result<bool> {
        let inserted = sqlx::query(sql::INSERT_RULE)
            .bind(rule.id.as_str())
            .bind(rule.tool.as_str())
            .bind(rule.matcher.to_json().to_string())
            .bind(rule.effect.code())
            .bind(i64::from(rule.priority))
            .bind(&rule.description)
            .bind(rule.source.as_str())
            .bind(rule.created_at.as_micros())
            .execute(&mut **self)
            .await?
            .rows_affected();
        Ok(inserted == 1)
    }

    async fn delete_rule(&mut self, id: &RuleId) -> Result<bool> {
        let deleted = sqlx::query(sql::DELETE_RULE)
            .bind(id.as_str())
            .execute(&mut **self)
            .await?
            .rows_affected();
        Ok(deleted == 1)
    }

    async fn delete_file_rules(&mut self) -> Result<()> {
        // Replicas starting at once load their files one after the other (submits, which only
        // read rules, are not held up).
        sqlx::query("LOCK TABLE rules IN EXCLUSIVE MODE")
            .execute(&mut **self)
            .await?;
        sqlx::query(sql::DELETE_RULES_FROM)
            .bind(RuleSource::File.as_str())
            .execute(&mut **self)
            .await?;
        Ok(())
    }
}
