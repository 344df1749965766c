//! The Decide and PreviewDecision RPCs, whole, at the gRPC edge: the request read into a domain
//! [`Decision`] (with auth on, the token says who decides, with which groups, seeing what; the
//! request cannot), and the broker's report filtered to what the approver may see and rendered
//! within the reply limit. `approver.rs` serves them with these three steps around
//! `Broker::decide`; the rest of the path is in `docs/architecture.md` ("One decision").

use tonic::{Request, Response, Status};

use super::oversize::Room;
use super::parse::{MAX_REASON_BYTES, grant_lifetime, line, matcher, scope, text};
use super::passkey_messages;
use super::render::{call, grant, outcome_unsealed};
use crate::broker::Broker;
use crate::domain::policy::{Remember, Scope};
use crate::domain::{
    AgentId, CallId, CallKey, DecideReport, Decision, SessionId, Timestamp, ToolInput, Verdict,
    Viewer,
};
use crate::door::auth::Caller;
use crate::error::{Error, Result};
use crate::proto::v1 as pb;

/// A Decide (or PreviewDecision) request as the broker takes it: with auth on, the token says
/// who decides, with which groups, seeing what; the request cannot.
pub(super) fn request(
    broker: &Broker,
    request: Request<pb::DecideRequest>,
) -> std::result::Result<(CallKey, Decision), Status> {
    let caller = Caller::of(&request);
    let mut req = request.into_inner();
    let passkey = req.passkey.take();
    let (key, mut decision) = decision(req, broker.limits().max_input_bytes)?;
    decision.approver = caller.approver(decision.approver)?;
    decision.approver_groups = caller.groups();
    decision.viewer = caller.viewer();
    if let Some(assertion) = passkey {
        let approves = decision.verdict == Verdict::Approve;
        decision.passkey = Some(passkey_messages::assertion(
            assertion,
            approves,
            broker.relying_party()?,
        )?);
    }
    Ok((key, decision))
}

/// The reply to a decision: the siblings a denial skipped, and the calls a new grant decided,
/// told only as far as the approver (`viewer`) may see them.
pub(super) fn reply(
    broker: &Broker,
    mut report: DecideReport,
    viewer: &Viewer,
) -> Response<pb::DecideResponse> {
    report.skipped.retain(|c| c.visible_to(viewer));
    report.decided_by_grant.retain(|c| c.visible_to(viewer));
    Response::new(response(
        &report,
        Timestamp::now(),
        broker.limits().max_reply_bytes,
    ))
}

