//! Deadlines: a task that turns every pending call whose deadline has passed into EXPIRED,
//! including calls that fell due while the broker was down (the first sweep runs at start), and
//! fires the escalation steps (reminders, escalations) that fell due, each once, before it
//! expires anything (a step due before a deadline comes before the EXPIRED it precedes).
//! It sleeps until the earliest deadline or step (at most a second), and is woken early when a
//! call with a deadline or a ladder is submitted.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::background::events::EventBus;
use crate::domain::Timestamp;
use crate::error::Result;
use crate::store::Deadlines;

/// The longest the sweeper sleeps between two sweeps.
const MAX_SLEEP: Duration = Duration::from_secs(1);

pub struct DeadlineSweeper {
    store: Arc<dyn Deadlines>,
    bus: Arc<EventBus>,
    deadline_added: Notify,
}

impl DeadlineSweeper {
    pub fn new(store: Arc<dyn Deadlines>, bus: Arc<EventBus>) -> Arc<Self> {
        Arc::new(Self {
            store,
            bus,
            deadline_added: Notify::new(),
        })
    }

    /// Expires every call that is due now. Returns how many expired.
    pub async fn expire_due(&self) -> Result<usize> {
        let expired = self.store.expire_due(Timestamp::now()).await?;
        if !expired.is_empty() {
            tracing::info!(count = expired.len(), "expired calls past their deadline");
            self.bus.committed(&expired);
        }
        Ok(expired.len())
    }

    /// Fires every escalation step that is due now. Returns how many fired.
    pub async fn escalate_due(&self) -> Result<u64> {
        let now = Timestamp::now();
        // A read first: without a step due, the writer is not asked for a transaction.
        if self.store.next_step_due().await?.is_none_or(|at| at > now) {
            return Ok(0);
        }
        let fired = self.store.escalate_due(now).await?;
        if fired > 0 {
            tracing::info!(
                count = fired,
                "escalation steps fired for calls still pending"
            );
            self.bus.committed(std::iter::empty());
        }
        Ok(fired)
    }

    /// Fires the steps due, then expires the calls due: what a sweep does.
    pub async fn sweep(&self) -> Result<()> {
        self.escalate_due().await?;
        self.expire_due().await?;
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

    /// Runs until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        loop {
            if let Err(err) = self.sweep().await {
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
