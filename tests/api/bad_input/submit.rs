//! AgentService/Submit: a malformed batch is refused as a whole, naming its field; a malformed call
//! of a valid batch is refused alone (its ack is the error) and nothing is stored.

use approval_broker::proto::v1 as pb;
use tonic::{Code, Response, Status};

use super::table::*;
use crate::helpers::*;

/// A submit of one (bad) call: refused alone, nothing stored.
pub(super) fn submit_reply(result: Result<Response<pb::SubmitResponse>, Status>) -> Got {
    let response = match result {
        Ok(response) => response.into_inner(),
        Err(status) => return Got::Status(status),
    };
    match response.acks.as_slice() {
        [
            pb::CallAck {
                index: 0,
                result: Some(pb::call_ack::Result::Error(error)),
                ..
            },
        ] if response.batch_id.is_empty() => Got::Item(error.clone()),
        _ => Got::Other(format!("OK {response:?}")),
    }
}

fn submit(name: &'static str, batch: Option<pb::BatchSpec>, expect: Expect) -> Case {
    case(name, expect, move |channel| {
        let request = pb::SubmitRequest {
            batch: batch.clone(),
        };
        async move { submit_reply(AgentServiceClient::new(channel).submit(request).await) }
    })
}

/// A submit of `bad` alone, in the seeded session: the call is refused naming
/// `batch.calls[0].<field>` and nothing is stored.
fn submit_call(name: &'static str, bad: pb::CallSpec, field: &'static str) -> Case {
    submit(
        name,
        Some(batch("seed", vec![bad])),
        Expect::Item(Code::InvalidArgument, field),
    )
}

fn with(edit: impl FnOnce(&mut pb::CallSpec)) -> pb::CallSpec {
    let mut spec = call("new-call", "t", "{}");
    edit(&mut spec);
    spec
}

fn batch_with(edit: impl FnOnce(&mut pb::BatchSpec)) -> Option<pb::BatchSpec> {
    let mut spec = batch("seed", vec![call("new-call", "t", "{}")]);
    edit(&mut spec);
    Some(spec)
}

pub(super) fn batch_cases() -> Vec<Case> {
    let big = "x".repeat(MESSAGE_LIMIT + 1);
    vec![
        submit("submit: no batch", None, invalid("batch")),
        submit(
            "submit: empty session id",
            batch_with(|b| b.session_id.clear()),
            invalid("batch.session_id"),
        ),
        submit(
            "submit: 257-byte session id",
            batch_with(|b| b.session_id = "s".repeat(257)),
            invalid("batch.session_id"),
        ),
        submit(
            "submit: session id with BEL",
            batch_with(|b| b.session_id = "a\u{7}b".into()),
            invalid("batch.session_id"),
        ),
        submit(
            "submit: session id with a C1 control (NEL)",
            batch_with(|b| b.session_id = "a\u{85}b".into()),
            invalid("batch.session_id"),
        ),
        submit(
            "submit: batch of 0 calls",
            batch_with(|b| b.calls.clear()),
            invalid("batch.calls"),
        ),
        submit(
            "submit: batch of 129 calls",
            batch_with(|b| {
                b.calls = (0..129)
                    .map(|i| call(&format!("n{i}"), "t", "{}"))
                    .collect()
            }),
            invalid("batch.calls"),
        ),
        submit(
            "submit: duplicate call ids in one batch",
            batch_with(|b| {
                b.calls = vec![
                    call("d0", "t", "{}"),
                    call("d1", "t", "{}"),
                    call("d0", "t", "{\"other\":1}"),
                ]
            }),
            invalid("batch.calls[2].call_id"),
        ),
        submit(
            "submit: unknown on_deny 99",
            batch_with(|b| b.on_deny = 99),
            invalid("batch.on_deny"),
        ),
        submit(
            "submit: negative on_deny",
            batch_with(|b| b.on_deny = -1),
            invalid("batch.on_deny"),
        ),
        submit(
            "submit: message over the gRPC limit",
            batch_with(|b| b.calls[0].input_json = format!("{{\"a\":\"{big}\"}}")),
            OVERSIZED,
        ),
    ]
}

/// The batch as a whole.
async fn a_malformed_batch_is_refused_naming_its_field_and_changes_nothing(app: TestApp) {
    refuses_every_case(&app, |_| batch_cases()).await;
}

