//! Batches: the calls of one model turn, submitted together and answered in their order.

use super::{AgentId, BatchId, Call, CallId, NewCall, SessionId};
use crate::error::Error;

/// At most this many calls in one batch.
pub const MAX_BATCH_CALLS: usize = 128;

impl BatchId {
    /// A new batch id (assigned by the broker when a batch is stored). Time-ordered (UUIDv7):
    /// the indexes keyed by batch id grow at their end, so a group of writes dirties a few of
    /// their pages rather than one random page per batch.
    pub fn generate() -> Self {
        Self::from_stored(uuid::Uuid::now_v7().to_string())
    }
}

/// What a denial does to the rest of its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDeny {
    /// Every still-pending call of the batch becomes SKIPPED.
    #[default]
    SkipRest,
    /// Each call is decided on its own.
    Independent,
}

impl OnDeny {
    pub fn as_i64(self) -> i64 {
        match self {
            OnDeny::SkipRest => 1,
            OnDeny::Independent => 2,
        }
    }

    pub fn from_i64(v: i64) -> Self {
        if v == 2 {
            OnDeny::Independent
        } else {
            OnDeny::SkipRest
        }
    }
}

/// A validated submit: the calls that passed validation (each remembers its index in the
/// request, so per-call errors and acknowledgements can be merged back in order).
#[derive(Debug, Clone)]
pub struct NewBatch {
    pub agent: AgentId,
    pub session: SessionId,
    pub on_deny: OnDeny,
    /// Supersede every pending call of the session (but those resubmitted here) first.
    pub supersede_pending: bool,
    pub calls: Vec<NewCall>,
    /// The most pending calls the agent may have (`--max-pending-per-agent`, set by the broker;
    /// `None`: no cap). New calls beyond it are refused, each for itself.
    pub pending_cap: Option<u64>,
    /// The escalation ladder of the calls left to a human that no ask rule gives one
    /// (`--escalation-file`, set by the broker; `None`: no default ladder).
    pub default_escalation: Option<std::sync::Arc<super::escalation::Ladder>>,
    /// Who may decide the calls no ask rule names approvers for (`--default-approvers`, set by
    /// the broker; `None`: anyone, alone).
    pub default_approvers: Option<super::policy::Approvers>,
}

/// What a submit did, call by call.
#[derive(Debug, Default)]
pub struct SubmitReport {
    /// The batch the new calls were stored under; `None` if nothing was new.
    pub batch_id: Option<BatchId>,
    /// One per call of the `NewBatch`, in its order.
    pub items: Vec<SubmitItem>,
    /// Pending calls this submit superseded; those it carries itself (superseded by a later
    /// call of it with the same key) are in `items` too, with their outcome.
    pub superseded: Vec<Call>,
    /// What shadow rules would have done with the calls stored now (recorded with them).
    pub shadow_verdicts: Vec<crate::domain::policy::ShadowVerdict>,
}

impl SubmitReport {
    /// Every call it reports (those stored now, those stored before, those superseded).
    pub fn calls_mut(&mut self) -> impl Iterator<Item = &mut Call> {
        let items = self
            .items
            .iter_mut()
            .filter_map(|item| match &mut item.result {
                SubmitResult::Accepted(call) | SubmitResult::Duplicate(call) => Some(call),
                SubmitResult::Refused(_) => None,
            });
        items.chain(self.superseded.iter_mut())
    }
}

#[derive(Debug)]
pub struct SubmitItem {
    pub index: u32,
    pub call_id: CallId,
    pub result: SubmitResult,
}

#[derive(Debug)]
pub enum SubmitResult {
    /// Stored now.
    Accepted(Call),
    /// The same call was already stored; nothing was written.
    Duplicate(Call),
    /// Refused for this call alone (ALREADY_EXISTS; INVALID_ARGUMENT for a new call whose
    /// deadline has passed).
    Refused(Error),
}
