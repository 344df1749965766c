//! Routing: who may decide a call, and how many must agree (see
//! [`Approvers`](crate::domain::policy::Approvers)).
//!
//! The requirement is fixed when a call is submitted, from the ask rule that sends it to people
//! (or the broker's default), and stored with the call: editing or deleting the rule later
//! never changes what a pending call needs. Decide (`decide.rs`) asks the call's gate before
//! anything else, then counts the vote under the call's batch lock.

use super::tx::WriteTx;
use crate::domain::policy::{Approval, Approvers, Requirement, Rule, Ruling};
use crate::domain::policy::{Prejudged, Subject, evaluate};
use crate::domain::{Call, Timestamp};
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
