//! The one gate every path to APPROVED or DENIED passes: a person's decision, the vote that
//! completes a quorum, a grant at submit, a new grant deciding pending calls, and (by reading the
//! call first) Postgres's one-statement approval. It judges a verdict against the call's
//! requirement, fixed at submit: who may decide (groups), how many distinct people (quorum), and
//! who may not approve (the agent that submitted the call, and the person it was requested by).
//!
//! A grant is a standing decision by the people who made it ([`GrantSpec::authors`]): it may
//! decide a call only where those people, together, could have decided it themselves. Rules are
//! the operator's policy and are not judged here; outcomes they decide say `policy:<id>`.
//!
//! Pure: identities arrive canonical ([`Identity`]), groups from the decider's token.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::{Approvers, GrantSpec, Requirement};
use crate::domain::identity::{Identity, canonical};
use crate::domain::{AgentId, Call, Decision, Verdict};
use crate::error::{Error, Result};

/// Someone who takes part in a verdict: their identity, and their approver groups when they
/// decided (`None` while auth is off: groups are then not checked, as for every decision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub identity: Identity,
    pub groups: Option<Vec<String>>,
}

impl Person {
    pub fn new(identity: Identity, groups: Option<Vec<String>>) -> Self {
        Self { identity, groups }
    }

    /// The stored form of a list of people (a grant's authors).
    pub fn list_to_stored(people: &[Person]) -> String {
        Value::Array(
            people
                .iter()
                .map(|p| json!({"identity": p.identity.as_str(), "groups": p.groups}))
                .collect(),
        )
        .to_string()
    }

    /// Reads [`Person::list_to_stored`]'s form. A grant stored before grants had authors has
    /// none (`None`): its authors are read from `created_by` (`approver:a,b`), with no groups
    /// known, so it decides no call whose requirement names groups.
    pub fn list_from_stored(stored: Option<&str>, created_by: &str) -> Result<Vec<Person>> {
        let Some(text) = stored else {
            let names = created_by.strip_prefix("approver:").unwrap_or(created_by);
            return Ok(names
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| Person::new(Identity::from_stored(n), Some(Vec::new())))
                .collect());
        };
        let unreadable = || Error::Internal("a grant's stored authors are unreadable".into());
        let list: Vec<Value> = serde_json::from_str(text).map_err(|_| unreadable())?;
        list.iter()
            .map(|v| {
                let identity = v
                    .get("identity")
                    .and_then(Value::as_str)
                    .ok_or_else(unreadable)?;
                let groups = match v.get("groups") {
                    None | Some(Value::Null) => None,
                    Some(Value::Array(groups)) => Some(
                        groups
                            .iter()
                            .filter_map(|g| g.as_str().map(str::to_owned))
                            .collect(),
                    ),
                    Some(_) => return Err(unreadable()),
                };
                Ok(Person::new(Identity::from_stored(identity), groups))
            })
            .collect()
    }
}

