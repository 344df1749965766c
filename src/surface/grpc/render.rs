//! Domain values become protobuf messages here. Replies that list what a write did are built
//! within the reply limit (see [`oversize`](super::oversize)): they list what fits and count all.

use std::collections::HashSet;

use crate::domain::policy::{
    Approval, Approvers, Effect, Explanation, FieldTest, Grant, GrantScope, Matcher, Rule,
    RuleEffect, Scope,
};
use crate::domain::receipt::Sealed;
use crate::domain::{
    Call, CallId, CancelReport, Status, SubmitReport, SubmitResult, Timestamp, invisible, json,
};
use crate::error::Error;
use crate::proto::v1 as pb;
use crate::receipts;

use super::oversize::Room;

pub fn timestamp(t: Timestamp) -> prost_types::Timestamp {
    let micros = t.as_micros();
    prost_types::Timestamp {
        seconds: micros.div_euclid(1_000_000),
        nanos: (micros.rem_euclid(1_000_000) * 1000) as i32,
    }
}

pub fn status(s: Status) -> pb::CallStatus {
    pb::CallStatus::try_from(s.code() as i32).unwrap_or(pb::CallStatus::Unspecified)
}

pub fn call(c: &Call) -> pb::Call {
    pb::Call {
        agent: c.key.agent.to_string(),
        session_id: c.key.session.to_string(),
        call_id: c.key.call_id.to_string(),
        batch_id: c.batch_id.as_str().to_owned(),
        position: c.position,
        batch_size: c.batch_size,
        tool: c.tool.to_string(),
        input_json: c.input.as_str().to_owned(),
        title: c.title.clone(),
        message: c.message.clone(),
        workspace: c.workspace.clone(),
        supersede_key: c.supersede_key.clone().unwrap_or_default(),
        deadline: c.deadline.map(timestamp),
        created_at: Some(timestamp(c.created_at)),
        status: status(c.status()) as i32,
        outcome: outcome_unsealed(c),
        hidden_characters: hidden_characters(c),
        // Only the audit (GetCall, Explain) reads and sets them.
        shadow_verdicts: Vec::new(),
        escalation: c
            .escalation
            .as_ref()
            .map(super::escalation_messages::escalation),
        approval: c.approval.as_ref().map(approval),
        requested_by: c.requested_by.clone(),
        host: c.host.map(|h| h.as_str().to_owned()).unwrap_or_default(),
        action: c.action.as_ref().map(|a| pb::Action {
            kind: a.kind.as_str().to_owned(),
            fields_json: a.fields.as_str().to_owned(),
        }),
    }
}

pub fn approvers(a: &Approvers) -> pb::Approvers {
    pb::Approvers {
        groups: a.groups.clone(),
        quorum: a.quorum,
        distinct_groups: a.distinct_groups,
        denials_to_deny: a.denials_to_deny,
        step_up: match a.step_up {
            None => pb::StepUp::Unspecified,
            Some(crate::domain::policy::StepUp::Passkey) => pb::StepUp::Passkey,
        } as i32,
    }
}

/// Who may decide a call and the votes so far.
pub fn approval(a: &Approval) -> pb::ApprovalProgress {
    pb::ApprovalProgress {
        rule_id: a.requirement.rule.clone().unwrap_or_default(),
        approvers: Some(approvers(&a.requirement.approvers)),
        approvals: a.approvals(),
        denials: a.denials(),
        votes: a
            .votes
            .iter()
            .map(|v| pb::Vote {
                approver: v.approver.clone(),
                approve: v.approve,
                reason: v.reason.clone(),
                at: Some(timestamp(Timestamp::from_micros(v.at))),
                groups: v.groups.clone().unwrap_or_default(),
                passkey_credential_id: v
                    .passkey
                    .as_ref()
                    .map(|p| p.credential_id.clone())
                    .unwrap_or_default(),
            })
            .collect(),
        summary: a.progress(),
    }
}

/// What the call's free text hides (see `domain::invisible`), field by field.
fn hidden_characters(c: &Call) -> Vec<pb::HiddenCharacters> {
    [
        ("title", c.title.as_str(), true),
        ("message", c.message.as_str(), true),
        ("input_json", c.input.as_str(), false),
    ]
    .into_iter()
    .filter_map(|(field, text, reveal)| {
        let (found, count) = invisible::found_in(text);
        (count > 0).then(|| pb::HiddenCharacters {
            field: field.to_owned(),
            code_points: found.into_iter().map(invisible::code_point).collect(),
            count: count as u32,
            revealed: if reveal {
                invisible::reveal(text)
            } else {
                String::new()
            },
        })
    })
    .collect()
}

