//! Slack messages on SQLite: each write its own small transaction on the one writer thread, like
//! webhook endpoints; the read of one row there too (once per event of a posted call).

use async_trait::async_trait;
use rusqlite::{OptionalExtension as _, params};

use super::SqliteStore;
use crate::domain::CallKey;
use crate::error::Result;
use crate::store::SlackMessages;
use crate::store::slack_rows::{CLAIM, RECORD, SELECT, StoredSlackMessage};

#[async_trait]
impl SlackMessages for SqliteStore {
    async fn claim_slack_message(
        &self,
        key: &CallKey,
        owner: &str,
        at: i64,
        stale_before: i64,
    ) -> Result<bool> {
        let (key, owner) = (key.clone(), owner.to_owned());
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    Ok(conn.prepare_cached(CLAIM)?.execute(params![
                        key.agent.as_str(),
                        key.session.as_str(),
                        key.call_id.as_str(),
                        owner,
                        at,
                        stale_before,
                    ])? > 0)
                })
            })
            .await
    }

    async fn record_slack_message(&self, key: &CallKey, channel: &str, ts: &str) -> Result<()> {
        let (key, channel, ts) = (key.clone(), channel.to_owned(), ts.to_owned());
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    conn.prepare_cached(RECORD)?.execute(params![
                        channel,
                        ts,
                        key.agent.as_str(),
                        key.session.as_str(),
                        key.call_id.as_str(),
                    ])?;
                    Ok(())
                })
            })
            .await
    }

    async fn slack_message(&self, key: &CallKey) -> Result<Option<StoredSlackMessage>> {
        let key = key.clone();
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    Ok(conn
                        .prepare_cached(SELECT)?
                        .query_row(
                            params![
                                key.agent.as_str(),
                                key.session.as_str(),
                                key.call_id.as_str()
                            ],
                            |row| {
                                Ok(StoredSlackMessage {
                                    owner: row.get(0)?,
                                    channel: row.get(1)?,
                                    ts: row.get(2)?,
                                })
                            },
                        )
                        .optional()?)
                })
            })
            .await
    }
}
