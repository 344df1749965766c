//! Cancelling: an agent withdraws calls it no longer wants decided (some calls, a batch, or its
//! whole session). Cancelling never changes an outcome that stands; it reports it.

use super::{AgentId, BatchId, Call, CallId, SessionId};

/// What a cancel names.
#[derive(Debug, Clone)]
pub struct CancelTarget {
    pub agent: AgentId,
    pub session: SessionId,
    pub scope: CancelScope,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub enum CancelScope {
    Calls(Vec<CallId>),
    Batch(BatchId),
    Session,
}

#[derive(Debug, Default)]
pub struct CancelReport {
    pub cancelled: Vec<Call>,
    pub already_decided: Vec<Call>,
    pub unknown: Vec<CallId>,
}

impl CancelReport {
    /// Every call it reports (cancelled now, decided before).
    pub fn calls_mut(&mut self) -> impl Iterator<Item = &mut Call> {
        self.cancelled
            .iter_mut()
            .chain(self.already_decided.iter_mut())
    }
}
