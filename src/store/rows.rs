//! Rows to domain values, for every backend: both schemas use the same column names and types
//! (BIGINT integers, TEXT, a boolean), so one decoder serves SQLite and Postgres rows alike,
//! whether sqlx read them or (the SQLite writer) rusqlite did. [`Columns`] is all a decoder needs
//! of a row.

use sqlx::Row;

/// What the decoders read of a row: typed values by column name.
pub trait Columns {
    fn int(&self, name: &str) -> Result<i64>;
    fn opt_int(&self, name: &str) -> Result<Option<i64>>;
    fn text(&self, name: &str) -> Result<String>;
    fn opt_text(&self, name: &str) -> Result<Option<String>>;
    fn flag(&self, name: &str) -> Result<bool>;
}

/// The rows sqlx reads (the readers of both backends, and Postgres's writers).
macro_rules! sqlx_columns {
    ($($row:ty),*) => {$(
        impl Columns for $row {
            fn int(&self, name: &str) -> Result<i64> {
                Ok(self.try_get(name)?)
            }
            fn opt_int(&self, name: &str) -> Result<Option<i64>> {
                Ok(self.try_get(name)?)
            }
            fn text(&self, name: &str) -> Result<String> {
                Ok(self.try_get(name)?)
            }
            fn opt_text(&self, name: &str) -> Result<Option<String>> {
                Ok(self.try_get(name)?)
            }
            fn flag(&self, name: &str) -> Result<bool> {
                Ok(self.try_get(name)?)
            }
        }
    )*};
}

sqlx_columns!(sqlx::sqlite::SqliteRow, sqlx::postgres::PgRow);

/// A row SQLite's writer read (rusqlite), found by name quickly. rusqlite finds a column by
/// name with a case-insensitive scan of the statement's column names on every lookup: decoding
/// a call (some 30 columns) compared names hundreds of times (profiled in
/// docs/benchmarks-notes.md). Decoders read the columns in the statement's order, so the column
/// after the last one read is tried first, and only a miss scans. Asking SQLite for even that
/// one name costs a call into it and a UTF-8 check per column, so the rows after a statement's
/// first are read with its names copied once ([`ColumnNames`]), since a commit's events are
/// dozens of rows of calls.
pub struct NamedRow<'a, 'stmt> {
    row: &'a rusqlite::Row<'stmt>,
    names: Option<&'a ColumnNames>,
    next: std::cell::Cell<usize>,
}

/// A statement's column names, copied from SQLite once for all the rows it returns.
pub struct ColumnNames(Vec<Box<str>>);

impl ColumnNames {
    pub fn of(row: &rusqlite::Row<'_>) -> Self {
        let statement: &rusqlite::Statement<'_> = row.as_ref();
        Self(
            statement
                .column_names()
                .into_iter()
                .map(Box::from)
                .collect(),
        )
    }
}

impl<'a, 'stmt> NamedRow<'a, 'stmt> {
    /// `row`, its columns found through `names` if given (else through SQLite).
    pub fn new(row: &'a rusqlite::Row<'stmt>, names: Option<&'a ColumnNames>) -> Self {
        Self {
            row,
            names,
            next: std::cell::Cell::new(0),
        }
    }

    fn index(&self, name: &str) -> Result<usize> {
        let guess = self.next.get();
        let index = match self.names {
            Some(ColumnNames(names)) => {
                if names.get(guess).is_some_and(|n| **n == *name) {
                    guess
                } else {
                    names
                        .iter()
                        .position(|n| n.eq_ignore_ascii_case(name))
                        .ok_or_else(|| rusqlite::Error::InvalidColumnName(name.into()))?
                }
            }
            None => {
                let statement: &rusqlite::Statement<'_> = self.row.as_ref();
                if statement.column_name(guess).is_ok_and(|n| n == name) {
                    guess
                } else {
                    statement.column_index(name)?
                }
            }
        };
        self.next.set(index + 1);
        Ok(index)
    }
}

impl Columns for NamedRow<'_, '_> {
    fn int(&self, name: &str) -> Result<i64> {
        Ok(self.row.get(self.index(name)?)?)
    }
    fn opt_int(&self, name: &str) -> Result<Option<i64>> {
        Ok(self.row.get(self.index(name)?)?)
    }
    fn text(&self, name: &str) -> Result<String> {
        Ok(self.row.get(self.index(name)?)?)
    }
    fn opt_text(&self, name: &str) -> Result<Option<String>> {
        Ok(self.row.get(self.index(name)?)?)
    }
    fn flag(&self, name: &str) -> Result<bool> {
        Ok(self.row.get(self.index(name)?)?)
    }
}

