//! Protobuf requests become validated domain values here, and only here (public so the fuzz
//! tests can drive it directly). Every error names the
//! field at fault, with its path in the request (`batch.calls[2].input_json`).

use std::collections::HashSet;
use std::time::Duration;

use crate::domain::OutcomeKind;
use crate::domain::policy::{
    ExplainTarget, FieldCondition, FieldPath, FieldTest, Glob, Matcher, RevokeTarget, Rule,
    RuleEffect, RuleId, RuleSource, Scope,
};
use crate::domain::{
    AgentId, BatchId, CallId, CallKey, CallQuery, CancelScope, CancelTarget, Cursor,
    DecidedByFilter, GrantQuery, Identity, MAX_BATCH_CALLS, NewBatch, NewCall, OnDeny, SessionId,
    Status, Timestamp, ToolInput, ToolName, refuse_invisible,
};
use crate::error::{Error, Result};
use crate::proto::v1 as pb;

const MAX_LOOKUP_IDS: usize = 1024;
const MAX_TITLE_BYTES: usize = 512;
const MAX_MESSAGE_BYTES: usize = 16 * 1024;
const MAX_WORKSPACE_BYTES: usize = 1024;
pub(super) const MAX_REASON_BYTES: usize = 4 * 1024;
const DEFAULT_PAGE_SIZE: u32 = 100;
const MAX_PAGE_SIZE: u32 = 1000;
/// The longest a grant may be given to live before it expires.
const MAX_GRANT_LIFETIME: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

/// A submit, split into what is wrong with single calls and what can be stored.
pub struct ParsedBatch {
    pub batch: NewBatch,
    /// Calls refused by validation, with their index in the request.
    pub refused: Vec<(u32, String, Error)>,
}

/// Parses a batch found at `field` of the request (`batch` in Submit, `submit` on Connect).
/// Batch-level problems (session, size, duplicate ids) refuse the whole batch; a bad call is
/// refused alone and the others go on.
pub fn batch(
    field: &str,
    spec: Option<pb::BatchSpec>,
    max_input_bytes: usize,
) -> Result<ParsedBatch> {
    let spec = spec.ok_or_else(|| Error::invalid(field, "is required"))?;
    let session = SessionId::parse(&format!("{field}.session_id"), spec.session_id)?;
    if spec.calls.is_empty() || spec.calls.len() > MAX_BATCH_CALLS {
        return Err(Error::invalid(
            format!("{field}.calls"),
            format!(
                "must hold 1 to {MAX_BATCH_CALLS} calls, got {}",
                spec.calls.len()
            ),
        ));
    }
    let on_deny = match pb::OnDeny::try_from(spec.on_deny) {
        Ok(pb::OnDeny::Unspecified | pb::OnDeny::SkipRest) => OnDeny::SkipRest,
        Ok(pb::OnDeny::Independent) => OnDeny::Independent,
        Err(_) => {
            return Err(Error::invalid(
                format!("{field}.on_deny"),
                format!("unknown value {}", spec.on_deny),
            ));
        }
    };
    let mut seen = HashSet::new();
    for (i, call) in spec.calls.iter().enumerate() {
        if !seen.insert(call.call_id.as_str()) {
            return Err(Error::invalid(
                format!("{field}.calls[{i}].call_id"),
                format!("`{}` appears twice in the batch", call.call_id),
            ));
        }
    }
    let mut calls = Vec::with_capacity(spec.calls.len());
    let mut refused = Vec::new();
    for (i, call) in spec.calls.into_iter().enumerate() {
        let call_id = call.call_id.clone();
        match new_call(field, i as u32, call, max_input_bytes) {
            Ok(call) => calls.push(call),
            Err(err) => refused.push((i as u32, call_id, err)),
        }
    }
    Ok(ParsedBatch {
        batch: NewBatch {
            agent: AgentId::default_owner(),
            session,
            on_deny,
            supersede_pending: spec.supersede_pending,
            calls,
            pending_cap: None,
            default_escalation: None,
            default_approvers: None,
        },
        refused,
    })
}

