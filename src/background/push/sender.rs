//! Sends pushes from the committed event log, never from a decision's write path: one task
//! follows the log (as webhook delivery and the Slack poster do) and, for each event, starts one
//! bounded task per subscription that may see the call. A push service that hangs holds only
//! its own task, for at most the configured attempts and timeouts; decisions never wait on it.
//!
//! Who is pushed is who may decide: the subscription's owner as a [`Viewer`] (their groups when
//! they subscribed, or every call for an admin, an auditor, or anyone while auth is off), asked
//! the same [`Call::visible_to`] that the inbox's list and stream ask.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use tokio::sync::Semaphore;

use super::{Answer, Notice, NoticeKind, Pusher, Subscription};
use crate::background::events::Feed;
use crate::domain::{Call, Event, EventKind, Viewer};
use crate::store::{Store, StoredPushSubscription};

/// Messages in flight at once, across subscriptions.
const MAX_IN_FLIGHT: usize = 64;

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
}

impl Sender {
    pub fn new(store: Arc<dyn Store>, pusher: Pusher, added: Arc<AtomicU64>) -> Arc<Self> {
        Arc::new(Self {
            store,
            pusher,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            added,
            none_since: Mutex::new(None),
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

    /// Pushes for each event `feed` gives, until it ends.
    pub async fn run(self: Arc<Self>, mut feed: Feed) {
        loop {
            match feed.next().await {
                Ok(delivery) => self.tell(&delivery.event).await,
                Err(err) => {
                    tracing::warn!(error = %err, "the Web Push sender's event feed ended");
                    return;
                }
            }
        }
    }

    async fn tell(self: &Arc<Self>, event: &Event) {
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

/// What a message says of `call`: for a shell call its command, else the canonical input.
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
    }
}
