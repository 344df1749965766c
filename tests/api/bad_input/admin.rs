//! AdminService/ListCalls and GetCall: malformed requests are refused naming the field; filters
//! full of quotes, `%`, `_` and SQL fragments are valid and match literally.

use approval_broker::proto::v1 as pb;
use tonic::Code;

use super::table::*;
use crate::helpers::*;

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

pub(super) fn list_calls_cases() -> Vec<Case> {
    let big = "x".repeat(MESSAGE_LIMIT + 1);
    vec![
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
    ]
}

/// ListCalls.
async fn a_malformed_list_calls_is_refused_naming_its_field_and_odd_filters_match_literally(
    app: TestApp,
) {
    refuses_every_case(&app, |_| list_calls_cases()).await;
}

pub(super) fn get_call_cases() -> Vec<Case> {
    let big = "x".repeat(MESSAGE_LIMIT + 1);
    vec![
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

/// GetCall.
async fn a_malformed_get_call_is_refused_naming_its_field(app: TestApp) {
    refuses_every_case(&app, |_| get_call_cases()).await;
}

backend_tests! {
    a_malformed_list_calls_is_refused_naming_its_field_and_odd_filters_match_literally => crate::bad_input::table::small_limits,
    a_malformed_get_call_is_refused_naming_its_field => crate::bad_input::table::small_limits,
}