fn new_call(
    batch: &str,
    index: u32,
    spec: pb::CallSpec,
    max_input_bytes: usize,
) -> Result<NewCall> {
    let field = |name: &str| format!("{batch}.calls[{index}].{name}");
    let deadline = spec
        .deadline
        .map(|t| timestamp(&field("deadline"), t))
        .transpose()?;
    // The cap holds for retries too: time only brings a stored deadline closer.
    if let Some(deadline) = deadline
        && deadline > Timestamp::now().saturating_add(crate::domain::MAX_DEADLINE_AHEAD)
    {
        return Err(Error::invalid(
            field("deadline"),
            "is more than 366 days ahead, the most a deadline may be",
        ));
    }
    // A deadline in the past refuses a new call only: the store checks it once it knows the
    // call is not stored already (a retry gets the stored call, whatever the clock says).
    Ok(NewCall {
        index,
        path: format!("{batch}.calls[{index}]"),
        call_id: CallId::parse(&field("call_id"), spec.call_id)?,
        tool: ToolName::parse(&field("tool"), spec.tool)?,
        input: ToolInput::parse(&field("input_json"), &spec.input_json, max_input_bytes)?,
        title: line(&field("title"), spec.title, MAX_TITLE_BYTES)?,
        message: text(&field("message"), spec.message, MAX_MESSAGE_BYTES)?,
        workspace: name(&field("workspace"), spec.workspace, MAX_WORKSPACE_BYTES)?,
        supersede_key: optional_name(&field("supersede_key"), spec.supersede_key, 256)?,
        deadline,
        requested_by: requested_by(&field("requested_by"), spec.requested_by)?,
        host: crate::domain::Host::parse(&field("host"), &spec.host)?,
        prejudged: Default::default(),
    })
}

/// The person a call acts for, in the one canonical form identities are compared in (see
/// [`Identity`]); empty: nobody named.
fn requested_by(field: &str, value: String) -> Result<String> {
    if value.is_empty() {
        return Ok(value);
    }
    Ok(Identity::parse(field, &value)?.into_string())
}

/// Optional one-line text: no control characters.
pub(super) fn line(field: &str, value: String, max: usize) -> Result<String> {
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    text(field, value, max)
}

/// Optional one-line text that names something (a workspace, a supersede key): as [`line`], and
/// no character that hides itself (see `domain::invisible`), so two names that look the same
/// are the same.
fn name(field: &str, value: String, max: usize) -> Result<String> {
    let value = line(field, value, max)?;
    refuse_invisible(field, &value)?;
    Ok(value)
}

fn optional_name(field: &str, value: String, max: usize) -> Result<Option<String>> {
    let value = name(field, value, max)?;
    Ok((!value.is_empty()).then_some(value))
}

/// Optional free text: bounded, no NUL.
pub(super) fn text(field: &str, value: String, max: usize) -> Result<String> {
    if value.len() > max {
        return Err(Error::invalid(
            field,
            format!("must be at most {max} bytes, got {}", value.len()),
        ));
    }
    if value.contains('\0') {
        return Err(Error::invalid(field, "must not contain NUL characters"));
    }
    Ok(value)
}

/// A protobuf Timestamp, refused outside the range the protobuf spec defines (years 1 to 9999):
/// stored, such an instant could not be printed by clients' JSON libraries.
fn timestamp(field: &str, t: prost_types::Timestamp) -> Result<Timestamp> {
    if !(0..1_000_000_000).contains(&t.nanos) {
        return Err(Error::invalid(field, "nanos must be in 0..1e9"));
    }
    if !crate::domain::PROTO_TIMESTAMP_SECONDS.contains(&t.seconds) {
        return Err(Error::invalid(
            field,
            "is outside the protobuf Timestamp range (0001-01-01 to 9999-12-31)",
        ));
    }
    let micros = t
        .seconds
        .checked_mul(1_000_000)
        .and_then(|s| s.checked_add(i64::from(t.nanos / 1000)))
        .ok_or_else(|| Error::invalid(field, "is out of range"))?;
    Ok(Timestamp::from_micros(micros))
}

