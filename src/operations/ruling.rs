//! What a ruling of the rules and grants does to a pending call: decide it as a human decision
//! would, with what that brings along (a denial skips the rest of a SKIP_REST batch). Shared by
//! submit (calls decided as they arrive) and decide (pending calls a new grant covers).

use super::tx::{PolicyTx, Resolved, WriteTx};
use crate::domain::policy::{Grant, Prejudged, Rule, Subject, evaluate};
use crate::domain::{BatchId, Call, DecidedBy, OnDeny, OutcomeKind, Timestamp, ToolResultTexts};
use crate::error::Result;

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
    let subject = Subject::of_call(call).with_prejudged(prejudged);
    let ruling = evaluate(&subject, rules, grants, now);
    let Some(outcome) = ruling.outcome(&call.input, texts, now) else {
        return Ok(None);
    };
    let Some(own) = tx.resolve(rowid, &outcome).await? else {
        return Ok(None);
    };
    let skipped = if outcome.kind == OutcomeKind::Denied
        && tx.on_deny(&call.batch_id).await? == OnDeny::SkipRest
    {
        skip_rest_of_batch(tx, &call.batch_id, texts, now).await?
    } else {
        Vec::new()
    };
    Ok(Some((own, skipped)))
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
