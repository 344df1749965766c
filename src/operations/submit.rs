//! Submit: store a batch's new calls, recognise retries, refuse conflicting reuse of a call id
//! (for that call alone), supersede what the batch supersedes, and let rules and grants decide
//! what they decide, all in one transaction.
//!
//! Rules and grants are read inside the transaction, before any call is stored, and judged by the
//! one pure function, [`evaluate`](crate::domain::policy::evaluate), that Explain calls too. A
//! call they decide is stored decided: it never enters the pending calls' indexes only to leave
//! them in the same transaction (about a fifth of the pages an auto-approved call's commit
//! writes). The costly part,
//! matching their conditions against large inputs, was done before the submit was queued (see
//! [`Prejudged`]): the transaction looks the results up, so it does not hold the writer while
//! globs run.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::escalate::start_escalations;
use super::routing::route_new_calls;
use super::ruling::{brought_along, decide_by_ruling, ruled_outcome};
use super::tx::{Placement, PolicyTx, Resolved, WriteTx, batches_of, complete_batches, tools_of};
use crate::domain::policy::{
    Grant, Prejudged, Requirement, Rule, RuleMode, ShadowVerdict, Subject, shadow_verdicts,
};
use crate::domain::{
    BatchId, Call, CallId, CallKey, DecidedBy, NewBatch, NewCall, OnDeny, Outcome, OutcomeKind,
    SubmitItem, SubmitReport, SubmitResult, Timestamp, ToolResultTexts,
};
use crate::error::{Error, Result};
use crate::observe::meters;

/// Stores a batch and commits.
pub async fn submit(
    mut tx: impl WriteTx + PolicyTx,
    batch: &NewBatch,
    texts: &ToolResultTexts,
) -> Result<SubmitReport> {
    let started = Instant::now();
    let report = submit_in(&mut tx, batch, texts, Timestamp::now()).await?;
    tx.commit().await?;
    meters::committed(1, started.elapsed());
    Ok(report)
}