/// Parses the call ids of a lookup (1 to 1024, each a valid id). `allow_empty` for "all calls".
pub fn call_ids(field: &str, ids: Vec<String>, allow_empty: bool) -> Result<Vec<CallId>> {
    if (ids.is_empty() && !allow_empty) || ids.len() > MAX_LOOKUP_IDS {
        return Err(Error::invalid(
            field,
            format!(
                "must name 1 to {MAX_LOOKUP_IDS} call ids, got {}",
                ids.len()
            ),
        ));
    }
    ids.into_iter()
        .enumerate()
        .map(|(i, id)| CallId::parse(&format!("{field}[{i}]"), id))
        .collect()
}

pub fn session(field: &str, value: String) -> Result<SessionId> {
    SessionId::parse(field, value)
}

pub fn cancel(target: Option<pb::CancelTarget>, field: &str) -> Result<CancelTarget> {
    let target = target.ok_or_else(|| Error::invalid(field, "is required"))?;
    let session = SessionId::parse(&format!("{field}.session_id"), target.session_id)?;
    let scope = match target.target {
        Some(pb::cancel_target::Target::Calls(ids)) => {
            let mut ids = call_ids(&format!("{field}.calls.call_ids"), ids.call_ids, false)?;
            // A call named twice is cancelled (or reported) once.
            let mut seen = HashSet::new();
            ids.retain(|id| seen.insert(id.clone()));
            CancelScope::Calls(ids)
        }
        Some(pb::cancel_target::Target::BatchId(id)) => {
            CancelScope::Batch(BatchId::parse(&format!("{field}.batch_id"), id)?)
        }
        Some(pb::cancel_target::Target::WholeSession(true)) => CancelScope::Session,
        Some(pb::cancel_target::Target::WholeSession(false)) | None => {
            return Err(Error::invalid(
                format!("{field}.target"),
                "one of calls, batch_id or whole_session=true is required",
            ));
        }
    };
    Ok(CancelTarget {
        agent: AgentId::default_owner(),
        session,
        scope,
        reason: text(&format!("{field}.reason"), target.reason, MAX_REASON_BYTES)?,
    })
}

/// A scope; UNSPECIFIED is ONCE.
pub(super) fn scope(field: &str, value: i32) -> Result<Scope> {
    match pb::Scope::try_from(value) {
        Ok(pb::Scope::Unspecified | pb::Scope::Once) => Ok(Scope::Once),
        Ok(pb::Scope::Session) => Ok(Scope::Session),
        Ok(pb::Scope::Workspace) => Ok(Scope::Workspace),
        Ok(pb::Scope::Always) => Ok(Scope::Always),
        Err(_) => Err(Error::invalid(field, format!("unknown value {value}"))),
    }
}

/// A grant's lifetime: positive, and at most a century.
pub(super) fn grant_lifetime(field: &str, d: prost_types::Duration) -> Result<Duration> {
    if d.seconds < 0 || d.nanos < 0 || (d.seconds == 0 && d.nanos == 0) {
        return Err(Error::invalid(
            field,
            "must be positive (a grant that expired at creation would decide nothing)",
        ));
    }
    if d.nanos >= 1_000_000_000 {
        return Err(Error::invalid(field, "nanos must be in 0..1e9"));
    }
    let lifetime = Duration::new(d.seconds as u64, d.nanos as u32);
    if lifetime > MAX_GRANT_LIFETIME {
        return Err(Error::invalid(field, "must be at most 100 years"));
    }
    Ok(lifetime)
}

/// An input matcher. Absent (or `exact_json` empty, where `own_input` allows it) is `None`: the
/// caller's default (Decide: exactly the decided call's input).
pub fn matcher(
    field: &str,
    m: Option<pb::InputMatcher>,
    max_input_bytes: usize,
    own_input: bool,
) -> Result<Option<Matcher>> {
    use pb::input_matcher::Kind;
    match m.and_then(|m| m.kind) {
        None => Ok(None),
        Some(Kind::Any(_)) => Ok(Some(Matcher::Any)),
        Some(Kind::ExactJson(text)) if text.is_empty() && own_input => Ok(None),
        Some(Kind::ExactJson(text)) => Ok(Some(Matcher::Exact(ToolInput::parse(
            &format!("{field}.exact_json"),
            &text,
            max_input_bytes,
        )?))),
        Some(Kind::Fields(fields)) => {
            let at = format!("{field}.fields.conditions");
            let conditions = fields
                .conditions
                .into_iter()
                .enumerate()
                .map(|(i, c)| condition(&format!("{at}[{i}]"), c))
                .collect::<Result<Vec<_>>>()?;
            Ok(Some(Matcher::fields(&at, conditions)?))
        }
    }
}

