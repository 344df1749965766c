//! Who may read a call: the one question every read that returns a call's content asks
//! ([`Call::visible_to`]), so that no read answers it its own way. Pure: the reader comes from
//! its token (`auth::Caller::viewer`), the requirement from the call as stored.
//!
//! A call its reader may not see does not exist for that reader: lists and streams leave it out,
//! and a read naming it answers NOT_FOUND exactly as for an unknown id ([`CallKey::not_found`]),
//! never PERMISSION_DENIED, which would say that it exists and what keeps the reader out.

use super::{AgentId, Call, CallKey};
use crate::error::{Error, Result};

/// Who reads, as far as visibility is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Viewer {
    /// Sees every call: an admin or an auditor (operators, who audit everything), or anyone
    /// while auth is off (the laptop default, where nobody's groups are known).
    Operator,
    /// An agent: its own calls (those submitted under its identity), and no other agent's.
    Agent(AgentId),
    /// An approver: the calls its groups may decide (a call whose requirement names groups is
    /// shown only to their members; one with no requirement, or none naming groups, to every
    /// approver).
    Approver { groups: Vec<String> },
}

impl Viewer {
    /// Whether this reader sees every call whatever it is: the only readers shown what cannot be
    /// judged any more (a receipt whose call retention pruned, its requirement gone with it).
    pub fn sees_every_call(&self) -> bool {
        matches!(self, Viewer::Operator)
    }
}

impl Call {
    /// Whether `viewer` may read this call: the one visibility rule. An approver's test is the
    /// same membership test the decision gate applies ([`Approvers::admits`]), so an approver
    /// sees exactly the calls their groups may decide.
    ///
    /// [`Approvers::admits`]: super::policy::Approvers::admits
    pub fn visible_to(&self, viewer: &Viewer) -> bool {
        match viewer {
            Viewer::Operator => true,
            Viewer::Agent(agent) => self.key.agent == *agent,
            Viewer::Approver { groups } => self
                .approval
                .as_ref()
                .is_none_or(|approval| approval.requirement.approvers.admits(groups)),
        }
    }

    /// This call if `viewer` may read it; otherwise NOT_FOUND for `asked` (the key the reader
    /// sent), word for word what an unknown call answers.
    pub fn shown_to(self, viewer: &Viewer, asked: &CallKey) -> Result<Call> {
        if self.visible_to(viewer) {
            Ok(self)
        } else {
            Err(hidden(asked))
        }
    }
}

/// What a reader is told of a call it may not see: [`CallKey::not_found`], nothing more.
fn hidden(asked: &CallKey) -> Error {
    asked.not_found()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::policy::{Approval, Approvers, Requirement};

    fn pending_call(call_id: &str) -> Call {
        Call::sample("bot", "s", call_id, "deploy", "b1")
    }

    fn requiring(mut call: Call, groups: &[&str]) -> Call {
        let approvers = Approvers {
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Approvers::default()
        };
        call.approval = Some(Approval {
            requirement: Requirement::default_of(&approvers),
            votes: Vec::new(),
        });
        call
    }

    fn approver(groups: &[&str]) -> Viewer {
        Viewer::Approver {
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn approvers_see_what_their_groups_may_decide_and_operators_see_everything() {
        let ops_only = requiring(pending_call("c1"), &["ops"]);
        assert!(ops_only.visible_to(&approver(&["ops", "sec"])));
        assert!(!ops_only.visible_to(&approver(&["sec"])));
        assert!(!ops_only.visible_to(&approver(&[])));
        assert!(ops_only.visible_to(&Viewer::Operator));

        let anyone = pending_call("c2");
        assert!(anyone.visible_to(&approver(&[])));
        let no_groups = requiring(pending_call("c3"), &[]);
        assert!(no_groups.visible_to(&approver(&[])));
    }

    #[test]
    fn an_agent_sees_its_own_calls_only() {
        let call = pending_call("c1");
        assert!(call.visible_to(&Viewer::Agent(call.key.agent.clone())));
        let other = AgentId::parse("agent", "someone-else").unwrap();
        assert!(!call.visible_to(&Viewer::Agent(other)));
    }

    #[test]
    fn a_hidden_call_is_refused_word_for_word_as_an_unknown_one() {
        let call = requiring(pending_call("c1"), &["ops"]);
        let asked = call.key.clone();
        let refused = call.shown_to(&approver(&[]), &asked).unwrap_err();
        let unknown = asked.not_found();
        assert_eq!(refused.code(), unknown.code());
        assert_eq!(refused.to_string(), unknown.to_string());
    }
}