/// A DecideRequest read into the call it names and a validated [`Decision`] (verdict, reason,
/// edited input, what to remember), refusing bad combinations. Who decides, with which groups,
/// is the request's here; [`request`] sets them from the token. Slack's clicks are read here too.
pub fn decision(req: pb::DecideRequest, max_input_bytes: usize) -> Result<(CallKey, Decision)> {
    let key = CallKey {
        agent: AgentId::parse_or_default("agent", req.agent)?,
        session: SessionId::parse("session_id", req.session_id)?,
        call_id: CallId::parse("call_id", req.call_id)?,
    };
    let (verdict, responds) = match pb::Decision::try_from(req.decision) {
        Ok(pb::Decision::Approve) => (Verdict::Approve, false),
        Ok(pb::Decision::Deny) => (Verdict::Deny, false),
        Ok(pb::Decision::Respond) => (Verdict::Deny, true),
        Ok(pb::Decision::Unspecified) => {
            return Err(Error::invalid(
                "decision",
                "must be DECISION_APPROVE, DECISION_DENY or DECISION_RESPOND",
            ));
        }
        Err(_) => {
            return Err(Error::invalid(
                "decision",
                format!("unknown value {}", req.decision),
            ));
        }
    };
    let response = respond_message(responds, req.response, &req.reason, req.scope)?;
    let edited_input = if req.edited_input_json.is_empty() {
        None
    } else if verdict == Verdict::Deny {
        return Err(Error::invalid(
            "edited_input_json",
            "is only allowed with DECISION_APPROVE",
        ));
    } else {
        Some(ToolInput::parse(
            "edited_input_json",
            &req.edited_input_json,
            max_input_bytes,
        )?)
    };
    // Required unless a token names the approver; see `auth::Caller::approver`.
    let approver = line("approver", req.approver, 256)?;
    // A response's message is the outcome's reason: what the receipt and the audit record.
    let reason = match response {
        Some(message) => message,
        None => text("reason", req.reason, MAX_REASON_BYTES)?,
    };
    let scope = scope("scope", req.scope)?;
    let remember = if scope == Scope::Once {
        if req.matcher.is_some() {
            return Err(Error::invalid(
                "matcher",
                "is only for a decision remembered with a scope other than SCOPE_ONCE",
            ));
        }
        if req.grant_expires_in.is_some() {
            return Err(Error::invalid(
                "grant_expires_in",
                "is only for a decision remembered with a scope other than SCOPE_ONCE",
            ));
        }
        None
    } else {
        if edited_input.is_some() {
            return Err(Error::invalid(
                "scope",
                "a decision with edited_input_json cannot be remembered (the grant would run \
                 later calls' own inputs, not the edit); decide it SCOPE_ONCE",
            ));
        }
        Some(Remember {
            scope,
            matcher: matcher("matcher", req.matcher, max_input_bytes, true)?,
            expires_in: req
                .grant_expires_in
                .map(|d| grant_lifetime("grant_expires_in", d))
                .transpose()?,
        })
    };
    Ok((
        key,
        Decision {
            verdict,
            reason,
            edited_input,
            approver,
            // The token's, set by the service (see `auth::Caller::groups`).
            approver_groups: None,
            viewer: crate::domain::Viewer::Operator,
            remember,
            responds,
            prejudged: Default::default(),
            // The assertion, with the relying party, set by the service (see
            // `passkey_messages::assertion`).
            passkey: None,
        },
    ))
}

/// The message of a DECISION_RESPOND (required, not blank, and not remembered: it answers this
/// call only), `None` for another decision, which may not carry one.
fn respond_message(
    responds: bool,
    response: String,
    reason: &str,
    scope: i32,
) -> Result<Option<String>> {
    if !responds {
        if !response.is_empty() {
            return Err(Error::invalid(
                "response",
                "is only for DECISION_RESPOND (a denial's reason goes in `reason`)",
            ));
        }
        return Ok(None);
    }
    let response = text("response", response, MAX_REASON_BYTES)?;
    if response.trim().is_empty() {
        return Err(Error::invalid(
            "response",
            "is required with DECISION_RESPOND: the message for the model, not empty",
        ));
    }
    if !reason.is_empty() {
        return Err(Error::invalid(
            "reason",
            "is not used with DECISION_RESPOND: the message goes in `response`",
        ));
    }
    if !matches!(
        pb::Scope::try_from(scope),
        Ok(pb::Scope::Unspecified | pb::Scope::Once)
    ) {
        return Err(Error::invalid(
            "scope",
            "a response answers this call only: DECISION_RESPOND is SCOPE_ONCE",
        ));
    }
    Ok(Some(response))
}

/// What a decision did: the outcome that stands and its grant, then the outcomes it skipped and
/// its grant decided that fit in `reply_limit`.
fn response(report: &DecideReport, now: Timestamp, reply_limit: usize) -> pb::DecideResponse {
    let decided = outcome_unsealed(&report.call);
    let grant = report.grant.as_ref().map(|g| grant(g, now));
    let mut room = Room::new(reply_limit);
    decided.iter().for_each(|o| room.charge(o));
    grant.iter().for_each(|g| room.charge(g));
    let (skipped, all_skipped) = room.fill(report.skipped.iter().filter_map(outcome_unsealed));
    let (decided_by_grant, all_by_grant) =
        room.fill(report.decided_by_grant.iter().filter_map(outcome_unsealed));
    pb::DecideResponse {
        outcome: decided,
        replayed: report.replayed,
        skipped,
        grant,
        decided_by_grant,
        skipped_count: report.skipped.len() as u64,
        decided_by_grant_count: report.decided_by_grant.len() as u64,
        truncated: !(all_skipped && all_by_grant),
        // A vote that left the call pending: the call, with its votes so far.
        pending: report.call.outcome.is_none().then(|| call(&report.call)),
        grant_note: report.grant_note.clone().unwrap_or_default(),
    }
}