/// The names of `people`, for messages: `alice, bob`.
pub fn names(people: &[Person]) -> String {
    people
        .iter()
        .map(|p| p.identity.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the gate knows of one call: who submitted it, and what it requires.
#[derive(Debug, Clone, Copy)]
pub struct Gate<'c> {
    call_id: &'c str,
    agent: &'c AgentId,
    requested_by: &'c str,
    requirement: Option<&'c Requirement>,
}

/// Anyone, alone: what a call with no requirement fixed on it needs.
static ANYONE: Approvers = Approvers {
    groups: Vec::new(),
    quorum: 1,
    distinct_groups: false,
    denials_to_deny: 1,
    step_up: None,
};

impl<'c> Gate<'c> {
    /// The gate of a stored call, with the requirement fixed on it at submit.
    pub fn of(call: &'c Call) -> Self {
        Self::with(call, call.approval.as_ref().map(|a| &a.requirement))
    }

    /// The gate of `call` under `requirement`: at submit, the requirement is fixed before any
    /// grant is tried, and stored with the call once it is known to wait for people.
    pub fn with(call: &'c Call, requirement: Option<&'c Requirement>) -> Self {
        Self::new(
            call.key.call_id.as_str(),
            &call.key.agent,
            &call.requested_by,
            requirement,
        )
    }

    /// The gate of a call not stored (Explain's inline call): its id as messages name it, its
    /// agent, the person it is requested by (empty: none), and its requirement.
    pub fn new(
        call_id: &'c str,
        agent: &'c AgentId,
        requested_by: &'c str,
        requirement: Option<&'c Requirement>,
    ) -> Self {
        Self {
            call_id,
            agent,
            requested_by,
            requirement,
        }
    }

    fn approvers(&self) -> &'c Approvers {
        self.requirement.map_or(&ANYONE, |r| &r.approvers)
    }

    /// Whether `person` may take part in `verdict` on this call: nobody approves a call they
    /// submitted (as its agent, or as the person it was requested by; they may withdraw it by
    /// denying), and where the requirement names groups, only their members decide.
    /// PERMISSION_DENIED naming the rule otherwise.
    pub fn admit(&self, person: &Person, verdict: Verdict) -> Result<()> {
        let who = person.identity.as_str();
        if verdict == Verdict::Approve {
            let role = if person.identity.is(self.agent.as_str()) {
                Some("its agent")
            } else if person.identity.is(self.requested_by) {
                Some("the human it was requested by")
            } else {
                None
            };
            if let Some(role) = role {
                return Err(Error::PermissionDenied(format!(
                    "`{who}` submitted call `{}` ({role}) and may not approve it: no \
                     self-approval; another approver must decide it",
                    self.call_id
                )));
            }
        }
        let approvers = self.approvers();
        if let (Some(groups), Some(requirement)) = (&person.groups, self.requirement)
            && !approvers.admits(groups)
        {
            let theirs = if groups.is_empty() {
                "none".to_owned()
            } else {
                groups.join(", ")
            };
            return Err(Error::PermissionDenied(format!(
                "`{who}` may not decide call `{}`: {} lets only members of {} decide it \
                 (`{who}`'s groups: {theirs})",
                self.call_id,
                requirement.name(),
                approvers.groups.join(", "),
            )));
        }
        Ok(())
    }

    /// Whether an approver's decision may be made: [`Gate::admit`] for its approver, no
    /// edited input where more than one approval is needed (each approves the input as
    /// submitted), and a passkey assertion with an approval where the requirement asks for one
    /// (whether it verifies is checked in the decision's transaction,
    /// `operations::passkeys::check_step_up`). Refused before anything is read or written.
    pub fn admit_decision(&self, decision: &Decision) -> Result<()> {
        self.admit(&decision.person(), decision.verdict)?;
        if decision.verdict == Verdict::Approve
            && decision.passkey.is_none()
            && let Some(requirement) = self.requirement.filter(|r| r.needs_passkey())
        {
            return Err(Error::PermissionDenied(format!(
                "call `{}` needs a passkey-signed approval ({} asks for step_up passkey): call \
                 BeginStepUp, sign its challenge with your passkey, and send the assertion as \
                 `passkey` with the decision",
                self.call_id,
                requirement.name()
            )));
        }
        let approvers = self.approvers();
        if decision.edited_input.is_some() && approvers.quorum > 1 {
            return Err(Error::invalid(
                "edited_input_json",
                format!(
                    "call `{}` needs {} approvals ({}); each approves the input as submitted, \
                     so none may edit it",
                    self.call_id,
                    approvers.quorum,
                    self.requirement
                        .map_or_else(|| "any approver".to_owned(), |r| r.name())
                ),
            ));
        }
        Ok(())
    }

    /// Whether `people` together decide this call `verdict`: each admitted, and enough distinct
    /// people (from distinct groups where the requirement asks for that).
    pub fn decides(&self, verdict: Verdict, people: &[Person]) -> bool {
        people.iter().all(|p| self.admit(p, verdict).is_ok())
            && quorum_met(self.approvers(), verdict, people)
    }

    /// Whether a grant may decide this call: only if its authors could have decided it
    /// themselves. `Err` says why not, for Explain and the audit.
    pub fn admits_grant(&self, grant: &GrantSpec) -> std::result::Result<(), String> {
        let verdict = grant.effect.verdict();
        if grant.authors.is_empty() {
            return Err("the grant names no author".into());
        }
        // A passkey signs one call's statement: a standing grant (even one made by a signed
        // vote) cannot sign for the calls after it. Denials need no passkey.
        if verdict == Verdict::Approve
            && let Some(requirement) = self.requirement.filter(|r| r.needs_passkey())
        {
            return Err(format!(
                "call `{}` needs each approval signed with a passkey ({} asks for step_up \
                 passkey), and a grant signs nothing",
                self.call_id,
                requirement.name()
            ));
        }
        for author in &grant.authors {
            if let Err(refused) = self.admit(author, verdict) {
                return Err(refused.to_string());
            }
        }
        if quorum_met(self.approvers(), verdict, &grant.authors) {
            return Ok(());
        }
        let approvers = self.approvers();
        let needed = match verdict {
            Verdict::Approve => approvers.quorum,
            Verdict::Deny => approvers.denials_to_deny,
        };
        Err(format!(
            "made by {}; call `{}` needs {} ({})",
            names(&grant.authors),
            self.call_id,
            match verdict {
                Verdict::Approve => format!("{needed} approval(s)"),
                Verdict::Deny => format!("{needed} denial(s)"),
            },
            self.requirement
                .map_or_else(|| "any approver".to_owned(), |r| r.name())
        ))
    }
}

