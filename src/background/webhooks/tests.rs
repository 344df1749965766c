//! Delivery against the clock: the dispatcher and a delivery task, as the broker runs them, over
//! an in-memory store and log and a fake receiver, with tokio's clock paused so an hour of
//! outage passes in moments and every attempt's time is exact.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::http::{Connect, Message, Transport};
use super::{DeliverySettings, Dispatcher};
use crate::domain::webhook::{
    DeliveryFailure, PayloadFormat, Webhook, WebhookChange, WebhookFilter, WebhookId,
    WebhookSecret, WebhookState, WebhookUrl,
};
use crate::domain::{Call, Event, EventKind, Timestamp};
use crate::error::Result;
use crate::store::{Backend, BackendReads, EventLog, Webhooks};

/// One endpoint's row, written as the stores' statements write it.
struct Endpoints {
    hooks: Mutex<Vec<Webhook>>,
}

impl Endpoints {
    fn hook(&self, id: &WebhookId) -> Webhook {
        let hooks = self.hooks.lock().unwrap();
        hooks.iter().find(|h| &h.id == id).cloned().unwrap()
    }

    fn edit(&self, id: &WebhookId, edit: impl FnOnce(&mut Webhook)) -> Webhook {
        let mut hooks = self.hooks.lock().unwrap();
        let hook = hooks.iter_mut().find(|h| &h.id == id).unwrap();
        edit(hook);
        hook.clone()
    }
}

impl Backend for Endpoints {
    fn reads(&self) -> &BackendReads {
        unreachable!("the fake answers every read itself")
    }
}

#[async_trait]
impl Webhooks for Endpoints {
    async fn create_webhook(&self, _hook: &Webhook) -> Result<Webhook> {
        unreachable!("delivery creates no endpoint")
    }
    async fn webhooks(&self) -> Result<Vec<Webhook>> {
        Ok(self.hooks.lock().unwrap().clone())
    }
    async fn webhook(&self, id: &WebhookId) -> Result<Webhook> {
        Ok(self.hook(id))
    }
    async fn update_webhook(&self, id: &WebhookId, change: WebhookChange) -> Result<Webhook> {
        Ok(self.edit(id, |hook| *hook = change.apply(hook.clone())))
    }
    async fn delete_webhook(&self, _id: &WebhookId) -> Result<Webhook> {
        unreachable!("delivery deletes no endpoint")
    }
    async fn load_file_webhooks(&self, _hooks: &[Webhook], _start: u64) -> Result<()> {
        unreachable!("delivery loads no file")
    }
    async fn lease_webhook(
        &self,
        _id: &WebhookId,
        _owner: &str,
        _now: Timestamp,
        _until: Timestamp,
    ) -> Result<bool> {
        Ok(true)
    }
    async fn release_webhook(&self, _id: &WebhookId, _owner: &str) -> Result<()> {
        Ok(())
    }
    async fn record_delivered(&self, id: &WebhookId, _owner: &str, cursor: u64) -> Result<bool> {
        self.edit(id, |hook| {
            hook.cursor = hook.cursor.max(cursor);
            hook.consecutive_failures = 0;
            hook.last_error.clear();
        });
        Ok(true)
    }
    async fn record_failure(&self, failure: &DeliveryFailure) -> Result<Option<Webhook>> {
        Ok(Some(self.edit(&failure.webhook, |hook| {
            hook.last_error = failure.error.clone();
            hook.consecutive_failures += 1;
            if hook.consecutive_failures >= failure.pause_after {
                hook.state = WebhookState::Paused {
                    reason: failure.error.clone(),
                };
            }
        })))
    }
}

/// The event log: what the test commits.
#[derive(Default)]
struct Log {
    events: Mutex<Vec<Event>>,
}

impl Log {
    /// Commits `kind` for the call `call`.
    fn commit(&self, call: &str, kind: EventKind) {
        let mut events = self.events.lock().unwrap();
        let seq = events.len() as u64 + 1;
        events.push(Event {
            seq,
            kind,
            call: Call::sample("agent", "session", call, "shell", call),
            batch_completed: kind == EventKind::Resolved,
            step: None,
        });
    }

    /// The call and kind of event `seq`.
    fn of(&self, seq: u64) -> (String, EventKind) {
        let events = self.events.lock().unwrap();
        let event = &events[seq as usize - 1];
        (event.call.key.call_id.as_str().to_owned(), event.kind)
    }
}

