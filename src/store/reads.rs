//! The reads both backends make outside write transactions (API listings, the event log, the
//! sweeper's questions), written once over sqlx, which both backends read with: Postgres on its
//! pool, SQLite on its read-only pool beside the one writer. What a backend must do before a
//! read (Postgres numbers committed events before saying which is the latest) it does itself.

use std::collections::HashMap;

use sqlx::{Database, Encode, Executor, IntoArguments, Pool, Type};

use super::health::Watch;
use super::listing::{Dialect, Listing, call_page, grant_page};
use super::receipt_rows::{self, StoredReceipt, receipt_from_row};
use super::rows::{
    Columns, call_from_row, rule_from_row, sealed_call_from_row, sealed_event_from_row,
    sealed_from_row, shadow_verdict_from_row,
};
use super::statements as sql;
use super::webhook_rows::{SELECT_WEBHOOK, SELECT_WEBHOOKS, not_found, webhook_from_row};
use crate::domain::policy::{Rule, ShadowVerdict};
use crate::domain::receipt::Sealed;
use crate::domain::webhook::{Webhook, WebhookId};
use crate::domain::{AgentId, BatchId, Call, CallId, CallKey, Event, SessionId, Timestamp};
use crate::domain::{CallPage, CallQuery, GrantPage, GrantQuery};
use crate::error::Result;

/// The read side of a store, on `DB`'s pool, with the storage health its failures are told
/// (see [`BackendReads`]).
pub struct Reads<DB: Database> {
    pool: Pool<DB>,
    health: Watch,
}

