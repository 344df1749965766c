//! Events: each change to a call, appended to the durable log with an increasing sequence number.

use super::Call;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A call was accepted and waits for a decision.
    Requested,
    /// A call got its outcome.
    Resolved,
}

impl EventKind {
    pub fn code(self) -> i64 {
        match self {
            EventKind::Requested => 1,
            EventKind::Resolved => 2,
        }
    }

    pub fn from_code(code: i64) -> Self {
        if code == 2 {
            EventKind::Resolved
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
