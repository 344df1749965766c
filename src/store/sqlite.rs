//! The SQLite backend: the zero-setup default, one file, one broker process.
//!
//! Writes go through a pool of exactly one connection and begin with `BEGIN IMMEDIATE`, so write
//! transactions are serialised and sequence numbers are assigned in commit order; reads use a
//! separate pool and WAL snapshots. `synchronous=FULL` by default: a commit is on disk before it
//! is acknowledged, even across power loss.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{QueryBuilder, Sqlite};

use super::group_commit::GroupCommit;
use super::rows::{
    call_columns, call_from_row, event_from_row, grant_from_row, rule_from_row, select_calls,
    select_grants, select_rules, stored,
};
use super::writes::{self, PolicyTx, Resolved, Stored, WriteTx, Writer};
use super::{
    CallPage, CallQuery, CancelReport, CancelTarget, Cursor, DecideReport, DecidedByFilter,
    ExplainTarget, Explanation, GrantPage, GrantQuery, RevokeReport, RevokeTarget, Store,
    SubmitReport,
};
use crate::domain::policy::{Grant, GrantScope, GrantSpec, Rule, RuleId, RuleSource};
use crate::domain::{
    AgentId, BatchId, Call, CallId, CallKey, Decision, Event, EventKind, NewBatch, NewCall, OnDeny,
    Outcome, SessionId, Timestamp, ToolInput, ToolName, ToolResultTexts,
};
use crate::error::{Error, Result};

/// SQLite's `synchronous` setting for the database file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit is flushed to disk before it is acknowledged: power-safe (the default).
    #[default]
    Full,
    /// Faster, and safe against a crash of the broker, but a power loss or OS crash may lose
    /// the last acknowledged commits. Not power-safe.
    Normal,
}

impl FromStr for Synchronous {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "full" => Ok(Synchronous::Full),
            "normal" => Ok(Synchronous::Normal),
            other => Err(format!("expected `full` or `normal`, got `{other}`")),
        }
    }
}

const SELECT_CALLS: &str = select_calls!();

/// Both read a batch's pending calls through the index `calls_pending_batch` (migration 0005),
/// never by walking every pending call of the store; a test checks the plans.
const PENDING_IN_BATCH: &str =
    "SELECT id FROM calls WHERE batch_id = ? AND status = 1 ORDER BY position";
const COMPLETE_BATCH_IF_DONE: &str = "UPDATE events SET batch_completed = 1 WHERE seq = ? \
     AND NOT EXISTS (SELECT 1 FROM calls WHERE batch_id = ? AND status = 1)";

pub struct SqliteStore {
    /// Submits, decisions and cancels, group-committed.
    group: GroupCommit,
    /// The one write connection, for what does not go through the group (expiry).
    writer: WritePool,
    reader: SqlitePool,
    texts: ToolResultTexts,
}

/// A write transaction that counts the writing statements it issued, so that a write of a
/// group that fails before changing anything needs no rollback (see `group_commit`).
pub struct SqliteTx {
    tx: sqlx::Transaction<'static, Sqlite>,
    writes: u64,
    /// The rules as this transaction sees them, read once: a group of submits shares one read.
    /// Only this transaction could change them before it ends (it is the only writer), and its
    /// own rule changes drop the copy.
    rules: Option<Vec<Rule>>,
}

/// The pool of the one write connection: a writer is whoever holds it.
#[derive(Clone)]
struct WritePool(SqlitePool);

impl SqliteStore {
    /// Opens (creating if needed) the database at `url` (`sqlite://path`, `sqlite:path` or a
    /// plain path) and applies the migrations under `migrations/sqlite`.
    pub async fn open(url: &str, synchronous: Synchronous, texts: ToolResultTexts) -> Result<Self> {
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        let path = path.split('?').next().unwrap_or(path);
        if path.is_empty() || path.contains(":memory:") {
            return Err(Error::invalid(
                "DATABASE_URL",
                "must name a SQLite file (an in-memory database would lose every call)",
            ));
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&writer).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options.read_only(true))
            .await?;
        let writer = WritePool(writer);
        Ok(Self {
            group: GroupCommit::start(writer.clone(), texts.clone()),
            writer,
            reader,
            texts,
        })
    }
}

