//! Slack messages on Postgres: each one statement on the pool, shared by every replica (the
//! claim decides which replica posts a call).

use async_trait::async_trait;
use sqlx::Row as _;

use super::PostgresStore;
use crate::domain::CallKey;
use crate::error::Result;
use crate::store::SlackMessages;
use crate::store::slack_rows::{CLAIM, RECORD, SELECT, StoredSlackMessage};

#[async_trait]
impl SlackMessages for PostgresStore {
    async fn claim_slack_message(
        &self,
        key: &CallKey,
        owner: &str,
        at: i64,
        stale_before: i64,
    ) -> Result<bool> {
        let done = sqlx::query(CLAIM)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
            .bind(owner)
            .bind(at)
            .bind(stale_before)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn record_slack_message(&self, key: &CallKey, channel: &str, ts: &str) -> Result<()> {
        sqlx::query(RECORD)
            .bind(channel)
            .bind(ts)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn slack_message(&self, key: &CallKey) -> Result<Option<StoredSlackMessage>> {
        let row = sqlx::query(SELECT)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            Ok(StoredSlackMessage {
                owner: row.try_get(0)?,
                channel: row.try_get(1)?,
                ts: row.try_get(2)?,
            })
        })
        .transpose()
    }
}