#[async_trait]
impl EventLog for Log {
    async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>> {
        let events = self.events.lock().unwrap();
        let after = events.iter().filter(|e| e.seq > after);
        Ok(after.take(limit as usize).cloned().collect())
    }
    async fn latest_seq(&self) -> Result<u64> {
        Ok(self.events.lock().unwrap().len() as u64)
    }
}

/// A receiver that answers 500 while it is down, and records what it accepts.
#[derive(Default)]
struct Receiver {
    up: AtomicBool,
    /// When each attempt came, while it was down.
    refused: Mutex<Vec<Instant>>,
    /// The sequence numbers accepted, in arrival order.
    accepted: Mutex<Vec<u64>>,
}

#[async_trait]
impl Transport for Receiver {
    async fn post(&self, message: &Message) -> std::result::Result<(), String> {
        if !self.up.load(Ordering::SeqCst) {
            self.refused.lock().unwrap().push(Instant::now());
            return Err("HTTP 500 Internal Server Error: the endpoint did not accept it".into());
        }
        let seq = message.id.strip_prefix("evt_").unwrap().parse().unwrap();
        self.accepted.lock().unwrap().push(seq);
        Ok(())
    }
}

fn endpoint() -> Webhook {
    Webhook {
        id: WebhookId::parse("id", "ops").unwrap(),
        url: WebhookUrl::parse("url", "https://hooks.example.com/approvals").unwrap(),
        secret: WebhookSecret::generate(),
        filter: WebhookFilter::default(),
        format: PayloadFormat::CloudEvents,
        max_in_flight: 4,
        state: WebhookState::Active,
        last_error: String::new(),
        consecutive_failures: 0,
        cursor: 0,
        from_file: false,
        created_at: Timestamp::now(),
    }
}

/// The documented schedule, at its defaults: the first retry 1 s after the first failure, each
/// further one twice as long up to 5 minutes, each wait between half and all of that (jitter).
/// The dispatcher rescans the endpoints every second meanwhile and must not cut a wait short;
/// after an hour the endpoint is not paused (50 failures in a row would), and when the receiver
/// is back every event arrives, each call's in order.
/// One endpoint ([`endpoint`]) delivered to by a dispatcher over `log`, as the broker runs it,
/// through a [`Receiver`] the test turns up or down.
struct Delivering {
    id: WebhookId,
    store: Arc<Endpoints>,
    bus: Arc<crate::background::events::EventBus>,
    receiver: Arc<Receiver>,
    dispatcher: Arc<Dispatcher>,
    pump: tokio::task::JoinHandle<()>,
    running: tokio::task::JoinHandle<()>,
}

async fn delivering(log: &Arc<Log>, settings: &DeliverySettings) -> Delivering {
    let hook = endpoint();
    let id = hook.id.clone();
    let store = Arc::new(Endpoints {
        hooks: Mutex::new(vec![hook]),
    });
    let bus = crate::background::events::EventBus::new(log.clone(), 64)
        .await
        .unwrap();
    let receiver = Arc::new(Receiver::default());
    let connect: Connect = {
        let receiver = Arc::clone(&receiver);
        Arc::new(move |_: &WebhookUrl| Ok(Arc::clone(&receiver) as Arc<dyn Transport>))
    };
    let dispatcher =
        Dispatcher::with_transport(store.clone(), Arc::clone(&bus), settings.clone(), connect);
    let pump = tokio::spawn(Arc::clone(&bus).pump());
    let running = tokio::spawn(Arc::clone(&dispatcher).run());
    Delivering {
        id,
        store,
        bus,
        receiver,
        dispatcher,
        pump,
        running,
    }
}

