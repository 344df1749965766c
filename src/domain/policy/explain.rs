//! Explain: what would decide a call (a rule, a grant, or a human) if it were submitted now,
//! asked of a stored call or of one described inline; and what the rules in shadow would do.

use super::{Approval, Effect, Grant, Rule, ShadowVerdict};
use crate::domain::{AgentId, Call, CallKey, DecidedBy, Host, SessionId, ToolInput, ToolName};

/// The call Explain is about.
#[derive(Debug, Clone)]
pub enum ExplainTarget {
    Stored(CallKey),
    Inline {
        agent: AgentId,
        session: SessionId,
        workspace: String,
        tool: ToolName,
        input: ToolInput,
        /// The host asking, if any: its action is tried against kind rules and grants.
        host: Option<Host>,
    },
}

/// What Explain found.
#[derive(Debug, Clone)]
pub struct Explanation {
    /// `None`: a human decides.
    pub effect: Option<Effect>,
    /// Who the outcome would name as its decider, when a rule or grant decides.
    pub decided_by: Option<DecidedBy>,
    /// The rule that decides, or the ask rule that requires a human.
    pub rule: Option<Rule>,
    /// The grant that decides.
    pub grant: Option<Grant>,
    pub reason: String,
    /// For a stored call: the call as it stands.
    pub call: Option<Call>,
    /// What each shadow rule would do with the call now, if enforced (see
    /// [`super::shadow_verdicts`]).
    pub shadow: Vec<ShadowVerdict>,
    /// For a stored call: what the shadow rules would have done with it at its submit.
    pub recorded_shadow: Vec<ShadowVerdict>,
    /// When a human decides: who may, and how many must agree (for a stored call, the
    /// requirement fixed on it with its votes so far). `None`: any approver, alone.
    pub approval: Option<Approval>,
}