pub async fn submit_in(
    tx: &mut (impl WriteTx + PolicyTx),
    batch: &NewBatch,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<SubmitReport> {
    // Every call's tool is locked, though a retry or a refused call needs none: the locks come
    // before the reads that tell them apart, in one statement, which (on Postgres) also says
    // which calls are stored already: only those are read. A count of the agent's pending
    // calls taken with them serves the cap unless the batch supersedes the session's pending
    // calls before the cap is checked (calls superseded by key are superseded after it).
    let host_calls = batch.calls.iter().any(|c| c.host.is_some());
    let locked = tx
        .lock_submit(
            batch,
            &tools_of(
                (batch.calls.iter().map(|c| &c.tool)).chain(host_calls.then(super::tx::host_calls)),
            ),
            batch.pending_cap.filter(|_| !batch.supersede_pending),
        )
        .await?;
    let mut report = SubmitReport::default();
    let mut resolved = Vec::new();

    let mut fresh: Vec<&NewCall> = Vec::new();
    // Stored calls this request resubmits: their row ids, and where their items are.
    let mut resubmitted: HashMap<i64, usize> = HashMap::new();
    for call in &batch.calls {
        let stored = match locked.may_be_stored(&call.call_id) {
            true => tx.find_call(&key_of(batch, &call.call_id)).await?,
            false => None,
        };
        match stored {
            Some(stored) => {
                let item = existing(batch, call, stored.call);
                if matches!(item.result, SubmitResult::Duplicate(_)) {
                    resubmitted.insert(stored.rowid, report.items.len());
                }
                report.items.push(item);
            }
            None => match call.refusal_if_new(now) {
                Some(refusal) => report.items.push(SubmitItem {
                    index: call.index,
                    call_id: call.call_id.clone(),
                    result: SubmitResult::Refused(refusal),
                }),
                None => fresh.push(call),
            },
        }
    }
    let tools = tools_of(fresh.iter().map(|c| &c.tool));

    // Supersede replaces what is pending with what this batch stores, so a batch that stores no
    // new call (a retry, or every call refused) supersedes nothing.
    let supersede_pending = batch.supersede_pending && !fresh.is_empty();
    let supersedes = supersede_pending || fresh.iter().any(|c| c.supersede_key.is_some());
    let pending = if supersedes {
        tx.pending_in_session(&batch.agent, &batch.session).await?
    } else {
        Vec::new()
    };
    tx.lock_batches(&batches_of(pending.iter().map(|p| &p.call)))
        .await?;

    if supersede_pending {
        // A pending call this batch resubmits (a duplicate) is one of its own and stays. One
        // whose id a refused call reuses for another request is not in the batch: it is
        // superseded like the others (left pending, it could be approved and run while the
        // model's turn holds another request under its id).
        let superseded = texts.outcome(OutcomeKind::Superseded, DecidedBy::Broker, "", now);
        for pending in pending {
            if !resubmitted.contains_key(&pending.rowid) {
                resolved.extend(tx.resolve(pending.rowid, &superseded).await?);
            }
        }
    }

    let fresh = refuse_past_pending_cap(tx, batch, fresh, locked.pending, &mut report).await?;

    // The rules and grants, read before any call is stored, so a call they decide as it arrives
    // is stored decided.
    let (rules, grants) = if fresh.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        let rules = tx.rules().await?;
        let grants = tx
            .live_grants(&batch.agent, Some(&batch.session), &tools, now)
            .await?;
        (rules, grants)
    };

    // The requirement a new call gets unless an ask rule names another, fixed before any grant
    // is tried: grants are tried only where no rule matches, so this is the requirement every
    // grant is judged against at submit (the gate; see `ruled_outcome`).
    let default_requirement = batch
        .default_approvers
        .as_ref()
        .map(Requirement::default_of);
    let requirement = default_requirement.as_ref();
    // Calls stored now, in position order: their row ids, and where their items are in the
    // report (which holds the calls themselves).
    let mut accepted: Vec<(i64, usize)> = Vec::new();
    // What was judged of each accepted call's input before the submit was queued, by row id.
    let mut prejudged: BTreeMap<i64, &Prejudged> = BTreeMap::new();
    // The accepted calls the rules and grants were asked about as they were stored, by row id,
    // with the outcome they were stored with (`None`: stored pending, nothing decides them).
    let mut ruled: HashMap<i64, Option<Outcome>> = HashMap::new();
    if !fresh.is_empty() {
        let batch_id = BatchId::generate();
        let planned = fresh.len();
        let mut position = 0;
        // Calls are ruled on as they are stored up to a denial that skips the rest of the
        // batch; those after it are stored pending and skipped with the rest.
        let mut ruling = true;
        for (i, call) in fresh.iter().copied().enumerate() {
            if let Some(key) = &call.supersede_key {
                let superseded = texts.outcome(OutcomeKind::Superseded, DecidedBy::Broker, "", now);
                for rowid in tx
                    .pending_with_key(&batch.agent, &batch.session, key)
                    .await?
                {
                    resolved.extend(tx.resolve(rowid, &superseded).await?);
                }
            }
            // What is about to be stored, as a pending call, without reading it back (the reply
            // of one stored decided is read back once its outcome is written, below).
            let key = key_of(batch, &call.call_id);
            let stored = call.pending(key, &batch_id, position as u32, planned as u32, now);
            // A call a later one of this batch supersedes by key is stored pending, so that one
            // finds it.
            let superseded_later = call.supersede_key.is_some()
                && fresh[i + 1..]
                    .iter()
                    .any(|later| later.supersede_key == call.supersede_key);
            let judged = (ruling && !superseded_later).then(|| {
                let policy = (rules.as_slice(), grants.as_slice());
                let prejudged = Some(&call.prejudged);
                ruled_outcome(&stored, requirement, prejudged, policy, texts, now)
            });
            let decided = judged.as_ref().and_then(Option::as_ref);
            let at = Placement {
                batch_id: &batch_id,
                position,
                new_batch: (i == 0).then_some(planned),
            };
            let result = match tx.insert_call(batch, at, call, now, decided).await? {
                Some(rowid) => {
                    accepted.push((rowid, report.items.len()));
                    prejudged.insert(rowid, &call.prejudged);
                    if decided.is_some_and(|outcome| outcome.kind == OutcomeKind::Denied)
                        && batch.on_deny == OnDeny::SkipRest
                    {
                        ruling = false;
                    }
                    if let Some(judged) = judged {
                        ruled.insert(rowid, judged);
                    }
                    position += 1;
                    SubmitResult::Accepted(stored)
                }
                // A concurrent submit stored the same identity first: answer as if it had
                // been there all along.
                None => match tx.find_call(&key_of(batch, &call.call_id)).await? {
                    Some(stored) => existing(batch, call, stored.call).result,
                    None => return Err(Error::Internal("a conflicting call vanished".into())),
                },
            };
            report.items.push(SubmitItem {
                index: call.index,
                call_id: call.call_id.clone(),
                result,
            });
        }
        if position == 0 {
            tx.resize_batch(&batch_id, 0).await?;
        } else {
            if position < planned {
                tx.resize_batch(&batch_id, position).await?;
                // The calls answered so far carry the planned size.
                for &(_, item) in &accepted {
                    if let SubmitResult::Accepted(call) = &mut report.items[item].result {
                        call.batch_size = position as u32;
                    }
                }
            }
            report.batch_id = Some(batch_id);
        }
    }

    let superseded = resolved.len();
    let mut accepted_calls: Vec<(i64, &Call)> = Vec::with_capacity(accepted.len());
    for &(rowid, item) in &accepted {
        if let SubmitResult::Accepted(call) = &report.items[item].result {
            accepted_calls.push((rowid, call));
        }
    }
    let decided = decide_by_policy(
        tx,
        (&rules, &grants, requirement),
        Arrived {
            accepted: &accepted_calls,
            prejudged: &prejudged,
            ruled: &ruled,
        },
        texts,
        now,
        &mut report.shadow_verdicts,
    )
    .await?;
    resolved.extend(decided);
    complete_batches(tx, &resolved).await?;
    let escalations =
        start_escalations(tx, batch, &accepted_calls, &rules, &prejudged, &resolved).await?;
    let routed = {
        let calls: Vec<_> = accepted_calls
            .iter()
            .map(|&(rowid, call)| (rowid, call, prejudged.get(&rowid).copied()))
            .collect();
        // The rules this submit already read (kept or not, they are the transaction's view).
        let policy = (rules.as_slice(), batch.default_approvers.as_ref());
        route_new_calls(tx, &calls, policy, now).await?
    };
    // The reply shows the ladder of the calls that wait for people, and who may decide them.
    let item_of = |rowid: i64| accepted.iter().find(|(r, _)| *r == rowid).map(|&(_, i)| i);
    for (rowid, escalation) in escalations {
        if let Some(item) = item_of(rowid)
            && let SubmitResult::Accepted(call) = &mut report.items[item].result
        {
            call.escalation = Some(escalation);
        }
    }
    for (rowid, approval) in routed {
        if let Some(item) = item_of(rowid)
            && let SubmitResult::Accepted(call) = &mut report.items[item].result
        {
            call.approval = Some(approval);
        }
    }
    // A call this request carries (stored now, or resubmitted) that a later call of it
    // superseded (the same supersede key) is acknowledged with its outcome, so the reply never
    // calls it pending.
    let carried: HashMap<i64, usize> = accepted.iter().copied().chain(resubmitted).collect();
    for r in &resolved[..superseded] {
        let call = tx.load_call(r.rowid).await?;
        if let Some(&item) = carried.get(&r.rowid) {
            let result = &mut report.items[item].result;
            *result = match result {
                SubmitResult::Duplicate(_) => SubmitResult::Duplicate(call.clone()),
                _ => SubmitResult::Accepted(call.clone()),
            };
        }
        report.superseded.push(call);
    }
    // The calls rules or grants decided (or whose batch a denial skipped) are acknowledged with
    // their outcome: one stored decided is the call as stored with that outcome, without a read
    // (a test checks it is what a read gives); any other is read back.
    for r in &resolved[superseded..] {
        if let Some(&(_, item)) = accepted.iter().find(|(rowid, _)| *rowid == r.rowid) {
            let result = &mut report.items[item].result;
            let call = match (ruled.get(&r.rowid), &*result) {
                (Some(Some(outcome)), SubmitResult::Accepted(call)) => {
                    call.clone().with_outcome(Outcome {
                        seq: r.seq,
                        ..outcome.clone()
                    })
                }
                _ => tx.load_call(r.rowid).await?,
            };
            *result = SubmitResult::Accepted(call);
        }
    }
    report.items.sort_by_key(|item| item.index);
    Ok(report)
}

