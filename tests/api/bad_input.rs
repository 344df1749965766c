//! Bad input: one table of malformed requests covering every RPC of the three services
//! (AgentService: Submit, Connect, GetOutcomes, WatchOutcomes, Cancel; ApproverService:
//! Subscribe, Decide, ListPending; AdminService: ListCalls, GetCall) proves, case by case, that
//! each is refused with its exact status code and a message naming the field at fault (guarantee
//! 7), that filters full of quotes, `%`, `_` and SQL fragments are valid and match literally, that
//! after every case the broker still serves, and that no rejected request changed the database
//! (every call, every status, the last event's sequence number). The broker runs with a 64 KiB
//! gRPC message limit so that oversized messages can be sent: they get RESOURCE_EXHAUSTED, the
//! code guarantee 7 names for limits (tonic's own OUT_OF_RANGE is rewritten by the broker), and
//! on a `Connect` stream, which cannot decode past such a message, the stream ends with it.
//!
//! Notes on what the table cannot or does not express:
//! - `page_size` is a `uint32`: a negative page size cannot be encoded, so only huge ones are sent.
//! - A page token of the right shape (`v1.<n>`) that this broker never issued cannot be told from
//!   one it did (tokens are plain positions): it is accepted, and one past the end lists nothing.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use approval_broker::proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::helpers::*;

/// The gRPC message limit the broker of this test runs with.
const MESSAGE_LIMIT: usize = 64 * 1024;
/// The tool-input limit the broker of this test runs with.
const INPUT_LIMIT: usize = 1024;
/// What the broker answers a message over the limit with, and what its message says.
const OVERSIZED: Expect = Expect::Status(Code::ResourceExhausted, "message length too large");

/// The workspace of the seeded call `tricky/w1`: quotes, wildcards and SQL.
const TRICKY: &str = "it's \"%_' OR '1'='1";
/// The tool of the seeded call `pct/p1`.
const PCT_TOOL: &str = "50%_off";

/// What a case's request got back, reduced to what the table checks.
enum Got {
    /// The RPC (or the stream) ended with this status.
    Status(Status),
    /// The RPC succeeded but refused the one item it was about: the only call of a submitted
    /// batch, or the request on a `Connect` stream (which then still answers a valid request).
    Item(pb::ItemError),
    /// The RPC succeeded and listed these calls (`session/call_id`), outcomes or states.
    Listed(Vec<String>),
    /// Anything else, described.
    Other(String),
}

impl Debug for Got {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Got::Status(s) => write!(f, "status {:?}: {}", s.code(), short(s.message())),
            Got::Item(e) => write!(
                f,
                "item error {:?}: {}",
                Code::from_i32(e.code),
                short(&e.message)
            ),
            Got::Listed(ids) => write!(f, "listed {ids:?}"),
            Got::Other(what) => write!(f, "{}", short(what)),
        }
    }
}