/// The call's outcome as an agent is sent it, with its receipt where it was read with it
/// (`Broker::seal_outcomes`), if it has one.
pub fn outcome(c: &Call) -> Option<pb::Outcome> {
    outcome_of(c, true)
}

/// The call's outcome as approvers are sent it: without its receipt (an approver reads that
/// with `GetReceipt`), which every subscriber would otherwise be sent with every outcome.
pub fn outcome_unsealed(c: &Call) -> Option<pb::Outcome> {
    outcome_of(c, false)
}

fn outcome_of(c: &Call, sealed: bool) -> Option<pb::Outcome> {
    let o = c.outcome.as_ref()?;
    Some(pb::Outcome {
        agent: c.key.agent.to_string(),
        session_id: c.key.session.to_string(),
        call_id: c.key.call_id.to_string(),
        status: status(c.status()) as i32,
        decided_at: Some(timestamp(o.decided_at)),
        decided_by: o.decided_by.to_string(),
        reason: o.reason.clone(),
        tool_result: o.tool_result.clone(),
        input_json: o
            .run_input
            .as_ref()
            .map(|i| i.as_str().to_owned())
            .unwrap_or_default(),
        input_edited: o.input_edited,
        responded: o.responded(),
        batch_id: c.batch_id.as_str().to_owned(),
        position: c.position,
        decided_by_approvers: o.decided_by.approvers(),
        receipt: match &o.receipt {
            Some(receipt) if sealed => sealed_envelope(receipt),
            _ => String::new(),
        },
    })
}

/// A receipt's DSSE envelope, built here from parts (off the thread that read them).
fn sealed_envelope(sealed: &Sealed) -> String {
    match sealed {
        Sealed::Whole(envelope) => envelope.clone(),
        Sealed::Parts {
            payload,
            key_id,
            sig,
        } => receipts::envelope(payload, key_id, sig),
    }
}

pub fn outcomes<'a>(calls: impl IntoIterator<Item = &'a Call>) -> Vec<pb::Outcome> {
    calls.into_iter().filter_map(outcome).collect()
}

pub fn item_error(err: &Error) -> pb::ItemError {
    pb::ItemError {
        code: err.code() as i32,
        message: err.client_message(),
    }
}

/// The acknowledgements of a submit, merged with the calls refused at validation, in the
/// request's order, then the outcomes it decided and superseded that fit in `reply_limit`.
pub fn submit_response(
    report: &SubmitReport,
    session_id: &str,
    refused: &[(u32, String, Error)],
    reply_limit: usize,
) -> pb::SubmitResponse {
    let mut acks: Vec<pb::CallAck> = report
        .items
        .iter()
        .map(|item| {
            let result = match &item.result {
                SubmitResult::Accepted(c) => pb::call_ack::Result::Accepted(accepted(c)),
                SubmitResult::Duplicate(c) => pb::call_ack::Result::Duplicate(accepted(c)),
                SubmitResult::Refused(err) => pb::call_ack::Result::Error(item_error(err)),
            };
            pb::CallAck {
                call_id: item.call_id.to_string(),
                index: item.index,
                result: Some(result),
            }
        })
        .collect();
    acks.extend(refused.iter().map(|(index, call_id, err)| pb::CallAck {
        call_id: call_id.clone(),
        index: *index,
        result: Some(pb::call_ack::Result::Error(item_error(err))),
    }));
    acks.sort_by_key(|ack| ack.index);
    // A call the request carries is answered by its ack (and `outcomes`); `superseded` lists the
    // others, so one reply never names a call twice.
    let carried: HashSet<&CallId> = report
        .items
        .iter()
        .filter(|item| !matches!(item.result, SubmitResult::Refused(_)))
        .map(|item| &item.call_id)
        .collect();
    let mut room = Room::new(reply_limit);
    room.charge_text(session_id);
    acks.iter().for_each(|ack| room.charge(ack));
    let (outcomes, all_outcomes) =
        room.fill(report.items.iter().filter_map(|item| match &item.result {
            SubmitResult::Accepted(c) | SubmitResult::Duplicate(c) => outcome(c),
            SubmitResult::Refused(_) => None,
        }));
    let of_earlier_batches: Vec<&Call> = report
        .superseded
        .iter()
        .filter(|c| !carried.contains(&c.key.call_id))
        .collect();
    let (superseded, all_superseded) =
        room.fill(of_earlier_batches.iter().copied().filter_map(outcome));
    pb::SubmitResponse {
        session_id: session_id.to_owned(),
        batch_id: report
            .batch_id
            .as_ref()
            .map(|b| b.as_str().to_owned())
            .unwrap_or_default(),
        acks,
        outcomes,
        superseded,
        superseded_count: of_earlier_batches.len() as u64,
        truncated: !(all_outcomes && all_superseded),
    }
}

