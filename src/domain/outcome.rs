//! Outcomes: the terminal state of a call, written once and never changed, with who decided it
//! and, for everything but APPROVED, the tool-result text the agent hands its model.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::policy::Prejudged;
use super::receipt::Sealed;
use super::{Call, CallKey, Timestamp, ToolInput, code};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    Approved,
    Denied,
    Superseded,
    Skipped,
    Expired,
    Cancelled,
}

impl OutcomeKind {
    pub const ALL: [OutcomeKind; 6] = [
        OutcomeKind::Approved,
        OutcomeKind::Denied,
        OutcomeKind::Superseded,
        OutcomeKind::Skipped,
        OutcomeKind::Expired,
        OutcomeKind::Cancelled,
    ];

    /// The stored code; the same numbers as the protobuf `CallStatus`.
    pub fn code(self) -> i64 {
        match self {
            OutcomeKind::Approved => code!(OutcomeKind::Approved),
            OutcomeKind::Denied => code!(OutcomeKind::Denied),
            OutcomeKind::Superseded => code!(OutcomeKind::Superseded),
            OutcomeKind::Skipped => code!(OutcomeKind::Skipped),
            OutcomeKind::Expired => code!(OutcomeKind::Expired),
            OutcomeKind::Cancelled => code!(OutcomeKind::Cancelled),
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutcomeKind::Approved => "APPROVED",
            OutcomeKind::Denied => "DENIED",
            OutcomeKind::Superseded => "SUPERSEDED",
            OutcomeKind::Skipped => "SKIPPED",
            OutcomeKind::Expired => "EXPIRED",
            OutcomeKind::Cancelled => "CANCELLED",
        })
    }
}

/// Who or what decided an outcome. Stored and shown as `approver:<identity>`, `grant:<id>`,
/// `policy:<rule id>`, `agent`, `deadline` or `broker`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecidedBy {
    Approver(String),
    /// A remembered decision (a grant) matched the call.
    Grant(i64),
    /// An operator's policy rule matched the call.
    Policy(String),
    /// The agent cancelled the call.
    Agent,
    /// The call's deadline passed.
    Deadline,
    /// The broker itself: supersede, skip.
    Broker,
}

impl DecidedBy {
    pub fn parse_stored(s: &str) -> Self {
        if let Some(identity) = s.strip_prefix("approver:") {
            return DecidedBy::Approver(identity.to_owned());
        }
        if let Some(id) = s.strip_prefix("grant:").and_then(|id| id.parse().ok()) {
            return DecidedBy::Grant(id);
        }
        if let Some(rule) = s.strip_prefix("policy:") {
            return DecidedBy::Policy(rule.to_owned());
        }
        match s {
            "agent" => DecidedBy::Agent,
            "deadline" => DecidedBy::Deadline,
            "broker" => DecidedBy::Broker,
            other => DecidedBy::Approver(other.to_owned()),
        }
    }
}

impl DecidedBy {
    /// The people who decided, one identity each (identities hold no comma, so the stored
    /// `approver:a,b` splits unambiguously); empty when no person did.
    pub fn approvers(&self) -> Vec<String> {
        match self {
            DecidedBy::Approver(names) => names
                .split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl fmt::Display for DecidedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecidedBy::Approver(id) => write!(f, "approver:{id}"),
            DecidedBy::Grant(id) => write!(f, "grant:{id}"),
            DecidedBy::Policy(rule) => write!(f, "policy:{rule}"),
            DecidedBy::Agent => f.write_str("agent"),
            DecidedBy::Deadline => f.write_str("deadline"),
            DecidedBy::Broker => f.write_str("broker"),
        }
    }
}