impl<DB> Reads<DB>
where
    DB: Dialect,
    DB::Row: Columns,
    DB::Arguments: IntoArguments<DB> + Default,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
{
    pub fn new(pool: Pool<DB>, health: Watch) -> Self {
        Self { pool, health }
    }

    #[cfg(test)]
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    pub fn pool_stats(&self) -> PoolStats {
        PoolStats {
            open: self.pool.size(),
            idle: self.pool.num_idle(),
        }
    }

    pub async fn pending_count(&self) -> Result<u64> {
        let row = sqlx::query(sql::PENDING_COUNT)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.int("n")? as u64)
    }

    pub async fn next_deadline(&self) -> Result<Option<Timestamp>> {
        let row = sqlx::query(sql::NEXT_DEADLINE)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.opt_int("next")?.map(Timestamp::from_micros))
    }

    /// See `Deadlines::next_step_due`.
    pub async fn next_step_due(&self) -> Result<Option<Timestamp>> {
        let row = sqlx::query(sql::NEXT_STEP_DUE)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.opt_int("next")?.map(Timestamp::from_micros))
    }

    /// See `Store::calls_by_id`.
    pub async fn calls_by_id(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
    ) -> Result<Vec<Option<Call>>> {
        if call_ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows = Listing::<DB>::calls_by_id(agent, session, call_ids)
            .build()
            .fetch_all(&self.pool)
            .await?;
        let mut by_id = HashMap::new();
        for row in &rows {
            let call = call_from_row(row)?;
            by_id.insert(call.key.call_id.clone(), call);
        }
        // A repeated id gets the same answer each time.
        Ok(call_ids.iter().map(|id| by_id.get(id).cloned()).collect())
    }

    pub async fn batch_calls(&self, batch: &BatchId) -> Result<Vec<Call>> {
        let rows = sqlx::query(sql::BATCH_CALLS)
            .bind(batch.as_str())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(sealed_call_from_row).collect()
    }

    pub async fn list_calls(&self, q: &CallQuery) -> Result<CallPage> {
        let mut query = Listing::<DB>::calls(q);
        call_page(&query.build().fetch_all(&self.pool).await?, q)
    }

    /// OUT_OF_RANGE when retention pruned events after `after`. Each row carries the horizon as
    /// the statement's snapshot saw it, with the events: a prune that committed before the read
    /// (and may have left a gap in it) is seen, so a reader is never handed a gap. Where there
    /// are no events, the horizon is read after the (empty) read.
    pub async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>> {
        let rows = sqlx::query(sql::EVENTS_AFTER)
            .bind(after as i64)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        let through = match rows.first() {
            Some(row) => row.opt_int("pruned_through")?.unwrap_or(0) as u64,
            None => self.pruned_through().await?,
        };
        if after < through {
            return Err(crate::Error::Pruned { after, through });
        }
        rows.iter().map(sealed_event_from_row).collect()
    }

    /// The highest sequence number retention pruned (0 when nothing was).
    pub async fn pruned_through(&self) -> Result<u64> {
        let row = sqlx::query(sql::PRUNED_THROUGH)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(row) => row.int("pruned_through")? as u64,
            None => 0,
        })
    }

    /// The last sequence number in the log (0 when it is empty).
    pub async fn latest_seq(&self) -> Result<u64> {
        let row = sqlx::query(sql::LATEST_SEQ).fetch_one(&self.pool).await?;
        Ok(row.opt_int("seq")?.unwrap_or(0) as u64)
    }

    pub async fn list_grants(&self, q: &GrantQuery) -> Result<GrantPage> {
        let mut query = Listing::<DB>::grants(q);
        grant_page(&query.build().fetch_all(&self.pool).await?, q)
    }

    pub async fn list_rules(&self) -> Result<Vec<Rule>> {
        let rows = sqlx::query(sql::RULES).fetch_all(&self.pool).await?;
        rows.iter().map(rule_from_row).collect()
    }

    /// See `Policies::shadow_verdicts`.
    pub async fn shadow_verdicts(&self, key: &CallKey) -> Result<Vec<ShadowVerdict>> {
        let rows = self.of_call(sql::SHADOW_VERDICTS_OF_CALL, key).await?;
        rows.iter().map(shadow_verdict_from_row).collect()
    }

    /// The rows `statement` reads of the call `key` (bound as agent, session, call id).
    async fn of_call(&self, statement: &'static str, key: &CallKey) -> Result<Vec<DB::Row>> {
        Ok(sqlx::query(statement)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
            .fetch_all(&self.pool)
            .await?)
    }

    pub async fn webhooks(&self) -> Result<Vec<Webhook>> {
        let rows = sqlx::query(SELECT_WEBHOOKS).fetch_all(&self.pool).await?;
        rows.iter().map(webhook_from_row).collect()
    }

    /// See [`receipt_rows::RECEIPTS_OF_CALL_ID`].
    pub async fn receipts_of(&self, key: &CallKey) -> Result<Vec<StoredReceipt>> {
        let rows = self.of_call(receipt_rows::RECEIPTS_OF_CALL_ID, key).await?;
        rows.iter().map(receipt_from_row).collect()
    }

    /// See `Receipts::seals_of_calls`.
    pub async fn seals_of_calls(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
    ) -> Result<HashMap<CallId, (BatchId, Sealed)>> {
        if call_ids.is_empty() {
            return Ok(HashMap::new());
        }
        let rows = Listing::<DB>::seals_of_calls(agent, session, call_ids)
            .build()
            .fetch_all(&self.pool)
            .await?;
        let mut seals = HashMap::with_capacity(rows.len());
        for row in &rows {
            if let Some(sealed) = sealed_from_row(row)? {
                let id = CallId::from_stored(row.text("call_id")?);
                seals.insert(id, (BatchId::from_stored(row.text("batch_id")?), sealed));
            }
        }
        Ok(seals)
    }

    pub async fn receipts_after(&self, after: u64, limit: u32) -> Result<Vec<StoredReceipt>> {
        let rows = sqlx::query(receipt_rows::RECEIPTS_AFTER)
            .bind(after.min(i64::MAX as u64) as i64)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(receipt_from_row).collect()
    }

    /// NOT_FOUND when there is none with that id.
    pub async fn webhook(&self, id: &WebhookId) -> Result<Webhook> {
        let row = sqlx::query(SELECT_WEBHOOK)
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref()
            .map(webhook_from_row)
            .transpose()?
            .ok_or_else(|| not_found(id))
    }
}