#[tokio::test(start_paused = true)]
async fn an_hour_of_outage_is_retried_on_the_backoff_schedule_then_everything_arrives_in_order() {
    let settings = DeliverySettings::default();
    let log = Arc::new(Log::default());
    log.commit("c1", EventKind::Requested);
    log.commit("c2", EventKind::Requested);
    let Delivering {
        id,
        store,
        bus,
        receiver,
        pump,
        running,
        ..
    } = delivering(&log, &settings).await;
    let start = Instant::now();

    // More events while the receiver is down: c1 decided and c3 requested after 10 minutes,
    // c2 and c3 decided after 30.
    tokio::time::sleep(Duration::from_secs(600)).await;
    log.commit("c1", EventKind::Resolved);
    log.commit("c3", EventKind::Requested);
    bus.wake();
    tokio::time::sleep(Duration::from_secs(1200)).await;
    log.commit("c2", EventKind::Resolved);
    log.commit("c3", EventKind::Resolved);
    bus.wake();
    tokio::time::sleep_until(start + Duration::from_secs(3600)).await;

    // The attempts of the hour: one round per instant (both pending calls at once).
    let mut rounds: Vec<Instant> = receiver.refused.lock().unwrap().clone();
    rounds.dedup();
    let failing = store.hook(&id);
    assert!(
        !matches!(failing.state, WebhookState::Paused { .. }),
        "paused after an hour: {failing:?}"
    );
    assert_eq!(failing.consecutive_failures as usize, rounds.len());
    assert_eq!(rounds[0], start, "the first attempt at once");
    for (i, pair) in rounds.windows(2).enumerate() {
        let failures = i as u32 + 1;
        let cap = settings
            .retry_min
            .saturating_mul(1 << (failures - 1).min(30))
            .min(settings.retry_max);
        let gap = pair[1] - pair[0];
        assert!(
            gap >= cap / 2 && gap <= cap + Duration::from_millis(1),
            "attempt {} came {gap:?} after the one before; the schedule says {:?} to {cap:?} \
             (all attempts, in seconds from the start: {:?})",
            i + 2,
            cap / 2,
            rounds
                .iter()
                .map(|r| (*r - start).as_secs_f64())
                .collect::<Vec<_>>()
        );
    }
    // 1 + 2 + ... + 256 s of (jittered) waits, then 2.5 to 5 minutes each: 20 to 32 attempts.
    assert!(
        (18..=34).contains(&rounds.len()),
        "{} attempts in an hour",
        rounds.len()
    );

    // Back after an hour: within the longest wait, everything arrives.
    receiver.up.store(true, Ordering::SeqCst);
    let back = Instant::now();
    while receiver.accepted.lock().unwrap().len() < 6 {
        assert!(
            back.elapsed() <= settings.retry_max + Duration::from_secs(1),
            "only {:?} arrived",
            receiver.accepted.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let accepted = receiver.accepted.lock().unwrap().clone();
    let mut sorted = accepted.clone();
    sorted.sort();
    assert_eq!(sorted, (1..=6).collect::<Vec<u64>>(), "each event once");
    for call in ["c1", "c2", "c3"] {
        let kinds: Vec<EventKind> = accepted
            .iter()
            .map(|seq| log.of(*seq))
            .filter(|(c, _)| c == call)
            .map(|(_, kind)| kind)
            .collect();
        assert_eq!(
            kinds,
            vec![EventKind::Requested, EventKind::Resolved],
            "{call}"
        );
    }
    // The run of failures and its last error end with the delivery.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let recovered = store.hook(&id);
    assert_eq!(recovered.cursor, 6);
    assert_eq!(recovered.consecutive_failures, 0);
    assert_eq!(recovered.last_error, "");
    running.abort();
    pump.abort();
}

/// A change to the endpoint's settings reaches a task waiting out a backoff without cutting the
/// wait short, unless the URL changed: a new receiver is tried at once.
#[tokio::test(start_paused = true)]
async fn a_backoff_is_cut_short_by_a_new_url_only() {
    let settings = DeliverySettings::default();
    let log = Arc::new(Log::default());
    log.commit("c1", EventKind::Requested);
    let Delivering {
        id,
        store,
        receiver,
        dispatcher,
        pump,
        running,
        ..
    } = delivering(&log, &settings).await;
    let start = Instant::now();
    // Into the seventh wait (32 s long, 16 s at least): 1+2+4+8+16+32 s of caps is 63 s.
    while receiver.refused.lock().unwrap().len() < 6 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sixth = *receiver.refused.lock().unwrap().last().unwrap();
    tokio::time::sleep_until(sixth + Duration::from_secs(1)).await;

    store.edit(&id, |h| h.secret = WebhookSecret::generate());
    dispatcher.endpoints_changed();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        receiver.refused.lock().unwrap().len(),
        6,
        "a new secret does not cut the wait short"
    );

    let url = WebhookUrl::parse("url", "https://other.example.com/approvals").unwrap();
    store.edit(&id, |h| h.url = url);
    dispatcher.endpoints_changed();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let refused = receiver.refused.lock().unwrap().clone();
    assert_eq!(refused.len(), 7, "a new URL is tried at once");
    assert!(
        refused[6] - sixth < Duration::from_secs(12),
        "{:?}",
        refused[6] - start
    );
    running.abort();
    pump.abort();
}
