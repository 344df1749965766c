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

    async fn claim_push_event(&self, seq: u64) -> Result<bool> {
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        let claimed = sqlx::query(CLAIM_EVENT)
            .bind(seq)
            .bind(crate::domain::Timestamp::now().as_micros())
            .execute(&self.pool)
            .await?;
        if seq % PRUNE_EVERY == 0 {
            sqlx::query(PRUNE_CLAIMS)
                .bind(seq - KEEP_CLAIMS)
                .execute(&self.pool)
                .await?;
        }
        Ok(claimed.rows_affected() == 1)
    }
}

/// The first replica to insert an event's sequence number pushes it.
const CLAIM_EVENT: &str =
    "INSERT INTO push_claims (seq, claimed_at) VALUES ($1, $2) ON CONFLICT (seq) DO NOTHING";
const PRUNE_CLAIMS: &str = "DELETE FROM push_claims WHERE seq < $1";
/// Claims kept behind the newest: far more than any replica lags.
const KEEP_CLAIMS: i64 = 100_000;
const PRUNE_EVERY: i64 = 1_000;