/// One backend's [`Reads`], whichever backend it is. The store traits' read methods default to
/// it (see `store::Backend`), so neither backend writes its reads out again; and every read
/// passes here, where its failure is told to storage health (`health`), once for all of them.
pub enum BackendReads {
    Sqlite(Reads<sqlx::Sqlite>),
    Postgres(Reads<sqlx::Postgres>),
}

/// Calls `$method` on whichever backend's reads this is, and tells storage health how it went.
macro_rules! on_backend {
    ($reads:expr, $method:ident($($arg:expr),*)) => {
        match $reads {
            BackendReads::Sqlite(reads) => reads.health.seen(reads.$method($($arg),*).await),
            BackendReads::Postgres(reads) => reads.health.seen(reads.$method($($arg),*).await),
        }
    };
}

/// A connection pool's connections now: open, and of those idle.
#[derive(Debug, Clone, Copy)]
pub struct PoolStats {
    pub open: u32,
    pub idle: usize,
}

impl BackendReads {
    /// The read pool's connections (on Postgres, the one pool for reads and writes; SQLite
    /// writes on its own connection, outside it).
    pub fn pool_stats(&self) -> PoolStats {
        match self {
            BackendReads::Sqlite(reads) => reads.pool_stats(),
            BackendReads::Postgres(reads) => reads.pool_stats(),
        }
    }

    pub async fn pending_count(&self) -> Result<u64> {
        on_backend!(self, pending_count())
    }

    pub async fn next_deadline(&self) -> Result<Option<Timestamp>> {
        on_backend!(self, next_deadline())
    }

    pub async fn next_step_due(&self) -> Result<Option<Timestamp>> {
        on_backend!(self, next_step_due())
    }

    pub async fn calls_by_id(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
    ) -> Result<Vec<Option<Call>>> {
        on_backend!(self, calls_by_id(agent, session, call_ids))
    }

    pub async fn batch_calls(&self, batch: &BatchId) -> Result<Vec<Call>> {
        on_backend!(self, batch_calls(batch))
    }

    pub async fn list_calls(&self, q: &CallQuery) -> Result<CallPage> {
        on_backend!(self, list_calls(q))
    }

    pub async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>> {
        on_backend!(self, events_after(after, limit))
    }

    pub async fn latest_seq(&self) -> Result<u64> {
        on_backend!(self, latest_seq())
    }

    pub async fn pruned_through(&self) -> Result<u64> {
        on_backend!(self, pruned_through())
    }

    pub async fn list_grants(&self, q: &GrantQuery) -> Result<GrantPage> {
        on_backend!(self, list_grants(q))
    }

    pub async fn list_rules(&self) -> Result<Vec<Rule>> {
        on_backend!(self, list_rules())
    }

    pub async fn shadow_verdicts(&self, key: &CallKey) -> Result<Vec<ShadowVerdict>> {
        on_backend!(self, shadow_verdicts(key))
    }

    pub async fn webhooks(&self) -> Result<Vec<Webhook>> {
        on_backend!(self, webhooks())
    }

    pub async fn webhook(&self, id: &WebhookId) -> Result<Webhook> {
        on_backend!(self, webhook(id))
    }

    pub async fn receipts_of(&self, key: &CallKey) -> Result<Vec<StoredReceipt>> {
        on_backend!(self, receipts_of(key))
    }

    pub async fn seals_of_calls(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
    ) -> Result<HashMap<CallId, (BatchId, Sealed)>> {
        on_backend!(self, seals_of_calls(agent, session, call_ids))
    }

    pub async fn receipts_after(&self, after: u64, limit: u32) -> Result<Vec<StoredReceipt>> {
        on_backend!(self, receipts_after(after, limit))
    }
}
