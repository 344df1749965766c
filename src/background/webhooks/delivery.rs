//! One endpoint's delivery task: reads the events after the endpoint's cursor (from the event
//! fan-out, which catches up from the durable log), POSTs the ones its filter admits, and
//! moves the cursor only once every event of a batch was delivered, so nothing is lost (a
//! crash or a failure delivers again: at least once, with the same `webhook-id`).
//!
//! Order per call: within a batch, the events of one call are sent one after the other, and a
//! batch ends before the next begins; different calls go in parallel, up to the endpoint's
//! `max_in_flight`. A failed attempt is recorded (the endpoint's last error and its run of
//! failures, which pauses it at `pause_after`), and only what was not delivered is retried,
//! after an exponential backoff with jitter. The backoff is waited out: only a new URL for the
//! endpoint ends it early (new events, and the dispatcher's rescans, do not), and the lease is
//! renewed meanwhile, so a five-minute wait does not hand the endpoint to another replica. The
//! task ends when the endpoint is paused or deleted, or when this process lost its lease.
//!
//! The cursor is a durable write, so it is stored at most once per [`CURSOR_EVERY`] while events
//! flow, and within that time once they stop: storing it after every batch made each endpoint
//! one more write per few events on the path every submit takes. A crash re-sends at most that
//! last stretch, with the same `webhook-id`s (at least once, as before).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use super::http::{Connect, Message, Transport};
use super::{DeliverySettings, Dispatcher, payload, signature};
use crate::background::events::Feed;
use crate::domain::webhook::{DeliveryFailure, Webhook, WebhookId, WebhookState};
use crate::domain::{CallKey, Event, Timestamp};
use crate::store::Webhooks;

/// The most events one batch holds.
const BATCH: usize = 256;

/// How long a delivered event may wait for its cursor to be stored.
const CURSOR_EVERY: Duration = Duration::from_millis(250);

pub(super) struct EndpointDelivery {
    store: Arc<dyn Webhooks>,
    settings: DeliverySettings,
    owner: String,
    id: WebhookId,
    hook: Webhook,
    config: watch::Receiver<Option<Webhook>>,
    connect: Connect,
    client: Arc<dyn Transport>,
    feed: Feed,
    /// Failed attempts in a row, as last recorded: the next backoff's length.
    failures: u32,
    leased_until: Timestamp,
    /// The last event delivered whose cursor is not stored yet, and when it last was.
    unrecorded: Option<u64>,
    recorded_at: Instant,
}

/// Why a task stops.
enum Stop {
    /// Paused or deleted: give the lease up.
    Inactive,
    /// Another process holds the lease now.
    LeaseLost,
}

/// A signed message for one body.
pub(super) fn sign(hook: &Webhook, id: String, body: Bytes) -> Message {
    let timestamp = Timestamp::now().as_micros() / 1_000_000;
    Message {
        signature: signature::sign(&hook.secret, &id, timestamp, &body),
        id,
        timestamp,
        content_type: "application/json",
        body,
    }
}

impl EndpointDelivery {
    /// A task for `hook`, whose lease this process holds until `leased_until`.
    pub(super) fn start(
        dispatcher: &Dispatcher,
        hook: Webhook,
        config: watch::Receiver<Option<Webhook>>,
        leased_until: Timestamp,
    ) -> Result<Self, String> {
        Ok(Self {
            store: Arc::clone(&dispatcher.store),
            settings: dispatcher.settings.clone(),
            owner: dispatcher.owner.clone(),
            id: hook.id.clone(),
            client: (dispatcher.connect)(&hook.url)?,
            connect: Arc::clone(&dispatcher.connect),
            feed: dispatcher.bus.feed_after(hook.cursor),
            failures: hook.consecutive_failures,
            hook,
            config,
            leased_until,
            unrecorded: None,
            recorded_at: Instant::now(),
        })
    }

    pub(super) async fn run(mut self) {
        let stop = self.deliver().await;
        match stop {
            Stop::Inactive => {
                let _ = self.record_cursor().await;
                if let Err(err) = self.store.release_webhook(&self.id, &self.owner).await {
                    tracing::warn!(webhook = %self.id, error = %err, "cannot release the lease");
                }
                tracing::info!(webhook = %self.id, "webhook delivery stopped: paused or deleted");
            }
            Stop::LeaseLost => {
                tracing::info!(webhook = %self.id, "webhook delivered by another broker now")
            }
        }
    }

