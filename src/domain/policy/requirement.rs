//! Who may decide a call, and how many must agree: an approval requirement. An ask rule may
//! name one (`approvers`), and the broker may have a default; the requirement that applies is
//! fixed on the call when it is submitted, so editing a rule later never changes what a pending
//! call needs. Votes are kept on the call until they decide it.
//!
//! Everything here is pure: the groups an approver belongs to come from their token, the votes
//! from the store, and [`Approval::tally`] says whether a new vote decides the call.

use std::fmt;

use serde_json::{Value, json};

use super::gate::counted;
use super::{Person, Remember, RuleId, quorum_met};
use crate::domain::passkey::SignedApproval;
use crate::domain::{Decision, Identity, Timestamp, Verdict};
use crate::error::{Error, Result};

/// At most this many groups in a requirement, and this many approvals or denials asked for.
pub const MAX_GROUPS: usize = 32;
pub const MAX_QUORUM: u32 = 16;

/// An approver group's name, as the token file and requirements spell it: 1 to 64 of
/// `A-Z a-z 0-9 . _ -`.
pub fn group_name(field: &str, name: &str) -> Result<String> {
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
        return Err(Error::invalid(
            field,
            format!(
                "a group is 1 to 64 of A-Z a-z 0-9 . _ - (got `{}`)",
                name.escape_debug()
            ),
        ));
    }
    Ok(name.to_owned())
}

/// What each approving vote must carry besides the approver's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepUp {
    /// A WebAuthn assertion by one of the voter's registered passkeys over the statement they
    /// were shown and a fresh nonce (`domain::passkey::step_up`); JSON `"passkey"`.
    Passkey,
}

impl StepUp {
    pub fn as_str(self) -> &'static str {
        match self {
            StepUp::Passkey => "passkey",
        }
    }
}

/// Who may decide the calls an ask rule (or the default) sends to people, and how many must
/// agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approvers {
    /// The groups whose members may decide; empty: every approver.
    pub groups: Vec<String>,
    /// How many approvals from distinct approvers approve the call (1 or more).
    pub quorum: u32,
    /// The approvals counted must each come from a different one of `groups`.
    pub distinct_groups: bool,
    /// How many denials from distinct approvers deny the call (1: any single denial).
    pub denials_to_deny: u32,
    /// What each approving vote must carry besides the approver's token (`None`: nothing).
    /// A denial never needs it.
    pub step_up: Option<StepUp>,
}

impl Default for Approvers {
    fn default() -> Self {
        Self {
            groups: Vec::new(),
            quorum: 1,
            distinct_groups: false,
            denials_to_deny: 1,
            step_up: None,
        }
    }
}

impl Approvers {
    /// Checks the terms: groups well formed and distinct, counts in range, and a quorum of
    /// distinct groups that the groups can meet. `field` prefixes the key named in errors.
    pub fn validated(self, field: &str) -> Result<Self> {
        if self.groups.len() > MAX_GROUPS {
            return Err(Error::invalid(
                format!("{field}.groups"),
                format!("at most {MAX_GROUPS} groups"),
            ));
        }
        for (i, group) in self.groups.iter().enumerate() {
            group_name(&format!("{field}.groups[{i}]"), group)?;
            if self.groups[..i].contains(group) {
                return Err(Error::invalid(
                    format!("{field}.groups[{i}]"),
                    format!("`{group}` is listed twice"),
                ));
            }
        }
        for (key, n) in [
            ("quorum", self.quorum),
            ("denials_to_deny", self.denials_to_deny),
        ] {
            if n == 0 || n > MAX_QUORUM {
                return Err(Error::invalid(
                    format!("{field}.{key}"),
                    format!("must be 1 to {MAX_QUORUM} (got {n})"),
                ));
            }
        }
        if self.distinct_groups && (self.groups.len() as u32) < self.quorum {
            return Err(Error::invalid(
                format!("{field}.distinct_groups"),
                format!(
                    "{} approvals from distinct groups need at least {} groups (got {})",
                    self.quorum,
                    self.quorum,
                    self.groups.len()
                ),
            ));
        }
        Ok(self)
    }

