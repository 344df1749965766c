//! ApproverService/Decide: a malformed decision is refused naming the field and decides nothing.

use approval_broker::proto::v1 as pb;
use tonic::Code;

use super::table::*;
use crate::helpers::*;

fn decide(name: &'static str, request: pb::DecideRequest, expect: Expect) -> Case {
    case(name, expect, move |channel| {
        let request = request.clone();
        async move { unary(ApproverServiceClient::new(channel).decide(request).await) }
    })
}

/// A valid decision on the pending seeded call `seed/c1`, edited.
fn decide_c1(edit: impl FnOnce(&mut pb::DecideRequest)) -> pb::DecideRequest {
    let mut request = decide_request("seed", "c1", pb::Decision::Approve, "");
    edit(&mut request);
    request
}

pub(super) fn decide_cases() -> Vec<Case> {
    let big = "x".repeat(MESSAGE_LIMIT + 1);
    let too_big_input = format!("{{\"a\":\"{}\"}}", "x".repeat(INPUT_LIMIT));
    vec![
        decide(
            "decide: empty session id",
            decide_c1(|r| r.session_id.clear()),
            invalid("session_id"),
        ),
        decide(
            "decide: empty call id",
            decide_c1(|r| r.call_id.clear()),
            invalid("call_id"),
        ),
        decide(
            "decide: 257-byte call id",
            decide_c1(|r| r.call_id = "c".repeat(257)),
            invalid("call_id"),
        ),
        decide(
            "decide: agent with DEL",
            decide_c1(|r| r.agent = "\u{7f}".into()),
            invalid("agent"),
        ),
        decide(
            "decide: DECISION_UNSPECIFIED",
            decide_c1(|r| r.decision = 0),
            invalid("decision"),
        ),
        decide(
            "decide: unknown decision 42",
            decide_c1(|r| r.decision = 42),
            invalid("decision"),
        ),
        decide(
            "decide: negative decision",
            decide_c1(|r| r.decision = -1),
            invalid("decision"),
        ),
        decide(
            "decide: no approver",
            decide_c1(|r| r.approver.clear()),
            invalid("approver"),
        ),
        decide(
            "decide: approver with a newline",
            decide_c1(|r| r.approver = "bob\nmallory".into()),
            invalid("approver"),
        ),
        decide(
            "decide: 257-byte approver",
            decide_c1(|r| r.approver = "a".repeat(257)),
            invalid("approver"),
        ),
        decide(
            "decide: reason over 4 KiB",
            decide_c1(|r| r.reason = "r".repeat(4 * 1024 + 1)),
            invalid("reason"),
        ),
        decide(
            "decide: reason with NUL",
            decide_c1(|r| r.reason = "a\0b".into()),
            invalid("reason"),
        ),
        decide(
            "decide: edited input an array",
            decide_c1(|r| r.edited_input_json = "[1]".into()),
            invalid("edited_input_json"),
        ),
        decide(
            "decide: edited input not JSON",
            decide_c1(|r| r.edited_input_json = "{oops".into()),
            invalid("edited_input_json"),
        ),
        decide(
            "decide: edited input a number",
            decide_c1(|r| r.edited_input_json = "42".into()),
            invalid("edited_input_json"),
        ),
        decide(
            "decide: edited input over the size limit",
            decide_c1(|r| r.edited_input_json = too_big_input.clone()),
            invalid("edited_input_json"),
        ),
        decide(
            "decide: edited input with a denial",
            decide_c1(|r| {
                r.decision = pb::Decision::Deny as i32;
                r.edited_input_json = "{}".into();
            }),
            invalid("edited_input_json"),
        ),
        decide(
            "decide: message over the gRPC limit",
            decide_c1(|r| r.reason = big.clone()),
            OVERSIZED,
        ),
        decide(
            "decide: unknown call",
            decide_c1(|r| r.call_id = "no-such-call".into()),
            Expect::Status(Code::NotFound, "no-such-call"),
        ),
        decide(
            "decide: unknown session",
            decide_c1(|r| r.session_id = "no-such-session".into()),
            Expect::Status(Code::NotFound, "no-such-session"),
        ),
        decide(
            "decide: a call of another agent",
            decide_c1(|r| r.agent = "mallory".into()),
            Expect::Status(Code::NotFound, "mallory"),
        ),
        decide(
            "decide: approving a denied call",
            decide_request("seed", "c2", pb::Decision::Approve, ""),
            Expect::Status(Code::FailedPrecondition, "DENIED"),
        ),
        decide(
            "decide: approving a denied call with an edited input",
            pb::DecideRequest {
                edited_input_json: "{\"path\":\"/\"}".into(),
                ..decide_request("seed", "c2", pb::Decision::Approve, "")
            },
            Expect::Status(Code::FailedPrecondition, "DENIED"),
        ),
    ]
}

/// Decide.
async fn a_malformed_decision_is_refused_naming_its_field_and_decides_nothing(app: TestApp) {
    refuses_every_case(&app, |_| decide_cases()).await;
}

backend_tests! {
    a_malformed_decision_is_refused_naming_its_field_and_decides_nothing => crate::bad_input::table::small_limits,
}
