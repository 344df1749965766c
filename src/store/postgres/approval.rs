//! A plain approval on Postgres, in one statement. Most decisions approve a call and remember
//! nothing ([`decide::approves_only`]): they write the call's outcome and its Resolved event,
//! nothing else. In a transaction of their own that is four round trips (BEGIN, the call read
//! locking its batch, the write, COMMIT), each a wake-up of a Postgres backend and of the broker
//! whatever the statement does; migration 0022's `approve_call` runs the same statements, under
//! the same lock, as one autocommit statement.
//!
//! Who may approve is judged by the one gate, in Rust, never in SQL: the call is read first
//! (who submitted it and the requirement fixed on it never change after submit) and
//! [`Gate::admit`] asked. The function then writes only what needs no other check of
//! [`decide::decide_in`]: a pending call without a requirement or a ladder, before its
//! deadline. Anything else (no such call aside) it leaves untouched, and the decision goes
//! through the whole transaction, which answers it exactly as before (a replay, a refusal, a
//! vote). So do all decisions while receipts are on: a receipt is signed and chained in the
//! outcome's transaction.

use std::time::Instant;

use sqlx::Row;

use super::PostgresStore;
use crate::domain::policy::Gate;
use crate::domain::{CallKey, DecideReport, DecidedBy, Decision, Timestamp, ToolInput, Verdict};
use crate::error::Result;
use crate::observe::meters;
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
        let stored = sqlx::query(sql::FIND_CALL)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(stored) = stored else {
            return Err(key.not_found());
        };
        let stored = call_from_row(&stored)?;
        let decision = &*decision.against(&stored.input);
        if stored.outcome.is_some()
            || !stored.visible_to(&decision.viewer)
            || Gate::of(&stored)
                .admit(&decision.person(), Verdict::Approve)
                .is_err()
            || stored
                .approval
                .as_ref()
                .is_some_and(|a| a.requirement.needs_passkey())
        {
            // A replay, a hidden call, a refusal, or a vote that needs its passkey checked (in
            // the transaction, with its challenge): the whole transaction answers it.
            return Ok(None);
        }
        let now = Timestamp::now();
        let decided_by = DecidedBy::Approver(decision.approver.clone()).to_string();
        let edited = decision.edited_input.as_ref().map(ToolInput::as_str);
        let row = sqlx::query(sql::APPROVE_CALL)
            .bind(key.agent.as_str())
            .bind(key.session.as_str())
            .bind(key.call_id.as_str())
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
            grant_note: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use testkit::Schema;

    use super::*;
    use crate::domain::{AgentId, NewCall, OnDeny, OutcomeKind, SessionId, Verdict};
    use crate::operations::testing::{AGENT, batch, call, decision, key, texts};
    use crate::store::{Calls as _, Writes as _};

    /// Which approvals the one statement writes, and which it leaves untouched for the whole
    /// transaction (`None`), on a fresh schema of the test database: written where the
    /// transaction would refuse, a refusal would be lost; written nowhere, every approval would
    /// pay for the transaction again, which no other test would notice.
    #[tokio::test]
    #[cfg_attr(
        not(approvals_test_postgres),
        ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
    )]
    async fn one_statement_approves_what_needs_no_other_check_and_nothing_else() {
        let schema = Schema::create(&testkit::postgres_url(), "approval")
            .await
            .unwrap();
        let store = PostgresStore::open(&schema.url(), 2, false, texts(), None)
            .await
            .unwrap();
        let acting = NewCall {
            requested_by: "Carol".into(),
            ..call("acting", "t", "{}")
        };
        let late = NewCall {
            deadline: Some(Timestamp::now().saturating_add(Duration::from_millis(100))),
            ..call("late", "t", "{}")
        };
        let ids = ["plain", "edited", "decided", "own"].map(|id| call(id, "t", r#"{"a":1}"#));
        let mut calls = batch("s", ids.into_iter().chain([acting, late]));
        calls.on_deny = OnDeny::Independent;
        store.submit(calls).await.unwrap();
        let approve = decision(Verdict::Approve, "fine");
        let at_once = async |id: &str, decision: &Decision| {
            store.approve_at_once(&key("s", id), decision).await
        };
        let stored = async |id: &str| {
            let session = SessionId::from_stored("s".into());
            let agent = AgentId::from_stored(AGENT.into());
            let ids = [key("s", id).call_id];
            let read = store.calls_by_id(&agent, &session, &ids).await.unwrap();
            read.into_iter().next().flatten().expect("stored")
        };

        let edited = Decision {
            edited_input: Some(ToolInput::from_stored(r#"{"a":2}"#.into())),
            ..approve.clone()
        };
        for (id, decision) in [("plain", &approve), ("edited", &edited)] {
            let report = at_once(id, decision).await.unwrap().expect("written");
            assert!(!report.replayed);
            let outcome = report.call.outcome.as_ref().expect("decided");
            assert_eq!(outcome.kind, OutcomeKind::Approved);
            assert_eq!(outcome.decided_by, DecidedBy::Approver("approver".into()));
            let runs = decision.edited_input.as_ref().unwrap_or(&report.call.input);
            assert_eq!(outcome.run_input.as_ref(), Some(runs), "{id}");
            assert_eq!(
                outcome.input_edited,
                decision.edited_input.is_some(),
                "{id}"
            );
            // What it answered is what a read gives, field for field (the sequence number is
            // given after commit, by the sequencer, which nothing runs here).
            let read = stored(id).await;
            assert_eq!(read.outcome.as_ref().and_then(|o| o.seq), None);
            assert_eq!(format!("{:?}", report.call), format!("{read:?}"), "{id}");
        }

        // Decided already: a replay, answered by the transaction.
        store.decide(&key("s", "decided"), &approve).await.unwrap();
        assert!(at_once("decided", &approve).await.unwrap().is_none());
        // Its agent or the human it acts for: refused by the transaction.
        let by = |approver: &str| Decision {
            approver: approver.into(),
            ..approve.clone()
        };
        assert!(at_once("own", &by(AGENT)).await.unwrap().is_none());
        assert!(at_once("acting", &by("carol")).await.unwrap().is_none());
        // The gate compares canonical identities: `CAROL` is carol (the edge canonicalises
        // every identity; a stored text from before is compared canonically too).
        assert!(at_once("acting", &by("CAROL")).await.unwrap().is_none());
        // Past its deadline: refused by the transaction.
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(at_once("late", &approve).await.unwrap().is_none());
        let err = at_once("nope", &approve).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);

        for id in ["own", "acting", "late"] {
            assert!(stored(id).await.outcome.is_none(), "{id}: nothing written");
        }
    }
}