    async fn deliver(&mut self) -> Stop {
        loop {
            let renewal = self.until_renewal();
            let record_in = match self.unrecorded {
                Some(_) => CURSOR_EVERY.saturating_sub(self.recorded_at.elapsed()),
                None => Duration::MAX,
            };
            let first = tokio::select! {
                next = self.feed.next() => match next {
                    Ok(delivery) => delivery.event,
                    Err(err) => {
                        tracing::warn!(webhook = %self.id, error = %err, "the event feed ended");
                        return Stop::Inactive;
                    }
                },
                _ = tokio::time::sleep(renewal) => {
                    if let Err(stop) = self.renew_lease().await {
                        return stop;
                    }
                    continue;
                }
                _ = tokio::time::sleep(record_in), if self.unrecorded.is_some() => {
                    if let Err(stop) = self.record_cursor().await {
                        return stop;
                    }
                    continue;
                }
                changed = self.config.changed() => {
                    if changed.is_err() {
                        return Stop::Inactive;
                    }
                    if let Err(stop) = self.take_config() {
                        return stop;
                    }
                    continue;
                }
            };
            let mut events = vec![first];
            while events.len() < BATCH {
                match now_or_never(self.feed.next()) {
                    Some(Ok(delivery)) => events.push(delivery.event),
                    _ => break,
                }
            }
            let last = events.last().map_or(0, |e| e.seq);
            let admitted: Vec<Arc<Event>> =
                events.into_iter().filter(|e| self.hook.wants(e)).collect();
            if let Err(stop) = self.deliver_batch(admitted).await {
                return stop;
            }
            self.unrecorded = Some(last);
            if self.recorded_at.elapsed() >= CURSOR_EVERY
                && let Err(stop) = self.record_cursor().await
            {
                return stop;
            }
        }
    }

    /// Stores the cursor of the last event delivered, if it moved since it was last stored.
    async fn record_cursor(&mut self) -> Result<(), Stop> {
        let Some(last) = self.unrecorded else {
            return Ok(());
        };
        self.recorded_at = Instant::now();
        match self
            .store
            .record_delivered(&self.id, &self.owner, last)
            .await
        {
            Ok(true) => {
                self.unrecorded = None;
                Ok(())
            }
            Ok(false) => Err(Stop::LeaseLost),
            // Delivered, only not recorded: tried again later, and a restart delivers these again.
            Err(err) => {
                tracing::warn!(webhook = %self.id, error = %err, "cannot store the webhook cursor");
                Ok(())
            }
        }
    }

    /// The endpoint as the dispatcher last read it; `Err` when it should stop delivering.
    fn take_config(&mut self) -> Result<(), Stop> {
        match &*self.config.borrow_and_update() {
            Some(hook) if hook.state == WebhookState::Active => {
                if hook.url != self.hook.url {
                    match (self.connect)(&hook.url) {
                        Ok(client) => self.client = client,
                        Err(_) => return Err(Stop::Inactive),
                    }
                }
                self.hook = hook.clone();
                Ok(())
            }
            _ => Err(Stop::Inactive),
        }
    }

    fn until_renewal(&self) -> Duration {
        let renew_at = self.leased_until.as_micros() - (self.settings.lease.as_micros() / 2) as i64;
        Duration::from_micros((renew_at - Timestamp::now().as_micros()).max(0) as u64)
    }

    async fn renew_lease(&mut self) -> Result<(), Stop> {
        let now = Timestamp::now();
        let until = now.saturating_add(self.settings.lease);
        match self
            .store
            .lease_webhook(&self.id, &self.owner, now, until)
            .await
        {
            Ok(true) => {
                self.leased_until = until;
                Ok(())
            }
            Ok(false) => Err(Stop::LeaseLost),
            Err(err) => {
                tracing::warn!(webhook = %self.id, error = %err, "cannot renew the webhook lease");
                if Timestamp::now() >= self.leased_until {
                    return Err(Stop::LeaseLost);
                }
                Ok(())
            }
        }
    }

    /// Delivers every event of `pending`, retrying what failed, until all are delivered.
    async fn deliver_batch(&mut self, mut pending: Vec<Arc<Event>>) -> Result<(), Stop> {
        while !pending.is_empty() {
            if self.config.has_changed().unwrap_or(true) {
                self.take_config()?;
            }
            if self.until_renewal().is_zero() {
                self.renew_lease().await?;
            }
            let (delivered, error) = self.round(&pending).await;
            pending.retain(|e| !delivered.contains(&e.seq));
            let Some(error) = error else {
                continue;
            };
            tracing::warn!(webhook = %self.id, error = %error, "webhook delivery failed; retrying");
            match self
                .store
                .record_failure(&DeliveryFailure {
                    webhook: self.id.clone(),
                    owner: self.owner.clone(),
                    error: error.clone(),
                    pause_after: self.settings.pause_after,
                })
                .await
            {
                Ok(None) => return Err(Stop::LeaseLost),
                Ok(Some(hook)) => {
                    self.failures = hook.consecutive_failures;
                    if let WebhookState::Paused { reason } = &hook.state {
                        tracing::warn!(webhook = %self.id, %reason, "webhook paused");
                        return Err(Stop::Inactive);
                    }
                }
                Err(err) => {
                    self.failures += 1;
                    tracing::warn!(webhook = %self.id, error = %err, "cannot record the failure");
                }
            }
            let retry_at = tokio::time::Instant::now() + backoff(&self.settings, self.failures);
            self.wait_to_retry(retry_at).await?;
        }
        // Delivered: the run of failures ended (the store hears it with the cursor).
        self.failures = 0;
        Ok(())
    }

