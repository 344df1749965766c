//! Signed receipts through the facade: a call's receipt or a page of the chain, each checked
//! against this broker's key as it is read, so a UI can show whether what it shows still
//! verifies. Receipts are written by the store with their outcomes; nothing here writes.
//!
//! A receipt holds its call's content (input included), so it is read as the call is: only by a
//! reader its call is [`visible_to`](crate::domain::Call::visible_to), NOT_FOUND for any other
//! exactly as for an unknown call. The chain (`receipts_after`) only verifies whole, each link
//! naming the one before, so it is served whole to readers who see every call and to no one else.

use std::collections::HashMap;
use std::sync::Arc;

use crate::domain::{AgentId, Call, CallId, CallKey, SessionId, Status, Viewer};
use crate::error::{Error, Result};
use crate::receipts::trust::TrustedKey;
use crate::receipts::{PublicKey, verify};
use crate::store::StoredReceipt;

use super::Broker;

/// A stored receipt, and whether it verified with this broker's key when it was read.
#[derive(Debug, Clone)]
pub struct CheckedReceipt {
    pub stored: StoredReceipt,
    pub verified: bool,
}

impl Broker {
    /// The key receipts verify with; `None` when this broker signs none.
    pub fn receipt_key(&self) -> Option<PublicKey> {
        self.receipt_key
    }

    /// The receipt of a decided call: of the call stored under the id now, or, once retention
    /// pruned it, of the last call decided under the id (an id may be used again after its call
    /// was pruned, and receipts are never pruned). NOT_FOUND for an unknown call and for one
    /// `viewer` may not see, alike; FAILED_PRECONDITION for a pending one, or one decided while
    /// receipts were off. A pruned call's receipt can no longer be judged (its requirement went
    /// with it), so only a reader who sees every call is given it.
    pub async fn receipt(&self, key: &CallKey, viewer: &Viewer) -> Result<CheckedReceipt> {
        // The call first: decided after this read, its receipt is among those read next.
        let call = match self.visible_call(key, viewer).await {
            Ok(call) => Some(call),
            Err(Error::NotFound(_)) if viewer.sees_every_call() => None,
            Err(e) => return Err(e),
        };
        let receipts = self.store.receipts_of(key).await?;
        let found = match &call {
            None => receipts.into_iter().next(),
            Some(call) => receipts
                .into_iter()
                .find(|r| verify::names_batch(&r.envelope, call.batch_id.as_str())),
        };
        if let Some(stored) = found {
            return Ok(self.checked(stored));
        }
        let call = call.ok_or_else(|| key.not_found())?;
        Err(Error::FailedPrecondition(match call.status() {
            Status::Pending => format!(
                "call `{}` is pending: its receipt is written with its outcome",
                key.call_id.as_str()
            ),
            Status::Decided(_) => format!(
                "call `{}` has no receipt: it was decided while receipts were off, or its \
                 stored outcome was written by something other than this broker",
                key.call_id.as_str()
            ),
        }))
    }

    /// Gives each decided call of `calls` that was read without its receipt the receipt stored
    /// with it, one read per session, so every outcome an agent is sent carries its receipt
    /// however it was read (the log's events carry theirs already: `store::rows`). A call whose
    /// receipt names another batch (its id used again after retention pruned the first) gets
    /// none. Nothing is read while this broker signs no receipts.
    pub async fn seal_outcomes<'a>(
        &self,
        calls: impl IntoIterator<Item = &'a mut Call>,
    ) -> Result<()> {
        if self.receipt_key.is_none() {
            return Ok(());
        }
        let mut unsealed: HashMap<(AgentId, SessionId), Vec<&'a mut Call>> = HashMap::new();
        for call in calls {
            if call.outcome.as_ref().is_some_and(|o| o.receipt.is_none()) {
                let session = (call.key.agent.clone(), call.key.session.clone());
                unsealed.entry(session).or_default().push(call);
            }
        }
        for ((agent, session), calls) in unsealed {
            let ids: Vec<CallId> = calls.iter().map(|c| c.key.call_id.clone()).collect();
            let seals = self.store.seals_of_calls(&agent, &session, &ids).await?;
            for call in calls {
                let sealed = seals
                    .get(&call.key.call_id)
                    .filter(|(batch, _)| *batch == call.batch_id);
                if let (Some((_, sealed)), Some(outcome)) = (sealed, call.outcome.as_mut()) {
                    outcome.receipt = Some(Arc::new(sealed.clone()));
                }
            }
        }
        Ok(())
    }

    /// At most `limit` receipts after sequence `after`, in chain order, for a reader who sees
    /// every call; PERMISSION_DENIED for any other (a chain with links left out does not
    /// verify, and the refusal is of the reader's role, saying nothing of any call).
    pub async fn receipts_after(
        &self,
        after: u64,
        limit: u32,
        viewer: &Viewer,
    ) -> Result<Vec<CheckedReceipt>> {
        if !viewer.sees_every_call() {
            return Err(Error::PermissionDenied(
                "the receipt chain is exported only to readers who see every call (admin, \
                 auditor)"
                    .into(),
            ));
        }
        let stored = self.store.receipts_after(after, limit).await?;
        Ok(stored.into_iter().map(|s| self.checked(s)).collect())
    }

    /// Every key this broker's receipts verify with: the current one first (with the time it
    /// started signing, if known), then the retired ones it was given. Empty when it signs none.
    pub fn receipt_keys(&self) -> &[TrustedKey] {
        self.receipt_keys.keys()
    }

    fn checked(&self, stored: StoredReceipt) -> CheckedReceipt {
        // Checked with the key it names among the current and retired ones, within its window:
        // a receipt signed before a rotation still verifies.
        let verified = self.receipt_key.is_some()
            && verify::receipt(&stored.envelope, &self.receipt_keys).is_ok();
        CheckedReceipt { stored, verified }
    }
}
