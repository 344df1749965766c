//! Webhook administration through the facade: endpoints are stored, then the dispatcher is
//! told, so delivery starts, changes or stops at once on this replica (other replicas notice
//! within a second). A new endpoint receives the events committed from its creation on. A URL
//! the egress policy refuses outright (a literal internal address) is refused here, naming the
//! field; names are checked again on every connection (`crate::background::webhooks::egress`).

use crate::background::webhooks::TestEvent;
use crate::domain::webhook::{Webhook, WebhookChange, WebhookId, WebhookUrl};
use crate::error::{Error, Result};

use super::Broker;

impl Broker {
    /// Stores a new endpoint, its cursor at the log's head.
    pub async fn create_webhook(&self, mut hook: Webhook) -> Result<Webhook> {
        self.check_webhook_url(&hook.url)?;
        hook.cursor = self.store.latest_seq().await?;
        let stored = self.store.create_webhook(&hook).await?;
        self.webhooks_changed();
        tracing::info!(webhook = %stored.id, "webhook created");
        Ok(stored)
    }

    pub async fn webhooks(&self) -> Result<Vec<Webhook>> {
        self.store.webhooks().await
    }

    /// Applies `change` to the stored endpoint `id`.
    pub async fn update_webhook(&self, id: &WebhookId, change: WebhookChange) -> Result<Webhook> {
        if let Some(url) = &change.url {
            self.check_webhook_url(url)?;
        }
        let stored = self.store.update_webhook(id, change).await?;
        self.webhooks_changed();
        tracing::info!(webhook = %stored.id, state = ?stored.state, "webhook updated");
        Ok(stored)
    }

    pub async fn delete_webhook(&self, id: &WebhookId) -> Result<Webhook> {
        let deleted = self.store.delete_webhook(id).await?;
        self.webhooks_changed();
        tracing::info!(webhook = %deleted.id, "webhook deleted");
        Ok(deleted)
    }

    /// POSTs a test message to endpoint `id`.
    pub async fn send_test_event(&self, id: &WebhookId) -> Result<TestEvent> {
        let hook = self.store.webhook(id).await?;
        let dispatcher = self
            .webhooks
            .as_ref()
            .ok_or_else(|| Error::Unavailable("webhook delivery is not running".into()))?;
        Ok(dispatcher.send_test_event(&hook).await)
    }

    fn check_webhook_url(&self, url: &WebhookUrl) -> Result<()> {
        match &self.webhooks {
            Some(dispatcher) => dispatcher.check_url("url", url),
            None => Ok(()),
        }
    }

    fn webhooks_changed(&self) {
        if let Some(dispatcher) = &self.webhooks {
            dispatcher.endpoints_changed();
        }
    }
}
