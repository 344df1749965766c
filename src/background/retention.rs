//! Retention: a task that, every `--prune-every`, deletes the batches all of whose calls were
//! decided more than `--retain-decided` ago, with their events, a chunk at a time (see
//! `operations::prune`). Off unless `--retain-decided` is set: by default the broker keeps
//! everything. Pending calls, grants and rules are never pruned; neither is an event a webhook
//! endpoint has not delivered.

use std::sync::Arc;
use std::time::Duration;

use crate::domain::Timestamp;
use crate::error::Result;
use crate::operations::prune::PruneReport;
use crate::store::Lifecycle;

/// How long decided calls are kept, and how pruning paces itself.
#[derive(Debug, Clone, Copy)]
pub struct RetentionPolicy {
    /// Decided calls older than this (by their decision) are pruned.
    pub keep_decided: Duration,
    /// How often a prune runs.
    pub every: Duration,
    /// Calls looked at per transaction.
    pub chunk: u32,
}

pub struct Retention {
    store: Arc<dyn Lifecycle>,
    policy: RetentionPolicy,
}

impl Retention {
    pub fn new(store: Arc<dyn Lifecycle>, policy: RetentionPolicy) -> Arc<Self> {
        Arc::new(Self { store, policy })
    }

    /// Prunes what is older than the policy keeps, as of now. Returns what it deleted.
    pub async fn prune_now(&self) -> Result<PruneReport> {
        let cutoff = Timestamp::now().saturating_sub(self.policy.keep_decided);
        let report = self.store.prune_decided(cutoff, self.policy.chunk).await?;
        if report.batches > 0 {
            tracing::info!(
                calls = report.calls,
                events = report.events,
                pruned_through = report.pruned_through,
                "pruned decided calls past --retain-decided"
            );
        }
        crate::observe::meters::pruned(report.calls, report.events);
        Ok(report)
    }

    /// Runs until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        loop {
            if let Err(err) = self.prune_now().await {
                tracing::warn!(error = %err, "pruning decided calls failed; the next run retries");
            }
            tokio::time::sleep(self.policy.every).await;
        }
    }
}