    /// From the policy file's (or the `--default-approvers` setting's) JSON: `{"groups": [...],
    /// "quorum": 2, "distinct_groups": true, "denials_to_deny": 1, "step_up": "passkey"}`, every
    /// key optional, unknown keys refused.
    pub fn from_json(field: &str, value: &Value) -> Result<Self> {
        let object = value
            .as_object()
            .ok_or_else(|| Error::invalid(field, "must be a JSON object"))?;
        const KEYS: [&str; 5] = [
            "groups",
            "quorum",
            "distinct_groups",
            "denials_to_deny",
            "step_up",
        ];
        if let Some(unknown) = object.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(Error::invalid(
                format!("{field}.{unknown}"),
                format!("unknown key (the keys are {})", KEYS.join(", ")),
            ));
        }
        let count = |key: &str, default: u32| match object.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| Error::invalid(format!("{field}.{key}"), "must be a number")),
        };
        let groups = match object.get("groups") {
            None => Vec::new(),
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    g.as_str().map(str::to_owned).ok_or_else(|| {
                        Error::invalid(format!("{field}.groups[{i}]"), "must be a string")
                    })
                })
                .collect::<Result<_>>()?,
            Some(_) => {
                return Err(Error::invalid(
                    format!("{field}.groups"),
                    "must be a list of strings",
                ));
            }
        };
        let distinct_groups = match object.get("distinct_groups") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(Error::invalid(
                    format!("{field}.distinct_groups"),
                    "must be true or false",
                ));
            }
        };
        let step_up = match object.get("step_up") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s == "passkey" => Some(StepUp::Passkey),
            Some(_) => {
                return Err(Error::invalid(
                    format!("{field}.step_up"),
                    "must be \"passkey\" (or absent)",
                ));
            }
        };
        Approvers {
            groups,
            quorum: count("quorum", 1)?,
            distinct_groups,
            denials_to_deny: count("denials_to_deny", 1)?,
            step_up,
        }
        .validated(field)
    }

    /// As [`Approvers::from_json`] reads them (`step_up` only when asked for, so requirements
    /// stored before it keep their form).
    pub fn to_json(&self) -> Value {
        let mut value = json!({
            "groups": self.groups,
            "quorum": self.quorum,
            "distinct_groups": self.distinct_groups,
            "denials_to_deny": self.denials_to_deny,
        });
        if let Some(step_up) = self.step_up {
            value["step_up"] = json!(step_up.as_str());
        }
        value
    }

    /// Whether an approver in `groups` may decide.
    pub fn admits(&self, groups: &[String]) -> bool {
        self.groups.is_empty() || self.groups.iter().any(|g| groups.contains(g))
    }
}

impl fmt::Display for Approvers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = if self.groups.is_empty() {
            "any approver".to_owned()
        } else {
            format!("members of {}", self.groups.join(", "))
        };
        let distinct = if self.distinct_groups {
            ", each from a different group"
        } else {
            ""
        };
        let signed = match self.step_up {
            Some(StepUp::Passkey) => ", each signed with a passkey",
            None => "",
        };
        write!(
            f,
            "{who}; {} approval(s) from distinct approvers{distinct}{signed}; {} denial(s) deny",
            self.quorum, self.denials_to_deny
        )
    }
}

/// The requirement fixed on a call at submit: the approvers, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The ask rule that named them; `None`: the broker's default (`--default-approvers`).
    pub rule: Option<String>,
    pub approvers: Approvers,
}

impl Requirement {
    pub fn of_rule(rule: &RuleId, approvers: &Approvers) -> Self {
        Self {
            rule: Some(rule.as_str().to_owned()),
            approvers: approvers.clone(),
        }
    }

    pub fn default_of(approvers: &Approvers) -> Self {
        Self {
            rule: None,
            approvers: approvers.clone(),
        }
    }

    /// Whether each approving vote must be signed with a passkey (`step_up: passkey`).
    pub fn needs_passkey(&self) -> bool {
        self.approvers.step_up == Some(StepUp::Passkey)
    }

    /// How errors and explanations name it: `rule `x`` or `the default requirement`.
    pub fn name(&self) -> String {
        match &self.rule {
            Some(rule) => format!("rule `{rule}`"),
            None => "the default requirement (--default-approvers)".to_owned(),
        }
    }

