//! Decide: an approver's verdict on a pending call. The first decision wins; repeating it
//! returns the outcome that stands, contradicting it is refused naming that outcome. A denial
//! skips the rest of a SKIP_REST batch; a decision remembered with a scope creates a grant and
//! decides, in the same transaction, the pending calls that grant covers.
//!
//! A call with a requirement (fixed at submit, see [`routing`](super::routing)) is decided only
//! by approvers it admits, never approved by who submitted it, and counts votes: a vote that does not complete
//! it is recorded and leaves it pending (no grant, nothing skipped); the vote that completes it
//! decides it as above, naming every approver who agreed. Where the requirement asks for
//! `step_up: passkey`, an approving vote counts only with a passkey assertion checked here, in
//! this transaction ([`passkeys::check_step_up`](super::passkeys::check_step_up)), and the
//! receipt of the approval carries every such assertion.

use std::collections::HashMap;
use std::time::Instant;

use super::ruling::{decide_by_ruling, skip_rest_of_batch};
use super::tx::{PolicyTx, Resolved, Stored, WriteTx, batches_of, complete_batches, tools_of};
use crate::domain::passkey::SignedApproval;
use crate::domain::policy::Tally;
use crate::domain::policy::{
    Effect, Gate, Grant, GrantScope, GrantSpec, Matcher, Person, Prejudged, Remember, Scope,
    Subject, Vote,
};
use crate::domain::{
    Call, CallKey, DecideReport, DecidedBy, Decision, Kind, OnDeny, Outcome, OutcomeKind,
    Timestamp, ToolName, ToolResultTexts, Verdict,
};
use crate::error::{Error, Result};
use crate::observe::meters;

/// Writes an approver's decision and commits.
pub async fn decide(
    mut tx: impl WriteTx + PolicyTx,
    key: &CallKey,
    decision: &Decision,
    texts: &ToolResultTexts,
) -> Result<DecideReport> {
    let started = Instant::now();
    let report = decide_in(&mut tx, key, decision, texts, Timestamp::now()).await?;
    tx.commit().await?;
    meters::committed(1, started.elapsed());
    Ok(report)
}

