//! Rows to domain values, for every backend: both schemas use the same column names and types
//! (BIGINT integers, TEXT, a boolean), so one decoder serves SQLite and Postgres rows alike.

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::writes::Stored;
use crate::domain::policy::{
    Effect, Glob, Grant, GrantScope, GrantSpec, Matcher, Rule, RuleEffect, RuleId, RuleSource,
    Scope,
};
use crate::domain::{
    AgentId, BatchId, Call, CallId, CallKey, DecidedBy, Event, EventKind, Outcome, SessionId,
    Status, Timestamp, ToolInput, ToolName,
};
use crate::error::{Error, Result};

/// The columns [`call_from_row`] reads, from `calls c` joined with its batch `b` and its
/// Resolved event `r`.
macro_rules! call_columns {
    () => {
        "c.id, c.agent, c.session_id, c.call_id, c.batch_id, c.position, b.size, c.tool, \
         c.input, c.title, c.message, c.workspace, c.supersede_key, c.deadline, c.created_at, \
         c.status, c.decided_at, c.decided_by, c.reason, c.tool_result, c.run_input, \
         c.input_edited, r.seq AS resolved_seq"
    };
}

/// `SELECT` of every call column, followed by the given clauses.
macro_rules! select_calls {
    ($($rest:literal)*) => {
        concat!(
            "SELECT ", call_columns!(),
            " FROM calls c JOIN batches b ON b.batch_id = c.batch_id ",
            "LEFT JOIN events r ON r.call_rowid = c.id AND r.kind = 2 ",
            $($rest),*
        )
    };
}

pub(crate) use {call_columns, select_calls};

/// A call from a row holding the [`call_columns`].
pub fn call_from_row<'r, R>(row: &'r R) -> Result<Call>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
{
    let status_code: i64 = row.try_get("status")?;
    let status = Status::from_code(status_code)
        .ok_or_else(|| Error::Internal(format!("unknown stored status {status_code}")))?;
    let text = |name: &'r str| -> Result<String> {
        Ok(row.try_get::<Option<String>, _>(name)?.unwrap_or_default())
    };
    let outcome = match status {
        Status::Pending => None,
        Status::Decided(kind) => Some(Outcome {
            kind,
            decided_at: Timestamp::from_micros(
                row.try_get::<Option<i64>, _>("decided_at")?.unwrap_or(0),
            ),
            decided_by: DecidedBy::parse_stored(&text("decided_by")?),
            reason: text("reason")?,
            tool_result: text("tool_result")?,
            run_input: row
                .try_get::<Option<String>, _>("run_input")?
                .map(ToolInput::from_stored),
            input_edited: row.try_get("input_edited")?,
            seq: row
                .try_get::<Option<i64>, _>("resolved_seq")?
                .map(|seq| seq as u64),
        }),
    };
    Ok(Call {
        key: CallKey {
            agent: AgentId::from_stored(row.try_get("agent")?),
            session: SessionId::from_stored(row.try_get("session_id")?),
            call_id: CallId::from_stored(row.try_get("call_id")?),
        },
        batch_id: BatchId::from_stored(row.try_get("batch_id")?),
        position: row.try_get::<i64, _>("position")? as u32,
        batch_size: row.try_get::<i64, _>("size")? as u32,
        tool: ToolName::from_stored(row.try_get("tool")?),
        input: ToolInput::from_stored(row.try_get("input")?),
        title: row.try_get("title")?,
        message: row.try_get("message")?,
        workspace: row.try_get("workspace")?,
        supersede_key: row.try_get("supersede_key")?,
        deadline: row
            .try_get::<Option<i64>, _>("deadline")?
            .map(Timestamp::from_micros),
        created_at: Timestamp::from_micros(row.try_get("created_at")?),
        outcome,
    })
}

/// A call and its row id, from a row holding the [`call_columns`].
pub fn stored<'r, R>(row: &'r R) -> Result<Stored>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(Stored {
        rowid: row.try_get("id")?,
        call: call_from_row(row)?,
    })
}

/// An event from a row holding `seq`, `kind`, `batch_completed` and the [`call_columns`].
pub fn event_from_row<'r, R>(row: &'r R) -> Result<Event>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
{
    let kind = EventKind::from_code(row.try_get("kind")?);
    let mut call = call_from_row(row)?;
    if kind == EventKind::Requested {
        // The call as the event left it: not yet decided.
        call.outcome = None;
    }
    Ok(Event {
        seq: row.try_get::<i64, _>("seq")? as u64,
        kind,
        call,
        batch_completed: row.try_get("batch_completed")?,
    })
}

