//! Web Push subscriptions on SQLite: each write its own small transaction on the one writer
//! thread, like webhook endpoints; the sender's read of them too (a few rows, read once per
//! event pushed).

use async_trait::async_trait;
use rusqlite::params;

use super::SqliteStore;
use crate::error::Result;
use crate::store::PushSubscriptions;
use crate::store::push_rows::{
    DELETE, DELETE_OF_APPROVER, SELECT_ALL, StoredPushSubscription, UPSERT, groups_of, groups_text,
};

#[async_trait]
impl PushSubscriptions for SqliteStore {
    async fn add_push_subscription(&self, subscription: &StoredPushSubscription) -> Result<()> {
        let s = subscription.clone();
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    conn.prepare_cached(UPSERT)?.execute(params![
                        s.endpoint,
                        s.approver,
                        s.sees_all,
                        groups_text(&s.groups),
                        s.p256dh,
                        s.auth,
                        s.created_at,
                    ])?;
                    Ok(())
                })
            })
            .await
    }

    async fn remove_push_subscription(&self, endpoint: &str, approver: &str) -> Result<bool> {
        let (endpoint, approver) = (endpoint.to_owned(), approver.to_owned());
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    Ok(conn
                        .prepare_cached(DELETE_OF_APPROVER)?
                        .execute(params![endpoint, approver])?
                        > 0)
                })
            })
            .await
    }

    async fn drop_push_subscription(&self, endpoint: &str) -> Result<()> {
        let endpoint = endpoint.to_owned();
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    conn.prepare_cached(DELETE)?.execute(params![endpoint])?;
                    Ok(())
                })
            })
            .await
    }

    async fn push_subscriptions(&self) -> Result<Vec<StoredPushSubscription>> {
        self.group
            .alone(move |writer| async move {
                writer.transact(|conn| {
                    let rows = conn
                        .prepare_cached(SELECT_ALL)?
                        .query_map([], |row| {
                            Ok(StoredPushSubscription {
                                endpoint: row.get(0)?,
                                approver: row.get(1)?,
                                sees_all: row.get(2)?,
                                groups: groups_of(&row.get::<_, String>(3)?),
                                p256dh: row.get(4)?,
                                auth: row.get(5)?,
                                created_at: row.get(6)?,
                            })
                        })?
                        .collect::<rusqlite::Result<Vec<_>>>()?;
                    Ok(rows)
                })
            })
            .await
    }

    /// One broker process serves a SQLite file: every event is its own to push.
    async fn claim_push_event(&self, _seq: u64) -> Result<bool> {
        Ok(true)
    }
}
