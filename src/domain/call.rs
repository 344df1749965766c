//! Calls: one tool call a model asked for, identified by (agent, session, call id).

use super::escalation::Escalation;
use super::policy::{Approval, Prejudged};
use super::{
    Action, AgentId, BatchId, CallId, Host, Outcome, OutcomeKind, SessionId, Timestamp, ToolInput,
    ToolName, code,
};
use crate::error::Error;

/// The identity of a call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallKey {
    pub agent: AgentId,
    pub session: SessionId,
    pub call_id: CallId,
}

impl CallKey {
    /// NOT_FOUND naming this call, as every request about an unknown call is answered.
    pub fn not_found(&self) -> Error {
        Error::NotFound(format!(
            "no call `{}` in session `{}` of agent `{}`",
            self.call_id, self.session, self.agent
        ))
    }
}

/// A call as submitted, validated.
#[derive(Debug, Clone)]
pub struct NewCall {
    /// Its index in the submitted batch.
    pub index: u32,
    /// Where it is in the request (`batch.calls[2]`), so that a refusal made after parsing
    /// (a deadline that has passed, for a call that is new) names the field too.
    pub path: String,
    pub call_id: CallId,
    pub tool: ToolName,
    pub input: ToolInput,
    pub title: String,
    pub message: String,
    pub workspace: String,
    pub supersede_key: Option<String>,
    pub deadline: Option<Timestamp>,
    /// The human the agent acts for (empty: none named); never an approver of the call.
    pub requested_by: String,
    /// The agent host whose call this is, when an adapter named it.
    pub host: Option<Host>,
    /// Rule and grant matchers judged against the input before the submit was queued, so the
    /// write transaction need not (see [`Prejudged`]).
    pub prejudged: Prejudged,
}

impl NewCall {
    /// Whether a stored call is this same call submitted again (same tool, same canonical input).
    pub fn is_same_request_as(&self, stored: &Call) -> bool {
        self.tool == stored.tool && self.input.is_stored_as(&stored.input)
    }

    /// Whether this call, if it is new, must be refused: its deadline has passed at `now`. A
    /// call already stored is answered as stored whatever the clock says (a retry).
    pub fn refusal_if_new(&self, now: Timestamp) -> Option<Error> {
        let deadline = self.deadline?;
        (deadline <= now)
            .then(|| Error::invalid(format!("{}.deadline", self.path), "is in the past"))
    }

    /// This call as a submit stores it, and reading it back returns it: pending, identified by
    /// `key`, at `position` of the batch `batch_id` of `batch_size` calls, stored at
    /// `created_at`.
    pub fn pending(
        &self,
        key: CallKey,
        batch_id: &BatchId,
        position: u32,
        batch_size: u32,
        created_at: Timestamp,
    ) -> Call {
        Call {
            key,
            batch_id: batch_id.clone(),
            position,
            batch_size,
            tool: self.tool.clone(),
            input: self.input.clone(),
            title: self.title.clone(),
            message: self.message.clone(),
            workspace: self.workspace.clone(),
            supersede_key: self.supersede_key.clone(),
            deadline: self.deadline,
            created_at,
            outcome: None,
            escalation: None,
            requested_by: self.requested_by.clone(),
            approval: None,
            host: self.host,
            action: self
                .host
                .map(|h| Action::of(h, &self.tool, &self.input, &self.workspace)),
        }
    }
}

/// A stored call, with its outcome once decided.
#[derive(Debug, Clone)]
pub struct Call {
    pub key: CallKey,
    pub batch_id: BatchId,
    pub position: u32,
    pub batch_size: u32,
    pub tool: ToolName,
    pub input: ToolInput,
    pub title: String,
    pub message: String,
    pub workspace: String,
    pub supersede_key: Option<String>,
    pub deadline: Option<Timestamp>,
    pub created_at: Timestamp,
    pub outcome: Option<Outcome>,
    /// Its escalation ladder and how far up it went, if it was left to a human with one.
    pub escalation: Option<Escalation>,
    /// The human the agent acts for (empty: none named).
    pub requested_by: String,
    /// Who may decide it and the votes so far, when a requirement was fixed on it at submit;
    /// `None`: any approver decides, alone.
    pub approval: Option<Approval>,
    /// The agent host whose call this is, when an adapter named it.
    pub host: Option<Host>,
    /// What the call does in terms common to every host, read from its host, tool and input
    /// (see [`Action::of`]); `None` without a host.
    pub action: Option<Action>,
}

impl Call {
    /// This call, read while it was pending, as it stands once `outcome` is written: what a read
    /// of it then gives, where nothing else of the call changed meanwhile.
    pub fn with_outcome(self, outcome: Outcome) -> Call {
        Call {
            outcome: Some(outcome),
            ..self
        }
    }

    pub fn status(&self) -> Status {
        match &self.outcome {
            None => Status::Pending,
            Some(o) => Status::Decided(o.kind),
        }
    }
}

#[cfg(test)]
impl Call {
    /// For tests: call `call_id` of `agent`/`session`, pending, of `tool` with input `{}`, alone
    /// in batch `batch`, requested at time zero, nothing else set; adjust what a test needs.
    pub fn sample(agent: &str, session: &str, call_id: &str, tool: &str, batch: &str) -> Call {
        Call {
            action: None,
            host: None,
            key: CallKey {
                agent: AgentId::from_stored(agent.into()),
                session: SessionId::from_stored(session.into()),
                call_id: CallId::from_stored(call_id.into()),
            },
            batch_id: BatchId::from_stored(batch.into()),
            position: 0,
            batch_size: 1,
            tool: ToolName::from_stored(tool.into()),
            input: ToolInput::from_stored("{}".into()),
            title: String::new(),
            message: String::new(),
            workspace: String::new(),
            supersede_key: None,
            deadline: None,
            created_at: Timestamp::from_micros(0),
            outcome: None,
            escalation: None,
            requested_by: String::new(),
            approval: None,
        }
    }
}

/// Where a call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pending,
    Decided(OutcomeKind),
}

impl Status {
    /// The stored code; the same numbers as the protobuf `CallStatus`.
    pub fn code(self) -> i64 {
        match self {
            Status::Pending => code!(Status::Pending),
            Status::Decided(kind) => kind.code(),
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        if code == code!(Status::Pending) {
            Some(Status::Pending)
        } else {
            OutcomeKind::from_code(code).map(Status::Decided)
        }
    }
}