/// `SELECT` of every grant column ([`grant_from_row`] reads them), followed by the given clauses.
macro_rules! select_grants {
    ($($rest:literal)*) => {
        concat!(
            "SELECT id, agent, scope, session_id, workspace, tool, matcher, effect, created_by, \
             created_at, expires_at, revoked_at, revoked_by, source_session, source_call, reason \
             FROM grants ",
            $($rest),*
        )
    };
}

/// `SELECT` of every rule column ([`rule_from_row`] reads them), followed by the given clauses.
macro_rules! select_rules {
    ($($rest:literal)*) => {
        concat!(
            "SELECT id, tool, matcher, effect, priority, description, source, created_at \
             FROM rules ",
            $($rest),*
        )
    };
}

pub(crate) use {select_grants, select_rules};

/// A matcher stored by this broker; it was validated on the way in.
fn stored_matcher(text: &str) -> Result<Matcher> {
    let value = serde_json::from_str(text)
        .map_err(|e| Error::Internal(format!("a stored matcher is not JSON: {e}")))?;
    Matcher::from_json("matcher", &value, usize::MAX)
        .map_err(|e| Error::Internal(format!("a stored matcher is invalid: {e}")))
}

/// A grant from a row holding the columns [`select_grants`] selects.
pub fn grant_from_row<'r, R>(row: &'r R) -> Result<Grant>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
{
    let agent = AgentId::from_stored(row.try_get("agent")?);
    let scope_code: i64 = row.try_get("scope")?;
    let scope = match Scope::from_code(scope_code) {
        Some(Scope::Session) => GrantScope::Session(SessionId::from_stored(
            row.try_get::<Option<String>, _>("session_id")?
                .unwrap_or_default(),
        )),
        Some(Scope::Workspace) => GrantScope::Workspace(
            row.try_get::<Option<String>, _>("workspace")?
                .unwrap_or_default(),
        ),
        Some(Scope::Always) => GrantScope::Always,
        _ => {
            return Err(Error::Internal(format!(
                "unknown stored scope {scope_code}"
            )));
        }
    };
    let effect_code: i64 = row.try_get("effect")?;
    let effect = Effect::from_code(effect_code)
        .ok_or_else(|| Error::Internal(format!("unknown stored effect {effect_code}")))?;
    let time = |name: &'r str| -> Result<Option<Timestamp>> {
        Ok(row
            .try_get::<Option<i64>, _>(name)?
            .map(Timestamp::from_micros))
    };
    Ok(Grant {
        id: row.try_get("id")?,
        spec: GrantSpec {
            source: CallKey {
                agent: agent.clone(),
                session: SessionId::from_stored(row.try_get("source_session")?),
                call_id: CallId::from_stored(row.try_get("source_call")?),
            },
            agent,
            scope,
            tool: ToolName::from_stored(row.try_get("tool")?),
            matcher: stored_matcher(&row.try_get::<String, _>("matcher")?)?,
            effect,
            created_by: row.try_get("created_by")?,
            created_at: Timestamp::from_micros(row.try_get("created_at")?),
            expires_at: time("expires_at")?,
            reason: row.try_get("reason")?,
        },
        revoked_at: time("revoked_at")?,
        revoked_by: row.try_get("revoked_by")?,
    })
}

/// A rule from a row holding the columns [`select_rules`] selects.
pub fn rule_from_row<'r, R>(row: &'r R) -> Result<Rule>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
{
    let effect_code: i64 = row.try_get("effect")?;
    let tool: String = row.try_get("tool")?;
    Ok(Rule {
        id: RuleId::from_stored(row.try_get("id")?),
        tool: Glob::parse("tool", &tool)
            .map_err(|e| Error::Internal(format!("a stored tool glob is invalid: {e}")))?,
        matcher: stored_matcher(&row.try_get::<String, _>("matcher")?)?,
        effect: RuleEffect::from_code(effect_code)
            .ok_or_else(|| Error::Internal(format!("unknown stored rule effect {effect_code}")))?,
        priority: row.try_get::<i64, _>("priority")? as i32,
        description: row.try_get("description")?,
        source: RuleSource::from_stored(&row.try_get::<String, _>("source")?),
        created_at: Timestamp::from_micros(row.try_get("created_at")?),
    })
}
