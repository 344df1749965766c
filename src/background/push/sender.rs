//! Sends pushes from the committed event log, never from a decision's write path: one task
//! follows the log (as webhook delivery and the Slack poster do) and, for each event, starts one
//! bounded task per subscription that may see the call. A push service that hangs holds only
//! its own task, for at most the configured attempts and timeouts; decisions never wait on it.
//!
//! Who is pushed is who may decide: the subscription's owner as a [`Viewer`] (their groups when
//! they subscribed, or every call for an admin, an auditor, or anyone while auth is off), asked
//! the same [`Call::visible_to`] that the inbox's list and stream ask.
//!
//! The sender resumes where it stopped: its position in the log is stored (`event_cursors`, at
//! most once a [`CURSOR_EVERY`] while events flow, as webhook delivery stores its cursor), so
//! the calls committed while no broker pushed, or while this one was behind, are pushed when it
//! catches up. An event read back from the log that way may be about a call decided since: it
//! is not pushed (nor, then, its withdrawal). Replicas each follow the log and the first to
//! claim an event pushes it, as for live events.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use tokio::sync::Semaphore;

use super::{Answer, Notice, NoticeKind, Pusher, Subscription};
use crate::background::events::{EventBus, Feed};
use crate::domain::{Call, CallKey, Event, EventKind, Viewer};
use crate::error::{Error, Result};
use crate::store::{Store, StoredPushSubscription};

/// Messages in flight at once, across subscriptions.
const MAX_IN_FLIGHT: usize = 64;

/// How long a handled event may wait for the stored position to pass it. A crash re-reads at
/// most that stretch (on Postgres the claims keep those from being pushed twice).
pub const CURSOR_EVERY: Duration = Duration::from_secs(1);

/// The most events a starting sender catches up on: one that finds the stored position further
/// behind starts that far from the log's end (far fewer than the claims Postgres keeps).
const MAX_CATCH_UP: u64 = 50_000;

/// The most calls remembered as "decided before their pending push was sent" (so that their
/// withdrawal is not sent either); past it the memory starts again, at worst sending a
/// withdrawal that closes nothing.
const MAX_UNPUSHED: usize = 4096;

/// How long the sender trusts having read no subscription at all, for subscriptions another
/// replica adds (this process's own adds are seen at once).
const NONE_TRUSTED_FOR: Duration = Duration::from_secs(1);

/// Follows the log and pushes (see the module).
pub struct Sender {
    store: Arc<dyn Store>,
    pusher: Pusher,
    in_flight: Arc<Semaphore>,
    /// Moved by each subscription this process adds.
    added: Arc<AtomicU64>,
    /// When the last read found no subscription, and `added` then: while both hold, an event
    /// needs no read (most brokers have no subscriber: two reads per call for nobody cost a
    /// measured 6% of the 64-agent bench's cycles).
    none_since: Mutex<Option<(Instant, u64)>>,
    /// Calls whose pending push this process held the claim of and did not send, the call
    /// being decided by the time the event was read (see [`Sender::tell`]).
    unpushed: Mutex<HashSet<CallKey>>,
}

impl Sender {
    pub fn new(store: Arc<dyn Store>, pusher: Pusher, added: Arc<AtomicU64>) -> Arc<Self> {
        Arc::new(Self {
            store,
            pusher,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            added,
            none_since: Mutex::new(None),
            unpushed: Mutex::default(),
        })
    }

    /// Whether a read a moment ago found nobody subscribed, and nothing was added here since.
    fn nobody_subscribed(&self) -> bool {
        let known = *self
            .none_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        known.is_some_and(|(at, added)| {
            at.elapsed() < NONE_TRUSTED_FOR && added == self.added.load(Ordering::Acquire)
        })
    }

    /// Pushes from `after` (see [`Sender::resume_point`]) until the event bus stops. The bus
    /// is held weakly: the sender must not keep a stopped broker's bus alive.
    pub async fn run(self: Arc<Self>, bus: Weak<EventBus>, mut after: u64) {
        loop {
            let Some(mut feed) = bus.upgrade().map(|bus| bus.feed_after(after)) else {
                return;
            };
            match self.follow(&mut feed).await {
                // Retention pruned events the sender had not read: none of them can be read
                // any more; go on after them.
                Error::Pruned { through, .. } => {
                    tracing::warn!(
                        after,
                        through,
                        "Web Push skips events retention pruned before they were pushed"
                    );
                    after = through;
                }
                err => {
                    tracing::debug!(error = %err, "the Web Push sender's event feed ended");
                    return;
                }
            }
        }
    }

    /// Where to push from: the stored position, at most [`MAX_CATCH_UP`] behind the log's
    /// end; on a first start the log's end (stored at once, so that a broker stopped before
    /// any event catches up from there).
    pub async fn resume_point(&self) -> Result<u64> {
        let latest = self.store.latest_seq().await?;
        Ok(match self.store.push_cursor().await? {
            Some(stored) if latest.saturating_sub(stored) > MAX_CATCH_UP => {
                tracing::warn!(
                    stored,
                    latest,
                    "Web Push was stopped long ago: only the last {MAX_CATCH_UP} events are caught up"
                );
                latest - MAX_CATCH_UP
            }
            Some(stored) => stored.min(latest),
            None => {
                self.store.record_push_cursor(latest).await?;
                latest
            }
        })
    }