use std::sync::Arc;

use crate::domain::Cursor;
use crate::domain::escalation::{Escalation, Ladder};
use crate::domain::policy::{
    Approval, Approvers, Effect, Glob, Grant, GrantScope, GrantSpec, Matcher, Person, Requirement,
    Rule, RuleEffect, RuleId, RuleMode, RuleSource, RuleVerdict, Scope, ShadowVerdict,
};
use crate::domain::receipt::Sealed;
use crate::domain::{
    Action, AgentId, BatchId, Call, CallId, CallKey, DecidedBy, Event, EventKind, Host, Kind,
    Outcome, OutcomeKind, SessionId, Status, Timestamp, ToolInput, ToolName,
};
use crate::error::{Error, Result};
use crate::operations::Stored;

/// A call from a row holding the `statements::call_columns`.
pub fn call_from_row(row: &(impl Columns + ?Sized)) -> Result<Call> {
    let status_code = row.int("status")?;
    let status = Status::from_code(status_code)
        .ok_or_else(|| Error::Internal(format!("unknown stored status {status_code}")))?;
    let text = |name: &str| -> Result<String> { Ok(row.opt_text(name)?.unwrap_or_default()) };
    let input = ToolInput::from_stored(row.text("input")?);
    let tool = ToolName::from_stored(row.text("tool")?);
    let workspace = row.text("workspace")?;
    let host = row.opt_text("host")?.as_deref().and_then(Host::from_stored);
    let action = host.map(|h| Action::of(h, &tool, &input, &workspace));
    let outcome = match status {
        Status::Pending => None,
        Status::Decided(kind) => Some(Outcome {
            kind,
            decided_at: Timestamp::from_micros(row.opt_int("decided_at")?.unwrap_or(0)),
            decided_by: DecidedBy::parse_stored(&text("decided_by")?),
            reason: text("reason")?,
            tool_result: text("tool_result")?,
            // An approval stored without its input to run runs the call's own input (see
            // `primitives::outcome_params`: a later version will store it only when edited).
            run_input: match row.opt_text("run_input")? {
                Some(edited) => Some(ToolInput::from_stored(edited)),
                None => (kind == OutcomeKind::Approved).then(|| input.clone()),
            },
            input_edited: row.flag("input_edited")?,
            seq: row.opt_int("resolved_seq")?.map(|seq| seq as u64),
            receipt: None,
        }),
    };
    Ok(Call {
        key: CallKey {
            agent: AgentId::from_stored(row.text("agent")?),
            session: SessionId::from_stored(row.text("session_id")?),
            call_id: CallId::from_stored(row.text("call_id")?),
        },
        batch_id: BatchId::from_stored(row.text("batch_id")?),
        position: row.int("position")? as u32,
        batch_size: row.int("size")? as u32,
        tool,
        input,
        title: row.text("title")?,
        message: row.text("message")?,
        workspace,
        supersede_key: row.opt_text("supersede_key")?,
        deadline: row.opt_int("deadline")?.map(Timestamp::from_micros),
        created_at: Timestamp::from_micros(row.int("created_at")?),
        outcome,
        escalation: escalation_from_row(row)?,
        requested_by: row.opt_text("requested_by")?.unwrap_or_default(),
        host,
        action,
        approval: match row.opt_text("requirement")? {
            None => None,
            Some(requirement) => Some(Approval {
                requirement: Requirement::from_stored(&requirement)?,
                votes: Approval::votes_from_stored(row.opt_text("votes")?.as_deref())?,
            }),
        },
    })
}

/// A call's escalation, from the `statements::call_columns`; `None` for a call without a ladder.
fn escalation_from_row(row: &(impl Columns + ?Sized)) -> Result<Option<Escalation>> {
    let Some(text) = row.opt_text("escalation")? else {
        return Ok(None);
    };
    Ok(Some(Escalation {
        ladder: Ladder::from_stored(&text)?,
        fired: row.int("next_step")? as u32,
        next_at: row.opt_int("next_step_at")?.map(Timestamp::from_micros),
    }))
}

