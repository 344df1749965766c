//! Where a follower of the event log that must not miss events (Web Push's sender, Slack's
//! poster) stopped, stored (`event_cursors`, one row per follower), so that what was committed
//! while no broker followed, or while this one was behind, is handled when it catches up. One
//! mechanism for both: where to start, and how often the position is stored.
//!
//! [`Follower::follow`] reads the log from there and hands each event to the follower's
//! [`Handle`]. The position is stored at most once a [`CURSOR_EVERY`] while events flow (as webhook
//! delivery stores its own), so a broker that stops reads that stretch again at its next start:
//! what a follower does for an event must be safe to do twice (claimed, or idempotent).

use std::sync::Weak;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::background::events::{Delivery, EventBus};
use crate::error::{Error, Result};
use crate::store::Store;

/// How long a handled event may wait for the stored position to pass it.
pub const CURSOR_EVERY: Duration = Duration::from_secs(1);

/// The most events a starting follower catches up on: one that finds the stored position
/// further behind starts that far from the log's end.
pub const MAX_CATCH_UP: u64 = 50_000;

/// Which follower's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follower {
    Push,
    Slack,
}

impl Follower {
    fn name(self) -> &'static str {
        match self {
            Follower::Push => "Web Push",
            Follower::Slack => "the Slack poster",
        }
    }

    async fn stored(self, store: &dyn Store) -> Result<Option<u64>> {
        match self {
            Follower::Push => store.push_cursor().await,
            Follower::Slack => store.slack_cursor().await,
        }
    }

    async fn record(self, store: &dyn Store, seq: u64) -> Result<()> {
        match self {
            Follower::Push => store.record_push_cursor(seq).await,
            Follower::Slack => store.record_slack_cursor(seq).await,
        }
    }

    /// Where to follow from: the stored position, at most [`MAX_CATCH_UP`] behind the log's
    /// end; on a first start the log's end (stored at once, so that a broker stopped before any
    /// event catches up from there).
    pub async fn resume_point(self, store: &dyn Store) -> Result<u64> {
        let latest = store.latest_seq().await?;
        Ok(match self.stored(store).await? {
            Some(stored) if latest.saturating_sub(stored) > MAX_CATCH_UP => {
                tracing::warn!(
                    stored,
                    latest,
                    "{} was stopped long ago: only the last {MAX_CATCH_UP} events are caught up",
                    self.name()
                );
                latest - MAX_CATCH_UP
            }
            Some(stored) => stored.min(latest),
            None => {
                self.record(store, latest).await?;
                latest
            }
        })
    }
}

/// What a follower does with each event of the log.
#[async_trait]
pub trait Handle: Send + Sync {
    /// Handles one event: `delivery.live` when it came as it was published, otherwise it was
    /// read back from the log and its call may have changed since.
    async fn handle(&self, delivery: &Delivery);
}

impl Follower {
    /// Hands `handler` each event after `after`, storing the position as it goes, until the
    /// event bus stops. Events retention pruned before they were read are skipped (logged). The
    /// bus is held weakly: a follower must not keep a stopped broker's bus alive.
    pub async fn follow(
        self,
        store: &dyn Store,
        bus: Weak<EventBus>,
        mut after: u64,
        handler: &dyn Handle,
    ) {
        loop {
            let Some(mut feed) = bus.upgrade().map(|bus| bus.feed_after(after)) else {
                return;
            };
            let mut position = Position::new(self);
            let ended = loop {
                let due_in = position.due_in();
                tokio::select! {
                    next = feed.next() => match next {
                        Ok(delivery) => {
                            handler.handle(&delivery).await;
                            position.handled(store, delivery.event.seq).await;
                        }
                        Err(err) => {
                            // The broker stopping: keep what was done, if the store still can.
                            position.flush(store).await;
                            break err;
                        }
                    },
                    () = tokio::time::sleep(due_in.unwrap_or_default()), if due_in.is_some() => {
                        position.store_if_due(store).await;
                    }
                }
            };
            match ended {
                // None of them can be read any more: go on after them.
                Error::Pruned { through, .. } => {
                    tracing::warn!(
                        after,
                        through,
                        "{} skips events retention pruned before it read them",
                        self.name()
                    );
                    after = through;
                }
                err => {
                    tracing::debug!(error = %err, "{}'s event feed ended", self.name());
                    return;
                }
            }
        }
    }
}

/// A follower's position while it runs: the last event it handled, stored now and then.
pub struct Position {
    follower: Follower,
    unrecorded: Option<u64>,
    recorded_at: Instant,
}

impl Position {
    pub fn new(follower: Follower) -> Self {
        Self {
            follower,
            unrecorded: None,
            recorded_at: Instant::now(),
        }
    }

    /// How long until the position is due to be stored; `None` while nothing waits to be.
    pub fn due_in(&self) -> Option<Duration> {
        self.unrecorded
            .map(|_| CURSOR_EVERY.saturating_sub(self.recorded_at.elapsed()))
    }

    /// Every event up to `seq` was handled; stores it if the last store is [`CURSOR_EVERY`]
    /// old.
    pub async fn handled(&mut self, store: &dyn Store, seq: u64) {
        self.unrecorded = Some(seq);
        self.store_if_due(store).await;
    }

    /// Stores the position if it is due.
    pub async fn store_if_due(&mut self, store: &dyn Store) {
        let Some(seq) = self.unrecorded else {
            return;
        };
        if self.recorded_at.elapsed() < CURSOR_EVERY {
            return;
        }
        self.recorded_at = Instant::now();
        match self.follower.record(store, seq).await {
            Ok(()) => self.unrecorded = None,
            Err(error) => {
                tracing::warn!(%error, "cannot store where {} got to", self.follower.name());
            }
        }
    }

    /// Stores what was handled, if the store still can (the follower stopping).
    pub async fn flush(&mut self, store: &dyn Store) {
        if let Some(seq) = self.unrecorded.take() {
            let _ = self.follower.record(store, seq).await;
        }
    }
}
