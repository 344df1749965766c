//! The messages of rules in shadow at the edge: a rule's mode, shadow verdicts, and ReplayRule's
//! request (parsed into domain values; errors name the field) and reply (rendered back).

use crate::broker::ReplayPage;
use crate::domain::policy::{
    Disagreement, ReplayRange, Rule, RuleId, RuleMode, RuleVerdict, ShadowVerdict,
};
use crate::domain::{CallQuery, Cursor, Status};
use crate::error::{Error, Result};
use crate::proto::v1 as pb;

use super::{parse, render};

/// A rule's mode; UNSPECIFIED is ENFORCE.
pub fn rule_mode(field: &str, mode: i32) -> Result<RuleMode> {
    match pb::RuleMode::try_from(mode) {
        Ok(pb::RuleMode::Unspecified | pb::RuleMode::Enforce) => Ok(RuleMode::Enforce),
        Ok(pb::RuleMode::Shadow) => Ok(RuleMode::Shadow),
        Ok(pb::RuleMode::Disabled) => Ok(RuleMode::Disabled),
        Err(_) => Err(Error::invalid(
            field,
            format!(
                "must be RULE_MODE_ENFORCE, RULE_MODE_SHADOW or RULE_MODE_DISABLED, got {mode}"
            ),
        )),
    }
}

pub fn render_rule_mode(mode: RuleMode) -> pb::RuleMode {
    match mode {
        RuleMode::Enforce => pb::RuleMode::Enforce,
        RuleMode::Shadow => pb::RuleMode::Shadow,
        RuleMode::Disabled => pb::RuleMode::Disabled,
    }
}

/// SetRuleMode's request.
pub fn set_rule_mode(req: pb::SetRuleModeRequest) -> Result<(RuleId, RuleMode)> {
    Ok((parse::rule_id("id", &req.id)?, rule_mode("mode", req.mode)?))
}

/// The call status a rule's verdict would give: APPROVED, DENIED, or PENDING (a human decides).
fn verdict_status(verdict: RuleVerdict) -> pb::CallStatus {
    match verdict {
        RuleVerdict::Approve => pb::CallStatus::Approved,
        RuleVerdict::Deny => pb::CallStatus::Denied,
        RuleVerdict::AskHuman => pb::CallStatus::Pending,
    }
}

pub fn shadow_verdicts(verdicts: &[ShadowVerdict]) -> Vec<pb::ShadowVerdict> {
    verdicts
        .iter()
        .map(|v| pb::ShadowVerdict {
            rule_id: v.rule.to_string(),
            verdict: verdict_status(v.verdict) as i32,
            reason: v.reason.clone(),
        })
        .collect()
}

/// What ReplayRule asks: the candidate, the range, and the page.
pub struct ReplayRequest {
    pub candidate: Rule,
    pub range: ReplayRange,
    pub limit: u32,
    pub after: Option<Cursor>,
}

pub fn replay_request(req: pb::ReplayRuleRequest, max_input_bytes: usize) -> Result<ReplayRequest> {
    let mut candidate = req
        .candidate
        .ok_or_else(|| Error::invalid("candidate", "is required"))?;
    if candidate.id.is_empty() {
        candidate.id = "candidate".into();
    }
    let candidate = parse::rule("candidate", Some(candidate), max_input_bytes)?;
    let range = ReplayRange::new(
        ("from", parse::time_bound("from", req.from)?),
        ("to", parse::time_bound("to", req.to)?),
    )?;
    // The same page size and token rules as every listing of calls.
    let mut page = CallQuery::default();
    parse::page(&mut page, req.page_size, &req.page_token)?;
    Ok(ReplayRequest {
        candidate,
        range,
        limit: page.limit,
        after: page.after,
    })
}

pub fn replay_response(page: &ReplayPage) -> pb::ReplayRuleResponse {
    let t = &page.tally;
    pb::ReplayRuleResponse {
        calls: t.calls,
        would_approve: t.would_approve,
        would_deny: t.would_deny,
        left_to_human: t.left_to_human,
        agree: t.agree,
        disagree: t.disagree,
        samples: t.samples.iter().map(disagreement).collect(),
        next_page_token: parse::page_token(page.next),
    }
}

fn disagreement(d: &Disagreement) -> pb::ReplayDisagreement {
    pb::ReplayDisagreement {
        agent: d.call.agent.to_string(),
        session_id: d.call.session.to_string(),
        call_id: d.call.call_id.to_string(),
        actual: render::status(Status::Decided(d.actual)) as i32,
        decided_by: d.decided_by.to_string(),
        would: verdict_status(d.would) as i32,
    }
}