#[derive(Clone, Copy)]
enum Expect {
    /// The RPC fails with this code; the message contains this text (the field it names).
    Status(Code, &'static str),
    /// The item is refused with this code; the message contains this text.
    Item(Code, &'static str),
    /// The request is valid and lists exactly these, in this order.
    Lists(&'static [&'static str]),
}

type Rpc = Box<dyn Fn(Channel) -> Pin<Box<dyn Future<Output = Got> + Send>>>;

struct Case {
    name: &'static str,
    rpc: Rpc,
    expect: Expect,
}

fn case<F, Fut>(name: &'static str, expect: Expect, rpc: F) -> Case
where
    F: Fn(Channel) -> Fut + 'static,
    Fut: Future<Output = Got> + Send + 'static,
{
    Case {
        name,
        expect,
        rpc: Box::new(move |channel| Box::pin(rpc(channel))),
    }
}

fn short(text: &str) -> String {
    if text.len() <= 300 {
        return text.to_owned();
    }
    let mut end = 300;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

fn check(expect: Expect, got: &Got) -> Result<(), String> {
    let ok = match (expect, got) {
        (Expect::Status(code, text), Got::Status(status)) => {
            status.code() == code && status.message().contains(text)
        }
        (Expect::Item(code, text), Got::Item(error)) => {
            error.code == code as i32 && error.message.contains(text)
        }
        (Expect::Lists(expected), Got::Listed(listed)) => listed == expected,
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let wanted = match expect {
        Expect::Status(code, text) => format!("status {code:?} naming `{text}`"),
        Expect::Item(code, text) => format!("item error {code:?} naming `{text}`"),
        Expect::Lists(ids) => format!("a listing of {ids:?}"),
    };
    Err(format!("expected {wanted}, got {got:?}"))
}

// ---- How each RPC's answer becomes a `Got` -------------------------------------------------

fn unary<T: Debug>(result: Result<Response<T>, Status>) -> Got {
    match result {
        Ok(response) => Got::Other(format!("OK {:?}", response.into_inner())),
        Err(status) => Got::Status(status),
    }
}

fn listed(calls: &[pb::Call]) -> Vec<String> {
    calls
        .iter()
        .map(|c| format!("{}/{}", c.session_id, c.call_id))
        .collect()
}

/// A submit of one (bad) call: refused alone, nothing stored.
fn submit_reply(result: Result<Response<pb::SubmitResponse>, Status>) -> Got {
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

// ---- Builders, one per RPC -----------------------------------------------------------------

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

/// Sends `request` (with request id `bad`) on a fresh `Connect` stream. A refusal must come as
/// the answer to `bad` (an `error` response, or the only ack of a submitted batch being an
/// error), and the stream must then still answer a valid resume.
fn connect(
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

fn get_outcomes(name: &'static str, session: &str, ids: Vec<String>, expect: Expect) -> Case {
    let request = pb::GetOutcomesRequest {
        session_id: session.into(),
        call_ids: ids,
    };
    case(name, expect, move |channel| {
        let request = request.clone();
        async move {
            match AgentServiceClient::new(channel).get_outcomes(request).await {
                Err(status) => Got::Status(status),
                Ok(response) => Got::Listed(
                    response
                        .into_inner()
                        .calls
                        .iter()
                        .map(|c| {
                            let state = match &c.state {
                                Some(pb::call_state::State::Outcome(_)) => "decided",
                                Some(pb::call_state::State::Pending(_)) => "pending",
                                Some(pb::call_state::State::Unknown(_)) => "unknown",
                                None => "none",
                            };
                            format!("{}={state}", c.call_id)
                        })
                        .collect(),
                ),
            }
        }
    })
}

/// WatchOutcomes: a refusal, or the outcomes sent before `caught_up` (`session/call_id`).
fn watch(name: &'static str, session: &str, ids: Vec<String>, expect: Expect) -> Case {
    let request = pb::WatchOutcomesRequest {
        session_id: session.into(),
        call_ids: ids,
    };
    case(name, expect, move |channel| {
        let request = request.clone();
        async move {
            use pb::watch_outcomes_response::Event as E;
            let mut stream = match AgentServiceClient::new(channel)
                .watch_outcomes(request)
                .await
            {
                Ok(response) => response.into_inner(),
                Err(status) => return Got::Status(status),
            };
            let mut outcomes = Vec::new();
            loop {
                match stream.message().await {
                    Err(status) => return Got::Status(status),
                    Ok(None) => return Got::Other("the watch ended before caught_up".into()),
                    Ok(Some(message)) => match message.event {
                        Some(E::Outcome(o)) => {
                            outcomes.push(format!("{}/{}", o.session_id, o.call_id))
                        }
                        Some(E::CaughtUp(_)) => return Got::Listed(outcomes),
                        _ => {}
                    },
                }
            }
        }
    })
}

fn cancel(name: &'static str, target: Option<pb::CancelTarget>, expect: Expect) -> Case {
    case(name, expect, move |channel| {
        let request = pb::CancelRequest {
            target: target.clone(),
        };
        async move { unary(AgentServiceClient::new(channel).cancel(request).await) }
    })
}

fn target(session: &str, target: Option<pb::cancel_target::Target>) -> Option<pb::CancelTarget> {
    Some(pb::CancelTarget {
        session_id: session.into(),
        target,
        reason: String::new(),
    })
}

fn batch_target(batch_id: &str) -> Option<pb::cancel_target::Target> {
    Some(pb::cancel_target::Target::BatchId(batch_id.into()))
}

fn calls_target(ids: &[&str]) -> Option<pb::cancel_target::Target> {
    Some(pb::cancel_target::Target::Calls(pb::CallIds {
        call_ids: ids.iter().map(|s| s.to_string()).collect(),
    }))
}

/// Subscribe: a refusal, or the calls of its snapshot (`session/call_id`).
fn subscribe(
    name: &'static str,
    filter: pb::CallFilter,
    after_seq: Option<u64>,
    expect: Expect,
) -> Case {
    case(name, expect, move |channel| {
        let request = pb::SubscribeRequest {
            filter: Some(filter.clone()),
            after_seq,
        };
        async move {
            use pb::approver_event::Event as E;
            let mut stream = match ApproverServiceClient::new(channel).subscribe(request).await {
                Ok(response) => response.into_inner(),
                Err(status) => return Got::Status(status),
            };
            let mut calls = Vec::new();
            loop {
                match stream.message().await {
                    Err(status) => return Got::Status(status),
                    Ok(None) => return Got::Other("the subscription ended".into()),
                    Ok(Some(event)) => match event.event {
                        Some(E::Snapshot(call)) => calls.push(call),
                        Some(E::SnapshotComplete(_)) => return Got::Listed(listed(&calls)),
                        other => return Got::Other(format!("unexpected event {other:?}")),
                    },
                }
            }
        }
    })
}

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

fn list_pending(name: &'static str, request: pb::ListPendingRequest, expect: Expect) -> Case {
    case(name, expect, move |channel| {
        let request = request.clone();
        async move {
            match ApproverServiceClient::new(channel)
                .list_pending(request)
                .await
            {
                Ok(response) => Got::Listed(listed(&response.into_inner().calls)),
                Err(status) => Got::Status(status),
            }
        }
    })
}

fn pending_where(filter: pb::CallFilter) -> pb::ListPendingRequest {
    pb::ListPendingRequest {
        filter: Some(filter),
        ..Default::default()
    }
}

fn page(size: u32, token: &str) -> pb::ListPendingRequest {
    pb::ListPendingRequest {
        filter: None,
        page_size: size,
        page_token: token.into(),
    }
}

fn list_calls(name: &'static str, request: pb::ListCallsRequest, expect: Expect) -> Case {
    case(name, expect, move |channel| {
        let request = request.clone();
        async move {
            match AdminServiceClient::new(channel).list_calls(request).await {
                Ok(response) => Got::Listed(listed(&response.into_inner().calls)),
                Err(status) => Got::Status(status),
            }
        }
    })
}

fn get_call(name: &'static str, agent: &str, session: &str, call_id: &str, expect: Expect) -> Case {
    let request = pb::GetCallRequest {
        session_id: session.into(),
        call_id: call_id.into(),
        agent: agent.into(),
    };
    case(name, expect, move |channel| {
        let request = request.clone();
        async move {
            match AdminServiceClient::new(channel).get_call(request).await {
                Ok(response) => Got::Listed(listed(&[response.into_inner()])),
                Err(status) => Got::Status(status),
            }
        }
    })
}

fn ts(seconds: i64, nanos: i32) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp { seconds, nanos })
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("id{i}")).collect()
}

fn filter(edit: impl FnOnce(&mut pb::CallFilter)) -> pb::CallFilter {
    let mut f = pb::CallFilter::default();
    edit(&mut f);
    f
}

// ---- The table -----------------------------------------------------------------------------

const INVALID: Code = Code::InvalidArgument;

fn invalid(field: &'static str) -> Expect {
    Expect::Status(INVALID, field)
}

fn item(field: &'static str) -> Expect {
    Expect::Item(INVALID, field)
}

/// Every case. `last_seq` is the sequence number of the last event after seeding.
fn cases(last_seq: u64) -> Vec<Case> {
    use pb::agent_request::Request as Req;
    let big = "x".repeat(MESSAGE_LIMIT + 1);
    let too_big_input = format!("{{\"a\":\"{}\"}}", "x".repeat(INPUT_LIMIT));
    let nested = format!("{{\"a\":{}{}}}", "[".repeat(200), "]".repeat(200));
    vec![
        // AgentService/Submit: the batch as a whole.
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
        // AgentService/Submit: one bad call, refused alone (its ack is the error).
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
        // AgentService/Connect: per-request error responses, or the per-call ack error.
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
        // AgentService/GetOutcomes.
        get_outcomes(
            "get_outcomes: empty session id",
            "",
            vec!["c1".into()],
            invalid("session_id"),
        ),
        get_outcomes(
            "get_outcomes: no call ids",
            "seed",
            vec![],
            invalid("call_ids"),
        ),
        get_outcomes(
            "get_outcomes: 1025 call ids",
            "seed",
            ids(1025),
            invalid("call_ids"),
        ),
        get_outcomes(
            "get_outcomes: an empty call id among good ones",
            "seed",
            vec!["c1".into(), String::new()],
            invalid("call_ids[1]"),
        ),
        get_outcomes(
            "get_outcomes: a call id with an escape",
            "seed",
            vec!["\u{1b}[2J".into()],
            invalid("call_ids[0]"),
        ),
        get_outcomes(
            "get_outcomes: message over the gRPC limit",
            "seed",
            (0..300).map(|i| format!("{i:0>250}")).collect(),
            OVERSIZED,
        ),
        get_outcomes(
            "get_outcomes: wildcard call ids match nothing (valid)",
            "seed",
            vec!["c%".into(), "c_".into(), "c1".into()],
            Expect::Lists(&["c%=unknown", "c_=unknown", "c1=pending"]),
        ),
        // AgentService/WatchOutcomes.
        watch("watch: empty session id", "", vec![], invalid("session_id")),
        watch(
            "watch: 257-byte session id",
            &"s".repeat(257),
            vec![],
            invalid("session_id"),
        ),
        watch(
            "watch: an empty call id",
            "seed",
            vec![String::new()],
            invalid("call_ids[0]"),
        ),
        watch(
            "watch: 1025 call ids",
            "seed",
            ids(1025),
            invalid("call_ids"),
        ),
        watch(
            "watch: message over the gRPC limit",
            &big,
            vec![],
            OVERSIZED,
        ),
        watch(
            "watch: a wildcard session matches nothing (valid)",
            "seed%",
            vec![],
            Expect::Lists(&[]),
        ),
        // AgentService/Cancel.
        cancel("cancel: no target", None, invalid("target")),
        cancel(
            "cancel: empty session id",
            target("", Some(pb::cancel_target::Target::WholeSession(true))),
            invalid("target.session_id"),
        ),
        cancel(
            "cancel: missing target oneof",
            target("seed", None),
            invalid("target.target"),
        ),
        cancel(
            "cancel: whole_session=false",
            target("seed", Some(pb::cancel_target::Target::WholeSession(false))),
            invalid("target.target"),
        ),
        cancel(
            "cancel: empty batch id",
            target("seed", batch_target("")),
            invalid("target.batch_id"),
        ),
        cancel(
            "cancel: empty call id list",
            target("seed", calls_target(&[])),
            invalid("target.calls.call_ids"),
        ),
        cancel(
            "cancel: a call id with a newline",
            target("seed", calls_target(&["c1\n"])),
            invalid("target.calls.call_ids[0]"),
        ),
        cancel(
            "cancel: reason over 4 KiB",
            Some(pb::CancelTarget {
                reason: "r".repeat(4 * 1024 + 1),
                ..target("seed", calls_target(&["c1"])).unwrap()
            }),
            invalid("target.reason"),
        ),
        cancel(
            "cancel: reason with NUL",
            Some(pb::CancelTarget {
                reason: "a\0b".into(),
                ..target("seed", calls_target(&["c1"])).unwrap()
            }),
            invalid("target.reason"),
        ),
        cancel(
            "cancel: unknown batch",
            target("seed", batch_target("no-such-batch")),
            Expect::Status(Code::NotFound, "no-such-batch"),
        ),
        cancel(
            "cancel: a batch id with an escape",
            target("seed", batch_target("\u{1b}[2J")),
            invalid("target.batch_id"),
        ),
        cancel(
            "cancel: a batch id that is an SQL fragment",
            target("seed", batch_target("' OR '1'='1")),
            Expect::Status(Code::NotFound, "' OR '1'='1"),
        ),
        // ApproverService/Subscribe.
        subscribe(
            "subscribe: after_seq beyond the last event",
            pb::CallFilter::default(),
            Some(last_seq + 1),
            invalid("after_seq"),
        ),
        subscribe(
            "subscribe: after_seq u64::MAX",
            pb::CallFilter::default(),
            Some(u64::MAX),
            invalid("after_seq"),
        ),
        subscribe(
            "subscribe: filter session id with a newline",
            filter(|f| f.session_id = "seed\n".into()),
            None,
            invalid("filter.session_id"),
        ),
        subscribe(
            "subscribe: filter tool of 129 bytes",
            filter(|f| f.tool = "t".repeat(129)),
            None,
            invalid("filter.tool"),
        ),
        subscribe(
            "subscribe: filter agent with DEL",
            filter(|f| f.agent = "default\u{7f}".into()),
            None,
            invalid("filter.agent"),
        ),
        subscribe(
            "subscribe: message over the gRPC limit",
            filter(|f| f.workspace = big.clone()),
            None,
            OVERSIZED,
        ),
        subscribe(
            "subscribe: quotes and wildcards in the workspace match literally (valid)",
            filter(|f| f.workspace = TRICKY.into()),
            None,
            Expect::Lists(&["tricky/w1"]),
        ),
        subscribe(
            "subscribe: a `%` tool matches nothing (valid)",
            filter(|f| f.tool = "%".into()),
            None,
            Expect::Lists(&[]),
        ),
        // ApproverService/Decide.
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
        // ApproverService/ListPending. (page_size is a uint32: a negative size cannot be sent.)
        list_pending(
            "list_pending: page size 1001",
            page(1001, ""),
            invalid("page_size"),
        ),
        list_pending(
            "list_pending: page size u32::MAX",
            page(u32::MAX, ""),
            invalid("page_size"),
        ),
        list_pending(
            "list_pending: forged token `garbage`",
            page(10, "garbage"),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: forged token `v1.-1`",
            page(10, "v1.-1"),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: forged token beyond i64",
            page(10, "v1.9223372036854775808"),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: forged token `v2.5`",
            page(10, "v2.5"),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: forged token with a trailing space",
            page(10, "v1.5 "),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: token that is an SQL fragment",
            page(10, "v1.0 OR 1=1"),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: a well-formed token past the end lists nothing (valid)",
            page(10, &format!("v1.{}", i64::MAX)),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: filter session id with a tab",
            pending_where(filter(|f| f.session_id = "\tseed".into())),
            invalid("filter.session_id"),
        ),
        list_pending(
            "list_pending: filter workspace with NUL",
            pending_where(filter(|f| f.workspace = "\0".into())),
            invalid("filter.workspace"),
        ),
        list_pending(
            "list_pending: filter agent of 257 bytes",
            pending_where(filter(|f| f.agent = "a".repeat(257))),
            invalid("filter.agent"),
        ),
        list_pending(
            "list_pending: quotes, `%` and `_` in the workspace match literally (valid)",
            pending_where(filter(|f| f.workspace = TRICKY.into())),
            Expect::Lists(&["tricky/w1"]),
        ),
        list_pending(
            "list_pending: workspace `%` matches nothing (valid)",
            pending_where(filter(|f| f.workspace = "%".into())),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: workspace `_` matches nothing (valid)",
            pending_where(filter(|f| f.workspace = "_".into())),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: workspace prefix with `%` matches nothing (valid)",
            pending_where(filter(|f| f.workspace = "it's%".into())),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: session id `' OR '1'='1` matches nothing (valid)",
            pending_where(filter(|f| f.session_id = "seed' OR '1'='1".into())),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: tool with `%` and `_` matches itself only (valid)",
            pending_where(filter(|f| f.tool = PCT_TOOL.into())),
            Expect::Lists(&["pct/p1"]),
        ),
        list_pending(
            "list_pending: tool `50%` matches nothing (valid)",
            pending_where(filter(|f| f.tool = "50%".into())),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: tool `' OR 1=1 --` matches nothing (valid)",
            pending_where(filter(|f| f.tool = "' OR 1=1 --".into())),
            Expect::Lists(&[]),
        ),
        // AdminService/ListCalls.
        list_calls(
            "list_calls: unknown status 77",
            pb::ListCallsRequest {
                statuses: vec![77],
                ..Default::default()
            },
            invalid("statuses[0]"),
        ),
        list_calls(
            "list_calls: CALL_STATUS_UNSPECIFIED after a good status",
            pb::ListCallsRequest {
                statuses: vec![1, 0],
                ..Default::default()
            },
            invalid("statuses[1]"),
        ),
        list_calls(
            "list_calls: negative status",
            pb::ListCallsRequest {
                statuses: vec![-3],
                ..Default::default()
            },
            invalid("statuses[0]"),
        ),
        list_calls(
            "list_calls: created_after with negative nanos",
            pb::ListCallsRequest {
                created_after: ts(0, -1),
                ..Default::default()
            },
            invalid("created_after"),
        ),
        list_calls(
            "list_calls: created_after with nanos of 1e9",
            pb::ListCallsRequest {
                created_after: ts(0, 1_000_000_000),
                ..Default::default()
            },
            invalid("created_after"),
        ),
        list_calls(
            "list_calls: created_before at i64::MAX seconds",
            pb::ListCallsRequest {
                created_before: ts(i64::MAX, 0),
                ..Default::default()
            },
            invalid("created_before"),
        ),
        list_calls(
            "list_calls: page size u32::MAX",
            pb::ListCallsRequest {
                page_size: u32::MAX,
                ..Default::default()
            },
            invalid("page_size"),
        ),
        list_calls(
            "list_calls: forged token",
            pb::ListCallsRequest {
                page_token: "v1.abc".into(),
                ..Default::default()
            },
            invalid("page_token"),
        ),
        list_calls(
            "list_calls: session id with a newline",
            pb::ListCallsRequest {
                session_id: "a\nb".into(),
                ..Default::default()
            },
            invalid("session_id"),
        ),
        list_calls(
            "list_calls: tool of 129 bytes",
            pb::ListCallsRequest {
                tool: "t".repeat(129),
                ..Default::default()
            },
            invalid("tool"),
        ),
        list_calls(
            "list_calls: message over the gRPC limit",
            pb::ListCallsRequest {
                session_id: big.clone(),
                ..Default::default()
            },
            OVERSIZED,
        ),
        list_calls(
            "list_calls: session id with `\"; DROP TABLE calls; --` matches nothing (valid)",
            pb::ListCallsRequest {
                session_id: "seed\"; DROP TABLE calls; --".into(),
                ..Default::default()
            },
            Expect::Lists(&[]),
        ),
        list_calls(
            "list_calls: session id `%` matches nothing (valid)",
            pb::ListCallsRequest {
                session_id: "%".into(),
                ..Default::default()
            },
            Expect::Lists(&[]),
        ),
        list_calls(
            "list_calls: tool `t' OR 'x'='x` matches nothing (valid)",
            pb::ListCallsRequest {
                tool: "t' OR 'x'='x".into(),
                ..Default::default()
            },
            Expect::Lists(&[]),
        ),
        list_calls(
            "list_calls: agent `%` matches nothing (valid)",
            pb::ListCallsRequest {
                agent: "%".into(),
                ..Default::default()
            },
            Expect::Lists(&[]),
        ),
        list_calls(
            "list_calls: the seeded session, for contrast (valid)",
            pb::ListCallsRequest {
                session_id: "seed".into(),
                agent: "default".into(),
                ..Default::default()
            },
            Expect::Lists(&["seed/c1", "seed/c2"]),
        ),
        // AdminService/GetCall.
        get_call(
            "get_call: empty session id",
            "",
            "",
            "c1",
            invalid("session_id"),
        ),
        get_call(
            "get_call: empty call id",
            "",
            "seed",
            "",
            invalid("call_id"),
        ),
        get_call(
            "get_call: call id with a bell",
            "",
            "seed",
            "c1\u{7}",
            invalid("call_id"),
        ),
        get_call(
            "get_call: 257-byte agent",
            &"a".repeat(257),
            "seed",
            "c1",
            invalid("agent"),
        ),
        get_call(
            "get_call: message over the gRPC limit",
            "",
            "seed",
            &big,
            OVERSIZED,
        ),
        get_call(
            "get_call: unknown call",
            "",
            "seed",
            "no-such-call",
            Expect::Status(Code::NotFound, "no-such-call"),
        ),
        get_call(
            "get_call: call id `c_` is not a pattern",
            "",
            "seed",
            "c_",
            Expect::Status(Code::NotFound, "c_"),
        ),
        get_call(
            "get_call: a call of another agent",
            "mallory",
            "seed",
            "c1",
            Expect::Status(Code::NotFound, "mallory"),
        ),
    ]
}

// ---- Seed, state, liveness ---------------------------------------------------------------

/// Events the seed writes: four calls requested, one resolved.
const SEED_EVENTS: u64 = 5;

/// `seed/c1` pending and `seed/c2` denied (one INDEPENDENT batch), `tricky/w1` pending in the
/// workspace [`TRICKY`], `pct/p1` pending with the tool [`PCT_TOOL`].
async fn seed(app: &TestApp) {
    submit_ok(
        app,
        pb::BatchSpec {
            on_deny: pb::OnDeny::Independent as i32,
            ..batch(
                "seed",
                vec![call("c1", "t", r#"{"path":"a"}"#), call("c2", "t", "{}")],
            )
        },
    )
    .await;
    submit_ok(
        app,
        batch(
            "tricky",
            vec![pb::CallSpec {
                workspace: TRICKY.into(),
                ..call("w1", "t", "{}")
            }],
        ),
    )
    .await;
    submit_ok(app, batch("pct", vec![call("p1", PCT_TOOL, "{}")])).await;
    deny(app, "seed", "c2", "no").await;
}

async fn submit_ok(app: &TestApp, spec: pb::BatchSpec) {
    let response = crate::helpers::submit(app, spec).await;
    assert!(
        response
            .acks
            .iter()
            .all(|a| matches!(a.result, Some(pb::call_ack::Result::Accepted(_)))),
        "seed accepted: {response:?}"
    );
}

/// Everything a rejected request must not change: every call (with its status and outcome)
/// and the last event's sequence number.
#[derive(Debug, PartialEq)]
struct State {
    calls: Vec<pb::Call>,
    last_seq: u64,
}

async fn state(app: &TestApp) -> State {
    let mut subscription = Subscription::open(app, pb::CallFilter::default(), None).await;
    let (_, last_seq) = subscription.snapshot().await;
    State {
        calls: all_calls(app).await,
        last_seq,
    }
}

/// Health says SERVING and a valid ListPending lists the three seeded pending calls.
async fn still_serves(app: &TestApp) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    let health = tonic_health::pb::health_client::HealthClient::new(app.channel.clone())
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .map_err(|e| format!("health check failed: {e:?}"))?
        .into_inner();
    if health.status != ServingStatus::Serving as i32 {
        return Err(format!("health says {health:?}"));
    }
    let pending = app
        .approver()
        .list_pending(pb::ListPendingRequest::default())
        .await
        .map_err(|e| format!("a valid ListPending failed: {e:?}"))?
        .into_inner();
    let ids = listed(&pending.calls);
    if ids != ["seed/c1", "tricky/w1", "pct/p1"] {
        return Err(format!("a valid ListPending listed {ids:?}"));
    }
    Ok(())
}

/// Runs every case; collects every failure, each naming its case.
async fn run_table(app: &TestApp, table: Vec<Case>, before: &State) -> Vec<String> {
    let mut failures = Vec::new();
    for case in table {
        let got = match tokio::time::timeout(PATIENCE, (case.rpc)(app.channel.clone())).await {
            Ok(got) => got,
            Err(_) => Got::Other(format!("no answer within {PATIENCE:?}")),
        };
        if let Err(why) = check(case.expect, &got) {
            failures.push(format!("{}: {why}", case.name));
        }
        if let Err(why) = still_serves(app).await {
            failures.push(format!("{}: the broker no longer serves: {why}", case.name));
            break;
        }
        let after = state(app).await;
        if &after != before {
            failures.push(format!(
                "{}: changed the database (last seq {} -> {}, {} -> {} calls)",
                case.name,
                before.last_seq,
                after.last_seq,
                before.calls.len(),
                after.calls.len()
            ));
        }
    }
    failures
}

async fn seeded_state(app: &TestApp) -> State {
    seed(app).await;
    let before = state(app).await;
    assert_eq!(before.last_seq, SEED_EVENTS, "the seed's events");
    assert_eq!(before.calls.len(), 4, "the seed's calls");
    before
}

async fn every_malformed_request_is_refused_precisely_and_changes_nothing(app: TestApp) {
    let before = seeded_state(&app).await;
    let mut table = cases(before.last_seq);
    table.extend(oversized_connect_message_cases());
    table.extend(control_characters_in_batch_id_cases());
    assert!(table.len() >= 40, "the table holds {} cases", table.len());
    let total = table.len();
    let failures = run_table(&app, table, &before).await;
    assert!(
        failures.is_empty(),
        "{} of {total} bad-input cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

backend_tests! {
    every_malformed_request_is_refused_precisely_and_changes_nothing => |c| {
        c.max_message_bytes = super::MESSAGE_LIMIT;
        c.max_input_bytes = super::INPUT_LIMIT;
    },
}

// ---- Cases that once showed bugs ----------------------------------------------------------

/// A message over the gRPC limit on a `Connect` stream ends the stream with RESOURCE_EXHAUSTED
/// (once, it ended with OK and no response, as if the client had gone).
fn oversized_connect_message_cases() -> Vec<Case> {
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

/// A batch id with control characters is refused naming the field (once, it reached Postgres,
/// which refused the NUL with INTERNAL).
fn control_characters_in_batch_id_cases() -> Vec<Case> {
    use pb::agent_request::Request as Req;
    vec![
        cancel(
            "cancel: a batch id with NUL",
            target("seed", batch_target("a\0b")),
            invalid("target.batch_id"),
        ),
        connect(
            "connect: cancel of a batch id with NUL",
            Some(Req::Cancel(pb::CancelTarget {
                session_id: "seed".into(),
                target: batch_target("\0"),
                reason: String::new(),
            })),
            item("cancel.batch_id"),
        ),
    ]
}
