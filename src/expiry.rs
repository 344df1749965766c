//! Deadlines: a task that turns every pending call whose deadline has passed into EXPIRED,
//! including calls that fell due while the broker was down (the first sweep runs at start).
//! It sleeps until the earliest deadline (at most a second), and is woken early when a call
//! with a deadline is submitted.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::domain::Timestamp;
use crate::error::Result;
use crate::events::EventBus;
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
            self.bus.notify_committed();
            crate::meters::outcomes(&expired);
            crate::telemetry::outcomes_written(&expired);
        }
        Ok(expired.len())
    }

    /// Wakes the sweeper: a call with a deadline was stored.
    pub fn deadline_added(&self) {
        self.deadline_added.notify_one();
    }

    /// Runs until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        loop {
            if let Err(err) = self.expire_due().await {
                tracing::warn!(error = %err, "expiring due calls failed; retrying");
            }
            let sleep = match self.store.next_deadline().await {
                Ok(Some(next)) => Timestamp::now().until(next).min(MAX_SLEEP),
                Ok(None) => MAX_SLEEP,
                Err(err) => {
                    tracing::warn!(error = %err, "reading the next deadline failed");
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