/// One page of a keyset query that fetched `limit + 1` rows ordered by `id`: the first `limit`
/// decoded, the cursor after each of them, and the cursor after the last of them when the extra
/// row shows that more follow.
pub fn page<R: Columns, T>(
    rows: &[R],
    limit: u32,
    decode: impl Fn(&R) -> Result<T>,
) -> Result<(Vec<T>, Vec<Cursor>, Option<Cursor>)> {
    let limit = limit as usize;
    let kept = &rows[..rows.len().min(limit)];
    let items = kept.iter().map(decode).collect::<Result<Vec<T>>>()?;
    let cursors = kept
        .iter()
        .map(|row| row.int("id").map(Cursor))
        .collect::<Result<Vec<Cursor>>>()?;
    let next = cursors.last().copied().filter(|_| rows.len() > limit);
    Ok((items, cursors, next))
}

/// A call and its row id, from a row holding the `statements::call_columns`.
pub fn stored(row: &(impl Columns + ?Sized)) -> Result<Stored> {
    Ok(Stored {
        rowid: row.int("id")?,
        call: call_from_row(row)?,
    })
}

/// A receipt read beside its call (`receipt_envelope`, `receipt_payload`, `receipt_keyid`,
/// `receipt_sig`: `statements::EVENTS_AFTER`, `receipt_rows::SEALS_OF_CALLS`), stored whole or
/// in parts; `None` where the call has none.
pub fn sealed_from_row(row: &(impl Columns + ?Sized)) -> Result<Option<Sealed>> {
    if let Some(payload) = row.opt_text("receipt_payload")? {
        return Ok(Some(Sealed::Parts {
            payload,
            key_id: row.text("receipt_keyid")?,
            sig: row.text("receipt_sig")?,
        }));
    }
    Ok(row
        .opt_text("receipt_envelope")?
        .filter(|envelope| !envelope.is_empty())
        .map(Sealed::Whole))
}

/// A call from a row holding the `statements::call_columns` and its receipt's (see
/// [`sealed_from_row`]), its outcome (if any) with the receipt.
pub fn sealed_call_from_row(row: &(impl Columns + ?Sized)) -> Result<Call> {
    let mut call = call_from_row(row)?;
    seal(&mut call, row)?;
    Ok(call)
}

/// Gives `call`'s outcome, if any, the receipt read beside it in `row`.
fn seal(call: &mut Call, row: &(impl Columns + ?Sized)) -> Result<()> {
    if let Some(outcome) = &mut call.outcome {
        outcome.receipt = sealed_from_row(row)?.map(Arc::new);
    }
    Ok(())
}

/// An event from a row holding the columns [`event_from_row`] reads and its receipt's (see
/// [`sealed_from_row`]), a Resolved one's outcome with the receipt.
pub fn sealed_event_from_row(row: &(impl Columns + ?Sized)) -> Result<Event> {
    let mut event = event_from_row(row)?;
    if event.kind == EventKind::Resolved {
        seal(&mut event.call, row)?;
    }
    Ok(event)
}

/// An event from a row holding `seq`, `kind`, `batch_completed` and the `statements::call_columns`.
pub fn event_from_row(row: &(impl Columns + ?Sized)) -> Result<Event> {
    let kind = EventKind::from_code(row.int("kind")?);
    let mut call = call_from_row(row)?;
    match kind {
        EventKind::Requested => {
            // The call as the event left it: not yet decided, no votes yet.
            call.outcome = None;
            if let Some(approval) = &mut call.approval {
                approval.votes.clear();
            }
        }
        // Pending when the vote was recorded (its votes are those recorded so far, as read), or
        // when a step of its ladder fired.
        EventKind::ApprovalRecorded | EventKind::Reminded | EventKind::Escalated => {
            call.outcome = None
        }
        EventKind::Resolved => {}
    }
    Ok(Event {
        seq: row.int("seq")? as u64,
        kind,
        call,
        batch_completed: row.flag("batch_completed")?,
        step: row.opt_int("step")?.map(|step| step as u32),
    })
}

/// A matcher stored by this broker; it was validated on the way in.
fn stored_matcher(text: &str) -> Result<Matcher> {
    let value = serde_json::from_str(text)
        .map_err(|e| Error::Internal(format!("a stored matcher is not JSON: {e}")))?;
    Matcher::from_json("matcher", &value, usize::MAX)
        .map_err(|e| Error::Internal(format!("a stored matcher is invalid: {e}")))
}

