//! Remembered approvals and policies, as plain values and pure functions (no I/O): scopes and
//! grants, operators' rules and their modes (shadow verdicts, replays of a candidate rule),
//! input matchers, and [`evaluate`], the one function that says whether a rule, a grant or a
//! human decides a call.

mod evaluate;
mod explain;
mod gate;
mod glob;
mod grant;
mod matcher;
mod mode;
mod requirement;
mod rule;
mod rule_replay;
mod shadow;

pub use evaluate::{
    Decider, Ruling, evaluate, evaluate_gated, rule_precedence, sort_by_precedence,
};
pub use explain::{ExplainTarget, Explanation};
pub use gate::{Gate, Person, quorum_met};
pub use glob::Glob;
pub use grant::{
    Effect, Grant, GrantScope, GrantSpec, Remember, RevokeReport, RevokeTarget, Scope,
};
pub use matcher::{FieldCondition, FieldPath, FieldTest, InputView, Matcher, Prejudged};
pub use mode::RuleMode;
pub use requirement::{
    Approval, Approvers, MAX_GROUPS, MAX_QUORUM, Requirement, StepUp, Tally, Vote, group_name,
};
pub use rule::{
    Rule, RuleEffect, RuleId, RuleSource, approvers_of, description, parse_policy_file,
};
pub use rule_replay::{Disagreement, MAX_REPLAY_SAMPLES, ReplayRange, ReplayTally};
pub use shadow::{RuleVerdict, ShadowVerdict, candidate_verdict, shadow_verdicts};

use super::{Action, AgentId, Call, Kind, SessionId, ToolInput, ToolName};

/// The facts about a call that rules and grants look at.
pub struct Subject<'a> {
    pub agent: &'a AgentId,
    pub session: &'a SessionId,
    /// Empty when the call names no workspace.
    pub workspace: &'a str,
    pub tool: &'a ToolName,
    pub input: InputView<'a>,
    /// What the call does in common terms, when its host is known: what a rule naming a kind,
    /// and a grant remembered from a host's call, match.
    pub action: Option<ActionView<'a>>,
}

/// A call's [`Action`] as matchers see it.
pub struct ActionView<'a> {
    pub kind: Kind,
    /// Its fields. Never prejudged: the prejudged results are of the tool's own input.
    pub fields: InputView<'a>,
}

impl<'a> ActionView<'a> {
    pub fn new(action: &'a Action) -> Self {
        Self {
            kind: action.kind,
            fields: InputView::new(&action.fields),
        }
    }
}

/// What a rule or a grant names: a tool (its own input matched), or an action kind (the
/// action's fields matched), whichever host asks.
pub fn target_matches(kind: Option<Kind>, matcher: &Matcher, subject: &Subject<'_>) -> bool {
    match kind {
        None => matcher.matches(&subject.input),
        Some(kind) => subject
            .action
            .as_ref()
            .is_some_and(|a| a.kind == kind && matcher.matches(&a.fields)),
    }
}

impl<'a> Subject<'a> {
    pub fn new(
        agent: &'a AgentId,
        session: &'a SessionId,
        workspace: &'a str,
        tool: &'a ToolName,
        input: &'a ToolInput,
    ) -> Self {
        Self {
            agent,
            session,
            workspace,
            tool,
            input: InputView::new(input),
            action: None,
        }
    }

    pub fn of_call(call: &'a Call) -> Self {
        let mut subject = Self::new(
            &call.key.agent,
            &call.key.session,
            &call.workspace,
            &call.tool,
            &call.input,
        );
        subject.action = call.action.as_ref().map(ActionView::new);
        subject
    }

    /// The same subject, its input's matchers answered from `prejudged` where it has them.
    pub fn with_prejudged(mut self, prejudged: Option<&'a Prejudged>) -> Self {
        self.input = self.input.with_prejudged(prejudged);
        self
    }
}
