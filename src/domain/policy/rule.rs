//! Policy rules: what operators decide ahead of time for every agent. A rule names tools by a
//! glob, optionally narrows the input with a matcher, and allows, denies or asks (forces a
//! human). Rules come from the policy file (loaded at start) and from AdminService.
//!
//! The policy file is JSON: `{"rules": [{"id": "...", "tool": "...", "kind": "shell", "effect":
//! "allow" | "deny" | "ask", "priority": 0, "match": {...}, "description": "...", "mode":
//! "enforce" | "shadow" | "disabled"}]}`; only `id`, `tool` (or `kind`: an action kind, whichever
//! host's tool asks, see `domain::action`) and `effect` are required (no `match` means any
//! input, no `mode` means `enforce`). An ask rule may also carry an `"escalation"` ladder (see
//! `domain::escalation`). Unknown keys are refused, so a typo
//! never silently widens a rule.

use std::collections::HashSet;
use std::fmt;

use serde_json::Value;

use super::{Approvers, Glob, Matcher, RuleMode, Subject};
use crate::domain::escalation::Ladder;
use crate::domain::{Kind, Timestamp};
use crate::error::{Error, Result};

/// At most this many bytes in a rule id and a rule's description.
pub const MAX_RULE_ID_BYTES: usize = 128;
pub const MAX_DESCRIPTION_BYTES: usize = 1024;

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleEffect {
    Allow,
    Deny,
    /// A human decides, whatever the grants say (see [`super::evaluate`]).
    Ask,
}

impl RuleEffect {
    /// The stored code; the same numbers as the protobuf `Effect`.
    pub fn code(self) -> i64 {
        match self {
            RuleEffect::Allow => 1,
            RuleEffect::Deny => 2,
            RuleEffect::Ask => 3,
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(RuleEffect::Allow),
            2 => Some(RuleEffect::Deny),
            3 => Some(RuleEffect::Ask),
            _ => None,
        }
    }

    fn parse(field: &str, text: &str) -> Result<Self> {
        match text {
            "allow" => Ok(RuleEffect::Allow),
            "deny" => Ok(RuleEffect::Deny),
            "ask" => Ok(RuleEffect::Ask),
            other => Err(Error::invalid(
                field,
                format!("must be `allow`, `deny` or `ask`, got `{other}`"),
            )),
        }
    }
}

impl fmt::Display for RuleEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuleEffect::Allow => "allow",
            RuleEffect::Deny => "deny",
            RuleEffect::Ask => "ask",
        })
    }
}

/// A rule's id, chosen by the operator: 1 to 128 of `A-Z a-z 0-9 . _ -`. Outcomes a rule
/// decides record `policy:<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(String);

impl RuleId {
    pub fn parse(field: &str, value: &str) -> Result<Self> {
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if value.is_empty() || value.len() > MAX_RULE_ID_BYTES || !value.chars().all(valid) {
            return Err(Error::invalid(
                field,
                format!(
                    "must be 1 to {MAX_RULE_ID_BYTES} of A-Z a-z 0-9 . _ - (got `{}`)",
                    value.escape_debug()
                ),
            ));
        }
        Ok(Self(value.to_owned()))
    }

