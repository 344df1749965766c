//! What a ruling of the rules and grants does to a call: decide it as a human decision would,
//! with what that brings along (a denial skips the rest of a SKIP_REST batch). Shared by submit
//! (calls decided as they arrive, most of them stored decided) and decide (pending calls a new
//! grant covers).

use super::tx::{PolicyTx, Resolved, WriteTx};
use crate::domain::policy::{Grant, Prejudged, Rule, Subject, evaluate};
use crate::domain::{
    BatchId, Call, DecidedBy, OnDeny, Outcome, OutcomeKind, Timestamp, ToolResultTexts,
};
use crate::error::Result;

/// The outcome the rules and grants give `call`, if they decide it. `prejudged`: what was judged
/// of the call's input before the write was queued.
pub(super) fn ruled_outcome(
    call: &Call,
    prejudged: Option<&Prejudged>,
    (rules, grants): (&[Rule], &[Grant]),
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Option<Outcome> {
    let subject = Subject::of_call(call).with_prejudged(prejudged);
    evaluate(&subject, rules, grants, now).outcome(&call.input, texts, now)
}

/// Decides a pending call if a rule or grant does, with what a human decision would bring
/// along (a denial skips the rest of a SKIP_REST batch). Returns its resolution and the
/// siblings skipped; `None` if nothing decides it, or it is decided already (an earlier denial
/// of the same pass may have skipped it: `resolve` is conditional). `prejudged`: what was
/// judged of the call's input before the write was queued.
pub(super) async fn decide_by_ruling(
    tx: &mut (impl WriteTx + PolicyTx),
    (rowid, call, prejudged): (i64, &Call, Option<&Prejudged>),
    rules: &[Rule],
    grants: &[Grant],
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<Option<(Resolved, Vec<Resolved>)>> {
    let Some(outcome) = ruled_outcome(call, prejudged, (rules, grants), texts, now) else {
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