/// Keeps the new calls the agent has room for under its pending cap
/// ([`NewBatch::pending_cap`]), in order, and refuses the rest, each with RESOURCE_EXHAUSTED
/// naming the setting. Counted after what this submit superseded, so a submit that replaces
/// the pending calls of its session makes room for itself; `counted` is the count taken with
/// the submit's locks, given only when it supersedes no pending call before this check.
async fn refuse_past_pending_cap<'b>(
    tx: &mut impl WriteTx,
    batch: &NewBatch,
    mut fresh: Vec<&'b NewCall>,
    counted: Option<u64>,
    report: &mut SubmitReport,
) -> Result<Vec<&'b NewCall>> {
    let Some(cap) = batch.pending_cap else {
        return Ok(fresh);
    };
    if fresh.is_empty() {
        return Ok(fresh);
    }
    let pending = match counted {
        Some(pending) => pending,
        None => tx.pending_of_agent(&batch.agent, cap).await?,
    };
    let room = cap.saturating_sub(pending) as usize;
    if fresh.len() <= room {
        return Ok(fresh);
    }
    for call in fresh.drain(room..) {
        report.items.push(SubmitItem {
            index: call.index,
            call_id: call.call_id.clone(),
            result: SubmitResult::Refused(Error::ResourceExhausted(format!(
                "agent {} has {pending} pending calls, the most --max-pending-per-agent \
                 allows ({cap}); decide or cancel some first",
                batch.agent
            ))),
        });
    }
    Ok(fresh)
}

