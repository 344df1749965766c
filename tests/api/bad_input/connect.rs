//! AgentService/Connect: a malformed request on the stream gets an error response for that request
//! (or a per-call ack error), and the stream goes on answering valid requests; a message over the
//! gRPC limit, which the stream cannot decode past, ends it with RESOURCE_EXHAUSTED.

use approval_broker::proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::Response;
use tonic::transport::Channel;

use super::cancel::{batch_target, calls_target, target};
use super::submit::submit_reply;
use super::table::*;
use crate::helpers::*;

/// Sends `request` (with request id `bad`) on a fresh `Connect` stream. A refusal must come as
/// the answer to `bad` (an `error` response, or the only ack of a submitted batch being an
/// error), and the stream must then still answer a valid resume.
pub(super) fn connect(
    name: &'static str,
    request: Option<pb::agent_request::Request>,
    expect: Expect,
) -> Case {
    case(name, expect, move |channel| {
        let request = pb::AgentRequest {
            request_id: "bad".into(),
            request: request.clone(),
        };
        async move { connect_exchange(channel, request).await }
    })
}

async fn connect_exchange(channel: Channel, request: pb::AgentRequest) -> Got {
    use pb::agent_response::Response as R;
    let (requests, rx) = mpsc::channel(4);
    let mut responses = match AgentServiceClient::new(channel)
        .connect(ReceiverStream::new(rx))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => return Got::Status(status),
    };
    if requests.send(request).await.is_err() {
        return Got::Other("the request stream closed".into());
    }
    // The answer to `bad`; pushed outcomes (empty request id) are skipped.
    let answer = loop {
        match responses.message().await {
            Err(status) => return Got::Status(status),
            Ok(None) => return Got::Other("the stream ended without an error".into()),
            Ok(Some(message)) if message.request_id == "bad" => break message.response,
            Ok(Some(_)) => {}
        }
    };
    let got = match answer {
        Some(R::Error(error)) => Got::Item(error),
        Some(R::Submitted(response)) => submit_reply(Ok(Response::new(response))),
        other => return Got::Other(format!("answered {other:?}")),
    };
    // The stream goes on: a valid request on it is still answered.
    let resume = pb::AgentRequest {
        request_id: "alive".into(),
        request: Some(pb::agent_request::Request::Resume(pb::ResumeRequest {
            session_id: "seed".into(),
            call_ids: vec![],
        })),
    };
    if requests.send(resume).await.is_err() {
        return Got::Other("the request stream closed after the refusal".into());
    }
    loop {
        match responses.message().await {
            Ok(Some(message)) if message.request_id == "alive" => {
                return match message.response {
                    Some(R::Resumed(_)) => got,
                    other => Got::Other(format!("after the refusal, resume got {other:?}")),
                };
            }
            Ok(Some(_)) => {}
            Ok(None) => return Got::Other("the stream ended after the refusal".into()),
            Err(status) => {
                return Got::Other(format!("the stream failed after the refusal: {status:?}"));
            }
        }
    }
}

pub(super) fn request_cases() -> Vec<Case> {
    use pb::agent_request::Request as Req;
    vec![
        connect("connect: request without a oneof", None, item("request")),
        connect(
            "connect: submit with an empty session id",
            Some(Req::Submit(batch("", vec![call("new-call", "t", "{}")]))),
            item("submit.session_id"),
        ),
        connect(
            "connect: submit of 0 calls",
            Some(Req::Submit(batch("seed", vec![]))),
            item("submit.calls"),
        ),
        connect(
            "connect: submit with duplicate call ids",
            Some(Req::Submit(batch(
                "seed",
                vec![call("d", "t", "{}"), call("d", "t", "{}")],
            ))),
            item("submit.calls[1].call_id"),
        ),
        connect(
            "connect: submit with unknown on_deny",
            Some(Req::Submit(pb::BatchSpec {
                on_deny: 3,
                ..batch("seed", vec![call("new-call", "t", "{}")])
            })),
            item("submit.on_deny"),
        ),
        connect(
            "connect: submit of one call whose input is not an object",
            Some(Req::Submit(batch(
                "seed",
                vec![call("new-call", "t", "[]")],
            ))),
            item("submit.calls[0].input_json"),
        ),
        connect(
            "connect: cancel without a target",
            Some(Req::Cancel(pb::CancelTarget {
                session_id: "seed".into(),
                ..Default::default()
            })),
            item("cancel.target"),
        ),
        connect(
            "connect: cancel with whole_session=false",
            Some(Req::Cancel(pb::CancelTarget {
                session_id: "seed".into(),
                target: Some(pb::cancel_target::Target::WholeSession(false)),
                reason: String::new(),
            })),
            item("cancel.target"),
        ),
        connect(
            "connect: cancel with an empty session id",
            Some(Req::Cancel(pb::CancelTarget {
                session_id: String::new(),
                target: Some(pb::cancel_target::Target::WholeSession(true)),
                reason: String::new(),
            })),
            item("cancel.session_id"),
        ),
        connect(
            "connect: cancel of an unknown batch",
            Some(Req::Cancel(pb::CancelTarget {
                session_id: "seed".into(),
                target: batch_target("no-such-batch"),
                reason: String::new(),
            })),
            Expect::Item(Code::NotFound, "no-such-batch"),
        ),
        connect(
            "connect: resume with an empty session id",
            Some(Req::Resume(pb::ResumeRequest::default())),
            item("resume.session_id"),
        ),
        connect(
            "connect: resume naming a call id with an escape",
            Some(Req::Resume(pb::ResumeRequest {
                session_id: "seed".into(),
                call_ids: vec!["\u{1b}[31m".into()],
            })),
            item("resume.call_ids[0]"),
        ),
        connect(
            "connect: resume naming 1025 call ids",
            Some(Req::Resume(pb::ResumeRequest {
                session_id: "seed".into(),
                call_ids: ids(1025),
            })),
            item("resume.call_ids"),
        ),
    ]
}

/// Per-request error responses, or the per-call ack error.
async fn a_malformed_connect_request_is_refused_alone_and_the_stream_goes_on(app: TestApp) {
    refuses_every_case(&app, |_| request_cases()).await;
}

/// A message over the gRPC limit on a `Connect` stream ends the stream with RESOURCE_EXHAUSTED
/// (once, it ended with OK and no response, as if the client had gone).
pub(super) fn oversized_connect_message_cases() -> Vec<Case> {
    use pb::agent_request::Request as Req;
    let big = "x".repeat(MESSAGE_LIMIT + 1);
    vec![
        connect(
            "connect: message over the gRPC limit (in the tool name)",
            Some(Req::Submit(batch(
                "seed",
                vec![call("new-call", &big, "{}")],
            ))),
            OVERSIZED,
        ),
        connect(
            "connect: message over the gRPC limit (in a cancel reason)",
            Some(Req::Cancel(pb::CancelTarget {
                reason: big,
                ..target("seed", calls_target(&["c1"])).unwrap()
            })),
            OVERSIZED,
        ),
    ]
}

async fn a_connect_message_over_the_limit_ends_the_stream_with_resource_exhausted(app: TestApp) {
    refuses_every_case(&app, |_| oversized_connect_message_cases()).await;
}

backend_tests! {
    a_malformed_connect_request_is_refused_alone_and_the_stream_goes_on => crate::bad_input::table::small_limits,
    a_connect_message_over_the_limit_ends_the_stream_with_resource_exhausted => crate::bad_input::table::small_limits,
}
