//! Grants: remembered decisions. An approver who decides a call with a scope other than ONCE
//! creates one: allow (or deny) this tool, for inputs its matcher accepts, for the rest of the
//! session, in the workspace, or always. Grants belong to the agent whose call was decided: an
//! agent's grants never decide another agent's calls (operators who want a decision for every
//! agent write a policy rule). A grant expires at its expiry, if it has one, and when revoked;
//! either way it never decides anything again, and it stays listed for the audit.

use std::time::Duration;

use super::{Matcher, Person, Subject};
use crate::domain::{AgentId, CallKey, Kind, SessionId, Timestamp, ToolName, Verdict, code};

/// How long a decision is remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// This call only: no grant.
    Once,
    /// Later calls of the same session (of the same agent).
    Session,
    /// Later calls of the agent in the same workspace.
    Workspace,
    /// Every later call of the agent.
    Always,
}

impl Scope {
    /// The stored code; the same numbers as the protobuf `Scope`.
    pub fn code(self) -> i64 {
        match self {
            Scope::Once => code!(Scope::Once),
            Scope::Session => code!(Scope::Session),
            Scope::Workspace => code!(Scope::Workspace),
            Scope::Always => code!(Scope::Always),
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        [Scope::Once, Scope::Session, Scope::Workspace, Scope::Always]
            .into_iter()
            .find(|s| s.code() == code)
    }
}

/// What a grant (or a rule) decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    Allow,
    Deny,
}

impl Effect {
    /// The stored code; the same numbers as the protobuf `Effect`.
    pub fn code(self) -> i64 {
        match self {
            Effect::Allow => 1,
            Effect::Deny => 2,
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(Effect::Allow),
            2 => Some(Effect::Deny),
            _ => None,
        }
    }

    /// The verdict a person deciding this way gives.
    pub fn verdict(self) -> Verdict {
        match self {
            Effect::Allow => Verdict::Approve,
            Effect::Deny => Verdict::Deny,
        }
    }
}

/// Where a grant applies, with the value its scope was taken from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantScope {
    Session(SessionId),
    Workspace(String),
    Always,
}

impl GrantScope {
    pub fn scope(&self) -> Scope {
        match self {
            GrantScope::Session(_) => Scope::Session,
            GrantScope::Workspace(_) => Scope::Workspace,
            GrantScope::Always => Scope::Always,
        }
    }

    /// Narrower scopes first: the order grants of one effect are tried in.
    fn rank(&self) -> u8 {
        match self {
            GrantScope::Session(_) => 0,
            GrantScope::Workspace(_) => 1,
            GrantScope::Always => 2,
        }
    }
}

/// What an approver asks to remember along with a decision.
#[derive(Debug, Clone)]
pub struct Remember {
    /// Session, workspace or always (never once).
    pub scope: Scope,
    /// `None`: exactly the decided call's input (the safe default).
    pub matcher: Option<Matcher>,
    /// `None`: until revoked.
    pub expires_in: Option<Duration>,
}

impl Remember {
    /// What is asked to be remembered, as one comparable text (scope, matcher, expiry): two
    /// votes asking for the same key ask for the same grant.
    pub fn key(&self) -> String {
        let matcher = self
            .matcher
            .as_ref()
            .map_or_else(|| "exact".to_owned(), |m| m.to_json().to_string());
        let expires = self
            .expires_in
            .map_or_else(|| "never".to_owned(), |d| d.as_micros().to_string());
        format!("{}|{matcher}|{expires}", self.scope.code())
    }
}

/// A grant as it is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantSpec {
    pub agent: AgentId,
    pub scope: GrantScope,
    /// The tool of the decided call: what the grant covers, unless `kind` is set.
    pub tool: ToolName,
    /// Set when the decided call came from a host with an action of a common kind (not
    /// `other`): the grant covers that action, whichever host's tool asks for it, and `matcher`
    /// tests the action's fields.
    pub kind: Option<Kind>,
    pub matcher: Matcher,
    pub effect: Effect,
    /// Who decided, as recorded in outcomes: `approver:<identity>` (display only; see
    /// `authors`).
    pub created_by: String,
    /// The people whose decision it is, with their groups then: only the voters who chose this
    /// scope. The gate lets it decide a call only where they could have decided it themselves
    /// (see [`Gate::admits_grant`](super::Gate::admits_grant)).
    pub authors: Vec<Person>,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    /// The call whose decision created the grant.
    pub source: CallKey,
    /// The reason the approver gave with the decision.
    pub reason: String,
}

/// A stored grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: i64,
    pub spec: GrantSpec,
    pub revoked_at: Option<Timestamp>,
    /// Who revoked it (an admin identity, or `admin` while auth is off).
    pub revoked_by: Option<String>,
}

impl Grant {
    /// Not revoked, and not past its expiry at `now`.
    pub fn is_live(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && self.spec.expires_at.is_none_or(|at| now < at)
    }

    /// Whether the grant covers `subject` (agent, tool, scope and input), ignoring liveness.
    pub fn covers(&self, subject: &Subject<'_>) -> bool {
        self.spec.covers(subject)
    }

    /// The order grants are tried in: deny before allow, narrower scope first, older first.
    pub(super) fn precedence(&self) -> (u8, u8, i64) {
        let effect = match self.spec.effect {
            Effect::Deny => 0,
            Effect::Allow => 1,
        };
        (effect, self.spec.scope.rank(), self.id)
    }
}

impl GrantSpec {
    /// What it applies to, for people: tool `Bash`, or the shell action of any host's tool.
    pub fn names(&self) -> String {
        match self.kind {
            Some(kind) => format!(
                "the {kind} action of any host's tool (remembered from tool `{}`)",
                self.tool
            ),
            None => format!("tool `{}`", self.tool),
        }
    }

    /// Whether a grant on these terms covers `subject` (agent, tool, scope and input).
    pub fn covers(&self, subject: &Subject<'_>) -> bool {
        let spec = self;
        spec.agent == *subject.agent
            && (spec.kind.is_some() || spec.tool == *subject.tool)
            && match &spec.scope {
                GrantScope::Session(session) => session == subject.session,
                GrantScope::Workspace(workspace) => workspace == subject.workspace,
                GrantScope::Always => true,
            }
            && super::target_matches(spec.kind, &spec.matcher, subject)
    }
}

/// Which grants to revoke.
#[derive(Debug, Clone)]
pub enum RevokeTarget {
    /// This one.
    Id(i64),
    /// Every active session grant of this session.
    Session(AgentId, SessionId),
    /// Every active workspace grant of this workspace.
    Workspace(AgentId, String),
}

#[derive(Debug, Default)]
pub struct RevokeReport {
    /// How many this revocation revoked.
    pub revoked: usize,
    /// The grants revoked (for an id: the grant as it stands, revoked now or before).
    pub grants: Vec<Grant>,
}
