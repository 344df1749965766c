//! The one function that decides whether a call needs a human: [`evaluate`]. Submit, grant
//! creation and Explain all call it, so what Explain says is what happens.
//!
//! Precedence, first match wins:
//! 1. **deny rules**, whatever their priority (highest priority, then smallest id, is named);
//! 2. the **allow and ask rules**, highest priority first; at equal priority ask before allow,
//!    then by id. An allow rule decides; an ask rule sends the call to a human and stops here, so
//!    an ask rule beats every grant (and every allow rule of lower priority);
//! 3. **grants** that are live (not revoked, not expired) and cover the call: deny grants
//!    before allow grants, then the narrower scope (session, workspace, always), then the older;
//! 4. nothing matched: a human decides.
//!
//! Only rules in mode `enforce` take part. Shadow rules and replayed candidate rules are judged by
//! the same precedence through [`evaluate_as_enforced`], so "what this rule would have done" is
//! answered by the very function that decides.

use std::cmp::Reverse;

use super::{Effect, Grant, GrantScope, Rule, RuleEffect, RuleMode, Subject};
use crate::domain::{DecidedBy, Outcome, OutcomeKind, Timestamp, ToolInput, ToolResultTexts};

/// What decides a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ruling<'p> {
    /// A rule or a grant decides, at once.
    Decided { effect: Effect, by: Decider<'p> },
    /// A human decides; `rule` is the ask rule that requires it, if one does.
    AskHuman { rule: Option<&'p Rule> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decider<'p> {
    Rule(&'p Rule),
    Grant(&'p Grant),
}

/// Which of `rules` (those enforced) and `grants` decides `subject` at `now`, or that a human
/// must.
pub fn evaluate<'p>(
    subject: &Subject<'_>,
    rules: &'p [Rule],
    grants: &'p [Grant],
    now: Timestamp,
) -> Ruling<'p> {
    evaluate_gated(subject, rules, grants, now, |_| true)
}

/// [`evaluate`], with only the grants `admits` lets decide this call taking part: what submit,
/// a new grant's pass over pending calls and Explain ask, with the call's
/// [`Gate`](super::Gate) as `admits`, so a grant decides only what its authors could have.
pub fn evaluate_gated<'p>(
    subject: &Subject<'_>,
    rules: &'p [Rule],
    grants: &'p [Grant],
    now: Timestamp,
    admits: impl Fn(&Grant) -> bool,
) -> Ruling<'p> {
    let enforced = rules.iter().filter(|rule| rule.mode == RuleMode::Enforce);
    judge(subject, enforced, grants, now, admits)
}

/// [`evaluate`] with every one of `rules` enforced, whatever its mode: what a shadow rule or a
/// candidate rule would do if it were enforced beside them.
pub(super) fn evaluate_as_enforced<'p>(
    subject: &Subject<'_>,
    rules: impl Iterator<Item = &'p Rule>,
    grants: &'p [Grant],
    now: Timestamp,
) -> Ruling<'p> {
    judge(subject, rules, grants, now, |_| true)
}

/// The precedence itself, over the grants `admits`.
fn judge<'p>(
    subject: &Subject<'_>,
    rules: impl Iterator<Item = &'p Rule>,
    grants: &'p [Grant],
    now: Timestamp,
    admits: impl Fn(&Grant) -> bool,
) -> Ruling<'p> {
    let first_rule = rules
        .filter(|rule| rule.covers(subject))
        .min_by_key(|rule| rule_precedence(rule));
    if let Some(rule) = first_rule {
        return match rule.effect {
            RuleEffect::Deny => Ruling::Decided {
                effect: Effect::Deny,
                by: Decider::Rule(rule),
            },
            RuleEffect::Allow => Ruling::Decided {
                effect: Effect::Allow,
                by: Decider::Rule(rule),
            },
            RuleEffect::Ask => Ruling::AskHuman { rule: Some(rule) },
        };
    }
    let first_grant = grants
        .iter()
        .filter(|grant| grant.is_live(now) && grant.covers(subject) && admits(grant))
        .min_by_key(|grant| grant.precedence());
    match first_grant {
        Some(grant) => Ruling::Decided {
            effect: grant.spec.effect,
            by: Decider::Grant(grant),
        },
        None => Ruling::AskHuman { rule: None },
    }
}

/// Sorts `rules` into the order [`evaluate`] tries them in.
pub fn sort_by_precedence(rules: &mut [Rule]) {
    rules.sort_by(|a, b| rule_precedence(a).cmp(&rule_precedence(b)));
}