fn condition(field: &str, c: pb::FieldCondition) -> Result<FieldCondition> {
    use pb::field_condition::Test;
    let at = |name: &str| format!("{field}.{name}");
    let path = FieldPath::parse(&at("field"), &c.field)?;
    let test = match c.test {
        Some(Test::Equals(value)) => {
            FieldTest::equals(&at("equals"), &serde_json::Value::String(value))?
        }
        Some(Test::EqualsJson(text)) => {
            let value = crate::domain::json::parse(&at("equals_json"), &text)?;
            FieldTest::equals(&at("equals_json"), &value)?
        }
        Some(Test::Prefix(prefix)) => FieldTest::prefix(&at("prefix"), &prefix)?,
        Some(Test::Glob(glob)) => FieldTest::glob(&at("glob"), &glob)?,
        Some(Test::CommandPrefix(words)) => {
            FieldTest::command_prefix(&at("command_prefix"), &words)?
        }
        Some(Test::PathUnder(dir)) => FieldTest::path_under(&at("path_under"), &dir)?,
        Some(Test::UrlHost(host)) => FieldTest::url_host(&at("url_host"), &host)?,
        None => {
            return Err(Error::invalid(
                field,
                "one of equals, equals_json, prefix, glob, command_prefix, path_under or \
                 url_host is required",
            ));
        }
    };
    Ok(FieldCondition::new(path, test))
}

/// A rule for CreateRule, found at `field`.
pub fn rule(field: &str, rule: Option<pb::Rule>, max_input_bytes: usize) -> Result<Rule> {
    let rule = rule.ok_or_else(|| Error::invalid(field, "is required"))?;
    let at = |name: &str| format!("{field}.{name}");
    let effect = match pb::Effect::try_from(rule.effect) {
        Ok(pb::Effect::Allow) => RuleEffect::Allow,
        Ok(pb::Effect::Deny) => RuleEffect::Deny,
        Ok(pb::Effect::Ask) => RuleEffect::Ask,
        _ => {
            return Err(Error::invalid(
                at("effect"),
                "must be EFFECT_ALLOW, EFFECT_DENY or EFFECT_ASK",
            ));
        }
    };
    let approvers = rule
        .approvers
        .map(|a| approvers(&at("approvers"), a))
        .transpose()?;
    let approvers = crate::domain::policy::approvers_of(effect, approvers)
        .map_err(|e| Error::invalid(at("approvers"), e.to_string()))?;
    let kind = match rule.kind.as_str() {
        "" => None,
        kind => Some(crate::domain::Kind::parse(&at("kind"), kind)?),
    };
    // A rule naming a kind may leave out the tool: every host's tool for that kind.
    let tool = match (rule.tool.as_str(), kind) {
        ("", Some(_)) => "*",
        (tool, _) => tool,
    };
    Rule {
        approvers,
        id: RuleId::parse(&at("id"), &rule.id)?,
        tool: Glob::parse(&at("tool"), tool)?,
        kind,
        matcher: matcher(&at("matcher"), rule.matcher, max_input_bytes, false)?
            .unwrap_or(Matcher::Any),
        effect,
        priority: rule.priority,
        description: crate::domain::policy::description(&at("description"), &rule.description)?,
        source: RuleSource::Admin,
        created_at: Timestamp::now(),
        mode: super::shadow_messages::rule_mode(&at("mode"), rule.mode)?,
        escalation: super::escalation_messages::ladder(&at("escalation"), rule.escalation)?,
    }
    .check_escalation(&at("escalation"))
}