/// A written outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub kind: OutcomeKind,
    pub decided_at: Timestamp,
    pub decided_by: DecidedBy,
    pub reason: String,
    /// For every kind but APPROVED: what the model should read as the tool's result.
    pub tool_result: String,
    /// For APPROVED: the input to run (the approver's edit, or the input as submitted).
    pub run_input: Option<ToolInput>,
    pub input_edited: bool,
    /// The sequence number of the call's Resolved event; `None` until the event is numbered
    /// (Postgres numbers events after they commit). A reader that knows the log up to `seq` S
    /// knows this outcome if `seq <= S`; otherwise the event is still to come.
    pub seq: Option<u64>,
    /// Its signed receipt, where the read that gave this outcome fetched it (the log's events,
    /// and the reads that answer agents: `Broker::seal_outcomes`); `None` elsewhere, while it is
    /// being written, and for an outcome decided while receipts were off.
    pub receipt: Option<Arc<Sealed>>,
}

impl Outcome {
    /// Whether a person answered the call with a message instead of running it (a
    /// [`Decision::responds`]): a DENIED outcome decided by people, whose reason is their message
    /// and whose tool result is exactly [`ToolResultTexts::responded`] of it. That text is fixed
    /// (not configurable) and quotes the message as a JSON string, so no denial's text (which
    /// always reads `<denied text> Reason: ...` or the denied text alone) is taken for one,
    /// and the marker needs no column of its own: a receipt rebuilt from the stored call says the
    /// same.
    pub fn responded(&self) -> bool {
        self.kind == OutcomeKind::Denied
            && matches!(self.decided_by, DecidedBy::Approver(_))
            && !self.reason.is_empty()
            && self.tool_result == ToolResultTexts::responded(&self.reason)
    }

    /// Whether the Resolved event of this outcome is at or before sequence number `upto`.
    pub fn is_logged_by(&self, upto: u64) -> bool {
        self.seq.is_some_and(|seq| seq <= upto)
    }
}

/// What an approver decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Deny,
}

impl Verdict {
    pub fn kind(self) -> OutcomeKind {
        match self {
            Verdict::Approve => OutcomeKind::Approved,
            Verdict::Deny => OutcomeKind::Denied,
        }
    }
}

/// An approver's decision on one call, validated.
#[derive(Debug, Clone)]
pub struct Decision {
    pub verdict: Verdict,
    pub reason: String,
    /// APPROVE only: the input to run instead of the submitted one.
    pub edited_input: Option<ToolInput>,
    pub approver: String,
    /// The approver groups of the approver's token; `None` while auth is off (groups are then
    /// not checked).
    pub approver_groups: Option<Vec<String>>,
    /// Who decides, as visibility knows them: a call they may not see is NOT_FOUND to them, word
    /// for word as an unknown call, never a refusal that says it exists.
    pub viewer: super::Viewer,
    /// Remember this decision as a grant (a scope other than ONCE).
    pub remember: Option<super::policy::Remember>,
    /// DENY only: the person answers the model instead (`reason` is their message, never
    /// empty): the call is not run and its tool result carries the message as their words
    /// ([`ToolResultTexts::responded`]). The gate, quorum and SKIP_REST treat it as the denial
    /// it is.
    pub responds: bool,
    /// For a remembered decision: the matchers that may decide the pending calls its grant
    /// covers (the grant's own, rules', other grants'), judged against their inputs before the
    /// decision was queued, so the write transaction need not (see [`Prejudged`]).
    pub prejudged: HashMap<CallKey, Prejudged>,
    /// APPROVE only: the passkey assertion a call whose requirement asks for `step_up: passkey`
    /// needs (checked in the decision's transaction, `operations::passkeys`).
    pub passkey: Option<std::sync::Arc<super::passkey::PasskeyVote>>,
}

