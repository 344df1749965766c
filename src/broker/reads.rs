//! What the API reads, through the broker: calls, batches, grants, rules, and the head of the
//! event log. Thin on purpose: reads change nothing, so there is nothing to notify; they are
//! here so the surface depends on the broker alone, never on the store.
//!
//! A read for a reader (a [`Viewer`]) asks [`Call::visible_to`] of every call it returns: a
//! call the reader may not see is left out of lists, and a read naming it answers NOT_FOUND word
//! for word as for an unknown id, so nothing tells the reader it exists.

use super::Broker;
use crate::domain::policy::{Rule, ShadowVerdict};
use crate::domain::{
    AgentId, BatchId, Call, CallId, CallKey, CallPage, CallQuery, GrantPage, GrantQuery, SessionId,
    Viewer,
};
use crate::error::Result;

impl Broker {
    /// The last sequence number in the event log, covering every commit so far.
    pub async fn latest_seq(&self) -> Result<u64> {
        self.store.latest_seq().await
    }

    /// One call, or NOT_FOUND naming it.
    pub async fn call(&self, key: &CallKey) -> Result<Call> {
        let found = self
            .calls_by_id(&key.agent, &key.session, std::slice::from_ref(&key.call_id))
            .await?;
        found
            .into_iter()
            .next()
            .flatten()
            .ok_or_else(|| key.not_found())
    }

    /// One call as `viewer` may read it: NOT_FOUND naming it, the same for a call it may not
    /// see as for an unknown one.
    pub async fn visible_call(&self, key: &CallKey, viewer: &Viewer) -> Result<Call> {
        self.call(key).await?.shown_to(viewer, key)
    }

    /// Nothing if `viewer` may read call `key`; NOT_FOUND, as for an unknown call, if not. For a
    /// read that fetches the call itself (and answers an unknown one the same way): a reader
    /// who sees every call costs it no read.
    pub async fn require_visible(&self, key: &CallKey, viewer: &Viewer) -> Result<()> {
        if viewer.sees_every_call() {
            return Ok(());
        }
        self.visible_call(key, viewer).await.map(drop)
    }

    /// The named calls of a session that `viewer` may read, in the order asked; `None` for
    /// unknown ids and for calls it may not see alike.
    pub async fn visible_calls_by_id(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
        viewer: &Viewer,
    ) -> Result<Vec<Option<Call>>> {
        let found = self.calls_by_id(agent, session, call_ids).await?;
        Ok(found
            .into_iter()
            .map(|call| call.filter(|c| c.visible_to(viewer)))
            .collect())
    }

    /// One call as `viewer` may read it (NOT_FOUND otherwise, as for an unknown one), with what
    /// the shadow rules would have done with it at its submit: the audit's view of a call.
    pub async fn audited_call(
        &self,
        key: &CallKey,
        viewer: &Viewer,
    ) -> Result<(Call, Vec<ShadowVerdict>)> {
        let call = self.visible_call(key, viewer).await?;
        let shadow = self.store.shadow_verdicts(key).await?;
        Ok((call, shadow))
    }

    /// The named calls of a session, in the order asked; `None` for unknown ids.
    pub async fn calls_by_id(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
    ) -> Result<Vec<Option<Call>>> {
        self.store.calls_by_id(agent, session, call_ids).await
    }

    /// The calls of a batch, in position order.
    pub async fn batch_calls(&self, batch: &BatchId) -> Result<Vec<Call>> {
        self.store.batch_calls(batch).await
    }

    /// A page of calls matching `query`, oldest first.
    pub async fn list_calls(&self, query: &CallQuery) -> Result<CallPage> {
        self.store.list_calls(query).await
    }

    /// A page of grants matching `query`, oldest first.
    pub async fn list_grants(&self, query: &GrantQuery) -> Result<GrantPage> {
        self.store.list_grants(query).await
    }

    /// Every rule.
    pub async fn list_rules(&self) -> Result<Vec<Rule>> {
        self.store.list_rules().await
    }
}
