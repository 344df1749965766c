//! Webhook endpoints on SQLite: their reads are the shared ones (`store::reads`); each write is
//! its own small transaction on the one writer thread. One broker process serves a SQLite file
//! (its process lock says so), so a lease is taken whoever held it before: a broker killed
//! mid-delivery is not waited for. The lease is kept anyway, so the delivery code is the same
//! everywhere.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension as _, params};

use super::SqliteStore;
use crate::domain::Timestamp;
use crate::domain::webhook::{DeliveryFailure, Webhook, WebhookChange, WebhookId};
use crate::error::Result;
use crate::store::Webhooks;
use crate::store::rows::NamedRow;
use crate::store::webhook_rows::{
    DELETE_WEBHOOK, INSERT_WEBHOOK, RECORD_DELIVERED, RECORD_FAILURE, RELEASE_WEBHOOK,
    SELECT_FILE_WEBHOOK_IDS, SELECT_WEBHOOK, TAKE_WEBHOOK_LEASE, UPDATE_WEBHOOK,
    UPSERT_FILE_WEBHOOK, WebhookRow, already_exists, not_found, pause_reason, webhook_from_row,
};

/// Inserts `hook` with `sql` (either insert statement); how many rows it wrote.
fn insert(conn: &Connection, sql: &str, hook: &Webhook) -> Result<usize> {
    let r = WebhookRow::of(hook);
    Ok(conn.prepare_cached(sql)?.execute(params![
        r.id,
        r.url,
        r.secret,
        r.event_kinds,
        r.tool,
        r.workspace,
        r.agent,
        r.format,
        r.max_in_flight,
        r.paused_reason,
        r.last_error,
        r.consecutive_failures,
        r.cursor,
        r.from_file,
        r.created_at,
    ])?)
}

fn stored(conn: &Connection, id: &WebhookId) -> Result<Option<Webhook>> {
    conn.prepare_cached(SELECT_WEBHOOK)?
        .query_row(params![id.as_str()], |row| {
            Ok(webhook_from_row(&NamedRow::new(row, None)).map_err(|e| e.to_string()))
        })
        .optional()?
        .map(|decoded| decoded.map_err(crate::Error::Internal))
        .transpose()
}

#[async_trait]
impl Webhooks for SqliteStore {
    async fn create_webhook(&self, hook: &Webhook) -> Result<Webhook> {
        let hook = hook.clone();
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    if insert(conn, INSERT_WEBHOOK, &hook)? == 0 {
                        return Err(already_exists(&hook.id));
                    }
                    stored(conn, &hook.id)?.ok_or_else(|| not_found(&hook.id))
                })
            })
            .await
    }

    async fn update_webhook(&self, id: &WebhookId, change: WebhookChange) -> Result<Webhook> {
        let id = id.clone();
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    let hook = change.apply(stored(conn, &id)?.ok_or_else(|| not_found(&id))?);
                    let r = WebhookRow::of(&hook);
                    let updated = conn.prepare_cached(UPDATE_WEBHOOK)?.execute(params![
                        r.url,
                        r.secret,
                        r.event_kinds,
                        r.tool,
                        r.workspace,
                        r.agent,
                        r.format,
                        r.max_in_flight,
                        r.paused_reason,
                        r.consecutive_failures,
                        r.from_file,
                        r.id,
                    ])?;
                    if updated == 0 {
                        return Err(not_found(&hook.id));
                    }
                    stored(conn, &hook.id)?.ok_or_else(|| not_found(&hook.id))
                })
            })
            .await
    }

    async fn delete_webhook(&self, id: &WebhookId) -> Result<Webhook> {
        let id = id.clone();
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    let hook = stored(conn, &id)?.ok_or_else(|| not_found(&id))?;
                    conn.prepare_cached(DELETE_WEBHOOK)?
                        .execute(params![id.as_str()])?;
                    Ok(hook)
                })
            })
            .await
    }

    async fn load_file_webhooks(&self, hooks: &[Webhook], start_cursor: u64) -> Result<()> {
        let hooks = hooks.to_vec();
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    let earlier: Vec<String> = conn
                        .prepare_cached(SELECT_FILE_WEBHOOK_IDS)?
                        .query_map([], |row| row.get(0))?
                        .collect::<rusqlite::Result<_>>()?;
                    for id in earlier {
                        if !hooks.iter().any(|h| h.id.as_str() == id) {
                            conn.prepare_cached(DELETE_WEBHOOK)?.execute(params![id])?;
                        }
                    }
                    for hook in &hooks {
                        let hook = Webhook {
                            cursor: start_cursor,
                            from_file: true,
                            ..hook.clone()
                        };
                        insert(conn, UPSERT_FILE_WEBHOOK, &hook)?;
                    }
                    Ok(())
                })
            })
            .await
    }

    async fn lease_webhook(
        &self,
        id: &WebhookId,
        owner: &str,
        _now: Timestamp,
        until: Timestamp,
    ) -> Result<bool> {
        let (id, owner) = (id.clone(), owner.to_owned());
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    let leased = conn.prepare_cached(TAKE_WEBHOOK_LEASE)?.execute(params![
                        owner,
                        until.as_micros(),
                        id.as_str(),
                    ])?;
                    Ok(leased == 1)
                })
            })
            .await
    }

    async fn release_webhook(&self, id: &WebhookId, owner: &str) -> Result<()> {
        let (id, owner) = (id.clone(), owner.to_owned());
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    conn.prepare_cached(RELEASE_WEBHOOK)?
                        .execute(params![id.as_str(), owner])?;
                    Ok(())
                })
            })
            .await
    }

    async fn record_delivered(&self, id: &WebhookId, owner: &str, cursor: u64) -> Result<bool> {
        let (id, owner) = (id.clone(), owner.to_owned());
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    let updated = conn.prepare_cached(RECORD_DELIVERED)?.execute(params![
                        cursor as i64,
                        id.as_str(),
                        owner,
                    ])?;
                    Ok(updated == 1)
                })
            })
            .await
    }

    async fn record_failure(&self, failure: &DeliveryFailure) -> Result<Option<Webhook>> {
        let failure = failure.clone();
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    let updated = conn.prepare_cached(RECORD_FAILURE)?.execute(params![
                        failure.error,
                        i64::from(failure.pause_after),
                        pause_reason(failure.pause_after, &failure.error),
                        failure.webhook.as_str(),
                        failure.owner,
                    ])?;
                    if updated == 0 {
                        return Ok(None);
                    }
                    stored(conn, &failure.webhook)
                })
            })
            .await
    }
}
