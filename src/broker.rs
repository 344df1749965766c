//! The broker's operations as the gRPC surface sees them: each one applies the domain's rules,
//! persists through the store, and only then tells the event fan-out and the deadline sweeper.
//! The services in `grpc/` translate protobuf to these calls and back, nothing more.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::domain::{CallKey, Decision, NewBatch, Timestamp};
use crate::error::Result;
use crate::events::EventBus;
use crate::expiry::DeadlineSweeper;
use crate::store::{CancelReport, CancelTarget, DecideReport, Store, SubmitReport};

/// Limits and defaults the broker applies to what clients send.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The largest tool input, in bytes of JSON text.
    pub max_input_bytes: usize,
    /// The deadline given to calls submitted without one.
    pub default_deadline: Option<Duration>,
    /// How many undelivered events a subscriber may have queued before its stream is ended.
    pub subscriber_buffer: usize,
}

pub struct Broker {
    store: Arc<dyn Store>,
    bus: Arc<EventBus>,
    sweeper: Arc<DeadlineSweeper>,
    limits: Limits,
    stopping: watch::Receiver<bool>,
}

impl Broker {
    pub fn new(
        store: Arc<dyn Store>,
        bus: Arc<EventBus>,
        sweeper: Arc<DeadlineSweeper>,
        limits: Limits,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        Self {
            store,
            bus,
            sweeper,
            limits,
            stopping,
        }
    }

    pub fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    pub fn bus(&self) -> &Arc<EventBus> {
        &self.bus
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Resolves when the server starts shutting down: long-lived streams end then.
    pub async fn stopping(&self) {
        let mut stopping = self.stopping.clone();
        // An error means the sender is gone: the server is gone too.
        let _ = stopping.wait_for(|stop| *stop).await;
    }

    /// Stores a batch (after giving calls without a deadline the default one).
    pub async fn submit(&self, mut batch: NewBatch) -> Result<SubmitReport> {
        if let Some(default) = self.limits.default_deadline {
            let deadline = Timestamp::now().saturating_add(default);
            for call in &mut batch.calls {
                call.deadline.get_or_insert(deadline);
            }
        }
        let has_deadline = batch.calls.iter().any(|c| c.deadline.is_some());
        let report = self.store.submit(batch).await?;
        self.bus.notify_committed();
        if has_deadline {
            self.sweeper.deadline_added();
        }
        Ok(report)
    }

    pub async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        let report = self.store.decide(key, decision).await?;
        if !report.replayed {
            self.bus.notify_committed();
        }
        Ok(report)
    }

    pub async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport> {
        let report = self.store.cancel(target).await?;
        if !report.cancelled.is_empty() {
            self.bus.notify_committed();
        }
        Ok(report)
    }
}
