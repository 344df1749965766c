//! Cancel: the agent withdraws calls (some, a batch, or its whole session). Pending ones become
//! CANCELLED; those already decided are reported as they stand, never changed.

use std::time::Instant;

use super::tx::{Stored, WriteTx, batches_of, complete_batches};
use crate::domain::{
    CallKey, CancelReport, CancelScope, CancelTarget, DecidedBy, OutcomeKind, Timestamp,
    ToolResultTexts,
};
use crate::error::{Error, Result};
use crate::observe::meters;

/// Cancels what `target` names and commits.
pub async fn cancel(
    mut tx: impl WriteTx,
    target: &CancelTarget,
    texts: &ToolResultTexts,
) -> Result<CancelReport> {
    let started = Instant::now();
    let report = cancel_in(&mut tx, target, texts, Timestamp::now()).await?;
    tx.commit().await?;
    meters::committed(1, started.elapsed());
    Ok(report)
}

pub async fn cancel_in(
    tx: &mut impl WriteTx,
    target: &CancelTarget,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<CancelReport> {
    let outcome = texts.outcome(
        OutcomeKind::Cancelled,
        DecidedBy::Agent,
        &target.reason,
        now,
    );
    let mut report = CancelReport::default();
    let candidates = match &target.scope {
        CancelScope::Calls(ids) => {
            let mut found = Vec::new();
            for call_id in ids {
                let key = CallKey {
                    agent: target.agent.clone(),
                    session: target.session.clone(),
                    call_id: call_id.clone(),
                };
                match tx.find_call(&key).await? {
                    Some(stored) => found.push(stored),
                    None => report.unknown.push(call_id.clone()),
                }
            }
            found
        }
        CancelScope::Batch(batch_id) => {
            let calls = tx
                .calls_of_batch(&target.agent, &target.session, batch_id)
                .await?;
            if calls.is_empty() {
                return Err(Error::NotFound(format!(
                    "no batch `{}` in session `{}`",
                    batch_id.as_str(),
                    target.session
                )));
            }
            calls
        }
        CancelScope::Session => {
            tx.pending_in_session(&target.agent, &target.session)
                .await?
        }
    };

    tx.lock_batches(&batches_of(
        candidates
            .iter()
            .map(|c| &c.call)
            .filter(|c| c.outcome.is_none()),
    ))
    .await?;
    let mut resolved = Vec::new();
    for Stored { rowid, call } in candidates {
        let won = match call.outcome {
            Some(_) => None,
            None => tx.resolve(rowid, &outcome).await?,
        };
        match won {
            Some(r) => resolved.push(r),
            // Decided before, or meanwhile by another transaction.
            None => report.already_decided.push(tx.load_call(rowid).await?),
        }
    }
    complete_batches(tx, &resolved).await?;
    for r in &resolved {
        report.cancelled.push(tx.load_call(r.rowid).await?);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AgentId, BatchId, CallId, SessionId, Status, Verdict};
    use crate::operations::decide::decide_in;
    use crate::operations::submit::submit_in;
    use crate::operations::testing::{AGENT, Db, batch, call, decision, key, texts};

    fn target(scope: CancelScope) -> CancelTarget {
        CancelTarget {
            agent: AgentId::from_stored(AGENT.into()),
            session: SessionId::from_stored("s".into()),
            scope,
            reason: "user stopped".into(),
        }
    }

    fn ids(calls: &[crate::domain::Call]) -> Vec<String> {
        calls.iter().map(|c| c.key.call_id.to_string()).collect()
    }

    #[tokio::test]
    async fn named_calls_are_cancelled_decided_ones_reported_and_unknown_ones_named() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let now = Timestamp::now();
        let b = batch("s", [call("a", "t", "{}"), call("b", "t", "{}")]);
        let mut b = b;
        b.on_deny = crate::domain::OnDeny::Independent;
        submit_in(&mut tx, &b, &texts(), now).await.unwrap();
        decide_in(
            &mut tx,
            &key("s", "a"),
            &decision(Verdict::Approve, ""),
            &texts(),
            now,
        )
        .await
        .unwrap();
        let named = ["a", "b", "zz"].map(|id| CallId::from_stored(id.into()));
        let report = cancel_in(
            &mut tx,
            &target(CancelScope::Calls(named.to_vec())),
            &texts(),
            now,
        )
        .await
        .unwrap();
        assert_eq!(ids(&report.cancelled), ["b"]);
        assert_eq!(ids(&report.already_decided), ["a"]);
        assert_eq!(report.unknown, [CallId::from_stored("zz".into())]);
        let outcome = report.cancelled[0].outcome.as_ref().unwrap();
        assert_eq!(outcome.kind, OutcomeKind::Cancelled);
        assert_eq!(outcome.decided_by, DecidedBy::Agent);
        assert_eq!(
            report.already_decided[0].status(),
            Status::Decided(OutcomeKind::Approved),
            "an outcome that stands is never changed"
        );
    }

    #[tokio::test]
    async fn an_unknown_batch_is_not_found() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let scope = CancelScope::Batch(BatchId::from_stored("nope".into()));
        let err = cancel_in(&mut tx, &target(scope), &texts(), Timestamp::now())
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
    }

    #[tokio::test]
    async fn a_batch_or_a_session_cancels_its_pending_calls() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let now = Timestamp::now();
        let first = submit_in(&mut tx, &batch("s", [call("a", "t", "{}")]), &texts(), now)
            .await
            .unwrap();
        submit_in(&mut tx, &batch("s", [call("b", "t", "{}")]), &texts(), now)
            .await
            .unwrap();
        let scope = CancelScope::Batch(first.batch_id.unwrap());
        let report = cancel_in(&mut tx, &target(scope), &texts(), now)
            .await
            .unwrap();
        assert_eq!(ids(&report.cancelled), ["a"]);
        let report = cancel_in(&mut tx, &target(CancelScope::Session), &texts(), now)
            .await
            .unwrap();
        assert_eq!(ids(&report.cancelled), ["b"]);
    }
}
