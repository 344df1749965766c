//! Routing: who may decide a call, and how many must agree (see
//! [`Approvers`](crate::domain::policy::Approvers)).
//!
//! The requirement is fixed when a call is submitted, from the ask rule that sends it to people
//! (or the broker's default), and stored with the call: editing or deleting the rule later
//! never changes what a pending call needs. Decide asks [`check_approver`] before anything else,
//! then counts the vote with [`vote`] under the call's batch lock, so two transactions (or
//! replicas) racing the last approval against a denial have one winner: whichever takes the
//! lock second reads the first one's vote or outcome.

use super::tx::WriteTx;
use crate::domain::passkey::SignedApproval;
use crate::domain::policy::{Approval, Approvers, Gate, Requirement, Rule, Ruling, Tally, Vote};
use crate::domain::policy::{Prejudged, Subject, evaluate};
use crate::domain::{Call, DecidedBy, Decision, Timestamp};
use crate::error::Result;

/// The requirement a call that `ruling` sends to people gets: its ask rule's approvers, else
/// the default. `None` when the ruling decides the call, or nothing asks for one.
pub fn requirement_of(ruling: &Ruling<'_>, default: Option<&Approvers>) -> Option<Requirement> {
    match ruling {
        Ruling::Decided { .. } => None,
        Ruling::AskHuman {
            rule:
                Some(Rule {
                    id,
                    approvers: Some(approvers),
                    ..
                }),
        } => Some(Requirement::of_rule(id, approvers)),
        Ruling::AskHuman { .. } => default.map(Requirement::default_of),
    }
}

/// Fixes on each call just stored the requirement that applies to it now (who it acts for is
/// stored with the call itself): on the calls still pending, and on those a grant decided at
/// submit or the batch resolved (skipped, superseded), so that every call of a group-scoped
/// requirement stays hidden from readers outside its groups however it was decided. A call a
/// rule decided has none: the rule, the operator's policy, decided it. Returns the approvals
/// fixed, by row id, so the reply shows them.
pub(super) async fn route_new_calls(
    tx: &mut impl WriteTx,
    accepted: &[(i64, &Call, Option<&Prejudged>)],
    (rules, default): (&[Rule], Option<&Approvers>),
    now: Timestamp,
) -> Result<Vec<(i64, Approval)>> {
    let mut routed = Vec::new();
    let asks_for_approvers = default.is_some() || rules.iter().any(|r| r.approvers.is_some());
    for &(rowid, call, prejudged) in accepted {
        // The rules alone name the ask rule (if any) that sends a call to people, or the rule
        // that decided it: grants are tried only when no rule matches.
        let requirement = if asks_for_approvers {
            let subject = Subject::of_call(call).with_prejudged(prejudged);
            requirement_of(&evaluate(&subject, rules, &[], now), default)
        } else {
            None
        };
        let Some(requirement) = requirement else {
            continue;
        };
        tx.route_call(rowid, &requirement).await?;
        routed.push((
            rowid,
            Approval {
                requirement,
                votes: Vec::new(),
            },
        ));
    }
    Ok(routed)
}

/// Refuses a decision its approver may not make, before anything is read or written: the
/// call's [`Gate`] judges it (no self-approval, groups, no edit where several must approve).
pub fn check_approver(call: &Call, decision: &Decision) -> Result<()> {
    Gate::of(call).admit_decision(decision)
}

/// What a vote did.
pub(super) enum Voted {
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
pub(super) async fn vote(
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
