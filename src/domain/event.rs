//! Events: each change to a call, appended to the durable log with an increasing sequence number.

use super::escalation::{EscalationStep, StepKind};
use super::{Call, code};
use crate::domain::webhook::WebhookId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A call was accepted and waits for a decision.
    Requested,
    /// A call got its outcome.
    Resolved,
    /// A reminder step of the call's escalation ladder fired: it still waits.
    Reminded,
    /// An escalation step of the call's ladder fired: it still waits, others are asked.
    Escalated,
    /// A vote was recorded on a call that needs more than one; the call stays pending.
    ApprovalRecorded,
}

impl EventKind {
    /// Every kind a webhook may filter on, in code order: all but [`EventKind::ApprovalRecorded`],
    /// which is never delivered to webhooks (a vote is not a change an endpoint acts on).
    pub const ALL: [EventKind; 4] = [
        EventKind::Requested,
        EventKind::Resolved,
        EventKind::Reminded,
        EventKind::Escalated,
    ];

    pub fn code(self) -> i64 {
        match self {
            EventKind::Requested => code!(EventKind::Requested),
            EventKind::Resolved => code!(EventKind::Resolved),
            EventKind::Reminded => code!(EventKind::Reminded),
            EventKind::Escalated => code!(EventKind::Escalated),
            EventKind::ApprovalRecorded => code!(EventKind::ApprovalRecorded),
        }
    }

    pub fn from_code(code: i64) -> Self {
        match code {
            code!(EventKind::Resolved) => EventKind::Resolved,
            code!(EventKind::Reminded) => EventKind::Reminded,
            code!(EventKind::Escalated) => EventKind::Escalated,
            code!(EventKind::ApprovalRecorded) => EventKind::ApprovalRecorded,
            _ => EventKind::Requested,
        }
    }

    /// The event a step of this kind appends.
    pub fn of_step(kind: StepKind) -> Self {
        match kind {
            StepKind::Reminder => EventKind::Reminded,
            StepKind::Escalation => EventKind::Escalated,
        }
    }
}

/// One committed event. `call` is the call as the event left it: without an outcome for
/// `Requested` and the escalation kinds, with it for `Resolved`.
#[derive(Debug, Clone)]
pub struct Event {
    pub seq: u64,
    pub kind: EventKind,
    pub call: Call,
    /// This resolution gave the last pending call of its batch an outcome.
    pub batch_completed: bool,
    /// For `Reminded` and `Escalated`: the index of the step of the call's ladder that fired.
    pub step: Option<u32>,
}

impl Event {
    /// The ladder step this event is the firing of, if it is one.
    pub fn fired_step(&self) -> Option<&EscalationStep> {
        let index = self.step?;
        let escalation = self.call.escalation.as_ref()?;
        escalation.ladder.steps().get(index as usize)
    }

    /// The endpoints a fired step names (empty for other events).
    pub fn step_endpoints(&self) -> &[WebhookId] {
        self.fired_step()
            .map(|s| s.endpoints.as_slice())
            .unwrap_or_default()
    }
}