pub(super) fn call_cases() -> Vec<Case> {
    let too_big_input = format!("{{\"a\":\"{}\"}}", "x".repeat(INPUT_LIMIT));
    let nested = format!("{{\"a\":{}{}}}", "[".repeat(200), "]".repeat(200));
    vec![
        submit_call(
            "call: empty call id",
            with(|c| c.call_id.clear()),
            "batch.calls[0].call_id",
        ),
        submit_call(
            "call: 257-byte call id",
            with(|c| c.call_id = "x".repeat(257)),
            "batch.calls[0].call_id",
        ),
        submit_call(
            "call: call id of 129 two-byte chars (258 bytes)",
            with(|c| c.call_id = "é".repeat(129)),
            "batch.calls[0].call_id",
        ),
        submit_call(
            "call: call id with a tab",
            with(|c| c.call_id = "a\tb".into()),
            "batch.calls[0].call_id",
        ),
        submit_call(
            "call: call id with NUL",
            with(|c| c.call_id = "a\0b".into()),
            "batch.calls[0].call_id",
        ),
        submit_call(
            "call: empty tool",
            with(|c| c.tool.clear()),
            "batch.calls[0].tool",
        ),
        submit_call(
            "call: 129-byte tool",
            with(|c| c.tool = "t".repeat(129)),
            "batch.calls[0].tool",
        ),
        submit_call(
            "call: tool with a newline",
            with(|c| c.tool = "rm\n-rf".into()),
            "batch.calls[0].tool",
        ),
        submit_call(
            "call: input not JSON",
            with(|c| c.input_json = "not json".into()),
            "batch.calls[0].input_json",
        ),
        submit_call(
            "call: empty input",
            with(|c| c.input_json.clear()),
            "batch.calls[0].input_json",
        ),
        submit_call(
            "call: input an array",
            with(|c| c.input_json = "[1, 2]".into()),
            "batch.calls[0].input_json",
        ),
        submit_call(
            "call: input a string",
            with(|c| c.input_json = "\"text\"".into()),
            "batch.calls[0].input_json",
        ),
        submit_call(
            "call: input null",
            with(|c| c.input_json = "null".into()),
            "batch.calls[0].input_json",
        ),
        submit_call(
            "call: input with trailing garbage",
            with(|c| c.input_json = "{\"a\":1} {}".into()),
            "batch.calls[0].input_json",
        ),
        submit_call(
            "call: input nested 200 deep",
            with(|c| c.input_json = nested.clone()),
            "batch.calls[0].input_json",
        ),
        submit_call(
            "call: input over the size limit",
            with(|c| c.input_json = too_big_input.clone()),
            "batch.calls[0].input_json",
        ),
        submit_call(
            "call: deadline in the past",
            with(|c| c.deadline = ts(1, 0)),
            "batch.calls[0].deadline",
        ),
        submit_call(
            "call: deadline with negative nanos",
            with(|c| c.deadline = ts(4_000_000_000, -1)),
            "batch.calls[0].deadline",
        ),
        submit_call(
            "call: deadline with nanos of 1e9",
            with(|c| c.deadline = ts(4_000_000_000, 1_000_000_000)),
            "batch.calls[0].deadline",
        ),
        submit_call(
            "call: deadline at i64::MAX seconds",
            with(|c| c.deadline = ts(i64::MAX, 0)),
            "batch.calls[0].deadline",
        ),
        submit_call(
            "call: deadline at i64::MIN seconds",
            with(|c| c.deadline = ts(i64::MIN, 0)),
            "batch.calls[0].deadline",
        ),
        submit_call(
            // Once stored, and then unprintable by clients' protobuf JSON libraries.
            "call: deadline after the year 9999",
            with(|c| c.deadline = ts(253_402_300_800, 0)),
            "batch.calls[0].deadline",
        ),
        submit_call(
            "call: deadline more than 366 days ahead (in 2096)",
            with(|c| c.deadline = ts(4_000_000_000, 0)),
            "batch.calls[0].deadline",
        ),
        submit_call(
            "call: title with a newline",
            with(|c| c.title = "Delete\nfile".into()),
            "batch.calls[0].title",
        ),
        submit_call(
            "call: 513-byte title",
            with(|c| c.title = "t".repeat(513)),
            "batch.calls[0].title",
        ),
        submit_call(
            "call: message with NUL",
            with(|c| c.message = "a\0b".into()),
            "batch.calls[0].message",
        ),
        submit_call(
            "call: message over 16 KiB",
            with(|c| c.message = "m".repeat(16 * 1024 + 1)),
            "batch.calls[0].message",
        ),
        submit_call(
            "call: workspace with a carriage return",
            with(|c| c.workspace = "repo\r".into()),
            "batch.calls[0].workspace",
        ),
        submit_call(
            "call: 257-byte supersede key",
            with(|c| c.supersede_key = "k".repeat(257)),
            "batch.calls[0].supersede_key",
        ),
    ]
}

/// One bad call, refused alone (its ack is the error).
async fn a_malformed_call_is_refused_alone_naming_its_field_and_changes_nothing(app: TestApp) {
    refuses_every_case(&app, |_| call_cases()).await;
}

backend_tests! {
    a_malformed_batch_is_refused_naming_its_field_and_changes_nothing => crate::bad_input::table::small_limits,
    a_malformed_call_is_refused_alone_naming_its_field_and_changes_nothing => crate::bad_input::table::small_limits,
}