    pub fn from_stored(value: String) -> Self {
        Self(value)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a rule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleSource {
    /// The policy file: replaced at every start that loads a file.
    File,
    /// AdminService `CreateRule`.
    Admin,
}

impl RuleSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleSource::File => "file",
            RuleSource::Admin => "admin",
        }
    }

    pub fn from_stored(s: &str) -> Self {
        if s == "file" {
            RuleSource::File
        } else {
            RuleSource::Admin
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub id: RuleId,
    /// The tools it applies to (`*` when the rule names a kind and no tool).
    pub tool: Glob,
    /// The action kind it applies to, whichever host's tool asks (see `domain::action`); its
    /// matcher then tests the action's fields. `None`: the tool's own input.
    pub kind: Option<Kind>,
    pub matcher: Matcher,
    pub effect: RuleEffect,
    /// Higher first (see [`super::evaluate`]).
    pub priority: i32,
    pub description: String,
    pub source: RuleSource,
    pub created_at: Timestamp,
    /// Whether it decides, is tried in shadow, or is set aside.
    pub mode: RuleMode,
    /// Ask rules only: the escalation ladder of the calls this rule sends to a human (empty:
    /// the default ladder, if one is set).
    pub escalation: Ladder,
    /// Ask rules only: who may decide the calls it sends to people, and how many must agree.
    /// `None`: anyone decides, alone (or the broker's default requirement).
    pub approvers: Option<Approvers>,
}

impl Rule {
    pub fn covers(&self, subject: &Subject<'_>) -> bool {
        self.tool.matches(subject.tool.as_str())
            && super::target_matches(self.kind, &self.matcher, subject)
    }

    /// What it applies to, for people: `for tool Bash`, or `for the shell action of any
    /// host's tool`.
    pub fn names(&self) -> String {
        match (self.kind, self.tool.as_str()) {
            (Some(kind), "*") => format!("for the {kind} action of any host's tool"),
            (Some(kind), tool) => format!("for the {kind} action of tool {tool}"),
            (None, tool) => format!("for tool {tool}"),
        }
    }

    /// Whether `other` says the same (ignoring where and when it was created).
    pub fn same_terms_as(&self, other: &Rule) -> bool {
        self.id == other.id
            && self.tool == other.tool
            && self.kind == other.kind
            && self.matcher == other.matcher
            && self.effect == other.effect
            && self.priority == other.priority
            && self.description == other.description
            && self.mode == other.mode
            && self.escalation == other.escalation
            && self.approvers == other.approvers
    }

    /// Refuses a ladder on a rule that does not ask (only a call left to a human can wait).
    pub fn check_escalation(self, field: &str) -> Result<Self> {
        if !self.escalation.is_empty() && self.effect != RuleEffect::Ask {
            return Err(Error::invalid(
                field,
                format!(
                    "only an ask rule may carry an escalation ladder (this one is {})",
                    self.effect
                ),
            ));
        }
        Ok(self)
    }

    /// One rule of the policy file. Errors name the key at fault (`effect`, `match.fields[0]`).
    pub fn from_json(value: &Value, max_input_bytes: usize, created_at: Timestamp) -> Result<Rule> {
        let object = value
            .as_object()
            .ok_or_else(|| Error::invalid("rule", "must be a JSON object"))?;
        const KEYS: [&str; 10] = [
            "id",
            "tool",
            "kind",
            "effect",
            "priority",
            "match",
            "description",
            "mode",
            "escalation",
            "approvers",
        ];
        if let Some(unknown) = object.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(Error::invalid(
                unknown,
                format!("unknown key (the keys are {})", KEYS.join(", ")),
            ));
        }
        let string = |key: &str| match object.get(key) {
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            None => Ok(None),
            Some(_) => Err(Error::invalid(key, "must be a string")),
        };
        let required = |key: &str| string(key)?.ok_or_else(|| Error::invalid(key, "is required"));
        let priority = match object.get("priority") {
            None => 0,
            Some(v) => v
                .as_i64()
                .and_then(|p| i32::try_from(p).ok())
                .ok_or_else(|| Error::invalid("priority", "must be a 32-bit integer"))?,
        };
        let matcher = match object.get("match") {
            None => Matcher::Any,
            Some(m) => Matcher::from_json("match", m, max_input_bytes)?,
        };
        let escalation = match object.get("escalation") {
            None => Ladder::default(),
            Some(steps) => Ladder::from_json("escalation", steps)?,
        };
        let effect = RuleEffect::parse("effect", required("effect")?)?;
        let approvers = object
            .get("approvers")
            .map(|a| Approvers::from_json("approvers", a))
            .transpose()?;
        let kind = string("kind")?
            .map(|k| Kind::parse("kind", k))
            .transpose()?;
        // A kind rule may leave out the tool: every host's tool for that kind.
        let tool = match (string("tool")?, kind) {
            (Some(tool), _) => tool,
            (None, Some(_)) => "*",
            (None, None) => return Err(Error::invalid("tool", "is required (or `kind`)")),
        };
        Rule {
            id: RuleId::parse("id", required("id")?)?,
            tool: Glob::parse("tool", tool)?,
            kind,
            matcher,
            approvers: approvers_of(effect, approvers)?,
            effect,
            priority,
            description: description("description", string("description")?.unwrap_or(""))?,
            source: RuleSource::File,
            created_at,
            mode: match string("mode")? {
                None => RuleMode::Enforce,
                Some(mode) => RuleMode::parse("mode", mode)?,
            },
            escalation,
        }
        .check_escalation("escalation")
    }
}

/// A rule's `approvers`, which only an ask rule may name: an allow or deny rule decides by
/// itself, so approvers there would be a rule that does not do what it says.
pub fn approvers_of(effect: RuleEffect, approvers: Option<Approvers>) -> Result<Option<Approvers>> {
    match (effect, approvers) {
        (RuleEffect::Ask, approvers) => Ok(approvers),
        (_, None) => Ok(None),
        (effect, Some(_)) => Err(Error::invalid(
            "approvers",
            format!("only an ask rule names who may decide (this rule's effect is {effect})"),
        )),
    }
}

/// A rule's description: optional text, bounded, one line.
pub fn description(field: &str, text: &str) -> Result<String> {
    if text.len() > MAX_DESCRIPTION_BYTES || text.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            format!("must be at most {MAX_DESCRIPTION_BYTES} bytes, without control characters"),
        ));
    }
    Ok(text.to_owned())
}