pub async fn decide_in(
    tx: &mut (impl WriteTx + PolicyTx),
    key: &CallKey,
    decision: &Decision,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<DecideReport> {
    // A decision that creates no grant locks no policy and no batch but the call's own: it
    // locks that as it reads the call (one statement where there are locks). One that creates
    // a grant locks the policy first (the lock order), then every batch it will resolve in.
    let batch_locked = decision.remember.is_none();
    let found = if batch_locked {
        tx.find_call_locking_batch(key).await?
    } else {
        tx.find_call(key).await?
    };
    let Some(Stored { rowid, call }) = found else {
        return Err(key.not_found());
    };
    let decision = &*decision.against(&call.input);
    // A call this approver may not see does not exist for them: the answer an unknown call gets.
    if !call.visible_to(&decision.viewer) {
        return Err(key.not_found());
    }
    // The call's gate: no self-approval, groups, no edit where several must approve, a
    // passkey assertion where the requirement asks for one. Before anything is read or written.
    Gate::of(&call).admit_decision(decision)?;
    let mut grant = decision
        .remember
        .as_ref()
        .map(|remember| grant_spec(&call, decision, remember, now))
        .transpose()?;
    if let Some(spec) = &grant {
        let host_calls = spec.kind.map(|_| super::tx::host_calls());
        let tools: Vec<&ToolName> = std::iter::once(&call.tool).chain(host_calls).collect();
        tx.lock_policy(&call.key.agent, &tools, true).await?;
    }
    let mut outcome = approver_outcome(&call, decision, texts, now);
    // The call as its receipt attests it: for a step-up call, with the votes that decided it.
    let mut signed_call = std::borrow::Cow::Borrowed(&call);
    if call.outcome.is_none()
        && let Some(deadline) = call.deadline
        && deadline <= now
    {
        // Too late: the call expires (the sweeper writes that within a second), and no
        // decision may win the race against its deadline.
        return Err(Error::FailedPrecondition(
            "the call's deadline has passed; it is EXPIRED (decided by deadline)".into(),
        ));
    }
    let won = match &call.outcome {
        Some(_) => None,
        None => {
            // The pending calls the new grant covers are decided in this transaction too: lock
            // their batches with the call's own, all at once.
            let covered = match &grant {
                Some(spec) => pending_covered_by(tx, spec, &decision.prejudged, rowid, now).await?,
                None => Vec::new(),
            };
            if !batch_locked {
                tx.lock_batches(&batches_of(
                    std::iter::once(&call).chain(covered.iter().map(|c| &c.call)),
                ))
                .await?;
            }
            // A step-up approval's assertion, checked before it may count (its challenge is
            // taken in this transaction, so it signs this one vote).
            let signed = if super::passkeys::needs_passkey(&call, decision) {
                Some(super::passkeys::check_step_up(tx, &call, decision, now).await?)
            } else {
                None
            };
            if call.approval.is_some() {
                match vote(tx, rowid, decision, signed, now).await? {
                    Voted::Resolve {
                        by,
                        votes,
                        signed_votes,
                    } => {
                        outcome.decided_by = by;
                        // The receipt attests the signed votes that decided the call.
                        if let Some(signed_votes) = signed_votes
                            && let Some(approval) = &mut signed_call.to_mut().approval
                        {
                            approval.votes = signed_votes;
                        }
                        if let (Some(spec), Some(remember)) = (&mut grant, &decision.remember)
                            && !votes.is_empty()
                        {
                            spec.authors = authors_of(&votes, decision, remember);
                        }
                    }
                    Voted::Pending { call, repeated } => {
                        // Not complete: nothing is decided, skipped or remembered yet.
                        return Ok(DecideReport {
                            call: *call,
                            replayed: repeated,
                            skipped: Vec::new(),
                            grant: None,
                            decided_by_grant: Vec::new(),
                            grant_note: None,
                        });
                    }
                }
            }
            // An approval without a grant resolves nothing after this call.
            let last_in_batch = approves_only(decision);
            tx.resolve_read(rowid, &signed_call, &outcome, last_in_batch)
                .await?
                .map(|won| (won, covered))
        }
    };
    let Some((won, covered)) = won else {
        // Decided before (or by a transaction that committed while this one waited).
        let standing = tx.load_call(rowid).await?;
        if let Some(outcome) = &standing.outcome {
            decision.check_against(outcome, &standing.input)?;
        }
        return Ok(DecideReport {
            call: standing,
            replayed: true,
            skipped: Vec::new(),
            grant: tx.grant_from_call(key).await?,
            decided_by_grant: Vec::new(),
            grant_note: None,
        });
    };

    let decided_seq = won.seq;
    let mut resolved = vec![won];
    let mut skipped = Vec::new();
    if decision.verdict == Verdict::Deny && tx.on_deny(&call.batch_id).await? == OnDeny::SkipRest {
        let siblings = skip_rest_of_batch(tx, &call.batch_id, texts, now).await?;
        skipped.extend(siblings.iter().map(|r| r.rowid));
        resolved.extend(siblings);
    }
    let mut created = None;
    let mut decided_by_grant = Vec::new();
    let mut grant_note = None;
    if let Some(spec) = grant {
        let grant = tx.insert_grant(&spec).await?;
        grant_note = Gate::of(&call).admits_grant(&spec).err().map(|why| {
            format!(
                "grant {} is kept, but cannot decide calls like this one: {why}; it decides \
                 only the calls its authors could decide themselves",
                grant.id
            )
        });
        let (decided, also_skipped) = decide_covered(
            tx,
            &grant,
            covered,
            &decision.prejudged,
            texts,
            now,
            &mut resolved,
        )
        .await?;
        decided_by_grant = decided;
        skipped.extend(also_skipped);
        created = Some(grant);
    }
    complete_batches(tx, &resolved).await?;
    let call = if call.escalation.is_none() && call.approval.is_none() {
        // Once stored, a call without a ladder or a requirement changes only by its outcome (its
        // ladder and requirement are set in the submit's transaction; steps and votes are
        // written only where there are some), and this transaction just wrote that: the call
        // as decided is the one read at the start with this outcome, not a read back.
        call.with_outcome(Outcome {
            seq: decided_seq,
            receipt: None,
            ..outcome
        })
    } else {
        tx.load_call(rowid).await?
    };
    let mut report = DecideReport {
        call,
        replayed: false,
        skipped: Vec::with_capacity(skipped.len()),
        grant: created,
        decided_by_grant: Vec::with_capacity(decided_by_grant.len()),
        grant_note,
    };
    for rowid in skipped {
        report.skipped.push(tx.load_call(rowid).await?);
    }
    for rowid in decided_by_grant {
        report.decided_by_grant.push(tx.load_call(rowid).await?);
    }
    Ok(report)
}

/// What `decision` would do now, without doing it: [`decide_in`] itself, in `tx`, which is
/// dropped (rolled back) and never committed, so the preview cannot drift from the decision:
/// the same gate, the same grant, the same evaluation of the pending calls it covers (a rule
/// that outranks the grant still wins). Its report lists the pending calls the grant would
/// decide now (`decided_by_grant`) and those it would skip. A grant's id in it was never kept.
pub async fn preview(
    mut tx: impl WriteTx + PolicyTx,
    key: &CallKey,
    decision: &Decision,
    texts: &ToolResultTexts,
) -> Result<DecideReport> {
    let report = decide_in(&mut tx, key, decision, texts, Timestamp::now()).await;
    // Never committed: dropping the transaction rolls back everything `decide_in` wrote.
    drop(tx);
    report
}

/// Whether `decision` writes nothing but its own call's outcome, whatever call it decides: an
/// approval that remembers nothing (a denial may skip the rest of its batch; a grant decides the
/// calls it covers). Postgres writes such a decision in one statement, where the call needs none
/// of [`decide_in`]'s other checks (see `store::PostgresStore`'s `approve_at_once`).
pub fn approves_only(decision: &Decision) -> bool {
    decision.verdict == Verdict::Approve
        && decision.remember.is_none()
        && decision.passkey.is_none()
}

/// `call`, read pending, with the outcome an [`approves_only`] decision written outside
/// [`decide_in`] at `now` gave it.
pub fn approved(call: Call, decision: &Decision, texts: &ToolResultTexts, now: Timestamp) -> Call {
    let outcome = approver_outcome(&call, decision, texts, now);
    call.with_outcome(outcome)
}

/// The outcome an approver's decision writes.
fn approver_outcome(
    call: &Call,
    decision: &Decision,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Outcome {
    let by = DecidedBy::Approver(decision.approver.clone());
    match decision.verdict {
        Verdict::Approve => Outcome {
            kind: OutcomeKind::Approved,
            decided_at: now,
            decided_by: by,
            reason: decision.reason.clone(),
            tool_result: String::new(),
            run_input: Some(
                decision
                    .edited_input
                    .clone()
                    .unwrap_or_else(|| call.input.clone()),
            ),
            input_edited: decision.edited_input.is_some(),
            seq: None,
            receipt: None,
        },
        Verdict::Deny if decision.responds => Outcome {
            tool_result: ToolResultTexts::responded(&decision.reason),
            ..texts.outcome(OutcomeKind::Denied, by, &decision.reason, now)
        },
        Verdict::Deny => texts.outcome(OutcomeKind::Denied, by, &decision.reason, now),
    }
}

/// The grant a decision asks to remember, for the call it decides.
fn grant_spec(
    call: &Call,
    decision: &Decision,
    remember: &Remember,
    now: Timestamp,
) -> Result<GrantSpec> {
    let scope = match remember.scope {
        Scope::Session => GrantScope::Session(call.key.session.clone()),
        Scope::Workspace if call.workspace.is_empty() => {
            return Err(Error::invalid(
                "scope",
                format!(
                    "SCOPE_WORKSPACE needs a call with a workspace; call `{}` has none",
                    call.key.call_id
                ),
            ));
        }
        Scope::Workspace => GrantScope::Workspace(call.workspace.clone()),
        Scope::Always => GrantScope::Always,
        Scope::Once => return Err(Error::Internal("a ONCE decision has no grant".into())),
    };
    // A host's call of a common kind is remembered as that action, so the decision holds for
    // the same action asked by another host's tool (docs/hosts.md); any other call, as its tool
    // and input. Either way the default is exactly what was decided.
    let (kind, exact) = match &call.action {
        Some(action) if action.kind != Kind::Other => (Some(action.kind), &action.fields),
        _ => (None, &call.input),
    };
    Ok(GrantSpec {
        agent: call.key.agent.clone(),
        scope,
        tool: call.tool.clone(),
        kind,
        matcher: remember
            .matcher
            .clone()
            .unwrap_or_else(|| Matcher::Exact(exact.clone())),
        effect: match decision.verdict {
            Verdict::Approve => Effect::Allow,
            Verdict::Deny => Effect::Deny,
        },
        created_by: DecidedBy::Approver(decision.approver.clone()).to_string(),
        authors: match &call.approval {
            // Predicted from the votes read so far; set from the votes counted under the
            // call's lock once the vote completes the call.
            Some(approval) => {
                let mut votes: Vec<Vote> = approval.votes.clone();
                votes.push(Vote::new(decision, now));
                authors_of(&votes, decision, remember)
            }
            None => vec![decision.person()],
        },
        created_at: now,
        expires_at: remember.expires_in.map(|d| now.saturating_add(d)),
        source: call.key.clone(),
        reason: decision.reason.clone(),
    })
}

/// A grant's authors, from the votes that decided its call: the voters who asked to remember
/// the same thing as `remember` with the same verdict (a vote that remembers nothing, or
/// something else, makes nobody an author of this grant).
fn authors_of(votes: &[Vote], decision: &Decision, remember: &Remember) -> Vec<Person> {
    let key = remember.key();
    let mut authors: Vec<Person> = Vec::new();
    for vote in votes {
        if vote.verdict() == decision.verdict
            && vote.remember.as_deref() == Some(key.as_str())
            && !authors.iter().any(|a| a.identity.is(&vote.approver))
        {
            authors.push(vote.person());
        }
    }
    authors
}

/// The pending calls (other than `except`) a grant about to be created covers, still before
/// their deadline.
async fn pending_covered_by(
    tx: &mut (impl WriteTx + PolicyTx),
    spec: &GrantSpec,
    prejudged: &HashMap<CallKey, Prejudged>,
    except: i64,
    now: Timestamp,
) -> Result<Vec<Stored>> {
    let pending = tx
        .pending_in_scope(
            &spec.agent,
            spec.kind.is_none().then_some(&spec.tool),
            &spec.scope,
        )
        .await?;
    Ok(pending
        .into_iter()
        .filter(|p| p.rowid != except)
        // The gate: the grant decides only what its authors could have decided themselves.
        .filter(|p| Gate::of(&p.call).admits_grant(spec).is_ok())
        .filter(|p| p.call.deadline.is_none_or(|d| d > now))
        .filter(|p| {
            spec.covers(&Subject::of_call(&p.call).with_prejudged(prejudged.get(&p.call.key)))
        })
        .collect())
}

/// Decides, by the one `evaluate` (so a rule that outranks the new grant still wins), the
/// pending calls `grant` covers, oldest first; a denial skips the rest of a SKIP_REST batch.
/// Returns the row ids decided, and those skipped.
async fn decide_covered(
    tx: &mut (impl WriteTx + PolicyTx),
    grant: &Grant,
    covered: Vec<Stored>,
    prejudged: &HashMap<CallKey, Prejudged>,
    texts: &ToolResultTexts,
    now: Timestamp,
    resolved: &mut Vec<Resolved>,
) -> Result<(Vec<i64>, Vec<i64>)> {
    let (mut decided, mut skipped) = (Vec::new(), Vec::new());
    if covered.is_empty() {
        return Ok((decided, skipped));
    }
    let rules = tx.rules().await?;
    // The grants of every covered call's tool: a grant of an action kind covers calls of other
    // tools, whose own grants (a denial, say) still come first.
    let tools = tools_of(
        covered
            .iter()
            .map(|s| &s.call.tool)
            .chain([&grant.spec.tool]),
    );
    let grants = tx.live_grants(&grant.spec.agent, None, &tools, now).await?;
    for Stored { rowid, call } in covered {
        let requirement = call.approval.as_ref().map(|a| &a.requirement);
        if let Some((own, siblings)) = decide_by_ruling(
            tx,
            (rowid, &call, prejudged.get(&call.key)),
            requirement,
            (&rules, &grants),
            texts,
            now,
        )
        .await?
        {
            resolved.push(own);
            decided.push(rowid);
            skipped.extend(siblings.iter().map(|r| r.rowid));
            resolved.extend(siblings);
        }
    }
    Ok((decided, skipped))
}

/// What a vote did.
enum Voted {
    /// The call is to be resolved (the vote completes it, or needs no count), naming these
    /// deciders; or it was decided meanwhile, which resolving finds out. `votes`: the votes of
    /// the deciding verdict, in the order they were cast (empty: decided alone, no count).
    /// `signed_votes`: for a call whose approvals are passkey-signed, every vote as now
    /// recorded (the receipt carries the assertions).
    Resolve {
        by: DecidedBy,
        votes: Vec<Vote>,
        signed_votes: Option<Vec<Vote>>,
    },
    /// The call stays pending, with the votes so far; `repeated`: this vote was recorded before.
    Pending { call: Box<Call>, repeated: bool },
}

/// Counts `decision` as a vote on call `rowid` (with `signed`, the passkey assertion checked
/// for it). Runs under the call's batch lock: the call is read again here, so the votes counted
/// are every vote committed before.
async fn vote(
    tx: &mut impl WriteTx,
    rowid: i64,
    decision: &Decision,
    signed: Option<SignedApproval>,
    now: Timestamp,
) -> Result<Voted> {
    let mut call = tx.load_call(rowid).await?;
    let alone = || Voted::Resolve {
        by: DecidedBy::Approver(decision.approver.clone()),
        votes: Vec::new(),
        signed_votes: None,
    };
    let (Some(approval), None) = (&mut call.approval, &call.outcome) else {
        return Ok(alone());
    };
    let vote = Vote {
        passkey: signed,
        ..Vote::new(decision, now)
    };
    match approval.tally(vote)? {
        Tally::Repeated => Ok(Voted::Pending {
            call: Box::new(call),
            repeated: true,
        }),
        Tally::Recorded => {
            tx.record_votes(rowid, approval, now, true).await?;
            Ok(Voted::Pending {
                call: Box::new(call),
                repeated: false,
            })
        }
        Tally::Decides(verdict, approvers) => {
            // Kept for the audit; the Resolved event announces it.
            tx.record_votes(rowid, approval, now, false).await?;
            let votes = approval
                .votes
                .iter()
                .filter(|v| v.verdict() == verdict)
                .cloned()
                .collect();
            Ok(Voted::Resolve {
                by: DecidedBy::Approver(approvers.join(",")),
                votes,
                signed_votes: approval
                    .requirement
                    .needs_passkey()
                    .then(|| approval.votes.clone()),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::policy::Approvers;
    use crate::domain::{Status, ToolInput};
    use crate::operations::submit::submit_in;
    use crate::operations::testing::{Db, batch, call, decision, key, texts};

    /// A transaction holding session `s`'s batch of calls `ids` of tool `t`, pending.
    async fn pending(db: &Db, ids: &[&str]) -> impl WriteTx + PolicyTx + use<> {
        let mut tx = db.tx().await;
        let calls = ids.iter().map(|id| call(id, "t", "{}"));
        submit_in(&mut tx, &batch("s", calls), &texts(), Timestamp::now())
            .await
            .unwrap();
        tx
    }

    #[tokio::test]
    async fn an_unknown_call_is_not_found() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let d = decision(Verdict::Approve, "");
        let err = decide_in(&mut tx, &key("s", "nope"), &d, &texts(), Timestamp::now())
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
    }

    /// The receipt of a decision is built from the call as read before its outcome was written
    /// (not read back): it attests the call as stored, with the outcome, link for link.
    #[tokio::test]
    async fn the_receipt_of_a_decision_attests_the_call_as_stored() {
        use crate::operations::testing::shown_call;
        let db = Db::new().await;
        let now = Timestamp::now();
        let mut tx = db.tx().await;
        let mut b = batch("s", [shown_call("a", "t", now), shown_call("b", "t", now)]);
        b.on_deny = OnDeny::Independent;
        submit_in(&mut tx, &b, &texts(), now).await.unwrap();
        tx.commit().await.unwrap();
        let mut tx = db.tx().await;
        let mut edited = decision(Verdict::Approve, "fine");
        edited.edited_input = Some(ToolInput::from_stored(r#"{"path":"/w"}"#.into()));
        decide_in(&mut tx, &key("s", "a"), &edited, &texts(), now)
            .await
            .unwrap();
        let deny = decision(Verdict::Deny, "no");
        decide_in(&mut tx, &key("s", "b"), &deny, &texts(), now)
            .await
            .unwrap();
        tx.commit().await.unwrap();

        db.assert_receipts_attest("s", &["a", "b"]).await;
    }

    /// A decision answers with the call as decided without reading it back: exactly what a
    /// read of it then gives, field for field (approved, approved with an edited input, denied),
    /// down to its Resolved event's sequence number.
    #[tokio::test]
    async fn a_decision_answers_with_the_call_exactly_as_a_read_of_it_gives() {
        use crate::operations::testing::shown_call;
        let db = Db::new().await;
        let now = Timestamp::now();
        let mut tx = db.tx().await;
        let ids = ["approved", "edited", "denied"];
        let mut b = batch("s", ids.map(|id| shown_call(id, "t", now)));
        b.on_deny = OnDeny::Independent;
        submit_in(&mut tx, &b, &texts(), now).await.unwrap();
        tx.commit().await.unwrap();

        let mut edited = decision(Verdict::Approve, "fine");
        edited.edited_input = Some(ToolInput::from_stored(r#"{"path":"/w"}"#.into()));
        let decisions = [
            decision(Verdict::Approve, "ok"),
            edited,
            decision(Verdict::Deny, "no"),
        ];
        for (id, d) in ids.iter().zip(&decisions) {
            let mut tx = db.tx().await;
            let report = decide_in(&mut tx, &key("s", id), d, &texts(), now)
                .await
                .unwrap();
            let read = tx.find_call(&key("s", id)).await.unwrap().unwrap().call;
            assert!(report.call.outcome.as_ref().unwrap().seq.is_some(), "{id}");
            assert_eq!(format!("{:?}", report.call), format!("{read:?}"), "{id}");
            tx.commit().await.unwrap();
        }
    }

    #[tokio::test]
    async fn the_first_decision_wins_and_repeating_it_is_replayed() {
        let db = Db::new().await;
        let mut tx = pending(&db, &["a"]).await;
        let d = decision(Verdict::Approve, "ok");
        let now = Timestamp::now();
        let first = decide_in(&mut tx, &key("s", "a"), &d, &texts(), now)
            .await
            .unwrap();
        assert!(!first.replayed);
        assert_eq!(first.call.status(), Status::Decided(OutcomeKind::Approved));
        let again = decide_in(&mut tx, &key("s", "a"), &d, &texts(), now)
            .await
            .unwrap();
        assert!(again.replayed);
        assert_eq!(again.call.outcome, first.call.outcome);
    }

    #[tokio::test]
    async fn a_conflicting_decision_is_refused_naming_the_outcome_that_stands() {
        let db = Db::new().await;
        let mut tx = pending(&db, &["a"]).await;
        let now = Timestamp::now();
        let approve = decision(Verdict::Approve, "");
        decide_in(&mut tx, &key("s", "a"), &approve, &texts(), now)
            .await
            .unwrap();
        let deny = decision(Verdict::Deny, "no");
        let err = decide_in(&mut tx, &key("s", "a"), &deny, &texts(), now)
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.to_string().contains("APPROVED"), "{err}");
    }

    #[tokio::test]
    async fn an_edited_approval_runs_the_edited_input() {
        let db = Db::new().await;
        let mut tx = pending(&db, &["a"]).await;
        let edited = ToolInput::from_stored(r#"{"safe":true}"#.into());
        let d = Decision {
            edited_input: Some(edited.clone()),
            ..decision(Verdict::Approve, "")
        };
        let report = decide_in(&mut tx, &key("s", "a"), &d, &texts(), Timestamp::now())
            .await
            .unwrap();
        let outcome = report.call.outcome.unwrap();
        assert_eq!(outcome.run_input, Some(edited));
        assert!(outcome.input_edited);
    }

    #[tokio::test]
    async fn a_response_is_a_denial_whose_tool_result_carries_the_message() {
        let db = Db::new().await;
        let mut tx = pending(&db, &["a", "b"]).await;
        let respond = Decision {
            responds: true,
            ..decision(Verdict::Deny, "run the tests first")
        };
        let now = Timestamp::now();
        let report = decide_in(&mut tx, &key("s", "a"), &respond, &texts(), now)
            .await
            .unwrap();
        let outcome = report.call.outcome.unwrap();
        assert_eq!(outcome.kind, OutcomeKind::Denied);
        assert!(outcome.responded());
        assert_eq!(outcome.run_input, None);
        assert_eq!(
            outcome.tool_result,
            "The user did not run this tool call and answered instead: \"run the tests first\""
        );
        // The same response again is a repeat; a plain denial is not the answer that stands.
        let again = decide_in(&mut tx, &key("s", "a"), &respond, &texts(), now)
            .await
            .unwrap();
        assert!(again.replayed);
        let deny = decision(Verdict::Deny, "run the tests first");
        let err = decide_in(&mut tx, &key("s", "a"), &deny, &texts(), now)
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.to_string().contains("a response to the model"), "{err}");
    }

    #[tokio::test]
    async fn a_denial_skips_the_pending_rest_of_its_batch() {
        let db = Db::new().await;
        let mut tx = pending(&db, &["a", "b", "c"]).await;
        let d = decision(Verdict::Deny, "no");
        let report = decide_in(&mut tx, &key("s", "b"), &d, &texts(), Timestamp::now())
            .await
            .unwrap();
        let skipped: Vec<_> = report
            .skipped
            .iter()
            .map(|c| c.key.call_id.to_string())
            .collect();
        assert_eq!(skipped, ["a", "c"]);
        assert!(
            report
                .skipped
                .iter()
                .all(|c| c.status() == Status::Decided(OutcomeKind::Skipped))
        );
    }

    #[tokio::test]
    async fn a_decision_after_the_deadline_is_refused() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let now = Timestamp::now();
        let mut due = call("a", "t", "{}");
        due.deadline = Some(Timestamp::from_micros(now.as_micros() + 1_000));
        submit_in(&mut tx, &batch("s", [due]), &texts(), now)
            .await
            .unwrap();
        let later = Timestamp::from_micros(now.as_micros() + 2_000);
        let d = decision(Verdict::Approve, "");
        let err = decide_in(&mut tx, &key("s", "a"), &d, &texts(), later)
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    }

    #[tokio::test]
    async fn a_remembered_approval_creates_a_grant_that_decides_the_pending_calls_it_covers() {
        let db = Db::new().await;
        let mut tx = pending(&db, &["a"]).await;
        let now = Timestamp::now();
        // Another batch of the session, the same tool and input: the grant covers it.
        submit_in(&mut tx, &batch("s", [call("b", "t", "{}")]), &texts(), now)
            .await
            .unwrap();
        let d = Decision {
            remember: Some(Remember {
                scope: Scope::Session,
                matcher: None,
                expires_in: None,
            }),
            ..decision(Verdict::Approve, "")
        };
        let report = decide_in(&mut tx, &key("s", "a"), &d, &texts(), now)
            .await
            .unwrap();
        let grant = report.grant.expect("a grant");
        assert_eq!(
            grant.spec.scope,
            GrantScope::Session(crate::domain::SessionId::from_stored("s".into()))
        );
        let by_grant: Vec<_> = report
            .decided_by_grant
            .iter()
            .map(|c| {
                (
                    c.key.call_id.to_string(),
                    c.outcome.as_ref().unwrap().decided_by.clone(),
                )
            })
            .collect();
        assert_eq!(by_grant, [("b".to_owned(), DecidedBy::Grant(grant.id))]);
    }

    #[tokio::test]
    async fn a_call_needing_two_approvals_waits_for_the_second_which_alone_remembers() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        let mut two = batch("s", [call("a", "t", "{}")]);
        two.default_approvers = Some(Approvers {
            quorum: 2,
            ..Approvers::default()
        });
        let now = Timestamp::now();
        submit_in(&mut tx, &two, &texts(), now).await.unwrap();
        let by = |approver: &str| Decision {
            approver: approver.into(),
            remember: Some(Remember {
                scope: Scope::Session,
                matcher: None,
                expires_in: None,
            }),
            ..decision(Verdict::Approve, "")
        };
        let first = decide_in(&mut tx, &key("s", "a"), &by("alice"), &texts(), now)
            .await
            .unwrap();
        assert!(first.call.outcome.is_none());
        assert!(
            first.grant.is_none(),
            "a partial approval remembers nothing"
        );
        let approval = first.call.approval.as_ref().unwrap();
        assert_eq!(approval.progress(), "1 of 2 approvals");
        let second = decide_in(&mut tx, &key("s", "a"), &by("bob"), &texts(), now)
            .await
            .unwrap();
        let outcome = second.call.outcome.unwrap();
        assert_eq!(outcome.kind, OutcomeKind::Approved);
        assert_eq!(outcome.decided_by.to_string(), "approver:alice,bob");
        assert!(second.grant.is_some(), "the completing approval remembers");
    }

    #[tokio::test]
    async fn the_agent_that_submitted_a_call_cannot_approve_it_but_may_deny_it() {
        let db = Db::new().await;
        let mut tx = pending(&db, &["a", "b"]).await;
        let agent = key("s", "a").agent.to_string();
        let own = Decision {
            approver: agent.clone(),
            ..decision(Verdict::Approve, "")
        };
        let err = decide_in(&mut tx, &key("s", "a"), &own, &texts(), Timestamp::now())
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        let withdraw = Decision {
            approver: agent,
            ..decision(Verdict::Deny, "")
        };
        let report = decide_in(
            &mut tx,
            &key("s", "b"),
            &withdraw,
            &texts(),
            Timestamp::now(),
        )
        .await
        .unwrap();
        assert_eq!(report.call.status(), Status::Decided(OutcomeKind::Denied));
    }

    #[tokio::test]
    async fn a_workspace_grant_for_a_call_without_a_workspace_is_refused() {
        let db = Db::new().await;
        let mut tx = pending(&db, &["a"]).await;
        let d = Decision {
            remember: Some(Remember {
                scope: Scope::Workspace,
                matcher: None,
                expires_in: None,
            }),
            ..decision(Verdict::Approve, "")
        };
        let err = decide_in(&mut tx, &key("s", "a"), &d, &texts(), Timestamp::now())
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.to_string().contains("scope"), "{err}");
    }
}