impl Decision {
    /// This decision with an "edit" that is the submitted input itself (canonically equal:
    /// `{"b":[1.0],"a":1}` for `{"a":1,"b":[1]}`) read as no edit at all: nothing else runs, so
    /// the outcome and its receipt say the input ran as submitted. Every path that decides a
    /// call reads the decision through this, once the call is found.
    pub fn against(&self, submitted: &ToolInput) -> std::borrow::Cow<'_, Decision> {
        match &self.edited_input {
            Some(edited) if edited.is_stored_as(submitted) || submitted.is_stored_as(edited) => {
                std::borrow::Cow::Owned(Decision {
                    edited_input: None,
                    ..self.clone()
                })
            }
            _ => std::borrow::Cow::Borrowed(self),
        }
    }

    /// Who decides, as the gate counts people: the approver's canonical identity and groups.
    pub fn person(&self) -> super::policy::Person {
        super::policy::Person::new(
            super::Identity::from_stored(&self.approver),
            self.approver_groups.clone(),
        )
    }

    /// Checks a decision against the outcome that already stands: the same verdict, running
    /// the same input, is a harmless repeat (`Ok`); anything else is refused, naming the outcome
    /// that stands. `submitted` is the call's own input.
    ///
    /// An approval that would run another input than the one that stands (another edit, no
    /// edit after an edit, an edit after none) approved something else: refused, since
    /// replaying it would tell that approver their approval runs. A denial's reason changes
    /// nothing that runs, so a denial repeated with another reason is a repeat (the first
    /// reason stands).
    pub fn check_against(&self, standing: &Outcome, submitted: &ToolInput) -> Result<()> {
        // A response repeated is a repeat; a denial after a response (or a response after a
        // denial) is not: the model reads one or the other, and the second would be told it did.
        let same_verdict =
            standing.kind == self.verdict.kind() && standing.responded() == self.responds;
        let would_run = self.edited_input.as_ref().unwrap_or(submitted);
        let same_input =
            self.verdict == Verdict::Deny || standing.run_input.as_ref() == Some(would_run);
        if same_verdict && same_input {
            return Ok(());
        }
        let what = match standing.kind {
            OutcomeKind::Denied if standing.responded() => {
                "DENIED with a response to the model".to_owned()
            }
            OutcomeKind::Approved if standing.input_edited => {
                "APPROVED with an edited input".to_owned()
            }
            OutcomeKind::Approved => "APPROVED with its input as submitted".to_owned(),
            kind => kind.to_string(),
        };
        Err(Error::FailedPrecondition(format!(
            "the call is already {what} (decided by {}); that outcome stands",
            standing.decided_by
        )))
    }
}

/// What the model reads before a person's response (see [`ToolResultTexts::responded`]).
pub const RESPONDED: &str = "The user did not run this tool call and answered instead:";

/// The tool-result texts the model reads for each outcome but APPROVED. Configurable; a
/// reason, when there is one, is appended as " Reason: ...".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResultTexts {
    pub denied: String,
    /// DENIED by a policy rule (not by a person).
    pub denied_by_policy: String,
    pub superseded: String,
    pub skipped: String,
    pub expired: String,
    pub cancelled: String,
}

impl Default for ToolResultTexts {
    fn default() -> Self {
        Self {
            denied: "The user denied this tool call.".to_owned(),
            denied_by_policy: "A policy rule denied this tool call.".to_owned(),
            superseded: "This request was replaced by a newer one and was not answered. \
                         If it is still needed, ask again with the same request."
                .to_owned(),
            skipped: "Not run: another tool call in the same batch was denied.".to_owned(),
            expired: "No approver answered before the deadline; the tool was not run.".to_owned(),
            cancelled: "The request was cancelled before a decision; the tool was not run."
                .to_owned(),
        }
    }
}

impl ToolResultTexts {
    /// The text for an outcome of `kind` with `reason`; empty for APPROVED.
    pub fn render(&self, kind: OutcomeKind, reason: &str) -> String {
        let base = match kind {
            OutcomeKind::Approved => return String::new(),
            OutcomeKind::Denied => &self.denied,
            OutcomeKind::Superseded => &self.superseded,
            OutcomeKind::Skipped => &self.skipped,
            OutcomeKind::Expired => &self.expired,
            OutcomeKind::Cancelled => &self.cancelled,
        };
        Self::with_reason(base, reason)
    }