    /// Waits until `retry_at`, renewing the lease when it is due. The endpoint's changes are
    /// taken as they come; only a new URL (another receiver, worth a try at once) ends the wait
    /// early, and a pause or a deletion stops the task.
    async fn wait_to_retry(&mut self, retry_at: tokio::time::Instant) -> Result<(), Stop> {
        loop {
            // At least a second between renewals, should the store keep failing them.
            let renewal = self.until_renewal().max(Duration::from_secs(1));
            tokio::select! {
                _ = tokio::time::sleep_until(retry_at) => return Ok(()),
                _ = tokio::time::sleep(renewal) => self.renew_lease().await?,
                changed = self.config.changed() => {
                    if changed.is_err() {
                        return Err(Stop::Inactive);
                    }
                    let url = self.hook.url.clone();
                    self.take_config()?;
                    if self.hook.url != url {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// One attempt at each pending event: a lane per call (its events in order, stopping at
    /// its first failure), at most `max_in_flight` lanes at once. The sequence numbers
    /// delivered, and the first error if any.
    async fn round(&self, pending: &[Arc<Event>]) -> (HashSet<u64>, Option<String>) {
        let mut lanes: Vec<(CallKey, Vec<Arc<Event>>)> = Vec::new();
        for event in pending {
            match lanes.iter_mut().find(|(key, _)| *key == event.call.key) {
                Some((_, events)) => events.push(Arc::clone(event)),
                None => lanes.push((event.call.key.clone(), vec![Arc::clone(event)])),
            }
        }
        let slots = Arc::new(Semaphore::new(self.hook.max_in_flight.max(1) as usize));
        let hook = Arc::new(self.hook.clone());
        let mut running = JoinSet::new();
        for (_, events) in lanes {
            let slot = Arc::clone(&slots).acquire_owned().await;
            let (client, hook) = (Arc::clone(&self.client), Arc::clone(&hook));
            let inbox = self.settings.inbox_url.clone();
            let links = self.settings.links.clone();
            running.spawn(async move {
                let _slot = slot;
                let mut delivered = Vec::new();
                for event in events {
                    let link = payload::signed_link(&event, inbox.as_deref(), links.as_ref());
                    let body = payload::body(&event, hook.format, inbox.as_deref(), link);
                    let message = sign(&hook, payload::message_id(&event), Bytes::from(body));
                    if let Err(error) = client.post(&message).await {
                        return (delivered, Some(error));
                    }
                    delivered.push(event.seq);
                }
                (delivered, None)
            });
        }
        let mut delivered = HashSet::new();
        let mut first_error = None;
        while let Some(lane) = running.join_next().await {
            let (seqs, error) = lane.unwrap_or_else(|e| (Vec::new(), Some(format!("{e}"))));
            delivered.extend(seqs);
            if first_error.is_none() {
                first_error = error;
            }
        }
        (delivered, first_error)
    }
}

/// The wait before the next attempt after `failures` failures in a row: `retry_min` doubled
/// for each failure after the first, at most `retry_max`, then between half and all of it
/// (jitter, so endpoints that failed together do not retry together).
fn backoff(settings: &DeliverySettings, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(30);
    let cap = settings
        .retry_min
        .saturating_mul(1 << doublings)
        .min(settings.retry_max);
    let random = (uuid::Uuid::new_v4().as_u128() % 1_000_000) as f64 / 1_000_000.0;
    cap.mul_f64(0.5 + random / 2.0)
}

/// `future`'s output if it is ready at once, without waiting. For draining what the feed
/// already holds into a batch: the feed's `next` loses nothing when dropped unfinished.
fn now_or_never<F: std::future::Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_within_half() {
        let settings = DeliverySettings {
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(1),
            ..DeliverySettings::default()
        };
        for (failures, cap) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (60, 1000),
        ] {
            let wait = backoff(&settings, failures);
            let cap = Duration::from_millis(cap);
            assert!(
                wait <= cap && wait >= cap / 2,
                "{failures}: {wait:?} vs {cap:?}"
            );
        }
    }
}
