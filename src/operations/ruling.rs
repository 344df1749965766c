//! What a ruling of the rules and grants does to a call: decide it as a human decision would,
//! through the call's gate for grants, with what that brings along (a denial skips the rest of a SKIP_REST batch). Shared by submit
//! (calls decided as they arrive, most of them stored decided) and decide (pending calls a new
//! grant covers).

use super::tx::{PolicyTx, Resolved, WriteTx};
use crate::domain::policy::{Gate, Grant, Prejudged, Requirement, Rule, Subject, evaluate_gated};
use crate::domain::{
    BatchId, Call, DecidedBy, OnDeny, Outcome, OutcomeKind, Timestamp, ToolResultTexts,
};
use crate::error::Result;

/// The outcome the rules and grants give `call`, if they decide it: the rules as the operator
/// wrote them, and only the grants the call's [`Gate`] admits under `requirement` (the one
/// fixed on it at submit, before any grant was tried), so a grant decides only what its authors
/// could have decided themselves. `prejudged`: what was judged of the call's input before the
/// write was queued.
pub(super) fn ruled_outcome(
    call: &Call,
    requirement: Option<&Requirement>,
    prejudged: Option<&Prejudged>,
    (rules, grants): (&[Rule], &[Grant]),
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Option<Outcome> {
    let subject = Subject::of_call(call).with_prejudged(prejudged);
    let gate = Gate::with(call, requirement);
    evaluate_gated(&subject, rules, grants, now, |grant| {
        gate.admits_grant(&grant.spec).is_ok()
    })
    .outcome(&call.input, texts, now)
}

/// Decides a pending call if a rule or grant does, with what a human decision would bring
/// along (a denial skips the rest of a SKIP_REST batch). Returns its resolution and the
/// siblings skipped; `None` if nothing decides it, or it is decided already (an earlier denial
/// of the same pass may have skipped it: `resolve` is conditional). `prejudged`: what was
/// judged of the call's input before the write was queued.
pub(super) async fn decide_by_ruling(
    tx: &mut (impl WriteTx + PolicyTx),
    (rowid, call, prejudged): (i64, &Call, Option<&Prejudged>),
    requirement: Option<&Requirement>,
    (rules, grants): (&[Rule], &[Grant]),
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<Option<(Resolved, Vec<Resolved>)>> {
    let policy = (rules, grants);
    let Some(outcome) = ruled_outcome(call, requirement, prejudged, policy, texts, now) else {
        return Ok(None);
    };
    let Some(own) = tx.resolve(rowid, &outcome).await? else {
        return Ok(None);
    };
    let skipped = brought_along(tx, call, &outcome, texts, now).await?;
    Ok(Some((own, skipped)))
}

/// What `call`'s `outcome` brings along, as a human decision's would: a denial skips the rest
/// of a SKIP_REST batch. The siblings skipped.
pub(super) async fn brought_along(
    tx: &mut impl WriteTx,
    call: &Call,
    outcome: &Outcome,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<Vec<Resolved>> {
    if outcome.kind == OutcomeKind::Denied && tx.on_deny(&call.batch_id).await? == OnDeny::SkipRest
    {
        skip_rest_of_batch(tx, &call.batch_id, texts, now).await
    } else {
        Ok(Vec::new())
    }
}

/// Skips every still-pending call of a batch (one of its calls was denied).
pub(super) async fn skip_rest_of_batch(
    tx: &mut impl WriteTx,
    batch: &BatchId,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<Vec<Resolved>> {
    let skip = texts.outcome(OutcomeKind::Skipped, DecidedBy::Broker, "", now);
    let mut skipped = Vec::new();
    for sibling in tx.pending_in_batch(batch).await? {
        skipped.extend(tx.resolve(sibling, &skip).await?);
    }
    Ok(skipped)
}
