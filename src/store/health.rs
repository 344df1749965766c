//! Whether the store can write, as `grpc.health.v1.Health` reports it.
//!
//! A broker whose every write fails (a full disk, a read-only or deleted file, Postgres down)
//! must not look healthy: load balancers and orchestrators would keep sending it clients.
//! [`Watched`] wraps the store and watches the results that prove something: a storage fault
//! (`Error::storage_fault`) from any operation makes the storage *failing*; a write that stored
//! something makes it *writable* again, except after corruption, which only an operator mends. [`probe_while_open`] writes a little every second, so the
//! state follows the storage when no client writes, and recovers as soon as writes work again.
//! It never retries or hides a client's failure: it only reports.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use super::{
    Backend, BackendReads, Calls, CommittedEvents, Deadlines, EventLog, Lifecycle, Policies, Store,
    Webhooks,
};
use crate::domain::policy::{
    ExplainTarget, Explanation, RevokeReport, RevokeTarget, Rule, RuleId, RuleMode, ShadowVerdict,
};
use crate::domain::webhook::{DeliveryFailure, Webhook, WebhookChange, WebhookId};
use crate::domain::{
    AgentId, BatchId, Call, CallId, CallKey, CallPage, CallQuery, CancelReport, CancelTarget,
    DecideReport, Decision, Event, GrantPage, GrantQuery, NewBatch, SessionId, SubmitReport,
    Timestamp,
};
use crate::error::{Error, Result, StorageFault};

/// How often [`probe_while_open`] writes.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The storage's state: `None` while writes work, else the fault that made the last one fail.
pub struct StorageHealth {
    state: watch::Sender<Option<StorageFault>>,
}

impl StorageHealth {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: watch::Sender::new(None),
        })
    }

    /// The state now and its changes.
    pub fn subscribe(&self) -> watch::Receiver<Option<StorageFault>> {
        self.state.subscribe()
    }

    /// Takes note of `result`: a storage fault makes the storage failing; success makes it
    /// writable if `wrote` says the success wrote to the database.
    fn observe<T>(&self, result: &Result<T>, wrote: impl FnOnce(&T) -> bool) {
        match result {
            Err(err) => self.observe_error(err),
            Ok(value) if wrote(value) => {
                self.state.send_if_modified(|state| {
                    // Corruption does not mend itself, however many writes succeed: only an
                    // operator restoring the database (and restarting the broker) does.
                    if matches!(state, None | Some(StorageFault::Corrupt)) {
                        return false;
                    }
                    tracing::info!("storage writable again: health is SERVING");
                    *state = None;
                    true
                });
            }
            Ok(_) => {}
        }
    }

    /// Takes note of a failed read or write: a storage fault makes the storage failing.
    fn observe_error(&self, err: &Error) {
        count_storage_error(err);
        let Some(fault) = err.storage_fault() else {
            return;
        };
        self.state.send_if_modified(|state| {
            if *state == Some(fault) || *state == Some(StorageFault::Corrupt) {
                return false;
            }
            tracing::error!(
                error = %err,
                %fault,
                "storage failing: writes fail, health is NOT_SERVING until one succeeds"
            );
            *state = Some(fault);
            true
        });
    }
}

/// Counts an error of the storage itself (not a client's mistake the store refused), by fault.
fn count_storage_error(err: &Error) {
    let fault = match err.storage_fault() {
        Some(StorageFault::Full) => "full",
        Some(StorageFault::Unavailable) => "unavailable",
        Some(StorageFault::Corrupt) => "corrupt",
        None if matches!(
            err,
            Error::Storage { .. } | Error::Migrate(_) | Error::Internal(_)
        ) =>
        {
            "other"
        }
        None => return,
    };
    crate::observe::meters::store_error(fault);
}

/// A store whose results feed a [`StorageHealth`]. Everything else passes straight through.
pub struct Watched {
    inner: Arc<dyn Store>,
    health: Arc<StorageHealth>,
}

