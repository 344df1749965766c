//! ApproverService/Subscribe: a malformed subscription is refused naming the field; filters full of
//! quotes, `%`, `_` and SQL fragments are valid and match literally.

use approval_broker::proto::v1 as pb;

use super::table::*;
use crate::helpers::*;

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

pub(super) fn subscribe_cases(last_seq: u64) -> Vec<Case> {
    let big = "x".repeat(MESSAGE_LIMIT + 1);
    vec![
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
    ]
}

/// Subscribe.
async fn a_malformed_subscription_is_refused_naming_its_field_and_odd_filters_match_literally(
    app: TestApp,
) {
    refuses_every_case(&app, subscribe_cases).await;
}

backend_tests! {
    a_malformed_subscription_is_refused_naming_its_field_and_odd_filters_match_literally => crate::bad_input::table::small_limits,
}