    /// Pushes for each event `feed` gives and stores how far it got, until the feed fails;
    /// returns why.
    async fn follow(self: &Arc<Self>, feed: &mut Feed) -> Error {
        let mut unrecorded: Option<u64> = None;
        let mut recorded_at = Instant::now();
        loop {
            let record_in = CURSOR_EVERY.saturating_sub(recorded_at.elapsed());
            tokio::select! {
                next = feed.next() => match next {
                    Ok(delivery) => {
                        self.tell(&delivery.event, delivery.live).await;
                        unrecorded = Some(delivery.event.seq);
                    }
                    Err(err) => {
                        if let Some(seq) = unrecorded {
                            // The broker stopping: keep what was done, if the store still can.
                            let _ = self.store.record_push_cursor(seq).await;
                        }
                        return err;
                    }
                },
                _ = tokio::time::sleep(record_in), if unrecorded.is_some() => {}
            }
            if let Some(seq) = unrecorded
                && recorded_at.elapsed() >= CURSOR_EVERY
            {
                recorded_at = Instant::now();
                match self.store.record_push_cursor(seq).await {
                    Ok(()) => unrecorded = None,
                    Err(err) => tracing::warn!(error = %err, "cannot store where Web Push got to"),
                }
            }
        }
    }

    /// Whether `call` has an outcome now (or is gone), as the store says.
    async fn decided_since(&self, call: &Call) -> bool {
        let key = &call.key;
        match self
            .store
            .calls_by_id(&key.agent, &key.session, std::slice::from_ref(&key.call_id))
            .await
        {
            Ok(found) => found
                .into_iter()
                .next()
                .flatten()
                .is_none_or(|now| now.outcome.is_some()),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read whether a call was decided; pushing it");
                false
            }
        }
    }

    /// Pushes what `event` tells of. `live`: it came as it was published; otherwise it was read
    /// back from the log, and its call may have been decided since.
    async fn tell(self: &Arc<Self>, event: &Event, live: bool) {
        let kind = match event.kind {
            EventKind::Requested if event.call.outcome.is_none() => NoticeKind::Pending,
            EventKind::Reminded | EventKind::Escalated => NoticeKind::Reminder,
            EventKind::Resolved => NoticeKind::Withdrawn,
            _ => return,
        };
        // Nobody to push to: neither claim the event (a replica that knows of a subscriber
        // pushes it) nor read the subscriptions again.
        if self.nobody_subscribed() {
            return;
        }
        // One replica of a fleet pushes each event.
        let added = self.added.load(Ordering::Acquire);
        match self.store.claim_push_event(event.seq).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => {
                tracing::warn!(error = %err, "cannot claim an event's pushes");
                return;
            }
        }
        // Read back from the log: a call decided since is not pushed as pending (nobody could
        // answer it), and, this process holding the claim of its pending push, neither is its
        // withdrawal.
        if !live && kind != NoticeKind::Withdrawn && self.decided_since(&event.call).await {
            if kind == NoticeKind::Pending {
                let mut unpushed = self.unpushed.lock().unwrap_or_else(PoisonError::into_inner);
                if unpushed.len() >= MAX_UNPUSHED {
                    unpushed.clear();
                }
                unpushed.insert(event.call.key.clone());
            }
            return;
        }
        if kind == NoticeKind::Withdrawn
            && self
                .unpushed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&event.call.key)
        {
            return;
        }
        let subscriptions = match self.store.push_subscriptions().await {
            Ok(subscriptions) => subscriptions,
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the push subscriptions");
                return;
            }
        };
        *self
            .none_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) =
            subscriptions.is_empty().then(|| (Instant::now(), added));
        let notice = Arc::new(notice(kind, &event.call));
        for stored in subscriptions {
            if !event.call.visible_to(&viewer(&stored)) {
                continue;
            }
            let Some(subscription) = decoded(&stored) else {
                continue;
            };
            let Ok(permit) = Arc::clone(&self.in_flight).acquire_owned().await else {
                return;
            };
            let this = Arc::clone(self);
            let notice = Arc::clone(&notice);
            tokio::spawn(async move {
                let _permit = permit;
                match this.pusher.send(&subscription, &notice).await {
                    Answer::Accepted => {}
                    Answer::Gone => {
                        tracing::info!(
                            approver = %stored.approver,
                            "a push subscription expired (404/410): dropped"
                        );
                        if let Err(err) = this
                            .store
                            .drop_push_subscription(&subscription.endpoint)
                            .await
                        {
                            tracing::warn!(error = %err, "cannot drop an expired push subscription");
                        }
                    }
                    Answer::Retry(why) | Answer::Refused(why) => tracing::warn!(
                        approver = %stored.approver,
                        ?subscription,
                        reason = %why,
                        "a push was not delivered"
                    ),
                }
            });
        }
    }
}

/// The subscription's owner as a reader of calls.
pub fn viewer(stored: &StoredPushSubscription) -> Viewer {
    if stored.sees_all {
        Viewer::Operator
    } else {
        Viewer::Approver {
            groups: stored.groups.clone(),
        }
    }
}

fn decoded(stored: &StoredPushSubscription) -> Option<Subscription> {
    Some(Subscription {
        endpoint: stored.endpoint.clone(),
        p256dh: B64.decode(&stored.p256dh).ok()?,
        auth: B64.decode(&stored.auth).ok()?,
    })
}

/// What a message says of `call`: for a shell call its command, else the canonical input; and
/// whether approving it needs a passkey.
pub fn notice(kind: NoticeKind, call: &Call) -> Notice {
    let input = serde_json::from_str::<serde_json::Value>(call.input.as_str())
        .ok()
        .and_then(|v| v.get("command").and_then(|c| c.as_str()).map(str::to_owned))
        .unwrap_or_else(|| call.input.as_str().to_owned());
    Notice {
        kind,
        agent: call.key.agent.to_string(),
        session: call.key.session.to_string(),
        call_id: call.key.call_id.to_string(),
        tool: call.tool.to_string(),
        input,
        step_up: call
            .approval
            .as_ref()
            .is_some_and(|a| a.requirement.needs_passkey()),
    }
}
