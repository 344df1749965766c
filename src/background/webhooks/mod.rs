//! Webhooks: every committed event, POSTed to the endpoints that want it, from the durable
//! event log. Each endpoint has a cursor in the store (the last event delivered) and, while it is
//! active, one delivery task in one broker process: the process holding its lease (a row
//! lease, so exactly one Postgres replica delivers an endpoint at a time, and another takes
//! over when a lease runs out). Delivery is at least once and in order per call; see
//! `delivery`. The RPC paths never wait on a webhook: they only commit events, which delivery
//! reads after the fact.
//!
//! - this file: the [`Dispatcher`], which starts and stops delivery tasks as endpoints are
//!   created, paused, resumed and deleted (on any replica), and sends test events;
//! - `delivery`: one endpoint's delivery task (batches, retries, backoff, pausing);
//! - `payload`: the bodies (CloudEvents, Slack); `signature`: Standard Webhooks signing;
//! - `http`: the HTTP client; `egress`: which addresses it may connect to.

mod delivery;
pub mod egress;
mod http;
pub mod payload;
pub mod signature;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::background::events::EventBus;
use crate::domain::Timestamp;
use crate::domain::webhook::{PayloadFormat, Webhook, WebhookId, WebhookState, WebhookUrl};
use crate::error::{Error, Result};
use crate::store::Webhooks;

use self::egress::EgressPolicy;
use self::http::{Client, Connect, Transport};

/// How often the dispatcher reads the endpoints (to notice other replicas' changes and leases
/// that ran out); local changes wake it at once. A read hands a delivery task its endpoint only
/// when a setting changed, so it never cuts a retry's backoff short.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// How delivery behaves (`--webhook-*` settings).
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    /// Failed attempts in a row after which an endpoint is paused.
    pub pause_after: u32,
    /// The first retry's delay; each further one doubles, up to `retry_max`, with jitter.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// How long one request may take, connecting included.
    pub timeout: Duration,
    /// How long a lease lasts without renewal: how soon another replica takes over an
    /// endpoint after the one delivering it died.
    pub lease: Duration,
    /// The inbox's base URL, for the links in Slack messages.
    pub inbox_url: Option<String>,
    /// The key signed approval links are made with, and how long one lasts: with `inbox_url`,
    /// every CloudEvents payload carries a link to its call (`data.link`; docs/answers.md).
    pub links: Option<(Arc<crate::door::links::LinkKey>, Duration)>,
    /// Which addresses delivery may connect to (`--webhook-allow-hosts` widens it).
    pub egress: Arc<EgressPolicy>,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self {
            pause_after: 50,
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
            lease: Duration::from_secs(15),
            inbox_url: None,
            links: None,
            egress: Arc::default(),
        }
    }
}

/// What a test message did: its `webhook-id` (also when it was not delivered, so a receiver's
/// logs can be searched for it) and whether the endpoint answered 2xx, or why not.
pub struct TestEvent {
    pub message_id: String,
    pub delivered: std::result::Result<(), String>,
}

/// Starts and stops the delivery tasks of this process.
pub struct Dispatcher {
    store: Arc<dyn Webhooks>,
    bus: Arc<EventBus>,
    settings: DeliverySettings,
    /// Makes an endpoint's transport: its HTTP client under the egress policy.
    connect: Connect,
    /// This process's name in leases.
    owner: String,
    changed: Notify,
    workers: Mutex<HashMap<WebhookId, Worker>>,
}

/// A running delivery task, and where it learns of changes to its endpoint.
struct Worker {
    config: watch::Sender<Option<Webhook>>,
    task: JoinHandle<()>,
}

/// Delivery tasks end with their dispatcher (a broker stopped or dropped in a test delivers
/// nothing more); their leases run out.
impl Drop for Dispatcher {
    fn drop(&mut self) {
        let workers = self
            .workers
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for worker in workers.values() {
            worker.task.abort();
        }
    }
}

impl Dispatcher {
    pub fn new(
        store: Arc<dyn Webhooks>,
        bus: Arc<EventBus>,
        settings: DeliverySettings,
    ) -> Arc<Self> {
        let (timeout, egress) = (settings.timeout, Arc::clone(&settings.egress));
        let connect: Connect = Arc::new(move |url: &WebhookUrl| {
            Ok(Arc::new(Client::new(url, timeout, Arc::clone(&egress))?) as Arc<dyn Transport>)
        });
        Self::with_transport(store, bus, settings, connect)
    }