/// Deny rules first; then by priority (highest first), ask before allow, id.
pub fn rule_precedence(rule: &Rule) -> (u8, Reverse<i32>, u8, &str) {
    let (class, effect) = match rule.effect {
        RuleEffect::Deny => (0, 0),
        RuleEffect::Ask => (1, 0),
        RuleEffect::Allow => (1, 1),
    };
    (class, Reverse(rule.priority), effect, rule.id.as_str())
}

impl Decider<'_> {
    /// What outcomes it decides record.
    pub fn decided_by(&self) -> DecidedBy {
        match self {
            Decider::Rule(rule) => DecidedBy::Policy(rule.id.as_str().to_owned()),
            Decider::Grant(grant) => DecidedBy::Grant(grant.id),
        }
    }

    /// The reason outcomes it decides carry: the rule's description, the grant's reason.
    fn reason(&self) -> &str {
        match self {
            Decider::Rule(rule) => &rule.description,
            Decider::Grant(grant) => &grant.spec.reason,
        }
    }
}

impl<'p> Ruling<'p> {
    /// The rule this ruling names: the one that decides, or the ask rule that requires a human.
    pub fn rule(&self) -> Option<&'p Rule> {
        match *self {
            Ruling::Decided {
                by: Decider::Rule(rule),
                ..
            } => Some(rule),
            Ruling::AskHuman { rule } => rule,
            Ruling::Decided { .. } => None,
        }
    }

    /// The outcome a call with `input` gets, if this ruling decides it.
    pub fn outcome(
        &self,
        input: &ToolInput,
        texts: &ToolResultTexts,
        now: Timestamp,
    ) -> Option<Outcome> {
        let Ruling::Decided { effect, by } = self else {
            return None;
        };
        let reason = by.reason();
        Some(match effect {
            Effect::Allow => Outcome {
                kind: OutcomeKind::Approved,
                decided_at: now,
                decided_by: by.decided_by(),
                reason: reason.to_owned(),
                tool_result: String::new(),
                run_input: Some(input.clone()),
                input_edited: false,
                seq: None,
                receipt: None,
            },
            Effect::Deny => {
                let mut outcome = texts.outcome(OutcomeKind::Denied, by.decided_by(), reason, now);
                if let Decider::Rule(_) = by {
                    outcome.tool_result =
                        ToolResultTexts::with_reason(&texts.denied_by_policy, reason);
                }
                outcome
            }
        })
    }

    /// Why, in a sentence for operators.
    pub fn explain(&self) -> String {
        match self {
            Ruling::Decided {
                by: Decider::Rule(rule),
                ..
            } => match rule.effect {
                RuleEffect::Deny => format!(
                    "deny rule `{}` (priority {}) matches ({} {}); deny rules come first",
                    rule.id,
                    rule.priority,
                    rule.matcher,
                    rule.names()
                ),
                _ => format!(
                    "allow rule `{}` (priority {}) matches ({} {}); no deny rule, and no \
                     ask rule of higher or equal priority, does: the operator's rule decides, \
                     not a person (no requirement's approvers are asked)",
                    rule.id,
                    rule.priority,
                    rule.matcher,
                    rule.names()
                ),
            },
            Ruling::Decided {
                effect,
                by: Decider::Grant(grant),
            } => {
                let spec = &grant.spec;
                let scope = match &spec.scope {
                    GrantScope::Session(s) => format!("for session `{s}`"),
                    GrantScope::Workspace(w) => format!("for workspace `{w}`"),
                    GrantScope::Always => "always".to_owned(),
                };
                let effect = match effect {
                    Effect::Allow => "allow",
                    Effect::Deny => "deny",
                };
                let authors = spec
                    .authors
                    .iter()
                    .map(|a| a.identity.as_str())
                    .collect::<Vec<_>>()
                    .join(", ");
                format!(
                    "{effect} grant {} ({scope}, agent `{}`, {}, {}; made by {authors}) \
                     matches, and its authors could decide the call themselves; no rule decides",
                    grant.id,
                    spec.agent,
                    spec.names(),
                    spec.matcher
                )
            }
            Ruling::AskHuman { rule: Some(rule) } => format!(
                "ask rule `{}` (priority {}) matches ({} {}): a human decides, whatever \
                 the grants say",
                rule.id,
                rule.priority,
                rule.matcher,
                rule.names()
            ),
            Ruling::AskHuman { rule: None } => {
                "no rule and no live grant matches: a human decides".to_owned()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Glob, GrantSpec, Matcher, RuleId, RuleSource};
    use super::*;
    use crate::domain::{AgentId, CallId, CallKey, SessionId, ToolName};

    fn rule(id: &str, tool: &str, effect: RuleEffect, priority: i32) -> Rule {
        Rule {
            kind: None,
            approvers: None,
            id: RuleId::parse("id", id).unwrap(),
            tool: Glob::parse("tool", tool).unwrap(),
            matcher: Matcher::Any,
            effect,
            priority,
            description: String::new(),
            source: RuleSource::Admin,
            created_at: Timestamp::from_micros(0),
            mode: RuleMode::Enforce,
            escalation: Default::default(),
        }
    }

    fn grant(id: i64, scope: GrantScope, effect: Effect) -> Grant {
        Grant {
            id,
            spec: GrantSpec {
                kind: None,
                agent: AgentId::default_owner(),
                scope,
                tool: ToolName::parse("tool", "shell").unwrap(),
                matcher: Matcher::Any,
                effect,
                created_by: "approver:alice".into(),
                authors: Vec::new(),
                created_at: Timestamp::from_micros(0),
                expires_at: None,
                source: CallKey {
                    agent: AgentId::default_owner(),
                    session: SessionId::parse("s", "s1").unwrap(),
                    call_id: CallId::parse("c", "c0").unwrap(),
                },
                reason: String::new(),
            },
            revoked_at: None,
            revoked_by: None,
        }
    }

    struct Call {
        agent: AgentId,
        session: SessionId,
        workspace: String,
        tool: ToolName,
        input: ToolInput,
    }

    fn call(session: &str, workspace: &str) -> Call {
        Call {
            agent: AgentId::default_owner(),
            session: SessionId::parse("s", session).unwrap(),
            workspace: workspace.into(),
            tool: ToolName::parse("tool", "shell").unwrap(),
            input: ToolInput::parse("i", r#"{"command":"ls"}"#, 1024).unwrap(),
        }
    }

    fn decider(rules: &[Rule], grants: &[Grant], c: &Call) -> Option<DecidedBy> {
        let subject = Subject::new(&c.agent, &c.session, &c.workspace, &c.tool, &c.input);
        match evaluate(&subject, rules, grants, Timestamp::from_micros(1_000)) {
            Ruling::Decided { by, .. } => Some(by.decided_by()),
            Ruling::AskHuman { .. } => None,
        }
    }

    fn policy(id: &str) -> Option<DecidedBy> {
        Some(DecidedBy::Policy(id.into()))
    }

    #[test]
    fn deny_rules_beat_allow_rules_of_any_priority_and_rules_beat_grants() {
        let c = call("s1", "");
        let grants = [grant(1, GrantScope::Always, Effect::Allow)];
        let rules = [
            rule("allow-high", "shell", RuleEffect::Allow, 100),
            rule("deny-low", "sh*", RuleEffect::Deny, -5),
        ];
        assert_eq!(decider(&rules, &grants, &c), policy("deny-low"));
        assert_eq!(decider(&rules[..1], &grants, &c), policy("allow-high"));
        assert_eq!(decider(&[], &grants, &c), Some(DecidedBy::Grant(1)));
        assert_eq!(decider(&[], &[], &c), None);
    }

    #[test]
    fn an_ask_rule_beats_grants_and_lower_allow_rules_but_not_deny_rules() {
        let c = call("s1", "");
        let grants = [grant(1, GrantScope::Always, Effect::Allow)];
        let ask = rule("ask", "shell", RuleEffect::Ask, 5);
        assert_eq!(decider(std::slice::from_ref(&ask), &grants, &c), None);
        let lower = rule("allow-lower", "*", RuleEffect::Allow, 4);
        assert_eq!(decider(&[ask.clone(), lower], &grants, &c), None);
        let equal = rule("allow-equal", "*", RuleEffect::Allow, 5);
        assert_eq!(
            decider(&[ask.clone(), equal], &grants, &c),
            None,
            "ask wins ties"
        );
        let higher = rule("allow-higher", "*", RuleEffect::Allow, 6);
        assert_eq!(
            decider(&[ask.clone(), higher], &grants, &c),
            policy("allow-higher")
        );
        let deny = rule("deny", "*", RuleEffect::Deny, -100);
        assert_eq!(decider(&[ask, deny], &grants, &c), policy("deny"));
    }

    #[test]
    fn among_rules_of_one_kind_the_highest_priority_then_the_smallest_id_is_named() {
        let c = call("s1", "");
        let rules = [
            rule("b", "shell", RuleEffect::Deny, 1),
            rule("a", "shell", RuleEffect::Deny, 1),
            rule("c", "shell", RuleEffect::Deny, 0),
        ];
        assert_eq!(decider(&rules, &[], &c), policy("a"));
    }

    #[test]
    fn deny_grants_beat_allow_grants_then_narrower_scopes_then_older_grants() {
        let c = call("s1", "w1");
        let allow_session = grant(1, GrantScope::Session(c.session.clone()), Effect::Allow);
        let deny_always = grant(2, GrantScope::Always, Effect::Deny);
        let allow_workspace = grant(3, GrantScope::Workspace("w1".into()), Effect::Allow);
        let all = [allow_session.clone(), deny_always, allow_workspace.clone()];
        assert_eq!(decider(&[], &all, &c), Some(DecidedBy::Grant(2)));
        let allows = [allow_workspace.clone(), allow_session.clone()];
        assert_eq!(decider(&[], &allows, &c), Some(DecidedBy::Grant(1)));
        let older = grant(0, GrantScope::Workspace("w1".into()), Effect::Allow);
        assert_eq!(
            decider(&[], &[allow_workspace, older], &c),
            Some(DecidedBy::Grant(0))
        );
    }

    #[test]
    fn grants_cover_only_their_scope_agent_and_tool() {
        let session = grant(
            1,
            GrantScope::Session(SessionId::parse("s", "s1").unwrap()),
            Effect::Allow,
        );
        let workspace = grant(2, GrantScope::Workspace("w1".into()), Effect::Allow);
        assert_eq!(
            decider(&[], std::slice::from_ref(&session), &call("s2", "w1")),
            None
        );
        assert_eq!(
            decider(&[], std::slice::from_ref(&workspace), &call("s2", "w2")),
            None
        );
        assert_eq!(
            decider(&[], std::slice::from_ref(&workspace), &call("s2", "")),
            None
        );
        assert_eq!(
            decider(&[], std::slice::from_ref(&workspace), &call("s2", "w1")),
            Some(DecidedBy::Grant(2))
        );
        let mut other_agent = grant(3, GrantScope::Always, Effect::Allow);
        other_agent.spec.agent = AgentId::parse("a", "someone-else").unwrap();
        assert_eq!(decider(&[], &[other_agent], &call("s1", "")), None);
        let mut other_tool = grant(4, GrantScope::Always, Effect::Allow);
        other_tool.spec.tool = ToolName::parse("t", "shell2").unwrap();
        assert_eq!(decider(&[], &[other_tool], &call("s1", "")), None);
    }

    #[test]
    fn expired_and_revoked_grants_never_match() {
        let c = call("s1", "");
        let mut expired = grant(1, GrantScope::Always, Effect::Allow);
        expired.spec.expires_at = Some(Timestamp::from_micros(1_000));
        assert_eq!(
            decider(&[], &[expired.clone()], &c),
            None,
            "expiry is exclusive"
        );
        expired.spec.expires_at = Some(Timestamp::from_micros(1_001));
        assert_eq!(decider(&[], &[expired], &c), Some(DecidedBy::Grant(1)));
        let mut revoked = grant(2, GrantScope::Always, Effect::Deny);
        revoked.revoked_at = Some(Timestamp::from_micros(5));
        assert_eq!(decider(&[], &[revoked], &c), None);
    }

    #[test]
    fn a_policy_denial_tells_the_model_a_rule_refused_it() {
        let texts = ToolResultTexts::default();
        let mut deny = rule("no-rm", "shell", RuleEffect::Deny, 0);
        deny.description = "rm is not allowed here".into();
        let input = ToolInput::parse("i", "{}", 64).unwrap();
        let ruling = Ruling::Decided {
            effect: Effect::Deny,
            by: Decider::Rule(&deny),
        };
        let outcome = ruling
            .outcome(&input, &texts, Timestamp::from_micros(1))
            .unwrap();
        assert_eq!(outcome.decided_by.to_string(), "policy:no-rm");
        assert_eq!(
            outcome.tool_result,
            "A policy rule denied this tool call. Reason: rm is not allowed here"
        );
        let g = grant(9, GrantScope::Always, Effect::Allow);
        let ruling = Ruling::Decided {
            effect: Effect::Allow,
            by: Decider::Grant(&g),
        };
        let outcome = ruling
            .outcome(&input, &texts, Timestamp::from_micros(1))
            .unwrap();
        assert_eq!(outcome.decided_by.to_string(), "grant:9");
        assert_eq!(outcome.run_input.as_ref(), Some(&input));
        assert!(
            Ruling::AskHuman { rule: None }
                .outcome(&input, &texts, Timestamp::from_micros(1))
                .is_none()
        );
    }
}
