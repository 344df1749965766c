//! Webhook endpoints on Postgres. Replicas share the endpoints; the lease row columns make
//! exactly one replica deliver an endpoint at a time, and the writes delivery makes (cursor,
//! failures) are conditional on still holding the lease.

use async_trait::async_trait;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres};

use super::PostgresStore;
use crate::domain::Timestamp;
use crate::domain::webhook::{DeliveryFailure, Webhook, WebhookChange, WebhookId};
use crate::error::Result;
use crate::store::Webhooks;
use crate::store::webhook_rows::{
    DELETE_WEBHOOK, INSERT_WEBHOOK, LEASE_WEBHOOK, RECORD_DELIVERED, RECORD_FAILURE,
    RELEASE_WEBHOOK, SELECT_FILE_WEBHOOK_IDS, SELECT_WEBHOOK, SELECT_WEBHOOK_FOR_UPDATE,
    UPDATE_WEBHOOK, UPSERT_FILE_WEBHOOK, WebhookRow, already_exists, not_found, pause_reason,
    webhook_from_row,
};

/// `sql` (either insert statement) with `hook`'s values bound.
fn insert<'q>(sql: &'static str, r: WebhookRow<'q>) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(sql)
        .bind(r.id)
        .bind(r.url)
        .bind(r.secret)
        .bind(r.event_kinds)
        .bind(r.tool)
        .bind(r.workspace)
        .bind(r.agent)
        .bind(r.format)
        .bind(r.max_in_flight)
        .bind(r.paused_reason)
        .bind(r.last_error)
        .bind(r.consecutive_failures)
        .bind(r.cursor)
        .bind(r.from_file)
        .bind(r.created_at)
}

async fn stored(conn: &mut PgConnection, id: &WebhookId) -> Result<Option<Webhook>> {
    let row = sqlx::query(SELECT_WEBHOOK)
        .bind(id.as_str())
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(webhook_from_row).transpose()
}

#[async_trait]
impl Webhooks for PostgresStore {
    async fn create_webhook(&self, hook: &Webhook) -> Result<Webhook> {
        let mut conn = self.pool.acquire().await?;
        let inserted = insert(INSERT_WEBHOOK, WebhookRow::of(hook))
            .execute(&mut *conn)
            .await?;
        if inserted.rows_affected() == 0 {
            return Err(already_exists(&hook.id));
        }
        stored(&mut conn, &hook.id)
            .await?
            .ok_or_else(|| not_found(&hook.id))
    }

    async fn update_webhook(&self, id: &WebhookId, change: WebhookChange) -> Result<Webhook> {
        let mut tx = self.pool.begin().await?;
        // Locked until the change is written: delivery's failure count waits, then applies.
        let locked = sqlx::query(SELECT_WEBHOOK_FOR_UPDATE)
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let hook = change.apply(
            locked
                .as_ref()
                .map(webhook_from_row)
                .transpose()?
                .ok_or_else(|| not_found(id))?,
        );
        let r = WebhookRow::of(&hook);
        let updated = sqlx::query(UPDATE_WEBHOOK)
            .bind(r.url)
            .bind(r.secret)
            .bind(r.event_kinds)
            .bind(r.tool)
            .bind(r.workspace)
            .bind(r.agent)
            .bind(r.format)
            .bind(r.max_in_flight)
            .bind(r.paused_reason)
            .bind(r.consecutive_failures)
            .bind(r.from_file)
            .bind(r.id)
            .execute(&mut *tx)
            .await?;
        if updated.rows_affected() == 0 {
            return Err(not_found(&hook.id));
        }
        let stored = stored(&mut tx, &hook.id)
            .await?
            .ok_or_else(|| not_found(&hook.id))?;
        tx.commit().await?;
        Ok(stored)
    }

    async fn delete_webhook(&self, id: &WebhookId) -> Result<Webhook> {
        let mut tx = self.pool.begin().await?;
        let hook = stored(&mut tx, id).await?.ok_or_else(|| not_found(id))?;
        sqlx::query(DELETE_WEBHOOK)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(hook)
    }

    async fn load_file_webhooks(&self, hooks: &[Webhook], start_cursor: u64) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let earlier: Vec<String> = sqlx::query_scalar(SELECT_FILE_WEBHOOK_IDS)
            .fetch_all(&mut *tx)
            .await?;
        for id in earlier {
            if !hooks.iter().any(|h| h.id.as_str() == id) {
                sqlx::query(DELETE_WEBHOOK)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        for hook in hooks {
            let hook = Webhook {
                cursor: start_cursor,
                from_file: true,
                ..hook.clone()
            };
            insert(UPSERT_FILE_WEBHOOK, WebhookRow::of(&hook))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn lease_webhook(
        &self,
        id: &WebhookId,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool> {
        let leased = sqlx::query(LEASE_WEBHOOK)
            .bind(owner)
            .bind(until.as_micros())
            .bind(id.as_str())
            .bind(now.as_micros())
            .execute(&self.pool)
            .await?;
        Ok(leased.rows_affected() == 1)
    }

    async fn release_webhook(&self, id: &WebhookId, owner: &str) -> Result<()> {
        sqlx::query(RELEASE_WEBHOOK)
            .bind(id.as_str())
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn record_delivered(&self, id: &WebhookId, owner: &str, cursor: u64) -> Result<bool> {
        let updated = sqlx::query(RECORD_DELIVERED)
            .bind(cursor as i64)
            .bind(id.as_str())
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(updated.rows_affected() == 1)
    }

    async fn record_failure(&self, failure: &DeliveryFailure) -> Result<Option<Webhook>> {
        let mut conn = self.pool.acquire().await?;
        let updated = sqlx::query(RECORD_FAILURE)
            .bind(&failure.error)
            .bind(i64::from(failure.pause_after))
            .bind(pause_reason(failure.pause_after, &failure.error))
            .bind(failure.webhook.as_str())
            .bind(&failure.owner)
            .execute(&mut *conn)
            .await?;
        if updated.rows_affected() == 0 {
            return Ok(None);
        }
        stored(&mut conn, &failure.webhook).await
    }
}