/// Parses a policy file: `{"rules": [...]}`. An error names the rule at fault by its index and,
/// when it has a readable one, its id.
pub fn parse_policy_file(text: &str, max_input_bytes: usize) -> Result<Vec<Rule>> {
    // Strict: a key named twice in a rule would leave the operator unsure which one holds.
    let value: Value = crate::domain::json::parse("policy file", text)?;
    let list = value
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("rules"))
        .and_then(Value::as_array)
        .ok_or_else(|| {
            Error::invalid(
                "policy file",
                "must be a JSON object with one key, `rules`, holding a list",
            )
        })?;
    let now = Timestamp::now();
    let mut seen = HashSet::new();
    let mut rules = Vec::with_capacity(list.len());
    for (i, value) in list.iter().enumerate() {
        let name = match value.get("id").and_then(Value::as_str) {
            Some(id) => format!("rules[{i}] (id `{}`)", id.escape_debug()),
            None => format!("rules[{i}]"),
        };
        let rule = Rule::from_json(value, max_input_bytes, now)
            .map_err(|e| Error::invalid(&name, e.to_string()))?;
        if !seen.insert(rule.id.clone()) {
            return Err(Error::invalid(name, "another rule has the same id"));
        }
        rules.push(rule);
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_file_parses_with_defaults_for_optional_keys() {
        let rules = parse_policy_file(
            r#"{"rules": [
                {"id": "no-force-push", "tool": "shell", "effect": "deny", "priority": 10,
                 "match": {"fields": [{"field": "command", "glob": "git push*--force*"}]},
                 "description": "never force-push"},
                {"id": "reads", "tool": "read_*", "effect": "allow"}
            ]}"#,
            4096,
        )
        .unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].effect, RuleEffect::Deny);
        assert_eq!(rules[0].priority, 10);
        assert_eq!(rules[1].matcher, Matcher::Any);
        assert_eq!(rules[1].priority, 0);
        assert_eq!(rules[1].source, RuleSource::File);
        assert_eq!(rules[1].approvers, None);
    }

    #[test]
    fn an_ask_rule_names_its_approvers() {
        let rules = parse_policy_file(
            r#"{"rules": [{"id": "prod", "tool": "deploy", "effect": "ask",
                "approvers": {"groups": ["ops", "sec"], "quorum": 2, "distinct_groups": true}}]}"#,
            4096,
        )
        .unwrap();
        let approvers = rules[0].approvers.as_ref().unwrap();
        assert_eq!(approvers.groups, ["ops", "sec"]);
        assert_eq!((approvers.quorum, approvers.distinct_groups), (2, true));
    }

    #[test]
    fn a_rules_mode_is_read_from_the_policy_file_and_defaults_to_enforce() {
        let rules = parse_policy_file(
            r#"{"rules": [
                {"id": "tried", "tool": "shell", "effect": "deny", "mode": "shadow"},
                {"id": "off", "tool": "shell", "effect": "allow", "mode": "disabled"},
                {"id": "on", "tool": "shell", "effect": "allow"}
            ]}"#,
            4096,
        )
        .unwrap();
        let modes: Vec<RuleMode> = rules.iter().map(|r| r.mode).collect();
        assert_eq!(
            modes,
            [RuleMode::Shadow, RuleMode::Disabled, RuleMode::Enforce]
        );
        let e = parse_policy_file(
            r#"{"rules": [{"id": "x", "tool": "b", "effect": "deny", "mode": "dry-run"}]}"#,
            4096,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("(id `x`): mode: must be `enforce`, `shadow` or"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_rule_is_refused_naming_it_and_the_key_at_fault() {
        let err = |text: &str| parse_policy_file(text, 4096).unwrap_err().to_string();
        let e = err(r#"{"rules": [{"id": "ok", "tool": "a", "effect": "allow"},
                                  {"id": "bad-one", "tool": "b", "effect": "maybe"}]}"#);
        assert!(
            e.starts_with("rules[1] (id `bad-one`): effect: must be"),
            "{e}"
        );
        let e = err(r#"{"rules": [{"id": "typo", "tool": "b", "effect": "deny", "priorty": 3}]}"#);
        assert!(e.contains("(id `typo`): priorty: unknown key"), "{e}");
        let e = err(r#"{"rules": [{"tool": "b", "effect": "deny"}]}"#);
        assert!(e.starts_with("rules[0]: id: is required"), "{e}");
        let e = err(r#"{"rules": [{"id": "a", "tool": "b", "effect": "deny"},
                                  {"id": "a", "tool": "c", "effect": "allow"}]}"#);
        assert!(
            e.contains("rules[1] (id `a`): another rule has the same id"),
            "{e}"
        );
        let e = err(r#"{"rules": [{"id": "m", "tool": "b", "effect": "deny",
                                  "match": {"fields": [{"field": "x", "glob": ""}]}}]}"#);
        assert!(e.contains("(id `m`): match.fields[0].glob"), "{e}");
        assert!(err("[]").contains("one key, `rules`"));
        assert!(err("{").contains("not valid JSON"));
        assert!(
            err(r#"{"rules": [{"id": "has space", "tool": "b", "effect": "deny"}]}"#)
                .contains("id: must be")
        );
        let e = err(r#"{"rules": [{"id": "d", "tool": "b", "effect": "deny",
                                  "approvers": {"quorum": 2}}]}"#);
        assert!(e.contains("(id `d`): approvers: only an ask rule"), "{e}");
        let e = err(r#"{"rules": [{"id": "q", "tool": "b", "effect": "ask",
                                  "approvers": {"quorum": 99}}]}"#);
        assert!(
            e.contains("(id `q`): approvers.quorum: must be 1 to 16"),
            "{e}"
        );
    }
}
