//! Webhook endpoints' storage, written once for both backends over their transactions
//! ([`Transact`]): their reads are the shared ones (`store::reads`); each write is a transaction
//! of its own, or statements on one connection where nothing needs them together (see
//! [`Transact::statements`]). What the backends do differently is one flag, [`SqlTx::REPLICAS`]:
//! where replicas share the database (Postgres), an endpoint read to be changed is locked until
//! the change is written, and the lease makes exactly one replica deliver an endpoint at a time,
//! taken over only once it has run out. One broker process serves a SQLite file (its process
//! lock says so), so there a lease is taken whoever held it before: a broker killed
//! mid-delivery is not waited for. The lease is kept anyway, so the delivery code is the same
//! everywhere. The writes delivery makes (cursor, failures) are conditional on still holding
//! the lease.

use async_trait::async_trait;

use super::Webhooks;
use super::primitives::{Param, Run, SqlTx, Transact};
use super::webhook_rows::{
    DELETE_WEBHOOK, INSERT_WEBHOOK, LEASE_WEBHOOK, RECORD_DELIVERED, RECORD_FAILURE,
    RELEASE_WEBHOOK, SELECT_FILE_WEBHOOK_IDS, SELECT_WEBHOOK, SELECT_WEBHOOK_FOR_UPDATE,
    TAKE_WEBHOOK_LEASE, UPDATE_WEBHOOK, UPSERT_FILE_WEBHOOK, WebhookRow, already_exists, not_found,
    pause_reason, webhook_from_row,
};
use crate::domain::Timestamp;
use crate::domain::webhook::{DeliveryFailure, Webhook, WebhookChange, WebhookId};
use crate::error::Result;

#[async_trait]
impl<S: Transact> Webhooks for S {
    async fn create_webhook(&self, hook: &Webhook) -> Result<Webhook> {
        let hook = hook.clone();
        self.statements(move |mut tx| async move {
            let params = WebhookRow::of(&hook).inserted();
            if tx.execute(Run::write(INSERT_WEBHOOK, &params)).await? == 0 {
                return Err(already_exists(&hook.id));
            }
            let stored = stored(&mut tx, SELECT_WEBHOOK, &hook.id).await?;
            let stored = stored.ok_or_else(|| not_found(&hook.id))?;
            tx.commit().await?;
            Ok(stored)
        })
        .await
    }

    async fn update_webhook(&self, id: &WebhookId, change: WebhookChange) -> Result<Webhook> {
        let id = id.clone();
        self.transaction(move |mut tx| async move {
            // Locked until the change is written: delivery's failure count waits, then applies.
            let select = locked(&tx);
            let hook = stored(&mut tx, select, &id).await?;
            let hook = change.apply(hook.ok_or_else(|| not_found(&id))?);
            let params = WebhookRow::of(&hook).updated();
            if tx.execute(Run::write(UPDATE_WEBHOOK, &params)).await? == 0 {
                return Err(not_found(&hook.id));
            }
            let stored = stored(&mut tx, SELECT_WEBHOOK, &hook.id).await?;
            let stored = stored.ok_or_else(|| not_found(&hook.id))?;
            tx.commit().await?;
            Ok(stored)
        })
        .await
    }

    async fn delete_webhook(&self, id: &WebhookId) -> Result<Webhook> {
        let id = id.clone();
        self.transaction(move |mut tx| async move {
            let hook = stored(&mut tx, SELECT_WEBHOOK, &id).await?;
            let hook = hook.ok_or_else(|| not_found(&id))?;
            let params = [Param::Text(id.as_str())];
            tx.execute(Run::write(DELETE_WEBHOOK, &params)).await?;
            tx.commit().await?;
            Ok(hook)
        })
        .await
    }

