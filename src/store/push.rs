//! Web Push subscriptions' storage, written once for both backends over their transactions
//! ([`Transact`]): each write one statement (on Postgres on the pool, shared by every replica;
//! on SQLite a small transaction on the one writer thread), and so is the sender's read of them
//! (a few rows). Where replicas share the database ([`SqlTx::REPLICAS`]), each event's pushes
//! are claimed, so a fleet sends each push once; one broker process serves a SQLite file, and
//! every event is its own to push.

use async_trait::async_trait;

use super::PushSubscriptions;
use super::primitives::{Param, Run, SqlTx, Transact};
use super::push_rows::{
    ADVANCE_CURSOR, CLAIM_EVENT, DELETE, DELETE_OF_APPROVER, KEEP_CLAIMS, PRUNE_CLAIMS,
    PRUNE_EVERY, PUSH_CURSOR, SELECT_ALL, SELECT_CURSOR, StoredPushSubscription, UPSERT, groups_of,
    groups_text,
};
use crate::domain::Timestamp;
use crate::error::Result;

#[async_trait]
impl<S: Transact> PushSubscriptions for S {
    async fn add_push_subscription(&self, subscription: &StoredPushSubscription) -> Result<()> {
        let s = subscription.clone();
        self.statements(move |mut tx| async move {
            let groups = groups_text(&s.groups);
            let params = [
                Param::Text(&s.endpoint),
                Param::Text(&s.approver),
                Param::Flag(s.sees_all),
                Param::Text(&groups),
                Param::Text(&s.p256dh),
                Param::Text(&s.auth),
                Param::Int(s.created_at),
            ];
            tx.execute(Run::write(UPSERT, &params)).await?;
            tx.commit().await
        })
        .await
    }

    async fn remove_push_subscription(&self, endpoint: &str, approver: &str) -> Result<bool> {
        let (endpoint, approver) = (endpoint.to_owned(), approver.to_owned());
        self.statements(move |mut tx| async move {
            let params = [Param::Text(&endpoint), Param::Text(&approver)];
            let removed = tx.execute(Run::write(DELETE_OF_APPROVER, &params)).await?;
            tx.commit().await?;
            Ok(removed > 0)
        })
        .await
    }

    async fn drop_push_subscription(&self, endpoint: &str) -> Result<()> {
        let endpoint = endpoint.to_owned();
        self.statements(move |mut tx| async move {
            let params = [Param::Text(&endpoint)];
            tx.execute(Run::write(DELETE, &params)).await?;
            tx.commit().await
        })
        .await
    }

    async fn push_subscriptions(&self) -> Result<Vec<StoredPushSubscription>> {
        self.statements(move |mut tx| async move {
            let all = tx.rows(Run::read(SELECT_ALL, &[]), |row| {
                Ok(StoredPushSubscription {
                    endpoint: row.text("endpoint")?,
                    approver: row.text("approver")?,
                    sees_all: row.flag("sees_all")?,
                    groups: groups_of(&row.text("groups")?),
                    p256dh: row.text("p256dh")?,
                    auth: row.text("auth")?,
                    created_at: row.int("created_at")?,
                })
            });
            let all = all.await?;
            tx.commit().await?;
            Ok(all)
        })
        .await
    }

    async fn claim_push_event(&self, seq: u64) -> Result<bool> {
        if !S::Tx::REPLICAS {
            return Ok(true);
        }
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        self.statements(move |mut tx| async move {
            let params = [Param::Int(seq), Param::Int(Timestamp::now().as_micros())];
            let claimed = tx.execute(Run::write(CLAIM_EVENT, &params)).await?;
            if seq % PRUNE_EVERY == 0 {
                let params = [Param::Int(seq - KEEP_CLAIMS)];
                tx.execute(Run::write(PRUNE_CLAIMS, &params)).await?;
            }
            tx.commit().await?;
            Ok(claimed == 1)
        })
        .await
    }

    async fn push_cursor(&self) -> Result<Option<u64>> {
        event_cursor(self, PUSH_CURSOR).await
    }

    async fn record_push_cursor(&self, seq: u64) -> Result<()> {
        record_event_cursor(self, PUSH_CURSOR, seq).await
    }
}

/// Where `consumer` (`event_cursors`) stopped in the event log.
pub(super) async fn event_cursor<S: Transact>(
    store: &S,
    consumer: &'static str,
) -> Result<Option<u64>> {
    store
        .statements(move |mut tx| async move {
            let params = [Param::Text(consumer)];
            let seq = tx.rows(Run::read(SELECT_CURSOR, &params), |row| row.int("seq"));
            let seq = seq.await?;
            tx.commit().await?;
            Ok(seq.first().map(|seq| *seq as u64))
        })
        .await
}

/// Moves `consumer`'s position forward to `seq` (never back).
pub(super) async fn record_event_cursor<S: Transact>(
    store: &S,
    consumer: &'static str,
    seq: u64,
) -> Result<()> {
    let seq = i64::try_from(seq).unwrap_or(i64::MAX);
    store
        .statements(move |mut tx| async move {
            let params = [
                Param::Text(consumer),
                Param::Int(seq),
                Param::Int(Timestamp::now().as_micros()),
            ];
            tx.execute(Run::write(ADVANCE_CURSOR, &params)).await?;
            tx.commit().await
        })
        .await
}