    /// The stored form: the approvers' JSON (as the policy file spells them) and `rule`.
    pub fn to_stored(&self) -> String {
        let mut value = self.approvers.to_json();
        value["rule"] = json!(self.rule);
        value.to_string()
    }

    pub fn from_stored(text: &str) -> Result<Self> {
        let unreadable = |why: String| Error::Internal(format!("a stored requirement: {why}"));
        let mut value: Value = serde_json::from_str(text).map_err(|e| unreadable(e.to_string()))?;
        let rule = match value.as_object_mut().and_then(|o| o.remove("rule")) {
            Some(Value::String(rule)) => Some(rule),
            _ => None,
        };
        let approvers =
            Approvers::from_json("requirement", &value).map_err(|e| unreadable(e.to_string()))?;
        Ok(Self { rule, approvers })
    }
}

/// One approver's vote on a call that needs more than one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vote {
    /// The approver's canonical identity.
    pub approver: String,
    /// The approver's groups when they voted (for distinct-group quorums and the audit); `None`
    /// while auth was off (groups not checked).
    pub groups: Option<Vec<String>>,
    pub approve: bool,
    pub reason: String,
    pub at: i64,
    /// What the approver asked to remember with the vote ([`Remember::key`]), if anything: the
    /// grant the completing vote creates names as its authors only the voters who asked for
    /// the same.
    pub remember: Option<String>,
    /// The passkey assertion that made this approval count, where the requirement asks for one
    /// (checked in the decision's transaction; the receipt carries it).
    pub passkey: Option<SignedApproval>,
}

impl Vote {
    pub fn new(decision: &Decision, at: Timestamp) -> Self {
        Self {
            approver: Identity::from_stored(&decision.approver).into_string(),
            groups: decision.approver_groups.clone(),
            approve: decision.verdict == Verdict::Approve,
            reason: decision.reason.clone(),
            at: at.as_micros(),
            remember: decision.remember.as_ref().map(Remember::key),
            passkey: None,
        }
    }

    pub fn verdict(&self) -> Verdict {
        if self.approve {
            Verdict::Approve
        } else {
            Verdict::Deny
        }
    }

    /// The voter, as the gate counts people.
    pub fn person(&self) -> Person {
        Person::new(Identity::from_stored(&self.approver), self.groups.clone())
    }
}

/// A call's requirement and the votes recorded on it so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    pub requirement: Requirement,
    pub votes: Vec<Vote>,
}

/// What a new vote does to a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tally {
    /// The same approver voted the same way before: nothing changes.
    Repeated,
    /// Recorded; the call still waits for more votes.
    Recorded,
    /// This vote decides the call; the approvers who decided it, in the order they voted.
    Decides(Verdict, Vec<String>),
}

impl Approval {
    /// Votes stored as JSON text (`None`: none yet).
    pub fn votes_from_stored(text: Option<&str>) -> Result<Vec<Vote>> {
        let Some(text) = text else {
            return Ok(Vec::new());
        };
        let unreadable = || Error::Internal("stored votes are unreadable".into());
        let list: Vec<Value> = serde_json::from_str(text).map_err(|_| unreadable())?;
        list.iter()
            .map(|v| {
                let text = |key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
                Ok(Vote {
                    approver: text("approver").ok_or_else(unreadable)?,
                    groups: match v.get("groups") {
                        Some(Value::Array(groups)) => Some(
                            groups
                                .iter()
                                .filter_map(|g| g.as_str().map(str::to_owned))
                                .collect(),
                        ),
                        Some(Value::Null) => None,
                        _ => return Err(unreadable()),
                    },
                    approve: v
                        .get("approve")
                        .and_then(Value::as_bool)
                        .ok_or_else(unreadable)?,
                    reason: text("reason").unwrap_or_default(),
                    at: v.get("at").and_then(Value::as_i64).unwrap_or(0),
                    remember: text("remember"),
                    passkey: v.get("passkey").and_then(SignedApproval::from_json),
                })
            })
            .collect()
    }

    pub fn votes_to_stored(&self) -> String {
        Value::Array(
            self.votes
                .iter()
                .map(|v| {
                    let mut stored = json!({
                        "approver": v.approver,
                        "groups": v.groups,
                        "approve": v.approve,
                        "reason": v.reason,
                        "at": v.at,
                        "remember": v.remember,
                    });
                    if let Some(passkey) = &v.passkey {
                        stored["passkey"] = passkey.to_json();
                    }
                    stored
                })
                .collect(),
        )
        .to_string()
    }

