//! Events: each change to a call, appended to the durable log with an increasing sequence number.

use super::{Call, code};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A call was accepted and waits for a decision.
    Requested,
    /// A call got its outcome.
    Resolved,
    /// A vote was recorded on a call that needs more than one; the call stays pending.
    ApprovalRecorded,
}

impl EventKind {
    pub fn code(self) -> i64 {
        match self {
            EventKind::Requested => code!(EventKind::Requested),
            EventKind::Resolved => code!(EventKind::Resolved),
            EventKind::ApprovalRecorded => code!(EventKind::ApprovalRecorded),
        }
    }

    pub fn from_code(code: i64) -> Self {
        if code == code!(EventKind::Resolved) {
            EventKind::Resolved
        } else if code == code!(EventKind::ApprovalRecorded) {
            EventKind::ApprovalRecorded
        } else {
            EventKind::Requested
        }
    }
}

/// One committed event. `call` is the call as the event left it: without an outcome for
/// `Requested`, with it for `Resolved`.
#[derive(Debug, Clone)]
pub struct Event {
    pub seq: u64,
    pub kind: EventKind,
    pub call: Call,
    /// This resolution gave the last pending call of its batch an outcome.
    pub batch_completed: bool,
}