    async fn load_file_webhooks(&self, hooks: &[Webhook], start_cursor: u64) -> Result<()> {
        let hooks = hooks.to_vec();
        self.transaction(move |mut tx| async move {
            let earlier = Run::read(SELECT_FILE_WEBHOOK_IDS, &[]);
            for id in tx.rows(earlier, |row| row.text("id")).await? {
                if !hooks.iter().any(|h| h.id.as_str() == id) {
                    let params = [Param::Text(&id)];
                    tx.execute(Run::write(DELETE_WEBHOOK, &params)).await?;
                }
            }
            for hook in &hooks {
                let hook = Webhook {
                    cursor: start_cursor,
                    from_file: true,
                    ..hook.clone()
                };
                let params = WebhookRow::of(&hook).inserted();
                tx.execute(Run::write(UPSERT_FILE_WEBHOOK, &params)).await?;
            }
            tx.commit().await
        })
        .await
    }

    async fn lease_webhook(
        &self,
        id: &WebhookId,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool> {
        let (id, owner) = (id.clone(), owner.to_owned());
        self.statements(move |mut tx| async move {
            let leased = lease(&mut tx, &id, &owner, now, until).await?;
            tx.commit().await?;
            Ok(leased == 1)
        })
        .await
    }

    async fn release_webhook(&self, id: &WebhookId, owner: &str) -> Result<()> {
        let (id, owner) = (id.clone(), owner.to_owned());
        self.statements(move |mut tx| async move {
            let params = [Param::Text(id.as_str()), Param::Text(&owner)];
            tx.execute(Run::write(RELEASE_WEBHOOK, &params)).await?;
            tx.commit().await
        })
        .await
    }

    async fn record_delivered(&self, id: &WebhookId, owner: &str, cursor: u64) -> Result<bool> {
        let (id, owner) = (id.clone(), owner.to_owned());
        self.statements(move |mut tx| async move {
            let params = [
                Param::Int(cursor as i64),
                Param::Text(id.as_str()),
                Param::Text(&owner),
            ];
            let updated = tx.execute(Run::write(RECORD_DELIVERED, &params)).await?;
            tx.commit().await?;
            Ok(updated == 1)
        })
        .await
    }

    async fn record_failure(&self, failure: &DeliveryFailure) -> Result<Option<Webhook>> {
        let failure = failure.clone();
        self.statements(move |mut tx| async move {
            let reason = pause_reason(failure.pause_after, &failure.error);
            let params = [
                Param::Text(&failure.error),
                Param::Int(i64::from(failure.pause_after)),
                Param::Text(&reason),
                Param::Text(failure.webhook.as_str()),
                Param::Text(&failure.owner),
            ];
            let updated = tx.execute(Run::write(RECORD_FAILURE, &params)).await?;
            let stored = match updated {
                0 => None,
                _ => stored(&mut tx, SELECT_WEBHOOK, &failure.webhook).await?,
            };
            tx.commit().await?;
            Ok(stored)
        })
        .await
    }
}

/// The endpoint `id` as stored, read with `select` (either select of one endpoint).
async fn stored(tx: &mut impl SqlTx, select: &str, id: &WebhookId) -> Result<Option<Webhook>> {
    let params = [Param::Text(id.as_str())];
    let run = Run::read(select, &params);
    let rows = tx.rows(run, |row| webhook_from_row(row)).await?;
    Ok(rows.into_iter().next())
}

/// The select of one endpoint that [`Webhooks::update_webhook`] reads it with: locked where
/// replicas write at the same time.
fn locked<T: SqlTx>(_: &T) -> &'static str {
    match T::REPLICAS {
        true => SELECT_WEBHOOK_FOR_UPDATE,
        false => SELECT_WEBHOOK,
    }
}

/// Takes the lease on endpoint `id` for `owner` until `until`; how many rows it changed (one if
/// `owner` holds it now). Where replicas share the database, only once the lease of another
/// holder ran out by `now`; else whoever held it.
async fn lease<T: SqlTx>(
    tx: &mut T,
    id: &WebhookId,
    owner: &str,
    now: Timestamp,
    until: Timestamp,
) -> Result<u64> {
    let (owner, until) = (Param::Text(owner), Param::Int(until.as_micros()));
    let id = Param::Text(id.as_str());
    if T::REPLICAS {
        let params = [owner, until, id, Param::Int(now.as_micros())];
        tx.execute(Run::write(LEASE_WEBHOOK, &params)).await
    } else {
        let params = [owner, until, id];
        tx.execute(Run::write(TAKE_WEBHOOK_LEASE, &params)).await
    }
}
