//! A plain approval on Postgres, in one statement. Most decisions approve a call and remember
//! nothing ([`decide::approves_only`]): they write the call's outcome and its Resolved event,
//! nothing else. In a transaction of their own that is four round trips (BEGIN, the call read
//! locking its batch, the write, COMMIT), each a wake-up of a Postgres backend and of the broker
//! whatever the statement does; migration 0013's `approve_call` runs the same statements, under
//! the same lock, as one autocommit statement.
//!
//! The function writes only what needs no other check of [`decide::decide_in`]: a pending call
//! without a requirement or a ladder, before its deadline, that the approver did not submit.
//! Anything else (no such call aside) it leaves untouched, and the decision goes through the
//! whole transaction, which answers it exactly as before (a replay, a refusal, a vote). So do
//! all decisions while receipts are on: a receipt is signed and chained in the outcome's
//! transaction.

use std::time::Instant;

use sqlx::Row;

use super::PostgresStore;
use crate::domain::{CallKey, DecideReport, DecidedBy, Decision, Timestamp, ToolInput};
use crate::error::Result;
use crate::meters;
use crate::operations::decide;
use crate::store::rows::call_from_row;
use crate::store::statements as sql;

impl PostgresStore {
    /// Writes `decision` (one [`decide::approves_only`] accepts) in one statement, if the call
    /// allows it: the report, or `None` when the decision needs the whole transaction.
    pub(super) async fn approve_at_once(
        &self,
        key: &CallKey,
        decision: &Decision,
    ) -> Result<Option<DecideReport>> {
        let started = Instant::now();
        let now = Timestamp::now();
        let decided_by = DecidedBy::Approver(decision.approver.clone()).to_string();
        let edited = decision.edited_input.as_ref().map(ToolInput::as_str);
        let row = sqlx::query(sql::APPROVE_CALL)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
            .bind(decision.approver.as_str())
            .bind(now.as_micros())
            .bind(&decided_by)
            .bind(&decision.reason)
            .bind(edited)
            .bind(edited.is_some())
            .fetch_one(&self.pool)
            .await?;
        let Some(rowid) = row.try_get::<Option<i64>, _>("call_row")? else {
            return Err(key.not_found());
        };
        if row.try_get::<Option<i64>, _>("resolved_event")?.is_none() {
            return Ok(None);
        }
        meters::committed(1, started.elapsed());
        let call = if row.try_get::<Option<i64>, _>("id")?.is_some() {
            decide::approved(call_from_row(&row)?, decision, &self.texts, now)
        } else {
            // The call committed after the statement's snapshot was taken and before the
            // function found it: what was approved is what is stored now.
            let stored = sqlx::query(sql::LOAD_CALL)
                .bind(rowid)
                .fetch_one(&self.pool)
                .await?;
            call_from_row(&stored)?
        };
        Ok(Some(DecideReport {
            call,
            replayed: false,
            skipped: Vec::new(),
            grant: None,
            decided_by_grant: Vec::new(),
        }))
    }
}