fn accepted(c: &Call) -> pb::Accepted {
    pb::Accepted {
        batch_id: c.batch_id.as_str().to_owned(),
        position: c.position,
        status: status(c.status()) as i32,
    }
}

/// What a cancel did: every unknown id, and the outcomes that fit in `reply_limit`.
pub fn cancel_result(report: &CancelReport, reply_limit: usize) -> pb::CancelResult {
    let unknown_call_ids: Vec<String> = report.unknown.iter().map(ToString::to_string).collect();
    let mut room = Room::new(reply_limit);
    unknown_call_ids.iter().for_each(|id| room.charge_text(id));
    let (cancelled, all_cancelled) = room.fill(report.cancelled.iter().filter_map(outcome));
    let (already_decided, all_decided) =
        room.fill(report.already_decided.iter().filter_map(outcome));
    pb::CancelResult {
        cancelled,
        already_decided,
        unknown_call_ids,
        cancelled_count: report.cancelled.len() as u64,
        already_decided_count: report.already_decided.len() as u64,
        truncated: !(all_cancelled && all_decided),
    }
}

pub fn batch_complete(calls: &[Call]) -> Option<pb::BatchComplete> {
    let first = calls.first()?;
    Some(pb::BatchComplete {
        session_id: first.key.session.to_string(),
        batch_id: first.batch_id.as_str().to_owned(),
        outcomes: outcomes(calls),
        truncated: false,
    })
}

/// A batch-complete message cut to `reply_limit`: the outcomes that fit (each was also sent on
/// its own before).
pub fn fit_batch_complete(
    mut complete: pb::BatchComplete,
    reply_limit: usize,
) -> pb::BatchComplete {
    let (outcomes, all) = Room::new(reply_limit).fill(std::mem::take(&mut complete.outcomes));
    complete.outcomes = outcomes;
    complete.truncated |= !all;
    complete
}

/// A resume's answer cut to `reply_limit`: every unknown id (at most the 1,024 named), and the
/// pending ids that fit.
pub fn fit_resume_done(mut done: pb::ResumeDone, reply_limit: usize) -> pb::ResumeDone {
    let mut room = Room::new(reply_limit);
    done.unknown_call_ids
        .iter()
        .for_each(|id| room.charge_text(id));
    let pending = &mut done.pending_call_ids;
    let fitting = pending.iter().take_while(|id| room.take_text(id)).count();
    done.truncated |= fitting < pending.len();
    pending.truncate(fitting);
    done
}

fn scope(s: Scope) -> pb::Scope {
    match s {
        Scope::Once => pb::Scope::Once,
        Scope::Session => pb::Scope::Session,
        Scope::Workspace => pb::Scope::Workspace,
        Scope::Always => pb::Scope::Always,
    }
}

fn effect(e: Effect) -> pb::Effect {
    match e {
        Effect::Allow => pb::Effect::Allow,
        Effect::Deny => pb::Effect::Deny,
    }
}

fn rule_effect(e: RuleEffect) -> pb::Effect {
    match e {
        RuleEffect::Allow => pb::Effect::Allow,
        RuleEffect::Deny => pb::Effect::Deny,
        RuleEffect::Ask => pb::Effect::Ask,
    }
}

pub fn matcher(m: &Matcher) -> pb::InputMatcher {
    use pb::field_condition::Test;
    use pb::input_matcher::Kind;
    let kind = match m {
        Matcher::Any => Kind::Any(pb::AnyInput {}),
        Matcher::Exact(input) => Kind::ExactJson(input.as_str().to_owned()),
        Matcher::Fields(conditions) => Kind::Fields(pb::FieldConditions {
            conditions: conditions
                .iter()
                .map(|c| pb::FieldCondition {
                    field: c.path().as_str().to_owned(),
                    test: Some(match c.test() {
                        FieldTest::Equals(serde_json::Value::String(s)) => Test::Equals(s.clone()),
                        FieldTest::Equals(value) => Test::EqualsJson(json::canonical(value)),
                        FieldTest::Prefix(p) => Test::Prefix(p.clone()),
                        FieldTest::Glob(g) => Test::Glob(g.as_str().to_owned()),
                        FieldTest::CommandPrefix(w) => Test::CommandPrefix(w.clone()),
                        FieldTest::PathUnder(d) => Test::PathUnder(d.clone()),
                        FieldTest::UrlHost(h) => Test::UrlHost(h.clone()),
                    }),
                })
                .collect(),
        }),
    };
    pb::InputMatcher { kind: Some(kind) }
}