/// Whether `people` are enough for `verdict` under `approvers` (see [`counted`]). Admission is
/// [`Gate::admit`]'s; this only counts.
pub fn quorum_met(approvers: &Approvers, verdict: Verdict, people: &[Person]) -> bool {
    let needed = match verdict {
        Verdict::Approve => approvers.quorum,
        Verdict::Deny => approvers.denials_to_deny,
    };
    counted(approvers, verdict, people) >= needed
}

/// How many of `people` count towards `verdict` under `approvers`: distinct identities
/// (canonical, so `Alice` and `alice` count once), and for approvals with `distinct_groups` at
/// most one per group (the largest assignment of people to the groups they are in).
pub fn counted(approvers: &Approvers, verdict: Verdict, people: &[Person]) -> u32 {
    let mut seen = HashSet::new();
    let distinct: Vec<&Person> = people
        .iter()
        .filter(|p| seen.insert(canonical(p.identity.as_str())))
        .collect();
    if verdict == Verdict::Approve && approvers.distinct_groups {
        distinct_group_count(&approvers.groups, &distinct)
    } else {
        distinct.len() as u32
    }
}

/// How many of `people` can each be assigned a different one of `groups` they belong to: a
/// bipartite matching (a handful of each), by Kuhn's augmenting paths.
fn distinct_group_count(groups: &[String], people: &[&Person]) -> u32 {
    fn assign(
        person: usize,
        people: &[&Person],
        groups: &[String],
        owner: &mut [Option<usize>],
        seen: &mut [bool],
    ) -> bool {
        let theirs = people[person].groups.as_deref().unwrap_or_default();
        for (g, group) in groups.iter().enumerate() {
            if seen[g] || !theirs.contains(group) {
                continue;
            }
            seen[g] = true;
            if owner[g].is_none_or(|other| assign(other, people, groups, owner, seen)) {
                owner[g] = Some(person);
                return true;
            }
        }
        false
    }
    let mut owner: Vec<Option<usize>> = vec![None; groups.len()];
    (0..people.len())
        .filter(|&person| {
            let mut seen = vec![false; groups.len()];
            assign(person, people, groups, &mut owner, &mut seen)
        })
        .count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::policy::{Approval, Effect, GrantScope, Matcher, RuleId};
    use crate::domain::{BatchId, CallId, CallKey, SessionId, Timestamp, ToolInput, ToolName};

    fn person(name: &str, groups: &[&str]) -> Person {
        Person::new(
            Identity::parse("t", name).unwrap(),
            Some(groups.iter().map(|g| g.to_string()).collect()),
        )
    }

    fn key() -> CallKey {
        CallKey {
            agent: AgentId::from_stored("bot".into()),
            session: SessionId::from_stored("s".into()),
            call_id: CallId::from_stored("c".into()),
        }
    }

    fn call(requested_by: &str, approvers: Option<Approvers>) -> Call {
        Call {
            action: None,
            host: None,
            key: key(),
            batch_id: BatchId::generate(),
            position: 0,
            batch_size: 1,
            tool: ToolName::from_stored("t".into()),
            input: ToolInput::from_stored("{}".into()),
            title: String::new(),
            message: String::new(),
            workspace: String::new(),
            supersede_key: None,
            deadline: None,
            created_at: Timestamp::from_micros(1),
            outcome: None,
            escalation: None,
            requested_by: requested_by.into(),
            approval: approvers.map(|approvers| Approval {
                requirement: Requirement::of_rule(&RuleId::parse("id", "r").unwrap(), &approvers),
                votes: Vec::new(),
            }),
        }
    }

    fn grant(authors: Vec<Person>) -> GrantSpec {
        GrantSpec {
            kind: None,
            agent: key().agent,
            scope: GrantScope::Always,
            tool: ToolName::from_stored("t".into()),
            matcher: Matcher::Any,
            effect: Effect::Allow,
            created_by: "approver:x".into(),
            authors,
            created_at: Timestamp::from_micros(0),
            expires_at: None,
            source: key(),
            reason: String::new(),
        }
    }

    fn two(groups: &[&str], distinct: bool) -> Approvers {
        Approvers {
            groups: groups.iter().map(|g| g.to_string()).collect(),
            quorum: 2,
            distinct_groups: distinct,
            denials_to_deny: 1,
            step_up: None,
        }
    }

    #[test]
    fn a_step_up_call_is_approved_by_no_grant_and_by_no_vote_without_a_passkey() {
        let signed = call(
            "",
            Some(Approvers {
                step_up: Some(super::super::StepUp::Passkey),
                ..Approvers::default()
            }),
        );
        let gate = Gate::of(&signed);
        let err = gate
            .admits_grant(&grant(vec![person("alice", &[]), person("bob", &[])]))
            .unwrap_err();
        assert!(err.contains("a grant signs nothing"), "{err}");
        let mut deny = grant(vec![person("alice", &[])]);
        deny.effect = Effect::Deny;
        assert!(
            gate.admits_grant(&deny).is_ok(),
            "a denial needs no passkey"
        );
        let decision = crate::operations::testing::decision(Verdict::Approve, "");
        let err = gate.admit_decision(&decision).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(err.to_string().contains("BeginStepUp"), "{err}");
        let deny = crate::operations::testing::decision(Verdict::Deny, "");
        assert!(gate.admit_decision(&deny).is_ok());
    }

    #[test]
    fn nobody_approves_their_own_call_whatever_the_case_or_width_they_are_written_in() {
        let c = call("Carol", None);
        let gate = Gate::of(&c);
        for me in ["carol", "CAROL", "ｃａｒｏｌ"] {
            let err = gate.admit(&person(me, &[]), Verdict::Approve).unwrap_err();
            assert_eq!(err.code(), tonic::Code::PermissionDenied, "{me}");
        }
        assert!(gate.admit(&person("carol", &[]), Verdict::Deny).is_ok());
        assert!(gate.admit(&person("BOT", &[]), Verdict::Approve).is_err());
        assert!(gate.decides(Verdict::Approve, &[person("alice", &[])]));
    }

    #[test]
    fn a_quorum_counts_distinct_people_once_whatever_their_case() {
        let c = call("", Some(two(&[], false)));
        let gate = Gate::of(&c);
        assert!(!gate.decides(
            Verdict::Approve,
            &[person("alice", &[]), person("Alice", &[])]
        ));
        assert!(gate.decides(
            Verdict::Approve,
            &[person("alice", &[]), person("bob", &[])]
        ));
    }

    #[test]
    fn a_grant_decides_only_what_its_authors_could_have_decided() {
        // Carol's own grant never approves a call she is requested_by.
        let own = call("carol", None);
        let err = Gate::of(&own)
            .admits_grant(&grant(vec![person("carol", &[])]))
            .unwrap_err();
        assert!(err.contains("no self-approval"), "{err}");
        // One author cannot satisfy a two-person rule; two distinct ones can.
        let pair = call("", Some(two(&[], false)));
        let err = Gate::of(&pair)
            .admits_grant(&grant(vec![person("bob", &[])]))
            .unwrap_err();
        assert!(err.contains("needs 2 approval(s)"), "{err}");
        assert!(
            Gate::of(&pair)
                .admits_grant(&grant(vec![person("alice", &[]), person("bob", &[])]))
                .is_ok()
        );
        // Groups: an author outside the call's groups cannot decide it.
        let ops = call(
            "",
            Some(Approvers {
                groups: vec!["ops".into()],
                ..Approvers::default()
            }),
        );
        assert!(
            Gate::of(&ops)
                .admits_grant(&grant(vec![person("dave", &["dev"])]))
                .is_err()
        );
        assert!(
            Gate::of(&ops)
                .admits_grant(&grant(vec![person("olga", &["ops"])]))
                .is_ok()
        );
        // A grant from before authors were stored: no groups known, so no group-scoped call.
        let legacy = Person::list_from_stored(None, "approver:olga").unwrap();
        assert!(Gate::of(&ops).admits_grant(&grant(legacy)).is_err());
    }

    #[test]
    fn distinct_groups_count_at_most_one_person_per_group() {
        let c = call("", Some(two(&["ops", "sec"], true)));
        let gate = Gate::of(&c);
        assert!(!gate.decides(
            Verdict::Approve,
            &[person("alice", &["ops"]), person("carol", &["ops"])]
        ));
        assert!(gate.decides(
            Verdict::Approve,
            &[person("dave", &["ops", "sec"]), person("alice", &["ops"])]
        ));
    }

    #[test]
    fn authors_round_trip_through_their_stored_form() {
        let people = vec![
            person("alice", &["ops"]),
            Person::new(Identity::parse("t", "bob").unwrap(), None),
        ];
        let stored = Person::list_to_stored(&people);
        assert_eq!(
            Person::list_from_stored(Some(&stored), "ignored").unwrap(),
            people
        );
    }
}