    /// The people who voted `verdict`, in the order they voted.
    pub fn voters(&self, verdict: Verdict) -> Vec<Person> {
        self.votes
            .iter()
            .filter(|v| v.verdict() == verdict)
            .map(Vote::person)
            .collect()
    }

    /// How many of the votes approve, counted as the gate counts them: distinct people, and
    /// with `distinct_groups` at most one per group.
    pub fn approvals(&self) -> u32 {
        counted(
            &self.requirement.approvers,
            Verdict::Approve,
            &self.voters(Verdict::Approve),
        )
    }

    pub fn denials(&self) -> u32 {
        self.votes.iter().filter(|v| !v.approve).count() as u32
    }

    /// "1 of 2 approvals", for people.
    pub fn progress(&self) -> String {
        format!(
            "{} of {} approvals",
            self.approvals(),
            self.requirement.approvers.quorum
        )
    }

    /// Adds `vote` and says what it does. An approver votes once: the same vote again is
    /// [`Tally::Repeated`]; the other verdict after a recorded vote is refused
    /// (FAILED_PRECONDITION naming the vote that stands).
    pub fn tally(&mut self, vote: Vote) -> Result<Tally> {
        let person = vote.person();
        if let Some(earlier) = self.votes.iter().find(|v| person.identity.is(&v.approver)) {
            if earlier.approve == vote.approve {
                return Ok(Tally::Repeated);
            }
            return Err(Error::FailedPrecondition(format!(
                "`{}` already voted to {} this call ({}); a vote cannot be changed",
                vote.approver,
                if earlier.approve { "approve" } else { "deny" },
                self.progress()
            )));
        }
        let verdict = vote.verdict();
        self.votes.push(vote);
        // The one count (the gate's): admission was asked before the vote was taken.
        if !quorum_met(&self.requirement.approvers, verdict, &self.voters(verdict)) {
            return Ok(Tally::Recorded);
        }
        let by = self
            .votes
            .iter()
            .filter(|v| v.verdict() == verdict)
            .map(|v| v.approver.clone())
            .collect();
        Ok(Tally::Decides(verdict, by))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval(groups: &[&str], quorum: u32, distinct: bool, denials: u32) -> Approval {
        Approval {
            requirement: Requirement::default_of(&Approvers {
                groups: groups.iter().map(|g| g.to_string()).collect(),
                quorum,
                distinct_groups: distinct,
                denials_to_deny: denials,
                step_up: None,
            }),
            votes: Vec::new(),
        }
    }

    fn vote(who: &str, groups: &[&str], verdict: Verdict) -> Vote {
        Vote {
            approver: who.to_owned(),
            groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            approve: verdict == Verdict::Approve,
            reason: String::new(),
            at: 1,
            remember: None,
            passkey: None,
        }
    }

    #[test]
    fn the_quorum_th_distinct_approval_decides_and_names_every_approver() {
        let mut a = approval(&[], 2, false, 1);
        assert_eq!(
            a.tally(vote("alice", &[], Verdict::Approve)).unwrap(),
            Tally::Recorded
        );
        assert_eq!(a.progress(), "1 of 2 approvals");
        assert_eq!(
            a.tally(vote("alice", &[], Verdict::Approve)).unwrap(),
            Tally::Repeated,
            "the same approver twice counts once"
        );
        assert_eq!(
            a.tally(vote("bob", &[], Verdict::Approve)).unwrap(),
            Tally::Decides(Verdict::Approve, vec!["alice".into(), "bob".into()])
        );
    }

    #[test]
    fn one_denial_denies_unless_more_are_asked_for_and_a_vote_cannot_flip() {
        let mut a = approval(&[], 2, false, 1);
        a.tally(vote("alice", &[], Verdict::Approve)).unwrap();
        assert_eq!(
            a.tally(vote("bob", &[], Verdict::Deny)).unwrap(),
            Tally::Decides(Verdict::Deny, vec!["bob".into()])
        );
        let err = a.tally(vote("alice", &[], Verdict::Deny)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);

        let mut two = approval(&[], 3, false, 2);
        assert_eq!(
            two.tally(vote("a", &[], Verdict::Deny)).unwrap(),
            Tally::Recorded
        );
        assert_eq!(
            two.tally(vote("b", &[], Verdict::Deny)).unwrap(),
            Tally::Decides(Verdict::Deny, vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn distinct_groups_count_at_most_one_approval_per_group() {
        let mut a = approval(&["ops", "sec"], 2, true, 1);
        a.tally(vote("alice", &["ops"], Verdict::Approve)).unwrap();
        assert_eq!(
            a.tally(vote("carol", &["ops"], Verdict::Approve)).unwrap(),
            Tally::Recorded,
            "two from ops are one group"
        );
        assert_eq!(a.approvals(), 1);
        // Dave is in both groups: alice holds ops, so he counts for sec.
        assert!(matches!(
            a.tally(vote("dave", &["ops", "sec"], Verdict::Approve))
                .unwrap(),
            Tally::Decides(Verdict::Approve, _)
        ));
        // The matching is the largest: a both-groups approver first does not block ops-only.
        let mut b = approval(&["ops", "sec"], 2, true, 1);
        b.tally(vote("dave", &["ops", "sec"], Verdict::Approve))
            .unwrap();
        assert!(matches!(
            b.tally(vote("alice", &["ops"], Verdict::Approve)).unwrap(),
            Tally::Decides(Verdict::Approve, _)
        ));
    }

    #[test]
    fn membership_is_any_listed_group_and_no_groups_admit_everyone() {
        let a = approval(&["ops", "sec"], 1, false, 1).requirement.approvers;
        assert!(a.admits(&["sec".into()]));
        assert!(!a.admits(&["dev".into()]));
        assert!(!a.admits(&[]));
        assert!(Approvers::default().admits(&[]));
    }

    #[test]
    fn requirements_parse_from_json_naming_the_key_at_fault() {
        let ok = Approvers::from_json(
            "approvers",
            &serde_json::json!({"groups": ["ops", "sec"], "quorum": 2, "distinct_groups": true}),
        )
        .unwrap();
        assert_eq!(ok.quorum, 2);
        assert_eq!(ok.denials_to_deny, 1);
        let err = |v: Value| {
            Approvers::from_json("approvers", &v)
                .unwrap_err()
                .to_string()
        };
        assert!(err(serde_json::json!({"quorum": 0})).starts_with("approvers.quorum"));
        assert!(err(serde_json::json!({"qorum": 2})).starts_with("approvers.qorum: unknown"));
        assert!(err(serde_json::json!({"groups": ["a b"]})).starts_with("approvers.groups[0]"));
        assert!(err(serde_json::json!({"groups": ["a", "a"]})).contains("listed twice"));
        assert!(err(serde_json::json!({"step_up": "totp"})).starts_with("approvers.step_up"));
        let signed =
            Approvers::from_json("approvers", &serde_json::json!({"step_up": "passkey"})).unwrap();
        assert_eq!(signed.step_up, Some(StepUp::Passkey));
        assert_eq!(signed.to_json()["step_up"], "passkey");
        assert!(Approvers::default().to_json().get("step_up").is_none());
        assert!(
            err(serde_json::json!({"groups": ["a"], "quorum": 2, "distinct_groups": true}))
                .starts_with("approvers.distinct_groups")
        );
    }

    #[test]
    fn a_requirement_round_trips_through_its_stored_form() {
        let r = Requirement::of_rule(
            &RuleId::parse("id", "two-person").unwrap(),
            &Approvers {
                groups: vec!["ops".into()],
                quorum: 2,
                distinct_groups: false,
                denials_to_deny: 1,
                step_up: Some(StepUp::Passkey),
            },
        );
        assert!(r.needs_passkey());
        assert!(r.approvers.to_string().contains("signed with a passkey"));
        assert_eq!(Requirement::from_stored(&r.to_stored()).unwrap(), r);
        let mut a = Approval {
            requirement: r,
            votes: Vec::new(),
        };
        a.tally(vote("alice", &["ops"], Verdict::Approve)).unwrap();
        let stored = a.votes_to_stored();
        assert_eq!(Approval::votes_from_stored(Some(&stored)).unwrap(), a.votes);
    }
}