/// A grant, with `active` judged at `now`.
pub fn grant(g: &Grant, now: Timestamp) -> pb::Grant {
    let spec = &g.spec;
    let (session_id, workspace) = match &spec.scope {
        GrantScope::Session(s) => (s.to_string(), String::new()),
        GrantScope::Workspace(w) => (String::new(), w.clone()),
        GrantScope::Always => (String::new(), String::new()),
    };
    pb::Grant {
        id: g.id as u64,
        agent: spec.agent.to_string(),
        scope: scope(spec.scope.scope()) as i32,
        session_id,
        workspace,
        tool: spec.tool.to_string(),
        matcher: Some(matcher(&spec.matcher)),
        effect: effect(spec.effect) as i32,
        created_by: spec.created_by.clone(),
        created_at: Some(timestamp(spec.created_at)),
        expires_at: spec.expires_at.map(timestamp),
        revoked_at: g.revoked_at.map(timestamp),
        revoked_by: g.revoked_by.clone().unwrap_or_default(),
        source_session_id: spec.source.session.to_string(),
        source_call_id: spec.source.call_id.to_string(),
        reason: spec.reason.clone(),
        active: g.is_live(now),
        authors: spec
            .authors
            .iter()
            .map(|a| a.identity.as_str().to_owned())
            .collect(),
        kind: spec.kind.map(|k| k.as_str().to_owned()).unwrap_or_default(),
    }
}

pub fn rule(r: &Rule) -> pb::Rule {
    pb::Rule {
        id: r.id.to_string(),
        tool: r.tool.as_str().to_owned(),
        kind: r.kind.map(|k| k.as_str().to_owned()).unwrap_or_default(),
        matcher: Some(matcher(&r.matcher)),
        effect: rule_effect(r.effect) as i32,
        priority: r.priority,
        description: r.description.clone(),
        source: r.source.as_str().to_owned(),
        created_at: Some(timestamp(r.created_at)),
        mode: super::shadow_messages::render_rule_mode(r.mode) as i32,
        escalation: super::escalation_messages::steps(&r.escalation),
        approvers: r.approvers.as_ref().map(approvers),
    }
}

pub fn explanation(e: &Explanation, now: Timestamp) -> pb::ExplainResponse {
    let verdict = match e.effect {
        None => pb::CallStatus::Pending,
        Some(Effect::Allow) => pb::CallStatus::Approved,
        Some(Effect::Deny) => pb::CallStatus::Denied,
    };
    pb::ExplainResponse {
        verdict: verdict as i32,
        decided_by: e
            .decided_by
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        rule: e.rule.as_ref().map(rule),
        grant: e.grant.as_ref().map(|g| grant(g, now)),
        reason: e.reason.clone(),
        call: e.call.as_ref().map(|c| pb::Call {
            shadow_verdicts: super::shadow_messages::shadow_verdicts(&e.recorded_shadow),
            ..call(c)
        }),
        shadow_verdicts: super::shadow_messages::shadow_verdicts(&e.shadow),
        // Set where the reply is fitted to the reply limit (`oversize::fit_explanation`).
        truncated: false,
        approval: e.approval.as_ref().map(approval),
    }
}

/// A receipt as read, with whether it verified (see `broker::receipts`).
pub fn receipt(checked: &crate::broker::CheckedReceipt) -> pb::Receipt {
    pb::Receipt {
        sequence: checked.stored.sequence,
        envelope: checked.stored.envelope.clone(),
        verified: checked.verified,
    }
}

/// GetReceipt's reply, the same to agents and approvers: the receipt, and the key it verifies
/// with when the broker signs.
pub fn receipt_response(
    checked: &crate::broker::CheckedReceipt,
    key: Option<&crate::receipts::PublicKey>,
) -> pb::GetReceiptResponse {
    pb::GetReceiptResponse {
        receipt: Some(receipt(checked)),
        key: key.map(receipt_key),
    }
}

/// The keys receipts verify with, the current one (`current`) first, each with its validity.
pub fn receipt_keys(
    keys: &[crate::receipts::trust::TrustedKey],
    current: Option<&crate::receipts::PublicKey>,
) -> pb::ListReceiptKeysResponse {
    let at = |t: Option<std::time::SystemTime>| t.map(prost_types::Timestamp::from);
    pb::ListReceiptKeysResponse {
        keys: keys
            .iter()
            .map(|k| pb::ReceiptKeyValidity {
                key: Some(receipt_key(&k.key)),
                valid_from: at(k.from),
                valid_until: at(k.until),
                current: current == Some(&k.key),
            })
            .collect(),
    }
}

/// The key receipts verify with, in each form a verifier may want.
pub fn receipt_key(key: &crate::receipts::PublicKey) -> pb::ReceiptKey {
    pb::ReceiptKey {
        key_id: key.key_id(),
        public_key: key.to_base64(),
        public_key_pem: key.to_pem(),
    }
}
