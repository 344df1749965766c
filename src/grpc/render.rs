//! Domain values become protobuf messages here.

use crate::domain::{Call, Status, Timestamp};
use crate::error::Error;
use crate::proto::v1 as pb;
use crate::store::{CancelReport, SubmitReport, SubmitResult};

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
        outcome: outcome(c),
    }
}

/// The call's outcome, if it has one.
pub fn outcome(c: &Call) -> Option<pb::Outcome> {
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
        batch_id: c.batch_id.as_str().to_owned(),
        position: c.position,
    })
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
/// request's order.
pub fn submit_response(
    report: &SubmitReport,
    session_id: &str,
    refused: &[(u32, String, Error)],
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
    pb::SubmitResponse {
        session_id: session_id.to_owned(),
        batch_id: report
            .batch_id
            .as_ref()
            .map(|b| b.as_str().to_owned())
            .unwrap_or_default(),
        acks,
        outcomes: report
            .items
            .iter()
            .filter_map(|item| match &item.result {
                SubmitResult::Accepted(c) | SubmitResult::Duplicate(c) => outcome(c),
                SubmitResult::Refused(_) => None,
            })
            .collect(),
        superseded: outcomes(&report.superseded),
    }
}

fn accepted(c: &Call) -> pb::Accepted {
    pb::Accepted {
        batch_id: c.batch_id.as_str().to_owned(),
        position: c.position,
        status: status(c.status()) as i32,
    }
}

pub fn cancel_result(report: &CancelReport) -> pb::CancelResult {
    pb::CancelResult {
        cancelled: outcomes(&report.cancelled),
        already_decided: outcomes(&report.already_decided),
        unknown_call_ids: report.unknown.iter().map(ToString::to_string).collect(),
    }
}

pub fn batch_complete(calls: &[Call]) -> Option<pb::BatchComplete> {
    let first = calls.first()?;
    Some(pb::BatchComplete {
        session_id: first.key.session.to_string(),
        batch_id: first.batch_id.as_str().to_owned(),
        outcomes: outcomes(calls),
    })
}
