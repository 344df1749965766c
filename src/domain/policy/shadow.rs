//! Rules in shadow: what each shadow rule would have done to a call, had it been enforced beside
//! the enforced rules and the grants. Judged by the one decision function
//! ([`evaluate_as_enforced`]), so a shadow verdict is exactly what enforcing the rule would do.
//!
//! A shadow rule is recorded for a call when, enforced, it would be the rule that rules the call
//! (decides it, or, for an ask rule, sends it to a human): a shadow rule that a deny rule, a
//! higher-priority rule, or its own miss would leave out says nothing about the call.

use std::fmt;
use std::iter;

use super::evaluate::evaluate_as_enforced;
use super::{Effect, Grant, Rule, RuleId, RuleMode, Ruling, Subject};
use crate::domain::Timestamp;

/// What a rule would do with a call: approve it, deny it, or leave it to a human.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleVerdict {
    Approve,
    Deny,
    /// No rule decides (or an ask rule rules): a human decides.
    AskHuman,
}

impl RuleVerdict {
    /// What `ruling` does with the call.
    pub fn of(ruling: &Ruling<'_>) -> Self {
        match ruling {
            Ruling::Decided {
                effect: Effect::Allow,
                ..
            } => RuleVerdict::Approve,
            Ruling::Decided {
                effect: Effect::Deny,
                ..
            } => RuleVerdict::Deny,
            Ruling::AskHuman { .. } => RuleVerdict::AskHuman,
        }
    }

    /// The stored code: the protobuf `CallStatus` the call would get (APPROVED 2, DENIED 3,
    /// PENDING 1 for a human), as Explain's verdict is.
    pub fn code(self) -> i64 {
        match self {
            RuleVerdict::AskHuman => 1,
            RuleVerdict::Approve => 2,
            RuleVerdict::Deny => 3,
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(RuleVerdict::AskHuman),
            2 => Some(RuleVerdict::Approve),
            3 => Some(RuleVerdict::Deny),
            _ => None,
        }
    }
}

impl fmt::Display for RuleVerdict {
    /// The metric label: `approve`, `deny`, `ask`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuleVerdict::Approve => "approve",
            RuleVerdict::Deny => "deny",
            RuleVerdict::AskHuman => "ask",
        })
    }
}

/// "Would have approved by rule X": one shadow rule's verdict on one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowVerdict {
    pub rule: RuleId,
    pub verdict: RuleVerdict,
    /// Why, in a sentence for operators (the ruling's explanation); empty when read back from
    /// the store, which keeps only the verdict.
    pub reason: String,
}

/// The verdicts of the shadow rules among `rules` that would rule `subject` at `now` if each
/// alone were enforced beside the enforced rules and `grants`, in rule id order.
pub fn shadow_verdicts(
    subject: &Subject<'_>,
    rules: &[Rule],
    grants: &[Grant],
    now: Timestamp,
) -> Vec<ShadowVerdict> {
    let enforced = || rules.iter().filter(|rule| rule.mode == RuleMode::Enforce);
    let mut verdicts: Vec<ShadowVerdict> = rules
        .iter()
        .filter(|rule| rule.mode == RuleMode::Shadow && rule.covers(subject))
        .filter_map(|shadow| {
            let ruling =
                evaluate_as_enforced(subject, enforced().chain(iter::once(shadow)), grants, now);
            let rules_it = ruling.rule().is_some_and(|r| std::ptr::eq(r, shadow));
            rules_it.then(|| ShadowVerdict {
                rule: shadow.id.clone(),
                verdict: RuleVerdict::of(&ruling),
                reason: ruling.explain(),
            })
        })
        .collect();
    verdicts.sort_by(|a, b| a.rule.cmp(&b.rule));
    verdicts
}

/// What `candidate` alone would do with `subject`, judged as it would be if it were the only
/// rule and no grant existed (what a replay of history asks).
pub fn candidate_verdict(candidate: &Rule, subject: &Subject<'_>, now: Timestamp) -> RuleVerdict {
    RuleVerdict::of(&evaluate_as_enforced(
        subject,
        iter::once(candidate),
        &[],
        now,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::{Glob, Matcher, RuleEffect, RuleSource, evaluate};
    use super::*;
    use crate::domain::{AgentId, SessionId, ToolInput, ToolName};

    fn rule(id: &str, effect: RuleEffect, priority: i32, mode: RuleMode) -> Rule {
        Rule {
            kind: None,
            id: RuleId::parse("id", id).unwrap(),
            tool: Glob::parse("tool", "shell").unwrap(),
            matcher: Matcher::Any,
            effect,
            priority,
            description: String::new(),
            source: RuleSource::Admin,
            created_at: Timestamp::from_micros(0),
            mode,
            escalation: Default::default(),
            approvers: None,
        }
    }

    fn verdicts(rules: &[Rule]) -> (Option<String>, Vec<(String, RuleVerdict)>) {
        let agent = AgentId::default_owner();
        let session = SessionId::parse("s", "s1").unwrap();
        let tool = ToolName::parse("tool", "shell").unwrap();
        let input = ToolInput::parse("i", "{}", 64).unwrap();
        let subject = Subject::new(&agent, &session, "", &tool, &input);
        let now = Timestamp::from_micros(1);
        let decided = evaluate(&subject, rules, &[], now)
            .rule()
            .map(|r| r.id.to_string());
        let shadow = shadow_verdicts(&subject, rules, &[], now)
            .into_iter()
            .map(|v| (v.rule.to_string(), v.verdict))
            .collect();
        (decided, shadow)
    }

    #[test]
    fn shadow_and_disabled_rules_never_decide() {
        let rules = [
            rule("shadow-deny", RuleEffect::Deny, 0, RuleMode::Shadow),
            rule("off-allow", RuleEffect::Allow, 0, RuleMode::Disabled),
        ];
        let (decided, shadow) = verdicts(&rules);
        assert_eq!(decided, None, "a human decides");
        assert_eq!(shadow, [("shadow-deny".to_owned(), RuleVerdict::Deny)]);
    }

    #[test]
    fn a_shadow_rule_is_recorded_only_where_enforcing_it_would_rule_the_call() {
        let rules = [
            rule("allow-high", RuleEffect::Allow, 10, RuleMode::Enforce),
            // Outranked by the enforced allow rule: says nothing about the call.
            rule("allow-low", RuleEffect::Allow, 1, RuleMode::Shadow),
            // Deny rules come first: it would decide.
            rule("deny-any", RuleEffect::Deny, -5, RuleMode::Shadow),
            // Higher priority ask: it would send the call to a human.
            rule("ask-higher", RuleEffect::Ask, 20, RuleMode::Shadow),
        ];
        let (decided, shadow) = verdicts(&rules);
        assert_eq!(decided.as_deref(), Some("allow-high"));
        assert_eq!(
            shadow,
            [
                ("ask-higher".to_owned(), RuleVerdict::AskHuman),
                ("deny-any".to_owned(), RuleVerdict::Deny),
            ]
        );
    }

    #[test]
    fn verdict_codes_are_the_call_statuses_they_would_give() {
        for verdict in [
            RuleVerdict::Approve,
            RuleVerdict::Deny,
            RuleVerdict::AskHuman,
        ] {
            assert_eq!(RuleVerdict::from_code(verdict.code()), Some(verdict));
        }
        assert_eq!(RuleVerdict::Approve.code(), 2);
        assert_eq!(RuleVerdict::AskHuman.to_string(), "ask");
    }
}