/// A rule's `approvers` (0 counts mean 1).
fn approvers(field: &str, a: pb::Approvers) -> Result<crate::domain::policy::Approvers> {
    crate::domain::policy::Approvers {
        groups: a.groups,
        quorum: a.quorum.max(1),
        distinct_groups: a.distinct_groups,
        denials_to_deny: a.denials_to_deny.max(1),
        step_up: match pb::StepUp::try_from(a.step_up) {
            Ok(pb::StepUp::Unspecified) => None,
            Ok(pb::StepUp::Passkey) => Some(crate::domain::policy::StepUp::Passkey),
            Err(_) => {
                return Err(Error::invalid(
                    format!("{field}.step_up"),
                    format!("unknown value {}", a.step_up),
                ));
            }
        },
    }
    .validated(field)
}

pub fn rule_id(field: &str, id: &str) -> Result<RuleId> {
    RuleId::parse(field, id)
}

/// ListCalls' `decided_by`: exact, or a prefix when it ends with `:`.
pub fn decided_by(field: &str, value: String) -> Result<Option<DecidedByFilter>> {
    if value.is_empty() {
        return Ok(None);
    }
    let value = line(field, value, 512)?;
    Ok(Some(if value.ends_with(':') {
        DecidedByFilter::Prefix(value)
    } else {
        DecidedByFilter::Exact(value)
    }))
}

pub fn list_grants(req: pb::ListGrantsRequest) -> Result<GrantQuery> {
    let scope = match pb::Scope::try_from(req.scope) {
        Ok(pb::Scope::Unspecified) => None,
        Ok(pb::Scope::Once) => {
            return Err(Error::invalid(
                "scope",
                "no grant is ONCE; use SESSION, WORKSPACE, ALWAYS or leave it out",
            ));
        }
        _ => Some(scope("scope", req.scope)?),
    };
    let (limit, after) = paging(req.page_size, &req.page_token)?;
    Ok(GrantQuery {
        agent: non_empty(req.agent, |v| AgentId::parse("agent", v))?,
        scope,
        session: non_empty(req.session_id, |v| SessionId::parse("session_id", v))?,
        workspace: non_empty(req.workspace, |v| name("workspace", v, MAX_WORKSPACE_BYTES))?,
        tool: non_empty(req.tool, |v| ToolName::parse("tool", v))?,
        include_inactive: req.include_inactive,
        now: None,
        after,
        limit,
    })
}

pub fn revoke_target(req: pb::RevokeGrantRequest) -> Result<RevokeTarget> {
    use pb::revoke_grant_request::Target;
    let agent = || AgentId::parse_or_default("agent", req.agent.clone());
    match req.target {
        Some(Target::Id(id)) => Ok(RevokeTarget::Id(
            i64::try_from(id).map_err(|_| Error::invalid("id", "is out of range"))?,
        )),
        Some(Target::SessionId(session)) => Ok(RevokeTarget::Session(
            agent()?,
            SessionId::parse("session_id", session)?,
        )),
        Some(Target::Workspace(workspace)) if !workspace.is_empty() => Ok(RevokeTarget::Workspace(
            agent()?,
            name("workspace", workspace, MAX_WORKSPACE_BYTES)?,
        )),
        Some(Target::Workspace(_)) => Err(Error::invalid("workspace", "must not be empty")),
        None => Err(Error::invalid(
            "target",
            "one of id, session_id or workspace is required",
        )),
    }
}

pub fn explain(req: pb::ExplainRequest, max_input_bytes: usize) -> Result<ExplainTarget> {
    use pb::explain_request::Call;
    match req.call {
        Some(Call::Stored(c)) => Ok(ExplainTarget::Stored(CallKey {
            agent: AgentId::parse_or_default("stored.agent", c.agent)?,
            session: SessionId::parse("stored.session_id", c.session_id)?,
            call_id: CallId::parse("stored.call_id", c.call_id)?,
        })),
        Some(Call::Inline(c)) => Ok(ExplainTarget::Inline {
            agent: AgentId::parse_or_default("inline.agent", c.agent)?,
            session: SessionId::parse("inline.session_id", c.session_id)?,
            workspace: name("inline.workspace", c.workspace, MAX_WORKSPACE_BYTES)?,
            tool: ToolName::parse("inline.tool", c.tool)?,
            input: ToolInput::parse("inline.input_json", &c.input_json, max_input_bytes)?,
            host: crate::domain::Host::parse("inline.host", &c.host)?,
        }),
        None => Err(Error::invalid(
            "call",
            "one of stored or inline is required",
        )),
    }
}

