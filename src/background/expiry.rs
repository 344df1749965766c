//! Deadlines: a task that turns every pending call whose deadline has passed into EXPIRED,
//! including calls that fell due while the broker was down (the first sweep runs at start), and
//! fires the escalation steps (reminders, escalations) that fell due, each once, before it
//! expires anything (a step due before a deadline comes before the EXPIRED it precedes).
//! It sleeps until the earliest deadline or step (at most a second), and is woken early when a
//! call with a deadline or a ladder is submitted. It decides when; the writes themselves go
//! through the broker ([`Sweeps`]), so they are followed by the same after-commit step as every
//! other write of calls.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::domain::Timestamp;
use crate::error::Result;
use crate::store::Deadlines;

/// The longest the sweeper sleeps between two sweeps.
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// The writes a sweep makes: the broker's, which follows each commit with its one after-commit
/// step (`Broker::committed`), as it does its own writes.
#[async_trait]
pub trait Sweeps: Send + Sync {
    /// Fires every escalation step of a pending call due at or before `now`; how many fired.
    async fn escalate_due(&self, now: Timestamp) -> Result<u64>;
    /// Expires every pending call whose deadline is at or before `now`; how many expired.
    async fn expire_due(&self, now: Timestamp) -> Result<usize>;
}

pub struct DeadlineSweeper {
    store: Arc<dyn Deadlines>,
    deadline_added: Notify,
}

impl DeadlineSweeper {
    pub fn new(store: Arc<dyn Deadlines>) -> Arc<Self> {
        Arc::new(Self {
            store,
            deadline_added: Notify::new(),
        })
    }

    /// Fires the steps due, then expires the calls due: what a sweep does, through `writes`.
    pub async fn sweep(&self, writes: &dyn Sweeps) -> Result<()> {
        let now = Timestamp::now();
        // A read first: without a step due, the writer is not asked for a transaction.
        if self
            .store
            .next_step_due()
            .await?
            .is_some_and(|at| at <= now)
        {
            writes.escalate_due(now).await?;
        }
        writes.expire_due(Timestamp::now()).await?;
        Ok(())
    }

    /// The earliest deadline or step still to come, if any.
    async fn next_due(&self) -> Result<Option<Timestamp>> {
        let deadline = self.store.next_deadline().await?;
        let step = self.store.next_step_due().await?;
        Ok(deadline.into_iter().chain(step).min())
    }

    /// Wakes the sweeper: a call with a deadline (or an escalation ladder) was stored.
    pub fn deadline_added(&self) {
        self.deadline_added.notify_one();
    }

    /// Sweeps through `writes` until the task is dropped.
    pub async fn run(self: Arc<Self>, writes: Arc<dyn Sweeps>) {
        loop {
            if let Err(err) = self.sweep(&*writes).await {
                tracing::warn!(error = %err, "escalating or expiring due calls failed; retrying");
            }
            let sleep = match self.next_due().await {
                Ok(Some(next)) => Timestamp::now().until(next).min(MAX_SLEEP),
                Ok(None) => MAX_SLEEP,
                Err(err) => {
                    tracing::warn!(error = %err, "reading the next deadline or step failed");
                    MAX_SLEEP
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = self.deadline_added.notified() => {}
            }
        }
    }
}
