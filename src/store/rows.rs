//! Rows to domain values, for every backend: both schemas use the same column names and types
//! (BIGINT integers, TEXT, a boolean), so one decoder serves SQLite and Postgres rows alike.

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::writes::Stored;
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