/// The calls a submit just stored, as [`decide_by_policy`] takes them.
struct Arrived<'a> {
    /// Their row ids and the calls, in position order.
    accepted: &'a [(i64, &'a Call)],
    /// What was judged of each one's input before the submit was queued, by row id.
    prejudged: &'a BTreeMap<i64, &'a Prejudged>,
    /// Those the rules and grants were asked about as they were stored, with the outcome they
    /// were stored with (`None`: stored pending, nothing decides them).
    ruled: &'a HashMap<i64, Option<Outcome>>,
}

/// Decides the calls just stored that a rule or a grant decides, in position order, with what a
/// human decision would bring along (a denial skips the rest of a SKIP_REST batch): writes what
/// follows from the outcome of those `ruled` stored decided, and rules on those not ruled on
/// yet. Records with each call what the shadow rules would have done with it, and adds those
/// verdicts to `shadow`.
async fn decide_by_policy(
    tx: &mut (impl WriteTx + PolicyTx),
    (rules, grants, requirement): (&[Rule], &[Grant], Option<&Requirement>),
    Arrived {
        accepted,
        prejudged,
        ruled,
    }: Arrived<'_>,
    texts: &ToolResultTexts,
    now: Timestamp,
    shadow: &mut Vec<ShadowVerdict>,
) -> Result<Vec<Resolved>> {
    let mut resolved = Vec::new();
    if accepted.is_empty() || (rules.is_empty() && grants.is_empty()) {
        return Ok(resolved);
    }
    let any_shadow = rules.iter().any(|rule| rule.mode == RuleMode::Shadow);
    for &(rowid, call) in accepted {
        if any_shadow {
            // Judged as the call arrived, whatever the enforced rules made of it and whether a
            // sibling's denial skips it: what the shadow rules would have done in their place.
            let subject = Subject::of_call(call).with_prejudged(prejudged.get(&rowid).copied());
            let verdicts = shadow_verdicts(&subject, rules, grants, now);
            tx.record_shadow_verdicts(rowid, &verdicts).await?;
            shadow.extend(verdicts);
        }
        let decided = match ruled.get(&rowid) {
            Some(Some(outcome)) => {
                let stored = call.clone().with_outcome(outcome.clone());
                let own = tx.record_outcome(rowid, &stored).await?;
                let skipped = brought_along(tx, call, outcome, texts, now).await?;
                Some((own, skipped))
            }
            Some(None) => None,
            None => {
                let call = (rowid, call, prejudged.get(&rowid).copied());
                decide_by_ruling(tx, call, requirement, (rules, grants), texts, now).await?
            }
        };
        if let Some((own, skipped)) = decided {
            resolved.push(own);
            resolved.extend(skipped);
        }
    }
    Ok(resolved)
}