/// A grant from a row holding the `statements::grant_columns`.
pub fn grant_from_row(row: &(impl Columns + ?Sized)) -> Result<Grant> {
    let agent = AgentId::from_stored(row.text("agent")?);
    let scope_code = row.int("scope")?;
    let scope = match Scope::from_code(scope_code) {
        Some(Scope::Session) => GrantScope::Session(SessionId::from_stored(
            row.opt_text("session_id")?.unwrap_or_default(),
        )),
        Some(Scope::Workspace) => {
            GrantScope::Workspace(row.opt_text("workspace")?.unwrap_or_default())
        }
        Some(Scope::Always) => GrantScope::Always,
        _ => {
            return Err(Error::Internal(format!(
                "unknown stored scope {scope_code}"
            )));
        }
    };
    let effect_code = row.int("effect")?;
    let effect = Effect::from_code(effect_code)
        .ok_or_else(|| Error::Internal(format!("unknown stored effect {effect_code}")))?;
    let time = |name: &str| -> Result<Option<Timestamp>> {
        Ok(row.opt_int(name)?.map(Timestamp::from_micros))
    };
    Ok(Grant {
        id: row.int("id")?,
        spec: GrantSpec {
            source: CallKey {
                agent: agent.clone(),
                session: SessionId::from_stored(row.text("source_session")?),
                call_id: CallId::from_stored(row.text("source_call")?),
            },
            agent,
            scope,
            tool: ToolName::from_stored(row.text("tool")?),
            kind: stored_kind(row)?,
            matcher: stored_matcher(&row.text("matcher")?)?,
            effect,
            authors: Person::list_from_stored(
                row.opt_text("authors")?.as_deref(),
                &row.text("created_by")?,
            )?,
            created_by: row.text("created_by")?,
            created_at: Timestamp::from_micros(row.int("created_at")?),
            expires_at: time("expires_at")?,
            reason: row.text("reason")?,
        },
        revoked_at: time("revoked_at")?,
        revoked_by: row.opt_text("revoked_by")?,
    })
}

/// A rule from a row holding the columns `statements::select_rules` selects.
pub fn rule_from_row(row: &(impl Columns + ?Sized)) -> Result<Rule> {
    let effect_code = row.int("effect")?;
    let tool = row.text("tool")?;
    Ok(Rule {
        id: RuleId::from_stored(row.text("id")?),
        tool: Glob::parse("tool", &tool)
            .map_err(|e| Error::Internal(format!("a stored tool glob is invalid: {e}")))?,
        kind: stored_kind(row)?,
        matcher: stored_matcher(&row.text("matcher")?)?,
        effect: RuleEffect::from_code(effect_code)
            .ok_or_else(|| Error::Internal(format!("unknown stored rule effect {effect_code}")))?,
        priority: row.int("priority")? as i32,
        description: row.text("description")?,
        source: RuleSource::from_stored(&row.text("source")?),
        created_at: Timestamp::from_micros(row.int("created_at")?),
        mode: {
            let code = row.int("mode")?;
            RuleMode::from_code(code)
                .ok_or_else(|| Error::Internal(format!("unknown stored rule mode {code}")))?
        },
        escalation: Ladder::from_stored(&row.text("escalation")?)?,
        approvers: match row.opt_text("approvers")? {
            None => None,
            Some(text) => Some(stored_approvers(&text)?),
        },
    })
}

/// A rule's or grant's action kind; `NULL` for one that names a tool.
fn stored_kind(row: &(impl Columns + ?Sized)) -> Result<Option<Kind>> {
    row.opt_text("kind")?
        .map(|text| {
            Kind::from_stored(&text)
                .ok_or_else(|| Error::Internal(format!("unknown stored action kind `{text}`")))
        })
        .transpose()
}

/// A shadow verdict from a row of `statements::SHADOW_VERDICTS_OF_CALL`.
pub fn shadow_verdict_from_row(row: &(impl Columns + ?Sized)) -> Result<ShadowVerdict> {
    let code = row.int("verdict")?;
    Ok(ShadowVerdict {
        rule: RuleId::from_stored(row.text("rule_id")?),
        verdict: RuleVerdict::from_code(code)
            .ok_or_else(|| Error::Internal(format!("unknown stored shadow verdict {code}")))?,
        reason: String::new(),
    })
}

/// An ask rule's stored `approvers` (the JSON the policy file spells them in).
fn stored_approvers(text: &str) -> Result<Approvers> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::Internal(format!("stored approvers are unreadable: {e}")))?;
    Approvers::from_json("approvers", &value)
        .map_err(|e| Error::Internal(format!("stored approvers are invalid: {e}")))
}
