//! Sends pushes from the committed event log, never from a decision's write path: one task
//! follows the log (as webhook delivery and the Slack poster do) and, for each event, starts one
//! bounded task per subscription that may see the call. A push service that hangs holds only
//! its own task, for at most the configured attempts and timeouts; decisions never wait on it.
//!
//! Who is pushed is who may decide: the subscription's owner as a [`Viewer`] (their groups when
//! they subscribed, or every call for an admin, an auditor, or anyone while auth is off), asked
//! the same [`Call::visible_to`] that the inbox's list and stream ask.
//!
//! The sender resumes where it stopped: its position in the log is stored
//! (`crate::background::cursor`, as the Slack poster's is), so the calls committed while no
//! broker pushed, or while this one was behind, are pushed when it catches up. An event read back from the log that way may be about a call decided since: it
//! is not pushed (nor, then, its withdrawal). Replicas each follow the log and the first to
//! claim an event pushes it, as for live events.
//!
//! A push its service did not accept within `--push-attempts` (429, 5xx, no answer) is tried
//! again in rounds (`crate::background::rounds`, as Slack's messages are), by the process that
//! claimed it: each round reads the call as it is then, so a call decided meanwhile is not
//! pushed as pending, and gets a withdrawal instead only if something of it may be shown on
//! that browser (a reminder's failure, or a withdrawal's own). A 404 or 410 drops the
//! subscription at once, and a push service that refuses a push (another 4xx) is not asked
//! again.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use tokio::sync::Semaphore;

use super::{Answer, Notice, NoticeKind, Pusher, Subscription};
use async_trait::async_trait;

use crate::background::cursor::{Follower, Handle};
use crate::background::events::{Delivery, EventBus};
use crate::background::rounds::{Next, Rounds};
use crate::domain::{Call, CallKey, Event, EventKind, Viewer};
use crate::error::Result;
use crate::store::{Store, StoredPushSubscription};

/// Messages in flight at once, across subscriptions.
const MAX_IN_FLIGHT: usize = 64;

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
    /// The pushes waiting for a round (see the module).
    rounds: Rounds<Unsent, Failed>,
}

/// A push no attempt delivered: to which subscription (its endpoint), of which call.
type Unsent = (String, CallKey);

/// What an unsent push was, as a round needs it.
#[derive(Debug, Clone, Copy)]
struct Failed {
    /// The last push of the call that failed there.
    kind: NoticeKind,
    /// Whether something of the call may be shown on that browser, so that a round that finds
    /// it decided sends a withdrawal: not when its pending push is the one that failed (a
    /// reminder's or a withdrawal's failure supposes its pending push was shown).
    shown: bool,
}

impl Failed {
    fn of(kind: NoticeKind) -> Self {
        Self {
            kind,
            shown: kind != NoticeKind::Pending,
        }
    }

    /// A later failure of a push still waiting: it says what the push is now; what may be
    /// shown stays, as neither got through.
    fn merge(mine: &mut Failed, theirs: Failed) {
        mine.kind = theirs.kind;
    }
}

/// What a round of an unsent push came to.
enum Round {
    /// Delivered, or nothing left to send (the call or the subscription is gone, the call was
    /// decided and nothing of it shown there, the push service refused it for good).
    Done,
    /// The push service failed again, or the store could not say: try again later.
    Again,
}