    /// A dispatcher whose endpoints are reached through `connect` (a test's fake receiver).
    fn with_transport(
        store: Arc<dyn Webhooks>,
        bus: Arc<EventBus>,
        settings: DeliverySettings,
        connect: Connect,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            bus,
            settings,
            connect,
            owner: uuid::Uuid::new_v4().simple().to_string(),
            changed: Notify::new(),
            workers: Mutex::new(HashMap::new()),
        })
    }

    /// Refuses a URL the egress policy refuses before any lookup (a literal internal address,
    /// `localhost`), naming `field`; names are checked again on each connection.
    pub fn check_url(&self, field: &str, url: &WebhookUrl) -> Result<()> {
        self.settings
            .egress
            .check_url(url)
            .map_err(|reason| Error::invalid(field, reason))
    }

    /// Tells the dispatcher that an endpoint was created, changed or deleted here.
    pub fn endpoints_changed(&self) {
        self.changed.notify_one();
    }

    /// Keeps the delivery tasks in line with the stored endpoints until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        loop {
            if let Err(err) = self.scan().await {
                tracing::warn!(error = %err, "reading the webhook endpoints failed; retrying");
            }
            tokio::select! {
                _ = self.changed.notified() => {}
                _ = tokio::time::sleep(SCAN_EVERY) => {}
            }
        }
    }

    /// Hands every running task its endpoint as stored now (`None`: deleted) if a setting of
    /// it changed, and starts a task for each active endpoint without one whose lease this
    /// process gets. What delivery itself changes (cursor, failures, last error) wakes no task:
    /// a task waiting out a retry's backoff must not be woken every second.
    async fn scan(self: &Arc<Self>) -> Result<()> {
        let hooks = self.store.webhooks().await?;
        let candidates: Vec<Webhook> = {
            let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
            workers.retain(|_, worker| !worker.task.is_finished());
            for (id, worker) in workers.iter() {
                let stored = hooks.iter().find(|h| &h.id == id).cloned();
                worker.config.send_if_modified(|current| {
                    let same = match (current.as_ref(), stored.as_ref()) {
                        (Some(current), Some(stored)) => current.same_settings(stored),
                        (None, None) => true,
                        _ => false,
                    };
                    if !same {
                        *current = stored;
                    }
                    !same
                });
            }
            hooks
                .into_iter()
                .filter(|h| h.state == WebhookState::Active && !workers.contains_key(&h.id))
                .collect()
        };
        for hook in candidates {
            let now = Timestamp::now();
            let until = now.saturating_add(self.settings.lease);
            if !self
                .store
                .lease_webhook(&hook.id, &self.owner, now, until)
                .await?
            {
                continue;
            }
            // Read again under the lease: the cursor may have moved since the list was read.
            let hook = self.store.webhook(&hook.id).await?;
            let (config, watched) = watch::channel(Some(hook.clone()));
            let id = hook.id.clone();
            let task = match delivery::EndpointDelivery::start(self, hook, watched, until) {
                Ok(delivery) => tokio::spawn(delivery.run()),
                Err(err) => {
                    tracing::warn!(webhook = %id, error = %err, "cannot deliver to this webhook");
                    self.store.release_webhook(&id, &self.owner).await?;
                    continue;
                }
            };
            tracing::info!(webhook = %id, "delivering webhook events");
            self.workers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(id, Worker { config, task });
        }
        Ok(())
    }

    /// Stops every delivery task and gives their leases up, so another replica takes over at
    /// once rather than when the leases run out. Events in flight are delivered again there.
    pub async fn stop(&self) {
        let workers: Vec<(WebhookId, Worker)> = self
            .workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        for (id, worker) in workers {
            worker.task.abort();
            let _ = worker.task.await;
            if let Err(err) = self.store.release_webhook(&id, &self.owner).await {
                tracing::warn!(webhook = %id, error = %err, "cannot release the webhook's lease");
            }
        }
    }

    /// POSTs a test message to `hook` now and says how it went (`Err`: why it failed). Its
    /// `webhook-id` is new each time and it changes nothing stored.
    pub async fn send_test_event(&self, hook: &Webhook) -> TestEvent {
        let id = format!("test_{}", uuid::Uuid::now_v7().simple());
        let body = match hook.format {
            PayloadFormat::CloudEvents => json!({
                "specversion": "1.0",
                "id": id,
                "source": "approval-broker",
                "type": "approvals.v1.test",
                "time": payload::rfc3339(Timestamp::now()),
                "datacontenttype": "application/json",
                "data": {"webhook": hook.id.as_str(), "message": "A test event from the approval broker."},
            }),
            PayloadFormat::Slack => json!({
                "text": format!("A test message from the approval broker (webhook `{}`).", hook.id),
            }),
        };
        let body = serde_json::to_vec(&body).expect("JSON values always serialise");
        let message = delivery::sign(hook, id.clone(), Bytes::from(body));
        let delivered = match (self.connect)(&hook.url) {
            Ok(client) => client.post(&message).await,
            Err(error) => Err(error),
        };
        TestEvent {
            message_id: id,
            delivered,
        }
    }
}