#[async_trait]
impl Writer for WritePool {
    type Tx = SqliteTx;

    async fn begin_write(&self) -> Result<Self::Tx> {
        Ok(SqliteTx {
            tx: self.0.begin_with("BEGIN IMMEDIATE").await?,
            writes: 0,
            rules: None,
        })
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn submit(&self, batch: NewBatch) -> Result<SubmitReport> {
        self.group.submit(batch).await
    }

    async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        self.group.decide(key, decision).await
    }

    async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport> {
        self.group.cancel(target).await
    }

    async fn expire_due(&self, now: Timestamp) -> Result<Vec<Call>> {
        writes::expire_due(&self.writer, &self.texts, now).await
    }

    async fn pending_count(&self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM calls WHERE status = 1")
            .fetch_one(&self.reader)
            .await?;
        Ok(n as u64)
    }

    async fn next_deadline(&self) -> Result<Option<Timestamp>> {
        let next: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(deadline) FROM calls WHERE status = 1 AND deadline IS NOT NULL",
        )
        .fetch_one(&self.reader)
        .await?;
        Ok(next.map(Timestamp::from_micros))
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
        let mut query = QueryBuilder::<Sqlite>::new(SELECT_CALLS);
        query
            .push("WHERE c.agent = ")
            .push_bind(agent.as_str())
            .push(" AND c.session_id = ")
            .push_bind(session.as_str())
            .push(" AND c.call_id IN (");
        let mut ids = query.separated(", ");
        for id in call_ids {
            ids.push_bind(id.as_str());
        }
        query.push(")");
        let rows = query.build().fetch_all(&self.reader).await?;
        let mut by_id = BTreeMap::new();
        for row in &rows {
            let call = call_from_row(row)?;
            by_id.insert(call.key.call_id.clone(), call);
        }
        Ok(call_ids.iter().map(|id| by_id.get(id).cloned()).collect())
    }

    async fn session_calls(
        &self,
        agent: &AgentId,
        session: &SessionId,
    ) -> Result<(Vec<Call>, u64)> {
        let mut tx = self.reader.begin().await?;
        let seq = latest_seq(&mut tx).await?;
        let rows = sqlx::query(select_calls!(
            "WHERE c.agent = ? AND c.session_id = ? ORDER BY c.id"
        ))
        .bind(agent.as_str())
        .bind(session.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let calls = rows.iter().map(call_from_row).collect::<Result<_>>()?;
        tx.commit().await?;
        Ok((calls, seq))
    }

    async fn batch_calls(&self, batch: &BatchId) -> Result<Vec<Call>> {
        let rows = sqlx::query(select_calls!("WHERE c.batch_id = ? ORDER BY c.position"))
            .bind(batch.as_str())
            .fetch_all(&self.reader)
            .await?;
        rows.iter().map(call_from_row).collect()
    }

    async fn list_calls(&self, q: &CallQuery) -> Result<CallPage> {
        let mut query = QueryBuilder::<Sqlite>::new(SELECT_CALLS);
        query.push("WHERE 1 = 1");
        if let Some(agent) = &q.agent {
            query.push(" AND c.agent = ").push_bind(agent.as_str());
        }
        if let Some(session) = &q.session {
            query
                .push(" AND c.session_id = ")
                .push_bind(session.as_str());
        }
        if let Some(workspace) = &q.workspace {
            query
                .push(" AND c.workspace = ")
                .push_bind(workspace.as_str());
        }
        if let Some(tool) = &q.tool {
            query.push(" AND c.tool = ").push_bind(tool.as_str());
        }
        if !q.statuses.is_empty() {
            query.push(" AND c.status IN (");
            let mut codes = query.separated(", ");
            for status in &q.statuses {
                codes.push_bind(status.code());
            }
            query.push(")");
        }
        if let Some(t) = q.created_after {
            query.push(" AND c.created_at >= ").push_bind(t.as_micros());
        }
        if let Some(t) = q.created_before {
            query.push(" AND c.created_at < ").push_bind(t.as_micros());
        }
        if let Some(seq) = q.requested_at_or_before {
            query.push(" AND c.requested_seq <= ").push_bind(seq as i64);
        }
        match &q.decided_by {
            Some(DecidedByFilter::Exact(by)) => {
                query.push(" AND c.decided_by = ").push_bind(by.clone());
            }
            Some(DecidedByFilter::Prefix(prefix)) => {
                query
                    .push(" AND substr(c.decided_by, 1, length(")
                    .push_bind(prefix.clone())
                    .push(")) = ")
                    .push_bind(prefix.clone());
            }
            None => {}
        }
        if let Some(Cursor(after)) = q.after {
            query.push(" AND c.id > ").push_bind(after);
        }
        query
            .push(" ORDER BY c.id LIMIT ")
            .push_bind(i64::from(q.limit) + 1);
        let rows = query.build().fetch_all(&self.reader).await?;
        let mut page = CallPage::default();
        for row in rows.iter().take(q.limit as usize) {
            let Stored { rowid, call } = stored(row)?;
            page.calls.push(call);
            page.next = Some(Cursor(rowid));
        }
        if rows.len() <= q.limit as usize {
            page.next = None;
        }
        Ok(page)
    }

    async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>> {
        let rows = sqlx::query(concat!(
            "SELECT e.seq, e.kind, e.batch_completed, ",
            call_columns!(),
            " FROM events e JOIN calls c ON c.id = e.call_rowid \
             JOIN batches b ON b.batch_id = c.batch_id \
             LEFT JOIN events r ON r.call_rowid = c.id AND r.kind = 2 \
             WHERE e.seq > ? ORDER BY e.seq LIMIT ?"
        ))
        .bind(after as i64)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(event_from_row).collect()
    }

    async fn latest_seq(&self) -> Result<u64> {
        let mut conn = self.reader.acquire().await?;
        latest_seq(&mut conn).await
    }

    async fn revoke_grants(&self, target: &RevokeTarget, by: &str) -> Result<RevokeReport> {
        writes::revoke_grants(self.writer.begin_write().await?, target, by).await
    }

    async fn list_grants(&self, q: &GrantQuery) -> Result<GrantPage> {
        let mut query = QueryBuilder::<Sqlite>::new(select_grants!("WHERE 1 = 1"));
        if let Some(agent) = &q.agent {
            query.push(" AND agent = ").push_bind(agent.as_str());
        }
        if let Some(scope) = q.scope {
            query.push(" AND scope = ").push_bind(scope.code());
        }
        if let Some(session) = &q.session {
            query.push(" AND session_id = ").push_bind(session.as_str());
        }
        if let Some(workspace) = &q.workspace {
            query
                .push(" AND workspace = ")
                .push_bind(workspace.as_str());
        }
        if let Some(tool) = &q.tool {
            query.push(" AND tool = ").push_bind(tool.as_str());
        }
        if !q.include_inactive {
            let now = q.now.unwrap_or_else(Timestamp::now).as_micros();
            query
                .push(" AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ")
                .push_bind(now)
                .push(")");
        }
        if let Some(Cursor(after)) = q.after {
            query.push(" AND id > ").push_bind(after);
        }
        query
            .push(" ORDER BY id LIMIT ")
            .push_bind(i64::from(q.limit) + 1);
        let rows = query.build().fetch_all(&self.reader).await?;
        let mut page = GrantPage::default();
        for row in rows.iter().take(q.limit as usize) {
            let grant = grant_from_row(row)?;
            page.next = Some(Cursor(grant.id));
            page.grants.push(grant);
        }
        if rows.len() <= q.limit as usize {
            page.next = None;
        }
        Ok(page)
    }

    async fn create_rule(&self, rule: &Rule) -> Result<Rule> {
        writes::create_rule(self.writer.begin_write().await?, rule).await
    }

    async fn delete_rule(&self, id: &RuleId) -> Result<Rule> {
        writes::delete_rule(self.writer.begin_write().await?, id).await
    }

    async fn list_rules(&self) -> Result<Vec<Rule>> {
        let rows = sqlx::query(select_rules!()).fetch_all(&self.reader).await?;
        rows.iter().map(rule_from_row).collect()
    }

    async fn load_file_rules(&self, rules: &[Rule]) -> Result<()> {
        writes::load_file_rules(self.writer.begin_write().await?, rules).await
    }

    async fn explain(&self, target: &ExplainTarget) -> Result<Explanation> {
        // A deferred read transaction: one snapshot of the rules and grants.
        let snapshot = SqliteTx {
            tx: self.reader.begin().await?,
            writes: 0,
            rules: None,
        };
        super::explain::explain(snapshot, target).await
    }
}