    /// The tool result of a person's response (`DECISION_RESPOND`): their message, quoted as a
    /// JSON string so where it ends is unambiguous, after a fixed text that says the call did
    /// not run and these are the person's words.
    pub fn responded(message: &str) -> String {
        format!(
            "{RESPONDED} {}",
            serde_json::Value::String(message.to_owned())
        )
    }

    /// `base`, with " Reason: ..." appended when there is a reason.
    pub fn with_reason(base: &str, reason: &str) -> String {
        if reason.is_empty() {
            base.to_owned()
        } else {
            format!("{base} Reason: {reason}")
        }
    }

    /// The outcome a non-approval resolution writes.
    pub fn outcome(
        &self,
        kind: OutcomeKind,
        decided_by: DecidedBy,
        reason: &str,
        at: Timestamp,
    ) -> Outcome {
        Outcome {
            kind,
            decided_at: at,
            decided_by,
            reason: reason.to_owned(),
            tool_result: self.render(kind, reason),
            run_input: None,
            input_edited: false,
            seq: None,
            receipt: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denial_text_carries_the_reason() {
        let texts = ToolResultTexts::default();
        assert_eq!(
            texts.render(OutcomeKind::Denied, "too risky"),
            "The user denied this tool call. Reason: too risky"
        );
        assert_eq!(texts.render(OutcomeKind::Approved, "fine"), "");
    }

    #[test]
    fn a_response_is_marked_and_no_denial_passes_for_one() {
        let texts = ToolResultTexts::default();
        let by = DecidedBy::Approver("ana".into());
        let at = Timestamp::from_micros(1);
        let message = r#"use "npm ci" instead"#;
        let mut answered = texts.outcome(OutcomeKind::Denied, by.clone(), message, at);
        answered.tool_result = ToolResultTexts::responded(message);
        assert!(answered.responded());
        assert_eq!(
            answered.tool_result,
            r#"The user did not run this tool call and answered instead: "use \"npm ci\" instead""#
        );
        // A denial with the same reason, a response text from a grant or with no message: not.
        let denied = texts.outcome(OutcomeKind::Denied, by.clone(), message, at);
        assert!(!denied.responded());
        let by_grant = Outcome {
            decided_by: DecidedBy::Grant(3),
            ..answered.clone()
        };
        assert!(!by_grant.responded());
        let empty = Outcome {
            reason: String::new(),
            tool_result: ToolResultTexts::responded(""),
            ..answered
        };
        assert!(!empty.responded());
    }

    #[test]
    fn decided_by_round_trips_through_its_stored_form() {
        for d in [
            DecidedBy::Approver("alice@example.com".into()),
            DecidedBy::Approver("grant:7".into()),
            DecidedBy::Grant(7),
            DecidedBy::Policy("no-rm".into()),
            DecidedBy::Agent,
            DecidedBy::Deadline,
            DecidedBy::Broker,
        ] {
            assert_eq!(DecidedBy::parse_stored(&d.to_string()), d);
        }
    }
}

/// What a decide did.
#[derive(Debug)]
pub struct DecideReport {
    /// The call with the outcome that stands.
    pub call: Call,
    /// The call was already decided this way; nothing was written.
    pub replayed: bool,
    /// Calls this decision skipped: of the same batch on a denial, and of the batches the new
    /// grant's denials touched.
    pub skipped: Vec<Call>,
    /// The grant the decision created; on a replayed decision, the one the first one created.
    pub grant: Option<super::policy::Grant>,
    /// Pending calls the new grant decided at once.
    pub decided_by_grant: Vec<Call>,
    /// Set when the new grant's authors could not decide calls like this one by themselves (a
    /// grant made by the vote that completes a quorum names only the voters who chose its
    /// scope): the grant is kept, and decides only the calls its authors could decide.
    pub grant_note: Option<String>,
}