fn key_of(batch: &NewBatch, call_id: &CallId) -> CallKey {
    CallKey {
        agent: batch.agent.clone(),
        session: batch.session.clone(),
        call_id: call_id.clone(),
    }
}

/// The answer for a submitted call whose identity is already stored.
fn existing(batch: &NewBatch, call: &NewCall, stored: Call) -> SubmitItem {
    let result = if call.is_same_request_as(&stored) {
        SubmitResult::Duplicate(stored)
    } else {
        SubmitResult::Refused(Error::AlreadyExists(format!(
            "call_id: call `{}` already exists in session `{}` with a different tool or input",
            call.call_id, batch.session
        )))
    };
    SubmitItem {
        index: call.index,
        call_id: call.call_id.clone(),
        result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{OnDeny, Status};
    use crate::operations::testing::{Db, batch, call, key, rule, shown_call, texts};

    /// Rules `ok-ls` (allow `ls`) and `no-rm` (deny `rm`).
    async fn allow_ls_deny_rm(tx: &mut impl PolicyTx) {
        tx.insert_rule(&rule("ok-ls", "ls", "allow")).await.unwrap();
        tx.insert_rule(&rule("no-rm", "rm", "deny")).await.unwrap();
    }

    fn accepted(item: &SubmitItem) -> &Call {
        match &item.result {
            SubmitResult::Accepted(call) => call,
            other => panic!("expected Accepted, got {other:?}"),
        }
    }

    fn refused(item: &SubmitItem) -> tonic::Code {
        match &item.result {
            SubmitResult::Refused(err) => err.code(),
            other => panic!("expected Refused, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn new_calls_are_stored_pending_in_one_batch_in_order() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let b = batch("s", [call("a", "t", "{}"), call("b", "t", "{}")]);
        let report = submit_in(&mut tx, &b, &texts(), Timestamp::now())
            .await
            .unwrap();
        let batch_id = report.batch_id.clone().expect("a batch was stored");
        for (i, item) in report.items.iter().enumerate() {
            let call = accepted(item);
            assert_eq!(call.status(), Status::Pending);
            assert_eq!((call.position, call.batch_size), (i as u32, 2));
            assert_eq!(call.batch_id, batch_id);
        }
        assert!(tx.find_call(&key("s", "b")).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn the_same_call_again_is_a_duplicate_and_stores_nothing_new() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let b = batch("s", [call("a", "t", r#"{"x":1}"#)]);
        submit_in(&mut tx, &b, &texts(), Timestamp::now())
            .await
            .unwrap();
        let again = submit_in(&mut tx, &b, &texts(), Timestamp::now())
            .await
            .unwrap();
        assert!(again.batch_id.is_none(), "nothing new, no batch");
        assert!(matches!(again.items[0].result, SubmitResult::Duplicate(_)));
    }

    #[tokio::test]
    async fn the_same_id_with_another_input_is_refused_for_that_call_alone() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        submit_in(
            &mut tx,
            &batch("s", [call("a", "t", r#"{"x":1}"#)]),
            &texts(),
            Timestamp::now(),
        )
        .await
        .unwrap();
        let b = batch("s", [call("a", "t", r#"{"x":2}"#), call("b", "t", "{}")]);
        let report = submit_in(&mut tx, &b, &texts(), Timestamp::now())
            .await
            .unwrap();
        assert_eq!(refused(&report.items[0]), tonic::Code::AlreadyExists);
        assert_eq!(accepted(&report.items[1]).batch_size, 1);
    }

    #[tokio::test]
    async fn a_new_call_whose_deadline_passed_is_refused() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let now = Timestamp::now();
        let mut late = call("a", "t", "{}");
        late.deadline = Some(Timestamp::from_micros(now.as_micros() - 1));
        let report = submit_in(&mut tx, &batch("s", [late]), &texts(), now)
            .await
            .unwrap();
        assert_eq!(refused(&report.items[0]), tonic::Code::InvalidArgument);
        assert!(report.batch_id.is_none());
    }

    #[tokio::test]
    async fn supersede_pending_supersedes_the_sessions_other_pending_calls() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let now = Timestamp::now();
        submit_in(
            &mut tx,
            &batch("s", [call("old", "t", "{}")]),
            &texts(),
            now,
        )
        .await
        .unwrap();
        let mut b = batch("s", [call("new", "t", "{}")]);
        b.supersede_pending = true;
        let report = submit_in(&mut tx, &b, &texts(), now).await.unwrap();
        assert_eq!(report.superseded.len(), 1);
        assert_eq!(
            report.superseded[0].status(),
            Status::Decided(OutcomeKind::Superseded)
        );
        assert_eq!(accepted(&report.items[0]).status(), Status::Pending);
    }

    #[tokio::test]
    async fn a_batch_that_stores_nothing_supersedes_nothing() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let now = Timestamp::now();
        let first = batch("s", [call("a", "t", "{}")]);
        submit_in(&mut tx, &first, &texts(), now).await.unwrap();
        let mut retry = first.clone();
        retry.supersede_pending = true;
        let report = submit_in(&mut tx, &retry, &texts(), now).await.unwrap();
        assert!(report.superseded.is_empty());
        let a = tx.find_call(&key("s", "a")).await.unwrap().unwrap();
        assert_eq!(a.call.status(), Status::Pending);
    }

    #[tokio::test]
    async fn a_supersede_key_supersedes_the_pending_call_with_that_key() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let now = Timestamp::now();
        let keyed = |id| NewCall {
            supersede_key: Some("k".into()),
            ..call(id, "t", "{}")
        };
        submit_in(&mut tx, &batch("s", [keyed("a")]), &texts(), now)
            .await
            .unwrap();
        let report = submit_in(&mut tx, &batch("s", [keyed("b")]), &texts(), now)
            .await
            .unwrap();
        let superseded: Vec<_> = report
            .superseded
            .iter()
            .map(|c| c.key.call_id.to_string())
            .collect();
        assert_eq!(superseded, ["a"]);
    }

    #[tokio::test]
    async fn calls_past_the_agents_pending_cap_are_refused_resource_exhausted() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let mut b = batch(
            "s",
            [
                call("a", "t", "{}"),
                call("b", "t", "{}"),
                call("c", "t", "{}"),
            ],
        );
        b.pending_cap = Some(2);
        let report = submit_in(&mut tx, &b, &texts(), Timestamp::now())
            .await
            .unwrap();
        accepted(&report.items[0]);
        accepted(&report.items[1]);
        assert_eq!(refused(&report.items[2]), tonic::Code::ResourceExhausted);
        assert_eq!(
            accepted(&report.items[0]).batch_size,
            2,
            "the batch holds what was stored"
        );
    }

    #[tokio::test]
    async fn a_rule_decides_at_submit_and_a_denial_skips_the_rest_of_the_batch() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        assert!(tx.insert_rule(&rule("no-rm", "rm", "deny")).await.unwrap());
        let b = batch("s", [call("a", "rm", "{}"), call("b", "ls", "{}")]);
        assert_eq!(b.on_deny, OnDeny::SkipRest);
        let report = submit_in(&mut tx, &b, &texts(), Timestamp::now())
            .await
            .unwrap();
        let a = accepted(&report.items[0]);
        assert_eq!(a.status(), Status::Decided(OutcomeKind::Denied));
        assert_eq!(
            a.outcome.as_ref().unwrap().decided_by,
            DecidedBy::Policy("no-rm".into())
        );
        assert_eq!(
            accepted(&report.items[1]).status(),
            Status::Decided(OutcomeKind::Skipped)
        );
    }

    #[tokio::test]
    async fn the_reply_of_a_call_decided_at_submit_is_the_call_as_a_read_gives_it() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        allow_ls_deny_rm(&mut tx).await;
        let now = Timestamp::now();
        let b = batch(
            "s",
            [
                NewCall {
                    supersede_key: Some("k".into()),
                    ..shown_call("a", "ls", now)
                },
                call("b", "rm", "{}"),
                call("c", "ls", "{}"),
            ],
        );
        let report = submit_in(&mut tx, &b, &texts(), now).await.unwrap();
        // a and b are stored decided (their replies built without a read), c is skipped by b's
        // denial (read back): each reply is the call as a read in the same transaction gives it,
        // field for field, its outcome's sequence number and who it acts for included.
        assert_eq!(report.items.len(), 3);
        assert_eq!(accepted(&report.items[0]).requested_by, "carol");
        for item in &report.items {
            let reply = accepted(item);
            assert!(
                reply.outcome.as_ref().is_some_and(|o| o.seq.is_some()),
                "{reply:?}"
            );
            let read = tx
                .find_call(&key("s", item.call_id.as_str()))
                .await
                .unwrap()
                .expect("stored")
                .call;
            assert_eq!(
                format!("{reply:?}"),
                format!("{read:?}"),
                "{}",
                item.call_id
            );
        }
        tx.commit().await.unwrap();
    }

    /// A call a rule decides as it arrives is stored decided: it never passes through pending
    /// (whose indexes it would enter and leave in the same commit). Those after a denial that
    /// skips the rest of the batch are stored pending and skipped, as before: what a human's
    /// denial of that call would do.
    #[tokio::test]
    async fn calls_a_rule_decides_are_stored_decided_up_to_a_denial_that_skips_the_rest() {
        let db = Db::new().await;
        db.execute_batch(
            "CREATE TABLE status_updates (call_id TEXT); \
             CREATE TRIGGER status_updated AFTER UPDATE OF status ON calls \
             BEGIN INSERT INTO status_updates VALUES (NEW.call_id); END;",
        );
        let mut tx = db.tx().await;
        allow_ls_deny_rm(&mut tx).await;
        let b = batch(
            "s",
            [
                call("a", "ls", "{}"),
                call("b", "rm", "{}"),
                call("c", "ls", "{}"),
                call("d", "cat", "{}"),
            ],
        );
        let report = submit_in(&mut tx, &b, &texts(), Timestamp::now())
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let statuses: Vec<_> = report.items.iter().map(|i| accepted(i).status()).collect();
        use OutcomeKind::*;
        assert_eq!(
            statuses,
            [Approved, Denied, Skipped, Skipped].map(Status::Decided)
        );
        assert_eq!(
            db.texts("SELECT call_id FROM status_updates ORDER BY call_id"),
            ["c", "d"],
            "a and b are stored decided; c and d pending, then skipped by b's denial"
        );
        let events = db.texts(
            "SELECT c.call_id || ':' || e.kind FROM events e JOIN calls c ON c.id = e.call_rowid \
             ORDER BY e.seq",
        );
        assert_eq!(
            events,
            ["a:1", "b:1", "c:1", "d:1", "a:2", "b:2", "c:2", "d:2"],
            "every call's Requested event, then their Resolved events, in position order"
        );
    }

    /// The receipt of a call stored decided attests the call exactly as it is stored: its
    /// payload is the one a read of the stored call gives, link for link (it is built from the
    /// call in memory, not read back).
    #[tokio::test]
    async fn the_receipt_of_a_call_stored_decided_attests_the_call_as_stored() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        allow_ls_deny_rm(&mut tx).await;
        let now = Timestamp::now();
        let mut b = batch(
            "s",
            [shown_call("a", "ls", now), shown_call("b", "rm", now)],
        );
        b.on_deny = OnDeny::Independent;
        submit_in(&mut tx, &b, &texts(), now).await.unwrap();
        tx.commit().await.unwrap();

        db.assert_receipts_attest("s", &["a", "b"]).await;
    }

    /// An approval of the input as submitted is stored without its input to run (on SQLite; see
    /// `primitives::outcome_params`), and reads back as running the call's own input.
    #[tokio::test]
    async fn an_approval_stored_without_its_input_to_run_runs_the_calls_own_input() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        tx.insert_rule(&rule("ok-ls", "ls", "allow")).await.unwrap();
        let b = batch("s", [call("a", "ls", r#"{"path":"/tmp"}"#)]);
        submit_in(&mut tx, &b, &texts(), Timestamp::now())
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            db.texts("SELECT COALESCE(run_input, 'none') FROM calls"),
            ["none"],
            "the input is stored once"
        );
        let mut tx = db.tx().await;
        let stored = tx.find_call(&key("s", "a")).await.unwrap().unwrap().call;
        let outcome = stored.outcome.unwrap();
        assert_eq!(outcome.run_input, Some(stored.input));
        assert!(!outcome.input_edited);
        drop(tx);

        // Going back to a binary that needs it stored (docs/data-lifecycle.md) stores it again.
        db.execute_batch(crate::store::sqlite::GOING_BACK_BEFORE_0014);
        assert_eq!(
            db.texts("SELECT COALESCE(run_input, 'none') FROM calls"),
            [r#"{"path":"/tmp"}"#]
        );
    }

    /// A call that a later call of its own batch supersedes by key is superseded, even if a
    /// rule would approve it: it is stored pending for the later call to find.
    #[tokio::test]
    async fn a_call_superseded_by_a_later_one_of_its_batch_is_superseded_not_approved() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        tx.insert_rule(&rule("ok-ls", "ls", "allow")).await.unwrap();
        let keyed = |id| NewCall {
            supersede_key: Some("k".into()),
            ..call(id, "ls", "{}")
        };
        let report = submit_in(
            &mut tx,
            &batch("s", [keyed("a"), keyed("b")]),
            &texts(),
            Timestamp::now(),
        )
        .await
        .unwrap();
        assert_eq!(
            accepted(&report.items[0]).status(),
            Status::Decided(OutcomeKind::Superseded)
        );
        assert_eq!(
            accepted(&report.items[1]).status(),
            Status::Decided(OutcomeKind::Approved)
        );
    }

    #[tokio::test]
    async fn with_independent_calls_a_denial_leaves_the_siblings_pending() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        tx.insert_rule(&rule("no-rm", "rm", "deny")).await.unwrap();
        let mut b = batch("s", [call("a", "rm", "{}"), call("b", "ls", "{}")]);
        b.on_deny = OnDeny::Independent;
        let report = submit_in(&mut tx, &b, &texts(), Timestamp::now())
            .await
            .unwrap();
        assert_eq!(accepted(&report.items[1]).status(), Status::Pending);
    }
}