impl Sender {
    /// A sender whose rounds of retries (see the module) start `first_round` after a push
    /// failed every attempt.
    pub fn new(
        store: Arc<dyn Store>,
        pusher: Pusher,
        added: Arc<AtomicU64>,
        first_round: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            pusher,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            added,
            none_since: Mutex::new(None),
            unpushed: Mutex::default(),
            rounds: Rounds::new(first_round),
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

    /// Pushes from `after` (see [`Sender::resume_point`]) until the event bus stops, and
    /// beside it runs the rounds of the pushes that failed. The bus is held weakly: the sender
    /// must not keep a stopped broker's bus alive.
    pub async fn run(self: Arc<Self>, bus: Weak<EventBus>, after: u64) {
        tokio::select! {
            () = Follower::Push.follow(&*self.store, bus, after, &self) => {}
            () = self.retry_rounds() => {}
        }
    }

    /// Where to push from (see `crate::background::cursor`; on Postgres the claims, kept far
    /// longer than a catch-up reaches back, keep a re-read event from being pushed twice).
    pub async fn resume_point(&self) -> Result<u64> {
        Follower::Push.resume_point(&*self.store).await
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
            let key = event.call.key.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match this.pusher.send(&subscription, &notice).await {
                    Answer::Accepted => {}
                    Answer::Gone => this.drop_gone(&stored, &subscription).await,
                    Answer::Retry(why) => {
                        tracing::warn!(
                            approver = %stored.approver,
                            ?subscription,
                            reason = %why,
                            "a push was not delivered; tried again later"
                        );
                        this.retry_later(&stored, &key, notice.kind);
                    }
                    Answer::Refused(why) => tracing::warn!(
                        approver = %stored.approver,
                        ?subscription,
                        reason = %why,
                        "a push was refused; not tried again"
                    ),
                }
            });
        }
    }

    /// Tries the push of `kind` for `key` to `stored` again in a later round.
    fn retry_later(&self, stored: &StoredPushSubscription, key: &CallKey, kind: NoticeKind) {
        let unsent = (stored.endpoint.clone(), key.clone());
        if self
            .rounds
            .first_failure(unsent, Failed::of(kind), Failed::merge)
            == Next::GivenUp
        {
            given_up(&stored.approver, key);
        }
    }

    /// Runs the rounds as they fall due, each in its own bounded task, until the sender stops.
    async fn retry_rounds(self: &Arc<Self>) {
        loop {
            let due = self.rounds.due().await;
            let subscriptions = match self.store.push_subscriptions().await {
                Ok(subscriptions) => subscriptions,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read the push subscriptions");
                    for (unsent, waiting) in due {
                        self.again(unsent, waiting.round, waiting.data, "");
                    }
                    continue;
                }
            };
            for ((endpoint, key), waiting) in due {
                // Removed or dropped meanwhile: nothing to send.
                let Some(stored) = subscriptions.iter().find(|s| s.endpoint == endpoint) else {
                    continue;
                };
                let stored = stored.clone();
                let Ok(permit) = Arc::clone(&self.in_flight).acquire_owned().await else {
                    return;
                };
                let this = Arc::clone(self);
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Round::Again = this.round(&stored, &key, waiting.data).await {
                        let approver = stored.approver.clone();
                        this.again((endpoint, key), waiting.round, waiting.data, &approver);
                    }
                });
            }
        }
    }

    /// Schedules the next round of `unsent`, or gives it up after the last.
    fn again(&self, unsent: Unsent, tried: u32, failed: Failed, approver: &str) {
        let key = unsent.1.clone();
        if self
            .rounds
            .failed_again(unsent, tried, failed, Failed::merge)
            == Next::GivenUp
        {
            given_up(approver, &key);
        }
    }

    /// One round of a push to `stored` for `key`: what the call asks for now, sent.
    async fn round(&self, stored: &StoredPushSubscription, key: &CallKey, failed: Failed) -> Round {
        let call = match self
            .store
            .calls_by_id(&key.agent, &key.session, std::slice::from_ref(&key.call_id))
            .await
        {
            Ok(found) => found.into_iter().next().flatten(),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read a call to push it again");
                return Round::Again;
            }
        };
        let Some(call) = call else {
            return Round::Done;
        };
        let kind = match (call.outcome.is_some(), failed.kind) {
            (true, _) if failed.shown => NoticeKind::Withdrawn,
            (true, _) => return Round::Done,
            (false, NoticeKind::Reminder) => NoticeKind::Reminder,
            (false, _) => NoticeKind::Pending,
        };
        let (Some(subscription), true) = (decoded(stored), call.visible_to(&viewer(stored))) else {
            return Round::Done;
        };
        match self.pusher.send(&subscription, &notice(kind, &call)).await {
            Answer::Accepted
                if kind != NoticeKind::Withdrawn && self.decided_since(&call).await =>
            {
                // Decided while the push was on its way, its withdrawal perhaps sent before it
                // arrived: withdraw it now (in a later round if that fails).
                let withdrawn = notice(NoticeKind::Withdrawn, &call);
                if let Answer::Retry(_) = self.pusher.send(&subscription, &withdrawn).await {
                    self.retry_later(stored, key, NoticeKind::Withdrawn);
                }
                Round::Done
            }
            Answer::Accepted => Round::Done,
            Answer::Gone => {
                self.drop_gone(stored, &subscription).await;
                Round::Done
            }
            Answer::Refused(why) => {
                tracing::warn!(approver = %stored.approver, reason = %why, "a push was refused");
                Round::Done
            }
            Answer::Retry(_) => Round::Again,
        }
    }

    /// Forgets a subscription its push service says is gone (404/410).
    async fn drop_gone(&self, stored: &StoredPushSubscription, subscription: &Subscription) {
        tracing::info!(
            approver = %stored.approver,
            "a push subscription expired (404/410): dropped"
        );
        if let Err(err) = self
            .store
            .drop_push_subscription(&subscription.endpoint)
            .await
        {
            tracing::warn!(error = %err, "cannot drop an expired push subscription");
        }
    }
}

/// Logs that a push is given up.
fn given_up(approver: &str, key: &CallKey) {
    tracing::warn!(
        approver,
        agent = %key.agent,
        session = %key.session,
        call = %key.call_id,
        "a push was not delivered in any round; given up"
    );
}

#[async_trait]
impl Handle for Arc<Sender> {
    async fn handle(&self, delivery: &Delivery) {
        self.tell(&delivery.event, delivery.live).await;
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