impl Watched {
    pub fn new(inner: Arc<dyn Store>, health: Arc<StorageHealth>) -> Self {
        Self { inner, health }
    }

    /// A read, or a write that proves nothing when it succeeds (it may have written nothing).
    fn read<T>(&self, result: Result<T>) -> Result<T> {
        self.health.observe(&result, |_| false);
        result
    }
}

/// Probes `store` every [`PROBE_EVERY`] for as long as the task runs. Meant for a [`Watched`]
/// store, which turns each probe's result into health.
pub async fn probe_while_open(store: Arc<dyn Store>) {
    loop {
        if let Err(err) = store.probe().await
            && err.storage_fault().is_none()
        {
            tracing::warn!(error = %err, "the storage probe failed");
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

impl Backend for Watched {
    fn reads(&self) -> &BackendReads {
        self.inner.reads()
    }

    // The reads the store's traits provide (receipts) are watched here, not re-declared.
    fn saw_read(&self, failed: Option<&Error>) {
        if let Some(err) = failed {
            self.health.observe_error(err);
        }
    }
}

#[async_trait]
impl Calls for Watched {
    async fn submit(&self, batch: NewBatch) -> Result<SubmitReport> {
        let result = self.inner.submit(batch).await;
        self.health
            .observe(&result, |report| report.batch_id.is_some());
        result
    }

    async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        let result = self.inner.decide(key, decision).await;
        self.health.observe(&result, |report| !report.replayed);
        result
    }

    async fn preview_decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        self.read(self.inner.preview_decide(key, decision).await)
    }

    async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport> {
        let result = self.inner.cancel(target).await;
        self.health
            .observe(&result, |report| !report.cancelled.is_empty());
        result
    }

    async fn calls_by_id(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
    ) -> Result<Vec<Option<Call>>> {
        self.read(self.inner.calls_by_id(agent, session, call_ids).await)
    }

    async fn batch_calls(&self, batch: &BatchId) -> Result<Vec<Call>> {
        self.read(self.inner.batch_calls(batch).await)
    }

    async fn list_calls(&self, query: &CallQuery) -> Result<CallPage> {
        self.read(self.inner.list_calls(query).await)
    }

    async fn probe(&self) -> Result<()> {
        let result = self.inner.probe().await;
        self.health.observe(&result, |()| true);
        result
    }
}

#[async_trait]
impl Deadlines for Watched {
    async fn expire_due(&self, now: Timestamp) -> Result<Vec<Call>> {
        let result = self.inner.expire_due(now).await;
        self.health.observe(&result, |expired| !expired.is_empty());
        result
    }

    async fn pending_count(&self) -> Result<u64> {
        self.read(self.inner.pending_count().await)
    }

    async fn next_deadline(&self) -> Result<Option<Timestamp>> {
        self.read(self.inner.next_deadline().await)
    }

    async fn escalate_due(&self, now: Timestamp) -> Result<u64> {
        let result = self.inner.escalate_due(now).await;
        self.health.observe(&result, |fired| *fired > 0);
        result
    }

    async fn next_step_due(&self) -> Result<Option<Timestamp>> {
        self.read(self.inner.next_step_due().await)
    }
}

#[async_trait]
impl EventLog for Watched {
    async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>> {
        self.read(self.inner.events_after(after, limit).await)
    }

    async fn latest_seq(&self) -> Result<u64> {
        self.read(self.inner.latest_seq().await)
    }

    async fn sequence_events(&self) -> Result<u64> {
        // A backend without a sequencer succeeds without writing anything.
        self.read(self.inner.sequence_events().await)
    }

    fn remote_commits(&self) -> Option<Arc<super::RemoteCommits>> {
        self.inner.remote_commits()
    }

    fn take_committed_events(&self) -> Option<CommittedEvents> {
        self.inner.take_committed_events()
    }
}

#[async_trait]
impl Policies for Watched {
    async fn revoke_grants(&self, target: &RevokeTarget, by: &str) -> Result<RevokeReport> {
        let result = self.inner.revoke_grants(target, by).await;
        self.health.observe(&result, |report| report.revoked > 0);
        result
    }

    async fn list_grants(&self, query: &GrantQuery) -> Result<GrantPage> {
        self.read(self.inner.list_grants(query).await)
    }

    async fn create_rule(&self, rule: &Rule) -> Result<Rule> {
        self.read(self.inner.create_rule(rule).await)
    }

    async fn delete_rule(&self, id: &RuleId) -> Result<Rule> {
        self.read(self.inner.delete_rule(id).await)
    }

    async fn list_rules(&self) -> Result<Vec<Rule>> {
        self.read(self.inner.list_rules().await)
    }

    async fn set_rule_mode(&self, id: &RuleId, mode: RuleMode) -> Result<Rule> {
        self.read(self.inner.set_rule_mode(id, mode).await)
    }

    async fn shadow_verdicts(&self, key: &CallKey) -> Result<Vec<ShadowVerdict>> {
        self.read(self.inner.shadow_verdicts(key).await)
    }

    async fn load_file_rules(&self, rules: &[Rule]) -> Result<()> {
        self.read(self.inner.load_file_rules(rules).await)
    }

    async fn explain(&self, target: &ExplainTarget) -> Result<Explanation> {
        self.read(self.inner.explain(target).await)
    }
}

#[async_trait]
impl Webhooks for Watched {
    async fn create_webhook(&self, hook: &Webhook) -> Result<Webhook> {
        self.read(self.inner.create_webhook(hook).await)
    }

    async fn webhooks(&self) -> Result<Vec<Webhook>> {
        self.read(self.inner.webhooks().await)
    }

    async fn webhook(&self, id: &WebhookId) -> Result<Webhook> {
        self.read(self.inner.webhook(id).await)
    }

    async fn update_webhook(&self, id: &WebhookId, change: WebhookChange) -> Result<Webhook> {
        self.read(self.inner.update_webhook(id, change).await)
    }

    async fn delete_webhook(&self, id: &WebhookId) -> Result<Webhook> {
        self.read(self.inner.delete_webhook(id).await)
    }

    async fn load_file_webhooks(&self, hooks: &[Webhook], start_cursor: u64) -> Result<()> {
        self.read(self.inner.load_file_webhooks(hooks, start_cursor).await)
    }

    async fn lease_webhook(
        &self,
        id: &WebhookId,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool> {
        self.read(self.inner.lease_webhook(id, owner, now, until).await)
    }

    async fn release_webhook(&self, id: &WebhookId, owner: &str) -> Result<()> {
        self.read(self.inner.release_webhook(id, owner).await)
    }

    async fn record_delivered(&self, id: &WebhookId, owner: &str, cursor: u64) -> Result<bool> {
        self.read(self.inner.record_delivered(id, owner, cursor).await)
    }

    async fn record_failure(&self, failure: &DeliveryFailure) -> Result<Option<Webhook>> {
        self.read(self.inner.record_failure(failure).await)
    }
}

#[async_trait]
impl crate::store::PushSubscriptions for Watched {
    async fn add_push_subscription(
        &self,
        subscription: &crate::store::StoredPushSubscription,
    ) -> Result<()> {
        self.read(self.inner.add_push_subscription(subscription).await)
    }

    async fn remove_push_subscription(&self, endpoint: &str, approver: &str) -> Result<bool> {
        self.read(
            self.inner
                .remove_push_subscription(endpoint, approver)
                .await,
        )
    }

    async fn drop_push_subscription(&self, endpoint: &str) -> Result<()> {
        self.read(self.inner.drop_push_subscription(endpoint).await)
    }

    async fn push_subscriptions(&self) -> Result<Vec<crate::store::StoredPushSubscription>> {
        self.read(self.inner.push_subscriptions().await)
    }

    async fn claim_push_event(&self, seq: u64) -> Result<bool> {
        self.read(self.inner.claim_push_event(seq).await)
    }
}

#[async_trait]
impl crate::store::Passkeys for Watched {
    async fn issue_passkey_challenge(
        &self,
        challenge: &crate::domain::passkey::Challenge,
    ) -> Result<()> {
        self.read(self.inner.issue_passkey_challenge(challenge).await)
    }

    async fn register_passkey(
        &self,
        registration: crate::domain::passkey::Registration,
    ) -> Result<crate::domain::passkey::Passkey> {
        self.read(self.inner.register_passkey(registration).await)
    }

    async fn passkeys(
        &self,
        approver: Option<&str>,
    ) -> Result<Vec<crate::domain::passkey::Passkey>> {
        self.read(self.inner.passkeys(approver).await)
    }

    async fn revoke_passkey(
        &self,
        credential_id: &str,
        by: &str,
    ) -> Result<crate::domain::passkey::Passkey> {
        self.read(self.inner.revoke_passkey(credential_id, by).await)
    }
}

#[async_trait]
impl crate::store::SlackMessages for Watched {
    async fn claim_slack_message(
        &self,
        key: &CallKey,
        owner: &str,
        at: i64,
        stale_before: i64,
    ) -> Result<bool> {
        self.read(
            self.inner
                .claim_slack_message(key, owner, at, stale_before)
                .await,
        )
    }

    async fn record_slack_message(&self, key: &CallKey, channel: &str, ts: &str) -> Result<()> {
        self.read(self.inner.record_slack_message(key, channel, ts).await)
    }

    async fn slack_message(
        &self,
        key: &CallKey,
    ) -> Result<Option<crate::store::StoredSlackMessage>> {
        self.read(self.inner.slack_message(key).await)
    }
}

#[async_trait]
impl Lifecycle for Watched {
    async fn prune_decided(
        &self,
        cutoff: Timestamp,
        chunk: u32,
    ) -> Result<crate::operations::prune::PruneReport> {
        let result = self.inner.prune_decided(cutoff, chunk).await;
        self.health.observe(&result, |report| report.batches > 0);
        result
    }

    async fn pruned_through(&self) -> Result<u64> {
        self.read(self.inner.pruned_through().await)
    }

    async fn backup(&self, to: &std::path::Path) -> Result<()> {
        // A backup writes another file, not the database: its failure (say, that file's disk
        // is full) says nothing about whether the database can be written.
        self.inner.backup(to).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn failed(fault: StorageFault) -> Result<bool> {
        Err(Error::StorageFault {
            fault,
            cause: "for the test".into(),
        })
    }

    /// Storage is failing from the first storage fault until a success that wrote something; a
    /// client's own error or a success that wrote nothing proves nothing either way. Corruption
    /// stays reported whatever succeeds after it.
    #[test]
    fn only_a_write_that_wrote_mends_failing_storage_and_corruption_stays() {
        let health = StorageHealth::new();
        let state = health.subscribe();
        let wrote = |wrote: &bool| *wrote;
        health.observe(&failed(StorageFault::Unavailable), wrote);
        assert_eq!(*state.borrow(), Some(StorageFault::Unavailable));
        health.observe(&Err(Error::NotFound("no such call".into())), wrote);
        health.observe(&Ok(false), wrote);
        assert_eq!(*state.borrow(), Some(StorageFault::Unavailable));
        health.observe(&Ok(true), wrote);
        assert_eq!(*state.borrow(), None);

        health.observe(&failed(StorageFault::Corrupt), wrote);
        health.observe(&Ok(true), wrote);
        health.observe(&failed(StorageFault::Full), wrote);
        assert_eq!(*state.borrow(), Some(StorageFault::Corrupt));
    }
}
