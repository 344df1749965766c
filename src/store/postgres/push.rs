//! Web Push subscriptions on Postgres: each write one statement on the pool, shared by every
//! replica (any replica's sender reads them all).

use async_trait::async_trait;
use sqlx::Row as _;

use super::PostgresStore;
use crate::error::Result;
use crate::store::PushSubscriptions;
use crate::store::push_rows::{
    DELETE, DELETE_OF_APPROVER, SELECT_ALL, StoredPushSubscription, UPSERT, groups_of, groups_text,
};

#[async_trait]
impl PushSubscriptions for PostgresStore {
    async fn add_push_subscription(&self, s: &StoredPushSubscription) -> Result<()> {
        sqlx::query(UPSERT)
            .bind(&s.endpoint)
            .bind(&s.approver)
            .bind(s.sees_all)
            .bind(groups_text(&s.groups))
            .bind(&s.p256dh)
            .bind(&s.auth)
            .bind(s.created_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn remove_push_subscription(&self, endpoint: &str, approver: &str) -> Result<bool> {
        let done = sqlx::query(DELETE_OF_APPROVER)
            .bind(endpoint)
            .bind(approver)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn drop_push_subscription(&self, endpoint: &str) -> Result<()> {
        sqlx::query(DELETE)
            .bind(endpoint)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn push_subscriptions(&self) -> Result<Vec<StoredPushSubscription>> {
        let rows = sqlx::query(SELECT_ALL).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                Ok(StoredPushSubscription {
                    endpoint: row.try_get(0)?,
                    approver: row.try_get(1)?,
                    sees_all: row.try_get(2)?,
                    groups: groups_of(&row.try_get::<String, _>(3)?),
                    p256dh: row.try_get(4)?,
                    auth: row.try_get(5)?,
                    created_at: row.try_get(6)?,
                })
            })
            .collect()
    }
}