/// SQLite's write transaction. Writers are serialised by `BEGIN IMMEDIATE` on the one writer
/// connection, so there is nothing to lock, and an event's row id is its sequence number.
#[async_trait]
impl WriteTx for SqliteTx {
    async fn lock_session(&mut self, _agent: &AgentId, _session: &SessionId) -> Result<()> {
        Ok(())
    }

    async fn lock_batches(&mut self, _batches: &[&str]) -> Result<()> {
        Ok(())
    }

    async fn find_call(&mut self, key: &CallKey) -> Result<Option<Stored>> {
        let row = sqlx::query(select_calls!(
            "WHERE c.agent = ? AND c.session_id = ? AND c.call_id = ?"
        ))
        .bind(key.agent.as_str())
        .bind(key.session.as_str())
        .bind(key.call_id.as_str())
        .fetch_optional(&mut *self.tx)
        .await?;
        row.as_ref().map(stored).transpose()
    }

    async fn load_call(&mut self, rowid: i64) -> Result<Call> {
        let row = sqlx::query(select_calls!("WHERE c.id = ?"))
            .bind(rowid)
            .fetch_one(&mut *self.tx)
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
        self.writes += 1;
        sqlx::query(
            "INSERT INTO batches (batch_id, agent, session_id, on_deny, size, created_at) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(batch_id.as_str())
        .bind(batch.agent.as_str())
        .bind(batch.session.as_str())
        .bind(batch.on_deny.as_i64())
        .bind(size as i64)
        .bind(now.as_micros())
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    async fn resize_batch(&mut self, batch_id: &BatchId, size: usize) -> Result<()> {
        self.writes += 1;
        let query = if size == 0 {
            sqlx::query("DELETE FROM batches WHERE batch_id = ?").bind(batch_id.as_str())
        } else {
            sqlx::query("UPDATE batches SET size = ? WHERE batch_id = ?")
                .bind(size as i64)
                .bind(batch_id.as_str())
        };
        query.execute(&mut *self.tx).await?;
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
        self.writes += 1;
        let rowid: Option<i64> = sqlx::query_scalar(
            "INSERT INTO calls (agent, session_id, call_id, batch_id, position, tool, input, \
             title, message, workspace, supersede_key, deadline, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (agent, session_id, call_id) DO NOTHING RETURNING id",
        )
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
        .fetch_optional(&mut *self.tx)
        .await?;
        // The trigger `calls_requested_event` (migration 0004) wrote its Requested event.
        Ok(rowid)
    }

    async fn resolve(&mut self, rowid: i64, outcome: &Outcome) -> Result<Option<Resolved>> {
        self.writes += 1;
        let batch_id: Option<String> = sqlx::query_scalar(
            "UPDATE calls SET status = ?, decided_at = ?, decided_by = ?, reason = ?, \
             tool_result = ?, run_input = ?, input_edited = ? \
             WHERE id = ? AND status = 1 RETURNING batch_id",
        )
        .bind(outcome.kind.code())
        .bind(outcome.decided_at.as_micros())
        .bind(outcome.decided_by.to_string())
        .bind(&outcome.reason)
        .bind(&outcome.tool_result)
        .bind(outcome.run_input.as_ref().map(ToolInput::as_str))
        .bind(outcome.input_edited)
        .bind(rowid)
        .fetch_optional(&mut *self.tx)
        .await?;
        let Some(batch_id) = batch_id else {
            return Ok(None);
        };
        let event =
            append_event(&mut self.tx, EventKind::Resolved, rowid, outcome.decided_at).await?;
        Ok(Some(Resolved {
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
        let rows = sqlx::query(select_calls!(
            "WHERE c.agent = ? AND c.session_id = ? AND c.status = 1 ORDER BY c.id"
        ))
        .bind(agent.as_str())
        .bind(session.as_str())
        .fetch_all(&mut *self.tx)
        .await?;
        rows.iter().map(stored).collect()
    }

    async fn pending_with_key(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
        key: &str,
    ) -> Result<Vec<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM calls WHERE agent = ? AND session_id = ? AND supersede_key = ? \
             AND status = 1 ORDER BY id",
        )
        .bind(agent.as_str())
        .bind(session.as_str())
        .bind(key)
        .fetch_all(&mut *self.tx)
        .await?)
    }

    async fn pending_in_batch(&mut self, batch: &BatchId) -> Result<Vec<i64>> {
        Ok(sqlx::query_scalar(PENDING_IN_BATCH)
            .bind(batch.as_str())
            .fetch_all(&mut *self.tx)
            .await?)
    }

    async fn calls_of_batch(
        &mut self,
        agent: &AgentId,
        session: &SessionId,
        batch: &BatchId,
    ) -> Result<Vec<Stored>> {
        let rows = sqlx::query(select_calls!(
            "WHERE c.batch_id = ? AND c.agent = ? AND c.session_id = ? ORDER BY c.position"
        ))
        .bind(batch.as_str())
        .bind(agent.as_str())
        .bind(session.as_str())
        .fetch_all(&mut *self.tx)
        .await?;
        rows.iter().map(stored).collect()
    }

    async fn on_deny(&mut self, batch: &BatchId) -> Result<OnDeny> {
        let on_deny: i64 = sqlx::query_scalar("SELECT on_deny FROM batches WHERE batch_id = ?")
            .bind(batch.as_str())
            .fetch_one(&mut *self.tx)
            .await?;
        Ok(OnDeny::from_i64(on_deny))
    }

    async fn due_calls(&mut self, now: Timestamp, limit: i64) -> Result<Vec<(i64, String)>> {
        Ok(sqlx::query_as(
            "SELECT id, batch_id FROM calls WHERE status = 1 AND deadline IS NOT NULL \
             AND deadline <= ? ORDER BY deadline LIMIT ?",
        )
        .bind(now.as_micros())
        .bind(limit)
        .fetch_all(&mut *self.tx)
        .await?)
    }

    async fn complete_batch_if_done(&mut self, batch_id: &str, event: i64) -> Result<()> {
        self.writes += 1;
        sqlx::query(COMPLETE_BATCH_IF_DONE)
            .bind(event)
            .bind(batch_id)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    fn writes(&self) -> Option<u64> {
        Some(self.writes)
    }

    async fn commit(self) -> Result<()> {
        Ok(self.tx.commit().await?)
    }
}

/// Grants and rules. Writers are serialised, so `lock_policy` has nothing to lock.
#[async_trait]
impl PolicyTx for SqliteTx {
    async fn lock_policy(
        &mut self,
        _agent: &AgentId,
        _tools: &[&ToolName],
        _exclusive: bool,
    ) -> Result<()> {
        Ok(())
    }

    async fn rules(&mut self) -> Result<Vec<Rule>> {
        if let Some(rules) = &self.rules {
            return Ok(rules.clone());
        }
        let rows = sqlx::query(select_rules!())
            .fetch_all(&mut *self.tx)
            .await?;
        let rules: Vec<Rule> = rows.iter().map(rule_from_row).collect::<Result<_>>()?;
        self.rules = Some(rules.clone());
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
        let mut query = QueryBuilder::<Sqlite>::new(select_grants!(
            "WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > "
        ));
        query
            .push_bind(now.as_micros())
            .push(") AND agent = ")
            .push_bind(agent.as_str())
            .push(" AND tool IN (");
        let mut list = query.separated(", ");
        for tool in tools {
            list.push_bind(tool.as_str());
        }
        query.push(")");
        if let Some(session) = session {
            query
                .push(" AND (session_id IS NULL OR session_id = ")
                .push_bind(session.as_str())
                .push(")");
        }
        query.push(" ORDER BY id");
        let rows = query.build().fetch_all(&mut *self.tx).await?;
        rows.iter().map(grant_from_row).collect()
    }

    async fn insert_grant(&mut self, spec: &GrantSpec) -> Result<Grant> {
        self.writes += 1;
        let (session, workspace) = match &spec.scope {
            GrantScope::Session(s) => (Some(s.as_str()), None),
            GrantScope::Workspace(w) => (None, Some(w.as_str())),
            GrantScope::Always => (None, None),
        };
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO grants (agent, scope, session_id, workspace, tool, matcher, effect, \
             created_by, created_at, expires_at, source_session, source_call, reason) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
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
        .fetch_one(&mut *self.tx)
        .await?;
        Ok(Grant {
            id,
            spec: spec.clone(),
            revoked_at: None,
            revoked_by: None,
        })
    }

    async fn grant_from_call(&mut self, key: &CallKey) -> Result<Option<Grant>> {
        let row = sqlx::query(select_grants!(
            "WHERE agent = ? AND source_session = ? AND source_call = ? ORDER BY id DESC LIMIT 1"
        ))
        .bind(key.agent.as_str())
        .bind(key.session.as_str())
        .bind(key.call_id.as_str())
        .fetch_optional(&mut *self.tx)
        .await?;
        row.as_ref().map(grant_from_row).transpose()
    }

    async fn grants_named(&mut self, target: &RevokeTarget, now: Timestamp) -> Result<Vec<Grant>> {
        let query = match target {
            RevokeTarget::Id(id) => sqlx::query(select_grants!("WHERE id = ?")).bind(*id),
            RevokeTarget::Session(agent, session) => sqlx::query(select_grants!(
                "WHERE agent = ? AND scope = 2 AND session_id = ? AND revoked_at IS NULL \
                 AND (expires_at IS NULL OR expires_at > ?) ORDER BY id"
            ))
            .bind(agent.as_str())
            .bind(session.as_str())
            .bind(now.as_micros()),
            RevokeTarget::Workspace(agent, workspace) => sqlx::query(select_grants!(
                "WHERE agent = ? AND scope = 3 AND workspace = ? AND revoked_at IS NULL \
                 AND (expires_at IS NULL OR expires_at > ?) ORDER BY id"
            ))
            .bind(agent.as_str())
            .bind(workspace.as_str())
            .bind(now.as_micros()),
        };
        let rows = query.fetch_all(&mut *self.tx).await?;
        rows.iter().map(grant_from_row).collect()
    }

    async fn revoke(&mut self, ids: &[i64], by: &str, now: Timestamp) -> Result<Vec<Grant>> {
        self.writes += 1;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut query = QueryBuilder::<Sqlite>::new("UPDATE grants SET revoked_at = ");
        query
            .push_bind(now.as_micros())
            .push(", revoked_by = ")
            .push_bind(by.to_owned())
            .push(" WHERE revoked_at IS NULL AND id IN (");
        let mut list = query.separated(", ");
        for id in ids {
            list.push_bind(*id);
        }
        query.push(
            ") RETURNING id, agent, scope, session_id, workspace, tool, matcher, effect, \
             created_by, created_at, expires_at, revoked_at, revoked_by, source_session, \
             source_call, reason",
        );
        let rows = query.build().fetch_all(&mut *self.tx).await?;
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
        let query = match scope {
            GrantScope::Session(session) => sqlx::query(select_calls!(
                "WHERE c.agent = ? AND c.tool = ? AND c.status = 1 AND c.session_id = ? \
                 ORDER BY c.id"
            ))
            .bind(agent.as_str())
            .bind(tool.as_str())
            .bind(session.as_str()),
            GrantScope::Workspace(workspace) => sqlx::query(select_calls!(
                "WHERE c.agent = ? AND c.tool = ? AND c.status = 1 AND c.workspace = ? \
                 ORDER BY c.id"
            ))
            .bind(agent.as_str())
            .bind(tool.as_str())
            .bind(workspace.as_str()),
            GrantScope::Always => sqlx::query(select_calls!(
                "WHERE c.agent = ? AND c.tool = ? AND c.status = 1 ORDER BY c.id"
            ))
            .bind(agent.as_str())
            .bind(tool.as_str()),
        };
        let rows = query.fetch_all(&mut *self.tx).await?;
        rows.iter().map(stored).collect()
    }

    async fn find_rule(&mut self, id: &RuleId) -> Result<Option<Rule>> {
        let row = sqlx::query(select_rules!("WHERE id = ?"))
            .bind(id.as_str())
            .fetch_optional(&mut *self.tx)
            .await?;
        row.as_ref().map(rule_from_row).transpose()
    }

    async fn insert_rule(&mut self, rule: &Rule) -> Result<bool> {
        self.writes += 1;
        self.rules = None;
        let inserted = sqlx::query(
            "INSERT INTO rules (id, tool, matcher, effect, priority, description, source, \
             created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        )
        .bind(rule.id.as_str())
        .bind(rule.tool.as_str())
        .bind(rule.matcher.to_json().to_string())
        .bind(rule.effect.code())
        .bind(i64::from(rule.priority))
        .bind(&rule.description)
        .bind(rule.source.as_str())
        .bind(rule.created_at.as_micros())
        .execute(&mut *self.tx)
        .await?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn delete_rule(&mut self, id: &RuleId) -> Result<bool> {
        self.writes += 1;
        self.rules = None;
        let deleted = sqlx::query("DELETE FROM rules WHERE id = ?")
            .bind(id.as_str())
            .execute(&mut *self.tx)
            .await?
            .rows_affected();
        Ok(deleted == 1)
    }

    async fn delete_file_rules(&mut self) -> Result<()> {
        self.writes += 1;
        self.rules = None;
        sqlx::query("DELETE FROM rules WHERE source = ?")
            .bind(RuleSource::File.as_str())
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }
}

async fn append_event(
    conn: &mut SqliteConnection,
    kind: EventKind,
    rowid: i64,
    now: Timestamp,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO events (kind, call_rowid, created_at) VALUES (?, ?, ?) RETURNING seq",
    )
    .bind(kind.code())
    .bind(rowid)
    .bind(now.as_micros())
    .fetch_one(conn)
    .await?)
}

async fn latest_seq(conn: &mut SqliteConnection) -> Result<u64> {
    let seq: Option<i64> = sqlx::query_scalar("SELECT MAX(seq) FROM events")
        .fetch_one(conn)
        .await?;
    Ok(seq.unwrap_or(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row;

    async fn pragma(store: &SqliteStore, name: &'static str) -> String {
        let row = sqlx::query(name).fetch_one(&store.writer.0).await.unwrap();
        match row.try_get::<String, _>(0) {
            Ok(text) => text,
            Err(_) => row.try_get::<i64, _>(0).unwrap().to_string(),
        }
    }

    #[tokio::test]
    async fn a_batchs_pending_calls_are_found_through_their_index_not_a_scan() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("a.db").display());
        let store = SqliteStore::open(&url, Synchronous::default(), ToolResultTexts::default())
            .await
            .unwrap();
        for sql in [PENDING_IN_BATCH, COMPLETE_BATCH_IF_DONE] {
            let plan: Vec<String> =
                sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .bind("some-batch")
                    .bind("some-batch")
                    .fetch_all(&store.writer.0)
                    .await
                    .unwrap()
                    .iter()
                    .map(|row| row.try_get("detail").unwrap())
                    .collect();
            assert!(
                plan.iter().any(|step| step.contains("calls_pending_batch")),
                "{sql}: {plan:?}"
            );
        }
    }

    #[tokio::test]
    async fn the_database_is_power_safe_by_default_wal_with_synchronous_full() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("a.db").display());
        let store = SqliteStore::open(&url, Synchronous::default(), ToolResultTexts::default())
            .await
            .unwrap();
        assert_eq!(pragma(&store, "PRAGMA journal_mode").await, "wal");
        assert_eq!(pragma(&store, "PRAGMA synchronous").await, "2", "2 is FULL");
        let relaxed = SqliteStore::open(&url, Synchronous::Normal, ToolResultTexts::default())
            .await
            .unwrap();
        assert_eq!(
            pragma(&relaxed, "PRAGMA synchronous").await,
            "1",
            "1 is NORMAL"
        );
    }

    #[tokio::test]
    async fn an_in_memory_database_is_refused() {
        let err = SqliteStore::open(
            "sqlite::memory:",
            Synchronous::Full,
            ToolResultTexts::default(),
        )
        .await
        .err()
        .expect("refused");
        assert!(err.to_string().contains("DATABASE_URL"), "{err}");
    }
}
