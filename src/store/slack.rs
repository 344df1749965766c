//! Slack messages' storage, written once for both backends over their transactions
//! ([`Transact`]): each write and the read of one row one statement (on Postgres on the pool,
//! shared by every replica, where the claim decides which replica posts a call; on SQLite a
//! small transaction on the one writer thread). The poster's position in the event log is kept
//! as Web Push's is (`event_cursors`, its own row).

use async_trait::async_trait;

use super::SlackMessages;
use super::primitives::{Param, Run, SqlTx, Transact};
use super::push::{event_cursor, record_event_cursor};
use super::push_rows::SLACK_CURSOR;
use super::slack_rows::{CLAIM, RECORD, SELECT, StoredSlackMessage};
use crate::domain::CallKey;
use crate::error::Result;

#[async_trait]
impl<S: Transact> SlackMessages for S {
    async fn claim_slack_message(
        &self,
        key: &CallKey,
        owner: &str,
        at: i64,
        stale_before: i64,
    ) -> Result<bool> {
        let (key, owner) = (key.clone(), owner.to_owned());
        self.statements(move |mut tx| async move {
            let [agent, session, call] = of_call(&key);
            let params = [
                agent,
                session,
                call,
                Param::Text(&owner),
                Param::Int(at),
                Param::Int(stale_before),
            ];
            let claimed = tx.execute(Run::write(CLAIM, &params)).await?;
            tx.commit().await?;
            Ok(claimed > 0)
        })
        .await
    }

    async fn record_slack_message(&self, key: &CallKey, channel: &str, ts: &str) -> Result<()> {
        let (key, channel, ts) = (key.clone(), channel.to_owned(), ts.to_owned());
        self.statements(move |mut tx| async move {
            let [agent, session, call] = of_call(&key);
            let params = [
                Param::Text(&channel),
                Param::Text(&ts),
                agent,
                session,
                call,
            ];
            tx.execute(Run::write(RECORD, &params)).await?;
            tx.commit().await
        })
        .await
    }

    async fn slack_message(&self, key: &CallKey) -> Result<Option<StoredSlackMessage>> {
        let key = key.clone();
        self.statements(move |mut tx| async move {
            let params = of_call(&key);
            let message = tx.rows(Run::read(SELECT, &params), |row| {
                Ok(StoredSlackMessage {
                    owner: row.text("owner")?,
                    channel: row.text("channel")?,
                    ts: row.text("ts")?,
                })
            });
            let message = message.await?.into_iter().next();
            tx.commit().await?;
            Ok(message)
        })
        .await
    }
    async fn slack_cursor(&self) -> Result<Option<u64>> {
        event_cursor(self, SLACK_CURSOR).await
    }

    async fn record_slack_cursor(&self, seq: u64) -> Result<()> {
        record_event_cursor(self, SLACK_CURSOR, seq).await
    }
}

/// The call's key as the statements bind it: agent, session, call id.
fn of_call(key: &CallKey) -> [Param<'_>; 3] {
    [
        Param::Text(key.agent.as_str()),
        Param::Text(key.session.as_str()),
        Param::Text(key.call_id.as_str()),
    ]
}
