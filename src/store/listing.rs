//! The read-side queries whose shape depends on the request (which filters are set, how many
//! ids are asked for), built once for both backends with sqlx's `QueryBuilder`, which is generic
//! over the database ([`Listing`]): the keyset listing of calls and of grants, and calls looked up
//! by id.
//!
//! A listing is a keyset page: the filters, then the rows after the cursor's row id, in row-id
//! order (ascending, or descending for a newest-first listing of calls), one more than the page
//! so the caller can tell whether more follow (`rows::page`). It must never page by `OFFSET` (a
//! page would cost every row before it) nor order by anything but the row id the cursors hold.

use sqlx::{Database, Encode, Postgres, QueryBuilder, Sqlite, Type};

use super::rows::{Columns, call_from_row, grant_from_row, page};
use super::statements::{select_calls, select_grants};
use crate::domain::{AgentId, CallId, SessionId, Timestamp};
use crate::domain::{CallPage, CallQuery, Cursor, DecidedByFilter, GrantPage, GrantQuery};
use crate::error::Result;

/// What the two databases say differently in a listing.
pub trait Dialect: Database {
    /// Around the bound sequence number: the call's Requested event is numbered at or below it.
    /// SQLite keeps that number on the call (`requested_seq`, set by the event's trigger);
    /// Postgres numbers events after commit, so it looks for the event (a call whose Requested
    /// event is not numbered yet reaches subscribers live).
    const REQUESTED_AT_OR_BEFORE: [&'static str; 2];
}

impl Dialect for Sqlite {
    const REQUESTED_AT_OR_BEFORE: [&'static str; 2] = [" AND c.requested_seq <= ", ""];
}

impl Dialect for Postgres {
    const REQUESTED_AT_OR_BEFORE: [&'static str; 2] = [
        concat!(
            " AND EXISTS (SELECT 1 FROM events e WHERE e.call_rowid = c.id AND e.kind = ",
            crate::domain::code!(EventKind::Requested),
            " AND e.seq <= "
        ),
        ")",
    ];
}

/// A keyset listing under construction: `select` (ending before `WHERE`) and its filters.
pub struct Listing<DB: Database> {
    query: QueryBuilder<DB>,
    /// The row-id column, qualified as the `SELECT` names its table.
    id: &'static str,
}

impl<DB> Listing<DB>
where
    DB: Dialect,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
    <DB as Database>::Arguments: Default,
{
    fn new(select: &'static str, id: &'static str) -> Self {
        let mut query = QueryBuilder::new(select);
        query.push("WHERE 1 = 1");
        Self { query, id }
    }

    /// `AND column = value`, if there is a value.
    fn equals(&mut self, column: &str, value: Option<&str>) -> &mut Self {
        if let Some(value) = value {
            self.query
                .push(format_args!(" AND {column} = "))
                .push_bind(value);
        }
        self
    }

    /// The rows after `after`, in row-id order (descending when `newest_first`), `limit` and
    /// one more.
    fn page(mut self, after: Option<Cursor>, limit: u32, newest_first: bool) -> QueryBuilder<DB> {
        let (beyond, order) = if newest_first {
            ("<", "DESC")
        } else {
            (">", "ASC")
        };
        if let Some(Cursor(after)) = after {
            self.query
                .push(format_args!(" AND {} {beyond} ", self.id))
                .push_bind(after);
        }
        self.query
            .push(format_args!(" ORDER BY {} {order} LIMIT ", self.id))
            .push_bind(i64::from(limit) + 1);
        self.query
    }

    /// The listing of calls `q` asks for.
    pub fn calls(q: &CallQuery) -> QueryBuilder<DB> {
        let mut listing = Self::new(select_calls!(), "c.id");
        listing
            .equals("c.agent", q.agent.as_ref().map(AgentId::as_str))
            .equals("c.session_id", q.session.as_deref())
            .equals("c.workspace", q.workspace.as_deref())
            .equals("c.tool", q.tool.as_deref());
        let query = &mut listing.query;
        if !q.statuses.is_empty() {
            query.push(" AND c.status IN (");
            let mut codes = query.separated(", ");
            for status in &q.statuses {
                codes.push_bind(status.code());
            }
            query.push(")");
        }
        if let Some(t) = q.created_after {
            query.push(" AND c.created_at >= ").push_bind(t.as_micros());
        }
        if let Some(t) = q.created_before {
            query.push(" AND c.created_at < ").push_bind(t.as_micros());
        }
        if let Some(seq) = q.requested_at_or_before {
            let [before, after] = DB::REQUESTED_AT_OR_BEFORE;
            query.push(before).push_bind(seq as i64).push(after);
        }
        match &q.decided_by {
            Some(DecidedByFilter::Exact(by)) => {
                query.push(" AND c.decided_by = ").push_bind(by.as_str());
            }
            Some(DecidedByFilter::Prefix(prefix)) => {
                query
                    .push(" AND substr(c.decided_by, 1, length(")
                    .push_bind(prefix.as_str())
                    .push(")) = ")
                    .push_bind(prefix.as_str());
            }
            None => {}
        }
        listing.page(q.after, q.limit, q.newest_first)
    }

    /// The listing of grants `q` asks for.
    pub fn grants(q: &GrantQuery) -> QueryBuilder<DB> {
        let mut listing = Self::new(select_grants!(), "id");
        listing.equals("agent", q.agent.as_ref().map(AgentId::as_str));
        if let Some(scope) = q.scope {
            listing.query.push(" AND scope = ").push_bind(scope.code());
        }
        listing
            .equals("session_id", q.session.as_ref().map(SessionId::as_str))
            .equals("workspace", q.workspace.as_deref())
            .equals("tool", q.tool.as_ref().map(|t| t.as_str()));
        if !q.include_inactive {
            let now = q.now.unwrap_or_else(Timestamp::now).as_micros();
            listing
                .query
                .push(" AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ")
                .push_bind(now)
                .push(")");
        }
        listing.page(q.after, q.limit, false)
    }

    /// The calls of a session named by id (in no particular order; the caller orders them).
    pub fn calls_by_id(agent: &AgentId, session: &SessionId, ids: &[CallId]) -> QueryBuilder<DB> {
        let mut query = QueryBuilder::new(concat!(select_calls!(), "WHERE "));
        named_calls(&mut query, agent, session, ids);
        query
    }

    /// The receipts of the stored calls of a session named by id, each with its call's id and
    /// batch (the columns `rows::sealed_from_row` reads): a call row has one receipt at most.
    pub fn seals_of_calls(
        agent: &AgentId,
        session: &SessionId,
        ids: &[CallId],
    ) -> QueryBuilder<DB> {
        let mut query = QueryBuilder::new(
            "SELECT c.call_id, c.batch_id, r.envelope AS receipt_envelope, \
             r.payload AS receipt_payload, r.keyid AS receipt_keyid, r.sig AS receipt_sig \
             FROM calls c JOIN receipts r ON r.call_row = c.id WHERE ",
        );
        named_calls(&mut query, agent, session, ids);
        query
    }
}

/// The condition on `c` (the calls) that picks the calls of `agent`'s `session` named in `ids`.
fn named_calls<DB>(
    query: &mut QueryBuilder<DB>,
    agent: &AgentId,
    session: &SessionId,
    ids: &[CallId],
) where
    DB: Database,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
{
    query
        .push("c.agent = ")
        .push_bind(agent.as_str())
        .push(" AND c.session_id = ")
        .push_bind(session.as_str())
        .push(" AND c.call_id IN (");
    let mut listed = query.separated(", ");
    for id in ids {
        listed.push_bind(id.as_str());
    }
    query.push(")");
}

/// The page of calls `q` asks for, from `rows` fetched with [`calls`].
pub fn call_page<R: Columns>(rows: &[R], q: &CallQuery) -> Result<CallPage> {
    let (calls, cursors, next) = page(rows, q.limit, call_from_row)?;
    Ok(CallPage {
        calls,
        cursors,
        next,
    })
}

/// The page of grants `q` asks for, from `rows` fetched with [`grants`].
pub fn grant_page<R: Columns>(rows: &[R], q: &GrantQuery) -> Result<GrantPage> {
    let (grants, cursors, next) = page(rows, q.limit, grant_from_row)?;
    Ok(GrantPage {
        grants,
        cursors,
        next,
    })
}