/// A filter's fields: empty matches everything; non-empty must be a valid value. `prefix` is
/// where they sit in the request (`filter.` in Subscribe, nothing in ListCalls).
pub fn filter(prefix: &str, filter: Option<pb::CallFilter>) -> Result<CallQuery> {
    let f = filter.unwrap_or_default();
    let field = |name: &str| format!("{prefix}{name}");
    Ok(CallQuery {
        agent: non_empty(f.agent, |v| AgentId::parse(&field("agent"), v))?,
        session: non_empty(f.session_id, |v| {
            SessionId::parse(&field("session_id"), v).map(|s| s.as_str().to_owned())
        })?,
        workspace: non_empty(f.workspace, |v| {
            name(&field("workspace"), v, MAX_WORKSPACE_BYTES)
        })?,
        tool: non_empty(f.tool, |v| {
            ToolName::parse(&field("tool"), v).map(|t| t.as_str().to_owned())
        })?,
        ..CallQuery::default()
    })
}

fn non_empty<T>(value: String, parse: impl FnOnce(String) -> Result<T>) -> Result<Option<T>> {
    if value.is_empty() {
        Ok(None)
    } else {
        parse(value).map(Some)
    }
}

/// Page size and token, into `query`.
pub fn page(query: &mut CallQuery, page_size: u32, page_token: &str) -> Result<()> {
    (query.limit, query.after) = paging(page_size, page_token)?;
    Ok(())
}

/// ExportReceipts' `page_size`: 0 is the default page.
pub fn receipts_page_size(page_size: u32) -> Result<u32> {
    Ok(paging(page_size, "")?.0)
}

/// A page's size and where it starts, from a request's `page_size` and `page_token`.
fn paging(page_size: u32, page_token: &str) -> Result<(u32, Option<Cursor>)> {
    let limit = match page_size {
        0 => DEFAULT_PAGE_SIZE,
        n if n > MAX_PAGE_SIZE => {
            return Err(Error::invalid(
                "page_size",
                format!("must be at most {MAX_PAGE_SIZE}, got {n}"),
            ));
        }
        n => n,
    };
    if page_token.is_empty() {
        return Ok((limit, None));
    }
    let id = page_token
        .strip_prefix("v1.")
        .and_then(|rest| rest.parse::<i64>().ok())
        .filter(|id| *id >= 0)
        .ok_or_else(|| Error::invalid("page_token", "is not a token this broker issued"))?;
    Ok((limit, Some(Cursor(id))))
}

/// The token for the page after `cursor`.
pub fn page_token(cursor: Option<Cursor>) -> String {
    cursor
        .map(|Cursor(id)| format!("v1.{id}"))
        .unwrap_or_default()
}

pub fn statuses(field: &str, values: Vec<i32>) -> Result<Vec<Status>> {
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| match pb::CallStatus::try_from(v) {
            Ok(pb::CallStatus::Pending) => Ok(Status::Pending),
            Ok(s) if s != pb::CallStatus::Unspecified => OutcomeKind::from_code(v.into())
                .map(Status::Decided)
                .ok_or_else(|| Error::invalid(format!("{field}[{i}]"), "unknown status")),
            _ => Err(Error::invalid(
                format!("{field}[{i}]"),
                format!("unknown status {v}"),
            )),
        })
        .collect()
}

pub fn time_bound(field: &str, t: Option<prost_types::Timestamp>) -> Result<Option<Timestamp>> {
    t.map(|t| timestamp(field, t)).transpose()
}

pub fn call_key(agent: String, session_id: String, call_id: String) -> Result<CallKey> {
    Ok(CallKey {
        agent: AgentId::parse_or_default("agent", agent)?,
        session: SessionId::parse("session_id", session_id)?,
        call_id: CallId::parse("call_id", call_id)?,
    })
}
